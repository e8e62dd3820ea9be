//! The eviction manager's loop, as the kubelet's `managerImpl.synchronize`
//! every 10 s: it observes the signals from the stats summary, publishes the
//! node's pressure conditions (for node status and admission), and when a
//! threshold is due, reports `EvictionThresholdMet` on the Node, reclaims
//! at node level first for a disk signal (dead containers, also those of
//! finished pods, and every unused image, as `buildSignalToNodeReclaimFuncs`
//! for the node's filesystem layout, [`super::node_reclaim`]) and stops
//! there when no threshold is met any more (minimum reclaim included), else
//! evicts the first pod of the ranking.
//! The layout (one filesystem, a dedicated image filesystem, or a split
//! one: [`crate::stats::FsLayout`]) is read once, at the first cycle, as
//! the kubelet's `synchronize` reads it; no cycle runs before it is known.
//! It sets the `containerfs.*` thresholds ([`super::container_fs_thresholds`]),
//! the ranking and the node-level reclaim.
//! An evicted pod gets an `Evicted` event and is killed through the pod
//! side ([`Pods::kill_pod`]: recorded for its pod worker, which stops it,
//! with the evicting status [`crate::pod_core::status::evicting`]); the
//! manager waits for its containers to stop before the next cycle.
//! At most one pod per cycle for a threshold; before thresholds, every pod
//! over a local storage limit goes ([`super::local_storage_violation`]),
//! with or without thresholds. Critical pods (static pods, and priority at
//! least 2000000000) are never evicted.
//!
//! What the manager works with is injected where the agent is wired
//! ([`super::types`], as the kubelet's eviction/types.go): the pods
//! ([`Pods`]: the active ones, their kill, their cleanup, the reclaim of
//! dead containers) and the image garbage collector ([`Images`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::{
    Eviction, Images, Pods, Pressure, Signal, State, Threshold, container_fs_thresholds, message,
    met, node_reclaim, observe, rank,
};
use crate::events::{EventType, Recorder, publish_annotated, publish_node};
use crate::stats::{FsLayout, Provider};

/// How long the manager waits for an evicted pod's containers to stop past
/// its grace period (the kubelet's `podCleanupTimeout`).
pub const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the manager looks (the kubelet's `evictionMonitoringPeriod`).
pub const MONITORING_PERIOD: Duration = Duration::from_secs(10);

pub use crate::pod_core::kind::SYSTEM_CRITICAL_PRIORITY;

/// The manager's configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The node's name (for its events).
    pub node_name: String,
    /// The thresholds and timings, which may change while the manager
    /// runs (a `NodeConfiguration` applied): read at each cycle.
    pub limits: watch::Receiver<Limits>,
    /// The huge page pools' bytes, which memory cannot give back, when the
    /// node's memory stats count them as available (0 when they do not:
    /// [`crate::stats::Provider::node_memory_counts_hugepages`]).
    pub hugepages_bytes: u64,
}

/// The eviction manager's thresholds and timings.
#[derive(Clone, Debug, PartialEq)]
pub struct Limits {
    /// The thresholds ([`super::thresholds`], with
    /// [`super::allocatable_thresholds`] when `pods` is enforced); those of
    /// `containerfs.*` are made from them at the first cycle after each
    /// change.
    pub thresholds: Vec<Threshold>,
    /// `evictionPressureTransitionPeriod`.
    pub transition: Duration,
    /// `evictionMaxPodGracePeriod`, seconds.
    pub max_pod_grace: i64,
}

/// True for a pod the manager never evicts and never refuses, as the
/// kubelet's `IsCriticalPod`: a static pod, a mirror pod, or one of
/// priority at least [`SYSTEM_CRITICAL_PRIORITY`].
#[must_use]
pub fn is_critical(pod: &Pod) -> bool {
    crate::pod_core::kind::PodKind::of(pod).is_critical
}

/// The runtime's filesystem layout with the thresholds for it (those of
/// `containerfs.*` made from `thresholds`), said in the log.
fn layout_thresholds(l: FsLayout, thresholds: &[Threshold]) -> (FsLayout, Vec<Threshold>) {
    let (thresholds, ignored) = container_fs_thresholds(thresholds, l);
    if let Some(e) = ignored {
        warn!(
            error = e,
            "eviction manager: found conflicting containerfs eviction. Ignoring."
        );
    }
    info!(layout = ?l, "eviction manager: the runtime's filesystems");
    (l, thresholds)
}

/// Runs the manager forever, as the kubelet's `managerImpl.Start`: it reads
/// `stats`, tells its events to `recorder`, evicts among `pods` and
/// reclaims images with `images`; `pressures` carries the conditions to
/// report.
pub async fn run<P: Pods, I: Images>(
    mut cfg: Config,
    stats: Arc<Provider>,
    recorder: Recorder,
    pods: Arc<P>,
    images: Arc<I>,
    pressures: watch::Sender<Vec<Pressure>>,
) {
    // With no thresholds the loop still enforces local storage limits
    // (`localStorageCapacityIsolation`, on by default).
    let started = Instant::now();
    let mut state = State::default();
    let mut tick = tokio::time::interval(MONITORING_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Whether the last summary failed: its failure is said once, on the
    // Node and in the log, not every 10 s.
    let mut blind = false;
    let mut layout: Option<(FsLayout, Vec<Threshold>)> = None;
    let mut limits = cfg.limits.borrow_and_update().clone();
    loop {
        tick.tick().await;
        if cfg.limits.has_changed().unwrap_or(false) {
            limits = cfg.limits.borrow_and_update().clone();
            info!(
                thresholds = limits.thresholds.len(),
                "eviction manager: thresholds changed"
            );
            layout = None;
        }
        if layout.is_none() {
            layout = stats
                .fs_layout()
                .await
                .map(|l| layout_thresholds(l, &limits.thresholds));
        }
        let Some((layout, thresholds)) = &layout else {
            if !blind {
                warn!(
                    "eviction manager: the runtime does not say where its image filesystem is; no eviction until it does"
                );
                blind = true;
            }
            continue;
        };
        let summary = match stats.summary(false).await {
            Ok(s) => {
                if blind {
                    info!("eviction manager: node statistics are back");
                    blind = false;
                }
                s
            }
            Err(e) => {
                if !blind {
                    warn!(error = %e, "eviction manager: no node statistics; no eviction until they are back");
                    publish_node(
                        &recorder,
                        &cfg.node_name,
                        EventType::Warning,
                        crate::reasons::event::EVICTION_STATS_UNAVAILABLE,
                        format!("The eviction manager has no node statistics and cannot act: {e}"),
                    );
                    blind = true;
                }
                continue;
            }
        };
        let observations = observe(&summary, cfg.hugepages_bytes);
        let cycle = state.cycle(
            started.elapsed(),
            thresholds,
            &observations,
            limits.transition,
        );
        pressures.send_if_modified(|p| {
            let changed = *p != cycle.pressures;
            if changed {
                info!(pressures = ?cycle.pressures, "node pressure changed");
                p.clone_from(&cycle.pressures);
            }
            changed
        });
        let candidates = pods.active_pods();
        let active: Vec<&Pod> = candidates
            .iter()
            .map(AsRef::as_ref)
            .filter(|p| !is_critical(p))
            .collect();
        let mut evicted: Vec<(String, i64)> = Vec::new();
        // Local storage limits first (`localStorageEviction`): every pod over
        // one goes, and then the cycle ends.
        for p in &active {
            let uid = p.metadata.uid.as_deref().unwrap_or_default();
            let Some(stats) = summary.pods.iter().find(|s| s.pod_ref.uid == uid) else {
                continue;
            };
            if let Some(text) = super::local_storage_violation(p, stats, *layout) {
                let grace = crate::pod_core::spec::EVICTION_GRACE_SECONDS;
                evict(&recorder, &*pods, p, text, BTreeMap::new(), false, grace).await;
                evicted.push((uid.to_string(), grace));
            }
        }
        if !evicted.is_empty() {
            wait_for_cleanup(&*pods, &evicted).await;
            continue;
        }
        let Some(threshold) = cycle.reclaim else {
            continue;
        };
        let resource = threshold.signal.resource();
        publish_node(
            &recorder,
            &cfg.node_name,
            EventType::Warning,
            crate::reasons::event::EVICTION_THRESHOLD_MET,
            format!("Attempting to reclaim {resource}"),
        );
        if threshold.signal.pressure() == Pressure::Disk {
            let reclaim = Reclaim {
                signal: threshold.signal,
                layout: *layout,
                thresholds,
                hugepages_bytes: cfg.hugepages_bytes,
            };
            if reclaim_node_level(&reclaim, &stats, &*pods, &*images).await {
                continue;
            }
        }
        let Some(victim) = rank(threshold.signal, &active, &summary, *layout)
            .first()
            .copied()
        else {
            warn!(resource, "eviction manager: no pod to evict");
            continue;
        };
        let (text, annotations) = message(
            &threshold,
            observations.get(&threshold.signal),
            victim,
            &summary,
        );
        let grace = super::grace_period(&threshold, limits.max_pod_grace, victim);
        evict(&recorder, &*pods, victim, text, annotations, true, grace).await;
        let uid = victim.metadata.uid.clone().unwrap_or_default();
        wait_for_cleanup(&*pods, &[(uid, grace)]).await;
    }
}

/// A node-level reclaim: for which disk signal, in which filesystem
/// layout, checked against which thresholds.
struct Reclaim<'a> {
    signal: Signal,
    layout: FsLayout,
    thresholds: &'a [Threshold],
    hugepages_bytes: u64,
}

/// Node-level reclaim for a disk signal, as `reclaimNodeLevelResources`:
/// what [`node_reclaim`] names for the signal in the layout, dead
/// containers (those of finished pods too,
/// [`Pods::delete_all_unused_containers`]), then every unused image
/// ([`Images::delete_unused_images`]); true when fresh stats then meet no
/// threshold, minimum reclaim included, so no pod need go.
async fn reclaim_node_level(
    r: &Reclaim<'_>,
    stats: &crate::stats::Provider,
    pods: &impl Pods,
    images: &impl Images,
) -> bool {
    let (containers, unused_images) = node_reclaim(r.signal, r.layout);
    if containers {
        match pods.delete_all_unused_containers().await {
            Ok(done) => debug!(?done, "eviction manager: containers reclaimed"),
            Err(e) => warn!(error = %e, "eviction manager: delete unused containers"),
        }
    }
    if unused_images {
        match images.delete_unused_images().await {
            Ok(freed) => info!(bytes = freed, "eviction manager: unused images deleted"),
            Err(e) => warn!(error = %e, "eviction manager: delete unused images"),
        }
    }
    let Ok(summary) = stats.summary(false).await else {
        return false;
    };
    let observations = observe(&summary, r.hugepages_bytes);
    met(r.thresholds, &observations, r.thresholds).is_empty()
}

/// Waits until the `evicted` pods (UID, grace period in seconds) have
/// finished: no container running and their volumes torn down
/// ([`Pods::pod_cleaned_up`], the kubelet's `podResourcesAreReclaimed`),
/// polling every second for at most 30 s past the longest grace period, as
/// the kubelet waits for the kill and then for `PodIsFinished` before its
/// next cycle: the next decision sees what the eviction freed, and no second
/// pod goes for what the first still holds.
async fn wait_for_cleanup(pods: &impl Pods, evicted: &[(String, i64)]) {
    let grace = evicted
        .iter()
        .map(|(_, g)| *g)
        .max()
        .unwrap_or(0)
        .clamp(0, 3600);
    let deadline = Instant::now() + CLEANUP_TIMEOUT + Duration::from_secs(grace.unsigned_abs());
    for (uid, _) in evicted {
        loop {
            if pods.pod_cleaned_up(uid).await || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Evicts `pod` with `text`, its containers stopped with `grace` seconds,
/// as the kubelet's `evictPod`: an `Evicted` event (with `annotations`),
/// then the pod killed with the eviction's record ([`Pods::kill_pod`]),
/// whose evicting status carries the `DisruptionTarget` condition when
/// `disruption`. Critical pods never get here ([`is_critical`]).
async fn evict(
    recorder: &Recorder,
    pods: &impl Pods,
    pod: &Pod,
    text: String,
    annotations: BTreeMap<String, String>,
    disruption: bool,
    grace: i64,
) {
    info!(
        pod = %format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or_default(), pod.metadata.name.as_deref().unwrap_or_default()),
        message = text,
        "evicting pod"
    );
    publish_annotated(
        recorder,
        pod,
        EventType::Warning,
        crate::reasons::pod::EVICTED,
        text.clone(),
        annotations,
    );
    let eviction = Eviction {
        reason: crate::reasons::pod::EVICTED,
        message: text,
        disruption,
        grace,
        at: Timestamp::now(),
    };
    if let Err(e) = pods.kill_pod(pod, eviction).await {
        warn!(error = %e, "eviction manager: status of the evicted pod");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::container_gc::Collected;

    /// The pod side as the manager sees it: what it was asked, nothing more.
    #[derive(Default)]
    struct FakePods {
        killed: Mutex<Vec<(String, Eviction)>>,
        asked: Mutex<Vec<String>>,
        reclaimed: Mutex<Vec<&'static str>>,
    }

    impl Images for FakePods {
        async fn delete_unused_images(&self) -> Result<u64, String> {
            self.reclaimed.lock().unwrap().push("images");
            Ok(0)
        }
    }

    impl Pods for FakePods {
        fn active_pods(&self) -> Vec<Arc<Pod>> {
            Vec::new()
        }

        async fn kill_pod(&self, pod: &Pod, eviction: Eviction) -> Result<(), kube::Error> {
            let name = pod.metadata.name.clone().unwrap_or_default();
            self.killed.lock().unwrap().push((name, eviction));
            Ok(())
        }

        async fn pod_cleaned_up(&self, uid: &str) -> bool {
            self.asked.lock().unwrap().push(uid.to_string());
            true
        }

        async fn delete_all_unused_containers(&self) -> crate::cri::Result<Collected> {
            self.reclaimed.lock().unwrap().push("containers");
            Ok(Collected::default())
        }
    }

    /// The node-level reclaim asks the pods and images for what the
    /// signal's filesystem holds, as [`node_reclaim`] says, containers
    /// first; without fresh stats it reports that pods must still go.
    #[tokio::test]
    async fn node_level_reclaim_asks_for_what_the_layout_puts_on_the_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = crate::cri::Runtime::connect_lazy(
            &format!("unix://{}", dir.path().join("none.sock").display()),
            Duration::from_secs(1),
        )
        .unwrap();
        let stats = Provider::new("n1", runtime, dir.path().into(), dir.path().join("logs"));
        for (signal, layout, want) in [
            (
                Signal::NodefsAvailable,
                FsLayout::Shared,
                &["containers", "images"][..],
            ),
            (Signal::NodefsAvailable, FsLayout::DedicatedImageFs, &[]),
            (
                Signal::ImagefsInodesFree,
                FsLayout::DedicatedImageFs,
                &["containers", "images"],
            ),
            (Signal::ImagefsAvailable, FsLayout::Split, &["images"]),
            (
                Signal::ContainerfsAvailable,
                FsLayout::Split,
                &["containers"],
            ),
        ] {
            let pods = FakePods::default();
            let r = Reclaim {
                signal,
                layout,
                thresholds: &[],
                hugepages_bytes: 0,
            };
            assert!(!reclaim_node_level(&r, &stats, &pods, &pods).await);
            assert_eq!(
                *pods.reclaimed.lock().unwrap(),
                want,
                "{signal:?} {layout:?}"
            );
        }
    }

    #[tokio::test]
    async fn an_evicted_pod_gets_an_event_is_killed_with_its_record_and_is_waited_for() {
        let api = crate::fake_api::FakeApi::default();
        let recorder = Recorder::new(api.client(), "node-1".into());
        let pods = FakePods::default();
        let web = crate::fixtures::pod("web")
            .container("c", "busybox")
            .build();
        let text = "The node was low on resource: memory. ".to_string();
        evict(
            &recorder,
            &pods,
            &web,
            text.clone(),
            BTreeMap::new(),
            true,
            7,
        )
        .await;
        let killed = pods.killed.lock().unwrap().clone();
        let [(name, eviction)] = killed.as_slice() else {
            panic!("one pod killed: {killed:?}");
        };
        assert_eq!(
            (
                name.as_str(),
                eviction.message.as_str(),
                eviction.disruption,
                eviction.grace
            ),
            ("web", text.as_str(), true, 7)
        );
        let mut seen = false;
        for _ in 0..100 {
            seen = api
                .events()
                .iter()
                .any(|(reason, message)| reason == "Evicted" && *message == text);
            if seen {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(seen, "an Evicted event: {:?}", api.events());
        wait_for_cleanup(&pods, &[("uid-web".into(), 7)]).await;
        assert_eq!(*pods.asked.lock().unwrap(), ["uid-web"]);
    }
}
