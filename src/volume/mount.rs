//! Mounts of the node the volume plugins make and undo: tmpfs for memory-backed
//! volumes, and the list of mount points under a pod's directory from
//! `/proc/self/mountinfo` so teardown can unmount them before removing it
//! (the kubelet's mount-utils, with the system calls through rustix).

use std::ffi::CString;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, UnmountFlags};

/// True when `dir` is a mount point: it is on another device than its parent.
#[must_use]
pub fn is_mount_point(dir: &Path) -> bool {
    let (Ok(d), Some(Ok(p))) = (
        std::fs::symlink_metadata(dir),
        dir.parent().map(std::fs::metadata),
    ) else {
        return false;
    };
    d.is_dir() && d.dev() != p.dev()
}

/// Mounts a tmpfs of at most `size_bytes` (the kernel's default, half the
/// memory, when `None`) on `dir`, unless one is already there.
///
/// # Errors
/// The `mount(2)` error (needs `CAP_SYS_ADMIN`).
pub fn mount_tmpfs(dir: &Path, size_bytes: Option<u64>) -> io::Result<()> {
    if is_mount_point(dir) {
        return Ok(());
    }
    let options = size_bytes.map(|s| format!("size={s}")).unwrap_or_default();
    let data = CString::new(options).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    rustix::mount::mount(
        "tmpfs",
        dir,
        "tmpfs",
        MountFlags::empty(),
        Some(data.as_c_str()),
    )
    .map_err(io::Error::from)
}

/// Decodes the octal escapes (`\040` for a space) of a mountinfo path.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let n = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(n);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount points listed in mountinfo `text` that are `dir` or under it,
/// deepest first (the order to unmount them in).
#[must_use]
pub fn mounts_under(text: &str, dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|f| PathBuf::from(unescape(f)))
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found.dedup();
    found
}

/// Unmounts every mount point at or under `dir`, deepest first; a busy one is
/// detached (`MNT_DETACH`) so the directory can go.
///
/// # Errors
/// Reading mountinfo, or an unmount that fails even detached.
pub fn unmount_all_under(dir: &Path) -> io::Result<usize> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    let points = mounts_under(&text, dir);
    for p in &points {
        if let Err(e) = rustix::mount::unmount(p, UnmountFlags::empty()) {
            tracing::warn!(path = %p.display(), error = %e, "unmount failed; detaching");
            rustix::mount::unmount(p, UnmountFlags::DETACH)
                .map_err(|e| io::Error::new(e.kind(), format!("unmount {}: {e}", p.display())))?;
        }
    }
    Ok(points.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_mounts_under_a_dir_deepest_first() {
        let text = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 0:50 / /var/lib/rustlet/pods/u1/volumes/kubernetes.io~secret/s rw - tmpfs tmpfs rw,size=10k
41 22 0:51 / /var/lib/rustlet/pods/u1/volumes/kubernetes.io~empty-dir/with\\040space rw - tmpfs tmpfs rw
42 40 0:52 / /var/lib/rustlet/pods/u1/volumes/kubernetes.io~secret/s/nested rw - tmpfs tmpfs rw
43 22 0:53 / /var/lib/rustlet/pods/u10/volumes/x rw - tmpfs tmpfs rw
";
        let got = mounts_under(text, Path::new("/var/lib/rustlet/pods/u1"));
        assert_eq!(
            got,
            vec![
                PathBuf::from("/var/lib/rustlet/pods/u1/volumes/kubernetes.io~secret/s/nested"),
                PathBuf::from("/var/lib/rustlet/pods/u1/volumes/kubernetes.io~secret/s"),
                PathBuf::from(
                    "/var/lib/rustlet/pods/u1/volumes/kubernetes.io~empty-dir/with space"
                ),
            ]
        );
    }

    #[test]
    fn mount_points_are_recognised() {
        assert!(is_mount_point(Path::new("/proc")));
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_mount_point(dir.path()));
    }
}
