//! Safe subPath mounts, as the kubelet's `pkg/volume/util/subpath`
//! (`subpath_linux.go`: `SafeMakeDir`, `doBindSubPath`, `doCleanSubPaths`).
//!
//! A volume's contents belong to the pod: a container can plant symlinks in
//! it (`ln -s / /vol/escape`) and swap them while the node works on the
//! volume. So a subPath is never handed on as a path string. Its file is
//! opened beneath the volume's root with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS)`, which follows symlinks only while they stay inside
//! the volume (a `..` past the root, an absolute symlink or a `/proc` magic
//! link fails in the kernel, in the same call, with no window between check and
//! use); missing directories are made one at a time with `mkdirat` relative to
//! the descriptor of their parent, never through a path. The opened file is
//! then bind-mounted (`open_tree` of its descriptor, `move_mount`) onto
//! `<pod-dir>/volume-subpaths/<volume>/<container>/<index>`, checked to be the
//! same inode after mounting, and that path is what the runtime gets.
//!
//! Symlinks that stay inside the volume are followed, as the kubelet follows
//! them (its `EvalSymlinks` then a check against the volume's root): the
//! atomic-writer volumes (configMap, secret, ...) are made of such links, and a
//! subPath naming one of their keys is common. Unlike the kubelet, an absolute
//! symlink is refused even when it happens to point back into the volume.
//!
//! Needs Linux 5.8 (`openat2`, `open_tree`, `move_mount`, `STATX_ATTR_MOUNT_ROOT`)
//! and `CAP_SYS_ADMIN` for the bind mounts. Everything here blocks: call it off
//! the async threads.

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, CWD, Mode, OFlags, ResolveFlags, Statx, StatxAttributes, StatxFlags};
use rustix::mount::{MoveMountFlags, OpenTreeFlags, UnmountFlags};
use tracing::{debug, info, warn};

use crate::paths;

/// Mode of the directories of `volume-subpaths` (as the kubelet's, 0750).
const TARGET_DIR_MODE: u32 = 0o750;
/// Mode of the empty file a file subPath is bind-mounted onto (0640).
const TARGET_FILE_MODE: u32 = 0o640;
/// How many mounts stacked on one bind target are undone before giving up.
const MAX_STACKED: usize = 16;
/// How many times a lookup raced by a rename (`EAGAIN`) is tried again.
const MAX_RETRIES: u32 = 8;

/// A subPath that cannot be made, bound or cleaned up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The subPath or a name of the bind target is not a relative path of
    /// plain names (empty, absolute, `..`, a name with `/`).
    #[error("invalid {what} {value:?}: {why}")]
    Invalid {
        /// What the value is (`subPath`, `volume name`, `container name`).
        what: &'static str,
        /// The value.
        value: String,
        /// Why it is refused.
        why: &'static str,
    },
    /// The subPath resolves outside the volume: a symlink to an absolute path,
    /// one that climbs above the volume's root, or a magic link.
    #[error("{what} {sub:?} leaves volume {}: {source}", volume.display())]
    Escapes {
        /// What the path is (`subPath`, `path`).
        what: &'static str,
        /// The path inside the volume.
        sub: String,
        /// The volume's root on the node.
        volume: PathBuf,
        /// What the kernel answered (`EXDEV`, `ELOOP`).
        #[source]
        source: io::Error,
    },
    /// A missing directory of the subPath could not be made inside the volume.
    #[error("create directory {path:?} of subPath in {}: {source}", volume.display())]
    MakeDir {
        /// The directory, relative to the volume's root.
        path: String,
        /// The volume's root on the node.
        volume: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A system call failed on a path.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// After the bind mount, the target is not the file that was opened.
    #[error("bind mount at {} is not the opened subPath", .0.display())]
    NotSame(PathBuf),
    /// A file to read ([`read_beneath`]) is a directory, FIFO, socket or device.
    #[error("{what} {path:?} is not a regular file")]
    NotRegular {
        /// What the path is.
        what: &'static str,
        /// The path inside the volume.
        path: String,
    },
    /// A file to read ([`read_beneath`]) holds more than its cap.
    #[error("{what} {path:?} is larger than {max} bytes")]
    TooLarge {
        /// What the path is.
        what: &'static str,
        /// The path inside the volume.
        path: String,
        /// The cap, in bytes.
        max: u64,
    },
}

/// Result of a subPath operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One subPath of a container's volume mount, as the kubelet's
/// `subpath.Subpath`.
#[derive(Clone, Copy, Debug)]
pub struct SubPath<'a> {
    /// The volume's root on the node (its symlinks, the node's own, are followed).
    pub volume_path: &'a Path,
    /// The subPath: relative, without `..` (from `subPath` or an expanded `subPathExpr`).
    pub sub_path: &'a str,
    /// The pod's directory, `<root-dir>/pods/<uid>`.
    pub pod_dir: &'a Path,
    /// The volume's name in the pod spec.
    pub volume_name: &'a str,
    /// The container's name.
    pub container_name: &'a str,
    /// The mount's index in the container's `volumeMounts`.
    pub index: usize,
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { op, path, source }
}

/// The names of relative path `sub` inside a volume, a `what` (`subPath`),
/// with `.` elements and repeated slashes dropped.
///
/// # Errors
/// [`Error::Invalid`] for an empty or absolute path or a `..` element.
fn names<'a>(what: &'static str, sub: &'a str) -> Result<Vec<&'a OsStr>> {
    let invalid = |why| Error::Invalid {
        what,
        value: sub.to_string(),
        why,
    };
    let mut out = Vec::new();
    for c in Path::new(sub).components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err(invalid("must not contain '..'")),
            Component::RootDir | Component::Prefix(_) => {
                return Err(invalid("must not be an absolute path"));
            }
        }
    }
    if out.is_empty() {
        return Err(invalid("names no file inside the volume"));
    }
    Ok(out)
}

/// A name used as one directory of the bind target: not empty, `.`, `..`,
/// and without `/` or NUL (the API server validates these names; the node
/// does not rely on it).
fn plain_name<'a>(what: &'static str, name: &'a str) -> Result<&'a str> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(Error::Invalid {
            what,
            value: name.to_string(),
            why: "must be one path element",
        });
    }
    Ok(name)
}

/// Opens the volume's root as an `O_PATH` directory.
fn open_root(volume: &Path) -> Result<OwnedFd> {
    rustix::fs::open(
        volume,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_err("open volume", volume)(e.into()))
}

/// How paths inside a volume are resolved: beneath its root, no magic links.
fn beneath() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS
}

/// Opens `rel` beneath `root` as an `O_PATH` descriptor. `EAGAIN` (a
/// rename or mount raced the lookup, which `RESOLVE_BENEATH` then refuses
/// to vouch for) is retried a few times.
fn open_beneath(root: &OwnedFd, rel: &Path) -> io::Result<OwnedFd> {
    let mut tries = 0;
    loop {
        match rustix::fs::openat2(
            root,
            rel,
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            beneath(),
        ) {
            Err(rustix::io::Errno::AGAIN) if tries < MAX_RETRIES => tries += 1,
            other => return other.map_err(io::Error::from),
        }
    }
}

/// True for the errors `openat2` gives when resolution would leave the root.
fn is_escape(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(code) if code == rustix::io::Errno::XDEV.raw_os_error()
            || code == rustix::io::Errno::LOOP.raw_os_error()
    )
}

fn statx_fd(fd: &OwnedFd) -> io::Result<Statx> {
    rustix::fs::statx(fd, "", AtFlags::EMPTY_PATH, StatxFlags::BASIC_STATS).map_err(Into::into)
}

/// The file's identity: (device major, device minor, inode).
fn identity(s: &Statx) -> (u32, u32, u64) {
    (s.stx_dev_major, s.stx_dev_minor, s.stx_ino)
}

fn is_dir(s: &Statx) -> bool {
    rustix::fs::FileType::from_raw_mode(u32::from(s.stx_mode)) == rustix::fs::FileType::Directory
}

/// The target's status when it exists and is the root of a mount; `None`
/// when it is missing or not a mount point. Symlinks are not followed.
fn mount_root(path: &Path) -> io::Result<Option<Statx>> {
    let s = match rustix::fs::statx(
        CWD,
        path,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::BASIC_STATS,
    ) {
        Ok(s) => s,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mounted = if s.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT) {
        s.stx_attributes.contains(StatxAttributes::MOUNT_ROOT)
    } else {
        // Kernels before 5.8 do not report it: look the path up in mountinfo.
        let text = std::fs::read_to_string("/proc/self/mountinfo")?;
        super::mount::mounts_under(&text, path)
            .iter()
            .any(|p| p == path)
    };
    Ok(mounted.then_some(s))
}

/// Unmounts `path` (not following a symlink there), detaching it when busy.
fn unmount(path: &Path) -> io::Result<()> {
    if let Err(e) = rustix::mount::unmount(path, UnmountFlags::NOFOLLOW) {
        warn!(path = %path.display(), error = %e, "unmount subPath failed; detaching");
        rustix::mount::unmount(path, UnmountFlags::NOFOLLOW | UnmountFlags::DETACH)?;
    }
    Ok(())
}

/// Unmounts everything stacked on `path`; returns how many mounts went.
fn unmount_all(path: &Path) -> Result<usize> {
    let mut n = 0;
    while mount_root(path).map_err(io_err("stat", path))?.is_some() {
        if n == MAX_STACKED {
            return Err(Error::Io {
                op: "unmount",
                path: path.to_path_buf(),
                source: io::Error::other(format!("more than {MAX_STACKED} mounts stacked")),
            });
        }
        unmount(path).map_err(io_err("unmount", path))?;
        n += 1;
    }
    Ok(n)
}

/// Makes the missing directories of `sub` beneath the volume's `root`, each
/// with the root's mode (umask or not), as the kubelet's `SafeMakeDir`: every
/// existing prefix is opened with [`open_beneath`], every missing one made
/// with `mkdirat` in the descriptor of its parent, opened without following a
/// symlink, then `fchmod`ed. Nothing is made outside the volume, whatever the
/// container swaps in meanwhile.
///
/// # Errors
/// [`Error::Escapes`] when an existing prefix leaves the volume;
/// [`Error::MakeDir`] when a directory cannot be made or opened.
fn make_dirs(volume: &Path, root: &OwnedFd, sub: &str) -> Result<()> {
    let root_stat = statx_fd(root).map_err(io_err("stat volume", volume))?;
    let mode = Mode::from_raw_mode(u32::from(root_stat.stx_mode) & 0o7777);
    let mut prefix = PathBuf::new();
    let mut dir: Option<OwnedFd> = None;
    let mut missing = false;
    for name in names("subPath", sub)? {
        prefix.push(name);
        let make_err = |source: io::Error| Error::MakeDir {
            path: prefix.display().to_string(),
            volume: volume.to_path_buf(),
            source,
        };
        if !missing {
            match open_beneath(root, &prefix) {
                Ok(fd) => {
                    dir = Some(fd);
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => missing = true,
                Err(e) if is_escape(&e) => {
                    return Err(Error::Escapes {
                        what: "subPath",
                        sub: sub.to_string(),
                        volume: volume.to_path_buf(),
                        source: e,
                    });
                }
                Err(e) => return Err(make_err(e)),
            }
        }
        let parent = dir.as_ref().map_or(root.as_fd(), AsFd::as_fd);
        match rustix::fs::mkdirat(parent, name, mode) {
            Ok(()) => {}
            Err(rustix::io::Errno::EXIST) => {
                // Made meanwhile (by the container): use it if it is inside.
                dir = Some(open_beneath(root, &prefix).map_err(make_err)?);
                missing = false;
                continue;
            }
            Err(e) => return Err(make_err(e.into())),
        }
        // O_NOFOLLOW: a symlink swapped in since the mkdirat is not opened.
        let made = rustix::fs::openat(
            parent,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| make_err(e.into()))?;
        rustix::fs::fchmod(&made, mode).map_err(|e| make_err(e.into()))?;
        debug!(volume = %volume.display(), dir = %prefix.display(), "made subPath directory");
        dir = Some(made);
    }
    Ok(())
}

/// Opens the subPath beneath the volume, making its missing directories
/// first (the kubelet makes them when the subPath does not exist).
fn open_sub_path(sp: &SubPath<'_>) -> Result<OwnedFd> {
    let rel = PathBuf::from_iter(names("subPath", sp.sub_path)?);
    let root = open_root(sp.volume_path)?;
    let escapes = |source| Error::Escapes {
        what: "subPath",
        sub: sp.sub_path.to_string(),
        volume: sp.volume_path.to_path_buf(),
        source,
    };
    let other = |source| Error::Io {
        op: "open subPath in",
        path: sp.volume_path.to_path_buf(),
        source,
    };
    match open_beneath(&root, &rel) {
        Ok(fd) => return Ok(fd),
        Err(e) if is_escape(&e) => return Err(escapes(e)),
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(other(e)),
        Err(_) => {}
    }
    make_dirs(sp.volume_path, &root, sp.sub_path)?;
    open_beneath(&root, &rel).map_err(|e| if is_escape(&e) { escapes(e) } else { other(e) })
}

/// Reads file `rel` of the volume at `volume`, a `what` (`path` of a
/// `fileKeyRef`), resolved as a subPath is: beneath the volume's root, through
/// symlinks only while they stay inside it. The file is opened `O_PATH`
/// first and must be a regular file (a FIFO would block the reader and a
/// device node planted by the container could be any of the node's devices);
/// only then is that inode opened for reading, through its descriptor. Reads
/// at most `max` bytes. Blocks.
///
/// # Errors
/// [`Error::Invalid`] for an empty or absolute path or one with `..`;
/// [`Error::Escapes`] when it leaves the volume; [`Error::NotRegular`];
/// [`Error::TooLarge`] past `max` bytes; [`Error::Io`] when the file is
/// missing or cannot be read.
pub fn read_beneath(volume: &Path, what: &'static str, rel: &str, max: u64) -> Result<Vec<u8>> {
    use std::io::Read as _;
    let names = PathBuf::from_iter(names(what, rel)?);
    let root = open_root(volume)?;
    let fd = open_beneath(&root, &names).map_err(|source| {
        if is_escape(&source) {
            Error::Escapes {
                what,
                sub: rel.to_string(),
                volume: volume.to_path_buf(),
                source,
            }
        } else {
            io_err("open", Path::new(rel))(source)
        }
    })?;
    let stat = statx_fd(&fd).map_err(io_err("stat", Path::new(rel)))?;
    if rustix::fs::FileType::from_raw_mode(u32::from(stat.stx_mode))
        != rustix::fs::FileType::RegularFile
    {
        return Err(Error::NotRegular {
            what,
            path: rel.to_string(),
        });
    }
    // The inode is fixed by the O_PATH descriptor: reopening it through
    // /proc/self/fd reads that very file, whatever is renamed meanwhile.
    let proc_path = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    ));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(reopen_flags())
        .open(&proc_path)
        .map_err(io_err("open", Path::new(rel)))?;
    let mut out = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(io_err("read", Path::new(rel)))?;
    if u64::try_from(out.len()).unwrap_or(u64::MAX) > max {
        return Err(Error::TooLarge {
            what,
            path: rel.to_string(),
            max,
        });
    }
    Ok(out)
}

/// `O_NOCTTY | O_NONBLOCK` for reopening a descriptor to read.
fn reopen_flags() -> i32 {
    i32::try_from((OFlags::NOCTTY | OFlags::NONBLOCK).bits()).unwrap_or(0)
}

/// The bind target of `sp`:
/// `<pod-dir>/volume-subpaths/<volume>/<container>/<index>`.
///
/// # Errors
/// [`Error::Invalid`] when the volume or container name is not one path element.
pub fn bind_target(sp: &SubPath<'_>) -> Result<PathBuf> {
    Ok(paths::volume_subpath(
        sp.pod_dir,
        plain_name("volume name", sp.volume_name)?,
        plain_name("container name", sp.container_name)?,
        sp.index,
    ))
}

/// Makes the bind target: its parents (0750), then an empty directory (0750)
/// for a directory or an empty file (0640) for anything else. Whatever of
/// the wrong kind is there is removed first (never recursively).
fn make_target(target: &Path, dir: bool) -> Result<()> {
    if let Some(parent) = target.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(TARGET_DIR_MODE)
            .create(parent)
            .map_err(io_err("create", parent))?;
    }
    if let Ok(m) = std::fs::symlink_metadata(target) {
        if m.is_dir() == dir {
            return Ok(());
        }
        if m.is_dir() {
            std::fs::remove_dir(target)
        } else {
            std::fs::remove_file(target)
        }
        .map_err(io_err("remove", target))?;
    }
    if dir {
        std::fs::DirBuilder::new()
            .mode(TARGET_DIR_MODE)
            .create(target)
            .map_err(io_err("create", target))
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(TARGET_FILE_MODE)
            .custom_flags(OFlags::NOFOLLOW.bits().cast_signed())
            .open(target)
            .map(drop)
            .map_err(io_err("create", target))
    }
}

/// Removes a bind target and the directories above it that are left empty,
/// up to the pod's directory (the kubelet's `cleanSubPath`).
fn remove_target(pod_dir: &Path, target: &Path) {
    if let Err(e) = unmount_all(target) {
        warn!(error = %e, "clean up subPath bind target");
        return;
    }
    let removed = match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_dir() => std::fs::remove_dir(target),
        Ok(_) => std::fs::remove_file(target),
        Err(_) => Ok(()),
    };
    if let Err(e) = removed {
        warn!(path = %target.display(), error = %e, "remove subPath bind target");
        return;
    }
    let mut dir = target.parent();
    while let Some(d) = dir.filter(|d| d.starts_with(pod_dir) && *d != pod_dir) {
        if std::fs::remove_dir(d).is_err() {
            break;
        }
        dir = d.parent();
    }
}

/// Prepares subPath `sp` for a container, as the kubelet's `doBindSubPath`:
/// opens it beneath the volume (making missing directories, see the module
/// docs), bind-mounts the opened file onto [`bind_target`] unless the same
/// file is mounted there already, checks that the mount is that file, and
/// returns the target: the host path to give the runtime.
///
/// # Errors
/// [`Error::Escapes`] when the subPath leaves the volume, [`Error::MakeDir`]
/// when a missing directory cannot be made, [`Error::NotSame`] when the mount
/// is not the opened file, [`Error::Io`] for the rest; on error no mount is
/// left at the target.
pub fn bind_sub_path(sp: &SubPath<'_>) -> Result<PathBuf> {
    let target = bind_target(sp)?;
    let fd = open_sub_path(sp)?;
    let source = statx_fd(&fd).map_err(io_err("stat subPath in", sp.volume_path))?;
    // Mounted by an earlier start of the container: reuse it when it is the
    // same file, unmount it otherwise.
    let mut stacked = 0;
    while let Some(m) = mount_root(&target).map_err(io_err("stat", &target))? {
        if identity(&m) == identity(&source) {
            debug!(target = %target.display(), "subPath already bind-mounted");
            return Ok(target);
        }
        if stacked == MAX_STACKED {
            return Err(Error::NotSame(target));
        }
        unmount(&target).map_err(io_err("unmount", &target))?;
        stacked += 1;
    }
    make_target(&target, is_dir(&source))?;
    let mounted = bind_fd(&fd, &target);
    let checked =
        mounted.and_then(
            |()| match mount_root(&target).map_err(io_err("stat", &target))? {
                Some(m) if identity(&m) == identity(&source) => Ok(()),
                _ => Err(Error::NotSame(target.clone())),
            },
        );
    if let Err(e) = checked {
        remove_target(sp.pod_dir, &target);
        return Err(e);
    }
    info!(
        sub_path = sp.sub_path,
        volume = sp.volume_name,
        container = sp.container_name,
        target = %target.display(),
        "bound subPath"
    );
    Ok(target)
}

/// Bind-mounts the file open at `fd` (non-recursively) onto `target`.
fn bind_fd(fd: &OwnedFd, target: &Path) -> Result<()> {
    let tree = rustix::mount::open_tree(
        fd,
        "",
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_EMPTY_PATH,
    )
    .map_err(|e| io_err("clone mount of subPath for", target)(e.into()))?;
    rustix::mount::move_mount(
        &tree,
        "",
        CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(|e| io_err("bind-mount subPath onto", target)(e.into()))
}

/// Unmounts and removes every subPath bind mount of the pod in `pod_dir`
/// (`volume-subpaths/<volume>/<container>/<index>`) and the directories
/// holding them, as the kubelet's `doCleanSubPaths` for each volume. Nothing
/// is removed recursively: an entry that is still mounted, or a directory that
/// is not empty, stays and is reported. Returns how many mounts were undone.
///
/// # Errors
/// The first entry that could not be unmounted or removed (the others are
/// still tried).
pub fn clean_sub_paths(pod_dir: &Path) -> Result<usize> {
    let base = paths::volume_subpaths_dir(pod_dir);
    let mut unmounted = 0;
    let mut first: Option<Error> = None;
    let mut keep = |r: Result<usize>| match r {
        Ok(n) => unmounted += n,
        Err(e) => {
            warn!(error = %e, "clean up subPath mounts");
            first.get_or_insert(e);
        }
    };
    match std::fs::symlink_metadata(&base) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_err("stat", &base)(e)),
        Ok(_) => {}
    }
    for volume in entries(&base) {
        let (volume, is_dir) = match volume {
            Ok(v) => v,
            Err(e) => {
                keep(Err(e));
                continue;
            }
        };
        if is_dir {
            for container in entries(&volume) {
                match container {
                    Ok((container, true)) => {
                        for index in entries(&container) {
                            keep(index.and_then(|(p, _)| remove_entry(&p)));
                        }
                        keep(remove_entry(&container));
                    }
                    Ok((file, false)) => keep(remove_entry(&file)),
                    Err(e) => keep(Err(e)),
                }
            }
        }
        keep(remove_entry(&volume));
    }
    keep(remove_entry(&base));
    match first {
        Some(e) => Err(e),
        None => {
            if unmounted > 0 {
                info!(pod_dir = %pod_dir.display(), unmounted, "cleaned up subPath mounts");
            }
            Ok(unmounted)
        }
    }
}

/// The entries of `dir`, each with whether it is a directory (not following symlinks).
fn entries(dir: &Path) -> Vec<Result<(PathBuf, bool)>> {
    match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .map(|e| {
                let e = e.map_err(io_err("read", dir))?;
                let is_dir = e.file_type().map_err(io_err("stat", &e.path()))?.is_dir();
                Ok((e.path(), is_dir))
            })
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => vec![Err(io_err("read", dir)(e))],
    }
}

/// Unmounts `path` if it is a mount point, then removes it (an empty
/// directory or a file); returns how many mounts were undone.
fn remove_entry(path: &Path) -> Result<usize> {
    let n = unmount_all(path)?;
    let removed = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    removed.map_err(io_err("remove", path))?;
    Ok(n)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

    /// True when the tests can mount (root); says so when they cannot.
    pub(crate) fn need_root() -> bool {
        let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        crate::fixtures::requires("root (bind mounts)", root)
    }

    /// A temporary directory for tests that mount: on drop, everything
    /// mounted under it is unmounted first, and if anything is still mounted
    /// there the directory is left in place, never removed recursively
    /// through a mount (which could reach any file a broken bind exposes).
    pub(crate) struct TestDir(Option<tempfile::TempDir>);

    impl TestDir {
        pub(crate) fn new() -> Self {
            Self(Some(tempfile::tempdir().unwrap()))
        }

        pub(crate) fn path(&self) -> &Path {
            self.0
                .as_ref()
                .map_or(Path::new("/nonexistent"), |d| d.path())
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let Some(dir) = self.0.take() else { return };
            for p in mounts_at_or_under(dir.path()) {
                let _ = rustix::mount::unmount(&p, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW);
            }
            if mounted_at_or_under(dir.path()) {
                eprintln!(
                    "left {} in place: still mounted under it",
                    dir.path().display()
                );
                let _ = dir.keep();
            }
        }
    }

    /// The mount points at or under `dir`.
    fn mounts_at_or_under(dir: &Path) -> Vec<PathBuf> {
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        crate::volume::mount::mounts_under(&text, dir)
    }

    /// True when something is mounted at or under `dir`.
    pub(crate) fn mounted_at_or_under(dir: &Path) -> bool {
        !mounts_at_or_under(dir).is_empty()
    }

    /// How many mounts are stacked exactly at `path`.
    fn mounts_at(path: &Path) -> usize {
        std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|p| Path::new(p) == path)
            .count()
    }

    /// A volume, a pod directory and a directory outside both, in a tempdir;
    /// whatever is left mounted is undone on drop.
    struct Fixture {
        /// Holds the tempdir (unmounted, then removed, on drop).
        _dir: TestDir,
        volume: PathBuf,
        pod_dir: PathBuf,
        outside: PathBuf,
    }

    impl Fixture {
        fn new() -> Self {
            let dir = TestDir::new();
            let volume = dir.path().join("pod/volumes/kubernetes.io~empty-dir/vol");
            let pod_dir = dir.path().join("pod");
            let outside = dir.path().join("outside");
            std::fs::create_dir_all(&volume).unwrap();
            std::fs::create_dir_all(&outside).unwrap();
            std::fs::set_permissions(&volume, std::fs::Permissions::from_mode(0o2777)).unwrap();
            Self {
                _dir: dir,
                volume,
                pod_dir,
                outside,
            }
        }

        fn sub<'a>(&'a self, sub: &'a str, container: &'a str, index: usize) -> SubPath<'a> {
            SubPath {
                volume_path: &self.volume,
                sub_path: sub,
                pod_dir: &self.pod_dir,
                volume_name: "vol",
                container_name: container,
                index,
            }
        }

        fn bind(&self, sub: &str) -> Result<PathBuf> {
            bind_sub_path(&self.sub(sub, "c", 0))
        }

        /// Nothing was bind-mounted, nothing was made outside.
        fn assert_untouched(&self) {
            assert!(!mounted_at_or_under(&self.pod_dir));
            assert!(!paths::volume_subpath(&self.pod_dir, "vol", "c", 0).exists());
            assert_eq!(std::fs::read_dir(&self.outside).unwrap().count(), 0);
        }
    }

    #[test]
    fn a_symlink_out_of_the_volume_as_the_last_component_is_refused() {
        if !need_root() {
            return;
        }
        let f = Fixture::new();
        symlink(&f.outside, f.volume.join("abs")).unwrap();
        symlink("../../../../outside", f.volume.join("rel")).unwrap();
        for sub in ["abs", "rel", "./abs"] {
            let err = f.bind(sub).unwrap_err();
            assert!(matches!(err, Error::Escapes { .. }), "{sub}: {err}");
        }
        f.assert_untouched();
    }

    #[test]
    fn a_symlink_out_of_the_volume_in_an_intermediate_component_makes_nothing() {
        if !need_root() {
            return;
        }
        let f = Fixture::new();
        symlink(&f.outside, f.volume.join("abs")).unwrap();
        symlink("../../../../outside", f.volume.join("rel")).unwrap();
        std::fs::create_dir(f.volume.join("d")).unwrap();
        symlink("../../../../../outside", f.volume.join("d/up")).unwrap();
        for sub in ["abs/new", "rel/new/deeper", "d/up/new", "abs"] {
            let err = f.bind(sub).unwrap_err();
            assert!(matches!(err, Error::Escapes { .. }), "{sub}: {err}");
        }
        f.assert_untouched();
    }

    #[test]
    fn an_absolute_symlink_to_the_root_reaches_nothing_on_the_host() {
        if !need_root() {
            return;
        }
        let f = Fixture::new();
        symlink("/", f.volume.join("escape")).unwrap();
        let canary = format!("rustlet-subpath-unit-canary-{}", std::process::id());
        let err = f.bind(&format!("escape/tmp/{canary}")).unwrap_err();
        assert!(matches!(err, Error::Escapes { .. }), "{err}");
        assert!(!Path::new("/tmp").join(&canary).exists());
        f.assert_untouched();
    }

    #[test]
    fn backsteps_and_absolute_sub_paths_are_refused_before_any_lookup() {
        if !need_root() {
            return;
        }
        let f = Fixture::new();
        std::fs::create_dir(f.volume.join("a")).unwrap();
        for sub in ["a/../../outside", "..", "/etc", "", "."] {
            let err = f.bind(sub).unwrap_err();
            assert!(matches!(err, Error::Invalid { .. }), "{sub:?}: {err}");
        }
        let mut bad = f.sub("a", "c", 0);
        bad.container_name = "../x";
        assert!(matches!(
            bind_sub_path(&bad).unwrap_err(),
            Error::Invalid { .. }
        ));
        f.assert_untouched();
    }

    #[test]
    fn missing_directories_are_made_beneath_the_volume_with_its_mode() {
        if !need_root() {
            return;
        }
        let f = Fixture::new();
        std::fs::create_dir(f.volume.join("a")).unwrap();
        let target = f.bind("a/b/c").unwrap();
        assert_eq!(target, f.pod_dir.join("volume-subpaths/vol/c/0"));
        for d in ["a/b", "a/b/c"] {
            let mode = std::fs::metadata(f.volume.join(d)).unwrap().mode() & 0o7777;
            assert_eq!(mode, 0o2777, "{d}: the volume's mode, whatever the umask");
        }
        let made = std::fs::metadata(f.volume.join("a/b/c")).unwrap();
        let bound = std::fs::metadata(&target).unwrap();
        assert_eq!((made.dev(), made.ino()), (bound.dev(), bound.ino()));
        assert_eq!(mounts_at(&target), 1);
        std::fs::write(target.join("through"), "x").unwrap();
        assert_eq!(
            std::fs::read_to_string(f.volume.join("a/b/c/through")).unwrap(),
            "x"
        );
        assert_eq!(clean_sub_paths(&f.pod_dir).unwrap(), 1);
        // A dangling symlink inside the volume is not made through.
        symlink("nowhere", f.volume.join("dangling")).unwrap();
        let err = f.bind("dangling/x").unwrap_err();
        assert!(matches!(err, Error::MakeDir { .. }), "{err}");
        assert!(!f.volume.join("nowhere").exists());
        f.assert_untouched();
    }

    #[test]
    fn a_file_sub_path_is_bound_onto_a_file_and_inner_symlinks_are_followed() {
        if !need_root() {
            return;
        }
        let f = Fixture::new();
        std::fs::create_dir(f.volume.join("data")).unwrap();
        std::fs::write(f.volume.join("data/app.conf"), "setting=1").unwrap();
        // As an atomic-writer volume lays out its keys.
        symlink("data/app.conf", f.volume.join("app.conf")).unwrap();
        symlink("data", f.volume.join("..data")).unwrap();
        for (i, sub) in ["data/app.conf", "app.conf", "..data/app.conf"]
            .into_iter()
            .enumerate()
        {
            let target = bind_sub_path(&f.sub(sub, "c", i)).unwrap();
            let m = std::fs::symlink_metadata(&target).unwrap();
            assert!(m.is_file(), "{sub}: bound onto a file");
            assert_eq!(std::fs::read_to_string(&target).unwrap(), "setting=1");
            assert_eq!(mounts_at(&target), 1);
        }
        assert_eq!(clean_sub_paths(&f.pod_dir).unwrap(), 3);
        assert!(!f.pod_dir.join("volume-subpaths").exists());
        assert_eq!(
            std::fs::read_to_string(f.volume.join("data/app.conf")).unwrap(),
            "setting=1",
            "cleaning up leaves the volume's files"
        );
    }

    #[test]
    fn a_second_start_reuses_the_same_mount_and_replaces_another() {
        if !need_root() {
            return;
        }
        let f = Fixture::new();
        std::fs::create_dir_all(f.volume.join("one")).unwrap();
        std::fs::create_dir_all(f.volume.join("two")).unwrap();
        let target = f.bind("one").unwrap();
        assert_eq!(f.bind("one").unwrap(), target);
        assert_eq!(mounts_at(&target), 1, "not mounted twice");
        // The same mount index now names another directory (subPathExpr).
        assert_eq!(f.bind("two").unwrap(), target);
        assert_eq!(mounts_at(&target), 1);
        let two = std::fs::metadata(f.volume.join("two")).unwrap();
        let bound = std::fs::metadata(&target).unwrap();
        assert_eq!(two.ino(), bound.ino());
        // And a file where a directory was bound.
        std::fs::write(f.volume.join("f"), "x").unwrap();
        assert_eq!(f.bind("f").unwrap(), target);
        assert!(std::fs::symlink_metadata(&target).unwrap().is_file());
        assert_eq!(mounts_at(&target), 1);
    }

    #[test]
    fn cleanup_unmounts_every_bind_and_removes_the_directories() {
        if !need_root() {
            return;
        }
        let f = Fixture::new();
        std::fs::create_dir_all(f.volume.join("d/e")).unwrap();
        std::fs::write(f.volume.join("d/e/file"), "keep").unwrap();
        let a = bind_sub_path(&f.sub("d", "one", 0)).unwrap();
        let b = bind_sub_path(&f.sub("d/e", "one", 3)).unwrap();
        let c = bind_sub_path(&f.sub("d/e/file", "two", 1)).unwrap();
        assert_eq!(
            mounts_at_or_under(&f.pod_dir.join("volume-subpaths")).len(),
            3
        );
        // Stacked on one target, as a crash between two mounts could leave.
        bind_fd(&open_sub_path(&f.sub("d", "one", 0)).unwrap(), &a).unwrap();
        assert_eq!(mounts_at(&a), 2);
        assert_eq!(clean_sub_paths(&f.pod_dir).unwrap(), 4);
        for t in [&a, &b, &c] {
            assert!(!t.exists(), "{}", t.display());
        }
        assert!(!f.pod_dir.join("volume-subpaths").exists());
        assert!(!mounted_at_or_under(&f.pod_dir));
        assert_eq!(
            std::fs::read_to_string(f.volume.join("d/e/file")).unwrap(),
            "keep"
        );
        assert_eq!(clean_sub_paths(&f.pod_dir).unwrap(), 0, "nothing left");
    }

    #[test]
    fn files_are_read_beneath_the_volume_and_nowhere_else() {
        let f = Fixture::new();
        let read = |rel: &str| read_beneath(&f.volume, "path", rel, 16);
        std::fs::create_dir(f.volume.join("d")).unwrap();
        std::fs::write(f.volume.join("d/config.env"), "A='1'\n").unwrap();
        std::fs::write(f.outside.join("secret"), "host").unwrap();
        assert_eq!(read("d/config.env").unwrap(), b"A='1'\n");
        assert_eq!(read("./d//config.env").unwrap(), b"A='1'\n");
        // A link that stays inside is followed, as for a subPath.
        symlink("d/config.env", f.volume.join("inside")).unwrap();
        assert_eq!(read("inside").unwrap(), b"A='1'\n");
        // Links out of the volume, absolute or climbing, and magic links.
        symlink(f.outside.join("secret"), f.volume.join("abs")).unwrap();
        symlink("../../../../outside/secret", f.volume.join("up")).unwrap();
        symlink("/proc/self/root/etc/hostname", f.volume.join("magic")).unwrap();
        for rel in ["abs", "up", "magic"] {
            let err = read(rel).unwrap_err();
            assert!(matches!(err, Error::Escapes { .. }), "{rel}: {err}");
        }
        for rel in ["../outside/secret", "/etc/hostname", "", "."] {
            let err = read(rel).unwrap_err();
            assert!(matches!(err, Error::Invalid { .. }), "{rel:?}: {err}");
        }
        let err = read("missing").unwrap_err();
        assert!(
            matches!(&err, Error::Io { source, .. } if source.kind() == io::ErrorKind::NotFound),
            "{err}"
        );
        // Not a regular file: a directory, and a FIFO no writer will ever open.
        rustix::fs::mknodat(
            CWD,
            f.volume.join("fifo"),
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        for rel in ["d", "fifo"] {
            let err = read(rel).unwrap_err();
            assert!(matches!(err, Error::NotRegular { .. }), "{rel}: {err}");
        }
        // At most `max` bytes.
        std::fs::write(f.volume.join("big"), [b'x'; 17]).unwrap();
        let err = read("big").unwrap_err();
        assert!(matches!(err, Error::TooLarge { max: 16, .. }), "{err}");
        std::fs::write(f.volume.join("exact"), [b'x'; 16]).unwrap();
        assert_eq!(read("exact").unwrap().len(), 16);
    }
}
