//! The reconcile of one pod and what it needs: the pod worker of the kubelet
//! (pod_workers.go → `SyncPod`), with its reason cache and image back-off kept
//! in memory and everything else read back from CRI on each pass.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::events::{EventType, Recorder};
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Pod, PodStatus, Service};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use tracing::{debug, info, warn};

use super::env;
use super::lifecycle;
use super::observe::observe;
use super::plan::{MAX_BACKOFF, Plan, PullBackoff, Step, Waiting, plan};
use super::state::{ContainerState, PodRuntime};
use super::status::{StatusContext, differs, status};
use super::translate::{self, NodeContext, PodFacts, pod_identity};
use crate::cri::{POD_UID_LABEL, Runtime};
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
}

/// Result of a pod sync.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the worker remembers of a pod between syncs (the rest is in CRI).
#[derive(Default)]
struct PodMemory {
    /// Waiting reasons left by the last sync (the kubelet's reason cache).
    waiting: BTreeMap<String, Waiting>,
    /// Image pull back-off per container: (failures, back-off).
    pulls: BTreeMap<String, (u32, PullBackoff)>,
    /// The last status patched, with the resourceVersion of the pod object it
    /// was computed from (the status manager's cache).
    sent: Option<(String, PodStatus)>,
}

/// Everything a pod sync needs; one per agent, shared by every pod worker.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// The runtime.
    pub runtime: Runtime,
    /// Event recorder (reporting component `kubelet`, instance the node name).
    pub recorder: Recorder,
    /// Node facts for sandbox and container configs.
    pub node: NodeContext,
    /// Node facts for the status.
    pub status: StatusContext,
    /// True while the PLEG's event stream is connected (then relists can be rare).
    pub pleg_connected: Arc<AtomicBool>,
    /// The probe manager.
    pub prober: crate::prober::manager::Manager,
    /// Serializes image pulls (the kubelet's `serializeImagePulls: true`).
    pub pull_lock: tokio::sync::Mutex<()>,
    /// The volume manager (set with [`Context::with_volumes`]).
    pub volumes: Arc<VolumeManager>,
    /// The reflector's pods (set with [`Context::with_store`]): a kill in
    /// progress reads the pod's current grace period from it.
    pub pods: Option<Store<Pod>>,
    /// The cluster's Services (set with [`Context::with_services`]), for the
    /// service environment variables; none: no service variables.
    pub services: Option<Store<Service>>,
    memory: Mutex<HashMap<String, PodMemory>>,
    /// The UIDs of the last [`DELETED_KEPT`] pods this agent deleted: the
    /// API server's last update of such a pod (grace period 0) arrives before
    /// its removal and must not sync, and so delete, it again.
    deleted: Mutex<std::collections::VecDeque<String>>,
}

/// How many deleted pods' UIDs [`Context`] remembers.
const DELETED_KEPT: usize = 1024;

impl Context {
    /// A context for the given parts.
    #[must_use]
    pub fn new(
        client: Client,
        runtime: Runtime,
        recorder: Recorder,
        node: NodeContext,
        status: StatusContext,
        pleg_connected: Arc<AtomicBool>,
        prober: crate::prober::manager::Manager,
    ) -> Self {
        let volumes = VolumeManager::new(
            client.clone(),
            crate::config::Settings::default().root_dir,
            BTreeMap::new(),
        );
        Self {
            prober,
            client,
            runtime,
            recorder,
            node,
            status,
            pleg_connected,
            pull_lock: tokio::sync::Mutex::new(()),
            volumes: Arc::new(volumes),
            pods: None,
            services: None,
            memory: Mutex::new(HashMap::new()),
            deleted: Mutex::new(std::collections::VecDeque::new()),
        }
    }

    /// This context with the reflector store of the cluster's Services, the
    /// source of the service environment variables (the kubelet's service lister).
    #[must_use]
    pub fn with_services(mut self, services: Store<Service>) -> Self {
        self.services = Some(services);
        self
    }

    /// This context with `volumes` as its volume manager (the default one keeps
    /// pod directories under the kubelet's default root dir and knows no
    /// allocatable resources).
    #[must_use]
    pub fn with_volumes(mut self, volumes: VolumeManager) -> Self {
        self.volumes = Arc::new(volumes);
        self
    }

    /// This context with `pods` as the source of the pods' latest versions
    /// (without it, a kill uses the grace period it started with).
    #[must_use]
    pub fn with_store(mut self, pods: Store<Pod>) -> Self {
        self.pods = Some(pods);
        self
    }

    /// The grace period of `pod` now, if it is being deleted: from the latest
    /// version in the reflector's store (same UID), else from `pod`.
    fn current_grace(&self, pod: &Pod) -> Option<i64> {
        let latest = self.pods.as_ref().and_then(|store| {
            let (ns, name, uid) = pod_identity(pod);
            store
                .get(&kube::runtime::reflector::ObjectRef::new(&name).within(&ns))
                .filter(|p| p.metadata.uid.as_deref() == Some(uid.as_str()))
        });
        let pod = latest.as_deref().unwrap_or(pod);
        pod.metadata
            .deletion_timestamp
            .is_some()
            .then(|| super::plan::grace_period(pod))
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

    fn memory<T>(&self, uid: &str, f: impl FnOnce(&mut PodMemory) -> T) -> T {
        let mut map = self
            .memory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(map.entry(uid.to_string()).or_default())
    }

    fn forget(&self, uid: &str) {
        let mut map = self
            .memory
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        map.remove(uid);
    }

    /// `pod` as this agent last left it: when the object is the very version
    /// a status patch was computed from (the watch has not yet brought the
    /// patched object back), its status is replaced by the patched one, as
    /// the kubelet builds on its status manager's cached status rather than
    /// the API's. Otherwise a sync before the watch catches up would
    /// recompute, and patch again, what was just written.
    fn with_sent_status(&self, pod: Arc<Pod>, uid: &str) -> Arc<Pod> {
        match self.memory(uid, |m| sent_status_of(&pod, m.sent.as_ref())) {
            Some(status) => {
                let mut p = (*pod).clone();
                p.status = Some(status);
                Arc::new(p)
            }
            None => pod,
        }
    }

    /// Remembers that pod `uid` was deleted from the API by this agent.
    fn mark_deleted(&self, uid: &str) {
        let mut deleted = self
            .deleted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if deleted.len() >= DELETED_KEPT {
            deleted.pop_front();
        }
        deleted.push_back(uid.to_string());
    }

    /// True when this agent deleted pod `uid` from the API.
    fn was_deleted(&self, uid: &str) -> bool {
        self.deleted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .any(|d| d == uid)
    }

    /// Publishes an event about `pod` (or one of its containers) without waiting for it.
    fn event(
        &self,
        pod: &Pod,
        container: Option<&str>,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        crate::events::publish(&self.recorder, pod, container, type_, reason, note);
    }
}

/// The status to see `pod` with, given the last status patched and the
/// resourceVersion it was computed from: that status when `pod` is still that
/// version, else none (the API's object is newer and has the last word).
fn sent_status_of(pod: &Pod, sent: Option<&(String, PodStatus)>) -> Option<PodStatus> {
    let rv = pod.metadata.resource_version.as_deref()?;
    sent.filter(|(at, _)| at == rv)
        .map(|(_, status)| status.clone())
}

/// One sync of `pod`: observe, plan, act, report. Never sleeps; waiting is a requeue.
///
/// # Errors
/// A failed CRI observation or API call; the controller's error policy requeues.
#[tracing::instrument(skip_all, fields(pod = %format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())))]
pub async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action> {
    let (ns, name, uid) = pod_identity(&pod);
    if ctx.was_deleted(&uid) {
        return Ok(Action::await_change());
    }
    let pod = ctx.with_sent_status(pod, &uid);
    let key = format!("{ns}/{name}");
    let rt_err = |source| Error::Runtime {
        pod: key.clone(),
        source,
    };
    let mut rt = observe(&ctx.runtime, &uid).await.map_err(rt_err)?;
    if let Some(rejection) = admission(&pod, &rt, &ctx) {
        reject(&pod, &rejection, &ctx)
            .await
            .map_err(|source| Error::Api { pod: key, source })?;
        return Ok(Action::await_change());
    }
    let now = Timestamp::now();
    let backoffs = ctx.memory(&uid, |m| {
        m.pulls
            .iter()
            .map(|(k, (_, b))| (k.clone(), b.clone()))
            .collect()
    });
    ctx.prober.sync(&pod, &rt);
    let probes = ctx.prober.results(&pod, &rt);
    let mut plan = plan(&pod, &rt, &backoffs, &probes, now);
    let volumes = prepare_volumes(&pod, &rt, &mut plan, &ctx).await;
    if !plan.steps.is_empty() {
        debug!(steps = ?plan.steps, "plan");
    }
    if plan.deadline_exceeded {
        ctx.event(
            &pod,
            None,
            EventType::Normal,
            super::plan::DEADLINE_REASON,
            super::plan::DEADLINE_MESSAGE.into(),
        );
    }
    let mut waiting = plan.waiting.clone();
    for (c, w) in &plan.waiting {
        let (type_, reason) = match w.reason.as_str() {
            "CrashLoopBackOff" => (EventType::Warning, "BackOff"),
            _ => (EventType::Normal, "BackOff"),
        };
        let note = if w.reason == "CrashLoopBackOff" {
            format!("Back-off restarting failed container {c} in pod {name}_{ns}({uid})")
        } else {
            w.message.clone()
        };
        ctx.event(&pod, Some(c), type_, reason, note);
    }
    let acted = !plan.steps.is_empty();
    if pod.metadata.deletion_timestamp.is_some() {
        kill_containers_with_sync_result(&pod, &rt, &mut plan, &waiting, &ctx).await?;
    }
    let mut deleted = false;
    let mut current: Option<(String, cri::PodSandboxConfig, Vec<String>)> = None;
    for step in &plan.steps {
        match step {
            Step::KillContainer {
                id,
                name: c,
                grace_seconds,
                reason,
            } => {
                debug!(container = c, reason, "kill container");
                kill_container(&pod, c, id, *grace_seconds, pod_ip(&rt), &ctx)
                    .await
                    .map_err(rt_err)?;
            }
            Step::StopSandbox { id } => ctx.runtime.stop_pod_sandbox(id).await.map_err(rt_err)?,
            Step::RemoveContainer { id } => {
                ctx.runtime.remove_container(id).await.map_err(rt_err)?
            }
            Step::RemoveSandbox { id } => {
                ctx.runtime.remove_pod_sandbox(id).await.map_err(rt_err)?
            }
            Step::CreateSandbox { attempt, changed } => {
                if *changed {
                    ctx.event(
                        &pod,
                        None,
                        EventType::Normal,
                        "SandboxChanged",
                        "Pod sandbox changed, it will be killed and re-created.".into(),
                    );
                }
                match create_sandbox(&pod, *attempt, &ctx).await {
                    Ok(s) => current = Some(s),
                    Err(msg) => {
                        ctx.event(
                            &pod,
                            None,
                            EventType::Warning,
                            "FailedCreatePodSandBox",
                            msg,
                        );
                        break;
                    }
                }
            }
            Step::StartContainer { name: c, attempt } => {
                if current.is_none() {
                    current = current_sandbox(&pod, &rt, &ctx)?;
                }
                let Some((sandbox_id, sandbox_config, ips)) = &current else {
                    break;
                };
                let Some(spec) = pod.spec.as_ref().and_then(|s| {
                    s.containers
                        .iter()
                        .chain(s.init_containers.iter().flatten())
                        .find(|x| &x.name == c)
                }) else {
                    continue;
                };
                let sandbox = Placement {
                    sandbox_id,
                    sandbox_config,
                    pod_ips: ips,
                    volumes: &volumes,
                };
                match start_container(&pod, spec, *attempt, None, &sandbox, &ctx).await {
                    Ok(()) => ctx.memory(&uid, |m| m.pulls.remove(c)).map_or((), drop),
                    Err(w) => {
                        waiting.insert(c.clone(), w);
                    }
                }
            }
            Step::StartEphemeralContainer { name: c, target_id } => {
                if current.is_none() {
                    current = current_sandbox(&pod, &rt, &ctx)?;
                }
                let Some((sandbox_id, sandbox_config, ips)) = &current else {
                    break;
                };
                let Some(ec) = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.ephemeral_containers.as_ref())
                    .and_then(|ecs| ecs.iter().find(|x| &x.name == c))
                else {
                    continue;
                };
                let spec = super::plan::ephemeral_as_container(ec);
                let target = ec.target_container_name.as_deref().unwrap_or_default();
                let started = match (target, target_id) {
                    ("", _) => None,
                    (_, Some(id)) => Some(Ok(id.as_str())),
                    (t, None) => Some(Err(format!("unable to find target container {t}"))),
                };
                let result = match started {
                    Some(Err(msg)) => {
                        ctx.event(
                            &pod,
                            Some(c),
                            EventType::Warning,
                            "Failed",
                            format!("Error: {msg}"),
                        );
                        Err(Waiting {
                            reason: "CreateContainerConfigError".into(),
                            message: msg,
                        })
                    }
                    target => {
                        let sandbox = Placement {
                            sandbox_id,
                            sandbox_config,
                            pod_ips: ips,
                            volumes: &volumes,
                        };
                        let target = target.and_then(Result::ok);
                        start_container(&pod, &spec, 0, target, &sandbox, &ctx).await
                    }
                };
                match result {
                    Ok(()) => ctx.memory(&uid, |m| m.pulls.remove(c)).map_or((), drop),
                    Err(w) => {
                        waiting.insert(c.clone(), w);
                    }
                }
            }
            Step::DeletePod => {
                ctx.volumes
                    .teardown(&uid)
                    .await
                    .map_err(|source| Error::Volume {
                        pod: key.clone(),
                        source,
                    })?;
                let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
                let dp = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions {
                        uid: Some(uid.clone()),
                        resource_version: None,
                    }),
                    ..DeleteParams::default()
                };
                match api.delete(&name, &dp).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                    Err(source) => return Err(Error::Api { pod: key, source }),
                }
                info!("pod terminated and deleted");
                deleted = true;
            }
        }
    }
    if deleted {
        ctx.mark_deleted(&uid);
        ctx.forget(&uid);
        ctx.prober.forget(&uid);
        return Ok(Action::await_change());
    }
    ctx.memory(&uid, |m| m.waiting = waiting.clone());
    let probes = if acted {
        rt = observe(&ctx.runtime, &uid).await.map_err(rt_err)?;
        ctx.prober.sync(&pod, &rt);
        ctx.prober.results(&pod, &rt)
    } else {
        probes
    };
    let new_status = status(&pod, &rt, &waiting, &probes, &ctx.status, Timestamp::now());
    if differs(pod.status.as_ref(), &new_status) {
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
        let patch = serde_json::json!({ "metadata": { "uid": uid }, "status": new_status });
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::Api { pod: key, source })?;
        let at = pod.metadata.resource_version.clone().unwrap_or_default();
        ctx.memory(&uid, |m| m.sent = Some((at, new_status)));
    }
    let requeue = plan
        .requeue_after
        .map_or(ctx.resync(), |r| r.min(ctx.resync()));
    Ok(Action::requeue(requeue.max(Duration::from_millis(100))))
}

/// The admission verdict on a pod this node has not started yet (no sandbox,
/// not finished, not being deleted), as the kubelet's `canAdmitPod` on pod
/// addition; `None` admits it.
fn admission(pod: &Pod, rt: &PodRuntime, ctx: &Context) -> Option<super::admit::Rejection> {
    if pod.metadata.deletion_timestamp.is_some()
        || super::plan::is_terminal(pod)
        || !rt.sandboxes.is_empty()
        || !rt.containers.is_empty()
    {
        return None;
    }
    super::admit::admit(pod, &ctx.node.allowed_unsafe_sysctls).err()
}

/// Fails a pod the node does not admit, as the kubelet's `rejectPod`: a Warning
/// event with the reason, then phase `Failed` with the reason and
/// `Pod was rejected: <message>`.
///
/// # Errors
/// The status patch failed.
async fn reject(
    pod: &Pod,
    rejection: &super::admit::Rejection,
    ctx: &Context,
) -> std::result::Result<(), kube::Error> {
    let (ns, name, uid) = pod_identity(pod);
    info!(
        reason = rejection.reason,
        detail = rejection.message,
        "pod rejected"
    );
    ctx.event(
        pod,
        None,
        EventType::Warning,
        rejection.reason,
        rejection.message.clone(),
    );
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let patch = serde_json::json!({
        "metadata": { "uid": uid },
        "status": {
            "phase": "Failed",
            "reason": rejection.reason,
            "message": format!("Pod was rejected: {}", rejection.message),
            "qosClass": super::status::qos_class(pod),
        }
    });
    match api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// How often the status of a terminating pod is refreshed while its containers stop.
const TERMINATING_STATUS_PERIOD: Duration = Duration::from_secs(1);

/// Stops the containers of a terminating pod (the plan's `KillContainer`
/// steps, taken out of it, each with its preStop hook): the main containers
/// all at once, as the kubelet's `killContainersWithSyncResult`, then the
/// sidecars in the plan's order; and while they stop within their grace
/// period keeps the pod's status current with the readiness probes, which
/// still run (the kubelet's status manager, `SetContainerReadiness`): a
/// container that turns unready while shutting down makes the pod unready.
///
/// # Errors
/// The first CRI stop that failed.
async fn kill_containers_with_sync_result(
    pod: &Pod,
    rt: &PodRuntime,
    plan: &mut Plan,
    waiting: &BTreeMap<String, Waiting>,
    ctx: &Context,
) -> Result<()> {
    let (ns, name, uid) = pod_identity(pod);
    let kills: Vec<Step> = plan
        .steps
        .iter()
        .filter(|s| matches!(s, Step::KillContainer { .. }))
        .cloned()
        .collect();
    if kills.is_empty() {
        return Ok(());
    }
    plan.steps
        .retain(|s| !matches!(s, Step::KillContainer { .. }));
    // Main containers stop together; sidecars after them, one at a time in
    // the plan's order (reverse start order), as the kubelet stops them.
    let sidecar = |c: &str| {
        super::plan::init_containers(pod)
            .iter()
            .any(|i| i.name == c && super::plan::is_sidecar(i))
    };
    let targets: Vec<(&str, &str, i64)> = kills
        .iter()
        .filter_map(|step| match step {
            Step::KillContainer {
                id,
                name: c,
                grace_seconds,
                reason,
            } => {
                debug!(container = c, reason, "kill container");
                Some((c.as_str(), id.as_str(), *grace_seconds))
            }
            _ => None,
        })
        .collect();
    let (sidecars, mains): (Vec<_>, Vec<_>) = targets.into_iter().partition(|(c, _, _)| sidecar(c));
    let ip = pod_ip(rt);
    let stops = async {
        futures::future::try_join_all(
            mains
                .iter()
                .map(|(c, id, grace)| kill_container(pod, c, id, *grace, ip, ctx)),
        )
        .await?;
        for (c, id, grace) in &sidecars {
            kill_container(pod, c, id, *grace, ip, ctx).await?;
        }
        Ok::<_, crate::cri::Error>(())
    };
    tokio::pin!(stops);
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let mut shown = pod.clone();
    let mut tick = tokio::time::interval(TERMINATING_STATUS_PERIOD);
    loop {
        tokio::select! {
            r = &mut stops => {
                return r.map_err(|source| Error::Runtime {
                    pod: format!("{ns}/{name}"),
                    source,
                });
            }
            _ = tick.tick() => {
                let probes = ctx.prober.results(pod, rt);
                let new = status(&shown, rt, waiting, &probes, &ctx.status, Timestamp::now());
                if differs(shown.status.as_ref(), &new) {
                    let patch = serde_json::json!({ "metadata": { "uid": uid }, "status": new });
                    match api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await
                    {
                        Ok(_) => shown.status = Some(new),
                        Err(e) => debug!(error = %e, "status of a terminating pod"),
                    }
                }
            }
        }
    }
}

/// How soon a pod whose volumes cannot be set up is synced again: the
/// kubelet's first mount retry (`initialDurationBeforeRetry`, 500 ms). The
/// common cause right after binding is the Node authorizer not yet knowing
/// the pod, which lasts milliseconds.
const VOLUME_RETRY: Duration = Duration::from_millis(500);

/// Sets up (or refreshes) the pod's volumes when the plan starts its sandbox or
/// containers, or containers run, as the kubelet's `WaitForAttachAndMount`
/// before `SyncPod`. Each failed volume is a `FailedMount` event; while a
/// volume was never set up, the steps that start the sandbox and containers
/// are dropped, so the pod stays Pending with its containers
/// `ContainerCreating`. A finished pod with nothing left running has its
/// volumes torn down.
async fn prepare_volumes(pod: &Pod, rt: &PodRuntime, plan: &mut Plan, ctx: &Context) -> PodVolumes {
    let starts = |s: &Step| matches!(s, Step::CreateSandbox { .. } | Step::StartContainer { .. });
    let running = rt
        .containers
        .iter()
        .any(|c| c.state == ContainerState::Running);
    if pod.metadata.deletion_timestamp.is_some() || !(running || plan.steps.iter().any(starts)) {
        let finished = super::plan::is_terminal(pod) || super::plan::all_done(pod, rt);
        if finished && plan.steps.is_empty() && rt.all_stopped() {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            if let Err(e) = ctx.volumes.teardown_volumes(uid).await {
                warn!(error = %e, "tear down the volumes of a finished pod");
            }
        }
        return PodVolumes::new();
    }
    let outcome = ctx.volumes.setup(pod).await;
    for (volume, e) in &outcome.errors {
        ctx.event(
            pod,
            None,
            EventType::Warning,
            "FailedMount",
            format!("MountVolume.SetUp failed for volume \"{volume}\" : {e}"),
        );
    }
    let unmounted = outcome.unmounted(pod);
    if !unmounted.is_empty() {
        debug!(?unmounted, "waiting for volumes");
        plan.steps.retain(|s| !starts(s));
        plan.requeue_after = Some(
            plan.requeue_after
                .map_or(VOLUME_RETRY, |r| r.min(VOLUME_RETRY)),
        );
    }
    outcome.volumes
}

/// The ready sandbox of the pod with its config and IPs, for starting containers in it.
fn current_sandbox(
    pod: &Pod,
    rt: &PodRuntime,
    ctx: &Context,
) -> Result<Option<(String, cri::PodSandboxConfig, Vec<String>)>> {
    let Some(s) = rt.latest_sandbox().filter(|s| s.ready) else {
        return Ok(None);
    };
    match translate::sandbox_config(pod, s.attempt, &ctx.node) {
        Ok(cfg) => Ok(Some((s.id.clone(), cfg, s.ips.clone()))),
        Err(e) => {
            warn!(error = %e, "sandbox config");
            Ok(None)
        }
    }
}

/// Creates the pod's log directory and sandbox; returns its ID, config and IPs,
/// or the message of the `FailedCreatePodSandBox` event.
async fn create_sandbox(
    pod: &Pod,
    attempt: u32,
    ctx: &Context,
) -> std::result::Result<(String, cri::PodSandboxConfig, Vec<String>), String> {
    let (ns, name, _) = pod_identity(pod);
    let config = translate::sandbox_config(pod, attempt, &ctx.node)
        .map_err(|e| format!("Failed to create pod sandbox: {e}"))?;
    tokio::fs::create_dir_all(&config.log_directory)
        .await
        .map_err(|e| {
            format!(
                "Failed to create pod sandbox: create log directory {}: {e}",
                config.log_directory
            )
        })?;
    let id = ctx
        .runtime
        .run_pod_sandbox(config.clone(), &format!("pod {ns}/{name}"))
        .await
        .map_err(|e| format!("Failed to create pod sandbox: {e}"))?;
    let ips = match ctx.runtime.pod_sandbox_status(&id).await {
        Ok(Some(st)) => super::observe::sandbox_from(&st).ips,
        _ => Vec::new(),
    };
    Ok((id, config, ips))
}

/// The image pull policy in effect: the spec's, else `Always` for `:latest` or
/// untagged images and `IfNotPresent` otherwise (API defaulting).
fn pull_policy(c: &k8s_openapi::api::core::v1::Container) -> String {
    if let Some(p) = &c.image_pull_policy {
        return p.clone();
    }
    let image = c.image.as_deref().unwrap_or_default();
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') || (last.contains(':') && !last.ends_with(":latest")) {
        "IfNotPresent".into()
    } else {
        "Always".into()
    }
}

/// Where a container is started: the pod's current sandbox, its config and
/// IPs, and the pod's volumes.
struct Placement<'a> {
    /// CRI sandbox ID.
    sandbox_id: &'a str,
    /// The sandbox's config (for image pulls and container creation).
    sandbox_config: &'a cri::PodSandboxConfig,
    /// The sandbox's IPs, primary first.
    pod_ips: &'a [String],
    /// The pod's volumes, set up.
    volumes: &'a PodVolumes,
}

/// The kubelet's `startContainer` steps for container `spec` (a regular,
/// init or ephemeral container): ensure the image, create, start. An ephemeral
/// container with a `target_id` shares the process namespace of that
/// container. A failure returns the waiting reason to show (after its events
/// are sent).
async fn start_container(
    pod: &Pod,
    spec: &k8s_openapi::api::core::v1::Container,
    attempt: u32,
    target_id: Option<&str>,
    at: &Placement<'_>,
    ctx: &Context,
) -> std::result::Result<(), Waiting> {
    let (ns, pod_name, uid) = pod_identity(pod);
    let name = spec.name.as_str();
    let (sandbox_id, sandbox_config, pod_ips, volumes) =
        (at.sandbox_id, at.sandbox_config, at.pod_ips, at.volumes);
    let fail = |reason: &str, message: String| {
        ctx.event(
            pod,
            Some(name),
            EventType::Warning,
            "Failed",
            format!("Error: {reason}"),
        );
        Waiting {
            reason: reason.into(),
            message,
        }
    };
    let image = spec.image.clone().unwrap_or_default();
    if image.is_empty() || image.contains(char::is_whitespace) {
        return Err(fail(
            "InvalidImageName",
            format!("Failed to apply default image tag \"{image}\": invalid reference format"),
        ));
    }
    let image = ensure_image(
        pod,
        name,
        &image,
        &pull_policy(spec),
        sandbox_config,
        ctx,
        &uid,
    )
    .await?;

    let log_dir = std::path::Path::new(&sandbox_config.log_directory).join(name);
    if let Err(e) = tokio::fs::create_dir_all(&log_dir).await {
        return Err(fail(
            "CreateContainerError",
            format!("create log directory {}: {e}", log_dir.display()),
        ));
    }
    // HostNetwork pods have the node's IPs as pod IPs (the kubelet's
    // `generateAPIPodStatus`, whose IPs SyncPod hands to the containers).
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    let pod_ips = if host_network && pod_ips.is_empty() {
        ctx.status.host_ips.as_slice()
    } else {
        pod_ips
    };
    let facts = PodFacts {
        pod_ips: pod_ips.to_vec(),
        host_ips: ctx.status.host_ips.clone(),
    };
    let config_error = |message: String| {
        ctx.event(
            pod,
            Some(name),
            EventType::Warning,
            "Failed",
            format!("Error: {message}"),
        );
        Waiting {
            reason: "CreateContainerConfigError".into(),
            message,
        }
    };
    let mut sources = env_sources(pod, spec, ctx).await;
    sources.services = service_env(pod, ctx).await.map_err(config_error)?;
    let env = env::environment(pod, spec, &ctx.node, &facts, &sources)
        .map_err(|e| config_error(e.to_string()))?;
    translate::verify_run_as_non_root(pod, spec, image.uid, &image.username)
        .map_err(config_error)?;
    let mounts = match crate::volume::container_mounts(spec, volumes, &env) {
        Ok(m) => m,
        Err(e) => return Err(config_error(e.to_string())),
    };
    let mut mounts = mounts;
    if super::hosts::should_mount(pod, spec, pod_ips) {
        let pod_dir = crate::volume::pod_dir(&ctx.node.root_dir, &uid);
        let hosts = super::hosts::make_hosts_mount(
            pod,
            &pod_dir,
            pod_ips,
            &ctx.node.cluster_domain,
            ctx.node.hosts_file(),
        )
        .await
        .map_err(config_error)?;
        mounts.push(hosts);
    }
    let mut config =
        translate::container_config(pod, spec, attempt, &image.id, &env, &ctx.node, mounts);
    if let Some(target) = target_id {
        translate::target_pid_namespace(&mut config, target);
    }
    match termination_log(&ctx.node.root_dir, &uid, spec, attempt).await {
        Ok(mount) => config.mounts.extend(mount),
        Err(e) => {
            return Err(fail(
                "CreateContainerError",
                format!("create termination message file: {e}"),
            ));
        }
    }
    let target = format!("container {name} of pod {ns}/{pod_name}");
    let id = match ctx
        .runtime
        .create_container(sandbox_id, config, sandbox_config.clone(), &target)
        .await
    {
        Ok(id) => id,
        Err(e) => {
            ctx.event(
                pod,
                Some(name),
                EventType::Warning,
                "Failed",
                format!("Error: {e}"),
            );
            return Err(Waiting {
                reason: "CreateContainerError".into(),
                message: e.to_string(),
            });
        }
    };
    ctx.event(
        pod,
        Some(name),
        EventType::Normal,
        "Created",
        format!("Created container: {name}"),
    );
    if let Err(e) = ctx.runtime.start_container(&id).await {
        ctx.event(
            pod,
            Some(name),
            EventType::Warning,
            "Failed",
            format!("Error: {e}"),
        );
        return Err(Waiting {
            reason: "RunContainerError".into(),
            message: e.to_string(),
        });
    }
    ctx.event(
        pod,
        Some(name),
        EventType::Normal,
        "Started",
        format!("Started container {name}"),
    );
    // The kubelet's startContainer step 4: the postStart hook, before the
    // container counts as started; on failure the container is killed.
    if let Some(handler) = spec.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
        let ip = pod_ips.first().and_then(|ip| ip.parse().ok());
        let ran = lifecycle::run_handler(
            &ctx.runtime,
            pod,
            spec,
            &id,
            handler,
            ip,
            lifecycle::POST_START_EXEC_LIMIT,
        )
        .await;
        if let Err(msg) = ran {
            ctx.event(
                pod,
                Some(name),
                EventType::Warning,
                "FailedPostStartHook",
                msg.clone(),
            );
            let grace = super::plan::grace_period(pod);
            if let Err(e) = kill_container(pod, name, &id, grace, ip, ctx).await {
                warn!(error = %e, container = name, "kill container after its postStart hook failed");
            }
            return Err(Waiting {
                reason: "PostStartHookError".into(),
                message: msg,
            });
        }
    }
    Ok(())
}

/// The pod's primary IP from its newest sandbox.
fn pod_ip(rt: &PodRuntime) -> Option<IpAddr> {
    rt.latest_sandbox()
        .and_then(|s| s.ips.first())
        .and_then(|ip| ip.parse().ok())
}

/// Stops container `name` (CRI ID `id`) of `pod` as the kubelet's
/// `killContainer`: the `Killing` event, the container's preStop hook (if any
/// and the grace period is not 0) within `grace_seconds`, then `StopContainer`
/// with what is left of the grace period, at least 2 s. While the hook runs,
/// a shorter grace period set by a new deletion of the pod cuts it short
/// ([`lifecycle::KillBudget`]). A failed hook is a `FailedPreStopHook` event;
/// the container is stopped anyway.
///
/// # Errors
/// `StopContainer` failed.
async fn kill_container(
    pod: &Pod,
    name: &str,
    id: &str,
    grace_seconds: i64,
    pod_ip: Option<IpAddr>,
    ctx: &Context,
) -> crate::cri::Result<()> {
    ctx.event(
        pod,
        Some(name),
        EventType::Normal,
        "Killing",
        format!("Stopping container {name}"),
    );
    let spec = pod.spec.as_ref().and_then(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .find(|c| c.name == name)
    });
    let hook = spec.and_then(|c| Some((c, c.lifecycle.as_ref()?.pre_stop.as_ref()?)));
    let mut budget = lifecycle::KillBudget::new(tokio::time::Instant::now(), grace_seconds);
    if let Some((c, handler)) = hook.filter(|_| grace_seconds > 0) {
        let exec_timeout = Duration::from_secs(u64::try_from(grace_seconds).unwrap_or(0));
        let run = lifecycle::run_handler(&ctx.runtime, pod, c, id, handler, pod_ip, exec_timeout);
        tokio::pin!(run);
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        loop {
            tokio::select! {
                ran = &mut run => {
                    if let Err(msg) = ran {
                        ctx.event(pod, Some(name), EventType::Warning, "FailedPreStopHook", msg);
                    }
                    break;
                }
                () = tokio::time::sleep_until(budget.deadline()) => {
                    debug!(container = name, "preStop hook not completed in the grace period");
                    break;
                }
                _ = tick.tick() => {
                    if let Some(grace) = ctx.current_grace(pod) {
                        budget = budget.observe(grace, tokio::time::Instant::now());
                    }
                }
            }
        }
    }
    ctx.runtime
        .stop_container(id, budget.stop_grace(tokio::time::Instant::now()))
        .await
}

/// What the container is created from: the image ID and the image's user.
struct ImageInfo {
    /// Image ID (`sha256:...`), or the reference the pull returned.
    id: String,
    /// The image's numeric user, if it has one.
    uid: Option<i64>,
    /// The image's user name, if not numeric.
    username: String,
}

impl ImageInfo {
    fn from_cri(i: cri::Image) -> Self {
        Self {
            id: i.id,
            uid: i.uid.map(|u| u.value),
            username: i.username,
        }
    }
}

/// Makes sure `image` is on the node under `policy`; returns the image
/// to create the container from. Failures start the image pull back-off
/// (10 s doubling to 300 s) and return `ErrImagePull` or `ErrImageNeverPull`.
async fn ensure_image(
    pod: &Pod,
    name: &str,
    image: &str,
    policy: &str,
    sandbox_config: &cri::PodSandboxConfig,
    ctx: &Context,
    uid: &str,
) -> std::result::Result<ImageInfo, Waiting> {
    let present = match ctx.runtime.image_id(image).await {
        Ok(found) => found,
        Err(e) => {
            warn!(error = %e, image, "image status");
            None
        }
    };
    if let Some(found) = present.filter(|_| policy != "Always") {
        ctx.event(
            pod,
            Some(name),
            EventType::Normal,
            "Pulled",
            format!("Container image \"{image}\" already present on machine"),
        );
        return Ok(ImageInfo::from_cri(found));
    }
    if policy == "Never" {
        let msg = format!("Container image \"{image}\" is not present with pull policy of Never");
        ctx.event(
            pod,
            Some(name),
            EventType::Warning,
            "ErrImageNeverPull",
            msg.clone(),
        );
        return Err(Waiting {
            reason: "ErrImageNeverPull".into(),
            message: msg,
        });
    }
    ctx.event(
        pod,
        Some(name),
        EventType::Normal,
        "Pulling",
        format!("Pulling image \"{image}\""),
    );
    let credentials = pull_credentials(pod, ctx).await.lookup(image);
    let queued = Instant::now();
    let _serial = ctx.pull_lock.lock().await;
    let started = Instant::now();
    match pull_with(ctx, image, sandbox_config, credentials).await {
        Ok(image_ref) => {
            let (total, pulling) = (queued.elapsed(), started.elapsed());
            ctx.event(
                pod,
                Some(name),
                EventType::Normal,
                "Pulled",
                format!(
                    "Successfully pulled image \"{image}\" in {:.3}s ({:.3}s including waiting)",
                    pulling.as_secs_f64(),
                    total.as_secs_f64()
                ),
            );
            let pulled = ctx.runtime.image_id(image).await.ok().flatten();
            Ok(pulled.map_or_else(
                || ImageInfo {
                    id: if image_ref.is_empty() {
                        image.to_string()
                    } else {
                        image_ref
                    },
                    uid: None,
                    username: String::new(),
                },
                ImageInfo::from_cri,
            ))
        }
        Err(e) => {
            let message = e.to_string();
            ctx.event(
                pod,
                Some(name),
                EventType::Warning,
                "Failed",
                format!("Failed to pull image \"{image}\": {message}"),
            );
            ctx.event(
                pod,
                Some(name),
                EventType::Warning,
                "Failed",
                "Error: ErrImagePull".into(),
            );
            ctx.memory(uid, |m| {
                let failures = m.pulls.get(name).map_or(0, |(n, _)| *n) + 1;
                let delay = (super::plan::INITIAL_BACKOFF * 2u32.saturating_pow(failures - 1))
                    .min(MAX_BACKOFF);
                let until = Timestamp::now() + delay;
                m.pulls.insert(
                    name.to_string(),
                    (
                        failures,
                        PullBackoff {
                            until,
                            image: image.to_string(),
                        },
                    ),
                );
            });
            Err(Waiting {
                reason: "ErrImagePull".into(),
                message,
            })
        }
    }
}

/// Pulls `image` with each of `credentials` in turn until one works, or
/// anonymously when there are none; the last failure otherwise, as the
/// kubelet's `pullImage` tries the keyring's matches.
async fn pull_with(
    ctx: &Context,
    image: &str,
    sandbox_config: &cri::PodSandboxConfig,
    credentials: Vec<cri::AuthConfig>,
) -> crate::cri::Result<String> {
    let mut tries: Vec<Option<cri::AuthConfig>> = credentials.into_iter().map(Some).collect();
    // The last try's outcome is the answer; with no credentials it is anonymous.
    let last = tries.pop().unwrap_or(None);
    for auth in tries {
        if let Ok(image_ref) = ctx
            .runtime
            .pull_image(image, sandbox_config.clone(), auth)
            .await
        {
            return Ok(image_ref);
        }
    }
    ctx.runtime
        .pull_image(image, sandbox_config.clone(), last)
        .await
}

/// The pod's `imagePullSecrets` as a keyring. Secrets that are missing or of
/// the wrong type are skipped with the kubelet's
/// `FailedToRetrieveImagePullSecret` event, and the pull goes on without them.
async fn pull_credentials(pod: &Pod, ctx: &Context) -> super::credentials::Keyring {
    let mut keyring = super::credentials::Keyring::default();
    let names: Vec<String> = pod
        .spec
        .as_ref()
        .and_then(|s| s.image_pull_secrets.as_ref())
        .into_iter()
        .flatten()
        .map(|r| r.name.clone())
        .filter(|n| !n.is_empty())
        .collect();
    if names.is_empty() {
        return keyring;
    }
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let mut missing = Vec::new();
    for name in names {
        let secret = match secrets.get_opt(&name).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                missing.push(name);
                continue;
            }
            Err(e) => {
                warn!(error = %e, secret = name, "get image pull secret");
                missing.push(name);
                continue;
            }
        };
        let data: BTreeMap<String, Vec<u8>> = secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.0))
            .collect();
        if let Err(e) = keyring.add_secret(secret.type_.as_deref().unwrap_or_default(), &data) {
            warn!(error = %e, secret = name, "image pull secret not used");
            missing.push(name);
        }
    }
    if !missing.is_empty() {
        ctx.event(
            pod,
            None,
            EventType::Warning,
            "FailedToRetrieveImagePullSecret",
            format!(
                "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                missing.join(", ")
            ),
        );
    }
    keyring
}

/// Creates the file mounted at the container's `terminationMessagePath`
/// (`<root>/pods/<uid>/containers/<name>/<attempt>`, mode 0666) as the
/// kubelet's `makeMounts` does; none when the path is empty.
///
/// # Errors
/// The file cannot be created.
async fn termination_log(
    root: &std::path::Path,
    uid: &str,
    c: &k8s_openapi::api::core::v1::Container,
    attempt: u32,
) -> std::io::Result<Option<cri::Mount>> {
    use std::os::unix::fs::PermissionsExt;
    let path = c
        .termination_message_path
        .as_deref()
        .unwrap_or("/dev/termination-log");
    if path.is_empty() {
        return Ok(None);
    }
    let dir = root.join("pods").join(uid).join("containers").join(&c.name);
    tokio::fs::create_dir_all(&dir).await?;
    let file = dir.join(attempt.to_string());
    tokio::fs::write(&file, b"").await?;
    tokio::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).await?;
    Ok(Some(cri::Mount {
        container_path: path.to_string(),
        host_path: file.to_string_lossy().into_owned(),
        ..Default::default()
    }))
}

/// Fetches the ConfigMaps and Secrets that the container's environment reads
/// (one GET each: a node may only read the objects its pods reference).
/// Missing or unreadable objects are left out; [`env::environment`] reports them.
async fn env_sources(
    pod: &Pod,
    c: &k8s_openapi::api::core::v1::Container,
    ctx: &Context,
) -> env::EnvSources {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let (ns, _, _) = pod_identity(pod);
    let (cm_names, secret_names) = env::referenced_sources(&[c]);
    let mut sources = env::EnvSources::default();
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    for name in cm_names {
        match cms.get_opt(&name).await {
            Ok(Some(cm)) => {
                let mut data = cm.data.unwrap_or_default();
                for (k, v) in cm.binary_data.unwrap_or_default() {
                    data.insert(k, String::from_utf8_lossy(&v.0).into_owned());
                }
                sources.config_maps.insert(name, data);
            }
            Ok(None) => {}
            Err(e) => warn!(error = %e, configmap = name, "get configmap"),
        }
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    for name in secret_names {
        match secrets.get_opt(&name).await {
            Ok(Some(s)) => {
                let mut data: BTreeMap<String, String> = s
                    .data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
                    .collect();
                data.extend(s.string_data.unwrap_or_default());
                sources.secrets.insert(name, data);
            }
            Ok(None) => {}
            Err(e) => warn!(error = %e, secret = name, "get secret"),
        }
    }
    sources
}

/// How long a container start waits for the first list of Services.
const SERVICES_SYNC_WAIT: Duration = Duration::from_secs(5);

/// The service environment variables of `pod` (none when the pod opted out
/// with `enableServiceLinks: false`, except the `kubernetes` service's), as the
/// kubelet's `getServiceEnvVarMap`.
///
/// # Errors
/// The kubelet's message while Services were never listed.
async fn service_env(
    pod: &Pod,
    ctx: &Context,
) -> std::result::Result<BTreeMap<String, String>, String> {
    let Some(store) = &ctx.services else {
        return Ok(BTreeMap::new());
    };
    if tokio::time::timeout(SERVICES_SYNC_WAIT, store.wait_until_ready())
        .await
        .is_err()
    {
        return Err(
            "services have not yet been read at least once, cannot construct envvars".into(),
        );
    }
    let (ns, _, _) = pod_identity(pod);
    let links = pod
        .spec
        .as_ref()
        .and_then(|s| s.enable_service_links)
        .unwrap_or(true);
    let all = store.state();
    Ok(env::service_env(env::visible_services(
        all.iter().map(AsRef::as_ref),
        &ns,
        links,
    )))
}

/// The controller's error policy: log and retry in 5 s.
#[must_use]
pub fn error_policy(_pod: Arc<Pod>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(%error, "pod sync failed");
    Action::requeue(Duration::from_secs(5))
}

/// Housekeeping (the kubelet's `HandlePodCleanups`): stops and removes the
/// sandboxes and containers of pods that are no longer bound to this node, such
/// as pods deleted while the agent was down or force-deleted, then tears down
/// their volumes and directories. A pod the reflector's cache does not know is
/// looked up in the API server first, so a cache that is still listing never
/// costs a running pod.
///
/// # Errors
/// The first CRI call that fails.
pub async fn cleanup_orphans(
    runtime: &Runtime,
    client: &Client,
    store: &Store<Pod>,
    volumes: &VolumeManager,
) -> crate::cri::Result<usize> {
    let known: HashSet<String> = store
        .state()
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let sandboxes = runtime.list_pod_sandboxes(HashMap::new()).await?;
    // Pods the local cache does not know, by UID, with their namespace and name.
    let candidates: HashMap<String, (String, String)> = sandboxes
        .iter()
        .filter_map(|s| {
            let uid = s.labels.get(POD_UID_LABEL)?;
            let ns = s.labels.get(crate::cri::POD_NAMESPACE_LABEL)?;
            let name = s.labels.get(crate::cri::POD_NAME_LABEL)?;
            (!known.contains(uid)).then(|| (uid.clone(), (ns.clone(), name.clone())))
        })
        .collect();
    // Orphans are cleaned up concurrently: each may wait for a container to stop.
    let results = futures::future::join_all(
        candidates
            .into_iter()
            .map(|(uid, (ns, name))| cleanup_orphan(runtime, client, volumes, uid, ns, name)),
    )
    .await;
    let mut removed = 0;
    for r in results {
        removed += usize::from(r?);
    }
    Ok(removed)
}

/// Cleans up one pod the cache does not know, unless the API server still has it.
async fn cleanup_orphan(
    runtime: &Runtime,
    client: &Client,
    volumes: &VolumeManager,
    uid: String,
    ns: String,
    name: String,
) -> crate::cri::Result<bool> {
    // The cache may be behind (just started, or relisting): ask the API server.
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    match api.get_opt(&name).await {
        Ok(Some(p)) if p.metadata.uid.as_deref() == Some(uid.as_str()) => return Ok(false),
        Ok(_) => {}
        // The Node authorizer forbids reading a pod that is not bound to this node,
        // which includes one that no longer exists.
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        Err(e) => {
            debug!(error = %e, pod = %format!("{ns}/{name}"), "housekeeping: get pod");
            return Ok(false);
        }
    }
    let by_uid = HashMap::from([(POD_UID_LABEL.to_string(), uid.clone())]);
    for c in runtime.list_containers(by_uid.clone()).await? {
        if c.state == cri::ContainerState::ContainerRunning as i32 {
            runtime.stop_container(&c.id, 2).await?;
        }
        runtime.remove_container(&c.id).await?;
    }
    for s in runtime.list_pod_sandboxes(by_uid).await? {
        runtime.stop_pod_sandbox(&s.id).await?;
        runtime.remove_pod_sandbox(&s.id).await?;
    }
    if let Err(e) = volumes.teardown(&uid).await {
        warn!(pod_uid = uid, error = %e, "housekeeping: remove pod directory");
    }
    info!(
        pod_uid = uid,
        "removed the sandboxes, containers and volumes of a pod no longer bound to this node"
    );
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::fixtures::pod;

    #[test]
    fn a_stale_pod_is_seen_with_the_status_last_sent() {
        let status = |phase: &str| PodStatus {
            phase: Some(phase.into()),
            ..PodStatus::default()
        };
        let mut p = pod("web").container("c", "busybox").build();
        p.metadata.resource_version = Some("7".into());
        p.status = Some(status("Pending"));
        let sent = ("7".to_string(), status("Running"));
        // The watch has not brought the patched pod back: it is version 7 still.
        assert_eq!(sent_status_of(&p, Some(&sent)), Some(status("Running")));
        // A newer version (the patch's echo, or someone else's change) wins.
        p.metadata.resource_version = Some("8".into());
        assert_eq!(sent_status_of(&p, Some(&sent)), None);
        // Nothing sent, or an object without a version: the API's status.
        assert_eq!(sent_status_of(&p, None), None);
        p.metadata.resource_version = None;
        assert_eq!(sent_status_of(&p, Some(&sent)), None);
    }
}
