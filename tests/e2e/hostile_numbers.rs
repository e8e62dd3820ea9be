//! End-to-end scenarios of hostile numbers in pod specs on the local cluster
//! (`hack/local-up.sh --agent rustlet`): a pod with int64-max grace periods
//! (pod, probe and deletion), a preStop hook and probe timings at the ends of
//! int32, a pod with a cpu limit of 9e15 cores and a memory limit in Pi, and
//! a postStart hook that never returns, deleted while it runs. Each leaves
//! the agent running (the same pid) and other pods syncing.

use std::time::Duration;

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::{Client, ResourceExt};

/// A container that exits at once on SIGTERM.
const TERM_EXITS: &str = "trap 'exit 0' TERM; sleep 3600 & wait";

/// The agent still runs as `pid`: its pid file names it and the process lives.
fn assert_agent_alive(pid: u32) {
    assert_eq!(agent_pid(), pid, "the agent was restarted");
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the agent (pid {pid}) is gone"
    );
}

/// A simple pod created after the hostile one starts and runs: the agent
/// still syncs pods.
async fn other_pods_sync(client: &Client, ns: &str, name: &str) {
    create(
        client,
        ns,
        &pod(name, "Always", BUSYBOX, &["sleep", "3600"]),
    )
    .await;
    wait_for(client, ns, name, 60, "Running", phase("Running")).await;
}

/// Deletes pod `name` with `grace` seconds, any `i64` as the API takes it
/// (kube's `DeleteParams` holds a `u32`), without waiting.
fn delete(ns: &str, name: &str, grace: i64) {
    let grace = format!("--grace-period={grace}");
    let (code, out, err) = kubectl(
        &["delete", "pod", name, "-n", ns, &grace, "--wait=false"],
        "",
    );
    assert_eq!(code, 0, "kubectl delete: {out} {err}");
}

#[tokio::test]
#[ignore = "needs the local cluster"]
async fn int64_max_grace_periods_and_huge_probe_timings_leave_the_agent_running() {
    let client = client().await;
    let ns = namespace(&client, "hostile-grace").await;
    let pid = agent_pid();
    let probe = |kind: &str| {
        let mut p = serde_json::json!({
            "exec": { "command": ["true"] },
            "initialDelaySeconds": if kind == "readiness" { 0 } else { i32::MAX },
            "periodSeconds": i32::MAX,
            "timeoutSeconds": i32::MAX,
            "successThreshold": 1,
            "failureThreshold": i32::MAX
        });
        if kind == "liveness" {
            p["terminationGracePeriodSeconds"] = i64::MAX.into();
        }
        p
    };
    let hostile: Pod = from_json(serde_json::json!({
        "metadata": { "name": "huge" },
        "spec": {
            "terminationGracePeriodSeconds": i64::MAX,
            "activeDeadlineSeconds": i64::from(i32::MAX),
            "containers": [{
                "name": "c", "image": BUSYBOX, "command": ["sh", "-c", TERM_EXITS],
                "lifecycle": { "preStop": { "exec": { "command": ["sleep", "2"] } } },
                "livenessProbe": probe("liveness"),
                "readinessProbe": probe("readiness"),
                "startupProbe": probe("startup")
            }]
        }
    }));
    let created = create(&client, &ns, &hostile).await;
    wait_for(&client, &ns, "huge", 60, "Running", phase("Running")).await;
    assert_agent_alive(pid);
    // Deleted with the largest grace period the API takes: the preStop hook
    // runs, the container stops on SIGTERM, the pod goes.
    delete(&ns, "huge", i64::MAX);
    let uid = created.uid().expect("uid");
    wait_deleted(&client, &ns, "huge", &uid, 60).await;
    assert_agent_alive(pid);
    other_pods_sync(&client, &ns, "after").await;
    assert_agent_alive(pid);
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster"]
async fn a_cpu_limit_of_9e15_cores_and_memory_in_pi_leave_the_agent_running() {
    let client = client().await;
    let ns = namespace(&client, "hostile-quantity").await;
    let pid = agent_pid();
    // Bound to the node directly: no scheduler places a pod asking this much.
    let hostile: Pod = from_json(serde_json::json!({
        "metadata": { "name": "huge" },
        "spec": {
            "nodeName": node_name(),
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": BUSYBOX, "command": ["sh", "-c", TERM_EXITS],
                "resources": {
                    "limits": { "cpu": "9e15", "memory": "1Pi" },
                    "requests": { "cpu": "9e15", "memory": "1Pi" }
                }
            }]
        }
    }));
    create(&client, &ns, &hostile).await;
    // Either it runs with its limits clamped, or it fails with a reason.
    let settled = |p: Option<&Pod>| {
        let Some(st) = p.and_then(|p| p.status.as_ref()) else {
            return false;
        };
        let phase = st.phase.as_deref().unwrap_or_default();
        let waiting = st
            .container_statuses
            .iter()
            .flatten()
            .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
            .any(|r| r != "ContainerCreating");
        phase == "Running" || phase == "Failed" || waiting
    };
    let p = wait_for(&client, &ns, "huge", 60, "Running or failed", settled).await;
    let st = p.status.clone().unwrap_or_default();
    eprintln!(
        "9e15 cores, 1Pi: phase {:?} reason {:?} message {:?}, container {:?}",
        st.phase,
        st.reason,
        st.message,
        st.container_statuses
            .iter()
            .flatten()
            .map(|c| c.state.clone())
            .collect::<Vec<_>>()
    );
    // A container that does not run says why (on cgroup v1 the kernel
    // refuses the clamped quota: RunContainerError with its message).
    let runs = st
        .container_statuses
        .iter()
        .flatten()
        .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
    if !runs {
        let reason = st.reason.clone().or_else(|| {
            st.container_statuses
                .iter()
                .flatten()
                .find_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
        });
        assert!(
            reason.is_some_and(|r| !r.is_empty() && r != "ContainerCreating"),
            "a pod that does not run says why: {st:#?}"
        );
    }
    assert_agent_alive(pid);
    other_pods_sync(&client, &ns, "after").await;
    assert_agent_alive(pid);
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster"]
async fn a_post_start_hook_that_never_returns_does_not_hold_the_deletion() {
    let client = client().await;
    let ns = namespace(&client, "hostile-poststart").await;
    let pid = agent_pid();
    let hooked: Pod = from_json(serde_json::json!({
        "metadata": { "name": "hooked" },
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "c", "image": BUSYBOX, "command": ["sh", "-c", TERM_EXITS],
                "lifecycle": { "postStart": { "exec": { "command": ["sleep", "100000"] } } }
            }]
        }
    }));
    let created = create(&client, &ns, &hooked).await;
    // The hook runs once the container started: wait for the runtime to
    // run it, then delete the pod.
    let runtime = runtime().await;
    let uid = created.uid().expect("uid");
    let mut running = false;
    for _ in 0..60 {
        let labels = std::collections::HashMap::from([(
            rustlet::labels::POD_UID_LABEL.to_string(),
            uid.clone(),
        )]);
        let containers = runtime.list_containers(labels).await.unwrap_or_default();
        if containers
            .iter()
            .any(|c| c.state == k8s_cri::v1::ContainerState::ContainerRunning as i32)
        {
            running = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(running, "the container started");
    tokio::time::sleep(Duration::from_secs(2)).await;
    delete(&ns, "hooked", 5);
    wait_deleted(&client, &ns, "hooked", &uid, 45).await;
    assert_agent_alive(pid);
    other_pods_sync(&client, &ns, "after").await;
    drop_namespace(&client, &ns).await;
}
