//! Graceful node shutdown on the local cluster, with stand-ins of
//! systemd-logind and systemd on a bus of their own (this machine has
//! neither): the agent, restarted with `shutdownGracePeriodByPodPriority`
//! and the bus's address, takes logind's delay lock. When the test sends
//! `PrepareForShutdown(true)`, as the upstream node tests send it, the node
//! reports Ready false (`node is shutting down`), a new pod is refused
//! (`NodeShutdown`), the pods stop lowest priority first, each `Failed`
//! with reason `Terminated`, the kubelet's message and the
//! `DisruptionTarget` condition, and the lock is released. `false` then
//! makes the node Ready again, with the lock taken again, and a pod runs.
//! The agent is restarted with its usual configuration at the end. It
//! restarts the agent, so it runs alone.

use std::time::Duration;

use crate::common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

#[allow(dead_code, reason = "a file shared with the library's tests")]
#[path = "../../../src/node_shutdown/standin.rs"]
mod standin;

/// A priority above the default's: its pods stop last.
const HIGH: &str = "e2e-shutdown-high";

/// Waits up to `secs` for `check`.
async fn until(secs: u64, what: &str, check: impl Fn() -> bool) {
    for _ in 0..secs * 10 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not so after {secs} s: {what}");
}

/// The node's Ready condition (status, message).
async fn ready(client: &kube::Client) -> (String, String) {
    let node = Api::<Node>::all(client.clone())
        .get(&node_name())
        .await
        .expect("the node");
    let c = node
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .expect("a Ready condition");
    (c.status, c.message.unwrap_or_default())
}

/// A pod that stops at once on SIGTERM, of priority class `class`.
fn stopping_pod(name: &str, class: Option<&str>) -> Pod {
    let mut p = pod(
        name,
        "Never",
        BUSYBOX,
        &["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
    );
    let spec = p.spec.as_mut().expect("spec");
    spec.priority_class_name = class.map(str::to_string);
    spec.termination_grace_period_seconds = Some(30);
    p
}

fn finished_at(p: &Pod) -> Option<k8s_openapi::jiff::Timestamp> {
    first_state(p)?
        .terminated
        .as_ref()?
        .finished_at
        .as_ref()
        .map(|t| t.0)
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_shutdown_stops_pods_by_priority_reports_the_node_and_a_cancellation_undoes_it() {
    let bus = standin::start_bus();
    let drop_ins = tempfile::tempdir().expect("temp dir");
    // logind grants 60 s: more than the 20 s asked, so no drop-in is written.
    let (seen, _served) = standin::serve(&bus, drop_ins.path(), 60_000_000).await;
    let client = client().await;
    let classes: Api<PriorityClass> = Api::all(client.clone());
    let _ = classes.delete(HIGH, &DeleteParams::default()).await;
    classes
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({
                "metadata": { "name": HIGH }, "value": 100_000,
            })),
        )
        .await
        .expect("priority class");
    let ns = namespace(&client, "e2e-shutdown").await;
    let config = local().join("rustlet-shutdown.yaml");
    let usual = std::fs::read_to_string(local().join("rustlet.yaml")).expect("rustlet.yaml");
    std::fs::write(
        &config,
        format!(
            "{usual}shutdownGracePeriodByPodPriority:\n- {{priority: 0, shutdownGracePeriodSeconds: 10}}\n- {{priority: 100000, shutdownGracePeriodSeconds: 10}}\n"
        ),
    )
    .expect("write the configuration");
    restart_agent_env(Some(&config), &[("DBUS_SYSTEM_BUS_ADDRESS", &bus.address)]);
    until(60, "the agent takes logind's lock", || {
        seen.lock().unwrap().locks.len() == 1
    })
    .await;
    assert_eq!(
        seen.lock().unwrap().inhibits[0],
        (
            "shutdown".to_string(),
            "kubelet".to_string(),
            "Kubelet needs time to handle node shutdown".to_string(),
            "delay".to_string()
        )
    );
    for (name, class) in [("low", None), ("high", Some(HIGH))] {
        create(&client, &ns, &stopping_pod(name, class)).await;
        wait_for(&client, &ns, name, 90, "Running", phase("Running")).await;
    }

    let emit = |active: bool| {
        standin::emit_prepare_for_shutdown(&bus.address, "/org/freedesktop/login1", active)
    };
    emit(true).await;
    for name in ["low", "high"] {
        let p = wait_for(&client, &ns, name, 60, "Failed", phase("Failed")).await;
        let st = p.status.clone().unwrap_or_default();
        assert_eq!(st.reason.as_deref(), Some("Terminated"), "{name}");
        assert_eq!(
            st.message.as_deref(),
            Some("Pod was terminated in response to imminent node shutdown."),
            "{name}"
        );
        let target = st
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "DisruptionTarget")
            .unwrap_or_else(|| panic!("{name}: no DisruptionTarget condition"));
        assert_eq!(target.status, "True");
        assert_eq!(target.reason.as_deref(), Some("TerminationByKubelet"));
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let (low, high) = (
        pods.get("low").await.unwrap(),
        pods.get("high").await.unwrap(),
    );
    assert!(
        finished_at(&low) <= finished_at(&high),
        "the lower priority stops first: {:?} {:?}",
        finished_at(&low),
        finished_at(&high)
    );
    let (status, message) = ready(&client).await;
    assert_eq!(
        (status.as_str(), message.as_str()),
        ("False", "node is shutting down")
    );
    until(30, "the lock is released", || !standin::held(&seen, 0)).await;
    // A pod bound here now is refused.
    let mut late = stopping_pod("late", None);
    late.spec.as_mut().expect("spec").node_name = Some(node_name());
    create(&client, &ns, &late).await;
    let late = wait_for(&client, &ns, "late", 60, "Failed", phase("Failed")).await;
    let st = late.status.unwrap_or_default();
    assert_eq!(st.reason.as_deref(), Some("NodeShutdown"));
    assert_eq!(
        st.message.as_deref(),
        Some("Pod was rejected: Pod was rejected as the node is shutting down."),
        "the kubelet's rejectPod prefix and the shutdown manager's message"
    );

    // Cancelled: Ready again, the lock taken again, and pods run.
    emit(false).await;
    until(30, "the lock is taken again", || {
        seen.lock().unwrap().locks.len() == 2
    })
    .await;
    assert!(standin::held(&seen, 1));
    for _ in 0..300 {
        if ready(&client).await.0 == "True" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ready(&client).await.0, "True");
    let mut after = stopping_pod("after", None);
    after.spec.as_mut().expect("spec").node_name = Some(node_name());
    create(&client, &ns, &after).await;
    wait_for(&client, &ns, "after", 90, "Running", phase("Running")).await;

    drop_namespace(&client, &ns).await;
    let _ = classes.delete(HIGH, &DeleteParams::default()).await;
    restart_agent(None);
    drop(bus);
}
