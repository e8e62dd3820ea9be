//! The topology manager's admit handler, as the kubelet's
//! (pkg/kubelet/cm/topologymanager `scope*.go`): for each container (scope
//! `container`) or once for the pod (scope `pod`), the hint providers'
//! hints are merged under the policy, a pod that cannot be aligned is
//! rejected with `TopologyAffinityError`, and the CPU manager, then the
//! memory manager, allocate along the merged hint (the kubelet's order of
//! hint providers). Device plugins' devices are allocated before this step,
//! by the device manager's own handler, and give no hints.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::cpu_manager::{AllocationError, CpuManager};
use crate::memory_manager::MemoryManager;
use crate::pod_core::admit::Rejection;
use crate::reasons::admission::UNEXPECTED_ADMISSION_ERROR;
use crate::topology_manager::{self as tm, Hint, Policy, ProviderHints, Scope, TopologyManager};

/// The CPU manager's hints as a provider's (resource `cpu`).
fn provider(hints: Option<Vec<Hint>>) -> ProviderHints {
    hints.map(|h| [("cpu".to_string(), Some(h))].into())
}

/// The memory manager's hints as a provider's.
fn memory_provider(hints: Option<std::collections::BTreeMap<String, Vec<Hint>>>) -> ProviderHints {
    hints.map(|m| m.into_iter().map(|(r, h)| (r, Some(h))).collect())
}

/// A memory manager error as the kubelet's admission gives it.
fn memory_rejection(message: String) -> Rejection {
    Rejection {
        reason: UNEXPECTED_ADMISSION_ERROR.into(),
        message: format!("Allocate failed due to {message}, which is unexpected"),
    }
}

fn affinity_error() -> Rejection {
    Rejection {
        reason: tm::REJECTION_REASON.into(),
        message: tm::REJECTION_MESSAGE.into(),
    }
}

fn allocation_rejection(e: AllocationError) -> Rejection {
    if e.reason.is_empty() {
        Rejection {
            reason: UNEXPECTED_ADMISSION_ERROR.into(),
            message: format!("Allocate failed due to {}, which is unexpected", e.message),
        }
    } else {
        Rejection {
            reason: e.reason.into(),
            message: e.message,
        }
    }
}

/// The merged hint, or the rejection.
fn merge(topology: &TopologyManager, providers: &[ProviderHints]) -> Result<Hint, Rejection> {
    match tm::merge(
        topology.policy,
        &topology.options,
        &topology.info,
        providers,
    ) {
        Some((hint, true)) => Ok(hint),
        _ => Err(affinity_error()),
    }
}

/// Admits `pod` under the topology manager and gives its containers their
/// CPUs and memory (init containers, then the others, as the kubelet walks
/// them); on a rejection, what some of its containers got is given back.
///
/// # Errors
/// The [`Rejection`]: `TopologyAffinityError` when the policy cannot align
/// it, the CPU manager's reason (`SMTAlignmentError`) or
/// `UnexpectedAdmissionError` when its CPUs or memory cannot be given.
pub fn admit(
    pod: &Pod,
    topology: &TopologyManager,
    cpus: &CpuManager,
    memory: Option<&MemoryManager>,
) -> Result<(), Rejection> {
    let containers: Vec<&Container> = pod
        .spec
        .iter()
        .flat_map(|s| {
            s.init_containers
                .iter()
                .flatten()
                .chain(s.containers.iter())
        })
        .collect();
    let allocate = |c: &Container, hint: Hint| -> Result<(), Rejection> {
        cpus.allocate(pod, c, hint.affinity)
            .map_err(allocation_rejection)?;
        if let Some(m) = memory {
            m.allocate(pod, c, hint).map_err(memory_rejection)?;
        }
        Ok(())
    };
    let result = (|| {
        if topology.policy == Policy::None {
            for c in &containers {
                allocate(c, Hint::default())?;
            }
            return Ok(());
        }
        match topology.scope {
            Scope::Pod => {
                let providers = [
                    provider(cpus.pod_hints(pod)),
                    memory_provider(memory.and_then(|m| m.pod_hints(pod))),
                ];
                let hint = merge(topology, &providers)?;
                for c in &containers {
                    allocate(c, hint)?;
                }
            }
            Scope::Container => {
                for c in &containers {
                    let providers = [
                        provider(cpus.hints(pod, c)),
                        memory_provider(memory.and_then(|m| m.hints(pod, c))),
                    ];
                    let hint = merge(topology, &providers)?;
                    allocate(c, hint)?;
                }
            }
        }
        Ok(())
    })();
    let m = crate::metrics::metrics();
    m.topology_manager_admission_requests.inc();
    if result.is_err() {
        m.topology_manager_admission_errors.inc();
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        cpus.remove_pod(uid);
        if let Some(memory) = memory {
            memory.remove_pod(uid);
        }
    }
    result
}
