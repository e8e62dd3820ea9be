//! Mounts of the node the volume plugins make and undo: tmpfs for memory-backed
//! volumes, the list of mount points under a pod's directory from
//! `/proc/self/mountinfo` so teardown can unmount them before removing it,
//! and the agent's root directory made a shared mount (the kubelet's
//! mount-utils and `MakeRShared`, with the system calls through rustix).

use std::ffi::CString;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

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
    let options = size_bytes.map(|s| format!("size={s}")).unwrap_or_default();
    mount_new(dir, "tmpfs", "tmpfs", &options)
}

/// Mounts a hugetlbfs of `page_bytes` pages on `dir` (`pagesize=2Mi`, as
/// the kubelet's emptyDir); a mount point already there is left.
///
/// # Errors
/// The kernel refused the mount (no pool of that page size, for one).
pub fn mount_hugetlbfs(dir: &Path, page_bytes: u64) -> io::Result<()> {
    let options = format!("pagesize={}", crate::config::binary_quantity(page_bytes));
    mount_new(dir, "nodev", "hugetlbfs", &options)
}

/// Mounts a new `fstype` filesystem from `source` with `options` on `dir`,
/// unless `dir` is a mount point already.
fn mount_new(dir: &Path, source: &str, fstype: &str, options: &str) -> io::Result<()> {
    if is_mount_point(dir) {
        return Ok(());
    }
    let data = CString::new(options).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    rustix::mount::mount(
        source,
        dir,
        fstype,
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

/// Each line of mountinfo `text` with a mount point (its 5th field,
/// unescaped), and the line's fields.
fn entries(text: &str) -> impl Iterator<Item = (PathBuf, std::str::Split<'_, char>)> {
    text.lines().filter_map(|l| {
        let point = l.split(' ').nth(4)?;
        Some((PathBuf::from(unescape(point)), l.split(' ')))
    })
}

/// The mount points listed in mountinfo `text` that are `dir` or under it,
/// deepest first (the order to unmount them in).
#[must_use]
pub fn mounts_under(text: &str, dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = entries(text)
        .map(|(point, _)| point)
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

/// Whether `path` lies on a shared mount (peer group `shared:N`) in
/// mountinfo `text`: the mount whose mount point is the longest prefix of
/// `path`, the last listed of equals (the one on top); false when none is.
/// As mount-utils' `isShared`.
#[must_use]
pub fn is_on_shared_mount(text: &str, path: &Path) -> bool {
    let mut best: Option<(usize, bool)> = None;
    for (point, fields) in entries(text) {
        if !path.starts_with(&point) {
            continue;
        }
        // The optional fields run from the 7th to the "-" separator.
        let shared = fields
            .skip(6)
            .take_while(|f| *f != "-")
            .any(|f| f.starts_with("shared:"));
        let depth = point.components().count();
        if best.is_none_or(|(d, _)| depth >= d) {
            best = Some((depth, shared));
        }
    }
    best.is_some_and(|(_, shared)| shared)
}

/// Makes `dir` (an existing directory) a recursively shared mount unless it
/// already lies on a shared one, as the kubelet's `setupDataDirs` makes its
/// root directory (`MakeRShared`): bind-mounted onto itself, then
/// `MS_SHARED | MS_REC`. Volumes a CSI driver mounts from its pod
/// (`mountPropagation: Bidirectional`) reach the node, and the agent's
/// mounts reach the driver, only through a shared mount. Returns whether it
/// mounted.
///
/// # Errors
/// Reading mountinfo, resolving `dir`, or a `mount(2)` error (needs
/// `CAP_SYS_ADMIN`).
pub fn make_rshared(dir: &Path) -> io::Result<bool> {
    let dir = std::fs::canonicalize(dir)?;
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    if is_on_shared_mount(&text, &dir) {
        return Ok(false);
    }
    let failed = |what: &str, e: rustix::io::Errno| {
        io::Error::new(e.kind(), format!("{what} {}: {e}", dir.display()))
    };
    rustix::mount::mount_bind(&dir, &dir).map_err(|e| failed("bind-mount", e))?;
    let shared = MountPropagationFlags::SHARED | MountPropagationFlags::REC;
    rustix::mount::mount_change(&dir, shared).map_err(|e| failed("make shared", e))?;
    Ok(true)
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

    #[test]
    fn shared_mounts_are_found_by_the_longest_mount_point_over_the_path() {
        let text = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 8:1 /x /var/lib/private rw master:1 - ext4 /dev/vda rw
31 22 8:1 /y /var/lib/both rw shared:7 master:1 - ext4 /dev/vda rw
32 31 8:1 /z /var/lib/both rw - ext4 /dev/vda rw
";
        let shared = |p: &str| is_on_shared_mount(text, Path::new(p));
        assert!(shared("/var/lib/kubelet"));
        assert!(!shared("/var/lib/private/pods"));
        // Prefixes count by whole components.
        assert!(shared("/var/lib/privatex"));
        // The last mount on a point is the one on top.
        assert!(!shared("/var/lib/both/pods"));
        let private_root = "22 1 8:1 / / rw,relatime - ext4 /dev/vda rw\n";
        assert!(!is_on_shared_mount(
            private_root,
            Path::new("/var/lib/kubelet")
        ));
        assert!(!is_on_shared_mount("", Path::new("/")));
        // Lines too short to hold a mount point are skipped.
        assert!(!is_on_shared_mount("1 2 3\n", Path::new("/")));
    }

    /// Needs root (`CAP_SYS_ADMIN`), as the agent.
    #[test]
    fn a_root_directory_on_a_private_mount_is_made_rshared_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = std::fs::canonicalize(dir.path()).unwrap();
        // A private mount of its own first: the state of a fresh host's `/`.
        rustix::mount::mount_bind(&path, &path).unwrap();
        rustix::mount::mount_change(&path, MountPropagationFlags::PRIVATE).unwrap();
        let on_shared = || {
            let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            is_on_shared_mount(&text, &path.join("pods"))
        };
        assert!(!on_shared());
        let mounted = make_rshared(&path);
        let shared_now = on_shared();
        let again = make_rshared(&path);
        let _ = unmount_all_under(&path);
        assert!(mounted.unwrap());
        assert!(shared_now);
        assert!(!again.unwrap(), "already shared: nothing to do");
    }
}
