//! End-to-end scenarios of the probe manager on the local cluster
//! (`hack/local-up.sh --agent rustlet`): exec and HTTP readiness, liveness
//! restarts with `Unhealthy` events, and startup probes holding readiness.

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;

fn ready(p: Option<&Pod>) -> bool {
    p.and_then(|p| {
        p.status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()
            .map(|c| c.ready)
    })
    .unwrap_or(false)
}

/// Runs `script` with `sh -c` in pod `name`'s container: what makes its
/// probe pass comes from the test, once it has seen the probe fail, so no
/// timing inside the pod decides what the test sees.
fn exec_in(ns: &str, name: &str, script: &str) {
    let (code, _, err) = kubectl(&["exec", "-n", ns, name, "--", "sh", "-c", script], "");
    assert_eq!(code, 0, "kubectl exec in {ns}/{name}: {err}");
}

/// Waits for pod `name` to run with its container not ready (the probe
/// fails), runs `pass` in it (what makes the probe pass), then waits for the
/// container and the pod's `Ready` condition to turn ready.
async fn unready_then_ready(client: &kube::Client, ns: &str, name: &str, pass: &str) {
    let running = wait_for(client, ns, name, 60, "Running", phase("Running")).await;
    assert!(
        !container_status(&running).ready,
        "{name}: ready before its probe passed"
    );
    exec_in(ns, name, pass);
    let p = wait_for(client, ns, name, 30, "ready", ready).await;
    let cond = pod_condition(&p, "Ready").expect("Ready");
    assert_eq!(cond.status, "True");
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn exec_readiness_turns_ready_when_the_file_appears() {
    let client = client().await;
    let ns = namespace(&client, "e2e-ready").await;
    create(&client, &ns, &from_json(serde_json::json!({
        "metadata": { "name": "ready" },
        "spec": { "containers": [{
            "name": "c", "image": BUSYBOX,
            "command": ["sleep", "3600"],
            "readinessProbe": { "exec": { "command": ["cat", "/tmp/ready"] }, "periodSeconds": 1 }
        }] }
    }))).await;
    unready_then_ready(&client, &ns, "ready", "touch /tmp/ready").await;
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn http_readiness_against_a_server_in_the_pod() {
    let client = client().await;
    let ns = namespace(&client, "e2e-http").await;
    create(&client, &ns, &from_json(serde_json::json!({
        "metadata": { "name": "web" },
        "spec": { "containers": [{
            "name": "c", "image": BUSYBOX,
            // The server answers at once, 404 until the test writes the page.
            "command": ["sh", "-c", "mkdir -p /www && exec httpd -f -p 8080 -h /www"],
            "ports": [{ "name": "http", "containerPort": 8080 }],
            "readinessProbe": { "httpGet": { "path": "/index.html", "port": "http" }, "periodSeconds": 1 }
        }] }
    }))).await;
    unready_then_ready(&client, &ns, "web", "echo ok > /www/index.html").await;
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn failing_liveness_restarts_the_container() {
    let client = client().await;
    let ns = namespace(&client, "e2e-live").await;
    create(&client, &ns, &from_json(serde_json::json!({
        "metadata": { "name": "live" },
        "spec": { "terminationGracePeriodSeconds": 1, "containers": [{
            "name": "c", "image": BUSYBOX, "command": ["sleep", "3600"],
            "livenessProbe": { "exec": { "command": ["false"] }, "periodSeconds": 1, "failureThreshold": 2 }
        }] }
    }))).await;
    wait_for(&client, &ns, "live", 60, "restarted", |p: Option<&Pod>| {
        p.and_then(|p| {
            p.status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .first()
                .map(|c| c.restart_count >= 1)
        })
        .unwrap_or(false)
    })
    .await;
    let unhealthy = wait_for_event(&client, &ns, Involving::Name("live"), "Unhealthy").await;
    assert!(
        unhealthy
            .message
            .as_deref()
            .unwrap_or_default()
            .starts_with("Liveness probe failed")
    );
    assert_eq!(
        unhealthy.involved_object.field_path.as_deref(),
        Some("spec.containers{c}")
    );
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn startup_probe_holds_started_and_ready() {
    let client = client().await;
    let ns = namespace(&client, "e2e-startup").await;
    create(&client, &ns, &from_json(serde_json::json!({
        "metadata": { "name": "slow" },
        "spec": { "containers": [{
            "name": "c", "image": BUSYBOX,
            "command": ["sleep", "3600"],
            "startupProbe": { "exec": { "command": ["cat", "/tmp/started"] }, "periodSeconds": 1, "failureThreshold": 30 }
        }] }
    }))).await;
    let running = wait_for(&client, &ns, "slow", 60, "Running", phase("Running")).await;
    let cs = container_status(&running);
    assert_eq!(
        (cs.started, cs.ready),
        (Some(false), false),
        "held by the startup probe"
    );
    exec_in(&ns, "slow", "touch /tmp/started");
    let p = wait_for(&client, &ns, "slow", 30, "ready", ready).await;
    assert_eq!(container_status(&p).started, Some(true));
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn readiness_is_probed_as_soon_as_the_startup_probe_passes() {
    let client = client().await;
    let ns = namespace(&client, "e2e-startready").await;
    // A readiness period of 60 s: only the trigger on startup success makes
    // the pod ready within the wait below.
    create(&client, &ns, &from_json(serde_json::json!({
        "metadata": { "name": "prompt" },
        "spec": { "containers": [{
            "name": "c", "image": BUSYBOX,
            "command": ["sh", "-c", "sleep 3; touch /tmp/started; sleep 3600"],
            "startupProbe": { "exec": { "command": ["cat", "/tmp/started"] }, "periodSeconds": 1, "failureThreshold": 30 },
            "readinessProbe": { "exec": { "command": ["true"] }, "periodSeconds": 60 }
        }] }
    }))).await;
    wait_for(&client, &ns, "prompt", 60, "Running", phase("Running")).await;
    let p = wait_for(&client, &ns, "prompt", 20, "ready", ready).await;
    assert_eq!(container_status(&p).started, Some(true));
    drop_namespace(&client, &ns).await;
}
