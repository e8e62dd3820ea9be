//! The node's ResourceSlices at the agent's start, on the local cluster
//! (`hack/local-up.sh --agent rustlet`): a slice a driver left for this node
//! goes when the agent starts, deleted with the node's own credentials (the
//! Node authorizer allows a node its own slices), as the kubelet wipes them;
//! another node's slice stays.
//!
//! Serial: it restarts the agent.

use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;

/// A ResourceSlice of `node`, one device, for driver `gpu.example.com`.
fn slice(name: &str, node: &str) -> ResourceSlice {
    from_json(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "driver": "gpu.example.com",
            "nodeName": node,
            "pool": { "name": node, "generation": 1, "resourceSliceCount": 1 },
            "devices": [{ "name": "gpu-0" }]
        }
    }))
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn the_nodes_resource_slices_are_wiped_at_start() {
    let client = client().await;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let node = node_name();
    let ours = format!("e2e-{node}-gpu");
    let theirs = "e2e-elsewhere-gpu".to_string();
    for (name, on) in [(&ours, node.as_str()), (&theirs, "elsewhere")] {
        let _ = slices.delete(name, &Default::default()).await;
        slices
            .create(&Default::default(), &slice(name, on))
            .await
            .unwrap_or_else(|e| panic!("create ResourceSlice {name}: {e}"));
    }
    restart_agent(None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while slices
        .get_opt(&ours)
        .await
        .expect("get the slice")
        .is_some()
    {
        assert!(
            Instant::now() < deadline,
            "the node's ResourceSlice is still there 60 s after the agent started"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        slices.get_opt(&theirs).await.expect("get").is_some(),
        "another node's slice stays"
    );
    slices
        .delete(&theirs, &Default::default())
        .await
        .expect("delete the other node's slice");
}
