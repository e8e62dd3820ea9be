//! ResourceClaims before the sandbox: a pod whose claim is missing, not
//! reserved for it, or allocated to a driver this node has not registered
//! gets no sandbox and waits with `FailedPrepareDynamicResources`; a claim
//! whose allocation holds no device lets it start.

use super::*;

/// `web` with one container naming the pod claim `gpu`, which names
/// ResourceClaim `shared-gpu`.
fn claiming_pod() -> Pod {
    let mut p = pod("web").container("c", IMAGE).build();
    if let Some(spec) = p.spec.as_mut() {
        spec.resource_claims = Some(vec![k8s_openapi::api::core::v1::PodResourceClaim {
            name: "gpu".into(),
            resource_claim_name: Some("shared-gpu".into()),
            ..Default::default()
        }]);
        spec.containers[0].resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            claims: Some(vec![k8s_openapi::api::core::v1::ResourceClaim {
                name: "gpu".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
    }
    p
}

/// ResourceClaim `shared-gpu`, reserved for `reserved_uid`, with `devices`
/// allocated.
fn claim(reserved_uid: &str, devices: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": { "name": "shared-gpu", "namespace": "default", "uid": "claim-uid" },
        "spec": {},
        "status": {
            "reservedFor": [{ "resource": "pods", "name": "web", "uid": reserved_uid }],
            "allocation": { "devices": { "results": devices } }
        }
    })
}

const CLAIM_GET: &str = "GET /apis/resource.k8s.io/v1/namespaces/default/resourceclaims/shared-gpu";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_waits_for_its_claim_and_never_runs_without_its_device() {
    let mut n = Node::start().await;
    let web = n.bind(claiming_pod());
    let uid = web.metadata.uid.clone().unwrap_or_default();

    // No such claim: no sandbox, the claim read once, the pod waiting.
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    assert!(
        n.api_calls().contains(&CLAIM_GET.to_string()),
        "{:?}",
        n.api_calls()
    );
    assert_eq!(state(&n.status("web"), "c").0, "waiting:ContainerCreating");
    n.event(
        "FailedPrepareDynamicResources",
        "Failed to prepare dynamic resources: prepare dynamic resources: fetch ResourceClaim shared-gpu: not found",
    )
    .await;

    // Another pod's claim: still nothing.
    let device = json!([{ "request": "gpu", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0" }]);
    n.api.put(
        "resourceclaims",
        "shared-gpu",
        claim("another-pod", device.clone()),
    );
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    n.event(
        "FailedPrepareDynamicResources",
        &format!("pod web ({uid}) is not allowed to use ResourceClaim shared-gpu (claim-uid)"),
    )
    .await;

    // Reserved for it and allocated, but no driver of its devices is
    // registered here: it waits rather than run without the device.
    n.api
        .put("resourceclaims", "shared-gpu", claim(&uid, device));
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    n.event(
        "FailedPrepareDynamicResources",
        "prepare dynamic resources: DRA driver gpu.example.com is not registered",
    )
    .await;
    assert_eq!(n.status("web").phase.as_deref(), Some("Pending"));

    // An allocation without devices needs no driver: the pod starts.
    n.api
        .put("resourceclaims", "shared-gpu", claim(&uid, json!([])));
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), started(&["c"]));
}
