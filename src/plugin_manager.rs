//! The plugin manager, as the kubelet's (pkg/kubelet/pluginmanager) with its
//! CSI handler (pkg/volume/csi `RegistrationHandler`, `nodeinfomanager`):
//! a plugin registers by putting a unix socket in
//! `<root-dir>/plugins_registry` and serving `pluginregistration.Registration`
//! there (upstream `node-driver-registrar` does this for CSI drivers). For
//! each socket the manager asks `GetInfo`, checks the plugin (type
//! `CSIPlugin`, a supported version: major 1, the highest taken; not older
//! than a driver of that name already registered), asks the driver
//! `NodeGetInfo` on its endpoint, records it on the Node (the
//! `csi.volume.kubernetes.io/nodeid` annotation, its topology labels) and in
//! the node's `CSINode` (one entry per driver: node ID, topology keys,
//! allocatable volume count), and tells the plugin the outcome
//! (`NotifyRegistrationStatus`; a plugin that cannot be told is taken out
//! again, and tried again at the next pass). A socket that goes takes its
//! driver out again. The directory is read every second (the kubelet's reconciler
//! period), which also sees a socket made again under the same name; a
//! registration that failed is tried again at each pass.
//!
//! DRA drivers register the same way (type `DRAPlugin`, the kubelet's DRA
//! handler): their name is checked, and the DRA manager takes them
//! ([`crate::dra::DraManager::register_plugin`]).

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tracing::{info, warn};

use crate::proto::csi::{NodeGetInfoRequest, node_client::NodeClient};
use crate::proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, registration_client::RegistrationClient,
};

/// The registration directory under the root dir (the kubelet's
/// `plugins_registry`).
pub const REGISTRY_DIR: &str = "plugins_registry";
/// The directory drivers keep their own sockets in, under the root dir.
pub const PLUGINS_DIR: &str = "plugins";
/// The plugin type of CSI drivers.
pub const CSI_PLUGIN: &str = "CSIPlugin";
/// The Node annotation mapping each CSI driver to its node ID (JSON).
pub const NODE_ID_ANNOTATION: &str = "csi.volume.kubernetes.io/nodeid";
/// How often the registration directory is read.
pub const RESYNC: Duration = Duration::from_secs(1);
/// How long one call to a plugin may take (the kubelet's `csiTimeout`).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// A registered CSI driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Driver {
    /// Its name (e.g. `hostpath.csi.k8s.io`).
    pub name: String,
    /// The unix socket its CSI services are served on.
    pub endpoint: PathBuf,
    /// The highest CSI version both speak (`1.x.y`).
    pub version: (u64, u64, u64),
    /// Its ID of this node (`NodeGetInfo`).
    pub node_id: String,
}

/// The registered CSI drivers, by name; cheap to clone and share with the
/// volume manager.
#[derive(Clone, Debug, Default)]
pub struct Drivers(Arc<RwLock<BTreeMap<String, Driver>>>);

impl Drivers {
    /// The driver named `name`, if registered.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<Driver> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(name)
            .cloned()
    }

    /// The names of the registered drivers.
    #[must_use]
    pub fn names(&self) -> Vec<String> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// Registers `driver` directly (tests of its users).
    #[cfg(test)]
    pub fn set_for_test(&self, driver: Driver) {
        self.set(driver);
    }

    fn set(&self, driver: Driver) {
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(driver.name.clone(), driver);
    }

    fn remove(&self, name: &str) {
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
    }
}

/// The highest version of `versions` this agent speaks (major 1), as the
/// kubelet's `HighestSupportedVersion`; versions may start with `v`.
///
/// # Errors
/// None of them is supported (or the list is empty).
pub fn highest_supported(versions: &[String]) -> Result<(u64, u64, u64), String> {
    let parse = |v: &str| -> Option<(u64, u64, u64)> {
        let mut parts = v.trim_start_matches('v').split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next().map_or(Some(0), |p| p.parse().ok())?;
        let patch = parts.next().map_or(Some(0), |p| p.parse().ok())?;
        parts.next().is_none().then_some((major, minor, patch))
    };
    if versions.is_empty() {
        return Err("Plugin returned an empty list for supported versions".into());
    }
    versions
        .iter()
        .filter_map(|v| parse(v))
        .filter(|(major, _, _)| *major == 1)
        .max()
        .ok_or_else(|| format!("None of the versions specified {versions:?} are supported"))
}

/// One socket seen in the registration directory.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    /// The socket file's identity (device, inode, change time): a socket
    /// made again is a new registration.
    identity: (u64, u64, i64),
    /// What it registered (None: registration failed, tried again at the
    /// next pass).
    driver: Option<Registered>,
}

/// A plugin registered through a socket.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Registered {
    /// The CSI driver of this name.
    Csi(String),
    /// A kubelet plugin of DRA driver `driver`, serving on `endpoint`.
    Dra { driver: String, endpoint: PathBuf },
}

/// The plugin manager of one node.
pub struct PluginManager {
    client: Client,
    node_name: String,
    registry: PathBuf,
    drivers: Drivers,
    dra: Option<crate::dra::DraManager>,
    seen: HashMap<PathBuf, Seen>,
}

impl PluginManager {
    /// A manager of `<root_dir>/plugins_registry` for Node `node_name`,
    /// keeping registered drivers in `drivers`.
    #[must_use]
    pub fn new(client: Client, root_dir: &Path, node_name: &str, drivers: Drivers) -> Self {
        Self {
            client,
            node_name: node_name.to_string(),
            registry: root_dir.join(REGISTRY_DIR),
            drivers,
            dra: None,
            seen: HashMap::new(),
        }
    }

    /// The manager, registering DRA drivers with `dra` too (without it
    /// they are refused as a type with no handler).
    #[must_use]
    pub fn with_dra(mut self, dra: crate::dra::DraManager) -> Self {
        self.dra = Some(dra);
        self
    }

    /// Makes the registration and plugin directories, then registers and
    /// deregisters plugins as their sockets come and go, every [`RESYNC`],
    /// until the task is dropped.
    pub async fn run(mut self) {
        let plugins = self.registry.with_file_name(PLUGINS_DIR);
        for dir in [&self.registry, &plugins] {
            if let Err(e) = std::fs::create_dir_all(dir) {
                warn!(dir = %dir.display(), error = %e, "plugin directory not made; no plugins register");
                return;
            }
        }
        loop {
            self.sync().await;
            tokio::time::sleep(RESYNC).await;
        }
    }

    /// One pass: sockets new or made again are registered, gone ones
    /// deregistered.
    pub async fn sync(&mut self) {
        let now = sockets(&self.registry);
        let gone: Vec<PathBuf> = self
            .seen
            .keys()
            .filter(|p| !now.contains_key(*p))
            .cloned()
            .collect();
        for socket in gone {
            if let Some(Seen {
                driver: Some(r), ..
            }) = self.seen.remove(&socket)
            {
                self.deregister(&r).await;
            }
        }
        for (socket, identity) in now {
            // Registered and unchanged: nothing to do. A registration that
            // failed is tried again at each pass, as the kubelet's
            // reconciler does.
            if self
                .seen
                .get(&socket)
                .is_some_and(|s| s.identity == identity && s.driver.is_some())
            {
                continue;
            }
            if let Some(Seen {
                driver: Some(r), ..
            }) = self.seen.remove(&socket)
            {
                self.deregister(&r).await;
            }
            let driver = self.register(&socket).await;
            self.seen.insert(socket, Seen { identity, driver });
        }
    }

    /// Registers the plugin on `socket`; what it registered.
    async fn register(&self, socket: &Path) -> Option<Registered> {
        let channel = match crate::cri::unix_channel(socket.to_path_buf()).await {
            Ok(c) => c,
            Err(e) => {
                warn!(socket = %socket.display(), error = %e, "plugin socket does not answer");
                return None;
            }
        };
        let mut registration = RegistrationClient::new(channel);
        let info = match timed(registration.get_info(InfoRequest {})).await {
            Ok(info) => info,
            Err(e) => {
                warn!(socket = %socket.display(), error = %e, "plugin GetInfo failed");
                return None;
            }
        };
        let outcome = self.install(socket, &info).await;
        let status = RegistrationStatus {
            plugin_registered: outcome.is_ok(),
            error: outcome.as_ref().err().cloned().unwrap_or_default(),
        };
        if let Err(e) = timed(registration.notify_registration_status(status)).await {
            warn!(plugin = info.name, error = %e, "plugin NotifyRegistrationStatus failed");
            // A plugin not told it is registered is not (the kubelet's
            // operation generator deregisters it): tried again at the next
            // pass.
            if let Ok(r) = &outcome {
                self.deregister(r).await;
            }
            return None;
        }
        match outcome {
            Ok(r) => {
                info!(
                    driver = info.name,
                    r#type = info.r#type,
                    "plugin registered"
                );
                Some(r)
            }
            Err(e) => {
                warn!(plugin = info.name, error = %e, "plugin not registered");
                None
            }
        }
    }

    /// Validates and installs the plugin `info` registered on `socket`.
    async fn install(&self, socket: &Path, info: &PluginInfo) -> Result<Registered, String> {
        if info.r#type == crate::dra::plugins::DRA_PLUGIN
            && let Some(dra) = &self.dra
        {
            return install_dra(dra, socket, info);
        }
        if info.r#type != CSI_PLUGIN {
            return Err(format!(
                "no handler registered for plugin type: {}",
                info.r#type
            ));
        }
        let name = &info.name;
        // The driver's name becomes part of paths under the root dir: only
        // a CSI driver name (a DNS subdomain of at most 63 characters) is
        // taken.
        if name.len() > 63 || !crate::names::is_dns1123_subdomain(name) {
            return Err(format!(
                "validation failed for CSI Driver {name:?}: not a valid driver name"
            ));
        }
        let version = highest_supported(&info.supported_versions).map_err(|e| {
            format!(
                "validation failed for CSI Driver {name} at endpoint {}: {e}",
                info.endpoint
            )
        })?;
        if let Some(existing) = self.drivers.get(name)
            && existing.version >= version
        {
            return Err(format!(
                "RegisterPlugin for CSI driver {name:?} failed. Another driver with the same name is already registered with a higher supported version: {:?}",
                existing.version
            ));
        }
        let endpoint = if info.endpoint.is_empty() {
            socket.to_path_buf()
        } else {
            crate::cri::socket_path(&info.endpoint).map_err(|e| e.to_string())?
        };
        let channel = crate::cri::unix_channel(endpoint.clone())
            .await
            .map_err(|e| format!("CSI driver {name} at {}: {e}", endpoint.display()))?;
        let node_info = timed(NodeClient::new(channel).node_get_info(NodeGetInfoRequest {}))
            .await
            .map_err(|e| format!("NodeGetInfo of CSI driver {name}: {e}"))?;
        let topology = node_info
            .accessible_topology
            .map(|t| t.segments)
            .unwrap_or_default();
        self.update_node(name, Some((&node_info.node_id, &topology)))
            .await?;
        self.update_csi_node(
            name,
            Some((
                &node_info.node_id,
                &topology,
                node_info.max_volumes_per_node,
            )),
        )
        .await?;
        self.drivers.set(Driver {
            name: name.clone(),
            endpoint,
            version,
            node_id: node_info.node_id,
        });
        Ok(Registered::Csi(name.clone()))
    }

    /// Takes what a socket registered out: a DRA driver's plugin from the
    /// DRA manager, a CSI driver from the registry, the Node's annotation
    /// and the CSINode.
    async fn deregister(&self, r: &Registered) {
        let name = match r {
            Registered::Csi(name) => name,
            Registered::Dra { driver, endpoint } => {
                if let Some(dra) = &self.dra {
                    dra.deregister_plugin(driver, endpoint);
                }
                return;
            }
        };
        self.drivers.remove(name);
        if let Err(e) = self.update_node(name, None).await {
            warn!(driver = name, error = %e, "driver not taken off the Node");
        }
        if let Err(e) = self.update_csi_node(name, None).await {
            warn!(driver = name, error = %e, "driver not taken off the CSINode");
        }
        info!(driver = name, "CSI driver deregistered");
    }

    /// Puts driver `name`'s node ID into the Node's annotation and its
    /// topology into the Node's labels (`Some`), or takes the ID out
    /// (`None`), as the kubelet's `updateNodeIDInNode` and
    /// `updateTopologyLabels`.
    async fn update_node(
        &self,
        name: &str,
        install: Option<(&String, &std::collections::HashMap<String, String>)>,
    ) -> Result<(), String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = nodes
            .get(&self.node_name)
            .await
            .map_err(|e| format!("get Node {}: {e}", self.node_name))?;
        let mut ids: BTreeMap<String, String> = node
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NODE_ID_ANNOTATION))
            .and_then(|v| serde_json::from_str(v).ok())
            .unwrap_or_default();
        let mut patch = serde_json::json!({"metadata": {}});
        match install {
            Some((id, topology)) => {
                ids.insert(name.to_string(), id.clone());
                if !topology.is_empty() {
                    patch["metadata"]["labels"] = serde_json::json!(topology);
                }
            }
            None => {
                ids.remove(name);
            }
        }
        let value = if ids.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::Value::String(serde_json::to_string(&ids).map_err(|e| e.to_string())?)
        };
        patch["metadata"]["annotations"] = serde_json::json!({ NODE_ID_ANNOTATION: value });
        nodes
            .patch(
                &self.node_name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| format!("patch Node {}: {e}", self.node_name))?;
        Ok(())
    }

    /// Puts driver `name` into the node's CSINode (`Some`: node ID, topology,
    /// max volumes; made, owned by the Node, when missing) or takes it out
    /// (`None`), as the kubelet's `installDriverToCSINode` and
    /// `uninstallDriverFromCSINode`.
    async fn update_csi_node(
        &self,
        name: &str,
        install: Option<(&String, &std::collections::HashMap<String, String>, i64)>,
    ) -> Result<(), String> {
        let csi_nodes: Api<CSINode> = Api::all(self.client.clone());
        let existing = csi_nodes
            .get_opt(&self.node_name)
            .await
            .map_err(|e| format!("get CSINode {}: {e}", self.node_name))?;
        let made = existing.is_none();
        let mut csi_node = match existing {
            Some(n) => n,
            None if install.is_none() => return Ok(()),
            None => self.new_csi_node().await?,
        };
        let drivers = &mut csi_node.spec.drivers;
        drivers.retain(|d| d.name != name);
        if let Some((id, topology, max_volumes)) = install {
            let mut keys: Vec<String> = topology.keys().cloned().collect();
            keys.sort();
            let count = (max_volumes > 0).then(|| i32::try_from(max_volumes).unwrap_or(i32::MAX));
            drivers.push(CSINodeDriver {
                name: name.to_string(),
                node_id: id.clone(),
                topology_keys: (!keys.is_empty()).then_some(keys),
                allocatable: count.map(|c| VolumeNodeResources { count: Some(c) }),
            });
        }
        let written = if made {
            csi_nodes.create(&PostParams::default(), &csi_node).await
        } else {
            csi_nodes
                .replace(&self.node_name, &PostParams::default(), &csi_node)
                .await
        };
        written.map_err(|e| format!("write CSINode {}: {e}", self.node_name))?;
        Ok(())
    }

    /// A CSINode for this node, owned by its Node (so it goes with it).
    async fn new_csi_node(&self) -> Result<CSINode, String> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = nodes
            .get(&self.node_name)
            .await
            .map_err(|e| format!("get Node {}: {e}", self.node_name))?;
        Ok(CSINode {
            metadata: kube::api::ObjectMeta {
                name: Some(self.node_name.clone()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: self.node_name.clone(),
                    uid: node.metadata.uid.unwrap_or_default(),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: CSINodeSpec {
                drivers: Vec::new(),
            },
            status: None,
        })
    }
}

/// Checks DRA driver plugin `info`, registered on `socket`, and gives it
/// to `dra`: its name must be a driver name (a DNS subdomain of at most 63
/// characters, as ResourceSlices take it), its endpoint a unix socket.
fn install_dra(
    dra: &crate::dra::DraManager,
    socket: &Path,
    info: &PluginInfo,
) -> Result<Registered, String> {
    let name = &info.name;
    if name.len() > 63 || !crate::names::is_dns1123_subdomain(name) {
        return Err(format!(
            "validation failed for DRA driver {name:?}: not a valid driver name"
        ));
    }
    let endpoint = if info.endpoint.is_empty() {
        socket.to_path_buf()
    } else {
        crate::cri::socket_path(&info.endpoint).map_err(|e| e.to_string())?
    };
    dra.register_plugin(name, &endpoint, &info.supported_versions)?;
    Ok(Registered::Dra {
        driver: name.clone(),
        endpoint,
    })
}

/// The unix sockets in `dir` (not hidden files), with their identities.
fn sockets(dir: &Path) -> HashMap<PathBuf, (u64, u64, i64)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return HashMap::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .filter_map(|e| {
            let m = std::fs::symlink_metadata(e.path()).ok()?;
            m.file_type().is_socket().then(|| {
                (
                    e.path(),
                    (m.dev(), m.ino(), m.ctime_nsec() + m.ctime() * 1_000_000_000),
                )
            })
        })
        .collect()
}

/// A plugin call bounded by [`CALL_TIMEOUT`]; its answer or the error.
async fn timed<T>(
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(status)) => Err(status.message().to_string()),
        Err(_) => Err(format!("no answer within {CALL_TIMEOUT:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_api::FakeApi;
    use crate::proto::pluginregistration::RegistrationStatusResponse;
    use crate::proto::pluginregistration::registration_server::{Registration, RegistrationServer};
    use std::sync::Mutex;
    use tonic::{Request, Response, Status};

    /// A plugin's registration socket (as node-driver-registrar serves it):
    /// what it says it is, and the statuses it was told.
    #[derive(Clone)]
    struct Registrar {
        info: PluginInfo,
        told: Arc<Mutex<Vec<RegistrationStatus>>>,
        /// How many `NotifyRegistrationStatus` calls fail first.
        fail_notify: Arc<std::sync::atomic::AtomicUsize>,
    }

    #[tonic::async_trait]
    impl Registration for Registrar {
        async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
            Ok(Response::new(self.info.clone()))
        }
        async fn notify_registration_status(
            &self,
            r: Request<RegistrationStatus>,
        ) -> Result<Response<RegistrationStatusResponse>, Status> {
            use std::sync::atomic::Ordering;
            self.told.lock().unwrap().push(r.into_inner());
            let fail = self.fail_notify.load(Ordering::SeqCst);
            if fail > 0 {
                self.fail_notify.store(fail - 1, Ordering::SeqCst);
                return Err(Status::unavailable("going away"));
            }
            Ok(Response::new(RegistrationStatusResponse {}))
        }
    }

    /// Serves `router` on a new unix socket at `path` until the test ends.
    fn serve(path: &Path, router: tonic::transport::server::Router) {
        let listener = tokio::net::UnixListener::bind(path).expect("bind socket");
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        tokio::spawn(router.serve_with_incoming(incoming));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_csi_driver_registers_on_the_node_and_its_csinode_and_leaves_with_its_socket() {
        let root = tempfile::tempdir().unwrap();
        let registry = root.path().join(REGISTRY_DIR);
        let driver_dir = root.path().join(PLUGINS_DIR).join("test.csi");
        std::fs::create_dir_all(&registry).unwrap();
        std::fs::create_dir_all(&driver_dir).unwrap();
        let endpoint = driver_dir.join("csi.sock");
        crate::fake_csi::FakeDriver::serve(&endpoint);
        let csi = Registrar {
            info: PluginInfo {
                r#type: CSI_PLUGIN.into(),
                name: "test.csi".into(),
                endpoint: endpoint.display().to_string(),
                supported_versions: vec!["1.0.0".into()],
            },
            told: Arc::default(),
            fail_notify: Arc::default(),
        };
        let device = Registrar {
            info: PluginInfo {
                r#type: "DevicePlugin".into(),
                name: "example.com/gpu".into(),
                ..Default::default()
            },
            told: Arc::default(),
            fail_notify: Arc::default(),
        };
        let csi_socket = registry.join("test.csi-reg.sock");
        serve(
            &csi_socket,
            tonic::transport::Server::builder().add_service(RegistrationServer::new(csi.clone())),
        );
        let hostile = Registrar {
            info: PluginInfo {
                r#type: CSI_PLUGIN.into(),
                name: "../../../etc".into(),
                endpoint: endpoint.display().to_string(),
                supported_versions: vec!["1.0.0".into()],
            },
            told: Arc::default(),
            fail_notify: Arc::default(),
        };
        serve(
            &registry.join("hostile-reg.sock"),
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(hostile.clone())),
        );
        serve(
            &registry.join("gpu-reg.sock"),
            tonic::transport::Server::builder()
                .add_service(RegistrationServer::new(device.clone())),
        );
        let api = FakeApi::default();
        api.put_node("n1");
        let drivers = Drivers::default();
        let mut manager = PluginManager::new(api.client(), root.path(), "n1", drivers.clone());
        manager.sync().await;

        let registered = drivers.get("test.csi").expect("registered");
        assert_eq!(
            (registered.node_id.as_str(), registered.version),
            ("node-1", (1, 0, 0))
        );
        assert_eq!(registered.endpoint, endpoint);
        assert_eq!(
            csi.told.lock().unwrap().clone(),
            [RegistrationStatus {
                plugin_registered: true,
                error: String::new()
            }]
        );
        let hostile_told = hostile.told.lock().unwrap().clone();
        assert!(!hostile_told[0].plugin_registered);
        assert!(
            hostile_told[0].error.contains("not a valid driver name"),
            "{hostile_told:?}"
        );
        assert_eq!(drivers.names(), ["test.csi"]);
        let refused = device.told.lock().unwrap().clone();
        assert!(!refused[0].plugin_registered);
        assert_eq!(
            refused[0].error,
            "no handler registered for plugin type: DevicePlugin"
        );
        let node = api.cluster_object("nodes", "n1").unwrap();
        assert_eq!(
            node["metadata"]["annotations"][NODE_ID_ANNOTATION],
            r#"{"test.csi":"node-1"}"#
        );
        assert_eq!(node["metadata"]["labels"]["topology.test.csi/node"], "n1");
        let csi_node = api.cluster_object("csinodes", "n1").unwrap();
        assert_eq!(
            csi_node["metadata"]["ownerReferences"][0]["uid"],
            "node-uid-n1"
        );
        let entry = &csi_node["spec"]["drivers"][0];
        assert_eq!(entry["name"], "test.csi");
        assert_eq!(entry["nodeID"], "node-1");
        assert_eq!(entry["topologyKeys"][0], "topology.test.csi/node");
        assert_eq!(entry["allocatable"]["count"], 16);

        // Nothing changed: no call at all.
        api.take_requests();
        manager.sync().await;
        assert_eq!(api.take_requests(), Vec::new());

        // The socket goes: so does the driver.
        std::fs::remove_file(&csi_socket).unwrap();
        manager.sync().await;
        assert!(drivers.get("test.csi").is_none());
        let node = api.cluster_object("nodes", "n1").unwrap();
        assert!(
            node["metadata"]["annotations"]
                .get(NODE_ID_ANNOTATION)
                .is_none(),
            "{node}"
        );
        let csi_node = api.cluster_object("csinodes", "n1").unwrap();
        assert_eq!(csi_node["spec"]["drivers"], serde_json::json!([]));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dra_driver_registers_with_the_dra_manager_and_its_slices_go_after_it() {
        let root = tempfile::tempdir().unwrap();
        let registry = root.path().join(REGISTRY_DIR);
        std::fs::create_dir_all(&registry).unwrap();
        let endpoint = root.path().join("dra.sock");
        let driver = crate::fake_dra::FakeDraDriver::serve(&endpoint, "gpu.example.com", false);
        let info = |name: &str, versions: &[&str]| PluginInfo {
            r#type: crate::dra::plugins::DRA_PLUGIN.into(),
            name: name.into(),
            endpoint: endpoint.display().to_string(),
            supported_versions: versions.iter().map(|v| (*v).to_string()).collect(),
        };
        let gpu = Registrar {
            info: info(
                "gpu.example.com",
                &["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth"],
            ),
            told: Arc::default(),
            fail_notify: Arc::default(),
        };
        let hostile = Registrar {
            info: info("gpu.example.com,spec.driver=x", &["v1.DRAPlugin"]),
            told: Arc::default(),
            fail_notify: Arc::default(),
        };
        let old = Registrar {
            info: info("old.example.com", &["v1alpha3.Node"]),
            told: Arc::default(),
            fail_notify: Arc::default(),
        };
        // Not told the first time: registered at the next pass.
        let flaky = Registrar {
            info: info("flaky.example.com", &["v1beta1.DRAPlugin"]),
            told: Arc::default(),
            fail_notify: Arc::new(1.into()),
        };
        let gpu_socket = registry.join("gpu.example.com-reg.sock");
        serve(
            &gpu_socket,
            tonic::transport::Server::builder().add_service(RegistrationServer::new(gpu.clone())),
        );
        for (name, r) in [
            ("hostile-reg.sock", &hostile),
            ("old-reg.sock", &old),
            ("flaky-reg.sock", &flaky),
        ] {
            serve(
                &registry.join(name),
                tonic::transport::Server::builder().add_service(RegistrationServer::new(r.clone())),
            );
        }
        let api = FakeApi::default();
        api.put_node("n1");
        let slice = serde_json::json!({ "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": { "name": "n1-gpu" },
            "spec": { "nodeName": "n1", "driver": "gpu.example.com",
                "pool": { "name": "n1", "generation": 1, "resourceSliceCount": 1 } } });
        api.put_cluster("resourceslices", "n1-gpu", slice);
        let dra = crate::dra::DraManager::new(api.client(), "n1")
            .with_wipe_delay(Duration::from_millis(200));
        let mut manager = PluginManager::new(api.client(), root.path(), "n1", Drivers::default())
            .with_dra(dra.clone());
        manager.sync().await;

        let told = gpu.told.lock().unwrap().clone();
        assert_eq!(
            told,
            [RegistrationStatus {
                plugin_registered: true,
                error: String::new()
            }]
        );
        // It answers on its endpoint: its slice stays past the delay.
        dra.probe_plugins().await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(api.cluster_object("resourceslices", "n1-gpu").is_some());
        let plugin = dra.plugins().get("gpu.example.com").expect("registered");
        assert_eq!(plugin.endpoint, endpoint);
        assert_eq!(plugin.service, crate::dra::plugins::Service::V1);
        // Called through the kept connection.
        let claims = [crate::dra::plugins::Claim {
            namespace: "ns".into(),
            uid: "u1".into(),
            name: "c".into(),
        }];
        assert_eq!(plugin.unprepare(&claims).await.unwrap()["u1"], "");
        assert_eq!(driver.take_calls(), ["NodeUnprepareResources ns/c"]);
        let hostile_told = hostile.told.lock().unwrap().clone();
        assert!(
            hostile_told[0].error.contains("not a valid driver name"),
            "{hostile_told:?}"
        );
        let old_told = old.told.lock().unwrap().clone();
        assert!(
            old_told[0].error.starts_with(
                "invalid supported gRPC versions of DRA driver plugin old.example.com"
            ),
            "{old_told:?}"
        );
        assert_eq!(dra.plugins().drivers(), ["gpu.example.com"]);
        manager.sync().await;
        assert_eq!(flaky.told.lock().unwrap().len(), 2);
        assert_eq!(
            dra.plugins().drivers(),
            ["flaky.example.com", "gpu.example.com"]
        );
        assert_eq!(
            dra.plugins().get("flaky.example.com").unwrap().service,
            crate::dra::plugins::Service::V1beta1
        );
        // Neither the Node nor a CSINode is touched.
        assert!(api.cluster_object("csinodes", "n1").is_none());

        // The socket goes: so does the driver, and its slices after the
        // delay, by node and driver.
        api.take_requests();
        std::fs::remove_file(&gpu_socket).unwrap();
        manager.sync().await;
        assert!(dra.plugins().get("gpu.example.com").is_err());
        for _ in 0..50 {
            if api.cluster_object("resourceslices", "n1-gpu").is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(api.cluster_object("resourceslices", "n1-gpu").is_none());
        let deletes: Vec<(String, String)> = api
            .take_requests()
            .into_iter()
            .map(|r| (r.line(), r.query))
            .collect();
        assert!(
            deletes.contains(&(
                "DELETE /apis/resource.k8s.io/v1/resourceslices".to_string(),
                "fieldSelector=spec.nodeName=n1,spec.driver=gpu.example.com".to_string()
            )),
            "{deletes:?}"
        );
    }

    #[test]
    fn the_highest_version_of_major_one_is_taken() {
        let v = |list: &[&str]| {
            highest_supported(&list.iter().map(|s| (*s).to_string()).collect::<Vec<_>>())
        };
        assert_eq!(v(&["1.0.0", "v1.2.0", "0.3.0"]), Ok((1, 2, 0)));
        assert_eq!(v(&["1.5"]), Ok((1, 5, 0)));
        assert!(
            v(&["0.3.0", "2.0.0", "x"])
                .unwrap_err()
                .contains("None of the versions")
        );
        assert!(v(&[]).unwrap_err().contains("empty list"));
    }
}
