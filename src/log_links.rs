//! The container log links of `/var/log/containers`, as the kubelet's
//! kuberuntime (`legacyLogSymlink`, `logSymlink`): each started container gets
//! `<pod>_<namespace>_<container>-<containerID>.log`, a symbolic link to its
//! log file under the pod logs directory, which log collectors read. A link
//! goes when its container is removed, and links whose log file is gone are
//! swept, as the kubelet's container garbage collector (`evictContainerLogs`).
//! The directory is [`crate::paths::CONTAINER_LOGS_DIR`].

use std::io;
use std::path::{Path, PathBuf};

use tracing::debug;

/// The longest file name ext4 takes, in bytes.
const MAX_FILE_NAME: usize = 255;
/// The links' suffix.
const SUFFIX: &str = ".log";

/// The link of container `container_id` (named `container`) of pod
/// `namespace/pod` in `dir`: `<pod>_<namespace>_<container>-<containerID>.log`,
/// its name cut to 255 bytes with the suffix, as `logSymlink`. None when a
/// part holds a `/` (the API server's names never do).
#[must_use]
pub fn link_path(
    dir: &Path,
    pod: &str,
    namespace: &str,
    container: &str,
    container_id: &str,
) -> Option<PathBuf> {
    if [pod, namespace, container, container_id]
        .iter()
        .any(|p| p.contains('/') || p.contains('\0'))
    {
        return None;
    }
    let mut name = format!("{pod}_{namespace}_{container}-{container_id}");
    let max = MAX_FILE_NAME - SUFFIX.len();
    name.truncate(name.floor_char_boundary(max));
    Some(dir.join(format!("{name}{SUFFIX}")))
}

/// Links `link` to the log file `target`, replacing a link of the same name,
/// when the log file exists (as the kubelet, which skips a missing one).
///
/// # Errors
/// Creating the directory or the link failed.
pub fn create(link: &Path, target: &Path) -> io::Result<()> {
    if !target.exists() {
        return Ok(());
    }
    if let Some(dir) = link.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(link) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::os::unix::fs::symlink(target, link)
}

/// Removes the link of container `container_id` from `dir`, whatever its pod
/// and container names (they are cut when long, the ID last).
///
/// # Errors
/// Reading the directory or removing the link failed.
pub fn remove(dir: &Path, container_id: &str) -> io::Result<()> {
    let ending = format!("-{container_id}{SUFFIX}");
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let is_link = entry.file_type().is_ok_and(|t| t.is_symlink());
        if is_link && entry.file_name().to_string_lossy().ends_with(&ending) {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// Removes the links of `dir` that point into `pod_logs_dir` at a file that
/// no longer exists; links to elsewhere are another agent's and stay.
/// Returns how many were removed.
///
/// # Errors
/// Reading the directory failed.
pub fn sweep(dir: &Path, pod_logs_dir: &Path) -> io::Result<usize> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if !entry.file_type().is_ok_and(|t| t.is_symlink()) {
            continue;
        }
        let Ok(target) = std::fs::read_link(&path) else {
            continue;
        };
        if target.starts_with(pod_logs_dir) && !target.exists() {
            match std::fs::remove_file(&path) {
                Ok(()) => removed += 1,
                Err(e) => debug!(link = %path.display(), error = %e, "remove container log link"),
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_names_follow_the_kubelet_and_fit_ext4() {
        let dir = Path::new("/var/log/containers");
        assert_eq!(
            link_path(dir, "web", "default", "nginx", "abc123"),
            Some(dir.join("web_default_nginx-abc123.log"))
        );
        let long = "a".repeat(253);
        let p = link_path(dir, &long, "ns", "c", "id").unwrap();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(name.len(), 255);
        assert!(name.ends_with("aaa.log"));
        assert_eq!(link_path(dir, "../x", "ns", "c", "id"), None);
        assert_eq!(link_path(dir, "p", "ns", "c", "a/b"), None);
    }

    #[test]
    fn links_are_made_replaced_removed_and_swept() {
        let tmp = tempfile::tempdir().unwrap();
        let logs = tmp.path().join("pods");
        let links = tmp.path().join("containers");
        std::fs::create_dir_all(logs.join("ns_p_uid/c")).unwrap();
        let log = logs.join("ns_p_uid/c/0.log");
        let link = link_path(&links, "p", "ns", "c", "id1").unwrap();

        // No log file yet: no link, as the kubelet.
        create(&link, &log).unwrap();
        assert!(!link.exists());
        std::fs::write(&log, "hello\n").unwrap();
        create(&link, &log).unwrap();
        assert_eq!(std::fs::read_to_string(&link).unwrap(), "hello\n");
        create(&link, &log).unwrap();
        assert_eq!(std::fs::read_link(&link).unwrap(), log);

        remove(&links, "id1").unwrap();
        assert!(std::fs::symlink_metadata(&link).is_err());

        // Swept: a link whose log is gone; kept: a live one and another agent's.
        let live = link_path(&links, "p", "ns", "c", "id2").unwrap();
        create(&live, &log).unwrap();
        let dead = links.join("q_ns_c-id3.log");
        std::os::unix::fs::symlink(logs.join("ns_q_uid/c/0.log"), &dead).unwrap();
        let foreign = links.join("r_ns_c-id4.log");
        std::os::unix::fs::symlink(tmp.path().join("elsewhere.log"), &foreign).unwrap();
        assert_eq!(sweep(&links, &logs).unwrap(), 1);
        assert!(std::fs::symlink_metadata(&dead).is_err());
        assert!(std::fs::symlink_metadata(&live).is_ok());
        assert!(std::fs::symlink_metadata(&foreign).is_ok());
        assert_eq!(sweep(&tmp.path().join("none"), &logs).unwrap(), 0);
    }
}
