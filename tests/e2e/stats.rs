//! Resource statistics of the node API on the local cluster: `/stats/summary`
//! and `/metrics/resource` read through the API server's node proxy (what
//! `kubectl get --raw` and metrics-server read), and `kubectl top` through
//! metrics-server when the cluster runs it (`hack/local-up.sh --metrics-server`).

use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;

/// A pod whose container `burner` keeps a fifth of a core busy.
fn burner() -> k8s_openapi::api::core::v1::Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": "burner" },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "burner",
                "image": BUSYBOX,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "while :; do :; done"],
                "resources": { "limits": { "cpu": "200m", "memory": "64Mi" } }
            }]
        }
    }))
    .unwrap()
}

async fn get(client: &kube::Client, path: &str) -> String {
    let path = format!("/api/v1/nodes/{}/proxy/{path}", node_name());
    client
        .request_text(axum::http::Request::get(&path).body(Vec::new()).unwrap())
        .await
        .unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

fn u64_at(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn stats_summary_and_resource_metrics_show_a_busy_pod() {
    let client = client().await;
    let ns = namespace(&client, "e2e-stats").await;
    create(&client, &ns, &burner()).await;
    wait_for(&client, &ns, "burner", 60, "Running", phase("Running")).await;

    // The rate needs two samples a second or more apart.
    let deadline = Instant::now() + Duration::from_secs(40);
    let (summary, pod) = loop {
        let text = get(&client, "stats/summary").await;
        let summary: Value = serde_json::from_str(&text).expect("summary JSON");
        let pod = summary["pods"]
            .as_array()
            .and_then(|pods| {
                pods.iter().find(|p| {
                    p["podRef"]["namespace"] == ns.as_str() && p["podRef"]["name"] == "burner"
                })
            })
            .cloned();
        if let Some(p) = &pod
            && u64_at(p, "/containers/0/cpu/usageNanoCores") > 0
            && u64_at(p, "/cpu/usageNanoCores") > 0
        {
            break (summary, p.clone());
        }
        assert!(
            Instant::now() < deadline,
            "no cpu rate for pod {ns}/burner in /stats/summary:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
    };

    let node = &summary["node"];
    assert_eq!(node["nodeName"], node_name().as_str(), "{node}");
    for p in [
        "/cpu/usageCoreNanoSeconds",
        "/memory/workingSetBytes",
        "/memory/usageBytes",
        "/memory/availableBytes",
        "/fs/capacityBytes",
        "/fs/availableBytes",
        "/runtime/imageFs/capacityBytes",
        "/runtime/imageFs/usedBytes",
        "/rlimit/maxpid",
        "/rlimit/curproc",
    ] {
        assert!(u64_at(node, p) > 0, "node {p} is not positive: {node:#}");
    }
    assert!(
        node["startTime"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{node}"
    );
    // The runtime's writable layers are on its image filesystem.
    assert!(
        u64_at(node, "/runtime/containerFs/capacityBytes") > 0,
        "{node:#}"
    );
    // The host's interfaces (the test runs on the node).
    assert!(
        node["network"]["interfaces"]
            .as_array()
            .is_some_and(|i| !i.is_empty()),
        "{node:#}"
    );
    // The node's pressure, where the kernel keeps it.
    if std::path::Path::new("/proc/pressure/cpu").exists() {
        for p in [
            "/cpu/psi/some/avg10",
            "/memory/psi/full/avg10",
            "/io/psi/some/avg10",
        ] {
            assert!(
                node.pointer(p).is_some_and(Value::is_f64),
                "node {p}: {node:#}"
            );
        }
    }
    // The cgroup of every pod, as the `pods` system container: it holds
    // the burner's usage.
    let pods = node["systemContainers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "pods"))
        .unwrap_or_else(|| panic!("no pods system container: {node:#}"));
    for p in [
        "/cpu/usageCoreNanoSeconds",
        "/memory/workingSetBytes",
        "/memory/availableBytes",
    ] {
        assert!(u64_at(pods, p) > 0, "pods {p} is not positive: {pods:#}");
    }

    assert_eq!(
        pod["containers"].as_array().map(Vec::len),
        Some(1),
        "{pod:#}"
    );
    let c = &pod["containers"][0];
    assert_eq!(c["name"], "burner");
    for p in [
        "/cpu/usageCoreNanoSeconds",
        "/cpu/usageNanoCores",
        "/memory/workingSetBytes",
        "/rootfs/capacityBytes",
        "/logs/usedBytes",
    ] {
        assert!(u64_at(c, p) > 0, "container {p} is not positive: {c:#}");
    }
    // Limited to 200m: over a few seconds the container uses well below a
    // core. (`usageNanoCores` is the runtime's rate since its previous
    // sample, which may be milliseconds ago and so exceed the quota.)
    let (t0, u0) = (Instant::now(), u64_at(c, "/cpu/usageCoreNanoSeconds"));
    tokio::time::sleep(Duration::from_secs(4)).await;
    let later: Value = serde_json::from_str(&get(&client, "stats/summary").await).expect("JSON");
    let u1 = later["pods"]
        .as_array()
        .and_then(|pods| {
            pods.iter()
                .find(|p| p["podRef"]["uid"] == pod["podRef"]["uid"])
        })
        .map_or(0, |p| u64_at(p, "/containers/0/cpu/usageCoreNanoSeconds"));
    assert!(u1 > u0, "cpu usage did not grow: {u0} then {u1}");
    let cores = (u1 - u0) as f64 / 1e9 / t0.elapsed().as_secs_f64();
    assert!(
        cores < 0.6,
        "{cores} cores used by a container limited to 200m"
    );
    for p in [
        "/cpu/usageCoreNanoSeconds",
        "/memory/workingSetBytes",
        "/ephemeral-storage/usedBytes",
    ] {
        assert!(u64_at(&pod, p) > 0, "pod {p} is not positive: {pod:#}");
    }
    // The pod's usage (its pod cgroup) holds its container's.
    assert!(
        u64_at(&pod, "/cpu/usageCoreNanoSeconds") >= u0,
        "pod cpu below its container's: {pod:#}"
    );
    assert!(
        pod["podRef"]["uid"].as_str().is_some_and(|u| !u.is_empty()),
        "{pod}"
    );
    // The pod cgroup's pressure (zero on cgroup v1, as the kubelet's).
    for p in ["/cpu/psi/some/avg10", "/memory/psi/full/avg10"] {
        assert!(
            pod.pointer(p).is_some_and(Value::is_f64),
            "pod {p}: {pod:#}"
        );
    }
    // The processes of its pod cgroup: the sandbox's pause and the burner.
    assert!(u64_at(&pod, "/process_stats/process_count") >= 2, "{pod:#}");
    // The sandbox's network namespace: its eth0.
    assert_eq!(pod["network"]["name"], "eth0", "{pod:#}");
    assert!(pod["network"]["rxBytes"].is_u64(), "{pod:#}");
    assert!(pod["network"]["txBytes"].is_u64(), "{pod:#}");

    // Only cpu and memory.
    let small: Value =
        serde_json::from_str(&get(&client, "stats/summary?only_cpu_and_memory=true").await)
            .unwrap();
    assert!(small["node"].get("fs").is_none(), "{small}");
    assert!(
        u64_at(&small["node"], "/cpu/usageCoreNanoSeconds") > 0,
        "{small}"
    );

    let metrics = get(&client, "metrics/resource").await;
    let labels = format!("{{container=\"burner\",pod=\"burner\",namespace=\"{ns}\"}}");
    for name in [
        "container_cpu_usage_seconds_total",
        "container_memory_working_set_bytes",
        "container_start_time_seconds",
    ] {
        let v = sample(&metrics, &format!("{name}{labels}"));
        assert!(
            v.is_some_and(|v| v > 0.0),
            "{name}{labels} = {v:?} in\n{metrics}"
        );
    }
    let pod_labels = format!("{{pod=\"burner\",namespace=\"{ns}\"}}");
    for name in [
        "pod_cpu_usage_seconds_total",
        "pod_memory_working_set_bytes",
    ] {
        let v = sample(&metrics, &format!("{name}{pod_labels}"));
        assert!(
            v.is_some_and(|v| v > 0.0),
            "{name}{pod_labels} = {v:?} in\n{metrics}"
        );
    }
    for name in [
        "node_cpu_usage_seconds_total",
        "node_memory_working_set_bytes",
    ] {
        assert!(
            sample(&metrics, name).is_some_and(|v| v > 0.0),
            "{name} in\n{metrics}"
        );
    }
    assert_eq!(
        sample(&metrics, "resource_scrape_error"),
        Some(0.0),
        "{metrics}"
    );

    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster with metrics-server: hack/local-up.sh --agent rustlet --metrics-server"]
async fn kubectl_top_shows_a_busy_pod_through_metrics_server() {
    let client = client().await;
    let ns = namespace(&client, "e2e-top").await;
    create(&client, &ns, &burner()).await;
    wait_for(&client, &ns, "burner", 60, "Running", phase("Running")).await;

    // metrics-server needs two scrapes (10 s apart) of the pod for a rate.
    let deadline = Instant::now() + Duration::from_secs(90);
    let out = loop {
        let (code, out, err) = kubectl(&["top", "pod", "-n", &ns, "--no-headers"], "");
        // burner   123m   1Mi
        let cpu = out
            .lines()
            .find(|l| l.split_whitespace().next() == Some("burner"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|c| c.strip_suffix('m'))
            .and_then(|c| c.parse::<u64>().ok());
        if code == 0 && cpu.is_some_and(|c| c > 0) {
            break out;
        }
        assert!(
            Instant::now() < deadline,
            "kubectl top pod -n {ns}: exit {code}\n{out}\n{err}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    assert!(out.contains("burner"), "{out}");

    let (code, out, err) = kubectl(&["top", "node", "--no-headers"], "");
    assert_eq!(code, 0, "kubectl top node: {out}\n{err}");
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().next() == Some(node_name().as_str())),
        "{out}"
    );

    drop_namespace(&client, &ns).await;
}

/// Whether this machine's kernel accounts block I/O to cgroups: its root
/// blkio cgroup (v1) lists a device, or the root's `io.stat` (v2) has a line.
fn blkio_accounted() -> bool {
    let device_line = |path: &str| {
        std::fs::read_to_string(path).is_ok_and(|t| {
            t.lines()
                .any(|l| l.split_whitespace().next().is_some_and(|d| d.contains(':')))
        })
    };
    device_line("/sys/fs/cgroup/blkio/blkio.throttle.io_service_bytes_recursive")
        || device_line("/sys/fs/cgroup/io.stat")
}

/// The values of every `name` series whose labels include all of `labels`
/// (`key="value"` as the exposition writes them).
fn series(text: &str, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix('{')?;
            let (set, value) = rest.rsplit_once("} ")?;
            labels
                .iter()
                .all(|(k, v)| set.contains(&format!("{k}=\"{v}\"")))
                .then(|| value.parse().ok())
                .flatten()
        })
        .collect()
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn cadvisor_metrics_show_a_containers_cgroup() {
    let client = client().await;
    let ns = namespace(&client, "e2e-cadvisor").await;
    // As the node suite's ContainerMetrics pod: an 80M memory limit, a few
    // direct (uncached) block writes and reads, then idle.
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "meter" },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "meter",
                "image": BUSYBOX,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c",
                    "dd if=/dev/zero of=/f oflag=direct bs=4096 count=2 2>/dev/null; \
                     dd if=/f of=/dev/null iflag=direct bs=4096 count=2 2>/dev/null; sleep 600"],
                "resources": { "limits": { "memory": "80M" } }
            }]
        }
    }))
    .unwrap();
    create(&client, &ns, &pod).await;
    wait_for(&client, &ns, "meter", 60, "Running", phase("Running")).await;

    let ctr = [
        ("namespace", ns.as_str()),
        ("pod", "meter"),
        ("container", "meter"),
    ];
    // Block I/O is counted only where the kernel accounts it to cgroups:
    // the node's own root blkio cgroup shows whether it does.
    let accounted = blkio_accounted();
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = get(&client, "metrics/cadvisor").await;
        let written: f64 = series(&text, "container_fs_writes_total", &ctr)
            .iter()
            .sum();
        // The writable layer's usage as the runtime last measured it.
        let layer: f64 = series(&text, "container_fs_usage_bytes", &ctr).iter().sum();
        if layer >= 8192.0 && (!accounted || written >= 2.0) {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no series (or block writes) of {ns}/meter in /metrics/cadvisor:\n{text}"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    let one = |name: &str| {
        let v = series(&text, name, &ctr);
        assert_eq!(v.len(), 1, "{name} of {ns}/meter: {v:?} in\n{text}");
        v[0]
    };
    // The limits runc wrote: 80M rounded down to a page; no cpu request,
    // so the minimum shares; the default period.
    let limit = one("container_spec_memory_limit_bytes");
    assert!(
        (79_953_920.0..=79_998_976.0).contains(&limit),
        "limit {limit}"
    );
    assert!((one("container_spec_cpu_shares") - 2.0).abs() < f64::EPSILON);
    assert!((one("container_spec_cpu_period") - 100_000.0).abs() < f64::EPSILON);
    assert!(one("container_spec_memory_reservation_limit_bytes").abs() < f64::EPSILON);
    // Its usage: a running shell and sleep.
    let rss = one("container_memory_rss");
    assert!((1024.0..80e6).contains(&rss), "rss {rss}");
    let ws = one("container_memory_working_set_bytes");
    assert!(
        ws > 0.0 && ws <= one("container_memory_usage_bytes"),
        "working set {ws}"
    );
    assert!(one("container_memory_failcnt").abs() < f64::EPSILON);
    assert!(one("container_oom_events_total").abs() < f64::EPSILON);
    let cpu = series(
        &text,
        "container_cpu_usage_seconds_total",
        &[("cpu", "total"), ctr[0], ctr[1], ctr[2]],
    );
    assert!(
        cpu.len() == 1 && cpu[0] > 0.0 && cpu[0] < 100.0,
        "cpu {cpu:?}"
    );
    let processes = one("container_processes");
    assert!((1.0..=10.0).contains(&processes), "processes {processes}");
    assert!(one("container_threads") >= processes, "threads");
    assert!(
        one("container_file_descriptors") >= 3.0,
        "stdin, stdout, stderr"
    );
    assert!(one("container_ulimits_soft") > 0.0, "max open files");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = one("container_start_time_seconds");
    assert!(
        now - started < 300.0 && started <= now + 1.0,
        "started {started}, now {now}"
    );
    assert!((one("container_last_seen") - now).abs() < 60.0, "last seen");
    // The direct I/O: 8 KiB each way through the block layer; none reported
    // (rather than zeros) where the kernel does not count it.
    let read: f64 = series(&text, "container_fs_reads_bytes_total", &ctr)
        .iter()
        .sum();
    let blkio_writes: f64 = series(
        &text,
        "container_blkio_device_usage_total",
        &[("operation", "Write"), ctr[0], ctr[1], ctr[2]],
    )
    .iter()
    .sum();
    if accounted {
        assert!(read >= 8192.0, "read {read}");
        assert!(blkio_writes >= 8192.0, "blkio writes {blkio_writes}");
    } else {
        assert!(
            series(&text, "container_fs_reads_bytes_total", &ctr).is_empty(),
            "block reads reported by a kernel that does not count them:\n{text}"
        );
    }
    // Its writable layer holds the 8 KiB file.
    assert!(one("container_fs_usage_bytes") >= 8192.0, "fs usage");
    // The sandbox, as container POD: its network namespace's eth0.
    let rx = series(
        &text,
        "container_network_receive_packets_total",
        &[
            ("namespace", ns.as_str()),
            ("pod", "meter"),
            ("container", "POD"),
            ("interface", "eth0"),
        ],
    );
    assert_eq!(rx.len(), 1, "POD eth0 of {ns}/meter in\n{text}");
    // The node's root cgroup, as cAdvisor's root container: its memory and
    // the node's root filesystem with its I/O counters.
    let root = [("id", "/")];
    let ws = series(&text, "container_memory_working_set_bytes", &root);
    assert!(ws.len() == 1 && ws[0] > 0.0, "root working set {ws:?}");
    let limit = series(&text, "container_fs_limit_bytes", &root);
    assert!(
        !limit.is_empty() && limit.iter().all(|l| *l > 0.0),
        "root filesystems {limit:?}"
    );
    assert!(
        !series(&text, "container_fs_io_time_seconds_total", &root).is_empty(),
        "root device counters in\n{text}"
    );
    assert_eq!(sample(&text, "container_scrape_error"), Some(0.0), "{text}");

    drop_namespace(&client, &ns).await;
}
