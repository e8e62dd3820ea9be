//! Hostile numbers and handlers: the largest grace periods and probe timings, huge limits, a resource divisor too large to hold, a sync that panics, a postStart hook that never returns.

use super::*;

/// A sync that panics with `message`.
async fn panicking_sync(message: String) -> crate::pod::worker::Result<Action> {
    panic!("{message}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_with_the_largest_grace_period_runs_its_pre_stop_hook_and_stops() {
    let mut n = Node::start().await;
    let mut p = pod("web").container("c", IMAGE).build();
    if let Some(spec) = p.spec.as_mut() {
        spec.termination_grace_period_seconds = Some(i64::MAX);
    }
    edit_container(&mut p, |c| {
        c.lifecycle = Some(exec_pre_stop("drain"));
    });
    let web = n.bind(p);
    n.sync(&web).await;
    n.cri_calls();
    n.delete_gracefully("web", i64::MAX);
    // The hook returns at once; the container is stopped with what is left
    // of a grace period no clock can count to the end.
    n.sync_watched("web").await;
    assert_eq!(n.cri.execs(), ["c drain"]);
    assert_eq!(
        n.cri_calls(),
        [
            format!("StopContainer c {}", i64::MAX),
            "StopPodSandbox web".into()
        ]
    );
    assert_eq!(state(&n.status("web"), "c").0, "terminated:Error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_the_largest_probe_timings_and_active_deadline_starts_and_syncs() {
    for deadline in [i64::from(i32::MAX), i64::MAX] {
        let mut n = Node::start().await;
        let mut p = pod("web").container("c", IMAGE).build();
        if let Some(spec) = p.spec.as_mut() {
            spec.active_deadline_seconds = Some(deadline);
        }
        let probe = Probe {
            exec: Some(ExecAction {
                command: Some(vec!["check".into()]),
            }),
            initial_delay_seconds: Some(i32::MAX),
            period_seconds: Some(i32::MAX),
            timeout_seconds: Some(i32::MAX),
            success_threshold: Some(i32::MAX),
            failure_threshold: Some(i32::MAX),
            termination_grace_period_seconds: Some(i64::MAX),
            ..Default::default()
        };
        edit_container(&mut p, |c| {
            c.startup_probe = Some(probe.clone());
            c.liveness_probe = Some(probe.clone());
            c.readiness_probe = Some(probe);
        });
        let web = n.bind(p);
        n.sync(&web).await;
        assert_eq!(n.cri_calls(), started(&["c"]), "deadline {deadline}");
        // The second sync counts the active deadline from the start time the
        // first one reported; no probe is due for 68 years.
        for _ in 0..2 {
            let action = n.sync_watched("web").await;
            assert_eq!(n.cri_calls(), Vec::<String>::new(), "deadline {deadline}");
            assert_eq!(requeue(&action), Some(Duration::from_secs(2)));
        }
        let st = n.status("web");
        assert_eq!(st.phase.as_deref(), Some("Running"));
        assert_eq!(state(&st, "c").0, "running");
        assert!(st.start_time.is_some());
        assert_eq!(n.cri.execs(), Vec::<String>::new());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_with_huge_limits_is_created_with_clamped_resources() {
    let mut n = Node::start().await;
    let mut p = pod("web").container("c", IMAGE).build();
    edit_container(&mut p, |c| {
        c.resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("9e15".into())),
                ("memory".to_string(), Quantity("8Ei".into())),
            ])),
            ..Default::default()
        });
    });
    let web = n.bind(p);
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    let c = n.cri.containers().pop().expect("the container");
    let r = c.linux_resources.expect("Linux resources");
    // Shares at the kernel's maximum, the quota and the memory limit
    // (2^63 bytes, one past i64) saturated, Guaranteed's OOM score.
    assert_eq!(
        (
            r.cpu_shares,
            r.cpu_quota,
            r.cpu_period,
            r.memory_limit_in_bytes,
            r.oom_score_adj
        ),
        (262_144, i64::MAX, 100_000, i64::MAX, -997)
    );
    assert_eq!(state(&n.status("web"), "c").0, "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_that_panics_fails_with_an_event_and_the_pod_syncs_again() {
    use crate::pod::worker::{Error, FAILED_SYNC_NOTE, error_policy, isolated};
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    let sync = panicking_sync(format!("index {} out of range", 7));
    let err = isolated(&web, &n.ctx, sync)
        .await
        .expect_err("a failed sync");
    let Error::Panicked { pod, message } = &err else {
        panic!("not a panic: {err}");
    };
    assert_eq!(
        (pod.as_str(), message.as_str()),
        ("default/web", "index 7 out of range")
    );
    assert_eq!(
        err.to_string(),
        "sync pod default/web: panicked: index 7 out of range"
    );
    n.event("FailedSync", FAILED_SYNC_NOTE).await;
    // The error policy retries it as any failed sync, and the next sync of
    // the pod, through the same wrapper, goes on as usual.
    let action = error_policy(Arc::new(web.clone()), &err, n.ctx.clone());
    assert_eq!(requeue(&action), Some(Duration::from_secs(5)));
    let sync = reconcile(Arc::new(web.clone()), n.ctx.clone());
    isolated(&web, &n.ctx, sync).await.expect("a sync");
    assert_eq!(n.cri_calls(), started(&["c"]));
    assert_eq!(state(&n.status("web"), "c").0, "running");
    // A panic with a static message.
    let sync = async { panic!("static") };
    let err = isolated(&web, &n.ctx, sync)
        .await
        .expect_err("a failed sync");
    assert!(matches!(err, Error::Panicked { message, .. } if message == "static"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_divisor_too_large_to_hold_fails_the_container_config() {
    let mut n = Node::start().await;
    let mut p = pod("web").container("c", IMAGE).build();
    edit_container(&mut p, |c| {
        c.env = Some(vec![EnvVar {
            name: "CPU".into(),
            value_from: Some(EnvVarSource {
                resource_field_ref: Some(ResourceFieldSelector {
                    resource: "limits.cpu".into(),
                    divisor: Some(Quantity("1e2147483647".into())),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]);
    });
    let web = n.bind(p);
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), ["RunPodSandbox default/web"]);
    let st = n.status("web");
    let waiting = st
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "c");
    let waiting = waiting
        .and_then(|c| c.state.clone()?.waiting)
        .expect("waiting");
    assert_eq!(
        waiting.reason.as_deref(),
        Some("CreateContainerConfigError")
    );
    assert!(
        waiting
            .message
            .is_some_and(|m| m.contains("invalid quantity \"1e2147483647\"")),
    );
    n.event("Failed", "invalid quantity").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_liveness_kill_with_the_largest_probe_grace_period_runs_the_hook_and_restarts() {
    let mut n = Node::start().await;
    n.cri.script_exec(["check"], 1, "unhealthy");
    let mut p = pod("web").container("c", IMAGE).build();
    edit_container(&mut p, |c| {
        c.liveness_probe = Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec!["check".into()]),
            }),
            period_seconds: Some(1),
            failure_threshold: Some(1),
            termination_grace_period_seconds: Some(i64::MAX),
            ..Default::default()
        });
        c.lifecycle = Some(exec_pre_stop("drain"));
    });
    let web = n.bind(p);
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    let calls = n.sync_until_called("web").await;
    assert_eq!(
        calls,
        [
            format!("StopContainer c {}", i64::MAX),
            "CreateContainer c".into(),
            "StartContainer c".into()
        ]
    );
    assert!(n.cri.execs().contains(&"c drain".to_string()));
    assert_eq!(state(&n.status("web"), "c"), ("running".into(), 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_start_hook_that_never_returns_does_not_hold_the_pods_deletion() {
    let mut n = Node::start().await;
    let mut p = pod("web")
        .container("c", IMAGE)
        .container("d", IMAGE)
        .build();
    edit_container(&mut p, |c| {
        c.lifecycle = Some(Lifecycle {
            post_start: Some(LifecycleHandler {
                sleep: Some(SleepAction { seconds: 100_000 }),
                ..Default::default()
            }),
            ..Default::default()
        });
    });
    let web = n.bind(p);
    // The hook holds the sync, as the kubelet runs postStart before the
    // container counts as started.
    let ctx = n.ctx.clone();
    let first = tokio::spawn(reconcile(Arc::new(web), ctx));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!first.is_finished(), "the hook runs");
    assert_eq!(n.cri_calls(), started(&["c"]));
    // Deleted meanwhile: the hook is cut short, the rest of the pass
    // starts nothing, and the sync ends.
    n.delete_gracefully("web", 30);
    n.watched("web");
    let ended = tokio::time::timeout(Duration::from_secs(5), first).await;
    ended
        .expect("the sync ends once the pod is being deleted")
        .expect("the sync does not panic")
        .expect("the sync succeeds");
    assert_eq!(n.cri_calls(), Vec::<String>::new(), "d is not started");
    n.event("FailedPostStartHook", "the pod is being deleted")
        .await;
    // The terminating sync stops the container, then the pod goes.
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["StopContainer c 30", "StopPodSandbox web"]);
    n.sync_watched("web").await;
    assert_eq!(
        n.cri_calls(),
        [
            "StopPodSandbox web",
            "RemoveContainer c",
            "RemovePodSandbox web"
        ]
    );
    assert!(n.api.pod("web").is_none(), "the pod is deleted");
}
