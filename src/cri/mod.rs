//! The CRI client: the kubelet's `remote runtime service` and `remote image
//! service` over one gRPC channel on a unix socket (tonic, `k8s-cri` bindings).
//!
//! Every call carries a deadline (the kubelet's `runtimeRequestTimeout`, 2 min
//! by default) and fails with an [`Error`] that names the CRI call and the object
//! (pod or container) it was made for.

pub mod extension;
pub mod fake;
pub mod log;

use std::{collections::HashMap, future::Future, io, path::PathBuf, time::Duration};

use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use tokio::net::UnixStream;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint, Uri};
use tower::service_fn;

pub use cri::image_service_client::ImageServiceClient;
pub use cri::runtime_service_client::RuntimeServiceClient;

/// Errors of the CRI client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint is not a `unix://` URL.
    #[error("container runtime endpoint {0:?} is not a unix:// socket")]
    Endpoint(String),
    /// The socket could not be reached.
    #[error("connect to container runtime at {endpoint}")]
    Connect {
        /// The endpoint as given.
        endpoint: String,
        /// What the transport said.
        #[source]
        source: tonic::transport::Error,
    },
    /// The runtime answered a call with an error.
    #[error("CRI {call} for {target}: {message} ({code:?})")]
    Call {
        /// The CRI method, e.g. `RunPodSandbox`.
        call: &'static str,
        /// The object the call was for, e.g. `pod default/web` or a container ID.
        target: String,
        /// The gRPC status code.
        code: tonic::Code,
        /// The runtime's message.
        message: String,
    },
    /// The call did not finish within the request timeout.
    #[error("CRI {call} for {target}: no answer within {timeout:?}")]
    Timeout {
        /// The CRI method.
        call: &'static str,
        /// The object the call was for.
        target: String,
        /// The deadline that passed.
        timeout: Duration,
    },
}

impl Error {
    /// The gRPC code of a failed call, if the runtime answered at all.
    #[must_use]
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Self::Call { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Which standard streams an exec or attach session carries, and whether it
/// runs in a terminal (the kubelet's `remotecommand.Options`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamIo {
    /// The client sends standard input.
    pub stdin: bool,
    /// The client reads standard output.
    pub stdout: bool,
    /// The client reads standard error (never with `tty`).
    pub stderr: bool,
    /// The process runs in a terminal.
    pub tty: bool,
}

/// Result of CRI calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A handle to the container runtime: one channel, both CRI services.
/// Cheap to clone; every clone shares the channel.
#[derive(Clone)]
pub struct Runtime {
    channel: Channel,
    runtime: RuntimeServiceClient<Traced>,
    images: ImageServiceClient<Traced>,
    timeout: Duration,
}

/// The channel as the CRI clients use it: each request carries the W3C
/// trace context of its span ([`crate::otel::TraceContext`]).
pub type Traced = InterceptedService<Channel, crate::otel::TraceContext>;

/// The largest CRI message (bytes) received or sent: the kubelet's
/// `maxMsgSize` (pkg/kubelet/cri/remote), which it sets for what it
/// receives; a request as large is also the most containerd's server
/// accepts, so a larger one is refused here with its size rather than there.
pub const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// Parses `unix:///path` (or a bare absolute path) into the socket path.
///
/// # Errors
/// [`Error::Endpoint`] for any other scheme.
pub fn socket_path(endpoint: &str) -> Result<PathBuf> {
    if let Some(p) = endpoint.strip_prefix("unix://") {
        return Ok(PathBuf::from(p));
    }
    if endpoint.starts_with('/') {
        return Ok(PathBuf::from(endpoint));
    }
    Err(Error::Endpoint(endpoint.to_string()))
}

/// A gRPC channel to the server on unix socket `path`, connected now (5 s
/// at most): for the runtime, and for plugins (registration, CSI drivers).
///
/// # Errors
/// The socket does not answer.
pub async fn unix_channel(path: PathBuf) -> std::result::Result<Channel, tonic::transport::Error> {
    // The URI is required by tonic but unused: the connector dials the socket.
    Endpoint::from_static("http://[::]:50051")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

/// A gRPC channel to the server on unix socket `path` that dials it only
/// when a call is made.
#[must_use]
pub fn unix_channel_lazy(path: PathBuf) -> Channel {
    Endpoint::from_static("http://[::]:50051")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector_lazy(service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
}

impl Runtime {
    /// Connects to the runtime at `endpoint` (`unix:///run/containerd/containerd.sock`);
    /// `timeout` bounds every later call.
    ///
    /// # Errors
    /// [`Error::Endpoint`] for a non-unix endpoint, [`Error::Connect`] when the
    /// socket does not answer.
    pub async fn connect(endpoint: &str, timeout: Duration) -> Result<Self> {
        let path = socket_path(endpoint)?;
        let channel = unix_channel(path).await.map_err(|source| Error::Connect {
            endpoint: endpoint.to_string(),
            source,
        })?;
        Ok(Self::over(channel, timeout))
    }

    /// The clients of `channel`, each message at most [`MAX_MESSAGE_BYTES`]
    /// either way.
    fn over(channel: Channel, timeout: Duration) -> Self {
        Self {
            runtime: RuntimeServiceClient::with_interceptor(
                channel.clone(),
                crate::otel::TraceContext,
            )
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
            images: ImageServiceClient::with_interceptor(
                channel.clone(),
                crate::otel::TraceContext,
            )
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
            channel,
            timeout,
        }
    }

    /// A handle to the runtime at `endpoint` that dials the socket only when a
    /// call is made (for servers that may start before the runtime answers).
    ///
    /// # Errors
    /// [`Error::Endpoint`] for a non-unix endpoint.
    pub fn connect_lazy(endpoint: &str, timeout: Duration) -> Result<Self> {
        let channel = unix_channel_lazy(socket_path(endpoint)?);
        Ok(Self::over(channel, timeout))
    }

    /// The runtime service client, for calls this handle does not wrap.
    #[must_use]
    pub fn runtime_client(&self) -> RuntimeServiceClient<Traced> {
        self.runtime.clone()
    }

    async fn call<T, F>(&self, call: &'static str, target: impl Into<String>, fut: F) -> Result<T>
    where
        F: Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = std::time::Instant::now();
        // A span per call (exported when tracing is on, src/otel.rs).
        let span = tracing::debug_span!(
            "cri",
            otel.name = %crate::otel::cri_span_name(call),
            otel.kind = "client",
        );
        let result =
            tracing::Instrument::instrument(tokio::time::timeout(self.timeout, fut), span).await;
        crate::metrics::metrics().record_runtime_operation(
            call,
            started.elapsed(),
            !matches!(result, Ok(Ok(_))),
        );
        match result {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) => Err(Error::Call {
                call,
                target: target.into(),
                code: status.code(),
                message: status.message().to_string(),
            }),
            Err(_) => Err(Error::Timeout {
                call,
                target: target.into(),
                timeout: self.timeout,
            }),
        }
    }

    /// CRI `Version`: the runtime's name and version (e.g. `containerd`, `v2.4.2`).
    ///
    /// # Errors
    /// As every call: [`Error::Call`] or [`Error::Timeout`].
    pub async fn version(&self) -> Result<cri::VersionResponse> {
        let mut c = self.runtime.clone();
        self.call(
            "Version",
            "runtime",
            c.version(cri::VersionRequest {
                version: "v1".into(),
            }),
        )
        .await
    }

    /// CRI `Status`: the RuntimeReady and NetworkReady conditions.
    ///
    /// # Errors
    /// As every call.
    pub async fn status(&self) -> Result<cri::StatusResponse> {
        let mut c = self.runtime.clone();
        self.call(
            "Status",
            "runtime",
            c.status(cri::StatusRequest { verbose: false }),
        )
        .await
    }

    /// CRI `RuntimeConfig`: the runtime's cgroup driver (`systemd` or
    /// `cgroupfs`), which the agent's must match, as the kubelet's
    /// `getCgroupDriverFromCRI` reads it. None when the runtime does not
    /// implement the call or gives no Linux configuration: the configured
    /// driver stands then.
    ///
    /// # Errors
    /// As every call (but `Unimplemented`), and [`Error::Call`] with
    /// `Unknown` for a driver number the API does not define.
    pub async fn cgroup_driver(&self) -> Result<Option<&'static str>> {
        let mut c = self.runtime.clone();
        let answer = self
            .call(
                "RuntimeConfig",
                "runtime",
                c.runtime_config(cri::RuntimeConfigRequest {}),
            )
            .await;
        let linux = match answer {
            Ok(r) => r.linux,
            Err(e) if e.code() == Some(tonic::Code::Unimplemented) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Some(linux) = linux else {
            return Ok(None);
        };
        match cri::CgroupDriver::try_from(linux.cgroup_driver) {
            Ok(cri::CgroupDriver::Systemd) => Ok(Some("systemd")),
            Ok(cri::CgroupDriver::Cgroupfs) => Ok(Some("cgroupfs")),
            Err(_) => Err(Error::Call {
                call: "RuntimeConfig",
                target: "runtime".into(),
                code: tonic::Code::Unknown,
                message: format!("unknown cgroup driver {}", linux.cgroup_driver),
            }),
        }
    }

    /// CRI `UpdateRuntimeConfig` with the node's pod CIDRs (`cidr`, comma
    /// separated), as the kubelet's `UpdatePodCIDR`: a runtime whose CNI
    /// config is a template (containerd's `conf_template`) writes it then.
    ///
    /// # Errors
    /// As every call.
    pub async fn update_pod_cidr(&self, cidr: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::UpdateRuntimeConfigRequest {
            runtime_config: Some(cri::RuntimeConfig {
                network_config: Some(cri::NetworkConfig {
                    pod_cidr: cidr.to_string(),
                }),
            }),
        };
        self.call(
            "UpdateRuntimeConfig",
            "runtime",
            c.update_runtime_config(req),
        )
        .await
        .map(|_| ())
    }

    /// CRI `RunPodSandbox` with runtime handler `runtime_handler` (a
    /// RuntimeClass's `handler`; empty: the runtime's default); returns the
    /// new sandbox's ID.
    ///
    /// # Errors
    /// As every call; `target` names the pod in the error.
    pub async fn run_pod_sandbox(
        &self,
        config: cri::PodSandboxConfig,
        runtime_handler: &str,
        target: &str,
    ) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: runtime_handler.to_string(),
        };
        Ok(self
            .call("RunPodSandbox", target, c.run_pod_sandbox(req))
            .await?
            .pod_sandbox_id)
    }

    /// CRI `StopPodSandbox`: stops every container in it and tears down its network.
    ///
    /// # Errors
    /// As every call.
    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call("StopPodSandbox", id, c.stop_pod_sandbox(req))
            .await
            .map(drop)
    }

    /// CRI `RemovePodSandbox`.
    ///
    /// # Errors
    /// As every call.
    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.call("RemovePodSandbox", id, c.remove_pod_sandbox(req))
            .await
            .map(drop)
    }

    /// CRI `PodSandboxStatus` (network status included).
    ///
    /// # Errors
    /// As every call.
    pub async fn pod_sandbox_status(&self, id: &str) -> Result<Option<cri::PodSandboxStatus>> {
        Ok(self.pod_sandbox_status_response(id, false).await?.status)
    }

    /// CRI `PodSandboxStatus` with `verbose`: the status and the runtime's
    /// extra information (containerd's `info` JSON carries the sandbox's `pid`).
    ///
    /// # Errors
    /// As every call.
    pub async fn pod_sandbox_status_verbose(
        &self,
        id: &str,
    ) -> Result<cri::PodSandboxStatusResponse> {
        self.pod_sandbox_status_response(id, true).await
    }

    async fn pod_sandbox_status_response(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<cri::PodSandboxStatusResponse> {
        let mut c = self.runtime.clone();
        let req = cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose,
        };
        self.call("PodSandboxStatus", id, c.pod_sandbox_status(req))
            .await
    }

    /// CRI `ListPodSandbox` filtered by labels (empty: all sandboxes).
    ///
    /// # Errors
    /// As every call.
    pub async fn list_pod_sandboxes(
        &self,
        labels: HashMap<String, String>,
    ) -> Result<Vec<cri::PodSandbox>> {
        let mut c = self.runtime.clone();
        let req = cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: labels,
                ..Default::default()
            }),
        };
        Ok(self
            .call("ListPodSandbox", "node", c.list_pod_sandbox(req))
            .await?
            .items)
    }

    /// CRI `ListContainers` filtered by labels.
    ///
    /// # Errors
    /// As every call.
    pub async fn list_containers(
        &self,
        labels: HashMap<String, String>,
    ) -> Result<Vec<cri::Container>> {
        self.list_containers_where(cri::ContainerFilter {
            label_selector: labels,
            ..Default::default()
        })
        .await
    }

    /// The running containers, selected by the runtime
    /// (`ListContainers` with a state filter).
    ///
    /// # Errors
    /// [`Error`] when the call fails.
    pub async fn list_running_containers(&self) -> Result<Vec<cri::Container>> {
        self.list_containers_where(cri::ContainerFilter {
            state: Some(cri::ContainerStateValue {
                state: cri::ContainerState::ContainerRunning.into(),
            }),
            ..Default::default()
        })
        .await
    }

    async fn list_containers_where(
        &self,
        filter: cri::ContainerFilter,
    ) -> Result<Vec<cri::Container>> {
        let mut c = self.runtime.clone();
        let req = cri::ListContainersRequest {
            filter: Some(filter),
        };
        Ok(self
            .call("ListContainers", "node", c.list_containers(req))
            .await?
            .containers)
    }

    /// CRI `ListContainerStats`: cpu, memory and writable layer usage of every
    /// container the runtime knows.
    ///
    /// # Errors
    /// As every call.
    pub async fn list_container_stats(&self) -> Result<Vec<cri::ContainerStats>> {
        let mut c = self.runtime.clone();
        let req = cri::ListContainerStatsRequest {
            filter: Some(cri::ContainerStatsFilter::default()),
        };
        Ok(self
            .call("ListContainerStats", "node", c.list_container_stats(req))
            .await?
            .stats)
    }

    /// CRI `ContainerStats` of container `id`: its cpu, memory and
    /// writable-layer usage (None when the runtime has none).
    ///
    /// # Errors
    /// As every call.
    pub async fn container_stats(&self, id: &str) -> Result<Option<cri::ContainerStats>> {
        let mut c = self.runtime.clone();
        let req = cri::ContainerStatsRequest {
            container_id: id.into(),
        };
        Ok(self
            .call("ContainerStats", id, c.container_stats(req))
            .await?
            .stats)
    }

    /// CRI `ListPodSandboxStats`: pod-level cpu, memory, network and process
    /// usage of every sandbox.
    ///
    /// # Errors
    /// As every call; runtimes without it answer `Unimplemented`.
    pub async fn list_pod_sandbox_stats(&self) -> Result<Vec<cri::PodSandboxStats>> {
        let mut c = self.runtime.clone();
        let req = cri::ListPodSandboxStatsRequest {
            filter: Some(cri::PodSandboxStatsFilter::default()),
        };
        Ok(self
            .call("ListPodSandboxStats", "node", c.list_pod_sandbox_stats(req))
            .await?
            .stats)
    }

    /// CRI `ContainerStatus` with `verbose`: the status and the runtime's
    /// extra information (containerd's `info` JSON carries the process `pid`).
    ///
    /// # Errors
    /// As every call.
    pub async fn container_status_verbose(&self, id: &str) -> Result<cri::ContainerStatusResponse> {
        self.container_status_response(id, true).await
    }

    async fn container_status_response(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<cri::ContainerStatusResponse> {
        let mut c = self.runtime.clone();
        let req = cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose,
        };
        self.call("ContainerStatus", id, c.container_status(req))
            .await
    }

    /// CRI `ContainerStatus` (exit code, times, reason).
    ///
    /// # Errors
    /// As every call.
    pub async fn container_status(&self, id: &str) -> Result<Option<cri::ContainerStatus>> {
        Ok(self.container_status_response(id, false).await?.status)
    }

    /// CRI `UpdateContainerResources`: the container's cgroup limits become
    /// `linux` (in-place resize).
    ///
    /// # Errors
    /// As every call.
    pub async fn update_container_resources(
        &self,
        id: &str,
        linux: cri::LinuxContainerResources,
    ) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::UpdateContainerResourcesRequest {
            container_id: id.into(),
            linux: Some(linux),
            ..Default::default()
        };
        self.call(
            "UpdateContainerResources",
            id,
            c.update_container_resources(req),
        )
        .await
        .map(drop)
    }

    /// CRI `CreateContainer` in a sandbox; returns the container's ID.
    /// `image_sub_paths` gives the image-volume mounts of `config` that
    /// mount a directory of their image (`Mount.image_sub_path`, sent as
    /// [`extension`] encodes it); the runtime fails the call when the image
    /// has no such directory.
    ///
    /// # Errors
    /// As every call.
    pub async fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox_config: cri::PodSandboxConfig,
        image_sub_paths: &extension::ImageSubPaths,
        target: &str,
    ) -> Result<String> {
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        if image_sub_paths.is_empty() {
            let mut c = self.runtime.clone();
            return Ok(self
                .call("CreateContainer", target, c.create_container(req))
                .await?
                .container_id);
        }
        let wire = extension::encode_create_container(&req, image_sub_paths);
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        let call = async move {
            grpc.ready()
                .await
                .map_err(|e| tonic::Status::unavailable(format!("runtime not ready: {e}")))?;
            let path = tonic::codegen::http::uri::PathAndQuery::from_static(
                "/runtime.v1.RuntimeService/CreateContainer",
            );
            let codec = extension::EncodedCodec::<cri::CreateContainerResponse>::default();
            grpc.unary(tonic::Request::new(wire), path, codec).await
        };
        Ok(self
            .call("CreateContainer", target, call)
            .await?
            .container_id)
    }

    /// CRI `StartContainer`.
    ///
    /// # Errors
    /// As every call.
    pub async fn start_container(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::StartContainerRequest {
            container_id: id.into(),
        };
        self.call("StartContainer", id, c.start_container(req))
            .await
            .map(drop)
    }

    /// CRI `StopContainer`: SIGTERM, then SIGKILL after `grace_seconds`.
    /// The call's own deadline is stretched by the grace period.
    ///
    /// # Errors
    /// As every call.
    pub async fn stop_container(&self, id: &str, grace_seconds: i64) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::StopContainerRequest {
            container_id: id.into(),
            timeout: grace_seconds,
        };
        let grace = Duration::from_secs(u64::try_from(grace_seconds).unwrap_or(0));
        // A grace period up to i64::MAX seconds: the deadline saturates (and
        // `tokio::time::timeout` takes one past the clock's end as none).
        let this = Self {
            timeout: self.timeout.saturating_add(grace),
            ..self.clone()
        };
        this.call("StopContainer", id, c.stop_container(req))
            .await
            .map(drop)
    }

    /// CRI `RemoveContainer`.
    ///
    /// # Errors
    /// As every call.
    pub async fn remove_container(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::RemoveContainerRequest {
            container_id: id.into(),
        };
        self.call("RemoveContainer", id, c.remove_container(req))
            .await
            .map(drop)
    }

    /// CRI `ReopenContainerLog`: the runtime reopens the container's log file
    /// at its path (after the file there was rotated away).
    ///
    /// # Errors
    /// As every call; the runtime refuses for a container that is not running.
    pub async fn reopen_container_log(&self, id: &str) -> Result<()> {
        let mut c = self.runtime.clone();
        let req = cri::ReopenContainerLogRequest {
            container_id: id.into(),
        };
        self.call("ReopenContainerLog", id, c.reopen_container_log(req))
            .await
            .map(drop)
    }

    /// CRI `ExecSync`: runs `cmd` in a running container and waits up to
    /// `timeout` (whole seconds, at least 1); returns (exit code, stdout + stderr).
    ///
    /// # Errors
    /// As every call; a command that outlives `timeout` is [`Error::Timeout`].
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<(i32, Vec<u8>)> {
        let mut c = self.runtime.clone();
        let secs = i64::try_from(timeout.as_secs().max(1)).unwrap_or(i64::MAX);
        let req = cri::ExecSyncRequest {
            container_id: id.into(),
            cmd,
            timeout: secs,
        };
        let this = Self {
            timeout: timeout.saturating_add(Duration::from_secs(2)),
            ..self.clone()
        };
        let resp = this.call("ExecSync", id, c.exec_sync(req)).await?;
        let mut out = resp.stdout;
        out.extend(resp.stderr);
        Ok((resp.exit_code, out))
    }

    /// CRI `Exec`: a URL on the runtime's streaming server that runs `cmd` in
    /// container `id` once a client upgrades a connection to it (the kubelet's
    /// `GetExec`).
    ///
    /// # Errors
    /// As every call.
    pub async fn exec_url(&self, id: &str, cmd: Vec<String>, io: StreamIo) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = cri::ExecRequest {
            container_id: id.into(),
            cmd,
            tty: io.tty,
            stdin: io.stdin,
            stdout: io.stdout,
            stderr: io.stderr,
        };
        Ok(self.call("Exec", id, c.exec(req)).await?.url)
    }

    /// CRI `Attach`: a URL on the runtime's streaming server that attaches to the
    /// main process of container `id` (the kubelet's `GetAttach`).
    ///
    /// # Errors
    /// As every call.
    pub async fn attach_url(&self, id: &str, io: StreamIo) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = cri::AttachRequest {
            container_id: id.into(),
            stdin: io.stdin,
            tty: io.tty,
            stdout: io.stdout,
            stderr: io.stderr,
        };
        Ok(self.call("Attach", id, c.attach(req)).await?.url)
    }

    /// CRI `PortForward`: a URL on the runtime's streaming server that forwards
    /// to `ports` (empty: the ports the client names per stream) in the network
    /// namespace of sandbox `id` (the kubelet's `GetPortForward`).
    ///
    /// # Errors
    /// As every call.
    pub async fn port_forward_url(&self, id: &str, ports: Vec<i32>) -> Result<String> {
        let mut c = self.runtime.clone();
        let req = cri::PortForwardRequest {
            pod_sandbox_id: id.into(),
            port: ports,
        };
        Ok(self.call("PortForward", id, c.port_forward(req)).await?.url)
    }

    /// CRI `ImageStatus`: the image's ID (`sha256:...`) if present on the node.
    ///
    /// # Errors
    /// As every call.
    pub async fn image_id(&self, image: &str) -> Result<Option<cri::Image>> {
        let mut c = self.images.clone();
        let req = cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            verbose: false,
        };
        Ok(self
            .call("ImageStatus", image, c.image_status(req))
            .await?
            .image)
    }

    /// CRI `ImageFsInfo`: usage of the filesystems that hold images and
    /// containers' writable layers.
    ///
    /// # Errors
    /// As every call.
    pub async fn image_fs_info(&self) -> Result<cri::ImageFsInfoResponse> {
        let mut c = self.images.clone();
        self.call(
            "ImageFsInfo",
            "node",
            c.image_fs_info(cri::ImageFsInfoRequest {}),
        )
        .await
    }

    /// CRI `RemoveImage` of the image `id`.
    ///
    /// # Errors
    /// As every call.
    pub async fn remove_image(&self, id: &str) -> Result<()> {
        let mut c = self.images.clone();
        let req = cri::RemoveImageRequest {
            image: Some(cri::ImageSpec {
                image: id.into(),
                ..Default::default()
            }),
        };
        self.call("RemoveImage", id, c.remove_image(req)).await?;
        Ok(())
    }

    /// CRI `ListImages`: every image on the node.
    ///
    /// # Errors
    /// As every call.
    pub async fn list_images(&self) -> Result<Vec<cri::Image>> {
        let mut c = self.images.clone();
        let req = cri::ListImagesRequest { filter: None };
        Ok(self
            .call("ListImages", "node", c.list_images(req))
            .await?
            .images)
    }

    /// CRI `PullImage` with registry credentials `auth` (anonymous when
    /// `None`); returns the image reference the runtime resolved.
    ///
    /// # Errors
    /// As every call.
    pub async fn pull_image(
        &self,
        image: &str,
        sandbox_config: cri::PodSandboxConfig,
        auth: Option<cri::AuthConfig>,
    ) -> Result<String> {
        let mut c = self.images.clone();
        let req = cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            auth,
            sandbox_config: Some(sandbox_config),
        };
        Ok(self
            .call("PullImage", image, c.pull_image(req))
            .await?
            .image_ref)
    }
}
