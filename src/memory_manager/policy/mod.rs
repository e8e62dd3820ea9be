//! The memory manager's `Static` policy, as the kubelet's
//! (pkg/kubelet/cm/memorymanager/policy_static.go): each NUMA node's memory
//! and huge pages as a table (total, reserved for the system, allocatable,
//! given, free), the NUMA nodes a Guaranteed container's memory is taken
//! from (its blocks), single-node or a group of nodes used only together,
//! and the topology hints for them. Pure: the manager keeps the state and
//! checkpoints it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};
use serde::{Deserialize, Serialize};

use crate::pod_core::qos::{QosClass, qos_class};
use crate::topology_manager::{Hint, NumaMask};

/// One resource's memory on one NUMA node, bytes (`MemoryTable`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryTable {
    /// All of it.
    #[serde(rename = "total")]
    pub total: u64,
    /// Held for the system (`reservedMemory`).
    pub system_reserved: u64,
    /// What containers may be given: total less the system's (and, for
    /// `memory`, less the node's huge pages).
    pub allocatable: u64,
    /// Given to containers.
    pub reserved: u64,
    /// Allocatable and not given.
    pub free: u64,
}

/// One NUMA node (`NUMANodeState`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeState {
    /// Blocks on the node, counted once per resource.
    pub number_of_assignments: u64,
    /// Resource name (`memory`, `hugepages-2Mi`) to its table.
    pub memory_map: BTreeMap<String, MemoryTable>,
    /// The nodes this one is used with: itself alone, or its group.
    pub cells: Vec<usize>,
}

/// The NUMA nodes by ID.
pub type MachineState = BTreeMap<usize, NodeState>;

/// Memory a container was given (`Block`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Block {
    /// The nodes it is taken from.
    pub numa_affinity: Vec<usize>,
    /// The resource.
    #[serde(rename = "type")]
    pub type_: String,
    /// Bytes.
    pub size: u64,
}

/// What the manager checkpoints: the machine and each container's blocks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// The NUMA nodes.
    pub machine: MachineState,
    /// Pod UID → container name → its blocks.
    pub entries: BTreeMap<String, BTreeMap<String, Vec<Block>>>,
}

/// One NUMA node of the machine: its memory and its huge page pools.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NumaMemory {
    /// Memory, bytes.
    pub memory: u64,
    /// Huge page resource name (`hugepages-2Mi`) to the pool's bytes.
    pub hugepages: BTreeMap<String, u64>,
}

/// The static policy: the machine and what `reservedMemory` holds back.
#[derive(Clone, Debug)]
pub struct StaticPolicy {
    machine: BTreeMap<usize, NumaMemory>,
    /// NUMA node → resource → bytes reserved for the system.
    reserved: BTreeMap<usize, BTreeMap<String, u64>>,
    /// Pod UID → mask → resource → bytes its regular init containers
    /// leave for its next containers (`initContainersReusableMemory`).
    reuse: BTreeMap<String, BTreeMap<u64, BTreeMap<String, u64>>>,
}

/// The message of an allocation that found no node.
pub const NO_DEFAULT_HINT: &str = "[memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available";

impl StaticPolicy {
    /// The policy of `machine` with `reserved` held back.
    ///
    /// # Errors
    /// The kubelet's `[memorymanager] you should specify the system
    /// reserved memory` when no `memory` is reserved.
    pub fn new(
        machine: BTreeMap<usize, NumaMemory>,
        reserved: BTreeMap<usize, BTreeMap<String, u64>>,
    ) -> Result<Self, String> {
        let total: u64 = reserved.values().filter_map(|r| r.get("memory")).sum();
        if total == 0 {
            return Err("[memorymanager] you should specify the system reserved memory".into());
        }
        Ok(Self {
            machine,
            reserved,
            reuse: BTreeMap::new(),
        })
    }

    fn system_reserved(&self, node: usize, resource: &str) -> u64 {
        self.reserved
            .get(&node)
            .and_then(|r| r.get(resource))
            .copied()
            .unwrap_or(0)
    }

    /// The machine with nothing given (`getDefaultMachineState`).
    #[must_use]
    pub fn default_machine(&self) -> MachineState {
        let mut out = MachineState::new();
        for (id, node) in &self.machine {
            let mut state = NodeState {
                cells: vec![*id],
                ..NodeState::default()
            };
            let mut pages = 0u64;
            for (name, total) in &node.hugepages {
                let system = self.system_reserved(*id, name);
                let allocatable = total.saturating_sub(system);
                state.memory_map.insert(
                    name.clone(),
                    MemoryTable {
                        total: *total,
                        system_reserved: system,
                        allocatable,
                        reserved: 0,
                        free: allocatable,
                    },
                );
                pages = pages.saturating_add(*total);
            }
            let system = self.system_reserved(*id, "memory");
            let allocatable = node.memory.saturating_sub(system).saturating_sub(pages);
            state.memory_map.insert(
                "memory".into(),
                MemoryTable {
                    total: node.memory,
                    system_reserved: system,
                    allocatable,
                    reserved: 0,
                    free: allocatable,
                },
            );
            out.insert(*id, state);
        }
        out
    }

    /// Fills an empty state and checks a restored one against the machine
    /// and its blocks (`validateState`).
    ///
    /// # Errors
    /// The kubelet's messages for a state that does not fit.
    pub fn start(&self, state: &mut State) -> Result<(), String> {
        if state.machine.is_empty() {
            if state.entries.values().any(|c| !c.is_empty()) {
                return Err(
                    "[memorymanager] machine state can not be empty when it has memory assignments"
                        .into(),
                );
            }
            state.machine = self.default_machine();
            return Ok(());
        }
        let mut expected = self.default_machine();
        for (uid, containers) in &state.entries {
            for (name, blocks) in containers {
                for b in blocks {
                    for n in &b.numa_affinity {
                        let Some(node) = expected.get(n) else {
                            return Err(format!(
                                "[memorymanager] (pod: {uid}, container: {name}) the memory assignment uses the NUMA that does not exist"
                            ));
                        };
                        if !node.memory_map.contains_key(&b.type_) {
                            return Err(format!(
                                "[memorymanager] (pod: {uid}, container: {name}) the memory assignment uses memory resource that does not exist"
                            ));
                        }
                    }
                    update_machine(&mut expected, &b.numa_affinity, &b.type_, b.size);
                }
            }
        }
        if !machines_agree(&expected, &state.machine) {
            return Err(
                "[memorymanager] the expected machine state is different from the real one".into(),
            );
        }
        Ok(())
    }

    /// `calculateHints`: for each resource asked for, the sets of NUMA
    /// nodes whose free memory (with what the pod's init containers leave)
    /// holds it, respecting the groups nodes are used in; preferred are
    /// those of the fewest nodes whose allocatable memory could hold it. A
    /// resource no set holds has no entry.
    #[must_use]
    pub fn calculate_hints(
        &self,
        machine: &MachineState,
        uid: &str,
        requested: &BTreeMap<String, u64>,
    ) -> BTreeMap<String, Vec<Hint>> {
        let nodes: Vec<usize> = machine.keys().copied().collect();
        let mut min_size = nodes.len();
        let mut masks = Vec::new();
        for mask in NumaMask::subsets(&nodes) {
            let bits = mask.nodes();
            let sum = |f: fn(&MemoryTable) -> u64, r: &str| -> u64 {
                bits.iter()
                    .filter_map(|n| machine.get(n).and_then(|s| s.memory_map.get(r)))
                    .map(f)
                    .fold(0u64, u64::saturating_add)
            };
            if requested
                .iter()
                .any(|(r, size)| sum(|t| t.allocatable, r) < *size)
            {
                continue;
            }
            min_size = min_size.min(bits.len());
            if bits.len() == 1 && machine[&bits[0]].cells.len() > 1 {
                continue;
            }
            if bits.len() > 1
                && bits.iter().any(|n| {
                    let s = &machine[n];
                    s.number_of_assignments > 0
                        && (s.cells.len() == 1 || !same_group(&s.cells, &bits))
                })
            {
                continue;
            }
            if requested.iter().any(|(r, size)| {
                sum(|t| t.free, r).saturating_add(self.reusable(uid, mask, r)) < *size
            }) {
                continue;
            }
            masks.push(mask);
        }
        let hints: Vec<Hint> = masks
            .into_iter()
            .map(|m| Hint {
                affinity: Some(m),
                preferred: m.count() as usize == min_size,
            })
            .collect();
        if hints.is_empty() {
            return BTreeMap::new();
        }
        requested
            .keys()
            .map(|r| (r.clone(), hints.clone()))
            .collect()
    }

    fn reusable(&self, uid: &str, mask: NumaMask, resource: &str) -> u64 {
        self.reuse
            .get(uid)
            .and_then(|m| m.get(&mask.0))
            .and_then(|r| r.get(resource))
            .copied()
            .unwrap_or(0)
    }

    /// The hints of container `c` (`GetTopologyHints`): `None` when it asks
    /// for no memory of its own (not Guaranteed, no request).
    #[must_use]
    pub fn hints(
        &self,
        state: &State,
        pod: &Pod,
        c: &Container,
    ) -> Option<BTreeMap<String, Vec<Hint>>> {
        if !managed(pod) {
            return None;
        }
        let requested = container_requests(c).ok()?;
        if requested.is_empty() {
            return None;
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if let Some(blocks) = state.entries.get(uid).and_then(|e| e.get(&c.name)) {
            return regenerate(blocks, &requested);
        }
        Some(self.calculate_hints(&state.machine, uid, &requested))
    }

    /// The hints of the whole pod (`GetPodTopologyHints`).
    #[must_use]
    pub fn pod_hints(&self, state: &State, pod: &Pod) -> Option<BTreeMap<String, Vec<Hint>>> {
        if !managed(pod) {
            return None;
        }
        let requested = pod_requests(pod).ok()?;
        if requested.is_empty() {
            return None;
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        for c in containers(pod) {
            if let Some(blocks) = state.entries.get(uid).and_then(|e| e.get(&c.name)) {
                return regenerate(blocks, &requested);
            }
        }
        Some(self.calculate_hints(&state.machine, uid, &requested))
    }

    /// The best of `calculate_hints`' `memory` hints (`findBestHint`).
    fn best(hints: &BTreeMap<String, Vec<Hint>>, within: Option<NumaMask>) -> Option<Hint> {
        let mut best: Option<Hint> = None;
        for h in hints.get("memory").into_iter().flatten() {
            let Some(m) = h.affinity else { continue };
            if within.is_some_and(|w| !w.is_subset_of(m)) {
                continue;
            }
            best = match best {
                None => Some(*h),
                Some(b) if h.preferred && !b.preferred => Some(*h),
                Some(b)
                    if h.preferred == b.preferred
                        && b.affinity.is_some_and(|bm| m.is_narrower_than(bm)) =>
                {
                    Some(*h)
                }
                keep => keep,
            };
        }
        best
    }

    /// Gives container `c` its memory blocks on `hint`'s nodes, extended to
    /// more nodes when they do not hold it (`Allocate`); returns them.
    ///
    /// # Errors
    /// The kubelet's `[memorymanager] …` messages.
    pub fn allocate(
        &mut self,
        state: &mut State,
        pod: &Pod,
        c: &Container,
        hint: Hint,
    ) -> Result<Option<Vec<Block>>, String> {
        if !managed(pod) {
            return Ok(None);
        }
        let requested = container_requests(c)?;
        if requested.is_empty() {
            return Ok(None);
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if let Some(blocks) = state
            .entries
            .get(&uid)
            .and_then(|e| e.get(&c.name))
            .cloned()
        {
            self.update_reuse(pod, c, &blocks);
            return Ok(Some(blocks));
        }
        let mut best = hint;
        if hint.affinity.is_none() {
            let hints = self.calculate_hints(&state.machine, &uid, &requested);
            let Some(default) = Self::best(&hints, None).filter(|_| !hints.is_empty()) else {
                return Err(NO_DEFAULT_HINT.into());
            };
            if !default.preferred && hint.preferred {
                return Err("[memorymanager] failed to find the default preferred hint".into());
            }
            best = default;
        }
        let mask = best.affinity.unwrap_or_default();
        if !satisfies(&state.machine, mask, &requested) {
            let hints = self.calculate_hints(&state.machine, &uid, &requested);
            let Some(extended) = Self::best(&hints, Some(mask)) else {
                return Err(
                    "[memorymanager] failed to find NUMA nodes to extend the current topology hint"
                        .into(),
                );
            };
            if !extended.preferred && best.preferred {
                return Err("[memorymanager] failed to find the extended preferred hint".into());
            }
            best = extended;
        }
        let mask = best.affinity.unwrap_or_default();
        if violates(&state.machine, mask) {
            return Err("[memorymanager] preferred hint violates NUMA node allocation".into());
        }
        let bits = mask.nodes();
        let mut blocks = Vec::new();
        for (r, size) in &requested {
            blocks.push(Block {
                numa_affinity: bits.clone(),
                type_: r.clone(),
                size: *size,
            });
            let charged = size.saturating_sub(self.reusable(&uid, mask, r));
            update_machine(&mut state.machine, &bits, r, charged);
        }
        self.update_reuse(pod, c, &blocks);
        state
            .entries
            .entry(uid.clone())
            .or_default()
            .insert(c.name.clone(), blocks.clone());
        shrink_init_blocks(state, pod, c, &blocks);
        Ok(Some(blocks))
    }

    /// `updatePodReusableMemory`.
    fn update_reuse(&mut self, pod: &Pod, c: &Container, blocks: &[Block]) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.reuse.retain(|k, _| *k == uid);
        let regular_init = pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_ref())
            .and_then(|i| i.iter().find(|i| i.name == c.name))
            .is_some_and(|i| !crate::pod_core::spec::is_sidecar(i));
        let pod_reuse = self.reuse.entry(uid).or_default();
        for b in blocks {
            let mask = NumaMask::of(&b.numa_affinity).0;
            if regular_init {
                let slot = pod_reuse
                    .entry(mask)
                    .or_default()
                    .entry(b.type_.clone())
                    .or_default();
                *slot = (*slot).max(b.size);
            } else if let Some(slot) = pod_reuse.get_mut(&mask).and_then(|m| m.get_mut(&b.type_)) {
                *slot = slot.saturating_sub(b.size);
            }
        }
    }

    /// Returns a container's blocks to the nodes (`RemoveContainer`).
    pub fn remove_container(&mut self, state: &mut State, uid: &str, name: &str) {
        let Some(containers) = state.entries.get_mut(uid) else {
            return;
        };
        let Some(blocks) = containers.remove(name) else {
            return;
        };
        if containers.is_empty() {
            state.entries.remove(uid);
        }
        for b in blocks {
            let mut released = b.size;
            for n in &b.numa_affinity {
                let Some(node) = state.machine.get_mut(n) else {
                    continue;
                };
                node.number_of_assignments = node.number_of_assignments.saturating_sub(1);
                if node.number_of_assignments == 0 {
                    node.cells = vec![*n];
                }
                if released == 0 {
                    continue;
                }
                let Some(t) = node.memory_map.get_mut(&b.type_) else {
                    continue;
                };
                let back = released.min(t.reserved);
                t.reserved -= back;
                t.free = t.free.saturating_add(back);
                released -= back;
            }
        }
    }

    /// Each node's allocatable memory of each resource (`GetAllocatableMemory`).
    #[must_use]
    pub fn allocatable(state: &State) -> Vec<Block> {
        let mut out = Vec::new();
        for (n, node) in &state.machine {
            for (r, t) in &node.memory_map {
                if t.allocatable > 0 {
                    out.push(Block {
                        numa_affinity: vec![*n],
                        type_: r.clone(),
                        size: t.allocatable,
                    });
                }
            }
        }
        out
    }
}

/// A Guaranteed pod without pod-level resources (the only pods the policy
/// gives memory to; pod-level managers are behind an alpha gate).
#[must_use]
pub fn managed(pod: &Pod) -> bool {
    qos_class(pod) == QosClass::Guaranteed
        && pod.spec.as_ref().is_none_or(|s| s.resources.is_none())
}

fn containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
    })
}

/// `memory` and `hugepages-*` requests of a container, bytes
/// (`getContainerRequestedResources`).
///
/// # Errors
/// `[memorymanager] failed to represent quantity as int64`.
pub fn container_requests(c: &Container) -> Result<BTreeMap<String, u64>, String> {
    let mut out = BTreeMap::new();
    let requests = c.resources.as_ref().and_then(|r| r.requests.as_ref());
    for (name, q) in requests.into_iter().flatten() {
        if name != "memory" && !name.starts_with("hugepages-") {
            continue;
        }
        let value = crate::resource::Quantity::parse(&q.0)
            .ok()
            .map(crate::resource::Quantity::value)
            .and_then(|v| i64::try_from(v).ok())
            .and_then(|v| u64::try_from(v).ok())
            .ok_or("[memorymanager] failed to represent quantity as int64")?;
        out.insert(name.clone(), value);
    }
    Ok(out)
}

/// What a pod needs at once (`getPodRequestedResources`): the most of an
/// init container beside the sidecars before it, or all app containers
/// and sidecars together.
///
/// # Errors
/// As [`container_requests`].
pub fn pod_requests(pod: &Pod) -> Result<BTreeMap<String, u64>, String> {
    let Some(spec) = &pod.spec else {
        return Ok(BTreeMap::new());
    };
    let mut init: BTreeMap<String, u64> = BTreeMap::new();
    let mut sidecars: BTreeMap<String, u64> = BTreeMap::new();
    for c in spec.init_containers.iter().flatten() {
        for (r, q) in container_requests(c)? {
            let side = sidecars.entry(r.clone()).or_default();
            let top = init.entry(r).or_default();
            if crate::pod_core::spec::is_sidecar(c) {
                *side = side.saturating_add(q);
            } else {
                *top = (*top).max(side.saturating_add(q));
            }
        }
    }
    let mut apps: BTreeMap<String, u64> = BTreeMap::new();
    for c in &spec.containers {
        for (r, q) in container_requests(c)? {
            let slot = apps.entry(r).or_default();
            *slot = slot.saturating_add(q);
        }
    }
    Ok(apps
        .into_iter()
        .map(|(r, q)| {
            let long = q.saturating_add(sidecars.get(&r).copied().unwrap_or(0));
            let need = long.max(init.get(&r).copied().unwrap_or(0));
            (r, need)
        })
        .collect())
}

/// `regenerateHints`: one preferred hint per block that matches the
/// request; `None` when the blocks do not.
fn regenerate(
    blocks: &[Block],
    requested: &BTreeMap<String, u64>,
) -> Option<BTreeMap<String, Vec<Hint>>> {
    if blocks.len() != requested.len() {
        return None;
    }
    let mut hints: BTreeMap<String, Vec<Hint>> =
        requested.keys().map(|r| (r.clone(), Vec::new())).collect();
    for b in blocks {
        if requested.get(&b.type_) != Some(&b.size) {
            return None;
        }
        hints
            .entry(b.type_.clone())
            .or_default()
            .push(Hint::new(&b.numa_affinity, true));
    }
    Some(hints)
}

fn same_group(a: &[usize], b: &[usize]) -> bool {
    let (mut a, mut b) = (a.to_vec(), b.to_vec());
    a.sort_unstable();
    b.sort_unstable();
    a == b
}

/// True when the nodes of `mask` hold every request free
/// (`isAffinitySatisfyRequest`).
fn satisfies(machine: &MachineState, mask: NumaMask, requested: &BTreeMap<String, u64>) -> bool {
    requested.iter().all(|(r, size)| {
        let free: u64 = mask
            .nodes()
            .iter()
            .filter_map(|n| machine.get(n).and_then(|s| s.memory_map.get(r)))
            .map(|t| t.free)
            .fold(0, u64::saturating_add);
        free >= *size
    })
}

/// `isAffinityViolatingNUMAAllocations`.
fn violates(machine: &MachineState, mask: NumaMask) -> bool {
    let bits = mask.nodes();
    if bits.len() == 1 {
        return false;
    }
    bits.iter().any(|n| {
        machine.get(n).is_some_and(|s| {
            s.number_of_assignments > 0 && (s.cells.len() == 1 || !same_group(&s.cells, &bits))
        })
    })
}

/// `updateMachineState`: each node of `bits` counts the block and joins the
/// group; `size` bytes move from free to reserved, node by node.
fn update_machine(machine: &mut MachineState, bits: &[usize], resource: &str, size: u64) {
    let mut left = size;
    for n in bits {
        let Some(node) = machine.get_mut(n) else {
            continue;
        };
        node.number_of_assignments += 1;
        node.cells = bits.to_vec();
        if left == 0 {
            continue;
        }
        let Some(t) = node.memory_map.get_mut(resource) else {
            continue;
        };
        let take = left.min(t.free);
        t.free -= take;
        t.reserved = t.reserved.saturating_add(take);
        left -= take;
    }
}

/// `updateInitContainersMemoryBlocks`: what an app container reuses of the
/// regular init containers before it shrinks their blocks.
fn shrink_init_blocks(state: &mut State, pod: &Pod, c: &Container, blocks: &[Block]) {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let inits: Vec<&Container> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .collect();
    for b in blocks {
        let mut left = b.size;
        for init in &inits {
            if init.name == c.name || left == 0 {
                break;
            }
            if crate::pod_core::spec::is_sidecar(init) {
                continue;
            }
            let Some(theirs) = state
                .entries
                .get_mut(&uid)
                .and_then(|e| e.get_mut(&init.name))
            else {
                continue;
            };
            for ib in theirs.iter_mut() {
                if ib.size == 0
                    || ib.type_ != b.type_
                    || NumaMask::of(&ib.numa_affinity) != NumaMask::of(&b.numa_affinity)
                {
                    continue;
                }
                let take = left.min(ib.size);
                ib.size -= take;
                left -= take;
            }
        }
    }
}

/// The machine states agree in what `validateState` compares: each node's
/// assignments, cells and every table.
fn machines_agree(a: &MachineState, b: &MachineState) -> bool {
    a.len() == b.len()
        && a.iter().all(|(n, x)| {
            b.get(n).is_some_and(|y| {
                x.number_of_assignments == y.number_of_assignments
                    && same_group(&x.cells, &y.cells)
                    && x.memory_map == y.memory_map
            })
        })
}

#[cfg(test)]
mod tests;
