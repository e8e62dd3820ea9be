//! What a sync does for a static pod beside running it, as the kubelet's
//! status manager and `tryReconcileMirrorPods`: its status seeded from its
//! mirror pod, and its mirror pod kept current.

use k8s_openapi::api::core::v1::Pod;
use tracing::warn;

use super::context::Context;
use crate::pod_core::kind::PodKind;

/// The status a static pod's sync starts from while this agent has not yet
/// reported on it to a mirror pod: its mirror pod's, what was last reported
/// of it (an agent restart keeps its containers' started and ready states),
/// as the kubelet's status manager reads a static pod's status from its
/// mirror. `None` for other pods, once reported, without a mirror pod of
/// this manifest, or when the mirror pod's status is terminal.
pub fn mirror_seed(
    pod: &Pod,
    kind: PodKind,
    ctx: &Context,
) -> Option<k8s_openapi::api::core::v1::PodStatus> {
    if !kind.is_static || ctx.status().reported_to_mirror(pod) {
        return None;
    }
    let mirror = ctx.sources().mirror_of(pod)?;
    // A terminal status is an earlier run's of the same manifest (removed
    // and put back): the pod starts anew, not from it.
    let running_status = mirror.status.as_ref().is_some_and(|s| {
        !s.phase
            .as_deref()
            .is_some_and(crate::reasons::phase::is_terminal)
    });
    if !crate::static_pod::is_mirror_of(&mirror, pod) || !running_status {
        return None;
    }
    mirror.status.clone()
}

/// How soon a static pod is synced again after its mirror pod could not be
/// written (an API server that is not up yet, as when it is itself a static
/// pod of this node): its pod is not otherwise synced before `syncFrequency`.
pub const MIRROR_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// Keeps the mirror pod of static pod `pod` current
/// ([`super::mirror_client::reconcile`]); a failure is logged and tried
/// again after the returned delay ([`MIRROR_RETRY`], also while the mirror
/// pod is not listed yet; None once it is), as the pod runs whether or not
/// the API server has its mirror.
pub async fn sync_mirror_pod(pod: &Pod, ctx: &Context) -> Option<std::time::Duration> {
    let node = &ctx.node().node_name;
    let client = ctx.client();
    let done = super::mirror_client::reconcile(client, ctx.sources(), ctx.node_store(), node, pod);
    if let Err(e) = done.await {
        warn!(error = %e, "mirror pod");
        return Some(MIRROR_RETRY);
    }
    // Not listed yet (no Node yet, or just created): looked at again soon.
    let listed = ctx
        .sources()
        .mirror_of(pod)
        .is_some_and(|m| crate::static_pod::is_mirror_of(&m, pod));
    (!listed && pod.metadata.deletion_timestamp.is_none()).then_some(MIRROR_RETRY)
}
