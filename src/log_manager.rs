//! Container log rotation, as the kubelet's `ContainerLogManager`
//! (pkg/kubelet/logs/container_log_manager.go): every `containerLogMonitorInterval`
//! each running container's log file (`<podLogsDir>/<ns>_<pod>_<uid>/<container>/<restart>.log`)
//! that has grown past `containerLogMaxSize` is renamed to
//! `<log>.<YYYYMMDD-hhmmss>` and the runtime is asked to reopen it
//! (CRI `ReopenContainerLog`). Rotated files but the newest are gzip-compressed
//! (`.gz`), and at most `containerLogMaxFiles` files are kept per container,
//! the live one included.

use std::io;
use std::path::{Path, PathBuf};

use k8s_openapi::jiff::Timestamp;
use tracing::{debug, warn};

use crate::cri::{self, Runtime};
use k8s_cri::v1 as api;

use crate::cri::log::{COMPRESSED_SUFFIX as COMPRESSED, TMP_SUFFIX as TMP, rotated_name};

pub use crate::config::ContainerLogPolicy as Policy;

/// What to do with a container's rotated files before rotating its live log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Cleanup {
    /// Files to remove: leftovers of interrupted compression, uncompressed
    /// copies of compressed files, and the oldest files beyond the limit.
    pub remove: Vec<PathBuf>,
    /// Rotated files to compress (all kept ones not compressed yet).
    pub compress: Vec<PathBuf>,
}

/// Decides the cleanup of the rotated files `rotated` (all `<log>.*`) so that
/// after one more rotation at most `max_files` files exist, as the kubelet's
/// `cleanupUnusedLogs`, `removeExcessLogs` and compression steps. Pure.
#[must_use]
pub fn cleanup(rotated: &[PathBuf], max_files: usize) -> Cleanup {
    let mut out = Cleanup::default();
    let name = |p: &PathBuf| p.to_string_lossy().into_owned();
    let mut kept: Vec<PathBuf> = Vec::new();
    for p in rotated {
        let n = name(p);
        let compressed_exists = rotated
            .iter()
            .any(|q| name(q) == format!("{n}{COMPRESSED}"));
        if n.ends_with(TMP) || compressed_exists {
            out.remove.push(p.clone());
        } else {
            kept.push(p.clone());
        }
    }
    // Timestamps sort as text; room is left for the live log and the one about to be rotated.
    kept.sort();
    let excess = kept.len().saturating_sub(max_files.saturating_sub(2));
    out.remove.extend(kept.drain(..excess));
    out.compress = kept
        .into_iter()
        .filter(|p| !name(p).ends_with(COMPRESSED))
        .collect();
    out
}

/// Checks the logs of every running container every `policy.interval`,
/// forever, and sweeps the links in `links_dir` whose log is gone
/// ([`crate::log_links::sweep`]). Errors are logged, never fatal.
pub async fn run(runtime: Runtime, pod_logs_dir: PathBuf, links_dir: PathBuf, policy: Policy) {
    let mut tick = tokio::time::interval(policy.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = rotate_all(&runtime, &pod_logs_dir, policy).await {
            debug!(error = %e, "container log rotation");
        }
        if let Err(e) = crate::log_links::sweep(&links_dir, &pod_logs_dir) {
            debug!(error = %e, "container log links");
        }
    }
}

/// One pass over the running containers.
async fn rotate_all(runtime: &Runtime, pod_logs_dir: &Path, policy: Policy) -> cri::Result<()> {
    // The runtime filters on state; the kubelet lists all and skips the rest.
    for c in runtime.list_running_containers().await? {
        let Some(log) = log_path(pod_logs_dir, &c) else {
            continue;
        };
        let size = match tokio::fs::metadata(&log).await {
            Ok(m) => m.len(),
            Err(_) => continue,
        };
        if size < policy.max_bytes {
            continue;
        }
        if let Err(e) = rotate(runtime, &c.id, &log, policy.max_files).await {
            warn!(container = c.id, log = %log.display(), error = %e, "rotate container log");
        }
    }
    Ok(())
}

/// The log file of a container, from its kubelet labels and restart attempt.
fn log_path(pod_logs_dir: &Path, c: &api::Container) -> Option<PathBuf> {
    let label = |k: &str| c.labels.get(k).map(String::as_str);
    let dir = crate::paths::pod_log_dir(
        pod_logs_dir,
        label(crate::labels::POD_NAMESPACE_LABEL)?,
        label(crate::labels::POD_NAME_LABEL)?,
        label(crate::labels::POD_UID_LABEL)?,
    );
    let meta = c.metadata.as_ref()?;
    Some(dir.join(crate::paths::container_log_path(&meta.name, meta.attempt)))
}

/// Errors of one rotation.
#[derive(Debug, thiserror::Error)]
enum RotateError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Runtime(#[from] cri::Error),
}

/// Cleans up and compresses the rotated files of `log`, then rotates it: the
/// live file is renamed and the runtime reopens it; if the runtime cannot, the
/// rename is undone so the next pass tries again (as `rotateLatestLog`).
async fn rotate(
    runtime: &Runtime,
    id: &str,
    log: &Path,
    max_files: usize,
) -> Result<(), RotateError> {
    let log_owned = log.to_path_buf();
    tokio::task::spawn_blocking(move || prepare(&log_owned, max_files))
        .await
        .map_err(io::Error::other)??;
    let rotated = rotated_name(log, Timestamp::now());
    tokio::fs::rename(log, &rotated).await?;
    if let Err(e) = runtime.reopen_container_log(id).await {
        tokio::fs::rename(&rotated, log).await?;
        return Err(e.into());
    }
    debug!(log = %log.display(), rotated = %rotated.display(), "rotated container log");
    Ok(())
}

/// The blocking part before a rotation: removes and compresses rotated files.
fn prepare(log: &Path, max_files: usize) -> io::Result<()> {
    let (Some(dir), Some(file)) = (log.parent(), log.file_name()) else {
        return Ok(());
    };
    let prefix = format!("{}.", file.to_string_lossy());
    let mut rotated = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            rotated.push(entry.path());
        }
    }
    let plan = cleanup(&rotated, max_files);
    for p in &plan.remove {
        match std::fs::remove_file(p) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    for p in &plan.compress {
        compress(p)?;
    }
    Ok(())
}

/// Gzips `path` to `path.gz` (through a `.tmp` file) and removes `path`.
fn compress(path: &Path) -> io::Result<()> {
    let gz = PathBuf::from(format!("{}{COMPRESSED}", path.display()));
    let tmp = PathBuf::from(format!("{}{TMP}", gz.display()));
    let mut input = std::fs::File::open(path)?;
    let out = std::fs::File::create(&tmp)?;
    let mut encoder = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    io::copy(&mut input, &mut encoder)?;
    encoder.finish()?.sync_all()?;
    std::fs::rename(&tmp, &gz)?;
    std::fs::remove_file(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(names: &[&str]) -> Vec<PathBuf> {
        names
            .iter()
            .map(|n| PathBuf::from(format!("/l/0.log.{n}")))
            .collect()
    }

    #[test]
    fn cleanup_keeps_room_for_the_next_rotation() {
        let rotated = paths(&[
            "20260101-000003",
            "20260101-000001.gz",
            "20260101-000002.gz",
            "20260101-000000.gz",
        ]);
        // 5 files: the live one, the one rotated next, and 3 kept.
        let plan = cleanup(&rotated, 5);
        assert_eq!(plan.remove, paths(&["20260101-000000.gz"]));
        assert_eq!(plan.compress, paths(&["20260101-000003"]));
        // 2 files: only the live one and the next rotated one.
        let plan = cleanup(&rotated, 2);
        assert_eq!(plan.remove.len(), 4);
        assert!(plan.compress.is_empty());
    }

    #[test]
    fn cleanup_drops_leftovers_of_interrupted_compression() {
        let rotated = paths(&[
            "20260101-000001",
            "20260101-000001.gz",
            "20260101-000002.gz.tmp",
        ]);
        let plan = cleanup(&rotated, 5);
        assert_eq!(
            plan.remove,
            paths(&["20260101-000001", "20260101-000002.gz.tmp"])
        );
        assert!(plan.compress.is_empty());
    }

    #[test]
    fn rotated_names_carry_a_sortable_utc_timestamp() {
        let now: Timestamp = "2026-11-23T02:31:07.5Z".parse().unwrap();
        assert_eq!(
            rotated_name(Path::new("/var/log/pods/ns_p_u/c/0.log"), now),
            PathBuf::from("/var/log/pods/ns_p_u/c/0.log.20261123-023107")
        );
    }

    #[test]
    fn prepare_compresses_and_prunes_on_disk() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let log = dir.join("0.log");
        std::fs::write(&log, "live\n").unwrap();
        for (name, body) in [
            ("0.log.20260101-000000.gz", "old"),
            ("0.log.20260101-000001.gz", "old"),
            (
                "0.log.20260101-000002",
                "2026-01-01T00:00:02Z stdout F hello\n",
            ),
        ] {
            std::fs::write(dir.join(name), body).unwrap();
        }
        prepare(&log, 3).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["0.log", "0.log.20260101-000002.gz"]);
        let gz = std::fs::File::open(dir.join("0.log.20260101-000002.gz")).unwrap();
        let mut text = String::new();
        io::Read::read_to_string(&mut flate2::read::GzDecoder::new(gz), &mut text).unwrap();
        assert_eq!(text, "2026-01-01T00:00:02Z stdout F hello\n");
    }
}
