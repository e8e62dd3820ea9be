//! The CPU manager's policies, as the kubelet's `policy_none.go`,
//! `policy_static.go` and `policy_options.go`: which containers get
//! exclusive CPUs, which, from which pool, and the topology hints for them.
//! Pure: the state is plain data the manager keeps and checkpoints.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod};

pub use super::PolicyName;
use super::assignment;
use super::topology::CpuTopology;
use crate::cpuset::CpuSet;
use crate::pod_core::qos::{QosClass, qos_class};
use crate::topology_manager::{Hint, NumaMask};

/// `cpuManagerPolicyOptions` of the static policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PolicyOptions {
    /// `full-pcpus-only` (GA): only whole physical cores are given.
    pub full_pcpus_only: bool,
    /// `distribute-cpus-across-numa` (beta): an allocation over several
    /// NUMA nodes is spread evenly over them.
    pub distribute_cpus_across_numa: bool,
    /// `strict-cpu-reservation` (GA): the reserved CPUs leave the shared
    /// pool too.
    pub strict_cpu_reservation: bool,
    /// `prefer-align-cpus-by-uncorecache` (GA): whole uncore caches first.
    pub prefer_align_by_uncore_cache: bool,
}

/// The options v1.37 has and their stage: `(name, stage)`.
pub const OPTIONS: [(&str, &str); 6] = [
    ("full-pcpus-only", "GA"),
    ("strict-cpu-reservation", "GA"),
    ("prefer-align-cpus-by-uncorecache", "GA"),
    ("distribute-cpus-across-numa", "beta"),
    ("align-by-socket", "alpha"),
    ("distribute-cpus-across-cores", "alpha"),
];

impl PolicyOptions {
    /// Reads the options as `NewStaticPolicyOptions`; beta options need
    /// `CPUManagerPolicyBetaOptions` (on by default), alpha ones
    /// `CPUManagerPolicyAlphaOptions` (off by default), and with it on they
    /// are still refused by name: this agent does not have them.
    ///
    /// # Errors
    /// The kubelet's message for an unknown option, a stage not enabled, a
    /// value that is not a Go boolean or options that exclude each other.
    pub fn parse(
        options: &BTreeMap<String, String>,
        beta_enabled: bool,
        alpha_enabled: bool,
    ) -> Result<Self, String> {
        let mut out = Self::default();
        for (name, value) in options {
            let Some((_, stage)) = OPTIONS.iter().find(|(n, _)| n == name) else {
                return Err(format!("unknown CPU Manager Policy option: {name:?}"));
            };
            match *stage {
                "alpha" if !alpha_enabled => {
                    return Err(format!(
                        "CPU Manager Policy Alpha-level Options not enabled, but option {name:?} provided"
                    ));
                }
                "alpha" => {
                    return Err(format!(
                        "CPU Manager Policy option {name:?} is alpha and not supported by this agent"
                    ));
                }
                "beta" if !beta_enabled => {
                    return Err(format!(
                        "CPU Manager Policy Beta-level Options not enabled, but option {name:?} provided"
                    ));
                }
                _ => {}
            }
            let on = crate::topology_manager::policy::go_bool(value).ok_or_else(|| {
                format!("bad value for option {name:?}: strconv.ParseBool: parsing {value:?}: invalid syntax")
            })?;
            match name.as_str() {
                "full-pcpus-only" => out.full_pcpus_only = on,
                "strict-cpu-reservation" => out.strict_cpu_reservation = on,
                "prefer-align-cpus-by-uncorecache" => out.prefer_align_by_uncore_cache = on,
                _ => out.distribute_cpus_across_numa = on,
            }
        }
        if out.prefer_align_by_uncore_cache && out.distribute_cpus_across_numa {
            return Err("static policy options prefer-align-cpus-by-uncorecache and distribute-cpus-across-numa can not be used at the same time".into());
        }
        Ok(out)
    }
}

/// Why an allocation failed: the admission reason and message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AllocationError {
    /// `SMTAlignmentError`, or empty for an error without a type of its
    /// own (the pod worker makes it `UnexpectedAdmissionError`).
    pub reason: &'static str,
    /// The kubelet's message.
    pub message: String,
}

/// The state the manager checkpoints: the shared pool and each
/// container's exclusive CPUs (the kubelet's `state.State`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// The shared (default) CPU set.
    pub default: CpuSet,
    /// Pod UID → container name → its exclusive CPUs.
    pub assignments: BTreeMap<String, BTreeMap<String, CpuSet>>,
}

impl State {
    /// The CPUs of a container: its own, else the shared pool
    /// (`GetCPUSetOrDefault`).
    #[must_use]
    pub fn cpuset_or_default(&self, uid: &str, container: &str) -> CpuSet {
        self.assignments
            .get(uid)
            .and_then(|c| c.get(container))
            .cloned()
            .unwrap_or_else(|| self.default.clone())
    }

    /// The exclusive CPUs of a container, if it has any.
    #[must_use]
    pub fn assigned(&self, uid: &str, container: &str) -> Option<&CpuSet> {
        self.assignments.get(uid).and_then(|c| c.get(container))
    }
}

/// The static policy: the machine, the reserved CPUs and the options.
#[derive(Clone, Debug)]
pub struct StaticPolicy {
    topo: CpuTopology,
    reserved: CpuSet,
    /// Every CPU of every core holding a reserved CPU.
    reserved_physical: CpuSet,
    options: PolicyOptions,
    /// Pod UID → the CPUs of its finished init containers, for its next
    /// containers (`cpusToReuse`).
    reuse: BTreeMap<String, CpuSet>,
}

impl StaticPolicy {
    /// The policy of a machine, with `reserved_count` CPUs reserved: the
    /// `specific` ones (`reservedSystemCPUs`), or as many taken by topology
    /// (`NewStaticPolicy`).
    ///
    /// # Errors
    /// The kubelet's messages when the reservation is empty, cannot be
    /// taken, or names CPUs the machine does not have.
    pub fn new(
        topo: CpuTopology,
        reserved_count: usize,
        specific: Option<&CpuSet>,
        options: PolicyOptions,
    ) -> Result<Self, String> {
        if reserved_count == 0 {
            return Err("[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero".into());
        }
        let all = topo.all();
        let reserved = match specific {
            Some(set) if !set.is_empty() => {
                if !set.is_subset(&all) {
                    return Err(format!(
                        "reserved-cpus: {set} is not a subset of online-cpus: {all}"
                    ));
                }
                set.clone()
            }
            _ => {
                let policy = Self {
                    topo: topo.clone(),
                    reserved: CpuSet::new(),
                    reserved_physical: CpuSet::new(),
                    options,
                    reuse: BTreeMap::new(),
                };
                policy.take(&all, reserved_count).unwrap_or_default()
            }
        };
        if reserved.len() != reserved_count {
            return Err(format!(
                "[cpumanager] unable to reserve the required amount of CPUs (size of {reserved} did not equal {reserved_count})"
            ));
        }
        let cores: Vec<usize> = reserved
            .iter()
            .filter_map(|c| topo.cpus.get(&c).map(|i| i.core))
            .collect();
        let reserved_physical = topo
            .cpus
            .iter()
            .filter(|(_, i)| cores.contains(&i.core))
            .map(|(c, _)| *c)
            .collect();
        Ok(Self {
            topo,
            reserved,
            reserved_physical,
            options,
            reuse: BTreeMap::new(),
        })
    }

    /// The reserved CPUs.
    #[must_use]
    pub fn reserved(&self) -> &CpuSet {
        &self.reserved
    }

    /// The machine.
    #[must_use]
    pub fn topology(&self) -> &CpuTopology {
        &self.topo
    }

    /// The CPUs containers may be given: every CPU but the reserved
    /// (`GetAllocatableCPUs`, the pod resources API's allocatable CPUs).
    #[must_use]
    pub fn allocatable(&self) -> CpuSet {
        self.topo.all().difference(&self.reserved)
    }

    /// Every CPU of the pools: all, less the reserved with
    /// `strict-cpu-reservation`.
    fn all_cpus(&self) -> CpuSet {
        if self.options.strict_cpu_reservation {
            self.allocatable()
        } else {
            self.topo.all()
        }
    }

    /// Fills an empty state, and checks a restored one against the machine
    /// (`validateState`).
    ///
    /// # Errors
    /// The kubelet's messages for a state that does not fit the machine.
    pub fn start(&self, state: &mut State) -> Result<(), String> {
        let all = self.all_cpus();
        if state.default.is_empty() {
            if state.assignments.values().any(|c| !c.is_empty()) {
                return Err("default cpuset cannot be empty".into());
            }
            state.default = all;
            return Ok(());
        }
        let d = &state.default;
        if self.options.strict_cpu_reservation {
            let both = self.reserved.intersection(d);
            if !both.is_empty() {
                return Err(format!(
                    "some of strictly reserved cpus: \"{both}\" are present in defaultCpuSet: \"{d}\""
                ));
            }
        } else if !self.reserved.is_subset(d) {
            return Err(format!(
                "not all reserved cpus: \"{}\" are present in defaultCpuSet: \"{d}\"",
                self.reserved
            ));
        }
        let mut union = d.clone();
        for (pod, containers) in &state.assignments {
            for (name, set) in containers {
                if !set.intersection(d).is_empty() {
                    return Err(format!(
                        "pod: {pod}, container: {name} cpuset: \"{set}\" overlaps with default cpuset \"{d}\""
                    ));
                }
                union = union.union(set);
            }
        }
        if union != all {
            return Err(format!(
                "current set of available CPUs \"{all}\" doesn't match with CPUs in state \"{union}\""
            ));
        }
        Ok(())
    }

    /// Takes `n` of `available` with the configured algorithm.
    fn take(&self, available: &CpuSet, n: usize) -> Result<CpuSet, assignment::Error> {
        if self.options.distribute_cpus_across_numa {
            let group = if self.options.full_pcpus_only {
                self.topo.cpus_per_core()
            } else {
                1
            };
            assignment::take_distributed(&self.topo, available, n, group)
        } else {
            assignment::take_packed(
                &self.topo,
                available,
                n,
                self.options.prefer_align_by_uncore_cache,
            )
        }
    }

    /// The free CPUs for exclusive use: the shared pool less the reserved.
    fn available(&self, state: &State) -> CpuSet {
        state.default.difference(&self.reserved)
    }

    /// Gives container `c` of `pod` its exclusive CPUs when it is owed some
    /// (`Allocate`), on the NUMA nodes of `hint` when it can; returns them.
    /// A container already holding CPUs keeps them.
    ///
    /// # Errors
    /// [`AllocationError`] with the kubelet's reason and message: not enough
    /// CPUs, or not whole cores under `full-pcpus-only`.
    pub fn allocate(
        &mut self,
        state: &mut State,
        pod: &Pod,
        c: &Container,
        hint: Option<NumaMask>,
    ) -> Result<Option<CpuSet>, AllocationError> {
        let n = guaranteed_cpus(pod, c);
        if n == 0 {
            return Ok(None);
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if let Some(set) = state.assigned(&uid, &c.name).cloned() {
            self.update_reuse(pod, c, &set);
            return Ok(Some(set));
        }
        if self.options.full_pcpus_only {
            let per_core = self.topo.cpus_per_core();
            if !n.is_multiple_of(per_core) {
                return Err(AllocationError {
                    reason: SMT_ALIGNMENT_ERROR,
                    message: format!(
                        "SMT Alignment Error: requested {n} cpus not multiple cpus per core = {per_core}"
                    ),
                });
            }
            let free = state.default.difference(&self.reserved_physical).len();
            if n > free {
                return Err(AllocationError {
                    reason: SMT_ALIGNMENT_ERROR,
                    message: format!(
                        "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = {free}, requested CPUs = {n}, CPUs per core = {per_core}"
                    ),
                });
            }
        }
        let reusable = self.reuse.get(&uid).cloned().unwrap_or_default();
        let pool = self.available(state).union(&reusable);
        let mut result = CpuSet::new();
        if let Some(mask) = hint {
            let aligned = pool.intersection(&self.topo.cpus_in_numa_nodes(&mask.nodes()));
            let k = n.min(aligned.len());
            result = self.take(&aligned, k).map_err(unexpected)?;
        }
        if result.len() < n {
            let rest = self
                .take(&pool.difference(&result), n - result.len())
                .map_err(unexpected)?;
            result = result.union(&rest);
        }
        state.default = state.default.difference(&result);
        state
            .assignments
            .entry(uid)
            .or_default()
            .insert(c.name.clone(), result.clone());
        self.update_reuse(pod, c, &result);
        Ok(Some(result))
    }

    /// `updateCPUsToReuse`: a regular init container's CPUs may go to the
    /// pod's next containers; a sidecar's and an app container's may not.
    fn update_reuse(&mut self, pod: &Pod, c: &Container, set: &CpuSet) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.reuse.retain(|k, _| *k == uid);
        let is_init = pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_ref())
            .is_some_and(|i| i.iter().any(|i| i.name == c.name));
        let entry = self.reuse.entry(uid).or_default();
        *entry = if is_init && !crate::pod_core::spec::is_sidecar(c) {
            entry.union(set)
        } else {
            entry.difference(set)
        };
    }

    /// Gives a container's CPUs back to the shared pool, but those another
    /// container of its pod still holds (`RemoveContainer`).
    pub fn remove_container(&mut self, state: &mut State, uid: &str, name: &str) {
        let Some(containers) = state.assignments.get_mut(uid) else {
            return;
        };
        let Some(set) = containers.remove(name) else {
            return;
        };
        let others = containers.values().fold(CpuSet::new(), |u, s| u.union(s));
        if containers.is_empty() {
            state.assignments.remove(uid);
        }
        state.default = state.default.union(&set.difference(&others));
    }

    /// The CPU hints of container `c` (`GetTopologyHints`): `None` when it
    /// is owed no exclusive CPUs.
    #[must_use]
    pub fn hints(&self, state: &State, pod: &Pod, c: &Container) -> Option<Vec<Hint>> {
        let n = guaranteed_cpus(pod, c);
        if n == 0 {
            return None;
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if let Some(set) = state.assigned(uid, &c.name) {
            if set.len() != n {
                return Some(Vec::new());
            }
            return Some(self.generate_hints(set, &CpuSet::new(), n));
        }
        let reusable = self.reuse.get(uid).cloned().unwrap_or_default();
        Some(self.generate_hints(&self.available(state), &reusable, n))
    }

    /// The CPU hints of a whole pod (`GetPodTopologyHints`).
    #[must_use]
    pub fn pod_hints(&self, state: &State, pod: &Pod) -> Option<Vec<Hint>> {
        let n = pod_guaranteed_cpus(pod);
        if n == 0 {
            return None;
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let mut assigned = CpuSet::new();
        for c in all_containers(pod) {
            if let Some(set) = state.assigned(uid, &c.name) {
                if set.len() != guaranteed_cpus(pod, c) {
                    return Some(Vec::new());
                }
                assigned = assigned.union(set);
            }
        }
        if assigned.len() == n {
            return Some(self.generate_hints(&assigned, &CpuSet::new(), n));
        }
        let reusable = self
            .reuse
            .get(uid)
            .cloned()
            .unwrap_or_default()
            .union(&assigned);
        Some(self.generate_hints(&self.available(state), &reusable, n))
    }

    /// `generateCPUTopologyHints`: each set of NUMA nodes whose available
    /// CPUs (with the reusable ones, which must lie within it) hold the
    /// request; preferred are those of the fewest nodes that could hold it
    /// on an empty machine.
    fn generate_hints(&self, available: &CpuSet, reusable: &CpuSet, request: usize) -> Vec<Hint> {
        let nodes = self.topo.numa_nodes();
        let mut min_size = nodes.len();
        let mut masks = Vec::new();
        for mask in NumaMask::subsets(&nodes) {
            let in_mask = self.topo.cpus_in_numa_nodes(&mask.nodes());
            if in_mask.len() >= request {
                min_size = min_size.min(mask.count() as usize);
            }
            if !reusable.is_subset(&in_mask) {
                continue;
            }
            if reusable.len() + available.intersection(&in_mask).len() >= request {
                masks.push(mask);
            }
        }
        Hint::preferring(masks, min_size)
    }
}

/// The admission reason of a `full-pcpus-only` refusal.
pub const SMT_ALIGNMENT_ERROR: &str = "SMTAlignmentError";

fn unexpected(e: assignment::Error) -> AllocationError {
    AllocationError {
        reason: "",
        message: e.to_string(),
    }
}

/// The pod's init containers, then its containers.
fn all_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
    })
}

/// The exclusive CPUs a container is owed (`guaranteedCPUs`): its whole
/// cpu request in a Guaranteed pod without pod-level resources, else 0.
#[must_use]
pub fn guaranteed_cpus(pod: &Pod, c: &Container) -> usize {
    if qos_class(pod) != QosClass::Guaranteed {
        return 0;
    }
    // Pod-level resources take exclusive CPUs only with
    // PodLevelResourceManagers, off in v1.37.
    if pod.spec.as_ref().is_some_and(|s| s.resources.is_some()) {
        return 0;
    }
    let Some(q) = c
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("cpu"))
        .and_then(|q| crate::resource::Quantity::parse(&q.0).ok())
    else {
        return 0;
    };
    if q.value() * 1000 != q.milli_value() {
        return 0;
    }
    usize::try_from(q.value()).unwrap_or(usize::MAX)
}

/// The exclusive CPUs a pod is owed at once (`podGuaranteedCPUs`): the
/// most any init container needs beside the sidecars started before it,
/// or all app containers and sidecars together.
#[must_use]
pub fn pod_guaranteed_cpus(pod: &Pod) -> usize {
    let Some(spec) = &pod.spec else { return 0 };
    let (mut sidecars, mut init_max) = (0usize, 0usize);
    for c in spec.init_containers.iter().flatten() {
        let n = guaranteed_cpus(pod, c);
        if crate::pod_core::spec::is_sidecar(c) {
            sidecars = sidecars.saturating_add(n);
        } else {
            init_max = init_max.max(sidecars.saturating_add(n));
        }
    }
    let apps = spec
        .containers
        .iter()
        .fold(0usize, |s, c| s.saturating_add(guaranteed_cpus(pod, c)));
    init_max.max(apps.saturating_add(sidecars))
}

#[cfg(test)]
mod tests;
