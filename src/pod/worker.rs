//! The pod worker: one reconcile per pod at a time, each a pass of the
//! kubelet's `SyncPod` (pod_workers.go → kubelet.go `SyncPod` /
//! `SyncTerminatingPod`): observe the runtime, plan, execute, report. Every
//! part it drives is a manager of its own, shared by all pod workers: the
//! [`RuntimeManager`] carries out the plan, the [`StatusManager`] writes the
//! status, the volume manager and the probe manager feed the plan.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use tracing::{debug, error, info, warn};

use super::admission_manager::AdmissionManager;
use super::runtime_manager::RuntimeManager;
use super::status_manager::StatusManager;
use crate::container::observe;
use crate::events::EventType;
use crate::eviction::Eviction;
use crate::pod_core::admit::{self, Rejection};
use crate::pod_core::facts::pod_identity;
use crate::pod_core::fit::NodeView;
use crate::pod_core::kind::PodKind;
use crate::pod_core::plan::{self, Plan, VolumeNeed, Volumes, Waiting, plan_evicted_with};
use crate::pod_core::runtime::PodRuntime;
use crate::pod_core::status::{self, StatusContext};
use crate::reasons::{event, waiting};
use crate::volume::{PodVolumes, VolumeManager};

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
    /// The sync panicked ([`isolated`]); the agent goes on.
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
    pub runtime: RuntimeManager,
    /// The status manager: the only writer of `pods/status` (shared with the
    /// node API, which shows the statuses it last sent).
    pub status: Arc<StatusManager>,
    /// Node facts for the status.
    pub status_context: StatusContext,
    /// The volume manager.
    pub volumes: Arc<VolumeManager>,
    /// The probe manager.
    pub prober: crate::prober::manager::Manager,
    /// True while the PLEG's event stream is connected (then relists can be rare).
    pub pleg_connected: Arc<AtomicBool>,
    /// This node's Node object (labels, taints, allocatable), for admission.
    pub node_store: Store<Node>,
    /// Admission verdicts, decided in creation order.
    pub admission: AdmissionManager,
    /// The node's pressure conditions, from the eviction manager.
    pub pressures: tokio::sync::watch::Receiver<Vec<crate::eviction::Pressure>>,
    /// Pod UID → the eviction the eviction manager decided for it (killed
    /// through [`super::eviction_pods::EvictionPods`]).
    pub evictions: std::sync::Mutex<std::collections::HashMap<String, Eviction>>,
    /// The pod sources: where static pods end and mirror pods are known.
    pub sources: super::sources::PodSources,
    /// The resources each admitted pod was given (in-place resize).
    pub allocations: super::allocation::Allocations,
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

    /// How long a pod with nothing pending waits for its next sync: the relist
    /// period, 2 s without runtime events (the generic PLEG relists every 1 s)
    /// and 30 s with them (a safety net only).
    #[must_use]
    pub fn resync(&self) -> Duration {
        if self.pleg_connected.load(Ordering::Relaxed) {
            Duration::from_secs(30)
        } else {
            Duration::from_secs(2)
        }
    }

    /// Publishes an event about `pod` (or one of its containers) without waiting for it.
    fn event(&self, pod: &Pod, c: Option<&str>, type_: EventType, reason: &str, note: String) {
        crate::events::publish(&self.runtime.recorder, pod, c, type_, reason, note);
    }
}

/// How often the status of a terminating pod is refreshed while its containers stop.
const TERMINATING_STATUS_PERIOD: Duration = Duration::from_secs(1);

/// One sync of `pod`, in the steps of the kubelet's `SyncPod`. Never sleeps;
/// waiting is a requeue.
///
/// # Errors
/// A failed CRI observation or call, or a failed API call; the controller's
/// error policy requeues.
#[tracing::instrument(skip_all, fields(pod = %format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())))]
pub async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action> {
    let (ns, name, uid) = pod_identity(&pod);
    let key = format!("{ns}/{name}");
    let rt_err = |source| Error::Runtime {
        pod: key.clone(),
        source,
    };
    let api_err = |source| Error::Api {
        pod: key.clone(),
        source,
    };
    if ctx.status.was_deleted(&uid) {
        return Ok(Action::await_change());
    }
    // Step 1: the pod as last reported, and what the runtime holds of it.
    let pod = ctx.status.with_sent_status(pod);
    // What kind of pod this is, read once: no step below asks again.
    let mut kind = PodKind::of(&pod);
    let seed = mirror_seed(&pod, kind, &ctx);
    let seeded = seed.is_some();
    let pod = match seed {
        Some(status) => {
            let mut seeded = (*pod).clone();
            seeded.status = Some(status);
            // A seed is never a terminal status ([`mirror_seed`]).
            kind.is_terminal = false;
            Arc::new(seeded)
        }
        None => pod,
    };
    // An eviction the status does not show yet (its write failed, or a
    // sync started before it overwrote it) is applied here.
    let eviction = ctx.eviction(&uid);
    let pod = match &eviction {
        Some(e) if !kind.is_terminal && !crate::pod_core::spec::is_evicted(&pod) => {
            let mut evicted = (*pod).clone();
            evicted.status = Some(status::evicting(&pod, &e.message, e.disruption, e.at));
            Arc::new(evicted)
        }
        _ => pod,
    };
    let rt = observe(&ctx.runtime.runtime, &uid).await.map_err(rt_err)?;
    // A static pod being stopped ends once nothing of it runs: what it ran
    // stays for housekeeping and container GC, so the same manifest put
    // back goes on from it (its restart count), as in the kubelet.
    if kind.is_static && pod.metadata.deletion_timestamp.is_some() && rt.all_stopped() {
        finish_static(&pod, &ctx).await?;
        return Ok(Action::await_change());
    }
    // Step 2: admission of a pod not started yet; a pod that finished
    // without ever running (rejected) has nothing more to do.
    if never_ran(&pod, kind, &rt) {
        return Ok(Action::await_change());
    }
    match admission(&pod, kind, &rt, &ctx).await.map_err(rt_err)? {
        Verdict::Admit => {
            if kind.is_static {
                sync_mirror_pod(&pod, &ctx).await;
            }
        }
        Verdict::Reject(rejection) => {
            reject(&pod, &rejection, &ctx).await.map_err(api_err)?;
            return Ok(Action::await_change());
        }
        Verdict::NodeNotSeen => {
            debug!("the Node is not listed yet: admission waits");
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
    }
    // The pod as allocated: a resize its spec asks for is admitted now or
    // stays pending.
    // As asked, for the messages of a resize left pending.
    let requested = pod.clone();
    let (pod, resize_pending) = allocate(pod, kind, &ctx);
    // Step 3: volumes, before anything starts.
    let now = Timestamp::now();
    let (volumes, ready) = prepare_volumes(&pod, &rt, now, &ctx).await;
    // Step 4: the plan.
    sync_probes(&pod, &rt, &ctx);
    let probes = ctx.prober.results(&pod, &rt);
    let backoffs = ctx.runtime.images.backoffs(&uid);
    let grace = eviction.map_or(crate::pod_core::spec::EVICTION_GRACE_SECONDS, |e| e.grace);
    let plan = plan_evicted_with(&pod, &rt, &backoffs, &probes, ready, now, grace);
    if !plan.steps.is_empty() {
        debug!(steps = ?plan.steps, "plan");
    }
    plan_events(&pod, &plan, &ctx);
    // Step 5: execute it; the containers of a pod that stops (deleted,
    // evicted, finished) stop together while its status stays current.
    let mut rest = plan.steps.as_slice();
    if plan.kill_pod && !plan.leading_kills().is_empty() {
        kill_reporting(&pod, &rt, &plan, &ctx).await?;
        rest = &rest[plan.leading_kills().len()..];
    }
    // Boxed: the runtime manager's future is large, and the pod worker's own
    // would carry it on the polling thread's stack.
    let outcome = Box::pin(ctx.runtime.execute(&pod, &rt, rest, &volumes)).await;
    let outcome = outcome.map_err(rt_err)?;
    if outcome.delete_pod {
        delete(&pod, kind, &ctx).await?;
        return Ok(Action::await_change());
    }
    // Step 6: report what the runtime holds now.
    let mut waiting = plan.waiting.clone();
    waiting.extend(outcome.waiting);
    let (rt, probes) = if plan.steps.is_empty() {
        (rt, probes)
    } else {
        let rt = observe(&ctx.runtime.runtime, &uid).await.map_err(rt_err)?;
        sync_probes(&pod, &rt, &ctx);
        let probes = ctx.prober.results(&pod, &rt);
        (rt, probes)
    };
    let mut new = status::status(
        &pod,
        &rt,
        &waiting,
        &probes,
        &ctx.status_context,
        Timestamp::now(),
    );
    status::pod_level_resources(&mut new, &pod, outcome.pod_cgroup.as_ref());
    status::resize_conditions(
        &mut new,
        &pod,
        &rt,
        outcome.pod_cgroup.as_ref(),
        resize_pending.as_ref(),
        outcome.resize_error.as_deref(),
        Timestamp::now(),
    );
    // A static pod's mirror pod listed while this sync ran (the agent has
    // just started): its status, not this one built without it, is what the
    // next sync starts from.
    if !seeded && mirror_seed(&pod, kind, &ctx).is_some() {
        debug!("the mirror pod was listed during the sync: syncing again from its status");
        return Ok(Action::requeue(Duration::from_millis(100)));
    }
    // Told once the status that makes the transition is written.
    let resize_events = status::resize_events(&pod, &requested, &new);
    ctx.status.set_status(&pod, new).await.map_err(api_err)?;
    for (warning, reason, note) in resize_events {
        let type_ = if warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        ctx.event(&pod, None, type_, reason, note);
    }
    let requeue = plan
        .requeue_after
        .map_or(ctx.resync(), |r| r.min(ctx.resync()));
    Ok(Action::requeue(requeue.max(Duration::from_millis(100))))
}

/// `pod` as allocated (the kubelet's `handlePodResourcesResize`): a pod
/// seen for the first time gets its spec's resources; a spec that asks for
/// others is a resize, allocated when the node holds it beside the other
/// active pods (as allocated), else left pending, and then the pod goes on
/// with its allocation, with the pending reason returned. A pod that stops
/// keeps its allocation.
fn allocate(pod: Arc<Pod>, kind: PodKind, ctx: &Context) -> (Arc<Pod>, Option<Rejection>) {
    use crate::pod_core::allocation;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let Some(current) = ctx.allocations.get(&uid) else {
        ctx.allocations.allocate(&pod);
        return (pod, None);
    };
    if !allocation::resize_requested(&pod, &current) {
        if current.partial {
            // Kept by an earlier version: made whole from the spec it runs.
            ctx.allocations.allocate(&pod);
        }
        return (pod, None);
    }
    if pod.metadata.deletion_timestamp.is_some() || kind.is_terminal {
        return (Arc::new(allocation::apply(&pod, &current)), None);
    }
    let node = &ctx.runtime.node;
    let Some(view) = node_view(&ctx.node_store, &node.node_name) else {
        return (Arc::new(allocation::apply(&pod, &current)), None);
    };
    let _admitting = ctx.allocations.admitting();
    let others = allocated_pods(ctx);
    let others: Vec<&Pod> = others
        .iter()
        .filter(|p| p.metadata.uid.as_deref() != Some(uid.as_str()))
        .filter(|p| !crate::pod_core::spec::is_terminal(p))
        .collect();
    match allocation::admit_resize(&pod, kind, &others, &view) {
        Ok(()) => {
            info!(pod = %pod_identity(&pod).1, "resize allocated");
            ctx.allocations.allocate(&pod);
            let note = status::resize_event_message("Pod resize started", &pod, None);
            ctx.event(&pod, None, EventType::Normal, event::RESIZE_STARTED, note);
            (pod, None)
        }
        Err(pending) => (Arc::new(allocation::apply(&pod, &current)), Some(pending)),
    }
}

/// The status a static pod's sync starts from while this agent has not yet
/// reported on it to a mirror pod: its mirror pod's, what was last reported
/// of it (an agent restart keeps its containers' started and ready states),
/// as the kubelet's status manager reads a static pod's status from its
/// mirror. `None` for other pods, once reported, without a mirror pod of
/// this manifest, or when the mirror pod's status is terminal.
fn mirror_seed(
    pod: &Pod,
    kind: PodKind,
    ctx: &Context,
) -> Option<k8s_openapi::api::core::v1::PodStatus> {
    if !kind.is_static || ctx.status.reported_to_mirror(pod) {
        return None;
    }
    let mirror = ctx.sources.mirror_of(pod)?;
    // A terminal status is an earlier run's of the same manifest (removed
    // and put back): the pod starts anew, not from it.
    let running_status = mirror.status.as_ref().is_some_and(|s| {
        !s.phase
            .as_deref()
            .is_some_and(crate::reasons::phase::is_terminal)
    });
    if !crate::static_pod::is_mirror_of(&mirror, pod) || !running_status {
        return None;
    }
    mirror.status.clone()
}

/// The pods bound to the node, each with the resources it was allocated.
fn allocated_pods(ctx: &Context) -> Vec<Pod> {
    super::allocation::allocated(&ctx.runtime.pods.state(), &ctx.allocations)
}

/// Starts and stops the pod's probe workers ([`crate::prober::manager::Manager::sync`]),
/// unless the pod has left the reflector's store meanwhile (force-deleted
/// while this sync ran): housekeeping has stopped its workers or is about to,
/// and a sync that outlived the pod must not start them again.
fn sync_probes(pod: &Pod, rt: &PodRuntime, ctx: &Context) {
    let key = kube::runtime::reflector::ObjectRef::from_obj(pod);
    let stored = ctx.runtime.pods.get(&key);
    if stored.is_some_and(|p| p.metadata.uid == pod.metadata.uid) {
        ctx.prober.sync(pod, rt);
    } else {
        debug!("pod no longer bound here: no probe workers started");
    }
}

/// Keeps the mirror pod of static pod `pod` current
/// ([`super::mirror_client::reconcile`]); a failure is logged and tried
/// again on the next sync, as the pod runs whether or not the API server
/// has its mirror.
async fn sync_mirror_pod(pod: &Pod, ctx: &Context) {
    let node = &ctx.runtime.node.node_name;
    let client = &ctx.runtime.client;
    let done = super::mirror_client::reconcile(client, &ctx.sources, &ctx.node_store, node, pod);
    if let Err(e) = done.await {
        warn!(error = %e, "mirror pod");
    }
}

/// What admission decided about a pod.
enum Verdict {
    /// It may start (or it already runs, or it ends).
    Admit,
    /// It is failed with this reason.
    Reject(Rejection),
    /// The Node is not in the watch's store yet: decide on a later sync.
    NodeNotSeen,
}

/// The admission verdict on a pod this node has not started yet (no sandbox,
/// not finished, not being deleted), as the kubelet's `canAdmitPod` on pod
/// addition: the admit handlers ([`admit::admit`]) and the GeneralPredicates
/// against the pods admitted before it ([`AdmissionManager::admit`]). A pod
/// that already runs is never rejected. The runtime's features (CRI
/// `Status`) are asked for only when the pod sets
/// `supplementalGroupsPolicy: Strict`.
///
/// # Errors
/// The runtime's `Status` call failed.
async fn admission(
    pod: &Pod,
    kind: PodKind,
    rt: &PodRuntime,
    ctx: &Context,
) -> Result<Verdict, crate::cri::Error> {
    if pod.metadata.deletion_timestamp.is_some()
        || kind.is_terminal
        || !rt.sandboxes.is_empty()
        || !rt.containers.is_empty()
    {
        return Ok(Verdict::Admit);
    }
    // A pod is admitted once: pressure that comes later does not reject a
    // pod admitted before (it may still wait for its volumes).
    if let Some(v) = ctx
        .admission
        .decided(pod.metadata.uid.as_deref().unwrap_or_default())
    {
        return Ok(v.map_or(Verdict::Admit, Verdict::Reject));
    }
    // The eviction manager's handler comes first, as in the kubelet.
    let pressures = ctx.pressures.borrow().clone();
    if let Some(r) = crate::eviction::admit_kind(pod, kind, &pressures) {
        return Ok(Verdict::Reject(r));
    }
    let node = &ctx.runtime.node;
    let supplemental_groups_policy = if admit::wants_strict_supplemental_groups(pod) {
        let status = ctx.runtime.runtime.status().await?;
        status
            .features
            .is_some_and(|f| f.supplemental_groups_policy)
    } else {
        false
    };
    let abilities = admit::NodeAbilities {
        allowed_unsafe_sysctls: &node.allowed_unsafe_sysctls,
        apparmor_enabled: node.apparmor_enabled,
        supplemental_groups_policy,
    };
    let view = match node_view(&ctx.node_store, &node.node_name) {
        Some(view) => view,
        // A static pod does not wait for the API server: it is admitted
        // against the node as the agent registers it (the kubelet's
        // `getNodeAnyWay` and `initialNode`).
        None if kind.is_static => NodeView {
            name: node.node_name.clone(),
            labels: node.initial_labels.clone(),
            taints: node.initial_taints.clone(),
            allocatable: node.allocatable.clone(),
        },
        None => return Ok(Verdict::NodeNotSeen),
    };
    // The other pods count with what they were allocated, not with a
    // resize still pending.
    let bound = allocated_pods(ctx);
    let bound: Vec<&Pod> = bound.iter().collect();
    let verdict = ctx
        .admission
        .admit(pod, &bound, &view, |p| admit::admit(p, &abilities).err());
    if let Some(rejection) = verdict {
        return Ok(Verdict::Reject(rejection));
    }
    // The devices its containers ask of device plugins, given now (the
    // kubelet's device manager admit handler).
    if let Some(devices) = &ctx.runtime.devices {
        let active = |uid: &str| {
            bound.iter().any(|p| {
                p.metadata.uid.as_deref() == Some(uid) && !crate::pod_core::spec::is_terminal(p)
            }) || pod.metadata.uid.as_deref() == Some(uid)
        };
        if let Err(e) = devices.allocate_pod(pod, active).await {
            let rejection = Rejection {
                reason: crate::reasons::admission::UNEXPECTED_ADMISSION_ERROR.into(),
                message: format!("Allocate failed due to {e}, which is unexpected"),
            };
            ctx.admission.overrule(
                pod.metadata.uid.as_deref().unwrap_or_default(),
                rejection.clone(),
            );
            return Ok(Verdict::Reject(rejection));
        }
    }
    Ok(Verdict::Admit)
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

/// True for a pod in a terminal phase that never ran here: no container
/// status, nothing in the runtime, not being deleted (a rejected pod, whose
/// status is final as the kubelet's `rejectPod` left it).
fn never_ran(pod: &Pod, kind: PodKind, rt: &PodRuntime) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && kind.is_terminal
        && pod
            .status
            .as_ref()
            .is_none_or(|s| s.container_statuses.is_none())
        && rt.sandboxes.is_empty()
        && rt.containers.is_empty()
}

/// Fails a pod the node does not admit, as the kubelet's `rejectPod`: a
/// Warning event with the reason, then the rejected status
/// ([`status::rejected`]) through the status manager.
///
/// # Errors
/// The status patch failed.
async fn reject(pod: &Pod, rejection: &Rejection, ctx: &Context) -> Result<bool, kube::Error> {
    info!(
        reason = %rejection.reason,
        detail = rejection.message,
        "pod rejected"
    );
    let note = rejection.message.clone();
    ctx.event(pod, None, EventType::Warning, &rejection.reason, note);
    ctx.status
        .set_status(pod, status::rejected(pod, rejection))
        .await
}

/// Sets up (or refreshes) the pod's volumes when it is active, or tears them
/// down once it finished and nothing of it runs ([`plan::volume_need`]).
/// Each volume that fails is a `FailedMount` event; returns the volumes
/// containers can mount and whether all are set up (the plan's input).
async fn prepare_volumes(
    pod: &Pod,
    rt: &PodRuntime,
    now: Timestamp,
    ctx: &Context,
) -> (PodVolumes, Volumes) {
    match plan::volume_need(pod, rt, now) {
        VolumeNeed::Leave => (PodVolumes::new(), Volumes::Ready),
        VolumeNeed::Unmount => {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            if let Err(e) = ctx.volumes.teardown_volumes(uid).await {
                warn!(error = %e, "tear down the volumes of a finished pod");
            }
            (PodVolumes::new(), Volumes::Ready)
        }
        VolumeNeed::Mount => {
            let node_name = &ctx.runtime.node.node_name;
            let node = crate::volume::NodeIdentity {
                name: node_name.clone(),
                labels: node_view(&ctx.node_store, node_name)
                    .map(|n| n.labels)
                    .unwrap_or_default(),
            };
            let outcome = ctx.volumes.setup(pod, &node).await;
            mount_events(pod, &outcome, ctx);
            let unmounted = outcome.unmounted(pod);
            if unmounted.is_empty() {
                (outcome.volumes, Volumes::Ready)
            } else {
                debug!(?unmounted, "waiting for volumes");
                (outcome.volumes, Volumes::NotReady)
            }
        }
    }
}

/// The `FailedMount` events of a volume setup: one per volume that failed,
/// as the kubelet's `MountVolume.SetUp failed for volume "v" : …`, and one
/// for the volumes whose claims could not be processed, as the kubelet's
/// `Unable to attach or mount volumes: unmounted volumes=[…], unattached
/// volumes=[…], failed to process volumes=[…]: …`.
fn mount_events(pod: &Pod, outcome: &crate::volume::SetupOutcome, ctx: &Context) {
    let mut unprocessed = Vec::new();
    let mut reasons = Vec::new();
    for (volume, e) in &outcome.errors {
        if let crate::volume::Error::Claim(message) = e {
            unprocessed.push(volume.as_str());
            reasons.push(message.as_str());
            continue;
        }
        let note = format!("MountVolume.SetUp failed for volume \"{volume}\" : {e}");
        ctx.event(pod, None, EventType::Warning, event::FAILED_MOUNT, note);
    }
    if !unprocessed.is_empty() {
        let mut unmounted = outcome.unmounted(pod);
        unmounted.sort();
        unprocessed.sort_unstable();
        let note = format!(
            "Unable to attach or mount volumes: unmounted volumes=[{}], unattached volumes=[], failed to process volumes=[{}]: {}",
            unmounted.join(" "),
            unprocessed.join(" "),
            reasons.join("; ")
        );
        ctx.event(pod, None, EventType::Warning, event::FAILED_MOUNT, note);
    }
}

/// The events a plan raises by itself: the active deadline passed, and a
/// `BackOff` for each container a back-off holds.
fn plan_events(pod: &Pod, plan: &Plan, ctx: &Context) {
    if plan.deadline_exceeded {
        let note = plan::DEADLINE_MESSAGE.into();
        ctx.event(pod, None, EventType::Normal, plan::DEADLINE_REASON, note);
    }
    let (ns, name, uid) = pod_identity(pod);
    for (c, w) in &plan.waiting {
        let (type_, note) = if w.reason == waiting::CRASH_LOOP_BACK_OFF {
            let note =
                format!("Back-off restarting failed container {c} in pod {name}_{ns}({uid})");
            (EventType::Warning, note)
        } else {
            (EventType::Normal, w.message.clone())
        };
        ctx.event(pod, Some(c), type_, event::BACK_OFF, note);
    }
}

/// Stops a terminating pod's containers ([`RuntimeManager::kill_pod_containers`])
/// and, while they stop within their grace period, keeps its status current
/// with the readiness probes, which still run (the kubelet's status manager,
/// `SetContainerReadiness`): a container that turns unready while shutting
/// down makes the pod unready.
///
/// # Errors
/// The first CRI stop that failed.
async fn kill_reporting(pod: &Pod, rt: &PodRuntime, plan: &Plan, ctx: &Context) -> Result<()> {
    let stops = ctx.runtime.kill_pod_containers(pod, rt, plan);
    tokio::pin!(stops);
    let mut tick = tokio::time::interval(TERMINATING_STATUS_PERIOD);
    let no_waiting = BTreeMap::<String, Waiting>::new();
    loop {
        tokio::select! {
            r = &mut stops => {
                return r.map_err(|source| Error::Runtime {
                    pod: format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
                    source,
                });
            }
            _ = tick.tick() => {
                // Built on the status last sent, so that what did not change
                // keeps its transition times.
                let shown = ctx.status.with_sent_status(Arc::new(pod.clone()));
                let probes = ctx.prober.results(pod, rt);
                let now = Timestamp::now();
                let new = status::status(&shown, rt, &no_waiting, &probes, &ctx.status_context, now);
                // A terminal phase (a pod past its deadline, evicted) is final:
                // it is written once the containers stopped, not while they stop.
                if new.phase.as_deref().is_some_and(crate::reasons::phase::is_terminal) {
                    continue;
                }
                if let Err(e) = ctx.status.set_status(&shown, new).await {
                    debug!(error = %e, "status of a terminating pod");
                }
            }
        }
    }
}

/// The end of a terminated pod whose containers and sandboxes are removed:
/// its final status is written ([`status::terminated_status`]), its volumes
/// and directory go, the status manager deletes the Pod object, and the
/// managers forget it.
///
/// # Errors
/// The teardown or the delete failed.
async fn delete(pod: &Pod, kind: PodKind, ctx: &Context) -> Result<()> {
    let (ns, name, uid) = pod_identity(pod);
    if kind.is_static {
        return finish_static(pod, ctx).await;
    }
    // The final status first: a pod kept by a finalizer shows how it ended.
    // A pod already gone (force-deleted meanwhile) needs none.
    let last = pod.status.clone().unwrap_or_default();
    match ctx
        .status
        .set_status(pod, status::terminated_status(pod, &last))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(source) => {
            return Err(Error::Api {
                pod: format!("{ns}/{name}"),
                source,
            });
        }
    }
    teardown(pod, ctx).await?;
    ctx.status.delete(pod).await.map_err(|source| Error::Api {
        pod: format!("{ns}/{name}"),
        source,
    })?;
    info!("pod terminated and deleted");
    forget(&uid, ctx);
    Ok(())
}

/// Tears down the volumes and directory of pod `pod`.
///
/// # Errors
/// The teardown failed.
async fn teardown(pod: &Pod, ctx: &Context) -> Result<()> {
    let (ns, name, uid) = pod_identity(pod);
    ctx.volumes
        .teardown(&uid)
        .await
        .map_err(|source| Error::Volume {
            pod: format!("{ns}/{name}"),
            source,
        })
}

/// The managers forget pod `uid`, which has ended here.
fn forget(uid: &str, ctx: &Context) {
    if let Some(devices) = &ctx.runtime.devices {
        devices.release(|u| u != uid);
    }
    ctx.runtime.images.forget(uid);
    ctx.runtime.userns.release(uid);
    ctx.prober.forget(uid);
}

/// The end of a stopped static pod (its manifest went or changed): its
/// volumes go, it leaves the pod sources (the manifest's new
/// version, if any, starts in its place; housekeeping deletes a mirror pod
/// left without a static pod), and the managers forget it, so that the same
/// manifest put back runs it anew.
///
/// # Errors
/// The teardown failed.
async fn finish_static(pod: &Pod, ctx: &Context) -> Result<()> {
    teardown(pod, ctx).await?;
    ctx.sources.finished(pod);
    info!("static pod stopped");
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    ctx.status.forget(pod);
    ctx.admission.retain(|u| u != uid);
    forget(uid, ctx);
    Ok(())
}

/// The kubelet's note of a `FailedSync` event: no detail, so that repeated
/// failures aggregate (pod_workers.go).
pub const FAILED_SYNC_NOTE: &str = "Error syncing pod";

/// Runs `sync`, one sync of `pod` (a [`reconcile`]), so that a panic in it
/// ends that sync only, not the agent: the controller polls every pod's sync
/// on one task, where a panic would unwind through all of them. The panic
/// becomes [`Error::Panicked`], logged, with a Warning `FailedSync` event on
/// the pod as the kubelet's pod worker sends for a failed sync; the error
/// policy then retries it like any failed sync.
///
/// Unwinding out of a sync is safe to go on from: the managers' locks are
/// taken poison-tolerant and hold no invariant a half-done sync breaks, and
/// the next sync observes the runtime afresh.
///
/// # Errors
/// The sync's own error, or [`Error::Panicked`].
pub async fn isolated<F>(pod: &Pod, ctx: &Context, sync: F) -> Result<Action>
where
    F: Future<Output = Result<Action>>,
{
    use futures::FutureExt as _;
    let panic = match std::panic::AssertUnwindSafe(sync).catch_unwind().await {
        Ok(result) => return result,
        Err(panic) => panic,
    };
    let message = panic_message(panic.as_ref());
    let (ns, name, _) = pod_identity(pod);
    error!(panic = %message, "pod sync panicked");
    let note = FAILED_SYNC_NOTE.to_string();
    ctx.event(pod, None, EventType::Warning, event::FAILED_SYNC, note);
    Err(Error::Panicked {
        pod: format!("{ns}/{name}"),
        message,
    })
}

/// The message a panic was raised with (`panic!("...")` carries a `&str` or
/// a `String`).
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// The controller's error policy: log and retry in 5 s.
#[must_use]
pub fn error_policy(_pod: Arc<Pod>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(%error, "pod sync failed");
    Action::requeue(Duration::from_secs(5))
}
