//! The CPU manager's reconcile loop, as the kubelet's `reconcileState`:
//! every `cpuManagerReconcilePeriod` the CPUs (and the memory manager's
//! blocks, its `removeStaleState`) of pods no longer active go back to the
//! shared pool, and each running container of an active pod
//! whose cpuset differs from what it was last given is updated in place
//! (CRI `UpdateContainerResources` with `cpuset_cpus` alone), so that
//! shared containers follow the pool as it shrinks and grows.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;
use tracing::{debug, warn};

use super::context::Context;
use crate::cpu_manager::{CpuManager, CpuSet, PolicyName};
use crate::labels::{CONTAINER_NAME_LABEL, POD_UID_LABEL};

/// Runs the loop once the pods bound to the node were listed (`listed`);
/// returns at once under the `none` policy, which sets no cpuset.
pub async fn run(
    ctx: Arc<Context>,
    period: Duration,
    mut listed: tokio::sync::watch::Receiver<bool>,
) {
    let Some(cpus) = ctx.cpus().cloned() else {
        return;
    };
    if cpus.policy() == PolicyName::None {
        return;
    }
    let _ = listed.wait_for(|listed| *listed).await;
    let mut pushed = HashMap::new();
    let mut tick = tokio::time::interval(period);
    loop {
        tick.tick().await;
        if let Err(e) = reconcile(&ctx, &cpus, &mut pushed).await {
            warn!(error = %e, "CPU manager reconcile");
        }
    }
}

/// The active pods' containers by pod UID: the pods whose phase, as last
/// sent, is not terminal (the kubelet's `GetActivePods`).
fn active_containers(ctx: &Context) -> BTreeMap<String, Vec<String>> {
    ctx.pods()
        .state()
        .into_iter()
        .map(|p| ctx.status().with_sent_status(p))
        .filter(|p| !crate::pod_core::spec::is_terminal(p))
        .filter_map(|p| {
            let uid = p.metadata.uid.clone()?;
            let names = p
                .spec
                .iter()
                .flat_map(|s| {
                    s.init_containers
                        .iter()
                        .flatten()
                        .chain(s.containers.iter())
                })
                .map(|c| c.name.clone())
                .collect();
            Some((uid, names))
        })
        .collect()
}

/// One pass: stale assignments removed, then every running container of
/// an active pod brought to its cpuset; `pushed` is what each container ID
/// was last given.
async fn reconcile(
    ctx: &Context,
    cpus: &CpuManager,
    pushed: &mut HashMap<String, CpuSet>,
) -> Result<(), crate::cri::Error> {
    let active = active_containers(ctx);
    cpus.remove_stale(&active);
    if let Some(memory) = ctx.memory() {
        memory.remove_stale(&active);
    }
    if cpus.policy() == PolicyName::None {
        return Ok(());
    }
    let containers = ctx.cri().list_containers(HashMap::new()).await?;
    pushed.retain(|id, _| containers.iter().any(|c| &c.id == id));
    for c in containers {
        if c.state != cri::ContainerState::ContainerRunning as i32 {
            continue;
        }
        let (Some(uid), Some(name)) = (
            c.labels.get(POD_UID_LABEL),
            c.labels.get(CONTAINER_NAME_LABEL),
        ) else {
            continue;
        };
        if !active.get(uid).is_some_and(|names| names.contains(name)) {
            continue;
        }
        let Some(set) = cpus.cpuset(uid, name) else {
            continue;
        };
        if pushed.get(&c.id) == Some(&set) {
            continue;
        }
        let linux = cri::LinuxContainerResources {
            cpuset_cpus: set.to_string(),
            ..Default::default()
        };
        match ctx.cri().update_container_resources(&c.id, linux).await {
            Ok(()) => {
                debug!(container = %c.id, cpuset = %set, "cpuset updated");
                pushed.insert(c.id, set);
            }
            Err(e) => warn!(container = %c.id, error = %e, "cpuset not updated"),
        }
    }
    Ok(())
}
