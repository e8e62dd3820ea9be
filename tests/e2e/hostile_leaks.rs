//! End-to-end scenarios of what must not outlive a pod or leak past a pull
//! secret, on the local cluster (`hack/local-up.sh --agent rustlet`): a
//! force-deleted pod's probe series leave `/metrics/probes`, and an image
//! pulled with a secret is not handed to a pod without it.

use std::time::{Duration, Instant};

use crate::common::registry::{Registry, private_pod};
use crate::common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;

/// The `prober_probe_total` lines of the pod with `uid`.
fn series_of(text: &str, uid: &str) -> Vec<String> {
    let label = format!("pod_uid=\"{uid}\"");
    text.lines()
        .filter(|l| l.starts_with("prober_probe_total{") && l.contains(&label))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_force_deleted_pods_probe_series_leave_the_metrics() {
    let client = client().await;
    let ns = namespace(&client, "e2e-leak-probes").await;
    let probe = serde_json::json!({ "exec": { "command": ["true"] }, "periodSeconds": 1 });
    let created = create(
        &client,
        &ns,
        &from_json(serde_json::json!({
            "metadata": { "name": "probed" },
            "spec": {
                "terminationGracePeriodSeconds": 30,
                "containers": [{
                    "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "3600"],
                    "startupProbe": probe, "livenessProbe": probe, "readinessProbe": probe
                }]
            }
        })),
    )
    .await;
    let uid = created.metadata.uid.clone().expect("uid");
    wait_for(
        &client,
        &ns,
        "probed",
        60,
        "Ready",
        condition_is("Ready", "True"),
    )
    .await;
    // Every probe has run and is counted under the pod's UID.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = scrape(&client, "metrics/probes").await;
        let series = series_of(&text, &uid);
        let kinds = ["Startup", "Liveness", "Readiness"];
        if kinds.iter().all(|k| {
            series
                .iter()
                .any(|l| l.contains(&format!("probe_type=\"{k}\"")))
        }) {
            break;
        }
        assert!(Instant::now() < deadline, "probes not counted: {series:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Force-deleted: gone from the API at once, no deletion timestamp ever seen.
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    api.delete("probed", &DeleteParams::default().grace_period(0))
        .await
        .expect("force delete");
    assert!(api.get_opt("probed").await.expect("get").is_none());
    // Its series leave within a few housekeeping rounds, and stay gone.
    let deleted = Instant::now();
    let deadline = deleted + Duration::from_secs(10);
    loop {
        let text = scrape(&client, "metrics/probes").await;
        let series = series_of(&text, &uid);
        if series.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "probe series of the force-deleted pod still there after {:?}: {series:?}",
            deleted.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let gone_after = deleted.elapsed();
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let series = series_of(&scrape(&client, "metrics/probes").await, &uid);
        assert!(
            series.is_empty(),
            "probe series came back after they left ({gone_after:?}): {series:?}"
        );
    }
    eprintln!("probe series gone {gone_after:?} after the force delete");
    drop_namespace(&client, &ns).await;
}

/// The loopback address of the test registry (another port than
/// `tests/e2e_images.rs`'s, so both can run at once).
const REGISTRY: &str = "127.0.0.1:5444";

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_private_image_pulled_with_a_secret_is_not_used_by_a_pod_without_it() {
    let registry = Registry::start(REGISTRY);
    let client = client().await;
    let with = namespace(&client, "e2e-leak-with").await;
    let image = format!("{REGISTRY}/private/busybox:{with}");
    registry.push_busybox(&image);
    registry.create_pull_secret(&client, &with, "regcred").await;
    // Pod A, with the secret: pulls the image and runs.
    create(
        &client,
        &with,
        &private_pod(
            "a",
            &image,
            "IfNotPresent",
            &["sleep", "3600"],
            &["regcred"],
        ),
    )
    .await;
    wait_for(&client, &with, "a", 90, "Running", phase("Running")).await;
    // Pod B, in another namespace, without a secret, IfNotPresent: the image
    // is on the node now, but B may not use it; its own pull is refused.
    let without = namespace(&client, "e2e-leak-without").await;
    create(
        &client,
        &without,
        &private_pod("b", &image, "IfNotPresent", &["sleep", "3600"], &[]),
    )
    .await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &without);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let b = api.get("b").await.expect("get pod b");
        let phase = b.status.as_ref().and_then(|s| s.phase.clone());
        assert_ne!(
            phase.as_deref(),
            Some("Running"),
            "pod b runs a private image it has no secret for: {:?}",
            b.status
        );
        if matches!(
            waiting(&b).as_deref(),
            Some("ErrImagePull" | "ImagePullBackOff")
        ) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "pod b not in ErrImagePull: {:?}",
            b.status
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // And it stays so.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let b = api.get("b").await.expect("get pod b");
    assert!(
        matches!(
            waiting(&b).as_deref(),
            Some("ErrImagePull" | "ImagePullBackOff")
        ),
        "{:?}",
        b.status
    );
    drop_namespace(&client, &with).await;
    drop_namespace(&client, &without).await;
}
