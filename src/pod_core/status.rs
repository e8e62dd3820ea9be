//! The pod's status as the kubelet's status manager reports it: phase
//! (`getPhase`), conditions, container statuses, IPs, start time and QoS class
//! (`generateAPIPodStatus` in kubelet_pods.go). Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container as ApiContainer, ContainerState as ApiState, ContainerStateRunning,
    ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition,
    PodIP, PodStatus, ResourceRequirements, VolumeMountStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::plan::{InitProgress, Waiting, init_progress};
use super::probes::ContainerProbes;
use super::qos::qos_class;
use super::runtime::{CgroupLimits, Container, ContainerState, PodRuntime};
use super::spec::{
    container_should_restart, ephemeral_containers, init_container_should_restart, init_containers,
    is_sidecar, main_containers, restart_policy,
};
use crate::reasons::condition::{self as cond, reason as cond_reason};
use crate::reasons::{phase, terminated, waiting};

/// Node-side facts the status needs.
#[derive(Clone, Debug, Default)]
pub struct StatusContext {
    /// Host IPs, primary first.
    pub host_ips: Vec<String>,
    /// Runtime name for container IDs (`containerd` → `containerd://<id>`).
    pub runtime_name: String,
    /// The runtime's default handler mounts recursively read-only (its
    /// `recursive_read_only_mounts` feature, read at start): what a
    /// container's `volumeMounts` status says of `recursiveReadOnly:
    /// IfPossible`. Pods of another RuntimeClass are shown as the default
    /// handler would mount them.
    pub runtime_rro: bool,
    /// `cpuCFSQuotaPeriod` in microseconds: the period of the quotas the
    /// agent sets, by which a quota read back becomes millicores.
    pub cpu_period_us: i64,
}

/// A pod's cgroup limits as read (None: no pod cgroup, or not read), and
/// the node's CFS period in microseconds (`cpuCFSQuotaPeriod`) every quota
/// is over.
#[derive(Clone, Copy, Debug)]
pub struct PodCgroup<'a> {
    /// The limits the pod's cgroup holds.
    pub read: Option<&'a super::limits::Limits>,
    /// The node's CFS period, microseconds.
    pub cpu_period_us: i64,
}

/// A container's `volumeMounts` status, as the kubelet's
/// `convertToAPIContainerStatuses`: each mount's name, path and read-only
/// flag, and for a read-only mount its resolved `recursiveReadOnly`
/// (`Enabled` or `Disabled`, [`super::spec::recursive_read_only`] with
/// `runtime_rro`); `None` for a container without mounts.
fn volume_mount_statuses(spec: &ApiContainer, runtime_rro: bool) -> Option<Vec<VolumeMountStatus>> {
    let mounts = spec.volume_mounts.as_deref().filter(|m| !m.is_empty())?;
    Some(
        mounts
            .iter()
            .map(|m| {
                let read_only = m.read_only.unwrap_or(false);
                let rro = read_only.then(|| {
                    let on =
                        super::spec::recursive_read_only(m, true, runtime_rro).unwrap_or(false);
                    if on { "Enabled" } else { "Disabled" }.to_string()
                });
                VolumeMountStatus {
                    name: m.name.clone(),
                    mount_path: m.mount_path.clone(),
                    read_only: m.read_only,
                    recursive_read_only: rro,
                    ..Default::default()
                }
            })
            .collect(),
    )
}

fn terminated(c: &Container, runtime: &str) -> ContainerStateTerminated {
    let reason = if !c.reason.is_empty() && c.reason != terminated::UNKNOWN {
        c.reason.clone()
    } else if c.exit_code == 0 {
        terminated::COMPLETED.into()
    } else {
        terminated::ERROR.into()
    };
    ContainerStateTerminated {
        exit_code: c.exit_code,
        reason: Some(reason),
        message: (!c.message.is_empty()).then(|| c.message.clone()),
        started_at: c.started_at.map(api_time),
        finished_at: c.finished_at.map(api_time),
        container_id: Some(format!("{runtime}://{}", c.id)),
        signal: None,
    }
}

/// The status of container `spec` from its newest two records; `restarts`
/// tells whether an exit code restarts it (then a waiting reason of the last
/// sync shows, with the exit as `lastState`). `pod` is `spec`'s, for the
/// pod-level limits it inherits.
#[allow(clippy::too_many_arguments)] // the parts of one container's status
fn container_status(
    pod: &Pod,
    spec: &ApiContainer,
    rt: &PodRuntime,
    waiting: Option<&Waiting>,
    probes: Option<&ContainerProbes>,
    restarts: impl Fn(i32) -> bool,
    default_wait: &str,
    ctx: &StatusContext,
) -> ContainerStatus {
    let (latest, previous) = rt.latest_two(&spec.name);
    let runtime = &ctx.runtime_name;
    let mut st = ContainerStatus {
        name: spec.name.clone(),
        image: spec.image.clone().unwrap_or_default(),
        volume_mounts: volume_mount_statuses(spec, ctx.runtime_rro),
        ..Default::default()
    };
    let wait = |reason: &str, message: Option<String>| ApiState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.into()),
            message,
        }),
        ..Default::default()
    };
    match latest {
        None => {
            st.state = Some(match waiting {
                Some(w) => wait(&w.reason, Some(w.message.clone())),
                None => wait(default_wait, None),
            });
            st.started = Some(false);
        }
        Some(c) => {
            st.container_id = Some(format!("{runtime}://{}", c.id));
            st.image_id = c.image_ref.clone();
            // What the node gave it (`spec` is the allocated pod's), and what
            // it runs with. The API server accepts a resize only from a node
            // that reports `resources`.
            let allocated = spec.resources.clone().unwrap_or_default();
            st.allocated_resources = allocated.requests.clone().filter(|r| !r.is_empty());
            let actual = c.resources.filter(|_| c.state == ContainerState::Running);
            st.resources = Some(running_resources(
                pod,
                spec,
                actual.as_ref(),
                ctx.cpu_period_us,
            ));
            st.restart_count = i32::try_from(c.attempt).unwrap_or(i32::MAX);
            st.last_state = previous
                .filter(|p| p.state == ContainerState::Exited)
                .map(|p| ApiState {
                    terminated: Some(terminated(p, runtime)),
                    ..Default::default()
                });
            match c.state {
                ContainerState::Running => {
                    st.state = Some(ApiState {
                        running: Some(ContainerStateRunning {
                            started_at: c.started_at.map(api_time),
                        }),
                        ..Default::default()
                    });
                    let p = probes.copied().unwrap_or(ContainerProbes {
                        ready: true,
                        started: true,
                        failed: None,
                    });
                    st.ready = p.ready;
                    st.started = Some(p.started);
                }
                ContainerState::Exited | ContainerState::Unknown => {
                    let restarting = restarts(c.exit_code) || waiting.is_some();
                    if restarting && let Some(w) = waiting {
                        st.last_state = Some(ApiState {
                            terminated: Some(terminated(c, runtime)),
                            ..Default::default()
                        });
                        st.state = Some(wait(&w.reason, Some(w.message.clone())));
                    } else {
                        st.state = Some(ApiState {
                            terminated: Some(terminated(c, runtime)),
                            ..Default::default()
                        });
                    }
                    st.started = Some(false);
                }
                ContainerState::Created => {
                    st.state = Some(wait(waiting::CONTAINER_CREATING, None));
                    st.started = Some(false);
                }
            }
        }
    }
    // `lastState` is a struct, not a pointer, in the Go type: the API server
    // always returns it, `{}` when empty.
    st.last_state.get_or_insert_with(ApiState::default);
    st
}

/// The statuses of the pod's ephemeral containers, sorted by name, as the
/// kubelet's `convertToAPIContainerStatuses` reports them: never restarted,
/// never probed (not ready, `started` unset), waiting with `PodInitializing`
/// in a pod with init containers and `ContainerCreating` otherwise until
/// created. One the runtime no longer has keeps its old status once
/// terminated.
#[must_use]
pub fn ephemeral_statuses(
    pod: &Pod,
    rt: &PodRuntime,
    waiting: &BTreeMap<String, Waiting>,
    ctx: &StatusContext,
) -> Vec<ContainerStatus> {
    let default_wait = if init_containers(pod).is_empty() {
        waiting::CONTAINER_CREATING
    } else {
        waiting::POD_INITIALIZING
    };
    let old: &[ContainerStatus] = pod
        .status
        .as_ref()
        .and_then(|s| s.ephemeral_container_statuses.as_deref())
        .unwrap_or_default();
    let mut statuses: Vec<ContainerStatus> = ephemeral_containers(pod)
        .iter()
        .map(|c| {
            let kept = old.iter().find(|o| {
                o.name == c.name
                    && o.state.as_ref().is_some_and(|s| s.terminated.is_some())
                    && rt.latest_two(&c.name).0.is_none()
            });
            if let Some(o) = kept {
                return o.clone();
            }
            let mut st = container_status(
                pod,
                c,
                rt,
                waiting.get(&c.name),
                None,
                |_| false,
                default_wait,
                ctx,
            );
            st.ready = false;
            st.started = None;
            st
        })
        .collect();
    statuses.sort_by(|a, b| a.name.cmp(&b.name));
    statuses
}

/// The pod phase from its main containers' statuses, as the kubelet's
/// `getPhase` with ContainerRestartRules: `restartable(name, exit_code)` tells
/// whether a stopped container restarts. Once every container stopped, the
/// pod runs on while any of them restarts, else it succeeded when all exited 0
/// and failed otherwise.
#[must_use]
pub fn phase(
    statuses: &[ContainerStatus],
    restartable: impl Fn(&str, i32) -> bool,
) -> &'static str {
    let (mut running, mut waiting, mut stopped, mut succeeded, mut restarting) = (0, 0, 0, 0, 0);
    for s in statuses {
        let state = s.state.as_ref();
        let last = s.last_state.as_ref().and_then(|l| l.terminated.as_ref());
        let last_exit = last.map(|t| t.exit_code);
        // Stopped by a restart of all containers in place: it runs again.
        let restarting_all =
            last.and_then(|t| t.reason.as_deref()) == Some(waiting::RESTARTING_ALL_CONTAINERS);
        if state.is_some_and(|x| x.running.is_some()) {
            running += 1;
        } else if let Some(t) = state.and_then(|x| x.terminated.as_ref()) {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
            restarting += usize::from(restartable(&s.name, t.exit_code));
        } else if let (true, Some(code)) = (state.is_some_and(|x| x.waiting.is_some()), last_exit) {
            stopped += 1;
            restarting += usize::from(restarting_all || restartable(&s.name, code));
        } else {
            waiting += 1;
        }
    }
    if waiting > 0 || statuses.is_empty() {
        return phase::PENDING;
    }
    if running > 0 {
        return phase::RUNNING;
    }
    if stopped > 0 {
        if restarting > 0 {
            return phase::RUNNING;
        }
        if stopped == succeeded {
            return phase::SUCCEEDED;
        }
        return phase::FAILED;
    }
    phase::PENDING
}

/// The resources container `spec` of `pod` (both as allocated) runs with,
/// as the kubelet's `convertToAPIContainerStatuses`: its requests and
/// limits, but the cpu request, cpu limit and memory limit the runtime
/// reports (`actual`, for a running container) where they are not what the
/// allocation asks for (its quota over the node's period of `period_us`
/// microseconds), converted back (millicores from shares and quota over
/// the period the runtime reports, bytes).
fn running_resources(
    pod: &Pod,
    spec: &ApiContainer,
    actual: Option<&CgroupLimits>,
    period_us: i64,
) -> ResourceRequirements {
    let mut out = spec.resources.clone().unwrap_or_default();
    out.claims = None;
    let Some(actual) = actual else {
        return out;
    };
    let desired = super::translate::cgroup_limits(pod, spec, period_us);
    let set = |map: &mut Option<BTreeMap<String, Quantity>>, name: &str, value: Option<String>| {
        match value {
            Some(v) => {
                map.get_or_insert_with(BTreeMap::new)
                    .insert(name.to_string(), Quantity(v));
            }
            None => {
                if let Some(m) = map.as_mut() {
                    m.remove(name);
                }
            }
        }
    };
    if desired.cpu_shares != actual.cpu_shares {
        let milli = i128::from(actual.cpu_shares) * 1000 / 1024;
        set(&mut out.requests, "cpu", Some(format!("{milli}m")));
    }
    let quota = |q: i64| (q > 0).then_some(q);
    if quota(desired.cpu_quota) != quota(actual.cpu_quota) {
        let milli = quota(actual.cpu_quota)
            .filter(|_| actual.cpu_period > 0)
            .map(|q| format!("{}m", i128::from(q) * 1000 / i128::from(actual.cpu_period)));
        set(&mut out.limits, "cpu", milli);
    }
    let memory = |m: i64| (m > 0 && m < i64::MAX / 2).then_some(m);
    if memory(desired.memory_limit_in_bytes) != memory(actual.memory_limit_in_bytes) {
        let bytes = memory(actual.memory_limit_in_bytes).map(|b| b.to_string());
        set(&mut out.limits, "memory", bytes);
    }
    out
}

/// The message of a resize event, as the kubelet's `podResizeMessage`:
/// `"<prefix>: <JSON>"`, the JSON naming the pod's resizable containers
/// (sidecar init containers under `initContainers`, then `containers`,
/// each with its `name` and `resources`), the pod's `generation`, and
/// `error` when there is one, in that order.
#[must_use]
pub fn resize_event_message(prefix: &str, pod: &Pod, error: Option<&str>) -> String {
    let entries = |cs: Vec<&k8s_openapi::api::core::v1::Container>| -> Vec<serde_json::Value> {
        cs.into_iter()
            .map(|c| {
                serde_json::json!({
                    "name": c.name,
                    "resources": c.resources.clone().unwrap_or_default(),
                })
            })
            .collect()
    };
    let init = entries(
        super::spec::init_containers(pod)
            .iter()
            .filter(|c| super::spec::is_sidecar(c))
            .collect(),
    );
    let main = entries(super::spec::main_containers(pod).iter().collect());
    let mut parts = Vec::new();
    for (key, list) in [("initContainers", init), ("containers", main)] {
        if !list.is_empty() {
            parts.push(format!("\"{key}\":{}", serde_json::Value::Array(list)));
        }
    }
    parts.push(format!(
        "\"generation\":{}",
        pod.metadata.generation.unwrap_or_default()
    ));
    if let Some(e) = error {
        parts.push(format!("\"error\":{}", serde_json::Value::from(e)));
    }
    format!("{prefix}: {{{}}}", parts.join(","))
}

/// The resize events of a status change: `pod` as allocated and reported
/// so far (its `status`), `requested` as its spec asks (what a pending
/// resize's message names), `new` the status about to be. As the kubelet,
/// only transitions are
/// told: `ResizeDeferred`/`ResizeInfeasible` (Warning) when
/// `PodResizePending` appears or changes its reason, `ResizeError` (Warning)
/// when `PodResizeInProgress` turns to reason `Error`, `ResizeCompleted`
/// (Normal) when `PodResizeInProgress` goes away from a pod still running.
/// Each is (warning, reason, message).
#[must_use]
pub fn resize_events(
    pod: &Pod,
    requested: &Pod,
    new: &PodStatus,
) -> Vec<(bool, &'static str, String)> {
    use crate::reasons::event;
    let find = |conditions: Option<&Vec<PodCondition>>, type_: &str| {
        conditions.and_then(|cs| cs.iter().find(|c| c.type_ == type_).cloned())
    };
    let old = pod.status.as_ref().and_then(|s| s.conditions.as_ref());
    let now = new.conditions.as_ref();
    let mut events = Vec::new();
    let (was, is) = (
        find(old, cond::POD_RESIZE_PENDING),
        find(now, cond::POD_RESIZE_PENDING),
    );
    if let Some(is) = &is
        && was.as_ref().map(|w| &w.reason) != Some(&is.reason)
    {
        let reason = is.reason.clone().unwrap_or_default();
        let event_reason = if reason == super::allocation::INFEASIBLE {
            event::RESIZE_INFEASIBLE
        } else {
            event::RESIZE_DEFERRED
        };
        let prefix = format!("Pod resize {reason}");
        events.push((
            true,
            event_reason,
            resize_event_message(&prefix, requested, is.message.as_deref()),
        ));
    }
    let (was, is) = (
        find(old, cond::POD_RESIZE_IN_PROGRESS),
        find(now, cond::POD_RESIZE_IN_PROGRESS),
    );
    let error = Some(cond_reason::ERROR);
    if let Some(is) = &is
        && is.reason.as_deref() == error
        && was.as_ref().and_then(|w| w.reason.as_deref()) != error
    {
        events.push((
            true,
            event::RESIZE_ERROR,
            resize_event_message("Pod resize error", pod, is.message.as_deref()),
        ));
    }
    let terminal = new.phase.as_deref().is_some_and(phase::is_terminal);
    if was.is_some() && is.is_none() && !terminal {
        events.push((
            false,
            event::RESIZE_COMPLETED,
            resize_event_message("Pod resize completed", pod, None),
        ));
    }
    events
}

/// The resize conditions of `status` for `pod`, as the kubelet's status
/// manager keeps them: `PodResizePending` (True) with `pending`'s reason and
/// message while a resize waits for the node; `PodResizeInProgress` (True,
/// reason `Error`, the runtime's message) when applying one failed (`error`),
/// or (True, no reason) while a running container's limits are not yet its
/// allocation's (`rt`), or the pod's cgroup's (`pod_cgroup`, as read) not
/// yet the pod's; each removed otherwise, and both from a terminal status. A condition
/// that stays keeps its first transition time; each carries the pod's
/// generation.
pub fn resize_conditions(
    status: &mut PodStatus,
    pod: &Pod,
    rt: &PodRuntime,
    pod_cgroup: PodCgroup<'_>,
    pending: Option<&super::admit::Rejection>,
    error: Option<&str>,
    now: Timestamp,
) {
    // Allocated but not yet what runs: a running container whose limits the
    // runtime does not report as its allocation's, or the pod's cgroup.
    let sandbox_ready = rt.latest_sandbox().is_some_and(|s| s.ready);
    let pod_in_progress = sandbox_ready
        && pod_cgroup.read.is_some_and(|l| {
            !l.same_as(&super::translate::pod_cgroup_limits(
                pod,
                pod_cgroup.cpu_period_us,
            ))
        });
    let in_progress = pod_in_progress
        || super::spec::main_containers(pod)
            .iter()
            .chain(super::spec::init_containers(pod))
            .any(|c| {
                rt.latest_two(&c.name).0.is_some_and(|x| {
                    x.state == ContainerState::Running
                        && x.resources.is_some_and(|actual| {
                            !super::translate::cgroup_limits(pod, c, pod_cgroup.cpu_period_us)
                                .enforced_by(&actual)
                        })
                })
            });
    let terminal = status.phase.as_deref().is_some_and(phase::is_terminal);
    let previous = |type_: &str| {
        pod.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
            .cloned()
    };
    let wanted = [
        (
            cond::POD_RESIZE_PENDING,
            pending.map(|p| (p.reason.clone(), p.message.clone())),
        ),
        (
            cond::POD_RESIZE_IN_PROGRESS,
            match error {
                Some(e) => Some((cond_reason::ERROR.to_string(), e.to_string())),
                None => in_progress.then(|| (String::new(), String::new())),
            },
        ),
    ];
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    for (type_, value) in wanted {
        conditions.retain(|c| c.type_ != type_);
        let Some((reason, message)) = value.filter(|_| !terminal) else {
            continue;
        };
        let last_transition_time = match previous(type_) {
            Some(p) if p.reason.as_deref() == Some(reason.as_str()) => p.last_transition_time,
            _ => Some(api_time(now)),
        };
        conditions.push(PodCondition {
            type_: type_.into(),
            status: "True".into(),
            reason: Some(reason).filter(|r| !r.is_empty()),
            message: Some(message).filter(|m| !m.is_empty()),
            last_transition_time,
            observed_generation: pod.metadata.generation,
            ..Default::default()
        });
    }
}

/// The pod-level `allocatedResources` and `resources` of `status`, as the
/// kubelet's `generateAPIPodStatus` reports them with
/// `InPlacePodLevelResourcesVerticalScaling` (on by default in 1.37), for
/// every pod. `pod` is as allocated. `allocatedResources` is its requests
/// ([`super::fit::pod_requests`]: pod-level ones first, else the
/// containers'). `resources` is, for a pod not running, its pod-level
/// resources with the pod's requests and limits; for a running one
/// (`convertToAPIPodLevelResourcesStatus`), its pod-level resources with
/// what its cgroup (`pod_cgroup`, as read) holds where that is not the
/// allocation's: the cpu request from `cpu.shares` (millicores, rounded
/// up), the cpu limit from the CFS quota above 10 millicores, the memory
/// limit in bytes; the memory request, when the pod level sets none, is
/// the pod's.
pub fn pod_level_resources(status: &mut PodStatus, pod: &Pod, pod_cgroup: PodCgroup<'_>) {
    use super::fit::{pod_limits, pod_requests};
    let api = |list: BTreeMap<String, crate::resource::Quantity>| {
        let out: BTreeMap<String, Quantity> = list
            .into_iter()
            .map(|(name, q)| {
                // Exact to the millis (a memory request of "10m" stays
                // that, as the kubelet's Quantity sums keep it).
                let milli = q.milli_value();
                let text = if name == "cpu" || milli % 1000 != 0 {
                    format!("{milli}m")
                } else {
                    (milli / 1000).to_string()
                };
                (name, Quantity(text))
            })
            .collect();
        (!out.is_empty()).then_some(out)
    };
    let requests = api(pod_requests(pod));
    let pod_level = pod.spec.as_ref().and_then(|s| s.resources.clone());
    let mut resources = pod_level.clone().unwrap_or_default();
    resources.claims = None;
    let running = status.phase.as_deref() == Some(phase::RUNNING);
    match pod_cgroup.read.filter(|_| running) {
        None => {
            resources.requests.clone_from(&requests);
            resources.limits = api(pod_limits(pod));
        }
        Some(actual) => {
            let allocated = |list: Option<&BTreeMap<String, Quantity>>, name: &str, milli: bool| {
                list.and_then(|l| l.get(name))
                    .and_then(|q| crate::resource::Quantity::parse_saturating(&q.0).ok())
                    .map_or(0, |q| if milli { q.milli_value() } else { q.value() })
            };
            let set = |map: &mut Option<BTreeMap<String, Quantity>>, name: &str, text: String| {
                map.get_or_insert_with(BTreeMap::new)
                    .insert(name.to_string(), Quantity(text));
            };
            let req = pod_level.as_ref().and_then(|r| r.requests.as_ref());
            let lim = pod_level.as_ref().and_then(|r| r.limits.as_ref());
            let shares = i128::from(actual.cpu_shares);
            if shares >= i128::from(super::limits::MIN_SHARES) {
                // Rounded up, as the kubelet's `SharesToMilliCPU`.
                let milli = (shares * 1000 + 1023) / 1024;
                let wanted = allocated(req, "cpu", true);
                let min = i128::from(super::limits::MIN_SHARES);
                let wanted_shares = i64::try_from(wanted).unwrap_or(i64::MAX);
                let same = i128::from(super::translate::cpu_shares(wanted_shares)) == shares;
                if (milli > min || wanted > min) && !same {
                    set(&mut resources.requests, "cpu", format!("{milli}m"));
                }
            }
            let has_memory_request = req.is_some_and(|r| r.contains_key("memory"));
            if !has_memory_request && let Some(m) = requests.as_ref().and_then(|r| r.get("memory"))
            {
                set(&mut resources.requests, "memory", m.0.clone());
            }
            if let Some(quota) = actual.cpu_quota {
                let period = i128::from(pod_cgroup.cpu_period_us.max(1));
                let milli = i128::from(quota) * 1000 / period;
                if milli > 0 && (milli > 10 || allocated(lim, "cpu", true) > 10) {
                    set(&mut resources.limits, "cpu", format!("{milli}m"));
                }
            }
            if let Some(bytes) = actual.memory {
                set(&mut resources.limits, "memory", bytes.to_string());
            }
        }
    }
    status.allocated_resources = requests;
    let empty = resources.requests.as_ref().is_none_or(BTreeMap::is_empty)
        && resources.limits.as_ref().is_none_or(BTreeMap::is_empty);
    status.resources = (!empty).then_some(resources);
}

fn condition(
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    old: Option<&PodStatus>,
    generation: Option<i64>,
    now: Timestamp,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let previous = old
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_));
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => Some(api_time(now)),
    };
    PodCondition {
        type_: type_.into(),
        status: status.into(),
        reason: (!ok)
            .then(|| reason.unwrap_or_default().to_string())
            .filter(|r| !r.is_empty()),
        last_transition_time,
        observed_generation: generation,
        ..Default::default()
    }
}

/// The pod's status from its runtime state at `now`, as the kubelet's
/// `generateAPIPodStatus`: container statuses, phase, IPs, conditions. `waiting`
/// holds reasons the last sync left for containers that could not start (the
/// kubelet's reason cache), `probes` the probe manager's results (readiness
/// and startup) by container. A pod already in a terminal phase keeps that phase.
#[must_use]
pub fn status(
    pod: &Pod,
    rt: &PodRuntime,
    waiting: &BTreeMap<String, Waiting>,
    probes: &BTreeMap<String, ContainerProbes>,
    ctx: &StatusContext,
    now: Timestamp,
) -> PodStatus {
    let old = pod.status.as_ref();
    if let Some(o) = old.filter(|o| {
        o.phase.as_deref().is_some_and(phase::is_terminal) && o.container_statuses.is_some()
    }) {
        // A terminal status is final: its containers may not leave `terminated`,
        // even once the runtime has removed them (the status manager's rule).
        return o.clone();
    }
    // A pod restarting all containers in place is planned, and initialized,
    // from its current run.
    let current = super::plan::current_run(pod, rt);
    let progress = init_progress(pod, &current);
    let mut init_statuses = init_statuses(pod, rt, waiting, probes, ctx);
    let main_wait = if progress == InitProgress::Done {
        waiting::CONTAINER_CREATING
    } else {
        waiting::POD_INITIALIZING
    };
    let policy = restart_policy(pod);
    let mut statuses: Vec<ContainerStatus> = main_containers(pod)
        .iter()
        .map(|c| {
            let restarts = |code| container_should_restart(c, policy, code);
            let (w, p) = (waiting.get(&c.name), probes.get(&c.name));
            container_status(pod, c, rt, w, p, restarts, main_wait, ctx)
        })
        .collect();
    let restarting_all = rt
        .latest_sandbox()
        .and_then(|s| super::plan::restart_all_boundary(pod, rt, &s.id).map(|b| (s.id.clone(), b)));
    if let Some((sandbox, boundary)) = &restarting_all {
        for st in init_statuses.iter_mut().chain(statuses.iter_mut()) {
            restarting_in_place(st, rt, sandbox, *boundary, &ctx.runtime_name);
        }
    }
    let ephemeral_statuses = ephemeral_statuses(pod, rt, waiting, ctx);
    let (pod_phase, reason_message) =
        pod_phase(pod, &current, &progress, &init_statuses, &statuses, now);
    let sandbox = rt.latest_sandbox().filter(|s| s.ready);
    let ips = pod_ips(pod, sandbox, ctx);
    let mut conditions = conditions(&Facts {
        pod,
        sandbox_ready: sandbox.is_some(),
        progress: &progress,
        terminal: phase::is_terminal(&pod_phase),
        init_statuses: &init_statuses,
        statuses: &statuses,
        now,
    });
    if super::spec::could_restart_all(pod) {
        restart_all_conditions(&mut conditions, pod, rt, restarting_all.as_ref(), now);
    }
    PodStatus {
        phase: Some(pod_phase),
        conditions: Some(conditions),
        container_statuses: Some(statuses),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        ephemeral_container_statuses: (!ephemeral_statuses.is_empty())
            .then_some(ephemeral_statuses),
        host_ip: ctx.host_ips.first().cloned(),
        host_ips: Some(
            ctx.host_ips
                .iter()
                .map(|ip| HostIP { ip: ip.clone() })
                .collect(),
        ),
        pod_ip: ips.first().cloned(),
        pod_ips: (!ips.is_empty()).then(|| ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect()),
        start_time: old
            .and_then(|s| s.start_time.clone())
            .or(Some(api_time(now))),
        qos_class: Some(qos_class(pod).as_str().into()),
        observed_generation: pod.metadata.generation,
        reason: reason_message
            .as_ref()
            .map(|(r, _)| r.clone())
            .or_else(|| old.and_then(|o| o.reason.clone())),
        message: reason_message
            .map(|(_, m)| m)
            .or_else(|| old.and_then(|o| o.message.clone())),
        ..old.cloned().unwrap_or_default()
    }
}

/// The message of a container whose record is of its pod's run before it
/// restarted all containers in place (the kubelet's).
pub const RESTARTING_ALL_MESSAGE: &str =
    "The container is removed because RestartAllContainers in place";

/// The status `st` of a container of a pod restarting all containers in
/// place in sandbox `sandbox` (from `boundary`,
/// [`super::plan::restart_all_boundary`]), when its newest record is of the
/// earlier run and no longer runs: waiting (`RestartingAllContainers`), that
/// record as its last state, and the restart count it will start with, as
/// the kubelet reports a container RestartAllContainers removed.
fn restarting_in_place(
    st: &mut ContainerStatus,
    rt: &PodRuntime,
    sandbox: &str,
    boundary: Option<Timestamp>,
    runtime: &str,
) {
    let Some(x) = rt.latest_two(&st.name).0 else {
        return;
    };
    if !super::plan::before_restart_all(x, sandbox, boundary) || x.state == ContainerState::Running
    {
        return;
    }
    st.state = Some(ApiState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(waiting::RESTARTING_ALL_CONTAINERS.into()),
            message: Some(RESTARTING_ALL_MESSAGE.into()),
        }),
        ..Default::default()
    });
    // Its last run, with the kubelet's reason and message for it (`getPhase`
    // counts such a container as restarting).
    let mut last = terminated(x, runtime);
    last.reason = Some(waiting::RESTARTING_ALL_CONTAINERS.into());
    last.message = Some(RESTARTING_ALL_MESSAGE.into());
    st.last_state = Some(ApiState {
        terminated: Some(last),
        ..Default::default()
    });
    st.restart_count = i32::try_from(x.attempt.saturating_add(1)).unwrap_or(i32::MAX);
    st.ready = false;
    st.started = Some(false);
}

/// The conditions of a pod that can restart all its containers in place,
/// as the kubelet's `GenerateAllContainersRestartingCondition`:
/// `AllContainersRestarting` True (`RestartAllContainersStarted`) while a
/// container of the run before a `RestartAllContainers` exit still runs
/// (`restarting`: the sandbox and the boundary of
/// [`super::plan::restart_all_boundary`]), else False; and `Initialized`
/// stays True once it was, while the init containers run again.
fn restart_all_conditions(
    conditions: &mut Vec<PodCondition>,
    pod: &Pod,
    rt: &PodRuntime,
    restarting: Option<&(String, Option<Timestamp>)>,
    now: Timestamp,
) {
    use crate::reasons::condition::{ALL_CONTAINERS_RESTARTING, INITIALIZED};
    let in_progress = restarting.is_some_and(|(sandbox, boundary)| {
        rt.containers.iter().any(|x| {
            super::plan::before_restart_all(x, sandbox, *boundary)
                && x.state == ContainerState::Running
        })
    });
    let old = pod.status.as_ref();
    let mut restarting_condition = condition(
        ALL_CONTAINERS_RESTARTING,
        in_progress,
        None,
        old,
        pod.metadata.generation,
        now,
    );
    if in_progress {
        restarting_condition.reason = Some("RestartAllContainersStarted".into());
        restarting_condition.message = Some("container exited with restart policy rule".into());
    }
    conditions.retain(|c| c.type_ != ALL_CONTAINERS_RESTARTING);
    conditions.push(restarting_condition);
    let was_initialized = old.and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
        cs.iter()
            .any(|c| c.type_ == INITIALIZED && c.status == "True")
    });
    if restarting.is_some() && was_initialized {
        for c in conditions.iter_mut().filter(|c| c.type_ == INITIALIZED) {
            c.status = "True".into();
            c.reason = None;
            c.message = None;
        }
    }
}

/// The message of a regular init container the runtime lost after the pod
/// was initialized (the kubelet's words).
pub const INIT_STATUS_LOST: &str = "Unable to get init container status from container runtime and pod has been initialized, treat it as exited normally";

/// A main container of the pod was created in any sandbox (the kubelet's
/// `HasAnyRegularContainerCreated`).
fn any_main_container_created(pod: &Pod, rt: &PodRuntime) -> bool {
    main_containers(pod)
        .iter()
        .any(|c| rt.containers.iter().any(|x| x.name == c.name))
}

/// The statuses of the pod's init containers: a sidecar is ready while it
/// runs and its readiness probe passes, a regular init container once it
/// exited 0.
fn init_statuses(
    pod: &Pod,
    rt: &PodRuntime,
    waiting: &BTreeMap<String, Waiting>,
    probes: &BTreeMap<String, ContainerProbes>,
    ctx: &StatusContext,
) -> Vec<ContainerStatus> {
    let policy = restart_policy(pod);
    init_containers(pod)
        .iter()
        .map(|c| {
            let restarts = |code| init_container_should_restart(c, policy, code);
            let (w, p) = (waiting.get(&c.name), probes.get(&c.name));
            let mut st =
                container_status(pod, c, rt, w, p, restarts, waiting::POD_INITIALIZING, ctx);
            // Gone from the runtime after the pod was initialized (a static
            // pod, whose status is not kept, across an agent restart): it
            // exited normally, as the kubelet's `convertToAPIContainerStatuses`
            // infers.
            let gone = !rt.containers.iter().any(|x| x.name == c.name);
            let waiting_now = st.state.as_ref().is_some_and(|s| s.waiting.is_some());
            if !is_sidecar(c) && gone && waiting_now && any_main_container_created(pod, rt) {
                st.state = Some(ApiState {
                    terminated: Some(k8s_openapi::api::core::v1::ContainerStateTerminated {
                        reason: Some(crate::reasons::terminated::COMPLETED.into()),
                        message: Some(INIT_STATUS_LOST.into()),
                        exit_code: 0,
                        ..Default::default()
                    }),
                    ..Default::default()
                });
            }
            let state = st.state.as_ref();
            st.ready = if is_sidecar(c) {
                state.is_some_and(|s| s.running.is_some()) && st.ready
            } else {
                state
                    .and_then(|s| s.terminated.as_ref())
                    .is_some_and(|t| t.exit_code == 0)
            };
            st
        })
        .collect()
}

/// The pod's phase (the kubelet's `getPhase` with the init containers'
/// progress), with the pod-level reason and message when the node sets them:
/// a terminal phase stays; a deleted pod whose containers all stopped settles
/// (`podIsTerminal`); past its active deadline it is `Failed` with
/// `DeadlineExceeded`. Once the pod initialized (a main container of the
/// current sandbox exists: `podHasInitialized`), a sidecar that stopped or
/// restarts no longer holds it `Pending`; a sidecar that runs keeps it
/// `Running`, so a pod whose main containers finished is terminal only when
/// its sidecars stopped too.
fn pod_phase(
    pod: &Pod,
    rt: &PodRuntime,
    progress: &InitProgress,
    init_statuses: &[ContainerStatus],
    statuses: &[ContainerStatus],
    now: Timestamp,
) -> (String, Option<(String, String)>) {
    let policy = restart_policy(pod);
    let restartable = |name: &str, code: i32| {
        main_containers(pod)
            .iter()
            .find(|c| c.name == name)
            .is_some_and(|c| container_should_restart(c, policy, code))
    };
    let initialized = rt
        .latest_sandbox()
        .is_some_and(|s| super::plan::initialized_in(pod, rt, &s.id));
    let running_sidecars = init_statuses.iter().filter(|st| {
        init_containers(pod)
            .iter()
            .any(|c| c.name == st.name && is_sidecar(c))
            && st.state.as_ref().is_some_and(|s| s.running.is_some())
    });
    let counted: Vec<ContainerStatus> = statuses.iter().chain(running_sidecars).cloned().collect();
    let old_phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let mut pod_phase = match (old_phase, progress) {
        (Some(p @ (phase::SUCCEEDED | phase::FAILED)), _) => p.to_string(),
        (_, InitProgress::Failed(_)) => phase::FAILED.to_string(),
        (_, InitProgress::Pending(_)) if !initialized => phase::PENDING.to_string(),
        (_, InitProgress::Pending(_) | InitProgress::Done) => {
            phase(&counted, restartable).to_string()
        }
    };
    // A deleted pod whose containers all stopped is terminal: they will not
    // restart whatever the restart policy (the kubelet's `podIsTerminal`).
    let stopped_for_deletion = pod.metadata.deletion_timestamp.is_some()
        && !rt
            .containers
            .iter()
            .any(|c| c.state == ContainerState::Running);
    if stopped_for_deletion && !phase::is_terminal(&pod_phase) {
        let settled = phase(statuses, |_, _| false);
        if settled != phase::PENDING {
            pod_phase = settled.to_string();
        }
    }
    // Evicted: failed, with the eviction's reason and message kept.
    if super::spec::is_evicted(pod) {
        return (phase::FAILED.to_string(), None);
    }
    if !old_phase.is_some_and(phase::is_terminal)
        && super::plan::active_deadline(pod, now) == super::plan::Deadline::Exceeded
    {
        let reason = super::plan::DEADLINE_REASON.to_string();
        let message = super::plan::DEADLINE_MESSAGE.to_string();
        return (phase::FAILED.to_string(), Some((reason, message)));
    }
    (pod_phase, None)
}

/// The pod's IPs: the node's for a `hostNetwork` pod, else its ready
/// sandbox's, else the ones last reported (a pod whose sandbox stopped keeps
/// its IPs in the status).
fn pod_ips(
    pod: &Pod,
    sandbox: Option<&super::runtime::Sandbox>,
    ctx: &StatusContext,
) -> Vec<String> {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    match sandbox {
        Some(_) if host_network => ctx.host_ips.clone(),
        Some(s) => s.ips.clone(),
        None => pod
            .status
            .as_ref()
            .and_then(|o| o.pod_ips.as_ref())
            .map(|v| v.iter().map(|p| p.ip.clone()).collect())
            .unwrap_or_default(),
    }
}

/// What the pod's conditions are computed from.
struct Facts<'a> {
    pod: &'a Pod,
    sandbox_ready: bool,
    progress: &'a InitProgress,
    terminal: bool,
    init_statuses: &'a [ContainerStatus],
    statuses: &'a [ContainerStatus],
    now: Timestamp,
}

/// The conditions the node owns (`PodReadyToStartContainers`, `Initialized`,
/// `ContainersReady`, `Ready`, with the kubelet's reasons and messages, and
/// `PodScheduled`, always true on the node: the kubelet's
/// `generateAPIPodStatus` sets it for pods bound without the scheduler), then
/// those others own (readiness gates, `DisruptionTarget`, ...) as they are.
fn conditions(f: &Facts<'_>) -> Vec<PodCondition> {
    let (pod, now, terminal) = (f.pod, f.now, f.terminal);
    let old = pod.status.as_ref();
    let generation = pod.metadata.generation;
    // Sidecars count for readiness as the main containers do
    // (`GenerateContainersReadyCondition`), in spec order, sidecars first.
    let sidecar_statuses = init_containers(pod)
        .iter()
        .filter(|c| is_sidecar(c))
        .filter_map(|c| f.init_statuses.iter().find(|s| s.name == c.name));
    let not_ready: Vec<&str> = sidecar_statuses
        .chain(f.statuses.iter())
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let all_ready = !f.statuses.is_empty() && not_ready.is_empty() && !terminal;
    let missing_gates: Vec<String> = pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .into_iter()
        .flatten()
        .filter(|g| {
            !old.and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.type_ == g.condition_type && c.status == "True")
        })
        .map(|g| g.condition_type.clone())
        .collect();
    let pod_ready = all_ready && missing_gates.is_empty();
    let initialized = *f.progress == InitProgress::Done
        || (terminal && !matches!(f.progress, InitProgress::Failed(_)));
    let not_ready_reason = if terminal {
        cond_reason::POD_COMPLETED
    } else {
        cond_reason::CONTAINERS_NOT_READY
    };
    let ready_reason = if !terminal && all_ready {
        cond_reason::READINESS_GATES_NOT_READY
    } else {
        not_ready_reason
    };
    let make = |type_, ok, reason| condition(type_, ok, reason, old, generation, now);
    let mut conditions = vec![
        make(cond::POD_READY_TO_START_CONTAINERS, f.sandbox_ready, None),
        make(
            cond::INITIALIZED,
            initialized,
            Some(cond_reason::CONTAINERS_NOT_INITIALIZED),
        ),
        make(cond::CONTAINERS_READY, all_ready, Some(not_ready_reason)),
        make(cond::READY, pod_ready, Some(ready_reason)),
        make(cond::POD_SCHEDULED, true, None),
    ];
    if !all_ready && !terminal {
        let msg = format!("containers with unready status: [{}]", not_ready.join(" "));
        conditions[2].message = Some(msg.clone());
        conditions[3].message = Some(msg);
    }
    if all_ready && !missing_gates.is_empty() {
        let gates: Vec<String> = missing_gates
            .iter()
            .map(|g| {
                format!("corresponding condition of pod readiness gate \"{g}\" does not exist.")
            })
            .collect();
        conditions[3].message = Some(gates.join(", "));
    }
    if conditions[1].status == "False" {
        let incomplete: Vec<&str> = f
            .init_statuses
            .iter()
            .filter(|s| !s.ready)
            .map(|s| s.name.as_str())
            .collect();
        conditions[1].message = Some(format!(
            "containers with incomplete status: [{}]",
            incomplete.join(" ")
        ));
    }
    let ours = [
        cond::POD_READY_TO_START_CONTAINERS,
        cond::INITIALIZED,
        cond::CONTAINERS_READY,
        cond::READY,
        cond::POD_SCHEDULED,
    ];
    conditions.extend(
        old.and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| !ours.contains(&c.type_.as_str()))
            .cloned(),
    );
    conditions
}

/// The status of a pod the node does not admit, as the kubelet's `rejectPod`:
/// phase `Failed` with the admission's reason and `Pod was rejected: <message>`,
/// and the pod's QoS class; everything else is left as the API has it.
#[must_use]
pub fn rejected(pod: &Pod, rejection: &super::admit::Rejection) -> PodStatus {
    PodStatus {
        phase: Some(phase::FAILED.into()),
        reason: Some(rejection.reason.clone()),
        message: Some(format!("Pod was rejected: {}", rejection.message)),
        qos_class: Some(qos_class(pod).as_str().into()),
        ..pod.status.clone().unwrap_or_default()
    }
}

/// The status that marks `pod` stopped by the node, as the eviction
/// manager's and the node shutdown manager's status functions: `reason`
/// (`Evicted`, or `Terminated` for a node shutdown) and `message`, and for
/// a threshold eviction or a shutdown (`disruption`) the `DisruptionTarget`
/// condition (reason `TerminationByKubelet`, the same message), which
/// local storage evictions do not set; the pod worker then stops its
/// containers and fails it ([`super::spec::is_evicted`]).
#[must_use]
pub fn evicting(
    pod: &Pod,
    reason: &str,
    message: &str,
    disruption: bool,
    now: Timestamp,
) -> PodStatus {
    let mut st = pod.status.clone().unwrap_or_default();
    st.reason = Some(reason.into());
    st.message = Some(message.to_string());
    if !disruption {
        return st;
    }
    let mut conditions: Vec<PodCondition> = st
        .conditions
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ != crate::reasons::pod::DISRUPTION_TARGET)
        .collect();
    conditions.push(PodCondition {
        type_: crate::reasons::pod::DISRUPTION_TARGET.into(),
        status: "True".into(),
        reason: Some(crate::reasons::pod::TERMINATION_BY_KUBELET.into()),
        message: Some(message.to_string()),
        last_transition_time: Some(api_time(now)),
        observed_generation: pod.metadata.generation,
        ..Default::default()
    });
    st.conditions = Some(conditions);
    st
}

/// The message of a container that had not terminated when its pod did (the
/// kubelet's `TerminatePod`).
pub const NOT_LOCATED_MESSAGE: &str =
    "The container could not be located when the pod was terminated";

/// The final status of a pod whose containers are gone, written before the
/// node deletes it, as the kubelet's status manager `TerminatePod`: once the
/// pod has initialized (no init containers, or a regular container left
/// `waiting`), each container status not `terminated` becomes terminated with
/// `ContainerStatusUnknown`, exit code 137; so do the init containers up to
/// the last one that started; and a `Pending` or `Running` phase becomes
/// `Failed` (a pod deleted while pending ends `Failed`).
#[must_use]
pub fn terminated_status(pod: &Pod, status: &PodStatus) -> PodStatus {
    let mut out = status.clone();
    let unknown = || ApiState {
        terminated: Some(ContainerStateTerminated {
            reason: Some(terminated::CONTAINER_STATUS_UNKNOWN.into()),
            message: Some(NOT_LOCATED_MESSAGE.into()),
            exit_code: 137,
            ..Default::default()
        }),
        ..Default::default()
    };
    let is_terminated =
        |s: &ContainerStatus| s.state.as_ref().is_some_and(|st| st.terminated.is_some());
    let started = |s: &ContainerStatus| {
        s.last_state
            .as_ref()
            .is_some_and(|st| st.terminated.is_some())
            || s.state.as_ref().is_none_or(|st| st.waiting.is_none())
    };
    let has_init = pod
        .spec
        .as_ref()
        .is_some_and(|s| s.init_containers.as_ref().is_some_and(|i| !i.is_empty()));
    let initialized = !has_init
        || status.container_statuses.iter().flatten().any(started)
        || status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == cond::INITIALIZED && c.status == "True");
    if initialized {
        for s in out.container_statuses.iter_mut().flatten() {
            if !is_terminated(s) {
                s.state = Some(unknown());
                s.ready = false;
            }
        }
    }
    if let Some(inits) = out.init_container_statuses.as_mut() {
        let last_started = inits.iter().rposition(started);
        for s in inits.iter_mut().take(last_started.map_or(0, |i| i + 1)) {
            if !is_terminated(s) {
                s.state = Some(unknown());
                s.ready = false;
            }
        }
    }
    if !out.phase.as_deref().is_some_and(phase::is_terminal) {
        out.phase = Some(phase::FAILED.into());
    }
    out
}

/// `t` as the API keeps it: `metav1.Time` has whole seconds, so a status
/// built with finer times would never equal the one read back, and every sync
/// would send a patch the API server drops as a no-op.
#[must_use]
pub fn api_time(t: Timestamp) -> Time {
    Time(Timestamp::from_second(t.as_second()).unwrap_or(t))
}

/// True when two statuses differ in anything but condition probe times, so a
/// patch is worth sending (the status manager's `needsUpdate`).
#[must_use]
pub fn differs(old: Option<&PodStatus>, new: &PodStatus) -> bool {
    old != Some(new)
}

#[cfg(test)]
mod tests {
    #[test]
    fn pod_level_status_resources_are_the_allocation_then_what_the_pod_cgroup_holds() {
        use super::*;
        let cgroup = |read| PodCgroup {
            read,
            cpu_period_us: crate::pod_core::limits::CPU_PERIOD_US,
        };
        let list = |cpu: &str, memory: &str| {
            Some(BTreeMap::from([
                ("cpu".to_string(), Quantity(cpu.into())),
                ("memory".to_string(), Quantity(memory.into())),
            ]))
        };
        let mut p = crate::fixtures::pod("web")
            .container("c", "busybox")
            .build();
        p.spec.as_mut().unwrap().resources = Some(ResourceRequirements {
            requests: list("200m", "128Mi"),
            limits: list("400m", "256Mi"),
            ..Default::default()
        });
        let mut st = PodStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        };
        pod_level_resources(&mut st, &p, cgroup(None));
        let bytes = |m: u64| (m << 20).to_string();
        assert_eq!(st.allocated_resources, list("200m", &bytes(128)));
        let r = st.resources.clone().unwrap();
        assert_eq!(r.requests, list("200m", &bytes(128)));
        assert_eq!(r.limits, list("400m", &bytes(256)));
        // Running: what the cgroup holds where it is not the allocation.
        st.phase = Some("Running".into());
        let applied = crate::pod_core::limits::Limits {
            cpu_shares: 204,
            cpu_quota: Some(40_000),
            memory: Some(256 << 20),
        };
        pod_level_resources(&mut st, &p, cgroup(Some(&applied)));
        let r = st.resources.clone().unwrap();
        assert_eq!(r.requests, list("200m", "128Mi"), "the allocation's");
        assert_eq!(r.limits, list("400m", &bytes(256)));
        let growing = crate::pod_core::limits::Limits {
            cpu_shares: 409,
            cpu_quota: Some(80_000),
            memory: Some(512 << 20),
        };
        pod_level_resources(&mut st, &p, cgroup(Some(&growing)));
        let r = st.resources.unwrap();
        assert_eq!(r.requests, list("400m", "128Mi"), "shares rounded up");
        assert_eq!(r.limits, list("800m", &bytes(512)));
        // A BestEffort pod has neither.
        let mut st = PodStatus::default();
        pod_level_resources(&mut st, &crate::fixtures::pod("be").build(), cgroup(None));
        assert_eq!((st.allocated_resources, st.resources), (None, None));
    }

    #[test]
    fn a_pod_deleted_while_pending_ends_failed_with_unknown_containers() {
        let waiting = |name: &str| ContainerStatus {
            name: name.into(),
            state: Some(ApiState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ErrImagePull".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut pod = Pod::default();
        let last = PodStatus {
            phase: Some("Pending".into()),
            container_statuses: Some(vec![waiting("app")]),
            ..Default::default()
        };
        let end = terminated_status(&pod, &last);
        assert_eq!(end.phase.as_deref(), Some("Failed"));
        let t = end.container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .terminated
            .unwrap();
        assert_eq!(t.exit_code, 137);
        assert_eq!(t.reason.as_deref(), Some("ContainerStatusUnknown"));
        assert_eq!(t.message.as_deref(), Some(NOT_LOCATED_MESSAGE));

        // Not initialized: the regular containers stay waiting, and init
        // containers after the last one that started are left alone.
        pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            init_containers: Some(vec![ApiContainer::default(), ApiContainer::default()]),
            ..Default::default()
        });
        let running = ContainerStatus {
            name: "init-1".into(),
            state: Some(ApiState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let last = PodStatus {
            phase: Some("Pending".into()),
            init_container_statuses: Some(vec![running, waiting("init-2")]),
            container_statuses: Some(vec![waiting("app")]),
            ..Default::default()
        };
        let end = terminated_status(&pod, &last);
        let inits = end.init_container_statuses.unwrap();
        assert!(inits[0].state.as_ref().unwrap().terminated.is_some());
        assert!(inits[1].state.as_ref().unwrap().waiting.is_some());
        assert!(
            end.container_statuses.unwrap()[0]
                .state
                .as_ref()
                .unwrap()
                .waiting
                .is_some()
        );

        // A terminal pod keeps its phase and its containers' own ends.
        let done = PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        };
        assert_eq!(terminated_status(&pod, &done), done);
    }

    use super::*;
    use crate::fixtures::{ctr, exited, pod, runtime, sandbox, t};
    use ContainerState::Running;
    use k8s_openapi::api::core::v1::VolumeMount;

    fn ctx() -> StatusContext {
        StatusContext {
            host_ips: vec!["127.0.0.1".into()],
            ..crate::fixtures::status_context()
        }
    }

    #[test]
    fn containers_of_the_run_before_a_restart_of_all_are_waiting_with_it_as_last_state() {
        let mut p = pod("all")
            .restart_policy("Never")
            .init_container("init", "busybox")
            .container("source", "busybox")
            .container_restart("Never", &[("RestartAllContainers", "In", &[42])])
            .container("regular", "busybox")
            .build();
        p.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "Initialized".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let rt = runtime(
            vec![sandbox("s0", 0, true)],
            vec![
                exited(ctr("i0", "init", 0, "s0", Running), 0, t(12)),
                exited(ctr("c0", "source", 0, "s0", Running), 42, t(60)),
                exited(ctr("r0", "regular", 0, "s0", Running), 137, t(61)),
            ],
        );
        let st = status(&p, &rt, &BTreeMap::new(), &BTreeMap::new(), &ctx(), t(62));
        for cs in st
            .container_statuses
            .iter()
            .flatten()
            .chain(st.init_container_statuses.iter().flatten())
        {
            let waiting = cs.state.as_ref().and_then(|s| s.waiting.as_ref()).unwrap();
            assert_eq!(
                waiting.reason.as_deref(),
                Some("RestartingAllContainers"),
                "{}",
                cs.name
            );
            assert_eq!(cs.restart_count, 1, "{}", cs.name);
            let last = cs
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .unwrap();
            let want = match cs.name.as_str() {
                "source" => 42,
                "regular" => 137,
                _ => 0,
            };
            assert_eq!(last.exit_code, want, "{}", cs.name);
        }
        assert_ne!(st.phase.as_deref(), Some("Failed"));
        assert_eq!(condition(&st, "AllContainersRestarting").status, "False");
        assert_eq!(
            condition(&st, "Initialized").status,
            "True",
            "stays initialized"
        );
    }

    /// The condition of type `ty` in `st`.
    fn condition<'a>(st: &'a PodStatus, ty: &str) -> &'a PodCondition {
        st.conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == ty)
            .unwrap_or_else(|| panic!("no {ty} condition in {st:#?}"))
    }

    fn state_of(s: &ContainerStatus) -> String {
        let st = s.state.as_ref().unwrap();
        if st.running.is_some() {
            "running".into()
        } else if let Some(t) = &st.terminated {
            format!(
                "terminated:{}:{}",
                t.exit_code,
                t.reason.clone().unwrap_or_default()
            )
        } else {
            format!(
                "waiting:{}",
                st.waiting
                    .as_ref()
                    .unwrap()
                    .reason
                    .clone()
                    .unwrap_or_default()
            )
        }
    }

    #[test]
    fn sidecar_readiness_counts_for_the_pod() {
        let p = pod("web")
            .sidecar("side", "busybox")
            .container("a", "busybox")
            .build();
        let rt = runtime(
            vec![sandbox("s0", 0, true)],
            vec![
                ctr("c0", "side", 0, "s0", Running),
                ctr("c1", "a", 0, "s0", Running),
            ],
        );
        let probes = |side_ready: bool| {
            BTreeMap::from([
                (
                    "side".to_string(),
                    ContainerProbes {
                        ready: side_ready,
                        started: true,
                        failed: None,
                    },
                ),
                (
                    "a".to_string(),
                    ContainerProbes {
                        ready: true,
                        started: true,
                        failed: None,
                    },
                ),
            ])
        };
        let cond = |st: &PodStatus, ty: &str| {
            let c = condition(st, ty).clone();
            (c.status, c.message.unwrap_or_default())
        };
        let unready = status(&p, &rt, &BTreeMap::new(), &probes(false), &ctx(), t(20));
        assert_eq!(
            cond(&unready, "Ready"),
            (
                "False".to_string(),
                "containers with unready status: [side]".to_string()
            )
        );
        assert_eq!(cond(&unready, "ContainersReady").0, "False");
        let ready = status(&p, &rt, &BTreeMap::new(), &probes(true), &ctx(), t(20));
        assert_eq!(cond(&ready, "Ready").0, "True");
    }

    #[test]
    fn volume_mounts_show_their_resolved_recursive_read_only_mode() {
        let mount = |path: &str, ro: Option<bool>, rro: Option<&str>| VolumeMount {
            name: "mnt".into(),
            mount_path: path.into(),
            read_only: ro,
            recursive_read_only: rro.map(str::to_string),
            ..Default::default()
        };
        let c = ApiContainer {
            name: "c".into(),
            volume_mounts: Some(vec![
                mount("/rro", Some(true), Some("Enabled")),
                mount("/if-possible", Some(true), Some("IfPossible")),
                mount("/ro", Some(true), None),
                mount("/rw", None, None),
            ]),
            ..Default::default()
        };
        let modes = |runtime_rro: bool| {
            volume_mount_statuses(&c, runtime_rro)
                .unwrap()
                .into_iter()
                .map(|v| (v.mount_path, v.recursive_read_only))
                .collect::<Vec<_>>()
        };
        let on = |m: &str| Some(m.to_string());
        assert_eq!(
            modes(true),
            vec![
                ("/rro".to_string(), on("Enabled")),
                ("/if-possible".to_string(), on("Enabled")),
                ("/ro".to_string(), on("Disabled")),
                ("/rw".to_string(), None),
            ]
        );
        assert_eq!(
            modes(false)[1].1,
            on("Disabled"),
            "IfPossible without the runtime's support"
        );
        let bare = ApiContainer::default();
        assert_eq!(volume_mount_statuses(&bare, true), None);
    }

    #[test]
    fn sidecars_after_initialization_neither_hold_the_pod_pending_nor_let_it_end_early() {
        let p = pod("job")
            .sidecar("side", "busybox")
            .container("a", "busybox")
            .restart_policy("Never")
            .build();
        let phase_of = |containers: Vec<Container>| {
            let rt = runtime(vec![sandbox("s0", 0, true)], containers);
            let st = status(&p, &rt, &BTreeMap::new(), &BTreeMap::new(), &ctx(), t(90));
            st.phase.unwrap()
        };
        let side = || ctr("c0", "side", 0, "s0", Running);
        let main = || ctr("c1", "a", 0, "s0", Running);
        // The main container finished; the sidecar still runs: Running, as
        // the kubelet counts a running sidecar.
        assert_eq!(phase_of(vec![side(), exited(main(), 0, t(60))]), "Running");
        // The sidecar was stopped after it: the pod succeeded, not Pending.
        assert_eq!(
            phase_of(vec![exited(side(), 137, t(70)), exited(main(), 0, t(60))]),
            "Succeeded"
        );
        assert_eq!(
            phase_of(vec![exited(side(), 0, t(70)), exited(main(), 1, t(60))]),
            "Failed"
        );
        // A sidecar that crashed while the main container runs: still Running.
        assert_eq!(phase_of(vec![exited(side(), 1, t(70)), main()]), "Running");
        // Before any main container exists, a sidecar not yet running is
        // initialization: Pending.
        assert_eq!(phase_of(vec![exited(side(), 1, t(70))]), "Pending");
    }

    #[test]
    fn table() {
        let always = pod("web").container("a", "busybox").build();
        let never = pod("job")
            .container("a", "busybox")
            .restart_policy("Never")
            .build();
        let none = BTreeMap::new();
        let crash = BTreeMap::from([(
            "a".to_string(),
            Waiting {
                reason: "CrashLoopBackOff".into(),
                message: "back-off 10s".into(),
            },
        )]);
        let pull = BTreeMap::from([(
            "a".to_string(),
            Waiting {
                reason: "ErrImagePull".into(),
                message: "not found".into(),
            },
        )]);
        let s0 = || vec![sandbox("s0", 0, true)];
        // (name, pod, runtime, waiting, phase, container state, ready, restarts)
        let cases = vec![
            (
                "nothing yet",
                &always,
                runtime(vec![], vec![]),
                &none,
                "Pending",
                "waiting:ContainerCreating",
                false,
                0,
            ),
            (
                "image pull failed",
                &always,
                runtime(s0(), vec![]),
                &pull,
                "Pending",
                "waiting:ErrImagePull",
                false,
                0,
            ),
            (
                "running",
                &always,
                runtime(s0(), vec![ctr("c1", "a", 0, "s0", Running)]),
                &none,
                "Running",
                "running",
                true,
                0,
            ),
            (
                "exit 3 under Never",
                &never,
                runtime(
                    s0(),
                    vec![exited(ctr("c1", "a", 0, "s0", Running), 3, t(5))],
                ),
                &none,
                "Failed",
                "terminated:3:Error",
                false,
                0,
            ),
            (
                "exit 0 under Never",
                &never,
                runtime(
                    s0(),
                    vec![exited(ctr("c1", "a", 0, "s0", Running), 0, t(5))],
                ),
                &none,
                "Succeeded",
                "terminated:0:Completed",
                false,
                0,
            ),
            (
                "crash loop under Always",
                &always,
                runtime(
                    s0(),
                    vec![
                        exited(ctr("c2", "a", 2, "s0", Running), 1, t(9)),
                        exited(ctr("c1", "a", 1, "s0", Running), 1, t(5)),
                    ],
                ),
                &crash,
                "Running",
                "waiting:CrashLoopBackOff",
                false,
                2,
            ),
            (
                "restarted and running",
                &always,
                runtime(
                    s0(),
                    vec![
                        ctr("c2", "a", 1, "s0", Running),
                        exited(ctr("c1", "a", 0, "s0", Running), 1, t(5)),
                    ],
                ),
                &none,
                "Running",
                "running",
                true,
                1,
            ),
        ];
        for (name, p, rt, waiting, want_phase, want_state, want_ready, restarts) in cases {
            let st = status(p, &rt, waiting, &BTreeMap::new(), &ctx(), t(100));
            let cs = &st.container_statuses.as_ref().unwrap()[0];
            assert_eq!(st.phase.as_deref(), Some(want_phase), "{name}: phase");
            assert_eq!(state_of(cs), want_state, "{name}: state");
            assert_eq!(cs.ready, want_ready, "{name}: ready");
            assert_eq!(cs.restart_count, restarts, "{name}: restarts");
            let ready = condition(&st, "Ready");
            assert_eq!(
                ready.status,
                if want_ready { "True" } else { "False" },
                "{name}: Ready condition"
            );
        }
    }

    #[test]
    fn running_pod_reports_ips_ids_and_keeps_scheduled() {
        let mut p = pod("web").container("a", "busybox").build();
        p.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let rt = runtime(
            vec![sandbox("s0", 0, true)],
            vec![ctr("c1", "a", 0, "s0", Running)],
        );
        let st = status(&p, &rt, &BTreeMap::new(), &BTreeMap::new(), &ctx(), t(100));
        assert_eq!(st.pod_ip.as_deref(), Some("10.88.0.2"));
        assert_eq!(st.host_ip.as_deref(), Some("127.0.0.1"));
        assert_eq!(st.qos_class.as_deref(), Some("BestEffort"));
        assert_eq!(st.start_time, Some(Time(t(100))));
        let cs = &st.container_statuses.as_ref().unwrap()[0];
        assert_eq!(cs.container_id.as_deref(), Some("containerd://c1"));
        assert_eq!(cs.image_id, "sha256:b");
        let types: Vec<&str> = st
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(
            types,
            vec![
                "PodReadyToStartContainers",
                "Initialized",
                "ContainersReady",
                "Ready",
                "PodScheduled"
            ]
        );
        // Same state later: conditions keep their transition times, so nothing to patch.
        p.status = Some(st.clone());
        let again = status(&p, &rt, &BTreeMap::new(), &BTreeMap::new(), &ctx(), t(200));
        assert!(!differs(Some(&st), &again));
    }

    #[test]
    fn a_pod_bound_without_the_scheduler_gets_pod_scheduled() {
        // spec.nodeName set by its author: no scheduler wrote PodScheduled.
        let p = pod("direct").container("a", "busybox").build();
        let rt = runtime(vec![sandbox("s0", 0, true)], vec![]);
        let st = status(&p, &rt, &BTreeMap::new(), &BTreeMap::new(), &ctx(), t(100));
        let scheduled: Vec<&PodCondition> = st
            .conditions
            .iter()
            .flatten()
            .filter(|c| c.type_ == "PodScheduled")
            .collect();
        assert_eq!(scheduled.len(), 1, "{:?}", st.conditions);
        assert_eq!(scheduled[0].status, "True");
        assert_eq!(scheduled[0].last_transition_time, Some(api_time(t(100))));
    }

    #[test]
    fn a_status_read_back_from_the_api_needs_no_patch() {
        let nanos = |s: i64, ns: i64| {
            Timestamp::from_nanosecond(
                i128::from(t(s).as_second()) * 1_000_000_000 + i128::from(ns),
            )
            .unwrap()
        };
        let mut p = pod("web")
            .container("a", "busybox")
            .container("b", "busybox")
            .build();
        let mut a = ctr("c1", "a", 0, "s0", Running);
        a.started_at = Some(nanos(10, 123_456_789));
        let mut b = exited(ctr("c2", "b", 0, "s0", Running), 1, nanos(20, 987_654_321));
        b.started_at = Some(nanos(11, 5));
        let rt = runtime(vec![sandbox("s0", 0, true)], vec![a, b]);
        let st = status(
            &p,
            &rt,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &ctx(),
            nanos(30, 42),
        );
        // What the API server stores and the watch brings back.
        let stored: PodStatus = serde_json::from_value(serde_json::to_value(&st).unwrap()).unwrap();
        assert_eq!(stored, st, "every time is in whole seconds");
        assert!(
            st.container_statuses
                .iter()
                .flatten()
                .all(|c| c.last_state.is_some()),
            "the API server returns lastState, {{}} when empty"
        );
        p.status = Some(stored.clone());
        let again = status(
            &p,
            &rt,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &ctx(),
            nanos(40, 7),
        );
        assert!(!differs(Some(&stored), &again), "{again:#?}");
    }

    #[test]
    fn readiness_and_startup_probes_drive_ready_and_started() {
        let p = pod("web").container("a", "busybox").build();
        let rt = runtime(
            vec![sandbox("s0", 0, true)],
            vec![ctr("c1", "a", 0, "s0", Running)],
        );
        let probes = |ready, started| {
            BTreeMap::from([(
                "a".to_string(),
                ContainerProbes {
                    ready,
                    started,
                    failed: None,
                },
            )])
        };
        let st = status(
            &p,
            &rt,
            &BTreeMap::new(),
            &probes(false, true),
            &ctx(),
            t(100),
        );
        let cs = &st.container_statuses.as_ref().unwrap()[0];
        assert!(!cs.ready && cs.started == Some(true));
        assert_eq!(st.phase.as_deref(), Some("Running"));
        let ready = condition(&st, "Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref()),
            ("False", Some("ContainersNotReady"))
        );
        let st = status(
            &p,
            &rt,
            &BTreeMap::new(),
            &probes(false, false),
            &ctx(),
            t(100),
        );
        assert_eq!(
            st.container_statuses.as_ref().unwrap()[0].started,
            Some(false)
        );
        let st = status(
            &p,
            &rt,
            &BTreeMap::new(),
            &probes(true, true),
            &ctx(),
            t(100),
        );
        assert!(st.container_statuses.as_ref().unwrap()[0].ready);
    }

    #[test]
    fn readiness_gates_hold_ready_and_foreign_conditions_stay() {
        use k8s_openapi::api::core::v1::PodReadinessGate;
        let mut p = pod("web").container("a", "busybox").build();
        p.spec.as_mut().unwrap().readiness_gates = Some(vec![PodReadinessGate {
            condition_type: "example.com/lb".into(),
        }]);
        let rt = runtime(
            vec![sandbox("s0", 0, true)],
            vec![ctr("c1", "a", 0, "s0", Running)],
        );
        let st = status(&p, &rt, &BTreeMap::new(), &BTreeMap::new(), &ctx(), t(100));
        let ready = condition(&st, "Ready").clone();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref()),
            ("False", Some("ReadinessGatesNotReady"))
        );
        p.status = Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "example.com/lb".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let st = status(&p, &rt, &BTreeMap::new(), &BTreeMap::new(), &ctx(), t(100));
        assert_eq!(
            condition(&st, "example.com/lb").status,
            "True",
            "the gate's condition is kept"
        );
        assert_eq!(condition(&st, "Ready").status, "True");
    }

    #[test]
    fn init_containers_in_status() {
        let p = pod("web")
            .init_container("i1", "busybox")
            .container("a", "busybox")
            .build();
        let never = pod("job")
            .init_container("i1", "busybox")
            .container("a", "busybox")
            .restart_policy("Never")
            .build();
        let cond = |st: &PodStatus, t: &str| {
            let c = condition(st, t);
            (c.status.clone(), c.reason.clone().unwrap_or_default())
        };
        let s0 = || vec![sandbox("s0", 0, true)];
        let running_init = runtime(s0(), vec![ctr("x1", "i1", 0, "s0", Running)]);
        let st = status(
            &p,
            &running_init,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &ctx(),
            t(100),
        );
        assert_eq!(st.phase.as_deref(), Some("Pending"));
        assert_eq!(
            cond(&st, "Initialized"),
            ("False".into(), "ContainersNotInitialized".into())
        );
        assert_eq!(
            state_of(&st.container_statuses.as_ref().unwrap()[0]),
            "waiting:PodInitializing"
        );
        assert_eq!(
            state_of(&st.init_container_statuses.as_ref().unwrap()[0]),
            "running"
        );

        let done = runtime(
            s0(),
            vec![
                ctr("a1", "a", 0, "s0", Running),
                exited(ctr("x1", "i1", 0, "s0", Running), 0, t(5)),
            ],
        );
        let st = status(
            &p,
            &done,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &ctx(),
            t(100),
        );
        assert_eq!(st.phase.as_deref(), Some("Running"));
        assert_eq!(cond(&st, "Initialized").0, "True");
        let init = &st.init_container_statuses.as_ref().unwrap()[0];
        assert_eq!(state_of(init), "terminated:0:Completed");
        assert!(init.ready, "a completed init container is ready");

        let failed = runtime(
            s0(),
            vec![exited(ctr("x1", "i1", 0, "s0", Running), 1, t(5))],
        );
        let st = status(
            &never,
            &failed,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &ctx(),
            t(100),
        );
        assert_eq!(st.phase.as_deref(), Some("Failed"));
        assert_eq!(cond(&st, "Initialized").0, "False");
        assert_eq!(
            state_of(&st.container_statuses.as_ref().unwrap()[0]),
            "waiting:PodInitializing"
        );
    }

    #[test]
    fn deleted_and_deadline_pods_are_terminal() {
        // (name, pod, runtime, phase, reason)
        let always = pod("web").container("a", "busybox").build();
        let running = runtime(
            vec![sandbox("s0", 0, true)],
            vec![ctr("c1", "a", 0, "s0", Running)],
        );
        let killed = |code| {
            runtime(
                vec![sandbox("s0", 0, false)],
                vec![exited(ctr("c1", "a", 0, "s0", Running), code, t(50))],
            )
        };
        let deleted = pod("web")
            .container("a", "busybox")
            .deleted(t(40), 5)
            .build();
        let mut deadline = always.clone();
        deadline.spec.as_mut().unwrap().active_deadline_seconds = Some(30);
        deadline.status = Some(PodStatus {
            start_time: Some(Time(t(0))),
            ..Default::default()
        });
        let cases = [
            (
                "deleted, still running",
                &deleted,
                running.clone(),
                "Running",
                None,
            ),
            (
                "deleted, stopped cleanly",
                &deleted,
                killed(0),
                "Succeeded",
                None,
            ),
            ("deleted, killed", &deleted, killed(137), "Failed", None),
            (
                "not deleted, restarting",
                &always,
                killed(0),
                "Running",
                None,
            ),
            (
                "past its deadline",
                &deadline,
                killed(137),
                "Failed",
                Some("DeadlineExceeded"),
            ),
        ];
        for (name, p, rt, want_phase, want_reason) in cases {
            let st = status(p, &rt, &BTreeMap::new(), &BTreeMap::new(), &ctx(), t(100));
            assert_eq!(st.phase.as_deref(), Some(want_phase), "{name}");
            assert_eq!(st.reason.as_deref(), want_reason, "{name}");
        }
        let mut early = deadline.clone();
        early.spec.as_mut().unwrap().active_deadline_seconds = Some(300);
        let st = status(
            &early,
            &running,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &ctx(),
            t(100),
        );
        assert_eq!((st.phase.as_deref(), st.reason), (Some("Running"), None));
    }

    #[test]
    fn terminal_status_is_final_even_without_containers() {
        let never = pod("job")
            .container("a", "busybox")
            .restart_policy("Never")
            .build();
        let done = runtime(
            vec![sandbox("s0", 0, false)],
            vec![exited(ctr("c1", "a", 0, "s0", Running), 0, t(5))],
        );
        let mut p = never.clone();
        p.status = Some(status(
            &never,
            &done,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &ctx(),
            t(10),
        ));
        assert_eq!(
            p.status.as_ref().unwrap().phase.as_deref(),
            Some("Succeeded")
        );
        // The runtime has since removed the container: nothing moves back to waiting.
        let gone = status(
            &p,
            &runtime(vec![], vec![]),
            &BTreeMap::new(),
            &BTreeMap::new(),
            &ctx(),
            t(20),
        );
        assert_eq!(Some(&gone), p.status.as_ref());
    }

    #[test]
    fn container_restart_policy_decides_the_phase() {
        // (name, pod, exit code, waiting to restart, phase)
        let s0 = || vec![sandbox("s0", 0, true)];
        let rule = pod("rule")
            .restart_policy("Never")
            .container("a", "busybox")
            .container_restart("Never", &[("Restart", "In", &[42])])
            .build();
        let own_never = pod("own-never")
            .container("a", "busybox")
            .container_restart("Never", &[])
            .build();
        let on_failure = pod("job")
            .restart_policy("Never")
            .container("a", "busybox")
            .container_restart("OnFailure", &[])
            .build();
        let crash = BTreeMap::from([(
            "a".to_string(),
            Waiting {
                reason: "CrashLoopBackOff".into(),
                message: "back-off".into(),
            },
        )]);
        let none = BTreeMap::new();
        let cases = [
            ("rule matches", &rule, 42, &none, "Running"),
            ("rule matches, backing off", &rule, 42, &crash, "Running"),
            ("rule does not match", &rule, 1, &none, "Failed"),
            (
                "container Never under pod Always",
                &own_never,
                1,
                &none,
                "Failed",
            ),
            ("container Never, exit 0", &own_never, 0, &none, "Succeeded"),
            (
                "OnFailure under pod Never, failed",
                &on_failure,
                1,
                &none,
                "Running",
            ),
            (
                "OnFailure under pod Never, done",
                &on_failure,
                0,
                &none,
                "Succeeded",
            ),
        ];
        for (name, p, code, waiting, want) in cases {
            let rt = runtime(
                s0(),
                vec![exited(ctr("c1", "a", 0, "s0", Running), code, t(5))],
            );
            let st = status(p, &rt, waiting, &BTreeMap::new(), &ctx(), t(100));
            assert_eq!(st.phase.as_deref(), Some(want), "{name}");
        }
    }

    #[test]
    fn ephemeral_container_statuses() {
        let p = pod("web")
            .container("a", "busybox")
            .ephemeral("zz", "busybox", None)
            .ephemeral("debugger", "busybox", Some("a"))
            .build();
        let rt = runtime(
            vec![sandbox("s0", 0, true)],
            vec![
                ctr("c1", "a", 0, "s0", Running),
                ctr("e1", "debugger", 0, "s0", Running),
            ],
        );
        let st = status(&p, &rt, &BTreeMap::new(), &BTreeMap::new(), &ctx(), t(100));
        let eph = st.ephemeral_container_statuses.clone().unwrap();
        let names: Vec<&str> = eph.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, vec!["debugger", "zz"], "sorted by name");
        assert_eq!(state_of(&eph[0]), "running");
        assert_eq!(eph[0].container_id.as_deref(), Some("containerd://e1"));
        assert!(!eph[0].ready && eph[0].started.is_none(), "never probed");
        assert_eq!(state_of(&eph[1]), "waiting:ContainerCreating");
        // Ready and the phase are the main containers' alone.
        assert_eq!(st.phase.as_deref(), Some("Running"));
        let ready = condition(&st, "Ready");
        assert_eq!(ready.status, "True");
        // An exited one stays terminated; it is not restarted.
        let rt = runtime(
            vec![sandbox("s0", 0, true)],
            vec![
                ctr("c1", "a", 0, "s0", Running),
                exited(ctr("e1", "debugger", 0, "s0", Running), 1, t(50)),
            ],
        );
        let st = status(&p, &rt, &BTreeMap::new(), &BTreeMap::new(), &ctx(), t(100));
        let eph = st.ephemeral_container_statuses.clone().unwrap();
        assert_eq!(state_of(&eph[0]), "terminated:1:Error");
        assert_eq!(st.phase.as_deref(), Some("Running"));
        // Its record gone (the runtime's state lost), it stays terminated.
        let mut reported = p.clone();
        reported.status = Some(st.clone());
        let lost = runtime(
            vec![sandbox("s0", 0, true)],
            vec![ctr("c1", "a", 0, "s0", Running)],
        );
        let again = status(
            &reported,
            &lost,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &ctx(),
            t(200),
        );
        assert_eq!(
            state_of(&again.ephemeral_container_statuses.unwrap()[0]),
            "terminated:1:Error"
        );
        // In a pod with init containers, an ephemeral one not yet created waits
        // with PodInitializing.
        let init = pod("web")
            .init_container("i1", "busybox")
            .container("a", "busybox")
            .ephemeral("debugger", "busybox", None)
            .build();
        let st = status(
            &init,
            &runtime(vec![sandbox("s0", 0, true)], vec![]),
            &BTreeMap::new(),
            &BTreeMap::new(),
            &ctx(),
            t(100),
        );
        assert_eq!(
            state_of(&st.ephemeral_container_statuses.unwrap()[0]),
            "waiting:PodInitializing"
        );
        // No ephemeral containers: no field.
        let plain = pod("web").container("a", "busybox").build();
        let st = status(
            &plain,
            &rt,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &ctx(),
            t(100),
        );
        assert!(st.ephemeral_container_statuses.is_none());
    }

    #[test]
    fn resize_events_tell_transitions_only_with_the_kubelets_messages() {
        let pod_json = serde_json::json!({
            "metadata": { "name": "p", "generation": 3 },
            "spec": {
                "initContainers": [
                    { "name": "init", "image": "i" },
                    { "name": "side", "image": "i", "restartPolicy": "Always",
                      "resources": { "requests": { "cpu": "100m" } } },
                ],
                "containers": [{ "name": "c", "image": "i",
                    "resources": { "limits": { "memory": "48Mi" } } }],
            },
            "status": { "phase": "Running" },
        });
        let mut pod: Pod = serde_json::from_value(pod_json).unwrap();
        assert_eq!(
            resize_event_message("Pod resize started", &pod, None),
            r#"Pod resize started: {"initContainers":[{"name":"side","resources":{"requests":{"cpu":"100m"}}}],"containers":[{"name":"c","resources":{"limits":{"memory":"48Mi"}}}],"generation":3}"#
        );
        let condition = |type_: &str, reason: Option<&str>, message: &str| PodCondition {
            type_: type_.into(),
            status: "True".into(),
            reason: reason.map(Into::into),
            message: Some(message.into()),
            ..Default::default()
        };
        let with = |conditions: Vec<PodCondition>| PodStatus {
            phase: Some("Running".into()),
            conditions: Some(conditions),
            ..Default::default()
        };
        let reasons = |events: Vec<(bool, &'static str, String)>| -> Vec<(bool, &'static str)> {
            events.into_iter().map(|(w, r, _)| (w, r)).collect()
        };
        // Deferred appears: one warning, with the admission message.
        let deferred = condition(cond::POD_RESIZE_PENDING, Some("Deferred"), "no room");
        // Its message names the resources asked for, not those allocated.
        let mut requested = pod.clone();
        requested.spec.as_mut().unwrap().containers[0].resources =
            serde_json::from_value(serde_json::json!({ "limits": { "memory": "1Gi" } })).unwrap();
        let events = resize_events(&pod, &requested, &with(vec![deferred.clone()]));
        assert_eq!(reasons(events.clone()), [(true, "ResizeDeferred")]);
        assert!(
            events[0].2.contains(r#""limits":{"memory":"1Gi"}"#),
            "{}",
            events[0].2
        );
        assert!(
            events[0].2.starts_with("Pod resize Deferred: {"),
            "{}",
            events[0].2
        );
        assert!(
            events[0]
                .2
                .ends_with(r#""generation":3,"error":"no room"}"#),
            "{}",
            events[0].2
        );
        // Still deferred: nothing.
        pod.status.as_mut().unwrap().conditions = Some(vec![deferred]);
        assert!(
            resize_events(
                &pod,
                &pod,
                &with(vec![condition(
                    cond::POD_RESIZE_PENDING,
                    Some("Deferred"),
                    "other"
                )])
            )
            .is_empty()
        );
        // The error appears once, then completes.
        let error = condition(
            cond::POD_RESIZE_IN_PROGRESS,
            Some("Error"),
            "cannot decrease memory limits: x",
        );
        let events = resize_events(&pod, &pod, &with(vec![error.clone()]));
        assert_eq!(reasons(events.clone()), [(true, "ResizeError")]);
        assert!(
            events[0]
                .2
                .ends_with(r#""error":"cannot decrease memory limits: x"}"#)
        );
        pod.status.as_mut().unwrap().conditions = Some(vec![error]);
        assert!(
            resize_events(
                &pod,
                &pod,
                &with(vec![condition(
                    cond::POD_RESIZE_IN_PROGRESS,
                    Some("Error"),
                    "y"
                )])
            )
            .is_empty()
        );
        assert_eq!(
            reasons(resize_events(&pod, &pod, &with(vec![]))),
            [(false, "ResizeCompleted")]
        );
        // A pod that ended completes nothing.
        let mut ended = with(vec![]);
        ended.phase = Some("Succeeded".into());
        assert!(resize_events(&pod, &pod, &ended).is_empty());
    }
}
