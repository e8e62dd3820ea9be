//! End-to-end scenarios of container lifecycle hooks and termination on the
//! local cluster (`hack/local-up.sh --agent rustlet`): postStart and preStop
//! hooks (exec, httpGet, sleep) reaching a logging server pod, a failed
//! postStart hook, a preStop sleep cut short by a second deletion with a
//! shorter grace period, and `activeDeadlineSeconds` set on a running pod.

use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

/// A container that exits at once on SIGTERM.
const TERM_EXITS: &str = "trap 'exit 0' TERM; sleep 3600 & wait";

/// Starts a hook server pod (agnhost netexec on 8080); returns it running (with its IP).
async fn server(client: &Client, ns: &str) -> Pod {
    create(
        client,
        ns,
        &from_json(serde_json::json!({
            "metadata": { "name": "server" },
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "s",
                    "image": AGNHOST,
                    "command": ["/agnhost", "netexec", "--http-port=8080"]
                }]
            }
        })),
    )
    .await;
    wait_for(client, ns, "server", 60, "Running", phase("Running")).await
}

fn pod_ip(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP")
}

/// Waits up to `secs` for the server pod's log to contain `want`.
async fn server_saw(ns: &str, server: &Pod, want: &str, secs: u64) {
    let path = log_path(ns, "server", &server.uid().unwrap(), "s");
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.contains(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the server never saw {want:?}: {text:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A pod named `name` with one busybox container that exits on SIGTERM and
/// has `lifecycle`.
fn hooked(name: &str, grace: i64, lifecycle: serde_json::Value) -> Pod {
    from_json(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "terminationGracePeriodSeconds": grace,
            "containers": [{
                "name": "c", "image": BUSYBOX, "command": ["sh", "-c", TERM_EXITS],
                "lifecycle": lifecycle
            }]
        }
    }))
}

/// Deletes pod `name` with `grace` seconds.
async fn delete(client: &Client, ns: &str, name: &str, grace: u32) {
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default().grace_period(grace))
        .await
        .expect("delete pod");
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn post_start_and_pre_stop_exec_and_http_hooks_run() {
    let client = client().await;
    let ns = namespace(&client, "e2e-hooks").await;
    let srv = server(&client, &ns).await;
    let ip = pod_ip(&srv);
    let get = |msg: &str| format!("wget -q -O /dev/null 'http://{ip}:8080/echo?msg={msg}'");
    let http = |msg: &str| serde_json::json!({ "httpGet": { "host": ip, "port": 8080, "path": format!("/echo?msg={msg}") } });
    let pods = [
        (
            "exec",
            serde_json::json!({
                "postStart": { "exec": { "command": ["sh", "-c", get("poststart-exec")] } },
                "preStop": { "exec": { "command": ["sh", "-c", get("prestop-exec")] } }
            }),
        ),
        (
            "http",
            serde_json::json!({
                "postStart": http("poststart-http"),
                "preStop": http("prestop-http")
            }),
        ),
    ];
    for (name, lifecycle) in &pods {
        create(&client, &ns, &hooked(name, 10, lifecycle.clone())).await;
    }
    for (name, _) in &pods {
        wait_for(&client, &ns, name, 60, "Running", phase("Running")).await;
        server_saw(&ns, &srv, &format!("msg=poststart-{name}"), 5).await;
    }
    for (name, _) in &pods {
        let p = Api::<Pod>::namespaced(client.clone(), &ns)
            .get(name)
            .await
            .unwrap();
        delete(&client, &ns, name, 10).await;
        wait_deleted(&client, &ns, name, &p.uid().unwrap(), 30).await;
        server_saw(&ns, &srv, &format!("msg=prestop-{name}"), 5).await;
    }
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_failed_post_start_hook_kills_and_restarts_the_container() {
    let client = client().await;
    let ns = namespace(&client, "e2e-hookfail").await;
    create(
        &client,
        &ns,
        &hooked(
            "fail",
            2,
            serde_json::json!({ "postStart": { "exec": { "command": ["sh", "-c", "exit 3"] } } }),
        ),
    )
    .await;
    wait_for(&client, &ns, "fail", 60, "restarted", |p: Option<&Pod>| {
        p.and_then(|p| {
            p.status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .first()
                .cloned()
        })
        .is_some_and(|c| c.restart_count >= 1)
    })
    .await;
    let failed = wait_for_event(&client, &ns, Involving::Any, "FailedPostStartHook").await;
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    let msg = failed.message.as_deref().unwrap_or_default();
    assert!(
        msg.starts_with("Exec lifecycle hook ([sh -c exit 3]) for Container \"c\" in Pod \"fail_"),
        "{msg}"
    );
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn pre_stop_sleep_delays_the_stop_and_a_shorter_grace_cuts_it() {
    let client = client().await;
    let ns = namespace(&client, "e2e-sleep").await;
    let sleep = |secs: i64| serde_json::json!({ "preStop": { "sleep": { "seconds": secs } } });
    create(&client, &ns, &hooked("full", 30, sleep(4))).await;
    create(&client, &ns, &hooked("cut", 60, sleep(40))).await;
    let full = wait_for(&client, &ns, "full", 60, "Running", phase("Running")).await;
    let cut = wait_for(&client, &ns, "cut", 60, "Running", phase("Running")).await;

    // The sleep runs to its end, then the container stops at once.
    let t0 = Instant::now();
    delete(&client, &ns, "full", 30).await;
    wait_deleted(&client, &ns, "full", &full.uid().unwrap(), 30).await;
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_secs(4) && took < Duration::from_secs(15),
        "deletion took {took:?}"
    );

    // A second deletion with 3 s ends a 40 s sleep within about 3 s.
    delete(&client, &ns, "cut", 60).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t1 = Instant::now();
    delete(&client, &ns, "cut", 3).await;
    wait_deleted(&client, &ns, "cut", &cut.uid().unwrap(), 30).await;
    let took = t1.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(12),
        "deletion after the shorter grace period took {took:?}"
    );
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn active_deadline_set_on_a_running_pod_fails_it() {
    let client = client().await;
    let ns = namespace(&client, "e2e-deadline").await;
    create(&client, &ns, &hooked("dl", 2, serde_json::json!({}))).await;
    wait_for(&client, &ns, "dl", 60, "Running", phase("Running")).await;
    let t0 = Instant::now();
    Api::<Pod>::namespaced(client.clone(), &ns)
        .patch(
            "dl",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "activeDeadlineSeconds": 5 } })),
        )
        .await
        .expect("set activeDeadlineSeconds");
    let failed = wait_for(&client, &ns, "dl", 40, "Failed", phase("Failed")).await;
    let st = failed.status.unwrap();
    assert_eq!(st.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(
        st.message.as_deref(),
        Some("Pod was active on the node longer than the specified deadline")
    );
    let cs = st.container_statuses.unwrap();
    assert!(cs[0].state.as_ref().unwrap().terminated.is_some(), "{cs:?}");
    // The deadline counts from the pod's start, not from the update.
    assert!(t0.elapsed() < Duration::from_secs(20));
    drop_namespace(&client, &ns).await;
}
