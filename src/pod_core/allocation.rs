//! Allocated resources, as the kubelet's allocation manager
//! (pkg/kubelet/allocation), the pure part: a pod's allocation (the
//! resources its containers were given, which is what runs, what the status
//! reports and what other pods are admitted against), a pod with its
//! allocation applied, and whether a resize request (`kubectl patch
//! --subresource resize`: spec resources that differ from the allocation)
//! can be admitted now (`PodResizePending`, `Infeasible` or `Deferred`).
//! The resizable resources are every container's (init containers' too, as
//! with the kubelet's `InPlacePodVerticalScalingInitContainers`) and the
//! pod-level `spec.resources` (`InPlacePodLevelResourcesVerticalScaling`).
//! The node's allocations, kept on disk, are [`crate::pod::allocation`]'s.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
use serde::{Deserialize, Serialize};

use super::admit::Rejection;
use super::fit::{NodeView, pod_requests};
use super::spec;

/// `PodResizePending` reason: the node can never hold the new resources.
pub const INFEASIBLE: &str = "Infeasible";
/// `PodResizePending` reason: the node cannot hold them now.
pub const DEFERRED: &str = "Deferred";

/// One pod's allocation: the resources of its containers (regular, init
/// and sidecar), by name, and its pod-level resources.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    /// Resources by container name.
    pub containers: BTreeMap<String, ResourceRequirements>,
    /// The pod-level `spec.resources` (None: the pod sets none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<ResourceRequirements>,
    /// Kept by an earlier version: containers it does not name, and the
    /// pod-level resources, are the spec's.
    #[serde(skip)]
    pub partial: bool,
}

/// `pod`'s spec resources as an allocation.
#[must_use]
pub fn of(pod: &Pod) -> Allocation {
    let containers = spec::main_containers(pod)
        .iter()
        .chain(spec::init_containers(pod))
        .map(|c| (c.name.clone(), c.resources.clone().unwrap_or_default()))
        .collect();
    let pod_level = pod.spec.as_ref().and_then(|s| s.resources.clone());
    Allocation {
        containers,
        pod: pod_level,
        partial: false,
    }
}

/// `allocation` whole: a partial one (kept by an earlier version) takes what
/// it does not hold from `pod`'s spec.
fn completed(pod: &Pod, allocation: &Allocation) -> Allocation {
    if !allocation.partial {
        return allocation.clone();
    }
    let mut whole = of(pod);
    for (name, r) in &allocation.containers {
        if let Some(slot) = whole.containers.get_mut(name) {
            slot.clone_from(r);
        }
    }
    whole
}

/// `pod` with the resources of `allocation` in place of its spec's, as the
/// kubelet's `UpdatePodFromAllocation`; containers the allocation does not
/// name keep theirs.
#[must_use]
pub fn apply(pod: &Pod, allocation: &Allocation) -> Pod {
    let allocation = completed(pod, allocation);
    let mut pod = pod.clone();
    if let Some(spec) = pod.spec.as_mut() {
        let containers = spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten());
        for c in containers {
            if let Some(r) = allocation.containers.get(&c.name) {
                c.resources = (r != &ResourceRequirements::default()).then(|| r.clone());
            }
        }
        spec.resources = allocation.pod;
    }
    pod
}

/// True when `pod`'s spec asks for other resources than `allocation`.
#[must_use]
pub fn resize_requested(pod: &Pod, allocation: &Allocation) -> bool {
    of(pod) != completed(pod, allocation)
}

/// The message of a resize of pod-level resources with the
/// `InPlacePodLevelResourcesVerticalScaling` gate off.
pub const POD_LEVEL_RESIZE_DISABLED_MESSAGE: &str =
    "InPlacePodLevelResourcesVerticalScaling is disabled";

/// With `InPlacePodLevelResourcesVerticalScaling` off, a resize that changes
/// the pod-level resources is `Infeasible`, as the kubelet's resize admit
/// handler (`IsInPlacePodLevelResourcesVerticalScalingAllowed`).
#[must_use]
pub fn pod_level_resize_refused(pod: &Pod, allocation: &Allocation) -> Option<Rejection> {
    (of(pod).pod != completed(pod, allocation).pod).then(|| Rejection {
        reason: INFEASIBLE.into(),
        message: POD_LEVEL_RESIZE_DISABLED_MESSAGE.into(),
    })
}

/// The message of a resize the static CPU manager policy refuses.
pub const STATIC_CPU_RESIZE_MESSAGE: &str =
    "Resize is infeasible for Guaranteed Pods alongside CPU Manager policy \"static\"";

/// Under the CPU manager's `static` policy, a resize of a Guaranteed pod
/// that changes a container's cpu request is `Infeasible`, as the v1.37
/// kubelet's resize admit handler refuses it with
/// `InPlacePodVerticalScalingExclusiveCPUs` off (its default).
#[must_use]
pub fn static_cpu_resize(pod: &Pod, allocation: &Allocation) -> Option<Rejection> {
    if super::qos::qos_class(pod) != super::qos::QosClass::Guaranteed {
        return None;
    }
    let allocation = completed(pod, allocation);
    let cpu = |r: Option<&ResourceRequirements>| {
        r.and_then(|r| r.requests.as_ref())
            .and_then(|m| m.get("cpu"))
            .map(|q| q.0.clone())
    };
    let changed = of(pod)
        .containers
        .iter()
        .any(|(name, r)| cpu(Some(r)) != cpu(allocation.containers.get(name)));
    changed.then(|| Rejection {
        reason: INFEASIBLE.into(),
        message: STATIC_CPU_RESIZE_MESSAGE.into(),
    })
}

/// Whether the resize `pod`'s spec asks for can be admitted now, as the
/// kubelet's `canResizePod`: a static pod's is `Infeasible`; requests
/// beyond the node's allocatable cpu or memory are `Infeasible` ("Node
/// didn't have enough capacity: <resource>, requested: <n>, capacity: <n>",
/// memory first, cpu in millicores); requests that do not fit beside
/// `others` (the other active pods, as allocated) are `Deferred`, with the
/// admission message.
///
/// # Errors
/// The `PodResizePending` reason and message.
pub fn admit_resize(
    pod: &Pod,
    kind: super::kind::PodKind,
    others: &[&Pod],
    node: &NodeView,
) -> Result<(), Rejection> {
    if kind.is_static {
        return Err(Rejection {
            reason: INFEASIBLE.into(),
            message: "In-place resize of static-pods is not supported".into(),
        });
    }
    let wanted = pod_requests(pod);
    let allocatable = crate::pod_core::fit::parsed_allocatable(node);
    for (resource, milli) in [("memory", false), ("cpu", true)] {
        let value = |q: Option<&crate::resource::Quantity>| {
            q.map_or(0, |q| if milli { q.milli_value() } else { q.value() })
        };
        let (requested, capacity) = (
            value(wanted.get(resource)),
            value(allocatable.get(resource)),
        );
        if requested > capacity {
            return Err(Rejection {
                reason: INFEASIBLE.into(),
                message: format!(
                    "Node didn't have enough capacity: {resource}, requested: {requested}, capacity: {capacity}"
                ),
            });
        }
    }
    match crate::pod_core::fit::fit(pod, others, node) {
        Some(r) => Err(Rejection {
            reason: DEFERRED.into(),
            message: r.message,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    fn with_pod_level(cpu: &str) -> Pod {
        let mut p = crate::fixtures::pod("p").container("c", "busybox").build();
        let list: BTreeMap<String, Quantity> = [("cpu".to_string(), Quantity(cpu.into()))].into();
        p.spec.as_mut().unwrap().resources = Some(ResourceRequirements {
            requests: Some(list.clone()),
            limits: Some(list),
            ..Default::default()
        });
        p
    }

    /// A resize of the pod-level resources is `Infeasible` with
    /// `InPlacePodLevelResourcesVerticalScaling` off, with its message; a
    /// pod whose pod-level resources did not change is not refused.
    #[test]
    fn a_pod_level_resize_is_refused_with_its_gate_off() {
        let allocated = of(&with_pod_level("1"));
        assert_eq!(
            pod_level_resize_refused(&with_pod_level("1"), &allocated),
            None
        );
        let resized = with_pod_level("2");
        assert!(resize_requested(&resized, &allocated));
        let r = pod_level_resize_refused(&resized, &allocated).expect("refused");
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (INFEASIBLE, POD_LEVEL_RESIZE_DISABLED_MESSAGE)
        );
    }
}
