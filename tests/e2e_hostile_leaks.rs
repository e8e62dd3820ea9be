//! End-to-end scenarios of what must not outlive a pod or leak past a pull
//! secret, on the local cluster (`hack/local-up.sh --agent rustlet`): a
//! force-deleted pod's probe series leave `/metrics/probes`, and an image
//! pulled with a secret is not handed to a pod without it.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;

async fn scrape_probes(client: &kube::Client) -> String {
    let path = format!("/api/v1/nodes/{}/proxy/metrics/probes", node_name());
    client
        .request_text(axum::http::Request::get(path).body(Vec::new()).unwrap())
        .await
        .expect("proxy/metrics/probes")
}

/// The `prober_probe_total` lines of the pod with `uid`.
fn series_of(text: &str, uid: &str) -> Vec<String> {
    let label = format!("pod_uid=\"{uid}\"");
    text.lines()
        .filter(|l| l.starts_with("prober_probe_total{") && l.contains(&label))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_force_deleted_pods_probe_series_leave_the_metrics() {
    let client = client().await;
    let ns = namespace(&client, "e2e-leak-probes").await;
    let probe = serde_json::json!({ "exec": { "command": ["true"] }, "periodSeconds": 1 });
    let created = create(
        &client,
        &ns,
        &from_json(serde_json::json!({
            "metadata": { "name": "probed" },
            "spec": {
                "terminationGracePeriodSeconds": 30,
                "containers": [{
                    "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "3600"],
                    "startupProbe": probe, "livenessProbe": probe, "readinessProbe": probe
                }]
            }
        })),
    )
    .await;
    let uid = created.metadata.uid.clone().expect("uid");
    wait_for(
        &client,
        &ns,
        "probed",
        60,
        "Ready",
        condition_is("Ready", "True"),
    )
    .await;
    // Every probe has run and is counted under the pod's UID.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = scrape_probes(&client).await;
        let series = series_of(&text, &uid);
        let kinds = ["Startup", "Liveness", "Readiness"];
        if kinds.iter().all(|k| {
            series
                .iter()
                .any(|l| l.contains(&format!("probe_type=\"{k}\"")))
        }) {
            break;
        }
        assert!(Instant::now() < deadline, "probes not counted: {series:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Force-deleted: gone from the API at once, no deletion timestamp ever seen.
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    api.delete("probed", &DeleteParams::default().grace_period(0))
        .await
        .expect("force delete");
    assert!(api.get_opt("probed").await.expect("get").is_none());
    // Its series leave within a few housekeeping rounds, and stay gone.
    let deleted = Instant::now();
    let deadline = deleted + Duration::from_secs(10);
    loop {
        let text = scrape_probes(&client).await;
        let series = series_of(&text, &uid);
        if series.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "probe series of the force-deleted pod still there after {:?}: {series:?}",
            deleted.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let gone_after = deleted.elapsed();
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let series = series_of(&scrape_probes(&client).await, &uid);
        assert!(
            series.is_empty(),
            "probe series came back after they left ({gone_after:?}): {series:?}"
        );
    }
    eprintln!("probe series gone {gone_after:?} after the force delete");
    drop_namespace(&client, &ns).await;
}
