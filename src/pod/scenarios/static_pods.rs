//! Scenarios of static pods: one read from a manifest runs without the API
//! server having it, gets a mirror pod that carries its status, gets it
//! back when the mirror pod is deleted, and stops when its manifest goes,
//! its mirror pod deleted after it.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use super::{IMAGE, Node};
use crate::static_pod;

/// The pods a manifest of pod `web` defines on `node-1`.
fn manifest_pods(n: &Node, grace: i64) -> BTreeMap<String, Pod> {
    let path = n.dir.path().join("web.yaml");
    let text = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  \
         terminationGracePeriodSeconds: {grace}\n  containers:\n  - name: c\n    image: {IMAGE}\n"
    );
    std::fs::write(&path, text).expect("manifest");
    let listing = static_pod::list(&path, "node-1");
    assert!(listing.errors.is_empty(), "{:?}", listing.errors);
    listing.pods
}

/// Static pod `web-node-1` as the pod workers see it now.
fn stored(n: &Node) -> Option<Arc<Pod>> {
    n.ctx
        .pods()
        .get(&ObjectRef::new("web-node-1").within("default"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_pod_runs_reports_on_its_mirror_pod_and_both_go_with_the_manifest() {
    let n = Node::start().await;
    n.pods.set_static("file", manifest_pods(&n, 1));
    let web = stored(&n).expect("the static pod is a pod to run");
    let uid = web.metadata.uid.clone().expect("uid");
    assert_eq!(static_pod::config_hash(&web), Some(uid.as_str()));

    // First sync: it starts, and its mirror pod is created.
    n.sync(&web).await;
    let calls = n.api_calls();
    assert_eq!(
        calls.first().map(String::as_str),
        Some("POST /api/v1/namespaces/default/pods"),
        "{calls:?}"
    );
    let mirror = n.api.pod("web-node-1").expect("the mirror pod");
    assert!(static_pod::is_mirror_of(&mirror, &web));
    let owner = &mirror.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("Node", "node-1", "node-uid-1")
    );
    assert_eq!(owner.controller, Some(true));
    assert!(n.cri.sandboxes().len() == 1, "the pod runs");

    // The watch brings the mirror pod: the status goes to it, by its UID.
    n.pods.api_event(watcher::Event::Apply(mirror.clone()));
    let web = stored(&n).expect("web");
    n.sync(&web).await;
    let patches: Vec<_> = n
        .api
        .take_requests()
        .into_iter()
        .filter(|r| r.method == "PATCH")
        .collect();
    assert_eq!(patches.len(), 1, "{patches:?}");
    assert_eq!(
        patches[0].path,
        "/api/v1/namespaces/default/pods/web-node-1/status"
    );
    assert_eq!(
        patches[0].body["metadata"]["uid"],
        mirror.metadata.uid.clone().expect("uid").as_str()
    );
    let phase = n.status("web-node-1").phase;
    assert_eq!(phase.as_deref(), Some("Running"));
    // The store shows the static pod with that status (for the node API).
    let shown = stored(&n)
        .and_then(|p| p.status.clone())
        .unwrap_or_default();
    assert_eq!(shown.phase.as_deref(), Some("Running"));
    assert!(shown.container_statuses.is_some_and(|c| c.len() == 1));
    // The same status again costs nothing.
    n.sync(&web).await;
    assert_eq!(n.api_calls(), Vec::<String>::new());

    // Someone deletes the mirror pod: it comes back, with the status again.
    n.api.remove_pod("web-node-1");
    n.pods.api_event(watcher::Event::Delete(mirror.clone()));
    n.sync(&web).await;
    let again = n.api.pod("web-node-1").expect("mirror pod made again");
    assert_ne!(again.metadata.uid, mirror.metadata.uid);
    n.pods.api_event(watcher::Event::Apply(again.clone()));
    n.sync(&web).await;
    assert_eq!(n.status("web-node-1").phase.as_deref(), Some("Running"));
    assert!(n.cri.sandboxes().len() == 1, "the pod itself never stopped");
    n.api_calls();
    n.cri_calls();

    // The manifest goes: the pod stops with its grace period and leaves;
    // the mirror pod stays until then, and is deleted after.
    n.pods.set_static("file", BTreeMap::new());
    let stopping = stored(&n).expect("still there while it stops");
    assert_eq!(stopping.metadata.deletion_grace_period_seconds, Some(1));
    assert!(n.pods.orphan_mirrors().is_empty());
    for _ in 0..20 {
        let Some(pod) = stored(&n) else { break };
        n.sync(&pod).await;
    }
    assert!(stored(&n).is_none(), "the stopped static pod left");
    // Stopped, not removed: the same manifest put back goes on from it.
    assert!(
        n.cri
            .sandboxes()
            .iter()
            .all(|s| s.state == k8s_cri::v1::PodSandboxState::SandboxNotready),
        "the sandbox is stopped"
    );
    // 1 s of grace, raised to the kubelet's 2 s floor when a container stops.
    let calls = n.cri_calls();
    assert!(
        calls.iter().any(|c| c == "StopContainer c 2"),
        "stopped with its grace period: {calls:?}"
    );
    assert!(
        n.api.pod("web-node-1").is_some(),
        "the worker does not delete the mirror pod"
    );
    // Housekeeping deletes it once every source has listed.
    let client = n.api.client();
    let none = super::super::housekeeping::delete_orphan_mirrors(&client, &n.pods).await;
    assert_eq!(none, 0, "the API server's pods are not listed yet");
    n.pods.api_event(watcher::Event::Init);
    n.pods.api_event(watcher::Event::InitApply(again));
    n.pods.api_event(watcher::Event::InitDone);
    let deleted = super::super::housekeeping::delete_orphan_mirrors(&client, &n.pods).await;
    assert_eq!(deleted, 1);
    assert!(n.api.pod("web-node-1").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_pod_starts_before_the_node_is_registered_and_its_mirror_pod_waits() {
    let n = Node::start_unregistered().await;
    n.pods.set_static("file", manifest_pods(&n, 1));
    let web = stored(&n).expect("web");
    n.sync(&web).await;
    // Admitted against the node as the agent knows it, and running.
    assert_eq!(
        n.cri.sandboxes().len(),
        1,
        "the static pod runs: {:?}",
        n.api.events()
    );
    // No Node, so no mirror pod and nowhere to write a status: no request.
    assert_eq!(n.api_calls(), Vec::<String>::new());
    // An API pod waits for the Node instead.
    let mut api_pod = n
        .api
        .put_pod(crate::fixtures::pod("db").container("c", IMAGE).build());
    api_pod.metadata.uid = Some("db-uid".into());
    n.sync(&api_pod).await;
    assert_eq!(
        n.cri.sandboxes().len(),
        1,
        "an API pod is not admitted without the Node"
    );
    // The node as it is registered has its labels (`--node-labels` among
    // them): a static pod that selects them runs, one that selects another
    // node does not.
    for (name, selector) in [
        ("pinned", "node.kubernetes.io/pool: blue"),
        ("elsewhere", "kubernetes.io/hostname: node-2"),
    ] {
        let path = n.dir.path().join(format!("{name}.yaml"));
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  nodeSelector:\n    \
             {selector}\n  containers:\n  - name: c\n    image: {IMAGE}\n"
        );
        std::fs::write(&path, text).expect("manifest");
        let listing = static_pod::list(&path, "node-1");
        assert!(listing.errors.is_empty(), "{:?}", listing.errors);
        n.pods.set_static(name, listing.pods);
        let pod = n
            .ctx
            .pods()
            .get(&ObjectRef::new(&format!("{name}-node-1")).within("default"))
            .expect("stored");
        n.sync(&pod).await;
    }
    assert_eq!(
        n.cri.sandboxes().len(),
        2,
        "the pod selecting node-1 runs, the other not"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_pod_with_an_extreme_grace_period_runs_and_stops_without_harm() {
    // The runtime gets the grace period as is (the kubelet's 2 s floor
    // aside), as the kubelet passes it.
    for (grace, stop) in [
        (-5, "StopContainer c 2".to_string()),
        (i64::MAX, format!("StopContainer c {}", i64::MAX)),
    ] {
        let n = Node::start().await;
        n.pods.set_static("file", manifest_pods(&n, grace));
        let web = stored(&n).expect("web");
        n.sync(&web).await;
        assert_eq!(n.cri.sandboxes().len(), 1, "grace {grace}: it runs");
        n.pods.set_static("file", BTreeMap::new());
        let stopping = stored(&n).expect("stopping");
        // A negative grace period is at least 1 s, as the kubelet stops a
        // removed static pod; a huge one is kept.
        assert_eq!(
            stopping.metadata.deletion_grace_period_seconds,
            Some(grace.max(1))
        );
        n.cri_calls();
        n.sync(&stopping).await;
        let calls = n.cri_calls();
        assert!(calls.contains(&stop), "grace {grace}: {calls:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_pod_removed_and_put_back_restarts_its_container_once() {
    let n = Node::start().await;
    let pods = manifest_pods(&n, 1);
    n.pods.set_static("file", pods.clone());
    let web = stored(&n).expect("web");
    n.sync(&web).await;
    n.pods.set_static("file", BTreeMap::new());
    // Put back while the first still stops: it starts once that one is done.
    n.pods.set_static("file", pods);
    for _ in 0..20 {
        let Some(pod) = stored(&n) else { break };
        if pod.metadata.deletion_timestamp.is_none() {
            break;
        }
        n.sync(&pod).await;
    }
    let again = stored(&n).expect("back");
    assert!(again.metadata.deletion_timestamp.is_none());
    assert_eq!(
        again.metadata.uid, web.metadata.uid,
        "the same manifest, the same UID"
    );
    n.sync(&again).await;
    // As the kubelet's: the stopped container is still there, so the new
    // one is its restart (attempt 1, the restart count the status shows).
    let attempts: Vec<u32> = n.cri.containers().iter().map(|c| c.attempt).collect();
    let mut sorted = attempts.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, [0, 1], "{:?}", n.cri_calls());
}
