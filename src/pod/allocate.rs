//! The resources a pod runs with, decided at each sync, as the kubelet's
//! `handlePodResourcesResize`: a pod's first allocation and the in-place
//! resizes its spec asks for.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tracing::info;

use super::context::Context;
use crate::events::EventType;
use crate::pod_core::admit::Rejection;
use crate::pod_core::facts::pod_identity;
use crate::pod_core::kind::PodKind;
use crate::pod_core::status;
use crate::reasons::event;

/// `pod` as allocated (the kubelet's `handlePodResourcesResize`): a pod
/// seen for the first time gets its spec's resources; a spec that asks for
/// others is a resize, allocated when the node holds it beside the other
/// active pods (as allocated), else left pending, and then the pod goes on
/// with its allocation, with the pending reason returned. A pod that stops
/// keeps its allocation.
pub fn allocate(pod: Arc<Pod>, kind: PodKind, ctx: &Context) -> (Arc<Pod>, Option<Rejection>) {
    use crate::pod_core::allocation;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let Some(current) = ctx.allocations().get(&uid) else {
        ctx.allocations().allocate(&pod);
        return (pod, None);
    };
    if !allocation::resize_requested(&pod, &current) {
        if current.partial {
            // Kept by an earlier version: made whole from the spec it runs.
            ctx.allocations().allocate(&pod);
        }
        return (pod, None);
    }
    if pod.metadata.deletion_timestamp.is_some() || kind.is_terminal {
        return (Arc::new(allocation::apply(&pod, &current)), None);
    }
    let Some(view) = ctx.node_view() else {
        return (Arc::new(allocation::apply(&pod, &current)), None);
    };
    if ctx.node().pod_level_resize_disabled
        && let Some(refused) = allocation::pod_level_resize_refused(&pod, &current)
    {
        return (Arc::new(allocation::apply(&pod, &current)), Some(refused));
    }
    let static_cpus = ctx
        .cpus()
        .is_some_and(|m| m.policy() == crate::cpu_manager::PolicyName::Static);
    if static_cpus && let Some(refused) = allocation::static_cpu_resize(&pod, &current) {
        return (Arc::new(allocation::apply(&pod, &current)), Some(refused));
    }
    let _admitting = ctx.allocations().admitting();
    let others = ctx.allocated_pods();
    let others: Vec<&Pod> = others
        .iter()
        .filter(|p| p.metadata.uid.as_deref() != Some(uid.as_str()))
        .filter(|p| !crate::pod_core::spec::is_terminal(p))
        .collect();
    match allocation::admit_resize(&pod, kind, &others, &view) {
        Ok(()) => {
            info!(pod = %pod_identity(&pod).1, "resize allocated");
            ctx.allocations().allocate(&pod);
            let note = status::resize_event_message("Pod resize started", &pod, None);
            ctx.event(&pod, None, EventType::Normal, event::RESIZE_STARTED, note);
            (pod, None)
        }
        Err(pending) => (Arc::new(allocation::apply(&pod, &current)), Some(pending)),
    }
}
