//! A pod's life in the pod worker: sandbox and containers, pulls and their back-off, CrashLoopBackOff, init containers and sidecars, probes, the status patches a sync sends, a dead sandbox, the active deadline, and the restart of all containers.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_pod_gets_a_sandbox_and_its_containers_and_one_status_patch() {
    let mut n = Node::start().await;
    let web = n.bind(
        pod("web")
            .container("a", IMAGE)
            .container("b", IMAGE)
            .build(),
    );
    let action = n.sync(&web).await;
    assert_eq!(n.cri_calls(), started(&["a", "b"]));
    assert_eq!(n.api_calls(), [WEB_STATUS]);
    let st = n.status("web");
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(state(&st, "a"), ("running".into(), 0));
    assert_eq!(state(&st, "b"), ("running".into(), 0));
    assert!(st.pod_ip.is_some_and(|ip| ip.starts_with("10.244.")));
    assert_eq!(
        requeue(&action),
        Some(Duration::from_secs(2)),
        "resync without PLEG"
    );
    n.event("Pulled", "already present on machine").await;
    n.event("Started", "Started container a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pull_backs_off_without_pulling_again() {
    let mut n = Node::start().await;
    let image = "registry.example/app:1";
    n.cri.fail_pull(image, "pull access denied");
    let web = n.bind(pod("web").container("c", image).build());
    n.sync(&web).await;
    assert_eq!(
        n.cri_calls(),
        ["RunPodSandbox default/web", &format!("PullImage {image}")]
    );
    assert_eq!(state(&n.status("web"), "c").0, "waiting:ErrImagePull");
    n.event("Failed", "pull access denied").await;
    // The next sync is inside the back-off: no pull, ImagePullBackOff.
    n.cri.allow_pull(image);
    let action = n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    assert_eq!(state(&n.status("web"), "c").0, "waiting:ImagePullBackOff");
    let wait = requeue(&action).expect("a requeue");
    assert!(wait <= Duration::from_secs(10), "{wait:?}");
    n.event("BackOff", "Back-off pulling image").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_too_long_fqdn_fails_the_sandbox_in_the_kubelet_words() {
    let mut n = Node::start().await;
    let mut p = pod("hostfqdnveryveryveryverylongforfqdntobemorethan64bytes")
        .container("c", IMAGE)
        .build();
    if let Some(spec) = p.spec.as_mut() {
        spec.subdomain = Some("t".into());
        spec.set_hostname_as_fqdn = Some(true);
    }
    let p = n.bind(p);
    n.ctx.set_pleg_connected(true);
    let action = n.sync(&p).await;
    assert_eq!(n.cri_calls(), Vec::<String>::new(), "no sandbox is created");
    // Tried again after the pod worker's back-off, as a failed sync.
    let wait = requeue(&action).expect("a requeue");
    assert!(
        wait >= Duration::from_secs(10) && wait <= Duration::from_secs(15),
        "{wait:?}"
    );
    n.event(
        "FailedCreatePodSandBox",
        "Failed to create pod sandbox: failed to construct FQDN from pod hostname and cluster domain, FQDN ",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_container_restarts_at_once_then_after_its_back_off_deadline() {
    let mut n = Node::start().await;
    n.cri.script_exit_on_start("c", 1);
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    // The first restart has no back-off.
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["CreateContainer c", "StartContainer c"]);
    // The second waits 10 s: CrashLoopBackOff, requeued for the deadline
    // (sooner than the `syncFrequency` resync of a node whose PLEG has runtime
    // events).
    n.ctx.set_pleg_connected(true);
    let action = n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    assert_eq!(
        state(&n.status("web"), "c"),
        ("waiting:CrashLoopBackOff".into(), 1)
    );
    let wait = requeue(&action).expect("a requeue");
    assert!(
        wait > Duration::from_secs(8) && wait <= Duration::from_secs(10),
        "{wait:?}"
    );
    n.event(
        "BackOff",
        "Back-off restarting failed container c in pod web_default(uid-web)",
    )
    .await;
    // Once the deadline has passed, it restarts.
    let last = n.cri.containers().into_iter().max_by_key(|c| c.attempt);
    let past = Timestamp::now().as_nanosecond() - 11_000_000_000;
    let past = i64::try_from(past).expect("nanoseconds");
    assert!(n.cri.set_finished_at(&last.expect("a container").id, past));
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["CreateContainer c", "StartContainer c"]);
    assert_eq!(state(&n.status("web"), "c").1, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_one_at_a_time_before_the_main_ones() {
    let mut n = Node::start().await;
    n.cri.script_exit_on_start("i1", 0);
    n.cri.script_exit_on_start("i2", 0);
    let web = n.bind(
        pod("web")
            .init_container("i1", IMAGE)
            .init_container("i2", IMAGE)
            .container("c", IMAGE)
            .build(),
    );
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), started(&["i1"]));
    assert_eq!(n.status("web").phase.as_deref(), Some("Pending"));
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["CreateContainer i2", "StartContainer i2"]);
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["CreateContainer c", "StartContainer c"]);
    let st = n.status("web");
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(state(&st, "i1").0, "terminated:Completed");
    assert_eq!(state(&st, "c").0, "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_starts_first_and_keeps_running_beside_the_main_container() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").sidecar("s", IMAGE).container("c", IMAGE).build());
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), started(&["s"]));
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["CreateContainer c", "StartContainer c"]);
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new(), "nothing to do");
    let st = n.status("web");
    assert_eq!(state(&st, "s").0, "running");
    assert_eq!(state(&st, "c").0, "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_liveness_probe_kills_and_restarts_the_container() {
    let mut n = Node::start().await;
    n.cri.script_exec(["check"], 1, "unhealthy");
    let mut p = pod("web").container("c", IMAGE).build();
    if let Some(c) = p.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.liveness_probe = Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec!["check".into()]),
            }),
            period_seconds: Some(1),
            failure_threshold: Some(1),
            ..Default::default()
        });
    }
    let web = n.bind(p);
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    // Sync until the probe manager has seen the probe fail.
    let calls = n.sync_until_called("web").await;
    assert_eq!(
        calls,
        [
            "StopContainer c 30",
            "CreateContainer c",
            "StartContainer c"
        ]
    );
    n.event("Unhealthy", "Liveness probe failed").await;
    // As the kubelet's `killContainer`: the event says why.
    n.event(
        "Killing",
        "Container c failed liveness probe, will be restarted",
    )
    .await;
    assert_eq!(state(&n.status("web"), "c"), ("running".into(), 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_that_changes_nothing_sends_no_patch() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    assert_eq!(
        (n.cri_calls(), n.api_calls()),
        (started(&["c"]), vec![WEB_STATUS.into()])
    );
    for _ in 0..3 {
        n.sync_watched("web").await;
        assert_eq!((n.cri_calls(), n.api_calls()), (vec![], vec![]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_pod_object_is_seen_with_the_status_last_sent() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    assert_eq!(n.api_calls(), [WEB_STATUS]);
    // The watch has not brought the patched object back: the same object
    // again costs no second patch of the same status.
    n.sync(&web).await;
    assert_eq!((n.cri_calls().len(), n.api_calls()), (3, vec![]));
    // A status the API lost (someone else's write) is written again.
    let mut other = n.api.pod("web").expect("pod");
    other.status = Some(PodStatus::default());
    n.api.put_pod(other);
    n.sync_watched("web").await;
    assert_eq!(n.api_calls(), [WEB_STATUS]);
    assert_eq!(n.status("web").phase.as_deref(), Some("Running"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_sandbox_is_replaced_and_its_containers_started_again() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    n.cri_calls();
    let sandbox = n.cri.sandboxes().pop().expect("a sandbox").id;
    n.ctx
        .cri()
        .stop_pod_sandbox(&sandbox)
        .await
        .expect("stop the sandbox");
    n.cri_calls();
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    n.event("SandboxChanged", "Pod sandbox changed").await;
    let attempts: Vec<u32> = n.cri.sandboxes().iter().map(|s| s.attempt).collect();
    assert!(attempts.contains(&1), "{attempts:?}");
    assert_eq!(state(&n.status("web"), "c"), ("running".into(), 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_past_its_active_deadline_is_killed_and_failed() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    n.cri_calls();
    let mut p = n.api.pod("web").expect("pod");
    if let Some(spec) = p.spec.as_mut() {
        spec.active_deadline_seconds = Some(1);
    }
    if let Some(st) = p.status.as_mut() {
        st.start_time = Some(Time(Timestamp::now() - Duration::from_secs(5)));
    }
    n.api.put_pod(p);
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["StopContainer c 30", "StopPodSandbox web"]);
    let st = n.status("web");
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(st.reason.as_deref(), Some("DeadlineExceeded"));
    n.event("DeadlineExceeded", "longer than the specified deadline")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_exiting_under_restart_all_containers_restarts_the_whole_pod_to_its_mains() {
    let mut n = Node::start().await;
    let mut p = pod("web")
        .restart_policy("Never")
        .init_container("init", IMAGE)
        .sidecar("sidecar", IMAGE)
        .sidecar("source", IMAGE)
        .container("regular", IMAGE)
        .build();
    if let Some(spec) = p.spec.as_mut() {
        let source = &mut spec.init_containers.as_mut().expect("init")[2];
        source.restart_policy_rules =
            Some(vec![k8s_openapi::api::core::v1::ContainerRestartRule {
                action: "RestartAllContainers".into(),
                exit_codes: Some(
                    k8s_openapi::api::core::v1::ContainerRestartRuleOnExitCodes {
                        operator: "In".into(),
                        values: Some(vec![42]),
                    },
                ),
            }]);
    }
    let web = n.bind(p);
    let uid = web.metadata.uid.clone().unwrap_or_default();
    // Up to the main container, one sync per step.
    for _ in 0..6 {
        n.sync_watched("web").await;
        n.cri.exit_named(&uid, "init", 0);
    }
    let running = |n: &Node| {
        n.cri
            .containers()
            .iter()
            .filter(|c| c.state == k8s_cri::v1::ContainerState::ContainerRunning)
            .map(|c| format!("{}/{}", c.name, c.attempt))
            .collect::<Vec<_>>()
    };
    assert_eq!(running(&n), ["sidecar/0", "source/0", "regular/0"]);
    n.cri.exit_named(&uid, "source", 42);
    for _ in 0..8 {
        n.sync_watched("web").await;
        n.cri.exit_named(&uid, "init", 0);
    }
    assert_eq!(running(&n), ["sidecar/1", "source/1", "regular/1"]);
    assert_eq!(n.status("web").phase.as_deref(), Some("Running"));
}

/// After a restart of all containers in place, the container GC (one dead
/// instance kept per container) removes the regular init container's first
/// run: its status keeps its restart count, and loses its last state, as
/// the kubelet's `convertToAPIContainerStatuses` shows an init container
/// with one record left; the others keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_container_gc_after_a_restart_of_all_containers_keeps_every_restart_count() {
    let mut n = Node::start().await;
    let p = pod("web")
        .restart_policy("Never")
        .init_container("init", IMAGE)
        .sidecar("sidecar", IMAGE)
        .container("source", IMAGE)
        .container_restart("Never", &[("RestartAllContainers", "In", &[42])])
        .container("regular", IMAGE)
        .build();
    let web = n.bind(p);
    let uid = web.metadata.uid.clone().unwrap_or_default();
    for _ in 0..6 {
        n.sync_watched("web").await;
        n.cri.exit_named(&uid, "init", 0);
    }
    n.cri.exit_named(&uid, "source", 42);
    for _ in 0..8 {
        n.sync_watched("web").await;
        n.cri.exit_named(&uid, "init", 0);
    }
    // (name, restart count, a terminated last state) of every container.
    let shown = |st: &PodStatus| {
        st.init_container_statuses
            .iter()
            .flatten()
            .chain(st.container_statuses.iter().flatten())
            .map(|c| {
                let last = c
                    .last_state
                    .as_ref()
                    .is_some_and(|s| s.terminated.is_some());
                (c.name.clone(), c.restart_count, last)
            })
            .collect::<Vec<_>>()
    };
    let every = |init_last: bool| {
        vec![
            ("init".to_string(), 1, init_last),
            ("sidecar".to_string(), 1, true),
            ("source".to_string(), 1, true),
            ("regular".to_string(), 1, true),
        ]
    };
    assert_eq!(shown(&n.status("web")), every(true));
    let runtime = n.cri.client(Duration::from_secs(10)).await.expect("client");
    let links = n.dir.path().join("links");
    let policy = crate::container_gc::Policy::default();
    let collected = crate::container_gc::collect(&runtime, policy, i64::MAX, |_| false, &links)
        .await
        .expect("collect");
    assert_eq!(collected.containers, 1, "the init container's first run");
    n.sync_watched("web").await;
    assert_eq!(shown(&n.status("web")), every(false));
}
