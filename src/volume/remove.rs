//! Removing a pod's directory tree without ever leaving it: no symbolic link
//! is followed and no mount point is crossed (the kubelet's
//! `removeall.RemoveAllOneFilesystem`). Each directory is opened relative to
//! its parent's descriptor with `O_NOFOLLOW` and checked to be on the same
//! device as the top before anything in it is removed, so a link or a mount
//! a container planted (or swapped in while the walk runs) stops the removal
//! instead of redirecting it to the host.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};

/// The deepest a tree is walked; deeper is refused.
const MAX_DEPTH: usize = 256;

fn open_dir(dirfd: &OwnedFd, name: &CStr) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rustix::fs::openat(dirfd, name, flags, Mode::empty())?)
}

fn crossing(path: &Path) -> io::Error {
    io::Error::other(format!(
        "{} is on another filesystem (a mount point): not removed",
        path.display()
    ))
}

/// Removes `path` and everything under it, on its own filesystem only. A
/// path that does not exist is fine; a non-directory is unlinked.
///
/// # Errors
/// A mount point under `path` (another device), a tree deeper than 256
/// levels, or the I/O error of a step; what was removed before stays removed.
pub fn remove_all_one_filesystem(path: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return std::fs::remove_file(path);
    }
    let parent = path.parent().unwrap_or_else(|| Path::new("/"));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} has no name", path.display())))?;
    let name = CString::new(name.as_bytes()).map_err(io::Error::other)?;
    let parent_fd: OwnedFd = rustix::fs::open(
        parent,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let top = open_dir(&parent_fd, &name)?;
    let dev = rustix::fs::fstat(&top)?.st_dev;
    remove_contents(&top, dev, path, 0)?;
    drop(top);
    rustix::fs::unlinkat(&parent_fd, name.as_c_str(), AtFlags::REMOVEDIR)?;
    Ok(())
}

/// Removes what directory `dir` (at `path`, on device `dev`) holds.
fn remove_contents(dir: &OwnedFd, dev: u64, path: &Path, depth: usize) -> io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(io::Error::other(format!(
            "{} is more than {MAX_DEPTH} levels deep: not removed",
            path.display()
        )));
    }
    let names: Vec<CString> = Dir::read_from(dir)?
        .filter_map(|e| match e {
            Ok(e) => {
                let n = e.file_name();
                (n != c"." && n != c"..").then(|| Ok(n.to_owned()))
            }
            Err(e) => Some(Err(io::Error::from(e))),
        })
        .collect::<io::Result<_>>()?;
    for name in names {
        let child: PathBuf = path.join(std::ffi::OsStr::from_bytes(name.as_bytes()));
        let st = rustix::fs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
            rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::empty())?;
            continue;
        }
        if st.st_dev != dev {
            return Err(crossing(&child));
        }
        // Opened without following a link, and checked again on the
        // descriptor: what is walked is what was checked.
        let sub = open_dir(dir, &name)?;
        if rustix::fs::fstat(&sub)?.st_dev != dev {
            return Err(crossing(&child));
        }
        remove_contents(&sub, dev, &child, depth.saturating_add(1))?;
        drop(sub);
        rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::REMOVEDIR)?;
    }
    Ok(())
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
        assert_eq!(std::fs::read_to_string(mnt.join("data")).unwrap(), "z");
        rustix::mount::unmount(&mnt, rustix::mount::UnmountFlags::DETACH).unwrap();
        remove_all_one_filesystem(&pod).unwrap();
        assert!(!pod.exists());
    }
}
