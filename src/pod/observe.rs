//! Reads one pod's sandboxes and containers from CRI by the
//! `io.kubernetes.pod.uid` label: the kubelet's `GetPodStatus`.

use std::collections::HashMap;

use k8s_cri::v1 as cri;
use k8s_openapi::jiff::Timestamp;

use super::state::{Container, ContainerState, PodRuntime, Sandbox};
use crate::cri::{CONTAINER_HASH_ANNOTATION, POD_UID_LABEL, Result, Runtime};

fn ts(nanos: i64) -> Option<Timestamp> {
    (nanos > 0)
        .then(|| Timestamp::from_nanosecond(i128::from(nanos)).ok())
        .flatten()
}

/// Converts a CRI sandbox status into [`Sandbox`].
#[must_use]
pub fn sandbox_from(s: &cri::PodSandboxStatus) -> Sandbox {
    let mut ips: Vec<String> = Vec::new();
    if let Some(n) = &s.network {
        if !n.ip.is_empty() {
            ips.push(n.ip.clone());
        }
        ips.extend(n.additional_ips.iter().map(|p| p.ip.clone()));
    }
    Sandbox {
        id: s.id.clone(),
        attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
        ready: s.state == cri::PodSandboxState::SandboxReady as i32,
        created_at: ts(s.created_at).unwrap_or_default(),
        ips,
    }
}

/// Converts a CRI container status into [`Container`].
#[must_use]
pub fn container_from(s: &cri::ContainerStatus, sandbox_id: &str) -> Container {
    let state = match cri::ContainerState::try_from(s.state) {
        Ok(cri::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(cri::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(cri::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    };
    Container {
        id: s.id.clone(),
        name: s
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default(),
        attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
        sandbox_id: sandbox_id.to_string(),
        state,
        created_at: ts(s.created_at).unwrap_or_default(),
        started_at: ts(s.started_at),
        finished_at: ts(s.finished_at),
        exit_code: s.exit_code,
        reason: s.reason.clone(),
        message: s.message.clone(),
        image: s
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default(),
        image_ref: s.image_ref.clone(),
        hash: s
            .annotations
            .get(CONTAINER_HASH_ANNOTATION)
            .cloned()
            .unwrap_or_default(),
    }
}

/// Everything the runtime holds for the pod with `uid`: one ListPodSandbox, one
/// ListContainers, then a status call for each ready sandbox (its IPs) and each container.
///
/// # Errors
/// The first CRI call that fails.
pub async fn observe(runtime: &Runtime, uid: &str) -> Result<PodRuntime> {
    let by_uid = HashMap::from([(POD_UID_LABEL.to_string(), uid.to_string())]);
    let (sandboxes, containers) = tokio::try_join!(
        runtime.list_pod_sandboxes(by_uid.clone()),
        runtime.list_containers(by_uid)
    )?;
    let sandbox_futs = sandboxes.iter().map(|s| async move {
        if s.state == cri::PodSandboxState::SandboxReady as i32
            && let Some(st) = runtime.pod_sandbox_status(&s.id).await?
        {
            return Ok(sandbox_from(&st));
        }
        Ok(Sandbox {
            id: s.id.clone(),
            attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
            ready: s.state == cri::PodSandboxState::SandboxReady as i32,
            created_at: ts(s.created_at).unwrap_or_default(),
            ips: vec![],
        })
    });
    let container_futs = containers.iter().map(|c| async move {
        Ok::<_, crate::cri::Error>(
            runtime
                .container_status(&c.id)
                .await?
                .map(|st| container_from(&st, &c.pod_sandbox_id)),
        )
    });
    let (sandboxes, containers) = tokio::try_join!(
        futures::future::try_join_all(sandbox_futs),
        futures::future::try_join_all(container_futs)
    )?;
    let mut rt = PodRuntime {
        sandboxes,
        containers: containers.into_iter().flatten().collect(),
    };
    rt.sort();
    Ok(rt)
}
