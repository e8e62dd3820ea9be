//! End-to-end scenarios of image pulls from a private registry on the local
//! cluster (`hack/local-up.sh --agent rustlet`): an OCI distribution registry
//! (`_output/bin/registry`, htpasswd auth) on loopback holds a copy of
//! busybox; pods pull it with and without `imagePullSecrets`. And, with
//! `hack/local-up.sh --registry-mirror`, pulls of registry.k8s.io images with
//! `imagePullPolicy: Always` through the local mirror.

use crate::common::registry::{Registry, private_pod};
use crate::common::*;
use k8s_openapi::api::core::v1::Pod;

/// The loopback address of the test registry.
const REGISTRY: &str = "127.0.0.1:5443";

/// Waits, at most 60 s, until the Events of pod `pod` as (reason, message)
/// pass `check`: Events trail the status that caused them.
async fn events_until(
    client: &kube::Client,
    ns: &str,
    pod: &str,
    what: &str,
    check: impl Fn(&[(String, String)]) -> bool,
) {
    wait_for_events(client, ns, Involving::Name(pod), 60, what, |events| {
        let pairs: Vec<(String, String)> = events
            .iter()
            .map(|e| {
                let reason = e.reason.clone().unwrap_or_default();
                (reason, e.message.clone().unwrap_or_default())
            })
            .collect();
        check(&pairs).then_some(())
    })
    .await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn image_pull_secrets_authenticate_private_pulls() {
    let registry = Registry::start(REGISTRY);
    let client = client().await;
    let ns = namespace(&client, "e2e-private").await;
    let image = format!("{REGISTRY}/private/busybox:{ns}");
    registry.push_busybox(&image);

    registry.create_pull_secret(&client, &ns, "regcred").await;

    // With the secret (and a missing one before it): pulled and running.
    create(
        &client,
        &ns,
        &private_pod(
            "with",
            &image,
            "Always",
            &["sh", "-c", "echo pulled; sleep 3600"],
            &["absent", "regcred"],
        ),
    )
    .await;
    wait_for(&client, &ns, "with", 90, "Running", phase("Running")).await;
    events_until(
        &client,
        &ns,
        "with",
        "FailedToRetrieveImagePullSecret naming the absent secret, and Pulled",
        |events| {
            events
                .iter()
                .any(|(r, m)| r == "FailedToRetrieveImagePullSecret" && m.contains("absent"))
                && events.iter().any(|(r, _)| r == "Pulled")
        },
    )
    .await;

    // Without it: the registry refuses, and the pod waits in ErrImagePull.
    create(
        &client,
        &ns,
        &private_pod(
            "without",
            &image,
            "Always",
            &["sh", "-c", "echo pulled; sleep 3600"],
            &[],
        ),
    )
    .await;
    wait_for(
        &client,
        &ns,
        "without",
        90,
        "ErrImagePull",
        |p: Option<&Pod>| {
            let waiting = p
                .and_then(|p| p.status.as_ref()?.container_statuses.clone())
                .and_then(|cs| cs.first()?.state.clone()?.waiting?.reason);
            matches!(
                waiting.as_deref(),
                Some("ErrImagePull" | "ImagePullBackOff")
            )
        },
    )
    .await;
    events_until(
        &client,
        &ns,
        "without",
        "Failed: Failed to pull image",
        |events| {
            events
                .iter()
                .any(|(r, m)| r == "Failed" && m.contains("Failed to pull image"))
        },
    )
    .await;
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet --registry-mirror"]
async fn always_pulls_a_registry_k8s_io_image_through_the_mirror() {
    let client = client().await;
    let ns = namespace(&client, "e2e-mirror").await;
    let image = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2";
    let mut always = pod("always", "Never", image, &["sh", "-c", "true"]);
    if let Some(spec) = always.spec.as_mut() {
        spec.containers[0].image_pull_policy = Some("Always".into());
    }
    create(&client, &ns, &always).await;
    wait_for(&client, &ns, "always", 90, "Succeeded", phase("Succeeded")).await;
    // Pulled, not taken from the node as it was: the kubelet's events of
    // a pull that went to the registry.
    events_until(
        &client,
        &ns,
        "always",
        "Pulling and Successfully pulled",
        |events| {
            events
                .iter()
                .any(|(r, m)| r == "Pulling" && m.contains(image))
                && events
                    .iter()
                    .any(|(r, m)| r == "Pulled" && m.contains("Successfully pulled image"))
        },
    )
    .await;
    drop_namespace(&client, &ns).await;
}
