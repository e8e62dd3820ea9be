//! The kubelet's atomic writer (pkg/volume/util/atomic_writer.go): projects a
//! set of files into a volume directory so that a reader never sees a mix of
//! old and new contents.
//!
//! The real files live in a hidden timestamped directory `..<yyyy_mm_dd_hh_mm_ss>.<n>`;
//! `..data` is a symlink to it; each user-visible top-level name is a symlink
//! through `..data` (`key -> ..data/key`). An update writes a new timestamped
//! directory, points `..data_tmp` at it and renames `..data_tmp` over `..data`
//! (rename is atomic), then prunes names that went away and the old directory.
//! Names starting with `..` are reserved. Nothing is written when the contents
//! are unchanged.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, lchown, symlink};
use std::path::{Path, PathBuf};

/// The symlink to the current timestamped data directory.
pub const DATA_DIR: &str = "..data";
/// The symlink that is renamed over [`DATA_DIR`] to publish a new version.
pub const NEW_DATA_DIR: &str = "..data_tmp";
/// Longest file name in a payload path, in bytes.
pub const MAX_FILE_NAME_LENGTH: usize = 255;
/// Longest payload path, in bytes.
pub const MAX_PATH_LENGTH: usize = 4096;

/// One file of a payload: contents, permission bits and an optional owner.
/// Its `Debug` shows the size of the contents, never the bytes (they may be
/// Secret data or a token).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct FileProjection {
    /// The file's bytes.
    pub data: Vec<u8>,
    /// Permission bits (`0644`); only the low 12 bits are used.
    pub mode: u32,
    /// Owner UID to set, if any (the `user`/`defaultUser` fields).
    pub fs_user: Option<u32>,
}

impl std::fmt::Debug for FileProjection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileProjection")
            .field("bytes", &self.data.len())
            .field("mode", &format_args!("{:#o}", self.mode))
            .field("fs_user", &self.fs_user)
            .finish()
    }
}

/// Files to project, by relative path (`key`, `dir/key`).
pub type Payload = BTreeMap<String, FileProjection>;

/// A function run on the new timestamped directory before it is published.
pub type SetPerms<'a> = &'a dyn Fn(&Path) -> io::Result<()>;

/// A failed projection.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A payload path is absolute, has a `..` element, starts with `..`, or is too long.
    #[error("invalid path: {0}")]
    InvalidPath(String),
    /// A filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// Result of a projection.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io { op, path, source }
}

/// Checks one payload path as the kubelet's `validatePath`: not empty, relative,
/// at most 4096 bytes, no `..` element, names at most 255 bytes, not starting with `..`.
///
/// # Errors
/// [`Error::InvalidPath`] saying which rule the path breaks.
pub fn validate_path(path: &str) -> Result<()> {
    let invalid = |why: String| Err(Error::InvalidPath(why));
    if path.is_empty() {
        return invalid(format!("must not be empty: {path:?}"));
    }
    if path.starts_with('/') {
        return invalid(format!("must be relative path: {path}"));
    }
    if path.len() > MAX_PATH_LENGTH {
        return invalid(format!(
            "must be less than or equal to {MAX_PATH_LENGTH} characters"
        ));
    }
    let items: Vec<&str> = path.split('/').collect();
    for item in &items {
        if *item == ".." {
            return invalid(format!("must not contain '..': {path}"));
        }
        if item.len() > MAX_FILE_NAME_LENGTH {
            return invalid(format!(
                "filenames must be less than or equal to {MAX_FILE_NAME_LENGTH} characters"
            ));
        }
    }
    if items[0].starts_with("..") && items[0].len() > 2 {
        return invalid(format!("must not start with '..': {path}"));
    }
    Ok(())
}

/// `path` without empty and `.` elements (Go's `filepath.Clean` for valid paths).
fn clean(path: &str) -> String {
    path.split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect::<Vec<_>>()
        .join("/")
}

fn validate_payload(payload: &Payload) -> Result<BTreeMap<String, &FileProjection>> {
    let mut clean_payload = BTreeMap::new();
    for (path, file) in payload {
        validate_path(path)?;
        let c = clean(path);
        if c.is_empty() {
            return Err(Error::InvalidPath(format!("must not be empty: {path:?}")));
        }
        clean_payload.insert(c, file);
    }
    Ok(clean_payload)
}

/// Relative paths of everything under `dir` (files and directories), not following symlinks.
fn walk(dir: &Path) -> io::Result<BTreeSet<String>> {
    fn visit(root: &Path, dir: &Path, out: &mut BTreeSet<String>) -> io::Result<()> {
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let path = entry.path();
            if let Ok(rel) = path.strip_prefix(root) {
                out.insert(rel.to_string_lossy().into_owned());
            }
            if entry.file_type()?.is_dir() {
                visit(root, &path, out)?;
            }
        }
        Ok(())
    }
    let mut out = BTreeSet::new();
    visit(dir, dir, &mut out)?;
    Ok(out)
}

/// The paths of the old version that the new payload no longer has (a path's
/// parent directories count as present).
fn paths_to_remove(
    payload: &BTreeMap<String, &FileProjection>,
    old_ts: &Path,
) -> io::Result<BTreeSet<String>> {
    let old = match walk(old_ts) {
        Ok(paths) => paths,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeSet::new()),
        Err(e) => return Err(e),
    };
    let mut new = BTreeSet::new();
    for file in payload.keys() {
        let mut p = file.as_str();
        loop {
            new.insert(p.to_string());
            match p.rfind('/') {
                Some(i) => p = &p[..i],
                None => break,
            }
        }
    }
    Ok(old.difference(&new).cloned().collect())
}

/// True when some file of the payload is missing from `old_ts` or has other bytes.
fn should_write(payload: &BTreeMap<String, &FileProjection>, old_ts: &Path) -> io::Result<bool> {
    for (path, file) in payload {
        let full = old_ts.join(path);
        match fs::symlink_metadata(&full) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        if fs::read(&full)? != file.data {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Creates a fresh `..<yyyy_mm_dd_hh_mm_ss>.<n>` directory with mode 0755.
fn new_timestamp_dir(target: &Path) -> Result<PathBuf> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let prefix = now.strftime("..%Y_%m_%d_%H_%M_%S.").to_string();
    let mut n = u64::from(now.subsec_nanosecond().unsigned_abs());
    loop {
        let dir = target.join(format!("{prefix}{n:09}"));
        match fs::create_dir(&dir) {
            Ok(()) => {
                fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
                    .map_err(io_err("set mode of", &dir))?;
                return Ok(dir);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => n += 1,
            Err(e) => return Err(io_err("create", &dir)(e)),
        }
    }
}

fn write_payload_to_dir(payload: &BTreeMap<String, &FileProjection>, dir: &Path) -> Result<()> {
    for (path, file) in payload {
        let full = dir.join(path);
        if let Some(parent) = full.parent() {
            fs::create_dir_all(parent).map_err(io_err("create directory", parent))?;
        }
        fs::write(&full, &file.data).map_err(io_err("write", &full))?;
        // Set the mode explicitly: the file was created with the umask applied.
        fs::set_permissions(&full, fs::Permissions::from_mode(file.mode & 0o7777))
            .map_err(io_err("set mode of", &full))?;
        if let Some(uid) = file.fs_user {
            lchown(&full, Some(uid), None).map_err(io_err("change owner of", &full))?;
        }
    }
    Ok(())
}

/// Creates `name -> ..data/name` for each top-level name of the payload that has no link yet.
fn create_user_visible_files(
    payload: &BTreeMap<String, &FileProjection>,
    target: &Path,
) -> Result<()> {
    for (path, file) in payload {
        let name = path.split('/').next().unwrap_or(path);
        let visible = target.join(name);
        match fs::read_link(&visible) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                symlink(Path::new(DATA_DIR).join(name), &visible)
                    .map_err(io_err("create symlink", &visible))?;
                if let Some(uid) = file.fs_user {
                    lchown(&visible, Some(uid), None)
                        .map_err(io_err("change owner of", &visible))?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// True for the name of a timestamped data directory,
/// `..<yyyy_mm_dd_hh_mm_ss>.<n>`.
fn is_timestamp_dir_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("..") else {
        return false;
    };
    let Some((stamp, n)) = rest.split_once('.') else {
        return false;
    };
    let digits = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_digit());
    let parts: Vec<&str> = stamp.split('_').collect();
    parts.len() == 6
        && digits(parts[0], 4)
        && parts[1..].iter().all(|p| digits(p, 2))
        && !n.is_empty()
        && n.bytes().all(|b| b.is_ascii_digit())
}

/// Removes the timestamped directories of `target` that `..data` does not
/// point at (`current`): left by a write interrupted between writing its
/// directory and swapping `..data` (a crash, a full disk), they would
/// otherwise stay for the life of the volume. Symbolic links are never
/// followed: only real directories directly in `target` go.
fn remove_stale_dirs(target: &Path, current: Option<&Path>) -> Result<()> {
    let entries = fs::read_dir(target).map_err(io_err("list", target))?;
    for entry in entries {
        let entry = entry.map_err(io_err("list", target))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        if !is_timestamp_dir_name(name) || current == Some(Path::new(name)) {
            continue;
        }
        let path = target.join(name);
        let is_dir = fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_dir());
        if is_dir {
            tracing::info!(path = %path.display(), "removing a data directory left by an interrupted write");
            fs::remove_dir_all(&path).map_err(io_err("remove stale data directory", &path))?;
        }
    }
    Ok(())
}

/// Projects `payload` into `target` (which must exist) atomically, as the
/// kubelet's `AtomicWriter.Write`. `set_perms` runs on the new timestamped
/// directory before it is published (the fsGroup ownership change).
///
/// Returns true when a new version was written, false when the contents on
/// disk were already the payload's (the user-visible links are still ensured).
///
/// # Errors
/// [`Error::InvalidPath`] for a bad payload path (nothing is written), or
/// [`Error::Io`] naming the operation and path that failed.
pub fn write(target: &Path, payload: &Payload, set_perms: Option<SetPerms<'_>>) -> Result<bool> {
    let clean_payload = validate_payload(payload)?;
    fs::metadata(target).map_err(io_err("stat target directory", target))?;
    let data_dir = target.join(DATA_DIR);
    let mut old_ts = match fs::read_link(&data_dir) {
        Ok(p) => Some(p),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_err("read link", &data_dir)(e)),
    };
    remove_stale_dirs(target, old_ts.as_deref())?;
    let mut remove = BTreeSet::new();
    let mut write = true;
    if let Some(old) = &old_ts {
        let old_path = target.join(old);
        remove = paths_to_remove(&clean_payload, &old_path)
            .map_err(io_err("list old data directory", &old_path))?;
        let changed = should_write(&clean_payload, &old_path)
            .map_err(io_err("compare with old data directory", &old_path))?;
        if !changed && remove.is_empty() {
            write = false;
            old_ts = None;
        }
    }
    if write {
        let ts_dir = new_timestamp_dir(target)?;
        let publish = || -> Result<()> {
            write_payload_to_dir(&clean_payload, &ts_dir)?;
            if let Some(f) = set_perms {
                f(&ts_dir).map_err(io_err("set ownership of", &ts_dir))?;
            }
            let ts_name = ts_dir
                .file_name()
                .map(PathBuf::from)
                .unwrap_or_else(|| ts_dir.clone());
            let new_data = target.join(NEW_DATA_DIR);
            // A link left by an interrupted write.
            let _ = fs::remove_file(&new_data);
            symlink(&ts_name, &new_data).map_err(io_err("create symlink", &new_data))?;
            if let Err(e) = fs::rename(&new_data, &data_dir) {
                let _ = fs::remove_file(&new_data);
                return Err(io_err("rename to", &data_dir)(e));
            }
            Ok(())
        };
        if let Err(e) = publish() {
            let _ = fs::remove_dir_all(&ts_dir);
            return Err(e);
        }
    }
    create_user_visible_files(&clean_payload, target)?;
    // Only links at the volume root are removed; deeper paths went with the old directory.
    let mut last = Ok(());
    for p in remove.iter().filter(|p| !p.contains('/')) {
        let path = target.join(p);
        let removed = match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => fs::remove_dir(&path),
            Ok(_) => fs::remove_file(&path),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = removed {
            last = Err(io_err("remove old path", &path)(e));
        }
    }
    last?;
    if let Some(old) = old_ts {
        let old_path = target.join(old);
        fs::remove_dir_all(&old_path).map_err(io_err("remove old data directory", &old_path))?;
    }
    Ok(write)
}

/// True when `target` holds a published version (its `..data` link exists):
/// the volume was set up at least once.
#[must_use]
pub fn is_published(target: &Path) -> bool {
    fs::symlink_metadata(target.join(DATA_DIR)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn debug_shows_the_size_never_the_bytes() {
        let f = FileProjection {
            data: b"secret-data".to_vec(),
            mode: 0o400,
            fs_user: Some(1000),
        };
        let printed = format!("{f:?}");
        assert_eq!(
            printed,
            "FileProjection { bytes: 11, mode: 0o400, fs_user: Some(1000) }"
        );
        let payload = Payload::from([("token".to_string(), f)]);
        assert!(!format!("{payload:#?}").contains("115"), "no byte values");
    }

    fn file(data: &str, mode: u32) -> FileProjection {
        FileProjection {
            data: data.as_bytes().to_vec(),
            mode,
            fs_user: None,
        }
    }

    fn payload(files: &[(&str, &str, u32)]) -> Payload {
        files
            .iter()
            .map(|(p, d, m)| ((*p).to_string(), file(d, *m)))
            .collect()
    }

    fn names(dir: &Path) -> BTreeSet<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn first_write_publishes_a_timestamped_dir_through_data_links() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        let p = payload(&[("a", "one", 0o644), ("sub/b", "two", 0o400)]);
        assert!(write(t, &p, None).unwrap());
        let ts = fs::read_link(t.join(DATA_DIR)).unwrap();
        let ts = ts.to_string_lossy();
        assert!(ts.starts_with("..2") && ts.len() > 20, "{ts}");
        assert_eq!(
            fs::read_link(t.join("a")).unwrap(),
            Path::new("..data/a"),
            "user-visible names link through ..data"
        );
        assert_eq!(
            fs::read_link(t.join("sub")).unwrap(),
            Path::new("..data/sub")
        );
        assert_eq!(fs::read_to_string(t.join("a")).unwrap(), "one");
        assert_eq!(fs::read_to_string(t.join("sub/b")).unwrap(), "two");
        let mode = |p: &str| fs::metadata(t.join(p)).unwrap().mode() & 0o7777;
        assert_eq!(mode("a"), 0o644);
        assert_eq!(mode("sub/b"), 0o400);
        assert_eq!(mode(&ts), 0o755);
        assert!(is_published(t));
        assert!(!t.join(NEW_DATA_DIR).exists());
    }

    #[test]
    fn unchanged_payload_is_not_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        let p = payload(&[("a", "one", 0o644)]);
        assert!(write(t, &p, None).unwrap());
        let before = fs::read_link(t.join(DATA_DIR)).unwrap();
        // A missing visible link is restored even without a write.
        fs::remove_file(t.join("a")).unwrap();
        assert!(!write(t, &p, None).unwrap());
        assert_eq!(fs::read_link(t.join(DATA_DIR)).unwrap(), before);
        assert_eq!(fs::read_to_string(t.join("a")).unwrap(), "one");
    }

    #[test]
    fn changed_payload_swaps_data_and_prunes_old_names() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        write(
            t,
            &payload(&[
                ("a", "one", 0o644),
                ("gone", "x", 0o644),
                ("d/e", "y", 0o644),
            ]),
            None,
        )
        .unwrap();
        let old = fs::read_link(t.join(DATA_DIR)).unwrap();
        assert!(
            write(
                t,
                &payload(&[("a", "uno", 0o644), ("d/f", "z", 0o644)]),
                None
            )
            .unwrap()
        );
        let new = fs::read_link(t.join(DATA_DIR)).unwrap();
        assert_ne!(old, new);
        assert!(!t.join(&old).exists(), "old timestamped dir removed");
        assert_eq!(fs::read_to_string(t.join("a")).unwrap(), "uno");
        assert_eq!(fs::read_to_string(t.join("d/f")).unwrap(), "z");
        assert!(!t.join("d/e").exists());
        let visible = names(t);
        let expected: BTreeSet<String> = [
            "..data".to_string(),
            new.to_string_lossy().into_owned(),
            "a".into(),
            "d".into(),
        ]
        .into();
        assert_eq!(visible, expected);
    }

    #[test]
    fn a_removed_key_alone_triggers_a_write() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        write(t, &payload(&[("a", "1", 0o644), ("b", "2", 0o644)]), None).unwrap();
        assert!(write(t, &payload(&[("a", "1", 0o644)]), None).unwrap());
        assert!(!t.join("b").exists() && fs::symlink_metadata(t.join("b")).is_err());
    }

    #[test]
    fn set_perms_runs_on_the_new_dir_before_publishing() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        let seen = std::cell::RefCell::new(None);
        let f = |p: &Path| {
            assert!(!is_published(p.parent().unwrap()) || p.join("a").exists());
            *seen.borrow_mut() = Some(p.to_path_buf());
            Ok(())
        };
        write(t, &payload(&[("a", "1", 0o644)]), Some(&f)).unwrap();
        let ts = fs::read_link(t.join(DATA_DIR)).unwrap();
        assert_eq!(seen.into_inner(), Some(t.join(ts)));
    }

    #[test]
    fn bad_paths_are_rejected_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path();
        for bad in [
            "",
            "/abs",
            "a/../b",
            "..",
            "..hidden",
            "../x",
            &"n".repeat(256),
        ] {
            let err = write(t, &payload(&[(bad, "x", 0o644)]), None).unwrap_err();
            assert!(matches!(err, Error::InvalidPath(_)), "{bad:?}: {err}");
        }
        assert!(names(t).is_empty());
        validate_path("..").unwrap_err();
        validate_path("./a").unwrap();
        validate_path("a/..b").unwrap();
    }

    #[test]
    fn a_directory_left_by_an_interrupted_write_goes_with_the_next_write() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("vol");
        fs::create_dir(&t).unwrap();
        let p = payload(&[("a", "1", 0o644)]);
        write(&t, &p, None).unwrap();
        let current = fs::read_link(t.join(DATA_DIR)).unwrap();
        // A crash after writing a new directory, before swapping `..data`;
        // and a link with such a name pointing out of the volume.
        let stale = t.join("..2024_01_02_03_04_05.000000001");
        fs::create_dir_all(stale.join("sub")).unwrap();
        fs::write(stale.join("sub/a"), "half").unwrap();
        let outside = dir.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("keep"), "x").unwrap();
        symlink(&outside, t.join("..2024_01_02_03_04_06.7")).unwrap();
        // An unchanged payload: nothing is rewritten, the stale directory goes.
        assert!(!write(&t, &p, None).unwrap());
        assert!(!stale.exists());
        assert_eq!(fs::read_link(t.join(DATA_DIR)).unwrap(), current);
        assert_eq!(fs::read_to_string(t.join("a")).unwrap(), "1");
        assert!(outside.join("keep").exists(), "a link is not followed");
        assert!(
            fs::symlink_metadata(t.join("..2024_01_02_03_04_06.7")).is_ok(),
            "nor removed"
        );
        // Names that are not timestamped directories stay.
        for name in ["..2024_01_02.1", "..data_x", "..2024_01_02_03_04_05."] {
            assert!(!is_timestamp_dir_name(name), "{name}");
        }
        assert!(is_timestamp_dir_name("..2024_01_02_03_04_05.1"));
    }

    #[test]
    fn missing_target_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = write(
            &dir.path().join("nope"),
            &payload(&[("a", "1", 0o644)]),
            None,
        );
        assert!(matches!(err, Err(Error::Io { .. })));
    }
}
