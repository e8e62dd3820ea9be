//! Pod workloads through the whole node agent, timed as the SIG-scalability
//! pod startup SLI (create → Running seen through a watch on the API server),
//! with the agent's RSS and CPU sampled from /proc while they run. Run it on
//! the local cluster with either agent (`hack/bench.sh` runs them all).
//!
//!   cargo bench --bench pod_start -- [--mode single|burst|steady|idle]
//!       [--count N] [--seconds S] [--pid AGENT_PID] [--json FILE]
//!
//! - single: N pods one at a time: create → Running, then delete → gone;
//! - burst:  N pods created at once: each one's create → Running, the wall
//!   time until all run, then all deleted;
//! - steady: N pods created at once and, once all run, S seconds of sampling;
//! - idle:   S seconds of sampling, no pods.
//!
//! Prints (or writes to FILE) one JSON record: latencies in seconds, the
//! window's start and end (RFC 3339), and the agent's RSS (MiB) and CPU (cores).

#[path = "support.rs"]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use futures::{StreamExt, TryStreamExt, future};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, PostParams, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::WatchEvent;
use kube::{Api, Client};
use serde::Serialize;
use support::{Latency, Sampler, Usage};

#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Single,
    Burst,
    Steady,
    Idle,
}

#[derive(Parser)]
struct Args {
    #[arg(long, value_enum, default_value = "single")]
    mode: Mode,
    /// Pods in the workload.
    #[arg(long, default_value_t = 20)]
    count: usize,
    /// Seconds of sampling for `idle` and, once all pods run, `steady`.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// The node agent's process, sampled for RSS and CPU.
    #[arg(long)]
    pid: Option<u32>,
    /// Where to write the JSON record (default: stdout).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Namespace of the pods.
    #[arg(long, default_value = "default")]
    namespace: String,
}

#[derive(Serialize, Default)]
struct Record {
    mode: Option<Mode>,
    count: usize,
    /// Create → Running per pod (single: one at a time; burst/steady: from the burst's start).
    start: Option<Latency>,
    /// Delete → gone per pod (single only).
    delete: Option<Latency>,
    /// Burst/steady: from the first create until every pod runs, seconds.
    all_running_s: Option<f64>,
    /// Burst/steady: from the delete until every pod is gone, seconds.
    all_gone_s: Option<f64>,
    /// Agent use over the whole workload (idle, single, burst) or the steady hold.
    agent: Usage,
    /// The workload's window, RFC 3339, for counting the agent's API requests.
    window_start: String,
    window_end: String,
    /// Single/burst/steady: each pod's name, when its create was sent (for a
    /// burst: the burst's start) and when it was seen Running, UNIX seconds
    /// (`hack/startup-trace.py` lays the agent's startup trace over them).
    pods: Vec<PodTimes>,
}

/// One pod's start as the workload saw it, UNIX seconds.
#[derive(Serialize)]
struct PodTimes {
    name: String,
    created: f64,
    running: f64,
}

/// The wall clock, UNIX seconds.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A pod that sleeps and exits at once on SIGTERM.
fn pod(name: &str, label: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "labels": { "bench": label } },
        "spec": {
            "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "c",
                "image": "docker.io/library/busybox:1.36",
                "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
            }]
        }
    }))?)
}

fn running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

async fn client() -> anyhow::Result<Client> {
    let path = std::env::var("BENCH_KUBECONFIG").unwrap_or_else(|_| {
        format!(
            "{}/_output/local/admin.kubeconfig",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    let cfg = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(&path)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    Ok(Client::try_from(cfg)?)
}

/// One pod at a time: create → Running and delete → gone, seconds; each
/// pod's times.
async fn single(
    api: &Api<Pod>,
    count: usize,
) -> anyhow::Result<(Vec<f64>, Vec<f64>, Vec<PodTimes>)> {
    let (mut start, mut stop, mut pods) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..count {
        let name = format!("bench-single-{}-{i}", std::process::id());
        let wp = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(290);
        let mut events = api.watch(&wp, "0").await?.boxed();
        let (t0, created) = (Instant::now(), unix_now());
        api.create(&PostParams::default(), &pod(&name, "single")?)
            .await?;
        while let Some(ev) = tokio::time::timeout(Duration::from_secs(120), events.try_next())
            .await
            .map_err(|_| anyhow::anyhow!("{name} not Running after 120 s"))??
        {
            if matches!(&ev, WatchEvent::Modified(p) if running(p)) {
                break;
            }
        }
        start.push(t0.elapsed().as_secs_f64());
        pods.push(PodTimes {
            name: name.clone(),
            created,
            running: unix_now(),
        });
        let t1 = Instant::now();
        api.delete(&name, &DeleteParams::default()).await?;
        while let Some(ev) = tokio::time::timeout(Duration::from_secs(120), events.try_next())
            .await
            .map_err(|_| anyhow::anyhow!("{name} not gone after 120 s"))??
        {
            if matches!(ev, WatchEvent::Deleted(_)) {
                break;
            }
        }
        stop.push(t1.elapsed().as_secs_f64());
    }
    Ok((start, stop, pods))
}

/// Creates `count` pods at once and waits until all run: each pod's time from
/// the burst's start to Running, the wall time, and each pod's times.
async fn burst(
    api: &Api<Pod>,
    count: usize,
    label: &str,
) -> anyhow::Result<(Vec<f64>, f64, Vec<PodTimes>)> {
    let lp = ListParams::default().labels(&format!("bench={label}"));
    let rv = api.list_metadata(&lp).await?.metadata.resource_version;
    let wp = WatchParams::default()
        .labels(&format!("bench={label}"))
        .timeout(290);
    let mut events = api.watch(&wp, rv.as_deref().unwrap_or("0")).await?.boxed();
    let names: Vec<String> = (0..count)
        .map(|i| format!("bench-{label}-{}-{i}", std::process::id()))
        .collect();
    let (t0, created) = (Instant::now(), unix_now());
    let creates = names.iter().map(|n| async move {
        api.create(&PostParams::default(), &pod(n, label)?)
            .await
            .map_err(anyhow::Error::from)
    });
    future::try_join_all(creates).await?;
    let mut started: BTreeMap<String, f64> = BTreeMap::new();
    let deadline = Duration::from_secs(600);
    while started.len() < count {
        let left = deadline.saturating_sub(t0.elapsed());
        let Some(ev) = tokio::time::timeout(left, events.try_next())
            .await
            .map_err(|_| {
                anyhow::anyhow!("{} of {count} pods Running after 600 s", started.len())
            })??
        else {
            // The watch timed out on the server: resume from a fresh list.
            let pods = api.list(&lp).await?;
            for p in pods.items.iter().filter(|p| running(p)) {
                let name = p.metadata.name.clone().unwrap_or_default();
                started
                    .entry(name)
                    .or_insert_with(|| t0.elapsed().as_secs_f64());
            }
            events = api
                .watch(
                    &wp,
                    pods.metadata.resource_version.as_deref().unwrap_or("0"),
                )
                .await?
                .boxed();
            continue;
        };
        if let WatchEvent::Modified(p) = ev
            && running(&p)
        {
            let name = p.metadata.name.clone().unwrap_or_default();
            started
                .entry(name)
                .or_insert_with(|| t0.elapsed().as_secs_f64());
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let pods = started
        .iter()
        .map(|(name, s)| PodTimes {
            name: name.clone(),
            created,
            running: created + s,
        })
        .collect();
    Ok((started.into_values().collect(), wall, pods))
}

/// Deletes every pod labelled `bench=label` and waits until all are gone, seconds.
async fn delete_all(api: &Api<Pod>, label: &str) -> anyhow::Result<f64> {
    let lp = ListParams::default().labels(&format!("bench={label}"));
    let t0 = Instant::now();
    api.delete_collection(&DeleteParams::default(), &lp).await?;
    loop {
        let left: BTreeSet<String> = api
            .list_metadata(&lp)
            .await?
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        if left.is_empty() {
            return Ok(t0.elapsed().as_secs_f64());
        }
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(600),
            "{} pods still there 600 s after the delete",
            left.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse_from(support::args());
    let api: Api<Pod> = Api::namespaced(client().await?, &args.namespace);
    let mut rec = Record {
        mode: Some(args.mode),
        count: args.count,
        window_start: support::now(),
        ..Record::default()
    };
    match args.mode {
        Mode::Idle => {
            let sampler = Sampler::start(args.pid);
            tokio::time::sleep(Duration::from_secs(args.seconds)).await;
            rec.agent = sampler.finish().await?;
            rec.count = 0;
        }
        Mode::Single => {
            let sampler = Sampler::start(args.pid);
            let (start, stop, pods) = single(&api, args.count).await?;
            rec.agent = sampler.finish().await?;
            rec.pods = pods;
            rec.start = Some(Latency::of(start));
            rec.delete = Some(Latency::of(stop));
        }
        Mode::Burst => {
            let sampler = Sampler::start(args.pid);
            let (start, wall, pods) = burst(&api, args.count, "burst").await?;
            rec.agent = sampler.finish().await?;
            rec.pods = pods;
            rec.all_running_s = Some(wall);
            rec.start = Some(Latency::of(start));
            rec.all_gone_s = Some(delete_all(&api, "burst").await?);
        }
        Mode::Steady => {
            let (start, wall, pods) = burst(&api, args.count, "steady").await?;
            rec.all_running_s = Some(wall);
            rec.pods = pods;
            rec.start = Some(Latency::of(start));
            let sampler = Sampler::start(args.pid);
            tokio::time::sleep(Duration::from_secs(args.seconds)).await;
            rec.agent = sampler.finish().await?;
            rec.all_gone_s = Some(delete_all(&api, "steady").await?);
        }
    }
    rec.window_end = support::now();
    support::emit(args.json.as_deref(), &rec)
}
