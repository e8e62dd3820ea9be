//! The CPU manager's checkpoint, `<root-dir>/cpu_manager_state`, in the
//! kubelet's format (pkg/kubelet/cm/cpumanager/state, format V4 with the
//! V2 fields beside it), so that a node keeps its containers' CPUs across
//! restarts and a kubelet's file reads here.
//!
//! Both checksums are the kubelet's: FNV-1a (32 bits) of the go-spew
//! rendering of what they cover (`k8s.io/utils/dump.ForHash`); for `data`
//! that is `(string)` and the string.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::PolicyName;
use super::policy::State;
use crate::cpuset::CpuSet;

/// The checkpoint's file name.
pub const FILE: &str = "cpu_manager_state";
/// The most of the file read, bytes.
pub const MAX_BYTES: u64 = 4 << 20;

/// Errors restoring or writing the checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be restored; the message is the kubelet's.
    #[error(
        "could not restore state from checkpoint: {message}, please drain this node and delete the CPU manager checkpoint file {path:?} before restarting Kubelet"
    )]
    Restore {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// The file could not be written.
    #[error("write CPU manager checkpoint {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
}

/// FNV-1a, 32 bits.
#[must_use]
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(2_166_136_261u32, |h, b| {
        (h ^ u32::from(*b)).wrapping_mul(16_777_619)
    })
}

type Entries = BTreeMap<String, BTreeMap<String, String>>;

/// The state inside `data`.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    policy_name: String,
    default_cpu_set: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    entries: Entries,
}

/// The file.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Checkpoint {
    policy_name: String,
    default_cpu_set: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    entries: Entries,
    #[serde(default)]
    checksum: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    data: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    data_checksum: u32,
}

#[allow(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The V2 checksum: FNV-1a of the go-spew text of the checkpoint with a
/// zero checksum.
fn legacy_checksum(policy: &str, default: &str, entries: &Entries) -> u32 {
    let mut text = format!(
        "(*state.CPUManagerCheckpoint){{PolicyName:(string){policy} DefaultCPUSet:(string){default} Entries:(map[string]map[string]string)map["
    );
    let pods: Vec<String> = entries
        .iter()
        .map(|(uid, containers)| {
            let cs: Vec<String> = containers
                .iter()
                .map(|(c, set)| format!("{c}:{set}"))
                .collect();
            format!("{uid}:map[{}]", cs.join(" "))
        })
        .collect();
    text.push_str(&pods.join(" "));
    text.push_str("] Checksum:(checksum.Checksum)0}");
    fnv1a32(text.as_bytes())
}

/// The data checksum: FNV-1a of `(string)` and the data.
fn data_checksum(data: &str) -> u32 {
    fnv1a32(format!("(string){data}").as_bytes())
}

/// The checkpoint's text for `policy` and `state`.
#[must_use]
pub fn encode(policy: PolicyName, state: &State) -> String {
    let entries: Entries = state
        .assignments
        .iter()
        .map(|(uid, cs)| {
            (
                uid.clone(),
                cs.iter()
                    .map(|(c, set)| (c.clone(), set.to_string()))
                    .collect(),
            )
        })
        .collect();
    let default = state.default.to_string();
    let data = Data {
        policy_name: policy.name().into(),
        default_cpu_set: default.clone(),
        entries: entries.clone(),
    };
    let data = serde_json::to_string(&data).unwrap_or_default();
    let checkpoint = Checkpoint {
        checksum: legacy_checksum(policy.name(), &default, &entries),
        policy_name: policy.name().into(),
        default_cpu_set: default,
        entries,
        data_checksum: data_checksum(&data),
        data,
    };
    serde_json::to_string(&checkpoint).unwrap_or_default()
}

/// Reads a checkpoint's text for `policy`: its state, as the kubelet's
/// `restoreState` (V4, else V2; a V2 checksum of 0 is accepted).
///
/// # Errors
/// The kubelet's message: a corrupted file, a policy other than
/// `policy`, or a CPU list that is not one.
pub fn decode(policy: PolicyName, text: &str) -> Result<State, String> {
    let file: Checkpoint =
        serde_json::from_str(text).map_err(|e| format!("checkpoint is corrupted: {e}"))?;
    let (name, default, entries) = if file.data.is_empty() && file.data_checksum == 0 {
        if file.checksum != 0
            && file.checksum
                != legacy_checksum(&file.policy_name, &file.default_cpu_set, &file.entries)
        {
            return Err("checkpoint is corrupted".into());
        }
        (file.policy_name, file.default_cpu_set, file.entries)
    } else {
        if data_checksum(&file.data) != file.data_checksum {
            return Err("could not load v4 checkpoint: checkpoint is corrupted".into());
        }
        let data: Data = serde_json::from_str(&file.data)
            .map_err(|e| format!("could not load v4 checkpoint: {e}"))?;
        (data.policy_name, data.default_cpu_set, data.entries)
    };
    if name != policy.name() {
        return Err(format!(
            "configured policy {:?} differs from state checkpoint policy {name:?}",
            policy.name()
        ));
    }
    let default = CpuSet::parse(&default)
        .map_err(|e| format!("could not parse default CPU set {default:?}: {e}"))?;
    let mut assignments: BTreeMap<String, BTreeMap<String, CpuSet>> = BTreeMap::new();
    for (uid, containers) in entries {
        for (c, set) in containers {
            let parsed = CpuSet::parse(&set).map_err(|e| {
                format!("could not parse cpuset {set:?} for container {c:?} in pod {uid:?}: {e}")
            })?;
            assignments
                .entry(uid.clone())
                .or_default()
                .insert(c, parsed);
        }
    }
    Ok(State {
        default,
        assignments,
    })
}

/// Restores the state from `dir/cpu_manager_state`; an absent file is an
/// empty state.
///
/// # Errors
/// [`Error::Restore`] for a file that cannot be read or used.
pub fn restore(dir: &Path, policy: PolicyName) -> Result<State, Error> {
    let path = dir.join(FILE);
    let restore = |message: String| Error::Restore {
        path: path.clone(),
        message,
    };
    let max = usize::try_from(MAX_BYTES).unwrap_or(usize::MAX);
    let read = crate::container::observe::read_at_most(&path, max)
        .and_then(|bytes| String::from_utf8(bytes).map_err(std::io::Error::other));
    let text = match read {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(State::default()),
        Err(e) => return Err(restore(e.to_string())),
    };
    decode(policy, &text).map_err(restore)
}

/// Writes the state to `dir/cpu_manager_state`, atomically.
///
/// # Errors
/// [`Error::Write`] when the file cannot be written.
pub fn save(dir: &Path, policy: PolicyName, state: &State) -> Result<(), Error> {
    let path = dir.join(FILE);
    let tmp = dir.join(format!(".{FILE}.tmp"));
    let write = |source| Error::Write {
        path: path.clone(),
        source,
    };
    std::fs::write(&tmp, encode(policy, state)).map_err(write)?;
    std::fs::rename(&tmp, &path).map_err(write)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubelets_checksums_are_reproduced() {
        // The kubelet's own file for the none policy.
        let text = encode(PolicyName::None, &State::default());
        assert_eq!(
            text,
            r#"{"policyName":"none","defaultCpuSet":"","checksum":1353318690,"data":"{\"policyName\":\"none\",\"defaultCpuSet\":\"\"}","dataChecksum":3028111495}"#
        );
        // A V2 file of a static node, as a kubelet before 1.36 wrote it.
        let entries = BTreeMap::from([(
            "235148fe-393f-47a8-a17d-bd55bc1a836b".to_string(),
            BTreeMap::from([("cgroup1-0".to_string(), "1,13".to_string())]),
        )]);
        assert_eq!(
            legacy_checksum("static", "0,2-12,14-23", &entries),
            1_552_716_370
        );
        let v2 = r#"{"policyName":"static","defaultCpuSet":"0,2-12,14-23","entries":{"235148fe-393f-47a8-a17d-bd55bc1a836b":{"cgroup1-0":"1,13"}},"checksum":1552716370}"#;
        let s = decode(PolicyName::Static, v2).unwrap();
        assert_eq!(s.default.to_string(), "0,2-12,14-23");
        assert_eq!(
            s.assigned("235148fe-393f-47a8-a17d-bd55bc1a836b", "cgroup1-0")
                .unwrap()
                .to_string(),
            "1,13"
        );
    }

    #[test]
    fn a_state_round_trips_and_bad_files_are_refused_with_the_kubelets_messages() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = State {
            default: CpuSet::parse("0,2-3").unwrap(),
            ..State::default()
        };
        s.assignments
            .entry("uid".into())
            .or_default()
            .insert("c".into(), CpuSet::parse("1").unwrap());
        save(dir.path(), PolicyName::Static, &s).unwrap();
        assert_eq!(restore(dir.path(), PolicyName::Static).unwrap(), s);
        let e = restore(dir.path(), PolicyName::None)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "could not restore state from checkpoint: configured policy \"none\" differs from state checkpoint policy \"static\", please drain this node and delete the CPU manager checkpoint file {:?} before restarting Kubelet",
                dir.path().join(FILE)
            )
        );
        // A changed byte in the data is caught by its checksum.
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        let tampered = text.replacen("0,2-3", "0,2-4", 2);
        assert!(
            decode(PolicyName::Static, &tampered)
                .unwrap_err()
                .contains("corrupted")
        );
        assert!(
            decode(PolicyName::Static, "{not json")
                .unwrap_err()
                .contains("corrupted")
        );
        // No file: an empty state.
        let empty = tempfile::tempdir().unwrap();
        assert_eq!(
            restore(empty.path(), PolicyName::Static).unwrap(),
            State::default()
        );
    }
}
