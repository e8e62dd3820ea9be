//! The pod side of the eviction manager's seams ([`crate::eviction::Pods`]),
//! as the kubelet hands its eviction manager `GetActivePods`, `killPodNow`
//! (pod_workers.go: "intended to be injected into other modules"),
//! `PodIsFinished` and its container GC: which pods may be evicted, the
//! kill of one (its eviction recorded for its pod worker and its evicting
//! status written), whether one has been cleaned up, and the reclaim of
//! dead containers.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tracing::debug;

use super::worker::Context;
use crate::eviction::Eviction;
use crate::pod_core::spec::{is_evicted, is_terminal};

/// What the eviction manager is given of the pods ([`crate::eviction::Pods`]):
/// the pod workers' shared context and the container GC policy node-level
/// reclaim applies.
pub struct EvictionPods {
    ctx: Arc<Context>,
    container_gc: crate::container_gc::Policy,
}

impl EvictionPods {
    /// The eviction manager's view of the pods of `ctx`, reclaiming dead
    /// containers with `container_gc` (the kubelet's `containerGC`).
    #[must_use]
    pub fn new(ctx: Arc<Context>, container_gc: crate::container_gc::Policy) -> Self {
        Self { ctx, container_gc }
    }
}

impl crate::eviction::Pods for EvictionPods {
    fn active_pods(&self) -> Vec<Arc<Pod>> {
        self.ctx
            .pods()
            .state()
            .into_iter()
            .filter(|p| {
                !is_terminal(p)
                    && p.metadata.deletion_timestamp.is_none()
                    && !is_evicted(p)
                    && self
                        .ctx
                        .eviction(p.metadata.uid.as_deref().unwrap_or_default())
                        .is_none()
            })
            .collect()
    }

    async fn kill_pod(&self, pod: &Pod, eviction: Eviction) -> Result<(), kube::Error> {
        let pod = self.ctx.status().with_sent_status(Arc::new(pod.clone()));
        let status = crate::pod_core::status::evicting(
            &pod,
            eviction.reason,
            &eviction.message,
            eviction.disruption,
            eviction.at,
        );
        if let Some(uid) = pod.metadata.uid.as_deref() {
            self.ctx.record_eviction(uid, eviction);
        }
        self.ctx.status().set_status(&pod, status).await.map(|_| ())
    }

    async fn pod_cleaned_up(&self, uid: &str) -> bool {
        let by_uid = HashMap::from([(crate::labels::POD_UID_LABEL.to_string(), uid.to_string())]);
        let running = match self.ctx.cri().list_containers(by_uid).await {
            Ok(cs) => cs
                .iter()
                .any(|c| c.state == k8s_cri::v1::ContainerState::ContainerRunning as i32),
            Err(e) => {
                debug!(error = %e, "eviction manager: containers of an evicted pod");
                true
            }
        };
        !running && !self.ctx.volumes().volumes_exist(uid)
    }

    async fn delete_all_unused_containers(
        &self,
    ) -> crate::cri::Result<crate::container_gc::Collected> {
        super::housekeeping::collect_containers(&self.ctx, self.container_gc, true).await
    }
}
