//! In-place resize on the local cluster (`hack/local-up.sh --agent rustlet`),
//! as a user does it: `kubectl patch pod --subresource resize`. A running
//! pod's cpu and memory go up and down with the same container (ID and
//! restart count unchanged), its cgroup files show the new limits and its
//! status the new resources; one beyond the node the API server refuses, one
//! beyond what is free beside another pod is `PodResizePending` /
//! `Deferred`; a memory resize under `resizePolicy: RestartContainer`
//! restarts exactly that container.

use crate::common::*;

/// A pod of one busybox container `c` that sleeps, with cpu and memory
/// requests and limits, and `policy` as the memory resize policy.
fn sized(
    name: &str,
    cpu: (&str, &str),
    memory: (&str, &str),
    policy: &str,
) -> k8s_openapi::api::core::v1::Pod {
    from_json(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c",
                "image": BUSYBOX,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
                "resources": {
                    "requests": { "cpu": cpu.0, "memory": memory.0 },
                    "limits": { "cpu": cpu.1, "memory": memory.1 },
                },
                "resizePolicy": [
                    { "resourceName": "cpu", "restartPolicy": "NotRequired" },
                    { "resourceName": "memory", "restartPolicy": policy },
                ],
            }]
        }
    }))
}

/// A pod `name` of one busybox container `c` that sleeps and sets no
/// resources, with pod-level `resources` (JSON).
fn pod_level(name: &str, resources: serde_json::Value) -> k8s_openapi::api::core::v1::Pod {
    from_json(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "resources": resources,
            "containers": [{
                "name": "c",
                "image": BUSYBOX,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
            }]
        }
    }))
}

/// Creates `pod` in `ns` and waits (90 s) until it runs; the pod as running.
async fn run(
    client: &kube::Client,
    ns: &str,
    pod: &k8s_openapi::api::core::v1::Pod,
) -> k8s_openapi::api::core::v1::Pod {
    create(client, ns, pod).await;
    let name = pod.metadata.name.clone().unwrap_or_default();
    wait_for(client, ns, &name, 90, "Running", phase("Running")).await
}

/// `kubectl patch pod <name> --subresource resize` to those resources.
fn resize(ns: &str, name: &str, cpu: (&str, &str), memory: (&str, &str)) -> (i32, String) {
    let patch = serde_json::json!({"spec": {"containers": [{"name": "c", "resources": {
        "requests": { "cpu": cpu.0, "memory": memory.0 },
        "limits": { "cpu": cpu.1, "memory": memory.1 },
    }}]}});
    patch_resize(ns, name, &patch)
}

/// `kubectl patch pod <name> --subresource resize` with strategic merge
/// patch `patch`: the exit code and what kubectl said.
fn patch_resize(ns: &str, name: &str, patch: &serde_json::Value) -> (i32, String) {
    let (code, out, err) = kubectl(
        &[
            "patch",
            "pod",
            name,
            "-n",
            ns,
            "--subresource",
            "resize",
            "--type",
            "strategic",
            "-p",
            &patch.to_string(),
        ],
        "",
    );
    (code, format!("{out}{err}"))
}

/// A file of the container's own cgroup, read inside it.
fn cgroup_file(ns: &str, name: &str, path: &str) -> String {
    let (code, out, err) = kubectl(&["exec", "-n", ns, name, "-c", "c", "--", "cat", path], "");
    assert_eq!(code, 0, "cat {path}: {err}");
    out.trim().to_string()
}

/// How many times the agent's log says it resized a container of pod `name`
/// in place (its log is JSON or text; the pod name is on the line).
fn resizes_logged(name: &str) -> usize {
    agent_log()
        .lines()
        .filter(|l| l.contains("container resized in place") && l.contains(name))
        .count()
}

/// File `file` of the cgroup of Guaranteed pod `uid` in hierarchy
/// `subsystem` (right below kubepods), read on the host.
fn guaranteed_pod_cgroup(uid: &str, subsystem: &str, file: &str) -> String {
    let path = format!("/sys/fs/cgroup/{subsystem}/kubepods/pod{uid}/{file}");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .to_string()
}

/// The first container's reported limit of `resource`.
fn limit(p: &k8s_openapi::api::core::v1::Pod, resource: &str) -> Option<String> {
    container_status(p)
        .resources
        .and_then(|r| r.limits)
        .and_then(|l| l.get(resource).map(|q| q.0.clone()))
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn cpu_and_memory_are_resized_in_place_and_an_infeasible_resize_waits() {
    let client = client().await;
    let ns = namespace(&client, "e2e-resize").await;
    let running = run(
        &client,
        &ns,
        &sized("web", ("100m", "200m"), ("64Mi", "128Mi"), "NotRequired"),
    )
    .await;
    let before = container_status(&running);
    assert_eq!(
        limit(&running, "cpu").as_deref(),
        Some("200m"),
        "resources reported"
    );
    assert_eq!(
        cgroup_file(&ns, "web", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
        "20000"
    );
    // NoSwap (this machine's cgroup v1 accounts swap): memory and swap
    // together are held to the memory limit, before and after each resize.
    let memsw = "/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes";
    assert_eq!(cgroup_file(&ns, "web", memsw), (128u64 << 20).to_string());

    // Up.
    let (code, out) = resize(&ns, "web", ("200m", "400m"), ("64Mi", "192Mi"));
    assert_eq!(code, 0, "{out}");
    let up = wait_for(
        &client,
        &ns,
        "web",
        60,
        "resized up",
        |p: Option<&k8s_openapi::api::core::v1::Pod>| {
            p.is_some_and(|p| limit(p, "cpu").as_deref() == Some("400m"))
        },
    )
    .await;
    let after = container_status(&up);
    assert_eq!(
        after.container_id, before.container_id,
        "the same container"
    );
    assert_eq!(after.restart_count, before.restart_count);
    assert_eq!(limit(&up, "memory").as_deref(), Some("192Mi"));
    // Applied once: later syncs find the runtime enforcing it.
    let resized = resizes_logged("web");
    assert!(resized >= 1, "the agent logs the resize");
    tokio::time::sleep(std::time::Duration::from_secs(6)).await;
    assert_eq!(
        resizes_logged("web"),
        resized,
        "no resize after it was applied"
    );
    assert_eq!(
        cgroup_file(&ns, "web", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
        "40000"
    );
    assert_eq!(
        cgroup_file(&ns, "web", "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        (192u64 << 20).to_string()
    );
    assert_eq!(cgroup_file(&ns, "web", memsw), (192u64 << 20).to_string());

    // Down.
    let (code, out) = resize(&ns, "web", ("100m", "150m"), ("64Mi", "160Mi"));
    assert_eq!(code, 0, "{out}");
    let down = wait_for(
        &client,
        &ns,
        "web",
        60,
        "resized down",
        |p: Option<&k8s_openapi::api::core::v1::Pod>| {
            p.is_some_and(|p| limit(p, "cpu").as_deref() == Some("150m"))
        },
    )
    .await;
    assert_eq!(container_status(&down).container_id, before.container_id);
    assert_eq!(
        cgroup_file(&ns, "web", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
        "15000"
    );
    assert_eq!(
        cgroup_file(&ns, "web", "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        (160u64 << 20).to_string()
    );
    assert_eq!(cgroup_file(&ns, "web", memsw), (160u64 << 20).to_string());

    // Beyond any node the API server refuses it itself.
    let (code, out) = resize(&ns, "web", ("1000", "1000"), ("64Mi", "160Mi"));
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("node didn't have enough allocatable resources"),
        "{out}"
    );
    // Beyond what is free beside another pod: deferred, nothing changes.
    let hog: k8s_openapi::api::core::v1::Pod = from_json(serde_json::json!({
        "metadata": { "name": "hog" },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
                "resources": { "requests": { "cpu": "1200m" } },
            }]
        }
    }));
    run(&client, &ns, &hog).await;
    let (code, out) = resize(&ns, "web", ("1900m", "1900m"), ("64Mi", "160Mi"));
    assert_eq!(code, 0, "{out}");
    let pending = wait_for(
        &client,
        &ns,
        "web",
        60,
        "PodResizePending",
        condition_is("PodResizePending", "True"),
    )
    .await;
    let c = pod_condition(&pending, "PodResizePending").expect("condition");
    assert_eq!(c.reason.as_deref(), Some("Deferred"), "{c:?}");
    assert!(
        c.message
            .as_deref()
            .unwrap_or_default()
            .starts_with("Node didn't have enough resource: cpu"),
        "{c:?}"
    );
    assert_eq!(
        limit(&pending, "cpu").as_deref(),
        Some("150m"),
        "as allocated"
    );
    assert_eq!(
        cgroup_file(&ns, "web", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
        "15000"
    );
    // Asked back to what it has: nothing pending any more.
    let (code, out) = resize(&ns, "web", ("100m", "150m"), ("64Mi", "160Mi"));
    assert_eq!(code, 0, "{out}");
    wait_for(
        &client,
        &ns,
        "web",
        60,
        "no resize pending",
        |p: Option<&k8s_openapi::api::core::v1::Pod>| {
            p.is_some_and(|p| pod_condition(p, "PodResizePending").is_none())
        },
    )
    .await;
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_memory_resize_under_restart_container_restarts_the_container() {
    let client = client().await;
    let ns = namespace(&client, "e2e-resize-restart").await;
    let running = run(
        &client,
        &ns,
        &sized("db", ("100m", "100m"), ("64Mi", "64Mi"), "RestartContainer"),
    )
    .await;
    let before = container_status(&running);
    let (code, out) = resize(&ns, "db", ("100m", "100m"), ("96Mi", "96Mi"));
    assert_eq!(code, 0, "{out}");
    let restarted = wait_for(
        &client,
        &ns,
        "db",
        60,
        "restarted",
        |p: Option<&k8s_openapi::api::core::v1::Pod>| {
            p.is_some_and(|p| {
                let c = container_status(p);
                c.restart_count == 1 && c.state.is_some_and(|s| s.running.is_some())
            })
        },
    )
    .await;
    assert_ne!(
        container_status(&restarted).container_id,
        before.container_id
    );
    assert_eq!(limit(&restarted, "memory").as_deref(), Some("96Mi"));
    assert_eq!(
        cgroup_file(&ns, "db", "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        (96u64 << 20).to_string()
    );
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_pod_with_pod_level_resources_gets_a_cgroup_of_its_own_with_them() {
    use kube::ResourceExt as _;
    let client = client().await;
    let ns = namespace(&client, "e2e-pod-cgroup").await;
    let p = pod_level(
        "whole",
        serde_json::json!({ "limits": { "cpu": "500m", "memory": "128Mi" } }),
    );
    let running = run(&client, &ns, &p).await;
    let st = running.status.clone().unwrap_or_default();
    assert_eq!(
        st.qos_class.as_deref(),
        Some("Guaranteed"),
        "from the pod's own limits"
    );
    // Guaranteed: right below kubepods.
    let uid = running.uid().unwrap_or_default();
    let pod_cgroup = |subsystem: &str, file: &str| guaranteed_pod_cgroup(&uid, subsystem, file);
    assert_eq!(pod_cgroup("cpu", "cpu.cfs_quota_us"), "50000");
    assert_eq!(pod_cgroup("cpu", "cpu.shares"), "512");
    assert_eq!(
        pod_cgroup("memory", "memory.limit_in_bytes"),
        (128u64 << 20).to_string()
    );
    // The container runs inside it.
    let (code, out, err) = kubectl(
        &["exec", "-n", &ns, "whole", "--", "cat", "/proc/1/cgroup"],
        "",
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!(
            "kubepods/pod{}",
            running.uid().unwrap_or_default()
        )),
        "{out}"
    );
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn pod_level_resources_are_resized_in_place_with_the_container_that_inherits_them() {
    use kube::ResourceExt as _;
    let client = client().await;
    let ns = namespace(&client, "e2e-pod-resize").await;
    let level = |cpu: &str, memory: &str| {
        serde_json::json!({
            "requests": { "cpu": cpu, "memory": memory },
            "limits": { "cpu": cpu, "memory": memory },
        })
    };
    let p = pod_level("plr", level("300m", "128Mi"));
    let running = run(&client, &ns, &p).await;
    let uid = running.uid().unwrap_or_default();
    let before = container_status(&running);
    let pod_cgroup = |subsystem: &str, file: &str| guaranteed_pod_cgroup(&uid, subsystem, file);
    // The container sets no limit: it runs with the pod's.
    let memory_file = "/sys/fs/cgroup/memory/memory.limit_in_bytes";
    assert_eq!(
        cgroup_file(&ns, "plr", memory_file),
        (128u64 << 20).to_string()
    );
    // The API server takes a pod-level resize only from a node that
    // declares it (status.declaredFeatures).
    for (cpu, memory, quota) in [("600m", "256Mi", "60000"), ("200m", "96Mi", "20000")] {
        let (code, out) = patch_resize(
            &ns,
            "plr",
            &serde_json::json!({"spec": {"resources": level(cpu, memory)}}),
        );
        assert_eq!(code, 0, "resize to {cpu}/{memory}: {out}");
        let bytes = parse_bytes(memory);
        let done = move |p: Option<&k8s_openapi::api::core::v1::Pod>| {
            p.and_then(|p| p.status.as_ref()).is_some_and(|st| {
                let allocated = st
                    .allocated_resources
                    .as_ref()
                    .and_then(|a| a.get("cpu"))
                    .map(|q| q.0.as_str());
                let conditions = st.conditions.as_deref().unwrap_or_default();
                allocated == Some(cpu)
                    && !conditions.iter().any(|c| c.type_.starts_with("PodResize"))
            })
        };
        let resized = wait_for(&client, &ns, "plr", 60, "the pod-level resize", done).await;
        assert_eq!(pod_cgroup("cpu", "cpu.cfs_quota_us"), quota);
        assert_eq!(
            pod_cgroup("memory", "memory.limit_in_bytes"),
            bytes.to_string()
        );
        assert_eq!(cgroup_file(&ns, "plr", memory_file), bytes.to_string());
        let after = container_status(&resized);
        assert_eq!(
            after.container_id, before.container_id,
            "the same container"
        );
        assert_eq!(after.restart_count, 0);
        let level_status = resized.status.and_then(|s| s.resources).unwrap_or_default();
        let memory_limit = level_status.limits.unwrap_or_default();
        let shown = memory_limit.get("memory").map(|q| q.0.clone());
        assert!(
            shown.as_deref() == Some(memory) || shown == Some(bytes.to_string()),
            "status.resources: what the pod cgroup holds, not {shown:?}"
        );
    }
    drop_namespace(&client, &ns).await;
}

/// Bytes of a quantity in `Mi`.
fn parse_bytes(mebibytes: &str) -> u64 {
    mebibytes
        .trim_end_matches("Mi")
        .parse::<u64>()
        .expect("a quantity in Mi")
        << 20
}

/// Waits up to 30 s for pod `mem`'s events with `reason`; returns their
/// messages, one per occurrence.
async fn mem_events(client: &kube::Client, ns: &str, reason: &str) -> Vec<String> {
    wait_for_events(
        client,
        ns,
        Involving::Name("mem"),
        30,
        &format!("a {reason} event"),
        |e| messages(e, reason),
    )
    .await
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_memory_limit_below_what_is_in_use_is_not_applied_until_it_fits() {
    let client = client().await;
    let ns = namespace(&client, "e2e-resize-memory").await;
    let running = run(
        &client,
        &ns,
        &sized("mem", ("100m", "100m"), ("32Mi", "128Mi"), "NotRequired"),
    )
    .await;
    let before = container_status(&running);
    // 56 MiB in the sandbox's tmpfs /dev/shm: memory the container's cgroup
    // is charged for and cannot reclaim.
    let (code, _, err) = kubectl(
        &[
            "exec",
            "-n",
            &ns,
            "mem",
            "-c",
            "c",
            "--",
            "sh",
            "-c",
            "head -c 58720256 /dev/zero > /dev/shm/fill",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let (code, out) = resize(&ns, "mem", ("100m", "100m"), ("32Mi", "48Mi"));
    assert_eq!(code, 0, "{out}");
    let refused = wait_for(
        &client,
        &ns,
        "mem",
        60,
        "PodResizeInProgress Error",
        |p: Option<&k8s_openapi::api::core::v1::Pod>| {
            p.and_then(|p| pod_condition(p, "PodResizeInProgress"))
                .is_some_and(|c| c.reason.as_deref() == Some("Error"))
        },
    )
    .await;
    let c = pod_condition(&refused, "PodResizeInProgress").expect("condition");
    let message = c.message.unwrap_or_default();
    let limit_48 = 48u64 << 20;
    assert!(
        message.starts_with("cannot decrease memory limits: [attempting to set pod memory limit (")
            && message.contains(&format!(
                "attempting to set container \"c\" memory limit ({limit_48}) below current usage ("
            )),
        "{message}"
    );
    assert_eq!(
        cgroup_file(&ns, "mem", "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        (128u64 << 20).to_string(),
        "nothing lowered"
    );
    assert_eq!(container_status(&refused).container_id, before.container_id);
    let errors = mem_events(&client, &ns, "ResizeError").await;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("Pod resize error: {\"containers\":[{\"name\":\"c\",")
            && errors[0].contains("\"error\":\"cannot decrease memory limits: "),
        "{errors:?}"
    );
    let started = mem_events(&client, &ns, "ResizeStarted").await;
    assert_eq!(started.len(), 1, "{started:?}");

    // Memory freed: the next sync applies it.
    let (code, _, err) = kubectl(
        &[
            "exec",
            "-n",
            &ns,
            "mem",
            "-c",
            "c",
            "--",
            "rm",
            "/dev/shm/fill",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let done = wait_for(
        &client,
        &ns,
        "mem",
        90,
        "resized down",
        |p: Option<&k8s_openapi::api::core::v1::Pod>| {
            p.is_some_and(|p| {
                limit(p, "memory").as_deref() == Some("48Mi")
                    && pod_condition(p, "PodResizeInProgress").is_none()
            })
        },
    )
    .await;
    assert_eq!(container_status(&done).container_id, before.container_id);
    assert_eq!(
        cgroup_file(&ns, "mem", "/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        limit_48.to_string()
    );
    let completed = mem_events(&client, &ns, "ResizeCompleted").await;
    assert!(
        completed[0].starts_with("Pod resize completed: {\"containers\":"),
        "{completed:?}"
    );
    drop_namespace(&client, &ns).await;
}
