//! An agent restart: running containers adopted, not restarted; readiness kept until the probes run; an init container the runtime lost after initialization not run again.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_agent_restart_running_containers_are_adopted_not_restarted() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").sidecar("s", IMAGE).container("c", IMAGE).build());
    n.sync(&web).await;
    n.sync_watched("web").await;
    n.cri_calls();
    n.api_calls();
    let mut fresh = n.restart().await;
    fresh.bind(n.api.pod("web").expect("pod"));
    fresh.sync_watched("web").await;
    assert_eq!(fresh.cri_calls(), Vec::<String>::new());
    assert_eq!(
        fresh.api_calls(),
        Vec::<String>::new(),
        "the status is unchanged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restart_keeps_a_ready_container_ready_until_its_probes_run() {
    let mut n = Node::start().await;
    // Readiness and startup probes that pass, checked once a minute: the
    // restarted agent has no result of its own for a while.
    let probe = |cmd: &str| Probe {
        exec: Some(ExecAction {
            command: Some(vec![cmd.into()]),
        }),
        period_seconds: Some(60),
        ..Default::default()
    };
    let mut p = pod("web").container("c", IMAGE).build();
    if let Some(c) = p.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.readiness_probe = Some(probe("ready"));
        c.startup_probe = Some(probe("started"));
    }
    let web = n.bind(p);
    n.sync(&web).await;
    let ready = |n: &Node| {
        let st = n.status("web");
        let c = st.container_statuses.unwrap_or_default();
        c.first().map(|c| (c.started, c.ready))
    };
    for _ in 0..100 {
        n.sync_watched("web").await;
        if ready(&n) == Some((Some(true), true)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ready(&n), Some((Some(true), true)), "ready before");
    // The container has run for a minute when the agent restarts.
    let a_minute_ago = Timestamp::now()
        .checked_sub(Duration::from_secs(60))
        .unwrap()
        .as_nanosecond();
    assert_eq!(
        n.cri
            .set_started_at("c", i64::try_from(a_minute_ago).unwrap()),
        1
    );
    n.cri.script_exec(["ready"], 1, "not now");
    n.cri_calls();
    let mut fresh = n.restart().await;
    fresh.bind(n.api.pod("web").expect("pod"));
    fresh.api_calls();
    fresh.sync_watched("web").await;
    assert_eq!(
        ready(&fresh),
        Some((Some(true), true)),
        "started and ready as last reported"
    );
    assert_eq!(fresh.cri_calls(), Vec::<String>::new(), "nothing restarted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_init_container_the_runtime_lost_after_initialization_is_not_run_again() {
    let mut n = Node::start().await;
    n.cri.script_exit_on_start("init", 0);
    let web = n.bind(
        pod("web")
            .init_container("init", IMAGE)
            .container("c", IMAGE)
            .build(),
    );
    for _ in 0..5 {
        n.sync_watched("web").await;
    }
    assert_eq!(state(&n.status("web"), "c"), ("running".into(), 0));
    let init = n
        .cri
        .containers()
        .into_iter()
        .find(|c| c.name == "init")
        .expect("the init container's record");
    let runtime = n.cri.client(Duration::from_secs(5)).await.unwrap();
    runtime.remove_container(&init.id).await.unwrap();
    n.cri_calls();
    // The agent restarts without the pod's status (a static pod's is not
    // kept): the init container is not run again, and reads as exited 0.
    let mut fresh = n.restart().await;
    let mut bare = web.clone();
    bare.status = None;
    fresh.bind(bare);
    fresh.sync_watched("web").await;
    assert_eq!(fresh.cri_calls(), Vec::<String>::new(), "nothing run again");
    let st = fresh.status("web");
    let init_status = st
        .init_container_statuses
        .unwrap_or_default()
        .into_iter()
        .next()
        .expect("init status");
    let t = init_status
        .state
        .and_then(|s| s.terminated)
        .expect("terminated");
    assert_eq!(
        (t.exit_code, t.reason.as_deref(), t.message.as_deref()),
        (
            0,
            Some("Completed"),
            Some(crate::pod_core::status::INIT_STATUS_LOST)
        )
    );
    assert!(init_status.ready);
    assert_eq!(state(&fresh.status("web"), "c"), ("running".into(), 0));
}
