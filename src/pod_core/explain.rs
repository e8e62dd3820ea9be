//! What holds a pod back, from one sync of the pod worker: the runtime state
//! it observed, the plan it computed, and each reason the pod is not (yet)
//! running as its spec asks, with when the next try is due. Served as JSON by
//! the node API (`/debug/pods/<namespace>/<pod>/plan`) and printed by
//! `rustlet explain`. Pure: the pod worker hands in what its sync saw.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::admit::Rejection;
use super::plan::{Plan, PullBackoff, Step, Waiting};
use super::runtime::{ContainerState, PodRuntime};

/// The most characters kept of one message (a runtime's or a volume
/// plugin's error can be long).
pub const MAX_MESSAGE_CHARS: usize = 1024;

/// One sync's account of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// `<namespace>/<name>`.
    pub pod: String,
    /// The pod's UID.
    pub uid: String,
    /// When the sync ran (RFC 3339).
    pub synced_at: String,
    /// When the pod worker syncs the pod next (RFC 3339); absent when only a
    /// change of the pod wakes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_sync_at: Option<String>,
    /// What the runtime held of the pod at the end of the sync.
    pub runtime: RuntimeView,
    /// The steps planned, in order, one line each.
    pub plan: Vec<String>,
    /// What holds the pod back; empty when nothing does.
    pub blockers: Vec<Blocker>,
}

/// The runtime's sandboxes and containers of a pod, newest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeView {
    /// Sandboxes.
    pub sandboxes: Vec<SandboxView>,
    /// Containers of every sandbox.
    pub containers: Vec<ContainerView>,
}

/// One sandbox.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxView {
    /// CRI sandbox ID.
    pub id: String,
    /// Its attempt (0 for the first).
    pub attempt: u32,
    /// True while it is ready.
    pub ready: bool,
}

/// One container record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerView {
    /// Its name in the spec.
    pub name: String,
    /// CRI container ID.
    pub id: String,
    /// Its attempt (restart count).
    pub attempt: u32,
    /// `Created`, `Running`, `Exited` or `Unknown`.
    pub state: String,
    /// Its exit code, once exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
}

/// One thing that holds a pod back.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Blocker {
    /// What kind: `Admission`, `NodeNotListed`, `Volume`, `Container`,
    /// `InitContainer`, `Resize`.
    pub kind: String,
    /// The container or volume it concerns, if one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The kubelet's reason (`CrashLoopBackOff`, `FailedMount`, …).
    pub reason: String,
    /// The message, as the pod's status or events give it.
    pub message: String,
    /// When the back-off holding it ends (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    /// The container's attempt (restart count) of the run that exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
}

/// What one sync of a pod saw and decided, for [`explain`].
#[derive(Clone, Copy, Debug)]
pub struct Sync<'a> {
    /// The pod, as allocated.
    pub pod: &'a Pod,
    /// The runtime state at the end of the sync.
    pub runtime: &'a PodRuntime,
    /// The plan.
    pub plan: &'a Plan,
    /// Why containers wait: the plan's and what executing it found
    /// (`CreateContainerConfigError`, `ErrImagePull`, …), by container.
    pub waiting: &'a BTreeMap<String, Waiting>,
    /// The image pull back-offs, by container.
    pub pull_backoffs: &'a BTreeMap<String, PullBackoff>,
    /// The volumes that could not be set up: (volume, error).
    pub volume_errors: &'a [(String, String)],
    /// A resize left pending (`PodResizePending`'s reason and message).
    pub resize_pending: Option<&'a Rejection>,
    /// When the sync ran.
    pub now: Timestamp,
    /// When the pod worker syncs the pod again.
    pub requeue: Option<Duration>,
}

fn text(message: &str) -> String {
    message.chars().take(MAX_MESSAGE_CHARS).collect()
}

fn at(t: Timestamp) -> String {
    t.to_string()
}

fn later(now: Timestamp, d: Duration) -> Option<String> {
    k8s_openapi::jiff::SignedDuration::try_from(d)
        .ok()
        .and_then(|d| now.checked_add(d).ok())
        .map(at)
}

fn identity(pod: &Pod) -> (String, String) {
    let (ns, name, uid) = super::facts::pod_identity(pod);
    (format!("{ns}/{name}"), uid)
}

/// The runtime's view of a pod.
#[must_use]
pub fn runtime_view(rt: &PodRuntime) -> RuntimeView {
    RuntimeView {
        sandboxes: rt
            .sandboxes
            .iter()
            .map(|s| SandboxView {
                id: s.id.clone(),
                attempt: s.attempt,
                ready: s.ready,
            })
            .collect(),
        containers: rt
            .containers
            .iter()
            .map(|c| ContainerView {
                name: c.name.clone(),
                id: c.id.clone(),
                attempt: c.attempt,
                state: format!("{:?}", c.state),
                exit_code: (c.state == ContainerState::Exited).then_some(c.exit_code),
            })
            .collect(),
    }
}

/// A step as one line.
#[must_use]
pub fn step_line(step: &Step) -> String {
    match step {
        Step::KillContainer {
            name,
            grace_seconds,
            reason,
            ..
        } => format!("kill container {name} (grace {grace_seconds}s): {reason}"),
        Step::StopSandbox { id } => format!("stop sandbox {id}"),
        Step::RemoveContainer { id } => format!("remove container {id}"),
        Step::RemoveSandbox { id } => format!("remove sandbox {id}"),
        Step::CreateSandbox { attempt, .. } => format!("create sandbox (attempt {attempt})"),
        Step::StartContainer { name, attempt, .. } => {
            format!("start container {name} (attempt {attempt})")
        }
        Step::StartEphemeralContainer { name, .. } => {
            format!("start ephemeral container {name}")
        }
        Step::ResizeContainer { name, .. } => format!("resize container {name}"),
        Step::DeletePod => "delete the pod object".into(),
    }
}

/// The first init container (not a sidecar) whose last run has not
/// completed, while no regular container has run yet: what the pod waits
/// for.
fn pending_init(pod: &Pod, rt: &PodRuntime) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let ran = |name: &str| rt.containers.iter().any(|c| c.name == name);
    if spec.containers.iter().any(|c| ran(&c.name)) {
        return None;
    }
    spec.init_containers
        .iter()
        .flatten()
        .filter(|c| !super::spec::is_sidecar(c))
        .find(|c| {
            !rt.latest_two(&c.name)
                .0
                .is_some_and(|x| x.state == ContainerState::Exited && x.exit_code == 0)
        })
        .map(|c| c.name.clone())
}

/// The account of one sync: its runtime view, its steps, and what holds the
/// pod back (volumes not set up, containers waiting with their back-off's
/// end and attempt, the init container the pod waits for, a pending
/// resize).
#[must_use]
pub fn explain(s: &Sync<'_>) -> Explanation {
    let (pod, uid) = identity(s.pod);
    let mut blockers: Vec<Blocker> = s
        .volume_errors
        .iter()
        .map(|(volume, e)| Blocker {
            kind: "Volume".into(),
            subject: Some(volume.clone()),
            reason: crate::reasons::event::FAILED_MOUNT.into(),
            message: text(&format!(
                "MountVolume.SetUp failed for volume \"{volume}\" : {e}"
            )),
            ..Blocker::default()
        })
        .collect();
    if let Some(init) = pending_init(s.pod, s.runtime) {
        blockers.push(Blocker {
            kind: "InitContainer".into(),
            message: format!("waiting for init container {init} to complete"),
            reason: "PodInitializing".into(),
            subject: Some(init),
            ..Blocker::default()
        });
    }
    for (name, w) in s.waiting {
        let until = s
            .plan
            .held_until
            .get(name)
            .copied()
            .or_else(|| s.pull_backoffs.get(name).map(|b| b.until))
            .filter(|t| *t > s.now);
        let attempt = s
            .plan
            .held_until
            .contains_key(name)
            .then(|| s.runtime.latest_two(name).0.map_or(0, |x| x.attempt));
        blockers.push(Blocker {
            kind: "Container".into(),
            subject: Some(name.clone()),
            reason: w.reason.clone(),
            message: text(&w.message),
            until: until.map(at),
            attempt,
        });
    }
    if let Some(r) = s.resize_pending {
        blockers.push(Blocker {
            kind: "Resize".into(),
            reason: r.reason.clone(),
            message: text(&r.message),
            ..Blocker::default()
        });
    }
    Explanation {
        pod,
        uid,
        synced_at: at(s.now),
        next_sync_at: s.requeue.and_then(|d| later(s.now, d)),
        runtime: runtime_view(s.runtime),
        plan: s.plan.steps.iter().map(step_line).collect(),
        blockers,
    }
}

/// The account of a sync that went no further than admission: the pod was
/// rejected (`rejection`), or the Node is not listed yet (`None`), and is
/// tried again after `requeue`.
#[must_use]
pub fn not_admitted(
    pod: &Pod,
    rejection: Option<&Rejection>,
    now: Timestamp,
    requeue: Option<Duration>,
) -> Explanation {
    let (name, uid) = identity(pod);
    let blocker = match rejection {
        Some(r) => Blocker {
            kind: "Admission".into(),
            reason: r.reason.clone(),
            message: text(&r.message),
            ..Blocker::default()
        },
        None => Blocker {
            kind: "NodeNotListed".into(),
            reason: "NodeNotListed".into(),
            message: "the Node object is not listed yet: admission waits for it".into(),
            ..Blocker::default()
        },
    };
    Explanation {
        pod: name,
        uid,
        synced_at: at(now),
        next_sync_at: requeue.and_then(|d| later(now, d)),
        blockers: vec![blocker],
        ..Explanation::default()
    }
}

/// `e` for a person, as `rustlet explain` prints it: the pod, the sync's
/// times, the runtime's records, the plan, and what holds the pod back.
#[must_use]
pub fn render(e: &Explanation) -> String {
    use std::fmt::Write as _;
    let mut out = format!("Pod {} (uid {})\n", e.pod, e.uid);
    let _ = writeln!(out, "Last synced: {}", e.synced_at);
    match &e.next_sync_at {
        Some(t) => {
            let _ = writeln!(out, "Next sync:   {t}");
        }
        None => out.push_str("Next sync:   on the next change of the pod\n"),
    }
    out.push_str("Runtime:\n");
    if e.runtime.sandboxes.is_empty() && e.runtime.containers.is_empty() {
        out.push_str("  nothing\n");
    }
    for s in &e.runtime.sandboxes {
        let ready = if s.ready { "ready" } else { "not ready" };
        let _ = writeln!(out, "  sandbox {} (attempt {}, {ready})", s.id, s.attempt);
    }
    for c in &e.runtime.containers {
        let code = c
            .exit_code
            .map(|code| format!(", exit code {code}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  container {} {} (attempt {}{code}) {}",
            c.name, c.state, c.attempt, c.id
        );
    }
    out.push_str("Plan:\n");
    if e.plan.is_empty() {
        out.push_str("  nothing to do\n");
    }
    for step in &e.plan {
        let _ = writeln!(out, "  - {step}");
    }
    if e.blockers.is_empty() {
        out.push_str("Nothing holds the pod back.\n");
        return out;
    }
    out.push_str("Held back by:\n");
    for b in &e.blockers {
        let subject = b
            .subject
            .as_ref()
            .map(|s| format!(" {s}"))
            .unwrap_or_default();
        let _ = write!(out, "  - {}{subject}: {}: {}", b.kind, b.reason, b.message);
        let mut extra = Vec::new();
        if let Some(t) = &b.until {
            extra.push(format!("until {t}"));
        }
        if let Some(a) = b.attempt {
            extra.push(format!("attempt {a}"));
        }
        if !extra.is_empty() {
            let _ = write!(out, " ({})", extra.join(", "));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;
    use crate::pod_core::runtime::{Container as RuntimeContainer, Sandbox};

    fn t(s: i64) -> Timestamp {
        crate::fixtures::t(s)
    }

    fn exited(name: &str, attempt: u32, code: i32) -> RuntimeContainer {
        RuntimeContainer {
            id: format!("{name}-{attempt}"),
            name: name.into(),
            attempt,
            sandbox_id: "s1".into(),
            state: ContainerState::Exited,
            exit_code: code,
            ..RuntimeContainer::default()
        }
    }

    /// A container in CrashLoopBackOff is named with its reason, the end of
    /// its back-off and its attempt; the next sync is when the back-off ends.
    #[test]
    fn a_crash_loop_is_explained_with_its_end_and_attempt() {
        let p = pod("crash").container("c", "busybox").build();
        let rt = PodRuntime {
            sandboxes: vec![Sandbox {
                id: "s1".into(),
                ready: true,
                ..Sandbox::default()
            }],
            containers: vec![exited("c", 3, 1)],
        };
        let mut plan = Plan::default();
        let waiting: BTreeMap<String, Waiting> = [(
            "c".to_string(),
            Waiting {
                reason: "CrashLoopBackOff".into(),
                message: "back-off 40s restarting failed container=c".into(),
            },
        )]
        .into();
        plan.held_until.insert("c".into(), t(140));
        let e = explain(&Sync {
            pod: &p,
            runtime: &rt,
            plan: &plan,
            waiting: &waiting,
            pull_backoffs: &BTreeMap::new(),
            volume_errors: &[],
            resize_pending: None,
            now: t(100),
            requeue: Some(Duration::from_secs(40)),
        });
        assert_eq!(e.pod, "default/crash");
        assert_eq!(e.next_sync_at.as_deref(), Some(at(t(140)).as_str()));
        assert_eq!(e.runtime.containers[0].exit_code, Some(1));
        assert_eq!(
            e.blockers,
            [Blocker {
                kind: "Container".into(),
                subject: Some("c".into()),
                reason: "CrashLoopBackOff".into(),
                message: "back-off 40s restarting failed container=c".into(),
                until: Some(at(t(140))),
                attempt: Some(3),
            }]
        );
        let text = render(&e);
        assert!(text.starts_with("Pod default/crash (uid "), "{text}");
        assert!(
            text.contains(&format!(
                "  - Container c: CrashLoopBackOff: back-off 40s restarting failed container=c (until {}, attempt 3)\n",
                at(t(140))
            )),
            "{text}"
        );
        assert!(
            text.contains("  container c Exited (attempt 3, exit code 1) c-3\n"),
            "{text}"
        );
        assert!(text.contains("Plan:\n  nothing to do\n"), "{text}");
    }

    /// A volume that failed and the init container the pod waits for are
    /// named; the plan's steps are one line each; a long message is cut.
    #[test]
    fn volumes_init_containers_and_steps_are_explained() {
        let p = pod("init")
            .init_container("setup", "busybox")
            .container("c", "busybox")
            .build();
        let rt = PodRuntime::default();
        let plan = Plan {
            steps: vec![Step::CreateSandbox {
                attempt: 0,
                changed: false,
            }],
            ..Plan::default()
        };
        let long = "x".repeat(5000);
        let errors = [(
            "cfg".to_string(),
            format!("configmap \"cfg\" not found {long}"),
        )];
        let e = explain(&Sync {
            pod: &p,
            runtime: &rt,
            plan: &plan,
            waiting: &BTreeMap::new(),
            pull_backoffs: &BTreeMap::new(),
            volume_errors: &errors,
            resize_pending: None,
            now: t(0),
            requeue: None,
        });
        assert_eq!(e.plan, ["create sandbox (attempt 0)"]);
        assert_eq!(e.next_sync_at, None);
        let kinds: Vec<(&str, Option<&str>)> = e
            .blockers
            .iter()
            .map(|b| (b.kind.as_str(), b.subject.as_deref()))
            .collect();
        assert_eq!(
            kinds,
            [("Volume", Some("cfg")), ("InitContainer", Some("setup"))]
        );
        assert_eq!(e.blockers[0].reason, "FailedMount");
        assert!(e.blockers[0].message.starts_with(
            "MountVolume.SetUp failed for volume \"cfg\" : configmap \"cfg\" not found"
        ));
        assert_eq!(e.blockers[0].message.chars().count(), MAX_MESSAGE_CHARS);
        // Once the init container completed, the pod no longer waits for it.
        let done = PodRuntime {
            containers: vec![exited("setup", 0, 0)],
            ..PodRuntime::default()
        };
        assert_eq!(pending_init(&p, &done), None);
    }

    #[test]
    fn a_pod_not_admitted_says_why() {
        let p = pod("big").container("c", "busybox").build();
        let r = Rejection {
            reason: "OutOfcpu".into(),
            message: "Node didn't have enough resource: cpu".into(),
        };
        let e = not_admitted(&p, Some(&r), t(0), None);
        assert_eq!(e.blockers[0].kind, "Admission");
        assert_eq!(e.blockers[0].reason, "OutOfcpu");
        let waiting = not_admitted(&p, None, t(0), Some(Duration::from_secs(1)));
        assert_eq!(waiting.blockers[0].kind, "NodeNotListed");
        assert_eq!(waiting.next_sync_at.as_deref(), Some(at(t(1)).as_str()));
        // The document is JSON with the API's casing.
        let json = serde_json::to_value(&e).unwrap();
        assert!(json.get("syncedAt").is_some() && json.get("nextSyncAt").is_none());
    }
}
