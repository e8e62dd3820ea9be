//! The user namespace manager: which host ID range each pod with
//! `hostUsers: false` is mapped onto, as the kubelet's `pkg/kubelet/userns`
//! (`UsernsManager`). Each such pod gets its own range of
//! [`USER_NS_LENGTH`] (65536) IDs, container ID 0 at the range's first host
//! ID, the same for groups; the first range (host IDs 0..65536) is the
//! host's and never given out, and no two pods share one. A pod's range is
//! kept in `<root>/pods/<uid>/userns` (the kubelet's file and format), so that
//! a restarted agent gives a running pod the same range again and does not
//! give it to another.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::pod_core::translate::USER_NS_LENGTH;

/// Errors of the user namespace manager.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Every range is taken, or as many pods as the node runs have one.
    #[error(
        "limit on count of pods with user namespaces exceeded (limit is {limit}, current pods with userns: {used})"
    )]
    Exhausted {
        /// The most pods with a user namespace.
        limit: usize,
        /// How many have one.
        used: usize,
    },
    /// The pod's mappings file could not be read or written.
    #[error("user namespace mappings of pod {uid}: {source}")]
    Io {
        /// The pod's UID.
        uid: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The pod's mappings file holds something this manager never writes.
    #[error("invalid user namespace mappings file of pod {uid}: {message}")]
    Invalid {
        /// The pod's UID.
        uid: String,
        /// What is wrong.
        message: String,
    },
}

/// One ID mapping of the mappings file (the kubelet's `idMapping`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct IdMapping {
    host_id: u32,
    container_id: u32,
    length: u32,
}

/// The mappings file (the kubelet's `userNamespace`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct MappingsFile {
    uid_mappings: Vec<IdMapping>,
    gid_mappings: Vec<IdMapping>,
}

/// Name of the mappings file in a pod's directory.
pub const MAPPINGS_FILE: &str = "userns";

/// The user namespace manager; one per agent.
pub struct UsernsManager {
    root_dir: PathBuf,
    /// The most pods with a user namespace at once (the node's `maxPods`).
    limit: usize,
    /// Pod UID → index of its range (its first host ID / 65536, at least 1).
    used: Mutex<BTreeMap<String, u32>>,
}

impl UsernsManager {
    /// A manager for pods under `<root_dir>/pods`, at most `limit` of them
    /// with a user namespace, that knows the ranges recorded there by an
    /// earlier run (files it cannot read are skipped with a warning: their
    /// pods get an error when they next ask).
    #[must_use]
    pub fn new(root_dir: &Path, limit: usize) -> Self {
        let mut used = BTreeMap::new();
        let pods = root_dir.join(crate::volume::PODS_DIR);
        for entry in std::fs::read_dir(&pods).into_iter().flatten().flatten() {
            let uid = entry.file_name().to_string_lossy().into_owned();
            match read_index(&entry.path(), &uid) {
                Ok(Some(index)) => {
                    used.insert(uid, index);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(error = %e, "user namespace of a pod on disk"),
            }
        }
        Self {
            root_dir: root_dir.to_path_buf(),
            limit,
            used: Mutex::new(used),
        }
    }

    /// The first host ID of pod `uid`'s range: the one it has (in memory or
    /// in its mappings file), else the lowest free one, recorded in its file
    /// before it is returned.
    ///
    /// # Errors
    /// [`Error::Exhausted`], or the file could not be read, parsed or written.
    pub fn get_or_create(&self, uid: &str) -> Result<u32, Error> {
        let mut used = self
            .used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let dir = crate::volume::pod_dir(&self.root_dir, uid);
        let index = match used.get(uid) {
            Some(index) => *index,
            None => match read_index(&dir, uid)? {
                Some(index) if used.values().all(|i| *i != index) => index,
                Some(index) => {
                    return Err(Error::Invalid {
                        uid: uid.into(),
                        message: format!("range {index} is already used by another pod"),
                    });
                }
                None => {
                    let index = self.free_index(&used)?;
                    write_index(&dir, uid, index)?;
                    index
                }
            },
        };
        used.insert(uid.to_string(), index);
        index.checked_mul(USER_NS_LENGTH).ok_or(Error::Invalid {
            uid: uid.into(),
            message: format!("range {index} is beyond the ID space"),
        })
    }

    /// Forgets pod `uid`'s range and removes its mappings file (a pod that is gone).
    pub fn release(&self, uid: &str) {
        let mut used = self
            .used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if used.remove(uid).is_some() {
            let file = crate::volume::pod_dir(&self.root_dir, uid).join(MAPPINGS_FILE);
            let _ = std::fs::remove_file(file);
        }
    }

    /// The lowest range index not in use (1.., range 0 being the host's).
    fn free_index(&self, used: &BTreeMap<String, u32>) -> Result<u32, Error> {
        let exhausted = || Error::Exhausted {
            limit: self.limit,
            used: used.len(),
        };
        if used.len() >= self.limit {
            return Err(exhausted());
        }
        let taken: std::collections::BTreeSet<u32> = used.values().copied().collect();
        let ranges = u32::MAX / USER_NS_LENGTH;
        (1..=ranges)
            .find(|i| !taken.contains(i))
            .ok_or_else(exhausted)
    }
}

/// The range index recorded in the mappings file in `pod_dir`; none without a file.
fn read_index(pod_dir: &Path, uid: &str) -> Result<Option<u32>, Error> {
    let file = pod_dir.join(MAPPINGS_FILE);
    let io = |source| Error::Io {
        uid: uid.into(),
        source,
    };
    let invalid = |message: String| Error::Invalid {
        uid: uid.into(),
        message,
    };
    let meta = match std::fs::symlink_metadata(&file) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(e)),
    };
    // The file is small; anything else is not ours.
    if !meta.is_file() || meta.len() > 4096 {
        return Err(invalid("not a small regular file".into()));
    }
    let text = std::fs::read_to_string(&file).map_err(io)?;
    let m: MappingsFile = serde_json::from_str(&text).map_err(|e| invalid(e.to_string()))?;
    let [uids] = m.uid_mappings.as_slice() else {
        return Err(invalid("exactly one UID mapping expected".into()));
    };
    if m.gid_mappings.as_slice() != [*uids] {
        return Err(invalid("GID and UID mappings differ".into()));
    }
    if uids.container_id != 0 || uids.length != USER_NS_LENGTH {
        return Err(invalid(format!(
            "mapping must start at container ID 0 and hold {USER_NS_LENGTH} IDs"
        )));
    }
    if uids.host_id % USER_NS_LENGTH != 0 || uids.host_id < USER_NS_LENGTH {
        return Err(invalid(format!(
            "host ID {} is not a range of its own",
            uids.host_id
        )));
    }
    Ok(Some(uids.host_id / USER_NS_LENGTH))
}

/// Records range `index` in the mappings file in `pod_dir` (written whole,
/// then renamed into place).
fn write_index(pod_dir: &Path, uid: &str, index: u32) -> Result<(), Error> {
    let io = |source| Error::Io {
        uid: uid.into(),
        source,
    };
    let host_id = index.checked_mul(USER_NS_LENGTH).ok_or(Error::Invalid {
        uid: uid.into(),
        message: format!("range {index} is beyond the ID space"),
    })?;
    let mapping = IdMapping {
        host_id,
        container_id: 0,
        length: USER_NS_LENGTH,
    };
    let file = MappingsFile {
        uid_mappings: vec![mapping],
        gid_mappings: vec![mapping],
    };
    let text = serde_json::to_vec(&file).map_err(|e| Error::Invalid {
        uid: uid.into(),
        message: e.to_string(),
    })?;
    std::fs::create_dir_all(pod_dir).map_err(io)?;
    let tmp = pod_dir.join(format!(".{MAPPINGS_FILE}.tmp"));
    std::fs::write(&tmp, text).map_err(io)?;
    std::fs::rename(&tmp, pod_dir.join(MAPPINGS_FILE)).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_distinct_persisted_and_released() {
        let dir = tempfile::tempdir().unwrap();
        let m = UsernsManager::new(dir.path(), 2);
        let a = m.get_or_create("a").unwrap();
        let b = m.get_or_create("b").unwrap();
        assert_eq!((a, b), (65536, 131_072), "range 0 is the host's");
        assert_eq!(m.get_or_create("a").unwrap(), a, "stable");
        assert!(matches!(
            m.get_or_create("c"),
            Err(Error::Exhausted { limit: 2, used: 2 })
        ));
        // A restarted manager reads the ranges back.
        let again = UsernsManager::new(dir.path(), 2);
        assert_eq!(again.get_or_create("b").unwrap(), b);
        again.release("a");
        assert!(!dir.path().join("pods/a/userns").exists());
        assert_eq!(
            again.get_or_create("c").unwrap(),
            a,
            "a's range is free again"
        );
    }

    #[test]
    fn hostile_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let m = UsernsManager::new(dir.path(), 10);
        let cases = [
            (
                "identity",
                r#"{"uidMappings":[{"hostId":0,"containerId":0,"length":65536}],"gidMappings":[{"hostId":0,"containerId":0,"length":65536}]}"#,
            ),
            (
                "short",
                r#"{"uidMappings":[{"hostId":65536,"containerId":0,"length":10}],"gidMappings":[{"hostId":65536,"containerId":0,"length":10}]}"#,
            ),
            (
                "odd",
                r#"{"uidMappings":[{"hostId":65537,"containerId":0,"length":65536}],"gidMappings":[{"hostId":65537,"containerId":0,"length":65536}]}"#,
            ),
            (
                "differ",
                r#"{"uidMappings":[{"hostId":65536,"containerId":0,"length":65536}],"gidMappings":[]}"#,
            ),
            ("garbage", "not json"),
        ];
        for (uid, text) in cases {
            let pod = dir.path().join("pods").join(uid);
            std::fs::create_dir_all(&pod).unwrap();
            std::fs::write(pod.join(MAPPINGS_FILE), text).unwrap();
            assert!(
                matches!(m.get_or_create(uid), Err(Error::Invalid { .. })),
                "{uid}"
            );
        }
    }
}
