//! The pod resources API, as the kubelet's (pkg/kubelet/apis/podresources,
//! served by `ListenAndServePodResources`): a gRPC service on
//! `<root-dir>/pod-resources/kubelet.sock` that tells node-local agents
//! (device plugins, monitoring and topology exporters) which devices each
//! container of the node's pods was given, and which devices the node can
//! still give.
//!
//! - `v1.PodResourcesLister`: `List` (every active pod: its restartable init
//!   containers, then its regular containers, each with its devices),
//!   `GetAllocatableResources` (the healthy devices of the device plugins,
//!   one entry per device) and `Get` (one active pod, by namespace and name;
//!   an unknown or finished pod is the kubelet's `pod <name> in namespace
//!   <namespace> not found`, code `Unknown`).
//! - `v1alpha1.PodResourcesLister`: `List`, every pod the agent has with its
//!   regular containers' devices, as the deprecated API still served next to
//!   v1.
//! - Calls are rate limited together as the kubelet limits them: 100 a
//!   second with bursts of 10 (`DefaultQPS`, `DefaultBurstTokens`); a call
//!   over the limit fails with `ResourceExhausted` "rejected by rate limit"
//!   and is not counted.
//! - Each call counts in the kubelet's metrics
//!   `kubelet_pod_resources_endpoint_requests_total{server_api_version}` and
//!   the per-call `kubelet_pod_resources_endpoint_requests_{list,get_allocatable,get}`
//!   and `kubelet_pod_resources_endpoint_errors_get`.
//!
//! Each container's dynamic resources are the ResourceClaims it names that
//! the DRA manager prepared, each device with its driver, pool, name, share
//! and CDI devices, as the kubelet's `GetDynamicResources`. A container's
//! `cpu_ids` are its exclusive CPUs from the CPU manager (none under the
//! `none` policy, or for a container on the shared pool), and
//! `GetAllocatableResources` lists the CPUs the static policy may give. The
//! memory manager's `Static` policy reports each container's memory blocks
//! and each NUMA node's allocatable memory (empty under `None`, as the
//! kubelet's). A device's NUMA topology is reported when its plugin gave
//! one.

use std::num::NonZeroU32;
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Container, Pod};
use tonic::{Request, Response, Status};
use tracing::info;

use crate::device_manager::{DeviceManager, DevicesByResource, Topology};
use crate::metrics::{PodResourcesCall, metrics};
use crate::proto::podresources::v1;
use crate::proto::podresources::v1alpha1 as alpha;

/// The directory of the socket under the agent's root directory (the
/// kubelet's `DefaultKubeletPodResourcesDirName`).
pub const DIR_NAME: &str = "pod-resources";
/// The socket's file name (`podresources.Socket`, with `.sock`).
pub const SOCKET: &str = "kubelet.sock";
/// Calls allowed a second, all together (`podresources.DefaultQPS`).
pub const QPS: u32 = 100;
/// Calls allowed at once above the rate (`podresources.DefaultBurstTokens`).
pub const BURST: u32 = 10;
/// The status message of a call over the rate limit (the kubelet's
/// `ErrorLimitExceeded`).
pub const RATE_LIMITED: &str = "rejected by rate limit";

/// Errors starting the service: the socket could not be made.
pub use crate::grpc_socket::Error;

/// Which pods a call lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pods {
    /// The active pods (the kubelet's `GetActivePods`): bound here and not
    /// finished.
    Active,
    /// Every pod the agent has, finished ones too (`GetPods`).
    All,
}

/// The pods of the node, as the agent's pod sources hold them.
pub type PodsProvider = Arc<dyn Fn(Pods) -> Vec<Arc<Pod>> + Send + Sync>;

/// Devices as the API lists them: one entry per device and NUMA node it
/// sits on, each with that one node, or one without topology for a device
/// that has none (the kubelet's `containerDevicesFromResourceDeviceInstances`),
/// from resource → (device ID, NUMA nodes).
fn container_devices(given: &[(String, Vec<(String, Topology)>)]) -> Vec<v1::ContainerDevices> {
    let mut out = Vec::new();
    for (resource, devices) in given {
        for (id, numa) in devices {
            let entry = |topology| v1::ContainerDevices {
                resource_name: resource.clone(),
                device_ids: vec![id.clone()],
                topology,
            };
            if numa.is_empty() {
                out.push(entry(None));
            }
            for &node in numa {
                out.push(entry(Some(v1::TopologyInfo {
                    nodes: vec![v1::NumaNode { id: node }],
                })));
            }
        }
    }
    out
}

/// A container's dynamic resources: each claim of `claims` with its
/// devices, driver by driver, as the kubelet's `GetDynamicResources` (but
/// each device with its own CDI devices). Pure.
pub fn dynamic_resources(claims: &[crate::dra::cache::ClaimInfo]) -> Vec<v1::DynamicResource> {
    claims
        .iter()
        .map(|claim| v1::DynamicResource {
            claim_name: claim.name.clone(),
            claim_namespace: claim.namespace.clone(),
            claim_resources: claim
                .drivers
                .iter()
                .flat_map(|(driver, devices)| {
                    devices.iter().map(move |d| v1::ClaimResource {
                        cdi_devices: d
                            .cdi_device_ids
                            .iter()
                            .map(|name| v1::CdiDevice { name: name.clone() })
                            .collect(),
                        driver_name: driver.clone(),
                        pool_name: d.pool_name.clone(),
                        device_name: d.device_name.clone(),
                        share_id: d.share_id.clone(),
                    })
                })
                .collect(),
        })
        .collect()
}

/// A container's exclusive CPUs (`cpu_ids`) and memory blocks (`memory`).
pub type Pinned = (Vec<i64>, Vec<v1::ContainerMemory>);

/// Memory blocks as the API's `ContainerMemory`, one per block
/// (`memory_type`, `size` in bytes, the NUMA nodes).
#[must_use]
pub fn container_memory(blocks: &[crate::memory_manager::Block]) -> Vec<v1::ContainerMemory> {
    blocks
        .iter()
        .map(|b| v1::ContainerMemory {
            memory_type: b.type_.clone(),
            size: b.size,
            topology: Some(v1::TopologyInfo {
                nodes: b
                    .numa_affinity
                    .iter()
                    .filter_map(|n| i64::try_from(*n).ok())
                    .map(|id| v1::NumaNode { id })
                    .collect(),
            }),
        })
        .collect()
}

/// A pod's resources for v1 `List` and `Get`: its restartable init
/// containers (sidecars), then its regular containers, each with what
/// `devices` answers for (pod UID, container name) and the claims `claims`
/// answers for it ([`dynamic_resources`]), as the kubelet's
/// `v1PodResourcesServer`. Pure.
pub fn pod_resources(
    pod: &Pod,
    devices: impl Fn(&str, &str) -> DevicesByResource,
    pinned: impl Fn(&str, &str) -> Pinned,
    claims: impl Fn(&Container) -> Vec<crate::dra::cache::ClaimInfo>,
) -> v1::PodResources {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let sidecars = crate::pod_core::spec::init_containers(pod)
        .iter()
        .filter(|c| crate::pod_core::spec::is_sidecar(c));
    let regular = crate::pod_core::spec::main_containers(pod);
    let container = |c: &Container| {
        let (cpu_ids, memory) = pinned(uid, &c.name);
        v1::ContainerResources {
            name: c.name.clone(),
            devices: container_devices(&devices(uid, &c.name)),
            cpu_ids,
            memory,
            dynamic_resources: dynamic_resources(&claims(c)),
        }
    };
    v1::PodResources {
        name: pod.metadata.name.clone().unwrap_or_default(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        containers: sidecars.chain(regular).map(container).collect(),
        ..Default::default()
    }
}

/// A pod's resources for v1alpha1 `List`: its regular containers and their
/// devices (one entry per device, without topology), as the kubelet's `v1alpha1PodResourcesServer`. Pure.
pub fn alpha_pod_resources(
    pod: &Pod,
    devices: impl Fn(&str, &str) -> DevicesByResource,
) -> alpha::PodResources {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let regular = crate::pod_core::spec::main_containers(pod);
    let container = |c: &Container| alpha::ContainerResources {
        name: c.name.clone(),
        devices: container_devices(&devices(uid, &c.name))
            .into_iter()
            .map(|d| alpha::ContainerDevices {
                resource_name: d.resource_name,
                device_ids: d.device_ids,
            })
            .collect(),
    };
    alpha::PodResources {
        name: pod.metadata.name.clone().unwrap_or_default(),
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        containers: regular.iter().map(container).collect(),
    }
}

/// The node's allocatable resources for `GetAllocatableResources`: every
/// healthy device of `healthy` (resource → device IDs and topology), one
/// entry each, as the kubelet's `GetAllocatableDevices`, the CPUs the CPU
/// manager may give (`GetAllocatableCPUs`) and each NUMA node's
/// allocatable memory (`GetAllocatableMemory`). Pure.
#[must_use]
pub fn allocatable(
    healthy: &[(String, Vec<(String, Topology)>)],
    (cpu_ids, memory): Pinned,
) -> v1::AllocatableResourcesResponse {
    v1::AllocatableResourcesResponse {
        devices: container_devices(healthy),
        cpu_ids,
        memory,
    }
}

/// A CPU set as the API's `cpu_ids`.
fn ids(set: &crate::cpu_manager::CpuSet) -> Vec<i64> {
    set.iter().filter_map(|c| i64::try_from(c).ok()).collect()
}

/// The longest name a pod or namespace can have (a DNS subdomain): what an
/// error message repeats of a name the caller sent, so that a caller
/// sending megabytes does not get them back in a status header.
const MAX_NAME_SHOWN: usize = 253;

/// `name` as an error message repeats it: at most [`MAX_NAME_SHOWN`] bytes
/// (no name that long exists, so nothing real is cut).
fn shown(name: &str) -> &str {
    &name[..name.floor_char_boundary(MAX_NAME_SHOWN)]
}

/// The shared state of both API versions.
struct Inner {
    pods: PodsProvider,
    devices: Option<DeviceManager>,
    cpus: Option<crate::cpu_manager::CpuManager>,
    memory: Option<crate::memory_manager::MemoryManager>,
    dra: Option<crate::dra::DraManager>,
    limiter: governor::DefaultDirectRateLimiter,
}

impl Inner {
    /// Admits a call under the rate limit, then counts it for `version`
    /// (and `call`, when the version counts calls one by one).
    fn admit(&self, version: &str, call: Option<PodResourcesCall>) -> Result<(), Status> {
        if self.limiter.check().is_err() {
            return Err(Status::resource_exhausted(RATE_LIMITED));
        }
        metrics().pod_resources_request(version, call);
        Ok(())
    }

    fn devices(&self, uid: &str, container: &str) -> DevicesByResource {
        self.devices
            .as_ref()
            .map(|d| d.devices(uid, container))
            .unwrap_or_default()
    }

    fn pinned(&self, uid: &str, container: &str) -> Pinned {
        let cpus = self
            .cpus
            .as_ref()
            .and_then(|m| m.exclusive(uid, container))
            .map(|set| ids(&set))
            .unwrap_or_default();
        let memory = self
            .memory
            .as_ref()
            .map(|m| container_memory(&m.blocks(uid, container)))
            .unwrap_or_default();
        (cpus, memory)
    }

    fn claims(&self, pod: &Pod, c: &Container) -> Vec<crate::dra::cache::ClaimInfo> {
        self.dra
            .as_ref()
            .map(|d| d.container_claims(pod, c))
            .unwrap_or_default()
    }
}

/// `v1.PodResourcesLister`.
#[derive(Clone)]
struct V1Service(Arc<Inner>);

#[tonic::async_trait]
impl v1::pod_resources_lister_server::PodResourcesLister for V1Service {
    async fn list(
        &self,
        _: Request<v1::ListPodResourcesRequest>,
    ) -> Result<Response<v1::ListPodResourcesResponse>, Status> {
        let s = &self.0;
        s.admit("v1", Some(PodResourcesCall::List))?;
        let pod_resources = (s.pods)(Pods::Active)
            .iter()
            .map(|p| {
                pod_resources(
                    p,
                    |u, c| s.devices(u, c),
                    |u, c| s.pinned(u, c),
                    |c| s.claims(p, c),
                )
            })
            .collect();
        Ok(Response::new(v1::ListPodResourcesResponse {
            pod_resources,
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<v1::AllocatableResourcesRequest>,
    ) -> Result<Response<v1::AllocatableResourcesResponse>, Status> {
        let s = &self.0;
        s.admit("v1", Some(PodResourcesCall::GetAllocatable))?;
        let healthy = s
            .devices
            .as_ref()
            .map(DeviceManager::allocatable_devices)
            .unwrap_or_default();
        let cpus = s
            .cpus
            .as_ref()
            .map(|m| ids(&m.allocatable()))
            .unwrap_or_default();
        let memory = s
            .memory
            .as_ref()
            .map(|m| container_memory(&m.allocatable()))
            .unwrap_or_default();
        Ok(Response::new(allocatable(&healthy, (cpus, memory))))
    }

    async fn get(
        &self,
        request: Request<v1::GetPodResourcesRequest>,
    ) -> Result<Response<v1::GetPodResourcesResponse>, Status> {
        let s = &self.0;
        s.admit("v1", Some(PodResourcesCall::Get))?;
        let r = request.into_inner();
        let pod = (s.pods)(Pods::Active).into_iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(r.pod_namespace.as_str())
                && p.metadata.name.as_deref() == Some(r.pod_name.as_str())
        });
        let Some(pod) = pod else {
            metrics().pod_resources_get_failed("v1");
            return Err(Status::unknown(format!(
                "pod {} in namespace {} not found",
                shown(&r.pod_name),
                shown(&r.pod_namespace)
            )));
        };
        Ok(Response::new(v1::GetPodResourcesResponse {
            pod_resources: Some(pod_resources(
                &pod,
                |u, c| s.devices(u, c),
                |u, c| s.pinned(u, c),
                |c| s.claims(&pod, c),
            )),
        }))
    }
}

/// `v1alpha1.PodResourcesLister`.
#[derive(Clone)]
struct AlphaService(Arc<Inner>);

#[tonic::async_trait]
impl alpha::pod_resources_lister_server::PodResourcesLister for AlphaService {
    async fn list(
        &self,
        _: Request<alpha::ListPodResourcesRequest>,
    ) -> Result<Response<alpha::ListPodResourcesResponse>, Status> {
        let s = &self.0;
        s.admit("v1alpha1", None)?;
        let pod_resources = (s.pods)(Pods::All)
            .iter()
            .map(|p| alpha_pod_resources(p, |u, c| s.devices(u, c)))
            .collect();
        Ok(Response::new(alpha::ListPodResourcesResponse {
            pod_resources,
        }))
    }
}

/// Serves both API versions on [`SOCKET`] in `<root_dir>/`[`DIR_NAME`]
/// (made with mode 0750 when missing; a stale socket is removed), with the
/// node's pods from `pods`, the device plugins' devices from `devices` and
/// the prepared ResourceClaims from `dra`, until the task is aborted.
///
/// # Errors
/// The directory or the socket cannot be made.
pub fn serve(
    root_dir: &Path,
    pods: PodsProvider,
    devices: Option<DeviceManager>,
    cpus: Option<crate::cpu_manager::CpuManager>,
    memory: Option<crate::memory_manager::MemoryManager>,
    dra: Option<crate::dra::DraManager>,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    let socket = root_dir.join(DIR_NAME).join(SOCKET);
    let burst = NonZeroU32::new(BURST).unwrap_or(NonZeroU32::MIN);
    let qps = NonZeroU32::new(QPS).unwrap_or(NonZeroU32::MIN);
    let inner = Arc::new(Inner {
        pods,
        devices,
        cpus,
        memory,
        dra,
        limiter: governor::RateLimiter::direct(governor::Quota::per_second(qps).allow_burst(burst)),
    });
    let router = tonic::transport::Server::builder()
        .add_service(
            v1::pod_resources_lister_server::PodResourcesListerServer::new(V1Service(
                inner.clone(),
            )),
        )
        .add_service(
            alpha::pod_resources_lister_server::PodResourcesListerServer::new(AlphaService(inner)),
        );
    let server = crate::grpc_socket::serve(&socket, 0o750, router, "pod resources")?;
    info!(socket = %socket.display(), "serving the pod resources API");
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;
    use v1::pod_resources_lister_client::PodResourcesListerClient;

    const GPU: &str = "example.com/gpu";

    /// Devices as a device manager would give them: container `c1` of pod
    /// `uid-web` has `gpu-0` (no topology) and `gpu-1` (NUMA node 1).
    fn given(uid: &str, container: &str) -> crate::device_manager::DevicesByResource {
        if uid == "uid-web" && container == "c1" {
            vec![(
                GPU.into(),
                vec![("gpu-0".into(), vec![]), ("gpu-1".into(), vec![1])],
            )]
        } else {
            Vec::new()
        }
    }

    fn web() -> Pod {
        pod("web")
            .init_container("setup", "busybox")
            .sidecar("proxy", "busybox")
            .container("c1", "busybox")
            .container("c2", "busybox")
            .build()
    }

    #[test]
    fn a_pod_lists_its_sidecars_then_its_containers_each_device_on_its_own() {
        let cpus = |_: &str, c: &str| {
            if c == "c2" {
                let block = crate::memory_manager::Block {
                    numa_affinity: vec![0],
                    type_: "memory".into(),
                    size: 1 << 30,
                };
                (vec![1, 3], container_memory(&[block]))
            } else {
                (Vec::new(), Vec::new())
            }
        };
        let r = pod_resources(&web(), given, cpus, |_| Vec::new());
        assert_eq!((r.name.as_str(), r.namespace.as_str()), ("web", "default"));
        assert_eq!(
            r.containers[2].cpu_ids,
            [1, 3],
            "a container's exclusive CPUs"
        );
        let names: Vec<&str> = r.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["proxy", "c1", "c2"], "no regular init container");
        assert_eq!(
            r.containers[1].devices,
            vec![
                v1::ContainerDevices {
                    resource_name: GPU.into(),
                    device_ids: vec!["gpu-0".into()],
                    topology: None,
                },
                v1::ContainerDevices {
                    resource_name: GPU.into(),
                    device_ids: vec!["gpu-1".into()],
                    topology: Some(v1::TopologyInfo {
                        nodes: vec![v1::NumaNode { id: 1 }],
                    }),
                },
            ]
        );
        assert!(r.containers[0].devices.is_empty());
        assert!(r.cpu_ids.is_empty() && r.containers[1].cpu_ids.is_empty());

        let a = alpha_pod_resources(&web(), given);
        let names: Vec<&str> = a.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["c1", "c2"], "v1alpha1: regular containers only");
        let ids: Vec<&[String]> = a.containers[0]
            .devices
            .iter()
            .map(|d| d.device_ids.as_slice())
            .collect();
        assert_eq!(ids, [["gpu-0".to_string()], ["gpu-1".to_string()]]);
    }

    #[test]
    fn a_containers_claims_list_each_device_with_its_driver_and_cdi_devices() {
        use crate::dra::cache::{ClaimInfo, Device};
        let claim = ClaimInfo {
            uid: "claim-uid".into(),
            name: "web-gpu-x7".into(),
            namespace: "default".into(),
            drivers: std::collections::BTreeMap::from([(
                "gpu.example.com".to_string(),
                vec![
                    Device {
                        pool_name: "node-1".into(),
                        device_name: "gpu-0".into(),
                        cdi_device_ids: vec!["example.com/gpu=0".into()],
                        ..Default::default()
                    },
                    Device {
                        pool_name: "node-1".into(),
                        device_name: "gpu-1".into(),
                        share_id: Some("share-1".into()),
                        cdi_device_ids: vec!["example.com/gpu=1".into()],
                        ..Default::default()
                    },
                ],
            )]),
            ..Default::default()
        };
        let r = pod_resources(
            &web(),
            given,
            |_, _| (Vec::new(), Vec::new()),
            |c| {
                if c.name == "c1" {
                    vec![claim.clone()]
                } else {
                    Vec::new()
                }
            },
        );
        let c1 = r.containers.iter().find(|c| c.name == "c1").unwrap();
        let dynamic = &c1.dynamic_resources;
        assert_eq!(dynamic.len(), 1);
        assert_eq!(
            (
                dynamic[0].claim_name.as_str(),
                dynamic[0].claim_namespace.as_str()
            ),
            ("web-gpu-x7", "default")
        );
        let devices: Vec<(&str, &str, Option<&str>, Vec<&str>)> = dynamic[0]
            .claim_resources
            .iter()
            .map(|d| {
                (
                    d.driver_name.as_str(),
                    d.device_name.as_str(),
                    d.share_id.as_deref(),
                    d.cdi_devices.iter().map(|c| c.name.as_str()).collect(),
                )
            })
            .collect();
        assert_eq!(
            devices,
            [
                ("gpu.example.com", "gpu-0", None, vec!["example.com/gpu=0"]),
                (
                    "gpu.example.com",
                    "gpu-1",
                    Some("share-1"),
                    vec!["example.com/gpu=1"]
                ),
            ]
        );
        assert!(
            r.containers
                .iter()
                .filter(|c| c.name != "c1")
                .all(|c| c.dynamic_resources.is_empty())
        );
    }

    #[test]
    fn allocatable_lists_one_entry_per_healthy_device_and_numa_node() {
        let healthy = vec![
            (GPU.to_string(), vec![("a".to_string(), vec![0, 1])]),
            (
                "example.com/nic".to_string(),
                vec![("n".to_string(), vec![])],
            ),
        ];
        let r = allocatable(&healthy, (vec![1], Vec::new()));
        assert_eq!(r.cpu_ids, [1]);
        assert_eq!(
            r.devices.len(),
            3,
            "one entry per NUMA node of `a`, one for `n`"
        );
        for (i, node) in [0, 1].into_iter().enumerate() {
            assert_eq!(r.devices[i].device_ids, ["a"]);
            assert_eq!(
                r.devices[i].topology,
                Some(v1::TopologyInfo {
                    nodes: vec![v1::NumaNode { id: node }],
                })
            );
        }
        assert_eq!(r.devices[2].device_ids, ["n"]);
        assert_eq!(r.devices[2].topology, None);
        assert!(
            allocatable(&[], (Vec::new(), Vec::new()))
                .devices
                .is_empty()
        );
    }

    /// The server on a socket: the calls, their errors and metrics, the rate
    /// limit, and the socket made anew over a stale file.
    #[tokio::test]
    async fn the_server_answers_both_versions_counts_its_calls_and_limits_their_rate() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join(DIR_NAME);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(SOCKET), "stale").unwrap();
        let mut done = web();
        done.metadata.name = Some("done".into());
        done.metadata.uid = Some("uid-done".into());
        done.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        let (running, done) = (Arc::new(web()), Arc::new(done));
        let lister: PodsProvider = Arc::new(move |which| match which {
            Pods::Active => vec![running.clone()],
            Pods::All => vec![running.clone(), done.clone()],
        });
        let server = serve(root.path(), lister, None, None, None, None).unwrap();
        let channel = crate::cri::unix_channel(dir.join(SOCKET)).await.unwrap();
        let mut client = PodResourcesListerClient::new(channel.clone());
        let before = |f: &Family| f.get_or_create(&v1_label()).get();
        let m = metrics();
        let (list0, get0, alloc0, err0) = (
            before(&m.pod_resources_requests_list),
            before(&m.pod_resources_requests_get),
            before(&m.pod_resources_requests_get_allocatable),
            before(&m.pod_resources_errors_get),
        );

        let list = client
            .list(v1::ListPodResourcesRequest {})
            .await
            .unwrap()
            .into_inner();
        let names: Vec<&str> = list.pod_resources.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["web"], "active pods only");
        let got = client
            .get(v1::GetPodResourcesRequest {
                pod_name: "web".into(),
                pod_namespace: "default".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(got.pod_resources.unwrap().containers.len(), 3);
        let missing = client
            .get(v1::GetPodResourcesRequest {
                pod_name: "done".into(),
                pod_namespace: "default".into(),
            })
            .await
            .unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Unknown);
        assert_eq!(missing.message(), "pod done in namespace default not found");
        // A name of a megabyte is not found, like any other.
        let huge = "n".repeat(1 << 20);
        let err = client
            .get(v1::GetPodResourcesRequest {
                pod_name: huge.clone(),
                pod_namespace: huge,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unknown, "{}", err.message());
        assert!(err.message().len() < 600, "the name is not sent back whole");
        let alloc = client
            .get_allocatable_resources(v1::AllocatableResourcesRequest {})
            .await
            .unwrap()
            .into_inner();
        assert!(alloc.devices.is_empty(), "no device manager, no devices");
        let alpha_list = alpha::pod_resources_lister_client::PodResourcesListerClient::new(channel)
            .list(alpha::ListPodResourcesRequest {})
            .await
            .unwrap()
            .into_inner();
        let names: Vec<&str> = alpha_list
            .pod_resources
            .iter()
            .map(|p| p.name.as_str())
            .collect();
        assert_eq!(names, ["web", "done"], "v1alpha1 lists every pod");

        // Counted (other tests of the process may count too: at least).
        assert!(before(&m.pod_resources_requests_list) > list0);
        assert!(before(&m.pod_resources_requests_get) >= get0 + 2);
        assert!(before(&m.pod_resources_requests_get_allocatable) > alloc0);
        assert!(before(&m.pod_resources_errors_get) > err0);

        // 200 calls at once, far above 100 a second with bursts of 10.
        let calls = (0..200).map(|_| {
            let mut c = client.clone();
            async move { c.list(v1::ListPodResourcesRequest {}).await }
        });
        let results = futures::future::join_all(calls).await;
        let limited: Vec<&Status> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        assert!(!limited.is_empty(), "no call was rate limited");
        assert!(
            limited
                .iter()
                .all(|s| s.code() == tonic::Code::ResourceExhausted && s.message() == RATE_LIMITED),
            "{limited:?}"
        );
        server.abort();
    }

    type Family = prometheus_client::metrics::family::Family<
        crate::metrics::ApiVersion,
        crate::metrics::PlainCounter,
    >;

    fn v1_label() -> crate::metrics::ApiVersion {
        crate::metrics::ApiVersion {
            server_api_version: "v1".into(),
        }
    }

    #[test]
    fn the_per_call_counters_keep_the_kubelets_names() {
        metrics().pod_resources_request("v1", Some(PodResourcesCall::List));
        let text = metrics().encode().unwrap();
        assert!(
            text.contains("# TYPE kubelet_pod_resources_endpoint_requests_list counter\n"),
            "{text}"
        );
        assert!(
            text.lines().any(|l| l.starts_with(
                "kubelet_pod_resources_endpoint_requests_list{server_api_version=\"v1\"} "
            )),
            "{text}"
        );
        assert!(
            text.lines().any(|l| l.starts_with(
                "kubelet_pod_resources_endpoint_requests_total{server_api_version=\"v1\"} "
            )),
            "{text}"
        );
    }
}
