//! Evicted pods, through the seams the eviction manager is given (`pod::eviction_pods`): stopped at once, with their grace period, when the status write fails, gone from the active pods, and their content reclaimed.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_pod_is_stopped_at_once_and_fails_with_the_eviction() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    n.cri_calls();
    let message = "The node was low on resource: memory. ";
    n.evict("web", message, None).await;
    // Grace 1 s, raised to the kubelet's minimum of 2 s for a kill.
    assert_eq!(n.cri_calls(), ["StopContainer c 2", "StopPodSandbox web"]);
    let st = n.status("web");
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(st.reason.as_deref(), Some("Evicted"));
    assert_eq!(st.message.as_deref(), Some(message));
    let target = st
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("DisruptionTarget");
    assert_eq!(
        (target.status.as_str(), target.reason.as_deref()),
        ("True", Some("TerminationByKubelet"))
    );
    assert!(state(&n.status("web"), "c").0.starts_with("terminated:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_evicted_for_a_soft_threshold_stops_with_the_grace_period_it_was_given() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    n.cri_calls();
    n.evict("web", "low on disk", Some(7)).await;
    assert_eq!(n.cri_calls(), ["StopContainer c 7", "StopPodSandbox web"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_whose_status_write_failed_still_stops_the_pod() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    n.cri_calls();
    // Recorded, but the status never reached the API server.
    let eviction = crate::eviction::Eviction {
        reason: crate::reasons::pod::EVICTED,
        message: "The node was low on resource: memory. ".into(),
        disruption: true,
        grace: 1,
        at: Timestamp::now(),
    };
    n.ctx
        .record_eviction(web.metadata.uid.as_deref().unwrap(), eviction);
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["StopContainer c 2", "StopPodSandbox web"]);
    let st = n.status("web");
    assert_eq!(
        (st.phase.as_deref(), st.reason.as_deref()),
        (Some("Failed"), Some("Evicted"))
    );
    assert!(
        st.conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "DisruptionTarget" && c.status == "True")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_pod_leaves_the_active_pods_and_is_cleaned_up_once_stopped() {
    use crate::eviction::Pods as _;
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    let other = n.bind(pod("other").container("c", IMAGE).build());
    n.sync(&web).await;
    n.sync(&other).await;
    let pods = n.eviction_pods();
    let names = |pods: &crate::pod::eviction_pods::EvictionPods| {
        let mut names: Vec<String> = pods
            .active_pods()
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&pods), ["other", "web"]);
    let uid = web.metadata.uid.clone().expect("uid");
    assert!(!pods.pod_cleaned_up(&uid).await, "its container runs");
    n.evict("web", "The node was low on resource: memory. ", None)
        .await;
    // Being evicted: no longer a candidate, and its containers stopped.
    assert_eq!(names(&pods), ["other"]);
    n.sync_watched("web").await;
    assert!(pods.pod_cleaned_up(&uid).await);
    assert!(
        !pods
            .pod_cleaned_up(other.metadata.uid.as_deref().expect("uid"))
            .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_gc_removes_an_evicted_pods_content_and_its_status_stays_failed() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    let other = n.bind(pod("other").container("c", IMAGE).build());
    n.sync(&web).await;
    n.sync(&other).await;
    n.evict(
        "web",
        "The node was low on resource: ephemeral-storage. ",
        None,
    )
    .await;
    let failed = n.status("web");
    assert_eq!(failed.phase.as_deref(), Some("Failed"));
    n.watched("web");
    n.cri_calls();
    // Periodic collection: the failed evicted pod's content goes, the
    // running pod's stays.
    let policy = crate::container_gc::Policy::default();
    let done = crate::pod::housekeeping::collect_containers(&n.ctx, policy, false)
        .await
        .expect("collect");
    assert_eq!((done.containers, done.sandboxes), (1, 1));
    let left: Vec<String> = n
        .cri
        .containers()
        .iter()
        .map(|c| c.pod_uid.clone())
        .collect();
    assert_eq!(left, [other.metadata.uid.clone().unwrap()]);
    // The pod worker neither starts it again nor changes what it reported.
    n.cri_calls();
    n.sync_watched("web").await;
    assert!(
        n.cri_calls().iter().all(|c| c.starts_with("List")
            || c.starts_with("ContainerStatus")
            || c.starts_with("PodSandboxStatus")),
        "the runtime was changed"
    );
    let after = n.status("web");
    assert_eq!(after.phase.as_deref(), Some("Failed"));
    assert_eq!(after.container_statuses, failed.container_statuses);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_succeeded_pods_containers_stay_until_the_eviction_manager_reclaims_disk() {
    let mut n = Node::start().await;
    let policy = crate::container_gc::Policy::default();
    let job = n.bind(
        pod("job")
            .container("c", IMAGE)
            .restart_policy("Never")
            .build(),
    );
    n.sync(&job).await;
    let uid = job.metadata.uid.clone().unwrap();
    assert!(n.cri.exit_named(&uid, "c", 0));
    n.sync_watched("job").await;
    n.sync_watched("job").await;
    assert_eq!(n.status("job").phase.as_deref(), Some("Succeeded"));
    n.watched("job");
    let done = crate::pod::housekeeping::collect_containers(&n.ctx, policy, false)
        .await
        .expect("collect");
    assert_eq!(done.containers, 0);
    let done = crate::pod::housekeeping::collect_containers(&n.ctx, policy, true)
        .await
        .expect("collect");
    assert_eq!(done.containers, 1);
    assert!(n.cri.containers().iter().all(|c| c.pod_uid != uid));
    n.sync_watched("job").await;
    assert_eq!(n.status("job").phase.as_deref(), Some("Succeeded"));
}
