//! The physical limit of pod start on this machine: a pod started straight
//! through CRI (RunPodSandbox + CreateContainer + StartContainer), one at a time,
//! with the same bindings and image the agent uses. Prints p50/p99 in seconds.
//!
//!   cargo bench --bench bare_cri -- [SOCKET] [COUNT]
//!
//! SOCKET defaults to the local cluster's containerd, COUNT to 20.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use rustlet::cri::Runtime;

const IMAGE: &str = "docker.io/library/busybox:1.36";

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let default_sock = format!(
        "{}/_output/local/containerd/containerd.sock",
        env!("CARGO_MANIFEST_DIR")
    );
    let sock = args.first().cloned().unwrap_or(default_sock);
    let count: usize = args.get(1).and_then(|c| c.parse().ok()).unwrap_or(20);
    let rt = Runtime::connect(&format!("unix://{sock}"), Duration::from_secs(60)).await?;
    let image = rt
        .image_id(IMAGE)
        .await?
        .map(|i| i.id)
        .ok_or_else(|| anyhow::anyhow!("{IMAGE} is not imported"))?;
    let logs = tempfile::tempdir()?;
    let mut times = Vec::with_capacity(count);
    for i in 0..count {
        let uid = format!("bare-cri-{}-{i}", std::process::id());
        let sandbox = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: uid.clone(),
                uid: uid.clone(),
                namespace: "bench".into(),
                attempt: 0,
            }),
            hostname: format!("bare-{i}"),
            log_directory: logs.path().join(&uid).to_string_lossy().into_owned(),
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
                image: image.clone(),
                ..Default::default()
            }),
            command: vec!["sleep".into(), "3600".into()],
            log_path: "c.log".into(),
            linux: Some(cri::LinuxContainerConfig::default()),
            ..Default::default()
        };
        let start = Instant::now();
        let sid = rt.run_pod_sandbox(sandbox.clone(), &uid).await?;
        let cid = rt.create_container(&sid, container, sandbox, &uid).await?;
        rt.start_container(&cid).await?;
        times.push(start.elapsed().as_secs_f64());
        rt.stop_pod_sandbox(&sid).await?;
        rt.remove_pod_sandbox(&sid).await?;
    }
    times.sort_by(f64::total_cmp);
    println!(
        "bare CRI pod start, {count} pods one at a time: p50 {:.3}s p99 {:.3}s min {:.3}s max {:.3}s",
        percentile(&times, 0.5),
        percentile(&times, 0.99),
        times[0],
        times[times.len() - 1]
    );
    Ok(())
}
