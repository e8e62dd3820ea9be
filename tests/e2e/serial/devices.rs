//! Device plugins on the local cluster: this test is the device plugin, as
//! the node suite's device plugin tests are. It serves the device plugin API
//! on a socket in the agent's device plugin directory, registers on the
//! agent's `kubelet.sock`, and checks the Node's capacity and allocatable,
//! a pod given a device (its environment and mount from `Allocate`), and
//! what happens when a device turns unhealthy and when the plugin stops;
//! the pod resources API's view of the same devices; and, across a kill -9
//! of the agent, the devices a running container holds (the checkpoint).

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use rustlet::proto::deviceplugin::device_plugin_server::{DevicePlugin, DevicePluginServer};
use rustlet::proto::deviceplugin::registration_client::RegistrationClient;
use rustlet::proto::deviceplugin::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse, Device, DevicePluginOptions,
    Empty, ListAndWatchResponse, Mount, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, RegisterRequest,
};
use rustlet::proto::podresources::v1::pod_resources_lister_client::PodResourcesListerClient;
use rustlet::proto::podresources::v1::{
    AllocatableResourcesRequest, ContainerDevices, GetPodResourcesRequest, ListPodResourcesRequest,
};
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

/// The agent's device plugin directory (`--device-plugins-dir`, default).
fn plugins_dir() -> PathBuf {
    std::env::var_os("RUSTLET_DEVICE_PLUGINS_DIR").map_or_else(
        || rustlet::device_manager::DEFAULT_DIR.into(),
        PathBuf::from,
    )
}

/// The agent's pod resources socket, under its root directory
/// (`RUSTLET_ROOT_DIR`, else the local cluster's agent's).
fn pod_resources_socket() -> PathBuf {
    std::env::var_os("RUSTLET_ROOT_DIR")
        .map_or_else(|| local().join("rustlet"), PathBuf::from)
        .join(rustlet::pod_resources::DIR_NAME)
        .join(rustlet::pod_resources::SOCKET)
}

/// What the kubelet's own Go client (`_output/bin/podresources-client`, from
/// tests/cluster/cmd) answers at `socket`: `{"list": ..., "allocatable": ...}`.
fn upstream_client_view(socket: &Path) -> serde_json::Value {
    let out = std::process::Command::new(registry::bin("podresources-client"))
        .arg(socket)
        .output()
        .expect("run _output/bin/podresources-client (hack/build-cluster.sh csi)");
    assert!(
        out.status.success(),
        "the Go client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the Go client's JSON")
}

/// The IDs of `resource`'s devices among `devices`, sorted.
fn ids_of(devices: &[ContainerDevices], resource: &str) -> Vec<String> {
    let mut ids: Vec<String> = devices
        .iter()
        .filter(|d| d.resource_name == resource)
        .flat_map(|d| d.device_ids.clone())
        .collect();
    ids.sort();
    ids
}

/// Pod `ns`/`name`'s resources, by the pod resources API's `Get`.
async fn get_pod(
    pr: &mut PodResourcesListerClient<Channel>,
    ns: &str,
    name: &str,
) -> rustlet::proto::podresources::v1::PodResources {
    pr.get(GetPodResourcesRequest {
        pod_name: name.into(),
        pod_namespace: ns.into(),
    })
    .await
    .unwrap_or_else(|e| panic!("Get of {ns}/{name}: {e}"))
    .into_inner()
    .pod_resources
    .unwrap_or_else(|| panic!("no resources of {ns}/{name}"))
}

/// The node's allocatable devices of `resource`, by the pod resources API.
async fn allocatable_ids(
    pr: &mut PodResourcesListerClient<Channel>,
    resource: &str,
) -> Vec<String> {
    let r = pr
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .expect("GetAllocatableResources")
        .into_inner();
    ids_of(&r.devices, resource)
}

#[derive(Clone)]
struct Plugin {
    devices: watch::Receiver<Vec<Device>>,
    /// The host file each allocation mounts at /device-info.
    info_file: PathBuf,
    allocated: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(DevicePluginOptions::default()))
    }

    type ListAndWatchStream =
        Pin<Box<dyn futures::Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let rx = self.devices.clone();
        let stream = futures::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            let devices = rx.borrow_and_update().clone();
            Some((Ok(ListAndWatchResponse { devices }), (rx, false)))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("not offered"))
    }

    async fn allocate(
        &self,
        r: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let mut out = AllocateResponse::default();
        for c in r.into_inner().container_requests {
            let ids = c.devices_ids.join(",");
            self.allocated.lock().unwrap().push(ids.clone());
            out.container_responses.push(ContainerAllocateResponse {
                envs: [("E2E_DEVICES".to_string(), ids)].into(),
                mounts: vec![Mount {
                    container_path: "/device-info".into(),
                    host_path: self.info_file.display().to_string(),
                    read_only: true,
                }],
                ..ContainerAllocateResponse::default()
            });
        }
        Ok(Response::new(out))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

fn device(id: &str, healthy: bool) -> Device {
    Device {
        id: id.into(),
        health: if healthy { "Healthy" } else { "Unhealthy" }.into(),
        topology: None,
    }
}

/// The Node's (allocatable, capacity) of `resource`, None where absent.
async fn counts(nodes: &Api<Node>, resource: &str) -> (Option<i64>, Option<i64>) {
    let node = nodes.get(&node_name()).await.unwrap();
    let st = node.status.unwrap_or_default();
    let get = |m: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >| {
        m.and_then(|m| m.get(resource))
            .and_then(|q| q.0.parse().ok())
    };
    (get(st.allocatable.as_ref()), get(st.capacity.as_ref()))
}

async fn wait_counts(nodes: &Api<Node>, resource: &str, want: (i64, i64)) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = counts(nodes, resource).await;
        if got == (Some(want.0), Some(want.1)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{resource} on the Node: (allocatable, capacity) {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Registers the plugin of `resource` at `endpoint` on the agent's
/// `kubelet.sock` in `dir`, as a device plugin does when it starts and when
/// the agent's socket is made anew.
async fn register(dir: &Path, endpoint: &str, resource: &str) {
    let channel = rustlet::cri::unix_channel(dir.join(rustlet::device_manager::SOCKET))
        .await
        .expect("the agent's kubelet.sock");
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: "v1beta1".into(),
            endpoint: endpoint.into(),
            resource_name: resource.into(),
            options: None,
        })
        .await
        .expect("registered");
}

/// A pod of one busybox container `name` running `command`, with `count`
/// devices of `resource` in its limits.
fn device_pod(
    name: &str,
    command: &[&str],
    resource: &str,
    count: u32,
) -> k8s_openapi::api::core::v1::Pod {
    from_json(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": name,
                "image": BUSYBOX,
                "imagePullPolicy": "IfNotPresent",
                "command": command,
                "resources": { "limits": { resource: count.to_string() } }
            }]
        }
    }))
}

fn serve(socket: &Path, plugin: Plugin) -> tokio::task::JoinHandle<()> {
    let _ = std::fs::remove_file(socket);
    let listener = tokio::net::UnixListener::bind(socket).expect("bind the plugin socket");
    let router = tonic::transport::Server::builder().add_service(DevicePluginServer::new(plugin));
    tokio::spawn(async move {
        let _ = router
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await;
    })
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_device_plugins_devices_reach_the_node_and_a_pod() {
    let client = client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let ns = namespace(&client, "e2e-devices").await;
    let suffix = ns.rsplit('-').next().unwrap_or("x").to_string();
    let resource = format!("e2e.rustlet.dev/dev-{suffix}");
    let dir = plugins_dir();
    let endpoint = format!("e2e-{suffix}.sock");
    let socket = dir.join(&endpoint);
    let info = tempfile::NamedTempFile::new_in("/tmp").unwrap();
    std::fs::write(info.path(), "device info from the plugin\n").unwrap();

    let (devices, rx) = watch::channel(vec![device("d0", true), device("d1", true)]);
    let allocated = Arc::new(Mutex::new(Vec::new()));
    let server = serve(
        &socket,
        Plugin {
            devices: rx,
            info_file: info.path().to_path_buf(),
            allocated: allocated.clone(),
        },
    );
    register(&dir, &endpoint, &resource).await;
    wait_counts(&nodes, &resource, (2, 2)).await;

    // A pod asking for one device gets it: the plugin's environment and mount.
    let pod = device_pod(
        "user",
        &[
            "sh",
            "-c",
            "echo devices=$E2E_DEVICES; cat /device-info; sleep 600",
        ],
        &resource,
        1,
    );
    let created = create(&client, &ns, &pod).await;
    wait_for(&client, &ns, "user", 60, "Running", phase("Running")).await;
    let given = allocated.lock().unwrap().clone();
    assert_eq!(given.len(), 1, "one Allocate call: {given:?}");
    assert!(given[0] == "d0" || given[0] == "d1", "{given:?}");
    let uid = created.metadata.uid.clone().unwrap();
    let log = log_path(&ns, "user", &uid, "user");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("device info from the plugin") {
            assert!(text.contains(&format!("devices={}", given[0])), "{text}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "container log {}: {text}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Held devices still count as allocatable (as the kubelet's).
    wait_counts(&nodes, &resource, (2, 2)).await;

    // The pod resources API: the pod's container with its device, by List
    // and by Get, and both healthy devices as allocatable.
    let channel = rustlet::cri::unix_channel(pod_resources_socket())
        .await
        .expect("the agent's pod resources socket");
    let mut pr = PodResourcesListerClient::new(channel);
    let listed = pr
        .list(ListPodResourcesRequest {})
        .await
        .expect("List")
        .into_inner();
    let mine = listed
        .pod_resources
        .iter()
        .find(|p| p.namespace == ns && p.name == "user")
        .unwrap_or_else(|| panic!("the pod in List: {listed:?}"));
    assert_eq!(mine.containers.len(), 1, "{mine:?}");
    assert_eq!(mine.containers[0].name, "user");
    assert_eq!(ids_of(&mine.containers[0].devices, &resource), given);
    let got = get_pod(&mut pr, &ns, "user").await;
    assert_eq!(&got, mine);
    assert_eq!(allocatable_ids(&mut pr, &resource).await, ["d0", "d1"]);
    // The kubelet's own Go client, which dials the bare socket path and
    // sends it as the request's authority, gets the same answers.
    let go = upstream_client_view(&pod_resources_socket());
    let pods = go["list"]["pod_resources"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let theirs = pods
        .iter()
        .find(|p| p["namespace"] == ns.as_str() && p["name"] == "user")
        .unwrap_or_else(|| panic!("the pod in the Go client's List: {go}"));
    let held = &theirs["containers"][0]["devices"][0];
    assert_eq!(held["resource_name"], resource.as_str(), "{theirs}");
    assert_eq!(held["device_ids"], serde_json::json!(given), "{theirs}");
    let alloc = go["allocatable"]["devices"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        alloc
            .iter()
            .any(|d| d["resource_name"] == resource.as_str()),
        "{go}"
    );
    let metrics = scrape(&client, "metrics").await;
    for name in ["list", "get", "get_allocatable"] {
        let line =
            format!("kubelet_pod_resources_endpoint_requests_{name}{{server_api_version=\"v1\"}}");
        assert!(
            sample(&metrics, &line).is_some_and(|v| v >= 1.0),
            "{line} in /metrics"
        );
    }

    // kill -9 of the agent: started again, it knows from its checkpoint
    // which device the running container holds. The plugin registers again
    // (its devices come back); a new pod asking for one device gets the
    // other one (without the checkpoint it would get the held one, the
    // first free in order); the pod resources API still lists the held one.
    kill_and_restart_agent();
    register(&dir, &endpoint, &resource).await;
    wait_counts(&nodes, &resource, (2, 2)).await;
    let second = device_pod("second", &["sleep", "600"], &resource, 1);
    create(&client, &ns, &second).await;
    wait_for(&client, &ns, "second", 60, "Running", phase("Running")).await;
    let channel = rustlet::cri::unix_channel(pod_resources_socket())
        .await
        .expect("the restarted agent's pod resources socket");
    let mut pr = PodResourcesListerClient::new(channel);
    let got = get_pod(&mut pr, &ns, "user").await;
    assert_eq!(ids_of(&got.containers[0].devices, &resource), given);
    let other = get_pod(&mut pr, &ns, "second").await;
    let theirs = ids_of(&other.containers[0].devices, &resource);
    assert_eq!(theirs.len(), 1, "{other:?}");
    assert_ne!(theirs, given, "the held device was given again");
    let p = wait_for(&client, &ns, "user", 10, "Running", phase("Running")).await;
    assert_eq!(container_status(&p).restart_count, 0);

    // A device turns unhealthy: allocatable drops, capacity stays.
    devices
        .send(vec![device("d0", false), device("d1", true)])
        .unwrap();
    wait_counts(&nodes, &resource, (1, 2)).await;
    assert_eq!(allocatable_ids(&mut pr, &resource).await, ["d1"]);

    // The plugin stops (its stream ends): every device unhealthy, capacity
    // kept; the pod runs on.
    drop(devices);
    server.abort();
    wait_counts(&nodes, &resource, (0, 2)).await;
    let p = wait_for(&client, &ns, "user", 10, "Running", phase("Running")).await;
    assert_eq!(container_status(&p).restart_count, 0);

    let _ = std::fs::remove_file(&socket);
    drop_namespace(&client, &ns).await;
}
