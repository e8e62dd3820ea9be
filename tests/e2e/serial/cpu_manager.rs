//! The CPU manager's `static` policy on this two-CPU machine: the agent is
//! restarted with `cpuManagerPolicy: static`, `reservedSystemCPUs: "0"` and
//! `topologyManagerPolicy: single-numa-node`. A Guaranteed pod asking for
//! one CPU runs on CPU 1 alone; a BestEffort pod started before it shrinks
//! to CPU 0 within a reconcile period; the kubelet's own pod resources
//! client sees the pinned CPU and CPU 1 as allocatable; a restart keeps the
//! assignment (the checkpoint); the kubelet's CPU manager metrics count
//! it; once the pinned pod goes, the shared pod
//! gets CPU 1 back. Every pod's CPUs change, so it runs alone; the agent is
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

fn remove_checkpoint() {
    let _ = std::fs::remove_file(checkpoint());
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

/// What the kubelet's pod resources client sees: the `cpu_ids` of pod
/// `ns`/`name`'s first container and the allocatable CPUs.
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
    (
        pod["containers"][0]["cpu_ids"].clone(),
        view["allocatable"]["cpu_ids"].clone(),
    )
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
    let (cpus, allocatable) = pod_resources_view(&ns, "pinned");
    assert_eq!(cpus, serde_json::json!([1]));
    assert_eq!(allocatable, serde_json::json!([1]));
    let (cpus, _) = pod_resources_view(&ns, "shared");
    assert!(cpus.as_array().is_none_or(Vec::is_empty), "shared: {cpus}");
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
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in /metrics"
        );
    }
    let state = std::fs::read_to_string(checkpoint()).expect("checkpoint");
    assert!(state.contains("\"policyName\":\"static\""), "{state}");

    // A restart keeps the assignment.
    restart_agent(Some(&config));
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(allowed(&ns, "pinned"), "1");
    assert_eq!(allowed(&ns, "shared"), "0");
    let (cpus, _) = pod_resources_view(&ns, "pinned");
    assert_eq!(cpus, serde_json::json!([1]), "after the restart");

    // The pinned pod goes: CPU 1 returns to the pool.
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("pinned", &DeleteParams::default())
        .await
        .expect("delete pinned");
    wait_allowed(&ns, "shared", "0-1", 60).await;

    drop_namespace(&client, &ns).await;
    restart_agent_after(None, remove_checkpoint);
    let _ = std::fs::remove_file(&config);
}
