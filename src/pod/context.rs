//! What every pod sync shares ([`Context`]): the managers the pod worker
//! drives and the node facts it reads, as the kubelet's `Kubelet` struct
//! holds them for `SyncPod`; and the errors of one sync.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{ObjectRef, Store};

use super::admission_manager::AdmissionManager;
use super::runtime_manager::RuntimeManager;
use super::status_manager::StatusManager;
use crate::events::EventType;
use crate::eviction::Eviction;
use crate::pod_core::fit::NodeView;
use crate::pod_core::status::StatusContext;
use crate::volume::VolumeManager;

/// Errors of one pod sync; the controller logs them and requeues the pod.
/// Errors of one pod sync; the controller logs them and requeues the pod.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the runtime state or a runtime call failed.
    #[error("sync pod {pod}: {source}")]
    Runtime {
        /// `namespace/name`.
        pod: String,
        /// The CRI error.
        #[source]
        source: crate::cri::Error,
    },
    /// An API call failed.
    #[error("sync pod {pod}: {source}")]
    Api {
        /// `namespace/name`.
        pod: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The pod's volumes could not be torn down.
    #[error("sync pod {pod}: {source}")]
    Volume {
        /// `namespace/name`.
        pod: String,
        /// The volume error.
        #[source]
        source: crate::volume::Error,
    },
    /// The pod's ResourceClaims could not be unprepared.
    #[error("sync pod {pod}: {message}")]
    Dra {
        /// `namespace/name`.
        pod: String,
        /// Why, as [`crate::dra::DraManager::unprepare`] says.
        message: String,
    },
    /// The sync panicked ([`super::worker::isolated`]); the agent goes on.
    #[error("sync pod {pod}: panicked: {message}")]
    Panicked {
        /// `namespace/name`.
        pod: String,
        /// The panic's message.
        message: String,
    },
}

/// Result of a pod sync.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a pod sync needs; one per agent, shared by every pod worker,
/// built in one step before the controller starts.
pub struct Context {
    /// The runtime manager (its runtime handle also serves observation).
    runtime: RuntimeManager,
    /// The status manager: the only writer of `pods/status` (shared with the
    /// node API, which shows the statuses it last sent).
    status: Arc<StatusManager>,
    /// Node facts for the status.
    status_context: StatusContext,
    /// The volume manager.
    volumes: Arc<VolumeManager>,
    /// The probe manager.
    prober: crate::prober::manager::Manager,
    /// True while the PLEG's event stream is connected (then relists can be rare).
    pleg_connected: Arc<AtomicBool>,
    /// This node's Node object (labels, taints, allocatable), for admission.
    node_store: Store<Node>,
    /// Admission verdicts, decided in creation order.
    admission: AdmissionManager,
    /// Each pod's last sync, explained (the node API serves them).
    explanations: Arc<super::explain::Explanations>,
    /// The node's pressure conditions, from the eviction manager.
    pressures: tokio::sync::watch::Receiver<Vec<crate::eviction::Pressure>>,
    shutting_down: tokio::sync::watch::Receiver<bool>,
    /// Pod UID → the eviction the eviction manager decided for it (killed
    /// through [`super::eviction_pods::EvictionPods`]).
    evictions: std::sync::Mutex<std::collections::HashMap<String, Eviction>>,
    /// The pod sources: where static pods end and mirror pods are known.
    sources: super::sources::PodSources,
    /// The resources each admitted pod was given (in-place resize).
    allocations: super::allocation::Allocations,
}

impl Context {
    /// Records the eviction of pod `uid`.
    pub fn record_eviction(&self, uid: &str, eviction: Eviction) {
        self.evictions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(uid.to_string(), eviction);
    }

    /// The eviction recorded for pod `uid`, if any.
    #[must_use]
    pub fn eviction(&self, uid: &str) -> Option<Eviction> {
        self.evictions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(uid)
            .cloned()
    }

    /// How long a pod with nothing pending waits for its next sync: 2 s
    /// without runtime events (the generic PLEG relists every 1 s); with
    /// them, `syncFrequency` jittered by up to half again, as the kubelet's
    /// pod workers requeue (`wait.Jitter(resyncInterval, 0.5)`), so that pods
    /// started together do not resync together.
    #[must_use]
    pub fn resync(&self) -> Duration {
        if self.pleg_connected.load(Ordering::Relaxed) {
            // A day at most: the controller's timer wheel holds about two
            // years, and a file may say more.
            jittered(self.node().sync_frequency.min(MAX_SYNC_FREQUENCY))
        } else {
            Duration::from_secs(2)
        }
    }

    /// How long a pod whose sandbox could not be made (its claims not
    /// prepared, or `RunPodSandbox` failed) waits for its next sync:
    /// [`BACK_OFF_PERIOD`] jittered by up to half again, as the kubelet's pod
    /// workers requeue a failed sync (`wait.Jitter(backOffPeriod, 0.5)`);
    /// [`Context::next_sync`] holds it to the resync period.
    #[must_use]
    pub fn back_off(&self) -> Duration {
        jittered(BACK_OFF_PERIOD)
    }

    /// How long a pod waits for its next sync: the soonest of `due` (the
    /// plan's deadline, a mirror pod's retry, [`Context::back_off`] after a
    /// sandbox that could not be made), at most [`Context::resync`], at
    /// least 100 ms.
    #[must_use]
    pub fn next_sync(&self, due: impl IntoIterator<Item = Option<Duration>>) -> Duration {
        (due.into_iter().flatten())
            .fold(self.resync(), Duration::min)
            .max(Duration::from_millis(100))
    }

    /// Publishes an event about `pod` (or one of its containers) without waiting for it.
    pub fn event(&self, pod: &Pod, c: Option<&str>, type_: EventType, reason: &str, note: String) {
        crate::events::publish(&self.runtime.recorder, pod, c, type_, reason, note);
    }
}

/// The parts a [`Context`] is built from ([`Context::new`]).
pub struct Parts {
    /// The runtime manager (its runtime handle also serves observation).
    pub runtime: RuntimeManager,
    /// The status manager, shared with the node API.
    pub status: Arc<StatusManager>,
    /// Node facts for the status.
    pub status_context: StatusContext,
    /// The volume manager.
    pub volumes: Arc<VolumeManager>,
    /// The probe manager.
    pub prober: crate::prober::manager::Manager,
    /// True while the PLEG's event stream is connected.
    pub pleg_connected: Arc<AtomicBool>,
    /// This node's Node object, for admission.
    pub node_store: Store<Node>,
    /// The node's pressure conditions, from the eviction manager.
    pub pressures: tokio::sync::watch::Receiver<Vec<crate::eviction::Pressure>>,
    /// Whether a node shutdown is under way, from the node shutdown manager.
    pub shutting_down: tokio::sync::watch::Receiver<bool>,
    /// The pod sources.
    pub sources: super::sources::PodSources,
    /// The resources each admitted pod was given.
    pub allocations: super::allocation::Allocations,
}

impl Context {
    /// The context of `parts`, with no admission decided and no eviction recorded.
    #[must_use]
    pub fn new(parts: Parts) -> Self {
        Self {
            runtime: parts.runtime,
            status: parts.status,
            status_context: parts.status_context,
            volumes: parts.volumes,
            prober: parts.prober,
            pleg_connected: parts.pleg_connected,
            node_store: parts.node_store,
            admission: AdmissionManager::new(),
            explanations: Arc::default(),
            pressures: parts.pressures,
            shutting_down: parts.shutting_down,
            evictions: std::sync::Mutex::default(),
            sources: parts.sources,
            allocations: parts.allocations,
        }
    }

    /// Tells whether the PLEG's event stream is connected ([`Self::resync`]).
    pub fn set_pleg_connected(&self, connected: bool) {
        self.pleg_connected.store(connected, Ordering::Relaxed);
    }

    /// The runtime manager, which carries out plans.
    #[must_use]
    pub fn runtime_manager(&self) -> &RuntimeManager {
        &self.runtime
    }

    /// The container runtime.
    #[must_use]
    pub fn cri(&self) -> &crate::cri::Runtime {
        &self.runtime.runtime
    }

    /// The image manager.
    #[must_use]
    pub fn images(&self) -> &super::image_manager::ImageManager {
        &self.runtime.images
    }

    /// The event recorder.
    #[must_use]
    pub fn recorder(&self) -> &crate::events::Recorder {
        &self.runtime.recorder
    }

    /// Node facts for sandbox and container configs.
    #[must_use]
    pub fn node(&self) -> &crate::pod_core::facts::NodeContext {
        &self.runtime.node
    }

    /// The reflector's pods bound to this node.
    #[must_use]
    pub fn pods(&self) -> &Store<Pod> {
        &self.runtime.pods
    }

    /// The API client.
    #[must_use]
    pub fn client(&self) -> &kube::Client {
        &self.runtime.client
    }

    /// The host ID ranges of pods with their own user namespace.
    #[must_use]
    pub fn userns(&self) -> &super::userns::UsernsManager {
        &self.runtime.userns
    }

    /// Where started containers get their log link.
    #[must_use]
    pub fn log_links_dir(&self) -> &std::path::Path {
        &self.runtime.log_links_dir
    }

    /// The pod and QoS cgroups, if pods get cgroups of their own.
    #[must_use]
    pub fn cgroups(&self) -> Option<&crate::cgroups::CgroupManager> {
        self.runtime.cgroups.as_ref()
    }

    /// The device manager, if device plugins are served.
    #[must_use]
    pub fn devices(&self) -> Option<&crate::device_manager::DeviceManager> {
        self.runtime.devices.as_ref()
    }

    /// The CPU manager.
    #[must_use]
    pub fn cpus(&self) -> Option<&crate::cpu_manager::CpuManager> {
        self.runtime.cpus.as_ref()
    }

    /// The memory manager.
    #[must_use]
    pub fn memory(&self) -> Option<&crate::memory_manager::MemoryManager> {
        self.runtime.memory.as_ref()
    }

    /// The topology manager's settings.
    #[must_use]
    pub fn topology(&self) -> &crate::topology_manager::TopologyManager {
        &self.runtime.topology
    }

    /// The DRA manager.
    #[must_use]
    pub fn dra(&self) -> &crate::dra::DraManager {
        &self.runtime.dra
    }

    /// The status manager, the only writer of `pods/status`.
    #[must_use]
    pub fn status(&self) -> &Arc<StatusManager> {
        &self.status
    }

    /// Node facts for the status.
    #[must_use]
    pub fn status_context(&self) -> &StatusContext {
        &self.status_context
    }

    /// The volume manager.
    #[must_use]
    pub fn volumes(&self) -> &Arc<VolumeManager> {
        &self.volumes
    }

    /// The probe manager.
    #[must_use]
    pub fn prober(&self) -> &crate::prober::manager::Manager {
        &self.prober
    }

    /// The admission manager.
    #[must_use]
    pub fn admission(&self) -> &AdmissionManager {
        &self.admission
    }

    /// Each pod's last sync, explained.
    #[must_use]
    pub fn explanations(&self) -> &Arc<super::explain::Explanations> {
        &self.explanations
    }

    /// The node's pressure conditions now.
    #[must_use]
    pub fn pressures(&self) -> Vec<crate::eviction::Pressure> {
        self.pressures.borrow().clone()
    }

    /// Whether a node shutdown is under way now.
    #[must_use]
    pub fn node_shutting_down(&self) -> bool {
        *self.shutting_down.borrow()
    }

    /// The pod sources.
    #[must_use]
    pub fn sources(&self) -> &super::sources::PodSources {
        &self.sources
    }

    /// The resources each admitted pod was given.
    #[must_use]
    pub fn allocations(&self) -> &super::allocation::Allocations {
        &self.allocations
    }

    /// Forgets the evictions of the pods `keep` says no to.
    pub fn retain_evictions(&self, keep: impl Fn(&str) -> bool) {
        self.evictions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|uid, _| keep(uid));
    }

    /// What admission reads of this node's Node object; None until it is
    /// listed with an allocatable.
    #[must_use]
    pub fn node_view(&self) -> Option<NodeView> {
        node_view(&self.node_store, &self.runtime.node.node_name)
    }

    /// The pods bound to the node, each with the resources it was allocated.
    #[must_use]
    pub fn allocated_pods(&self) -> Vec<Pod> {
        super::allocation::allocated(&self.runtime.pods.state(), &self.allocations)
    }

    /// This node's Node object, as the watch holds it.
    #[must_use]
    pub fn node_store(&self) -> &Store<Node> {
        &self.node_store
    }
}

/// The longest resync [`Context::resync`] waits, whatever `syncFrequency`
/// says: one day.
pub const MAX_SYNC_FREQUENCY: Duration = Duration::from_secs(24 * 3600);

/// How long a pod whose sandbox could not be made waits for its next sync
/// before jitter ([`Context::back_off`]): the kubelet's pod worker
/// `backOffPeriod`, 10 s.
pub const BACK_OFF_PERIOD: Duration = Duration::from_secs(10);

/// `d` and up to half of it again, at random: the kubelet's
/// `wait.Jitter(d, 0.5)` (millisecond steps).
fn jittered(d: Duration) -> Duration {
    let half = u64::try_from((d / 2).as_millis()).unwrap_or(u64::MAX);
    let extra = match (half, getrandom::u64()) {
        (0, _) | (_, Err(_)) => 0,
        (n, Ok(r)) => r % n,
    };
    d.saturating_add(Duration::from_millis(extra))
}

/// What admission reads of the Node in `store`; None until it is listed
/// with an allocatable.
fn node_view(store: &Store<Node>, name: &str) -> Option<NodeView> {
    let node = store.get(&ObjectRef::new(name))?;
    let allocatable = node.status.as_ref()?.allocatable.clone()?;
    Some(NodeView {
        name: name.to_string(),
        labels: node.metadata.labels.clone().unwrap_or_default(),
        taints: node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default(),
        allocatable,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resync_is_jittered_by_up_to_half_again() {
        let d = Duration::from_secs(60);
        let draws: Vec<Duration> = (0..200).map(|_| jittered(d)).collect();
        assert!(draws.iter().all(|j| *j >= d && *j < d + d / 2), "{draws:?}");
        // Spread, not one value: 200 draws over 30,000 steps.
        let distinct: std::collections::BTreeSet<_> = draws.iter().collect();
        assert!(distinct.len() > 100, "{}", distinct.len());
        assert_eq!(jittered(Duration::ZERO), Duration::ZERO);
        assert_eq!(jittered(Duration::MAX), Duration::MAX);
    }
}
