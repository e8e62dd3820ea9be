//! `NodeConfiguration`s applied while the agent runs: a resource that
//! selects the node once it carries a label changes the image manager's
//! thresholds and a soft eviction threshold; `/configz` shows them, the
//! Node's annotation and condition say so, and the threshold acts (the node
//! reports MemoryPressure). A second resource setting the same field is a
//! conflict, a value the kubelet refuses is invalid: both are refused on
//! the condition and the node keeps its values. Deleting the resources
//! brings the file's values back. The status writer (`rustlet
//! report-node-configurations`, run here as the chart's approver Deployment
//! runs it) counts each resource's nodes in its status. It changes the
//! node's eviction thresholds: it runs alone.

use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::Node;
use kube::Api;

const LABEL: &str = "e2e.rustlet.dev/node-configuration";
const ANNOTATION: &str = "rustlet.dev/node-configuration";

fn resource(name: &str, live: &str) -> String {
    format!(
        "apiVersion: rustlet.dev/v1alpha1\nkind: NodeConfiguration\nmetadata:\n  name: {name}\n\
         spec:\n  nodeSelector:\n    matchLabels:\n      {LABEL}: \"yes\"\n  kubeletConfiguration:\n{live}"
    )
}

fn apply(yaml: &str) {
    let (code, _, err) = kubectl(&["apply", "-f", "-"], yaml);
    assert_eq!(code, 0, "{err}");
}

fn configz() -> serde_json::Value {
    node_api("configz")
}

/// Where each field of `/configz` came from (`/configz/sources`).
fn sources() -> serde_json::Value {
    node_api("configz/sources")
}

/// The `kubeletconfig` of the node API's `path`, through the API server.
fn node_api(path: &str) -> serde_json::Value {
    let (code, out, err) = kubectl(
        &[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{}/proxy/{path}", node_name()),
        ],
        "",
    );
    assert_eq!(code, 0, "{path}: {err}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    doc["kubeletconfig"].clone()
}

/// The Node's annotation and the `(status, reason, message)` of its
/// condition.
async fn report(nodes: &Api<Node>) -> (Option<String>, Option<(String, String, String)>) {
    let node = nodes.get(&node_name()).await.expect("the Node");
    let annotation = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION).cloned());
    let condition = node
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "NodeConfigurationApplied")
        .map(|c| {
            (
                c.status,
                c.reason.unwrap_or_default(),
                c.message.unwrap_or_default(),
            )
        });
    (annotation, condition)
}

fn pressure(node: &Node, type_: &str) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

/// Waits up to `secs` for `check` to hold, with what it last saw.
async fn eventually<T: std::fmt::Debug>(
    secs: u64,
    what: &str,
    mut probe: impl AsyncFnMut() -> T,
    check: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let seen = probe().await;
        if check(&seen) {
            return seen;
        }
        assert!(Instant::now() < deadline, "{what}: last seen {seen:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A resource's status, as `kubectl get` shows it.
fn status_of(name: &str) -> serde_json::Value {
    let (code, out, err) = kubectl(&["get", "nodeconfig", name, "-o", "json"], "");
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    doc["status"].clone()
}

/// The status writer, stopped with the test.
struct Reporter(std::process::Child);

impl Reporter {
    fn start() -> Self {
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_rustlet"))
            .args(["report-node-configurations", "--kubeconfig"])
            .arg(local().join("admin.kubeconfig"))
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("run rustlet report-node-configurations");
        Self(child)
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Removes the resources and the label, also when the test fails.
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = kubectl(
            &[
                "delete",
                "nodeconfig",
                "e2e-gc",
                "e2e-clash",
                "e2e-bad",
                "--ignore-not-found",
            ],
            "",
        );
        let _ = kubectl(&["label", "node", &node_name(), &format!("{LABEL}-")], "");
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_selected_configuration_applies_live_and_conflicts_are_refused() {
    let client = client().await;
    let nodes = Api::<Node>::all(client.clone());
    let _cleanup = Cleanup;
    let _reporter = Reporter::start();
    let file = configz();
    assert_eq!(file["imageGCHighThresholdPercent"], 100, "{file}");
    // Where each value comes from: the file, or the kubelet's default.
    let from_file = sources();
    let file_source = from_file["imageGCHighThresholdPercent"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(file_source.starts_with("file /"), "{from_file}");
    assert_eq!(from_file["evictionSoft"], "default", "{from_file}");

    apply(&resource(
        "e2e-gc",
        "    imageGCHighThresholdPercent: 90\n    imageGCLowThresholdPercent: 80\n\
         \x20   evictionSoft:\n      memory.available: 100000Gi\n\
         \x20   evictionSoftGracePeriod:\n      memory.available: 1s\n\
         \x20   evictionPressureTransitionPeriod: 5s\n",
    ));
    // Not selected yet: nothing changes.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(configz()["imageGCHighThresholdPercent"], 100);

    let (code, _, err) = kubectl(
        &["label", "node", &node_name(), &format!("{LABEL}=yes")],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let live = eventually(
        30,
        "/configz shows the resource",
        async || configz(),
        |c| c["imageGCHighThresholdPercent"] == 90,
    )
    .await;
    assert_eq!(live["imageGCLowThresholdPercent"], 80);
    assert_eq!(live["evictionSoft"]["memory.available"], "100000Gi");
    assert_eq!(live["evictionPressureTransitionPeriod"], "5s");
    let applied = sources();
    for field in [
        "imageGCHighThresholdPercent",
        "evictionSoft",
        "evictionPressureTransitionPeriod",
    ] {
        assert_eq!(
            applied[field], "NodeConfiguration e2e-gc",
            "{field}: {applied}"
        );
    }
    let (annotation, condition) = eventually(
        30,
        "the Node reports it",
        async || report(&nodes).await,
        |r| r.0.is_some(),
    )
    .await;
    assert_eq!(annotation.as_deref(), Some("e2e-gc/1"));
    let (status, reason, message) = condition.expect("the condition");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Applied"));
    assert_eq!(message, "applied e2e-gc/1");
    // The resource's status counts the node.
    let counted = eventually(
        30,
        "the status counts the node",
        async || status_of("e2e-gc"),
        |s| s["applied"] == 1,
    )
    .await;
    assert_eq!(counted["selected"], 1, "{counted}");
    assert_eq!(counted["refused"], 0, "{counted}");
    assert_eq!(counted["observedGeneration"], 1, "{counted}");
    let (code, table, err) = kubectl(&["get", "nodeconfigurations", "e2e-gc"], "");
    assert_eq!(code, 0, "{err}");
    assert!(
        table.starts_with("NAME") && table.contains("SELECTED") && table.contains("APPLIED"),
        "{table}"
    );
    // The soft threshold acts: available memory is under 100000Gi.
    eventually(
        60,
        "MemoryPressure",
        async || nodes.get(&node_name()).await.expect("the Node"),
        |n| pressure(n, "MemoryPressure").as_deref() == Some("True"),
    )
    .await;

    // The same field from a second resource: both refused, values kept.
    apply(&resource(
        "e2e-clash",
        "    imageGCHighThresholdPercent: 95\n",
    ));
    // A value the kubelet refuses over the file (a maximum age below the
    // minimum).
    apply(&resource("e2e-bad", "    imageMaximumGCAge: 1s\n"));
    let (annotation, condition) = eventually(
        30,
        "the refusals reported",
        async || report(&nodes).await,
        |r| {
            r.1.as_ref()
                .is_some_and(|c| c.0 == "False" && c.2.contains("e2e-clash"))
        },
    )
    .await;
    let (_, reason, message) = condition.expect("the condition");
    assert_eq!(
        reason, "Invalid",
        "the first refused by name, e2e-bad: {message}"
    );
    assert!(message.contains("e2e-bad/1 refused (Invalid)"), "{message}");
    assert!(message.contains("imageMaximumGCAge"), "{message}");
    assert!(
        message.contains(
            "e2e-clash/1 refused (Conflict): imageGCHighThresholdPercent is also set by e2e-gc"
        ),
        "{message}"
    );
    assert!(message.contains("e2e-gc/1 refused (Conflict)"), "{message}");
    assert_eq!(annotation, None, "nothing applied by name");
    // Each refused resource's status names the node and the reason.
    for (name, reason) in [("e2e-clash", "Conflict"), ("e2e-bad", "Invalid")] {
        let s = eventually(
            30,
            "the refusal counted",
            async || status_of(name),
            |s| s["refused"] == 1,
        )
        .await;
        assert_eq!(s["applied"], 0, "{s}");
        assert_eq!(s["refusals"][0]["node"], node_name(), "{s}");
        assert_eq!(s["refusals"][0]["reason"], reason, "{s}");
    }
    let kept = configz();
    assert_eq!(kept["imageGCHighThresholdPercent"], 90, "kept: {kept}");
    assert_eq!(kept["evictionSoft"]["memory.available"], "100000Gi");

    // The refused ones go; e2e-gc, changed, drops its soft threshold and
    // keeps the short transition period: the pressure ends.
    let (code, _, err) = kubectl(&["delete", "nodeconfig", "e2e-clash", "e2e-bad"], "");
    assert_eq!(code, 0, "{err}");
    apply(&resource(
        "e2e-gc",
        "    imageGCHighThresholdPercent: 90\n    imageGCLowThresholdPercent: 80\n\
         \x20   evictionPressureTransitionPeriod: 5s\n",
    ));
    let (annotation, _) = eventually(
        30,
        "the new generation applied",
        async || report(&nodes).await,
        |r| r.0.as_deref() == Some("e2e-gc/2"),
    )
    .await;
    assert_eq!(annotation.as_deref(), Some("e2e-gc/2"));
    eventually(
        60,
        "MemoryPressure gone",
        async || nodes.get(&node_name()).await.expect("the Node"),
        |n| pressure(n, "MemoryPressure").as_deref() == Some("False"),
    )
    .await;

    // Gone: the file's values, no annotation.
    let (code, _, err) = kubectl(&["delete", "nodeconfig", "e2e-gc"], "");
    assert_eq!(code, 0, "{err}");
    let back = eventually(
        30,
        "the file's values",
        async || configz(),
        |c| c["imageGCHighThresholdPercent"] == 100,
    )
    .await;
    assert_eq!(back["evictionSoft"], file["evictionSoft"], "{back}");
    let restored = sources();
    assert_eq!(
        restored["imageGCHighThresholdPercent"],
        file_source.as_str(),
        "{restored}"
    );
    assert_eq!(restored["evictionSoft"], "default", "{restored}");
    assert_eq!(
        back["evictionPressureTransitionPeriod"],
        file["evictionPressureTransitionPeriod"]
    );
    let (annotation, condition) = eventually(
        30,
        "the report of none",
        async || report(&nodes).await,
        |r| r.1.as_ref().is_some_and(|c| c.1 == "NoConfiguration"),
    )
    .await;
    assert_eq!(annotation, None);
    assert_eq!(condition.map(|c| c.0).as_deref(), Some("True"));
}
