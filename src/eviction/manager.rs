//! The eviction manager's loop, as the kubelet's `managerImpl.synchronize`
//! every 10 s: it observes the signals from the stats summary, publishes the
//! node's pressure conditions (for node status and admission), and when a
//! threshold is due, reports `EvictionThresholdMet` on the Node, reclaims
//! at node level first for a disk signal (dead containers, also those of
//! finished pods, then every unused image, as `buildSignalToNodeReclaimFuncs`
//! on one filesystem) and stops there when no threshold is met any more
//! (minimum reclaim included), else evicts the first pod of the ranking.
//! An evicted pod is recorded for its pod worker, which stops it, gets an
//! `Evicted` event and the evicting status
//! ([`crate::pod_core::status::evicting`]); the manager waits for its containers
//! to stop before the next cycle. At most one pod per cycle for a
//! threshold; before thresholds, every pod over a local storage limit goes
//! ([`super::local_storage_violation`]), with or without thresholds.
//! Critical pods (static pods, and priority at least 2000000000) are never evicted.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::{Pressure, State, Threshold, message, met, observe, rank};
use crate::events::{EventType, publish_annotated, publish_node};
use crate::pod::worker::Context;
use crate::pod_core::spec::is_terminal;
use crate::stats::Provider;

/// How long the manager waits for an evicted pod's containers to stop past
/// its grace period (the kubelet's `podCleanupTimeout`).
pub const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How often the manager looks (the kubelet's `evictionMonitoringPeriod`).
pub const MONITORING_PERIOD: Duration = Duration::from_secs(10);

/// The lowest priority of a critical pod (`SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The manager's configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The node's name (for its events).
    pub node_name: String,
    /// The thresholds ([`super::thresholds`]).
    pub thresholds: Vec<Threshold>,
    /// `evictionPressureTransitionPeriod`.
    pub transition: Duration,
    /// The huge page pools' bytes, which memory cannot give back, when the
    /// node's memory stats count them as available (0 when they do not:
    /// [`crate::stats::Provider::node_memory_counts_hugepages`]).
    pub hugepages_bytes: u64,
    /// The container GC policy node-level reclaim applies.
    pub container_gc: crate::container_gc::Policy,
    /// `evictionMaxPodGracePeriod`, seconds.
    pub max_pod_grace: i64,
}

/// True for a pod the manager never evicts and never refuses, as the
/// kubelet's `IsCriticalPod`: a static pod, a mirror pod, or one of
/// priority at least [`SYSTEM_CRITICAL_PRIORITY`].
#[must_use]
pub fn is_critical(pod: &Pod) -> bool {
    crate::static_pod::is_static(pod)
        || crate::static_pod::is_mirror(pod)
        || pod
            .spec
            .as_ref()
            .and_then(|s| s.priority)
            .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY)
}

/// Runs the manager forever; `pressures` carries the conditions to report.
pub async fn run(
    cfg: Config,
    stats: Arc<Provider>,
    ctx: Arc<Context>,
    image_gc: Arc<crate::image_gc::ImageGc>,
    pressures: watch::Sender<Vec<Pressure>>,
) {
    // With no thresholds the loop still enforces local storage limits
    // (`localStorageCapacityIsolation`, on by default).
    let started = Instant::now();
    let mut state = State::default();
    let mut tick = tokio::time::interval(MONITORING_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let summary = match stats.summary(false).await {
            Ok(s) => s,
            Err(e) => {
                debug!(error = %e, "eviction manager: no stats");
                continue;
            }
        };
        let observations = observe(&summary, cfg.hugepages_bytes);
        let cycle = state.cycle(
            started.elapsed(),
            &cfg.thresholds,
            &observations,
            cfg.transition,
        );
        pressures.send_if_modified(|p| {
            let changed = *p != cycle.pressures;
            if changed {
                info!(pressures = ?cycle.pressures, "node pressure changed");
                p.clone_from(&cycle.pressures);
            }
            changed
        });
        let bound = ctx.runtime.pods.state();
        let active: Vec<&Pod> = bound
            .iter()
            .map(AsRef::as_ref)
            .filter(|p| {
                !is_terminal(p)
                    && !is_critical(p)
                    && p.metadata.deletion_timestamp.is_none()
                    && !crate::pod_core::spec::is_evicted(p)
                    && ctx
                        .eviction(p.metadata.uid.as_deref().unwrap_or_default())
                        .is_none()
            })
            .collect();
        let mut evicted: Vec<(String, i64)> = Vec::new();
        // Local storage limits first (`localStorageEviction`): every pod over
        // one goes, and then the cycle ends.
        for p in &active {
            let uid = p.metadata.uid.as_deref().unwrap_or_default();
            let Some(stats) = summary.pods.iter().find(|s| s.pod_ref.uid == uid) else {
                continue;
            };
            if let Some(text) = super::local_storage_violation(p, stats) {
                let grace = crate::pod_core::spec::EVICTION_GRACE_SECONDS;
                evict(&ctx, p, text, BTreeMap::new(), false, grace).await;
                evicted.push((uid.to_string(), grace));
            }
        }
        if !evicted.is_empty() {
            wait_for_cleanup(&ctx, &evicted).await;
            continue;
        }
        let Some(threshold) = cycle.reclaim else {
            continue;
        };
        let resource = threshold.signal.resource();
        publish_node(
            &ctx.runtime.recorder,
            &cfg.node_name,
            EventType::Warning,
            crate::reasons::event::EVICTION_THRESHOLD_MET,
            format!("Attempting to reclaim {resource}"),
        );
        if threshold.signal.pressure() == Pressure::Disk
            && reclaim_node_level(&cfg, &stats, &ctx, &image_gc).await
        {
            continue;
        }
        let Some(victim) = rank(threshold.signal, &active, &summary).first().copied() else {
            warn!(resource, "eviction manager: no pod to evict");
            continue;
        };
        let (text, annotations) = message(
            &threshold,
            observations.get(&threshold.signal),
            victim,
            &summary,
        );
        let grace = super::grace_period(&threshold, cfg.max_pod_grace, victim);
        evict(&ctx, victim, text, annotations, true, grace).await;
        let uid = victim.metadata.uid.clone().unwrap_or_default();
        wait_for_cleanup(&ctx, &[(uid, grace)]).await;
    }
}

/// Node-level reclaim for a disk signal, as `reclaimNodeLevelResources`:
/// dead containers (those of finished pods too, as
/// `DeleteAllUnusedContainers`), then every unused image; true when fresh
/// stats then meet no threshold, minimum reclaim included, so no pod need go.
async fn reclaim_node_level(
    cfg: &Config,
    stats: &crate::stats::Provider,
    ctx: &Context,
    image_gc: &crate::image_gc::ImageGc,
) -> bool {
    match crate::pod::housekeeping::collect_containers(ctx, cfg.container_gc, true).await {
        Ok(done) => debug!(?done, "eviction manager: containers reclaimed"),
        Err(e) => warn!(error = %e, "eviction manager: delete unused containers"),
    }
    match image_gc.delete_unused().await {
        Ok(freed) => info!(bytes = freed, "eviction manager: unused images deleted"),
        Err(e) => warn!(error = %e, "eviction manager: delete unused images"),
    }
    let Ok(summary) = stats.summary(false).await else {
        return false;
    };
    let observations = observe(&summary, cfg.hugepages_bytes);
    met(&cfg.thresholds, &observations, &cfg.thresholds).is_empty()
}

/// Waits until the `evicted` pods (UID, grace period in seconds) have
/// finished: no container running and their volumes torn down (the
/// kubelet's `podResourcesAreReclaimed`), polling every second for at most
/// 30 s past the longest grace period, as the kubelet waits for the kill and
/// then for `PodIsFinished` before its next cycle: the next decision sees
/// what the eviction freed, and no second pod goes for what the first still
/// holds.
async fn wait_for_cleanup(ctx: &Context, evicted: &[(String, i64)]) {
    let grace = evicted
        .iter()
        .map(|(_, g)| *g)
        .max()
        .unwrap_or(0)
        .clamp(0, 3600);
    let deadline = Instant::now() + CLEANUP_TIMEOUT + Duration::from_secs(grace.unsigned_abs());
    for (uid, _) in evicted {
        let by_uid = std::collections::HashMap::from([(
            crate::labels::POD_UID_LABEL.to_string(),
            uid.clone(),
        )]);
        loop {
            let running = match ctx.runtime.runtime.list_containers(by_uid.clone()).await {
                Ok(cs) => cs
                    .iter()
                    .any(|c| c.state == k8s_cri::v1::ContainerState::ContainerRunning as i32),
                Err(e) => {
                    debug!(error = %e, "eviction manager: containers of an evicted pod");
                    true
                }
            };
            let finished = !running && !ctx.volumes.volumes_exist(uid);
            if finished || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// Evicts `pod` with `text`, its containers stopped with `grace` seconds:
/// the eviction recorded for the pod worker ([`Context::record_eviction`]),
/// an `Evicted` event, and the evicting status (with the `DisruptionTarget`
/// condition when `disruption`), written over the status last reported so
/// it keeps the newest one.
async fn evict(
    ctx: &Context,
    pod: &Pod,
    text: String,
    annotations: BTreeMap<String, String>,
    disruption: bool,
    grace: i64,
) {
    let pod = ctx.status.with_sent_status(Arc::new(pod.clone()));
    let pod = pod.as_ref();
    info!(
        pod = %format!("{}/{}", pod.metadata.namespace.as_deref().unwrap_or_default(), pod.metadata.name.as_deref().unwrap_or_default()),
        message = text,
        "evicting pod"
    );
    publish_annotated(
        &ctx.runtime.recorder,
        pod,
        EventType::Warning,
        crate::reasons::pod::EVICTED,
        text.clone(),
        annotations,
    );
    let now = Timestamp::now();
    if let Some(uid) = pod.metadata.uid.as_deref() {
        let eviction = crate::pod::worker::Eviction {
            message: text.clone(),
            disruption,
            grace,
            at: now,
        };
        ctx.record_eviction(uid, eviction);
    }
    let status = crate::pod_core::status::evicting(pod, &text, disruption, now);
    if let Err(e) = ctx.status.set_status(pod, status).await {
        warn!(error = %e, "eviction manager: status of the evicted pod");
    }
}
