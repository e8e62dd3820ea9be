//! The runtime manager: carries out a pod's [`Plan`] steps through CRI, as
//! the kubelet's kuberuntime manager (`SyncPod` after `computePodActions`,
//! `startContainer`, `killContainer`, `killPodWithSyncResult`): sandboxes are
//! created with their log directory, containers are started with their image
//! ensured (the [`ImageManager`]), their environment, mounts and termination
//! message file, and stopped with their preStop hook inside the grace period.
//! What a step could not do comes back as the container's waiting reason.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::runtime::reflector::{ObjectRef, Store};
use tracing::{debug, info, warn};

use super::env_sources::SourceReader;
use super::image_manager::ImageManager;
use super::lifecycle;
use super::userns::UsernsManager;
use crate::cri::Runtime;
use crate::cri::extension::ImageSubPaths;
use crate::events::{EventType, Recorder};
use crate::pod_core::env;
use crate::pod_core::facts::{NodeContext, PodFacts, pod_identity};
use crate::pod_core::plan::{Plan, Step, Waiting};
use crate::pod_core::runtime::PodRuntime;
use crate::pod_core::spec;
use crate::pod_core::translate::{self, Isolation, UserNamespaceNeed};
use crate::reasons::{event, waiting};
use crate::volume::PodVolumes;

/// The attempt a container is created with and the attempt its
/// CrashLoopBackOff counts from (see [`crate::pod_core::plan::backoff_since`]).
#[derive(Clone, Copy, Debug, Default)]
struct Attempt {
    number: u32,
    backoff_since: u32,
}

/// The runtime manager; one per agent, shared by every pod worker.
pub struct RuntimeManager {
    /// The container runtime.
    pub runtime: Runtime,
    /// The image manager.
    pub images: ImageManager,
    /// Where environments are read from.
    pub sources: SourceReader,
    /// Event recorder (reporting component `kubelet`, instance the node name).
    pub recorder: Recorder,
    /// Node facts for sandbox and container configs.
    pub node: NodeContext,
    /// The reflector's pods: a kill in progress reads the pod's current grace
    /// period from it.
    pub pods: Store<Pod>,
    /// The API client: RuntimeClasses are read through it.
    pub client: kube::Client,
    /// The host ID ranges of pods with their own user namespace.
    pub userns: UsernsManager,
    /// Where started containers get their log link (`/var/log/containers`,
    /// [`crate::log_links`]).
    pub log_links_dir: std::path::PathBuf,
    /// The pod and QoS cgroups (`cgroupsPerQOS`); None: pods run in the
    /// runtime's own cgroups.
    pub cgroups: Option<crate::cgroups::CgroupManager>,
    /// The device manager: what containers get of the devices they were
    /// given (None: no device plugins).
    pub devices: Option<crate::device_manager::DeviceManager>,
    /// The DRA manager: a pod's ResourceClaims are prepared before its
    /// sandbox is made, and give its containers their CDI devices.
    pub dra: crate::dra::DraManager,
    /// The CPU manager: the cpuset each container is created with.
    pub cpus: Option<crate::cpu_manager::CpuManager>,
    /// The memory manager: the `cpuset.mems` each container is created with.
    pub memory: Option<crate::memory_manager::MemoryManager>,
    /// The topology manager's settings, for admission.
    pub topology: crate::topology_manager::TopologyManager,
}

/// What carrying out a plan left behind.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Containers that could not start this time, with why (`state.waiting`).
    pub waiting: BTreeMap<String, Waiting>,
    /// The plan reached [`Step::DeletePod`]: the pod's runtime objects are
    /// gone and the Pod object is to be deleted.
    pub delete_pod: bool,
    /// Why an in-place resize failed (the runtime's error), for the
    /// `PodResizeInProgress` condition's `Error` reason.
    pub resize_error: Option<String>,
    /// The limits of the pod's cgroup once the plan was carried out (None:
    /// the pod has none, or it could not be read), for the pod-level
    /// `status.resources`.
    pub pod_cgroup: Option<crate::cgroups::Limits>,
    /// The pass ended before a sandbox was made: the pod's claims were not
    /// prepared or `RunPodSandbox` failed. The pod is tried again after the
    /// pod worker's back-off, not at its next resync.
    pub sandbox_failed: bool,
}

/// Where a container is started: the pod's current sandbox, its config and IPs.
struct Placement {
    /// CRI sandbox ID.
    sandbox_id: String,
    /// The sandbox's config (for image pulls and container creation).
    config: cri::PodSandboxConfig,
    /// The sandbox's IPs, primary first.
    pod_ips: Vec<String>,
    /// The pod's runtime handler and user namespace.
    isolation: Isolation,
}

/// How far one pass's resize has gone.
#[derive(Default)]
struct ResizeState {
    /// The lowered memory limits were checked against usage.
    memory_checked: bool,
    /// The pod's cgroup was grown (to be set exactly at the end).
    pod_cgroup_grown: bool,
}

/// How often a running postStart hook looks whether its pod is being deleted.
const DELETION_POLL: Duration = Duration::from_millis(500);

/// A step failed on the runtime (the pod's sync fails and is retried).
pub type Result<T, E = crate::cri::Error> = std::result::Result<T, E>;

impl RuntimeManager {
    fn event(&self, pod: &Pod, c: Option<&str>, type_: EventType, reason: &str, note: String) {
        crate::events::publish(&self.recorder, pod, c, type_, reason, note);
    }

    /// Carries out `steps` of `pod`'s plan in order against its runtime state
    /// `rt`, with its set-up `volumes`. Container start failures become
    /// waiting reasons; a sandbox that cannot be created ends the pass (its
    /// `FailedCreatePodSandBox` event sent), as `SyncPod` returns there, and
    /// so do claims that cannot be prepared (`FailedPrepareDynamicResources`):
    /// [`Outcome::sandbox_failed`].
    ///
    /// # Errors
    /// A CRI call that stops, removes or kills failed.
    pub async fn execute(
        &self,
        pod: &Pod,
        rt: &PodRuntime,
        steps: &[Step],
        volumes: &PodVolumes,
    ) -> Result<Outcome> {
        let mut outcome = Outcome::default();
        let mut placement: Option<Placement> = None;
        let mut resize = ResizeState::default();
        // A pod-level resize (its cgroup's limits are not its allocation's)
        // comes first, as the kubelet's `UpdatePodLevelResources`, even when
        // no container is resized with it.
        if self.pod_cgroup_resize_needed(pod, rt, steps) {
            self.begin_resize(pod, rt, steps, &mut resize, &mut outcome)
                .await;
        }
        for step in steps {
            match step {
                Step::KillContainer {
                    id,
                    name,
                    grace_seconds,
                    reason,
                } => {
                    debug!(container = name, reason, "kill container");
                    self.kill_container(pod, name, id, *grace_seconds, pod_ip(rt), reason)
                        .await?;
                }
                Step::StopSandbox { id } => self.runtime.stop_pod_sandbox(id).await?,
                Step::RemoveContainer { id } => {
                    crate::container_gc::remove_container(&self.runtime, id, &self.log_links_dir)
                        .await?;
                }
                Step::RemoveSandbox { id } => self.runtime.remove_pod_sandbox(id).await?,
                Step::CreateSandbox { attempt, changed } => {
                    if *changed {
                        let note = "Pod sandbox changed, it will be killed and re-created.";
                        let reason = event::SANDBOX_CHANGED;
                        self.event(pod, None, EventType::Normal, reason, note.into());
                    }
                    // Claims first, as the kubelet's `SyncPod` before
                    // `createPodSandbox`: a pod whose devices are not
                    // prepared gets no sandbox, and waits.
                    if let Err(e) = self.dra.prepare(pod).await {
                        let reason = event::FAILED_PREPARE_DYNAMIC_RESOURCES;
                        let note = format!("Failed to prepare dynamic resources: {e}");
                        self.event(pod, None, EventType::Warning, reason, note);
                        outcome.sandbox_failed = true;
                        break;
                    }
                    match self.create_sandbox(pod, *attempt).await {
                        Ok(p) => placement = Some(p),
                        Err(msg) => {
                            let reason = event::FAILED_CREATE_POD_SANDBOX;
                            self.event(pod, None, EventType::Warning, reason, msg);
                            outcome.sandbox_failed = true;
                            break;
                        }
                    }
                }
                Step::StartContainer { .. } | Step::StartEphemeralContainer { .. }
                    if self.current_grace(pod).is_some() =>
                {
                    // The pod became terminating during this pass (a
                    // postStart hook was cut short): nothing more starts.
                    break;
                }
                Step::StartContainer {
                    name,
                    attempt,
                    backoff_since,
                } => {
                    if placement.is_none() {
                        placement = self.current_sandbox(pod, rt).await;
                    }
                    let Some(at) = &placement else { break };
                    let Some(c) = spec::find_container(pod, name) else {
                        continue;
                    };
                    let attempt = Attempt {
                        number: *attempt,
                        backoff_since: *backoff_since,
                    };
                    let started = self.start_container(pod, c, attempt, None, at, volumes);
                    self.record_start(pod, name, started.await, &mut outcome);
                }
                Step::StartEphemeralContainer { name, target_id } => {
                    if placement.is_none() {
                        placement = self.current_sandbox(pod, rt).await;
                    }
                    let Some(at) = &placement else { break };
                    let started =
                        self.start_ephemeral(pod, name, target_id.as_deref(), at, volumes);
                    if let Some(result) = started.await {
                        self.record_start(pod, name, result, &mut outcome);
                    }
                }
                Step::ResizeContainer { .. } if outcome.resize_error.is_some() => {
                    // The first failure ends the resize (the next sync tries
                    // again, as the kubelet's `doPodResizeAction`); the rest
                    // of the plan goes on.
                }
                Step::ResizeContainer { id, name } => {
                    let Some(c) = spec::find_container(pod, name) else {
                        continue;
                    };
                    if !self
                        .begin_resize(pod, rt, steps, &mut resize, &mut outcome)
                        .await
                    {
                        continue;
                    }
                    let linux = translate::linux_resources(pod, c, &self.node);
                    match self.runtime.update_container_resources(id, linux).await {
                        Ok(()) => info!(
                            pod = %pod_identity(pod).1,
                            container = name,
                            "container resized in place"
                        ),
                        Err(e) => outcome.resize_error = Some(e.to_string()),
                    }
                }
                Step::DeletePod => {
                    outcome.delete_pod = true;
                    break;
                }
            }
        }
        if resize.pod_cgroup_grown
            && outcome.resize_error.is_none()
            && let Err(e) = self.resize_pod_cgroup(pod, false)
        {
            outcome.resize_error = Some(e.to_string());
        }
        outcome.pod_cgroup = self.pod_cgroup_now(pod);
        Ok(outcome)
    }

    /// Begins the resize of `steps` once (`state`): nothing is resized while
    /// a lowered memory limit would sit below what is in use, and the pod's
    /// cgroup grows before its containers, to shrink after them
    /// ([`Self::execute`]'s end), as the kubelet's `doPodResizeAction`.
    /// False when the resize cannot go on (the error is in `outcome`).
    async fn begin_resize(
        &self,
        pod: &Pod,
        rt: &PodRuntime,
        steps: &[Step],
        state: &mut ResizeState,
        outcome: &mut Outcome,
    ) -> bool {
        if outcome.resize_error.is_some() {
            return false;
        }
        if !state.memory_checked {
            state.memory_checked = true;
            if let Some(e) = self.memory_decrease_error(pod, rt, steps).await {
                outcome.resize_error = Some(e);
                return false;
            }
        }
        if !state.pod_cgroup_grown {
            state.pod_cgroup_grown = true;
            if let Err(e) = self.resize_pod_cgroup(pod, true) {
                outcome.resize_error = Some(e.to_string());
                return false;
            }
        }
        true
    }

    /// The limits `pod`'s cgroup has now, its cpu shares taken as its
    /// allocation's when cgroup v2's weight is all that differs
    /// ([`crate::cgroups::CgroupManager::as_allocated`]); None without one
    /// (pod cgroups off, a pod from before them) or when it cannot be read.
    pub fn pod_cgroup_now(&self, pod: &Pod) -> Option<crate::cgroups::Limits> {
        let (cgroups, qos, uid) = self.pod_cgroup(pod)?;
        if !cgroups.has_pod(qos, uid) {
            return None;
        }
        cgroups
            .pod_dir(qos, uid)
            .and_then(|dir| cgroups.limits(&dir))
            .ok()
            .map(|now| {
                cgroups.as_allocated(
                    now,
                    &translate::pod_cgroup_limits(pod, self.node.cpu_period_us),
                )
            })
    }

    /// Whether the running `pod`'s cgroup must be resized to its
    /// allocation's limits: its sandbox is ready and stays (`steps` neither
    /// stop nor replace it), and the cgroup's limits are not
    /// [`translate::pod_cgroup_limits`] (memory compared in whole pages, as
    /// the kernel keeps it).
    fn pod_cgroup_resize_needed(&self, pod: &Pod, rt: &PodRuntime, steps: &[Step]) -> bool {
        let running = rt.latest_sandbox().is_some_and(|s| s.ready)
            && pod.metadata.deletion_timestamp.is_none()
            && !spec::is_terminal(pod)
            && !steps.iter().any(|s| {
                matches!(
                    s,
                    Step::StopSandbox { .. } | Step::CreateSandbox { .. } | Step::DeletePod
                )
            });
        running
            && self.pod_cgroup_now(pod).is_some_and(|now| {
                !now.same_as(&translate::pod_cgroup_limits(pod, self.node.cpu_period_us))
            })
    }

    /// Notes how a container start went: its pull back-off ends, or its
    /// waiting reason is kept for the status.
    fn record_start(
        &self,
        pod: &Pod,
        name: &str,
        result: std::result::Result<(), Waiting>,
        outcome: &mut Outcome,
    ) {
        match result {
            Ok(()) => {
                let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                self.images.started(uid, name);
            }
            Err(w) => {
                outcome.waiting.insert(name.to_string(), w);
            }
        }
    }

    /// Starts ephemeral container `name` (none when the spec no longer has
    /// it), joining the process namespace of its target container `target_id`
    /// when it names one; a target that does not exist is a
    /// `CreateContainerConfigError`.
    async fn start_ephemeral(
        &self,
        pod: &Pod,
        name: &str,
        target_id: Option<&str>,
        at: &Placement,
        volumes: &PodVolumes,
    ) -> Option<std::result::Result<(), Waiting>> {
        let ec = pod
            .spec
            .as_ref()
            .and_then(|s| s.ephemeral_containers.as_ref())
            .and_then(|ecs| ecs.iter().find(|x| x.name == name))?;
        let c = spec::ephemeral_as_container(ec);
        let target = ec.target_container_name.as_deref().unwrap_or_default();
        if !target.is_empty() && target_id.is_none() {
            let msg = format!("unable to find target container {target}");
            let note = format!("Error: {msg}");
            self.event(pod, Some(name), EventType::Warning, event::FAILED, note);
            return Some(Err(Waiting {
                reason: waiting::CREATE_CONTAINER_CONFIG_ERROR.into(),
                message: msg,
            }));
        }
        let target_id = target_id.filter(|_| !target.is_empty());
        Some(
            self.start_container(pod, &c, Attempt::default(), target_id, at, volumes)
                .await,
        )
    }

    /// Why the resize of `steps` cannot lower a memory limit now: the new
    /// limit of the pod's cgroup or of a resized container is at most what it
    /// uses (page cache included), as the kubelet's
    /// `validateMemoryResizeAction` checks before it changes anything.
    /// Only limits that are lowered or newly set are checked (the
    /// containers' current limits as `rt` reports them); a container the
    /// runtime has no stats for is not. A usage that cannot be read is the
    /// kubelet's "unable to read memory usage" error. None: the resize may
    /// go on.
    async fn memory_decrease_error(
        &self,
        pod: &Pod,
        rt: &PodRuntime,
        steps: &[Step],
    ) -> Option<String> {
        let mut errors = Vec::new();
        if let Some((cgroups, qos, uid)) = self.pod_cgroup(pod)
            && cgroups.has_pod(qos, uid)
            && let Some(desired) = translate::pod_cgroup_limits(pod, self.node.cpu_period_us).memory
        {
            let current = cgroups
                .pod_dir(qos, uid)
                .and_then(|dir| cgroups.limits(&dir))
                .ok()
                .and_then(|l| l.memory);
            if current.is_none_or(|c| desired < c) {
                match cgroups.pod_memory_usage(qos, uid) {
                    Ok(Some(used)) => {
                        if i128::from(used) >= i128::from(desired) {
                            errors.push(format!(
                                "attempting to set pod memory limit ({desired}) below current usage ({used})"
                            ));
                        }
                    }
                    _ => errors.push("missing pod memory usage".to_string()),
                }
            }
        }
        for step in steps {
            let Step::ResizeContainer { id, name } = step else {
                continue;
            };
            let Some(c) = spec::find_container(pod, name) else {
                continue;
            };
            let desired = translate::linux_resources(pod, c, &self.node).memory_limit_in_bytes;
            if desired <= 0 {
                continue;
            }
            // What it runs with, as the runtime reported it for this sync;
            // unknown limits cannot be compared: the kubelet's message.
            let Some(current) = rt
                .containers
                .iter()
                .find(|x| &x.id == id)
                .and_then(|x| x.resources)
                .map(|r| r.memory_limit_in_bytes)
            else {
                let (ns, pod_name, uid) = pod_identity(pod);
                return Some(format!(
                    "unable to read memory usage for pod \"{pod_name}_{ns}({uid})\""
                ));
            };
            if current > 0 && desired >= current {
                continue;
            }
            let stats = match self.runtime.container_stats(id).await {
                Ok(stats) => stats,
                Err(_) => {
                    let (ns, pod_name, uid) = pod_identity(pod);
                    return Some(format!(
                        "unable to read memory usage for pod \"{pod_name}_{ns}({uid})\""
                    ));
                }
            };
            let Some(stats) = stats else { continue };
            match stats.memory.and_then(|m| m.usage_bytes).map(|u| u.value) {
                Some(used) => {
                    if i128::from(used) >= i128::from(desired) {
                        errors.push(format!(
                            "attempting to set container {name:?} memory limit ({desired}) below current usage ({used})"
                        ));
                    }
                }
                None => errors.push(format!("missing container {name:?} memory usage")),
            }
        }
        (!errors.is_empty()).then(|| memory_decrease_message(&errors))
    }

    /// The cgroup manager with `pod`'s QoS class and UID, when pod cgroups
    /// are on.
    fn pod_cgroup<'a>(
        &'a self,
        pod: &'a Pod,
    ) -> Option<(
        &'a crate::cgroups::CgroupManager,
        crate::pod_core::qos::QosClass,
        &'a str,
    )> {
        let cgroups = self.cgroups.as_ref()?;
        let qos = crate::pod_core::qos::qos_class(pod);
        Some((
            cgroups,
            qos,
            pod.metadata.uid.as_deref().unwrap_or_default(),
        ))
    }

    /// Sets `pod`'s cgroup (if it has one) to the limits of its resources:
    /// with `grow`, only what grows (each limit the larger of now and then),
    /// so its containers' new limits fit in it; else exactly.
    ///
    /// # Errors
    /// The cgroup filesystem refused a limit.
    fn resize_pod_cgroup(
        &self,
        pod: &Pod,
        grow: bool,
    ) -> std::result::Result<(), crate::cgroups::Error> {
        let Some((cgroups, qos, uid)) = self.pod_cgroup(pod) else {
            return Ok(());
        };
        if !cgroups.has_pod(qos, uid) {
            return Ok(());
        }
        let new = translate::pod_cgroup_limits(pod, self.node.cpu_period_us);
        let limits = if grow {
            let now = cgroups.limits(&cgroups.pod_dir(qos, uid)?)?;
            // None is no limit, the largest of all.
            let larger = |a: Option<i64>, b: Option<i64>| a.zip(b).map(|(a, b)| a.max(b));
            crate::cgroups::Limits {
                cpu_shares: now.cpu_shares.max(new.cpu_shares),
                cpu_quota: larger(now.cpu_quota, new.cpu_quota),
                memory: larger(now.memory, new.memory),
            }
        } else {
            new
        };
        cgroups.update_pod(qos, uid, limits)
    }

    /// Puts the sandbox of `config` in `pod`'s cgroup (CRI `cgroup_parent`)
    /// when pod cgroups are on: made with the pod's limits when `make`, else
    /// only when it exists (a sandbox made without one keeps its
    /// containers where they are).
    ///
    /// # Errors
    /// The cgroup could not be made.
    fn place_in_pod_cgroup(
        &self,
        pod: &Pod,
        config: &mut k8s_cri::v1::PodSandboxConfig,
        make: bool,
    ) -> std::result::Result<(), crate::cgroups::Error> {
        let Some((cgroups, qos, uid)) = self.pod_cgroup(pod) else {
            return Ok(());
        };
        let parent = if make {
            let huge = translate::pod_huge_page_limits(pod);
            if !cgroups.limits_huge_pages() && huge.values().any(|b| *b > 0) {
                self.event(
                    pod,
                    None,
                    EventType::Warning,
                    event::HUGE_PAGES_NOT_LIMITED,
                    "the node has no hugetlb cgroup controller: the pod's huge page requests are not enforced as limits".into(),
                );
            }
            cgroups.ensure_pod(
                qos,
                uid,
                translate::pod_cgroup_limits(pod, self.node.cpu_period_us),
                &huge,
            )?
        } else if cgroups.has_pod(qos, uid) {
            cgroups.cgroup_parent(qos, uid)?
        } else {
            return Ok(());
        };
        config
            .linux
            .get_or_insert_with(Default::default)
            .cgroup_parent = parent;
        Ok(())
    }

    /// The ready sandbox of the pod with its config and IPs, for starting
    /// containers in it; none without one.
    async fn current_sandbox(&self, pod: &Pod, rt: &PodRuntime) -> Option<Placement> {
        let s = rt.latest_sandbox().filter(|s| s.ready)?;
        let isolation = match self.isolation(pod).await {
            Ok(i) => i,
            Err(e) => {
                warn!(error = %e, "isolation of the pod's sandbox");
                return None;
            }
        };
        match translate::sandbox_config(pod, s.attempt, &self.node, &isolation).map(|mut c| {
            // The cgroup its sandbox was made in, if it was.
            if let Err(e) = self.place_in_pod_cgroup(pod, &mut c, false) {
                warn!(error = %e, "pod cgroup");
            }
            c
        }) {
            Ok(config) => Some(Placement {
                sandbox_id: s.id.clone(),
                config,
                pod_ips: s.ips.clone(),
                isolation,
            }),
            Err(e) => {
                warn!(error = %e, "sandbox config");
                None
            }
        }
    }

    /// The pod's [`Isolation`], as the kubelet's `createPodSandbox` and
    /// `NamespacesForPod`: the handler of its RuntimeClass (read from the
    /// API, as the kubelet's runtimeclass manager; `""` without one),
    /// checked against the handlers the runtime reports, and its user
    /// namespace ([`translate::user_namespace_need`], with a range from the
    /// [`UsernsManager`]). The runtime's `Status` is asked only for a pod
    /// with a RuntimeClass or its own user namespace.
    ///
    /// # Errors
    /// Why the pod cannot run here, in the kubelet's words: the RuntimeClass
    /// does not exist, the runtime does not know its handler, or cannot give
    /// the pod the user namespace it asks for. Never a fallback.
    async fn isolation(&self, pod: &Pod) -> std::result::Result<Isolation, String> {
        let spec = pod.spec.as_ref();
        let class = runtime_class(pod);
        let runtime_handler = self.runtime_handler(pod).await?;
        let own_userns = spec.and_then(|s| s.host_users) == Some(false);
        let handlers = if class.is_some() || own_userns {
            let status = self.runtime.status().await.map_err(|e| e.to_string())?;
            translate::check_runtime_handler(&runtime_handler, &status.runtime_handlers)?;
            status.runtime_handlers
        } else {
            Vec::new()
        };
        let gate = self.node.user_namespaces_support;
        let need = translate::user_namespace_need(pod, &runtime_handler, &handlers, gate)?;
        let user_namespace = match need {
            UserNamespaceNeed::Unspecified => None,
            UserNamespaceNeed::Host => Some(translate::host_user_namespace()),
            UserNamespaceNeed::Pod => {
                let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                let first = self.userns.get_or_create(uid).map_err(|e| e.to_string())?;
                Some(translate::pod_user_namespace(first))
            }
        };
        Ok(Isolation {
            runtime_handler,
            user_namespace,
        })
    }

    /// The runtime handler of `pod`: its RuntimeClass's `handler`, read from
    /// the API, else the runtime's default (`""`), as the kubelet's
    /// `RuntimeClassManager.LookupRuntimeHandler`.
    ///
    /// # Errors
    /// The kubelet's words when the RuntimeClass does not exist or cannot be read.
    async fn runtime_handler(&self, pod: &Pod) -> std::result::Result<String, String> {
        use k8s_openapi::api::node::v1::RuntimeClass;
        let Some(name) = runtime_class(pod) else {
            return Ok(String::new());
        };
        match kube::Api::<RuntimeClass>::all(self.client.clone())
            .get_opt(name)
            .await
        {
            Ok(Some(rc)) => Ok(rc.handler),
            Ok(None) => Err(format!("runtimeclass.node.k8s.io {name:?} not found")),
            Err(e) => Err(format!("failed to lookup RuntimeClass {name}: {e}")),
        }
    }

    /// Whether the runtime handler of `pod` mounts recursively read-only
    /// ([`translate::handler_supports_rro`]), as the kubelet's
    /// `runtimeSupportsRRO`. False when the RuntimeClass or the runtime's
    /// status cannot be read.
    async fn runtime_supports_rro(&self, pod: &Pod) -> bool {
        let Ok(handler) = self.runtime_handler(pod).await else {
            return false;
        };
        self.runtime
            .status()
            .await
            .is_ok_and(|s| translate::handler_supports_rro(&s.runtime_handlers, &handler))
    }

    /// Creates the pod's log directory and sandbox (attempt `attempt`) with
    /// its [`Isolation`].
    ///
    /// # Errors
    /// The message of the `FailedCreatePodSandBox` event.
    async fn create_sandbox(
        &self,
        pod: &Pod,
        attempt: u32,
    ) -> std::result::Result<Placement, String> {
        let (ns, name, _) = pod_identity(pod);
        let failed = |e: String| format!("Failed to create pod sandbox: {e}");
        let isolation = self.isolation(pod).await.map_err(failed)?;
        let mut config = translate::sandbox_config(pod, attempt, &self.node, &isolation)
            .map_err(|e| failed(e.to_string()))?;
        let omitted = translate::oversized_metadata(pod);
        if !omitted.is_empty() {
            self.event(
                pod,
                None,
                EventType::Warning,
                event::SANDBOX_METADATA_OMITTED,
                format!(
                    "the pod's labels and annotations take more than {} bytes: its {} were not passed to the container runtime",
                    translate::MAX_SANDBOX_METADATA_BYTES,
                    omitted.join(" and ")
                ),
            );
        }
        self.place_in_pod_cgroup(pod, &mut config, true)
            .map_err(|e| failed(e.to_string()))?;
        tokio::fs::create_dir_all(&config.log_directory)
            .await
            .map_err(|e| {
                format!(
                    "Failed to create pod sandbox: create log directory {}: {e}",
                    config.log_directory
                )
            })?;
        let sandbox_id = self
            .runtime
            .run_pod_sandbox(
                config.clone(),
                &isolation.runtime_handler,
                &format!("pod {ns}/{name}"),
            )
            .await
            .map_err(|e| failed(e.to_string()))?;
        crate::startup_trace::mark(pod, crate::startup_trace::Stage::SandboxReady);
        let pod_ips = match self.runtime.pod_sandbox_status(&sandbox_id).await {
            Ok(Some(st)) => crate::container::observe::sandbox_from(&st).ips,
            _ => Vec::new(),
        };
        Ok(Placement {
            sandbox_id,
            config,
            pod_ips,
            isolation,
        })
    }

    /// The kubelet's `startContainer` for container `c` (a regular, init or
    /// ephemeral container), numbered as its steps: (1) ensure the image,
    /// (2) build the config and create the container, (3) start it, (4) run
    /// its postStart hook, killing it when the hook fails. An ephemeral
    /// container with a `target_id` shares that container's process
    /// namespace. A failure returns the waiting reason to show, its events sent.
    async fn start_container(
        &self,
        pod: &Pod,
        c: &Container,
        attempt: Attempt,
        target_id: Option<&str>,
        at: &Placement,
        volumes: &PodVolumes,
    ) -> std::result::Result<(), Waiting> {
        let (ns, pod_name, _) = pod_identity(pod);
        let name = c.name.as_str();
        let image = c.image.clone().unwrap_or_default();
        if image.is_empty() || image.contains(char::is_whitespace) {
            let message =
                format!("Failed to apply default image tag \"{image}\": invalid reference format");
            return Err(self.failed(pod, name, waiting::INVALID_IMAGE_NAME, message));
        }
        // Step 1: the image.
        let policy = spec::pull_policy(c);
        let image = (self.images)
            .ensure_image(pod, name, &image, &policy, &at.config)
            .await?;
        crate::startup_trace::mark(pod, crate::startup_trace::Stage::ImageReady);
        // Step 2: the config, then the container.
        let pod_ips = self.pod_ips(pod, &at.pod_ips);
        let (mut config, image_sub_paths) = self
            .container_config(
                pod,
                c,
                attempt.number,
                &image,
                &at.config,
                &pod_ips,
                volumes,
            )
            .await?;
        config.annotations.insert(
            crate::labels::BACKOFF_SINCE_ANNOTATION.to_string(),
            attempt.backoff_since.to_string(),
        );
        translate::join_user_namespace(&mut config, &at.isolation);
        if let Some(target) = target_id {
            translate::target_pid_namespace(&mut config, target);
        }
        let target = format!("container {name} of pod {ns}/{pod_name}");
        let log = std::path::Path::new(&at.config.log_directory).join(&config.log_path);
        let created = self
            .runtime
            .create_container(
                &at.sandbox_id,
                config,
                at.config.clone(),
                &image_sub_paths,
                &target,
            )
            .await;
        let id = created.map_err(|e| {
            let note = format!("Error: {e}");
            self.event(pod, Some(name), EventType::Warning, event::FAILED, note);
            Waiting {
                reason: waiting::CREATE_CONTAINER_ERROR.into(),
                message: e.to_string(),
            }
        })?;
        crate::startup_trace::mark(pod, crate::startup_trace::Stage::ContainerCreated);
        let note = format!("Created container: {name}");
        self.event(pod, Some(name), EventType::Normal, event::CREATED, note);
        // Step 3: start.
        if let Err(e) = self.runtime.start_container(&id).await {
            let note = format!("Error: {e}");
            self.event(pod, Some(name), EventType::Warning, event::FAILED, note);
            return Err(Waiting {
                reason: waiting::RUN_CONTAINER_ERROR.into(),
                message: e.to_string(),
            });
        }
        crate::startup_trace::mark(pod, crate::startup_trace::Stage::ContainerStarted);
        let note = format!("Started container {name}");
        self.event(pod, Some(name), EventType::Normal, event::STARTED, note);
        // The log link for collectors, as the kubelet's startContainer.
        if let Some(link) =
            crate::log_links::link_path(&self.log_links_dir, &pod_name, &ns, name, &id)
            && let Err(e) = crate::log_links::create(&link, &log)
        {
            warn!(link = %link.display(), error = %e, "container log link");
        }
        // Step 4: the postStart hook, before the container counts as started.
        let ip = pod_ips.first().and_then(|ip| ip.parse().ok());
        self.post_start(pod, c, &id, ip).await
    }

    /// The pod IPs containers are given: the sandbox's, or the node's for a
    /// `hostNetwork` pod (the kubelet's `generateAPIPodStatus`, whose IPs
    /// `SyncPod` hands to the containers).
    fn pod_ips(&self, pod: &Pod, sandbox_ips: &[String]) -> Vec<String> {
        let host_network = pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        if host_network && sandbox_ips.is_empty() {
            self.node.node_ips.clone()
        } else {
            sandbox_ips.to_vec()
        }
    }

    /// A `Failed` event `Error: <reason>` for container `name`; the waiting
    /// reason to show.
    fn failed(&self, pod: &Pod, name: &str, reason: &str, message: String) -> Waiting {
        let note = format!("Error: {reason}");
        self.event(pod, Some(name), EventType::Warning, event::FAILED, note);
        Waiting {
            reason: reason.into(),
            message,
        }
    }

    /// The CRI config of container `c`: its environment (from the sources it
    /// names), the `runAsNonRoot` check against the image's user, its volume
    /// mounts, the managed `/etc/hosts` and the termination message file.
    ///
    /// # Errors
    /// `CreateContainerConfigError` (or `CreateContainerError` for the node's
    /// own files), its event sent.
    /// The images of the image volumes container `c` mounts, each made sure
    /// of under its volume's pull policy (the kubelet's `getImageVolumes`,
    /// with its events on the container), as the runtime is to mount them.
    ///
    /// # Errors
    /// The pull's waiting reason (`ErrImagePull`, `ErrImageNeverPull`).
    async fn image_volumes(
        &self,
        pod: &Pod,
        c: &Container,
        sandbox_config: &cri::PodSandboxConfig,
        volumes: &PodVolumes,
    ) -> std::result::Result<crate::volume::ImageVolumes, Waiting> {
        let mut out = crate::volume::ImageVolumes::new();
        for m in c.volume_mounts.iter().flatten() {
            let Some(reference) = volumes.get(&m.name).and_then(|v| v.image.as_deref()) else {
                continue;
            };
            if out.contains_key(&m.name) {
                continue;
            }
            let policy = pod
                .spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .find(|v| v.name == m.name)
                .and_then(|v| v.image.as_ref())
                .map_or_else(
                    || "IfNotPresent".to_string(),
                    spec::image_volume_pull_policy,
                );
            let pulled = (self.images)
                .ensure_image(pod, &c.name, reference, &policy, sandbox_config)
                .await?;
            out.insert(
                m.name.clone(),
                cri::ImageSpec {
                    image: pulled.id,
                    user_specified_image: reference.to_string(),
                    annotations: translate::pod_annotations(pod),
                    ..Default::default()
                },
            );
        }
        Ok(out)
    }

    #[allow(clippy::too_many_arguments)] // one call site; the parts of one container start
    async fn container_config(
        &self,
        pod: &Pod,
        c: &Container,
        attempt: u32,
        image: &super::image_manager::ImageInfo,
        sandbox_config: &cri::PodSandboxConfig,
        pod_ips: &[String],
        volumes: &PodVolumes,
    ) -> std::result::Result<(cri::ContainerConfig, ImageSubPaths), Waiting> {
        let (_, _, uid) = pod_identity(pod);
        let name = c.name.as_str();
        let log_dir = std::path::Path::new(&sandbox_config.log_directory).join(name);
        if let Err(e) = tokio::fs::create_dir_all(&log_dir).await {
            let message = format!("create log directory {}: {e}", log_dir.display());
            return Err(self.failed(pod, name, waiting::CREATE_CONTAINER_ERROR, message));
        }
        let config_error = |message: String| {
            let note = format!("Error: {message}");
            self.event(pod, Some(name), EventType::Warning, event::FAILED, note);
            Waiting {
                reason: waiting::CREATE_CONTAINER_CONFIG_ERROR.into(),
                message,
            }
        };
        let facts = PodFacts {
            pod_ips: pod_ips.to_vec(),
            host_ips: self.node.node_ips.clone(),
        };
        let mut sources = self.sources.read(pod, c).await.map_err(config_error)?;
        sources.files = SourceReader::read_files(pod, c, volumes).await;
        let env = env::environment(pod, c, &self.node, &facts, &sources)
            .map_err(|e| config_error(e.to_string()))?;
        translate::verify_run_as_non_root(pod, c, image.uid, &image.username)
            .map_err(config_error)?;
        let images = self.image_volumes(pod, c, sandbox_config, volumes).await?;
        let pod_dir = crate::volume::pod_dir(&self.node.root_dir, &uid);
        let asks_rro = c.volume_mounts.iter().flatten().any(|m| {
            m.recursive_read_only
                .as_deref()
                .is_some_and(|r| r != "Disabled")
        });
        let runtime_rro = asks_rro && self.runtime_supports_rro(pod).await;
        // SubPaths are opened, made and bind-mounted here: blocking work.
        let made = tokio::task::spawn_blocking({
            let (c, volumes, env, pod_dir) =
                (c.clone(), volumes.clone(), env.clone(), pod_dir.clone());
            move || {
                crate::volume::container_mounts(&c, &volumes, &images, &env, &pod_dir, runtime_rro)
            }
        })
        .await;
        let crate::volume::ContainerMounts {
            mut mounts,
            image_sub_paths,
        } = match made {
            Ok(m) => m.map_err(|e| config_error(e.to_string()))?,
            Err(e) => return Err(config_error(format!("prepare volume mounts: {e}"))),
        };
        if crate::pod_core::hosts::should_mount(pod, c, pod_ips) {
            let hosts = super::hosts::make_hosts_mount(
                pod,
                &pod_dir,
                pod_ips,
                &self.node.cluster_domain,
                self.node.hosts_file(),
            )
            .await
            .map_err(config_error)?;
            mounts.push(hosts);
        }
        let mut config =
            translate::container_config(pod, c, attempt, &image.id, &env, &self.node, mounts)
                .map_err(|e| config_error(e.to_string()))?;
        // What device plugins gave it (the kubelet's
        // GetDeviceRunContainerOptions): environment, mounts, devices.
        if let Some(devices) = &self.devices {
            let pods = self.pods.state();
            let active = |uid: &str| {
                pods.iter()
                    .any(|p| p.metadata.uid.as_deref() == Some(uid) && !spec::is_terminal(p))
            };
            devices
                .run_options(pod, c, active)
                .await
                .map_err(config_error)?
                .apply(&mut config);
        }
        // Its CPUs: its exclusive ones, else the shared pool (the kubelet's
        // PreCreateContainer).
        if let Some(cpus) = self.cpus.as_ref().and_then(|m| m.cpuset(&uid, &c.name))
            && let Some(r) = config.linux.as_mut().and_then(|l| l.resources.as_mut())
        {
            r.cpuset_cpus = cpus.to_string();
        }
        // Its memory's NUMA nodes, when the memory manager pinned it.
        if let Some(mems) = self
            .memory
            .as_ref()
            .and_then(|m| m.cpuset_mems(&uid, &c.name))
            && let Some(r) = config.linux.as_mut().and_then(|l| l.resources.as_mut())
        {
            r.cpuset_mems = mems;
        }
        // The CDI devices of its claims, as prepared by their DRA drivers
        // (the kubelet's GetResources).
        for name in self.dra.cdi_devices(pod, c).map_err(config_error)? {
            if !config.cdi_devices.iter().any(|d| d.name == name) {
                config.cdi_devices.push(cri::CdiDevice { name });
            }
        }
        // Block volumes, as devices (makeBlockVolumes).
        config.devices.extend(
            crate::volume::container_devices(c, volumes)
                .map_err(|e| config_error(e.to_string()))?,
        );
        match termination_log(&self.node.root_dir, &uid, c, attempt).await {
            Ok(mount) => config.mounts.extend(mount),
            Err(e) => {
                let message = format!("create termination message file: {e}");
                return Err(self.failed(pod, name, waiting::CREATE_CONTAINER_ERROR, message));
            }
        }
        Ok((config, image_sub_paths))
    }

    /// Runs container `c`'s postStart hook, if it has one; on failure the
    /// `FailedPostStartHook` event, the container killed, and
    /// `PostStartHookError`. The hook runs until it ends or the pod is being
    /// deleted ([`RuntimeManager::being_deleted`], polled every
    /// [`DELETION_POLL`]): the kubelet's pod worker cancels the sync of a pod
    /// that becomes terminating, which ends the hook, so that a hook that
    /// never returns (`sleep 100000`) cannot hold the deletion. A hook cut
    /// short so fails without a kill of its own: the terminating sync that
    /// follows stops the container.
    async fn post_start(
        &self,
        pod: &Pod,
        c: &Container,
        id: &str,
        ip: Option<IpAddr>,
    ) -> std::result::Result<(), Waiting> {
        let Some(handler) = c.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) else {
            return Ok(());
        };
        let limit = lifecycle::POST_START_EXEC_LIMIT;
        let run = lifecycle::run_handler(&self.runtime, pod, c, id, handler, ip, limit);
        tokio::pin!(run);
        let mut tick = tokio::time::interval(DELETION_POLL);
        let ran = loop {
            tokio::select! {
                ran = &mut run => break ran,
                _ = tick.tick() => {
                    if self.being_deleted(pod) {
                        break Err(format!(
                            "PostStart hook of container {:?} cut short: the pod is being deleted",
                            c.name
                        ));
                    }
                }
            }
        };
        let Err(msg) = ran else { return Ok(()) };
        let name = c.name.as_str();
        let reason = event::FAILED_POST_START_HOOK;
        self.event(pod, Some(name), EventType::Warning, reason, msg.clone());
        if self.being_deleted(pod) {
            // The terminating sync that follows stops the container, with
            // its preStop hook and the deletion's grace period.
            return Err(Waiting {
                reason: waiting::POST_START_HOOK_ERROR.into(),
                message: msg,
            });
        }
        let grace = spec::grace_period(pod);
        if let Err(e) = self.kill_container(pod, name, id, grace, ip, "").await {
            warn!(error = %e, container = name, "kill container after its postStart hook failed");
        }
        Err(Waiting {
            reason: waiting::POST_START_HOOK_ERROR.into(),
            message: msg,
        })
    }

    /// Stops the containers of a terminating pod (its plan's leading
    /// [`Step::KillContainer`] steps, [`Plan::leading_kills`]) all at once, as
    /// the kubelet's `killContainersWithSyncResult` with its termination
    /// ordering: every container's preStop hook starts together; a sidecar
    /// then waits for its turn (every main container stopped, and every
    /// sidecar started after it, the ones before it in the plan's reverse
    /// start order) for at most what is left of its grace period and one
    /// second, and is stopped with what is left after that.
    ///
    /// # Errors
    /// The first `StopContainer` that failed (every other container is still
    /// stopped).
    pub async fn kill_pod_containers(&self, pod: &Pod, rt: &PodRuntime, plan: &Plan) -> Result<()> {
        let sidecar = |c: &str| {
            spec::init_containers(pod)
                .iter()
                .any(|i| i.name == c && spec::is_sidecar(i))
        };
        let targets: Vec<_> = plan
            .leading_kills()
            .iter()
            .filter_map(|step| match step {
                Step::KillContainer {
                    id,
                    name,
                    grace_seconds,
                    reason,
                } => {
                    debug!(container = name, reason, "kill container");
                    Some((name.as_str(), id.as_str(), *grace_seconds))
                }
                _ => None,
            })
            .collect();
        let ip = pod_ip(rt);
        // One "stopped" signal per target; a sidecar's turn comes when every
        // target before it has sent its own (or dropped it, having failed).
        let (done, stopped): (Vec<_>, Vec<_>) = targets
            .iter()
            .map(|_| tokio::sync::watch::channel(false))
            .unzip();
        let kills = targets
            .iter()
            .zip(done)
            .enumerate()
            .map(|(i, ((c, id, grace), done))| {
                let before: Vec<_> = if sidecar(c) {
                    stopped[..i].to_vec()
                } else {
                    Vec::new()
                };
                let turn = async move {
                    for mut rx in before {
                        // An error: that kill ended without a signal.
                        let _ = rx.wait_for(|s| *s).await;
                    }
                };
                async move {
                    let r = self
                        .kill_container_in_turn(pod, c, id, *grace, ip, "", turn)
                        .await;
                    let _ = done.send(true);
                    r
                }
            });
        futures::future::join_all(kills)
            .await
            .into_iter()
            .collect::<Result<Vec<()>>>()
            .map(|_| ())
    }

    /// True when `pod` is being deleted now: the reflector's store holds it
    /// (same UID) with a deletion timestamp, or no longer holds it (deleted
    /// with grace 0, or replaced by a new pod of the same name).
    fn being_deleted(&self, pod: &Pod) -> bool {
        let (ns, name, uid) = pod_identity(pod);
        let latest = self
            .pods
            .get(&ObjectRef::new(&name).within(&ns))
            .filter(|p| p.metadata.uid.as_deref() == Some(uid.as_str()));
        latest.is_none_or(|p| p.metadata.deletion_timestamp.is_some())
    }

    /// The grace period of `pod` now, if it is being deleted: from the latest
    /// version in the reflector's store (same UID), else from `pod`.
    fn current_grace(&self, pod: &Pod) -> Option<i64> {
        let (ns, name, uid) = pod_identity(pod);
        let latest = self
            .pods
            .get(&ObjectRef::new(&name).within(&ns))
            .filter(|p| p.metadata.uid.as_deref() == Some(uid.as_str()));
        let pod = latest.as_deref().unwrap_or(pod);
        pod.metadata
            .deletion_timestamp
            .is_some()
            .then(|| spec::grace_period(pod))
    }

    /// Stops container `name` (CRI ID `id`) of `pod` as the kubelet's
    /// `killContainer`: the `Killing` event (`message`, or `Stopping
    /// container <name>` when it is empty), the container's preStop hook (if
    /// any and the grace period is not 0) within `grace_seconds`, then
    /// `StopContainer` with what is left of the grace period, at least 2 s.
    /// While the hook runs, a shorter grace period set by a new deletion of
    /// the pod cuts the wait for it short ([`lifecycle::KillBudget`]); a hook
    /// still running then goes on until the container stops, as the
    /// kubelet's `executePreStopHook` leaves it. A failed hook is a
    /// `FailedPreStopHook` event; the container is stopped anyway.
    ///
    /// # Errors
    /// `StopContainer` failed.
    pub async fn kill_container(
        &self,
        pod: &Pod,
        name: &str,
        id: &str,
        grace_seconds: i64,
        pod_ip: Option<IpAddr>,
        message: &str,
    ) -> Result<()> {
        let now = std::future::ready(());
        self.kill_container_in_turn(pod, name, id, grace_seconds, pod_ip, message, now)
            .await
    }

    /// [`Self::kill_container`], where the container is stopped only once
    /// `turn` completed after its preStop hook (the kubelet's
    /// `terminationOrdering.waitForTurn`), waiting at most until its grace
    /// period and one second more have gone by, and not at all when the hook
    /// used the whole grace period.
    ///
    /// # Errors
    /// `StopContainer` failed.
    #[allow(clippy::too_many_arguments)]
    async fn kill_container_in_turn(
        &self,
        pod: &Pod,
        name: &str,
        id: &str,
        grace_seconds: i64,
        pod_ip: Option<IpAddr>,
        message: &str,
        turn: impl std::future::Future<Output = ()>,
    ) -> Result<()> {
        let note = if message.is_empty() {
            format!("Stopping container {name}")
        } else {
            message.to_string()
        };
        self.event(pod, Some(name), EventType::Normal, event::KILLING, note);
        let spec = spec::find_container(pod, name);
        let hook = spec.and_then(|c| Some((c, c.lifecycle.as_ref()?.pre_stop.as_ref()?)));
        let failed_hook = |msg: String| {
            let reason = event::FAILED_PRE_STOP_HOOK;
            self.event(pod, Some(name), EventType::Warning, reason, msg);
        };
        let mut budget = lifecycle::KillBudget::new(tokio::time::Instant::now(), grace_seconds);
        // The preStop hook. One still running when the grace period is over
        // goes on (the kubelet stops waiting for it, not the hook) until its
        // container stops.
        let mut hook_run = hook.filter(|_| grace_seconds > 0).map(|(c, handler)| {
            let limit = lifecycle::PRE_STOP_EXEC_LIMIT;
            Box::pin(lifecycle::run_handler(
                &self.runtime,
                pod,
                c,
                id,
                handler,
                pod_ip,
                limit,
            ))
        });
        let mut hook_done = hook_run.is_none();
        if let Some(run) = hook_run.as_mut() {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tokio::select! {
                    ran = run.as_mut() => {
                        if let Err(msg) = ran {
                            failed_hook(msg);
                        }
                        hook_done = true;
                        break;
                    }
                    () = budget.expired() => {
                        debug!(container = name, "preStop hook not completed in the grace period");
                        break;
                    }
                    _ = tick.tick() => {
                        if let Some(grace) = self.current_grace(pod) {
                            budget = budget.observe(grace, tokio::time::Instant::now());
                        }
                    }
                }
            }
        }
        let budget = budget;
        let stop = async {
            // A grace period the hook used up leaves no wait for the turn.
            match budget.deadline() {
                Some(end) if end <= tokio::time::Instant::now() => {}
                Some(end) => {
                    // A grace period near the clock's end has no second past it.
                    let end = end.checked_add(Duration::from_secs(1)).unwrap_or(end);
                    if tokio::time::timeout_at(end, turn).await.is_err() {
                        debug!(
                            container = name,
                            "stopped before its turn: its grace period ran out"
                        );
                    }
                }
                None => turn.await,
            }
            let grace = budget.stop_grace(tokio::time::Instant::now());
            self.runtime.stop_container(id, grace).await
        };
        let Some(mut run) = hook_run.filter(|_| !hook_done) else {
            return stop.await;
        };
        tokio::pin!(stop);
        loop {
            tokio::select! {
                stopped = &mut stop => return stopped,
                ran = run.as_mut(), if !hook_done => {
                    hook_done = true;
                    if let Err(msg) = ran {
                        failed_hook(msg);
                    }
                }
            }
        }
    }
}

/// The pod's `runtimeClassName`, when it names one.
fn runtime_class(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.runtime_class_name.as_deref())
        .filter(|c| !c.is_empty())
}

/// The pod's primary IP from its newest sandbox.
fn pod_ip(rt: &PodRuntime) -> Option<IpAddr> {
    rt.latest_sandbox()
        .and_then(|s| s.ips.first())
        .and_then(|ip| ip.parse().ok())
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
    c: &Container,
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

/// The kubelet's error for limits that cannot be lowered: `errors` as
/// `utilerrors.NewAggregate` prints them (one bare, several in brackets,
/// duplicates once) after "cannot decrease memory limits: ".
fn memory_decrease_message(errors: &[String]) -> String {
    let mut unique: Vec<&str> = Vec::new();
    for e in errors {
        if !unique.contains(&e.as_str()) {
            unique.push(e);
        }
    }
    match unique.as_slice() {
        [one] => format!("cannot decrease memory limits: {one}"),
        many => format!("cannot decrease memory limits: [{}]", many.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_decrease_errors_read_as_the_kubelets_aggregate() {
        let pod = "attempting to set pod memory limit (104857600) below current usage (209715200)";
        let c = "attempting to set container \"app\" memory limit (104857600) below current usage (150000000)";
        assert_eq!(
            memory_decrease_message(&[pod.into()]),
            format!("cannot decrease memory limits: {pod}")
        );
        assert_eq!(
            memory_decrease_message(&[pod.into(), c.into(), pod.into()]),
            format!("cannot decrease memory limits: [{pod}, {c}]")
        );
    }
}
