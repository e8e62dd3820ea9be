//! Pod housekeeping, as the kubelet's `HandlePodCleanups`: the sandboxes,
//! containers and volumes of pods no longer bound to this node (deleted while
//! the agent was down, or force-deleted) are stopped and removed, and the pod
//! workers' managers forget pods that are gone, and mirror pods whose static
//! pod is gone are deleted.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::Store;
use kube::{Api, Client};
use tracing::{debug, info, warn};

use super::worker::Context;
use crate::cri::Runtime;
use crate::labels::POD_UID_LABEL;
use crate::volume::VolumeManager;

/// Deletes the mirror pods whose static pod is gone
/// ([`super::sources::PodSources::orphan_mirrors`]), as the kubelet's
/// `HandlePodCleanups`; returns how many it deleted. A failed delete is
/// logged and tried again on the next pass.
pub async fn delete_orphan_mirrors(client: &Client, sources: &super::sources::PodSources) -> usize {
    let mut deleted = 0;
    for mirror in sources.orphan_mirrors() {
        let name = mirror.metadata.name.clone().unwrap_or_default();
        match super::mirror_client::delete(client, &mirror).await {
            Ok(()) => {
                info!(
                    mirror = name,
                    "deleted the mirror pod of a static pod that is gone"
                );
                deleted += 1;
            }
            Err(e) => warn!(mirror = name, error = %e, "delete an orphaned mirror pod"),
        }
    }
    deleted
}

/// Housekeeping (the kubelet's `HandlePodCleanups`): stops and removes the
/// sandboxes and containers of pods that are no longer bound to this node, such
/// as pods deleted while the agent was down or force-deleted, then tears down
/// their volumes and directories. A pod the reflector's cache does not know is
/// looked up in the API server first, so a cache that is still listing never
/// costs a running pod.
///
/// Then the directories of pods that have neither a sandbox nor a place in
/// the cache (their sandbox vanished while the agent was down, as after a
/// reboot) are torn down as the kubelet's `cleanupOrphanedPodDirs` does: the
/// mounts the agent made in them undone, then removed without following a
/// link or crossing into a mount ([`VolumeManager::cleanup_orphans`]). The
/// directory of a pod the runtime still has is left to the step above, which
/// asks the API server first. Only call this once the cache has listed: a
/// directory is known to be an orphan only from a complete list.
///
/// Last, the log directories of pods neither the cache nor the runtime has
/// are removed ([`crate::container_gc::remove_orphaned_log_dirs`]).
///
/// Returns how many pods were cleaned up (sandboxes and orphaned
/// directories) and how many pods only the runtime has are left, their
/// cleanup having failed this time (logged; tried again on the next pass).
///
/// # Errors
/// Listing the runtime's sandboxes failed.
pub async fn cleanup_orphans(
    runtime: &Runtime,
    client: &Client,
    store: &Store<Pod>,
    volumes: &VolumeManager,
    pod_logs_dir: &Path,
) -> crate::cri::Result<Cleaned> {
    let known: HashSet<String> = store
        .state()
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let sandboxes = runtime.list_pod_sandboxes(HashMap::new()).await?;
    // Pods the local cache does not know, by UID, with their namespace and name.
    let candidates: HashMap<String, (String, String)> = sandboxes
        .iter()
        .filter_map(|s| {
            let uid = s.labels.get(POD_UID_LABEL)?;
            let ns = s.labels.get(crate::labels::POD_NAMESPACE_LABEL)?;
            let name = s.labels.get(crate::labels::POD_NAME_LABEL)?;
            (!known.contains(uid)).then(|| (uid.clone(), (ns.clone(), name.clone())))
        })
        .collect();
    // Orphans are cleaned up concurrently: each may wait for a container to stop.
    let results = futures::future::join_all(
        candidates
            .into_iter()
            .map(|(uid, (ns, name))| cleanup_orphan(runtime, client, volumes, uid, ns, name)),
    )
    .await;
    let mut removed = 0;
    let mut left = 0;
    for r in results {
        match r {
            Ok(cleaned) => removed += usize::from(cleaned),
            Err(e) => {
                warn!(error = %e, "housekeeping: clean up a pod no longer bound to this node");
                left += 1;
            }
        }
    }
    let in_runtime: HashSet<&String> = sandboxes
        .iter()
        .filter_map(|s| s.labels.get(POD_UID_LABEL))
        .collect();
    let dirs = volumes
        .cleanup_orphans(store, |uid| in_runtime.contains(&uid.to_string()))
        .await;
    // The cache read again: a pod bound while orphans were being cleaned up
    // is not in the snapshot above, and its logs must stay. Its sandbox
    // only ever starts from the cache, so the runtime need not be asked
    // twice.
    let known: HashSet<String> = store
        .state()
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    crate::container_gc::remove_orphaned_log_dirs(pod_logs_dir, |uid| {
        known.contains(uid) || in_runtime.contains(&uid.to_string())
    });
    Ok(Cleaned {
        removed: removed + dirs,
        left,
    })
}

/// What [`cleanup_orphans`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cleaned {
    /// Pods cleaned up: sandboxes and orphaned directories.
    pub removed: usize,
    /// Pods only the runtime has that are still there, their cleanup having
    /// failed (the kubelet's `runtime_only` working pods, still terminating).
    pub left: usize,
}

/// Cleans up one pod the cache does not know, unless the API server still has it.
async fn cleanup_orphan(
    runtime: &Runtime,
    client: &Client,
    volumes: &VolumeManager,
    uid: String,
    ns: String,
    name: String,
) -> crate::cri::Result<bool> {
    // The cache may be behind (just started, or relisting): ask the API server.
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    match api.get_opt(&name).await {
        Ok(Some(p)) if p.metadata.uid.as_deref() == Some(uid.as_str()) => return Ok(false),
        Ok(_) => {}
        // The Node authorizer forbids reading a pod that is not bound to this node,
        // which includes one that no longer exists.
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        Err(e) => {
            debug!(error = %e, pod = %format!("{ns}/{name}"), "housekeeping: get pod");
            return Ok(false);
        }
    }
    let by_uid = HashMap::from([(POD_UID_LABEL.to_string(), uid.clone())]);
    for c in runtime.list_containers(by_uid.clone()).await? {
        if c.state == cri::ContainerState::ContainerRunning as i32 {
            runtime.stop_container(&c.id, 2).await?;
        }
        runtime.remove_container(&c.id).await?;
    }
    for s in runtime.list_pod_sandboxes(by_uid).await? {
        runtime.stop_pod_sandbox(&s.id).await?;
        runtime.remove_pod_sandbox(&s.id).await?;
    }
    if let Err(e) = volumes.teardown(&uid).await {
        warn!(pod_uid = uid, error = %e, "housekeeping: remove pod directory");
    }
    info!(
        pod_uid = uid,
        "removed the sandboxes, containers and volumes of a pod no longer bound to this node"
    );
    Ok(true)
}

/// One container garbage collection ([`crate::container_gc::collect`]) with
/// the pods bound to this node: the content of an evicted pod that has
/// failed goes whole, as the kubelet's `ShouldPodContentBeRemoved`; with
/// `terminated_too` (the eviction manager reclaiming disk, as
/// `DeleteAllUnusedContainers`) so does that of every pod that has
/// finished. Pods the cache does not know are left to [`cleanup_orphans`],
/// which asks the API server first.
///
/// # Errors
/// The first CRI call that failed.
pub async fn collect_containers(
    ctx: &Context,
    policy: crate::container_gc::Policy,
    terminated_too: bool,
) -> crate::cri::Result<crate::container_gc::Collected> {
    let finished: HashSet<String> = ctx
        .pods()
        .state()
        .iter()
        .filter(|p| crate::pod_core::spec::is_terminal(p))
        .filter(|p| terminated_too || has_evicted_reason(p))
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let now = k8s_openapi::jiff::Timestamp::now().as_nanosecond();
    let now = i64::try_from(now).unwrap_or(i64::MAX);
    crate::container_gc::collect(
        ctx.cri(),
        policy,
        now,
        |uid| finished.contains(uid),
        ctx.log_links_dir(),
    )
    .await
}

/// Runs container GC ([`collect_containers`]) every
/// [`crate::container_gc::PERIOD`] once the pods bound to the node were
/// listed (`listed`), as the kubelet's `StartGarbageCollection`; a failed
/// collection is a `ContainerGCFailed` node event.
pub async fn run_container_gc(
    ctx: std::sync::Arc<Context>,
    policy: crate::container_gc::Policy,
    mut listed: tokio::sync::watch::Receiver<bool>,
) {
    let _ = listed.wait_for(|listed| *listed).await;
    let mut tick = tokio::time::interval(crate::container_gc::PERIOD);
    loop {
        tick.tick().await;
        if let Err(e) = collect_containers(&ctx, policy, false).await {
            warn!(error = %e, "container GC");
            crate::events::publish_node(
                ctx.recorder(),
                &ctx.node().node_name,
                crate::events::EventType::Warning,
                crate::reasons::event::CONTAINER_GC_FAILED,
                e.to_string(),
            );
        }
    }
}

/// True when the pod's status reason is `Evicted`.
fn has_evicted_reason(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.reason.as_deref()) == Some(crate::reasons::pod::EVICTED)
}

/// Makes the pod workers' managers forget the pods that are no longer bound
/// to this node (the reflector's `store`, once it has listed): their cached
/// statuses, image pull back-offs, probe workers (which take their
/// `prober_probe_total` series with them) and the pod start timing of the
/// metrics, as the kubelet's `HandlePodCleanups` has the probe manager's
/// `CleanupPods` and the status manager's `RemoveOrphanedStatuses` do. Pods
/// this agent deleted were forgotten then; this catches those removed behind
/// its back, such as a force-deleted pod (grace period 0), which no sync ever
/// sees being deleted.
pub fn forget_gone(ctx: &Context, store: &Store<Pod>) {
    let known: HashSet<String> = store
        .state()
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    let keep = |uid: &str| known.contains(uid);
    ctx.status().retain(keep);
    ctx.admission().retain(keep);
    ctx.explanations().retain(keep);
    ctx.retain_evictions(keep);
    ctx.images().retain(keep);
    ctx.allocations().retain(keep);
    if let Some(devices) = ctx.devices() {
        devices.release(keep);
    }
    for uid in ctx.prober().pods().into_iter().filter(|u| !keep(u)) {
        debug!(pod_uid = uid, "housekeeping: stop the probes of a pod gone");
        ctx.prober().forget(&uid);
    }
    crate::metrics::metrics().retain_pods(keep);
}

/// Unprepares the ResourceClaims of pods that no longer run here: gone
/// from the reflector's `store` (deleted behind the agent's back, or while
/// it was down) or finished (`Succeeded`, `Failed`), as the kubelet's DRA
/// reconcile loop does for pods not active. Returns how many pods' claims
/// were unprepared.
pub async fn unprepare_inactive_claims(ctx: &Context, store: &Store<Pod>) -> usize {
    let active: HashSet<String> = store
        .state()
        .iter()
        .filter(|p| !crate::pod_core::spec::is_terminal(p))
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    ctx.dra()
        .unprepare_inactive(|uid| active.contains(uid))
        .await
}

/// Where a pod worker is with its pod, as the kubelet's `PodWorkerState`:
/// `sync` (running it), `terminating` (stopping it: it is being deleted, or
/// its static pod's manifest went, and a container still runs) or
/// `terminated` (it has finished, or was stopped). Read from `pod`'s status
/// as this agent last reported it. Pure.
#[must_use]
pub fn lifecycle(pod: &Pod) -> &'static str {
    let status = pod.status.as_ref();
    let finished = status
        .and_then(|s| s.phase.as_deref())
        .is_some_and(crate::reasons::phase::is_terminal);
    if finished {
        return "terminated";
    }
    if pod.metadata.deletion_timestamp.is_none() {
        return "sync";
    }
    let running = status
        .into_iter()
        .flat_map(|s| {
            [
                &s.init_container_statuses,
                &s.container_statuses,
                &s.ephemeral_container_statuses,
            ]
        })
        .flatten()
        .flatten()
        .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
    if running { "terminating" } else { "terminated" }
}

/// The pod gauges of `census` (lifecycles read by `lifecycle_of`) with
/// `runtime_only` pods still being removed, as the kubelet's
/// `HandlePodCleanups` sets `kubelet_working_pods`, `kubelet_desired_pods`,
/// `kubelet_active_pods` and `kubelet_mirror_pods`. A desired pod is active
/// while its lifecycle is `sync`; a static pod waiting for its predecessor
/// to stop is active too (the kubelet counts it so). Pure.
#[must_use]
pub fn pod_counts(
    census: &super::sources::Census,
    lifecycle_of: impl Fn(&Arc<Pod>) -> &'static str,
    runtime_only: usize,
) -> crate::metrics::PodCounts {
    let mut counts = crate::metrics::PodCounts::default();
    let mut worked_static = 0usize;
    for w in &census.working {
        let lifecycle = lifecycle_of(&w.pod);
        let config = if w.orphan { "orphan" } else { "desired" };
        let stat = if w.is_static { "true" } else { "" };
        *counts.working.entry((lifecycle, config, stat)).or_default() += 1;
        if w.orphan {
            continue;
        }
        let active = lifecycle == "sync";
        if w.is_static {
            worked_static += 1;
            counts.active.1 += usize::from(active);
        } else {
            counts.desired.0 += 1;
            counts.active.0 += usize::from(active);
        }
    }
    counts.desired.1 = census.desired_static;
    counts.active.1 += census.desired_static.saturating_sub(worked_static);
    if runtime_only > 0 {
        counts
            .working
            .insert(("terminating", "runtime_only", "unknown"), runtime_only);
    }
    counts.mirrors = census.mirrors;
    counts
}

/// Sets the pod gauges ([`pod_counts`]) from the pod sources, each pod's
/// lifecycle read from the status this agent last sent, with
/// `runtime_only` pods left by [`cleanup_orphans`].
pub fn record_pod_counts(ctx: &Context, runtime_only: usize) {
    let census = ctx.sources().census();
    let counts = pod_counts(
        &census,
        |pod| lifecycle(&ctx.status().with_sent_status(pod.clone())),
        runtime_only,
    );
    crate::metrics::metrics().set_pod_counts(&counts);
}

/// The pod cgroups of housekeeping, as the kubelet's `cleanupOrphanedPodCgroups`
/// and QoS container manager: the cgroup of a pod no longer in `store` is
/// removed (one that still holds tasks is tried again next time), and the
/// `burstable` cgroup's shares follow its pods' cpu requests (as allocated).
pub fn sync_pod_cgroups(ctx: &Context, store: &Store<Pod>) {
    let Some(cgroups) = ctx.cgroups() else {
        return;
    };
    let pods = store.state();
    let live: HashSet<&str> = pods
        .iter()
        .filter_map(|p| p.metadata.uid.as_deref())
        .collect();
    for (qos, uid) in cgroups.pods() {
        if !live.contains(uid.as_str()) {
            match cgroups.remove_pod(qos, &uid) {
                Ok(()) => debug!(pod_uid = uid, "housekeeping: pod cgroup removed"),
                Err(e) => {
                    debug!(pod_uid = uid, error = %e, "housekeeping: pod cgroup not removed yet")
                }
            }
        }
    }
    // QoS is fixed at creation (a resize keeps it): only the burstable pods
    // are looked at, each with its allocated resources.
    let milli = pods
        .iter()
        .filter(|p| !crate::pod_core::spec::is_terminal(p))
        .filter(|p| crate::pod_core::qos::qos_class(p) == crate::pod_core::qos::QosClass::Burstable)
        .filter_map(|p| {
            let allocated =
                super::allocation::allocated(std::slice::from_ref(p), ctx.allocations());
            allocated.first().and_then(|p| {
                crate::pod_core::fit::pod_requests(p)
                    .get("cpu")
                    .map(|q| q.milli_value())
            })
        })
        .fold(0_i128, i128::saturating_add);
    let shares = crate::pod_core::translate::cpu_shares(i64::try_from(milli).unwrap_or(i64::MAX));
    if let Err(e) = cgroups.set_burstable_shares(u64::try_from(shares).unwrap_or(2)) {
        warn!(error = %e, "burstable cgroup shares");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_state(deleting: bool, phase: &str, running: bool) -> Pod {
        use k8s_openapi::api::core::v1::{
            ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus,
            PodStatus,
        };
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let mut p = crate::fixtures::pod("p").container("c", "busybox").build();
        if deleting {
            p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        }
        let state = if running {
            ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..ContainerState::default()
            }
        } else {
            ContainerState {
                terminated: Some(ContainerStateTerminated::default()),
                ..ContainerState::default()
            }
        };
        p.status = Some(PodStatus {
            phase: Some(phase.into()),
            container_statuses: Some(vec![ContainerStatus {
                name: "c".into(),
                state: Some(state),
                ..ContainerStatus::default()
            }]),
            ..PodStatus::default()
        });
        p
    }

    #[test]
    fn a_pods_lifecycle_is_read_from_its_status_as_the_pod_workers_states() {
        assert_eq!(lifecycle(&with_state(false, "Running", true)), "sync");
        assert_eq!(lifecycle(&with_state(false, "Pending", false)), "sync");
        assert_eq!(lifecycle(&with_state(true, "Running", true)), "terminating");
        assert_eq!(lifecycle(&with_state(true, "Running", false)), "terminated");
        assert_eq!(
            lifecycle(&with_state(false, "Succeeded", false)),
            "terminated"
        );
        assert_eq!(lifecycle(&with_state(true, "Failed", false)), "terminated");
    }

    #[test]
    fn the_pod_counts_split_desired_active_and_orphaned_pods() {
        use super::super::sources::{Census, WorkingPod};
        let w = |name: &str, is_static: bool, orphan: bool, deleting: bool| WorkingPod {
            pod: Arc::new({
                let mut p = with_state(deleting, "Running", true);
                p.metadata.name = Some(name.into());
                p
            }),
            is_static,
            orphan,
        };
        let census = Census {
            working: vec![
                w("api", false, false, false),
                w("api-deleting", false, false, true),
                w("static", true, false, false),
                w("static-old", true, true, true),
            ],
            // "static", and the successor of "static-old", not started yet.
            desired_static: 2,
            mirrors: 2,
        };
        let counts = pod_counts(&census, |p| lifecycle(p), 0);
        assert_eq!(
            counts.working,
            HashMap::from([
                (("sync", "desired", ""), 1),
                (("terminating", "desired", ""), 1),
                (("sync", "desired", "true"), 1),
                (("terminating", "orphan", "true"), 1),
            ])
        );
        assert_eq!(counts.desired, (2, 2));
        assert_eq!(counts.active, (1, 2));
        assert_eq!(counts.mirrors, 2);
    }
}
