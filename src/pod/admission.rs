//! Admission of a pod at the start of its sync, as the kubelet's
//! `canAdmitPod` on pod addition and `rejectPod`: the eviction manager's
//! handler, the admit handlers, the resource managers' allocation (devices,
//! CPUs, memory, aligned by the topology manager) and the GeneralPredicates
//! against the pods admitted before it.

use k8s_openapi::api::core::v1::Pod;
use tracing::info;

use super::admission_manager::Handlers;
use super::context::Context;
use super::topology_admission::{self, Managers};
use crate::events::EventType;
use crate::pod_core::admit::{self, Rejection};
use crate::pod_core::fit::NodeView;
use crate::pod_core::kind::PodKind;
use crate::pod_core::runtime::PodRuntime;
use crate::pod_core::status;

/// What admission decided about a pod.
pub enum Verdict {
    /// It may start (or it already runs, or it ends).
    Admit,
    /// It is failed with this reason.
    Reject(Rejection),
    /// The Node is not in the watch's store yet: decide on a later sync.
    NodeNotSeen,
}

/// The admission verdict on a pod this node has not started yet (no sandbox,
/// not finished, not being deleted), as the kubelet's `canAdmitPod` on pod
/// addition: the admit handlers ([`admit::admit`]) and the GeneralPredicates
/// against the pods admitted before it ([`AdmissionManager::admit`]). A pod
/// that already runs is never rejected. The runtime's features (CRI
/// `Status`) are asked for only when the pod sets
/// `supplementalGroupsPolicy: Strict`.
///
/// # Errors
/// The runtime's `Status` call failed.
pub async fn admission(
    pod: &Pod,
    kind: PodKind,
    rt: &PodRuntime,
    ctx: &Context,
) -> Result<Verdict, crate::cri::Error> {
    if pod.metadata.deletion_timestamp.is_some()
        || kind.is_terminal
        || !rt.sandboxes.is_empty()
        || !rt.containers.is_empty()
    {
        return Ok(Verdict::Admit);
    }
    // A pod is admitted once: pressure that comes later does not reject a
    // pod admitted before (it may still wait for its volumes).
    if let Some(v) = ctx
        .admission()
        .decided(pod.metadata.uid.as_deref().unwrap_or_default())
    {
        return Ok(v.map_or(Verdict::Admit, Verdict::Reject));
    }
    // The eviction manager's handler comes first, as in the kubelet.
    let pressures = ctx.pressures();
    if let Some(r) = crate::eviction::admit(pod, kind, &pressures) {
        return Ok(Verdict::Reject(r));
    }
    // The node shutdown manager's handler: no pod starts on a node that is
    // shutting down.
    if ctx.node_shutting_down() {
        return Ok(Verdict::Reject(Rejection {
            reason: crate::reasons::admission::NODE_SHUTDOWN.into(),
            message: crate::reasons::admission::NODE_SHUTDOWN_MESSAGE.into(),
        }));
    }
    let node = ctx.node();
    let supplemental_groups_policy = if admit::wants_strict_supplemental_groups(pod) {
        let status = ctx.cri().status().await?;
        status
            .features
            .is_some_and(|f| f.supplemental_groups_policy)
    } else {
        false
    };
    let abilities = admit::NodeAbilities {
        allowed_unsafe_sysctls: &node.allowed_unsafe_sysctls,
        apparmor_enabled: node.apparmor_enabled,
        supplemental_groups_policy,
        pod_level_resources_disabled: node.pod_level_resources_disabled,
    };
    let view = match ctx.node_view() {
        Some(view) => view,
        // A static pod does not wait for the API server: it is admitted
        // against the node as the agent registers it (the kubelet's
        // `getNodeAnyWay` and `initialNode`).
        None if kind.is_static => NodeView {
            name: node.node_name.clone(),
            labels: node.initial_labels.clone(),
            taints: node.initial_taints.clone(),
            allocatable: node.allocatable.clone(),
        },
        None => return Ok(Verdict::NodeNotSeen),
    };
    // The other pods count with what they were allocated, not with a
    // resize still pending.
    let bound = ctx.allocated_pods();
    let bound: Vec<&Pod> = bound.iter().collect();
    let handlers = NodeHandlers {
        abilities,
        ctx,
        bound: &bound,
    };
    Ok(
        match ctx.admission().admit(pod, &bound, &view, &handlers).await {
            Some(rejection) => Verdict::Reject(rejection),
            None => {
                crate::startup_trace::mark(pod, crate::startup_trace::Stage::Admitted);
                Verdict::Admit
            }
        },
    )
}

/// The admit handlers of this node: the checks of [`admit::admit`], and the
/// topology manager's handler, which gives the containers their devices,
/// CPUs and memory, aligned, before the GeneralPredicates (the kubelet's
/// order).
struct NodeHandlers<'a> {
    abilities: admit::NodeAbilities<'a>,
    ctx: &'a Context,
    /// The pods bound to this node: those not terminal hold their devices.
    bound: &'a [&'a Pod],
}

impl NodeHandlers<'_> {
    fn managers(&self) -> Managers<'_> {
        Managers {
            topology: self.ctx.topology(),
            devices: self.ctx.devices(),
            cpus: self.ctx.cpus(),
            memory: self.ctx.memory(),
        }
    }
}

impl Handlers for NodeHandlers<'_> {
    fn check(&self, pod: &Pod) -> Option<Rejection> {
        admit::admit(pod, &self.abilities).err()
    }

    async fn allocate(&self, pod: &Pod) -> Option<Rejection> {
        let this = pod.metadata.uid.as_deref();
        let active = |uid: &str| {
            this == Some(uid)
                || self.bound.iter().any(|p| {
                    p.metadata.uid.as_deref() == Some(uid) && !crate::pod_core::spec::is_terminal(p)
                })
        };
        topology_admission::admit(pod, self.managers(), active)
            .await
            .err()
    }

    fn release(&self, pod: &Pod) {
        self.managers()
            .release(pod.metadata.uid.as_deref().unwrap_or_default());
    }
}

/// True for a pod in a terminal phase that never ran here: no container
/// status, nothing in the runtime, not being deleted (a rejected pod, whose
/// status is final as the kubelet's `rejectPod` left it).
pub fn never_ran(pod: &Pod, kind: PodKind, rt: &PodRuntime) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && kind.is_terminal
        && pod
            .status
            .as_ref()
            .is_none_or(|s| s.container_statuses.is_none())
        && rt.sandboxes.is_empty()
        && rt.containers.is_empty()
}

/// Fails a pod the node does not admit, as the kubelet's `rejectPod`: a
/// Warning event with the reason, then the rejected status
/// ([`status::rejected`]) through the status manager.
///
/// # Errors
/// The status patch failed.
pub async fn reject(pod: &Pod, rejection: &Rejection, ctx: &Context) -> Result<bool, kube::Error> {
    info!(
        reason = %rejection.reason,
        detail = rejection.message,
        "pod rejected"
    );
    let note = rejection.message.clone();
    ctx.event(pod, None, EventType::Warning, &rejection.reason, note);
    ctx.status()
        .set_status(pod, status::rejected(pod, rejection))
        .await
}
