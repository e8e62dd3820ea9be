//! An in-memory CRI container runtime, for in-process tests of the pod worker
//! and for simulating nodes that run no containers.
//!
//! It mirrors the kubelet's fake runtime (`pkg/kubelet/container/testing`, and
//! cri-api's `fake_runtime.go` and `fake_image_service.go`): sandboxes,
//! containers and images live in memory and move through the states
//! containerd's CRI plugin moves them through, without processes, mounts or
//! network. Unlike those fakes it is served by a real gRPC server on a unix
//! socket, so the code under test reaches it through the real
//! [`Runtime`](crate::cri::Runtime) client: requests, deadlines, status codes
//! and error mapping all run as against containerd.
//!
//! [`FakeRuntime`] is both the service (it implements the generated
//! `RuntimeService` and `ImageService` traits) and the test's handle on it: it
//! adds images, makes pulls fail, makes containers exit, makes the next call of
//! a method fail, and reads back the calls received and the objects held.
//!
//! What it does, call by call:
//! - `RunPodSandbox` stores the config and answers with a READY sandbox that
//!   has the next address of `10.244.0.0/16` (none on the host network);
//!   `StopPodSandbox` makes it NOTREADY, releases its address and kills its
//!   running containers (exit code 137); `RemovePodSandbox` drops it and its
//!   containers.
//! - `CreateContainer` needs the image in the store (else `NotFound`, as
//!   containerd) and a READY sandbox; `StartContainer` runs it (or lets it
//!   exit at once when scripted); `StopContainer` ends it with exit code 137
//!   unless scripted otherwise; `RemoveContainer` drops it.
//! - `PullImage` adds the image with ID `sha256:<hex of sha256 of the name>`
//!   (see [`image_id`]); image names are matched as given, or by that ID, with
//!   no registry normalization.
//! - `ExecSync` answers exit code 0 and no output unless scripted.
//! - `GetContainerEvents` answers `Unimplemented`, so the agent relists; the
//!   stats lists are empty; `ContainerStats` reports a container's memory
//!   usage ([`DEFAULT_MEMORY_USAGE`] unless set); `UpdateContainerResources`
//!   records the new resources; streaming, log reopening, checkpoints and
//!   metrics are `Unimplemented`.
//!
//! Timestamps are wall-clock nanoseconds since the Unix epoch, as containerd's.
//!
//! In a test: `FakeRuntime::serve(dir)` binds `dir/cri.sock` and returns the
//! handle; `fake.add_image(..)` stocks the image store; `fake.client(timeout)`
//! (or [`Runtime::connect`] with `fake.endpoint()`) gives the client the code
//! under test uses; then `fake.take_calls()`, `fake.sandboxes()` and
//! `fake.containers()` show what it did.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::stream::BoxStream;
use k8s_cri::v1 as cri;
use k8s_cri::v1::image_service_server::{ImageService, ImageServiceServer};
use k8s_cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use sha2::{Digest, Sha256};
use tokio::net::UnixListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Code, Request, Response, Status};

use crate::cri::Runtime;

use crate::labels::POD_UID_LABEL;
use crate::reasons::terminated;

/// File name of the socket [`FakeRuntime::serve`] listens on, in the directory
/// it is given.
pub const SOCKET_NAME: &str = "cri.sock";

/// Exit code of a container the runtime killed (128 + SIGKILL).
pub const KILLED_EXIT_CODE: i32 = 137;

/// The ID the fake runtime gives the image named `name`:
/// `sha256:` and the 64 hex digits of the SHA-256 of the name.
#[must_use]
pub fn image_id(name: &str) -> String {
    format!("sha256:{}", hex_sha256(name))
}

fn hex_sha256(data: &str) -> String {
    Sha256::digest(data.as_bytes())
        .iter()
        .fold(String::with_capacity(64), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

/// Wall-clock time in nanoseconds since the Unix epoch.
fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The reason containerd gives an exited container: `Completed` for exit
/// code 0, else `Error`.
fn exit_reason(exit_code: i32) -> &'static str {
    if exit_code == 0 {
        terminated::COMPLETED
    } else {
        terminated::ERROR
    }
}

fn selector_matches(selector: &HashMap<String, String>, labels: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// A sandbox as [`FakeRuntime::sandboxes`] shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxSnapshot {
    /// The sandbox ID (64 hex digits).
    pub id: String,
    /// The pod's UID (the `io.kubernetes.pod.uid` label, else the metadata's).
    pub pod_uid: String,
    /// The pod's namespace, from the sandbox metadata.
    pub namespace: String,
    /// The pod's name, from the sandbox metadata.
    pub name: String,
    /// The sandbox attempt, from the sandbox metadata.
    pub attempt: u32,
    /// READY or NOTREADY.
    pub state: cri::PodSandboxState,
    /// The pod IP; empty on the host network and once stopped.
    pub ip: String,
    /// The sandbox config's `linux.cgroup_parent` (empty: none).
    pub cgroup_parent: String,
}

/// A container as [`FakeRuntime::containers`] shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerSnapshot {
    /// The container ID (64 hex digits).
    pub id: String,
    /// The ID of its sandbox.
    pub sandbox_id: String,
    /// The pod's UID (the `io.kubernetes.pod.uid` label, else the sandbox's).
    pub pod_uid: String,
    /// The container's name, from its metadata.
    pub name: String,
    /// The container's attempt (restart count), from its metadata.
    pub attempt: u32,
    /// CREATED, RUNNING, EXITED or UNKNOWN.
    pub state: cri::ContainerState,
    /// The exit code; 0 until the container exits.
    pub exit_code: i32,
    /// The image as the container config named it.
    pub image: String,
    /// When it started, in nanoseconds since the Unix epoch; 0 if it never did.
    pub started_at: i64,
    /// When it exited, in nanoseconds since the Unix epoch; 0 if it has not.
    pub finished_at: i64,
    /// The Linux resources (cpu shares and quota, memory limit, OOM score
    /// adjustment) its config asked for, as received.
    pub linux_resources: Option<cri::LinuxContainerResources>,
    /// The mounts its config asked for, as received.
    pub mounts: Vec<cri::Mount>,
    /// The CDI devices its config asked for, by name.
    pub cdi_devices: Vec<String>,
}

struct SandboxRecord {
    id: String,
    seq: u64,
    config: cri::PodSandboxConfig,
    runtime_handler: String,
    state: cri::PodSandboxState,
    created_at: i64,
    ip: String,
}

impl SandboxRecord {
    fn metadata(&self) -> cri::PodSandboxMetadata {
        self.config.metadata.clone().unwrap_or_default()
    }

    fn pod_name(&self) -> String {
        self.metadata().name
    }

    fn pod_uid(&self) -> String {
        self.config
            .labels
            .get(POD_UID_LABEL)
            .cloned()
            .unwrap_or_else(|| self.metadata().uid)
    }

    fn host_network(&self) -> bool {
        self.config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.as_ref())
            .is_some_and(|n| n.network == cri::NamespaceMode::Node as i32)
    }

    fn to_sandbox(&self) -> cri::PodSandbox {
        cri::PodSandbox {
            id: self.id.clone(),
            metadata: self.config.metadata.clone(),
            state: self.state.into(),
            created_at: self.created_at,
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            runtime_handler: self.runtime_handler.clone(),
        }
    }

    fn to_status(&self) -> cri::PodSandboxStatus {
        cri::PodSandboxStatus {
            id: self.id.clone(),
            metadata: self.config.metadata.clone(),
            state: self.state.into(),
            created_at: self.created_at,
            network: Some(cri::PodSandboxNetworkStatus {
                ip: self.ip.clone(),
                additional_ips: vec![],
            }),
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            runtime_handler: self.runtime_handler.clone(),
            ..Default::default()
        }
    }

    fn snapshot(&self) -> SandboxSnapshot {
        let md = self.metadata();
        SandboxSnapshot {
            id: self.id.clone(),
            pod_uid: self.pod_uid(),
            namespace: md.namespace,
            name: md.name,
            attempt: md.attempt,
            state: self.state,
            ip: self.ip.clone(),
            cgroup_parent: self
                .config
                .linux
                .as_ref()
                .map(|l| l.cgroup_parent.clone())
                .unwrap_or_default(),
        }
    }
}

struct ContainerRecord {
    id: String,
    seq: u64,
    sandbox_id: String,
    pod_uid: String,
    config: cri::ContainerConfig,
    image_id: String,
    log_path: String,
    state: cri::ContainerState,
    created_at: i64,
    started_at: i64,
    finished_at: i64,
    exit_code: i32,
    reason: String,
}

impl ContainerRecord {
    fn name(&self) -> &str {
        self.config
            .metadata
            .as_ref()
            .map_or("", |m| m.name.as_str())
    }

    fn image_spec(&self) -> Option<cri::ImageSpec> {
        self.config.image.clone()
    }

    fn image(&self) -> String {
        self.config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default()
    }

    /// Ends the container now with `exit_code`, if it is running.
    fn exit(&mut self, exit_code: i32) -> bool {
        if self.state != cri::ContainerState::ContainerRunning {
            return false;
        }
        self.state = cri::ContainerState::ContainerExited;
        self.finished_at = now().max(self.started_at);
        self.exit_code = exit_code;
        self.reason = exit_reason(exit_code).to_string();
        true
    }

    fn to_container(&self) -> cri::Container {
        cri::Container {
            id: self.id.clone(),
            pod_sandbox_id: self.sandbox_id.clone(),
            metadata: self.config.metadata.clone(),
            image: self.image_spec(),
            image_ref: self.image_id.clone(),
            state: self.state.into(),
            created_at: self.created_at,
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            image_id: self.image_id.clone(),
        }
    }

    fn to_status(&self) -> cri::ContainerStatus {
        cri::ContainerStatus {
            id: self.id.clone(),
            metadata: self.config.metadata.clone(),
            state: self.state.into(),
            created_at: self.created_at,
            started_at: self.started_at,
            finished_at: self.finished_at,
            exit_code: self.exit_code,
            image: self.image_spec(),
            image_ref: self.image_id.clone(),
            reason: self.reason.clone(),
            message: String::new(),
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            mounts: self.config.mounts.clone(),
            log_path: self.log_path.clone(),
            image_id: self.image_id.clone(),
            // As containerd: the resources of its spec, the created ones
            // updated by UpdateContainerResources.
            resources: self
                .config
                .linux
                .as_ref()
                .and_then(|l| l.resources.clone())
                .map(|linux| cri::ContainerResources {
                    linux: Some(linux),
                    ..Default::default()
                }),
            ..Default::default()
        }
    }

    fn snapshot(&self) -> ContainerSnapshot {
        ContainerSnapshot {
            id: self.id.clone(),
            sandbox_id: self.sandbox_id.clone(),
            pod_uid: self.pod_uid.clone(),
            name: self.name().to_string(),
            attempt: self.config.metadata.as_ref().map_or(0, |m| m.attempt),
            state: self.state,
            exit_code: self.exit_code,
            image: self.image(),
            started_at: self.started_at,
            finished_at: self.finished_at,
            linux_resources: self.config.linux.as_ref().and_then(|l| l.resources.clone()),
            mounts: self.config.mounts.clone(),
            cdi_devices: self
                .config
                .cdi_devices
                .iter()
                .map(|d| d.name.clone())
                .collect(),
        }
    }
}

/// An image in the store: the name it was added or pulled under, and its ID.
struct ImageRecord {
    name: String,
    id: String,
}

impl ImageRecord {
    fn matches(&self, reference: &str) -> bool {
        self.name == reference || self.id == reference
    }

    fn to_image(&self) -> cri::Image {
        cri::Image {
            id: self.id.clone(),
            repo_tags: vec![self.name.clone()],
            spec: Some(cri::ImageSpec {
                image: self.name.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// A scripted `ExecSync` answer.
struct ExecResult {
    exit_code: i32,
    stdout: Vec<u8>,
}

struct State {
    /// Counter behind IDs and creation order.
    seq: u64,
    /// Pod addresses handed out so far.
    ips: u32,
    sandboxes: HashMap<String, SandboxRecord>,
    containers: HashMap<String, ContainerRecord>,
    images: Vec<ImageRecord>,
    failing_pulls: HashMap<String, String>,
    /// Image → the (username, password) its registry asks of a pull.
    auth_required: HashMap<String, (String, String)>,
    exit_on_start: HashMap<String, i32>,
    exit_on_stop: HashMap<String, i32>,
    exec_results: HashMap<Vec<String>, ExecResult>,
    failures: HashMap<String, VecDeque<(Code, String)>>,
    calls: Vec<String>,
    execs: Vec<String>,
    /// The `traceparent` headers of the requests received, in order.
    trace_parents: Vec<String>,
    runtime_ready: bool,
    network_ready: bool,
    socket: Option<PathBuf>,
    /// Container name → the memory `ContainerStats` reports it uses, bytes
    /// (others: [`DEFAULT_MEMORY_USAGE`]).
    memory_usage: HashMap<String, u64>,
    /// What `RuntimeConfig` answers as the cgroup driver (the API's
    /// number); None: the call is unimplemented, as in older runtimes.
    cgroup_driver: Option<i32>,
    image_fs_info: cri::ImageFsInfoResponse,
}

/// How many `traceparent` headers [`FakeRuntime::trace_parents`] keeps.
pub const TRACE_PARENTS_KEPT: usize = 256;

/// The memory a container uses unless [`FakeRuntime::set_memory_usage`]
/// says otherwise: 4 MiB.
pub const DEFAULT_MEMORY_USAGE: u64 = 4 << 20;

impl State {
    fn new() -> Self {
        Self {
            seq: 0,
            ips: 0,
            sandboxes: HashMap::new(),
            containers: HashMap::new(),
            images: Vec::new(),
            failing_pulls: HashMap::new(),
            auth_required: HashMap::new(),
            exit_on_start: HashMap::new(),
            exit_on_stop: HashMap::new(),
            exec_results: HashMap::new(),
            failures: HashMap::new(),
            calls: Vec::new(),
            execs: Vec::new(),
            trace_parents: Vec::new(),
            runtime_ready: true,
            network_ready: true,
            socket: None,
            memory_usage: HashMap::new(),
            cgroup_driver: None,
            image_fs_info: cri::ImageFsInfoResponse::default(),
        }
    }

    /// Records a mutating call (if `record` is given), then fails if a
    /// failure of `method` was scripted.
    fn begin(&mut self, method: &str, record: Option<String>) -> Result<(), Status> {
        if let Some(call) = record {
            self.calls.push(call);
        }
        let queued = self.failures.get_mut(method).and_then(VecDeque::pop_front);
        match queued {
            Some((code, message)) => Err(Status::new(code, message)),
            None => Ok(()),
        }
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn new_id(&mut self, kind: &str) -> (String, u64) {
        let seq = self.next_seq();
        (hex_sha256(&format!("{kind}-{seq}")), seq)
    }

    /// The next pod address: 10.244.0.1 … 10.244.0.254, then 10.244.1.1 ….
    fn next_ip(&mut self) -> String {
        let n = self.ips;
        self.ips += 1;
        format!("10.244.{}.{}", (n / 254) % 256, n % 254 + 1)
    }

    fn image(&self, reference: &str) -> Option<&ImageRecord> {
        self.images.iter().find(|i| i.matches(reference))
    }

    fn add_image(&mut self, name: &str) -> String {
        if let Some(i) = self.image(name) {
            return i.id.clone();
        }
        let id = image_id(name);
        self.images.push(ImageRecord {
            name: name.to_string(),
            id: id.clone(),
        });
        id
    }

    fn sandbox_name(&self, id: &str) -> String {
        self.sandboxes
            .get(id)
            .map_or_else(|| id.to_string(), SandboxRecord::pod_name)
    }

    fn container_name(&self, id: &str) -> String {
        self.containers
            .get(id)
            .map_or_else(|| id.to_string(), |c| c.name().to_string())
    }

    fn insert_sandbox(&mut self, config: cri::PodSandboxConfig, runtime_handler: String) -> String {
        let (id, seq) = self.new_id("sandbox");
        let mut record = SandboxRecord {
            id: id.clone(),
            seq,
            config,
            runtime_handler,
            state: cri::PodSandboxState::SandboxReady,
            created_at: now(),
            ip: String::new(),
        };
        if !record.host_network() {
            record.ip = self.next_ip();
        }
        self.sandboxes.insert(id.clone(), record);
        id
    }

    fn insert_container(
        &mut self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        image_id: String,
    ) -> Option<String> {
        let sandbox = self.sandboxes.get(sandbox_id)?;
        let pod_uid = config
            .labels
            .get(POD_UID_LABEL)
            .cloned()
            .unwrap_or_else(|| sandbox.pod_uid());
        let log_path = if config.log_path.is_empty() {
            String::new()
        } else {
            Path::new(&sandbox.config.log_directory)
                .join(&config.log_path)
                .to_string_lossy()
                .into_owned()
        };
        let (id, seq) = self.new_id("container");
        self.containers.insert(
            id.clone(),
            ContainerRecord {
                id: id.clone(),
                seq,
                sandbox_id: sandbox_id.to_string(),
                pod_uid,
                config,
                image_id,
                log_path,
                state: cri::ContainerState::ContainerCreated,
                created_at: now(),
                started_at: 0,
                finished_at: 0,
                exit_code: 0,
                reason: String::new(),
            },
        );
        Some(id)
    }

    fn sorted_sandboxes(&self) -> Vec<&SandboxRecord> {
        let mut all: Vec<_> = self.sandboxes.values().collect();
        all.sort_by_key(|s| s.seq);
        all
    }

    fn sorted_containers(&self) -> Vec<&ContainerRecord> {
        let mut all: Vec<_> = self.containers.values().collect();
        all.sort_by_key(|c| c.seq);
        all
    }

    // The CRI methods, in the order of the proto.

    fn run_pod_sandbox(
        &mut self,
        req: cri::RunPodSandboxRequest,
    ) -> Result<cri::RunPodSandboxResponse, Status> {
        let config = req.config.unwrap_or_default();
        let md = config.metadata.clone().unwrap_or_default();
        self.begin(
            "RunPodSandbox",
            Some(format!("RunPodSandbox {}/{}", md.namespace, md.name)),
        )?;
        if md.name.is_empty() {
            return Err(Status::invalid_argument(
                "sandbox config must include metadata",
            ));
        }
        let taken = self.sandboxes.values().find(|s| {
            let other = s.metadata();
            other.name == md.name
                && other.namespace == md.namespace
                && other.uid == md.uid
                && other.attempt == md.attempt
        });
        if let Some(other) = taken {
            return Err(Status::unknown(format!(
                "failed to reserve sandbox name \"{}_{}_{}_{}\": name is reserved for \"{}\"",
                md.name, md.namespace, md.uid, md.attempt, other.id
            )));
        }
        let pod_sandbox_id = self.insert_sandbox(config, req.runtime_handler);
        Ok(cri::RunPodSandboxResponse { pod_sandbox_id })
    }

    fn stop_pod_sandbox(
        &mut self,
        req: cri::StopPodSandboxRequest,
    ) -> Result<cri::StopPodSandboxResponse, Status> {
        let id = req.pod_sandbox_id;
        let call = format!("StopPodSandbox {}", self.sandbox_name(&id));
        self.begin("StopPodSandbox", Some(call))?;
        let Some(sandbox) = self.sandboxes.get_mut(&id) else {
            return Err(Status::not_found(format!(
                "an error occurred when try to find sandbox {id:?}: not found"
            )));
        };
        sandbox.state = cri::PodSandboxState::SandboxNotready;
        sandbox.ip.clear();
        for c in self.containers.values_mut().filter(|c| c.sandbox_id == id) {
            c.exit(KILLED_EXIT_CODE);
        }
        Ok(cri::StopPodSandboxResponse {})
    }

    fn remove_pod_sandbox(
        &mut self,
        req: cri::RemovePodSandboxRequest,
    ) -> Result<cri::RemovePodSandboxResponse, Status> {
        let id = req.pod_sandbox_id;
        let call = format!("RemovePodSandbox {}", self.sandbox_name(&id));
        self.begin("RemovePodSandbox", Some(call))?;
        // As containerd: removing what is not there succeeds.
        if self.sandboxes.remove(&id).is_some() {
            self.containers.retain(|_, c| c.sandbox_id != id);
        }
        Ok(cri::RemovePodSandboxResponse {})
    }

    fn pod_sandbox_status(
        &mut self,
        req: cri::PodSandboxStatusRequest,
    ) -> Result<cri::PodSandboxStatusResponse, Status> {
        self.begin("PodSandboxStatus", None)?;
        let id = req.pod_sandbox_id;
        let sandbox = self.sandboxes.get(&id).ok_or_else(|| {
            Status::not_found(format!(
                "an error occurred when try to find sandbox {id:?}: not found"
            ))
        })?;
        Ok(cri::PodSandboxStatusResponse {
            status: Some(sandbox.to_status()),
            ..Default::default()
        })
    }

    fn list_pod_sandbox(
        &mut self,
        req: cri::ListPodSandboxRequest,
    ) -> Result<cri::ListPodSandboxResponse, Status> {
        self.begin("ListPodSandbox", None)?;
        let filter = req.filter.unwrap_or_default();
        let items = self
            .sorted_sandboxes()
            .into_iter()
            .filter(|s| filter.id.is_empty() || s.id == filter.id)
            .filter(|s| filter.state.is_none_or(|v| v.state == s.state as i32))
            .filter(|s| selector_matches(&filter.label_selector, &s.config.labels))
            .map(SandboxRecord::to_sandbox)
            .collect();
        Ok(cri::ListPodSandboxResponse { items })
    }

    fn create_container(
        &mut self,
        req: cri::CreateContainerRequest,
    ) -> Result<cri::CreateContainerResponse, Status> {
        let config = req.config.unwrap_or_default();
        let md = config.metadata.clone().unwrap_or_default();
        self.begin(
            "CreateContainer",
            Some(format!("CreateContainer {}", md.name)),
        )?;
        let sandbox_id = req.pod_sandbox_id;
        let sandbox = self.sandboxes.get(&sandbox_id).ok_or_else(|| {
            Status::not_found(format!(
                "failed to find sandbox id {sandbox_id:?}: not found"
            ))
        })?;
        if sandbox.state != cri::PodSandboxState::SandboxReady {
            return Err(Status::unknown(format!(
                "sandbox container {sandbox_id:?} is not running"
            )));
        }
        if md.name.is_empty() {
            return Err(Status::invalid_argument(
                "container config must include metadata",
            ));
        }
        let image = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        let image_id = self.image(&image).map(|i| i.id.clone()).ok_or_else(|| {
            Status::not_found(format!("failed to resolve image {image:?}: not found"))
        })?;
        let taken = self.containers.values().find(|c| {
            c.sandbox_id == sandbox_id && c.config.metadata.as_ref().is_some_and(|m| *m == md)
        });
        if let Some(other) = taken {
            return Err(Status::unknown(format!(
                "failed to reserve container name \"{}_{}\": name is reserved for \"{}\"",
                md.name, md.attempt, other.id
            )));
        }
        let container_id = self
            .insert_container(&sandbox_id, config, image_id)
            .ok_or_else(|| Status::not_found(format!("sandbox {sandbox_id:?} not found")))?;
        Ok(cri::CreateContainerResponse { container_id })
    }

    fn start_container(
        &mut self,
        req: cri::StartContainerRequest,
    ) -> Result<cri::StartContainerResponse, Status> {
        let id = req.container_id;
        let call = format!("StartContainer {}", self.container_name(&id));
        self.begin("StartContainer", Some(call))?;
        let container = self.containers.get(&id).ok_or_else(|| {
            Status::not_found(format!(
                "an error occurred when try to find container {id:?}: not found"
            ))
        })?;
        if container.state != cri::ContainerState::ContainerCreated {
            return Err(Status::unknown(format!(
                "container is in {} state",
                container.state.as_str_name()
            )));
        }
        let sandbox_ready = self
            .sandboxes
            .get(&container.sandbox_id)
            .is_some_and(|s| s.state == cri::PodSandboxState::SandboxReady);
        if !sandbox_ready {
            return Err(Status::unknown(format!(
                "sandbox container {:?} is not running",
                container.sandbox_id
            )));
        }
        let exit_code = self.exit_on_start.get(container.name()).copied();
        if let Some(c) = self.containers.get_mut(&id) {
            c.state = cri::ContainerState::ContainerRunning;
            c.started_at = now();
            if let Some(code) = exit_code {
                c.exit(code);
            }
        }
        Ok(cri::StartContainerResponse {})
    }

    fn stop_container(
        &mut self,
        req: cri::StopContainerRequest,
    ) -> Result<cri::StopContainerResponse, Status> {
        let id = req.container_id;
        let call = format!("StopContainer {} {}", self.container_name(&id), req.timeout);
        self.begin("StopContainer", Some(call))?;
        let name = self.container_name(&id);
        let exit_code = self
            .exit_on_stop
            .get(&name)
            .copied()
            .unwrap_or(KILLED_EXIT_CODE);
        let container = self.containers.get_mut(&id).ok_or_else(|| {
            Status::not_found(format!(
                "an error occurred when try to find container {id:?}: not found"
            ))
        })?;
        // Stopping a container that is not running is a no-op, as containerd.
        container.exit(exit_code);
        Ok(cri::StopContainerResponse {})
    }

    fn update_container_resources(
        &mut self,
        req: cri::UpdateContainerResourcesRequest,
    ) -> Result<cri::UpdateContainerResourcesResponse, Status> {
        let id = req.container_id;
        let linux = req.linux.unwrap_or_default();
        let call = format!(
            "UpdateContainerResources {} shares={} quota={} memory={}",
            self.container_name(&id),
            linux.cpu_shares,
            linux.cpu_quota,
            linux.memory_limit_in_bytes
        );
        self.begin("UpdateContainerResources", Some(call))?;
        let container = self.containers.get_mut(&id).ok_or_else(|| {
            Status::not_found(format!(
                "an error occurred when try to find container {id:?}: not found"
            ))
        })?;
        container
            .config
            .linux
            .get_or_insert_with(Default::default)
            .resources = Some(linux);
        Ok(cri::UpdateContainerResourcesResponse {})
    }

    fn remove_container(
        &mut self,
        req: cri::RemoveContainerRequest,
    ) -> Result<cri::RemoveContainerResponse, Status> {
        let id = req.container_id;
        let call = format!("RemoveContainer {}", self.container_name(&id));
        self.begin("RemoveContainer", Some(call))?;
        // A running container is removed forcibly; an unknown one is no error.
        self.containers.remove(&id);
        Ok(cri::RemoveContainerResponse {})
    }

    fn list_containers(
        &mut self,
        req: cri::ListContainersRequest,
    ) -> Result<cri::ListContainersResponse, Status> {
        self.begin("ListContainers", None)?;
        let filter = req.filter.unwrap_or_default();
        let containers = self
            .sorted_containers()
            .into_iter()
            .filter(|c| filter.id.is_empty() || c.id == filter.id)
            .filter(|c| filter.state.is_none_or(|v| v.state == c.state as i32))
            .filter(|c| filter.pod_sandbox_id.is_empty() || c.sandbox_id == filter.pod_sandbox_id)
            .filter(|c| selector_matches(&filter.label_selector, &c.config.labels))
            .map(ContainerRecord::to_container)
            .collect();
        Ok(cri::ListContainersResponse { containers })
    }

    fn container_status(
        &mut self,
        req: cri::ContainerStatusRequest,
    ) -> Result<cri::ContainerStatusResponse, Status> {
        self.begin("ContainerStatus", None)?;
        let id = req.container_id;
        let container = self.containers.get(&id).ok_or_else(|| {
            Status::not_found(format!(
                "an error occurred when try to find container {id:?}: not found"
            ))
        })?;
        Ok(cri::ContainerStatusResponse {
            status: Some(container.to_status()),
            info: HashMap::new(),
        })
    }

    fn exec_sync(&mut self, req: cri::ExecSyncRequest) -> Result<cri::ExecSyncResponse, Status> {
        self.begin("ExecSync", None)?;
        let id = req.container_id;
        let container = self.containers.get(&id).ok_or_else(|| {
            Status::not_found(format!(
                "an error occurred when try to find container {id:?}: not found"
            ))
        })?;
        if container.state != cri::ContainerState::ContainerRunning {
            return Err(Status::unknown(format!(
                "container is in {} state",
                container.state.as_str_name()
            )));
        }
        let exec = format!("{} {}", container.name(), req.cmd.join(" "));
        self.execs.push(exec);
        Ok(match self.exec_results.get(&req.cmd) {
            Some(r) => cri::ExecSyncResponse {
                stdout: r.stdout.clone(),
                stderr: vec![],
                exit_code: r.exit_code,
            },
            None => cri::ExecSyncResponse::default(),
        })
    }

    fn update_runtime_config(
        &mut self,
        req: cri::UpdateRuntimeConfigRequest,
    ) -> Result<cri::UpdateRuntimeConfigResponse, Status> {
        let cidr = req
            .runtime_config
            .and_then(|c| c.network_config)
            .map(|n| n.pod_cidr)
            .unwrap_or_default();
        self.begin(
            "UpdateRuntimeConfig",
            Some(format!("UpdateRuntimeConfig {cidr}")),
        )?;
        Ok(cri::UpdateRuntimeConfigResponse {})
    }

    fn status(&mut self) -> Result<cri::StatusResponse, Status> {
        self.begin("Status", None)?;
        // Not ready, the conditions carry the reasons containerd gives.
        let condition = |kind: &str, ready: bool, reason: &str, message: &str| {
            let (reason, message) = if ready { ("", "") } else { (reason, message) };
            cri::RuntimeCondition {
                r#type: kind.to_string(),
                status: ready,
                reason: reason.to_string(),
                message: message.to_string(),
            }
        };
        Ok(cri::StatusResponse {
            status: Some(cri::RuntimeStatus {
                conditions: vec![
                    condition(
                        "RuntimeReady",
                        self.runtime_ready,
                        "RuntimeNotReady",
                        "the fake runtime was set not ready",
                    ),
                    condition(
                        "NetworkReady",
                        self.network_ready,
                        "NetworkPluginNotReady",
                        "Network plugin returns error: cni plugin not initialized",
                    ),
                ],
            }),
            ..Default::default()
        })
    }

    fn list_images(
        &mut self,
        req: cri::ListImagesRequest,
    ) -> Result<cri::ListImagesResponse, Status> {
        self.begin("ListImages", None)?;
        let wanted = req
            .filter
            .and_then(|f| f.image)
            .map(|i| i.image)
            .unwrap_or_default();
        let images = self
            .images
            .iter()
            .filter(|i| wanted.is_empty() || i.matches(&wanted))
            .map(ImageRecord::to_image)
            .collect();
        Ok(cri::ListImagesResponse { images })
    }

    fn image_status(
        &mut self,
        req: cri::ImageStatusRequest,
    ) -> Result<cri::ImageStatusResponse, Status> {
        self.begin("ImageStatus", None)?;
        let name = req.image.map(|i| i.image).unwrap_or_default();
        Ok(cri::ImageStatusResponse {
            image: self.image(&name).map(ImageRecord::to_image),
            info: HashMap::new(),
        })
    }

    fn pull_image(&mut self, req: cri::PullImageRequest) -> Result<cri::PullImageResponse, Status> {
        let name = req.image.map(|i| i.image).unwrap_or_default();
        self.begin("PullImage", Some(format!("PullImage {name}")))?;
        if let Some(message) = self.failing_pulls.get(&name) {
            return Err(Status::not_found(message.clone()));
        }
        if let Some((user, pass)) = self.auth_required.get(&name) {
            let given = req.auth.as_ref().map(|a| (&a.username, &a.password));
            if given != Some((user, pass)) {
                return Err(Status::unknown(format!(
                    "failed to pull and unpack image \"{name}\": failed to resolve reference \"{name}\": pull access denied, repository does not exist or may require authorization: authorization failed: no basic auth credentials"
                )));
            }
        }
        if name.is_empty() {
            return Err(Status::invalid_argument("image name must not be empty"));
        }
        // An ID names no registry to pull from (containerd resolves it as a
        // repository `sha256` on docker.io, which has none).
        if crate::image_policy::is_image_id(&name) {
            return Err(Status::not_found(format!(
                "failed to pull and unpack image \"{name}\": failed to resolve reference \"docker.io/library/{name}\": not found"
            )));
        }
        let image_ref = self.add_image(&name);
        Ok(cri::PullImageResponse { image_ref })
    }

    fn remove_image(
        &mut self,
        req: cri::RemoveImageRequest,
    ) -> Result<cri::RemoveImageResponse, Status> {
        let name = req.image.map(|i| i.image).unwrap_or_default();
        self.begin("RemoveImage", Some(format!("RemoveImage {name}")))?;
        self.images.retain(|i| !i.matches(&name));
        Ok(cri::RemoveImageResponse {})
    }
}

/// The in-memory runtime and the test's handle on it. Cheap to clone: every
/// clone shares one state, so the handle a test keeps sees what the gRPC
/// server it serves did.
#[derive(Clone)]
pub struct FakeRuntime {
    state: Arc<Mutex<State>>,
}

impl Default for FakeRuntime {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for FakeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("FakeRuntime")
            .field("socket", &st.socket)
            .field("sandboxes", &st.sandboxes.len())
            .field("containers", &st.containers.len())
            .field("images", &st.images.len())
            .finish_non_exhaustive()
    }
}

impl FakeRuntime {
    /// An empty runtime (no sandboxes, containers or images; runtime and
    /// network ready), not yet served on any socket.
    #[must_use]
    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(State::new())),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut State) -> Result<T, Status>,
    ) -> Result<Response<T>, Status> {
        f(&mut self.lock()).map(Response::new)
    }

    /// A new runtime served on `dir/cri.sock` (see [`FakeRuntime::listen`]);
    /// returns it and the socket's path.
    ///
    /// Must be called within a Tokio runtime: the server runs on a spawned task
    /// until that runtime shuts down.
    ///
    /// # Errors
    /// When the socket cannot be bound.
    pub fn serve(dir: &Path) -> io::Result<(Self, PathBuf)> {
        let fake = Self::new();
        let socket = dir.join(SOCKET_NAME);
        fake.listen(&socket)?;
        Ok((fake, socket))
    }

    /// Serves this runtime's `RuntimeService` and `ImageService` on a unix
    /// socket at `socket` (a stale file there is replaced), on a spawned task.
    /// Aborting the returned task stops accepting connections.
    ///
    /// Must be called within a Tokio runtime.
    ///
    /// # Errors
    /// When the socket cannot be bound.
    pub fn listen(&self, socket: &Path) -> io::Result<JoinHandle<()>> {
        match std::fs::remove_file(socket) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let listener = UnixListener::bind(socket)?;
        self.lock().socket = Some(socket.to_path_buf());
        // Each request's `traceparent` header is kept, for the tests of the
        // trace context the client sends.
        let seen = self.clone();
        let trace_parent = move |request: Request<()>| {
            if let Some(value) = request.metadata().get("traceparent") {
                let value = value.to_str().unwrap_or("(not text)").to_string();
                let mut st = seen.lock();
                if st.trace_parents.len() == TRACE_PARENTS_KEPT {
                    st.trace_parents.remove(0);
                }
                st.trace_parents.push(value);
            }
            Ok(request)
        };
        let router = tonic::transport::Server::builder()
            .add_service(RuntimeServiceServer::with_interceptor(
                self.clone(),
                trace_parent.clone(),
            ))
            .add_service(ImageServiceServer::with_interceptor(
                self.clone(),
                trace_parent,
            ));
        let incoming = UnixListenerStream::new(listener);
        Ok(tokio::spawn(async move {
            if let Err(error) = router.serve_with_incoming(incoming).await {
                tracing::warn!(%error, "fake container runtime: the gRPC server stopped");
            }
        }))
    }

    /// The `unix://` endpoint of the socket this runtime was last served on,
    /// as [`Runtime::connect`] takes it; `None` before it is served.
    #[must_use]
    pub fn endpoint(&self) -> Option<String> {
        self.lock()
            .socket
            .as_ref()
            .map(|p| format!("unix://{}", p.display()))
    }

    /// A client connected to this runtime's socket, every call bounded by
    /// `timeout`.
    ///
    /// # Errors
    /// [`crate::cri::Error::Endpoint`] when the runtime is not served,
    /// [`crate::cri::Error::Connect`] when the socket does not answer.
    pub async fn client(&self, timeout: Duration) -> crate::cri::Result<Runtime> {
        let endpoint = self.endpoint().unwrap_or_default();
        Runtime::connect(&endpoint, timeout).await
    }

    /// Sets the RuntimeReady and NetworkReady conditions `Status` reports
    /// (both true at first; a false NetworkReady has containerd's reason
    /// `NetworkPluginNotReady`).
    pub fn set_status(&self, runtime_ready: bool, network_ready: bool) {
        let mut st = self.lock();
        st.runtime_ready = runtime_ready;
        st.network_ready = network_ready;
    }

    /// Sets the cgroup driver `RuntimeConfig` answers with (the CRI
    /// `CgroupDriver` number, any `i32` a runtime might send); None makes
    /// the call unimplemented (the default).
    pub fn set_cgroup_driver(&self, driver: Option<i32>) {
        self.lock().cgroup_driver = driver;
    }

    /// Sets what `ImageFsInfo` answers (no filesystems at first).
    pub fn set_image_fs_info(&self, info: cri::ImageFsInfoResponse) {
        self.lock().image_fs_info = info;
    }

    /// Puts the image `name` in the store, as if pulled; returns its ID
    /// ([`image_id`]). Not recorded as a call.
    pub fn add_image(&self, name: &str) -> String {
        self.lock().add_image(name)
    }

    /// Makes every `PullImage` of `name` fail with `NotFound` and `message`
    /// (e.g. `pull access denied`), until [`FakeRuntime::allow_pull`].
    pub fn fail_pull(&self, name: &str, message: &str) {
        self.lock()
            .failing_pulls
            .insert(name.to_string(), message.to_string());
    }

    /// Makes the registry of image `name` refuse every `PullImage` that does
    /// not give `username` and `password` (as a private registry does),
    /// whether or not the image is in the store already.
    pub fn require_auth(&self, name: &str, username: &str, password: &str) {
        self.lock().auth_required.insert(
            name.to_string(),
            (username.to_string(), password.to_string()),
        );
    }

    /// Undoes [`FakeRuntime::fail_pull`] for `name`.
    pub fn allow_pull(&self, name: &str) {
        self.lock().failing_pulls.remove(name);
    }

    /// The names of the images in the store, in the order they were added.
    #[must_use]
    pub fn images(&self) -> Vec<String> {
        self.lock().images.iter().map(|i| i.name.clone()).collect()
    }

    /// Makes the running container `container_id` exit now with `exit_code`
    /// (finished now; reason `Completed` for 0, else `Error`). Returns false,
    /// changing nothing, when no such container is running.
    pub fn exit(&self, container_id: &str, exit_code: i32) -> bool {
        self.lock()
            .containers
            .get_mut(container_id)
            .is_some_and(|c| c.exit(exit_code))
    }

    /// As [`FakeRuntime::exit`], for the running container named
    /// `container_name` of the pod with UID `pod_uid`.
    pub fn exit_named(&self, pod_uid: &str, container_name: &str, exit_code: i32) -> bool {
        self.lock()
            .containers
            .values_mut()
            .find(|c| {
                c.pod_uid == pod_uid
                    && c.name() == container_name
                    && c.state == cri::ContainerState::ContainerRunning
            })
            .is_some_and(|c| c.exit(exit_code))
    }

    /// Makes every container named `container_name` (in any pod) exit with
    /// `exit_code` right after `StartContainer`, as a crash-looping one does,
    /// until [`FakeRuntime::clear_exit_on_start`].
    pub fn script_exit_on_start(&self, container_name: &str, exit_code: i32) {
        self.lock()
            .exit_on_start
            .insert(container_name.to_string(), exit_code);
    }

    /// Undoes [`FakeRuntime::script_exit_on_start`] for `container_name`.
    pub fn clear_exit_on_start(&self, container_name: &str) {
        self.lock().exit_on_start.remove(container_name);
    }

    /// Makes `StopContainer` of a running container named `container_name`
    /// end it with `exit_code` (a process that handles SIGTERM) instead of
    /// [`KILLED_EXIT_CODE`]. `StopPodSandbox` still kills with 137.
    pub fn script_exit_on_stop(&self, container_name: &str, exit_code: i32) {
        self.lock()
            .exit_on_stop
            .insert(container_name.to_string(), exit_code);
    }

    /// Makes `ExecSync` of exactly `cmd` (in any running container) answer
    /// `exit_code` with `stdout` as its output, instead of 0 and nothing.
    pub fn script_exec<I, S>(&self, cmd: I, exit_code: i32, stdout: impl Into<Vec<u8>>)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let cmd = cmd.into_iter().map(Into::into).collect();
        self.lock().exec_results.insert(
            cmd,
            ExecResult {
                exit_code,
                stdout: stdout.into(),
            },
        );
    }

    /// The `ExecSync` calls that reached a running container, in order, each
    /// as `"<container name> <cmd joined by spaces>"`.
    #[must_use]
    pub fn execs(&self) -> Vec<String> {
        self.lock().execs.clone()
    }

    /// Makes the next call of the CRI method `call` (as the proto names it,
    /// e.g. `StartContainer`, `ListContainers`, `PullImage`) fail once with
    /// `code` and `message`. Calling it again queues another failure. The
    /// failed call is still recorded in [`FakeRuntime::calls`].
    pub fn fail_next(&self, call: &str, code: Code, message: &str) {
        self.lock()
            .failures
            .entry(call.to_string())
            .or_default()
            .push_back((code, message.to_string()));
    }

    /// Makes `ContainerStats` report that containers named `name` use
    /// `bytes` of memory.
    pub fn set_memory_usage(&self, name: &str, bytes: u64) {
        self.lock().memory_usage.insert(name.to_string(), bytes);
    }

    /// The mutating CRI calls received, in order (reads are not recorded):
    /// `RunPodSandbox <namespace>/<pod name>`, `StopPodSandbox <pod name>`,
    /// `RemovePodSandbox <pod name>`, `CreateContainer <container name>`,
    /// `StartContainer <container name>`,
    /// `StopContainer <container name> <timeout seconds>`,
    /// `RemoveContainer <container name>`, `PullImage <image>`,
    /// `RemoveImage <image>`, `UpdateRuntimeConfig <pod CIDR>`. An unknown
    /// sandbox or container is named by the ID the call gave.
    #[must_use]
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    /// The W3C `traceparent` headers of the requests received (every call,
    /// reads too), in order, the last [`TRACE_PARENTS_KEPT`]; requests
    /// without one add nothing.
    #[must_use]
    pub fn trace_parents(&self) -> Vec<String> {
        self.lock().trace_parents.clone()
    }

    /// As [`FakeRuntime::calls`], and forgets them.
    pub fn take_calls(&self) -> Vec<String> {
        std::mem::take(&mut self.lock().calls)
    }

    /// The sandboxes held, in creation order.
    #[must_use]
    pub fn sandboxes(&self) -> Vec<SandboxSnapshot> {
        self.lock()
            .sorted_sandboxes()
            .into_iter()
            .map(SandboxRecord::snapshot)
            .collect()
    }

    /// The containers held, in creation order.
    #[must_use]
    pub fn containers(&self) -> Vec<ContainerSnapshot> {
        self.lock()
            .sorted_containers()
            .into_iter()
            .map(ContainerRecord::snapshot)
            .collect()
    }

    /// Adds a READY sandbox made from `config`, as if it had survived a restart
    /// of the agent; returns its ID. Not recorded as a call.
    pub fn insert_sandbox(&self, config: cri::PodSandboxConfig) -> String {
        self.lock().insert_sandbox(config, String::new())
    }

    /// Adds a container made from `config` to sandbox `sandbox_id` in `state`,
    /// as if it had survived a restart of the agent; returns its ID, or `None`
    /// when there is no such sandbox. A RUNNING one started now; an EXITED one
    /// started and finished now with exit code 0 (to have another, insert it
    /// RUNNING and [`FakeRuntime::exit`] it). The image need not be in the
    /// store. Not recorded as a call.
    pub fn insert_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        state: cri::ContainerState,
    ) -> Option<String> {
        let mut st = self.lock();
        let image = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        let image_ref = st
            .image(&image)
            .map_or_else(|| image_id(&image), |i| i.id.clone());
        let id = st.insert_container(sandbox_id, config, image_ref)?;
        if let Some(c) = st.containers.get_mut(&id) {
            let at = c.created_at;
            match state {
                cri::ContainerState::ContainerCreated => {}
                cri::ContainerState::ContainerRunning => {
                    c.state = state;
                    c.started_at = at;
                }
                cri::ContainerState::ContainerExited => {
                    c.state = cri::ContainerState::ContainerRunning;
                    c.started_at = at;
                    c.exit(0);
                }
                cri::ContainerState::ContainerUnknown => c.state = state,
            }
        }
        Some(id)
    }

    /// Sets when the running containers named `name` started, in
    /// nanoseconds since the Unix epoch (to backdate a start, e.g. to before
    /// an agent restart). Returns how many were changed.
    pub fn set_started_at(&self, name: &str, nanos: i64) -> usize {
        let mut st = self.lock();
        let mut changed = 0;
        for c in st.containers.values_mut() {
            let named = c.config.metadata.as_ref().is_some_and(|m| m.name == name);
            if named && c.state == cri::ContainerState::ContainerRunning {
                c.started_at = nanos;
                changed += 1;
            }
        }
        changed
    }

    /// Sets when the exited container `container_id` finished, in nanoseconds
    /// since the Unix epoch (to backdate an exit, e.g. past a crash-loop
    /// back-off); a start later than that is moved back to it. Returns false,
    /// changing nothing, when no such container has exited.
    pub fn set_finished_at(&self, container_id: &str, nanos: i64) -> bool {
        let mut st = self.lock();
        match st.containers.get_mut(container_id) {
            Some(c) if c.state == cri::ContainerState::ContainerExited => {
                c.finished_at = nanos;
                c.started_at = c.started_at.min(nanos);
                true
            }
            _ => false,
        }
    }
}

fn unimplemented<T>(method: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!(
        "the fake container runtime does not implement {method}"
    )))
}

#[tonic::async_trait]
impl RuntimeService for FakeRuntime {
    async fn version(
        &self,
        _request: Request<cri::VersionRequest>,
    ) -> Result<Response<cri::VersionResponse>, Status> {
        self.with(|st| {
            st.begin("Version", None)?;
            Ok(cri::VersionResponse {
                version: "0.1.0".into(),
                runtime_name: "fake".into(),
                runtime_version: "0.1.0".into(),
                runtime_api_version: "v1".into(),
            })
        })
    }

    async fn run_pod_sandbox(
        &self,
        request: Request<cri::RunPodSandboxRequest>,
    ) -> Result<Response<cri::RunPodSandboxResponse>, Status> {
        self.with(|st| st.run_pod_sandbox(request.into_inner()))
    }

    async fn stop_pod_sandbox(
        &self,
        request: Request<cri::StopPodSandboxRequest>,
    ) -> Result<Response<cri::StopPodSandboxResponse>, Status> {
        self.with(|st| st.stop_pod_sandbox(request.into_inner()))
    }

    async fn remove_pod_sandbox(
        &self,
        request: Request<cri::RemovePodSandboxRequest>,
    ) -> Result<Response<cri::RemovePodSandboxResponse>, Status> {
        self.with(|st| st.remove_pod_sandbox(request.into_inner()))
    }

    async fn pod_sandbox_status(
        &self,
        request: Request<cri::PodSandboxStatusRequest>,
    ) -> Result<Response<cri::PodSandboxStatusResponse>, Status> {
        self.with(|st| st.pod_sandbox_status(request.into_inner()))
    }

    async fn list_pod_sandbox(
        &self,
        request: Request<cri::ListPodSandboxRequest>,
    ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
        self.with(|st| st.list_pod_sandbox(request.into_inner()))
    }

    async fn create_container(
        &self,
        request: Request<cri::CreateContainerRequest>,
    ) -> Result<Response<cri::CreateContainerResponse>, Status> {
        self.with(|st| st.create_container(request.into_inner()))
    }

    async fn start_container(
        &self,
        request: Request<cri::StartContainerRequest>,
    ) -> Result<Response<cri::StartContainerResponse>, Status> {
        self.with(|st| st.start_container(request.into_inner()))
    }

    async fn stop_container(
        &self,
        request: Request<cri::StopContainerRequest>,
    ) -> Result<Response<cri::StopContainerResponse>, Status> {
        self.with(|st| st.stop_container(request.into_inner()))
    }

    async fn remove_container(
        &self,
        request: Request<cri::RemoveContainerRequest>,
    ) -> Result<Response<cri::RemoveContainerResponse>, Status> {
        self.with(|st| st.remove_container(request.into_inner()))
    }

    async fn list_containers(
        &self,
        request: Request<cri::ListContainersRequest>,
    ) -> Result<Response<cri::ListContainersResponse>, Status> {
        self.with(|st| st.list_containers(request.into_inner()))
    }

    async fn container_status(
        &self,
        request: Request<cri::ContainerStatusRequest>,
    ) -> Result<Response<cri::ContainerStatusResponse>, Status> {
        self.with(|st| st.container_status(request.into_inner()))
    }

    async fn update_container_resources(
        &self,
        request: Request<cri::UpdateContainerResourcesRequest>,
    ) -> Result<Response<cri::UpdateContainerResourcesResponse>, Status> {
        self.with(|st| st.update_container_resources(request.into_inner()))
    }

    async fn reopen_container_log(
        &self,
        _request: Request<cri::ReopenContainerLogRequest>,
    ) -> Result<Response<cri::ReopenContainerLogResponse>, Status> {
        unimplemented("ReopenContainerLog")
    }

    async fn exec_sync(
        &self,
        request: Request<cri::ExecSyncRequest>,
    ) -> Result<Response<cri::ExecSyncResponse>, Status> {
        self.with(|st| st.exec_sync(request.into_inner()))
    }

    async fn exec(
        &self,
        _request: Request<cri::ExecRequest>,
    ) -> Result<Response<cri::ExecResponse>, Status> {
        unimplemented("Exec")
    }

    async fn attach(
        &self,
        _request: Request<cri::AttachRequest>,
    ) -> Result<Response<cri::AttachResponse>, Status> {
        unimplemented("Attach")
    }

    async fn port_forward(
        &self,
        _request: Request<cri::PortForwardRequest>,
    ) -> Result<Response<cri::PortForwardResponse>, Status> {
        unimplemented("PortForward")
    }

    async fn container_stats(
        &self,
        request: Request<cri::ContainerStatsRequest>,
    ) -> Result<Response<cri::ContainerStatsResponse>, Status> {
        let id = request.into_inner().container_id;
        self.with(|st| {
            st.begin("ContainerStats", None)?;
            let container = st
                .containers
                .get(&id)
                .ok_or_else(|| Status::not_found(format!("container {id:?} not found")))?;
            let name = container
                .config
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default();
            let usage = st
                .memory_usage
                .get(&name)
                .copied()
                .unwrap_or(DEFAULT_MEMORY_USAGE);
            Ok(cri::ContainerStatsResponse {
                stats: Some(cri::ContainerStats {
                    attributes: Some(cri::ContainerAttributes {
                        id: id.clone(),
                        metadata: container.config.metadata.clone(),
                        ..Default::default()
                    }),
                    memory: Some(cri::MemoryUsage {
                        usage_bytes: Some(cri::UInt64Value { value: usage }),
                        working_set_bytes: Some(cri::UInt64Value { value: usage }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            })
        })
    }

    async fn list_container_stats(
        &self,
        _request: Request<cri::ListContainerStatsRequest>,
    ) -> Result<Response<cri::ListContainerStatsResponse>, Status> {
        self.with(|st| {
            st.begin("ListContainerStats", None)?;
            Ok(cri::ListContainerStatsResponse::default())
        })
    }

    async fn pod_sandbox_stats(
        &self,
        _request: Request<cri::PodSandboxStatsRequest>,
    ) -> Result<Response<cri::PodSandboxStatsResponse>, Status> {
        unimplemented("PodSandboxStats")
    }

    async fn list_pod_sandbox_stats(
        &self,
        _request: Request<cri::ListPodSandboxStatsRequest>,
    ) -> Result<Response<cri::ListPodSandboxStatsResponse>, Status> {
        self.with(|st| {
            st.begin("ListPodSandboxStats", None)?;
            Ok(cri::ListPodSandboxStatsResponse::default())
        })
    }

    async fn update_runtime_config(
        &self,
        request: Request<cri::UpdateRuntimeConfigRequest>,
    ) -> Result<Response<cri::UpdateRuntimeConfigResponse>, Status> {
        self.with(|st| st.update_runtime_config(request.into_inner()))
    }

    async fn status(
        &self,
        _request: Request<cri::StatusRequest>,
    ) -> Result<Response<cri::StatusResponse>, Status> {
        self.with(State::status)
    }

    async fn checkpoint_container(
        &self,
        _request: Request<cri::CheckpointContainerRequest>,
    ) -> Result<Response<cri::CheckpointContainerResponse>, Status> {
        unimplemented("CheckpointContainer")
    }

    type GetContainerEventsStream = BoxStream<'static, Result<cri::ContainerEventResponse, Status>>;

    async fn get_container_events(
        &self,
        _request: Request<cri::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        unimplemented("GetContainerEvents")
    }

    async fn list_metric_descriptors(
        &self,
        _request: Request<cri::ListMetricDescriptorsRequest>,
    ) -> Result<Response<cri::ListMetricDescriptorsResponse>, Status> {
        unimplemented("ListMetricDescriptors")
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _request: Request<cri::ListPodSandboxMetricsRequest>,
    ) -> Result<Response<cri::ListPodSandboxMetricsResponse>, Status> {
        unimplemented("ListPodSandboxMetrics")
    }

    async fn runtime_config(
        &self,
        _request: Request<cri::RuntimeConfigRequest>,
    ) -> Result<Response<cri::RuntimeConfigResponse>, Status> {
        let Some(driver) = self.lock().cgroup_driver else {
            return unimplemented("RuntimeConfig");
        };
        Ok(Response::new(cri::RuntimeConfigResponse {
            linux: Some(cri::LinuxRuntimeConfiguration {
                cgroup_driver: driver,
            }),
        }))
    }
}

#[tonic::async_trait]
impl ImageService for FakeRuntime {
    async fn list_images(
        &self,
        request: Request<cri::ListImagesRequest>,
    ) -> Result<Response<cri::ListImagesResponse>, Status> {
        self.with(|st| st.list_images(request.into_inner()))
    }

    async fn image_status(
        &self,
        request: Request<cri::ImageStatusRequest>,
    ) -> Result<Response<cri::ImageStatusResponse>, Status> {
        self.with(|st| st.image_status(request.into_inner()))
    }

    async fn pull_image(
        &self,
        request: Request<cri::PullImageRequest>,
    ) -> Result<Response<cri::PullImageResponse>, Status> {
        self.with(|st| st.pull_image(request.into_inner()))
    }

    async fn remove_image(
        &self,
        request: Request<cri::RemoveImageRequest>,
    ) -> Result<Response<cri::RemoveImageResponse>, Status> {
        self.with(|st| st.remove_image(request.into_inner()))
    }

    async fn image_fs_info(
        &self,
        _request: Request<cri::ImageFsInfoRequest>,
    ) -> Result<Response<cri::ImageFsInfoResponse>, Status> {
        self.with(|st| {
            st.begin("ImageFsInfo", None)?;
            Ok(st.image_fs_info.clone())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::{CONTAINER_NAME_LABEL, POD_NAME_LABEL, POD_NAMESPACE_LABEL};

    const PAUSE: &str = "registry.k8s.io/pause:3.10";
    const BUSYBOX: &str = "docker.io/library/busybox:1.36";

    fn sandbox_config(namespace: &str, name: &str, uid: &str) -> cri::PodSandboxConfig {
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: namespace.into(),
                attempt: 0,
            }),
            log_directory: format!("/var/log/pods/{namespace}_{name}_{uid}"),
            labels: HashMap::from([
                (POD_UID_LABEL.to_string(), uid.to_string()),
                (POD_NAME_LABEL.to_string(), name.to_string()),
                (POD_NAMESPACE_LABEL.to_string(), namespace.to_string()),
            ]),
            ..Default::default()
        }
    }

    fn container_config(uid: &str, name: &str, attempt: u32) -> cri::ContainerConfig {
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.into(),
                attempt,
            }),
            image: Some(cri::ImageSpec {
                image: BUSYBOX.into(),
                ..Default::default()
            }),
            labels: HashMap::from([
                (POD_UID_LABEL.to_string(), uid.to_string()),
                (CONTAINER_NAME_LABEL.to_string(), name.to_string()),
            ]),
            annotations: HashMap::from([(
                "io.kubernetes.container.hash".to_string(),
                "1".to_string(),
            )]),
            log_path: format!("{name}/{attempt}.log"),
            mounts: vec![cri::Mount {
                container_path: "/data".into(),
                host_path: "/var/lib/data".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    async fn served() -> (tempfile::TempDir, FakeRuntime, Runtime) {
        let dir = tempfile::tempdir().unwrap();
        let (fake, socket) = FakeRuntime::serve(dir.path()).unwrap();
        assert_eq!(socket, dir.path().join(SOCKET_NAME));
        assert_eq!(
            fake.endpoint().unwrap(),
            format!("unix://{}", socket.display())
        );
        let runtime = fake.client(Duration::from_secs(10)).await.unwrap();
        (dir, fake, runtime)
    }

    /// Runs a sandbox for pod `default/<name>` with UID `uid` and one container
    /// `name` in it, started; returns (sandbox ID, container ID).
    async fn running_pod(runtime: &Runtime, name: &str, uid: &str) -> (String, String) {
        let config = sandbox_config("default", name, uid);
        let sandbox = runtime
            .run_pod_sandbox(config.clone(), "", name)
            .await
            .unwrap();
        let container = runtime
            .create_container(
                &sandbox,
                container_config(uid, name, 0),
                config,
                &no_sub_paths(),
                name,
            )
            .await
            .unwrap();
        runtime.start_container(&container).await.unwrap();
        (sandbox, container)
    }

    fn state(s: &cri::ContainerStatus) -> cri::ContainerState {
        cri::ContainerState::try_from(s.state).unwrap()
    }

    #[tokio::test]
    async fn the_runtimes_cgroup_driver_is_read_as_the_kubelet_reads_it() {
        let (_dir, fake, runtime) = served().await;
        // A runtime without the call: the configured driver stands.
        assert_eq!(runtime.cgroup_driver().await.unwrap(), None);
        fake.set_cgroup_driver(Some(cri::CgroupDriver::Systemd as i32));
        assert_eq!(runtime.cgroup_driver().await.unwrap(), Some("systemd"));
        fake.set_cgroup_driver(Some(cri::CgroupDriver::Cgroupfs as i32));
        assert_eq!(runtime.cgroup_driver().await.unwrap(), Some("cgroupfs"));
        // A number the API does not define is an error, not a guess.
        fake.set_cgroup_driver(Some(7));
        let e = runtime.cgroup_driver().await.unwrap_err();
        assert!(e.to_string().contains("unknown cgroup driver 7"), "{e}");
    }

    #[tokio::test]
    async fn sandbox_runs_lists_by_filter_stops_and_is_removed() {
        let (_dir, fake, runtime) = served().await;
        let web = runtime
            .run_pod_sandbox(
                sandbox_config("default", "web", "uid-web"),
                "",
                "default/web",
            )
            .await
            .unwrap();
        let db = runtime
            .run_pod_sandbox(sandbox_config("prod", "db", "uid-db"), "", "prod/db")
            .await
            .unwrap();
        assert_ne!(web, db);
        assert_eq!(web.len(), 64);

        let status = runtime.pod_sandbox_status(&web).await.unwrap().unwrap();
        assert_eq!(status.id, web);
        assert_eq!(status.state, cri::PodSandboxState::SandboxReady as i32);
        assert_eq!(status.network.unwrap().ip, "10.244.0.1");
        assert_eq!(status.metadata.unwrap().namespace, "default");
        assert_eq!(status.labels[POD_NAME_LABEL], "web");
        assert!(
            status.created_at > 1_600_000_000_000_000_000,
            "{}",
            status.created_at
        );
        let db_status = runtime.pod_sandbox_status(&db).await.unwrap().unwrap();
        assert_eq!(db_status.network.unwrap().ip, "10.244.0.2");

        let by_uid = HashMap::from([(POD_UID_LABEL.to_string(), "uid-db".to_string())]);
        let listed = runtime.list_pod_sandboxes(by_uid).await.unwrap();
        assert_eq!(listed.iter().map(|s| &s.id).collect::<Vec<_>>(), [&db]);
        assert_eq!(
            runtime
                .list_pod_sandboxes(HashMap::new())
                .await
                .unwrap()
                .len(),
            2
        );
        let nobody = HashMap::from([(POD_UID_LABEL.to_string(), "uid-none".to_string())]);
        assert!(runtime.list_pod_sandboxes(nobody).await.unwrap().is_empty());

        runtime.stop_pod_sandbox(&web).await.unwrap();
        let status = runtime.pod_sandbox_status(&web).await.unwrap().unwrap();
        assert_eq!(status.state, cri::PodSandboxState::SandboxNotready as i32);
        assert_eq!(status.network.unwrap().ip, "");

        let mut client = runtime.runtime_client();
        let list = |filter: cri::PodSandboxFilter| {
            let mut client = client.clone();
            async move {
                let req = cri::ListPodSandboxRequest {
                    filter: Some(filter),
                };
                let items = client
                    .list_pod_sandbox(req)
                    .await
                    .unwrap()
                    .into_inner()
                    .items;
                items.into_iter().map(|s| s.id).collect::<Vec<_>>()
            }
        };
        let not_ready = cri::PodSandboxFilter {
            state: Some(cri::PodSandboxStateValue {
                state: cri::PodSandboxState::SandboxNotready.into(),
            }),
            ..Default::default()
        };
        assert_eq!(list(not_ready).await, [web.as_str()]);
        let by_id = cri::PodSandboxFilter {
            id: db.clone(),
            ..Default::default()
        };
        assert_eq!(list(by_id).await, [db.as_str()]);

        runtime.remove_pod_sandbox(&web).await.unwrap();
        let gone = runtime.pod_sandbox_status(&web).await.unwrap_err();
        assert_eq!(gone.code(), Some(Code::NotFound));
        // Removing again is no error, as containerd.
        runtime.remove_pod_sandbox(&web).await.unwrap();
        let version = client
            .version(cri::VersionRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(version.runtime_name, "fake");

        assert_eq!(
            fake.calls(),
            [
                "RunPodSandbox default/web",
                "RunPodSandbox prod/db",
                "StopPodSandbox web",
                "RemovePodSandbox web",
                &format!("RemovePodSandbox {web}"),
            ]
        );
        let left = fake.sandboxes();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].pod_uid, "uid-db");
        assert_eq!(left[0].state, cri::PodSandboxState::SandboxReady);
    }

    #[tokio::test]
    async fn host_network_sandbox_has_no_pod_ip() {
        let (_dir, fake, runtime) = served().await;
        let mut config = sandbox_config("kube-system", "proxy", "uid-proxy");
        config.linux = Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: cri::NamespaceMode::Node.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        let proxy = runtime.run_pod_sandbox(config, "", "proxy").await.unwrap();
        let status = runtime.pod_sandbox_status(&proxy).await.unwrap().unwrap();
        assert_eq!(status.network.unwrap().ip, "");
        // The next pod network sandbox still gets the first address.
        let web = runtime
            .run_pod_sandbox(sandbox_config("default", "web", "uid-web"), "", "web")
            .await
            .unwrap();
        let ips: Vec<_> = fake.sandboxes().into_iter().map(|s| (s.id, s.ip)).collect();
        assert_eq!(
            ips,
            [(proxy, String::new()), (web, "10.244.0.1".to_string())]
        );
    }

    fn no_sub_paths() -> crate::cri::extension::ImageSubPaths {
        crate::cri::extension::ImageSubPaths::new()
    }

    #[tokio::test]
    async fn a_create_with_image_sub_paths_reaches_the_runtime_whole() {
        // The request goes out encoded by the extension (the bindings' bytes
        // and the mounts appended); the server, decoding with the bindings,
        // reads every mount in order, each sub path skipped as an unknown
        // field.
        let (_dir, _fake, runtime) = served().await;
        let config = sandbox_config("default", "web", "uid-web");
        let sandbox = runtime
            .run_pod_sandbox(config.clone(), "", "web")
            .await
            .unwrap();
        let image = runtime
            .pull_image(BUSYBOX, config.clone(), None)
            .await
            .unwrap();
        let mut container = container_config("uid-web", "app", 0);
        container.mounts = vec![
            cri::Mount {
                container_path: "/etc/hosts".into(),
                host_path: "/pods/uid-web/etc-hosts".into(),
                ..Default::default()
            },
            cri::Mount {
                container_path: "/data".into(),
                readonly: true,
                image: Some(cri::ImageSpec {
                    image,
                    user_specified_image: BUSYBOX.into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
        ];
        let subs: crate::cri::extension::ImageSubPaths =
            [("/data".to_string(), "bin".to_string())].into();
        let id = runtime
            .create_container(&sandbox, container.clone(), config, &subs, "app")
            .await
            .unwrap();
        let created = runtime.container_status(&id).await.unwrap().unwrap();
        assert_eq!(created.mounts, container.mounts);
        assert_eq!(created.metadata, container.metadata);
        assert_eq!(created.image.unwrap().image, BUSYBOX);
    }

    #[tokio::test]
    async fn container_lifecycle_through_the_client() {
        let (_dir, fake, runtime) = served().await;
        let config = sandbox_config("default", "web", "uid-web");
        let sandbox = runtime
            .run_pod_sandbox(config.clone(), "", "web")
            .await
            .unwrap();
        let image_ref = runtime
            .pull_image(BUSYBOX, config.clone(), None)
            .await
            .unwrap();
        assert_eq!(image_ref, image_id(BUSYBOX));

        let id = runtime
            .create_container(
                &sandbox,
                container_config("uid-web", "app", 0),
                config,
                &no_sub_paths(),
                "app",
            )
            .await
            .unwrap();
        let created = runtime.container_status(&id).await.unwrap().unwrap();
        assert_eq!(state(&created), cri::ContainerState::ContainerCreated);
        assert_eq!(created.started_at, 0);
        assert!(created.created_at > 0);
        assert_eq!(
            created.log_path,
            "/var/log/pods/default_web_uid-web/app/0.log"
        );
        assert_eq!(created.image.unwrap().image, BUSYBOX);
        assert_eq!(created.image_ref, image_ref);
        assert_eq!(created.mounts[0].container_path, "/data");
        assert_eq!(created.annotations["io.kubernetes.container.hash"], "1");
        assert_eq!(created.labels[CONTAINER_NAME_LABEL], "app");

        runtime.start_container(&id).await.unwrap();
        let running = runtime.container_status(&id).await.unwrap().unwrap();
        assert_eq!(state(&running), cri::ContainerState::ContainerRunning);
        assert!(running.started_at >= running.created_at);
        assert_eq!(running.finished_at, 0);
        // Starting twice is refused, as containerd.
        assert!(runtime.start_container(&id).await.is_err());

        runtime.stop_container(&id, 30).await.unwrap();
        let exited = runtime.container_status(&id).await.unwrap().unwrap();
        assert_eq!(state(&exited), cri::ContainerState::ContainerExited);
        assert_eq!(exited.exit_code, KILLED_EXIT_CODE);
        assert_eq!(exited.reason, "Error");
        assert!(exited.finished_at >= exited.started_at);

        runtime.remove_container(&id).await.unwrap();
        let gone = runtime.container_status(&id).await.unwrap_err();
        assert_eq!(gone.code(), Some(Code::NotFound));
        assert!(fake.containers().is_empty());
        assert_eq!(
            fake.take_calls(),
            [
                "RunPodSandbox default/web",
                "PullImage docker.io/library/busybox:1.36",
                "CreateContainer app",
                "StartContainer app",
                "StartContainer app",
                "StopContainer app 30",
                "RemoveContainer app",
            ]
        );
        assert!(fake.calls().is_empty());
    }

    #[tokio::test]
    async fn create_needs_the_image_and_a_free_name() {
        let (_dir, fake, runtime) = served().await;
        let config = sandbox_config("default", "web", "uid-web");
        let sandbox = runtime
            .run_pod_sandbox(config.clone(), "", "web")
            .await
            .unwrap();
        let err = runtime
            .create_container(
                &sandbox,
                container_config("uid-web", "app", 0),
                config.clone(),
                &no_sub_paths(),
                "app",
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some(Code::NotFound));
        assert!(fake.containers().is_empty());

        fake.add_image(BUSYBOX);
        runtime
            .create_container(
                &sandbox,
                container_config("uid-web", "app", 0),
                config.clone(),
                &no_sub_paths(),
                "app",
            )
            .await
            .unwrap();
        // The same name and attempt again in the sandbox is refused.
        assert!(
            runtime
                .create_container(
                    &sandbox,
                    container_config("uid-web", "app", 0),
                    config.clone(),
                    &no_sub_paths(),
                    "app"
                )
                .await
                .is_err()
        );
        runtime
            .create_container(
                &sandbox,
                container_config("uid-web", "app", 1),
                config.clone(),
                &no_sub_paths(),
                "app",
            )
            .await
            .unwrap();
        // Nothing is created in a stopped sandbox.
        runtime.stop_pod_sandbox(&sandbox).await.unwrap();
        assert!(
            runtime
                .create_container(
                    &sandbox,
                    container_config("uid-web", "app", 2),
                    config,
                    &no_sub_paths(),
                    "app"
                )
                .await
                .is_err()
        );
        assert_eq!(
            fake.containers()
                .iter()
                .map(|c| c.attempt)
                .collect::<Vec<_>>(),
            [0, 1]
        );
    }

    #[tokio::test]
    async fn containers_list_by_label_state_and_sandbox() {
        let (_dir, fake, runtime) = served().await;
        fake.add_image(BUSYBOX);
        let (web_sandbox, web) = running_pod(&runtime, "web", "uid-web").await;
        let (_, db) = running_pod(&runtime, "db", "uid-db").await;
        runtime.stop_container(&db, 0).await.unwrap();

        let by_uid = HashMap::from([(POD_UID_LABEL.to_string(), "uid-db".to_string())]);
        let listed = runtime.list_containers(by_uid).await.unwrap();
        assert_eq!(listed.iter().map(|c| &c.id).collect::<Vec<_>>(), [&db]);
        assert_eq!(listed[0].state, cri::ContainerState::ContainerExited as i32);
        assert_eq!(listed[0].image_ref, image_id(BUSYBOX));

        let running = runtime.list_running_containers().await.unwrap();
        assert_eq!(running.iter().map(|c| &c.id).collect::<Vec<_>>(), [&web]);

        let mut client = runtime.runtime_client();
        let req = cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                pod_sandbox_id: web_sandbox.clone(),
                ..Default::default()
            }),
        };
        let in_web = client
            .list_containers(req)
            .await
            .unwrap()
            .into_inner()
            .containers;
        assert_eq!(in_web.iter().map(|c| &c.id).collect::<Vec<_>>(), [&web]);
        assert_eq!(in_web[0].pod_sandbox_id, web_sandbox);
        let req = cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                id: db.clone(),
                ..Default::default()
            }),
        };
        let by_id = client
            .list_containers(req)
            .await
            .unwrap()
            .into_inner()
            .containers;
        assert_eq!(by_id.iter().map(|c| &c.id).collect::<Vec<_>>(), [&db]);

        // Stopping the sandbox kills its running container; removing it drops it.
        runtime.stop_pod_sandbox(&web_sandbox).await.unwrap();
        let killed = runtime.container_status(&web).await.unwrap().unwrap();
        assert_eq!(state(&killed), cri::ContainerState::ContainerExited);
        assert_eq!(killed.exit_code, KILLED_EXIT_CODE);
        runtime.remove_pod_sandbox(&web_sandbox).await.unwrap();
        let left = fake.containers();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].id, db);
        assert_eq!(left[0].pod_uid, "uid-db");
    }

    #[tokio::test]
    async fn pulls_add_images_and_scripted_pulls_fail() {
        let (_dir, fake, runtime) = served().await;
        assert_eq!(runtime.image_id(BUSYBOX).await.unwrap(), None);
        let sandbox = sandbox_config("default", "web", "uid-web");
        let image_ref = runtime
            .pull_image(BUSYBOX, sandbox.clone(), None)
            .await
            .unwrap();
        assert!(image_ref.starts_with("sha256:") && image_ref.len() == 7 + 64);
        let image = runtime.image_id(BUSYBOX).await.unwrap().unwrap();
        assert_eq!(image.id, image_ref);
        assert_eq!(image.repo_tags, [BUSYBOX]);
        // An image can be found by its ID too.
        assert!(runtime.image_id(&image_ref).await.unwrap().is_some());

        fake.fail_pull("private.example/app:1", "pull access denied");
        let err = runtime
            .pull_image("private.example/app:1", sandbox.clone(), None)
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some(Code::NotFound));
        assert!(err.to_string().contains("pull access denied"), "{err}");
        assert_eq!(
            runtime.image_id("private.example/app:1").await.unwrap(),
            None
        );
        fake.allow_pull("private.example/app:1");
        runtime
            .pull_image("private.example/app:1", sandbox, None)
            .await
            .unwrap();

        fake.add_image(PAUSE);
        let listed = runtime.list_images().await.unwrap();
        assert_eq!(
            listed
                .iter()
                .map(|i| i.repo_tags[0].as_str())
                .collect::<Vec<_>>(),
            [BUSYBOX, "private.example/app:1", PAUSE]
        );
        assert_eq!(fake.images(), [BUSYBOX, "private.example/app:1", PAUSE]);
        assert_eq!(
            fake.calls(),
            [
                "PullImage docker.io/library/busybox:1.36",
                "PullImage private.example/app:1",
                "PullImage private.example/app:1",
            ]
        );
    }

    #[tokio::test]
    async fn scripted_exits_and_backdated_finish() {
        let (_dir, fake, runtime) = served().await;
        fake.add_image(BUSYBOX);
        fake.script_exit_on_start("crash", 1);
        let (_, crash) = running_pod(&runtime, "crash", "uid-crash").await;
        let status = runtime.container_status(&crash).await.unwrap().unwrap();
        assert_eq!(state(&status), cri::ContainerState::ContainerExited);
        assert_eq!(status.exit_code, 1);
        assert_eq!(status.reason, "Error");
        assert!(status.started_at > 0 && status.finished_at >= status.started_at);

        let (_, web) = running_pod(&runtime, "web", "uid-web").await;
        assert!(fake.exit_named("uid-web", "web", 0));
        let status = runtime.container_status(&web).await.unwrap().unwrap();
        assert_eq!(state(&status), cri::ContainerState::ContainerExited);
        assert_eq!(status.exit_code, 0);
        assert_eq!(status.reason, "Completed");
        // Only a running container exits.
        assert!(!fake.exit(&web, 2));
        assert!(!fake.exit_named("uid-web", "web", 2));
        assert_eq!(
            runtime
                .container_status(&web)
                .await
                .unwrap()
                .unwrap()
                .exit_code,
            0
        );

        assert!(fake.set_finished_at(&crash, 1_000));
        let status = runtime.container_status(&crash).await.unwrap().unwrap();
        assert_eq!(status.finished_at, 1_000);
        assert!(status.started_at <= 1_000);

        fake.script_exit_on_stop("graceful", 0);
        let (_, graceful) = running_pod(&runtime, "graceful", "uid-graceful").await;
        assert!(!fake.set_finished_at(&graceful, 1_000));
        runtime.stop_container(&graceful, 30).await.unwrap();
        let status = runtime.container_status(&graceful).await.unwrap().unwrap();
        assert_eq!((status.exit_code, status.reason.as_str()), (0, "Completed"));
        let snapshot = fake.containers();
        assert_eq!(
            snapshot
                .iter()
                .map(|c| (c.name.as_str(), c.exit_code))
                .collect::<Vec<_>>(),
            [("crash", 1), ("web", 0), ("graceful", 0)]
        );
    }

    #[tokio::test]
    async fn fail_next_fails_one_call_of_that_method() {
        let (_dir, fake, runtime) = served().await;
        fake.add_image(BUSYBOX);
        let config = sandbox_config("default", "web", "uid-web");
        let sandbox = runtime
            .run_pod_sandbox(config.clone(), "", "web")
            .await
            .unwrap();
        let id = runtime
            .create_container(
                &sandbox,
                container_config("uid-web", "app", 0),
                config,
                &no_sub_paths(),
                "app",
            )
            .await
            .unwrap();
        fake.fail_next("StartContainer", Code::Unavailable, "runtime busy");
        fake.fail_next("ListContainers", Code::DeadlineExceeded, "slow");

        let err = runtime.start_container(&id).await.unwrap_err();
        assert_eq!(err.code(), Some(Code::Unavailable));
        assert!(err.to_string().contains("runtime busy"), "{err}");
        let status = runtime.container_status(&id).await.unwrap().unwrap();
        assert_eq!(state(&status), cri::ContainerState::ContainerCreated);
        let err = runtime.list_containers(HashMap::new()).await.unwrap_err();
        assert_eq!(err.code(), Some(Code::DeadlineExceeded));

        runtime.start_container(&id).await.unwrap();
        assert_eq!(runtime.list_running_containers().await.unwrap().len(), 1);
        assert_eq!(
            fake.calls(),
            [
                "RunPodSandbox default/web",
                "CreateContainer app",
                "StartContainer app",
                "StartContainer app",
            ]
        );
    }

    #[tokio::test]
    async fn inserted_state_is_seen_as_survivors_of_a_restart() {
        let (_dir, fake, runtime) = served().await;
        let sandbox = fake.insert_sandbox(sandbox_config("default", "old", "uid-old"));
        let running = fake
            .insert_container(
                &sandbox,
                container_config("uid-old", "app", 3),
                cri::ContainerState::ContainerRunning,
            )
            .unwrap();
        let exited = fake
            .insert_container(
                &sandbox,
                container_config("uid-old", "app", 2),
                cri::ContainerState::ContainerExited,
            )
            .unwrap();
        assert!(
            fake.insert_container(
                "no-such-sandbox",
                container_config("uid-old", "app", 4),
                cri::ContainerState::ContainerCreated,
            )
            .is_none()
        );
        assert!(fake.calls().is_empty());

        let by_uid = HashMap::from([(POD_UID_LABEL.to_string(), "uid-old".to_string())]);
        let sandboxes = runtime.list_pod_sandboxes(by_uid.clone()).await.unwrap();
        assert_eq!(
            sandboxes.iter().map(|s| &s.id).collect::<Vec<_>>(),
            [&sandbox]
        );
        let containers = runtime.list_containers(by_uid).await.unwrap();
        assert_eq!(
            containers.iter().map(|c| &c.id).collect::<Vec<_>>(),
            [&running, &exited]
        );
        let status = runtime.container_status(&running).await.unwrap().unwrap();
        assert_eq!(state(&status), cri::ContainerState::ContainerRunning);
        assert_eq!(status.metadata.unwrap().attempt, 3);
        let status = runtime.container_status(&exited).await.unwrap().unwrap();
        assert_eq!(state(&status), cri::ContainerState::ContainerExited);
        assert_eq!(status.reason, "Completed");

        // The adopted container is stopped like any other.
        assert!(fake.exit(&running, 143));
        let status = runtime.container_status(&running).await.unwrap().unwrap();
        assert_eq!((status.exit_code, status.reason.as_str()), (143, "Error"));
    }

    #[tokio::test]
    async fn version_status_exec_and_unimplemented_events() {
        let (_dir, fake, runtime) = served().await;
        let version = runtime.version().await.unwrap();
        assert_eq!(
            (
                version.runtime_name.as_str(),
                version.runtime_version.as_str(),
                version.runtime_api_version.as_str()
            ),
            ("fake", "0.1.0", "v1")
        );
        let conditions = |s: cri::StatusResponse| {
            s.status
                .unwrap()
                .conditions
                .into_iter()
                .map(|c| (c.r#type, c.status))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            conditions(runtime.status().await.unwrap()),
            [("RuntimeReady".into(), true), ("NetworkReady".into(), true)]
        );
        fake.set_status(true, false);
        let status = runtime.status().await.unwrap();
        let network = &status.status.as_ref().unwrap().conditions[1];
        assert_eq!(network.reason, "NetworkPluginNotReady");
        assert_eq!(
            conditions(status),
            [
                ("RuntimeReady".into(), true),
                ("NetworkReady".into(), false)
            ]
        );

        let mut client = runtime.runtime_client();
        let err = client
            .get_container_events(cri::GetEventsRequest {})
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unimplemented);
        assert!(runtime.list_container_stats().await.unwrap().is_empty());

        fake.add_image(BUSYBOX);
        let (_, web) = running_pod(&runtime, "web", "uid-web").await;
        let probe = vec!["cat".to_string(), "/tmp/healthy".to_string()];
        let timeout = Duration::from_secs(1);
        assert_eq!(
            runtime
                .exec_sync(&web, probe.clone(), timeout)
                .await
                .unwrap(),
            (0, vec![])
        );
        fake.script_exec(["cat", "/tmp/healthy"], 1, "No such file\n");
        assert_eq!(
            runtime
                .exec_sync(&web, probe.clone(), timeout)
                .await
                .unwrap(),
            (1, b"No such file\n".to_vec())
        );
        assert_eq!(
            fake.execs(),
            ["web cat /tmp/healthy", "web cat /tmp/healthy"]
        );
        runtime.stop_container(&web, 0).await.unwrap();
        assert!(runtime.exec_sync(&web, probe, timeout).await.is_err());
    }
}
