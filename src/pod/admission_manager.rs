//! The order of admission, as the kubelet's `HandlePodAdditions` admits pods
//! oldest first, each against the pods admitted before it: a pod's verdict
//! (the admit handlers of [`crate::pod_core::admit`], the resource managers'
//! allocation, then the GeneralPredicates of [`crate::pod_core::fit`]) is decided once and remembered, the pods it is decided
//! against are those admitted and still active, and older pods not decided
//! yet are decided first, in creation order. Pods that already run (after an
//! agent restart) hold their resources without being judged again. One lock
//! serializes admission (held across the resource managers' calls to device
//! plugins, as the kubelet admits one pod at a time), so two pods synced at
//! once never both take the last of a resource.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, PoisonError};

use k8s_openapi::api::core::v1::Pod;

use crate::pod_core::admit::Rejection;
use crate::pod_core::fit::{NodeView, fit};
use crate::pod_core::spec::is_terminal;
use crate::reasons::condition;

/// The admit handlers run on each pod decided, in the kubelet's order
/// around the GeneralPredicates: the checks, then the resource allocation
/// handler (the topology manager's, which gives the pod its devices, CPUs
/// and memory), then the predicates. A closure is a handler of checks alone.
pub trait Handlers {
    /// The admit handlers that allocate nothing (sysctls, OS, AppArmor …).
    fn check(&self, pod: &Pod) -> Option<Rejection>;
    /// Allocates what the pod asks of the resource managers; `Some` when
    /// it cannot be allocated (nothing is kept then).
    fn allocate(&self, _pod: &Pod) -> impl Future<Output = Option<Rejection>> + Send {
        std::future::ready(None)
    }
    /// Gives back what [`Handlers::allocate`] gave a pod the predicates
    /// then rejected.
    fn release(&self, _pod: &Pod) {}
}

impl<F: Fn(&Pod) -> Option<Rejection>> Handlers for F {
    fn check(&self, pod: &Pod) -> Option<Rejection> {
        self(pod)
    }
}

/// One pod's verdict: the handlers, then the predicates against `admitted`.
async fn decide(
    handlers: &impl Handlers,
    pod: &Pod,
    admitted: &[&Pod],
    node: &NodeView,
) -> Option<Rejection> {
    if let Some(r) = handlers.check(pod) {
        return Some(r);
    }
    if let Some(r) = handlers.allocate(pod).await {
        return Some(r);
    }
    let v = fit(pod, admitted, node);
    if v.is_some() {
        handlers.release(pod);
    }
    v
}

/// Remembered verdicts, by pod UID: `None` admitted, `Some` rejected.
#[derive(Debug, Default)]
pub struct AdmissionManager {
    verdicts: Mutex<HashMap<String, Option<Rejection>>>,
    /// Serializes [`AdmissionManager::admit`].
    serial: tokio::sync::Mutex<()>,
}

fn uid(p: &Pod) -> &str {
    p.metadata.uid.as_deref().unwrap_or_default()
}

/// Creation order: creation time, then UID (the kubelet's `PodsByCreationTime`
/// leaves ties unordered; the UID makes the order the same on every sync).
fn by_creation(a: &Pod, b: &Pod) -> Ordering {
    let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    t(a).cmp(&t(b)).then_with(|| uid(a).cmp(uid(b)))
}

/// True for a pod the node has started: running or finished containers, or
/// its sandbox reported ready to start them. Such a pod was admitted by an
/// earlier run of the agent and keeps its place.
#[must_use]
pub fn has_started(p: &Pod) -> bool {
    let Some(st) = p.status.as_ref() else {
        return false;
    };
    let ran = st
        .container_statuses
        .iter()
        .chain(st.init_container_statuses.iter())
        .flatten()
        .any(|c| {
            c.state
                .as_ref()
                .is_some_and(|s| s.running.is_some() || s.terminated.is_some())
                || c.last_state
                    .as_ref()
                    .is_some_and(|s| s.terminated.is_some())
        });
    let sandbox = st
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == condition::POD_READY_TO_START_CONTAINERS && c.status == "True");
    st.phase.as_deref() == Some(crate::reasons::phase::RUNNING) || ran || sandbox
}

impl AdmissionManager {
    /// A manager with no verdicts.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The verdict on `candidate`, decided now if it has none: the
    /// [`Handlers`] then [`fit`] against the active pods of `bound` (the
    /// pods bound to this node) that were admitted or already run, after the
    /// older undecided pods of `bound` were decided the same way. Terminal
    /// pods hold nothing. None admits.
    pub async fn admit(
        &self,
        candidate: &Pod,
        bound: &[&Pod],
        node: &NodeView,
        handlers: &impl Handlers,
    ) -> Option<Rejection> {
        let _serial = self.serial.lock().await;
        let (mut admitted, older) = {
            let mut verdicts = self.verdicts.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(v) = verdicts.get(uid(candidate)) {
                return v.clone();
            }
            let mut others: Vec<&Pod> = bound
                .iter()
                .copied()
                .filter(|p| uid(p) != uid(candidate) && !is_terminal(p))
                .collect();
            others.sort_by(|a, b| by_creation(a, b));
            let mut admitted: Vec<&Pod> = Vec::new();
            let mut older: Vec<&Pod> = Vec::new();
            for p in others {
                match verdicts.get(uid(p)) {
                    Some(None) => admitted.push(p),
                    Some(Some(_)) => {}
                    None if has_started(p) => {
                        verdicts.insert(uid(p).to_string(), None);
                        admitted.push(p);
                    }
                    None if by_creation(p, candidate) == Ordering::Less => older.push(p),
                    None => {}
                }
            }
            (admitted, older)
        };
        for p in older {
            let v = decide(handlers, p, &admitted, node).await;
            if v.is_none() {
                admitted.push(p);
            }
            self.record(uid(p), v);
        }
        let v = decide(handlers, candidate, &admitted, node).await;
        self.record(uid(candidate), v.clone());
        v
    }

    fn record(&self, uid: &str, verdict: Option<Rejection>) {
        self.verdicts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(uid.to_string(), verdict);
    }

    /// The verdict already decided on the pod `uid`, if any (None inside:
    /// admitted).
    #[must_use]
    pub fn decided(&self, uid: &str) -> Option<Option<Rejection>> {
        self.verdicts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(uid)
            .cloned()
    }

    /// Forgets the verdicts of pods whose UID `keep` rejects (pods gone from
    /// the node).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.verdicts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|uid, _| keep(uid));
    }

    /// How many verdicts are remembered.
    #[must_use]
    pub fn remembered(&self) -> usize {
        self.verdicts
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{PodStatus, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::fixtures::{pod, t};

    fn cpu_pod(name: &str, created: i64, cpu: &str) -> Pod {
        let mut p = pod(name).container("c", "busybox").build();
        p.metadata.creation_timestamp = Some(Time(t(created)));
        if let Some(spec) = p.spec.as_mut() {
            spec.containers[0].resources = Some(ResourceRequirements {
                requests: Some(BTreeMap::from([("cpu".to_string(), Quantity(cpu.into()))])),
                ..Default::default()
            });
        }
        p
    }

    fn node() -> NodeView {
        NodeView {
            name: "n1".into(),
            allocatable: BTreeMap::from([
                ("cpu".to_string(), Quantity("1".into())),
                ("pods".to_string(), Quantity("110".into())),
            ]),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn pods_are_admitted_oldest_first_whatever_order_they_are_synced_in() {
        let m = AdmissionManager::new();
        let old = cpu_pod("old", 0, "600m");
        let new = cpu_pod("new", 10, "600m");
        let bound = [&old, &new];
        // The newer pod is synced first: the older one is decided before it.
        let v = m
            .admit(&new, &bound, &node(), &|_: &Pod| None)
            .await
            .expect("rejected");
        assert_eq!(v.reason, "OutOfcpu");
        assert_eq!(m.admit(&old, &bound, &node(), &|_: &Pod| None).await, None);
        // A verdict is kept.
        assert!(
            m.admit(&new, &bound, &node(), &|_: &Pod| None)
                .await
                .is_some()
        );
        m.retain(|uid| uid != "uid-new");
        assert_eq!(m.remembered(), 1);
    }

    #[tokio::test]
    async fn running_pods_keep_their_place_and_finished_ones_hold_nothing() {
        let m = AdmissionManager::new();
        let mut running = cpu_pod("running", 20, "600m");
        running.status = Some(PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        });
        let mut done = cpu_pod("done", 0, "900m");
        done.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        let candidate = cpu_pod("candidate", 10, "500m");
        let bound = [&done, &candidate, &running];
        let v = m
            .admit(&candidate, &bound, &node(), &|_: &Pod| None)
            .await
            .expect("rejected");
        assert!(v.message.contains("used: 600"), "{}", v.message);
        // The admit handlers come first.
        let other = cpu_pod("other", 30, "1m");
        let reject = |_: &Pod| {
            Some(Rejection {
                reason: "SysctlForbidden".into(),
                message: "forbidden sysctl".into(),
            })
        };
        assert_eq!(
            m.admit(&other, &[&other], &node(), &reject)
                .await
                .map(|r| r.reason),
            Some("SysctlForbidden".into())
        );
    }

    /// Handlers that record what they were asked, in order.
    #[derive(Default)]
    struct Recorder(std::sync::Mutex<Vec<String>>);

    impl Handlers for Recorder {
        fn check(&self, pod: &Pod) -> Option<Rejection> {
            self.0.lock().unwrap().push(format!("check {}", uid(pod)));
            None
        }
        async fn allocate(&self, pod: &Pod) -> Option<Rejection> {
            self.0
                .lock()
                .unwrap()
                .push(format!("allocate {}", uid(pod)));
            None
        }
        fn release(&self, pod: &Pod) {
            self.0.lock().unwrap().push(format!("release {}", uid(pod)));
        }
    }

    #[tokio::test]
    async fn resources_are_allocated_before_the_predicates_and_given_back_on_their_rejection() {
        let m = AdmissionManager::new();
        let old = cpu_pod("old", 0, "600m");
        let new = cpu_pod("new", 10, "600m");
        let bound = [&new, &old];
        let handlers = Recorder::default();
        assert!(m.admit(&new, &bound, &node(), &handlers).await.is_some());
        // The older pod is decided first, with its resources allocated; the
        // newer one gets its resources, then fails the predicates and gives
        // them back.
        assert_eq!(
            *handlers.0.lock().unwrap(),
            [
                "check uid-old",
                "allocate uid-old",
                "check uid-new",
                "allocate uid-new",
                "release uid-new"
            ]
        );
    }
}
