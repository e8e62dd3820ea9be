//! The physical limit of pod start on this machine: pods started straight
//! through CRI (RunPodSandbox + CreateContainer + StartContainer), with the
//! same bindings and image the agent uses, no API server and no agent.
//!
//!   cargo bench --bench bare_cri -- [--mode single|burst] [--count N]
//!       [--socket PATH] [--json FILE]
//!
//! - single: N pods one at a time (each removed before the next);
//! - burst:  N pods started at once; each one's time from the burst's start.
//!
//! SOCKET defaults to the local cluster's containerd. Prints (or writes to
//! FILE) one JSON record with the latencies in seconds.

#[path = "support.rs"]
mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use futures::future;
use k8s_cri::v1 as cri;
use rustlet::cri::Runtime;
use serde::Serialize;
use support::Latency;

const IMAGE: &str = "docker.io/library/busybox:1.36";

#[derive(Clone, Copy, Debug, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Single,
    Burst,
}

#[derive(Parser)]
struct Args {
    #[arg(long, value_enum, default_value = "single")]
    mode: Mode,
    /// Pods in the workload.
    #[arg(long, default_value_t = 20)]
    count: usize,
    /// containerd's CRI socket.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Where to write the JSON record (default: stdout).
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Serialize)]
struct Record {
    mode: Mode,
    count: usize,
    /// Start → container started per pod, seconds (burst: from the burst's start).
    start: Latency,
    /// Burst: until every pod runs, seconds.
    all_running_s: Option<f64>,
}

/// Starts one pod (sandbox and container) named `uid`; returns its sandbox ID.
async fn start_pod(rt: &Runtime, image: &str, logs: &Path, uid: String) -> anyhow::Result<String> {
    let sandbox = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: uid.clone(),
            uid: uid.clone(),
            namespace: "bench".into(),
            attempt: 0,
        }),
        hostname: uid.clone(),
        log_directory: logs.join(&uid).to_string_lossy().into_owned(),
        // Not the kubelet's pod UID label: node agents leave these sandboxes alone.
        labels: HashMap::from([("rustlet.bench/uid".to_string(), uid.clone())]),
        linux: Some(cri::LinuxPodSandboxConfig::default()),
        ..Default::default()
    };
    std::fs::create_dir_all(&sandbox.log_directory)?;
    let container = cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: "c".into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: image.to_string(),
            ..Default::default()
        }),
        command: vec!["sleep".into(), "3600".into()],
        log_path: "c.log".into(),
        linux: Some(cri::LinuxContainerConfig::default()),
        ..Default::default()
    };
    let sid = rt.run_pod_sandbox(sandbox.clone(), "", &uid).await?;
    let no_sub_paths = rustlet::cri::extension::ImageSubPaths::new();
    let cid = rt
        .create_container(&sid, container, sandbox, &no_sub_paths, &uid)
        .await?;
    rt.start_container(&cid).await?;
    Ok(sid)
}

async fn remove_pod(rt: &Runtime, sid: &str) -> anyhow::Result<()> {
    rt.stop_pod_sandbox(sid).await?;
    rt.remove_pod_sandbox(sid).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse_from(support::args());
    let sock = args.socket.unwrap_or_else(|| {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/_output/local/containerd/containerd.sock"
        ))
    });
    let rt = Runtime::connect(
        &format!("unix://{}", sock.display()),
        Duration::from_secs(120),
    )
    .await?;
    let image = rt
        .image_id(IMAGE)
        .await?
        .map(|i| i.id)
        .ok_or_else(|| anyhow::anyhow!("{IMAGE} is not imported"))?;
    let logs = tempfile::tempdir()?;
    let pid = std::process::id();
    let mut times = Vec::with_capacity(args.count);
    let mut all_running_s = None;
    match args.mode {
        Mode::Single => {
            for i in 0..args.count {
                let t0 = Instant::now();
                let sid = start_pod(&rt, &image, logs.path(), format!("bare-{pid}-{i}")).await?;
                times.push(t0.elapsed().as_secs_f64());
                remove_pod(&rt, &sid).await?;
            }
        }
        Mode::Burst => {
            let t0 = Instant::now();
            let pods = (0..args.count).map(|i| {
                let (rt, image, logs) = (&rt, &image, logs.path());
                async move {
                    let sid = start_pod(rt, image, logs, format!("bare-{pid}-{i}")).await?;
                    anyhow::Ok((sid, t0.elapsed().as_secs_f64()))
                }
            });
            let started = future::try_join_all(pods).await?;
            all_running_s = Some(t0.elapsed().as_secs_f64());
            times = started.iter().map(|(_, t)| *t).collect();
            future::try_join_all(started.iter().map(|(sid, _)| remove_pod(&rt, sid))).await?;
        }
    }
    let rec = Record {
        mode: args.mode,
        count: args.count,
        start: Latency::of(times),
        all_running_s,
    };
    support::emit(args.json.as_deref(), &rec)
}
