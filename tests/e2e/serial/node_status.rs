//! When the agent writes the Node: only when its status changes (heartbeats
//! go to the Lease), as the kubelet does; and an extended resource advertised
//! on the Node by a cluster administrator, as in "Advertise Extended
//! Resources for a Node", which the agent gives an equal allocatable, keeps
//! across its own status patches, and stops writing the Node once the two
//! agree. Serial: each test asserts that the Node is not written for a
//! while, which any other test's change to the node (an image pulled, a
//! resource advertised) would break.

use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};

const DONGLE: &str = "example.com/dongle";

fn quantity(n: &Node, field: &str) -> Option<String> {
    let st = n.status.as_ref()?;
    let map = if field == "capacity" {
        st.capacity.as_ref()
    } else {
        st.allocatable.as_ref()
    };
    map?.get(DONGLE).map(|q| q.0.clone())
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn node_status_is_patched_only_when_it_changes() {
    // Heartbeats go to the Lease; the Node is written when its status changes
    // or every nodeStatusReportFrequency (5 min), as the kubelet does.
    let client = client().await;
    let nodes = Api::<Node>::all(client.clone());
    let version = |n: Node| n.metadata.resource_version.expect("resourceVersion");
    // A first patch may still be due right after the agent started.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let before = version(nodes.get(&node_name()).await.expect("node"));
    // Two and a half nodeStatusUpdateFrequency periods (10 s).
    tokio::time::sleep(Duration::from_secs(25)).await;
    let after = version(nodes.get(&node_name()).await.expect("node"));
    assert_eq!(before, after, "the Node was written without a change");
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn an_advertised_extended_resource_becomes_allocatable_and_stays() {
    let client = client().await;
    let nodes = Api::<Node>::all(client);
    let name = node_name();
    let set = |v: serde_json::Value| {
        let nodes = nodes.clone();
        let name = name.clone();
        async move {
            let patch = serde_json::json!({ "status": { "capacity": { DONGLE: v } } });
            nodes
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("patch node status")
        }
    };
    set(serde_json::json!("4")).await;

    // The agent's next status update (nodeStatusUpdateFrequency, 10 s) copies it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let node = loop {
        let n = nodes.get(&name).await.expect("node");
        if quantity(&n, "allocatable").as_deref() == Some("4") {
            break n;
        }
        assert!(
            Instant::now() < deadline,
            "allocatable {DONGLE} not set in 30 s: {:?}",
            n.status.map(|s| s.allocatable)
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let before = node.metadata.resource_version.clone();

    // Two and a half update periods later: still advertised, and not rewritten.
    tokio::time::sleep(Duration::from_secs(25)).await;
    let after = nodes.get(&name).await.expect("node");
    set(serde_json::Value::Null).await;
    assert_eq!(quantity(&after, "capacity").as_deref(), Some("4"));
    assert_eq!(quantity(&after, "allocatable").as_deref(), Some("4"));
    assert_eq!(
        before, after.metadata.resource_version,
        "the Node was written again although nothing changed"
    );

    // Withdrawn from capacity, it leaves allocatable too.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = nodes.get(&name).await.expect("node");
        if quantity(&n, "allocatable").is_none() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "allocatable {DONGLE} still there 30 s after capacity lost it"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
