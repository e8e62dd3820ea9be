//! What to do for one pod, given what the runtime holds: the kubelet's
//! `computePodActions` (kuberuntime_manager.go) plus the terminating path of
//! `SyncTerminatingPod`. Pure: pod, runtime state and time in; a [`Plan`] out.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::state::{ContainerState, PodRuntime};
use super::translate::container_hash;

/// Initial CrashLoopBackOff delay (10 s), doubled per restart up to [`MAX_BACKOFF`].
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(10);
/// Maximum CrashLoopBackOff and image pull back-off delay (300 s).
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

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
    /// The earliest deadline (a back-off ending) after which the pod must be synced again.
    pub requeue_after: Option<Duration>,
}

impl Plan {
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

/// The CrashLoopBackOff delay before restart number `restarts + 1`:
/// 0 for the first restart, then 10 s doubling to 300 s (the kubelet's
/// `backOff.Next` with its 10 s initial and 300 s maximum).
#[must_use]
pub fn crash_backoff(restarts: u32) -> Duration {
    if restarts == 0 {
        return Duration::ZERO;
    }
    let factor = 1u32.checked_shl(restarts - 1).unwrap_or(u32::MAX);
    INITIAL_BACKOFF.saturating_mul(factor).min(MAX_BACKOFF)
}

/// The pod's restart policy (`Always` when unset).
#[must_use]
pub fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

/// Whether a container that exited with `exit_code` is restarted under `policy`.
#[must_use]
pub fn should_restart(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// The pod's grace period for deletion, in seconds: `deletionGracePeriodSeconds`,
/// else `terminationGracePeriodSeconds`, else 30.
#[must_use]
pub fn grace_period(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(30)
        .max(0)
}

/// True when the pod's phase in the API is already terminal (Succeeded or Failed).
#[must_use]
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// True when every container has run and none will restart: the pod is done.
#[must_use]
pub fn all_done(pod: &Pod, rt: &PodRuntime) -> bool {
    let policy = restart_policy(pod);
    let spec = pod.spec.as_ref();
    let containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    !containers.is_empty()
        && containers.iter().all(|c| match rt.latest_two(&c.name).0 {
            Some(x) => x.state == ContainerState::Exited && !should_restart(policy, x.exit_code),
            None => false,
        })
}

/// Plans one sync of `pod` against `rt` at `now`. `pull_backoff` holds the image
/// pull back-offs of this pod's containers by name.
#[must_use]
pub fn plan(
    pod: &Pod,
    rt: &PodRuntime,
    pull_backoff: &BTreeMap<String, PullBackoff>,
    now: Timestamp,
) -> Plan {
    let mut plan = Plan::default();
    if pod.metadata.deletion_timestamp.is_some() {
        terminate(pod, rt, &mut plan);
        return plan;
    }
    if is_terminal(pod) || all_done(pod, rt) {
        // A finished pod keeps its exited containers (for status and logs) but not its sandbox.
        for c in rt
            .containers
            .iter()
            .filter(|c| c.state == ContainerState::Running)
        {
            plan.steps.push(Step::KillContainer {
                id: c.id.clone(),
                name: c.name.clone(),
                grace_seconds: grace_period(pod),
                reason: "pod has completed".into(),
            });
        }
        for s in rt.sandboxes.iter().filter(|s| s.ready) {
            plan.steps.push(Step::StopSandbox { id: s.id.clone() });
        }
        return plan;
    }
    let policy = restart_policy(pod);
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let next_attempt = |name: &str| rt.latest_two(name).0.map_or(0, |c| c.attempt + 1);

    match rt.latest_sandbox() {
        Some(s) if s.ready => {
            let sandbox_id = s.id.clone();
            for c in containers {
                let latest = rt.latest_two(&c.name).0;
                let start = match latest {
                    None => true,
                    Some(x) if x.state == ContainerState::Running => {
                        let changed = !x.hash.is_empty() && x.hash != container_hash(c);
                        if changed || x.sandbox_id != sandbox_id {
                            plan.steps.push(Step::KillContainer {
                                id: x.id.clone(),
                                name: c.name.clone(),
                                grace_seconds: grace_period(pod),
                                reason: format!(
                                    "Container {} definition changed, will be restarted",
                                    c.name
                                ),
                            });
                            true
                        } else {
                            false
                        }
                    }
                    Some(x) if x.state == ContainerState::Created => {
                        plan.steps.push(Step::RemoveContainer { id: x.id.clone() });
                        true
                    }
                    Some(x) => {
                        if x.sandbox_id != sandbox_id || should_restart(policy, x.exit_code) {
                            let finished = x.finished_at.unwrap_or(x.created_at);
                            let due = finished + crash_backoff(x.attempt);
                            if due > now {
                                let (ns, name, uid) = super::translate::pod_identity(pod);
                                let delay = crash_backoff(x.attempt).as_secs();
                                plan.waiting.insert(
                                    c.name.clone(),
                                    Waiting {
                                        reason: "CrashLoopBackOff".into(),
                                        message: format!(
                                            "back-off {delay}s restarting failed container={} pod={name}_{ns}({uid})",
                                            c.name
                                        ),
                                    },
                                );
                                plan.requeue_at(now, due);
                                false
                            } else {
                                true
                            }
                        } else {
                            false
                        }
                    }
                };
                if !start {
                    continue;
                }
                if let Some(b) = pull_backoff.get(&c.name).filter(|b| b.until > now) {
                    plan.waiting.insert(
                        c.name.clone(),
                        Waiting {
                            reason: "ImagePullBackOff".into(),
                            message: format!("Back-off pulling image \"{}\"", b.image),
                        },
                    );
                    plan.requeue_at(now, b.until);
                    continue;
                }
                plan.steps.push(Step::StartContainer {
                    name: c.name.clone(),
                    attempt: next_attempt(&c.name),
                });
            }
            garbage(
                rt,
                &sandbox_id,
                containers.iter().map(|c| c.name.as_str()),
                &mut plan,
            );
        }
        latest => {
            let ran_before = !rt.containers.is_empty();
            if latest.is_some() && policy == "Never" && ran_before {
                // The kubelet does not recreate the sandbox of a pod that must not restart.
                return plan;
            }
            for c in rt
                .containers
                .iter()
                .filter(|c| c.state == ContainerState::Running)
            {
                plan.steps.push(Step::KillContainer {
                    id: c.id.clone(),
                    name: c.name.clone(),
                    grace_seconds: grace_period(pod),
                    reason: "pod sandbox changed".into(),
                });
            }
            plan.steps.push(Step::CreateSandbox {
                attempt: latest.map_or(0, |s| s.attempt + 1),
                changed: latest.is_some(),
            });
            for c in containers {
                let succeeded = rt
                    .latest_two(&c.name)
                    .0
                    .is_some_and(|x| x.state == ContainerState::Exited && x.exit_code == 0);
                if policy == "OnFailure" && succeeded {
                    continue;
                }
                plan.steps.push(Step::StartContainer {
                    name: c.name.clone(),
                    attempt: next_attempt(&c.name),
                });
            }
        }
    }
    plan
}

/// Container garbage collection within a sync: keep the newest two records of
/// each container (current and `lastState`); drop older sandboxes once every
/// container has a record in the current one.
fn garbage<'a>(
    rt: &PodRuntime,
    sandbox_id: &str,
    names: impl Iterator<Item = &'a str>,
    plan: &mut Plan,
) {
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
            .filter(|s| s.id != sandbox_id && !s.ready)
        {
            plan.steps.push(Step::RemoveSandbox { id: s.id.clone() });
        }
    }
}

/// The terminating path: kill what runs (grace period), stop sandboxes, remove
/// everything, then delete the Pod object.
fn terminate(pod: &Pod, rt: &PodRuntime, plan: &mut Plan) {
    let grace = grace_period(pod);
    for c in rt
        .containers
        .iter()
        .filter(|c| c.state == ContainerState::Running)
    {
        plan.steps.push(Step::KillContainer {
            id: c.id.clone(),
            name: c.name.clone(),
            grace_seconds: grace,
            reason: format!("Stopping container {}", c.name),
        });
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
    use crate::pod::fixtures::{ctr, exited, pod, runtime, sandbox, t};
    use ContainerState::{Created, Running};

    fn start(name: &str, attempt: u32) -> Step {
        Step::StartContainer {
            name: name.into(),
            attempt,
        }
    }

    #[test]
    fn crash_backoff_doubles_to_five_minutes() {
        let secs: Vec<u64> = (0..8).map(|n| crash_backoff(n).as_secs()).collect();
        assert_eq!(secs, vec![0, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(crash_backoff(40), MAX_BACKOFF);
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
        let cases: Vec<(&str, &Pod, crate::pod::state::PodRuntime, Vec<Step>)> = vec![
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
            assert_eq!(plan(pod, &rt, &none, t(100)).steps, want, "{name}");
        }
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
        let early = plan(&p, &rt, &BTreeMap::new(), t(110));
        assert_eq!(early.waiting["a"].reason, "CrashLoopBackOff");
        assert!(
            early.waiting["a"]
                .message
                .starts_with("back-off 40s restarting failed container=a")
        );
        assert_eq!(early.requeue_after, Some(Duration::from_secs(30)));
        assert_eq!(early.steps, vec![Step::RemoveContainer { id: "c1".into() }]);
        let due = plan(&p, &rt, &BTreeMap::new(), t(140));
        assert_eq!(due.steps[0], start("a", 4));
        assert!(due.waiting.is_empty());
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
        let held = plan(&p, &rt, &backoff, t(100));
        assert!(held.steps.is_empty());
        assert_eq!(held.waiting["a"].reason, "ImagePullBackOff");
        assert_eq!(held.requeue_after, Some(Duration::from_secs(20)));
        assert_eq!(plan(&p, &rt, &backoff, t(121)).steps, vec![start("a", 0)]);
    }

    #[test]
    fn deletion_kills_with_grace_then_removes_and_deletes() {
        let p = pod("web")
            .container("a", "busybox")
            .deleted(t(90), 5)
            .build();
        let rt = runtime(
            vec![sandbox("s0", 0, true)],
            vec![ctr("c1", "a", 0, "s0", Running)],
        );
        let steps = plan(&p, &rt, &BTreeMap::new(), t(100)).steps;
        assert_eq!(
            steps,
            vec![
                Step::KillContainer {
                    id: "c1".into(),
                    name: "a".into(),
                    grace_seconds: 5,
                    reason: "Stopping container a".into()
                },
                Step::StopSandbox { id: "s0".into() },
                Step::RemoveContainer { id: "c1".into() },
                Step::RemoveSandbox { id: "s0".into() },
                Step::DeletePod,
            ]
        );
        let gone = plan(&p, &runtime(vec![], vec![]), &BTreeMap::new(), t(100)).steps;
        assert_eq!(gone, vec![Step::DeletePod]);
    }
}
