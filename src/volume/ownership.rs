//! The pod's `fsGroup` applied to a volume, as the kubelet's
//! `SetVolumeOwnership` (pkg/volume/volume_linux.go): every file and directory
//! gets the group, files `g+rw` (`g+r` on read-only volumes), directories also
//! `g+x` and setgid. Symlinks get the group but keep their mode.

use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, lchown};
use std::path::Path;

/// Group bits added on a writable volume.
const RW_MASK: u32 = 0o660;
/// Group bits added on a read-only volume.
const RO_MASK: u32 = 0o440;
/// Execute bits added to directories.
const EXEC_MASK: u32 = 0o110;
/// The setgid bit, added to directories.
const SETGID: u32 = 0o2000;

/// Applies `fs_group` to `path` and everything under it, children before parents.
///
/// # Errors
/// The first directory that cannot be read; failed `lchown`/`chmod` calls on
/// single entries are ignored, as the kubelet logs and goes on.
pub fn apply(path: &Path, fs_group: u32, read_only: bool) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    if meta.is_dir() {
        for entry in fs::read_dir(path)? {
            apply(&entry?.path(), fs_group, read_only)?;
        }
    }
    let _ = lchown(path, None, Some(fs_group));
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mut mask = if read_only { RO_MASK } else { RW_MASK };
    if meta.is_dir() {
        mask |= SETGID | EXEC_MASK;
    }
    let mode = meta.permissions().mode() & 0o7777;
    let _ = fs::set_permissions(path, fs::Permissions::from_mode(mode | mask));
    Ok(())
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
    use std::os::unix::fs::MetadataExt;

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
}
