//! The pod worker: one reconcile per pod at a time, each a pass of the
//! kubelet's `SyncPod` (pod_workers.go → kubelet.go `SyncPod` /
//! `SyncTerminatingPod`): observe the runtime, plan, execute, report. Every
//! part it drives is a manager of its own, shared by all pod workers: the
//! [`super::runtime_manager::RuntimeManager`] carries out the plan, the [`super::status_manager::StatusManager`] writes the
//! status, the volume manager and the probe manager feed the plan.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::{debug, error, warn};

use super::admission::{Verdict, admission, never_ran, reject};
use super::allocate::allocate;
pub use super::context::{Context, Error, Parts, Result};
use super::static_pods::{mirror_seed, sync_mirror_pod};
use super::teardown::{delete, finish_static};
use crate::container::observe;
use crate::events::EventType;
use crate::pod_core::explain;
use crate::pod_core::facts::pod_identity;
use crate::pod_core::kind::PodKind;
use crate::pod_core::plan::{self, Plan, Policy, VolumeNeed, Volumes, Waiting, plan_with};
use crate::pod_core::runtime::PodRuntime;
use crate::pod_core::status;
use crate::reasons::{event, waiting};
use crate::volume::PodVolumes;

/// How often the status of a terminating pod is refreshed while its containers stop.
const TERMINATING_STATUS_PERIOD: Duration = Duration::from_secs(1);

/// How soon admission is tried again while the Node is not listed.
const NODE_RETRY: Duration = Duration::from_secs(1);

/// One sync of `pod`, in the steps of the kubelet's `SyncPod`. Never sleeps;
/// waiting is a requeue.
///
/// # Errors
/// A failed CRI observation or call, or a failed API call; the controller's
/// error policy requeues.
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
    if ctx.status().was_deleted(&uid) {
        return Ok(Action::await_change());
    }
    // Step 1: the pod as last reported, and what the runtime holds of it.
    let Seen {
        pod,
        kind,
        seeded,
        eviction,
    } = seen(pod, &uid, &ctx);
    let rt = observe(ctx.cri(), &uid).await.map_err(rt_err)?;
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
    let mut mirror_retry = None;
    match admission(&pod, kind, &rt, &ctx).await.map_err(rt_err)? {
        Verdict::Admit if kind.is_static => mirror_retry = sync_mirror_pod(&pod, &ctx).await,
        Verdict::Admit => {}
        Verdict::Reject(rejection) => {
            ctx.explanations()
                .not_admitted(&pod, Some(&rejection), None);
            reject(&pod, &rejection, &ctx).await.map_err(api_err)?;
            return Ok(Action::await_change());
        }
        Verdict::NodeNotSeen => {
            debug!("the Node is not listed yet: admission waits");
            ctx.explanations()
                .not_admitted(&pod, None, Some(NODE_RETRY));
            return Ok(Action::requeue(NODE_RETRY));
        }
    }
    // The pod as allocated (a resize is admitted now or stays pending); as
    // asked, for the messages of a resize left pending.
    let requested = pod.clone();
    let (pod, resize_pending) = allocate(pod, kind, &ctx);
    // Step 3: volumes, before anything starts.
    let now = Timestamp::now();
    let (volumes, ready, volume_errors) = prepare_volumes(&pod, &rt, now, &ctx).await;
    // Step 4: the plan.
    sync_probes(&pod, &rt, &ctx);
    let probes = ctx.prober().results(&pod, &rt);
    let backoffs = ctx.images().backoffs(&uid);
    let policy = Policy {
        eviction_grace: eviction.map_or(crate::pod_core::spec::EVICTION_GRACE_SECONDS, |e| e.grace),
        crash_backoff: ctx.node().crash_backoff,
        cpu_period_us: ctx.node().cpu_period_us,
    };
    let plan = plan_with(&pod, &rt, &backoffs, &probes, ready, now, &policy);
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
    let outcome = Box::pin(ctx.runtime_manager().execute(&pod, &rt, rest, &volumes)).await;
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
        let rt = observe(ctx.cri(), &uid).await.map_err(rt_err)?;
        sync_probes(&pod, &rt, &ctx);
        let probes = ctx.prober().results(&pod, &rt);
        (rt, probes)
    };
    let mut new = status::status(
        &pod,
        &rt,
        &waiting,
        &probes,
        ctx.status_context(),
        Timestamp::now(),
    );
    resource_status(
        &mut new,
        &pod,
        &rt,
        outcome.pod_cgroup.as_ref(),
        resize_pending.as_ref(),
        outcome.resize_error.as_deref(),
        &ctx,
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
    ctx.status().set_status(&pod, new).await.map_err(api_err)?;
    for (warning, reason, note) in resize_events {
        let type_ = if warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        ctx.event(&pod, None, type_, reason, note);
    }
    let back_off = outcome.sandbox_failed.then(|| ctx.back_off());
    let requeue = ctx.next_sync([plan.requeue_after, mirror_retry, back_off]);
    ctx.explanations().record(explain::explain(&explain::Sync {
        pod: &pod,
        runtime: &rt,
        plan: &plan,
        waiting: &waiting,
        pull_backoffs: &backoffs,
        volume_errors: &volume_errors,
        resize_pending: resize_pending.as_ref(),
        now,
        requeue: Some(requeue),
    }));
    Ok(Action::requeue(requeue))
}

/// The pod as one sync sees it ([`seen`]).
struct Seen {
    /// The pod with the status last sent, a static pod's seeded from its
    /// mirror pod, an eviction's applied.
    pod: Arc<Pod>,
    /// What the pod is, read once: no step of the sync asks again.
    kind: PodKind,
    /// The status was seeded from the mirror pod ([`mirror_seed`]).
    seeded: bool,
    /// The eviction recorded for the pod, if any.
    eviction: Option<crate::eviction::Eviction>,
}

/// `pod` as this sync sees it: with the status last sent, a static pod's
/// status seeded from its mirror pod, and an eviction the status does not
/// show yet (its write failed, or a sync started before it overwrote it)
/// applied; with its kind computed once.
fn seen(pod: Arc<Pod>, uid: &str, ctx: &Context) -> Seen {
    let pod = ctx.status().with_sent_status(pod);
    let mut kind = PodKind::of(&pod);
    let seed = mirror_seed(&pod, kind, ctx);
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
    let eviction = ctx.eviction(uid);
    let pod = match &eviction {
        Some(e) if !kind.is_terminal && !crate::pod_core::spec::is_evicted(&pod) => {
            let mut evicted = (*pod).clone();
            evicted.status = Some(status::evicting(
                &pod,
                e.reason,
                &e.message,
                e.disruption,
                e.at,
            ));
            Arc::new(evicted)
        }
        _ => pod,
    };
    Seen {
        pod,
        kind,
        seeded,
        eviction,
    }
}

/// Starts and stops the pod's probe workers ([`crate::prober::manager::Manager::sync`]),
/// unless the pod has left the reflector's store meanwhile (force-deleted
/// while this sync ran): housekeeping has stopped its workers or is about to,
/// and a sync that outlived the pod must not start them again.
/// The resources part of the new status `new`: the pod-level resources
/// its cgroup (`pod_cgroup`, as read) holds, the DRA drivers' device
/// statuses, and the resize conditions (`pending`: a resize not admitted;
/// `error`: the runtime's refusal of one).
fn resource_status(
    new: &mut k8s_openapi::api::core::v1::PodStatus,
    pod: &Pod,
    rt: &PodRuntime,
    pod_cgroup: Option<&crate::cgroups::Limits>,
    pending: Option<&crate::pod_core::admit::Rejection>,
    error: Option<&str>,
    ctx: &Context,
) {
    let pod_cgroup = status::PodCgroup {
        read: pod_cgroup,
        cpu_period_us: ctx.node().cpu_period_us,
    };
    status::pod_level_resources(new, pod, pod_cgroup);
    ctx.dra().update_allocated_resources_status(pod, new);
    status::resize_conditions(new, pod, rt, pod_cgroup, pending, error, Timestamp::now());
}

fn sync_probes(pod: &Pod, rt: &PodRuntime, ctx: &Context) {
    let key = kube::runtime::reflector::ObjectRef::from_obj(pod);
    let stored = ctx.pods().get(&key);
    if stored.is_some_and(|p| p.metadata.uid == pod.metadata.uid) {
        ctx.prober().sync(pod, rt);
    } else {
        debug!("pod no longer bound here: no probe workers started");
    }
}

/// Sets up (or refreshes) the pod's volumes when it is active, or tears them
/// down once it finished and nothing of it runs ([`plan::volume_need`]).
/// Each volume that fails is a `FailedMount` event; returns the volumes
/// containers can mount, whether all are set up (the plan's input), and the
/// volumes that failed with why.
async fn prepare_volumes(
    pod: &Pod,
    rt: &PodRuntime,
    now: Timestamp,
    ctx: &Context,
) -> (PodVolumes, Volumes, Vec<(String, String)>) {
    match plan::volume_need(pod, rt, now) {
        VolumeNeed::Leave => (PodVolumes::new(), Volumes::Ready, Vec::new()),
        VolumeNeed::Unmount => {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            if let Err(e) = ctx.volumes().teardown_volumes(uid).await {
                warn!(error = %e, "tear down the volumes of a finished pod");
            }
            (PodVolumes::new(), Volumes::Ready, Vec::new())
        }
        VolumeNeed::Mount => {
            let node_name = &ctx.node().node_name;
            let node = crate::volume::NodeIdentity {
                name: node_name.clone(),
                labels: ctx.node_view().map(|n| n.labels).unwrap_or_default(),
            };
            let outcome = ctx.volumes().setup(pod, &node).await;
            super::volume_events::mount_events(pod, &outcome, ctx);
            let unmounted = outcome.unmounted(pod);
            let errors = outcome
                .errors
                .iter()
                .map(|(v, e)| (v.clone(), e.to_string()))
                .collect();
            if unmounted.is_empty() {
                crate::startup_trace::mark(pod, crate::startup_trace::Stage::VolumesReady);
                (outcome.volumes, Volumes::Ready, errors)
            } else {
                debug!(?unmounted, "waiting for volumes");
                (outcome.volumes, Volumes::NotReady, errors)
            }
        }
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

/// Stops a terminating pod's containers ([`super::runtime_manager::RuntimeManager::kill_pod_containers`])
/// and, while they stop within their grace period, keeps its status current
/// with the readiness probes, which still run (the kubelet's status manager,
/// `SetContainerReadiness`): a container that turns unready while shutting
/// down makes the pod unready.
///
/// # Errors
/// The first CRI stop that failed.
async fn kill_reporting(pod: &Pod, rt: &PodRuntime, plan: &Plan, ctx: &Context) -> Result<()> {
    let stops = ctx.runtime_manager().kill_pod_containers(pod, rt, plan);
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
                let shown = ctx.status().with_sent_status(Arc::new(pod.clone()));
                let probes = ctx.prober().results(pod, rt);
                let now = Timestamp::now();
                let mut new = status::status(&shown, rt, &no_waiting, &probes, ctx.status_context(), now);
                ctx.dra().update_allocated_resources_status(pod, &mut new);
                // A terminal phase (a pod past its deadline, evicted) is final:
                // it is written once the containers stopped, not while they stop.
                if new.phase.as_deref().is_some_and(crate::reasons::phase::is_terminal) {
                    continue;
                }
                if let Err(e) = ctx.status().set_status(&shown, new).await {
                    debug!(error = %e, "status of a terminating pod");
                }
            }
        }
    }
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
