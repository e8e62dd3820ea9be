//! The memory manager, as the kubelet's (pkg/kubelet/cm/memorymanager):
//! with the `Static` policy, a Guaranteed container's memory and huge pages
//! are taken from the NUMA nodes the topology manager chose (its blocks,
//! [`policy`]), and the container is created with `cpuset.mems` on those
//! nodes (CRI `cpuset_mems`, the kubelet's `PreCreateContainer`). With
//! `None` (the default) nothing is pinned. The state lives in
//! `<root-dir>/memory_manager_state` ([`state`]), in the kubelet's format.

pub mod policy;
pub mod state;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::{Container, Pod};
use tracing::{info, warn};

pub use policy::{Block, NumaMemory};
use policy::{State, StaticPolicy};

use crate::topology_manager::Hint;

struct Inner {
    policy: Option<StaticPolicy>,
    state: State,
}

/// The memory manager; cheap to clone.
#[derive(Clone)]
pub struct MemoryManager {
    name: &'static str,
    dir: PathBuf,
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for MemoryManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryManager")
            .field("policy", &self.name)
            .finish_non_exhaustive()
    }
}

/// The machine's NUMA nodes' memory and huge page pools, from sysfs under
/// `sys` (`devices/system/node/nodeN/meminfo` and `hugepages/`); one node 0
/// of `fallback_memory` bytes when the kernel lists none.
#[must_use]
pub fn discover(
    sys: &Path,
    fallback_memory: u64,
    fallback_pages: &[(u64, u64)],
) -> BTreeMap<usize, NumaMemory> {
    let pages = |pools: &[(u64, u64)]| -> BTreeMap<String, u64> {
        pools
            .iter()
            .map(|(kib, n)| {
                (
                    format!(
                        "hugepages-{}",
                        crate::config::binary_quantity(kib.saturating_mul(1024))
                    ),
                    kib.saturating_mul(1024).saturating_mul(*n),
                )
            })
            .collect()
    };
    let mut out = BTreeMap::new();
    let dir = sys.join("devices/system/node");
    for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(id) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let meminfo = std::fs::read_to_string(entry.path().join("meminfo")).unwrap_or_default();
        let kib = meminfo
            .lines()
            .find(|l| l.contains("MemTotal:"))
            .and_then(|l| l.split_whitespace().rev().nth(1))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        let pools = crate::node::info::huge_pages(&entry.path().join("hugepages"));
        out.insert(
            id,
            NumaMemory {
                memory: kib.saturating_mul(1024),
                hugepages: pages(&pools),
            },
        );
    }
    if out.is_empty() {
        out.insert(
            0,
            NumaMemory {
                memory: fallback_memory,
                hugepages: pages(fallback_pages),
            },
        );
    }
    out
}

/// `reservedMemory` as bytes per node and resource, checked as the
/// kubelet's `getSystemReservedMemory`: every node named must exist, and
/// each type's total must equal what node allocatable holds back for it
/// (`held`: resource → bytes of kubeReserved, systemReserved and the hard
/// eviction threshold).
///
/// # Errors
/// The kubelet's messages.
pub fn reserved_by_node(
    reserved: &[crate::config::ReservedMemory],
    nodes: &BTreeMap<usize, NumaMemory>,
    held: &BTreeMap<String, u64>,
) -> Result<BTreeMap<usize, BTreeMap<String, u64>>, String> {
    let mut out: BTreeMap<usize, BTreeMap<String, u64>> = BTreeMap::new();
    let mut totals: BTreeMap<String, u64> = BTreeMap::new();
    for r in reserved {
        let node = usize::try_from(r.numa_node).ok().filter(|n| nodes.contains_key(n)).ok_or_else(|| {
            format!(
                "the reserved memory configuration references a NUMA node {} that does not exist on this machine",
                r.numa_node
            )
        })?;
        for (name, q) in &r.limits {
            let bytes = crate::resource::Quantity::parse(q)
                .ok()
                .and_then(|q| u64::try_from(q.value()).ok())
                .ok_or("could not covert a variable of type Quantity to int64")?;
            out.entry(node).or_default().insert(name.clone(), bytes);
            let t = totals.entry(name.clone()).or_default();
            *t = t.saturating_add(bytes);
        }
    }
    let mut kinds: Vec<&String> = totals.keys().chain(held.keys()).collect();
    kinds.sort();
    kinds.dedup();
    for kind in kinds {
        let (mine, theirs) = (
            totals.get(kind).copied().unwrap_or(0),
            held.get(kind).copied().unwrap_or(0),
        );
        if mine != theirs {
            let show = |b: u64| {
                if b == 0 {
                    "0".to_string()
                } else {
                    crate::config::binary_quantity(b)
                }
            };
            return Err(format!(
                "the total amount {:?} of type {kind:?} is not equal to the value {:?} determined by Node Allocatable feature",
                show(mine),
                show(theirs)
            ));
        }
    }
    Ok(out)
}

impl MemoryManager {
    /// The manager of policy `name` (`None` or `Static`) on `machine`, with
    /// `reserved` held back per node, its state restored from `root_dir`
    /// and checked.
    ///
    /// # Errors
    /// The kubelet's messages: no memory reserved under `Static`, a
    /// checkpoint of another policy, or one that does not fit the machine;
    /// and, under `Static`, a machine with a NUMA node numbered 16 or more
    /// (the hints weigh every set of nodes).
    pub fn new(
        name: &str,
        machine: BTreeMap<usize, NumaMemory>,
        reserved: BTreeMap<usize, BTreeMap<String, u64>>,
        root_dir: &Path,
    ) -> Result<Self, String> {
        let (name, policy) = if name == "Static" {
            let max = crate::topology_manager::policy::MAX_NUMA_NODES;
            if machine.len() > max || machine.keys().any(|n| *n >= max) {
                return Err(format!(
                    "the Static memory manager policy handles NUMA nodes 0 to {} (each set of them is weighed); this machine has {} nodes up to {}",
                    max - 1,
                    machine.len(),
                    machine.keys().last().copied().unwrap_or(0)
                ));
            }
            ("Static", Some(StaticPolicy::new(machine, reserved)?))
        } else {
            ("None", None)
        };
        let mut state = state::restore(root_dir, name)?;
        if let Some(p) = &policy {
            p.start(&mut state)
                .map_err(|e| format!("start memory manager error: {e}"))?;
            info!(nodes = state.machine.len(), "memory manager: static policy");
        }
        state::save(root_dir, name, &state)
            .map_err(|e| format!("write {}: {e}", root_dir.join(state::FILE).display()))?;
        Ok(Self {
            name,
            dir: root_dir.to_path_buf(),
            inner: Arc::new(Mutex::new(Inner { policy, state })),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// True under the `Static` policy.
    #[must_use]
    pub fn is_static(&self) -> bool {
        self.name == "Static"
    }

    /// The memory hints of container `c` (`None`: no preference).
    #[must_use]
    pub fn hints(&self, pod: &Pod, c: &Container) -> Option<BTreeMap<String, Vec<Hint>>> {
        let inner = self.lock();
        inner.policy.as_ref()?.hints(&inner.state, pod, c)
    }

    /// The memory hints of the whole pod.
    #[must_use]
    pub fn pod_hints(&self, pod: &Pod) -> Option<BTreeMap<String, Vec<Hint>>> {
        let inner = self.lock();
        inner.policy.as_ref()?.pod_hints(&inner.state, pod)
    }

    /// Gives container `c` its blocks along `hint` and writes the
    /// checkpoint; counts it in `kubelet_memory_manager_pinning_*_total`
    /// when it asks for memory of its own, as the kubelet.
    ///
    /// # Errors
    /// The kubelet's `[memorymanager] …` message.
    pub fn allocate(&self, pod: &Pod, c: &Container, hint: Hint) -> Result<(), String> {
        let mut inner = self.lock();
        let Inner { policy, state } = &mut *inner;
        let Some(policy) = policy else { return Ok(()) };
        let pins =
            policy::managed(pod) && policy::container_requests(c).is_ok_and(|r| !r.is_empty());
        if pins {
            crate::metrics::metrics()
                .memory_manager_pinning_requests
                .inc();
        }
        let given = policy.allocate(state, pod, c, hint).inspect_err(|_| {
            if pins {
                crate::metrics::metrics()
                    .memory_manager_pinning_errors
                    .inc();
            }
        })?;
        if let Some(blocks) = given {
            let nodes: Vec<usize> = blocks
                .first()
                .map(|b| b.numa_affinity.clone())
                .unwrap_or_default();
            info!(pod = pod.metadata.name.as_deref().unwrap_or_default(), container = %c.name, ?nodes, "memory pinned");
        }
        self.save(&inner);
        Ok(())
    }

    fn save(&self, inner: &Inner) {
        if let Err(e) = state::save(&self.dir, self.name, &inner.state) {
            warn!(error = %e, "memory manager checkpoint not written");
        }
    }

    /// The `cpuset.mems` of container `name` of pod `uid`: the NUMA nodes
    /// of its blocks, lowest first, comma-separated; `None` without blocks.
    #[must_use]
    pub fn cpuset_mems(&self, uid: &str, name: &str) -> Option<String> {
        let inner = self.lock();
        let blocks = inner.state.entries.get(uid)?.get(name)?;
        let mut nodes: Vec<usize> = blocks
            .iter()
            .flat_map(|b| b.numa_affinity.iter().copied())
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        (!nodes.is_empty()).then(|| {
            nodes
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        })
    }

    /// The blocks of container `name` of pod `uid` (the pod resources API's
    /// `memory`).
    #[must_use]
    pub fn blocks(&self, uid: &str, name: &str) -> Vec<Block> {
        self.lock()
            .state
            .entries
            .get(uid)
            .and_then(|e| e.get(name))
            .cloned()
            .unwrap_or_default()
    }

    /// Each node's allocatable memory (`GetAllocatableMemory`); empty under
    /// `None`.
    #[must_use]
    pub fn allocatable(&self) -> Vec<Block> {
        let inner = self.lock();
        if inner.policy.is_none() {
            return Vec::new();
        }
        StaticPolicy::allocatable(&inner.state)
    }

    /// Returns the blocks of containers whose pod is not `active` (by UID,
    /// with its container names), as `removeStaleState`.
    pub fn remove_stale(&self, active: &BTreeMap<String, Vec<String>>) {
        let mut inner = self.lock();
        let Inner { policy, state } = &mut *inner;
        let Some(policy) = policy else { return };
        let stale: Vec<(String, String)> = state
            .entries
            .iter()
            .flat_map(|(uid, cs)| cs.keys().map(move |c| (uid.clone(), c.clone())))
            .filter(|(uid, c)| !active.get(uid).is_some_and(|names| names.contains(c)))
            .collect();
        if stale.is_empty() {
            return;
        }
        for (uid, c) in &stale {
            policy.remove_container(state, uid, c);
        }
        self.save(&inner);
    }

    /// Returns the blocks of every container of pod `uid`.
    pub fn remove_pod(&self, uid: &str) {
        let mut inner = self.lock();
        let Inner { policy, state } = &mut *inner;
        let Some(policy) = policy else { return };
        let names: Vec<String> = state
            .entries
            .get(uid)
            .map(|c| c.keys().cloned().collect())
            .unwrap_or_default();
        for c in names {
            policy.remove_container(state, uid, &c);
        }
        self.save(&inner);
    }
}

#[cfg(test)]
mod tests;
