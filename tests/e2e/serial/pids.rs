//! `podPidsLimit`: the agent, restarted with `podPidsLimit: 64`, gives each
//! pod's cgroup `pids.max` 64, as the kubelet's pod container manager. A
//! fork bomb in a pod stops there: the pod's cgroup fills up to 64
//! processes and no further, the bomb's forks fail, and another pod still
//! starts while the node stays Ready and renews its Lease. The agent is
//! restarted with its usual configuration at the end. It restarts the
//! agent, so it runs alone.

use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;

const LIMIT: u64 = 64;

/// File `file` of BestEffort pod `uid`'s cgroup in the `pids` hierarchy.
fn pids_file(uid: &str, file: &str) -> String {
    cgroup_file("pids", &format!("kubepods/besteffort/pod{uid}"), file)
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_fork_bomb_stops_at_the_pod_pids_limit_and_the_node_stays_ready() {
    let config = restart_agent_with("pids", &format!("podPidsLimit: {LIMIT}\n"));
    let client = client().await;
    let ns = namespace(&client, "e2e-pids").await;
    // An inner shell forks up to 200 sleepers (a bound of its own: without
    // the limit, a node would not be brought down) and ends at the first
    // fork that fails; the outer one then says so and stays.
    let bomb = from_json::<Pod>(serde_json::json!({
        "metadata": { "name": "bomb" },
        "spec": { "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "c", "image": BUSYBOX,
            "command": ["sh", "-c",
                "sh -c 'i=0; while [ $i -lt 200 ]; do sleep 600 & i=$((i+1)); done' 2>/dev/null; echo bomb stopped; exec sleep 3600"]
        }] }
    }));
    let bomb = create(&client, &ns, &bomb).await;
    let uid = bomb.metadata.uid.expect("uid");
    wait_for(&client, &ns, "bomb", 90, "Running", phase("Running")).await;
    assert_eq!(pids_file(&uid, "pids.max"), LIMIT.to_string());
    // Its forks are refused once the cgroup is full.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !logs(&ns, "bomb").contains("bomb stopped") {
        assert!(
            Instant::now() < deadline,
            "the bomb never stopped: {:?}",
            logs(&ns, "bomb")
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Full to the limit with its sleepers, never past it.
    let current: u64 = pids_file(&uid, "pids.current")
        .parse()
        .expect("pids.current");
    assert!(
        (LIMIT - 8..=LIMIT).contains(&current),
        "{current} processes in the pod, limit {LIMIT}"
    );

    // The node goes on: another pod starts, the node is Ready, the Lease renewed.
    create(
        &client,
        &ns,
        &pod("fine", "Never", BUSYBOX, &["sh", "-c", "echo fine"]),
    )
    .await;
    wait_for(&client, &ns, "fine", 60, "Succeeded", phase("Succeeded")).await;
    lease_renewed(&client, 60).await;
    let node = Api::<Node>::all(client.clone())
        .get(&node_name())
        .await
        .expect("node");
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status);
    assert_eq!(ready.as_deref(), Some("True"));
    drop_namespace(&client, &ns).await;
    restart_agent(None);
    let _ = std::fs::remove_file(&config);
}
