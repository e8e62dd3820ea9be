//! `kubeAPIQPS` and `kubeAPIBurst`: the agent, restarted with 5 and 10 under
//! 30 pods (`RUSTLET_E2E_RATE_PODS` sets another number, up to the node's
//! 110; each pod has its service account token to request again), never
//! sends the API server more than `burst + qps * W` requests in any window
//! of `W` seconds, counted from the API server's audit log of the node's
//! requests (`hack/local-up.sh` writes it). The Lease and node status (the
//! heartbeat) and Events (their own bucket) are not counted, as in the
//! kubelet. The agent is restarted with its usual configuration at the end.
//! It restarts the agent, so it runs alone.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;

const QPS: f64 = 5.0;
const BURST: f64 = 10.0;
/// How many pods the restart finds: `RUSTLET_E2E_RATE_PODS`, else 30.
fn pods_wanted() -> usize {
    std::env::var("RUSTLET_E2E_RATE_PODS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(30)
}

/// The node's counted requests received since `since`, by the API server's
/// receive time: one per audit ID; Leases, node status and Events left out.
fn counted_requests(since: Timestamp) -> Vec<Timestamp> {
    let log = std::fs::read_to_string(local().join("logs/audit.log")).expect("audit log");
    let mut first: BTreeMap<String, Timestamp> = BTreeMap::new();
    for line in log.lines() {
        let Ok(e) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if e["user"]["username"] != format!("system:node:{}", node_name()).as_str() {
            continue;
        }
        let object = &e["objectRef"];
        let heartbeat = object["resource"] == "leases"
            || (object["resource"] == "nodes" && object["subresource"] == "status")
            || object["resource"] == "events";
        let Some(at) = e["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<Timestamp>().ok())
        else {
            continue;
        };
        if heartbeat || at < since {
            continue;
        }
        let id = e["auditID"].as_str().unwrap_or_default().to_string();
        first.entry(id).or_insert(at);
    }
    let mut times: Vec<Timestamp> = first.into_values().collect();
    times.sort();
    times
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_restart_under_many_pods_keeps_to_the_api_rate_limit() {
    let wanted = pods_wanted();
    let client = client().await;
    let ns = namespace(&client, "e2e-rate").await;
    for i in 0..wanted {
        create(
            &client,
            &ns,
            &pod(&format!("p{i}"), "Always", BUSYBOX, &["sleep", "3600"]),
        )
        .await;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let running = |list: &[Pod]| {
        list.iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60 + 6 * wanted as u64);
    while running(&pods.list(&ListParams::default()).await.expect("pods").items) < wanted {
        assert!(
            std::time::Instant::now() < deadline,
            "{wanted} pods not Running"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }

    let since = Timestamp::now();
    let config = restart_agent_with(
        "rate",
        &format!("kubeAPIQPS: {QPS}\nkubeAPIBurst: {BURST}\n"),
    );
    // The restart's work: the pods synced again, their tokens requested.
    tokio::time::sleep(Duration::from_secs(40.max(wanted as u64 / 2))).await;
    let times = counted_requests(since);
    assert!(
        times.len() as f64 > 2.0 * BURST,
        "only {} requests: the bucket was never tested",
        times.len()
    );
    // Every window that starts at a request: at most burst + qps * W, plus
    // 3: the receive times' jitter, and the unthrottled heartbeat's one GET
    // of the Node before the Node's watch has listed it (the audit log
    // cannot tell the two clients apart).
    let mut worst = (0.0, 0usize, 0.0);
    for (i, start) in times.iter().enumerate() {
        for (j, end) in times.iter().enumerate().skip(i) {
            let secs = end.duration_since(*start).as_secs_f64();
            let n = j - i + 1;
            let allowed = BURST + QPS * secs + 3.0;
            if n as f64 - allowed > worst.0 {
                worst = (n as f64 - allowed, n, secs);
            }
        }
    }
    assert!(
        worst.0 <= 0.0,
        "{} requests in {:.2} s, over burst {BURST} + {QPS}/s (of {} requests)",
        worst.1,
        worst.2,
        times.len()
    );
    // And the pods are all still there and running.
    assert_eq!(
        running(&pods.list(&ListParams::default()).await.expect("pods").items),
        wanted
    );
    drop_namespace(&client, &ns).await;
    restart_agent(None);
    let _ = std::fs::remove_file(&config);
}
