//! Pod start latency through the whole node agent, as the SIG-scalability pod
//! startup SLI: create a pod, observe it Running through a watch on the API
//! server; one pod at a time. Run it on the local cluster with either agent.
//!
//!   cargo bench --bench pod_start -- [COUNT]
//!
//! Prints p50/p99 of create → Running and of delete → gone, in seconds.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::WatchEvent;
use kube::{Api, Client};

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn summary(name: &str, mut v: Vec<f64>) -> String {
    v.sort_by(f64::total_cmp);
    format!(
        "{name}: p50 {:.3}s p99 {:.3}s",
        percentile(&v, 0.5),
        percentile(&v, 0.99)
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let count: usize = args.first().and_then(|c| c.parse().ok()).unwrap_or(20);
    let path = format!(
        "{}/_output/local/admin.kubeconfig",
        env!("CARGO_MANIFEST_DIR")
    );
    let cfg = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&path)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    let api: Api<Pod> = Api::namespaced(Client::try_from(cfg)?, "default");
    let (mut start, mut stop) = (Vec::new(), Vec::new());
    for i in 0..count {
        let name = format!("bench-start-{}-{i}", std::process::id());
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name },
            "spec": {
                "terminationGracePeriodSeconds": 30,
                "containers": [{
                    "name": "c",
                    "image": "docker.io/library/busybox:1.36",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
                }]
            }
        }))?;
        let wp = WatchParams::default().fields(&format!("metadata.name={name}"));
        let mut events = api.watch(&wp, "0").await?.boxed();
        let t0 = Instant::now();
        api.create(&PostParams::default(), &pod).await?;
        while let Some(ev) = events.try_next().await? {
            if let WatchEvent::Modified(p) = ev
                && p.status.and_then(|s| s.phase).as_deref() == Some("Running")
            {
                break;
            }
        }
        start.push(t0.elapsed().as_secs_f64());
        let t1 = Instant::now();
        api.delete(&name, &DeleteParams::default()).await?;
        while let Some(ev) =
            tokio::time::timeout(Duration::from_secs(60), events.try_next()).await??
        {
            if matches!(ev, WatchEvent::Deleted(_)) {
                break;
            }
        }
        stop.push(t1.elapsed().as_secs_f64());
    }
    println!(
        "{}",
        summary(
            &format!("create -> Running, {count} pods one at a time"),
            start
        )
    );
    println!("{}", summary("delete -> gone", stop));
    Ok(())
}
