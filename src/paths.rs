//! Where the node keeps container logs: the kubelet's log layout
//! (`<podLogsDir>/<namespace>_<name>_<uid>/<container>/<restartCount>.log`,
//! kuberuntime `BuildPodLogsDirectory` and `BuildContainerLogsDirectory`).
//! Read by the CRI config translator, the node API's log reader, the stats
//! provider and the log manager. Pure.

use std::path::{Path, PathBuf};

/// The pod's log directory: `<pod_logs_dir>/<namespace>_<name>_<uid>`, as the kubelet's `BuildPodLogsDirectory`.
#[must_use]
pub fn pod_log_dir(pod_logs_dir: &Path, namespace: &str, name: &str, uid: &str) -> PathBuf {
    pod_logs_dir.join(format!("{namespace}_{name}_{uid}"))
}

/// The container's log path relative to the pod log directory: `<container>/<restartCount>.log`.
#[must_use]
pub fn container_log_path(container: &str, attempt: u32) -> String {
    format!("{container}/{attempt}.log")
}
