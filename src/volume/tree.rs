//! Walking a volume's tree by descriptors, for the walkers that must not be
//! led astray by what a container writes there: disk usage
//! ([`usage`]), fsGroup ownership (`ownership`) and removal (`remove`).
//!
//! Each directory is opened relative to its parent's descriptor with
//! `O_NOFOLLOW | O_DIRECTORY` and every entry is `lstat`ed relative to its
//! directory, so no path is ever built: names 255 bytes long nested past
//! `PATH_MAX` are reached like any other, and a symbolic link is never
//! followed, even one swapped in while the walk runs. A directory on
//! another device (a mount point) is reported, not entered.
//!
//! The walk is iterative and holds one directory open at a time. For each
//! directory above the current one it keeps 32 bytes: the directory's device
//! and inode and two `getdents` positions (where its child's entry is, and
//! where to go on after it). Returning from a child it opens `..` and checks
//! that it is the directory it left (a container may rename a directory
//! within its volume, never out of it); a mismatch ends the walk with an
//! error. So the walk has no depth limit and its memory is 32 bytes a level,
//! the open descriptors two at most.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

/// What a walk does with what it meets. Every method has a default that does
/// nothing.
pub trait Visitor {
    /// Whether [`Visitor::left`] needs the child's name: reading it back
    /// costs a `getdents` of the parent per directory.
    const NAMES_CHILDREN: bool = false;

    /// Directory `dir` (its own `stat`), once on entering it, before its
    /// entries; the walk's top included.
    ///
    /// # Errors
    /// An error ends the walk.
    fn enter(&mut self, dir: BorrowedFd<'_>, stat: &Stat) -> io::Result<()> {
        let _ = (dir, stat);
        Ok(())
    }

    /// A non-directory entry `name` of directory `parent`, as `lstat` found
    /// it (a symbolic link is the link).
    ///
    /// # Errors
    /// An error ends the walk.
    fn entry(&mut self, parent: BorrowedFd<'_>, name: &CStr, stat: &Stat) -> io::Result<()> {
        let _ = (parent, name, stat);
        Ok(())
    }

    /// A directory entry `name` of `parent` on another device: a mount
    /// point. It is not entered.
    ///
    /// # Errors
    /// An error ends the walk.
    fn mount_point(&mut self, parent: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
        let _ = (parent, name);
        Ok(())
    }

    /// Directory `dir` once all its entries were visited, still open; the
    /// walk's top included.
    ///
    /// # Errors
    /// An error ends the walk.
    fn leave(&mut self, dir: BorrowedFd<'_>, stat: &Stat) -> io::Result<()> {
        let _ = (dir, stat);
        Ok(())
    }

    /// Back in `parent` from its child directory `name` (`None` unless
    /// [`Visitor::NAMES_CHILDREN`]), which is closed now.
    ///
    /// # Errors
    /// An error ends the walk.
    fn left(&mut self, parent: BorrowedFd<'_>, name: Option<&CStr>) -> io::Result<()> {
        let _ = (parent, name);
        Ok(())
    }
}

/// Opens directory `name` of `parent` without following a link.
///
/// # Errors
/// `ELOOP` or `ENOTDIR` when `name` is not a directory (any more), or the
/// error of `openat`.
pub fn open_dir(parent: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rustix::fs::openat(parent, name, flags, Mode::empty())?)
}

/// Opens directory `path` (the agent's own path, trusted up to its last
/// component, which is not followed if it is a link).
///
/// # Errors
/// As [`open_dir`]; a path with no last component.
pub fn open_path(path: &Path) -> io::Result<OwnedFd> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    Ok(rustix::fs::open(path, flags, Mode::empty())?)
}

/// The directory holding `path` (the agent's own path, links in it
/// followed) and `path`'s last component, for the `*at` calls on it.
///
/// # Errors
/// A path with no last component or with a NUL byte; opening its parent.
pub fn open_parent(path: &Path) -> io::Result<(OwnedFd, CString)> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} has no name", path.display())))?;
    let name =
        CString::new(std::os::unix::ffi::OsStrExt::as_bytes(name)).map_err(io::Error::other)?;
    let parent = path.parent().unwrap_or_else(|| Path::new("/"));
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
    Ok((rustix::fs::open(parent, flags, Mode::empty())?, name))
}

/// One directory above the one being read.
struct Level {
    dev: u64,
    ino: u64,
    /// The `getdents` position of the entry of the child being walked.
    child_at: i64,
    /// The position after that entry, where reading goes on.
    resume: i64,
}

fn is_dir(stat: &Stat) -> bool {
    FileType::from_raw_mode(stat.st_mode) == FileType::Directory
}

/// An error of a name that went away (or changed type) while the walk ran:
/// the entry is passed over, as `find` does.
fn vanished(e: Errno) -> bool {
    e == Errno::NOENT || e == Errno::LOOP || e == Errno::NOTDIR
}

/// Walks the tree of directory `top`, which the walk takes, calling `visitor`
/// for each directory and entry, parents entered before and left after their
/// children. Entries that vanish while the walk runs are passed over.
///
/// # Errors
/// The first error of a visitor; a directory that cannot be read; a
/// directory found moved on the way back up (its `..` is not the directory
/// the walk came from).
pub fn walk<V: Visitor>(top: OwnedFd, visitor: &mut V) -> io::Result<()> {
    let top_stat = rustix::fs::fstat(&top)?;
    let dev = top_stat.st_dev;
    visitor.enter(top.as_fd(), &top_stat)?;
    let mut above: Vec<Level> = Vec::new();
    let mut dir = Dir::new(top)?;
    let mut stat = top_stat;
    // The position of the next entry `dir` reads.
    let mut at: i64 = 0;
    loop {
        let mut child = None;
        while let Some(e) = dir.read() {
            let e = e?;
            let (name, next) = (e.file_name(), e.offset());
            if name == c"." || name == c".." {
                at = next;
                continue;
            }
            let fd = dir.fd()?;
            let st = match rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(e) if vanished(e) => {
                    at = next;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            if !is_dir(&st) {
                visitor.entry(fd, name, &st)?;
                at = next;
                continue;
            }
            if st.st_dev != dev {
                visitor.mount_point(fd, name)?;
                at = next;
                continue;
            }
            let sub = match open_dir(fd, name) {
                Ok(sub) => sub,
                Err(e)
                    if e.raw_os_error()
                        .is_some_and(|n| vanished(Errno::from_raw_os_error(n))) =>
                {
                    at = next;
                    continue;
                }
                Err(e) => return Err(e),
            };
            // Checked on the descriptor: what is walked is what was checked.
            let sub_stat = rustix::fs::fstat(&sub)?;
            if sub_stat.st_dev != dev {
                visitor.mount_point(fd, name)?;
                at = next;
                continue;
            }
            above.push(Level {
                dev: stat.st_dev,
                ino: stat.st_ino,
                child_at: at,
                resume: next,
            });
            child = Some((sub, sub_stat));
            break;
        }
        if let Some((sub, sub_stat)) = child {
            visitor.enter(sub.as_fd(), &sub_stat)?;
            dir = Dir::new(sub)?;
            stat = sub_stat;
            at = 0;
            continue;
        }
        visitor.leave(dir.fd()?, &stat)?;
        let Some(level) = above.pop() else {
            return Ok(());
        };
        let parent = open_dir(dir.fd()?, c"..")?;
        let parent_stat = rustix::fs::fstat(&parent)?;
        if (parent_stat.st_dev, parent_stat.st_ino) != (level.dev, level.ino) {
            return Err(io::Error::other(
                "a directory was moved while its tree was walked",
            ));
        }
        let child_ino = stat.st_ino;
        drop(dir);
        dir = Dir::new(parent)?;
        stat = parent_stat;
        if V::NAMES_CHILDREN {
            let name = name_of(&mut dir, level.child_at, child_ino)?;
            visitor.left(dir.fd()?, name.as_deref())?;
        } else {
            visitor.left(dir.fd()?, None)?;
        }
        dir.seek(level.resume)?;
        at = level.resume;
    }
}

/// The name of the entry of `dir` with inode `ino`, looked for from position
/// `at` (where it was), then from the start (entries were added or removed
/// before it); `None` if it is gone.
fn name_of(dir: &mut Dir, at: i64, ino: u64) -> io::Result<Option<CString>> {
    for from in [at, 0] {
        dir.seek(from)?;
        while let Some(e) = dir.read() {
            let e = e?;
            if e.ino() == ino && e.file_name() != c"." && e.file_name() != c".." {
                return Ok(Some(e.file_name().to_owned()));
            }
        }
    }
    Ok(None)
}

/// Bytes allocated and inodes used by a tree, as the kubelet's `du` and
/// `find -xdev` of a volume: every directory, file and link on the top's
/// device, each hard link counted at each of its names (as `du -l`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Bytes allocated (512-byte blocks).
    pub bytes: u64,
    /// Inodes: directories, files, links.
    pub inodes: u64,
}

impl Usage {
    fn add(&mut self, stat: &Stat) {
        let blocks = u64::try_from(stat.st_blocks).unwrap_or(0);
        self.bytes = self.bytes.saturating_add(blocks.saturating_mul(512));
        self.inodes = self.inodes.saturating_add(1);
    }
}

impl Visitor for Usage {
    fn enter(&mut self, _: BorrowedFd<'_>, stat: &Stat) -> io::Result<()> {
        self.add(stat);
        Ok(())
    }

    fn entry(&mut self, _: BorrowedFd<'_>, _: &CStr, stat: &Stat) -> io::Result<()> {
        self.add(stat);
        Ok(())
    }
}

/// The usage of the tree at `path` (a directory, or a single file), not
/// following a link at `path` itself.
///
/// # Errors
/// `path` cannot be read; a directory moved while it was walked.
pub fn usage(path: &Path) -> io::Result<Usage> {
    let st = rustix::fs::lstat(path)?;
    let mut usage = Usage::default();
    if !is_dir(&st) {
        usage.add(&st);
        return Ok(usage);
    }
    walk(open_path(path)?, &mut usage)?;
    Ok(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makes `levels` nested directories named `name` under `top`, by
    /// descriptors (their paths pass PATH_MAX), a file of `bytes` in the
    /// deepest; returns the deepest.
    pub(crate) fn nest(top: &Path, name: &str, levels: usize, bytes: usize) -> OwnedFd {
        let name = CString::new(name).unwrap();
        let mut dir = open_path(top).unwrap();
        for _ in 0..levels {
            rustix::fs::mkdirat(&dir, &name, Mode::from_raw_mode(0o755)).unwrap();
            dir = open_dir(dir.as_fd(), &name).unwrap();
        }
        let file = rustix::fs::openat(
            &dir,
            c"data",
            OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .unwrap();
        rustix::io::write(&file, &vec![7u8; bytes]).unwrap();
        rustix::fs::fsync(&file).unwrap();
        dir
    }

    #[test]
    fn usage_counts_what_lies_past_path_max_and_no_link() {
        let dir = tempfile::tempdir().unwrap();
        let v = dir.path().join("v");
        std::fs::create_dir(&v).unwrap();
        // 20 levels of 255-byte names: 5,100 bytes of path.
        nest(&v, &"n".repeat(255), 20, 1 << 20);
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("big"), vec![1u8; 4 << 20]).unwrap();
        std::os::unix::fs::symlink(&outside, v.join("link")).unwrap();
        let u = usage(&v).unwrap();
        // The top, 20 directories, the data file and the link.
        assert_eq!(u.inodes, 23, "{u:?}");
        assert!(u.bytes >= 1 << 20, "the deep megabyte is counted: {u:?}");
        assert!(u.bytes < 4 << 20, "the link is not followed: {u:?}");
        assert_eq!(usage(&v.join("link")).unwrap().inodes, 1);
    }

    #[test]
    fn a_tree_of_any_depth_is_walked_with_two_descriptors() {
        let dir = tempfile::tempdir().unwrap();
        let v = dir.path().join("v");
        std::fs::create_dir(&v).unwrap();
        nest(&v, "d", 5000, 10);
        let open_before = std::fs::read_dir("/proc/self/fd").unwrap().count();
        /// Counts the descriptors the process holds at the deepest point.
        struct Deepest(usize, usize);
        impl Visitor for Deepest {
            fn entry(&mut self, _: BorrowedFd<'_>, _: &CStr, _: &Stat) -> io::Result<()> {
                self.0 = std::fs::read_dir("/proc/self/fd")?.count();
                Ok(())
            }
            fn enter(&mut self, _: BorrowedFd<'_>, _: &Stat) -> io::Result<()> {
                self.1 += 1;
                Ok(())
            }
        }
        let mut d = Deepest(0, 0);
        walk(open_path(&v).unwrap(), &mut d).unwrap();
        assert_eq!(d.1, 5001);
        // Other tests' threads open files too: a margin, far below 5000.
        assert!(
            d.0 <= open_before + 16,
            "{} open, {open_before} before",
            d.0
        );
        crate::volume::remove::remove_all_one_filesystem(&v).unwrap();
        assert!(!v.exists());
    }

    #[test]
    fn a_directory_moved_under_the_walk_ends_it() {
        let dir = tempfile::tempdir().unwrap();
        let v = dir.path().join("v");
        std::fs::create_dir_all(v.join("a/b")).unwrap();
        std::fs::create_dir_all(v.join("c")).unwrap();
        /// Moves `a/b` to `c/b` while the walk is inside it.
        struct Mover(PathBuf);
        impl Visitor for Mover {
            fn leave(&mut self, dir: BorrowedFd<'_>, _: &Stat) -> io::Result<()> {
                // Leaving b: it moves before the walk goes back up.
                let st = rustix::fs::fstat(dir)?;
                let b = std::fs::metadata(self.0.join("a/b"));
                if b.is_ok_and(|m| std::os::unix::fs::MetadataExt::ino(&m) == st.st_ino) {
                    std::fs::rename(self.0.join("a/b"), self.0.join("c/b"))?;
                }
                Ok(())
            }
        }
        use std::path::PathBuf;
        let err = walk(open_path(&v).unwrap(), &mut Mover(v.clone())).unwrap_err();
        assert!(err.to_string().contains("moved"), "{err}");
    }
}
