//! Deleted pods: a graceful delete, a force delete, a pod deleted while pending, pods deleted while the agent was down, and one whose cleanup fails.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_while_pending_is_failed_before_it_is_deleted() {
    let mut n = Node::start().await;
    let image = "registry.example/missing:1";
    n.cri.fail_pull(image, "pull access denied");
    let web = n.bind(pod("web").container("c", image).build());
    n.sync(&web).await;
    assert_eq!(n.status("web").phase.as_deref(), Some("Pending"));
    n.delete_gracefully("web", 30);
    n.cri_calls();
    n.api_calls();
    // Nothing runs: the sandbox goes, the final status is written, then the
    // pod is deleted (as the kubelet's TerminatePod, then deletePod).
    for _ in 0..5 {
        n.sync_watched("web").await;
        if n.api.pod("web").is_none() {
            break;
        }
    }
    let requests = n.api.take_requests();
    let lines: Vec<String> = requests.iter().map(api::Seen::line).collect();
    let patch = lines
        .iter()
        .rposition(|l| l == WEB_STATUS)
        .expect("a final status patch");
    let delete = lines
        .iter()
        .position(|l| l == "DELETE /api/v1/namespaces/default/pods/web")
        .expect("the delete");
    assert!(patch < delete, "{lines:?}");
    let status = &requests[patch].body["status"];
    assert_eq!(status["phase"], "Failed", "{status}");
    let terminated = &status["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(terminated["reason"], "ContainerStatusUnknown", "{status}");
    assert_eq!(terminated["exitCode"], 137);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_delete_stops_reports_then_removes_and_deletes_once() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    n.cri_calls();
    n.api_calls();
    n.delete_gracefully("web", 30);
    // Stop within the grace period, then report the terminated container.
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["StopContainer c 30", "StopPodSandbox web"]);
    assert_eq!(n.api_calls(), [WEB_STATUS]);
    assert_eq!(state(&n.status("web"), "c").0, "terminated:Error");
    n.event("Killing", "Stopping container c").await;
    // Then remove everything and delete the pod (grace 0, UID precondition).
    let last = n.watched("web");
    n.sync(&last).await;
    assert_eq!(
        n.cri_calls(),
        [
            "StopPodSandbox web",
            "RemoveContainer c",
            "RemovePodSandbox web"
        ]
    );
    let requests = n.api.take_requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(
        requests[0].line(),
        "DELETE /api/v1/namespaces/default/pods/web"
    );
    assert_eq!(requests[0].body["gracePeriodSeconds"], 0);
    assert_eq!(requests[0].body["preconditions"]["uid"], "uid-web");
    assert!(n.api.pod("web").is_none());
    // The API's last update of the pod arrives after: nothing happens again.
    let action = n.sync(&last).await;
    assert_eq!((n.cri_calls(), n.api_calls()), (vec![], vec![]));
    assert_eq!(action, Action::await_change());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_deleted_pod_is_cleaned_up_once_the_watch_has_dropped_it() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    n.cri_calls();
    n.api.remove_pod("web");
    n.api_calls();
    let (rt, client) = (n.ctx.cri(), n.api.client());
    let store = n.ctx.pods().clone();
    let logs = n.ctx.node().pod_logs_dir.clone();
    let cleanup =
        || crate::pod::housekeeping::cleanup_orphans(rt, &client, &store, n.ctx.volumes(), &logs);
    // The watch has not dropped it yet: housekeeping leaves it alone.
    assert_eq!(cleanup().await.expect("housekeeping").removed, 0);
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    n.pods.api_event(watcher::Event::Delete(web));
    assert_eq!(cleanup().await.expect("housekeeping").removed, 1);
    assert_eq!(
        n.cri_calls(),
        [
            "StopContainer c 2",
            "RemoveContainer c",
            "StopPodSandbox web",
            "RemovePodSandbox web"
        ]
    );
    assert_eq!(n.api_calls(), ["GET /api/v1/namespaces/default/pods/web"]);
    assert!(n.cri.sandboxes().is_empty());
    // The managers forget it too.
    assert_eq!(n.ctx.status().cached(), 1);
    crate::pod::housekeeping::forget_gone(&n.ctx, n.ctx.pods());
    assert_eq!(n.ctx.status().cached(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_deleted_while_the_agent_was_down_are_removed_but_not_those_the_api_still_has() {
    let mut n = Node::start().await;
    let gone = n.bind(pod("gone").container("c", IMAGE).build());
    let kept = n.bind(pod("kept").container("c", IMAGE).build());
    n.sync(&gone).await;
    n.sync(&kept).await;
    n.cri_calls();
    // The agent restarts: its store is empty (not listed yet); `gone` was
    // deleted from the API meanwhile, `kept` was not.
    n.api.remove_pod("gone");
    let fresh = n.restart().await;
    fresh.api_calls();
    let client = fresh.api.client();
    let removed = crate::pod::housekeeping::cleanup_orphans(
        fresh.ctx.cri(),
        &client,
        fresh.ctx.pods(),
        fresh.ctx.volumes(),
        &fresh.ctx.node().pod_logs_dir,
    )
    .await
    .expect("housekeeping")
    .removed;
    assert_eq!(removed, 1);
    let mut calls = fresh.cri_calls();
    calls.sort();
    assert_eq!(
        calls,
        [
            "RemoveContainer c",
            "RemovePodSandbox gone",
            "StopContainer c 2",
            "StopPodSandbox gone"
        ]
    );
    let names: Vec<String> = fresh.cri.sandboxes().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["kept"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_only_the_runtime_has_whose_cleanup_fails_is_counted_until_it_is_gone() {
    let mut n = Node::start().await;
    let gone = n.bind(pod("gone").container("c", IMAGE).build());
    n.sync(&gone).await;
    n.api.remove_pod("gone");
    let fresh = n.restart().await;
    let client = fresh.api.client();
    let cleanup = || {
        crate::pod::housekeeping::cleanup_orphans(
            fresh.ctx.cri(),
            &client,
            fresh.ctx.pods(),
            fresh.ctx.volumes(),
            &fresh.ctx.node().pod_logs_dir,
        )
    };
    // The runtime refuses to stop the container: the pod stays, counted as
    // a runtime-only pod still terminating, and the pass goes on.
    fresh
        .cri
        .fail_next("StopContainer", tonic::Code::Unavailable, "runtime busy");
    let first = cleanup().await.expect("housekeeping");
    assert_eq!(first.left, 1);
    assert_eq!(fresh.cri.sandboxes().len(), 1);
    let census = fresh.ctx.sources().census();
    let counts = crate::pod::housekeeping::pod_counts(&census, |_| "sync", first.left);
    assert_eq!(
        counts
            .working
            .get(&("terminating", "runtime_only", "unknown")),
        Some(&1)
    );
    // The next pass removes it.
    let second = cleanup().await.expect("housekeeping");
    assert_eq!((second.left, second.removed), (0, 1));
    assert!(fresh.cri.sandboxes().is_empty());
}
