//! Scenarios of in-place resize (`kubectl patch --subresource resize`):
//! the node allocates what fits and updates the running container's cgroup
//! limits in place, reports the allocation in the status, leaves what does
//! not fit pending (`Infeasible`, `Deferred`), and restarts a container whose
//! `resizePolicy` asks for it.

use k8s_openapi::api::core::v1::{ContainerResizePolicy, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::{IMAGE, Node};
use crate::fixtures::pod;

/// Requests and limits of cpu and memory.
fn resources(cpu: (&str, &str), memory: (&str, &str)) -> ResourceRequirements {
    let map = |c: &str, m: &str| {
        Some(
            [("cpu", c), ("memory", m)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.into())))
                .collect(),
        )
    };
    ResourceRequirements {
        requests: map(cpu.0, memory.0),
        limits: map(cpu.1, memory.1),
        ..Default::default()
    }
}

/// Pod `name` with one container `c` of `r`.
fn sized(name: &str, r: ResourceRequirements) -> Pod {
    let mut p = pod(name).container("c", IMAGE).build();
    if let Some(spec) = p.spec.as_mut() {
        spec.containers[0].resources = Some(r);
    }
    p
}

/// `pod` as the API server stores a resize of its container to `r`
/// (generation bumped).
fn resized(mut pod: Pod, r: ResourceRequirements) -> Pod {
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers[0].resources = Some(r);
    }
    pod.metadata.generation = Some(pod.metadata.generation.unwrap_or(1) + 1);
    pod
}

/// Resizes pod `name`'s container to `r` in the API and the watch; the pod
/// as stored.
fn resize(n: &mut Node, name: &str, r: ResourceRequirements) -> Pod {
    let now = n.watched(name);
    n.bind(resized(now, r))
}

fn condition(n: &Node, name: &str, type_: &str) -> Option<(String, String)> {
    n.status(name)
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.reason.unwrap_or_default(), c.message.unwrap_or_default()))
}

fn reported(n: &Node, name: &str) -> (Option<ResourceRequirements>, String) {
    let cs = n.status(name).container_statuses.unwrap_or_default();
    let c = cs.first().cloned().unwrap_or_default();
    (c.resources, c.container_id.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_that_fits_is_applied_in_place_and_one_that_does_not_waits() {
    let mut n = Node::start().await;
    let small = resources(("100m", "200m"), ("64Mi", "128Mi"));
    let web = n.bind(sized("web", small.clone()));
    n.sync(&web).await;
    let (shown, id) = reported(&n, "web");
    assert_eq!(shown.as_ref(), Some(&small), "resources as allocated");
    n.cri_calls();

    // Up: updated in place, the same container, the status follows.
    let big = resources(("500m", "1"), ("128Mi", "256Mi"));
    let web = resize(&mut n, "web", big.clone());
    n.sync(&web).await;
    assert_eq!(
        n.cri_calls(),
        ["UpdateContainerResources c shares=512 quota=100000 memory=268435456"]
    );
    let (shown, same) = reported(&n, "web");
    assert_eq!(same, id, "not restarted");
    assert_eq!(shown.as_ref(), Some(&big));
    let allocated = n.status("web").container_statuses.unwrap_or_default()[0]
        .allocated_resources
        .clone();
    assert_eq!(allocated, big.requests);
    assert_eq!(condition(&n, "web", "PodResizePending"), None);
    // Once applied, nothing more to do.
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    assert_eq!(condition(&n, "web", "PodResizeInProgress"), None);

    // Beyond the node (4 cpus): infeasible, nothing changes.
    let huge = resources(("8", "8"), ("128Mi", "256Mi"));
    let web = resize(&mut n, "web", huge);
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    let (reason, message) = condition(&n, "web", "PodResizePending").expect("pending");
    assert_eq!(reason, "Infeasible");
    assert_eq!(
        message,
        "Node didn't have enough capacity: cpu, requested: 8000, capacity: 4000"
    );
    assert_eq!(
        reported(&n, "web").0.as_ref(),
        Some(&big),
        "still as allocated"
    );

    // Within the node but not beside another pod: deferred, then allocated
    // once that pod is gone.
    let other = n.bind(sized("other", resources(("3", "3"), ("64Mi", "64Mi"))));
    n.sync(&other).await;
    n.cri_calls();
    let wanted = resources(("1500m", "2"), ("128Mi", "256Mi"));
    let web = resize(&mut n, "web", wanted.clone());
    n.sync(&web).await;
    let (reason, message) = condition(&n, "web", "PodResizePending").expect("pending");
    assert_eq!(reason, "Deferred");
    assert!(
        message.starts_with("Node didn't have enough resource: cpu"),
        "{message}"
    );
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    n.pods
        .api_event(kube::runtime::watcher::Event::Delete(other));
    n.sync_watched("web").await;
    assert_eq!(condition(&n, "web", "PodResizePending"), None);
    assert_eq!(
        n.cri_calls(),
        ["UpdateContainerResources c shares=1536 quota=200000 memory=268435456"]
    );
    assert_eq!(reported(&n, "web").0.as_ref(), Some(&wanted));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_the_runtime_refuses_is_in_progress_with_its_error_and_tried_again() {
    let mut n = Node::start().await;
    let web = n.bind(sized("web", resources(("500m", "1"), ("128Mi", "256Mi"))));
    n.sync(&web).await;
    n.cri_calls();
    // A runtime that refuses: in progress with its error, the limits it
    // runs with reported, and tried again at the next sync.
    n.cri.fail_next(
        "UpdateContainerResources",
        tonic::Code::Unknown,
        "device or resource busy",
    );
    let mid = resources(("500m", "1"), ("128Mi", "200Mi"));
    let web = resize(&mut n, "web", mid.clone());
    n.sync(&web).await;
    let (reason, message) = condition(&n, "web", "PodResizeInProgress").expect("in progress");
    assert_eq!(reason, "Error");
    assert!(message.contains("device or resource busy"), "{message}");
    let (shown, _) = reported(&n, "web");
    let shown_memory = shown
        .and_then(|r| r.limits)
        .and_then(|l| l.get("memory").cloned());
    assert_eq!(
        shown_memory,
        Some(Quantity((256_u64 << 20).to_string())),
        "what runs"
    );
    n.cri_calls();
    n.sync_watched("web").await;
    assert_eq!(
        n.cri_calls(),
        ["UpdateContainerResources c shares=512 quota=100000 memory=209715200"]
    );
    assert_eq!(condition(&n, "web", "PodResizeInProgress"), None);
    assert_eq!(reported(&n, "web").0.as_ref(), Some(&mid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_resize_with_restart_container_restarts_that_container() {
    let mut n = Node::start().await;
    let mut p = sized("db", resources(("100m", "100m"), ("64Mi", "64Mi")));
    if let Some(spec) = p.spec.as_mut() {
        spec.containers[0].resize_policy = Some(vec![ContainerResizePolicy {
            resource_name: "memory".into(),
            restart_policy: "RestartContainer".into(),
        }]);
    }
    let db = n.bind(p);
    n.sync(&db).await;
    n.cri_calls();
    // cpu alone: in place.
    let db = resize(&mut n, "db", resources(("200m", "200m"), ("64Mi", "64Mi")));
    n.sync(&db).await;
    let calls = n.cri_calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(
        calls[0].starts_with("UpdateContainerResources c "),
        "{calls:?}"
    );
    // memory: the container restarts with it.
    let db = resize(
        &mut n,
        "db",
        resources(("200m", "200m"), ("128Mi", "128Mi")),
    );
    n.sync(&db).await;
    let calls = n.cri_calls();
    assert!(
        calls.iter().any(|c| c.starts_with("StopContainer c")),
        "{calls:?}"
    );
    assert!(
        calls.contains(&"CreateContainer c".to_string()),
        "{calls:?}"
    );
    n.event("Killing", "Container c resize requires restart")
        .await;
    let restarted = n.status("db").container_statuses.unwrap_or_default()[0].restart_count;
    assert_eq!(restarted, 1);
    // The memory request alone sets no cgroup limit, yet restarts it too, as
    // the kubelet compares it with what the container was made with.
    n.sync_watched("db").await;
    n.cri_calls();
    let db = resize(&mut n, "db", resources(("200m", "200m"), ("96Mi", "128Mi")));
    n.sync(&db).await;
    let calls = n.cri_calls();
    assert!(
        calls.iter().any(|c| c.starts_with("StopContainer c")),
        "{calls:?}"
    );
    n.sync_watched("db").await;
    let restarted = n.status("db").container_statuses.unwrap_or_default()[0].restart_count;
    assert_eq!(restarted, 2);
    // And once made with it, nothing more happens.
    n.cri_calls();
    n.sync_watched("db").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_request_change_under_not_required_changes_nothing_that_runs() {
    let mut n = Node::start().await;
    let db = n.bind(sized("db", resources(("100m", "100m"), ("64Mi", "128Mi"))));
    n.sync(&db).await;
    n.cri_calls();
    let lower = resources(("100m", "100m"), ("32Mi", "128Mi"));
    let db = resize(&mut n, "db", lower.clone());
    n.sync(&db).await;
    n.sync_watched("db").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new(), "no call, no restart");
    assert_eq!(reported(&n, "db").0.as_ref(), Some(&lower), "allocated");
    assert_eq!(condition(&n, "db", "PodResizeInProgress"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocations_outlive_a_restart_of_the_agent() {
    let mut n = Node::start().await;
    let small = resources(("100m", "100m"), ("64Mi", "64Mi"));
    let web = n.bind(sized("web", small));
    n.sync(&web).await;
    let big = resources(("200m", "200m"), ("64Mi", "64Mi"));
    let web = resize(&mut n, "web", big.clone());
    n.sync(&web).await;
    let allocations = n.ctx.allocations();
    let uid = web.metadata.uid.clone().unwrap_or_default();
    assert_eq!(
        allocations.get(&uid).map(|a| a.containers["c"].clone()),
        Some(big)
    );
}

/// Runs `body` with a cgroup manager on the machine's real cgroup v1
/// hierarchies, under a root of the test's own (its name is `body`'s
/// second argument), then removes every cgroup it made, whether `body`
/// passed or not. Skipped (said on stderr) where there is no writable
/// hierarchy.
async fn on_real_cgroups<F, Fut>(body: F)
where
    F: FnOnce(crate::cgroups::CgroupManager, String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use crate::cgroups::CgroupManager;
    use futures::FutureExt as _;
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let serial = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("rustlet-scenario-{}-{serial}", std::process::id());
    let Some(cgroups) = CgroupManager::v1(std::path::Path::new("/sys/fs/cgroup"), "/", &name)
    else {
        eprintln!("no cgroup v1 hierarchy here: skipped");
        return;
    };
    if cgroups.ensure_qos(None).is_err() {
        eprintln!("cgroups not writable here: skipped");
        cgroups.remove_qos();
        return;
    }
    let run = body(cgroups.clone(), name);
    let result = std::panic::AssertUnwindSafe(run).catch_unwind().await;
    for (qos, uid) in cgroups.pods() {
        let _ = cgroups.remove_pod(qos, &uid);
    }
    cgroups.remove_qos();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_runs_in_a_cgroup_of_its_own_with_its_limits_through_a_resize_until_it_goes() {
    use crate::cgroups::Limits;
    use crate::pod_core::qos::QosClass;
    on_real_cgroups(|cgroups, name| async move {
        let mut n = Node::start_with_cgroups(cgroups.clone()).await;
        let web = n.bind(sized("web", resources(("250m", "500m"), ("64Mi", "128Mi"))));
        n.sync(&web).await;
        let uid = web.metadata.uid.clone().unwrap_or_default();
        let sandbox = n.cri.sandboxes().pop().expect("sandbox");
        assert_eq!(sandbox.cgroup_parent, format!("/{name}/burstable/pod{uid}"));
        let dir = cgroups.pod_dir(QosClass::Burstable, &uid).expect("dir");
        assert_eq!(
            cgroups.limits(&dir).expect("limits"),
            Limits {
                cpu_shares: 256,
                cpu_quota: Some(50_000),
                memory: Some(128 << 20)
            }
        );
        // The burstable cgroup's shares follow its pods.
        let store = n.pods.store();
        super::super::housekeeping::sync_pod_cgroups(&n.ctx, &store);
        let burstable = std::path::Path::new(&name).join("burstable");
        assert_eq!(cgroups.limits(&burstable).expect("limits").cpu_shares, 256);

        // Resized: the pod's cgroup follows.
        let web = resize(&mut n, "web", resources(("500m", "1"), ("64Mi", "256Mi")));
        n.sync(&web).await;
        assert_eq!(
            cgroups.limits(&dir).expect("limits"),
            Limits {
                cpu_shares: 512,
                cpu_quota: Some(100_000),
                memory: Some(256 << 20)
            }
        );
        // Gone from the node: its cgroup goes.
        n.pods.api_event(kube::runtime::watcher::Event::Delete(web));
        super::super::housekeeping::sync_pod_cgroups(&n.ctx, &store);
        assert!(!cgroups.has_pod(QosClass::Burstable, &uid));
    })
    .await;
}

/// Resizes pod "web"'s pod-level resources to `level` (cpu, memory:
/// request and limit each), syncs, and checks that the one CRI call was
/// `call`, that its cgroup `dir` holds `limits`, and that the resize is no
/// longer in progress.
async fn resize_pod_level(
    n: &mut Node,
    cgroups: &crate::cgroups::CgroupManager,
    dir: &std::path::Path,
    level: ((&str, &str), (&str, &str)),
    call: &str,
    limits: crate::cgroups::Limits,
) {
    let mut resized = n.watched("web");
    if let Some(spec) = resized.spec.as_mut() {
        spec.resources = Some(resources(level.0, level.1));
    }
    resized.metadata.generation = Some(resized.metadata.generation.unwrap_or(1) + 1);
    let web = n.bind(resized);
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), [call]);
    assert_eq!(cgroups.limits(dir).expect("limits"), limits);
    assert_eq!(condition(n, "web", "PodResizeInProgress"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_level_resources_are_resized_in_place_in_the_pod_cgroup_and_the_containers_that_inherit_them()
 {
    use crate::cgroups::Limits;
    use crate::pod_core::qos::QosClass;
    on_real_cgroups(|cgroups, _name| async move {
        let mut n = Node::start_with_cgroups(cgroups.clone()).await;
        // Pod-level resources only; container "c" sets none, container
        // "own" its own limits.
        let mut web = pod("web")
            .container("c", IMAGE)
            .container("own", IMAGE)
            .build();
        if let Some(spec) = web.spec.as_mut() {
            spec.resources = Some(resources(("200m", "200m"), ("128Mi", "128Mi")));
            spec.containers[1].resources = Some(resources(("50m", "50m"), ("32Mi", "32Mi")));
        }
        let web = n.bind(web);
        n.sync(&web).await;
        let uid = web.metadata.uid.clone().unwrap_or_default();
        let dir = cgroups.pod_dir(QosClass::Guaranteed, &uid).expect("dir");
        assert_eq!(
            cgroups.limits(&dir).expect("limits"),
            Limits {
                cpu_shares: 204,
                cpu_quota: Some(20_000),
                memory: Some(128 << 20)
            }
        );
        // "c" runs with the pod's limits, as the kubelet's getCPULimit and
        // getMemoryLimit give them; "own" with its own.
        let created = n.cri.containers();
        let limits_of = |name: &str| {
            let c = created.iter().find(|c| c.name == name).expect("created");
            let r = c.linux_resources.clone().unwrap_or_default();
            (r.cpu_quota, r.memory_limit_in_bytes)
        };
        assert_eq!(limits_of("c"), (20_000, 128 << 20));
        assert_eq!(limits_of("own"), (5_000, 32 << 20));
        let status = n.status("web");
        let requests = status.allocated_resources.expect("allocatedResources");
        assert_eq!(requests["cpu"].0, "200m");
        assert_eq!(requests["memory"].0, (128_u64 << 20).to_string());
        n.cri_calls();

        // The pod level grows: the pod's cgroup first, then "c", which
        // inherits; "own" is left alone and nothing restarts.
        let grown = (("400m", "400m"), ("256Mi", "256Mi"));
        let call = "UpdateContainerResources c shares=409 quota=40000 memory=268435456";
        let limits = Limits {
            cpu_shares: 409,
            cpu_quota: Some(40_000),
            memory: Some(256 << 20),
        };
        resize_pod_level(&mut n, &cgroups, &dir, grown, call, limits).await;
        let status = n.status("web");
        assert_eq!(
            status.allocated_resources.expect("allocatedResources")["cpu"].0,
            "400m"
        );
        let restarts: Vec<i32> = status
            .container_statuses
            .unwrap_or_default()
            .iter()
            .map(|c| c.restart_count)
            .collect();
        assert_eq!(restarts, [0, 0], "nothing restarted");
        n.event("ResizeStarted", "Pod resize started: ").await;

        // Back down: "c" shrinks first, then the pod's cgroup, to where
        // they began.
        let back = (("200m", "200m"), ("128Mi", "128Mi"));
        let call = "UpdateContainerResources c shares=204 quota=20000 memory=134217728";
        let limits = Limits {
            cpu_shares: 204,
            cpu_quota: Some(20_000),
            memory: Some(128 << 20),
        };
        resize_pod_level(&mut n, &cgroups, &dir, back, call, limits).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_limit_below_what_the_container_uses_waits_until_it_fits() {
    let mut n = Node::start().await;
    let web = n.bind(sized("web", resources(("500m", "1"), ("128Mi", "256Mi"))));
    n.sync(&web).await;
    n.cri_calls();
    n.cri.set_memory_usage("c", 220 << 20);
    let lower = resources(("500m", "1"), ("128Mi", "200Mi"));
    let web = resize(&mut n, "web", lower.clone());
    n.sync(&web).await;
    n.event(
        "ResizeStarted",
        "Pod resize started: {\"containers\":[{\"name\":\"c\"",
    )
    .await;
    let (reason, message) = condition(&n, "web", "PodResizeInProgress").expect("in progress");
    assert_eq!(reason, "Error");
    assert_eq!(
        message,
        format!(
            "cannot decrease memory limits: attempting to set container \"c\" memory limit ({}) below current usage ({})",
            200_u64 << 20,
            220_u64 << 20
        )
    );
    assert_eq!(n.cri_calls(), Vec::<String>::new(), "nothing changed");
    n.event("ResizeError", "\"error\":\"cannot decrease memory limits: ")
        .await;
    // The same error at the next sync: no new event.
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    let errors = n
        .api
        .events()
        .into_iter()
        .filter(|(r, _)| r == "ResizeError")
        .count();
    assert_eq!(errors, 1);
    // Memory freed: applied at the next sync, and completed.
    n.cri.set_memory_usage("c", 100 << 20);
    n.sync_watched("web").await;
    assert_eq!(
        n.cri_calls(),
        ["UpdateContainerResources c shares=512 quota=100000 memory=209715200"]
    );
    assert_eq!(condition(&n, "web", "PodResizeInProgress"), None);
    n.sync_watched("web").await;
    n.event("ResizeCompleted", "Pod resize completed: {\"containers\":")
        .await;
    assert_eq!(reported(&n, "web").0.as_ref(), Some(&lower));
}
