//! ResourceClaims on the local cluster (`hack/local-up.sh --agent rustlet`):
//! a pod bound to the node whose claim is not reserved for it, and then one
//! allocated to a driver the node has not registered, gets no sandbox and
//! waits with `FailedPrepareDynamicResources` in the kubelet's words, rather
//! than run without its device. The claim is read with the node's own
//! credentials (the Node authorizer allows a node the claims of its pods);
//! the claim's status is written as the scheduler would, with the admin's.

use std::time::Duration;

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_pod_whose_claim_is_not_prepared_waits_without_a_sandbox() {
    let client = client().await;
    let ns = namespace(&client, "e2e-claims").await;
    let node = node_name();
    let (code, _, err) = kubectl(
        &["apply", "-n", &ns, "-f", "-"],
        "apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: gpu}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.example.com}
",
    );
    assert_eq!(code, 0, "create the claim: {err}");
    // Bound to the node directly, as the pod was: the scheduler
    // would hold a pod whose claim cannot be allocated.
    let pod = create(
        &client,
        &ns,
        &from_json(serde_json::json!({
            "metadata": { "name": "claimer" },
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{ "name": "gpu", "resourceClaimName": "gpu" }],
                "containers": [{
                    "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "3600"],
                    "resources": { "claims": [{ "name": "gpu" }] }
                }]
            }
        })),
    )
    .await;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let prepare_failed = |text: String| {
        move |events: &[k8s_openapi::api::core::v1::Event]| {
            messages(events, "FailedPrepareDynamicResources")
                .and_then(|m| m.into_iter().find(|m| m.contains(&text)))
        }
    };
    let why = wait_for_events(
        &client,
        &ns,
        Involving::Name("claimer"),
        60,
        "the claim refused: not reserved for the pod",
        prepare_failed(format!(
            "pod claimer ({uid}) is not allowed to use ResourceClaim gpu"
        )),
    )
    .await;
    assert!(
        why.starts_with("Failed to prepare dynamic resources: prepare dynamic resources: "),
        "{why}"
    );

    // Allocated and reserved for the pod, as the scheduler writes it.
    let status = serde_json::json!({ "status": {
        "allocation": { "devices": { "results": [
            { "request": "gpu", "driver": "gpu.example.com", "pool": node, "device": "gpu-0" }
        ] } },
        "reservedFor": [{ "resource": "pods", "name": "claimer", "uid": uid }]
    }});
    let (code, _, err) = kubectl(
        &[
            "patch",
            "-n",
            &ns,
            "resourceclaim",
            "gpu",
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ],
        "",
    );
    assert_eq!(code, 0, "allocate the claim: {err}");
    wait_for_events(
        &client,
        &ns,
        Involving::Name("claimer"),
        60,
        "the claim refused: its driver is not registered",
        prepare_failed("DRA driver gpu.example.com is not registered".into()),
    )
    .await;

    // Through all of it no sandbox, no container: the pod waits.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sandboxes = runtime()
        .await
        .list_pod_sandboxes(std::collections::HashMap::from([(
            "io.kubernetes.pod.uid".to_string(),
            uid.clone(),
        )]))
        .await
        .expect("ListPodSandbox");
    assert!(sandboxes.is_empty(), "{sandboxes:?}");
    let now = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("claimer")
        .await
        .expect("pod");
    assert_eq!(
        now.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    assert_eq!(waiting(&now).as_deref(), Some("ContainerCreating"));
    drop_namespace(&client, &ns).await;
}
