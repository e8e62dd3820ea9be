//! `csi-hostpath`: a CSI driver whose volumes are directories of the host,
//! for tests and demonstrations (the role upstream's csi-driver-host-path
//! plays in Kubernetes' own tests). Not for production: a volume's size is
//! not enforced and its data lives on the node.
//!
//! It serves the CSI Identity, Controller and Node services on one unix
//! socket, so the upstream external-provisioner and external-attacher and
//! the node agent all talk to it:
//! - `CreateVolume` makes `<state-dir>/volumes/<name>` (the request's name,
//!   `pvc-<claim uid>` from the provisioner), reachable only from this node
//!   (topology key [`TOPOLOGY_KEY`]); `DeleteVolume` removes it. A raw block
//!   volume (a block capability) also has a sparse file of the size asked
//!   for, `<state-dir>/images/<name>.img`, out of reach of what a pod writes
//!   in a filesystem volume; it is not deleted while a loop device holds it.
//! - `ControllerPublishVolume` attaches a volume that exists to this node.
//! - `NodeStageVolume` bind-mounts the volume at the staging path (the global
//!   mount), `NodePublishVolume` bind-mounts the staged volume (read-only
//!   when asked) at the pod's target path; both are idempotent and checked
//!   against `/proc/self/mountinfo`, and their undoing unmounts. A block
//!   volume is not staged; it is published by attaching its file to a loop
//!   device (`losetup`) and binding that device on the target file, and
//!   unpublished by unbinding and detaching it.
//! - `NodeGetVolumeStats` reports the bytes and inodes under the volume and
//!   its filesystem's totals.
//! - An inline ephemeral volume (a publish whose volume context says
//!   `csi.storage.k8s.io/ephemeral: "true"`, which the agent sends when the
//!   CSIDriver has `podInfoOnMount`) is made on publish and removed on
//!   unpublish.
//!
//! With `--registration-dir` it also registers itself with the node agent
//! as upstream node-driver-registrar does: it serves the plugin
//! registration API on `<dir>/<driver>-reg.sock`.
#![forbid(unsafe_code)]
#![cfg_attr(
    test,
    allow(
        clippy::too_many_lines,
        reason = "a test is one scenario, read top to bottom; the limit holds for the agent's own functions, which the non-test build checks"
    )
)]

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use rustix::mount::{MountFlags, UnmountFlags};
use tonic::{Request, Response, Status};

use rustlet::proto::csi::controller_server::{Controller, ControllerServer};
use rustlet::proto::csi::identity_server::{Identity, IdentityServer};
use rustlet::proto::csi::node_server::{Node, NodeServer};
use rustlet::proto::csi::*;
use rustlet::proto::pluginregistration::registration_server::{Registration, RegistrationServer};
use rustlet::proto::pluginregistration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};

/// The driver's default name.
const DRIVER: &str = "hostpath.csi.rustlet.io";
/// The topology key whose value is the node a volume lives on.
const TOPOLOGY_KEY: &str = "topology.hostpath.csi.rustlet.io/node";
/// The longest volume name accepted (bytes).
const MAX_NAME: usize = 128;
/// The volume context key that marks an inline ephemeral volume.
const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";
/// The suffix of a raw block volume's file in the images directory.
const IMAGE_SUFFIX: &str = ".img";
/// The size of a block volume made with no size asked for (bytes).
const DEFAULT_BLOCK_BYTES: u64 = 64 << 20;
/// The loop devices' major number.
const LOOP_MAJOR: u32 = 7;

/// The command line.
#[derive(Parser, Debug)]
#[command(
    name = "csi-hostpath",
    about = "A CSI driver whose volumes are directories of the host (for tests)"
)]
struct Args {
    /// Unix socket to serve the Identity, Controller and Node services on.
    #[arg(long)]
    endpoint: PathBuf,
    /// This node's name, as NodeGetInfo reports it.
    #[arg(long)]
    node_id: String,
    /// Directory the volumes live in (`<state-dir>/volumes/<volume id>`).
    #[arg(long, default_value = "/var/lib/csi-hostpath")]
    state_dir: PathBuf,
    /// The driver's name.
    #[arg(long, default_value = DRIVER)]
    driver_name: String,
    /// The node agent's plugin registration directory
    /// (`<root-dir>/plugins_registry`): register there as
    /// node-driver-registrar does.
    #[arg(long)]
    registration_dir: Option<PathBuf>,
    /// Seconds each NodeStageVolume, NodePublishVolume, NodeUnpublishVolume
    /// and NodeUnstageVolume waits before it mounts or unmounts (after
    /// logging that it began): room for tests to kill the node agent
    /// meanwhile.
    #[arg(long, default_value_t = 0)]
    node_call_delay: u64,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("csi-hostpath: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("csi-hostpath: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Serves until SIGTERM or SIGINT, or until the agent refuses the
/// registration.
async fn run(args: Args) -> Result<(), String> {
    if args.node_id.is_empty() {
        return Err("--node-id must not be empty".into());
    }
    let mut driver = Driver::new(&args.driver_name, &args.node_id, &args.state_dir)
        .map_err(|e| format!("state directory {}: {e}", args.state_dir.display()))?;
    driver.delay = std::time::Duration::from_secs(args.node_call_delay);
    let csi = serve_csi(driver, &args.endpoint)
        .map_err(|e| format!("endpoint {}: {e}", args.endpoint.display()))?;
    let (refused_tx, mut refused) = tokio::sync::mpsc::channel::<String>(1);
    let registration = match &args.registration_dir {
        Some(dir) => {
            let socket = dir.join(format!("{}-reg.sock", args.driver_name));
            let registrar = Registrar {
                name: args.driver_name.clone(),
                endpoint: args.endpoint.display().to_string(),
                refused: refused_tx,
            };
            Some((
                serve_registration(registrar, &socket)
                    .map_err(|e| format!("registration socket {}: {e}", socket.display()))?,
                socket,
            ))
        }
        None => None,
    };
    tracing::info!(driver = %args.driver_name, node = %args.node_id, endpoint = %args.endpoint.display(), "serving");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("SIGTERM handler: {e}"))?;
    let outcome = tokio::select! {
        _ = term.recv() => Ok(()),
        _ = tokio::signal::ctrl_c() => Ok(()),
        Some(why) = refused.recv() => Err(format!("the node agent refused the registration: {why}")),
    };
    csi.abort();
    let _ = std::fs::remove_file(&args.endpoint);
    if let Some((task, socket)) = registration {
        task.abort();
        let _ = std::fs::remove_file(socket);
    }
    outcome
}

/// Serves the driver's three services on `socket` (replacing a stale one).
fn serve_csi(
    driver: Driver,
    socket: &Path,
) -> Result<tokio::task::JoinHandle<()>, rustlet::grpc_socket::Error> {
    let driver = Arc::new(driver);
    let router = tonic::transport::Server::builder()
        .add_service(IdentityServer::from_arc(driver.clone()))
        .add_service(ControllerServer::from_arc(driver.clone()))
        .add_service(NodeServer::from_arc(driver));
    rustlet::grpc_socket::serve(socket, 0o755, router, "CSI")
}

/// Serves the registration API on `socket` (replacing a stale one).
fn serve_registration(
    r: Registrar,
    socket: &Path,
) -> Result<tokio::task::JoinHandle<()>, rustlet::grpc_socket::Error> {
    let router = tonic::transport::Server::builder().add_service(RegistrationServer::new(r));
    rustlet::grpc_socket::serve(socket, 0o755, router, "registration")
}

/// The registration API, as node-driver-registrar serves it: the driver's
/// name and endpoint, and the agent's answer.
struct Registrar {
    name: String,
    endpoint: String,
    refused: tokio::sync::mpsc::Sender<String>,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: "CSIPlugin".into(),
            name: self.name.clone(),
            endpoint: self.endpoint.clone(),
            supported_versions: vec!["1.0.0".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = req.into_inner();
        if status.plugin_registered {
            tracing::info!("registered with the node agent");
        } else {
            let _ = self.refused.try_send(status.error);
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// The driver: its name, node and volume directory. Node calls are
/// serialized (`lock`) so that a check of the mount table and the mount it
/// decides on are not interleaved with another call's.
struct Driver {
    name: String,
    node: String,
    volumes: PathBuf,
    /// A file per inline ephemeral volume (named as it), removed with it.
    ephemeral: PathBuf,
    /// A file per raw block volume (`<name>.img`), its bytes.
    images: PathBuf,
    lock: Arc<tokio::sync::Mutex<()>>,
    /// The wait of each node call that mounts or unmounts (`--node-call-delay`).
    delay: std::time::Duration,
}

impl Driver {
    /// A driver keeping its volumes under `<state_dir>/volumes` (made).
    fn new(name: &str, node: &str, state_dir: &Path) -> io::Result<Self> {
        let volumes = state_dir.join("volumes");
        let ephemeral = state_dir.join("ephemeral");
        let images = state_dir.join("images");
        std::fs::create_dir_all(&volumes)?;
        std::fs::create_dir_all(&ephemeral)?;
        std::fs::create_dir_all(&images)?;
        Ok(Self {
            name: name.into(),
            node: node.into(),
            volumes,
            ephemeral,
            images,
            lock: Arc::new(tokio::sync::Mutex::new(())),
            delay: std::time::Duration::ZERO,
        })
    }

    /// Runs node call `call` of `volume`: under the lock, logs that it
    /// began, waits the configured delay, then does `work` (mounts). It runs
    /// as a task of its own, so that a caller that goes away (a node agent
    /// killed) does not stop it halfway, as a driver's mount goes on
    /// without its caller.
    async fn run(
        &self,
        call: &'static str,
        volume: String,
        work: impl FnOnce(&str) -> Result<(), Status> + Send + 'static,
    ) -> Result<(), Status> {
        let (lock, delay) = (self.lock.clone(), self.delay);
        tokio::spawn(async move {
            let _guard = lock.lock().await;
            tracing::info!(volume, "{call} begins");
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            work(&volume)
        })
        .await
        .map_err(|e| Status::internal(format!("{call}: {e}")))?
    }

    /// The directory of volume `id`, which must be a plain name.
    fn volume(&self, id: &str) -> Result<PathBuf, Status> {
        valid_name(id).map_err(Status::invalid_argument)?;
        Ok(self.volumes.join(id))
    }

    /// The file of raw block volume `id` (a plain name, checked by the caller).
    fn image(&self, id: &str) -> PathBuf {
        self.images.join(format!("{id}{IMAGE_SUFFIX}"))
    }

    /// Whether volume `id` is a raw block one, when `capability` asks for
    /// what it is; `InvalidArgument` when it asks for the other type.
    fn block_as_asked(&self, id: &str, capability: &VolumeCapability) -> Result<bool, Status> {
        let block = self.image(id).exists();
        if is_block([capability]) == block {
            Ok(block)
        } else {
            Err(Status::invalid_argument(format!(
                "volume {id} is not of the access type asked for"
            )))
        }
    }

    /// The directory of volume `id`, which must exist.
    fn existing(&self, id: &str) -> Result<PathBuf, Status> {
        let dir = self.volume(id)?;
        if dir.is_dir() {
            Ok(dir)
        } else {
            Err(Status::not_found(format!("volume {id} does not exist")))
        }
    }

    fn topology(&self) -> Topology {
        Topology {
            segments: HashMap::from([(TOPOLOGY_KEY.to_string(), self.node.clone())]),
        }
    }
}

/// Whether `name` can name a volume directory: 1 to [`MAX_NAME`] bytes of
/// ASCII letters, digits, `-`, `_` and `.`, not `.` or `..`.
fn valid_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "volume name {name:?} is not 1 to {MAX_NAME} letters, digits, '-', '_' or '.'"
        ))
    }
}

/// An absolute path from a request field, else `InvalidArgument`.
fn absolute(field: &str, path: &str) -> Result<PathBuf, Status> {
    let p = PathBuf::from(path);
    if p.is_absolute() {
        Ok(p)
    } else {
        Err(Status::invalid_argument(format!(
            "{field} must be an absolute path, not {path:?}"
        )))
    }
}

/// Whether `path` is a mount point in this mount namespace.
fn mounted(path: &Path) -> Result<bool, Status> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Status::internal(format!("read mountinfo: {e}")))?;
    Ok(rustlet::volume::mount::mounts_under(&text, path)
        .iter()
        .any(|p| p == path))
}

/// Bind-mounts `source` on `target` (made), read-only when asked; nothing
/// when `target` is already a mount point.
fn bind_mount(source: &Path, target: &Path, read_only: bool) -> Result<(), Status> {
    if mounted(target)? {
        return Ok(());
    }
    std::fs::create_dir_all(target)
        .map_err(|e| Status::internal(format!("make {}: {e}", target.display())))?;
    bind(source, target, read_only)
}

/// Binds `source` on the existing `target`, read-only when asked.
fn bind(source: &Path, target: &Path, read_only: bool) -> Result<(), Status> {
    rustix::mount::mount_bind(source, target).map_err(|e| {
        Status::internal(format!(
            "bind {} on {}: {e}",
            source.display(),
            target.display()
        ))
    })?;
    if read_only {
        let remount =
            rustix::mount::mount_remount(target, MountFlags::BIND | MountFlags::RDONLY, "");
        if let Err(e) = remount {
            let _ = rustix::mount::unmount(target, UnmountFlags::empty());
            return Err(Status::internal(format!(
                "make {} read-only: {e}",
                target.display()
            )));
        }
    }
    Ok(())
}

/// Unmounts `target` when it is a mount point.
fn unmount(target: &Path) -> Result<(), Status> {
    if mounted(target)? {
        rustix::mount::unmount(target, UnmountFlags::empty())
            .map_err(|e| Status::internal(format!("unmount {}: {e}", target.display())))?;
    }
    Ok(())
}

/// Whether `caps` ask for a raw block volume.
fn is_block<'a>(caps: impl IntoIterator<Item = &'a VolumeCapability>) -> bool {
    caps.into_iter()
        .any(|c| matches!(c.access_type, Some(volume_capability::AccessType::Block(_))))
}

/// Runs `losetup` with `args`; its standard output.
fn losetup(args: &[&std::ffi::OsStr]) -> Result<String, Status> {
    let out = std::process::Command::new("losetup")
        .args(args)
        .output()
        .map_err(|e| Status::internal(format!("run losetup: {e}")))?;
    if !out.status.success() {
        return Err(Status::internal(format!(
            "losetup {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The loop device bound on `target`, from the device number it shows and
/// the kernel's name for it (`/sys/dev/block/<major>:<minor>`: a loop
/// device's minor is not its index when it has partitions); `None` when it
/// shows none (a directory, a file not yet bound).
fn loop_bound_on(target: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
    let m = std::fs::metadata(target).ok()?;
    let (major, minor) = (rustix::fs::major(m.rdev()), rustix::fs::minor(m.rdev()));
    if !m.file_type().is_block_device() || major != LOOP_MAJOR {
        return None;
    }
    let link = std::fs::read_link(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let name = link.file_name()?.to_str()?;
    name.starts_with("loop")
        .then(|| Path::new("/dev").join(name))
}

/// Publishes block volume file `image` at the file `target` (made when
/// missing): attached to a free loop device (read-only when asked), which
/// is bound on `target`; nothing when `target` is bound already.
fn publish_block(image: &Path, target: &Path, read_only: bool) -> Result<(), Status> {
    if mounted(target)? {
        return Ok(());
    }
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(target)
        .map_err(|e| Status::internal(format!("make {}: {e}", target.display())))?;
    // Read-only at the device: a read-only mount does not stop writes to a
    // device node.
    let mut args: Vec<&std::ffi::OsStr> = vec!["--find".as_ref(), "--show".as_ref()];
    if read_only {
        args.push("--read-only".as_ref());
    }
    args.push(image.as_os_str());
    let device = PathBuf::from(losetup(&args)?);
    if let Err(e) = bind(&device, target, read_only) {
        let _ = losetup(&["--detach".as_ref(), device.as_os_str()]);
        return Err(e);
    }
    Ok(())
}

/// Bytes (512-byte blocks allocated) and inodes used under `dir`, without
/// following symbolic links or crossing into other filesystems.
fn usage(dir: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let root = std::fs::symlink_metadata(dir)?;
    let (mut bytes, mut inodes) = (root.blocks().saturating_mul(512), 1u64);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let m = entry.metadata()?;
            if m.dev() != root.dev() {
                continue;
            }
            bytes = bytes.saturating_add(m.blocks().saturating_mul(512));
            inodes = inodes.saturating_add(1);
            if m.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Ok((bytes, inodes))
}

/// A `u64` as the `int64` the wire carries (saturating).
fn wire(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[tonic::async_trait]
impl Identity for Driver {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").into(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let service = |t: plugin_capability::service::Type| PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service { r#type: t.into() },
            )),
        };
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: vec![
                service(plugin_capability::service::Type::ControllerService),
                service(plugin_capability::service::Type::VolumeAccessibilityConstraints),
            ],
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        Ok(Response::new(ProbeResponse {
            ready: Some(Ready { value: true }),
        }))
    }
}

#[tonic::async_trait]
impl Controller for Driver {
    async fn create_volume(
        &self,
        req: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let req = req.into_inner();
        let dir = self.volume(&req.name)?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument("volume_capabilities is empty"));
        }
        let block = is_block(&req.volume_capabilities);
        if block && req.volume_capabilities.iter().any(|c| !is_block([c])) {
            return Err(Status::invalid_argument(
                "a volume is either raw block or mounted, not both",
            ));
        }
        // Reachable only from this node: a requisite topology must allow it.
        if let Some(req_topology) = &req.accessibility_requirements
            && !req_topology.requisite.is_empty()
            && !req_topology
                .requisite
                .iter()
                .any(|t| t.segments.get(TOPOLOGY_KEY) == Some(&self.node))
        {
            return Err(Status::resource_exhausted(format!(
                "node {} is not in the requisite topology",
                self.node
            )));
        }
        // The size asked for (none is enforced on a directory): the
        // required bytes, else the limit.
        let mut capacity = req.capacity_range.map_or(0, |r| {
            if r.required_bytes > 0 {
                r.required_bytes
            } else {
                r.limit_bytes.max(0)
            }
        });
        let image = self.image(&req.name);
        if dir.is_dir() && image.exists() != block {
            return Err(Status::already_exists(format!(
                "volume {} exists with another access type",
                req.name
            )));
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| Status::internal(format!("make {}: {e}", dir.display())))?;
        if block {
            // Sparse: the size is reserved, not written.
            let bytes = u64::try_from(capacity)
                .ok()
                .filter(|b| *b > 0)
                .unwrap_or(DEFAULT_BLOCK_BYTES);
            capacity = wire(bytes);
            match std::fs::metadata(&image) {
                // Made before: the same request again, or another size.
                Ok(m) if m.len() == bytes => {}
                Ok(m) => {
                    return Err(Status::already_exists(format!(
                        "volume {} exists with {} bytes",
                        req.name,
                        m.len()
                    )));
                }
                Err(_) => std::fs::File::create_new(&image)
                    .and_then(|f| f.set_len(bytes))
                    .map_err(|e| Status::internal(format!("make {}: {e}", image.display())))?,
            }
        }
        tracing::info!(volume = %req.name, bytes = capacity, block, "volume made");
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(Volume {
                capacity_bytes: capacity,
                volume_id: req.name,
                volume_context: HashMap::new(),
                accessible_topology: vec![self.topology()],
            }),
        }))
    }

    async fn delete_volume(
        &self,
        req: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        let dir = self.volume(&req.get_ref().volume_id)?;
        let _guard = self.lock.lock().await;
        let text = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| Status::internal(format!("read mountinfo: {e}")))?;
        if !rustlet::volume::mount::mounts_under(&text, &dir).is_empty() {
            return Err(Status::failed_precondition(
                "the volume is mounted under itself",
            ));
        }
        let image = self.image(&req.get_ref().volume_id);
        if image.exists() {
            let held = losetup(&[
                "--list".as_ref(),
                "--noheadings".as_ref(),
                "--output".as_ref(),
                "NAME".as_ref(),
                "--associated".as_ref(),
                image.as_os_str(),
            ])?;
            if !held.is_empty() {
                return Err(Status::failed_precondition(format!(
                    "the volume is published: {}",
                    held.split_whitespace().collect::<Vec<_>>().join(", ")
                )));
            }
            match std::fs::remove_file(&image) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(Status::internal(format!("remove {}: {e}", image.display())));
                }
                _ => {}
            }
        }
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(Status::internal(format!("remove {}: {e}", dir.display())))
            }
            _ => {
                tracing::info!(volume = %req.get_ref().volume_id, "volume deleted");
                Ok(Response::new(DeleteVolumeResponse {}))
            }
        }
    }

    async fn controller_publish_volume(
        &self,
        req: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        let req = req.into_inner();
        self.existing(&req.volume_id)?;
        if req.node_id != self.node {
            return Err(Status::not_found(format!(
                "node {} is not this driver's",
                req.node_id
            )));
        }
        tracing::info!(volume = %req.volume_id, node = %req.node_id, "volume attached");
        Ok(Response::new(ControllerPublishVolumeResponse {
            publish_context: HashMap::from([("attachedTo".to_string(), self.node.clone())]),
        }))
    }

    async fn controller_unpublish_volume(
        &self,
        req: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        self.volume(&req.get_ref().volume_id)?;
        tracing::info!(volume = %req.get_ref().volume_id, "volume detached");
        Ok(Response::new(ControllerUnpublishVolumeResponse {}))
    }

    async fn validate_volume_capabilities(
        &self,
        req: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        let req = req.into_inner();
        self.existing(&req.volume_id)?;
        let block = self.image(&req.volume_id).exists();
        let fits = req
            .volume_capabilities
            .iter()
            .all(|c| is_block([c]) == block);
        Ok(Response::new(if !fits {
            ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message: format!(
                    "volume {} is {}",
                    req.volume_id,
                    if block { "raw block" } else { "a filesystem" }
                ),
            }
        } else {
            ValidateVolumeCapabilitiesResponse {
                confirmed: Some(validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                }),
                message: String::new(),
            }
        }))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let rpc = |t: controller_service_capability::rpc::Type| ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(
                controller_service_capability::Rpc { r#type: t.into() },
            )),
        };
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: vec![
                rpc(controller_service_capability::rpc::Type::CreateDeleteVolume),
                rpc(controller_service_capability::rpc::Type::PublishUnpublishVolume),
            ],
        }))
    }
}

#[tonic::async_trait]
impl Node for Driver {
    async fn node_stage_volume(
        &self,
        req: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let req = req.into_inner();
        let dir = self.existing(&req.volume_id)?;
        let staging = absolute("staging_target_path", &req.staging_target_path)?;
        let Some(capability) = &req.volume_capability else {
            return Err(Status::invalid_argument("volume_capability is missing"));
        };
        if self.block_as_asked(&req.volume_id, capability)? {
            // Nothing to stage: publishing attaches the file.
            return Ok(Response::new(NodeStageVolumeResponse {}));
        }
        self.run("NodeStageVolume", req.volume_id, move |volume| {
            bind_mount(&dir, &staging, false)?;
            tracing::info!(volume, path = %staging.display(), "volume staged");
            Ok(())
        })
        .await?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        req: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let req = req.into_inner();
        self.volume(&req.volume_id)?;
        let staging = absolute("staging_target_path", &req.staging_target_path)?;
        self.run("NodeUnstageVolume", req.volume_id, move |volume| {
            unmount(&staging)?;
            tracing::info!(volume, path = %staging.display(), "volume unstaged");
            Ok(())
        })
        .await?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        req: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let ephemeral = req.volume_context.get(EPHEMERAL_KEY).map(String::as_str) == Some("true");
        let dir = if ephemeral {
            // Made here, and known as ephemeral until unpublished.
            let dir = self.volume(&req.volume_id)?;
            let marker = self.ephemeral.join(&req.volume_id);
            std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::write(&marker, b""))
                .map_err(|e| Status::internal(format!("make {}: {e}", dir.display())))?;
            dir
        } else {
            self.existing(&req.volume_id)?
        };
        let target = absolute("target_path", &req.target_path)?;
        let Some(capability) = &req.volume_capability else {
            return Err(Status::invalid_argument("volume_capability is missing"));
        };
        let image = self.image(&req.volume_id);
        if self.block_as_asked(&req.volume_id, capability)? {
            let read_only = req.readonly;
            self.run("NodePublishVolume", req.volume_id, move |volume| {
                publish_block(&image, &target, read_only)?;
                tracing::info!(volume, path = %target.display(), read_only, "block volume published");
                Ok(())
            })
            .await?;
            return Ok(Response::new(NodePublishVolumeResponse {}));
        }
        let staging = if req.staging_target_path.is_empty() || ephemeral {
            None
        } else {
            Some(absolute("staging_target_path", &req.staging_target_path)?)
        };
        let read_only = req.readonly;
        self.run("NodePublishVolume", req.volume_id, move |volume| {
            let source = match staging {
                None => dir,
                Some(staging) if mounted(&staging)? => staging,
                Some(staging) => {
                    return Err(Status::failed_precondition(format!(
                        "volume {volume} is not staged at {}",
                        staging.display()
                    )));
                }
            };
            bind_mount(&source, &target, read_only)?;
            tracing::info!(volume, path = %target.display(), read_only, "volume published");
            Ok(())
        })
        .await?;
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        req: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let req = req.into_inner();
        let dir = self.volume(&req.volume_id)?;
        let marker = self.ephemeral.join(&req.volume_id);
        let target = absolute("target_path", &req.target_path)?;
        self.run("NodeUnpublishVolume", req.volume_id, move |volume| {
            // A block volume's loop device is detached before its bind goes,
            // so that a failure leaves the bind to find it by again.
            if mounted(&target)?
                && let Some(device) = loop_bound_on(&target)
            {
                losetup(&["--detach".as_ref(), device.as_os_str()])?;
            }
            unmount(&target)?;
            let removed = match std::fs::symlink_metadata(&target) {
                Ok(m) if m.is_dir() => std::fs::remove_dir(&target),
                Ok(_) => std::fs::remove_file(&target),
                Err(e) => Err(e),
            };
            match removed {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(Status::internal(format!(
                        "remove {}: {e}",
                        target.display()
                    )));
                }
                _ => {}
            }
            // An inline ephemeral volume goes with its only pod.
            if marker.exists() {
                std::fs::remove_dir_all(&dir)
                    .and_then(|()| std::fs::remove_file(&marker))
                    .map_err(|e| Status::internal(format!("remove {}: {e}", dir.display())))?;
                tracing::info!(volume, "ephemeral volume removed");
            }
            tracing::info!(volume, path = %target.display(), "volume unpublished");
            Ok(())
        })
        .await?;
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        req: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let req = req.into_inner();
        let dir = self.existing(&req.volume_id)?;
        let path = absolute("volume_path", &req.volume_path)?;
        if !mounted(&path)? {
            return Err(Status::not_found(format!(
                "volume {} is not published at {}",
                req.volume_id,
                path.display()
            )));
        }
        // A block volume: its size only, as CSI asks of one.
        if let Ok(m) = std::fs::metadata(self.image(&req.volume_id)) {
            return Ok(Response::new(NodeGetVolumeStatsResponse {
                usage: vec![VolumeUsage {
                    total: wire(m.len()),
                    unit: volume_usage::Unit::Bytes.into(),
                    ..VolumeUsage::default()
                }],
            }));
        }
        let (fs, (bytes, inodes)) = tokio::task::spawn_blocking(move || {
            let fs = rustix::fs::statvfs(&dir).map_err(io::Error::from)?;
            Ok::<_, io::Error>((fs, usage(&dir)?))
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| Status::internal(format!("usage of volume {}: {e}", req.volume_id)))?;
        Ok(Response::new(NodeGetVolumeStatsResponse {
            usage: vec![
                VolumeUsage {
                    available: wire(fs.f_bavail.saturating_mul(fs.f_frsize)),
                    total: wire(fs.f_blocks.saturating_mul(fs.f_frsize)),
                    used: wire(bytes),
                    unit: volume_usage::Unit::Bytes.into(),
                },
                VolumeUsage {
                    available: wire(fs.f_ffree),
                    total: wire(fs.f_files),
                    used: wire(inodes),
                    unit: volume_usage::Unit::Inodes.into(),
                },
            ],
        }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let rpc = |t: node_service_capability::rpc::Type| NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(
                node_service_capability::Rpc { r#type: t.into() },
            )),
        };
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![
                rpc(node_service_capability::rpc::Type::StageUnstageVolume),
                rpc(node_service_capability::rpc::Type::GetVolumeStats),
            ],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: self.node.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(self.topology()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustlet::proto::csi::controller_client::ControllerClient;
    use rustlet::proto::csi::identity_client::IdentityClient;
    use rustlet::proto::csi::node_client::NodeClient;
    use rustlet::proto::pluginregistration::registration_client::RegistrationClient;

    fn mount_capability() -> VolumeCapability {
        VolumeCapability {
            access_type: Some(volume_capability::AccessType::Mount(
                volume_capability::MountVolume::default(),
            )),
            access_mode: Some(volume_capability::AccessMode {
                mode: volume_capability::access_mode::Mode::SingleNodeWriter.into(),
            }),
        }
    }

    fn is_mounted(p: &Path) -> bool {
        mounted(p).unwrap()
    }

    /// A driver of node `node-a` keeping its state under a new temporary
    /// directory, served on a socket there: the directory (kept while it
    /// lives) and a channel to the driver.
    async fn served() -> (tempfile::TempDir, tonic::transport::Channel) {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        let driver = Driver::new(DRIVER, "node-a", &dir.path().join("state")).unwrap();
        serve_csi(driver, &socket).unwrap();
        let channel = rustlet::cri::unix_channel(socket).await.unwrap();
        (dir, channel)
    }

    /// The whole life of a volume over the real socket, with real bind
    /// mounts: made, attached, staged, published (twice, idempotently),
    /// written through the pod's path, measured, unpublished, unstaged,
    /// deleted.
    #[tokio::test]
    async fn a_volume_is_made_mounted_measured_and_removed() {
        let (dir, channel) = served().await;
        let (mut identity, mut controller, mut node) = (
            IdentityClient::new(channel.clone()),
            ControllerClient::new(channel.clone()),
            NodeClient::new(channel),
        );

        let info = identity
            .get_plugin_info(GetPluginInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.name, DRIVER);
        let ready = identity.probe(ProbeRequest {}).await.unwrap().into_inner();
        assert_eq!(ready.ready, Some(Ready { value: true }));

        let create = CreateVolumeRequest {
            name: "pvc-1".into(),
            capacity_range: Some(CapacityRange {
                required_bytes: 1 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![mount_capability()],
            ..CreateVolumeRequest::default()
        };
        let made = controller
            .create_volume(create.clone())
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap();
        assert_eq!(made.volume_id, "pvc-1");
        assert_eq!(made.capacity_bytes, 1 << 20);
        assert_eq!(
            made.accessible_topology[0].segments.get(TOPOLOGY_KEY),
            Some(&"node-a".to_string())
        );
        // Made again: the same volume.
        let again = controller.create_volume(create).await.unwrap().into_inner();
        assert_eq!(again.volume.unwrap().volume_id, "pvc-1");

        let attached = controller
            .controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: "pvc-1".into(),
                node_id: "node-a".into(),
                volume_capability: Some(mount_capability()),
                ..ControllerPublishVolumeRequest::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            attached.publish_context.get("attachedTo").unwrap(),
            "node-a"
        );
        let elsewhere = controller
            .controller_publish_volume(ControllerPublishVolumeRequest {
                volume_id: "pvc-1".into(),
                node_id: "node-b".into(),
                ..ControllerPublishVolumeRequest::default()
            })
            .await
            .unwrap_err();
        assert_eq!(elsewhere.code(), tonic::Code::NotFound);

        let staging = dir.path().join("globalmount");
        let target = dir.path().join("pod").join("mount");
        let stage = NodeStageVolumeRequest {
            volume_id: "pvc-1".into(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(mount_capability()),
            ..NodeStageVolumeRequest::default()
        };
        node.node_stage_volume(stage.clone()).await.unwrap();
        node.node_stage_volume(stage).await.unwrap();
        assert!(is_mounted(&staging));
        let publish = NodePublishVolumeRequest {
            volume_id: "pvc-1".into(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(mount_capability()),
            ..NodePublishVolumeRequest::default()
        };
        node.node_publish_volume(publish.clone()).await.unwrap();
        node.node_publish_volume(publish).await.unwrap();
        assert!(is_mounted(&target));
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let at_target = rustlet::volume::mount::mounts_under(&text, &target);
        assert_eq!(at_target.len(), 1, "published once: {at_target:?}");

        // What the pod writes is in the volume.
        std::fs::write(target.join("file"), vec![7u8; 64 * 1024]).unwrap();
        let kept = dir.path().join("state/volumes/pvc-1/file");
        assert_eq!(std::fs::metadata(&kept).unwrap().len(), 64 * 1024);

        let stats = node
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: "pvc-1".into(),
                volume_path: target.display().to_string(),
                staging_target_path: staging.display().to_string(),
            })
            .await
            .unwrap()
            .into_inner();
        let bytes = stats
            .usage
            .iter()
            .find(|u| u.unit == volume_usage::Unit::Bytes as i32)
            .unwrap();
        assert!(bytes.used >= 64 * 1024, "{bytes:?}");
        assert!(bytes.total > 0 && bytes.available > 0, "{bytes:?}");
        let inodes = stats
            .usage
            .iter()
            .find(|u| u.unit == volume_usage::Unit::Inodes as i32)
            .unwrap();
        assert_eq!(inodes.used, 2, "the volume's directory and its file");

        // Unpublished: gone from the pod's path, and no longer measured.
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: "pvc-1".into(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        assert!(!target.exists());
        let not_published = node
            .node_get_volume_stats(NodeGetVolumeStatsRequest {
                volume_id: "pvc-1".into(),
                volume_path: target.display().to_string(),
                staging_target_path: String::new(),
            })
            .await
            .unwrap_err();
        assert_eq!(not_published.code(), tonic::Code::NotFound);
        node.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: "pvc-1".into(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .unwrap();
        assert!(!is_mounted(&staging));
        assert_eq!(std::fs::metadata(&kept).unwrap().len(), 64 * 1024);

        controller
            .delete_volume(DeleteVolumeRequest {
                volume_id: "pvc-1".into(),
                ..DeleteVolumeRequest::default()
            })
            .await
            .unwrap();
        assert!(!dir.path().join("state/volumes/pvc-1").exists());
        // Deleted again: nothing to do.
        controller
            .delete_volume(DeleteVolumeRequest {
                volume_id: "pvc-1".into(),
                ..DeleteVolumeRequest::default()
            })
            .await
            .unwrap();
    }

    /// A read-only publish is read-only; publishing a volume that is not
    /// staged is refused.
    #[tokio::test]
    async fn read_only_publish_and_unstaged_volumes() {
        let (dir, channel) = served().await;
        std::fs::create_dir_all(dir.path().join("state/volumes/v1")).unwrap();
        let mut node = NodeClient::new(channel);
        let staging = dir.path().join("globalmount");
        let target = dir.path().join("ro");
        let publish = NodePublishVolumeRequest {
            volume_id: "v1".into(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(mount_capability()),
            readonly: true,
            ..NodePublishVolumeRequest::default()
        };
        let refused = node.node_publish_volume(publish.clone()).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
        node.node_stage_volume(NodeStageVolumeRequest {
            volume_id: "v1".into(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(mount_capability()),
            ..NodeStageVolumeRequest::default()
        })
        .await
        .unwrap();
        node.node_publish_volume(publish).await.unwrap();
        let err = std::fs::write(target.join("f"), b"x").unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(rustix::io::Errno::ROFS.raw_os_error())
        );
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: "v1".into(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        node.node_unstage_volume(NodeUnstageVolumeRequest {
            volume_id: "v1".into(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .unwrap();
        assert!(!is_mounted(&staging));
    }

    /// An inline ephemeral volume is made on publish and removed on
    /// unpublish; a persistent one that was never made is not found.
    #[tokio::test]
    async fn inline_ephemeral_volumes_live_as_long_as_their_publication() {
        let (dir, channel) = served().await;
        let mut node = NodeClient::new(channel);
        let target = dir.path().join("pod").join("mount");
        let publish = |ephemeral: bool| NodePublishVolumeRequest {
            volume_id: "csi-abc".into(),
            target_path: target.display().to_string(),
            volume_capability: Some(mount_capability()),
            volume_context: if ephemeral {
                HashMap::from([(EPHEMERAL_KEY.to_string(), "true".to_string())])
            } else {
                HashMap::new()
            },
            ..NodePublishVolumeRequest::default()
        };
        let err = node.node_publish_volume(publish(false)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
        node.node_publish_volume(publish(true)).await.unwrap();
        assert!(is_mounted(&target));
        std::fs::write(target.join("f"), b"x").unwrap();
        let volume = dir.path().join("state/volumes/csi-abc");
        assert!(volume.join("f").exists());
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id: "csi-abc".into(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
        assert!(!is_mounted(&target));
        assert!(!volume.exists(), "the ephemeral volume goes with its pod");
    }

    /// Names that could leave the volume directory, and requests without
    /// what they need, are refused before anything is touched.
    #[tokio::test]
    async fn hostile_requests_are_refused() {
        let (dir, channel) = served().await;
        let mut controller = ControllerClient::new(channel.clone());
        let mut node = NodeClient::new(channel);
        for name in ["", ".", "..", "../escape", "a/b", &"x".repeat(MAX_NAME + 1)] {
            let err = controller
                .create_volume(CreateVolumeRequest {
                    name: name.into(),
                    volume_capabilities: vec![mount_capability()],
                    ..CreateVolumeRequest::default()
                })
                .await
                .unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument, "{name:?}");
        }
        assert!(!dir.path().join("escape").exists());
        let block = VolumeCapability {
            access_type: Some(volume_capability::AccessType::Block(
                volume_capability::BlockVolume {},
            )),
            ..mount_capability()
        };
        // Raw block and mounted at once: refused.
        let err = controller
            .create_volume(CreateVolumeRequest {
                name: "b".into(),
                volume_capabilities: vec![block.clone(), mount_capability()],
                ..CreateVolumeRequest::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(!dir.path().join("state/volumes/b").exists());
        let err = controller
            .create_volume(CreateVolumeRequest {
                name: "elsewhere".into(),
                volume_capabilities: vec![mount_capability()],
                accessibility_requirements: Some(TopologyRequirement {
                    requisite: vec![Topology {
                        segments: HashMap::from([(TOPOLOGY_KEY.into(), "node-b".into())]),
                    }],
                    preferred: Vec::new(),
                }),
                ..CreateVolumeRequest::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        let err = node
            .node_stage_volume(NodeStageVolumeRequest {
                volume_id: "missing".into(),
                staging_target_path: "/tmp/x".into(),
                volume_capability: Some(mount_capability()),
                ..NodeStageVolumeRequest::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
        std::fs::create_dir_all(dir.path().join("state/volumes/v")).unwrap();
        let err = node
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: "v".into(),
                target_path: "relative/path".into(),
                volume_capability: Some(mount_capability()),
                ..NodePublishVolumeRequest::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        // A filesystem volume published as a device: refused, nothing made.
        let err = node
            .node_publish_volume(NodePublishVolumeRequest {
                volume_id: "v".into(),
                target_path: dir.path().join("dev").display().to_string(),
                volume_capability: Some(block),
                ..NodePublishVolumeRequest::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(!dir.path().join("dev").exists());
    }

    /// A raw block volume: a sparse file of its size, published as a loop
    /// device bound on the target file (readable and writable through it,
    /// read-only when asked), its loop device detached on unpublish.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_block_volume_is_a_loop_device_bound_on_its_target() {
        use std::io::{Read as _, Seek as _, Write as _};
        let (dir, channel) = served().await;
        let mut controller = ControllerClient::new(channel.clone());
        let mut node = NodeClient::new(channel);
        let block = VolumeCapability {
            access_type: Some(volume_capability::AccessType::Block(
                volume_capability::BlockVolume {},
            )),
            ..mount_capability()
        };
        let made = controller
            .create_volume(CreateVolumeRequest {
                name: "blk".into(),
                volume_capabilities: vec![block.clone()],
                capacity_range: Some(CapacityRange {
                    required_bytes: 8 << 20,
                    limit_bytes: 0,
                }),
                ..CreateVolumeRequest::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(made.volume.unwrap().capacity_bytes, 8 << 20);
        let image = dir.path().join("state/images/blk.img");
        assert_eq!(std::fs::metadata(&image).unwrap().len(), 8 << 20);
        let check = |caps: Vec<VolumeCapability>| {
            let mut c = controller.clone();
            async move {
                c.validate_volume_capabilities(ValidateVolumeCapabilitiesRequest {
                    volume_id: "blk".into(),
                    volume_capabilities: caps,
                    ..ValidateVolumeCapabilitiesRequest::default()
                })
                .await
                .unwrap()
                .into_inner()
                .confirmed
                .is_some()
            }
        };
        assert!(check(vec![block.clone()]).await);
        assert!(!check(vec![mount_capability()]).await);
        let staging = dir.path().join("staging");
        std::fs::create_dir_all(&staging).unwrap();
        node.node_stage_volume(NodeStageVolumeRequest {
            volume_id: "blk".into(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(block.clone()),
            ..NodeStageVolumeRequest::default()
        })
        .await
        .unwrap();
        assert!(!is_mounted(&staging), "nothing to stage for a device");
        let publish = |target: PathBuf, readonly: bool| {
            let mut n = node.clone();
            let block = block.clone();
            async move {
                n.node_publish_volume(NodePublishVolumeRequest {
                    volume_id: "blk".into(),
                    target_path: target.display().to_string(),
                    volume_capability: Some(block),
                    readonly,
                    ..NodePublishVolumeRequest::default()
                })
                .await
            }
        };
        let target = dir.path().join("pod-dev");
        publish(target.clone(), false).await.unwrap();
        publish(target.clone(), false).await.unwrap(); // idempotent
        assert!(is_mounted(&target));
        let device = loop_bound_on(&target).expect("a loop device bound on the target");
        // Written through the target, read back from the volume's file.
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&target)
            .unwrap();
        f.seek(std::io::SeekFrom::Start(4096)).unwrap();
        f.write_all(b"block data").unwrap();
        f.sync_all().unwrap();
        drop(f);
        let mut back = vec![0; 10];
        let mut img = std::fs::File::open(&image).unwrap();
        img.seek(std::io::SeekFrom::Start(4096)).unwrap();
        img.read_exact(&mut back).unwrap();
        assert_eq!(back, b"block data");
        // Read-only: the device cannot be opened for writing.
        let ro = dir.path().join("pod-dev-ro");
        publish(ro.clone(), true).await.unwrap();
        let written = std::fs::OpenOptions::new()
            .write(true)
            .open(&ro)
            .and_then(|mut f| f.write_all(b"x").and_then(|()| f.sync_all()));
        assert!(written.is_err(), "a write through the read-only device");
        let ro_device = loop_bound_on(&ro).unwrap();
        // Made again with the same size: the same volume; with another: refused.
        let again = |bytes: i64| {
            let mut c = controller.clone();
            let block = block.clone();
            async move {
                c.create_volume(CreateVolumeRequest {
                    name: "blk".into(),
                    volume_capabilities: vec![block],
                    capacity_range: Some(CapacityRange {
                        required_bytes: bytes,
                        limit_bytes: 0,
                    }),
                    ..CreateVolumeRequest::default()
                })
                .await
            }
        };
        again(8 << 20).await.unwrap();
        let err = again(4 << 20).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::AlreadyExists);
        assert_eq!(
            std::fs::metadata(&image).unwrap().len(),
            8 << 20,
            "not shrunk"
        );
        // A file a pod might write in a filesystem volume's directory does
        // not make it a block volume: the image lives elsewhere.
        assert!(!image.starts_with(dir.path().join("state/volumes")));
        // Published: not deleted.
        let err = controller
            .delete_volume(DeleteVolumeRequest {
                volume_id: "blk".into(),
                ..DeleteVolumeRequest::default()
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(image.exists());
        for (t, d) in [(&target, &device), (&ro, &ro_device)] {
            node.node_unpublish_volume(NodeUnpublishVolumeRequest {
                volume_id: "blk".into(),
                target_path: t.display().to_string(),
            })
            .await
            .unwrap();
            assert!(!t.exists(), "target file removed");
            let attached = losetup(&[
                "--list".as_ref(),
                "--noheadings".as_ref(),
                "--output".as_ref(),
                "NAME".as_ref(),
            ])
            .unwrap();
            assert!(
                !attached.lines().any(|l| Path::new(l.trim()) == d.as_path()),
                "{} detached: {attached}",
                d.display()
            );
        }
        controller
            .delete_volume(DeleteVolumeRequest {
                volume_id: "blk".into(),
                ..DeleteVolumeRequest::default()
            })
            .await
            .unwrap();
        assert!(!image.exists());
    }

    /// The registration API answers as node-driver-registrar does, and a
    /// refusal reaches the driver's main loop.
    #[tokio::test]
    async fn registers_as_the_registrar_does() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir
            .path()
            .join("registry")
            .join(format!("{DRIVER}-reg.sock"));
        let (tx, mut refused) = tokio::sync::mpsc::channel(1);
        let registrar = Registrar {
            name: DRIVER.into(),
            endpoint: "/run/csi/csi.sock".into(),
            refused: tx,
        };
        let _server = serve_registration(registrar, &socket).unwrap();
        let mut client = RegistrationClient::new(rustlet::cri::unix_channel(socket).await.unwrap());
        let info = client.get_info(InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info.r#type, "CSIPlugin");
        assert_eq!(info.name, DRIVER);
        assert_eq!(info.endpoint, "/run/csi/csi.sock");
        assert_eq!(info.supported_versions, vec!["1.0.0".to_string()]);
        client
            .notify_registration_status(RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            })
            .await
            .unwrap();
        assert!(refused.try_recv().is_err());
        client
            .notify_registration_status(RegistrationStatus {
                plugin_registered: false,
                error: "version not supported".into(),
            })
            .await
            .unwrap();
        assert_eq!(refused.recv().await.unwrap(), "version not supported");
    }
}
