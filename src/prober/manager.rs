//! Probe workers: one tokio task per (container, probe kind), started when a
//! container with probes runs and stopped when it stops (the kubelet's
//! prober_manager.go and worker.go). Results are shared with the pod worker;
//! a changed result requeues the pod.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use crate::events::{EventType, Recorder};
use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::Notify;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use super::run::probe_once;
use super::{ContainerProbes, ProbeKind, ProbeState, Timing};
use crate::cri::Runtime;
use crate::pod_core::runtime::{ContainerState, PodRuntime};
use crate::reasons::event;

type Key = (String, ProbeKind);

/// The probe manager: workers and their results, keyed by container ID.
pub struct Manager {
    runtime: Runtime,
    recorder: Recorder,
    requeue: UnboundedSender<ObjectRef<Pod>>,
    results: Arc<Mutex<HashMap<Key, ProbeState>>>,
    workers: Mutex<HashMap<String, HashMap<Key, JoinHandle<()>>>>,
    /// Container ID → the trigger that runs its readiness probe at once (the
    /// kubelet's `manualTriggerCh`): pulled when its startup probe passes.
    triggers: Mutex<HashMap<String, Arc<Notify>>>,
    /// Containers started before this are adopted ([`RESTART_GRACE`]
    /// before the manager was made).
    adopted_before: Timestamp,
}

/// How long before the agent's start a container must have started to count
/// as running from before a restart (the kubelet's
/// `kubeletRestartGracePeriod`, 10 s).
pub const RESTART_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Drops the triggers of containers that have no worker left.
fn prune_triggers(
    triggers: &mut HashMap<String, Arc<Notify>>,
    workers: &HashMap<String, HashMap<Key, JoinHandle<()>>>,
) {
    triggers.retain(|id, _| {
        workers
            .values()
            .any(|pod| pod.keys().any(|(cid, _)| cid == id))
    });
}

fn probe_of(c: &Container, kind: ProbeKind) -> Option<&Probe> {
    match kind {
        ProbeKind::Startup => c.startup_probe.as_ref(),
        ProbeKind::Liveness => c.liveness_probe.as_ref(),
        ProbeKind::Readiness => c.readiness_probe.as_ref(),
    }
}

fn all_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
    })
}

impl Manager {
    /// A manager probing through `runtime`, reporting `Unhealthy` events to
    /// `recorder` and pods to resync to `requeue`.
    #[must_use]
    pub fn new(
        runtime: Runtime,
        recorder: Recorder,
        requeue: UnboundedSender<ObjectRef<Pod>>,
    ) -> Self {
        Self {
            runtime,
            recorder,
            requeue,
            results: Arc::default(),
            workers: Mutex::default(),
            triggers: Mutex::default(),
            adopted_before: Timestamp::now()
                .checked_sub(RESTART_GRACE)
                .unwrap_or(Timestamp::UNIX_EPOCH),
        }
    }

    /// Starts workers for the pod's running containers that have probes and
    /// stops the workers of containers that no longer run. Once the pod is
    /// being deleted its liveness and startup probes stop and count as passed,
    /// readiness probes go on (the kubelet's worker `doProbe` on a pod with a
    /// deletion timestamp).
    pub fn sync(&self, pod: &Pod, rt: &PodRuntime) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let terminating = pod.metadata.deletion_timestamp.is_some();
        let running: HashMap<&str, &crate::pod_core::runtime::Container> = rt
            .containers
            .iter()
            .filter(|c| c.state == ContainerState::Running)
            .map(|c| (c.name.as_str(), c))
            .collect();
        let pod_ip = rt
            .latest_sandbox()
            .and_then(|s| s.ips.first())
            .and_then(|ip| ip.parse::<IpAddr>().ok());
        let mut workers = self.workers.lock().unwrap_or_else(PoisonError::into_inner);
        let pod_workers = workers.entry(uid.clone()).or_default();
        let mut wanted: Vec<Key> = Vec::new();
        for c in all_containers(pod) {
            let Some(rc) = running.get(c.name.as_str()) else {
                continue;
            };
            for kind in [
                ProbeKind::Startup,
                ProbeKind::Liveness,
                ProbeKind::Readiness,
            ] {
                let Some(probe) = probe_of(c, kind) else {
                    continue;
                };
                if terminating && kind != ProbeKind::Readiness {
                    continue;
                }
                let key = (rc.id.clone(), kind);
                wanted.push(key.clone());
                if pod_workers.contains_key(&key) {
                    continue;
                }
                let trigger = self
                    .triggers
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(rc.id.clone())
                    .or_default()
                    .clone();
                let worker = Worker {
                    // Taken now, before an old worker of the same series
                    // (the container's previous instance) is stopped below.
                    _series: SeriesGuard::new(series_labels(kind, pod, c, "")),
                    trigger,
                    runtime: self.runtime.clone(),
                    recorder: self.recorder.clone(),
                    requeue: self.requeue.clone(),
                    results: self.results.clone(),
                    pod: pod.clone(),
                    container: c.clone(),
                    container_id: rc.id.clone(),
                    started: rc.started_at.unwrap_or(rc.created_at),
                    has_startup: c.startup_probe.is_some(),
                    kind,
                    probe: probe.clone(),
                    pod_ip,
                };
                // Running since before the agent started: no initial result,
                // so a restart does not turn a ready container unready.
                let adopted = rc.started_at.is_some_and(|at| at < self.adopted_before);
                let state = if adopted {
                    ProbeState::adopted(kind)
                } else {
                    ProbeState::new(kind)
                };
                self.results
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(key.clone(), state);
                pod_workers.insert(key, tokio::spawn(worker.run()));
            }
        }
        let stale: Vec<Key> = pod_workers
            .keys()
            .filter(|k| !wanted.contains(k))
            .cloned()
            .collect();
        let mut results = self.results.lock().unwrap_or_else(PoisonError::into_inner);
        for key in stale {
            if let Some(h) = pod_workers.remove(&key) {
                h.abort();
            }
            results.remove(&key);
        }
        if pod_workers.is_empty() {
            workers.remove(&uid);
        }
        prune_triggers(
            &mut self.triggers.lock().unwrap_or_else(PoisonError::into_inner),
            &workers,
        );
    }

    /// The UIDs of the pods that have probe workers.
    #[must_use]
    pub fn pods(&self) -> Vec<String> {
        let workers = self.workers.lock().unwrap_or_else(PoisonError::into_inner);
        workers.keys().cloned().collect()
    }

    /// Stops every worker of the pod with `uid`.
    pub fn forget(&self, uid: &str) {
        let mut workers = self.workers.lock().unwrap_or_else(PoisonError::into_inner);
        let mut results = self.results.lock().unwrap_or_else(PoisonError::into_inner);
        for (key, h) in workers.remove(uid).unwrap_or_default() {
            h.abort();
            results.remove(&key);
        }
        prune_triggers(
            &mut self.triggers.lock().unwrap_or_else(PoisonError::into_inner),
            &workers,
        );
        crate::metrics::metrics().forget_probes(uid);
    }

    /// What the probes say about each running container of the pod, by name
    /// (liveness and startup pass once the pod is being deleted).
    #[must_use]
    pub fn results(&self, pod: &Pod, rt: &PodRuntime) -> BTreeMap<String, ContainerProbes> {
        let terminating = pod.metadata.deletion_timestamp.is_some();
        let results = self.results.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = BTreeMap::new();
        for c in all_containers(pod) {
            let Some(rc) = rt
                .containers
                .iter()
                .find(|x| x.name == c.name && x.state == ContainerState::Running)
            else {
                continue;
            };
            // An adopted container's probe without a result yet keeps what
            // the pod last reported of it: started as it was, ready while the
            // pod was Ready (the kubelet's `isContainerStarted` and
            // `setReadyStateOnKubeletRestart`).
            let previous = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .into_iter()
                .chain(
                    pod.status
                        .as_ref()
                        .and_then(|s| s.init_container_statuses.as_ref()),
                )
                .flatten()
                .find(|s| s.name == c.name);
            let pod_ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|x| x.type_ == crate::reasons::condition::READY && x.status == "True")
                });
            let get = |kind| {
                probe_of(c, kind).map(|_| {
                    if terminating && kind != ProbeKind::Readiness {
                        // Turned off while the pod terminates: passed.
                        return Some(true);
                    }
                    match results.get(&(rc.id.clone(), kind)) {
                        Some(s) if s.adopted && s.result.is_none() => match kind {
                            // Started as reported, else unknown (not failed).
                            ProbeKind::Startup => previous
                                .is_some_and(|p| p.started == Some(true))
                                .then_some(true),
                            _ => Some(pod_ready),
                        },
                        Some(s) => s.result,
                        None => super::initial_result(kind),
                    }
                })
            };
            let startup = get(ProbeKind::Startup);
            let liveness = get(ProbeKind::Liveness);
            let readiness = get(ProbeKind::Readiness);
            let started = startup.is_none_or(|r| r == Some(true));
            let failed = if startup == Some(Some(false)) {
                Some(ProbeKind::Startup)
            } else if liveness == Some(Some(false)) {
                Some(ProbeKind::Liveness)
            } else {
                None
            };
            out.insert(
                c.name.clone(),
                ContainerProbes {
                    ready: started && readiness.is_none_or(|r| r == Some(true)),
                    started,
                    failed,
                },
            );
        }
        out
    }
}

/// The labels of the `prober_probe_total` series of probe `kind` of
/// container `c` of `pod` with `result`.
fn series_labels(
    kind: ProbeKind,
    pod: &Pod,
    c: &Container,
    result: &str,
) -> crate::metrics::ProbeLabels {
    crate::metrics::ProbeLabels {
        probe_type: kind.name().to_string(),
        result: result.to_string(),
        container: c.name.clone(),
        pod: pod.metadata.name.clone().unwrap_or_default(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
    }
}

/// One probe of one container.
struct Worker {
    /// Its series go when the worker does.
    _series: SeriesGuard,
    /// Shared by the container's workers: the startup worker pulls it when the
    /// startup probe passes, the readiness worker then probes at once.
    trigger: Arc<Notify>,
    runtime: Runtime,
    recorder: Recorder,
    requeue: UnboundedSender<ObjectRef<Pod>>,
    results: Arc<Mutex<HashMap<Key, ProbeState>>>,
    pod: Pod,
    container: Container,
    container_id: String,
    started: Timestamp,
    has_startup: bool,
    kind: ProbeKind,
    probe: Probe,
    pod_ip: Option<IpAddr>,
}

impl Worker {
    /// Publishes a Warning event about the probed container.
    fn warn(&self, reason: &str, note: String) {
        crate::events::publish(
            &self.recorder,
            &self.pod,
            Some(&self.container.name),
            EventType::Warning,
            reason,
            note,
        );
    }

    fn key(&self) -> Key {
        (self.container_id.clone(), self.kind)
    }

    fn startup_passed(&self) -> bool {
        !self.has_startup
            || self
                .results
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&(self.container_id.clone(), ProbeKind::Startup))
                .is_some_and(|s| s.result == Some(true))
    }

    /// The labels of this worker's `prober_probe_total` series with `result`.
    fn labels(&self, result: &str) -> crate::metrics::ProbeLabels {
        series_labels(self.kind, &self.pod, &self.container, result)
    }

    /// Probes until stopped (its task aborted by the manager). A worker whose
    /// probe is done (a passed startup probe, a failed liveness or startup
    /// probe) stays, idle, until its container goes, as the kubelet's worker
    /// stays on hold; when it is stopped, its series leave
    /// `prober_probe_total`, as the kubelet's worker deletes its metrics on
    /// the way out.
    async fn run(self) {
        if self.probe().await {
            std::future::pending::<()>().await;
        }
    }

    /// The probe loop; true when the probe is done, false when the pod
    /// worker has gone (the agent stops).
    async fn probe(&self) -> bool {
        let timing = Timing::of(&self.probe);
        let mut tick = tokio::time::interval(timing.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let readiness = self.kind == ProbeKind::Readiness;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = self.trigger.notified(), if readiness => {}
            }
            if !ProbeState::due(&timing, self.started, Timestamp::now()) {
                continue;
            }
            if self.kind != ProbeKind::Startup && !self.startup_passed() {
                continue;
            }
            let outcome = probe_once(
                &self.runtime,
                &self.probe,
                &self.container,
                &self.container_id,
                self.pod_ip,
                timing.timeout,
            )
            .await;
            if outcome.errored {
                // The probe could not run (the runtime failed the call): the
                // result is thrown away, as the kubelet's worker does; it
                // neither counts toward a threshold nor in the metrics.
                self.warn(
                    event::UNHEALTHY,
                    format!(
                        "{} probe errored and resulted in unknown state: {}",
                        self.kind.name(),
                        outcome.output.trim_end()
                    ),
                );
                continue;
            }
            let result = if outcome.ok { "successful" } else { "failed" };
            crate::metrics::metrics().record_probe(self.labels(result));
            if outcome.warning {
                self.warn(
                    event::PROBE_WARNING,
                    format!("{} probe warning: {}", self.kind.name(), outcome.output),
                );
            }
            if !outcome.ok {
                self.warn(
                    event::UNHEALTHY,
                    format!(
                        "{} probe failed: {}",
                        self.kind.name(),
                        outcome.output.trim_end()
                    ),
                );
            }
            let (changed, result) = {
                let mut results = self.results.lock().unwrap_or_else(PoisonError::into_inner);
                let state = results
                    .entry(self.key())
                    .or_insert_with(|| ProbeState::new(self.kind));
                (state.record(outcome.ok, &timing), state.result)
            };
            if changed && self.kind == ProbeKind::Startup && result == Some(true) {
                // As the kubelet: readiness is probed as soon as startup passes,
                // not a whole readiness period later.
                self.trigger.notify_one();
            }
            if changed {
                let ns = self.pod.metadata.namespace.clone().unwrap_or_default();
                let name = self.pod.metadata.name.clone().unwrap_or_default();
                if self
                    .requeue
                    .send(ObjectRef::new(&name).within(&ns))
                    .is_err()
                {
                    return false;
                }
            }
            // A failed liveness or startup probe ends with the container; a passed
            // startup probe is not run again.
            let done = match self.kind {
                ProbeKind::Startup => result.is_some(),
                ProbeKind::Liveness => result == Some(false),
                ProbeKind::Readiness => false,
            };
            if done {
                return true;
            }
        }
    }
}

/// Removes a worker's `prober_probe_total` series (every result) when the
/// worker ends, however it ends: its task returns or is aborted. Recording
/// happens only inside the task, so nothing is recorded after this. The
/// series stay while another worker has them (a restarted container's).
struct SeriesGuard(crate::metrics::ProbeLabels);

impl SeriesGuard {
    fn new(labels: crate::metrics::ProbeLabels) -> Self {
        crate::metrics::metrics().probe_worker_started(&labels);
        Self(labels)
    }
}

impl Drop for SeriesGuard {
    fn drop(&mut self) {
        crate::metrics::metrics().probe_worker_stopped(&self.0);
    }
}
