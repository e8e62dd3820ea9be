//! The eviction manager under real memory pressure: the agent is restarted
//! with `evictionHard: memory.available` a little below what the node has
//! free and a 30 s `evictionPressureTransitionPeriod`; a BestEffort pod that
//! fills a memory-backed emptyDir is evicted (Failed, `Evicted`, the
//! kubelet's message, `DisruptionTarget`, an `Evicted` event annotated with
//! the starved resource and the offending container) while a Guaranteed pod keeps
//! running, the Node reports MemoryPressure, then no longer once the memory
//! is back. The agent is restarted with its usual configuration at the end.
//! It restarts the agent, so it runs alone (hack/test.sh).

use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, Client};

/// The agent's stats summary, through the API server's proxy.
fn summary() -> serde_json::Value {
    let (code, out, err) = kubectl(
        &[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{}/proxy/stats/summary", node_name()),
        ],
        "",
    );
    assert_eq!(code, 0, "stats summary: {err}");
    serde_json::from_str(&out).expect("summary JSON")
}

/// The node's `memory.available` as the agent's summary reports it, bytes.
fn memory_available() -> u64 {
    summary()["node"]["memory"]["availableBytes"]
        .as_u64()
        .expect("node.memory.availableBytes")
}

/// Restarts the agent with `file` (under the local cluster's directory)
/// holding a configuration of `head` (KubeletConfiguration fields, one per
/// line) and `memory.available` at `memory` (the disk signals and image GC
/// off, a 30 s pressure transition period), then waits two of the eviction
/// manager's 10 s cycles and checks there is no MemoryPressure yet.
async fn restart_for_memory(client: &Client, file: &str, head: &str, memory: &str) {
    let config = local().join(file);
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{head}\
             evictionHard:\n  memory.available: \"{memory}\"\n  nodefs.available: \"0%\"\n  \
             nodefs.inodesFree: \"0%\"\n  imagefs.available: \"0%\"\n  imagefs.inodesFree: \"0%\"\n\
             imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n\
             evictionPressureTransitionPeriod: 30s\n\
             authentication:\n  x509:\n    clientCAFile: {}\n",
            local().join("pki/ca.crt").display()
        ),
    )
    .expect("config");
    restart_agent(Some(&config));
    tokio::time::sleep(Duration::from_secs(21)).await;
    assert_eq!(
        memory_pressure(client).await.as_deref(),
        Some("False"),
        "MemoryPressure before the hog: the threshold ({memory}) is too close to what is free"
    );
}

/// A BestEffort pod `hog` that writes `step_mi` MiB a second, 40 times,
/// into a memory-backed emptyDir, then sleeps.
fn hog(step_mi: u32) -> Pod {
    pod_json(serde_json::json!({
        "metadata": { "name": "hog" },
        "spec": {
            "nodeName": node_name(),
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": BUSYBOX,
                "command": ["sh", "-c", format!("i=0; while [ $i -lt 40 ]; do dd if=/dev/zero of=/fill/f$i bs=1M count={step_mi}; i=$((i+1)); sleep 1; done; sleep 3600")],
                "volumeMounts": [{ "name": "fill", "mountPath": "/fill" }]
            }],
            "volumes": [{ "name": "fill", "emptyDir": { "medium": "Memory" } }]
        }
    }))
}

/// Waits at most 120 s for pod `hog` of `ns` to fail; returns it and
/// whether the Node reported MemoryPressure meanwhile or within the 10 s
/// after (the condition stays for the transition period).
async fn hog_evicted(client: &Client, ns: &str) -> (Pod, bool) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut pressure_seen = false;
    let evicted = loop {
        pressure_seen |= memory_pressure(client).await.as_deref() == Some("True");
        let p = pods.get("hog").await.expect("hog");
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed") {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "the hog was not evicted in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for _ in 0..20 {
        if pressure_seen {
            break;
        }
        pressure_seen |= memory_pressure(client).await.as_deref() == Some("True");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    (evicted, pressure_seen)
}

async fn memory_pressure(client: &Client) -> Option<String> {
    let node = Api::<Node>::all(client.clone())
        .get(&node_name())
        .await
        .ok()?;
    node.status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "MemoryPressure")
        .map(|c| c.status)
}

async fn wait_pressure(client: &Client, want: &str, secs: u64) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while memory_pressure(client).await.as_deref() != Some(want) {
        assert!(
            Instant::now() < deadline,
            "MemoryPressure not {want} within {secs} s"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn pod_json(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).expect("pod")
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet; restarts the agent"]
async fn a_best_effort_memory_hog_is_evicted_and_a_guaranteed_pod_stays() {
    let client = client().await;
    let ns = namespace(&client, "e2e-evict").await;
    // The agent restarted once as it is, so that what a restart costs (a
    // build, caches) is in the measure; then a threshold 300 MiB below what
    // is free, which the hog's growing memory-backed volume crosses.
    restart_agent(None);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let threshold = memory_available().saturating_sub(300 << 20);
    restart_for_memory(&client, "rustlet-eviction.yaml", "", &threshold.to_string()).await;

    let guaranteed = pod_json(serde_json::json!({
        "metadata": { "name": "guaranteed" },
        "spec": {
            "nodeName": node_name(),
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": BUSYBOX, "command": ["sleep", "3600"],
                "resources": {
                    "requests": { "cpu": "10m", "memory": "64Mi" },
                    "limits": { "cpu": "10m", "memory": "64Mi" }
                }
            }]
        }
    }));
    create(&client, &ns, &guaranteed).await;
    wait_for(&client, &ns, "guaranteed", 60, "Running", phase("Running")).await;
    // 100 MiB a second, up to 4 GiB: past the threshold even if the node
    // frees memory meanwhile (a build's caches).
    create(&client, &ns, &hog(100)).await;
    let (evicted, mut pressure_seen) = hog_evicted(&client, &ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let st = evicted.status.expect("status");
    assert_eq!(st.reason.as_deref(), Some("Evicted"));
    let message = st.message.unwrap_or_default();
    assert!(
        message.starts_with("The node was low on resource: memory. Threshold quantity: "),
        "{message}"
    );
    assert!(
        message.contains("Container c was using "),
        "the hog's container is named: {message}"
    );
    let target = st
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("DisruptionTarget condition");
    assert_eq!(target.reason.as_deref(), Some("TerminationByKubelet"));
    // The Evicted event names the starved resource and the hog's container,
    // with its usage, in its annotations (the kubelet's AnnotatedEventf).
    let annotations = wait_for_events(
        &client,
        &ns,
        Involving::Name("hog"),
        30,
        "an Evicted event",
        |events| {
            events
                .iter()
                .find(|e| e.reason.as_deref() == Some("Evicted"))
                .map(|e| e.metadata.annotations.clone().unwrap_or_default())
        },
    )
    .await;
    assert_eq!(
        annotations.get("starved_resource").map(String::as_str),
        Some("memory"),
        "{annotations:?}"
    );
    assert_eq!(
        annotations.get("offending_containers").map(String::as_str),
        Some("c"),
        "{annotations:?}"
    );
    let usage = annotations
        .get("offending_containers_usage")
        .cloned()
        .unwrap_or_default();
    assert!(
        usage.starts_with(|c: char| c.is_ascii_digit()),
        "a quantity: {annotations:?}"
    );
    pressure_seen |= memory_pressure(&client).await.as_deref() == Some("True");
    assert!(pressure_seen, "the Node never reported MemoryPressure");
    let g = pods.get("guaranteed").await.expect("guaranteed");
    assert_eq!(
        g.status.and_then(|s| s.phase).as_deref(),
        Some("Running"),
        "the Guaranteed pod keeps running"
    );
    // The hog's memory is freed with its volume once the pod is deleted.
    drop_namespace(&client, &ns).await;
    wait_pressure(&client, "False", 120).await;
    restart_agent(None);
}

/// The pods' cgroup's working set as the agent's summary reports it
/// (`systemContainers` `pods`), bytes.
fn pods_working_set() -> u64 {
    summary()["node"]["systemContainers"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["name"] == "pods"))
        .and_then(|c| c["memory"]["workingSetBytes"].as_u64())
        .expect("the pods system container's working set")
}

/// `allocatableMemory.available`, as the kubelet's: with `pods` enforced,
/// the hard `memory.available` threshold (1 GiB here, far below what the
/// node has free) is copied to the pods' cgroup, whose limit is the node's
/// memory less `systemReserved`. With `systemReserved` leaving the pods
/// 2.5 GiB above what they use now, a BestEffort pod filling a
/// memory-backed emptyDir is evicted for memory while the node's own
/// memory is plentiful, and the Node reports MemoryPressure meanwhile.
#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet; restarts the agent"]
async fn a_pod_filling_the_pods_cgroup_is_evicted_for_allocatable_memory() {
    let client = client().await;
    let ns = namespace(&client, "e2e-evict-alloc").await;
    let node = Api::<Node>::all(client.clone())
        .get(&node_name())
        .await
        .expect("node");
    let capacity = node
        .status
        .and_then(|s| s.capacity)
        .and_then(|c| c.get("memory").cloned())
        .and_then(|q| q.0.strip_suffix("Ki").and_then(|k| k.parse::<u64>().ok()))
        .expect("memory capacity in Ki")
        * 1024;
    let headroom: u64 = 5 << 29; // 2.5 GiB
    let reserved = capacity.saturating_sub(pods_working_set() + headroom) >> 20;
    assert!(
        memory_available() > (4 << 30),
        "the node needs 4 GiB free for this test"
    );
    let head = format!("systemReserved:\n  memory: {reserved}Mi\n");
    restart_for_memory(&client, "rustlet-eviction-allocatable.yaml", &head, "1Gi").await;
    // 50 MiB a second, up to 2 GiB: past the 1.5 GiB the threshold
    // leaves, below the pods' cgroup limit.
    create(&client, &ns, &hog(50)).await;
    let (evicted, pressure_seen) = hog_evicted(&client, &ns).await;
    let st = evicted.status.expect("status");
    assert_eq!(st.reason.as_deref(), Some("Evicted"), "{st:?}");
    let message = st.message.unwrap_or_default();
    assert!(
        message.starts_with("The node was low on resource: memory. Threshold quantity: 1Gi, "),
        "{message}"
    );
    assert!(
        memory_available() > (2 << 30),
        "the node's own memory stayed plentiful: the pods' cgroup ran low"
    );
    assert!(pressure_seen, "the Node never reported MemoryPressure");
    drop_namespace(&client, &ns).await;
    // The agent's usual configuration starts without pressure.
    restart_agent(None);
}
