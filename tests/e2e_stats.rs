//! Resource statistics of the node API on the local cluster: `/stats/summary`
//! and `/metrics/resource` read through the API server's node proxy (what
//! `kubectl get --raw` and metrics-server read), and `kubectl top` through
//! metrics-server when the cluster runs it (`hack/local-up.sh --metrics-server`).

mod common;

use std::time::{Duration, Instant};

use common::*;
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
