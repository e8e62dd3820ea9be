//! Removing a pod's directory tree without ever leaving it: no symbolic link
//! is followed and no mount point is crossed (the kubelet's
//! `removeall.RemoveAllOneFilesystem`). Each directory is opened relative to
//! its parent's descriptor with `O_NOFOLLOW` and checked to be on the same
//! device as the top before anything in it is removed, so a link or a mount
//! a container planted (or swapped in while the walk runs) stops the removal
//! instead of redirecting it to the host.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd as _, BorrowedFd};
use std::path::Path;

use rustix::fs::AtFlags;
use rustix::io::Errno;

use super::tree::{self, Visitor};

/// Removes what a walk meets: files and links as they are met, each
/// directory once it is left and empty.
struct Remover<'a> {
    top: &'a Path,
}

/// `unlinkat`, a name already gone being fine.
fn unlink(parent: BorrowedFd<'_>, name: &CStr, flags: AtFlags) -> io::Result<()> {
    match rustix::fs::unlinkat(parent, name, flags) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

impl Visitor for Remover<'_> {
    const NAMES_CHILDREN: bool = true;

    fn entry(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &CStr,
        _: &rustix::fs::Stat,
    ) -> io::Result<()> {
        unlink(parent, name, AtFlags::empty())
    }

    fn mount_point(&mut self, _: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
        Err(io::Error::other(format!(
            "{} holds {} on another filesystem (a mount point): not removed",
            self.top.display(),
            name.to_string_lossy()
        )))
    }

    fn left(&mut self, parent: BorrowedFd<'_>, name: Option<&CStr>) -> io::Result<()> {
        match name {
            Some(name) => unlink(parent, name, AtFlags::REMOVEDIR),
            None => Err(io::Error::other(format!(
                "a directory under {} was moved while it was removed",
                self.top.display()
            ))),
        }
    }
}

/// Removes `path` and everything under it, on its own filesystem only, at
/// any depth ([`tree::walk`]). A path that does not exist is fine; a
/// non-directory (a link included) is unlinked.
///
/// # Errors
/// A mount point under `path` (another device), a directory moved while the
/// walk ran, or the I/O error of a step; what was removed before stays
/// removed.
pub fn remove_all_one_filesystem(path: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return std::fs::remove_file(path);
    }
    let (parent, name) = tree::open_parent(path)?;
    let top = tree::open_dir(parent.as_fd(), &name)?;
    tree::walk(top, &mut Remover { top: path })?;
    unlink(parent.as_fd(), &name, AtFlags::REMOVEDIR)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn removes_a_tree_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        let pod = dir.path().join("pod");
        std::fs::create_dir_all(pod.join("volumes/a/b")).unwrap();
        std::fs::write(pod.join("volumes/a/b/f"), "y").unwrap();
        symlink(&outside, pod.join("volumes/a/link")).unwrap();
        symlink(outside.join("keep"), pod.join("file-link")).unwrap();
        remove_all_one_filesystem(&pod).unwrap();
        assert!(!pod.exists());
        assert_eq!(std::fs::read_to_string(outside.join("keep")).unwrap(), "x");
        // Gone already: fine.
        remove_all_one_filesystem(&pod).unwrap();
        // The top itself a link: the link goes, not what it points at.
        symlink(&outside, &pod).unwrap();
        remove_all_one_filesystem(&pod).unwrap();
        assert!(std::fs::symlink_metadata(&pod).is_err());
        assert!(outside.join("keep").exists());
    }

    #[test]
    fn does_not_cross_into_a_mount() {
        // Needs CAP_SYS_ADMIN to mount; without it there is nothing to test.
        let dir = tempfile::tempdir().unwrap();
        let pod = dir.path().join("pod");
        let mnt = pod.join("volumes/kubernetes.io~empty-dir/m");
        std::fs::create_dir_all(&mnt).unwrap();
        let mounted = crate::volume::mount::mount_tmpfs(&mnt, Some(1 << 20)).is_ok();
        if !crate::fixtures::requires("a tmpfs mount (CAP_SYS_ADMIN)", mounted) {
            return;
        }
        std::fs::write(mnt.join("data"), "z").unwrap();
        let err = remove_all_one_filesystem(&pod).unwrap_err();
        assert!(err.to_string().contains("another filesystem"), "{err}");
        assert!(err.to_string().contains("holds m "), "{err}");
        assert_eq!(std::fs::read_to_string(mnt.join("data")).unwrap(), "z");
        rustix::mount::unmount(&mnt, rustix::mount::UnmountFlags::DETACH).unwrap();
        remove_all_one_filesystem(&pod).unwrap();
        assert!(!pod.exists());
    }
}
