//! The hostPath volume plugin (pkg/volume/hostpath): a path of the node itself,
//! mounted as is. Its `type` is checked before containers start:
//! `Directory`, `File`, `Socket`, `CharDevice` and `BlockDevice` must already be
//! that; `DirectoryOrCreate` (mode 0755) and `FileOrCreate` (mode 0644, empty)
//! create a missing path; `""` checks nothing.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

use super::{Error, Result};

/// The type of what is at `path` (following symlinks), named as the API names
/// host path types: `Directory`, `File`, `Socket`, `CharDevice`, `BlockDevice`.
///
/// # Errors
/// The stat error, or `InvalidData` for a FIFO or other unknown kind.
pub fn file_type(path: &Path) -> io::Result<&'static str> {
    let t = fs::metadata(path)?.file_type();
    Ok(if t.is_dir() {
        "Directory"
    } else if t.is_file() {
        "File"
    } else if t.is_socket() {
        "Socket"
    } else if t.is_char_device() {
        "CharDevice"
    } else if t.is_block_device() {
        "BlockDevice"
    } else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "only recognise file, directory, socket, block device and character device",
        ));
    })
}

fn expect_type(path: &Path, want: &'static str, expected: &str) -> Result<()> {
    match file_type(path) {
        Ok(t) if t == want => Ok(()),
        Ok(t) => Err(Error::HostPath(format!(
            "hostPath type check failed: {} is not a {expected}, it's a {t}",
            path.display()
        ))),
        Err(e) => Err(Error::HostPath(format!(
            "hostPath type check failed, {} is not a {expected}, unable to determine its type: {e}",
            path.display()
        ))),
    }
}

/// Checks (and for the `…OrCreate` types, creates) `path` for host path type
/// `type_`, as the kubelet's `checkTypeInternal`.
///
/// # Errors
/// [`Error::HostPath`] with the kubelet's message (`hostPath type check failed:
/// /x is not a directory, it's a File`), for a path with a `..` element, an
/// unknown type, or a failed create.
pub fn check(path: &Path, type_: Option<&str>) -> Result<()> {
    if path
        .components()
        .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(Error::HostPath(format!(
            "invalid HostPath `{}`: must not contain '..'",
            path.display()
        )));
    }
    let exists = fs::metadata(path).is_ok();
    let created =
        |e: io::Error| Error::HostPath(format!("hostPath: create {}: {e}", path.display()));
    match type_.unwrap_or_default() {
        "" => Ok(()),
        "DirectoryOrCreate" if !exists => fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(path)
            .map_err(created),
        "Directory" | "DirectoryOrCreate" => expect_type(path, "Directory", "directory"),
        "FileOrCreate" if !exists => fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(path)
            .map(drop)
            .map_err(created),
        "File" | "FileOrCreate" => expect_type(path, "File", "file"),
        "Socket" => expect_type(path, "Socket", "socket file"),
        "CharDevice" => expect_type(path, "CharDevice", "character device"),
        "BlockDevice" => expect_type(path, "BlockDevice", "block device"),
        other => Err(Error::HostPath(format!(
            "{other} is an invalid volume type"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_are_checked_with_the_kubelet_messages() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let file = d.join("f");
        fs::write(&file, "x").unwrap();
        check(d, Some("Directory")).unwrap();
        check(&file, Some("File")).unwrap();
        check(&file, None).unwrap();
        check(&d.join("nothing"), Some("")).unwrap();
        check(Path::new("/dev/null"), Some("CharDevice")).unwrap();
        let err = check(&file, Some("Directory")).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "hostPath type check failed: {} is not a directory, it's a File",
                file.display()
            )
        );
        let err = check(d, Some("Socket")).unwrap_err().to_string();
        assert!(
            err.ends_with("is not a socket file, it's a Directory"),
            "{err}"
        );
        let err = check(&d.join("missing"), Some("File"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unable to determine its type"), "{err}");
        assert_eq!(
            check(d, Some("Weird")).unwrap_err().to_string(),
            "Weird is an invalid volume type"
        );
        assert!(check(&d.join("a/../b"), None).is_err());
        assert!(check(Path::new("/dev/null"), Some("BlockDevice")).is_err());
    }

    #[test]
    fn or_create_types_create_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("new/dir");
        check(&d, Some("DirectoryOrCreate")).unwrap();
        assert!(d.is_dir());
        check(&d, Some("DirectoryOrCreate")).unwrap();
        let f = dir.path().join("new/file");
        check(&f, Some("FileOrCreate")).unwrap();
        assert_eq!(fs::read(&f).unwrap(), b"");
        fs::write(&f, "kept").unwrap();
        check(&f, Some("FileOrCreate")).unwrap();
        assert_eq!(fs::read_to_string(&f).unwrap(), "kept");
        assert!(check(&f, Some("DirectoryOrCreate")).is_err());
        let sock = dir.path().join("s.sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        check(&sock, Some("Socket")).unwrap();
    }
}
