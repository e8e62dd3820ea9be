//! The CPU manager's `static` policy on this two-CPU machine, with the
//! memory manager's `Static` policy: the agent is restarted with
//! `cpuManagerPolicy: static`, `reservedSystemCPUs: "0"`,
//! `memoryManagerPolicy: Static` (100Mi of NUMA node 0 reserved, as the
//! hard eviction threshold holds back) and `topologyManagerPolicy:
//! single-numa-node`. A Guaranteed pod asking for one CPU runs on CPU 1
//! alone, its memory pinned to node 0 (`cpuset.mems` in the spec given to
//! the runtime); a BestEffort pod started before it shrinks to CPU 0 within
//! a reconcile period and has no memory pinned; the kubelet's own pod
//! resources client sees the pinned CPU and memory block, CPU 1 and node
//! 0's memory as allocatable; a restart keeps both (the checkpoints); the
//! kubelet's CPU and memory manager metrics count them; once the pinned
//! pod goes, the shared pod gets CPU 1 back and its memory returns. Every pod's CPUs change, so it runs alone; the agent is
//! restarted with its usual configuration (and its checkpoint removed) at
//! the end.

use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;

/// The agent's CPU manager checkpoint in the local cluster.
fn checkpoint() -> std::path::PathBuf {
    local()
        .join("rustlet")
        .join(rustlet::cpu_manager::state::FILE)
}

/// The agent's memory manager checkpoint in the local cluster.
fn memory_checkpoint() -> std::path::PathBuf {
    local()
        .join("rustlet")
        .join(rustlet::memory_manager::state::FILE)
}

fn remove_checkpoint() {
    let _ = std::fs::remove_file(checkpoint());
    let _ = std::fs::remove_file(memory_checkpoint());
}

/// The `cpuset.mems` of the spec the runtime was given for the first
/// container of pod `ns`/`name` (empty when none was set).
async fn cpuset_mems(client: &kube::Client, ns: &str, name: &str) -> String {
    let pod = Api::<Pod>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .expect("get the pod");
    let id = container_status(&pod)
        .container_id
        .unwrap_or_default()
        .trim_start_matches("containerd://")
        .to_string();
    let status = runtime()
        .await
        .container_status_verbose(&id)
        .await
        .expect("ContainerStatus");
    let info: serde_json::Value =
        serde_json::from_str(status.info.get("info").expect("verbose info")).expect("JSON");
    info["runtimeSpec"]["linux"]["resources"]["cpu"]["mems"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The CPUs container `c` of pod `ns`/`name` may run on, as its first
/// process sees them (`Cpus_allowed_list`).
fn allowed(ns: &str, name: &str) -> String {
    let (code, out, err) = kubectl(
        &[
            "exec",
            "-n",
            ns,
            name,
            "-c",
            "c",
            "--",
            "grep",
            "Cpus_allowed_list",
            "/proc/1/status",
        ],
        "",
    );
    assert_eq!(code, 0, "exec in {name}: {err}");
    out.split(':').nth(1).unwrap_or_default().trim().to_string()
}

/// Waits up to `secs` for `name`'s allowed CPUs to be `want`.
async fn wait_allowed(ns: &str, name: &str, want: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let got = allowed(ns, name);
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} runs on {got}, not {want}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// A Guaranteed pod `name` with one container asking for `cpu`.
fn guaranteed(name: &str, cpu: &str) -> Pod {
    from_json(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": BUSYBOX, "command": ["sleep", "3600"],
                "resources": {
                    "requests": { "cpu": cpu, "memory": "32Mi" },
                    "limits": { "cpu": cpu, "memory": "32Mi" }
                }
            }]
        }
    }))
}

/// What the kubelet's pod resources client sees of pod `ns`/`name`'s first
/// container (its `cpu_ids` and `memory`) and of the node's allocatable
/// resources (`cpu_ids`, `memory`).
fn pod_resources_view(ns: &str, name: &str) -> (serde_json::Value, serde_json::Value) {
    let socket = local()
        .join("rustlet")
        .join(rustlet::pod_resources::DIR_NAME)
        .join(rustlet::pod_resources::SOCKET);
    let out = std::process::Command::new(registry::bin("podresources-client"))
        .arg(&socket)
        .output()
        .expect("run _output/bin/podresources-client (hack/build-cluster.sh csi)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let pod = view["list"]["pod_resources"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .find(|p| p["namespace"] == ns && p["name"] == name)
        .unwrap_or_else(|| panic!("{name} in the List: {view}"));
    (pod["containers"][0].clone(), view["allocatable"].clone())
}

/// The NUMA nodes of a pod resources API memory block.
fn block_nodes(block: &serde_json::Value) -> Vec<i64> {
    block["topology"]["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|n| n["ID"].as_i64().or_else(|| n["id"].as_i64()).unwrap_or(0))
        .collect()
}

/// On a failure, the agent goes back to its usual configuration without
/// the static policy's checkpoint, which that configuration refuses.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        if std::thread::panicking() {
            restart_agent_after(None, remove_checkpoint);
        }
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_guaranteed_pod_gets_cpu_1_alone_and_the_shared_pool_follows() {
    let usual = std::fs::read_to_string(local().join("rustlet.yaml")).expect("rustlet.yaml");
    let config = local().join("rustlet-cpu-manager.yaml");
    std::fs::write(
        &config,
        format!(
            "{usual}cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\ncpuManagerReconcilePeriod: 2s\n\
             memoryManagerPolicy: Static\nreservedMemory:\n- numaNode: 0\n  limits:\n    memory: 100Mi\n\
             topologyManagerPolicy: single-numa-node\n"
        ),
    )
    .expect("write the configuration");
    // The usual agent's checkpoint is of the none policy.
    restart_agent_after(Some(&config), remove_checkpoint);
    let _restore = Restore;
    let client = client().await;
    let ns = namespace(&client, "e2e-cpus").await;

    create(
        &client,
        &ns,
        &pod("shared", "Never", BUSYBOX, &["sleep", "3600"]),
    )
    .await;
    wait_for(&client, &ns, "shared", 90, "Running", phase("Running")).await;
    assert_eq!(
        allowed(&ns, "shared"),
        "0-1",
        "the shared pool is every CPU"
    );

    create(&client, &ns, &guaranteed("pinned", "1")).await;
    wait_for(&client, &ns, "pinned", 90, "Running", phase("Running")).await;
    assert_eq!(allowed(&ns, "pinned"), "1", "created on its exclusive CPU");
    wait_allowed(&ns, "shared", "0", 20).await;
    let (pinned, allocatable) = pod_resources_view(&ns, "pinned");
    assert_eq!(pinned["cpu_ids"], serde_json::json!([1]));
    assert_eq!(allocatable["cpu_ids"], serde_json::json!([1]));
    let block = &pinned["memory"][0];
    assert_eq!(block["memory_type"], "memory", "pinned: {pinned}");
    assert_eq!(block["size"], 32 << 20, "pinned: {pinned}");
    assert_eq!(block_nodes(block), [0], "pinned: {pinned}");
    let node_memory = allocatable["memory"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|b| b["memory_type"] == "memory")
        .unwrap_or_else(|| panic!("no allocatable memory: {allocatable}"));
    assert_eq!(block_nodes(node_memory), [0]);
    assert!(node_memory["size"].as_u64().unwrap_or(0) > 1 << 30);
    let (shared, _) = pod_resources_view(&ns, "shared");
    let cpus = &shared["cpu_ids"];
    assert!(cpus.as_array().is_none_or(Vec::is_empty), "shared: {cpus}");
    assert!(
        shared["memory"].as_array().is_none_or(Vec::is_empty),
        "shared: {shared}"
    );
    // Memory pinned to node 0 in the runtime's spec; none for the shared pod.
    assert_eq!(cpuset_mems(&client, &ns, "pinned").await, "0");
    assert_eq!(cpuset_mems(&client, &ns, "shared").await, "");
    // The kubelet's metrics of the pool.
    let (code, metrics, err) = kubectl(
        &[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{}/proxy/metrics", node_name()),
        ],
        "",
    );
    assert_eq!(code, 0, "metrics: {err}");
    for line in [
        "kubelet_cpu_manager_exclusive_cpu_allocation_count 1",
        "kubelet_cpu_manager_shared_pool_size_millicores 0",
        "kubelet_cpu_manager_pinning_requests_total 1",
        "kubelet_topology_manager_admission_requests_total 2",
        "kubelet_memory_manager_pinning_requests_total 1",
        "kubelet_memory_manager_pinning_errors_total 0",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in /metrics"
        );
    }
    let state = std::fs::read_to_string(checkpoint()).expect("checkpoint");
    assert!(state.contains("\"policyName\":\"static\""), "{state}");
    let pinned_uid = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("pinned")
        .await
        .expect("get pinned")
        .metadata
        .uid
        .unwrap_or_default();
    let memory_state = std::fs::read_to_string(memory_checkpoint()).expect("memory checkpoint");
    assert!(memory_state.contains(&pinned_uid), "{memory_state}");

    // A restart keeps the assignment.
    restart_agent(Some(&config));
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(allowed(&ns, "pinned"), "1");
    assert_eq!(allowed(&ns, "shared"), "0");
    let (pinned, _) = pod_resources_view(&ns, "pinned");
    assert_eq!(
        pinned["cpu_ids"],
        serde_json::json!([1]),
        "after the restart"
    );
    assert_eq!(pinned["memory"][0]["size"], 32 << 20, "after the restart");
    assert_eq!(cpuset_mems(&client, &ns, "pinned").await, "0");

    // The pinned pod goes: CPU 1 returns to the pool.
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("pinned", &DeleteParams::default())
        .await
        .expect("delete pinned");
    wait_allowed(&ns, "shared", "0-1", 60).await;
    let memory_state = std::fs::read_to_string(memory_checkpoint()).expect("memory checkpoint");
    assert!(!memory_state.contains(&pinned_uid), "{memory_state}");

    drop_namespace(&client, &ns).await;
    restart_agent_after(None, remove_checkpoint);
    let _ = std::fs::remove_file(&config);
}
