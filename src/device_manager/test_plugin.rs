//! A device plugin served over gRPC on a unix socket, registering through
//! the device manager's own socket: what the device manager's tests and the
//! pod worker's admission tests run against.

use super::*;
use crate::proto::deviceplugin::device_plugin_server::{DevicePlugin, DevicePluginServer};
use crate::proto::deviceplugin::registration_client::RegistrationClient;
use crate::proto::deviceplugin::{
    AllocateResponse, ContainerAllocateResponse, ContainerPreferredAllocationResponse, Device,
    DevicePluginOptions, DeviceSpec, ListAndWatchResponse, Mount, PreStartContainerResponse,
    PreferredAllocationResponse,
};
use std::pin::Pin;

/// What the test plugin's `ListAndWatch` sends next: devices, or an error
/// that ends the stream.
pub(crate) type Next = Option<Vec<Device>>;

#[derive(Clone)]
pub(crate) struct TestPlugin {
    pub(crate) calls: Arc<Mutex<Vec<String>>>,
    pub(crate) devices: watch::Receiver<Next>,
    pub(crate) fail_options: bool,
    pub(crate) options: DevicePluginOptions,
    pub(crate) preferred: Vec<String>,
}

impl TestPlugin {
    fn record(&self, call: String) {
        self.calls.lock().unwrap().push(call);
    }
}

#[tonic::async_trait]
impl DevicePlugin for TestPlugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        self.record("GetDevicePluginOptions".into());
        if self.fail_options {
            return Err(Status::unknown("GetDevicePluginOptions failed"));
        }
        Ok(Response::new(self.options))
    }

    type ListAndWatchStream =
        Pin<Box<dyn futures::Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        self.record("ListAndWatch".into());
        let rx = self.devices.clone();
        let stream = futures::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            let next = rx.borrow_and_update().clone();
            let item = match next {
                Some(devices) => Ok(ListAndWatchResponse { devices }),
                None => Err(Status::internal("ListAndWatch failed")),
            };
            Some((item, (rx, false)))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        r: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let r = r.into_inner();
        let c = &r.container_requests[0];
        let must = if c.must_include_device_i_ds.is_empty() {
            String::new()
        } else {
            format!(" including {}", c.must_include_device_i_ds.join(","))
        };
        self.record(format!(
            "GetPreferredAllocation {} of {}{must}",
            c.allocation_size,
            c.available_device_i_ds.join(",")
        ));
        Ok(Response::new(PreferredAllocationResponse {
            container_responses: vec![ContainerPreferredAllocationResponse {
                device_i_ds: self.preferred.clone(),
            }],
        }))
    }

    async fn allocate(
        &self,
        r: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let r = r.into_inner();
        let ids = r.container_requests[0].devices_ids.join(",");
        self.record(format!("Allocate {ids}"));
        Ok(Response::new(AllocateResponse {
            container_responses: vec![ContainerAllocateResponse {
                envs: [("TEST_DEVICES".to_string(), ids.clone())].into(),
                mounts: vec![Mount {
                    container_path: "/dev-info".into(),
                    host_path: format!("/run/test-devices/{ids}"),
                    read_only: true,
                }],
                devices: vec![DeviceSpec {
                    container_path: "/dev/test0".into(),
                    host_path: "/dev/null".into(),
                    permissions: "rw".into(),
                }],
                annotations: [("example.com/devices".to_string(), ids)].into(),
                cdi_devices: Vec::new(),
            }],
        }))
    }

    async fn pre_start_container(
        &self,
        r: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        self.record(format!(
            "PreStartContainer {}",
            r.into_inner().devices_ids.join(",")
        ));
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

pub(crate) struct Setup {
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) dir: PathBuf,
    pub(crate) manager: DeviceManager,
    pub(crate) _server: tokio::task::JoinHandle<()>,
}

pub(crate) fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("device-plugins");
    let manager = DeviceManager::new(&path);
    let server = manager.serve().unwrap();
    Setup {
        _dir: dir,
        dir: path,
        manager,
        _server: server,
    }
}

pub(crate) fn device(id: &str, healthy: bool) -> Device {
    Device {
        id: id.into(),
        health: if healthy { HEALTHY } else { "Unhealthy" }.into(),
        topology: None,
    }
}

/// Serves `plugin` on `<dir>/<endpoint>`.
pub(crate) fn serve_plugin(
    dir: &Path,
    endpoint: &str,
    plugin: TestPlugin,
) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::UnixListener::bind(dir.join(endpoint)).unwrap();
    let router = tonic::transport::Server::builder().add_service(DevicePluginServer::new(plugin));
    tokio::spawn(async move {
        let _ = router
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await;
    })
}

pub(crate) async fn register(dir: &Path, endpoint: &str, resource: &str) -> Result<(), Status> {
    let channel = crate::cri::unix_channel(dir.join(SOCKET)).await.unwrap();
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: VERSION.into(),
            endpoint: endpoint.into(),
            resource_name: resource.into(),
            options: None,
        })
        .await
        .map(|_| ())
}

pub(crate) fn plugin(devices: watch::Receiver<Next>) -> TestPlugin {
    TestPlugin {
        calls: Arc::default(),
        devices,
        fail_options: false,
        options: DevicePluginOptions::default(),
        preferred: Vec::new(),
    }
}

/// Waits (at most 5 s) until the manager reports `want` (allocatable,
/// capacity) for `resource` (None: not reported).
pub(crate) async fn wait_counts(m: &DeviceManager, resource: &str, want: Option<(u64, u64)>) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = m.resources(Instant::now());
        let got = r
            .capacity
            .get(resource)
            .map(|c| (r.allocatable[resource], *c));
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{resource}: {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) const RES: &str = "example.com/dev";

/// A healthy device on NUMA node `node`.
pub(crate) fn on_node(id: &str, node: i64) -> Device {
    Device {
        topology: Some(crate::proto::deviceplugin::TopologyInfo {
            nodes: vec![crate::proto::deviceplugin::NumaNode { id: node }],
        }),
        ..device(id, true)
    }
}
