//! The reset of a node the agent leaves for good (the Helm chart's uninstall, `node::reset`): every pod, its directory and the Node go.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_removes_every_pod_its_directory_and_the_node() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    let db = n.bind(pod("db").container("c", IMAGE).build());
    n.sync(&web).await;
    n.sync(&db).await;
    n.api.put_node("companion");
    let pods_dir = n.ctx.volumes().root_dir().join("pods");
    assert_eq!(std::fs::read_dir(&pods_dir).expect("pod dirs").count(), 2);
    n.api_calls();
    n.cri_calls();

    let client = n.api.client();
    let target = crate::node::reset::Target {
        runtime: n.ctx.cri(),
        volumes: n.ctx.volumes(),
        pod_logs_dir: &n.ctx.node().pod_logs_dir,
        client: &client,
        node: "companion",
        bridge: None,
        cgroups: None,
    };
    let report = crate::node::reset::reset(target).await;
    assert_eq!(report.errors, Vec::<String>::new());
    assert_eq!(
        (
            report.containers,
            report.sandboxes,
            report.pod_dirs,
            report.pods
        ),
        (2, 2, 2, 2)
    );
    assert!(report.node_deleted && report.bridge_deleted);
    assert!(n.cri.sandboxes().is_empty());
    assert_eq!(std::fs::read_dir(&pods_dir).expect("pod dirs").count(), 0);
    assert!(n.api.pod("web").is_none() && n.api.pod("db").is_none());
    assert!(!n.api.has_node("companion"));
    let mut calls = n.api_calls();
    calls.sort();
    assert_eq!(
        calls,
        [
            "DELETE /api/v1/namespaces/default/pods/db",
            "DELETE /api/v1/namespaces/default/pods/web",
            "DELETE /api/v1/nodes/companion",
            "GET /api/v1/pods",
        ]
    );
    // Again: nothing left, and a Node already gone is no error.
    let again = crate::node::reset::reset(target).await;
    assert_eq!(again.errors, Vec::<String>::new());
    assert_eq!((again.containers, again.sandboxes, again.pods), (0, 0, 0));
    assert!(again.node_deleted);
}
