//! `/metrics` of the node API on the local cluster (`hack/local-up.sh --agent
//! rustlet`), read through the API server's node proxy as Prometheus scrapes
//! it: the kubelet's metric names move as a pod starts.

use crate::common::*;

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn metrics_count_a_pod_start_under_the_kubelets_names() {
    let client = client().await;
    let before = scrape(&client, "metrics").await;
    let starts = |t: &str| sample(t, "kubelet_pod_start_duration_seconds_count").unwrap_or(0.0);
    let sandboxes = |t: &str| {
        sample(
            t,
            "kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"}",
        )
        .unwrap_or(0.0)
    };
    let ns = namespace(&client, "metrics").await;
    let mut sleeper = pod("sleeper", "Never", BUSYBOX, &["sleep", "3600"]);
    sleeper.spec.as_mut().unwrap().containers[0].readiness_probe = Some(
        serde_json::from_value(serde_json::json!({
            "exec": { "command": ["true"] }, "periodSeconds": 1
        }))
        .unwrap(),
    );
    create(&client, &ns, &sleeper).await;
    wait_for(&client, &ns, "sleeper", 60, "Running", phase("Running")).await;
    // The pod start is recorded when the worker sees its Running status come back.
    let mut after = String::new();
    for _ in 0..50 {
        after = scrape(&client, "metrics").await;
        if starts(&after) > starts(&before) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(
        starts(&after) > starts(&before),
        "pod start not counted:\n{after}"
    );
    assert!(sandboxes(&after) > sandboxes(&before), "{after}");
    assert!(
        sample(&after, "kubelet_running_pods").unwrap_or(0.0) >= 1.0,
        "{after}"
    );
    assert!(
        sample(
            &after,
            "kubelet_running_containers{container_state=\"running\"}"
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{after}"
    );
    assert!(
        sample(
            &after,
            "kubelet_pod_worker_duration_seconds_count{operation_type=\"create\"}"
        )
        .unwrap_or(0.0)
            >= 1.0,
        "{after}"
    );
    assert!(after.contains("# TYPE kubelet_runtime_operations_duration_seconds histogram"));
    // Ready only once the readiness probe has succeeded, and so been counted.
    wait_for(
        &client,
        &ns,
        "sleeper",
        30,
        "Ready",
        condition_is("Ready", "True"),
    )
    .await;
    let probes = scrape(&client, "metrics/probes").await;
    let series = format!(
        "prober_probe_total{{probe_type=\"Readiness\",result=\"successful\",container=\"c\",pod=\"sleeper\",namespace=\"{ns}\""
    );
    assert!(
        probes.lines().any(|l| l.starts_with(&series)),
        "no {series} in\n{probes}"
    );
    drop_namespace(&client, &ns).await;
}
