//! Admission of pods bound with `spec.nodeName` (no scheduler between them
//! and the node), as the kubelet's GeneralPredicates: a pod that asks for
//! more cpu or memory than the node has left, misses a required node
//! selector, or wants a host port another pod holds ends Failed with the
//! kubelet's reason and an Event; pods that fit run. It takes two thirds of
//! the node's cpu, so it runs alone (hack/test.sh).

use crate::common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;

/// A pod bound straight to the node under test, sleeping, with `extra`
/// merged into its container and `spec` into its spec.
fn bound(name: &str, container: serde_json::Value, spec: serde_json::Value) -> Pod {
    let mut c = serde_json::json!({
        "name": "c", "image": BUSYBOX, "command": ["sleep", "3600"], "imagePullPolicy": "IfNotPresent"
    });
    if let (Some(c), Some(extra)) = (c.as_object_mut(), container.as_object()) {
        c.extend(extra.clone());
    }
    let mut p = serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "nodeName": node_name(),
            "terminationGracePeriodSeconds": 1,
            "containers": [c]
        }
    });
    if let (Some(s), Some(extra)) = (p["spec"].as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    serde_json::from_value(p).expect("pod")
}

fn cpu(millicores: i64) -> serde_json::Value {
    serde_json::json!({ "resources": { "requests": { "cpu": format!("{millicores}m") } } })
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn pods_that_do_not_fit_fail_with_the_kubelets_reasons_and_the_others_run() {
    let client = client().await;
    let ns = namespace(&client, "e2e-fit").await;
    let node = Api::<Node>::all(client.clone())
        .get(&node_name())
        .await
        .expect("node");
    let alloc = node
        .status
        .and_then(|s| s.allocatable)
        .expect("allocatable");
    let cpus: i64 = alloc["cpu"].0.trim_end_matches('m').parse().expect("cpu");
    let alloc_millis = if alloc["cpu"].0.ends_with('m') {
        cpus
    } else {
        cpus * 1000
    };

    // Two thirds of the node's cpu fits; another two thirds does not.
    let share = alloc_millis * 2 / 3;
    create(
        &client,
        &ns,
        &bound("first", cpu(share), serde_json::json!({})),
    )
    .await;
    wait_for(&client, &ns, "first", 60, "Running", phase("Running")).await;
    create(
        &client,
        &ns,
        &bound("second", cpu(share), serde_json::json!({})),
    )
    .await;
    let memory = serde_json::json!({ "resources": { "requests": { "memory": "1000Ti" } } });
    create(&client, &ns, &bound("huge", memory, serde_json::json!({}))).await;
    let selector = serde_json::json!({ "nodeSelector": { "e2e.rustlet.dev/nowhere": "true" } });
    create(
        &client,
        &ns,
        &bound("elsewhere", serde_json::json!({}), selector),
    )
    .await;
    let port = serde_json::json!({ "ports": [{ "containerPort": 80, "hostPort": 31080 }] });
    create(
        &client,
        &ns,
        &bound("port-a", port.clone(), serde_json::json!({})),
    )
    .await;
    wait_for(&client, &ns, "port-a", 60, "Running", phase("Running")).await;
    create(&client, &ns, &bound("port-b", port, serde_json::json!({}))).await;
    create(&client, &ns, &bound("small", cpu(1), serde_json::json!({}))).await;

    for (name, reason, message) in [
        (
            "second",
            "OutOfcpu",
            format!(
                "Pod was rejected: Node didn't have enough resource: cpu, requested: {share}, used: "
            ),
        ),
        (
            "huge",
            "OutOfmemory",
            "Pod was rejected: Node didn't have enough resource: memory, requested: 1099511627776000".into(),
        ),
        (
            "elsewhere",
            "NodeAffinity",
            "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector".into(),
        ),
        (
            "port-b",
            "NodePorts",
            "Pod was rejected: Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports".into(),
        ),
    ] {
        let failed = wait_for(&client, &ns, name, 60, "Failed", phase("Failed")).await;
        let st = failed.status.expect("status");
        assert_eq!(st.reason.as_deref(), Some(reason), "{name}");
        let got = st.message.unwrap_or_default();
        assert!(got.starts_with(&message), "{name}: {got}");
        if name == "second" {
            assert!(got.ends_with(&format!(", capacity: {alloc_millis}")), "{got}");
        }
        // The QoS class stays, as the kubelet's rejectPod keeps it.
        assert!(st.qos_class.is_some(), "{name}");
        wait_for_events(
            &client,
            &ns,
            Involving::Name(name),
            60,
            &format!("{name}: a Warning event {reason}"),
            |events| {
                events
                    .iter()
                    .any(|e| {
                        e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning")
                    })
                    .then_some(())
            },
        )
        .await;
    }
    // What fits still runs beside them.
    wait_for(&client, &ns, "small", 60, "Running", phase("Running")).await;
    drop_namespace(&client, &ns).await;
}
