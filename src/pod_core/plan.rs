//! What to do for one pod, given what the runtime holds: the kubelet's
//! `computePodActions` (kuberuntime_manager.go) plus the terminating path of
//! `SyncTerminatingPod`. Pure: pod, runtime state and time in; a [`Plan`] out.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use super::probes::{ContainerProbes, ProbeKind};
use super::runtime::{CgroupLimits, Container as RuntimeContainer, ContainerState, PodRuntime};
use super::spec::{
    EVICTION_GRACE_SECONDS, container_should_restart, ephemeral_names, grace_period,
    init_container_should_restart, init_containers, is_evicted, is_sidecar, is_terminal,
    main_containers, restart_policy, restarts_after_kill,
};
use super::translate::hash_matches;
use crate::reasons::waiting;

use super::backoff::CrashBackoff;

/// One action on the runtime or the API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Stop a running container: SIGTERM, SIGKILL after `grace_seconds`.
    KillContainer {
        /// CRI container ID.
        id: String,
        /// Container name, for events.
        name: String,
        /// Grace period in seconds.
        grace_seconds: i64,
        /// Why, for the `Killing` event.
        reason: String,
    },
    /// Stop a sandbox (its containers and network).
    StopSandbox {
        /// CRI sandbox ID.
        id: String,
    },
    /// Remove a stopped container.
    RemoveContainer {
        /// CRI container ID.
        id: String,
    },
    /// Remove a stopped sandbox.
    RemoveSandbox {
        /// CRI sandbox ID.
        id: String,
    },
    /// Create and start a new sandbox.
    CreateSandbox {
        /// Sandbox attempt number.
        attempt: u32,
        /// True when an earlier sandbox existed (the `SandboxChanged` event).
        changed: bool,
    },
    /// Pull the image if needed, create and start the container in the current sandbox.
    StartContainer {
        /// Container name in the spec.
        name: String,
        /// Attempt (restart count) to create it with.
        attempt: u32,
        /// The attempt its CrashLoopBackOff counts from ([`backoff_since`]).
        backoff_since: u32,
    },
    /// Pull the image if needed, create and start an ephemeral container in
    /// the current sandbox, once (the kubelet's `EphemeralContainersToStart`).
    StartEphemeralContainer {
        /// Container name in `spec.ephemeralContainers`.
        name: String,
        /// CRI ID of the newest container named by its `targetContainerName`,
        /// whose process namespace it joins; `None` when it names none or the
        /// runtime has no such container.
        target_id: Option<String>,
    },
    /// Change a running container's cgroup limits to those of its
    /// (allocated) resources, in place (in-place resize, CRI
    /// `UpdateContainerResources`).
    ResizeContainer {
        /// CRI container ID.
        id: String,
        /// Container name in the spec.
        name: String,
    },
    /// Everything is stopped and removed: delete the Pod object (grace 0, UID precondition).
    DeletePod,
}

/// Why a container is waiting, as shown in `state.waiting`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    /// Reason, e.g. `CrashLoopBackOff`, `ErrImagePull`.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

/// The result of planning one sync of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Steps, in order.
    pub steps: Vec<Step>,
    /// Containers held back by a back-off, by name.
    pub waiting: BTreeMap<String, Waiting>,
    /// When the CrashLoopBackOff of each container it holds ends, by name.
    pub held_until: BTreeMap<String, Timestamp>,
    /// The earliest deadline (a back-off ending) after which the pod must be synced again.
    pub requeue_after: Option<Duration>,
    /// The pod ran past `spec.activeDeadlineSeconds`: its containers are killed
    /// and its phase becomes `Failed` with reason `DeadlineExceeded`.
    pub deadline_exceeded: bool,
    /// The plan kills the whole pod (deleted, evicted, finished or past its
    /// deadline; the kubelet's `PodActions.KillPod`): its leading
    /// [`Step::KillContainer`] steps are `killPodWithSyncResult`'s, run
    /// together ([`Plan::leading_kills`]).
    pub kill_pod: bool,
}

impl Plan {
    /// The plan's leading [`Step::KillContainer`] steps: for a terminating
    /// pod, every container to stop, which the runtime manager stops together
    /// before the rest of the plan (the kubelet's `killPodWithSyncResult`).
    #[must_use]
    pub fn leading_kills(&self) -> &[Step] {
        let n = self
            .steps
            .iter()
            .take_while(|s| matches!(s, Step::KillContainer { .. }))
            .count();
        &self.steps[..n]
    }

    fn requeue_at(&mut self, now: Timestamp, at: Timestamp) {
        let d = Duration::try_from(at.duration_since(now)).unwrap_or(Duration::ZERO);
        self.requeue_after = Some(self.requeue_after.map_or(d, |r| r.min(d)));
    }
}

/// A failed image pull that holds a container back until `until`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullBackoff {
    /// End of the back-off.
    pub until: Timestamp,
    /// The image.
    pub image: String,
}

/// Whether record `x` was made from `c`'s definition (or before the hash
/// was kept, when it is taken to be).
fn same_definition(x: &RuntimeContainer, c: &Container) -> bool {
    x.hash.is_empty() || hash_matches(&x.hash, c)
}

/// Whether the back-off of exited record `x` expired, as the kubelet's
/// `flowcontrol.Backoff` lets an entry expire: more than twice the curve's
/// maximum ([`CrashBackoff::expiry`]) from the crash before (`older`'s
/// finish; without it, `x`'s creation, which is later) to `x`'s.
fn backoff_expired(
    x: &RuntimeContainer,
    older: Option<&RuntimeContainer>,
    backoff: &CrashBackoff,
) -> bool {
    let Some(finished) = x.finished_at else {
        return false;
    };
    let since = older.and_then(|o| o.finished_at).unwrap_or(x.created_at);
    finished.duration_since(since)
        > SignedDuration::try_from(backoff.expiry()).unwrap_or(SignedDuration::MAX)
}

/// Restarts of exited record `x`'s back-off series so far: what
/// [`CrashBackoff::delay`] takes for its restart. As the kubelet keeps one
/// back-off per container definition (`GetStableKey`: pod, container name
/// and spec hash), a record of another definition than `c`'s starts a new
/// series (its restart is at once), and so does one whose back-off expired
/// ([`backoff_expired`]).
#[must_use]
pub fn backoff_series(
    c: &Container,
    x: &RuntimeContainer,
    older: Option<&RuntimeContainer>,
    backoff: &CrashBackoff,
) -> u32 {
    if !same_definition(x, c) || backoff_expired(x, older, backoff) {
        0
    } else {
        x.attempt.saturating_sub(x.backoff_since)
    }
}

/// The attempt from which a container of `c` started as `attempt` counts its
/// CrashLoopBackOff, given the record it replaces (`previous`, and `older`
/// before it): the previous one's when the series goes on; the previous
/// one's attempt when a series begins with this restart (another
/// definition, or an expired back-off: as the kubelet's, that restart is at
/// once and the next waits 10 s); `attempt` itself for a container's first.
#[must_use]
pub fn backoff_since(
    c: &Container,
    previous: Option<&RuntimeContainer>,
    older: Option<&RuntimeContainer>,
    attempt: u32,
    backoff: &CrashBackoff,
) -> u32 {
    match previous {
        None => attempt,
        Some(p) if !same_definition(p, c) || backoff_expired(p, older, backoff) => {
            p.attempt.min(attempt)
        }
        Some(p) => p.backoff_since.min(attempt),
    }
}

/// Reason of a pod failed for its active deadline (the kubelet's active_deadline.go).
pub const DEADLINE_REASON: &str = crate::reasons::pod::DEADLINE_EXCEEDED;
/// Message of a pod failed for its active deadline.
pub const DEADLINE_MESSAGE: &str = "Pod was active on the node longer than the specified deadline";

/// Where a pod stands against `spec.activeDeadlineSeconds`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deadline {
    /// No deadline, or no `status.startTime` yet to count from.
    None,
    /// The pod has been active for at least its deadline.
    Exceeded,
    /// The deadline ends after this long.
    In(Duration),
}

/// The pod's active deadline at `now`, counted from `status.startTime` (the
/// kubelet's `pastActiveDeadline`: exceeded once `now - startTime >=
/// activeDeadlineSeconds`). A deadline of 0 or less is exceeded at once, as
/// there; one past the last time a timestamp holds (`activeDeadlineSeconds`
/// near `i64::MAX`, which only API validation keeps out) is never reached,
/// where the kubelet's `Duration(seconds) * time.Second` wraps.
#[must_use]
pub fn active_deadline(pod: &Pod, now: Timestamp) -> Deadline {
    let Some(secs) = pod.spec.as_ref().and_then(|s| s.active_deadline_seconds) else {
        return Deadline::None;
    };
    let Some(start) = pod.status.as_ref().and_then(|s| s.start_time.as_ref()) else {
        return Deadline::None;
    };
    let Ok(end) = start.0.checked_add(SignedDuration::from_secs(secs.max(0))) else {
        return Deadline::None;
    };
    if now >= end {
        Deadline::Exceeded
    } else {
        Deadline::In(Duration::try_from(end.duration_since(now)).unwrap_or(Duration::ZERO))
    }
}

/// True when the pod's API status shows a container running (its terminated
/// state not reported yet).
#[must_use]
pub fn reports_running(pod: &Pod) -> bool {
    pod.status.iter().any(|s| {
        s.container_statuses
            .iter()
            .chain(s.init_container_statuses.iter())
            .chain(s.ephemeral_container_statuses.iter())
            .flatten()
            .any(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
    })
}

/// Kills the running containers: main and ephemeral containers first, then
/// init containers (sidecars) in reverse order, as the kubelet stops sidecars
/// after the main containers. Returns true when any runs.
fn kill_running(pod: &Pod, rt: &PodRuntime, grace: i64, reason: &str, plan: &mut Plan) -> bool {
    let order = main_containers(pod)
        .iter()
        .map(|c| c.name.as_str())
        .chain(ephemeral_names(pod))
        .chain(init_containers(pod).iter().rev().map(|c| c.name.as_str()));
    let mut killed = false;
    for name in order {
        for c in rt
            .containers
            .iter()
            .filter(|c| c.name == name && c.state == ContainerState::Running)
        {
            plan.steps.push(Step::KillContainer {
                id: c.id.clone(),
                name: c.name.clone(),
                grace_seconds: grace,
                reason: if reason.is_empty() {
                    format!("Stopping container {}", c.name)
                } else {
                    reason.to_string()
                },
            });
            killed = true;
        }
    }
    // Containers the spec no longer names.
    for c in rt.containers.iter().filter(|c| {
        c.state == ContainerState::Running
            && !main_containers(pod)
                .iter()
                .chain(init_containers(pod))
                .any(|s| s.name == c.name)
            && !ephemeral_names(pod).any(|e| e == c.name)
    }) {
        plan.steps.push(Step::KillContainer {
            id: c.id.clone(),
            name: c.name.clone(),
            grace_seconds: grace,
            reason: format!("Stopping container {}", c.name),
        });
        killed = true;
    }
    killed
}

/// Where the pod's init containers stand in the current sandbox, as the
/// kubelet's `computeInitContainerActions` sees them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InitProgress {
    /// Every init container completed (sidecars: started); main containers may run.
    Done,
    /// The named init container is next or still running.
    Pending(String),
    /// The named init container failed and the pod's restart policy is `Never`.
    Failed(String),
}

/// The init containers' progress in the newest sandbox.
#[must_use]
pub fn init_progress(pod: &Pod, rt: &PodRuntime) -> InitProgress {
    let Some(sandbox) = rt.latest_sandbox() else {
        return match init_containers(pod).first() {
            Some(c) => InitProgress::Pending(c.name.clone()),
            None => InitProgress::Done,
        };
    };
    let initialized = initialized_in(pod, rt, &sandbox.id);
    let latest = |c: &Container| {
        rt.containers
            .iter()
            .find(|x| x.name == c.name && x.sandbox_id == sandbox.id)
    };
    // A regular init container that failed for good fails the pod whatever
    // the init containers before it do (a sidecar that exited and is to
    // restart): the kubelet's `getPhase` counts failed initialization over
    // all of them, and `computeInitContainerActions` kills such a pod.
    if !initialized {
        let policy = restart_policy(pod);
        let failed = init_containers(pod)
            .iter()
            .filter(|c| !is_sidecar(c))
            .find_map(|c| {
                latest(c).filter(|x| {
                    x.state == ContainerState::Exited
                        && x.exit_code != 0
                        && !init_container_should_restart(c, policy, x.exit_code)
                })
            });
        if let Some(x) = failed {
            return InitProgress::Failed(x.name.clone());
        }
    }
    for c in init_containers(pod) {
        if initialized && !is_sidecar(c) {
            continue;
        }
        match latest(c) {
            Some(x) if is_sidecar(c) && x.state == ContainerState::Running => {}
            Some(x) if !is_sidecar(c) && x.state == ContainerState::Exited && x.exit_code == 0 => {}
            _ => return InitProgress::Pending(c.name.clone()),
        }
    }
    InitProgress::Done
}

/// Where the run of sandbox `sandbox_id` that restarts all containers in
/// place begins, after the latest exit there of a container under a
/// `RestartAllContainers` rule ([`super::spec::restarts_all`]), as the
/// kubelet's `ShouldAllContainersRestart`: None when there is no such exit;
/// else the creation time of the first record, made after that exit, of the
/// pod's first container in start order (its first init container, else its
/// first main container), None inside while there is none yet. Every record
/// of the sandbox made before it is of the earlier run, even one made after
/// the exit (a container started in the same pass as the one that exited):
/// the running ones are killed, and the rest are as if gone, so the pod
/// starts again from its first container in the same sandbox (its restart
/// counts going on).
#[must_use]
pub fn restart_all_boundary(
    pod: &Pod,
    rt: &PodRuntime,
    sandbox_id: &str,
) -> Option<Option<Timestamp>> {
    let exit = rt
        .containers
        .iter()
        .filter(|x| x.sandbox_id == sandbox_id && x.state == ContainerState::Exited)
        .filter(|x| {
            super::spec::find_container(pod, &x.name)
                .is_some_and(|c| super::spec::restarts_all(c, x.exit_code))
        })
        .map(|x| x.finished_at.unwrap_or(x.created_at))
        .max()?;
    let first = init_containers(pod)
        .first()
        .or_else(|| main_containers(pod).first())?;
    Some(
        rt.containers
            .iter()
            .filter(|x| x.sandbox_id == sandbox_id && x.name == first.name && x.created_at > exit)
            .map(|x| x.created_at)
            .min(),
    )
}

/// Whether record `x` of sandbox `sandbox_id` is of the run before
/// `boundary` ([`restart_all_boundary`]).
#[must_use]
pub fn before_restart_all(
    x: &RuntimeContainer,
    sandbox_id: &str,
    boundary: Option<Timestamp>,
) -> bool {
    x.sandbox_id == sandbox_id && boundary.is_none_or(|b| x.created_at < b)
}

/// `rt` as the pod's current run in its newest sandbox: without the records
/// of the run before a restart of all containers in place
/// ([`restart_all_boundary`]; all of `rt` when there is none).
#[must_use]
pub fn current_run<'a>(pod: &Pod, rt: &'a PodRuntime) -> std::borrow::Cow<'a, PodRuntime> {
    let Some(sandbox) = rt.latest_sandbox() else {
        return std::borrow::Cow::Borrowed(rt);
    };
    let Some(boundary) = restart_all_boundary(pod, rt, &sandbox.id) else {
        return std::borrow::Cow::Borrowed(rt);
    };
    let mut current = rt.clone();
    current
        .containers
        .retain(|x| !before_restart_all(x, &sandbox.id, boundary));
    std::borrow::Cow::Owned(current)
}

/// True once a main container of the pod exists in sandbox `sandbox_id`:
/// the pod was initialized, and its regular init containers are done even
/// when the runtime no longer has them (the kubelet's
/// `HasAnyActiveRegularContainerStarted` in `computeInitContainerActions`).
#[must_use]
pub fn initialized_in(pod: &Pod, rt: &PodRuntime, sandbox_id: &str) -> bool {
    main_containers(pod).iter().any(|c| {
        rt.containers
            .iter()
            .any(|x| x.name == c.name && x.sandbox_id == sandbox_id)
    })
}

/// The API status of ephemeral container `name` shows it terminated.
fn ephemeral_terminated(pod: &Pod, name: &str) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.ephemeral_container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == name))
        .and_then(|c| c.state.as_ref())
        .is_some_and(|st| st.terminated.is_some())
}

/// The ephemeral containers to start: those the runtime has no record of in
/// any sandbox (they run once and are never restarted), each with the CRI ID
/// of its target container's newest record, if it names one and it exists
/// (`computePodActions` and `startSpec.getTargetID`). One the API already
/// shows terminated (its record lost, e.g. with the runtime's state) is not
/// run again: the API server refuses to take it out of `terminated`.
#[must_use]
pub fn ephemeral_to_start(pod: &Pod, rt: &PodRuntime) -> Vec<(String, Option<String>)> {
    pod.spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|ec| rt.latest_two(&ec.name).0.is_none() && !ephemeral_terminated(pod, &ec.name))
        .map(|ec| {
            let target = ec
                .target_container_name
                .as_deref()
                .filter(|t| !t.is_empty())
                .and_then(|t| rt.latest_two(t).0)
                .map(|x| x.id.clone());
            (ec.name.clone(), target)
        })
        .collect()
}

/// True when the pod has run and nothing will restart: every main container
/// exited for good, or an init container failed and will not restart (by
/// [`container_should_restart`]).
#[must_use]
pub fn all_done(pod: &Pod, rt: &PodRuntime) -> bool {
    // Of the current run: containers stopped by a restart of all in place
    // run again.
    let rt = &*current_run(pod, rt);
    if matches!(init_progress(pod, rt), InitProgress::Failed(_)) {
        return true;
    }
    let policy = restart_policy(pod);
    let containers = main_containers(pod);
    !containers.is_empty()
        && containers.iter().all(|c| match rt.latest_two(&c.name).0 {
            Some(x) => {
                x.state == ContainerState::Exited
                    && !container_should_restart(c, policy, x.exit_code)
            }
            None => false,
        })
}

/// How soon a pod whose volumes are not all set up is synced again: the
/// kubelet's first mount retry (`initialDurationBeforeRetry`, 500 ms). The
/// common cause right after binding is the Node authorizer not yet knowing
/// the pod, which lasts milliseconds.
pub const VOLUME_RETRY: Duration = Duration::from_millis(500);

/// What a pod's volumes need before its sync is planned, as the kubelet's
/// volume manager sees the pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeNeed {
    /// The pod is active: its volumes are set up (or refreshed) before it is
    /// planned (`WaitForAttachAndMount` before `SyncPod`).
    Mount,
    /// The pod finished and nothing of it runs: its volumes are torn down.
    Unmount,
    /// Nothing to do: the pod is terminating (its volumes go with it) or a
    /// finished pod still has something running.
    Leave,
}

/// What the volumes of `pod` need at `now`, given its runtime state `rt`.
#[must_use]
pub fn volume_need(pod: &Pod, rt: &PodRuntime, now: Timestamp) -> VolumeNeed {
    if pod.metadata.deletion_timestamp.is_some() {
        return VolumeNeed::Leave;
    }
    let deadline = !is_terminal(pod) && active_deadline(pod, now) == Deadline::Exceeded;
    if deadline || is_terminal(pod) || all_done(pod, rt) {
        if rt.all_stopped() {
            VolumeNeed::Unmount
        } else {
            VolumeNeed::Leave
        }
    } else {
        VolumeNeed::Mount
    }
}

/// Whether the pod's volumes are all set up, an input of [`plan`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Volumes {
    /// Every volume is set up: the sandbox and containers may start.
    Ready,
    /// Some volume is not: nothing starts, and the pod is synced again after
    /// [`VOLUME_RETRY`]; its containers stay `ContainerCreating`.
    NotReady,
}

/// Plans one sync of `pod` against `rt` at `now`. `pull_backoff` holds the image
/// pull back-offs of this pod's containers by name, `probes` what the probe
/// manager says of its running containers (a failed liveness or startup probe
/// kills the container, which then restarts as its restart policy says),
/// `volumes` whether the pod's volumes are set up ([`volume_need`]); with
/// the node's default [`Policy`].
#[must_use]
pub fn plan(
    pod: &Pod,
    rt: &PodRuntime,
    pull_backoff: &BTreeMap<String, PullBackoff>,
    probes: &BTreeMap<String, ContainerProbes>,
    volumes: Volumes,
    now: Timestamp,
) -> Plan {
    let policy = Policy::default();
    plan_with(pod, rt, pull_backoff, probes, volumes, now, &policy)
}

/// What the node's configuration and its eviction manager set for a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Seconds an evicted pod's containers get to stop: the eviction
    /// manager's grace period override, 1 for a hard threshold and at most
    /// `evictionMaxPodGracePeriod` for a soft one.
    pub eviction_grace: i64,
    /// The CrashLoopBackOff curve (`crashLoopBackOff.maxContainerRestartPeriod`).
    pub crash_backoff: CrashBackoff,
    /// `cpuCFSQuotaPeriod` in microseconds: the period of the CPU quotas a
    /// running container's are compared with (a resize).
    pub cpu_period_us: i64,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            eviction_grace: EVICTION_GRACE_SECONDS,
            crash_backoff: CrashBackoff::default(),
            cpu_period_us: super::limits::CPU_PERIOD_US,
        }
    }
}

/// [`plan`] under `policy`.
#[must_use]
pub fn plan_with(
    pod: &Pod,
    rt: &PodRuntime,
    pull_backoff: &BTreeMap<String, PullBackoff>,
    probes: &BTreeMap<String, ContainerProbes>,
    volumes: Volumes,
    now: Timestamp,
    policy: &Policy,
) -> Plan {
    let mut plan = plan_ready(pod, rt, pull_backoff, probes, now, policy);
    if volumes == Volumes::NotReady {
        // Nothing starts before the volumes it mounts exist.
        let starts =
            |s: &Step| matches!(s, Step::CreateSandbox { .. } | Step::StartContainer { .. });
        plan.steps.retain(|s| !starts(s));
        plan.requeue_after = Some(
            plan.requeue_after
                .map_or(VOLUME_RETRY, |r| r.min(VOLUME_RETRY)),
        );
    }
    plan
}

/// The plan of [`plan`] with every volume set up.
fn plan_ready(
    pod: &Pod,
    rt: &PodRuntime,
    pull_backoff: &BTreeMap<String, PullBackoff>,
    probes: &BTreeMap<String, ContainerProbes>,
    now: Timestamp,
    policy: &Policy,
) -> Plan {
    let eviction_grace = policy.eviction_grace;
    let mut plan = Plan::default();
    if pod.metadata.deletion_timestamp.is_some() {
        terminate(pod, rt, &mut plan);
        return plan;
    }
    let deadline = if is_terminal(pod) {
        Deadline::None
    } else {
        active_deadline(pod, now)
    };
    plan.deadline_exceeded = deadline == Deadline::Exceeded;
    if let Deadline::In(d) = deadline {
        plan.requeue_after = Some(d);
    }
    if is_evicted(pod) {
        // Evicted: every container stops at once, as the kubelet's evictPod.
        plan.kill_pod = kill_running(pod, rt, eviction_grace, "pod was evicted", &mut plan);
        for s in rt.sandboxes.iter().filter(|s| s.ready) {
            plan.steps.push(Step::StopSandbox { id: s.id.clone() });
        }
        return plan;
    }
    if plan.deadline_exceeded || is_terminal(pod) || all_done(pod, rt) {
        // A finished pod keeps its exited containers (for status and logs) but not its
        // sandbox; sidecars still running are stopped.
        plan.kill_pod = kill_running(pod, rt, grace_period(pod), "pod has completed", &mut plan);
        for s in rt.sandboxes.iter().filter(|s| s.ready) {
            plan.steps.push(Step::StopSandbox { id: s.id.clone() });
        }
        return plan;
    }
    match rt.latest_sandbox() {
        Some(s) if s.ready => {
            let sandbox_id = s.id.clone();
            // Restarting all containers in place: what still runs of the
            // earlier run stops first, mains then init containers,
            // each in reverse order (the kubelet's `ContainersToReset`).
            if let Some(boundary) = restart_all_boundary(pod, rt, &sandbox_id) {
                let earlier = |c: &Container| {
                    rt.containers.iter().find(|x| {
                        x.name == c.name
                            && before_restart_all(x, &sandbox_id, boundary)
                            && x.state == ContainerState::Running
                    })
                };
                let running = main_containers(pod)
                    .iter()
                    .rev()
                    .chain(init_containers(pod).iter().rev())
                    .filter_map(|c| earlier(c).map(|x| (c, x)));
                for (c, x) in running {
                    plan.steps.push(Step::KillContainer {
                        id: x.id.clone(),
                        name: c.name.clone(),
                        grace_seconds: grace_period(pod),
                        reason: RESTART_ALL_KILL.into(),
                    });
                }
                if !plan.steps.is_empty() {
                    plan.requeue_after = Some(Duration::from_millis(500));
                    return plan;
                }
            }
            let current = current_run(pod, rt);
            let mut planner = Planner {
                pod,
                rt: &current,
                history: rt,
                pull_backoff,
                probes,
                now,
                backoff: policy.crash_backoff,
                cpu_period_us: policy.cpu_period_us,
                plan: &mut plan,
            };
            planner.in_sandbox(&sandbox_id);
            let names = init_containers(pod)
                .iter()
                .chain(main_containers(pod))
                .map(|c| c.name.as_str());
            garbage(rt, &sandbox_id, names, ephemeral_names(pod), &mut plan);
        }
        latest => new_sandbox(pod, rt, latest, (now, &policy.crash_backoff), &mut plan),
    }
    plan
}

/// The CrashLoopBackOff that holds container `c` back at `now`, given its
/// latest record `x` (exited) and the one before it (`older`): the Waiting
/// state it shows and when the back-off ends; None when it may start now
/// (the kubelet's `doBackOff`, with [`backoff_series`] on the node's curve).
fn crash_loop(
    pod: &Pod,
    c: &Container,
    (x, older): (&RuntimeContainer, Option<&RuntimeContainer>),
    now: Timestamp,
    backoff: &CrashBackoff,
) -> Option<(Waiting, Timestamp)> {
    let delay = backoff.delay(backoff_series(c, x, older, backoff));
    let due = x.finished_at.unwrap_or(x.created_at) + delay;
    if due <= now {
        return None;
    }
    let (ns, name, uid) = super::facts::pod_identity(pod);
    let held = Waiting {
        reason: waiting::CRASH_LOOP_BACK_OFF.into(),
        message: format!(
            "back-off {}s restarting failed container={} pod={name}_{ns}({uid})",
            delay.as_secs(),
            c.name
        ),
    };
    Some((held, due))
}

/// Plans a pod without a ready sandbox: kill what still runs, create the
/// next sandbox, then start its first init container or else its main
/// containers (`computePodActions` when the sandbox changed). A pod that must
/// not restart and already ran gets no new sandbox. A container whose last
/// run exited waits out its CrashLoopBackOff in the new sandbox too, as the
/// kubelet's `start` backs off whatever sandbox it starts in.
fn new_sandbox(
    pod: &Pod,
    rt: &PodRuntime,
    latest: Option<&super::runtime::Sandbox>,
    (now, backoff): (Timestamp, &CrashBackoff),
    plan: &mut Plan,
) {
    let policy = restart_policy(pod);
    let ran_before = !rt.containers.is_empty();
    if latest.is_some() && policy == "Never" && ran_before {
        // The kubelet does not recreate the sandbox of a pod that must not restart.
        return;
    }
    kill_running(pod, rt, grace_period(pod), "pod sandbox changed", plan);
    plan.steps.push(Step::CreateSandbox {
        attempt: latest.map_or(0, |s| s.attempt.saturating_add(1)),
        changed: latest.is_some(),
    });
    // A new sandbox runs the init containers again from the first.
    let start = |c: &Container, plan: &mut Plan| {
        let (previous, older) = rt.latest_two(&c.name);
        if let Some(x) = previous.filter(|x| x.state == ContainerState::Exited)
            && let Some((held, due)) = crash_loop(pod, c, (x, older), now, backoff)
        {
            plan.waiting.insert(c.name.clone(), held);
            plan.held_until.insert(c.name.clone(), due);
            plan.requeue_at(now, due);
            return;
        }
        let attempt = previous.map_or(0, |p| p.attempt.saturating_add(1));
        plan.steps.push(Step::StartContainer {
            name: c.name.clone(),
            attempt,
            backoff_since: backoff_since(c, previous, older, attempt, backoff),
        });
    };
    if let Some(first) = init_containers(pod).first() {
        start(first, plan);
        return;
    }
    for c in main_containers(pod) {
        let succeeded = rt
            .latest_two(&c.name)
            .0
            .is_some_and(|x| x.state == ContainerState::Exited && x.exit_code == 0);
        // A container that restarts only on failure and succeeded is
        // not run again; its own restartPolicy overrides the pod's,
        // and its restartPolicyRules play no part here
        // (`computePodActions` on a new sandbox).
        let run_once = c.restart_policy.as_deref().unwrap_or(policy) == "OnFailure";
        if run_once && succeeded {
            continue;
        }
        start(c, plan);
    }
}

/// The grace period for killing a container whose `kind` probe failed: the
/// probe's own `terminationGracePeriodSeconds`, else the pod's.
fn probe_grace(pod: &Pod, c: &Container, kind: ProbeKind) -> i64 {
    let probe = match kind {
        ProbeKind::Startup => c.startup_probe.as_ref(),
        ProbeKind::Liveness => c.liveness_probe.as_ref(),
        ProbeKind::Readiness => None,
    };
    probe
        .and_then(|p| p.termination_grace_period_seconds)
        .unwrap_or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30)
        })
        .max(0)
}

/// The Killing event's message of a container stopped because its pod
/// restarts all containers (the kubelet's).
pub const RESTART_ALL_KILL: &str = "killing";

/// Plans one container in a ready sandbox.
struct Planner<'a> {
    pod: &'a Pod,
    /// The pod's current run ([`current_run`]).
    rt: &'a PodRuntime,
    /// Every record, for the attempt numbers of new containers.
    history: &'a PodRuntime,
    pull_backoff: &'a BTreeMap<String, PullBackoff>,
    probes: &'a BTreeMap<String, ContainerProbes>,
    now: Timestamp,
    /// The node's CrashLoopBackOff curve.
    backoff: CrashBackoff,
    /// The node's CFS period, microseconds.
    cpu_period_us: i64,
    plan: &'a mut Plan,
}

impl Planner<'_> {
    /// Plans the containers of a pod whose sandbox `sandbox_id` is ready:
    /// ephemeral containers not run yet, then the init containers in order
    /// (a sidecar must have started, a regular one exited 0, before the next),
    /// then, once initialized, the main containers.
    fn in_sandbox(&mut self, sandbox_id: &str) {
        let (pod, rt) = (self.pod, self.rt);
        // Ephemeral containers start even before initialization completes.
        for (name, target_id) in ephemeral_to_start(pod, rt) {
            self.ephemeral(name, target_id);
        }
        let initialized = initialized_in(pod, rt, sandbox_id);
        for c in init_containers(pod) {
            if initialized && !is_sidecar(c) {
                // Initialized: a regular init container never runs again,
                // even when the runtime has lost it.
                continue;
            }
            let latest = rt
                .containers
                .iter()
                .find(|x| x.name == c.name && x.sandbox_id == sandbox_id);
            if is_sidecar(c) {
                self.container(c, latest, sandbox_id);
                // The next containers wait until the sidecar has started
                // (its startup probe, if any, passed).
                let started = latest.is_some_and(|x| {
                    x.state == ContainerState::Running
                        && self.probes.get(&c.name).is_none_or(|p| p.started)
                });
                if !started {
                    return;
                }
            } else if !latest.is_some_and(|x| x.state == ContainerState::Exited && x.exit_code == 0)
            {
                // Run (or restart) this one; the rest wait for it, one at a time.
                self.container(c, latest, sandbox_id);
                return;
            }
        }
        for c in main_containers(pod) {
            let latest = rt.latest_two(&c.name).0;
            self.container(c, latest, sandbox_id);
        }
    }

    /// Plans ephemeral container `name` that never ran: start it once, unless
    /// its image pull is backing off.
    fn ephemeral(&mut self, name: String, target_id: Option<String>) {
        if self.pull_backoff_holds(&name) {
            return;
        }
        self.plan
            .steps
            .push(Step::StartEphemeralContainer { name, target_id });
    }

    /// True (and the container waits with `ImagePullBackOff`) while the image
    /// pull back-off of container `name` lasts.
    fn pull_backoff_holds(&mut self, name: &str) -> bool {
        let now = self.now;
        let Some(b) = self.pull_backoff.get(name).filter(|b| b.until > now) else {
            return false;
        };
        self.plan.waiting.insert(
            name.to_string(),
            Waiting {
                reason: waiting::IMAGE_PULL_BACK_OFF.into(),
                message: format!("Back-off pulling image \"{}\"", b.image),
            },
        );
        self.plan.requeue_at(now, b.until);
        true
    }

    /// Decides for container `c` whose newest record is `latest`: keep it,
    /// replace it, restart it after its CrashLoopBackOff, or start it. Whether
    /// it restarts is [`container_should_restart`] under the pod's policy (a
    /// sidecar's own `restartPolicy: Always` makes it always restart).
    fn container(&mut self, c: &Container, latest: Option<&RuntimeContainer>, sandbox_id: &str) {
        let (pod, now) = (self.pod, self.now);
        let policy = restart_policy(pod);
        let start = match latest {
            None => true,
            Some(x) if x.state == ContainerState::Running => {
                let changed = !x.hash.is_empty() && !hash_matches(&x.hash, c);
                let unhealthy = self.probes.get(&c.name).and_then(|p| p.failed);
                if let Some(kind) = unhealthy {
                    self.plan.steps.push(Step::KillContainer {
                        id: x.id.clone(),
                        name: c.name.clone(),
                        grace_seconds: probe_grace(pod, c, kind),
                        reason: format!(
                            "Container {} failed {} probe, will be restarted",
                            c.name,
                            kind.name().to_lowercase()
                        ),
                    });
                    restarts_after_kill(c, policy)
                } else if changed || x.sandbox_id != sandbox_id {
                    self.plan.steps.push(Step::KillContainer {
                        id: x.id.clone(),
                        name: c.name.clone(),
                        grace_seconds: grace_period(pod),
                        reason: format!(
                            "Container {} definition changed, will be restarted",
                            c.name
                        ),
                    });
                    true
                } else if let Some(restart) = resize(pod, c, x, self.cpu_period_us) {
                    if restart {
                        self.plan.steps.push(Step::KillContainer {
                            id: x.id.clone(),
                            name: c.name.clone(),
                            grace_seconds: grace_period(pod),
                            reason: format!("Container {} resize requires restart", c.name),
                        });
                    } else {
                        self.plan.steps.push(Step::ResizeContainer {
                            id: x.id.clone(),
                            name: c.name.clone(),
                        });
                    }
                    restart
                } else {
                    false
                }
            }
            Some(x) if x.state == ContainerState::Created => {
                self.plan
                    .steps
                    .push(Step::RemoveContainer { id: x.id.clone() });
                true
            }
            Some(x) => {
                if x.sandbox_id != sandbox_id || container_should_restart(c, policy, x.exit_code) {
                    let older = self.history.latest_two(&c.name).1;
                    let backoff = &self.backoff;
                    if let Some((held, due)) = crash_loop(pod, c, (x, older), now, backoff) {
                        self.plan.waiting.insert(c.name.clone(), held);
                        self.plan.held_until.insert(c.name.clone(), due);
                        self.plan.requeue_at(now, due);
                        false
                    } else {
                        true
                    }
                } else {
                    false
                }
            }
        };
        if !start || self.pull_backoff_holds(&c.name) {
            return;
        }
        let (previous, older) = self.history.latest_two(&c.name);
        let attempt = previous.map_or(0, |x| x.attempt.saturating_add(1));
        self.plan.steps.push(Step::StartContainer {
            name: c.name.clone(),
            attempt,
            backoff_since: backoff_since(c, previous, older, attempt, &self.backoff),
        });
    }
}

/// Container garbage collection within a sync: keep the newest two records of
/// each container (current and `lastState`); drop older sandboxes once every
/// container has a record in the current one, except sandboxes that hold the
/// record of an ephemeral container (`kept`), which is never run again and
/// keeps its status from it (the kubelet evicts only sandboxes without
/// containers).
fn garbage<'a>(
    rt: &PodRuntime,
    sandbox_id: &str,
    names: impl Iterator<Item = &'a str>,
    kept: impl Iterator<Item = &'a str>,
    plan: &mut Plan,
) {
    let kept: Vec<&str> = kept.collect();
    let holds_kept = |s: &str| {
        rt.containers
            .iter()
            .any(|c| c.sandbox_id == s && kept.contains(&c.name.as_str()))
    };
    let mut all_current = true;
    for name in names {
        let mut records = rt.containers.iter().filter(|c| c.name == name);
        all_current &= records.next().is_some_and(|c| c.sandbox_id == sandbox_id);
        for old in records
            .skip(1)
            .filter(|c| c.state == ContainerState::Exited)
        {
            plan.steps
                .push(Step::RemoveContainer { id: old.id.clone() });
        }
    }
    if all_current {
        for s in rt
            .sandboxes
            .iter()
            .filter(|s| s.id != sandbox_id && !s.ready && !holds_kept(&s.id))
        {
            plan.steps.push(Step::RemoveSandbox { id: s.id.clone() });
        }
    }
}

/// Whether running container `x` must be resized to spec `c`'s (allocated)
/// resources, as the kubelet's `computePodResizeAction`: None when the
/// runtime enforces them already (or reports nothing to compare); else true
/// when a changed cpu or memory limit (or cpu request) has `resizePolicy`
/// `RestartContainer`, so the container restarts with them, false when it
/// is updated in place.
fn resize(pod: &Pod, c: &Container, x: &RuntimeContainer, period_us: i64) -> Option<bool> {
    let actual = x.resources?;
    let desired = super::translate::cgroup_limits(pod, c, period_us);
    let restarts = |resource: &str| {
        c.resize_policy
            .iter()
            .flatten()
            .any(|p| p.resource_name == resource && p.restart_policy == "RestartContainer")
    };
    // A memory request change sets no cgroup v1 limit: it restarts the
    // container under RestartContainer, and is otherwise only allocated.
    let request_changed = x.memory_request.is_some()
        && x.memory_request != super::translate::memory_request(c)
        && restarts("memory");
    if desired.enforced_by(&actual) {
        return request_changed.then_some(true);
    }
    let cpu_changed = desired.cpu_shares != actual.cpu_shares
        || desired.cpu_quota.max(0) != actual.cpu_quota.max(0);
    let memory_changed = !CgroupLimits {
        memory_limit_in_bytes: desired.memory_limit_in_bytes,
        ..actual
    }
    .enforced_by(&actual);
    Some(
        (cpu_changed && restarts("cpu"))
            || (memory_changed && restarts("memory"))
            || request_changed,
    )
}

/// The terminating path: kill what runs (grace period), stop sandboxes, remove
/// everything, then delete the Pod object.
fn terminate(pod: &Pod, rt: &PodRuntime, plan: &mut Plan) {
    let stop_sandboxes = |plan: &mut Plan| {
        for s in rt.sandboxes.iter().filter(|s| s.ready) {
            plan.steps.push(Step::StopSandbox { id: s.id.clone() });
        }
    };
    if kill_running(pod, rt, grace_period(pod), "", plan) {
        plan.kill_pod = true;
        stop_sandboxes(plan);
        return;
    }
    if reports_running(pod) && !rt.containers.is_empty() {
        // The containers' terminated states are reported before the pod goes
        // (the status manager's terminal status, then the deletion).
        stop_sandboxes(plan);
        plan.requeue_after = Some(Duration::from_secs(1));
        return;
    }
    for s in &rt.sandboxes {
        plan.steps.push(Step::StopSandbox { id: s.id.clone() });
    }
    for c in &rt.containers {
        plan.steps.push(Step::RemoveContainer { id: c.id.clone() });
    }
    for s in &rt.sandboxes {
        plan.steps.push(Step::RemoveSandbox { id: s.id.clone() });
    }
    plan.steps.push(Step::DeletePod);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{ctr, exited, pod, runtime, sandbox, t};
    use crate::pod_core::backoff::MAX_BACKOFF;
    use ContainerState::{Created, Running};

    fn start(name: &str, attempt: u32) -> Step {
        Step::StartContainer {
            name: name.into(),
            attempt,
            backoff_since: 0,
        }
    }

    #[test]
    fn table() {
        let none = BTreeMap::new();
        let p = pod("web")
            .container("a", "busybox")
            .container("b", "busybox")
            .build();
        let never = pod("job")
            .container("a", "busybox")
            .restart_policy("Never")
            .build();
        let on_failure = pod("job")
            .container("a", "busybox")
            .restart_policy("OnFailure")
            .build();
        let s0 = sandbox("s0", 0, true);
        let dead0 = sandbox("s0", 0, false);
        let cases: Vec<(&str, &Pod, crate::pod_core::runtime::PodRuntime, Vec<Step>)> = vec![
            (
                "new pod: sandbox then every container",
                &p,
                runtime(vec![], vec![]),
                vec![
                    Step::CreateSandbox {
                        attempt: 0,
                        changed: false,
                    },
                    start("a", 0),
                    start("b", 0),
                ],
            ),
            (
                "all running: nothing to do",
                &p,
                runtime(
                    vec![s0.clone()],
                    vec![
                        ctr("c1", "a", 0, "s0", Running),
                        ctr("c2", "b", 0, "s0", Running),
                    ],
                ),
                vec![],
            ),
            (
                "one missing: start only it",
                &p,
                runtime(vec![s0.clone()], vec![ctr("c1", "a", 0, "s0", Running)]),
                vec![start("b", 0)],
            ),
            (
                "exited under Always, first restart is immediate",
                &p,
                runtime(
                    vec![s0.clone()],
                    vec![
                        exited(ctr("c1", "a", 0, "s0", Running), 1, t(50)),
                        ctr("c2", "b", 0, "s0", Running),
                    ],
                ),
                vec![start("a", 1)],
            ),
            (
                "exited under Never: nothing",
                &never,
                runtime(
                    vec![s0.clone()],
                    vec![exited(ctr("c1", "a", 0, "s0", Running), 3, t(50))],
                ),
                vec![Step::StopSandbox { id: "s0".into() }],
            ),
            (
                "exited 0 under OnFailure: pod done, sandbox stopped",
                &on_failure,
                runtime(
                    vec![s0.clone()],
                    vec![exited(ctr("c1", "a", 0, "s0", Running), 0, t(50))],
                ),
                vec![Step::StopSandbox { id: "s0".into() }],
            ),
            (
                "dead sandbox: kill, recreate with next attempt, restart counts continue",
                &p,
                runtime(
                    vec![dead0.clone()],
                    vec![
                        ctr("c1", "a", 0, "s0", Running),
                        exited(ctr("c2", "b", 2, "s0", Running), 0, t(60)),
                    ],
                ),
                vec![
                    Step::KillContainer {
                        id: "c1".into(),
                        name: "a".into(),
                        grace_seconds: 30,
                        reason: "pod sandbox changed".into(),
                    },
                    Step::CreateSandbox {
                        attempt: 1,
                        changed: true,
                    },
                    start("a", 1),
                    start("b", 3),
                ],
            ),
            (
                "dead sandbox under Never after a run: leave it",
                &never,
                runtime(
                    vec![dead0.clone()],
                    vec![exited(ctr("c1", "a", 0, "s0", Running), 137, t(60))],
                ),
                vec![],
            ),
            (
                "created but never started: replace it",
                &never,
                runtime(vec![s0.clone()], vec![ctr("c1", "a", 0, "s0", Created)]),
                vec![Step::RemoveContainer { id: "c1".into() }, start("a", 1)],
            ),
        ];
        for (name, pod, rt, want) in cases {
            assert_eq!(
                plan(pod, &rt, &none, &BTreeMap::new(), Volumes::Ready, t(100)).steps,
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn init_containers_run_one_at_a_time_then_mains() {
        let none = BTreeMap::new();
        let p = pod("web")
            .init_container("i1", "busybox")
            .init_container("i2", "busybox")
            .container("a", "busybox")
            .build();
        let never = pod("job")
            .init_container("i1", "busybox")
            .container("a", "busybox")
            .restart_policy("Never")
            .build();
        let s0 = || vec![sandbox("s0", 0, true)];
        let cases: Vec<(&str, &Pod, crate::pod_core::runtime::PodRuntime, Vec<Step>)> = vec![
            (
                "new pod: sandbox and the first init container only",
                &p,
                runtime(vec![], vec![]),
                vec![
                    Step::CreateSandbox {
                        attempt: 0,
                        changed: false,
                    },
                    start("i1", 0),
                ],
            ),
            (
                "first running: wait",
                &p,
                runtime(s0(), vec![ctr("x1", "i1", 0, "s0", Running)]),
                vec![],
            ),
            (
                "first done: the second",
                &p,
                runtime(
                    s0(),
                    vec![exited(ctr("x1", "i1", 0, "s0", Running), 0, t(20))],
                ),
                vec![start("i2", 0)],
            ),
            (
                "all done: main containers",
                &p,
                runtime(
                    s0(),
                    vec![
                        exited(ctr("x1", "i1", 0, "s0", Running), 0, t(20)),
                        exited(ctr("x2", "i2", 0, "s0", Running), 0, t(30)),
                    ],
                ),
                vec![start("a", 0)],
            ),
            (
                "failed init under Always: restarted (first restart immediate)",
                &p,
                runtime(
                    s0(),
                    vec![exited(ctr("x1", "i1", 0, "s0", Running), 1, t(20))],
                ),
                vec![start("i1", 1)],
            ),
            (
                "failed init under Never: pod done, sandbox stopped",
                &never,
                runtime(
                    s0(),
                    vec![exited(ctr("x1", "i1", 0, "s0", Running), 1, t(20))],
                ),
                vec![Step::StopSandbox { id: "s0".into() }],
            ),
        ];
        for (name, pod, rt, want) in cases {
            assert_eq!(
                plan(pod, &rt, &none, &BTreeMap::new(), Volumes::Ready, t(100)).steps,
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn only_a_new_image_replaces_a_running_container_and_older_hashes_are_adopted() {
        use crate::pod_core::translate::container_hash;
        let none = BTreeMap::new();
        let p = pod("web").container("a", "busybox:1").build();
        let spec = p.spec.as_ref().unwrap().containers[0].clone();
        let with_hash = |hash: String| {
            let mut c = ctr("a1", "a", 0, "s0", Running);
            c.hash = hash;
            runtime(vec![sandbox("s0", 0, true)], vec![c])
        };
        let steps = |hash: String| {
            plan(
                &p,
                &with_hash(hash),
                &none,
                &BTreeMap::new(),
                Volumes::Ready,
                t(100),
            )
            .steps
        };
        assert_eq!(
            steps(container_hash(&spec)),
            vec![],
            "the same spec runs on"
        );
        // Other resources: the same hash (they are resized in place).
        let mut resized = spec.clone();
        resized.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "cpu".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("2".into()),
            )])),
            ..Default::default()
        });
        assert_eq!(container_hash(&resized), container_hash(&spec));
        // An earlier version's hash of this very spec: adopted.
        let legacy = {
            use sha2::Digest as _;
            let d = sha2::Sha256::digest(serde_json::to_vec(&spec).unwrap());
            d.iter()
                .take(8)
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        assert_eq!(steps(legacy), vec![], "adopted after an upgrade");
        // A new image: replaced.
        let mut newer = spec.clone();
        newer.image = Some("busybox:2".into());
        let replaced = steps(container_hash(&newer));
        assert!(
            matches!(&replaced[..], [Step::KillContainer { reason, .. }, ..] if reason.contains("definition changed")),
            "{replaced:?}"
        );
        // An earlier version's hash of another spec: replaced too.
        assert!(matches!(
            &steps("0123456789abcdef".into())[..],
            [Step::KillContainer { .. }, ..]
        ));
    }

    #[test]
    fn sidecars_start_in_order_and_keep_running() {
        let none = BTreeMap::new();
        let p = pod("web")
            .sidecar("proxy", "busybox")
            .init_container("i1", "busybox")
            .container("a", "busybox")
            .build();
        let s0 = || vec![sandbox("s0", 0, true)];
        let rt = runtime(s0(), vec![ctr("p1", "proxy", 0, "s0", Running)]);
        assert_eq!(
            plan(&p, &rt, &none, &BTreeMap::new(), Volumes::Ready, t(100)).steps,
            vec![start("i1", 0)],
            "started sidecar gates the next"
        );
        let rt = runtime(
            s0(),
            vec![
                exited(ctr("p1", "proxy", 0, "s0", Running), 0, t(50)),
                exited(ctr("x1", "i1", 0, "s0", Running), 0, t(20)),
                ctr("a1", "a", 0, "s0", Running),
            ],
        );
        assert_eq!(
            plan(&p, &rt, &none, &BTreeMap::new(), Volumes::Ready, t(100)).steps,
            vec![start("proxy", 1)],
            "an exited sidecar restarts"
        );
        let done = runtime(
            s0(),
            vec![
                ctr("p1", "proxy", 0, "s0", Running),
                exited(ctr("x1", "i1", 0, "s0", Running), 0, t(20)),
                exited(ctr("a1", "a", 0, "s0", Running), 0, t(60)),
            ],
        );
        let never = pod("job")
            .sidecar("proxy", "busybox")
            .init_container("i1", "busybox")
            .container("a", "busybox")
            .restart_policy("Never")
            .build();
        assert_eq!(
            plan(
                &never,
                &done,
                &none,
                &BTreeMap::new(),
                Volumes::Ready,
                t(100)
            )
            .steps,
            vec![
                Step::KillContainer {
                    id: "p1".into(),
                    name: "proxy".into(),
                    grace_seconds: 30,
                    reason: "pod has completed".into()
                },
                Step::StopSandbox { id: "s0".into() }
            ],
            "sidecars stop after the main containers"
        );
    }

    #[test]
    fn failed_liveness_kills_and_restarts_by_policy() {
        let p = pod("web").container("a", "busybox").build();
        let never = pod("job")
            .container("a", "busybox")
            .restart_policy("Never")
            .build();
        let rt = runtime(
            vec![sandbox("s0", 0, true)],
            vec![ctr("c1", "a", 0, "s0", Running)],
        );
        let unhealthy = BTreeMap::from([(
            "a".to_string(),
            ContainerProbes {
                ready: false,
                started: true,
                failed: Some(ProbeKind::Liveness),
            },
        )]);
        let kill = Step::KillContainer {
            id: "c1".into(),
            name: "a".into(),
            grace_seconds: 30,
            reason: "Container a failed liveness probe, will be restarted".into(),
        };
        let none = BTreeMap::new();
        assert_eq!(
            plan(&p, &rt, &none, &unhealthy, Volumes::Ready, t(100)).steps,
            vec![kill.clone(), start("a", 1)]
        );
        assert_eq!(
            plan(&never, &rt, &none, &unhealthy, Volumes::Ready, t(100)).steps,
            vec![kill]
        );
    }

    #[test]
    fn crash_loop_waits_for_its_deadline() {
        let p = pod("web").container("a", "busybox").build();
        let rt = runtime(
            vec![sandbox("s0", 0, true)],
            vec![
                exited(ctr("c3", "a", 3, "s0", Running), 1, t(100)),
                exited(ctr("c2", "a", 2, "s0", Running), 1, t(80)),
                exited(ctr("c1", "a", 1, "s0", Running), 1, t(60)),
            ],
        );
        // Third restart: 40 s after the exit at t=100.
        let early = plan(
            &p,
            &rt,
            &BTreeMap::new(),
            &BTreeMap::new(),
            Volumes::Ready,
            t(110),
        );
        assert_eq!(early.waiting["a"].reason, "CrashLoopBackOff");
        assert!(
            early.waiting["a"]
                .message
                .starts_with("back-off 40s restarting failed container=a")
        );
        assert_eq!(early.requeue_after, Some(Duration::from_secs(30)));
        assert_eq!(early.steps, vec![Step::RemoveContainer { id: "c1".into() }]);
        let due = plan(
            &p,
            &rt,
            &BTreeMap::new(),
            &BTreeMap::new(),
            Volumes::Ready,
            t(140),
        );
        assert_eq!(due.steps[0], start("a", 4));
        assert!(due.waiting.is_empty());
    }

    /// A container in CrashLoopBackOff waits it out in a new sandbox too
    /// (the kubelet's `start` backs off whatever sandbox it starts in).
    #[test]
    fn a_new_sandbox_does_not_cut_a_crash_loop_short() {
        let p = pod("web").container("a", "busybox").build();
        let rt = runtime(
            vec![sandbox("s0", 0, false)],
            vec![
                exited(ctr("c3", "a", 3, "s0", Running), 1, t(100)),
                exited(ctr("c2", "a", 2, "s0", Running), 1, t(80)),
            ],
        );
        let (pulls, probes) = (BTreeMap::new(), BTreeMap::new());
        let new = Step::CreateSandbox {
            attempt: 1,
            changed: true,
        };
        let early = plan(&p, &rt, &pulls, &probes, Volumes::Ready, t(110));
        assert_eq!(early.steps, vec![new.clone()]);
        assert_eq!(early.waiting["a"].reason, "CrashLoopBackOff");
        assert!(
            early.waiting["a"]
                .message
                .starts_with("back-off 40s restarting failed container=a"),
            "{}",
            early.waiting["a"].message
        );
        assert_eq!(early.requeue_after, Some(Duration::from_secs(30)));
        let due = plan(&p, &rt, &pulls, &probes, Volumes::Ready, t(140));
        assert_eq!(due.steps, vec![new, start("a", 4)]);
        assert!(due.waiting.is_empty());
    }

    /// One back-off per container definition, as the kubelet keys it: a new
    /// image restarts at once, then backs off from 10 s again, however many
    /// restarts the old one had; so does a back-off that expired.
    #[test]
    fn a_changed_definition_starts_its_back_off_anew() {
        let old = pod("web").container("a", "busybox:1").build();
        let new = pod("web").container("a", "busybox:2").build();
        let hash_of = |p: &Pod| {
            super::super::translate::container_hash(&super::super::spec::main_containers(p)[0])
        };
        let made = |id: &str, attempt, since, p: &Pod, at| {
            let mut c = exited(ctr(id, "a", attempt, "s0", Running), 1, t(at));
            c.hash = hash_of(p);
            c.backoff_since = since;
            c.created_at = t(at - 5);
            c
        };
        let go = |p: &Pod, containers: Vec<RuntimeContainer>, now| {
            let rt = runtime(vec![sandbox("s0", 0, true)], containers);
            plan(
                p,
                &rt,
                &BTreeMap::new(),
                &BTreeMap::new(),
                Volumes::Ready,
                t(now),
            )
        };
        let started = |name: &str, attempt, backoff_since| Step::StartContainer {
            name: name.into(),
            attempt,
            backoff_since,
        };
        let waits = |p: &Plan| p.waiting.get("a").map(|w| w.message.clone());
        // `p` holds the container back `secs`, or starts it as `step`.
        let held = |p: &Plan, secs: u64| {
            let message = waits(p).unwrap_or_default();
            assert!(
                message.starts_with(&format!("back-off {secs}s")),
                "{:?}",
                p.waiting
            );
        };
        let starts = |p: &Plan, step: Step| {
            assert_eq!(waits(p), None);
            assert!(p.steps.contains(&step), "{:?}", p.steps);
        };
        // Eight restarts of the old image: five minutes.
        let old7 = || made("c7", 7, 0, &old, 100);
        held(
            &go(&old, vec![old7(), made("c6", 6, 0, &old, 60)], 110),
            300,
        );
        // The image changed while it waited: at once, the series begun there.
        starts(&go(&new, vec![old7()], 110), started("a", 8, 7));
        // The new image's first failure waits 10 s, its second 20 s.
        held(
            &go(&new, vec![made("c8", 8, 7, &new, 200), old7()], 200),
            10,
        );
        let second = vec![made("c9", 9, 7, &new, 300), made("c8", 8, 7, &new, 200)];
        held(&go(&new, second, 305), 20);
        // More than 10 minutes since the crash before: expired, at once, and
        // the next series counts from here.
        let long = vec![made("c9", 9, 7, &new, 900), made("c8", 8, 7, &new, 200)];
        starts(&go(&new, long, 905), started("a", 10, 9));
        // A container of an earlier agent (no back-off mark) counts from 0.
        let legacy = vec![made("c9", 9, 0, &new, 300), made("c8", 8, 0, &new, 280)];
        held(&go(&new, legacy, 305), 300);
        let c = &super::super::spec::main_containers(&new)[0];
        assert_eq!(backoff_since(c, None, None, 0, &CrashBackoff::default()), 0);
    }

    /// `crashLoopBackOff.maxContainerRestartPeriod`: the node's curve holds a
    /// crashing container at most its maximum, from its first wait on when
    /// the maximum is below 10 s, and forgets a series after twice it.
    #[test]
    fn the_nodes_crash_loop_maximum_caps_the_wait_and_the_series() {
        let p = pod("web").container("a", "busybox:1").build();
        let made = |id: &str, attempt, at| {
            let mut c = exited(ctr(id, "a", attempt, "s0", Running), 1, t(at));
            c.hash = super::super::translate::container_hash(
                &super::super::spec::main_containers(&p)[0],
            );
            c.created_at = t(at - 1);
            c
        };
        let policy = |max| Policy {
            crash_backoff: CrashBackoff::with_max(Duration::from_secs(max)),
            ..Policy::default()
        };
        let go = |containers: Vec<RuntimeContainer>, now, policy: &Policy| {
            let rt = runtime(vec![sandbox("s0", 0, true)], containers);
            let (none, probes) = (BTreeMap::new(), BTreeMap::new());
            plan_with(&p, &rt, &none, &probes, Volumes::Ready, t(now), policy)
        };
        let wait = |p: &Plan| p.waiting.get("a").map(|w| w.message.clone());
        // A fourth crash in a row: 80 s by default, 60 s at a one-minute maximum.
        let crashes = || vec![made("c4", 4, 100), made("c3", 3, 90)];
        let default = go(crashes(), 101, &Policy::default());
        assert!(
            wait(&default).is_some_and(|m| m.starts_with("back-off 80s")),
            "{default:?}"
        );
        let minute = go(crashes(), 101, &policy(60));
        assert!(
            wait(&minute).is_some_and(|m| m.starts_with("back-off 60s")),
            "{minute:?}"
        );
        assert_eq!(minute.requeue_after, Some(Duration::from_secs(59)));
        // A 2 s maximum: 2 s from the first wait on.
        let second = || vec![made("c1", 1, 100), made("c0", 0, 97)];
        let two = go(second(), 101, &policy(2));
        assert!(
            wait(&two).is_some_and(|m| m.starts_with("back-off 2s")),
            "{two:?}"
        );
        assert_eq!(go(second(), 102, &policy(2)).waiting, BTreeMap::new());
        // Crashes 5 s apart are more than twice a 2 s maximum apart: the
        // series expired, and the restart is at once.
        let apart = go(vec![made("c1", 1, 100), made("c0", 0, 94)], 100, &policy(2));
        assert!(apart.waiting.is_empty(), "{apart:?}");
        let apart = go(
            vec![made("c1", 1, 100), made("c0", 0, 94)],
            100,
            &Policy::default(),
        );
        assert!(
            wait(&apart).is_some_and(|m| m.starts_with("back-off 10s")),
            "{apart:?}"
        );
    }

    #[test]
    fn image_pull_backoff_holds_the_container() {
        let p = pod("web").container("a", "nope:1").build();
        let rt = runtime(vec![sandbox("s0", 0, true)], vec![]);
        let backoff = BTreeMap::from([(
            "a".to_string(),
            PullBackoff {
                until: t(120),
                image: "nope:1".into(),
            },
        )]);
        let held = plan(&p, &rt, &backoff, &BTreeMap::new(), Volumes::Ready, t(100));
        assert!(held.steps.is_empty());
        assert_eq!(held.waiting["a"].reason, "ImagePullBackOff");
        assert_eq!(held.requeue_after, Some(Duration::from_secs(20)));
        assert_eq!(
            plan(&p, &rt, &backoff, &BTreeMap::new(), Volumes::Ready, t(121)).steps,
            vec![start("a", 0)]
        );
    }

    fn with_status(mut p: Pod, running: Option<&str>, start: Option<Timestamp>) -> Pod {
        use k8s_openapi::api::core::v1::{
            ContainerState as ApiState, ContainerStateRunning, ContainerStatus, PodStatus,
        };
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        p.status = Some(PodStatus {
            start_time: start.map(Time),
            container_statuses: running.map(|name| {
                vec![ContainerStatus {
                    name: name.into(),
                    state: Some(ApiState {
                        running: Some(ContainerStateRunning::default()),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        });
        p
    }

    #[test]
    fn deletion_kills_reports_then_removes_and_deletes() {
        let p = pod("web")
            .container("a", "busybox")
            .sidecar("side", "busybox")
            .deleted(t(90), 5)
            .build();
        let rt = runtime(
            vec![sandbox("s0", 0, true)],
            vec![
                ctr("c0", "side", 0, "s0", Running),
                ctr("c1", "a", 0, "s0", Running),
            ],
        );
        let kill = |id: &str, name: &str| Step::KillContainer {
            id: id.into(),
            name: name.into(),
            grace_seconds: 5,
            reason: format!("Stopping container {name}"),
        };
        // Main containers are killed before sidecars; nothing is removed yet.
        let steps = plan(
            &p,
            &rt,
            &BTreeMap::new(),
            &BTreeMap::new(),
            Volumes::Ready,
            t(100),
        )
        .steps;
        assert_eq!(
            steps,
            vec![
                kill("c1", "a"),
                kill("c0", "side"),
                Step::StopSandbox { id: "s0".into() }
            ]
        );
        let stopped = runtime(
            vec![sandbox("s0", 0, false)],
            vec![exited(ctr("c1", "a", 0, "s0", Running), 0, t(95))],
        );
        // Until the API shows the container terminated, the pod stays.
        let reported = with_status(p.clone(), Some("a"), Some(t(1)));
        let wait = plan(
            &reported,
            &stopped,
            &BTreeMap::new(),
            &BTreeMap::new(),
            Volumes::Ready,
            t(100),
        );
        assert!(wait.steps.is_empty());
        assert_eq!(wait.requeue_after, Some(Duration::from_secs(1)));
        let done = with_status(p.clone(), None, Some(t(1)));
        assert_eq!(
            plan(
                &done,
                &stopped,
                &BTreeMap::new(),
                &BTreeMap::new(),
                Volumes::Ready,
                t(100)
            )
            .steps,
            vec![
                Step::StopSandbox { id: "s0".into() },
                Step::RemoveContainer { id: "c1".into() },
                Step::RemoveSandbox { id: "s0".into() },
                Step::DeletePod,
            ]
        );
        let gone = plan(
            &p,
            &runtime(vec![], vec![]),
            &BTreeMap::new(),
            &BTreeMap::new(),
            Volumes::Ready,
            t(100),
        )
        .steps;
        assert_eq!(gone, vec![Step::DeletePod]);
    }

    #[test]
    fn attempts_stay_at_the_largest_cri_attempt() {
        // The runtime's attempt is a u32 (the kubelet counts restarts in an
        // int): the next attempt after the last one is the last one again.
        let (backoffs, probes) = (BTreeMap::new(), BTreeMap::new());
        let p = pod("web").container("a", "busybox").build();
        let at = t(1000);
        let last = u32::MAX;
        let dead = runtime(
            vec![sandbox("s0", last, false)],
            vec![exited(ctr("c1", "a", last, "s0", Running), 0, at)],
        );
        // Past its back-off (a new sandbox does not cut it short).
        let steps = plan(
            &p,
            &dead,
            &backoffs,
            &probes,
            Volumes::Ready,
            at + MAX_BACKOFF,
        )
        .steps;
        let new_sandbox = Step::CreateSandbox {
            attempt: last,
            changed: true,
        };
        assert_eq!(steps, vec![new_sandbox, start("a", last)]);
        let crashed = runtime(
            vec![sandbox("s1", 0, true)],
            vec![exited(ctr("c1", "a", last, "s1", Running), 1, at)],
        );
        let later = at + MAX_BACKOFF;
        let steps = plan(&p, &crashed, &backoffs, &probes, Volumes::Ready, later).steps;
        assert_eq!(steps, vec![start("a", last)]);
    }

    #[test]
    fn active_deadline_table() {
        let deadline = |secs: Option<i64>, start: Option<Timestamp>| {
            let mut p = with_status(pod("web").container("a", "busybox").build(), None, start);
            p.spec.as_mut().unwrap().active_deadline_seconds = secs;
            p
        };
        let cases = [
            (deadline(None, Some(t(0))), t(100), Deadline::None),
            (deadline(Some(5), None), t(100), Deadline::None),
            (
                deadline(Some(5), Some(t(0))),
                t(3),
                Deadline::In(Duration::from_secs(2)),
            ),
            (deadline(Some(5), Some(t(0))), t(5), Deadline::Exceeded),
            (deadline(Some(5), Some(t(0))), t(60), Deadline::Exceeded),
            // Extremes: past the end of time, never; 0 or less, at once.
            (deadline(Some(i64::MAX), Some(t(0))), t(100), Deadline::None),
            (
                deadline(Some(i64::MIN), Some(t(0))),
                t(0),
                Deadline::Exceeded,
            ),
            (deadline(Some(-1), Some(t(0))), t(0), Deadline::Exceeded),
            (deadline(Some(0), Some(t(0))), t(0), Deadline::Exceeded),
            (
                deadline(Some(i64::from(i32::MAX)), Some(t(0))),
                t(0),
                Deadline::In(Duration::from_secs(u64::from(i32::MAX.unsigned_abs()))),
            ),
            (
                deadline(Some(1), Some(Timestamp::MAX)),
                Timestamp::MAX,
                Deadline::None,
            ),
        ];
        for (p, now, want) in cases {
            assert_eq!(active_deadline(&p, now), want);
        }
    }

    #[test]
    fn past_the_active_deadline_the_pod_is_killed() {
        let mut p = with_status(
            pod("web").container("a", "busybox").build(),
            Some("a"),
            Some(t(0)),
        );
        p.spec.as_mut().unwrap().active_deadline_seconds = Some(30);
        let rt = runtime(
            vec![sandbox("s0", 0, true)],
            vec![ctr("c1", "a", 0, "s0", Running)],
        );
        let before = plan(
            &p,
            &rt,
            &BTreeMap::new(),
            &BTreeMap::new(),
            Volumes::Ready,
            t(20),
        );
        assert!(!before.deadline_exceeded && before.steps.is_empty());
        assert_eq!(before.requeue_after, Some(Duration::from_secs(10)));
        let after = plan(
            &p,
            &rt,
            &BTreeMap::new(),
            &BTreeMap::new(),
            Volumes::Ready,
            t(30),
        );
        assert!(after.deadline_exceeded);
        assert_eq!(
            after.steps,
            vec![
                Step::KillContainer {
                    id: "c1".into(),
                    name: "a".into(),
                    grace_seconds: 30,
                    reason: "pod has completed".into()
                },
                Step::StopSandbox { id: "s0".into() }
            ]
        );
    }

    #[test]
    fn main_containers_wait_for_the_sidecar_startup_probe() {
        let p = pod("web")
            .sidecar("side", "busybox")
            .container("a", "busybox")
            .build();
        let rt = runtime(
            vec![sandbox("s0", 0, true)],
            vec![ctr("c0", "side", 0, "s0", Running)],
        );
        let probes = |started| {
            BTreeMap::from([(
                "side".to_string(),
                ContainerProbes {
                    ready: started,
                    started,
                    failed: None,
                },
            )])
        };
        assert!(
            plan(
                &p,
                &rt,
                &BTreeMap::new(),
                &probes(false),
                Volumes::Ready,
                t(20)
            )
            .steps
            .is_empty()
        );
        assert_eq!(
            plan(
                &p,
                &rt,
                &BTreeMap::new(),
                &probes(true),
                Volumes::Ready,
                t(20)
            )
            .steps,
            vec![start("a", 0)]
        );
    }

    #[test]
    fn init_containers_restart_only_after_failure_unless_sidecars() {
        let c = |policy: Option<&str>| Container {
            name: "i".into(),
            restart_policy: policy.map(Into::into),
            ..Container::default()
        };
        // (pod policy, container policy, exit code, restarts)
        let cases = [
            ("Always", None, 0, false),
            ("Always", None, 1, true),
            ("OnFailure", None, 1, true),
            ("Never", None, 1, false),
            ("Never", Some("Always"), 0, true),
            ("Never", Some("Always"), 1, true),
        ];
        for (pod_policy, own, code, want) in cases {
            assert_eq!(
                init_container_should_restart(&c(own), pod_policy, code),
                want,
                "{pod_policy} {own:?} {code}"
            );
        }
    }

    #[test]
    fn container_should_restart_table() {
        // (pod policy, container policy and rules, exit code, restarts)
        type Rules<'a> = &'a [(&'a str, &'a str, &'a [i32])];
        type Case<'a> = (&'a str, Option<(&'a str, Rules<'a>)>, i32, bool);
        let cases: &[Case] = &[
            ("Always", None, 0, true),
            ("OnFailure", None, 0, false),
            ("OnFailure", None, 1, true),
            ("Never", None, 1, false),
            ("Never", Some(("Always", &[])), 0, true),
            ("Always", Some(("Never", &[])), 1, false),
            ("Never", Some(("OnFailure", &[])), 1, true),
            ("Never", Some(("OnFailure", &[])), 0, false),
            (
                "Never",
                Some(("Never", &[("Restart", "In", &[42])])),
                42,
                true,
            ),
            (
                "Never",
                Some(("Never", &[("Restart", "In", &[42])])),
                1,
                false,
            ),
            (
                "Always",
                Some(("Never", &[("Restart", "NotIn", &[0])])),
                0,
                false,
            ),
            (
                "Never",
                Some(("Never", &[("Restart", "NotIn", &[0])])),
                3,
                true,
            ),
            (
                "Never",
                Some(("Never", &[("RestartAllContainers", "In", &[7])])),
                7,
                true,
            ),
            // An unknown action falls back to the container's policy.
            ("Never", Some(("Always", &[("Other", "In", &[1])])), 1, true),
            ("Never", Some(("Never", &[("Other", "In", &[1])])), 1, false),
        ];
        for (pod_policy, own, code, want) in cases {
            let mut b = pod("p").container("a", "busybox");
            if let Some((policy, rules)) = own {
                b = b.container_restart(policy, rules);
            }
            let p = b.build();
            let c = &main_containers(&p)[0];
            assert_eq!(
                container_should_restart(c, pod_policy, *code),
                *want,
                "pod {pod_policy}, container {own:?}, exit {code}"
            );
        }
    }

    #[test]
    fn restart_all_containers_stops_the_earlier_run_then_starts_from_the_first_init_container() {
        let none = BTreeMap::new();
        let p = pod("all")
            .restart_policy("Never")
            .init_container("init", "busybox")
            .sidecar("sidecar", "busybox")
            .container("source", "busybox")
            .container_restart("Never", &[("RestartAllContainers", "In", &[42])])
            .container("regular", "busybox")
            .build();
        let s0 = || vec![sandbox("s0", 0, true)];
        let before = |regular: RuntimeContainer, sidecar: RuntimeContainer| {
            runtime(
                s0(),
                vec![
                    exited(ctr("i0", "init", 0, "s0", Running), 0, t(12)),
                    sidecar,
                    exited(ctr("c0", "source", 0, "s0", Running), 42, t(60)),
                    regular,
                ],
            )
        };
        // The source exited 42: what still runs stops, mains first, each
        // group in reverse order.
        let rt = before(
            ctr("r0", "regular", 0, "s0", Running),
            ctr("s0c", "sidecar", 0, "s0", Running),
        );
        let kill = |id: &str, name: &str| Step::KillContainer {
            id: id.into(),
            name: name.into(),
            grace_seconds: 30,
            reason: RESTART_ALL_KILL.into(),
        };
        let first = plan(&p, &rt, &none, &BTreeMap::new(), Volumes::Ready, t(61));
        assert_eq!(first.steps, [kill("r0", "regular"), kill("s0c", "sidecar")]);
        // Stopped: the pod starts again from its first init container, in
        // the same sandbox, with the next attempt.
        let rt = before(
            exited(ctr("r0", "regular", 0, "s0", Running), 137, t(62)),
            exited(ctr("s0c", "sidecar", 0, "s0", Running), 137, t(62)),
        );
        let second = plan(&p, &rt, &none, &BTreeMap::new(), Volumes::Ready, t(63));
        assert_eq!(second.steps, [start("init", 1)]);
        // Then each in turn, as in a first run: the sidecar after init.
        let mut rt = rt;
        let mut again = exited(ctr("i1", "init", 1, "s0", Running), 0, t(70));
        again.created_at = t(64);
        rt.containers.push(again);
        rt.sort();
        let third = plan(&p, &rt, &none, &BTreeMap::new(), Volumes::Ready, t(71));
        assert_eq!(third.steps, [start("sidecar", 1)]);
        // A container started in the same pass as the one that exited (made
        // after the exit) is of the earlier run too: stopped, not kept.
        let mut late = ctr("r0", "regular", 0, "s0", Running);
        late.created_at = t(61);
        let raced = before(late, ctr("s0c", "sidecar", 0, "s0", Running));
        let stopped = plan(&p, &raced, &none, &BTreeMap::new(), Volumes::Ready, t(62));
        assert_eq!(
            stopped.steps,
            [kill("r0", "regular"), kill("s0c", "sidecar")]
        );
        // A sidecar under the rule: the same, from the first init container.
        let mut q = pod("side")
            .restart_policy("Never")
            .init_container("init", "busybox")
            .sidecar("sidecar", "busybox")
            .sidecar("source", "busybox")
            .container("regular", "busybox")
            .build();
        q.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[2].restart_policy_rules =
            p.spec.as_ref().unwrap().containers[0]
                .restart_policy_rules
                .clone();
        let stopped = runtime(
            s0(),
            vec![
                exited(ctr("i0", "init", 0, "s0", Running), 0, t(12)),
                exited(ctr("s0c", "sidecar", 0, "s0", Running), 137, t(62)),
                exited(ctr("c0", "source", 0, "s0", Running), 42, t(60)),
                exited(ctr("r0", "regular", 0, "s0", Running), 137, t(62)),
            ],
        );
        let again = plan(&q, &stopped, &none, &BTreeMap::new(), Volumes::Ready, t(63));
        assert_eq!(again.steps, [start("init", 1)]);
        // Its volumes stay: the pod is not done, its mains stopped only to
        // start again.
        assert_eq!(volume_need(&q, &stopped, t(63)), VolumeNeed::Mount);
        // A rule that does not match restarts nothing else.
        let no_match = runtime(
            s0(),
            vec![
                exited(ctr("i0", "init", 0, "s0", Running), 0, t(12)),
                ctr("s0c", "sidecar", 0, "s0", Running),
                exited(ctr("c0", "source", 0, "s0", Running), 1, t(60)),
                ctr("r0", "regular", 0, "s0", Running),
            ],
        );
        let plain = plan(
            &p,
            &no_match,
            &none,
            &BTreeMap::new(),
            Volumes::Ready,
            t(61),
        );
        assert!(plain.steps.is_empty(), "{:?}", plain.steps);
    }

    /// A running container's quota is compared over the node's CFS period
    /// (`cpuCFSQuotaPeriod`): 25 ms a 50 ms period is its 500m limit, not a
    /// resize; over the default 100 ms period it is one.
    #[test]
    fn a_running_containers_quota_is_read_over_the_nodes_period() {
        use k8s_openapi::api::core::v1::ResourceRequirements;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let mut p = pod("web").container("a", "busybox:1").build();
        p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "cpu".to_string(),
                Quantity("500m".into()),
            )])),
            ..Default::default()
        });
        let spec = p.spec.as_ref().unwrap().containers[0].clone();
        let mut c = ctr("a1", "a", 0, "s0", Running);
        c.hash = super::super::translate::container_hash(&spec);
        c.resources = Some(super::super::translate::cgroup_limits(&p, &spec, 50_000));
        assert_eq!(
            c.resources.map(|r| (r.cpu_quota, r.cpu_period)),
            Some((25_000, 50_000))
        );
        let rt = runtime(vec![sandbox("s0", 0, true)], vec![c]);
        let steps = |cpu_period_us| {
            let policy = Policy {
                cpu_period_us,
                ..Policy::default()
            };
            plan_with(
                &p,
                &rt,
                &BTreeMap::new(),
                &BTreeMap::new(),
                Volumes::Ready,
                t(100),
                &policy,
            )
            .steps
        };
        assert_eq!(steps(50_000), vec![]);
        assert!(
            matches!(&steps(100_000)[..], [Step::ResizeContainer { .. }]),
            "{:?}",
            steps(100_000)
        );
    }

    #[test]
    fn container_restart_rules_decide_restart_and_completion() {
        let none = BTreeMap::new();
        let s0 = || vec![sandbox("s0", 0, true)];
        let exit = |code| {
            runtime(
                s0(),
                vec![exited(ctr("c1", "a", 0, "s0", Running), code, t(50))],
            )
        };
        let stop = vec![Step::StopSandbox { id: "s0".into() }];
        let rule = pod("rule")
            .restart_policy("Never")
            .container("a", "busybox")
            .container_restart("Never", &[("Restart", "In", &[42])])
            .build();
        let own_never = pod("own-never")
            .container("a", "busybox")
            .container_restart("Never", &[])
            .build();
        let own_always = pod("own-always")
            .restart_policy("Never")
            .container("a", "busybox")
            .container_restart("Always", &[])
            .build();
        let cases: Vec<(&str, &Pod, i32, Vec<Step>)> = vec![
            ("rule matches: restarted", &rule, 42, vec![start("a", 1)]),
            ("rule does not match: done", &rule, 1, stop.clone()),
            (
                "container Never under pod Always: done",
                &own_never,
                1,
                stop,
            ),
            (
                "container Always under pod Never",
                &own_always,
                1,
                vec![start("a", 1)],
            ),
            (
                "container Always, exit 0",
                &own_always,
                0,
                vec![start("a", 1)],
            ),
        ];
        for (name, p, code, want) in cases {
            assert_eq!(
                plan(
                    p,
                    &exit(code),
                    &none,
                    &BTreeMap::new(),
                    Volumes::Ready,
                    t(100)
                )
                .steps,
                want,
                "{name}"
            );
        }
        // A failed liveness probe restarts by the container's own policy.
        let running = runtime(s0(), vec![ctr("c1", "a", 0, "s0", Running)]);
        let unhealthy = BTreeMap::from([(
            "a".to_string(),
            ContainerProbes {
                ready: false,
                started: true,
                failed: Some(ProbeKind::Liveness),
            },
        )]);
        let steps = plan(
            &own_always,
            &running,
            &none,
            &unhealthy,
            Volumes::Ready,
            t(100),
        )
        .steps;
        assert_eq!(steps.last(), Some(&start("a", 1)));
        let steps = plan(
            &own_never,
            &running,
            &none,
            &unhealthy,
            Volumes::Ready,
            t(100),
        )
        .steps;
        assert!(matches!(steps.as_slice(), [Step::KillContainer { .. }]));
    }

    #[test]
    fn a_failed_init_container_fails_the_pod_while_the_sidecar_before_it_is_down() {
        // restartPolicy Never: the sidecar and the init container after it
        // both exited 1. The sidecar would restart, but the init container
        // failed for good: the pod fails and is stopped, as the kubelet's
        // getPhase and computeInitContainerActions.
        let p = pod("job")
            .restart_policy("Never")
            .sidecar("proxy", "busybox")
            .init_container("i1", "busybox")
            .container("a", "busybox")
            .build();
        let rt = runtime(
            vec![sandbox("s0", 0, true)],
            vec![
                exited(ctr("p1", "proxy", 0, "s0", Running), 1, t(20)),
                exited(ctr("x1", "i1", 0, "s0", Running), 1, t(20)),
            ],
        );
        assert_eq!(init_progress(&p, &rt), InitProgress::Failed("i1".into()));
        assert!(all_done(&p, &rt));
        // With OnFailure the init container runs again: still pending, at
        // the sidecar first.
        let again = pod("job")
            .restart_policy("OnFailure")
            .sidecar("proxy", "busybox")
            .init_container("i1", "busybox")
            .container("a", "busybox")
            .build();
        assert_eq!(
            init_progress(&again, &rt),
            InitProgress::Pending("proxy".into())
        );
    }

    #[test]
    fn init_container_restart_policy_overrides_the_pods() {
        let none = BTreeMap::new();
        let mut p = pod("job")
            .restart_policy("Never")
            .init_container("i1", "busybox")
            .container("a", "busybox")
            .build();
        p.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].restart_policy =
            Some("OnFailure".into());
        let failed = runtime(
            vec![sandbox("s0", 0, true)],
            vec![exited(ctr("x1", "i1", 0, "s0", Running), 1, t(20))],
        );
        assert_eq!(
            init_progress(&p, &failed),
            InitProgress::Pending("i1".into())
        );
        assert_eq!(
            plan(&p, &failed, &none, &BTreeMap::new(), Volumes::Ready, t(100)).steps,
            vec![start("i1", 1)]
        );
    }

    #[test]
    fn ephemeral_containers_start_once_in_the_running_sandbox() {
        let none = BTreeMap::new();
        let p = pod("web")
            .container("a", "busybox")
            .ephemeral("debugger", "busybox", None)
            .ephemeral("shell", "busybox", Some("a"))
            .build();
        let eph = |name: &str, target: Option<&str>| Step::StartEphemeralContainer {
            name: name.into(),
            target_id: target.map(Into::into),
        };
        let s0 = || vec![sandbox("s0", 0, true)];
        let cases: Vec<(&str, crate::pod_core::runtime::PodRuntime, Vec<Step>)> = vec![
            (
                "new: both, the second in its target's process namespace",
                runtime(s0(), vec![ctr("c1", "a", 0, "s0", Running)]),
                vec![eph("debugger", None), eph("shell", Some("c1"))],
            ),
            (
                "target not there: started without it (the worker reports it)",
                runtime(s0(), vec![]),
                vec![eph("debugger", None), eph("shell", None), start("a", 0)],
            ),
            (
                "exited or created ones are never started again",
                runtime(
                    s0(),
                    vec![
                        ctr("c1", "a", 0, "s0", Running),
                        exited(ctr("e1", "debugger", 0, "s0", Running), 1, t(40)),
                        ctr("e2", "shell", 0, "s0", Created),
                    ],
                ),
                vec![],
            ),
            (
                "no ready sandbox: not started with the new one",
                runtime(vec![sandbox("s0", 0, false)], vec![]),
                vec![
                    Step::CreateSandbox {
                        attempt: 1,
                        changed: true,
                    },
                    start("a", 0),
                ],
            ),
        ];
        for (name, rt, want) in cases {
            assert_eq!(
                plan(&p, &rt, &none, &BTreeMap::new(), Volumes::Ready, t(100)).steps,
                want,
                "{name}"
            );
        }
        // One the API shows terminated is not run again when its record is gone.
        let mut ran = p.clone();
        ran.status = Some(k8s_openapi::api::core::v1::PodStatus {
            ephemeral_container_statuses: Some(vec![k8s_openapi::api::core::v1::ContainerStatus {
                name: "debugger".into(),
                state: Some(k8s_openapi::api::core::v1::ContainerState {
                    terminated: Some(Default::default()),
                    ..Default::default()
                }),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let rt = runtime(s0(), vec![ctr("c1", "a", 0, "s0", Running)]);
        assert_eq!(
            plan(&ran, &rt, &none, &BTreeMap::new(), Volumes::Ready, t(100)).steps,
            vec![eph("shell", Some("c1"))]
        );
        // Before initialization completes, ephemeral containers still start.
        let init = pod("web")
            .init_container("i1", "busybox")
            .container("a", "busybox")
            .ephemeral("debugger", "busybox", None)
            .build();
        let rt = runtime(s0(), vec![ctr("x1", "i1", 0, "s0", Running)]);
        assert_eq!(
            plan(&init, &rt, &none, &BTreeMap::new(), Volumes::Ready, t(100)).steps,
            vec![eph("debugger", None)]
        );
        // An image pull back-off holds it.
        let backoff = BTreeMap::from([(
            "debugger".to_string(),
            PullBackoff {
                until: t(120),
                image: "busybox".into(),
            },
        )]);
        let rt = runtime(s0(), vec![ctr("c1", "a", 0, "s0", Running)]);
        let held = plan(&p, &rt, &backoff, &BTreeMap::new(), Volumes::Ready, t(100));
        assert_eq!(held.steps, vec![eph("shell", Some("c1"))]);
        assert_eq!(held.waiting["debugger"].reason, "ImagePullBackOff");
    }

    #[test]
    fn ephemeral_containers_stop_with_the_pod_and_keep_their_sandbox() {
        let none = BTreeMap::new();
        let p = pod("web")
            .container("a", "busybox")
            .ephemeral("debugger", "busybox", None)
            .deleted(t(90), 5)
            .build();
        let rt = runtime(
            vec![sandbox("s0", 0, true)],
            vec![
                ctr("c1", "a", 0, "s0", Running),
                ctr("e1", "debugger", 0, "s0", Running),
            ],
        );
        let kills: Vec<String> = plan(&p, &rt, &none, &BTreeMap::new(), Volumes::Ready, t(100))
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::KillContainer { name, .. } => Some(name.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(kills, vec!["a", "debugger"]);
        // The old sandbox holding an ephemeral container's record stays.
        let live = pod("web")
            .container("a", "busybox")
            .ephemeral("debugger", "busybox", None)
            .build();
        let rt = runtime(
            vec![sandbox("s1", 1, true), sandbox("s0", 0, false)],
            vec![
                ctr("c2", "a", 1, "s1", Running),
                exited(ctr("e1", "debugger", 0, "s0", Running), 137, t(40)),
            ],
        );
        assert!(
            plan(&live, &rt, &none, &BTreeMap::new(), Volumes::Ready, t(100))
                .steps
                .is_empty()
        );
    }
}
