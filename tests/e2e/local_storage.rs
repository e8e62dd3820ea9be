//! Local storage limits, as the kubelet's eviction manager enforces them: a
//! pod that writes past its emptyDir `sizeLimit` is evicted (Failed,
//! `Evicted`, the kubelet's message) without the `DisruptionTarget`
//! condition, and a pod under its limit keeps running.

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;

fn writer(name: &str, megabytes: u32) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", format!("dd if=/dev/zero of=/scratch/fill bs=1M count={megabytes}; sleep 3600")],
                "volumeMounts": [{ "name": "scratch", "mountPath": "/scratch" }]
            }],
            "volumes": [{ "name": "scratch", "emptyDir": { "sizeLimit": "10Mi" } }]
        }
    }))
    .expect("pod")
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_pod_over_its_empty_dir_size_limit_is_evicted() {
    let client = client().await;
    let ns = namespace(&client, "e2e-local-storage").await;
    create(&client, &ns, &writer("over", 20)).await;
    create(&client, &ns, &writer("under", 5)).await;
    let evicted = wait_for(&client, &ns, "over", 120, "evicted", phase("Failed")).await;
    let st = evicted.status.expect("status");
    assert_eq!(st.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        st.message.as_deref(),
        Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"10Mi\". ")
    );
    assert!(
        !st.conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "DisruptionTarget"),
        "local storage evictions set no DisruptionTarget"
    );
    let under = wait_for(&client, &ns, "under", 30, "Running", phase("Running")).await;
    assert_eq!(under.status.and_then(|s| s.reason), None);
    drop_namespace(&client, &ns).await;
}
