//! The CPU manager, as the kubelet's (pkg/kubelet/cm/cpumanager): with the
//! `static` policy, a container of a Guaranteed pod that asks for whole
//! CPUs gets them to itself, taken by topology ([`assignment`]) on the NUMA
//! nodes the topology manager chose, and every other container runs on the
//! shared pool, which shrinks and grows as exclusive CPUs are given and
//! returned. With `none` (the default) no cpuset is set.
//!
//! - Admission gives a pod's containers their CPUs ([`CpuManager::allocate`],
//!   from `pod::admission`), after the topology manager merged their hints
//!   ([`CpuManager::hints`]).
//! - A container is created with its cpuset (CRI `cpuset_cpus`, the
//!   kubelet's `PreCreateContainer`); the reconcile loop (`pod::cpu_reconciler`,
//!   every `cpuManagerReconcilePeriod`) updates each running container whose
//!   cpuset differs from what it was last given, and returns the CPUs of
//!   pods no longer active to the pool (`removeStaleState`).
//! - The state lives in `<root-dir>/cpu_manager_state` ([`state`]), written on
//!   every change: a restarted agent keeps every assignment, and a changed
//!   policy over an existing state stops it with the kubelet's message.

pub mod assignment;
#[cfg(test)]
pub mod fixtures;
pub mod policy;
pub mod state;
pub mod topology;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::{Container, Pod};
use tracing::{info, warn};

pub use crate::config::CpuManagerPolicy as PolicyName;
pub use crate::cpuset::{self, CpuSet};
pub use policy::{AllocationError, PolicyOptions};
use policy::{State, StaticPolicy};
use topology::CpuTopology;

use crate::topology_manager::{Hint, NumaMask};

/// Errors starting the CPU manager, with the kubelet's messages.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The machine's topology could not be read.
    #[error("could not detect the CPU topology: {0}")]
    Topology(#[from] topology::Error),
    /// The policy could not be made.
    #[error("{0}")]
    Policy(String),
    /// The checkpoint could not be restored or written.
    #[error(transparent)]
    Checkpoint(#[from] state::Error),
    /// The restored state does not fit the machine (`validateState`).
    #[error("start cpu manager error: {0}")]
    State(String),
}

struct Inner {
    policy: Option<StaticPolicy>,
    state: State,
}

/// The CPU manager; cheap to clone, shared by admission, the runtime
/// manager, the reconcile loop and the pod resources API.
#[derive(Clone)]
pub struct CpuManager {
    name: PolicyName,
    dir: PathBuf,
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for CpuManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuManager")
            .field("policy", &self.name)
            .finish_non_exhaustive()
    }
}

/// The CPUs `kubeReserved` and `systemReserved` hold together, in
/// millicores; `None` when neither names `cpu`.
#[must_use]
pub fn reserved_millicores(reservations: &crate::config::Reservations) -> Option<i128> {
    let cpu = |m: &BTreeMap<String, String>| {
        m.get("cpu")
            .and_then(|q| crate::resource::Quantity::parse(q).ok())
            .map(crate::resource::Quantity::milli_value)
    };
    match (
        cpu(&reservations.kube_reserved),
        cpu(&reservations.system_reserved),
    ) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
    }
}

impl CpuManager {
    /// The manager of `settings` on machine `topo`, with its state restored
    /// from `root_dir` and checked (the kubelet's `NewManager` and `Start`):
    /// `reserved_millicores` is what [`reserved_millicores`] gives,
    /// `beta_options` whether `CPUManagerPolicyBetaOptions` is on.
    ///
    /// # Errors
    /// [`Error`] with the kubelet's message: options under `none`, an unknown
    /// or disabled option, no CPUs reserved under `static`, a checkpoint of
    /// another policy or one that does not fit the machine.
    pub fn new(
        settings: &crate::config::ResourceManagers,
        reserved_millicores: Option<i128>,
        root_dir: &Path,
        topo: CpuTopology,
        beta_options: bool,
    ) -> Result<Self, Error> {
        let name = settings.cpu_policy;
        let policy = match name {
            PolicyName::None => {
                if !settings.cpu_policy_options.is_empty() {
                    return Err(Error::Policy(format!(
                        "new none policy error: None policy: received unsupported options={}",
                        go_map(&settings.cpu_policy_options)
                    )));
                }
                None
            }
            PolicyName::Static => {
                let options = PolicyOptions::parse(
                    &settings.cpu_policy_options,
                    beta_options,
                    settings.cpu_alpha_options,
                )
                .map_err(|e| Error::Policy(format!("new static policy error: {e}")))?;
                let count = match (&settings.reserved_system_cpus, reserved_millicores) {
                    (Some(set), _) => set.len(),
                    (None, Some(milli)) => {
                        usize::try_from((milli.max(0) + 999) / 1000).unwrap_or(usize::MAX)
                    }
                    (None, None) => {
                        return Err(Error::Policy(
                            "[cpumanager] unable to determine reserved CPU resources for static policy".into(),
                        ));
                    }
                };
                let policy =
                    StaticPolicy::new(topo, count, settings.reserved_system_cpus.as_ref(), options)
                        .map_err(|e| Error::Policy(format!("new static policy error: {e}")))?;
                Some(policy)
            }
        };
        let mut state = state::restore(root_dir, name)?;
        if let Some(p) = &policy {
            p.start(&mut state).map_err(Error::State)?;
            info!(reserved = %p.reserved(), shared = %state.default, "CPU manager: static policy");
        }
        state::save(root_dir, name, &state)?;
        let inner = Inner { policy, state };
        Self::record(&inner);
        Ok(Self {
            name,
            dir: root_dir.to_path_buf(),
            inner: Arc::new(Mutex::new(inner)),
        })
    }

    /// The policy.
    #[must_use]
    pub fn policy(&self) -> PolicyName {
        self.name
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The machine's NUMA nodes, lowest first (one, node 0, under `none`).
    #[must_use]
    pub fn numa_nodes(&self) -> Vec<usize> {
        self.lock()
            .policy
            .as_ref()
            .map_or_else(|| vec![0], |p| p.topology().numa_nodes())
    }

    /// The CPU hints of container `c` for the topology manager: `None`
    /// for no preference.
    #[must_use]
    pub fn hints(&self, pod: &Pod, c: &Container) -> Option<Vec<Hint>> {
        let inner = self.lock();
        inner.policy.as_ref()?.hints(&inner.state, pod, c)
    }

    /// The CPU hints of the whole pod (scope `pod`).
    #[must_use]
    pub fn pod_hints(&self, pod: &Pod) -> Option<Vec<Hint>> {
        let inner = self.lock();
        inner.policy.as_ref()?.pod_hints(&inner.state, pod)
    }

    /// Gives container `c` its exclusive CPUs, on `hint`'s NUMA nodes when
    /// they hold them, and writes the checkpoint (`Allocate`).
    ///
    /// # Errors
    /// [`AllocationError`] with the kubelet's reason and message.
    pub fn allocate(
        &self,
        pod: &Pod,
        c: &Container,
        hint: Option<NumaMask>,
    ) -> Result<(), AllocationError> {
        let mut inner = self.lock();
        let Inner { policy, state } = &mut *inner;
        let Some(policy) = policy else { return Ok(()) };
        if policy::guaranteed_cpus(pod, c) > 0 {
            crate::metrics::metrics().cpu_manager_pinning_requests.inc();
        }
        let given = policy.allocate(state, pod, c, hint).inspect_err(|_| {
            crate::metrics::metrics().cpu_manager_pinning_errors.inc();
        })?;
        if let Some(cpus) = given {
            info!(pod = pod.metadata.name.as_deref().unwrap_or_default(), container = %c.name, %cpus, "exclusive CPUs given");
        }
        self.save(&inner);
        Ok(())
    }

    /// Sets the pool gauges from the state (`updateMetricsOnStart`).
    fn record(inner: &Inner) {
        let Some(policy) = &inner.policy else { return };
        let m = crate::metrics::metrics();
        let shared = inner.state.default.difference(policy.reserved()).len();
        let given = inner
            .state
            .assignments
            .values()
            .flat_map(|c| c.values())
            .fold(CpuSet::new(), |u, s| u.union(s))
            .len();
        m.cpu_manager_shared_pool_size_millicores
            .set(i64::try_from(shared.saturating_mul(1000)).unwrap_or(i64::MAX));
        m.cpu_manager_exclusive_cpu_allocation_count
            .set(i64::try_from(given).unwrap_or(i64::MAX));
    }

    fn save(&self, inner: &Inner) {
        Self::record(inner);
        if let Err(e) = state::save(&self.dir, self.name, &inner.state) {
            warn!(error = %e, "CPU manager checkpoint not written");
        }
    }

    /// The cpuset container `name` of pod `uid` runs on: its own CPUs, else
    /// the shared pool; `None` under `none` (no cpuset is set).
    #[must_use]
    pub fn cpuset(&self, uid: &str, name: &str) -> Option<CpuSet> {
        let inner = self.lock();
        inner.policy.as_ref()?;
        Some(inner.state.cpuset_or_default(uid, name)).filter(|s| !s.is_empty())
    }

    /// The exclusive CPUs of container `name` of pod `uid`, if any (the pod
    /// resources API's `cpu_ids`).
    #[must_use]
    pub fn exclusive(&self, uid: &str, name: &str) -> Option<CpuSet> {
        self.lock().state.assigned(uid, name).cloned()
    }

    /// The CPUs containers may be given (`GetAllocatableCPUs`); empty under
    /// `none`.
    #[must_use]
    pub fn allocatable(&self) -> CpuSet {
        self.lock()
            .policy
            .as_ref()
            .map_or_else(CpuSet::new, StaticPolicy::allocatable)
    }

    /// Returns the CPUs of every container whose pod is not `active` (by
    /// UID) or that its pod no longer has (`removeStaleState`), and writes
    /// the checkpoint when that changed anything.
    pub fn remove_stale(&self, active: &BTreeMap<String, Vec<String>>) {
        let mut inner = self.lock();
        let Inner { policy, state } = &mut *inner;
        let Some(policy) = policy else { return };
        let stale: Vec<(String, String)> = state
            .assignments
            .iter()
            .flat_map(|(uid, cs)| cs.keys().map(move |c| (uid.clone(), c.clone())))
            .filter(|(uid, c)| !active.get(uid).is_some_and(|names| names.contains(c)))
            .collect();
        if stale.is_empty() {
            return;
        }
        for (uid, c) in &stale {
            policy.remove_container(state, uid, c);
            info!(pod_uid = %uid, container = %c, "exclusive CPUs returned to the shared pool");
        }
        self.save(&inner);
    }

    /// Returns the CPUs of every container of pod `uid` (a pod rejected
    /// after some of its containers got CPUs).
    pub fn remove_pod(&self, uid: &str) {
        let mut inner = self.lock();
        let Inner { policy, state } = &mut *inner;
        let Some(policy) = policy else { return };
        let names: Vec<String> = state
            .assignments
            .get(uid)
            .map(|c| c.keys().cloned().collect())
            .unwrap_or_default();
        for c in names {
            policy.remove_container(state, uid, &c);
        }
        self.save(&inner);
    }
}

/// A map as Go's `%v` prints it: `map[a:1 b:2]`.
fn go_map(m: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = m.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    format!("map[{}]", pairs.join(" "))
}

#[cfg(test)]
mod tests;
