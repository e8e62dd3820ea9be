//! The memory manager's checkpoint, `<root-dir>/memory_manager_state`, in
//! the kubelet's format (pkg/kubelet/cm/memorymanager/state, format V3: the
//! V1 fields beside `data` and `dataChecksum`), checksums and all.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::policy::{Block, MachineState, State};
use crate::cpu_manager::state::fnv1a32;

/// The checkpoint's file name.
pub const FILE: &str = "memory_manager_state";
/// The most of the file read, bytes.
pub const MAX_BYTES: u64 = 4 << 20;

type Entries = BTreeMap<String, BTreeMap<String, Vec<Block>>>;

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Data {
    policy_name: String,
    machine_state: MachineState,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    entries: Entries,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Checkpoint {
    policy_name: String,
    #[serde(default)]
    machine_state: MachineState,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    entries: Entries,
    #[serde(default)]
    checksum: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    data: String,
    #[serde(default)]
    data_checksum: u32,
}

/// A slice of ints as go-spew prints one inside `%#v`: `[0 1]`.
fn ints(v: &[usize]) -> String {
    let parts: Vec<String> = v.iter().map(ToString::to_string).collect();
    format!("[{}]", parts.join(" "))
}

/// The V1 checksum: FNV-1a of the go-spew text of the checkpoint with a
/// zero checksum.
fn legacy_checksum(policy: &str, machine: &MachineState, entries: &Entries) -> u32 {
    let nodes: Vec<String> = machine
        .iter()
        .map(|(id, n)| {
            let tables: Vec<String> = n
                .memory_map
                .iter()
                .map(|(r, t)| {
                    format!(
                        "{r}:<*>{{TotalMemSize:(uint64){} SystemReserved:(uint64){} Allocatable:(uint64){} Reserved:(uint64){} Free:(uint64){}}}",
                        t.total, t.system_reserved, t.allocatable, t.reserved, t.free
                    )
                })
                .collect();
            format!(
                "{id}:<*>{{NumberOfAssignments:(int){} MemoryMap:(map[v1.ResourceName]*state.MemoryTable)map[{}] Cells:([]int){}}}",
                n.number_of_assignments,
                tables.join(" "),
                ints(&n.cells)
            )
        })
        .collect();
    let pods: Vec<String> = entries
        .iter()
        .map(|(uid, cs)| {
            let cs: Vec<String> = cs
                .iter()
                .map(|(c, blocks)| {
                    let bs: Vec<String> = blocks
                        .iter()
                        .map(|b| {
                            format!(
                                "{{NUMAAffinity:([]int){} Type:(v1.ResourceName){} Size:(uint64){}}}",
                                ints(&b.numa_affinity),
                                b.type_,
                                b.size
                            )
                        })
                        .collect();
                    format!("{c}:[{}]", bs.join(" "))
                })
                .collect();
            format!("{uid}:map[{}]", cs.join(" "))
        })
        .collect();
    let text = format!(
        "(*state.MemoryManagerCheckpoint){{PolicyName:(string){policy} MachineState:(state.NUMANodeMap)map[{}] Entries:(state.ContainerMemoryAssignments)map[{}] Checksum:(checksum.Checksum)0}}",
        nodes.join(" "),
        pods.join(" ")
    );
    fnv1a32(text.as_bytes())
}

/// The checkpoint's text for policy `policy` (`None`, `Static`).
#[must_use]
pub fn encode(policy: &str, state: &State) -> String {
    let data = Data {
        policy_name: policy.into(),
        machine_state: state.machine.clone(),
        entries: state.entries.clone(),
    };
    let data = serde_json::to_string(&data).unwrap_or_default();
    let file = Checkpoint {
        policy_name: policy.into(),
        checksum: legacy_checksum(policy, &state.machine, &state.entries),
        machine_state: state.machine.clone(),
        entries: state.entries.clone(),
        data_checksum: fnv1a32(format!("(string){data}").as_bytes()),
        data,
    };
    serde_json::to_string(&file).unwrap_or_default()
}

/// Reads a checkpoint's text for `policy` (V3; else V1/V2, whose checksum
/// of 0 is accepted).
///
/// # Errors
/// The kubelet's message for a corrupted file or another policy.
pub fn decode(policy: &str, text: &str) -> Result<State, String> {
    let file: Checkpoint =
        serde_json::from_str(text).map_err(|e| format!("checkpoint is corrupted: {e}"))?;
    let (name, machine, entries) = if file.data.is_empty() && file.data_checksum == 0 {
        if file.checksum != 0
            && file.checksum
                != legacy_checksum(&file.policy_name, &file.machine_state, &file.entries)
        {
            return Err("checkpoint is corrupted".into());
        }
        (file.policy_name, file.machine_state, file.entries)
    } else {
        if fnv1a32(format!("(string){}", file.data).as_bytes()) != file.data_checksum {
            return Err("could not load v3 checkpoint: checkpoint is corrupted".into());
        }
        let data: Data = serde_json::from_str(&file.data).map_err(|e| {
            format!("could not load v3 checkpoint: failed to deserialize memory manager checkpoint data: {e}")
        })?;
        (data.policy_name, data.machine_state, data.entries)
    };
    if name != policy {
        return Err(format!(
            "[memorymanager] configured policy {policy:?} differs from state checkpoint policy {name:?}"
        ));
    }
    Ok(State { machine, entries })
}

fn restore_error(dir: &Path, message: &str) -> String {
    format!(
        "could not restore state from checkpoint: {message}, please drain this node and delete the memory manager checkpoint file {:?} before restarting Kubelet",
        dir.join(FILE)
    )
}

/// Restores the state from `dir/memory_manager_state`; no file is an empty
/// state.
///
/// # Errors
/// The kubelet's message for a file that cannot be read or used.
pub fn restore(dir: &Path, policy: &str) -> Result<State, String> {
    let max = usize::try_from(MAX_BYTES).unwrap_or(usize::MAX);
    let read = crate::container::observe::read_at_most(&dir.join(FILE), max)
        .and_then(|b| String::from_utf8(b).map_err(std::io::Error::other));
    match read {
        Ok(text) => decode(policy, &text).map_err(|e| restore_error(dir, &e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
        Err(e) => Err(restore_error(dir, &e.to_string())),
    }
}

/// Writes the state to `dir/memory_manager_state`, atomically.
///
/// # Errors
/// The file cannot be written.
pub fn save(dir: &Path, policy: &str, state: &State) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{FILE}.tmp"));
    std::fs::write(&tmp, encode(policy, state))?;
    std::fs::rename(&tmp, dir.join(FILE))
}

#[cfg(test)]
mod tests {
    use super::super::policy::{MemoryTable, NodeState};
    use super::*;

    fn vector() -> State {
        let mut machine = MachineState::new();
        machine.insert(
            0,
            NodeState {
                number_of_assignments: 0,
                memory_map: BTreeMap::from([(
                    "memory".to_string(),
                    MemoryTable {
                        total: 2048,
                        system_reserved: 512,
                        allocatable: 1536,
                        reserved: 512,
                        free: 1024,
                    },
                )]),
                cells: Vec::new(),
            },
        );
        let mut entries = Entries::new();
        entries.entry("pod".into()).or_default().insert(
            "container1".into(),
            vec![Block {
                numa_affinity: vec![0],
                type_: "memory".into(),
                size: 512,
            }],
        );
        State { machine, entries }
    }

    #[test]
    fn the_kubelets_checksums_are_reproduced() {
        let s = vector();
        assert_eq!(
            legacy_checksum("static", &s.machine, &s.entries),
            4_215_593_881
        );
        let text = encode("static", &s);
        let file: Checkpoint = serde_json::from_str(&text).unwrap();
        assert_eq!(
            file.data,
            r#"{"policyName":"static","machineState":{"0":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,"free":1024}},"cells":[]}},"entries":{"pod":{"container1":[{"numaAffinity":[0],"type":"memory","size":512}]}}}"#
        );
        assert_eq!(file.data_checksum, 1_849_615_440);
        assert_eq!(decode("static", &text).unwrap(), s);
    }

    #[test]
    fn bad_files_and_other_policies_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(restore(dir.path(), "Static").unwrap(), State::default());
        save(dir.path(), "Static", &vector()).unwrap();
        assert_eq!(restore(dir.path(), "Static").unwrap(), vector());
        let e = restore(dir.path(), "None").unwrap_err();
        assert!(
            e.contains("[memorymanager] configured policy \"None\" differs from state checkpoint policy \"Static\", please drain this node"),
            "{e}"
        );
        let text =
            encode("Static", &vector()).replacen("\\\"free\\\":1024", "\\\"free\\\":1025", 1);
        assert!(decode("Static", &text).unwrap_err().contains("corrupted"));
    }
}
