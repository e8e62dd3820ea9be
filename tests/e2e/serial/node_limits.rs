//! The node's own limits on restarts, pulls and CPU time, on the local
//! cluster: the agent, restarted with
//! `crashLoopBackOff.maxContainerRestartPeriod: 2s`, `registryPullQPS: 1`,
//! `registryBurst: 1` and a `cpuCFSQuotaPeriod` of 50ms (with
//! `CustomCPUCFSQuotaPeriod`), restarts a crashing container every 2 s
//! instead of after 10, 20, 40 s, fails an image pull past the bucket with
//! the kubelet's "pull QPS exceeded", then pulls it after its back-off, and
//! gives a Guaranteed pod's container and cgroup a 500m quota over 50 ms.
//! The agent is restarted with its usual configuration at the end. It
//! restarts the agent, so it runs alone.

use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet --registry-mirror"]
async fn crash_loop_maximum_and_pull_rate_are_the_nodes() {
    let config = restart_agent_with(
        "limits",
        "crashLoopBackOff:\n  maxContainerRestartPeriod: 2s\nregistryPullQPS: 1\nregistryBurst: 1\n\
         featureGates:\n  CustomCPUCFSQuotaPeriod: true\ncpuCFSQuotaPeriod: 50ms\n",
    );
    let client = client().await;
    let ns = namespace(&client, "e2e-limits").await;

    // A container that exits at once: at the kubelet's default curve it
    // would have restarted three times in 30 s (at 0, 10 and 30 s).
    create(
        &client,
        &ns,
        &pod("crasher", "Always", BUSYBOX, &["sh", "-c", "exit 1"]),
    )
    .await;
    let api = kube::Api::<Pod>::namespaced(client.clone(), &ns);
    let started = Instant::now();
    let mut seen_wait = None;
    loop {
        let p = api.get("crasher").await.expect("get crasher");
        let status = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first().cloned());
        if let Some(waiting) = status
            .as_ref()
            .and_then(|s| s.state.as_ref()?.waiting.clone())
            .filter(|w| w.reason.as_deref() == Some("CrashLoopBackOff"))
        {
            seen_wait = waiting.message;
        }
        let restarts = status.map_or(0, |s| s.restart_count);
        if restarts >= 6 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{restarts} restarts in 30 s with a 2 s maximum back-off"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let wait = seen_wait.expect("a CrashLoopBackOff wait was seen");
    assert!(
        wait.starts_with("back-off 2s restarting failed container=c pod=crasher_"),
        "{wait}"
    );

    // Two containers pulled with Always in one sync: the second finds the
    // bucket empty, fails at once in the kubelet's words, and starts after
    // its back-off.
    let image = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2";
    let pulls = from_json::<Pod>(serde_json::json!({
        "metadata": { "name": "pulls" },
        "spec": { "terminationGracePeriodSeconds": 1, "containers": [
            { "name": "a", "image": image, "imagePullPolicy": "Always", "command": ["sleep", "3600"] },
            { "name": "b", "image": image, "imagePullPolicy": "Always", "command": ["sleep", "3600"] }
        ] }
    }));
    create(&client, &ns, &pulls).await;
    wait_for_events(
        &client,
        &ns,
        Involving::Name("pulls"),
        60,
        "a pull refused by the pull rate",
        |events| {
            events
                .iter()
                .find(|e| {
                    e.reason.as_deref() == Some("Failed")
                        && e.message.as_deref().is_some_and(|m| {
                            m == format!("Failed to pull image \"{image}\": pull QPS exceeded")
                        })
                })
                .cloned()
        },
    )
    .await;
    wait_for(&client, &ns, "pulls", 90, "Running", phase("Running")).await;

    // A 500m limit is 25 ms of every 50 ms period: the container's (as the
    // runtime made it) and the Guaranteed pod's cgroup, right below kubepods.
    let mut timed = pod("timed", "Always", BUSYBOX, &["sleep", "3600"]);
    let limits = serde_json::json!({ "cpu": "500m", "memory": "64Mi" });
    timed.spec.as_mut().expect("spec").containers[0].resources = Some(from_json(
        serde_json::json!({ "limits": limits, "requests": limits }),
    ));
    let timed = create(&client, &ns, &timed).await;
    wait_for(&client, &ns, "timed", 60, "Running", phase("Running")).await;
    let inside = |file: &str| {
        let path = format!("/sys/fs/cgroup/cpu/{file}");
        let (code, out, err) = kubectl(&["exec", "-n", &ns, "timed", "--", "cat", &path], "");
        assert_eq!(code, 0, "cat {path}: {err}");
        out.trim().to_string()
    };
    assert_eq!(
        (inside("cpu.cfs_period_us"), inside("cpu.cfs_quota_us")),
        ("50000".to_string(), "25000".to_string()),
        "the container's period and quota"
    );
    let uid = timed.metadata.uid.clone().unwrap_or_default();
    let pod_cgroup = format!("kubepods/pod{uid}");
    assert_eq!(
        (
            cgroup_file("cpu", &pod_cgroup, "cpu.cfs_period_us"),
            cgroup_file("cpu", &pod_cgroup, "cpu.cfs_quota_us")
        ),
        ("50000".to_string(), "25000".to_string()),
        "the pod cgroup's period and quota"
    );
    let shown = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("timed")
        .await
        .expect("timed");
    let reported = shown
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.first().and_then(|c| c.resources.clone()))
        .and_then(|r| r.limits)
        .and_then(|l| l.get("cpu").cloned());
    assert_eq!(
        reported.map(|q| q.0).as_deref(),
        Some("500m"),
        "the status' limit"
    );

    drop_namespace(&client, &ns).await;
    restart_agent(None);
    let _ = std::fs::remove_file(&config);
}
