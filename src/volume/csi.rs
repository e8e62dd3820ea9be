//! CSI volumes, as the kubelet's CSI plugin (pkg/volume/csi): a
//! PersistentVolume with a `csi` source, or an inline CSI ephemeral volume
//! (a pod volume's `csi`), served by a driver registered through the
//! plugin manager ([`crate::plugin_manager`]).
//!
//! Setting one up: when the driver needs attaching (its CSIDriver's
//! `attachRequired`, true when there is no CSIDriver object), the volume's
//! VolumeAttachment (`csi-<sha256(handle, driver, node)>`) must be attached
//! (its `attachmentMetadata` is the publish context); when the driver
//! stages (`STAGE_UNSTAGE_VOLUME`), `NodeStageVolume` at
//! `<root-dir>/plugins/kubernetes.io/csi/<driver>/<sha256(handle)>/globalmount`
//! unless mounted there already; then `NodePublishVolume` at
//! `<root-dir>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount` unless
//! mounted there already, with the pod's details in the volume context when
//! the CSIDriver asks (`podInfoOnMount`). What each volume is is written
//! beside it (`vol_data.json`, the kubelet's file and keys), so that
//! [`tear_down_pod`] finds and unpublishes it even after the agent
//! restarted, and unstages a staged volume once no other pod publishes it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{PersistentVolume, Pod, Secret, Volume};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec, VolumeAttachment};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use super::{MountedVolume, PODS_DIR, VOLUMES_DIR};
use crate::plugin_manager::Drivers;
use crate::proto::csi::{
    NodeGetCapabilitiesRequest, NodeGetVolumeStatsRequest, NodePublishVolumeRequest,
    NodeStageVolumeRequest, NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability,
    node_client::NodeClient, node_service_capability, volume_capability, volume_usage,
};

/// The plugin directory of CSI volumes in a pod's volumes directory.
pub const PLUGIN_DIR: &str = "kubernetes.io~csi";
/// The file beside each CSI volume that says what it is.
pub const VOL_DATA_FILE: &str = "vol_data.json";
/// The directory of staged (globally mounted) volumes under the root dir.
pub const STAGING_DIR: &str = "plugins/kubernetes.io/csi";

/// A CSI volume as a pod uses it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Source {
    /// The name the volume goes by on the node: the PersistentVolume's name,
    /// or the pod volume's for an inline one.
    pub spec_name: String,
    /// The driver's name.
    pub driver: String,
    /// The driver's ID of the volume (an inline volume's is made from the
    /// pod UID and the volume name, as the kubelet makes it).
    pub volume_handle: String,
    /// Mounted read-only.
    pub read_only: bool,
    /// Filesystem type (empty: the driver's choice).
    pub fs_type: String,
    /// Mount options (a PersistentVolume's `mountOptions`).
    pub mount_flags: Vec<String>,
    /// The driver's attributes of the volume.
    pub attributes: BTreeMap<String, String>,
    /// The PersistentVolume's first access mode (`ReadWriteOnce` for inline
    /// volumes).
    pub access_mode: String,
    /// The secret for `NodeStageVolume` (namespace, name).
    pub stage_secret: Option<(String, String)>,
    /// The secret for `NodePublishVolume` (namespace, name).
    pub publish_secret: Option<(String, String)>,
    /// An inline ephemeral volume (no staging, no attaching).
    pub ephemeral: bool,
    /// Whether the pod's `fsGroup` may be applied to it under the default
    /// `ReadWriteOnceWithFSType` policy: its PersistentVolume's access modes
    /// include `ReadWriteOnce` or `ReadWriteOncePod` (always for an inline
    /// volume), as the kubelet's `hasReadWriteOnce`.
    pub read_write_once: bool,
    /// The pod volume's name (the name `/stats/summary` gives the volume).
    pub pod_volume: String,
    /// The claim the pod uses the volume through, in its namespace (`None`:
    /// an inline volume).
    pub claim: Option<String>,
    /// A raw block volume (its PersistentVolume's `volumeMode: Block`),
    /// published as a device file rather than mounted.
    pub block: bool,
}

/// The CSI source of PersistentVolume `pv` used read-only when `read_only`
/// (its pod volume and claim left for the caller to fill in).
#[must_use]
pub fn of_persistent_volume(pv: &PersistentVolume, read_only: bool) -> Option<Source> {
    let spec = pv.spec.as_ref()?;
    let csi = spec.csi.as_ref()?;
    let secret = |r: Option<&k8s_openapi::api::core::v1::SecretReference>| {
        r.and_then(|r| Some((r.namespace.clone()?, r.name.clone()?)))
    };
    Some(Source {
        spec_name: pv.metadata.name.clone().unwrap_or_default(),
        driver: csi.driver.clone(),
        volume_handle: csi.volume_handle.clone(),
        read_only: read_only || csi.read_only.unwrap_or(false),
        fs_type: csi.fs_type.clone().unwrap_or_default(),
        mount_flags: spec.mount_options.clone().unwrap_or_default(),
        attributes: csi.volume_attributes.clone().unwrap_or_default(),
        access_mode: spec
            .access_modes
            .as_ref()
            .and_then(|m| m.first().cloned())
            .unwrap_or_else(|| "ReadWriteOnce".into()),
        stage_secret: secret(csi.node_stage_secret_ref.as_ref()),
        publish_secret: secret(csi.node_publish_secret_ref.as_ref()),
        ephemeral: false,
        read_write_once: spec
            .access_modes
            .iter()
            .flatten()
            .any(|m| m == "ReadWriteOnce" || m == "ReadWriteOncePod"),
        pod_volume: String::new(),
        claim: None,
        block: spec.volume_mode.as_deref() == Some("Block"),
    })
}

/// The CSI source of inline volume `v` of `pod`, if it is one; its handle
/// is `csi-<sha256(pod UID, volume name)>`, as the kubelet's
/// `makeVolumeHandle`.
#[must_use]
pub fn of_inline(pod: &Pod, v: &Volume) -> Option<Source> {
    let csi = v.csi.as_ref()?;
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    Some(Source {
        pod_volume: v.name.clone(),
        spec_name: v.name.clone(),
        driver: csi.driver.clone(),
        volume_handle: format!("csi-{}", sha256_hex(&format!("{uid}{}", v.name))),
        read_only: csi.read_only.unwrap_or(false),
        fs_type: csi.fs_type.clone().unwrap_or_default(),
        mount_flags: Vec::new(),
        attributes: csi.volume_attributes.clone().unwrap_or_default(),
        access_mode: "ReadWriteOnce".into(),
        stage_secret: None,
        publish_secret: csi
            .node_publish_secret_ref
            .as_ref()
            .map(|r| (ns, r.name.clone())),
        ephemeral: true,
        read_write_once: true,
        claim: None,
        block: false,
    })
}

fn sha256_hex(text: &str) -> String {
    format!("{:x}", Sha256::digest(text.as_bytes()))
}

/// The name of the VolumeAttachment of `handle` of `driver` on `node`, as
/// the kubelet's `getAttachmentName`.
#[must_use]
pub fn attachment_name(handle: &str, driver: &str, node: &str) -> String {
    format!("csi-{}", sha256_hex(&format!("{handle}{driver}{node}")))
}

/// Where `handle` of `driver` is staged: `<root>/plugins/kubernetes.io/csi/
/// <driver>/<sha256(handle)>/globalmount`.
#[must_use]
pub fn staging_path(root: &Path, driver: &str, handle: &str) -> PathBuf {
    root.join(STAGING_DIR)
        .join(driver)
        .join(sha256_hex(handle))
        .join("globalmount")
}

/// The directory of raw block CSI volumes under the root dir (the
/// kubelet's `volumeDevices` of the CSI plugin).
pub const BLOCK_DIR: &str = "plugins/kubernetes.io/csi/volumeDevices";

/// Where raw block volume `spec_name` is staged, as the kubelet's block
/// mapper stages it: `<root>/plugins/kubernetes.io/csi/volumeDevices/staging/<spec_name>`.
#[must_use]
pub fn block_staging_path(root: &Path, spec_name: &str) -> PathBuf {
    root.join(BLOCK_DIR).join("staging").join(spec_name)
}

/// The device file raw block volume `spec_name` is published at for pod
/// `uid`, as the kubelet's block mapper publishes it:
/// `<root>/plugins/kubernetes.io/csi/volumeDevices/publish/<spec_name>/<uid>`
/// (the driver makes the file and binds the device on it; containers get
/// it as a device).
#[must_use]
pub fn block_publish_path(root: &Path, spec_name: &str, uid: &str) -> PathBuf {
    root.join(BLOCK_DIR)
        .join("publish")
        .join(spec_name)
        .join(uid)
}

/// The directory of pod `uid`'s CSI volume `spec_name`: its `vol_data.json`,
/// and, for a filesystem volume, its `mount`, where it is published.
#[must_use]
pub fn volume_dir(root: &Path, uid: &str, spec_name: &str) -> PathBuf {
    super::volume_dir(root, uid, PLUGIN_DIR, spec_name)
}

/// What a CSI volume is, kept beside it (`vol_data.json`, the kubelet's
/// keys).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolData {
    /// The volume's name on the node ([`Source::spec_name`]).
    #[serde(rename = "specVolID")]
    pub spec_vol_id: String,
    /// The driver's ID of it.
    pub volume_handle: String,
    /// The driver.
    pub driver_name: String,
    /// The node.
    pub node_name: String,
    /// Its VolumeAttachment's name (empty: not attached).
    #[serde(default, rename = "attachmentID")]
    pub attachment_id: String,
    /// `Persistent` or `Ephemeral`.
    #[serde(default)]
    pub volume_lifecycle_mode: String,
    /// Where it is staged (empty: not staged). Not one of the kubelet's
    /// keys: the kubelet finds it again from the spec.
    #[serde(default)]
    pub staging_path: String,
    /// The pod volume's name ([`Source::pod_volume`]). Not one of the
    /// kubelet's keys: its summary takes it from the spec.
    #[serde(default)]
    pub pod_volume_name: String,
    /// The claim the pod uses the volume through (empty: an inline
    /// volume). Not one of the kubelet's keys, as `pod_volume_name`.
    #[serde(default)]
    pub claim_name: String,
    /// Where a raw block volume is published ([`block_publish_path`]);
    /// empty for a filesystem volume, published at the directory's `mount`.
    /// Not one of the kubelet's keys (its block mapper keeps its data
    /// elsewhere).
    #[serde(default)]
    pub publish_path: String,
}

impl VolData {
    /// Where the volume whose data is in directory `dir` is published.
    #[must_use]
    pub fn target(&self, dir: &Path) -> PathBuf {
        if self.publish_path.is_empty() {
            dir.join("mount")
        } else {
            PathBuf::from(&self.publish_path)
        }
    }
}

/// Whether `path` is a mount point now (`/proc/self/mountinfo`).
///
/// # Errors
/// The mount table cannot be read: nothing can be said, and no caller may
/// take it for "not mounted" (a teardown would remove a live mount's files).
fn is_mounted(path: &Path) -> Result<bool, String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| {
            super::mount::mounts_under(&t, path)
                .iter()
                .any(|m| m == path)
        })
        .map_err(|e| format!("read /proc/self/mountinfo: {e}"))
}

/// Removes directory `dir` if it is empty and there; a directory that
/// still holds something (a driver's leftovers, a mount) is an error, never
/// emptied: teardown removes only what it made, as the kubelet's
/// `removeMountDir`.
fn remove_empty_dir(dir: &Path) -> Result<(), String> {
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("remove {}: {e}", dir.display()))
        }
        _ => Ok(()),
    }
}

/// Removes file `file` if it is there.
fn remove_file(file: &Path) -> Result<(), String> {
    match std::fs::remove_file(file) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("remove {}: {e}", file.display()))
        }
        _ => Ok(()),
    }
}

/// What a CSI set-up needs of the agent: the API client (CSIDriver,
/// VolumeAttachment and secrets), the registered drivers, the root dir and
/// the node's name.
#[derive(Clone)]
pub struct Host {
    /// The node's client.
    pub client: Client,
    /// The registered drivers.
    pub drivers: Drivers,
    /// The agent's root dir.
    pub root: PathBuf,
    /// The node's name.
    pub node_name: String,
}

/// Sets up CSI volume `source` for `pod` (attach wait, stage, publish) and
/// returns where containers mount it.
///
/// # Errors
/// The kubelet's kind of message: the driver is not registered, the
/// attachment is not there yet, a secret cannot be read, the driver
/// refused a call.
pub async fn set_up(host: &Host, pod: &Pod, source: &Source) -> Result<MountedVolume, String> {
    let driver = host.drivers.get(&source.driver).ok_or_else(|| {
        format!(
            "kubernetes.io/csi: mounter.SetUpAt failed to get CSI client: driver name {} not found in the list of registered CSI drivers",
            source.driver
        )
    })?;
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let dir = volume_dir(&host.root, uid, &source.spec_name);
    let target = if source.block {
        block_publish_path(&host.root, &source.spec_name, uid)
    } else {
        dir.join("mount")
    };
    let published = MountedVolume {
        host_path: target.clone(),
        read_only: source.read_only,
        image: None,
        block: source.block,
    };
    if is_mounted(&target)? {
        return Ok(published);
    }
    let driver_spec = csi_driver_spec(host, source).await?;
    // Attached first, when the driver needs it.
    let (attachment_id, publish_context) =
        if !source.ephemeral && driver_spec.attach_required.unwrap_or(true) {
            attached(host, source).await?
        } else {
            (String::new(), HashMap::new())
        };
    let mut node = connect(&driver.endpoint, &source.driver).await?;
    // The pod's fsGroup: given to a driver that mounts for a group
    // (VOLUME_MOUNT_GROUP), else applied here after publishing when the
    // CSIDriver's fsGroupPolicy allows (csiMountMgr.SetUpAt); never to a
    // raw device.
    let fs_group = super::fs_group(pod).filter(|_| !source.block);
    let delegate = fs_group.is_some() && mounts_for_group(&mut node).await?;
    let mount_group = fs_group
        .filter(|_| delegate)
        .map(|g| g.to_string())
        .unwrap_or_default();
    let capability = capability(source, &mount_group);
    let staging = stage(host, &mut node, source, &publish_context, &capability).await?;
    write_vol_data(host, source, &dir, &target, attachment_id, &staging)?;
    // A device file's directory is the agent's to make; the file, the driver's.
    if let Some(parent) = target.parent().filter(|_| source.block) {
        std::fs::create_dir_all(parent).map_err(|e| format!("make {}: {e}", parent.display()))?;
    }
    let request = NodePublishVolumeRequest {
        volume_id: source.volume_handle.clone(),
        publish_context,
        staging_target_path: staging,
        target_path: target.display().to_string(),
        volume_capability: Some(capability),
        readonly: source.read_only,
        secrets: secret(host, source.publish_secret.as_ref()).await?,
        volume_context: volume_context(pod, source, driver_spec.pod_info_on_mount == Some(true)),
    };
    publish(&mut node, request).await?;
    if let Some(gid) = fs_group
        .filter(|_| !delegate && applies_fs_group(source, driver_spec.fs_group_policy.as_deref()))
    {
        apply_fs_group(pod, source, &target, gid).await?;
    }
    info!(
        volume = source.spec_name,
        driver = source.driver,
        block = source.block,
        "CSI volume published"
    );
    Ok(published)
}

/// The spec of `source`'s CSIDriver object (an empty one when there is
/// none: attaching required, no pod info on mount), once the driver is
/// seen to allow the volume's lifecycle mode.
///
/// # Errors
/// The CSIDriver cannot be read, or it does not allow the volume's mode.
async fn csi_driver_spec(host: &Host, source: &Source) -> Result<CSIDriverSpec, String> {
    let csi_driver = Api::<CSIDriver>::all(host.client.clone())
        .get_opt(&source.driver)
        .await
        .map_err(|e| format!("get CSIDriver {}: {e}", source.driver))?;
    lifecycle_mode_allowed(csi_driver.as_ref(), source)?;
    Ok(csi_driver.map(|d| d.spec).unwrap_or_default())
}

/// Waits for `source`'s VolumeAttachment on this node: its name and, once
/// it is attached, its `attachmentMetadata` as the publish context.
///
/// # Errors
/// The attachment cannot be read, is not attached yet, or failed to attach
/// (its `attachError`).
async fn attached(
    host: &Host,
    source: &Source,
) -> Result<(String, HashMap<String, String>), String> {
    let attachment_id = attachment_name(&source.volume_handle, &source.driver, &host.node_name);
    let va = Api::<VolumeAttachment>::all(host.client.clone())
        .get_opt(&attachment_id)
        .await
        .map_err(|e| format!("get VolumeAttachment {attachment_id}: {e}"))?;
    let status = va.and_then(|v| v.status);
    if !status.as_ref().is_some_and(|s| s.attached) {
        let why = status
            .and_then(|s| s.attach_error)
            .and_then(|e| e.message)
            .unwrap_or_else(|| "not attached yet".into());
        return Err(format!(
            "volume {} of driver {}: VolumeAttachment {attachment_id}: {why}",
            source.volume_handle, source.driver
        ));
    }
    let publish_context = status
        .and_then(|s| s.attachment_metadata)
        .unwrap_or_default()
        .into_iter()
        .collect();
    Ok((attachment_id, publish_context))
}

/// A client of the Node service of `driver` at `endpoint`.
///
/// # Errors
/// The driver's socket cannot be reached.
async fn connect(
    endpoint: &Path,
    driver: &str,
) -> Result<NodeClient<tonic::transport::Channel>, String> {
    let channel = crate::cri::unix_channel(endpoint.to_path_buf())
        .await
        .map_err(|e| format!("CSI driver {driver} at {}: {e}", endpoint.display()))?;
    Ok(NodeClient::new(channel))
}

/// Stages `source` once per node when the driver stages
/// (`STAGE_UNSTAGE_VOLUME`; never an inline ephemeral volume):
/// `NodeStageVolume` at its staging path unless mounted there already.
/// Returns the staging path, empty when the volume is not staged.
///
/// # Errors
/// The driver's capabilities cannot be read, the staging path cannot be
/// made, the stage secret cannot be read, or the driver refused to stage.
async fn stage(
    host: &Host,
    node: &mut NodeClient<tonic::transport::Channel>,
    source: &Source,
    publish_context: &HashMap<String, String>,
    capability: &VolumeCapability,
) -> Result<String, String> {
    if source.ephemeral || !stages(node).await? {
        return Ok(String::new());
    }
    let path = if source.block {
        block_staging_path(&host.root, &source.spec_name)
    } else {
        staging_path(&host.root, &source.driver, &source.volume_handle)
    };
    if !is_mounted(&path)? {
        std::fs::create_dir_all(&path)
            .map_err(|e| format!("make staging path {}: {e}", path.display()))?;
        let secrets = secret(host, source.stage_secret.as_ref()).await?;
        let request = NodeStageVolumeRequest {
            volume_id: source.volume_handle.clone(),
            publish_context: publish_context.clone(),
            staging_target_path: path.display().to_string(),
            volume_capability: Some(capability.clone()),
            secrets,
            volume_context: source.attributes.clone().into_iter().collect(),
        };
        call(node.node_stage_volume(request)).await.map_err(|e| {
            format!(
                "rpc error: NodeStageVolume of {}: {e}",
                source.volume_handle
            )
        })?;
    }
    Ok(path.display().to_string())
}

/// `NodePublishVolume`.
///
/// # Errors
/// The driver refused to publish, or did not answer in time.
async fn publish(
    node: &mut NodeClient<tonic::transport::Channel>,
    request: NodePublishVolumeRequest,
) -> Result<(), String> {
    let handle = request.volume_id.clone();
    call(node.node_publish_volume(request))
        .await
        .map(|_| ())
        .map_err(|e| format!("rpc error: NodePublishVolume of {handle}: {e}"))
}

/// Writes what `source` is into its directory `dir` ([`VOL_DATA_FILE`]),
/// made if need be: published at `target`, attached as `attachment_id`,
/// staged at `staging` (each empty when not).
///
/// # Errors
/// The directory or the file cannot be written.
fn write_vol_data(
    host: &Host,
    source: &Source,
    dir: &Path,
    target: &Path,
    attachment_id: String,
    staging: &str,
) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("make {}: {e}", dir.display()))?;
    let data = VolData {
        spec_vol_id: source.spec_name.clone(),
        volume_handle: source.volume_handle.clone(),
        driver_name: source.driver.clone(),
        node_name: host.node_name.clone(),
        attachment_id,
        volume_lifecycle_mode: if source.ephemeral {
            "Ephemeral".into()
        } else {
            "Persistent".into()
        },
        staging_path: staging.to_string(),
        pod_volume_name: source.pod_volume.clone(),
        claim_name: source.claim.clone().unwrap_or_default(),
        publish_path: if source.block {
            target.display().to_string()
        } else {
            String::new()
        },
    };
    let text = serde_json::to_string(&data).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(VOL_DATA_FILE), text)
        .map_err(|e| format!("write {}: {e}", dir.join(VOL_DATA_FILE).display()))
}

/// The volume context `NodePublishVolume` gets: the volume's attributes,
/// with the pod's details when the CSIDriver asks (`podInfoOnMount`).
fn volume_context(pod: &Pod, source: &Source, pod_info_on_mount: bool) -> HashMap<String, String> {
    let mut context: HashMap<String, String> = source.attributes.clone().into_iter().collect();
    if pod_info_on_mount {
        context.extend(pod_info(pod, source.ephemeral));
    }
    context
}

/// Gives the published volume at `target` to group `gid` (the pod's
/// fsGroup) under the pod's `fsGroupChangePolicy`, as the kubelet's
/// `applyFSGroup` after publishing.
///
/// # Errors
/// The ownership could not be changed.
async fn apply_fs_group(pod: &Pod, source: &Source, target: &Path, gid: u32) -> Result<(), String> {
    let (path, policy) = (
        target.to_path_buf(),
        super::fs_group_change_policy(pod).map(str::to_string),
    );
    let applied = tokio::task::spawn_blocking(move || {
        super::ownership::apply_with_policy(&path, gid, false, policy.as_deref())
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r.map_err(|e| e.to_string()));
    // Published but unusable: the next sync sees it mounted and the pod
    // waits; teardown unpublishes it from disk.
    applied.map_err(|e| format!("applyFSGroup failed for vol {}: {e}", source.volume_handle))
}

/// The pod details a driver with `podInfoOnMount` gets in the volume
/// context (the kubelet's `getPodInfoAttrs`).
fn pod_info(pod: &Pod, ephemeral: bool) -> HashMap<String, String> {
    let field = |v: Option<&String>| v.cloned().unwrap_or_default();
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    HashMap::from([
        (
            "csi.storage.k8s.io/pod.name".into(),
            field(pod.metadata.name.as_ref()),
        ),
        (
            "csi.storage.k8s.io/pod.namespace".into(),
            field(pod.metadata.namespace.as_ref()),
        ),
        (
            "csi.storage.k8s.io/pod.uid".into(),
            field(pod.metadata.uid.as_ref()),
        ),
        ("csi.storage.k8s.io/serviceAccount.name".into(), sa),
        ("csi.storage.k8s.io/ephemeral".into(), ephemeral.to_string()),
    ])
}

/// The volume capability of `source`: a raw block device, or a mounted
/// filesystem with its type and flags, in the access mode of its PersistentVolume, and the group the
/// driver is to mount it for (`VOLUME_MOUNT_GROUP`; empty: none).
fn capability(source: &Source, mount_group: &str) -> VolumeCapability {
    use volume_capability::access_mode::Mode;
    let mode = match source.access_mode.as_str() {
        "ReadOnlyMany" => Mode::MultiNodeReaderOnly,
        "ReadWriteMany" => Mode::MultiNodeMultiWriter,
        "ReadWriteOncePod" => Mode::SingleNodeSingleWriter,
        _ => Mode::SingleNodeWriter,
    };
    let access_type = if source.block {
        volume_capability::AccessType::Block(volume_capability::BlockVolume {})
    } else {
        volume_capability::AccessType::Mount(volume_capability::MountVolume {
            fs_type: source.fs_type.clone(),
            mount_flags: source.mount_flags.clone(),
            volume_mount_group: mount_group.to_string(),
        })
    };
    VolumeCapability {
        access_type: Some(access_type),
        access_mode: Some(volume_capability::AccessMode { mode: mode.into() }),
    }
}

/// Whether the CSIDriver allows `source`'s lifecycle mode, as the kubelet's
/// `supportsVolumeLifecycleMode`: without a CSIDriver only persistent
/// volumes; with one, the modes it lists (`Persistent` when it lists none,
/// the API's default).
///
/// # Errors
/// The kubelet's message naming the mode and the driver.
fn lifecycle_mode_allowed(driver: Option<&CSIDriver>, source: &Source) -> Result<(), String> {
    let mode = if source.ephemeral {
        "Ephemeral"
    } else {
        "Persistent"
    };
    let Some(driver) = driver else {
        return if source.ephemeral {
            Err(format!(
                "volume mode \"{mode}\" not supported by driver {} (no CSIDriver object)",
                source.driver
            ))
        } else {
            Ok(())
        };
    };
    let modes = driver
        .spec
        .volume_lifecycle_modes
        .clone()
        .unwrap_or_else(|| vec!["Persistent".to_string()]);
    if modes.iter().any(|m| m == mode) {
        Ok(())
    } else {
        Err(format!(
            "volume mode \"{mode}\" not supported by driver {} (only supports {modes:?})",
            source.driver
        ))
    }
}

/// Whether the agent applies the pod's fsGroup to `source` under the
/// CSIDriver's `fsGroupPolicy` (absent: `ReadWriteOnceWithFSType`), as the
/// kubelet's `supportsFSGroup`: never to a read-only volume or under
/// `None`; always under `File`; else only to a volume with a filesystem
/// type that is `ReadWriteOnce`.
fn applies_fs_group(source: &Source, policy: Option<&str>) -> bool {
    match policy {
        _ if source.read_only => false,
        Some("None") => false,
        Some("File") => true,
        _ => !source.fs_type.is_empty() && source.read_write_once,
    }
}

/// Whether the driver stages volumes (`STAGE_UNSTAGE_VOLUME`).
async fn stages(node: &mut NodeClient<tonic::transport::Channel>) -> Result<bool, String> {
    has_capability(node, node_service_capability::rpc::Type::StageUnstageVolume).await
}

/// Whether the driver mounts volumes for a group itself (`VOLUME_MOUNT_GROUP`).
async fn mounts_for_group(
    node: &mut NodeClient<tonic::transport::Channel>,
) -> Result<bool, String> {
    has_capability(node, node_service_capability::rpc::Type::VolumeMountGroup).await
}

/// Whether the driver's Node service has capability `wanted`.
async fn has_capability(
    node: &mut NodeClient<tonic::transport::Channel>,
    wanted: node_service_capability::rpc::Type,
) -> Result<bool, String> {
    let caps = call(node.node_get_capabilities(NodeGetCapabilitiesRequest {}))
        .await
        .map_err(|e| format!("rpc error: NodeGetCapabilities: {e}"))?;
    Ok(caps.capabilities.iter().any(|c| {
        matches!(
            &c.r#type,
            Some(node_service_capability::Type::Rpc(rpc)) if rpc.r#type == wanted as i32
        )
    }))
}

/// A published CSI volume's usage, as its driver reports it
/// (`NodeGetVolumeStats`): bytes and inodes, each `None` when the driver
/// did not say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// What the volume is (its `vol_data.json`).
    pub data: VolData,
    /// Bytes free.
    pub available_bytes: Option<u64>,
    /// Bytes in all.
    pub capacity_bytes: Option<u64>,
    /// Bytes used.
    pub used_bytes: Option<u64>,
    /// Inodes free.
    pub inodes_free: Option<u64>,
    /// Inodes in all.
    pub inodes: Option<u64>,
    /// Inodes used.
    pub inodes_used: Option<u64>,
}

/// How long a driver has to report a volume's usage.
const STATS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The usage of every CSI volume pod `uid` has published whose driver is
/// registered and reports usage (`GET_VOLUME_STATS`), sorted by pod volume
/// name, as the kubelet's volume stats calculator asks it of the CSI
/// plugin's `GetMetrics`. A volume whose driver fails is left out (logged).
pub async fn usage(drivers: &Drivers, root: &Path, uid: &str) -> Vec<Usage> {
    let dir = super::pod_dir(root, uid).join(VOLUMES_DIR).join(PLUGIN_DIR);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.filter_map(Result::ok) {
        let Some(data) = std::fs::read(entry.path().join(VOL_DATA_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice::<VolData>(&b).ok())
        else {
            continue;
        };
        // A block volume at its device file, as the kubelet's block mapper
        // asks its driver (only the driver knows a device's use).
        let target = data.target(&entry.path());
        if !is_mounted(&target).unwrap_or(false) {
            continue;
        }
        let Some(driver) = drivers.get(&data.driver_name) else {
            continue;
        };
        match tokio::time::timeout(
            STATS_TIMEOUT,
            volume_usage(&driver.endpoint, &data, &target),
        )
        .await
        {
            Ok(Ok(Some(u))) => out.push(u),
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                tracing::debug!(volume = %data.spec_vol_id, error = %e, "CSI volume stats")
            }
            Err(_) => {
                tracing::debug!(volume = %data.spec_vol_id, "CSI volume stats: no answer in time")
            }
        }
    }
    out.sort_by(|a, b| a.data.pod_volume_name.cmp(&b.data.pod_volume_name));
    out
}

/// One volume's usage from its driver; `None` when the driver does not
/// report usage.
async fn volume_usage(
    endpoint: &Path,
    data: &VolData,
    target: &Path,
) -> Result<Option<Usage>, String> {
    let channel = crate::cri::unix_channel(endpoint.to_path_buf())
        .await
        .map_err(|e| {
            format!(
                "CSI driver {} at {}: {e}",
                data.driver_name,
                endpoint.display()
            )
        })?;
    let mut node = NodeClient::new(channel);
    if !has_capability(
        &mut node,
        node_service_capability::rpc::Type::GetVolumeStats,
    )
    .await?
    {
        return Ok(None);
    }
    let stats = call(node.node_get_volume_stats(NodeGetVolumeStatsRequest {
        volume_id: data.volume_handle.clone(),
        volume_path: target.display().to_string(),
        staging_target_path: data.staging_path.clone(),
    }))
    .await
    .map_err(|e| format!("rpc error: NodeGetVolumeStats: {e}"))?;
    let mut u = Usage {
        data: data.clone(),
        ..Usage::default()
    };
    // Negative numbers from the driver are not numbers.
    let n = |v: i64| u64::try_from(v).ok();
    for s in &stats.usage {
        if s.unit == volume_usage::Unit::Bytes as i32 {
            (u.available_bytes, u.capacity_bytes, u.used_bytes) =
                (n(s.available), n(s.total), n(s.used));
        } else if s.unit == volume_usage::Unit::Inodes as i32 {
            (u.inodes_free, u.inodes, u.inodes_used) = (n(s.available), n(s.total), n(s.used));
        }
    }
    Ok(Some(u))
}

/// The data of secret `reference` (namespace, name), as strings; none
/// without one.
async fn secret(
    host: &Host,
    reference: Option<&(String, String)>,
) -> Result<HashMap<String, String>, String> {
    let Some((ns, name)) = reference else {
        return Ok(HashMap::new());
    };
    let secret = Api::<Secret>::namespaced(host.client.clone(), ns)
        .get(name)
        .await
        .map_err(|e| format!("fetching NodePublishSecretRef {ns}/{name} failed: {e}"))?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
        .collect())
}

/// A CSI call bounded by [`crate::plugin_manager::CALL_TIMEOUT`] (longer for
/// mounts: two minutes, the kubelet's `csiTimeout`).
async fn call<T>(
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(std::time::Duration::from_secs(120), call).await {
        Ok(Ok(r)) => Ok(r.into_inner()),
        Ok(Err(status)) => Err(format!(
            "code = {:?} desc = {}",
            status.code(),
            status.message()
        )),
        Err(_) => Err("no answer within 120s".into()),
    }
}

/// Unpublishes every CSI volume of pod `uid` (found from their
/// `vol_data.json`), removes its directory, and unstages each staged volume
/// no other pod publishes any more. A volume whose driver is not
/// registered stays, and so does the error.
///
/// # Errors
/// The first volume that could not be unpublished or unstaged.
pub async fn tear_down_pod(host: &Host, uid: &str) -> Result<(), String> {
    let plugin_dir = host
        .root
        .join(PODS_DIR)
        .join(uid)
        .join(VOLUMES_DIR)
        .join(PLUGIN_DIR);
    let Ok(entries) = std::fs::read_dir(&plugin_dir) else {
        return Ok(());
    };
    let mut first_error = None;
    for entry in entries.filter_map(Result::ok) {
        let dir = entry.path();
        if let Err(e) = tear_down_volume(host, &dir).await {
            warn!(volume = %dir.display(), error = %e, "CSI volume not torn down");
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Tears down one CSI volume directory.
async fn tear_down_volume(host: &Host, dir: &Path) -> Result<(), String> {
    let data: VolData = match std::fs::read(dir.join(VOL_DATA_FILE)) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: {e}", dir.join(VOL_DATA_FILE).display()))?,
        Err(_) if !is_mounted(&dir.join("mount"))? => {
            // Never published (set-up failed before): nothing to undo but
            // the directories set-up made.
            remove_empty_dir(&dir.join("mount"))?;
            return remove_empty_dir(dir);
        }
        Err(e) => return Err(format!("{}: {e}", dir.join(VOL_DATA_FILE).display())),
    };
    let target = data.target(dir);
    let driver = host.drivers.get(&data.driver_name).ok_or_else(|| {
        format!(
            "driver name {} not found in the list of registered CSI drivers",
            data.driver_name
        )
    })?;
    let channel = crate::cri::unix_channel(driver.endpoint.clone())
        .await
        .map_err(|e| format!("CSI driver {}: {e}", data.driver_name))?;
    let mut node = NodeClient::new(channel);
    let request = NodeUnpublishVolumeRequest {
        volume_id: data.volume_handle.clone(),
        target_path: target.display().to_string(),
    };
    call(node.node_unpublish_volume(request))
        .await
        .map_err(|e| {
            format!(
                "rpc error: NodeUnpublishVolume of {}: {e}",
                data.volume_handle
            )
        })?;
    if is_mounted(&target)? {
        return Err(format!(
            "{} is still mounted after NodeUnpublishVolume",
            target.display()
        ));
    }
    if !data.publish_path.is_empty() {
        // The driver removes the device file; its directory goes once empty.
        remove_file(&target)?;
        if let Some(parent) = target.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
    // What set-up made, each only if empty: never a walk that could cross
    // a mount the driver left below the target.
    remove_file(&dir.join(VOL_DATA_FILE))?;
    remove_empty_dir(&dir.join("mount"))?;
    remove_empty_dir(dir)?;
    info!(
        volume = data.spec_vol_id,
        driver = data.driver_name,
        "CSI volume unpublished"
    );
    if !data.staging_path.is_empty() && !published_elsewhere(&host.root, &data) {
        let request = NodeUnstageVolumeRequest {
            volume_id: data.volume_handle.clone(),
            staging_target_path: data.staging_path.clone(),
        };
        call(node.node_unstage_volume(request)).await.map_err(|e| {
            format!(
                "rpc error: NodeUnstageVolume of {}: {e}",
                data.volume_handle
            )
        })?;
        let _ = std::fs::remove_dir(&data.staging_path);
        info!(
            volume = data.spec_vol_id,
            driver = data.driver_name,
            "CSI volume unstaged"
        );
    }
    Ok(())
}

/// The CSI volumes of the node's pods that were attached, by the unique
/// names the attach/detach controller knows them by
/// (`kubernetes.io/csi/<driver>^<handle>`), sorted, each once: the Node's
/// `status.volumesInUse`, so that none is detached while a pod still has it
/// published (the kubelet's `GetVolumesInUse`).
#[must_use]
pub fn in_use(root: &Path) -> Vec<String> {
    let Ok(pods) = std::fs::read_dir(root.join(PODS_DIR)) else {
        return Vec::new();
    };
    let mut names: Vec<String> = pods
        .filter_map(Result::ok)
        .filter_map(|pod| std::fs::read_dir(pod.path().join(VOLUMES_DIR).join(PLUGIN_DIR)).ok())
        .flat_map(|vols| vols.filter_map(Result::ok))
        .filter_map(|v| std::fs::read(v.path().join(VOL_DATA_FILE)).ok())
        .filter_map(|b| serde_json::from_slice::<VolData>(&b).ok())
        .filter(|d| !d.attachment_id.is_empty())
        .map(|d| format!("kubernetes.io/csi/{}^{}", d.driver_name, d.volume_handle))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Whether another pod's CSI volume of the node uses `data`'s staged volume.
fn published_elsewhere(root: &Path, data: &VolData) -> bool {
    let Ok(pods) = std::fs::read_dir(root.join(PODS_DIR)) else {
        return false;
    };
    pods.filter_map(Result::ok).any(|pod| {
        let plugin_dir = pod.path().join(VOLUMES_DIR).join(PLUGIN_DIR);
        std::fs::read_dir(plugin_dir).is_ok_and(|vols| {
            vols.filter_map(Result::ok).any(|v| {
                std::fs::read(v.path().join(VOL_DATA_FILE))
                    .ok()
                    .and_then(|b| serde_json::from_slice::<VolData>(&b).ok())
                    .is_some_and(|other| {
                        other.driver_name == data.driver_name
                            && other.volume_handle == data.volume_handle
                    })
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake_api::FakeApi;
    use crate::fake_csi::FakeDriver;

    /// A registry with driver `test.csi` served on `socket`.
    fn registered(socket: &Path) -> Drivers {
        let drivers = Drivers::default();
        drivers.set_for_test(crate::plugin_manager::Driver {
            name: "test.csi".into(),
            endpoint: socket.to_path_buf(),
            version: (1, 0, 0),
            node_id: "node-1".into(),
        });
        drivers
    }

    fn pod(name: &str, uid: &str) -> Pod {
        let mut p = crate::fixtures::pod(name).build();
        p.metadata.uid = Some(uid.into());
        p
    }

    /// Usage is asked of the driver for each published volume of the pod
    /// (with its target and staging paths) and reported under the pod
    /// volume's name with its claim; a volume not mounted, or of a driver
    /// not registered, is left out; a negative count is no count.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn usage_of_published_volumes_comes_from_their_drivers() {
        let root = tempfile::tempdir().unwrap();
        let socket = root.path().join("csi.sock");
        let driver = FakeDriver::serve(&socket);
        let drivers = registered(&socket);
        let backing = tempfile::tempdir().unwrap();
        let mut mounted = Vec::new();
        for (dir, driver_name, mount) in [
            ("pv-a", "test.csi", true),
            ("pv-b", "test.csi", false),
            ("pv-c", "gone.csi", true),
        ] {
            let vol = volume_dir(root.path(), "u1", dir);
            let target = vol.join("mount");
            std::fs::create_dir_all(&target).unwrap();
            let data = VolData {
                spec_vol_id: dir.into(),
                volume_handle: format!("h-{dir}"),
                driver_name: driver_name.into(),
                staging_path: "/staged".into(),
                pod_volume_name: format!("vol-{dir}"),
                claim_name: format!("claim-{dir}"),
                ..VolData::default()
            };
            std::fs::write(vol.join(VOL_DATA_FILE), serde_json::to_vec(&data).unwrap()).unwrap();
            if mount {
                rustix::mount::mount_bind(backing.path(), &target).unwrap();
                mounted.push(target);
            }
        }
        let got = usage(&drivers, root.path(), "u1").await;
        for t in &mounted {
            rustix::mount::unmount(t, rustix::mount::UnmountFlags::empty()).unwrap();
        }
        assert_eq!(got.len(), 1, "{got:?}");
        let u = &got[0];
        assert_eq!(u.data.pod_volume_name, "vol-pv-a");
        assert_eq!(u.data.claim_name, "claim-pv-a");
        assert_eq!(
            (u.available_bytes, u.capacity_bytes, u.used_bytes),
            (Some(600), Some(1000), Some(400))
        );
        assert_eq!(
            (u.inodes_free, u.inodes, u.inodes_used),
            (Some(90), Some(100), None)
        );
        let target = volume_dir(root.path(), "u1", "pv-a").join("mount");
        assert_eq!(
            driver.take(),
            vec![format!(
                "stats h-pv-a at {} staged at /staged",
                target.display()
            )]
        );
        assert!(usage(&drivers, root.path(), "other").await.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_volume_is_attached_staged_once_published_per_pod_and_torn_down_from_disk() {
        let root = tempfile::tempdir().unwrap();
        let socket = root.path().join("csi.sock");
        let driver = FakeDriver::serve(&socket);
        let registered = || registered(&socket);
        let api = FakeApi::default();
        let host = Host {
            client: api.client(),
            drivers: registered(),
            root: root.path().to_path_buf(),
            node_name: "n1".into(),
        };
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv1"},
            "spec": {"accessModes": ["ReadWriteMany"],
                "csi": {"driver": "test.csi", "volumeHandle": "h1"}}
        }))
        .unwrap();
        let source = of_persistent_volume(&pv, false).unwrap();
        let (first, second) = (pod("first", "u1"), pod("second", "u2"));

        // Not attached yet: nothing is asked of the driver.
        let err = set_up(&host, &first, &source).await.unwrap_err();
        assert!(err.contains("not attached yet"), "{err}");
        assert_eq!(driver.take(), Vec::<String>::new());
        let attachment = attachment_name("h1", "test.csi", "n1");
        api.put_cluster(
            "volumeattachments",
            &attachment,
            serde_json::json!({"metadata": {"name": attachment},
                "spec": {"attacher": "test.csi", "nodeName": "n1", "source": {"persistentVolumeName": "pv1"}},
                "status": {"attached": true, "attachmentMetadata": {"device": "/dev/x"}}}),
        );
        let mounted = set_up(&host, &first, &source).await.unwrap();
        let staging = staging_path(root.path(), "test.csi", "h1");
        let target = volume_dir(root.path(), "u1", "pv1").join("mount");
        assert_eq!(mounted.host_path, target);
        assert_eq!(
            driver.take(),
            [
                format!(
                    "stage h1 at {} {{\"device\": \"/dev/x\"}}",
                    staging.display()
                ),
                format!(
                    "publish h1 at {} from {} ro=false pod=",
                    target.display(),
                    staging.display()
                ),
            ]
        );
        // A driver that asks for pod details gets them.
        api.put_cluster(
            "csidrivers",
            "test.csi",
            serde_json::json!({"metadata": {"name": "test.csi"},
                "spec": {"attachRequired": true, "podInfoOnMount": true}}),
        );
        set_up(&host, &second, &source).await.unwrap();
        let target2 = volume_dir(root.path(), "u2", "pv1").join("mount");
        let calls = driver.take();
        assert_eq!(
            calls.last().unwrap(),
            &format!(
                "publish h1 at {} from {} ro=false pod=second",
                target2.display(),
                staging.display()
            )
        );

        // Both pods' publications of the attached volume: in use once.
        assert_eq!(in_use(root.path()), ["kubernetes.io/csi/test.csi^h1"]);

        // An agent started anew tears down from what is on disk: the first
        // pod's volume is unpublished, the staging stays for the second.
        let restarted = Host {
            drivers: registered(),
            ..host.clone()
        };
        tear_down_pod(&restarted, "u1").await.unwrap();
        assert_eq!(
            driver.take(),
            [format!("unpublish h1 at {}", target.display())]
        );
        assert!(!target.parent().unwrap().exists());
        tear_down_pod(&restarted, "u2").await.unwrap();
        assert_eq!(
            driver.take(),
            [
                format!("unpublish h1 at {}", target2.display()),
                format!("unstage h1 at {}", staging.display()),
            ]
        );
        assert_eq!(in_use(root.path()), Vec::<String>::new());
        // Without the driver registered, nothing is dropped.
        set_up(&host, &first, &source).await.unwrap();
        driver.take();
        let unregistered = Host {
            drivers: Drivers::default(),
            ..host.clone()
        };
        let err = tear_down_pod(&unregistered, "u1").await.unwrap_err();
        assert!(
            err.contains("not found in the list of registered CSI drivers"),
            "{err}"
        );
        assert!(target.parent().unwrap().join(VOL_DATA_FILE).exists());
    }

    /// A raw block volume is staged and published at the block mapper's
    /// paths with a block capability, handed over as a device, and torn
    /// down from disk.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_block_volume_is_published_as_a_device_file_and_torn_down() {
        let root = tempfile::tempdir().unwrap();
        let socket = root.path().join("csi.sock");
        let driver = FakeDriver::serve(&socket);
        let api = FakeApi::default();
        api.put_cluster(
            "csidrivers",
            "test.csi",
            serde_json::json!({"metadata": {"name": "test.csi"},
                "spec": {"attachRequired": false}}),
        );
        let host = Host {
            client: api.client(),
            drivers: registered(&socket),
            root: root.path().to_path_buf(),
            node_name: "n1".into(),
        };
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pvb"},
            "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Block",
                "csi": {"driver": "test.csi", "volumeHandle": "hb"}}
        }))
        .unwrap();
        let source = of_persistent_volume(&pv, false).unwrap();
        assert!(source.block);
        let mut p = pod("user", "ub");
        p.spec.as_mut().unwrap().security_context =
            Some(serde_json::from_value(serde_json::json!({"fsGroup": 1234})).unwrap());
        let mounted = set_up(&host, &p, &source).await.unwrap();
        let staging = block_staging_path(root.path(), "pvb");
        let device = block_publish_path(root.path(), "pvb", "ub");
        assert_eq!(
            device,
            root.path()
                .join("plugins/kubernetes.io/csi/volumeDevices/publish/pvb/ub")
        );
        assert!(mounted.block && !mounted.read_only);
        assert_eq!(mounted.host_path, device);
        assert!(device.is_file(), "the driver made the device file");
        assert_eq!(
            driver.take(),
            [
                format!("stage hb at {} {{}}", staging.display()),
                format!(
                    "publish hb at {} from {} ro=false pod= block",
                    device.display(),
                    staging.display()
                ),
            ]
        );
        // No fsGroup is applied to a device: its file keeps its group.
        use std::os::unix::fs::MetadataExt as _;
        assert_ne!(std::fs::metadata(&device).unwrap().gid(), 1234);
        let dir = volume_dir(root.path(), "ub", "pvb");
        let data: VolData =
            serde_json::from_slice(&std::fs::read(dir.join(VOL_DATA_FILE)).unwrap()).unwrap();
        assert_eq!(data.target(&dir), device);
        // Its usage is asked of the driver at the device file, once bound.
        let backing = tempfile::NamedTempFile::new().unwrap();
        rustix::mount::mount_bind(backing.path(), &device).unwrap();
        let got = usage(&host.drivers, root.path(), "ub").await;
        rustix::mount::unmount(&device, rustix::mount::UnmountFlags::empty()).unwrap();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].capacity_bytes, Some(1000));
        assert_eq!(
            driver.take(),
            [format!(
                "stats hb at {} staged at {}",
                device.display(),
                staging.display()
            )]
        );
        tear_down_pod(&host, "ub").await.unwrap();
        assert_eq!(
            driver.take(),
            [
                format!("unpublish hb at {}", device.display()),
                format!("unstage hb at {}", staging.display()),
            ]
        );
        assert!(!device.parent().unwrap().exists(), "publish dir removed");
        assert!(!dir.exists());
    }

    /// The pod's fsGroup goes onto the published volume when the
    /// CSIDriver's policy allows it (`File`), and not under `None`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_pods_fs_group_is_applied_as_the_driver_policy_says() {
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        let socket = root.path().join("csi.sock");
        let _driver = FakeDriver::serve(&socket);
        let drivers = registered(&socket);
        let api = FakeApi::default();
        let host = Host {
            client: api.client(),
            drivers,
            root: root.path().to_path_buf(),
            node_name: "n1".into(),
        };
        let v: Volume = serde_json::from_value(serde_json::json!({
            "name": "scratch", "csi": {"driver": "test.csi"}
        }))
        .unwrap();
        for (uid, policy, changed) in [("u1", "File", true), ("u2", "None", false)] {
            api.put_cluster(
                "csidrivers",
                "test.csi",
                serde_json::json!({"metadata": {"name": "test.csi"},
                    "spec": {"attachRequired": false, "fsGroupPolicy": policy,
                        "volumeLifecycleModes": ["Ephemeral"]}}),
            );
            let mut p = pod("web", uid);
            if let Some(spec) = p.spec.as_mut() {
                spec.security_context =
                    Some(serde_json::from_value(serde_json::json!({"fsGroup": 4321})).unwrap());
            }
            let mounted = set_up(&host, &p, &of_inline(&p, &v).unwrap())
                .await
                .unwrap();
            let meta = std::fs::metadata(&mounted.host_path).unwrap();
            assert_eq!(meta.gid() == 4321, changed, "{policy}");
            assert_eq!(meta.mode() & 0o2000 != 0, changed, "{policy}: setgid");
        }
        let mut inline = of_inline(&pod("web", "u3"), &v).unwrap();
        assert!(!applies_fs_group(&inline, None), "no filesystem type");
        inline.fs_type = "ext4".into();
        assert!(
            applies_fs_group(&inline, None),
            "inline volumes are ReadWriteOnce"
        );
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv1"},
            "spec": {"accessModes": ["ReadWriteMany"],
                "csi": {"driver": "test.csi", "volumeHandle": "h1", "fsType": "ext4"}}
        }))
        .unwrap();
        let many = of_persistent_volume(&pv, false).unwrap();
        assert!(!applies_fs_group(&many, None), "not ReadWriteOnce");
        assert!(applies_fs_group(&many, Some("File")));
        let read_only = of_persistent_volume(&pv, true).unwrap();
        assert!(!applies_fs_group(&read_only, Some("File")));
    }

    #[test]
    fn lifecycle_modes_are_the_csi_drivers() {
        let v: Volume = serde_json::from_value(serde_json::json!({
            "name": "scratch", "csi": {"driver": "test.csi"}
        }))
        .unwrap();
        let inline = of_inline(&pod("web", "u1"), &v).unwrap();
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv1"},
            "spec": {"csi": {"driver": "test.csi", "volumeHandle": "h1"}}
        }))
        .unwrap();
        let persistent = of_persistent_volume(&pv, false).unwrap();
        let driver = |modes: serde_json::Value| -> CSIDriver {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "test.csi"}, "spec": {"volumeLifecycleModes": modes}
            }))
            .unwrap()
        };
        assert!(lifecycle_mode_allowed(None, &persistent).is_ok());
        assert_eq!(
            lifecycle_mode_allowed(None, &inline).unwrap_err(),
            "volume mode \"Ephemeral\" not supported by driver test.csi (no CSIDriver object)"
        );
        let listed = driver(serde_json::json!(["Ephemeral"]));
        assert!(lifecycle_mode_allowed(Some(&listed), &inline).is_ok());
        assert!(lifecycle_mode_allowed(Some(&listed), &persistent).is_err());
        let default = driver(serde_json::Value::Null);
        assert!(lifecycle_mode_allowed(Some(&default), &persistent).is_ok());
        assert!(lifecycle_mode_allowed(Some(&default), &inline).is_err());
    }

    #[test]
    fn inline_volumes_get_the_kubelets_handle_and_names() {
        let p = pod("web", "u1");
        let v: Volume = serde_json::from_value(serde_json::json!({
            "name": "scratch", "csi": {"driver": "test.csi", "readOnly": true}
        }))
        .unwrap();
        let s = of_inline(&p, &v).unwrap();
        assert!(s.ephemeral && s.read_only);
        assert_eq!(s.volume_handle, format!("csi-{}", sha256_hex("u1scratch")));
        assert_eq!(s.spec_name, "scratch");
        assert_eq!(
            attachment_name("h", "d", "n"),
            format!("csi-{}", sha256_hex("hdn"))
        );
    }
}
