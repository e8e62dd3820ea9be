//! Where the node keeps container logs: the kubelet's log layout
//! (`<podLogsDir>/<namespace>_<name>_<uid>/<container>/<restartCount>.log`,
//! kuberuntime `BuildPodLogsDirectory` and `BuildContainerLogsDirectory`).
//! Read by the CRI config translator, the node API's log reader, the stats
//! provider and the log manager. And where a pod's subPath bind mounts go
//! (`<pod-dir>/volume-subpaths/...`, the kubelet's `getPodVolumeSubpathsDir`).
//! Pure.

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

/// The directory of the container log links collectors read, fixed as the
/// kubelet's `ContainerLogsDir`; the `log_links` module keeps them.
pub const CONTAINER_LOGS_DIR: &str = "/var/log/containers";

/// Directory of a pod's subPath bind mounts in its pod directory.
pub const VOLUME_SUBPATHS_DIR: &str = "volume-subpaths";

/// The pod's subPath bind mounts: `<pod_dir>/volume-subpaths`, as the
/// kubelet's `getPodVolumeSubpathsDir`.
#[must_use]
pub fn volume_subpaths_dir(pod_dir: &Path) -> PathBuf {
    pod_dir.join(VOLUME_SUBPATHS_DIR)
}

/// Where the subPath of mount `index` (its position in the container's
/// `volumeMounts`) of `container` on `volume` is bind-mounted:
/// `<pod_dir>/volume-subpaths/<volume>/<container>/<index>`, as the kubelet's
/// `getSubpathBindTarget`. The names are taken as single path elements.
#[must_use]
pub fn volume_subpath(pod_dir: &Path, volume: &str, container: &str, index: usize) -> PathBuf {
    volume_subpaths_dir(pod_dir)
        .join(volume)
        .join(container)
        .join(index.to_string())
}
