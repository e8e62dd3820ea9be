//! Scenarios of what must not outlive a pod: a force-deleted pod's probe
//! workers, their metrics and what the managers hold of it; and a runtime
//! error while probing, which the kubelet throws away rather than count.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ExecAction, Probe};
use kube::runtime::watcher;
use tonic::Code;

use super::{IMAGE, Node, edit_container, reconcile, state};
use crate::fixtures::pod;

fn exec_probe(command: &str) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec![command.into()]),
        }),
        period_seconds: Some(1),
        failure_threshold: Some(1),
        ..Default::default()
    }
}

/// The `prober_probe_total` lines of pod `uid`.
fn probe_series(uid: &str) -> Vec<String> {
    let label = format!("pod_uid=\"{uid}\"");
    crate::metrics::metrics()
        .encode_probes()
        .expect("encode")
        .lines()
        .filter(|l| l.starts_with("prober_probe_total{") && l.contains(&label))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_deleted_pod_stops_its_probes_and_every_manager_forgets_it() {
    let mut n = Node::start().await;
    let uid = "uid-forced";
    let failing = "registry.example/forced:1";
    n.cri.fail_pull(failing, "pull access denied");
    let mut p = pod("forced")
        .container("c", IMAGE)
        .container("d", failing)
        .build();
    edit_container(&mut p, |c| {
        c.readiness_probe = Some(exec_probe("ready"));
        c.liveness_probe = Some(exec_probe("live"));
    });
    let forced = n.bind(p);
    crate::metrics::metrics().pod_seen(uid);
    n.sync(&forced).await;
    for _ in 0..50 {
        if probe_series(uid).len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(probe_series(uid).len(), 2, "{:?}", probe_series(uid));
    assert!(n.ctx.runtime.images.tracks(uid), "a pull back-off");
    assert_eq!(n.ctx.status.cached(), 1);
    // Force-deleted: gone from the API and the watch at once; no sync sees it.
    n.api.remove_pod("forced");
    n.pods
        .apply_watcher_event(&watcher::Event::Delete(forced.clone()));
    super::super::housekeeping::forget_gone(&n.ctx, &n.ctx.runtime.pods);
    assert_eq!(n.ctx.prober.pods(), Vec::<String>::new());
    assert_eq!(probe_series(uid), Vec::<String>::new());
    assert!(!crate::metrics::metrics().tracks_pod(uid));
    assert!(!n.ctx.runtime.images.tracks(uid));
    assert_eq!(n.ctx.status.cached(), 0);
    // A sync that was under way when the pod went starts no worker again.
    let stale = reconcile(Arc::new(forced.clone()), n.ctx.clone());
    let _ = tokio::time::timeout(Duration::from_secs(20), stale).await;
    assert_eq!(n.ctx.prober.pods(), Vec::<String>::new());
    // And nothing probes it any more.
    let execs = n.cri.execs().len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(n.cri.execs().len(), execs, "{:?}", n.cri.execs());
    assert_eq!(probe_series(uid), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_error_while_probing_is_thrown_away_not_counted_as_a_failure() {
    let mut n = Node::start().await;
    let uid = "uid-errprobe";
    let mut p = pod("errprobe").container("c", IMAGE).build();
    edit_container(&mut p, |c| c.liveness_probe = Some(exec_probe("check")));
    let errprobe = n.bind(p);
    n.sync(&errprobe).await;
    n.cri_calls();
    // Every ExecSync fails in the runtime: the container is not found, then
    // the runtime is unavailable. With a failure threshold of 1, a single
    // counted failure would restart the container.
    for _ in 0..200 {
        n.cri
            .fail_next("ExecSync", Code::NotFound, "container not found");
        n.cri
            .fail_next("ExecSync", Code::Unavailable, "runtime unavailable");
    }
    n.event(
        "Unhealthy",
        "Liveness probe errored and resulted in unknown state",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    n.sync_watched("errprobe").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new(), "no restart");
    assert_eq!(state(&n.status("errprobe"), "c"), ("running".into(), 0));
    let failed: Vec<String> = probe_series(uid)
        .into_iter()
        .filter(|l| !l.contains("result=\"successful\""))
        .collect();
    assert_eq!(failed, Vec::<String>::new(), "errors are not counted");
    assert!(
        !n.api
            .events()
            .iter()
            .any(|(r, m)| r == "Unhealthy" && m.contains("probe failed")),
        "{:?}",
        n.api.events()
    );
}
