//! The node shutdown manager's loop, as the kubelet's `managerImpl`
//! (`nodeshutdown_manager_linux.go`): at start it makes sure logind grants
//! inhibitors the whole grace period (raising `InhibitDelayMaxSec` with a
//! drop-in and a reload when it does not, then reading it back at most five
//! times, 100 ms doubling), takes the delay inhibitor lock and watches for
//! `PrepareForShutdown`. On `true` it says so in a `NodeShutdown` event on
//! the Node, marks the node as shutting down (node status reports Ready
//! false, admission refuses new pods), stops the active pods group by
//! group, lowest priority first ([`super::plan`]), each group until its
//! pods are cleaned up or its period has passed, and releases the lock so
//! the shutdown goes on. On `false` (cancelled) it says so, clears the
//! mark and takes the lock again. When the bus connection ends it starts
//! over after a second. A host without logind (or without a bus) is said
//! once, and the agent runs without graceful shutdown, as the kubelet does.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tracing::{info, warn};

use super::logind::{self, InhibitLock, Logind};
use super::plan::{self, PriorityPeriod};
use crate::events::{EventType, Recorder, publish_node};
use crate::eviction::{Eviction, Pods};
use crate::reasons::pod::{NODE_SHUTDOWN, NODE_SHUTDOWN_MESSAGE};

/// How long after the bus connection ended the manager starts over (the
/// kubelet's `dbusReconnectPeriod`).
pub const RECONNECT_PERIOD: Duration = Duration::from_secs(1);
/// How often a group's pods are looked at while the manager waits for them.
const CLEANUP_POLL: Duration = Duration::from_millis(500);
/// The event reason on the Node (the kubelet's `NodeShutdown`).
pub const NODE_SHUTDOWN_EVENT: &str = "NodeShutdown";

/// The manager's configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The node's name (for its events).
    pub node_name: String,
    /// The groups ([`plan::periods`]), not empty.
    pub periods: Vec<PriorityPeriod>,
    /// Where logind's drop-ins go ([`logind::DROP_IN_DIR`]).
    pub drop_in_dir: PathBuf,
    /// The bus (None: the system bus).
    pub bus_address: Option<String>,
    /// Where the last shutdown's start and end are kept
    /// (`<root-dir>/graceful_node_shutdown_state`, [`STATE_FILE`]); None:
    /// nowhere.
    pub state_file: Option<PathBuf>,
}

/// The file name of the shutdown state in the root directory (the
/// kubelet's `localStorageStateFile`).
pub const STATE_FILE: &str = "graceful_node_shutdown_state";

/// The last shutdown's start and end (the kubelet's `state`), RFC 3339.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    /// When it began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Timestamp>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Timestamp>,
}

/// Sets `kubelet_graceful_shutdown_{start,end}_time_seconds` from `state`.
fn set_metrics(state: &State) {
    let m = crate::metrics::metrics();
    let secs = |t: Option<Timestamp>| t.map_or(0.0, |t| t.as_millisecond() as f64 / 1000.0);
    m.graceful_shutdown_start_time
        .set(secs(state.start_time).trunc());
    m.graceful_shutdown_end_time
        .set(secs(state.end_time).trunc());
}

/// The state kept at `path` (none when missing or unreadable: logged).
fn load_state(path: &Path) -> State {
    match std::fs::read(path) {
        Ok(bytes) if bytes.len() <= 4096 => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
            warn!(error = %e, "Failed to load graceful shutdown state");
            State::default()
        }),
        Ok(_) => {
            warn!("Failed to load graceful shutdown state: larger than 4 KiB");
            State::default()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::default(),
        Err(e) => {
            warn!(error = %e, "Failed to load graceful shutdown state");
            State::default()
        }
    }
}

/// Keeps `state` at `path`, atomically (the kubelet's mode 0644); a
/// failure is logged.
fn store_state(path: &Path, state: &State) {
    let written = serde_json::to_string(state)
        .map_err(std::io::Error::other)
        .and_then(|text| crate::certificate::write_private(path, &text, 0o644));
    if let Err(e) = written {
        warn!(error = %e, "Failed to store graceful shutdown state");
    }
}

/// Runs the manager until the bus cannot be reached at start (said once,
/// as the kubelet's "Failed to start node shutdown manager"), else
/// forever: `pods` are stopped through the eviction seams, `recorder`
/// tells the Node's events, `shutting_down` carries the mark.
pub async fn run<P: Pods>(
    cfg: Config,
    pods: Arc<P>,
    recorder: Recorder,
    shutting_down: watch::Sender<bool>,
) {
    if let Some(path) = &cfg.state_file {
        set_metrics(&load_state(path));
    }
    let mut logind = match start(&cfg).await {
        Ok(l) => l,
        Err(e) => {
            warn!(error = %e, "Failed to start node shutdown manager: graceful node shutdown is off");
            return;
        }
    };
    loop {
        if let Err(e) = watch(&cfg, &logind, &*pods, &recorder, &shutting_down).await {
            warn!(error = %e, "Unable to watch the node for shutdown events");
        }
        tokio::time::sleep(RECONNECT_PERIOD).await;
        info!("Restarting watch for node shutdown events");
        match start(&cfg).await {
            Ok(l) => logind = l,
            Err(e) => warn!(error = %e, "Unable to watch the node for shutdown events"),
        }
    }
}

/// Connects and makes sure logind's `InhibitDelayMaxSec` covers the
/// grace period (the kubelet's `start` before it takes the lock).
async fn start(cfg: &Config) -> Result<Logind, String> {
    let logind = Logind::connect(cfg.bus_address.as_deref())
        .await
        .map_err(|e| e.to_string())?;
    let current = logind
        .inhibit_delay_max()
        .await
        .map_err(|e| e.to_string())?;
    let requested = plan::period_requested(&cfg.periods);
    if requested <= current {
        return Ok(logind);
    }
    logind::override_inhibit_delay(&cfg.drop_in_dir, requested)
        .map_err(|e| format!("unable to override inhibit delay by shutdown manager: {e}"))?;
    logind.reload().await.map_err(|e| e.to_string())?;
    let mut wait = Duration::from_millis(100);
    let mut updated = current;
    for attempt in 1..=5 {
        updated = logind
            .inhibit_delay_max()
            .await
            .map_err(|e| e.to_string())?;
        if requested <= updated {
            return Ok(logind);
        }
        if attempt < 5 {
            tokio::time::sleep(wait).await;
            wait = wait.saturating_mul(2);
        }
    }
    Err(format!(
        "node shutdown manager was timed out after 5 attempts waiting for logind InhibitDelayMaxSec to update to {} (ShutdownGracePeriod), current value is {}",
        crate::config::go_duration(requested),
        crate::config::go_duration(updated)
    ))
}

/// Takes the lock and handles `PrepareForShutdown` until the connection
/// ends.
async fn watch<P: Pods>(
    cfg: &Config,
    logind: &Logind,
    pods: &P,
    recorder: &Recorder,
    shutting_down: &watch::Sender<bool>,
) -> Result<(), String> {
    let mut lock: Option<InhibitLock> =
        Some(logind.inhibit_shutdown().await.map_err(|e| e.to_string())?);
    let signals = logind
        .prepare_for_shutdown()
        .await
        .map_err(|e| e.to_string())?;
    let mut signals = std::pin::pin!(signals);
    while let Some(active) = signals.next().await {
        let note = if active {
            "Shutdown manager detected shutdown event"
        } else {
            "Shutdown manager detected shutdown cancellation"
        };
        info!(shutting_down = active, "{note}");
        publish_node(
            recorder,
            &cfg.node_name,
            EventType::Normal,
            NODE_SHUTDOWN_EVENT,
            note.to_string(),
        );
        shutting_down.send_replace(active);
        if active {
            let mut state = State {
                start_time: Some(Timestamp::now()),
                end_time: None,
            };
            set_metrics(&state);
            if let Some(path) = &cfg.state_file {
                store_state(path, &state);
            }
            kill_pods(pods, &cfg.periods).await;
            state.end_time = Some(Timestamp::now());
            set_metrics(&state);
            if let Some(path) = &cfg.state_file {
                store_state(path, &state);
            }
            drop(lock.take());
            info!(
                "Shutdown manager completed processing shutdown event, node will shutdown shortly"
            );
        } else {
            match logind.inhibit_shutdown().await {
                Ok(l) => lock = Some(l),
                Err(e) => warn!(error = %e, "take the inhibitor lock again"),
            }
        }
    }
    Err("Ended to watching the node for shutdown events".into())
}

/// Stops the active pods group by group, lowest priority first: each pod
/// with the `Terminated` status, the kubelet's message and the
/// `DisruptionTarget` condition, and its group's grace period (its own
/// when shorter); the group is waited for until its pods are cleaned up
/// or its period has passed (the kubelet's `killPods`).
pub async fn kill_pods<P: Pods>(pods: &P, periods: &[PriorityPeriod]) {
    let active = pods.active_pods();
    let refs: Vec<&k8s_openapi::api::core::v1::Pod> = active.iter().map(|p| &**p).collect();
    for (period, group) in plan::groups(periods, &refs) {
        if group.is_empty() {
            continue;
        }
        for pod in &group {
            let grace = plan::pod_grace(pod, period.seconds);
            info!(
                pod = pod.metadata.name.as_deref().unwrap_or_default(),
                grace, "Shutdown manager killing pod with gracePeriod"
            );
            let kill = Eviction {
                reason: NODE_SHUTDOWN,
                message: NODE_SHUTDOWN_MESSAGE.into(),
                disruption: true,
                grace,
                at: Timestamp::now(),
            };
            if let Err(e) = pods.kill_pod(pod, kill).await {
                warn!(error = %e, "Shutdown manager failed killing pod");
            }
        }
        // A period from the configuration may be as long as i64 allows:
        // the deadline is then as far as an instant goes.
        let wait = Duration::from_secs(u64::try_from(period.seconds).unwrap_or(0));
        let now = tokio::time::Instant::now();
        let deadline = now
            .checked_add(wait)
            .unwrap_or_else(|| now + Duration::from_secs(u64::from(u32::MAX)));
        loop {
            let mut done = true;
            for pod in &group {
                let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                if !pods.pod_cleaned_up(uid).await {
                    done = false;
                    break;
                }
            }
            if done {
                info!(
                    priority = period.priority,
                    "Done waiting for all pods in group to terminate"
                );
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                info!(
                    priority = period.priority,
                    "Shutdown manager pod killing time out"
                );
                break;
            }
            tokio::time::sleep(CLEANUP_POLL.min(deadline - tokio::time::Instant::now())).await;
        }
    }
}
