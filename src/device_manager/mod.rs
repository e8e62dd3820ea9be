//! The device manager, as the kubelet's (pkg/kubelet/cm/devicemanager with
//! its v1beta1 plugin server): device plugins advertise devices (GPUs, NICs,
//! test devices) as extended resources of the Node and give them to the
//! containers that ask for them in their limits.
//!
//! - The agent serves `v1beta1.Registration` on `kubelet.sock` in the device
//!   plugin directory (`/var/lib/kubelet/device-plugins`, where every device
//!   plugin looks for it). A plugin registers its socket (a file name in that
//!   directory) and its resource name; the agent checks the version
//!   (`v1beta1`) and the name (an extended resource), asks the plugin
//!   `GetDevicePluginOptions` (a failure refuses the registration, with the
//!   kubelet's `failed to get device plugin options: …`), then follows its
//!   `ListAndWatch` stream, which is never asked again once it ends.
//! - The Node's capacity counts a resource's devices, its allocatable the
//!   healthy ones. When the stream ends (the plugin failed or stopped) every
//!   device turns unhealthy; five minutes later the resource is dropped and
//!   reported as zero, unless the plugin registered again.
//! - A pod admitted with devices in its containers' limits gets them then
//!   (healthy devices no active pod holds, the plugin's preferred ones first
//!   when it offers `GetPreferredAllocation`), through `Allocate`; a pod that
//!   cannot is rejected with `UnexpectedAdmissionError`. Each container is
//!   created with what the plugin answered: environment, mounts, device nodes,
//!   annotations and CDI devices; `PreStartContainer` first when the plugin
//!   asked for it.
//!
//! What each container was given is kept in a checkpoint file in the
//! directory ([`CHECKPOINT`], as the kubelet's `kubelet_internal_checkpoint`),
//! written on every change: an agent started again knows which devices its
//! running containers hold, gives them to no other pod, and creates a
//! container again with the same devices and the plugin's same answer.

pub mod state;
pub mod topology;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::proto::deviceplugin::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    PreStartContainerRequest, PreferredAllocationRequest, RegisterRequest,
    device_plugin_client::DevicePluginClient,
    registration_server::{Registration, RegistrationServer},
};
pub use state::{Allocation, DeviceResources, DevicesByResource, Options, STOP_GRACE, Topology};
use state::{ContainerKey, Plan, State};
use topology::PreferredRequest;

use crate::topology_manager::{NumaMask, ProviderHints};

/// Where device plugins and the agent's registration socket live (the
/// kubelet's `DevicePluginPath`, the same whatever its root directory).
pub const DEFAULT_DIR: &str = "/var/lib/kubelet/device-plugins";
/// The file name of the agent's registration socket (`KubeletSocket`).
pub const SOCKET: &str = "kubelet.sock";
/// The file name of the checkpoint of the devices given to containers.
pub const CHECKPOINT: &str = "rustlet_internal_checkpoint";
/// The most of the checkpoint file read, bytes (a longer one is cut, and
/// then unreadable: ignored). Bounds what a file planted there costs.
pub const MAX_CHECKPOINT_BYTES: u64 = 4 << 20;
/// The device plugin API version the agent speaks.
pub const VERSION: &str = "v1beta1";
/// How long a call to a plugin may take (connection, options, allocation).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `PreStartContainer` may take (the kubelet's
/// `KubeletPreStartContainerRPCTimeoutInSecs`).
pub const PRE_START_TIMEOUT: Duration = Duration::from_secs(30);
/// The health a device plugin reports for a usable device.
pub const HEALTHY: &str = "Healthy";

/// Errors starting the device manager: the registration socket could not be made.
pub use crate::grpc_socket::Error;

/// A registered plugin: its registration, its client, and the task that
/// follows its `ListAndWatch` (aborted when a new registration replaces it).
#[derive(Clone)]
struct Plugin {
    generation: u64,
    client: DevicePluginClient<Channel>,
    watcher: Option<tokio::task::AbortHandle>,
}

struct Inner {
    dir: PathBuf,
    state: Mutex<State>,
    plugins: Mutex<HashMap<String, Plugin>>,
    /// Serializes allocations: two pods admitted at once never get the same
    /// device.
    allocating: tokio::sync::Mutex<()>,
    /// Bumped on every change of the resources the Node reports.
    changed: watch::Sender<u64>,
    /// Serializes checkpoint writes, so that the last write holds the
    /// latest state.
    saving: Mutex<()>,
}

/// The device manager; cheap to clone, shared by the node status loop, the
/// pod workers and the runtime manager.
#[derive(Clone)]
pub struct DeviceManager {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DeviceManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceManager")
            .field("dir", &self.inner.dir)
            .finish_non_exhaustive()
    }
}

/// What a container gets from the devices it was given: the plugins'
/// answers, merged (the kubelet's `DeviceRunContainerOptions`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunOptions {
    /// Environment variables (name → value).
    pub envs: BTreeMap<String, String>,
    /// Bind mounts.
    pub mounts: Vec<cri::Mount>,
    /// Device nodes.
    pub devices: Vec<cri::Device>,
    /// Annotations for the runtime.
    pub annotations: BTreeMap<String, String>,
    /// CDI device names.
    pub cdi_devices: Vec<String>,
}

impl RunOptions {
    /// Adds these options to a container's CRI config: environment
    /// variables after the container's own (the plugin's win where both
    /// set one), mounts and devices not already there (by container path),
    /// annotations, CDI devices.
    pub fn apply(&self, config: &mut cri::ContainerConfig) {
        for (k, v) in &self.envs {
            config.envs.retain(|e| &e.key != k);
            config.envs.push(cri::KeyValue {
                key: k.clone(),
                value: v.clone(),
            });
        }
        for m in &self.mounts {
            if !config
                .mounts
                .iter()
                .any(|x| x.container_path == m.container_path)
            {
                config.mounts.push(m.clone());
            }
        }
        for d in &self.devices {
            if !config
                .devices
                .iter()
                .any(|x| x.container_path == d.container_path)
            {
                config.devices.push(d.clone());
            }
        }
        for (k, v) in &self.annotations {
            config.annotations.insert(k.clone(), v.clone());
        }
        for name in &self.cdi_devices {
            if !config.cdi_devices.iter().any(|c| &c.name == name) {
                config
                    .cdi_devices
                    .push(cri::CdiDevice { name: name.clone() });
            }
        }
    }
}

/// The options of the allocations of one container, in resource order.
fn run_options(allocations: &BTreeMap<String, Allocation>) -> RunOptions {
    let mut out = RunOptions::default();
    for a in allocations.values() {
        let r = &a.response;
        out.envs.extend(r.envs.clone());
        out.mounts.extend(r.mounts.iter().map(|m| cri::Mount {
            container_path: m.container_path.clone(),
            host_path: m.host_path.clone(),
            readonly: m.read_only,
            ..cri::Mount::default()
        }));
        out.devices.extend(r.devices.iter().map(|d| cri::Device {
            container_path: d.container_path.clone(),
            host_path: d.host_path.clone(),
            permissions: d.permissions.clone(),
        }));
        out.annotations.extend(r.annotations.clone());
        out.cdi_devices
            .extend(r.cdi_devices.iter().map(|c| c.name.clone()));
    }
    out
}

/// The device counts container `c` asks for: its limits of extended
/// resources (for which requests equal limits), whole units, positive;
/// a count too large to hold is `usize::MAX`.
fn device_requests(c: &Container) -> Vec<(String, usize)> {
    c.resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .into_iter()
        .flatten()
        .filter(|(name, _)| crate::resource::is_extended_resource(name))
        .filter_map(|(name, q)| {
            // A count beyond any node's is asked as such (and refused), not
            // dropped: `1e30` devices is never zero devices.
            let n = crate::resource::Quantity::parse_saturating(&q.0)
                .ok()?
                .value();
            (n > 0).then(|| (name.clone(), usize::try_from(n).unwrap_or(usize::MAX)))
        })
        .collect()
}

/// The names of `pod`'s init containers that are not sidecars: what they
/// were given, its later containers may reuse.
fn regular_init_containers(pod: &Pod) -> std::collections::BTreeSet<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| !crate::pod_core::spec::is_sidecar(c))
        .map(|c| c.name.clone())
        .collect()
}

/// True for a resource name a device plugin may register: an extended
/// resource whose domain is a DNS subdomain and whose name is a DNS-style
/// label of at most 63 characters (letters, digits, `-`, `_`, `.`), as the
/// kubelet's `IsExtendedResourceName` with its qualified-name check.
#[must_use]
pub fn valid_resource_name(name: &str) -> bool {
    let Some((domain, local)) = name.split_once('/') else {
        return false;
    };
    let local_ok = !local.is_empty()
        && local.len() <= 63
        && local
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && local.starts_with(|c: char| c.is_ascii_alphanumeric())
        && local.ends_with(|c: char| c.is_ascii_alphanumeric());
    crate::resource::is_extended_resource(name)
        && crate::names::is_dns1123_subdomain(domain)
        && local_ok
}

/// A gRPC error as the kubelet's messages quote one (`rpc error: code =
/// Unknown desc = …`).
fn rpc_error(s: &Status) -> String {
    format!("rpc error: code = {:?} desc = {}", s.code(), s.message())
}

impl DeviceManager {
    /// A manager of the device plugins in `dir` (normally [`DEFAULT_DIR`]),
    /// serving nothing yet ([`DeviceManager::serve`]), with the devices its
    /// checkpoint there says containers hold and the resources it says were
    /// registered (none when it is missing, longer than
    /// [`MAX_CHECKPOINT_BYTES`] or unreadable: logged).
    #[must_use]
    pub fn new(dir: &Path) -> Self {
        let (changed, _) = watch::channel(0);
        let mut state = State::default();
        let path = dir.join(CHECKPOINT);
        // At most the bound, never blocking on what is not a regular file
        // (a FIFO planted there reads as empty).
        let max = usize::try_from(MAX_CHECKPOINT_BYTES).unwrap_or(usize::MAX);
        let read = crate::container::observe::read_at_most(&path, max)
            .and_then(|bytes| String::from_utf8(bytes).map_err(std::io::Error::other));
        match read {
            Ok(text) => match state.restore(&text, Instant::now()) {
                Ok(n) => info!(containers = n, "devices given before the restart"),
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "device checkpoint unreadable; no devices are held");
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                warn!(path = %path.display(), error = %e, "device checkpoint unreadable; no devices are held")
            }
        }
        Self {
            inner: Arc::new(Inner {
                dir: dir.to_path_buf(),
                state: Mutex::new(state),
                plugins: Mutex::new(HashMap::new()),
                allocating: tokio::sync::Mutex::new(()),
                changed,
                saving: Mutex::new(()),
            }),
        }
    }

    /// Writes the checkpoint of what containers were given; a failure is
    /// logged (the allocations stay in memory).
    fn save(&self) {
        let _serial = self
            .inner
            .saving
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let path = self.inner.dir.join(CHECKPOINT);
        let written = self
            .state()
            .checkpoint()
            .map_err(std::io::Error::other)
            .and_then(|text| {
                std::fs::create_dir_all(&self.inner.dir)?;
                crate::certificate::write_private(&path, &text, 0o600)
            });
        if let Err(e) = written {
            warn!(path = %path.display(), error = %e, "device checkpoint not written");
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn notify(&self) {
        self.inner.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver that sees every change of the resources the Node reports.
    #[must_use]
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.changed.subscribe()
    }

    /// Serves the registration socket ([`SOCKET`] in the directory, made
    /// anew: a stale one is removed), until the task is aborted.
    ///
    /// # Errors
    /// The directory or the socket cannot be made.
    pub fn serve(&self) -> Result<tokio::task::JoinHandle<()>, Error> {
        let socket = self.inner.dir.join(SOCKET);
        let router = tonic::transport::Server::builder().add_service(RegistrationServer::new(
            RegistrationService {
                manager: self.clone(),
            },
        ));
        let server =
            crate::grpc_socket::serve(&socket, 0o755, router, "device plugin registration")?;
        info!(socket = %socket.display(), "device plugin registration");
        Ok(server)
    }

    /// The device plugins' resources as the Node reports them at `now`.
    #[must_use]
    pub fn resources(&self, now: Instant) -> DeviceResources {
        self.state().resources(now)
    }

    /// The healthy devices of every resource, with their NUMA nodes (the
    /// kubelet's `GetAllocatableDevices`, for the pod resources API).
    #[must_use]
    pub fn allocatable_devices(&self) -> DevicesByResource {
        self.state().allocatable_devices()
    }

    /// The devices container `container` of the pod with UID `uid` was
    /// given, by resource, with their NUMA nodes (the kubelet's `GetDevices`).
    #[must_use]
    pub fn devices(&self, uid: &str, container: &str) -> DevicesByResource {
        self.state()
            .devices(&(uid.to_string(), container.to_string()))
    }

    /// A registration (`Register`), checked and connected as the kubelet's
    /// plugin server does it.
    async fn register(&self, r: RegisterRequest) -> Result<(), Status> {
        if r.version != VERSION {
            return Err(Status::invalid_argument(format!(
                "requested API version {:?} is not supported by kubelet. Supported version is [\"{VERSION}\"]",
                r.version
            )));
        }
        if !valid_resource_name(&r.resource_name) {
            return Err(Status::invalid_argument(format!(
                "the ResourceName {:?} is invalid",
                r.resource_name
            )));
        }
        // The socket is a file of the directory, never a path elsewhere.
        if r.endpoint.is_empty()
            || r.endpoint.contains('/')
            || r.endpoint == "."
            || r.endpoint == ".."
            || r.endpoint == SOCKET
        {
            return Err(Status::invalid_argument(format!(
                "the endpoint {:?} is not a socket file name in {}",
                r.endpoint,
                self.inner.dir.display()
            )));
        }
        let resource = r.resource_name;
        let socket = self.inner.dir.join(&r.endpoint);
        let channel = crate::cri::unix_channel(socket.clone())
            .await
            .map_err(|e| Status::unavailable(format!("failed to dial device plugin: {e}")))?;
        let mut client = DevicePluginClient::new(channel);
        let options =
            match tokio::time::timeout(CALL_TIMEOUT, client.get_device_plugin_options(Empty {}))
                .await
            {
                Ok(Ok(o)) => o.into_inner(),
                Ok(Err(s)) => {
                    return Err(Status::unknown(format!(
                        "failed to get device plugin options: {}",
                        rpc_error(&s)
                    )));
                }
                Err(_) => {
                    return Err(Status::deadline_exceeded(
                        "failed to get device plugin options: timed out",
                    ));
                }
            };
        let options = Options {
            pre_start_required: options.pre_start_required,
            preferred_allocation: options.get_preferred_allocation_available,
        };
        let Some(generation) = self.state().register(&resource, options) else {
            return Err(Status::resource_exhausted(format!(
                "too many device plugin resources ({}): {resource} refused",
                state::MAX_RESOURCES
            )));
        };
        info!(resource = %resource, socket = %socket.display(), "device plugin registered");
        let watcher = tokio::spawn(self.clone().list_and_watch(
            resource.clone(),
            generation,
            client.clone(),
        ));
        let replaced = self
            .inner
            .plugins
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                resource,
                Plugin {
                    generation,
                    client,
                    watcher: Some(watcher.abort_handle()),
                },
            );
        // The plugin it replaces is no longer followed.
        if let Some(w) = replaced.and_then(|p| p.watcher) {
            w.abort();
        }
        self.notify();
        Ok(())
    }

    /// Follows a plugin's `ListAndWatch` until it ends, then marks its
    /// devices unhealthy (never asked again: the plugin registers anew).
    async fn list_and_watch(
        self,
        resource: String,
        generation: u64,
        mut client: DevicePluginClient<Channel>,
    ) {
        match client.list_and_watch(Empty {}).await {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(m)) => {
                            if !self.state().is_current(&resource, generation) {
                                return;
                            }
                            let devices: Vec<state::Device> = m
                                .devices
                                .iter()
                                .take(state::MAX_DEVICES)
                                .map(|d| state::Device {
                                    id: d.id.clone(),
                                    healthy: d.health == HEALTHY,
                                    numa: d
                                        .topology
                                        .iter()
                                        .flat_map(|t| &t.nodes)
                                        .map(|n| n.id)
                                        .collect(),
                                })
                                .collect();
                            if self.state().update(&resource, generation, &devices) {
                                self.notify();
                            }
                        }
                        Ok(None) => {
                            warn!(resource = %resource, "ListAndWatch of the device plugin ended");
                            break;
                        }
                        Err(s) => {
                            warn!(resource = %resource, error = %rpc_error(&s), "ListAndWatch of the device plugin ended");
                            break;
                        }
                    }
                }
            }
            Err(s) => {
                warn!(resource = %resource, error = %rpc_error(&s), "ListAndWatch of the device plugin")
            }
        }
        if self
            .state()
            .disconnected(&resource, generation, Instant::now())
        {
            let mut plugins = self
                .inner
                .plugins
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if plugins
                .get(&resource)
                .is_some_and(|p| p.generation == generation)
            {
                plugins.remove(&resource);
            }
            drop(plugins);
            self.notify();
        }
    }

    fn plugin(&self, resource: &str) -> Option<Plugin> {
        self.inner
            .plugins
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(resource)
            .cloned()
    }

    /// Gives every container of `pod` (init containers first) the devices
    /// its limits ask for, with no NUMA affinity to follow, as
    /// [`DeviceManager::allocate`] does for each.
    ///
    /// # Errors
    /// As [`DeviceManager::allocate`].
    pub async fn allocate_pod(
        &self,
        pod: &Pod,
        active: impl Fn(&str) -> bool,
    ) -> Result<(), String> {
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(());
        };
        for c in spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
        {
            self.allocate(pod, c, &active, None).await?;
        }
        Ok(())
    }

    /// Gives container `c` of `pod` the devices its limits ask for, as the
    /// kubelet's device manager does when it admits a pod (its `Allocate`):
    /// the devices its pod's init containers held first (a sidecar keeps
    /// its own), then healthy devices no active pod holds (`active` on a
    /// pod's UID), those on the nodes of `affinity`, the topology manager's
    /// merged hint, first. Extended resources no plugin advertises are left
    /// alone; a container given devices before keeps them.
    ///
    /// # Errors
    /// Why the devices could not be given (the kubelet's messages), for the
    /// pod's `UnexpectedAdmissionError`.
    pub async fn allocate(
        &self,
        pod: &Pod,
        c: &Container,
        active: impl Fn(&str) -> bool,
        affinity: Option<NumaMask>,
    ) -> Result<(), String> {
        if device_requests(c).is_empty() {
            return Ok(());
        }
        let key = (pod.metadata.uid.clone().unwrap_or_default(), c.name.clone());
        let regular = regular_init_containers(pod);
        let _serial = self.inner.allocating.lock().await;
        self.allocate_container(&key, c, &active, &regular, affinity)
            .await
    }

    /// The device hints of container `c` of `pod`, by resource, for the
    /// topology manager (the kubelet's `GetTopologyHints`); `machine` holds
    /// the machine's NUMA nodes, `active` tells the pods whose devices are
    /// held. `None` when it asks for no device of a plugin.
    #[must_use]
    pub fn hints(
        &self,
        pod: &Pod,
        c: &Container,
        active: impl Fn(&str) -> bool,
        machine: &[usize],
    ) -> ProviderHints {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let regular = regular_init_containers(pod);
        let st = self.state();
        let hints: BTreeMap<_, _> = device_requests(c)
            .into_iter()
            .filter(|(resource, _)| st.is_device_resource(resource))
            .map(|(resource, requested)| {
                let allocated = st.held_by(uid, &resource, |n| n == c.name);
                let available = st.available(&resource, &active);
                let reusable = st.reusable(uid, &resource, |n| regular.contains(n));
                let hints = st
                    .topology(&resource)
                    .hints(requested, &allocated, &available, &reusable, machine);
                (resource, hints)
            })
            .collect();
        (!hints.is_empty()).then_some(hints)
    }

    /// The device hints of the whole of `pod` (scope `pod`, the kubelet's
    /// `GetPodTopologyHints`): its device limits as the pod's limits add
    /// them up.
    #[must_use]
    pub fn pod_hints(
        &self,
        pod: &Pod,
        active: impl Fn(&str) -> bool,
        machine: &[usize],
    ) -> ProviderHints {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let st = self.state();
        let hints: BTreeMap<_, _> = crate::pod_core::fit::pod_limits(pod)
            .into_iter()
            .filter(|(resource, _)| st.is_device_resource(resource))
            .filter_map(|(resource, q)| {
                let requested = usize::try_from(q.value()).ok()?;
                (requested > 0).then_some((resource, requested))
            })
            .map(|(resource, requested)| {
                let allocated = st.held_by(uid, &resource, |_| true);
                let available = st.available(&resource, &active);
                let hints =
                    st.topology(&resource)
                        .hints(requested, &allocated, &available, &[], machine);
                (resource, hints)
            })
            .collect();
        (!hints.is_empty()).then_some(hints)
    }

    /// Gives container `key` (`c`) its devices of each resource it asks for
    /// and has not been given yet.
    async fn allocate_container(
        &self,
        key: &ContainerKey,
        c: &Container,
        active: &impl Fn(&str) -> bool,
        regular: &std::collections::BTreeSet<String>,
        affinity: Option<NumaMask>,
    ) -> Result<(), String> {
        // One checkpoint write for the container, whatever it was given
        // before an error (as the kubelet writes once per allocation).
        let mut recorded = false;
        let result = self
            .allocate_resources(key, c, active, regular, affinity, &mut recorded)
            .await;
        if recorded {
            self.save();
        }
        result
    }

    /// [`DeviceManager::allocate_container`]'s allocations, each resource
    /// recorded in the state (`recorded` set), none written yet.
    async fn allocate_resources(
        &self,
        key: &ContainerKey,
        c: &Container,
        active: &impl Fn(&str) -> bool,
        regular: &std::collections::BTreeSet<String>,
        affinity: Option<NumaMask>,
        recorded: &mut bool,
    ) -> Result<(), String> {
        for (resource, needed) in device_requests(c) {
            let (known, given) = {
                let st = self.state();
                let given = st.allocated(key).is_some_and(|a| a.contains_key(&resource));
                (st.is_device_resource(&resource), given)
            };
            // Given once, a container keeps its devices (a restart reuses
            // them, healthy or not, as the kubelet's pod devices).
            if !known || given {
                continue;
            }
            let plugin = self
                .plugin(&resource)
                .ok_or_else(|| format!("unknown Device Plugin {resource}"))?;
            let options = self.state().options(&resource).unwrap_or_default();
            let plan = {
                let st = self.state();
                let reusable = st.reusable(&key.0, &resource, |n| regular.contains(n));
                st.plan(key, &resource, needed, active, &reusable, affinity)?
            };
            let devices = match plan {
                Plan::Keep(devices) => devices,
                Plan::Pick(picker) => {
                    let preferred = match picker.preferred_request() {
                        Some(request) if options.preferred_allocation => {
                            self.preferred(&plugin, request).await?
                        }
                        _ => Vec::new(),
                    };
                    picker.pick(&preferred)
                }
            };
            let mut client = plugin.client.clone();
            let request = AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: devices.clone(),
                }],
            };
            let response = match tokio::time::timeout(CALL_TIMEOUT, client.allocate(request)).await
            {
                Ok(Ok(r)) => r.into_inner(),
                Ok(Err(s)) => return Err(rpc_error(&s)),
                Err(_) => return Err(format!("Allocate of {resource} timed out")),
            };
            let Some(response) = response.container_responses.into_iter().next() else {
                return Err(format!(
                    "no containers return in allocation response for {resource}"
                ));
            };
            info!(pod = %key.0, container = %key.1, resource = %resource, ?devices, "devices allocated");
            self.state().record(
                key.clone(),
                &resource,
                Allocation {
                    devices,
                    response,
                    ..Allocation::default()
                },
            );
            *recorded = true;
        }
        Ok(())
    }

    /// The plugin's preferred devices for `request` (`GetPreferredAllocation`).
    async fn preferred(
        &self,
        plugin: &Plugin,
        request: PreferredRequest,
    ) -> Result<Vec<String>, String> {
        let mut client = plugin.client.clone();
        let request = PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: request.available,
                must_include_device_i_ds: request.must_include,
                allocation_size: i32::try_from(request.size).unwrap_or(i32::MAX),
            }],
        };
        match tokio::time::timeout(CALL_TIMEOUT, client.get_preferred_allocation(request)).await {
            Ok(Ok(r)) => Ok(r
                .into_inner()
                .container_responses
                .into_iter()
                .next()
                .map(|mut c| {
                    c.device_i_ds.truncate(state::MAX_DEVICES);
                    c.device_i_ds
                })
                .unwrap_or_default()),
            Ok(Err(s)) => Err(format!(
                "device plugin GetPreferredAllocation rpc failed with err: {}",
                rpc_error(&s)
            )),
            Err(_) => Err("device plugin GetPreferredAllocation rpc timed out".to_string()),
        }
    }

    /// What container `c` of `pod` is created with from its devices: given
    /// now if it has none yet (a container created again after an agent
    /// restart), then `PreStartContainer` of each plugin that asked for it
    /// (the kubelet's `GetDeviceRunContainerOptions`).
    ///
    /// # Errors
    /// The devices could not be given, or a `PreStartContainer` failed.
    pub async fn run_options(
        &self,
        pod: &Pod,
        c: &Container,
        active: impl Fn(&str) -> bool,
    ) -> Result<RunOptions, String> {
        if device_requests(c).is_empty() {
            return Ok(RunOptions::default());
        }
        let key = (pod.metadata.uid.clone().unwrap_or_default(), c.name.clone());
        {
            let regular = regular_init_containers(pod);
            let _serial = self.inner.allocating.lock().await;
            self.allocate_container(&key, c, &active, &regular, None)
                .await?;
        }
        let allocations = self.state().allocated(&key).cloned().unwrap_or_default();
        for (resource, a) in &allocations {
            let asked = self
                .state()
                .options(resource)
                .is_some_and(|o| o.pre_start_required);
            if !asked {
                continue;
            }
            let Some(plugin) = self.plugin(resource) else {
                return Err(format!(
                    "endpoint not found in cache for a registered resource: {resource}"
                ));
            };
            let mut client = plugin.client.clone();
            let request = PreStartContainerRequest {
                devices_ids: a.devices.clone(),
            };
            match tokio::time::timeout(PRE_START_TIMEOUT, client.pre_start_container(request)).await
            {
                Ok(Ok(_)) => {}
                Ok(Err(s)) => {
                    return Err(format!(
                        "device plugin PreStartContainer rpc failed with err: {}",
                        rpc_error(&s)
                    ));
                }
                Err(_) => {
                    return Err("device plugin PreStartContainer rpc timed out".to_string());
                }
            }
        }
        Ok(run_options(&allocations))
    }

    /// Forgets the devices of the pods `keep` rejects (by UID): they are free
    /// for other pods.
    pub fn release(&self, keep: impl Fn(&str) -> bool) {
        let n = self.state().release(keep);
        if n > 0 {
            info!(containers = n, "devices released");
            self.save();
        }
    }
}

/// The registration service on the agent's socket.
struct RegistrationService {
    manager: DeviceManager,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = request.into_inner();
        let resource = r.resource_name.clone();
        match self.manager.register(r).await {
            Ok(()) => Ok(Response::new(Empty {})),
            Err(s) => {
                warn!(resource = %resource, error = %s.message(), "device plugin registration refused");
                Err(s)
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod test_plugin;
#[cfg(test)]
mod tests;
