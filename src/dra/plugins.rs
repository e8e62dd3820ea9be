//! The registered kubelet plugins of DRA drivers, as the kubelet's DRA
//! plugin manager (`pkg/kubelet/cm/dra/plugin`): a driver registers through
//! the plugin registration socket (type [`DRA_PLUGIN`], its name the
//! driver's, its "versions" the gRPC services it serves, such as
//! `v1.DRAPlugin`), and is called on the endpoint it named, through one
//! gRPC connection kept for all its calls (dialled when a call needs it,
//! dialled again after the driver restarts). A driver may register several
//! plugins (a rolling update); the newest is called.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tonic::transport::Channel;

use super::cache::Device;
use crate::proto::dra::{v1, v1beta1};

/// The plugin type DRA drivers register with.
pub const DRA_PLUGIN: &str = "DRAPlugin";
/// How long one call to a driver may take (the kubelet's
/// `defaultClientCallTimeout`).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(45);
/// The most plugins registered at once, all drivers together; a plugin
/// beyond it is refused.
pub const MAX_PLUGINS: usize = 256;
/// How long a probe of a plugin ([`Plugin::answers`]) waits.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// The largest answer taken from a driver, bytes.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// The gRPC service a driver is called through, newest first (the
/// kubelet's `servicesSupportedByKubelet`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// `v1.DRAPlugin`.
    V1,
    /// `v1beta1.DRAPlugin`.
    V1beta1,
}

impl Service {
    /// Its name as drivers list it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::V1 => "v1.DRAPlugin",
            Self::V1beta1 => "v1beta1.DRAPlugin",
        }
    }
}

/// The service to call a driver through, of those it lists (the kubelet's
/// `validateSupportedServices`: the first of its list this agent speaks).
///
/// # Errors
/// The kubelet's messages: an empty list, or none of them spoken here.
pub fn choose_service(services: &[String]) -> Result<Service, String> {
    if services.is_empty() {
        return Err("empty list of supported gRPC services (aka supported versions)".into());
    }
    services
        .iter()
        .find_map(|s| {
            [Service::V1, Service::V1beta1]
                .into_iter()
                .find(|k| k.name() == s)
        })
        .ok_or_else(|| {
            format!(
                "none of services supported by the plugin ({services:?}) are supported by the kubelet ([\"{}\" \"{}\"])",
                Service::V1.name(),
                Service::V1beta1.name()
            )
        })
}

/// The health service a driver is watched through (the kubelet's
/// `healthServicesSupportedByKubelet`, newest first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthService {
    /// `v1.DRAResourceHealth`.
    V1,
    /// `v1alpha1.DRAResourceHealth`.
    V1alpha1,
}

/// The health service of those a driver lists, the newest this agent
/// speaks (None: the driver serves none; its devices' health is not known).
#[must_use]
pub fn choose_health_service(services: &[String]) -> Option<HealthService> {
    [
        ("v1.DRAResourceHealth", HealthService::V1),
        ("v1alpha1.DRAResourceHealth", HealthService::V1alpha1),
    ]
    .into_iter()
    .find(|(name, _)| services.iter().any(|s| s == name))
    .map(|(_, h)| h)
}

impl Plugin {
    /// Follows the driver's `NodeWatchResources` stream through `service`,
    /// on the connection its other calls use (as the kubelet, one
    /// connection per plugin), giving each message's devices to `seen`,
    /// until the stream ends (Ok) or fails (its code).
    ///
    /// # Errors
    /// The code the call or the stream failed with (`Unimplemented`: the
    /// driver does not report health).
    pub async fn watch_health(
        &self,
        service: HealthService,
        mut seen: impl FnMut(Vec<super::health::Reported>),
    ) -> Result<(), tonic::Code> {
        use super::health::{Health, Reported};
        use crate::proto::dra::{health_v1, health_v1alpha1};
        macro_rules! follow {
            ($api:ident) => {{
                let mut client = $api::dra_resource_health_client::DraResourceHealthClient::new(
                    self.channel.clone(),
                )
                .max_decoding_message_size(MAX_MESSAGE_BYTES);
                let mut stream = client
                    .node_watch_resources($api::NodeWatchResourcesRequest {})
                    .await
                    .map_err(|s| s.code())?
                    .into_inner();
                while let Some(message) = stream.message().await.map_err(|s| s.code())? {
                    seen(
                        message
                            .devices
                            .into_iter()
                            .map(|d| {
                                let id = d.device.unwrap_or_default();
                                Reported {
                                    pool: id.pool_name,
                                    device: id.device_name,
                                    health: Health::from_wire(d.health),
                                    timeout: Duration::from_secs(
                                        u64::try_from(d.health_check_timeout_seconds).unwrap_or(0),
                                    ),
                                    message: d.message,
                                }
                            })
                            .collect(),
                    );
                }
                Ok(())
            }};
        }
        match service {
            HealthService::V1 => follow!(health_v1),
            HealthService::V1alpha1 => follow!(health_v1alpha1),
        }
    }

    /// Whether the driver answers on the plugin's connection, the one its
    /// calls use (no connection of its own, as the kubelet follows the
    /// state of its one connection): a gRPC health check
    /// (`grpc.health.v1.Health/Check`), any answer counting, even that the
    /// service is not implemented; a transport failure, or no answer
    /// within [`PROBE_TIMEOUT`], is none.
    pub async fn answers(&self) -> bool {
        let mut client = tonic_health::pb::health_client::HealthClient::new(self.channel.clone());
        let check = client.check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        });
        match tokio::time::timeout(PROBE_TIMEOUT, check).await {
            Ok(Ok(_)) => true,
            Ok(Err(s)) => !matches!(
                s.code(),
                tonic::Code::Unavailable
                    | tonic::Code::Unknown
                    | tonic::Code::Cancelled
                    | tonic::Code::DeadlineExceeded
            ),
            Err(_) => false,
        }
    }
}

/// A claim as drivers are asked about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    /// Its namespace.
    pub namespace: String,
    /// Its UID (the key of the driver's answer).
    pub uid: String,
    /// Its name.
    pub name: String,
}

/// One claim's outcome of `NodePrepareResources`: its devices, or the
/// driver's error.
pub type Prepared = Result<Vec<Device>, String>;

/// One registered plugin of a DRA driver.
#[derive(Clone, Debug)]
pub struct Plugin {
    /// The driver's name.
    pub driver: String,
    /// The unix socket it serves the DRA API on.
    pub endpoint: PathBuf,
    /// The service it is called through.
    pub service: Service,
    /// How long one call may take.
    pub timeout: Duration,
    channel: Channel,
    /// Its endpoint answered when last tried (shared by the clones).
    connected: Arc<std::sync::atomic::AtomicBool>,
}

impl Plugin {
    /// Records whether its endpoint answers; whether that changed.
    pub fn set_connected(&self, connected: bool) -> bool {
        self.connected
            .swap(connected, std::sync::atomic::Ordering::Relaxed)
            != connected
    }

    /// Whether its endpoint answered when last tried.
    #[must_use]
    pub fn is_connected(&self) -> bool {
        self.connected.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A call of `NodePrepareResources` through API module `$api` (`v1`,
/// `v1beta1`, of the same messages), its devices taken with `$device`:
/// each claim's outcome by UID.
macro_rules! prepare_through {
    ($api:ident, $plugin:expr, $claims:expr, $device:path) => {{
        let request = $api::NodePrepareResourcesRequest {
            claims: $claims
                .iter()
                .map(|c| $api::Claim {
                    namespace: c.namespace.clone(),
                    uid: c.uid.clone(),
                    name: c.name.clone(),
                })
                .collect(),
        };
        let mut client = $api::dra_plugin_client::DraPluginClient::new($plugin.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let answer = $plugin
            .timed(
                "NodePrepareResources",
                client.node_prepare_resources(request),
            )
            .await?;
        answer
            .claims
            .into_iter()
            .map(|(uid, r)| {
                let outcome = if r.error.is_empty() {
                    Ok(r.devices.into_iter().map($device).collect())
                } else {
                    Err(r.error)
                };
                (uid, outcome)
            })
            .collect()
    }};
}

/// A call of `NodeUnprepareResources` through API module `$api`: each
/// claim's error (empty: none) by UID.
macro_rules! unprepare_through {
    ($api:ident, $plugin:expr, $claims:expr) => {{
        let request = $api::NodeUnprepareResourcesRequest {
            claims: $claims
                .iter()
                .map(|c| $api::Claim {
                    namespace: c.namespace.clone(),
                    uid: c.uid.clone(),
                    name: c.name.clone(),
                })
                .collect(),
        };
        let mut client = $api::dra_plugin_client::DraPluginClient::new($plugin.channel.clone())
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        let answer = $plugin
            .timed(
                "NodeUnprepareResources",
                client.node_unprepare_resources(request),
            )
            .await?;
        answer
            .claims
            .into_iter()
            .map(|(uid, r)| (uid, r.error))
            .collect()
    }};
}

impl Plugin {
    /// `NodePrepareResources` for `claims`: each claim's outcome, by claim
    /// UID, as the driver answered (it may leave claims out).
    ///
    /// # Errors
    /// The call failed or took longer than its timeout ([`CALL_TIMEOUT`]
    /// unless set otherwise, [`Plugins::set_call_timeout`]).
    pub async fn prepare(&self, claims: &[Claim]) -> Result<BTreeMap<String, Prepared>, String> {
        Ok(match self.service {
            Service::V1 => prepare_through!(v1, self, claims, from_v1),
            Service::V1beta1 => prepare_through!(v1beta1, self, claims, from_v1beta1),
        })
    }

    /// `NodeUnprepareResources` for `claims`: each claim's error (empty:
    /// none), by claim UID, as the driver answered.
    ///
    /// # Errors
    /// The call failed or took longer than its timeout ([`CALL_TIMEOUT`]
    /// unless set otherwise, [`Plugins::set_call_timeout`]).
    pub async fn unprepare(&self, claims: &[Claim]) -> Result<BTreeMap<String, String>, String> {
        Ok(match self.service {
            Service::V1 => unprepare_through!(v1, self, claims),
            Service::V1beta1 => unprepare_through!(v1beta1, self, claims),
        })
    }
}

/// The name of gRPC status `code` as Go's `codes.Code` prints it (`OK`,
/// `Canceled`, `DeadlineExceeded`), the kubelet's `grpc_status_code` label.
#[must_use]
pub fn grpc_code_name(code: tonic::Code) -> String {
    match code {
        tonic::Code::Ok => "OK".into(),
        tonic::Code::Cancelled => "Canceled".into(),
        other => format!("{other:?}"),
    }
}

fn from_v1(d: v1::Device) -> Device {
    Device {
        request_names: d.request_names,
        pool_name: d.pool_name,
        device_name: d.device_name,
        share_id: d.share_id,
        cdi_device_ids: d.cdi_device_ids,
    }
}

fn from_v1beta1(d: v1beta1::Device) -> Device {
    Device {
        request_names: d.request_names,
        pool_name: d.pool_name,
        device_name: d.device_name,
        share_id: None,
        cdi_device_ids: d.cdi_device_ids,
    }
}

impl Plugin {
    /// A call of `method` (`NodePrepareResources`) bounded by the plugin's
    /// timeout, counted in `dra_grpc_operations_duration_seconds`; its
    /// answer, or the error as the kubelet quotes gRPC errors.
    async fn timed<T>(
        &self,
        method: &str,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, String> {
        let started = std::time::Instant::now();
        let (answer, code) = match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(r)) => (Ok(r.into_inner()), tonic::Code::Ok),
            Ok(Err(s)) => (
                Err(format!(
                    "rpc error: code = {:?} desc = {}",
                    s.code(),
                    s.message()
                )),
                s.code(),
            ),
            Err(_) => (
                Err("rpc error: code = DeadlineExceeded desc = context deadline exceeded".into()),
                tonic::Code::DeadlineExceeded,
            ),
        };
        let package = match self.service {
            Service::V1 => "k8s.io.kubelet.pkg.apis.dra.v1",
            Service::V1beta1 => "k8s.io.kubelet.pkg.apis.dra.v1beta1",
        };
        crate::metrics::metrics().record_dra_call(
            &self.driver,
            &format!("/{package}.DRAPlugin/{method}"),
            &grpc_code_name(code),
            started.elapsed(),
        );
        answer
    }
}

/// The registered plugins, by driver, oldest first; cheap to clone and
/// share with the plugin manager.
#[derive(Clone, Debug, Default)]
pub struct Plugins(Arc<Mutex<Registry>>);

#[derive(Debug, Default)]
struct Registry {
    by_driver: BTreeMap<String, Vec<Plugin>>,
    /// The call timeout of plugins registered from now on (None:
    /// [`CALL_TIMEOUT`]).
    timeout: Option<Duration>,
}

impl Plugins {
    /// Plugins registered from now on have calls bounded by `timeout`
    /// instead of [`CALL_TIMEOUT`].
    pub fn set_call_timeout(&self, timeout: Duration) {
        self.lock().timeout = Some(timeout);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers driver `driver`'s plugin serving `service` on `endpoint`
    /// (the kubelet's `add`); its connection is made when first used.
    ///
    /// # Errors
    /// The kubelet's message when a plugin of the driver already has the
    /// endpoint; more than [`MAX_PLUGINS`] plugins.
    pub fn add(&self, driver: &str, endpoint: &Path, service: Service) -> Result<(), String> {
        let mut registry = self.lock();
        let timeout = registry.timeout.unwrap_or(CALL_TIMEOUT);
        let all = &mut registry.by_driver;
        let of_driver = all.get(driver).map(Vec::as_slice).unwrap_or_default();
        if of_driver.iter().any(|p| p.endpoint == endpoint) {
            return Err(format!(
                "endpoint {} already registered for DRA driver plugin {driver}",
                endpoint.display()
            ));
        }
        if all.values().map(Vec::len).sum::<usize>() >= MAX_PLUGINS {
            return Err(format!(
                "DRA driver plugin {driver} not registered: {MAX_PLUGINS} plugins are registered already"
            ));
        }
        all.entry(driver.to_string()).or_default().push(Plugin {
            driver: driver.to_string(),
            endpoint: endpoint.to_path_buf(),
            service,
            timeout,
            channel: crate::cri::unix_channel_lazy(endpoint.to_path_buf()),
            connected: Arc::default(),
        });
        Ok(())
    }

    /// Takes driver `driver`'s plugin on `endpoint` out; whether the driver
    /// has no plugin left.
    pub fn remove(&self, driver: &str, endpoint: &Path) -> bool {
        let mut registry = self.lock();
        let all = &mut registry.by_driver;
        let Some(of_driver) = all.get_mut(driver) else {
            return true;
        };
        of_driver.retain(|p| p.endpoint != endpoint);
        if of_driver.is_empty() {
            all.remove(driver);
            return true;
        }
        false
    }

    /// The plugin to call for driver `driver`: its newest that answered
    /// when last tried, else its newest (the kubelet's `GetPlugin`).
    ///
    /// # Errors
    /// The kubelet's messages: `DRA driver name is empty`, `DRA driver
    /// <name> is not registered`.
    pub fn get(&self, driver: &str) -> Result<Plugin, String> {
        if driver.is_empty() {
            return Err("DRA driver name is empty".into());
        }
        let registry = self.lock();
        let of_driver = registry.by_driver.get(driver).map(Vec::as_slice);
        let of_driver = of_driver.unwrap_or_default();
        of_driver
            .iter()
            .rev()
            .find(|p| p.is_connected())
            .or_else(|| of_driver.last())
            .cloned()
            .ok_or_else(|| format!("DRA driver {driver} is not registered"))
    }

    /// Whether a plugin of driver `driver` answered when last tried (the
    /// kubelet's `usable`).
    #[must_use]
    pub fn usable(&self, driver: &str) -> bool {
        self.lock()
            .by_driver
            .get(driver)
            .is_some_and(|p| p.iter().any(Plugin::is_connected))
    }

    /// Driver `driver`'s plugin on `endpoint`.
    #[must_use]
    pub fn find(&self, driver: &str, endpoint: &Path) -> Option<Plugin> {
        self.lock()
            .by_driver
            .get(driver)?
            .iter()
            .find(|p| p.endpoint == endpoint)
            .cloned()
    }

    /// Every registered plugin.
    #[must_use]
    pub fn all(&self) -> Vec<Plugin> {
        self.lock().by_driver.values().flatten().cloned().collect()
    }

    /// The names of the drivers with a plugin registered.
    #[must_use]
    pub fn drivers(&self) -> Vec<String> {
        self.lock().by_driver.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn the_first_service_of_the_drivers_list_spoken_here_is_chosen() {
        assert_eq!(
            choose_service(&list(&["v1.DRAPlugin", "v1beta1.DRAPlugin"])),
            Ok(Service::V1)
        );
        assert_eq!(
            choose_service(&list(&["v1alpha4.DRAPlugin", "v1beta1.DRAPlugin"])),
            Ok(Service::V1beta1)
        );
        assert!(choose_service(&[]).unwrap_err().contains("empty list"));
        assert!(
            choose_service(&list(&["1.0.0"]))
                .unwrap_err()
                .starts_with("none of services supported by the plugin")
        );
    }

    #[tokio::test]
    async fn the_newest_plugin_of_a_driver_is_called_and_one_endpoint_registers_once() {
        let plugins = Plugins::default();
        let (a, b) = (Path::new("/p/a.sock"), Path::new("/p/b.sock"));
        assert_eq!(
            plugins.get("gpu.example.com").unwrap_err(),
            "DRA driver gpu.example.com is not registered"
        );
        assert_eq!(plugins.get("").unwrap_err(), "DRA driver name is empty");
        plugins.add("gpu.example.com", a, Service::V1).unwrap();
        plugins.add("gpu.example.com", b, Service::V1beta1).unwrap();
        assert!(
            plugins
                .add("gpu.example.com", a, Service::V1)
                .unwrap_err()
                .contains("already registered")
        );
        assert_eq!(plugins.get("gpu.example.com").unwrap().endpoint, b);
        // One that answers is preferred to a newer one that does not.
        assert!(!plugins.usable("gpu.example.com"));
        let older = plugins.all().into_iter().find(|p| p.endpoint == a).unwrap();
        assert!(older.set_connected(true));
        assert!(!older.set_connected(true));
        assert!(plugins.usable("gpu.example.com"));
        assert_eq!(plugins.get("gpu.example.com").unwrap().endpoint, a);
        assert!(!plugins.remove("gpu.example.com", b));
        assert_eq!(plugins.get("gpu.example.com").unwrap().endpoint, a);
        assert!(plugins.remove("gpu.example.com", a));
        assert!(plugins.drivers().is_empty());
        for i in 0..MAX_PLUGINS {
            plugins
                .add("d.example.com", Path::new(&format!("/p/{i}")), Service::V1)
                .unwrap();
        }
        assert!(
            plugins
                .add("e.example.com", Path::new("/p/x"), Service::V1)
                .unwrap_err()
                .contains("plugins are registered already")
        );
    }
}
