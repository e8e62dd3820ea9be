//! The topology manager's admit handler, as the kubelet's
//! (pkg/kubelet/cm/topologymanager `scope*.go`): for each container (scope
//! `container`) or once for the pod (scope `pod`), the hint providers'
//! hints are merged under the policy, a pod that cannot be aligned is
//! rejected with `TopologyAffinityError`, and the device manager, the CPU
//! manager, then the memory manager allocate along the merged hint (the
//! kubelet's order of hint providers), container by container: a later
//! container's hints see what the earlier ones were given.

use k8s_openapi::api::core::v1::{Container, Pod};

use crate::cpu_manager::{AllocationError, CpuManager};
use crate::device_manager::DeviceManager;
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

/// A resource manager's error as the kubelet's admission gives it.
fn unexpected(message: String) -> Rejection {
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

/// The resource managers that give a pod what it asks for, and the
/// topology manager that aligns them.
#[derive(Clone, Copy)]
pub struct Managers<'a> {
    /// The topology manager's settings and the machine's NUMA nodes.
    pub topology: &'a TopologyManager,
    /// The device manager, when device plugins are served.
    pub devices: Option<&'a DeviceManager>,
    /// The CPU manager.
    pub cpus: Option<&'a CpuManager>,
    /// The memory manager, under its `Static` policy.
    pub memory: Option<&'a MemoryManager>,
}

impl Managers<'_> {
    /// The hint providers' hints for container `c`, or for the whole pod
    /// (`None`), in the kubelet's order: devices, CPUs, memory.
    fn hints(
        &self,
        pod: &Pod,
        c: Option<&Container>,
        active: &impl Fn(&str) -> bool,
    ) -> [ProviderHints; 3] {
        let nodes = &self.topology.info.nodes;
        match c {
            Some(c) => [
                self.devices.and_then(|d| d.hints(pod, c, active, nodes)),
                provider(self.cpus.and_then(|m| m.hints(pod, c))),
                memory_provider(self.memory.and_then(|m| m.hints(pod, c))),
            ],
            None => [
                self.devices.and_then(|d| d.pod_hints(pod, active, nodes)),
                provider(self.cpus.and_then(|m| m.pod_hints(pod))),
                memory_provider(self.memory.and_then(|m| m.pod_hints(pod))),
            ],
        }
    }

    /// Gives container `c` its devices, CPUs and memory along `hint`.
    async fn allocate(
        &self,
        pod: &Pod,
        c: &Container,
        hint: Hint,
        active: &impl Fn(&str) -> bool,
    ) -> Result<(), Rejection> {
        if let Some(d) = self.devices {
            d.allocate(pod, c, active, hint.affinity)
                .await
                .map_err(unexpected)?;
        }
        if let Some(cpus) = self.cpus {
            cpus.allocate(pod, c, hint.affinity)
                .map_err(allocation_rejection)?;
        }
        if let Some(m) = self.memory {
            m.allocate(pod, c, hint).map_err(unexpected)?;
        }
        Ok(())
    }

    /// Gives back what pod `uid`'s containers were given.
    pub fn release(&self, uid: &str) {
        if let Some(d) = self.devices {
            d.release(|u| u != uid);
        }
        if let Some(cpus) = self.cpus {
            cpus.remove_pod(uid);
        }
        if let Some(memory) = self.memory {
            memory.remove_pod(uid);
        }
    }
}

/// Admits `pod` under the topology manager and gives its containers their
/// devices, CPUs and memory (init containers, then the others, as the
/// kubelet walks them); `active` tells the UIDs of the pods whose devices
/// are held. On a rejection, what some of its containers got is given back.
///
/// # Errors
/// The [`Rejection`]: `TopologyAffinityError` when the policy cannot align
/// it, the CPU manager's reason (`SMTAlignmentError`) or
/// `UnexpectedAdmissionError` when its devices, CPUs or memory cannot be
/// given.
pub async fn admit(
    pod: &Pod,
    managers: Managers<'_>,
    active: impl Fn(&str) -> bool,
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
    let topology = managers.topology;
    let result = async {
        if topology.policy == Policy::None {
            for c in &containers {
                managers.allocate(pod, c, Hint::default(), &active).await?;
            }
            return Ok(());
        }
        match topology.scope {
            Scope::Pod => {
                let hint = merge(topology, &managers.hints(pod, None, &active))?;
                for c in &containers {
                    managers.allocate(pod, c, hint, &active).await?;
                }
            }
            Scope::Container => {
                for c in &containers {
                    let hint = merge(topology, &managers.hints(pod, Some(c), &active))?;
                    managers.allocate(pod, c, hint, &active).await?;
                }
            }
        }
        Ok(())
    }
    .await;
    let m = crate::metrics::metrics();
    m.topology_manager_admission_requests.inc();
    if result.is_err() {
        m.topology_manager_admission_errors.inc();
        managers.release(pod.metadata.uid.as_deref().unwrap_or_default());
    }
    result
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use tokio::sync::watch;

    use super::*;
    use crate::config::{CpuManagerPolicy, ResourceManagers};
    use crate::cpuset::CpuSet;
    use crate::device_manager::test_plugin::{
        RES, on_node, plugin, register, serve_plugin, setup, wait_counts,
    };
    use crate::topology_manager::NumaInfo;

    /// A Guaranteed pod of one container asking `cpu` CPUs and `devices`
    /// of the test plugin's devices.
    fn pod(uid: &str, cpu: &str, devices: &str) -> Pod {
        let mut pod = crate::fixtures::pod(uid).container("c", "busybox").build();
        pod.metadata.uid = Some(uid.into());
        let r: BTreeMap<String, Quantity> = [
            ("cpu".to_string(), Quantity(cpu.into())),
            ("memory".to_string(), Quantity("64Mi".into())),
            (RES.to_string(), Quantity(devices.into())),
        ]
        .into();
        pod.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            requests: Some(r.clone()),
            limits: Some(r),
            ..Default::default()
        });
        pod
    }

    /// Under `single-numa-node`, a container's CPUs follow its device to
    /// the NUMA node the device is on; a pod whose device cannot be had on
    /// one node is refused with `TopologyAffinityError` and keeps nothing.
    #[tokio::test]
    async fn cpus_and_devices_are_aligned_on_one_numa_node() {
        let s = setup();
        let (_tx, rx) = watch::channel(Some(vec![on_node("g1", 1)]));
        let _srv = serve_plugin(&s.dir, "p.sock", plugin(rx));
        register(&s.dir, "p.sock", RES).await.unwrap();
        wait_counts(&s.manager, RES, Some((1, 1))).await;

        let state = tempfile::tempdir().unwrap();
        let settings = ResourceManagers {
            cpu_policy: CpuManagerPolicy::Static,
            reserved_system_cpus: Some(CpuSet::parse("0").unwrap()),
            ..ResourceManagers::default()
        };
        // Two NUMA nodes of four CPUs: 0-3 and 4-7.
        let topo = crate::cpu_manager::fixtures::dual_socket_no_ht();
        let cpus = CpuManager::new(&settings, None, state.path(), topo, true).unwrap();
        let topology = TopologyManager {
            policy: Policy::SingleNumaNode,
            scope: Scope::Container,
            info: NumaInfo {
                nodes: vec![0, 1],
                ..NumaInfo::default()
            },
            ..TopologyManager::default()
        };
        let managers = Managers {
            topology: &topology,
            devices: Some(&s.manager),
            cpus: Some(&cpus),
            memory: None,
        };
        let all = |_: &str| true;
        let first = pod("u1", "2", "1");
        admit(&first, managers, all).await.unwrap();
        // Node 0 has the most free CPUs, but the device is on node 1.
        assert_eq!(cpus.exclusive("u1", "c").unwrap().to_string(), "4-5");
        let held: Vec<(String, Vec<i64>)> = s
            .manager
            .devices("u1", "c")
            .into_iter()
            .flat_map(|(_, d)| d)
            .collect();
        assert_eq!(held, [("g1".to_string(), vec![1])]);

        let second = pod("u2", "1", "1");
        let r = admit(&second, managers, all).await.unwrap_err();
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (tm::REJECTION_REASON, tm::REJECTION_MESSAGE)
        );
        assert_eq!(cpus.exclusive("u2", "c"), None, "nothing kept");
        // Once the first pod no longer holds the device, the second gets it
        // and a CPU beside it (4-5 are still the first pod's CPUs).
        let not_first = |u: &str| u != "u1";
        admit(&second, managers, not_first).await.unwrap();
        assert_eq!(cpus.exclusive("u2", "c").unwrap().to_string(), "6");
    }
}
