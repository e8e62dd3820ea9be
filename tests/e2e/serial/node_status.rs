//! When the agent writes the Node: only when its status changes (heartbeats
//! go to the Lease), as the kubelet does; and an extended resource advertised
//! on the Node by a cluster administrator, as in "Advertise Extended
//! Resources for a Node", which the agent gives an equal allocatable, keeps
//! across its own status patches, and stops writing the Node once the two
//! agree; and the conditions of other writers (node-problem-detector's)
//! survive the agent's restart and its status writes. Serial: each test
//! asserts that the Node is not written for a while, which any other test's
//! change to the node (an image pulled, a resource advertised) would break,
//! or restarts the agent.

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

    // Two and a half update periods later: still advertised, and not
    // rewritten. Heartbeats go to the Lease; the Node is written when its
    // status changes or every nodeStatusReportFrequency (5 min), as the
    // kubelet does.
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

/// The condition node-problem-detector writes, as it writes it: a
/// strategic merge patch of `nodes/status` holding only its conditions.
async fn write_kernel_deadlock(nodes: &Api<Node>, heartbeat: &str) {
    let patch = serde_json::json!({ "status": { "conditions": [{
        "type": "KernelDeadlock",
        "status": "False",
        "reason": "KernelHasNoDeadlock",
        "message": "kernel has no deadlock",
        "lastHeartbeatTime": heartbeat,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }] } });
    nodes
        .patch_status(
            &node_name(),
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
        .expect("write the KernelDeadlock condition");
}

/// The Node's condition of `type_`: (status, lastHeartbeatTime).
fn condition_of(n: &Node, type_: &str) -> Option<(String, String)> {
    let c = n
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)?
        .clone();
    Some((c.status, c.last_heartbeat_time?.0.to_string()))
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn conditions_of_other_writers_survive_a_restart_and_a_minute_of_status_updates() {
    let client = client().await;
    let nodes = Api::<Node>::all(client);
    let name = node_name();
    write_kernel_deadlock(&nodes, "2026-01-01T00:00:01Z").await;
    // The agent again, writing the Node every second whether or not it
    // changed: each write would have replaced the condition list.
    let config = restart_agent_with(
        "status-1s",
        "nodeStatusUpdateFrequency: 1s\nnodeStatusReportFrequency: 1s\n",
    );
    let restarted = nodes.get(&name).await.expect("node");
    let (_, ready_then) = condition_of(&restarted, "Ready").expect("Ready");
    let mut heartbeat = "2026-01-01T00:00:01Z".to_string();
    let mut agent_writes = std::collections::BTreeSet::new();
    let end = Instant::now() + Duration::from_secs(60);
    let mut second = 0u32;
    while Instant::now() < end {
        // node-problem-detector renews its condition meanwhile; the agent
        // never brings an older copy back.
        if second % 10 == 5 {
            heartbeat = format!("2026-01-01T00:01:{second:02}Z");
            write_kernel_deadlock(&nodes, &heartbeat).await;
        }
        let n = nodes.get(&name).await.expect("node");
        let kernel = condition_of(&n, "KernelDeadlock");
        assert_eq!(
            kernel,
            Some(("False".to_string(), heartbeat.clone())),
            "second {second}: the KernelDeadlock condition was changed"
        );
        if let Some((_, ready)) = condition_of(&n, "Ready") {
            agent_writes.insert(ready);
        }
        second += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    restart_agent(None);
    let after = nodes.get(&name).await.expect("node");
    assert_eq!(
        condition_of(&after, "KernelDeadlock").map(|c| c.1),
        Some(heartbeat),
        "gone after the agent's restart"
    );
    // The agent did write its own conditions all along: a new Ready
    // heartbeat in most of the (about 30) looks.
    agent_writes.remove(&ready_then);
    assert!(
        agent_writes.len() >= 20,
        "the agent's writes seen in a minute: {}",
        agent_writes.len()
    );
    // Gone for the next tests.
    let remove = serde_json::json!({ "status": { "conditions": [
        { "type": "KernelDeadlock", "$patch": "delete" }
    ] } });
    nodes
        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&remove))
        .await
        .expect("remove the KernelDeadlock condition");
    let _ = std::fs::remove_file(&config);
}
