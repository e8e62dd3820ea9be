//! The pod's `fsGroup` applied to a volume, as the kubelet's
//! `SetVolumeOwnership` (pkg/volume/volume_linux.go): every file and directory
//! gets the group, files `g+rw` (`g+r` on read-only volumes), directories also
//! `g+x` and setgid. Symlinks get the group but keep their mode.

use std::ffi::CStr;
use std::fs;
use std::io;
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};

use super::tree::{self, Visitor};

/// Group bits added on a writable volume.
const RW_MASK: u32 = 0o660;
/// Group bits added on a read-only volume.
const RO_MASK: u32 = 0o440;
/// Execute bits added to directories.
const EXEC_MASK: u32 = 0o110;
/// The setgid bit, added to directories.
const SETGID: u32 = 0o2000;

/// Gives each entry a walk meets the group and its bits, on descriptors
/// only: a name swapped for a link between the `lstat` and the change is
/// never followed.
struct Owner {
    gid: rustix::fs::Gid,
    mask: u32,
}

impl Owner {
    fn mode(&self, stat: &Stat, dir: bool) -> Mode {
        let extra = if dir { SETGID | EXEC_MASK } else { 0 };
        Mode::from_raw_mode((stat.st_mode & 0o7777) | self.mask | extra)
    }
}

impl Visitor for Owner {
    fn entry(&mut self, parent: BorrowedFd<'_>, name: &CStr, stat: &Stat) -> io::Result<()> {
        let group = Some(self.gid);
        if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink {
            // The link's own group (`lchown`); links keep their mode.
            let _ = rustix::fs::chownat(parent, name, None, group, AtFlags::SYMLINK_NOFOLLOW);
            return Ok(());
        }
        // An O_PATH descriptor of the entry itself, never of what a link
        // swapped in names; opening it has no effect on a device or FIFO.
        let Ok(fd) = rustix::fs::openat(
            parent,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return Ok(());
        };
        let Ok(now) = rustix::fs::fstat(&fd) else {
            return Ok(());
        };
        if (now.st_dev, now.st_ino) != (stat.st_dev, stat.st_ino)
            || FileType::from_raw_mode(now.st_mode) == FileType::Symlink
        {
            // Replaced since the walk read it: passed over.
            return Ok(());
        }
        let _ = rustix::fs::chownat(&fd, c"", None, group, AtFlags::EMPTY_PATH);
        // The mode through the descriptor's /proc/self/fd entry, which
        // names the inode itself (fchmod refuses O_PATH descriptors).
        let proc_fd = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let _ = rustix::fs::chmod(proc_fd.as_str(), self.mode(&now, false));
        Ok(())
    }

    fn leave(&mut self, dir: BorrowedFd<'_>, stat: &Stat) -> io::Result<()> {
        let _ = rustix::fs::fchown(dir, None, Some(self.gid));
        let _ = rustix::fs::fchmod(dir, self.mode(stat, true));
        Ok(())
    }
}

/// Applies `fs_group` to `path` and everything under it, children before
/// parents, by descriptors ([`tree::walk`]): at any depth, never through a
/// link, not into another filesystem mounted below.
///
/// # Errors
/// `path` cannot be read; a directory of the volume cannot be read or was
/// moved while the walk ran. Failed changes of single entries are ignored,
/// as the kubelet logs and goes on.
pub fn apply(path: &Path, fs_group: u32, read_only: bool) -> io::Result<()> {
    let mut owner = Owner {
        gid: rustix::fs::Gid::from_raw(fs_group),
        mask: if read_only { RO_MASK } else { RW_MASK },
    };
    let stat = rustix::fs::lstat(path)?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        let (parent, name) = tree::open_parent(path)?;
        return owner.entry(parent.as_fd(), &name, &stat);
    }
    tree::walk(tree::open_path(path)?, &mut owner)
}

/// Whether `path` (a volume's root) needs its ownership changed for
/// `fs_group` under `fsGroupChangePolicy: OnRootMismatch`: its group is
/// another, it is not a directory, or it lacks the group bits (read and
/// search, and write unless `read_only`) or the setgid bit, as the kubelet's
/// `requiresPermissionChange`. An unreadable root needs the change.
#[must_use]
pub fn root_mismatch(path: &Path, fs_group: u32, read_only: bool) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = fs::metadata(path) else {
        return true;
    };
    if meta.gid() != fs_group || !meta.is_dir() {
        return true;
    }
    let wanted = (if read_only { RO_MASK } else { RW_MASK }) | EXEC_MASK;
    let mode = meta.mode();
    mode & wanted != wanted || mode & SETGID == 0
}

/// Applies `fs_group` to the volume at `path` as [`apply`], unless
/// `change_policy` is `OnRootMismatch` and its root already matches
/// ([`root_mismatch`]): the kubelet's `ChangePermissions` with
/// `skipPermissionChange`. A `path` that is a symlink (a local
/// PersistentVolume's path may be one) stands for the directory it names,
/// as the kubelet's bind mount of it does; symlinks below it are not
/// followed.
///
/// # Errors
/// Resolving `path`; reading a directory of the volume.
pub fn apply_with_policy(
    path: &Path,
    fs_group: u32,
    read_only: bool,
    change_policy: Option<&str>,
) -> io::Result<()> {
    let root = fs::canonicalize(path)?;
    if change_policy == Some("OnRootMismatch") && !root_mismatch(&root, fs_group, read_only) {
        return Ok(());
    }
    apply(&root, fs_group, read_only)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn adds_group_bits_and_setgid_on_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("d");
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
        let f = d.join("f");
        fs::write(&f, "x").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o400)).unwrap();
        std::os::unix::fs::symlink("f", d.join("l")).unwrap();
        let gid = fs::metadata(dir.path()).unwrap().gid();
        apply(&d, gid, true).unwrap();
        assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o440);
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o7777, 0o2750);
        apply(&d, gid, false).unwrap();
        assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o660);
    }

    #[test]
    fn a_volume_root_that_is_a_symlink_stands_for_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let backend = dir.path().join("backend");
        fs::create_dir(&backend).unwrap();
        fs::set_permissions(&backend, fs::Permissions::from_mode(0o700)).unwrap();
        let f = backend.join("f");
        fs::write(&f, "x").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
        let outside = dir.path().join("outside");
        fs::write(&outside, "y").unwrap();
        fs::set_permissions(&outside, fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&outside, backend.join("escape")).unwrap();
        let link = dir.path().join("volume");
        std::os::unix::fs::symlink(&backend, &link).unwrap();
        let gid = fs::metadata(dir.path()).unwrap().gid();
        apply_with_policy(&link, gid, false, None).unwrap();
        assert_eq!(fs::metadata(&backend).unwrap().mode() & 0o7777, 0o2770);
        assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o660);
        // A symlink inside the volume is not followed.
        assert_eq!(fs::metadata(&outside).unwrap().mode() & 0o7777, 0o600);
    }

    #[test]
    fn on_root_mismatch_changes_only_a_root_that_does_not_match() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("d");
        fs::create_dir(&d).unwrap();
        let f = d.join("f");
        fs::write(&f, "x").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
        let gid = fs::metadata(dir.path()).unwrap().gid();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
        assert!(root_mismatch(&d, gid, false), "no group bits, no setgid");
        assert!(root_mismatch(&f, gid, false), "not a directory");
        // The root matches (group, bits, setgid): the file is left as it is.
        fs::set_permissions(&d, fs::Permissions::from_mode(0o2770)).unwrap();
        assert!(!root_mismatch(&d, gid, false));
        apply_with_policy(&d, gid, false, Some("OnRootMismatch")).unwrap();
        assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o600);
        // Always (the default): every file gets the group bits.
        apply_with_policy(&d, gid, false, None).unwrap();
        assert_eq!(fs::metadata(&f).unwrap().mode() & 0o7777, 0o660);
        assert!(
            root_mismatch(&d, gid.wrapping_add(1), false),
            "another group"
        );
    }

    #[test]
    fn a_directory_swapped_for_a_link_mid_walk_changes_nothing_outside() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("etc");
        fs::create_dir(&outside).unwrap();
        for i in 0..50 {
            // The names the volume's directory holds.
            let f = outside.join(format!("g{i}"));
            fs::write(&f, "secret").unwrap();
            fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
        }
        fs::set_permissions(&outside, fs::Permissions::from_mode(0o700)).unwrap();
        let before: Vec<_> = fs::read_dir(&outside)
            .unwrap()
            .map(|e| {
                let m = e.unwrap().metadata().unwrap();
                (m.ino(), m.mode(), m.gid())
            })
            .collect();
        let v = dir.path().join("v");
        let d = v.join("d");
        fs::create_dir_all(&d).unwrap();
        for i in 0..200 {
            fs::write(d.join(format!("g{i}")), "x").unwrap();
        }
        let gid = fs::metadata(dir.path()).unwrap().gid().wrapping_add(1);
        // A fixed number of swaps, each `d` for a link to `etc` and back,
        // while the group is applied again and again.
        let swapper = {
            let (d, outside) = (d.clone(), outside.clone());
            let aside = v.join("aside");
            std::thread::spawn(move || {
                for _ in 0..2000 {
                    fs::rename(&d, &aside).unwrap();
                    std::os::unix::fs::symlink(&outside, &d).unwrap();
                    std::thread::sleep(std::time::Duration::from_micros(200));
                    fs::remove_file(&d).unwrap();
                    fs::rename(&aside, &d).unwrap();
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            })
        };
        while !swapper.is_finished() {
            let _ = apply(&v, gid, false);
        }
        swapper.join().unwrap();
        let after: Vec<_> = fs::read_dir(&outside)
            .unwrap()
            .map(|e| {
                let m = e.unwrap().metadata().unwrap();
                (m.ino(), m.mode(), m.gid())
            })
            .collect();
        assert_eq!(before, after, "a file under the link's target changed");
        let top = fs::metadata(&outside).unwrap();
        assert_eq!(top.mode() & 0o7777, 0o700);
        // The volume itself got the group.
        apply(&v, gid, false).unwrap();
        assert_eq!(fs::metadata(d.join("g0")).unwrap().gid(), gid);
    }
}
