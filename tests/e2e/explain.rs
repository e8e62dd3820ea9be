//! "Why is my pod not running?": the pod worker's last account of a pod,
//! read through the API server's node proxy
//! (`/api/v1/nodes/<node>/proxy/debug/pods/<ns>/<pod>/plan`) and printed by
//! `rustlet explain`, for a pod in CrashLoopBackOff and one whose ConfigMap
//! volume is missing.

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;
use rustlet::pod_core::explain::Explanation;

/// The node's account of pod `ns`/`name`.
async fn plan_of(ns: &str, name: &str) -> Explanation {
    let path = format!(
        "/api/v1/nodes/{}/proxy/debug/pods/{ns}/{name}/plan",
        node_name()
    );
    let req = axum::http::Request::get(&path).body(Vec::new()).unwrap();
    let text = client().await.request_text(req).await.expect("the plan");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The node's account of pod `ns`/`name` once it names a blocker of `kind`
/// (at most 60 s): a sync may run between the pod's status and the read.
async fn plan_blocked_by(ns: &str, name: &str, kind: &str) -> Explanation {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let e = plan_of(ns, name).await;
        if e.blockers.iter().any(|b| b.kind == kind) {
            return e;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {kind} blocker: {e:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// `rustlet explain <ns>/<name>` with the local cluster's kubeconfig:
/// (exit code, stdout, stderr).
fn explain(target: &str, json: bool) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_rustlet"));
    cmd.args(["explain", target, "--kubeconfig"])
        .arg(local().join("admin.kubeconfig"));
    if json {
        cmd.arg("--json");
    }
    let out = cmd.output().expect("run rustlet explain");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn the_plan_names_a_crash_loop_and_a_missing_config_map_with_their_next_try() {
    let client = client().await;
    let ns = namespace(&client, "explain").await;
    let crash = pod("crash", "Always", BUSYBOX, &["sh", "-c", "exit 3"]);
    create(&client, &ns, &crash).await;
    let missing: Pod = from_json(serde_json::json!({
        "metadata": { "name": "missing" },
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{ "name": "c", "image": BUSYBOX, "command": ["sleep", "3600"],
                             "volumeMounts": [{ "name": "cfg", "mountPath": "/cfg" }] }],
            "volumes": [{ "name": "cfg", "configMap": { "name": "no-such-config" } }]
        }
    }));
    create(&client, &ns, &missing).await;
    wait_for(
        &client,
        &ns,
        "crash",
        90,
        "in CrashLoopBackOff",
        waiting_reason("CrashLoopBackOff"),
    )
    .await;

    let e = plan_blocked_by(&ns, "crash", "Container").await;
    assert_eq!(e.pod, format!("{ns}/crash"));
    let held = e
        .blockers
        .iter()
        .find(|b| b.kind == "Container" && b.subject.as_deref() == Some("c"))
        .unwrap_or_else(|| panic!("no blocker for c: {e:?}"));
    assert_eq!(held.reason, "CrashLoopBackOff", "{e:?}");
    assert!(
        held.message.contains("restarting failed container=c"),
        "{e:?}"
    );
    let until = held.until.clone().expect("when the back-off ends");
    assert!(until > e.synced_at, "{until} after {}", e.synced_at);
    assert!(held.attempt.is_some(), "{e:?}");
    assert!(e.next_sync_at.is_some(), "{e:?}");
    assert!(
        e.runtime
            .containers
            .iter()
            .any(|c| c.name == "c" && c.exit_code == Some(3)),
        "{e:?}"
    );

    // The missing ConfigMap: the volume is named, with the kubelet's
    // message, and the next try is due.
    let e = plan_blocked_by(&ns, "missing", "Volume").await;
    let volume = e.blockers.iter().find(|b| b.kind == "Volume").unwrap();
    assert_eq!(volume.subject.as_deref(), Some("cfg"));
    assert_eq!(volume.reason, "FailedMount");
    assert!(
        volume.message.contains("\"no-such-config\" not found"),
        "{volume:?}"
    );
    assert!(e.next_sync_at.is_some(), "{e:?}");
    assert!(e.runtime.containers.is_empty(), "nothing started: {e:?}");

    // The same for a person, from the API server alone.
    let (code, text, err) = explain(&format!("{ns}/crash"), false);
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("Held back by:"), "{text}");
    assert!(text.contains("Container c: CrashLoopBackOff"), "{text}");
    assert!(text.contains("until "), "{text}");
    let (code, json, err) = explain(&format!("{ns}/missing"), true);
    assert_eq!(code, 0, "{err}");
    let doc: Explanation = serde_json::from_str(&json).expect("JSON");
    assert!(doc.blockers.iter().any(|b| b.kind == "Volume"), "{json}");
    // A pod that does not exist is one clear line and a non-zero exit.
    let (code, _, err) = explain(&format!("{ns}/nobody"), false);
    assert_ne!(code, 0);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("nobody"), "{err}");
    drop_namespace(&client, &ns).await;
}
