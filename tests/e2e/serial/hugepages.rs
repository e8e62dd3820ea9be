//! Huge pages: with 2 MiB pages reserved on the host and the agent
//! restarted (the pools are read at start, as the kubelet's machine info),
//! the node offers `hugepages-2Mi`. A pod requesting them gets an emptyDir
//! `medium: HugePages` as a hugetlbfs of 2 MiB pages and its request as the
//! huge page limit of its cgroup, above its containers' cgroups (on this
//! cgroup v1 host the `hugetlb` controller sits in the hybrid v2 hierarchy,
//! where runc puts the containers too). A pod with such a volume and no
//! request fails to mount it with the kubelet's message; one asking more
//! than the node has is rejected with `OutOfhugepages-2Mi`. The pool and
//! the agent are put back at the end. It restarts the agent, so it runs
//! alone.

use crate::common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;

const POOL: &str = "/proc/sys/vm/nr_hugepages";
const PAGES: u64 = 8;

/// A pod bound to this node whose container `c` runs `script` with
/// `resources`, mounting an emptyDir of `medium` at /huge.
fn huge_pod(name: &str, medium: &str, resources: serde_json::Value, script: &str) -> Pod {
    from_json(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "nodeName": node_name(),
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "volumes": [{ "name": "huge", "emptyDir": { "medium": medium } }],
            "containers": [{
                "name": "c", "image": BUSYBOX, "command": ["sh", "-c", script],
                "resources": resources,
                "volumeMounts": [{ "name": "huge", "mountPath": "/huge" }]
            }]
        }
    }))
}

fn huge(amount: &str) -> serde_json::Value {
    serde_json::json!({
        "requests": { "memory": "32Mi", "hugepages-2Mi": amount },
        "limits": { "memory": "64Mi", "hugepages-2Mi": amount }
    })
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn huge_page_pods_get_hugetlbfs_and_their_limit_or_the_kubelets_errors() {
    if !std::path::Path::new("/sys/kernel/mm/hugepages/hugepages-2048kB").is_dir() {
        panic!("this kernel has no 2 MiB huge pages");
    }
    let before = std::fs::read_to_string(POOL).expect("nr_hugepages");
    std::fs::write(POOL, PAGES.to_string()).expect("reserve huge pages");
    let reserved: u64 = std::fs::read_to_string(POOL)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(reserved, PAGES, "the kernel reserved fewer pages");
    restart_agent(None);
    let client = client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let want = format!("{}", PAGES * 2 * 1024 * 1024);
    let mut offered = None;
    for _ in 0..60 {
        let node = nodes.get(&node_name()).await.expect("node");
        offered = node
            .status
            .and_then(|s| s.allocatable)
            .and_then(|a| a.get("hugepages-2Mi").map(|q| q.0.clone()));
        if offered.as_deref() == Some(want.as_str()) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    assert_eq!(
        offered.as_deref(),
        Some(want.as_str()),
        "allocatable hugepages-2Mi"
    );

    let ns = namespace(&client, "e2e-hugepages").await;
    let script = "grep ' /huge ' /proc/mounts; cat /proc/self/cgroup; echo done; exec sleep 3600";
    let running = create(
        &client,
        &ns,
        &huge_pod("huge", "HugePages", huge("4Mi"), script),
    )
    .await;
    let uid = running.metadata.uid.expect("uid");
    create(
        &client,
        &ns,
        &huge_pod("nohuge", "HugePages", serde_json::json!({}), "sleep 3600"),
    )
    .await;
    create(
        &client,
        &ns,
        &huge_pod("toomuch", "HugePages-2Mi", huge("64Mi"), "sleep 3600"),
    )
    .await;

    wait_for(&client, &ns, "huge", 90, "Running", phase("Running")).await;
    let mut out = String::new();
    for _ in 0..30 {
        out = logs(&ns, "huge");
        if out.contains("done") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    let mount = out
        .lines()
        .find(|l| l.contains(" /huge "))
        .unwrap_or_default();
    assert!(
        mount.contains(" hugetlbfs ") && mount.contains("pagesize=2M"),
        "the volume is no hugetlbfs of 2 MiB pages: {out}"
    );
    // The pod's cgroup holds its request as the limit; the container's
    // cgroup in that hierarchy is below it.
    let pod_dir = format!("/kubepods/burstable/pod{uid}");
    let limit = std::fs::read_to_string(format!("/sys/fs/cgroup/unified{pod_dir}/hugetlb.2MB.max"))
        .expect("the pod's hugetlb limit");
    assert_eq!(limit.trim(), (4u64 << 20).to_string());
    let gig = std::fs::read_to_string(format!("/sys/fs/cgroup/unified{pod_dir}/hugetlb.1GB.max"));
    if let Ok(gig) = gig {
        assert_eq!(gig.trim(), "0", "a page size the pod did not ask for");
    }
    let v2 = out
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_default();
    assert!(
        v2.starts_with(&format!("{pod_dir}/")),
        "the container is not below its pod in the hugetlb hierarchy: {out}"
    );

    let event = wait_for_event(&client, &ns, Involving::Name("nohuge"), "FailedMount").await;
    let message = event.message.unwrap_or_default();
    assert!(
        message.contains(
            "medium HugePages: hugePages storage requested, but there is no resource request for huge pages"
        ),
        "{message}"
    );
    let pending = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("nohuge")
        .await
        .expect("nohuge");
    assert_eq!(
        pending.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );

    let rejected = wait_for(&client, &ns, "toomuch", 60, "Failed", phase("Failed")).await;
    let st = rejected.status.expect("status");
    assert_eq!(st.reason.as_deref(), Some("OutOfhugepages-2Mi"));
    let got = st.message.unwrap_or_default();
    assert!(
        got.starts_with(
            "Pod was rejected: Node didn't have enough resource: hugepages-2Mi, requested: 67108864, used: "
        ) && got.ends_with(", capacity: 16777216"),
        "{got}"
    );

    drop_namespace(&client, &ns).await;
    wait_deleted(&client, &ns, "huge", &uid, 60).await;
    std::fs::write(POOL, before.trim()).expect("give the pages back");
    restart_agent(None);
}
