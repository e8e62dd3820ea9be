//! The volume manager: the kubelet's volumemanager and its in-tree plugins for
//! a node without a cloud (pkg/kubelet/volumemanager, pkg/volume/*).
//!
//! Each pod volume lives at `<root-dir>/pods/<uid>/volumes/<plugin>/<name>`
//! with the kubelet's plugin directory names; hostPath volumes are the host
//! path itself. The pod worker calls [`VolumeManager::setup`] before it starts
//! a pod's sandbox or containers, and on every later sync of a running pod
//! (which refreshes configMap, secret, downwardAPI and projected contents when
//! their sources change); [`mounts::container_mounts`] turns a container's
//! `volumeMounts` into CRI mounts (a subPath as a bind mount under
//! `<root-dir>/pods/<uid>/volume-subpaths`, [`subpath`]);
//! [`VolumeManager::teardown`] unmounts those, then the volumes, and removes
//! the pod's directory when the pod is gone.
//!
//! Config maps, secrets and service account tokens are read one object at a
//! time (`GET`, and `POST serviceaccounts/<sa>/token`), the only access the
//! Node authorizer grants a node for the pods bound to it; objects are cached
//! for [`OBJECT_TTL`], tokens until 80 % of their lifetime.

pub mod atomic_writer;
pub mod claim;
pub mod configmap;
pub mod csi;
pub mod downward_api;
pub mod empty_dir;
pub mod host_path;
pub mod mount;
pub mod mounts;
pub mod ownership;
pub mod pod_certificate;
pub mod projected;
pub mod remove;
pub mod secret;
pub mod subpath;
pub mod token;
pub mod tree;
pub mod trust_bundle;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Volume};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use kube::runtime::reflector::Store;
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use tracing::{debug, info, warn};

pub use mounts::{
    ContainerMounts, ImageVolumes, MountedVolume, PodVolumes, container_devices, container_mounts,
};

use atomic_writer::Payload;
use empty_dir::Medium;
use token::{TokenKey, TokenManager};

/// File mode of projected files when the source sets no `defaultMode` (0644,
/// the API default).
pub const DEFAULT_MODE: i32 = 0o644;
/// How long a config map or secret read from the API server is reused (5 s).
pub const OBJECT_TTL: Duration = Duration::from_secs(5);
/// Directory of pod directories under the root dir.
pub const PODS_DIR: &str = "pods";
/// Directory of volumes in a pod directory.
pub const VOLUMES_DIR: &str = "volumes";

/// A volume that could not be set up, or a pod directory that could not be removed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A config map or secret the volume needs does not exist (and is not optional).
    #[error("{kind} \"{name}\" not found")]
    NotFound {
        /// `configmap` or `secret`.
        kind: &'static str,
        /// The object's name.
        name: String,
    },
    /// An API call failed.
    #[error("{what}: {}", api_message(source))]
    Api {
        /// What was being done (`get configmap "x"`).
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The volume's contents cannot be computed (a missing key, a bad field).
    #[error("{0}")]
    Payload(String),
    /// A hostPath type check failed.
    #[error("{0}")]
    HostPath(String),
    /// A container's volume mount cannot be made.
    #[error("{0}")]
    Mount(String),
    /// The volume type or projection is not supported by this node.
    #[error("{0}")]
    Unsupported(String),
    /// A volume's claim could not be resolved to its PersistentVolume
    /// (`error processing PVC <ns>/<name>: …`): the volume is not processed
    /// at all, as the kubelet's populator leaves it out.
    #[error("{0}")]
    Claim(String),
    /// A CSI driver could not set the volume up (or is not registered).
    #[error("{0}")]
    Csi(String),
    /// A PersistentVolume's node affinity does not match this node.
    #[error("NodeAffinity check failed: {0}")]
    NodeAffinity(&'static str),
    /// Writing the volume's files failed.
    #[error(transparent)]
    Writer(#[from] atomic_writer::Error),
    /// A filesystem or mount operation failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A subPath bind mount could not be cleaned up.
    #[error(transparent)]
    SubPath(#[from] subpath::Error),
    /// Several sources of one volume failed.
    #[error("[{}]", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    Multiple(Vec<Error>),
}

/// Result of a volume operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The API server's message of an API error (`configmaps "x" is forbidden: …`).
fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if !s.message.is_empty() => s.message.clone(),
        other => other.to_string(),
    }
}

/// `None` for no errors, the error for one, [`Error::Multiple`] for more (Go's
/// `NewAggregate`).
fn aggregate(mut errors: Vec<Error>) -> Option<Error> {
    match errors.len() {
        0 => None,
        1 => errors.pop(),
        _ => Some(Error::Multiple(errors)),
    }
}

/// A UID field (`user`, `defaultUser`) as a UID, if it is one.
fn to_uid(user: Option<i64>) -> Option<u32> {
    user.and_then(|u| u32::try_from(u).ok())
}

/// A file's mode from a `defaultMode` or `mode` field: the permission bits
/// (0777) of the `int32`'s two's-complement value, as the kubelet's
/// `os.FileMode(mode)` conversion keeps them. The API admits only 0–0777;
/// whatever else a spec holds never sets setuid, setgid or sticky bits (its
/// absolute value used to: `-1` was mode 0001, `0o4755` setuid).
fn file_mode(mode: i32) -> u32 {
    mode.cast_unsigned() & 0o777
}

/// An emptyDir directory's mode from its `mode` field: the permission and
/// sticky bits (01777, the range the API admits) of the two's-complement
/// value, as [`file_mode`].
fn dir_mode(mode: i32) -> u32 {
    mode.cast_unsigned() & 0o1777
}

/// The pod's directory: `<root>/pods/<uid>`.
#[must_use]
pub fn pod_dir(root: &Path, uid: &str) -> PathBuf {
    root.join(PODS_DIR).join(uid)
}

/// A volume's directory: `<root>/pods/<uid>/volumes/<plugin>/<name>`.
#[must_use]
pub fn volume_dir(root: &Path, uid: &str, plugin: &str, name: &str) -> PathBuf {
    pod_dir(root, uid).join(VOLUMES_DIR).join(plugin).join(name)
}

/// What the API server answered for the objects and tokens a pod's volumes
/// read, by name (`Ok(None)`: not found; `Err`: the error's message). Its
/// `Debug` shows names only, never Secret data nor tokens.
#[derive(Clone, Default)]
pub struct Fetched {
    /// Config maps by name.
    pub config_maps: BTreeMap<String, Result<Option<Arc<ConfigMap>>, String>>,
    /// Secrets by name.
    pub secrets: BTreeMap<String, Result<Option<Arc<Secret>>, String>>,
    /// Service account tokens by request.
    pub tokens: HashMap<TokenKey, Result<String, String>>,
    /// ClusterTrustBundle anchors by request: `None` when no bundle matches.
    pub trust_bundles: BTreeMap<trust_bundle::TrustKey, Result<Option<Vec<u8>>, String>>,
    /// `podCertificate` credentials by (volume name, source index).
    pub pod_certificates: BTreeMap<(String, usize), Result<pod_certificate::Credentials, String>>,
    /// Warning Events the reads owe the pod: (reason, message).
    pub notices: Vec<pod_certificate::Notice>,
    /// The claims of claim volumes, by volume name: the claim and its bound
    /// volume, and whether the volume is yet to be set up for the pod the
    /// first time; `Err`: why not ([`claim::resolve`]).
    pub claims: BTreeMap<String, Result<(Arc<claim::Bound>, bool), String>>,
    /// Volumes set up apart (CSI volumes, by their driver): left out of the
    /// set-up of the others.
    pub apart: BTreeSet<String>,
}

/// The Node a pod's volumes are set up on: its name and labels (for the
/// node affinity of PersistentVolumes).
#[derive(Clone, Debug, Default)]
pub struct NodeIdentity {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels` (empty while the Node is not listed).
    pub labels: BTreeMap<String, String>,
}

fn found<T: Clone>(
    kind: &'static str,
    name: &str,
    optional: bool,
    entry: Option<&Result<Option<T>, String>>,
) -> Result<Option<T>> {
    match entry {
        Some(Ok(Some(obj))) => Ok(Some(obj.clone())),
        Some(Ok(None)) if optional => Ok(None),
        Some(Ok(None)) => Err(Error::NotFound {
            kind,
            name: name.to_string(),
        }),
        Some(Err(message)) => Err(Error::Payload(message.clone())),
        None => Err(Error::Payload(format!("{kind} \"{name}\" was not read"))),
    }
}

impl std::fmt::Debug for Fetched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fetched")
            .field("config_maps", &self.config_maps.keys().collect::<Vec<_>>())
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .field("tokens", &self.tokens.keys().collect::<Vec<_>>())
            .field(
                "trust_bundles",
                &self.trust_bundles.keys().collect::<Vec<_>>(),
            )
            .field("claims", &self.claims.keys().collect::<Vec<_>>())
            .field(
                "pod_certificates",
                &self.pod_certificates.keys().collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Fetched {
    /// The config map `name`: `None` when it is missing and `optional`.
    ///
    /// # Errors
    /// [`Error::NotFound`] when missing and not optional; the read's error otherwise.
    pub fn config_map(&self, name: &str, optional: bool) -> Result<Option<Arc<ConfigMap>>> {
        found("configmap", name, optional, self.config_maps.get(name))
    }

    /// The secret `name`: `None` when it is missing and `optional`.
    ///
    /// # Errors
    /// [`Error::NotFound`] when missing and not optional; the read's error otherwise.
    pub fn secret(&self, name: &str, optional: bool) -> Result<Option<Arc<Secret>>> {
        found("secret", name, optional, self.secrets.get(name))
    }

    /// The token for `key`.
    ///
    /// # Errors
    /// The token request's error.
    pub fn token(&self, key: &TokenKey) -> Result<String> {
        match self.tokens.get(key) {
            Some(Ok(t)) => Ok(t.clone()),
            Some(Err(message)) => Err(Error::Payload(message.clone())),
            None => Err(Error::Payload(format!(
                "token for service account \"{}\" was not requested",
                key.service_account
            ))),
        }
    }
}

/// The names of the config maps, secrets and tokens `volumes` read.
#[must_use]
pub fn references(pod: &Pod) -> (BTreeSet<String>, BTreeSet<String>, Vec<TokenKey>) {
    let (mut cms, mut secrets, mut tokens) = (BTreeSet::new(), BTreeSet::new(), Vec::new());
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        if let Some(cm) = &v.config_map {
            cms.insert(cm.name.clone());
        }
        if let Some(name) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            secrets.insert(name);
        }
        for p in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(cm) = &p.config_map {
                cms.insert(cm.name.clone());
            }
            if let Some(s) = &p.secret {
                secrets.insert(s.name.clone());
            }
            if let Some(t) = &p.service_account_token {
                let key = projected::token_key(pod, t);
                if !tokens.contains(&key) {
                    tokens.push(key);
                }
            }
        }
    }
    (cms, secrets, tokens)
}

/// Cached objects by (namespace, name), with when they were read.
type Entries<K> = HashMap<(String, String), (Instant, Arc<K>)>;

/// Namespaced objects read with `GET` and reused for [`OBJECT_TTL`] (found ones only).
struct ObjectCache<K> {
    entries: Mutex<Entries<K>>,
}

impl<K> Default for ObjectCache<K> {
    fn default() -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<K> ObjectCache<K>
where
    K: kube::Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Debug,
{
    fn lock(&self) -> std::sync::MutexGuard<'_, Entries<K>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn get(
        &self,
        client: &Client,
        ns: &str,
        name: &str,
    ) -> Result<Option<Arc<K>>, kube::Error> {
        let key = (ns.to_string(), name.to_string());
        if let Some((at, v)) = self.lock().get(&key)
            && at.elapsed() < OBJECT_TTL
        {
            return Ok(Some(v.clone()));
        }
        let api: Api<K> = Api::namespaced(client.clone(), ns);
        let value = api.get_opt(name).await?.map(Arc::new);
        let mut entries = self.lock();
        entries.retain(|_, (at, _)| at.elapsed() < OBJECT_TTL * 12);
        // "Not found" is not kept: a pod waiting for the object starts as soon as it exists.
        match &value {
            Some(v) => entries.insert(key, (Instant::now(), v.clone())),
            None => entries.remove(&key),
        };
        Ok(value)
    }
}

/// The outcome of setting up a pod's volumes.
#[derive(Debug, Default)]
pub struct SetupOutcome {
    /// The volumes containers can mount: set up now, or earlier when a refresh failed.
    pub volumes: PodVolumes,
    /// The volumes that failed, with why (each one a `FailedMount` event).
    pub errors: Vec<(String, Error)>,
    /// Other Warning Events the setup owes the pod: (reason, message).
    pub notices: Vec<pod_certificate::Notice>,
}

impl SetupOutcome {
    /// The pod's volumes that are not mounted: while there are any, the pod's
    /// sandbox and containers must not start (the kubelet's `WaitForAttachAndMount`).
    #[must_use]
    pub fn unmounted(&self, pod: &Pod) -> Vec<String> {
        pod.spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .filter(|v| !self.volumes.contains_key(&v.name))
            .map(|v| v.name.clone())
            .collect()
    }
}

/// The volume manager; one per agent, shared by every pod worker.
pub struct VolumeManager {
    client: Client,
    root_dir: PathBuf,
    allocatable: BTreeMap<String, ApiQuantity>,
    config_maps: ObjectCache<ConfigMap>,
    secrets: ObjectCache<Secret>,
    tokens: TokenManager,
    trust_bundles: trust_bundle::TrustBundles,
    /// Claims resolved, by pod UID and volume name: a claim's binding does
    /// not change, so each is read once per pod (as the kubelet's populator
    /// processes a pod's volumes once); with whether its volume was set up.
    claims: Mutex<ResolvedClaims>,
    /// CSI volumes: the drivers and the node (None: no CSI volume is set up).
    csi: Option<csi::Host>,
    /// The credentials of `podCertificate` sources.
    pod_certificates: pod_certificate::PodCertificateManager,
    /// The Node's name, for `podCertificate` requests ([`VolumeManager::with_csi`]).
    node_name: String,
}

/// Claims resolved, by (pod UID, volume name): the claim and its volume,
/// and whether the volume was set up for the pod.
type ResolvedClaims = HashMap<(String, String), (Arc<claim::Bound>, bool)>;

impl VolumeManager {
    /// A volume manager keeping pod directories under `root_dir`, reading
    /// objects with `client` (the node's credentials). `allocatable` is the
    /// node's allocatable resources, for resource fields and tmpfs sizes.
    #[must_use]
    pub fn new(
        client: Client,
        root_dir: impl Into<PathBuf>,
        allocatable: BTreeMap<String, ApiQuantity>,
    ) -> Self {
        Self {
            client,
            root_dir: root_dir.into(),
            allocatable,
            config_maps: ObjectCache::default(),
            secrets: ObjectCache::default(),
            tokens: TokenManager::default(),
            trust_bundles: trust_bundle::TrustBundles::default(),
            claims: Mutex::new(HashMap::new()),
            csi: None,
            pod_certificates: pod_certificate::PodCertificateManager::default(),
            node_name: String::new(),
        }
    }

    /// This manager, setting up CSI volumes with the drivers registered in
    /// `drivers`, for the Node named `node_name` (also the Node its
    /// `podCertificate` requests name).
    #[must_use]
    pub fn with_csi(mut self, drivers: crate::plugin_manager::Drivers, node_name: &str) -> Self {
        self.node_name = node_name.to_string();
        self.csi = Some(csi::Host {
            client: self.client.clone(),
            drivers,
            root: self.root_dir.clone(),
            node_name: node_name.to_string(),
        });
        self
    }

    /// The root dir pod directories are under.
    #[must_use]
    pub fn root_dir(&self) -> &Path {
        &self.root_dir
    }

    /// Reads the objects and tokens the pod's volumes need.
    pub async fn fetch(&self, pod: &Pod) -> Fetched {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let (cms, secrets, tokens) = references(pod);
        let mut fetched = Fetched::default();
        for name in cms {
            let got = self.config_maps.get(&self.client, &ns, &name).await;
            let got = got.map_err(|source| {
                Error::Api {
                    what: format!("get configmap \"{name}\""),
                    source,
                }
                .to_string()
            });
            fetched.config_maps.insert(name, got);
        }
        for name in secrets {
            let got = self.secrets.get(&self.client, &ns, &name).await;
            let got = got.map_err(|source| {
                Error::Api {
                    what: format!("get secret \"{name}\""),
                    source,
                }
                .to_string()
            });
            fetched.secrets.insert(name, got);
        }
        for key in tokens {
            let got = self.tokens.get(&self.client, &key).await;
            fetched.tokens.insert(key, got.map_err(|e| e.to_string()));
        }
        for key in trust_bundle::references(pod) {
            let got = self.trust_bundles.get(&self.client, &key).await;
            fetched.trust_bundles.insert(key, got);
        }
        for (volume, index, source) in pod_certificate::sources(pod) {
            let (got, notices) = self
                .pod_certificates
                .get(&self.client, &self.node_name, pod, &volume, index, &source)
                .await;
            fetched.pod_certificates.insert((volume, index), got);
            fetched.notices.extend(notices);
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let Some(c) = claim::claim_of(pod, v) else {
                continue;
            };
            let key = (uid.clone(), v.name.clone());
            let known = self.claims_lock().get(&key).cloned();
            let got = match known {
                Some((bound, set_up)) => Ok((bound, !set_up)),
                None => claim::resolve(&self.client, pod, &c).await.map(|bound| {
                    let bound = Arc::new(bound);
                    self.claims_lock().insert(key, (bound.clone(), false));
                    (bound, true)
                }),
            };
            fetched.claims.insert(v.name.clone(), got);
        }
        fetched
    }

    fn claims_lock(&self) -> std::sync::MutexGuard<'_, ResolvedClaims> {
        self.claims
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sets up `pod`'s CSI volumes (inline ones, and claims bound to CSI
    /// PersistentVolumes whose node affinity matches `node`), by volume
    /// name; none when CSI is not set up for this manager.
    async fn set_up_csi(
        &self,
        pod: &Pod,
        node: &NodeIdentity,
        fetched: &Fetched,
    ) -> BTreeMap<String, Result<MountedVolume>> {
        let mut out = BTreeMap::new();
        for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
            let source = match claim::claim_of(pod, v) {
                Some(c) => match fetched.claims.get(&v.name) {
                    Some(Ok((bound, _))) => {
                        let Some(mut source) =
                            csi::of_persistent_volume(&bound.volume, c.read_only)
                        else {
                            continue;
                        };
                        if let Err(e) = check_volume_mode(pod, &v.name, source.block) {
                            out.insert(v.name.clone(), Err(e));
                            continue;
                        }
                        source.pod_volume.clone_from(&v.name);
                        source.claim = Some(c.name.clone());
                        if let Err(e) =
                            claim::check_node_affinity(&bound.volume, &node.name, &node.labels)
                        {
                            out.insert(v.name.clone(), Err(Error::NodeAffinity(e)));
                            continue;
                        }
                        source
                    }
                    _ => continue,
                },
                None => match csi::of_inline(pod, v) {
                    Some(_) if uses(pod, &v.name).1 => {
                        let e = mode_mismatch(&v.name, "Filesystem", "volumeDevices");
                        out.insert(v.name.clone(), Err(e));
                        continue;
                    }
                    Some(source) => source,
                    None => continue,
                },
            };
            let result = match &self.csi {
                Some(host) => csi::set_up(host, pod, &source).await.map_err(Error::Csi),
                None => Err(Error::Unsupported(format!(
                    "volume {:?}: CSI volumes are not supported by this node",
                    v.name
                ))),
            };
            out.insert(v.name.clone(), result);
        }
        out
    }

    /// Forgets what was read for pod `uid` (its tokens and claims).
    fn forget_pod(&self, uid: &str) {
        self.tokens.forget_pod(uid);
        self.pod_certificates.forget_pod(uid);
        self.claims_lock().retain(|(u, _), _| u != uid);
    }

    /// Sets up (or refreshes) every volume of `pod` on `node`, as the
    /// kubelet's `MountVolume.SetUp` for each plugin. Never fails as a
    /// whole: each volume's error is in the outcome.
    pub async fn setup(&self, pod: &Pod, node: &NodeIdentity) -> SetupOutcome {
        let mut fetched = self.fetch(pod).await;
        let notices = std::mem::take(&mut fetched.notices);
        let csi = self.set_up_csi(pod, node, &fetched).await;
        fetched.apart = csi.keys().cloned().collect();
        let pod = pod.clone();
        let root = self.root_dir.clone();
        let allocatable = self.allocatable.clone();
        let node = node.clone();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let set_up = move || set_up_all(&root, &pod, &fetched, &allocatable, &node);
        let outcome = tokio::task::spawn_blocking(set_up).await;
        if let Ok(outcome) = &outcome {
            // Claim volumes set up once: later syncs only check them.
            let mut claims = self.claims_lock();
            for ((u, volume), (_, set_up)) in claims.iter_mut() {
                if *u == uid && outcome.volumes.contains_key(volume) {
                    *set_up = true;
                }
            }
        }
        match outcome {
            Ok(mut outcome) => {
                outcome.notices = notices;
                for (volume, result) in csi {
                    match result {
                        Ok(mounted) => {
                            outcome.volumes.insert(volume, mounted);
                        }
                        Err(e) => outcome.errors.push((volume, e)),
                    }
                }
                outcome
            }
            Err(e) => SetupOutcome {
                volumes: PodVolumes::new(),
                errors: vec![(
                    String::new(),
                    Error::Payload(format!("volume setup task failed: {e}")),
                )],
                notices,
            },
        }
    }

    /// Unmounts the pod's subPath bind mounts, then everything else under the
    /// pod's directory, and removes it, and forgets the pod's tokens (the
    /// kubelet's volume teardown with `CleanSubPaths`, and
    /// `cleanupOrphanedPodDirs`). A pod without a directory is fine.
    ///
    /// # Errors
    /// [`Error::SubPath`] or [`Error::Io`] when a mount cannot be undone or
    /// the directory removed; nothing is removed while a mount is left.
    pub async fn teardown(&self, uid: &str) -> Result<()> {
        self.tear_down_csi(uid).await?;
        let dir = pod_dir(&self.root_dir, uid);
        self.forget_pod(uid);
        let task = tokio::task::spawn_blocking(move || tear_down_pod_dir(&dir));
        match task.await {
            Ok(r) => r,
            Err(e) => Err(Error::Payload(format!("volume teardown task failed: {e}"))),
        }
    }

    /// Unpublishes (and unstages when unused) pod `uid`'s CSI volumes.
    ///
    /// # Errors
    /// [`Error::Csi`]: a volume is left (its driver is not registered, or
    /// refused).
    async fn tear_down_csi(&self, uid: &str) -> Result<()> {
        match &self.csi {
            Some(host) => csi::tear_down_pod(host, uid).await.map_err(Error::Csi),
            None => Ok(()),
        }
    }

    /// True while pod `uid` has a volumes directory (its volumes are set up,
    /// or not torn down yet), as the kubelet's `podVolumesExist`.
    #[must_use]
    pub fn volumes_exist(&self, uid: &str) -> bool {
        std::fs::symlink_metadata(pod_dir(&self.root_dir, uid).join(VOLUMES_DIR)).is_ok()
    }

    /// Unmounts and removes the subPath bind mounts and the volumes of a pod
    /// that has finished (its `volume-subpaths` and `volumes` directories; the
    /// pod directory stays until the pod is gone), as the kubelet does for
    /// terminated pods. Cheap when already done.
    ///
    /// # Errors
    /// As [`VolumeManager::teardown`].
    pub async fn teardown_volumes(&self, uid: &str) -> Result<()> {
        let pod = pod_dir(&self.root_dir, uid);
        let dir = pod.join(VOLUMES_DIR);
        let subpaths = crate::paths::volume_subpaths_dir(&pod);
        if std::fs::symlink_metadata(&dir).is_err() && std::fs::symlink_metadata(&subpaths).is_err()
        {
            return Ok(());
        }
        self.tear_down_csi(uid).await?;
        self.forget_pod(uid);
        let task = tokio::task::spawn_blocking(move || {
            clean_sub_paths(&pod)?;
            remove_pod_dir(&dir)
        });
        match task.await {
            Ok(r) => r,
            Err(e) => Err(Error::Payload(format!("volume teardown task failed: {e}"))),
        }
    }

    /// Tears down the directories of pods that are not in `store` (the pods
    /// bound to this node) and that `keep` does not keep (the housekeeping's
    /// pods the runtime still has); returns how many were removed. The
    /// directories are listed before the store is read, so a pod that has
    /// just arrived (and whose directory is being made) is never taken for an
    /// orphan.
    pub async fn cleanup_orphans(&self, store: &Store<Pod>, keep: impl Fn(&str) -> bool) -> usize {
        let pods = self.root_dir.join(PODS_DIR);
        let Ok(entries) = std::fs::read_dir(&pods) else {
            return 0;
        };
        let dirs: Vec<String> = entries
            .filter_map(std::result::Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let known: HashSet<String> = store
            .state()
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        let orphans: Vec<String> = dirs
            .into_iter()
            .filter(|uid| !known.contains(uid) && !keep(uid))
            .collect();
        let mut removed = 0;
        for uid in orphans {
            match self.teardown(&uid).await {
                Ok(()) => {
                    info!(
                        pod_uid = uid,
                        "removed the directory of a pod no longer bound to this node"
                    );
                    removed += 1;
                }
                Err(e) => warn!(pod_uid = uid, error = %e, "remove orphaned pod directory"),
            }
        }
        removed
    }
}

/// Unmounts and removes the subPath bind mounts of the pod in `pod_dir`
/// ([`subpath::clean_sub_paths`]), before its volumes go, as the kubelet
/// cleans a volume's subPaths before unmounting it.
fn clean_sub_paths(pod_dir: &Path) -> Result<()> {
    subpath::clean_sub_paths(pod_dir)?;
    Ok(())
}

/// Tears down a pod's directory: its subPath bind mounts, then the other
/// mounts the agent made under it, then the directory ([`remove_pod_dir`]).
fn tear_down_pod_dir(dir: &Path) -> Result<()> {
    clean_sub_paths(dir)?;
    remove_pod_dir(dir)
}

/// True for a mount point the agent makes: a volume
/// (`pods/<uid>/volumes/<plugin>/<name>`) or a subPath bind mount
/// (`pods/<uid>/volume-subpaths/<volume>/<container>/<index>`).
fn made_by_agent(p: &Path) -> bool {
    let c: Vec<&std::ffi::OsStr> = p.components().map(|c| c.as_os_str()).collect();
    let at = |back: usize| c.len().checked_sub(back).and_then(|i| c.get(i)).copied();
    (at(3) == Some(VOLUMES_DIR.as_ref()) && at(5) == Some(PODS_DIR.as_ref()))
        || (at(4) == Some(crate::paths::VOLUME_SUBPATHS_DIR.as_ref())
            && at(6) == Some(PODS_DIR.as_ref()))
}

/// Removes a pod's directory (or its `volumes` directory) as the kubelet's
/// `cleanupOrphanedPodDirs`: the mounts the agent made under it are undone
/// first (a busy one detached); then, if no mount is left, the tree is
/// removed without following a link or crossing onto another filesystem
/// ([`remove::remove_all_one_filesystem`]). A mount the agent did not make
/// (one a container propagated, or someone else's) is left alone and keeps
/// the directory.
fn remove_pod_dir(dir: &Path) -> Result<()> {
    if std::fs::symlink_metadata(dir).is_err() {
        return Ok(());
    }
    let io = |op: &'static str| {
        let path = dir.to_path_buf();
        move |source| Error::Io { op, path, source }
    };
    let mounts = || {
        std::fs::read_to_string("/proc/self/mountinfo")
            .map(|t| mount::mounts_under(&t, dir))
            .map_err(io("read mountinfo for"))
    };
    for p in mounts()?.iter().filter(|p| made_by_agent(p)) {
        if let Err(e) = rustix::mount::unmount(p, rustix::mount::UnmountFlags::empty()) {
            warn!(path = %p.display(), error = %e, "unmount failed; detaching");
            rustix::mount::unmount(p, rustix::mount::UnmountFlags::DETACH).map_err(|e| {
                Error::Io {
                    op: "unmount",
                    path: p.clone(),
                    source: e.into(),
                }
            })?;
        }
    }
    if let Some(p) = mounts()?.first() {
        return Err(Error::Io {
            op: "still mounted:",
            path: p.clone(),
            source: std::io::Error::other("a mount the agent did not make; not removed"),
        });
    }
    remove::remove_all_one_filesystem(dir).map_err(io("remove"))
}

pub(crate) fn fs_group(pod: &Pod) -> Option<u32> {
    pod.spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|sc| sc.fs_group)
        .and_then(|g| u32::try_from(g).ok())
}

/// Whether any container of `pod` (init, main or ephemeral) names volume
/// `name` in its `volumeMounts` (first) and in its `volumeDevices`
/// (second).
fn uses(pod: &Pod, name: &str) -> (bool, bool) {
    let Some(spec) = pod.spec.as_ref() else {
        return (false, false);
    };
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .map(|c| (c.volume_mounts.as_deref(), c.volume_devices.as_deref()));
    let ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|c| (c.volume_mounts.as_deref(), c.volume_devices.as_deref()));
    containers
        .chain(ephemeral)
        .fold((false, false), |(m, d), (mounts, devices)| {
            (
                m || mounts.unwrap_or_default().iter().any(|x| x.name == name),
                d || devices.unwrap_or_default().iter().any(|x| x.name == name),
            )
        })
}

/// The kubelet's refusal of a volume of `mode` named where that mode cannot
/// go (`volumeMounts` or `volumeDevices`).
fn mode_mismatch(name: &str, mode: &str, field: &str) -> Error {
    Error::Unsupported(format!(
        "volume {name} has volumeMode {mode}, but is specified in {field}"
    ))
}

/// Checks that claim volume `name` (`block`: `volumeMode: Block`) is named
/// only where its mode goes, as the kubelet's volume manager checks it.
fn check_volume_mode(pod: &Pod, name: &str, block: bool) -> Result<()> {
    let (mounted, device) = uses(pod, name);
    if block && mounted {
        return Err(mode_mismatch(name, "Block", "volumeMounts"));
    }
    if !block && device {
        return Err(mode_mismatch(name, "Filesystem", "volumeDevices"));
    }
    Ok(())
}

/// The pod's `securityContext.fsGroupChangePolicy`.
pub(crate) fn fs_group_change_policy(pod: &Pod) -> Option<&str> {
    pod.spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|sc| sc.fs_group_change_policy.as_deref())
}

/// Sets up every volume of `pod` (blocking filesystem work).
fn set_up_all(
    root: &Path,
    pod: &Pod,
    fetched: &Fetched,
    allocatable: &BTreeMap<String, ApiQuantity>,
    node: &NodeIdentity,
) -> SetupOutcome {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let mut outcome = SetupOutcome::default();
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    for v in volumes.filter(|v| !fetched.apart.contains(&v.name)) {
        let set_up = match claim::claim_of(pod, v) {
            Some(c) => set_up_claim(pod, v, &c, fetched, node).map_err(|e| (e, None)),
            // Only a claim's volume can be a block device.
            None if uses(pod, &v.name).1 => {
                Err((mode_mismatch(&v.name, "Filesystem", "volumeDevices"), None))
            }
            None => set_up_volume(root, &uid, pod, v, fetched, allocatable),
        };
        match set_up {
            Ok(mounted) => {
                outcome.volumes.insert(v.name.clone(), mounted);
            }
            Err((e, still_usable)) => {
                debug!(volume = v.name, error = %e, "volume setup failed");
                if let Some(mounted) = still_usable {
                    outcome.volumes.insert(v.name.clone(), mounted);
                }
                outcome.errors.push((v.name.clone(), e));
            }
        }
    }
    outcome
}

/// A volume of claim `c`: the PersistentVolume bound to it, used where it
/// is (the kubelet's hostPath and local plugins): a `hostPath` volume's
/// path, type-checked; a `local` volume's path, which must exist, with the
/// pod's `fsGroup` applied when it is first set up for the pod, unless it
/// is read-only. The volume's node
/// affinity must match `node`; a `Block` volume cannot be mounted; other
/// volume types are not supported here.
fn set_up_claim(
    pod: &Pod,
    v: &Volume,
    c: &claim::ClaimRef,
    fetched: &Fetched,
    node: &NodeIdentity,
) -> Result<MountedVolume> {
    let (bound, first) = match fetched.claims.get(&v.name) {
        Some(Ok((bound, first))) => (bound, *first),
        Some(Err(message)) => return Err(Error::Claim(message.clone())),
        None => return Err(Error::Claim(format!("claim {:?} was not read", c.name))),
    };
    let pv = &bound.volume;
    claim::check_node_affinity(pv, &node.name, &node.labels).map_err(Error::NodeAffinity)?;
    let spec = pv.spec.clone().unwrap_or_default();
    let block = spec.volume_mode.as_deref() == Some("Block");
    check_volume_mode(pod, &v.name, block)?;
    if block {
        // A raw block device: only a local volume here (the kubelet's local
        // plugin's block mapper); the device is passed, not mounted.
        let Some(local) = &spec.local else {
            return Err(Error::Unsupported(format!(
                "volume {}: block volumes of this type are not supported by this node",
                v.name
            )));
        };
        let path = PathBuf::from(&local.path);
        host_path::check(&path, Some("BlockDevice"))?;
        return Ok(MountedVolume {
            host_path: path,
            read_only: c.read_only,
            image: None,
            block: true,
        });
    }
    if let Some(hp) = &spec.host_path {
        let path = PathBuf::from(&hp.path);
        host_path::check(&path, hp.type_.as_deref())?;
        return Ok(MountedVolume {
            host_path: path,
            read_only: c.read_only,
            image: None,
            block: false,
        });
    }
    if let Some(local) = &spec.local {
        let path = PathBuf::from(&local.path);
        host_path::check(&path, None)?;
        if std::fs::symlink_metadata(&path).is_err() {
            return Err(Error::HostPath(format!(
                "local volume path {} does not exist",
                path.display()
            )));
        }
        if first
            && !c.read_only
            && let Some(gid) = fs_group(pod)
        {
            ownership::apply_with_policy(&path, gid, false, fs_group_change_policy(pod)).map_err(
                |source| Error::Io {
                    op: "apply fsGroup to local volume",
                    path: path.clone(),
                    source,
                },
            )?;
        }
        return Ok(MountedVolume {
            host_path: path,
            read_only: c.read_only,
            image: None,
            block: false,
        });
    }
    Err(Error::Unsupported(format!(
        "volume {:?}: PersistentVolume {:?} is of a type this node does not support",
        v.name,
        pv.metadata.name.as_deref().unwrap_or_default()
    )))
}

/// One volume; on failure, the error and the volume as it was when an earlier
/// version of it can still be used.
#[allow(
    clippy::result_large_err,
    reason = "set up once per volume and sync; the error is rare"
)]
fn set_up_volume(
    root: &Path,
    uid: &str,
    pod: &Pod,
    v: &Volume,
    fetched: &Fetched,
    allocatable: &BTreeMap<String, ApiQuantity>,
) -> std::result::Result<MountedVolume, (Error, Option<MountedVolume>)> {
    let dir = |plugin: &str| volume_dir(root, uid, plugin, &v.name);
    if let Some(image) = &v.image {
        // The runtime mounts the image; the pod worker pulls it first.
        let reference = image.reference.as_deref().unwrap_or_default();
        if reference.is_empty() || reference.contains(char::is_whitespace) {
            return Err((
                Error::Mount(format!(
                    "volume {:?}: invalid image reference {reference:?}",
                    v.name
                )),
                None,
            ));
        }
        return Ok(MountedVolume {
            host_path: PathBuf::new(),
            read_only: true,
            image: Some(reference.to_string()),
            block: false,
        });
    }
    if let Some(hp) = &v.host_path {
        let path = PathBuf::from(&hp.path);
        host_path::check(&path, hp.type_.as_deref()).map_err(|e| (e, None))?;
        return Ok(MountedVolume {
            host_path: path,
            read_only: false,
            image: None,
            block: false,
        });
    }
    if let Some(ed) = &v.empty_dir {
        let d = dir(empty_dir::PLUGIN_DIR);
        let first = std::fs::symlink_metadata(&d).is_err();
        let mode = ed.mode.map_or(empty_dir::DEFAULT_DIR_MODE, dir_mode);
        let io = |source| Error::Io {
            op: "set up emptyDir",
            path: d.clone(),
            source,
        };
        let medium =
            empty_dir::medium(pod, ed, allocatable).map_err(|e| (Error::Mount(e), None))?;
        empty_dir::set_up(&d, medium, mode).map_err(|e| (io(e), None))?;
        if first && let Some(gid) = fs_group(pod) {
            ownership::apply(&d, gid, false).map_err(|e| (io(e), None))?;
        }
        return Ok(MountedVolume {
            host_path: d,
            read_only: false,
            image: None,
            block: false,
        });
    }
    let memory = || Medium::Memory(empty_dir::memory_size(pod, None, allocatable).unwrap_or(0));
    let (plugin, medium, payload) = if let Some(cm) = &v.config_map {
        let optional = cm.optional.unwrap_or(false);
        let payload = fetched.config_map(&cm.name, optional).and_then(|obj| {
            configmap::payload(
                cm.items.as_deref(),
                obj.as_deref(),
                cm.default_mode,
                cm.default_user,
                optional,
            )
        });
        (configmap::PLUGIN_DIR, Medium::Disk, payload)
    } else if let Some(s) = &v.secret {
        let optional = s.optional.unwrap_or(false);
        let name = s.secret_name.clone().unwrap_or_default();
        let payload = fetched.secret(&name, optional).and_then(|obj| {
            secret::payload(
                s.items.as_deref(),
                obj.as_deref(),
                s.default_mode,
                s.default_user,
                optional,
            )
        });
        (secret::PLUGIN_DIR, memory(), payload)
    } else if let Some(d) = &v.downward_api {
        let payload = downward_api::payload(
            d.items.as_deref().unwrap_or_default(),
            pod,
            allocatable,
            d.default_mode,
            d.default_user,
        );
        (downward_api::PLUGIN_DIR, memory(), payload)
    } else if let Some(p) = &v.projected {
        let payload = projected::payload(p, &v.name, pod, fetched, allocatable);
        (projected::PLUGIN_DIR, memory(), payload)
    } else {
        return Err((
            Error::Unsupported(format!(
                "volume {:?}: this volume type is not supported by this node",
                v.name
            )),
            None,
        ));
    };
    let d = dir(plugin);
    let earlier = atomic_writer::is_published(&d).then(|| MountedVolume {
        host_path: d.clone(),
        read_only: true,
        image: None,
        block: false,
    });
    let fail = |e: Error| (e, earlier.clone());
    let payload = payload.map_err(fail)?;
    write_volume(&d, medium, &payload, fs_group(pod)).map_err(fail)?;
    Ok(MountedVolume {
        host_path: d,
        read_only: true,
        image: None,
        block: false,
    })
}

/// The wrapped emptyDir of an atomic-writer volume, then the payload written into it.
fn write_volume(
    dir: &Path,
    medium: Medium,
    payload: &Payload,
    fs_group: Option<u32>,
) -> Result<()> {
    empty_dir::set_up(dir, medium, empty_dir::DEFAULT_DIR_MODE).map_err(|source| Error::Io {
        op: "set up volume directory",
        path: dir.to_path_buf(),
        source,
    })?;
    let perms = move |_: &Path| match fs_group {
        Some(gid) => ownership::apply(dir, gid, true),
        None => Ok(()),
    };
    let written = atomic_writer::write(dir, payload, Some(&perms))?;
    if written {
        debug!(dir = %dir.display(), files = payload.len(), "volume contents written");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;
    use k8s_openapi::api::core::v1::{
        ConfigMapVolumeSource, EmptyDirVolumeSource, HostPathVolumeSource, KeyToPath,
        SecretVolumeSource,
    };

    fn volume(name: &str) -> Volume {
        Volume {
            name: name.into(),
            ..Default::default()
        }
    }

    fn with_volumes(vols: Vec<Volume>) -> Pod {
        let mut p = pod("web").container("c", "busybox").build();
        p.spec.as_mut().unwrap().volumes = Some(vols);
        p
    }

    #[test]
    fn fetched_debug_names_objects_and_never_shows_their_data() {
        let secret = Secret {
            data: Some(BTreeMap::from([(
                "password".to_string(),
                k8s_openapi::ByteString(b"secret-bytes".to_vec()),
            )])),
            string_data: Some(BTreeMap::from([("k".into(), "secret-string".into())])),
            ..Default::default()
        };
        let key = token::TokenKey {
            namespace: "ns".into(),
            service_account: "sa".into(),
            audience: None,
            expiration_seconds: 3600,
            pod_name: "web".into(),
            pod_uid: "u".into(),
            service_account_uid: None,
        };
        let fetched = Fetched {
            secrets: BTreeMap::from([("creds".to_string(), Ok(Some(Arc::new(secret))))]),
            tokens: HashMap::from([(key, Ok("eyJ.secret-token".to_string()))]),
            ..Default::default()
        };
        let printed = format!("{fetched:?} {fetched:#?}");
        assert!(
            printed.contains("creds") && printed.contains("sa"),
            "{printed}"
        );
        for secret in ["secret-", "eyJ", "115, 101, 99"] {
            assert!(!printed.contains(secret), "{secret} in {printed}");
        }
    }

    #[test]
    fn modes_keep_only_the_bits_the_api_admits() {
        // (field value, file mode, emptyDir mode)
        let cases = [
            (0o644, 0o644, 0o644),
            (0o777, 0o777, 0o777),
            (0o1777, 0o777, 0o1777),
            (0o4755, 0o755, 0o755),
            (0o7777, 0o777, 0o1777),
            (0, 0, 0),
            (-1, 0o777, 0o1777),
            (-0o644, 0o134, 0o1134),
            (i32::MAX, 0o777, 0o1777),
            (i32::MIN, 0, 0),
        ];
        for (v, file, dir) in cases {
            assert_eq!((file_mode(v), dir_mode(v)), (file, dir), "{v:o}");
        }
    }

    #[test]
    fn volumes_land_in_the_kubelet_layout() {
        let root = tempfile::tempdir().unwrap();
        let host = root.path().join("host-data");
        let mut cm = volume("cfg");
        cm.config_map = Some(ConfigMapVolumeSource {
            name: "app-config".into(),
            items: Some(vec![KeyToPath {
                key: "k".into(),
                path: "conf/k.txt".into(),
                mode: Some(0o600),
                user: None,
            }]),
            ..Default::default()
        });
        let mut ed = volume("scratch");
        ed.empty_dir = Some(EmptyDirVolumeSource::default());
        let mut hp = volume("host");
        hp.host_path = Some(HostPathVolumeSource {
            path: host.to_string_lossy().into_owned(),
            type_: Some("DirectoryOrCreate".into()),
        });
        let p = with_volumes(vec![cm, ed, hp]);
        let mut fetched = Fetched::default();
        fetched.config_maps.insert(
            "app-config".into(),
            Ok(Some(Arc::new(ConfigMap {
                data: Some([("k".to_string(), "v".to_string())].into()),
                ..Default::default()
            }))),
        );
        let out = set_up_all(
            root.path(),
            &p,
            &fetched,
            &BTreeMap::new(),
            &NodeIdentity::default(),
        );
        assert!(out.errors.is_empty(), "{:?}", out.errors);
        assert!(out.unmounted(&p).is_empty());
        let cfg = volume_dir(root.path(), "uid-web", "kubernetes.io~configmap", "cfg");
        assert_eq!(
            out.volumes["cfg"],
            MountedVolume {
                host_path: cfg.clone(),
                read_only: true,
                image: None,
                block: false,
            }
        );
        assert_eq!(
            std::fs::read_to_string(cfg.join("conf/k.txt")).unwrap(),
            "v"
        );
        let scratch = volume_dir(root.path(), "uid-web", "kubernetes.io~empty-dir", "scratch");
        assert!(scratch.is_dir());
        assert!(!out.volumes["scratch"].read_only);
        assert_eq!(out.volumes["host"].host_path, host);
        assert!(host.is_dir());
    }

    #[test]
    fn missing_config_map_blocks_until_it_exists() {
        let root = tempfile::tempdir().unwrap();
        let mut cm = volume("cfg");
        cm.config_map = Some(ConfigMapVolumeSource {
            name: "nope".into(),
            ..Default::default()
        });
        let mut opt = volume("opt");
        opt.config_map = Some(ConfigMapVolumeSource {
            name: "also-nope".into(),
            optional: Some(true),
            ..Default::default()
        });
        let p = with_volumes(vec![cm, opt]);
        let mut fetched = Fetched::default();
        fetched.config_maps.insert("nope".into(), Ok(None));
        fetched.config_maps.insert("also-nope".into(), Ok(None));
        let out = set_up_all(
            root.path(),
            &p,
            &fetched,
            &BTreeMap::new(),
            &NodeIdentity::default(),
        );
        assert_eq!(out.unmounted(&p), vec!["cfg"]);
        assert_eq!(out.errors.len(), 1);
        assert_eq!(out.errors[0].1.to_string(), "configmap \"nope\" not found");
        assert!(
            !volume_dir(root.path(), "uid-web", configmap::PLUGIN_DIR, "cfg").exists(),
            "nothing written for a volume that cannot be set up"
        );
        let opt = volume_dir(root.path(), "uid-web", configmap::PLUGIN_DIR, "opt");
        assert!(
            atomic_writer::is_published(&opt),
            "an optional missing source is empty"
        );
    }

    #[test]
    fn a_failed_refresh_keeps_the_published_version() {
        let root = tempfile::tempdir().unwrap();
        let mut cm = volume("cfg");
        cm.config_map = Some(ConfigMapVolumeSource {
            name: "app".into(),
            ..Default::default()
        });
        let p = with_volumes(vec![cm]);
        let mut fetched = Fetched::default();
        fetched.config_maps.insert(
            "app".into(),
            Ok(Some(Arc::new(ConfigMap {
                data: Some([("a".to_string(), "1".to_string())].into()),
                ..Default::default()
            }))),
        );
        assert!(
            set_up_all(
                root.path(),
                &p,
                &fetched,
                &BTreeMap::new(),
                &NodeIdentity::default()
            )
            .errors
            .is_empty()
        );
        fetched.config_maps.insert("app".into(), Ok(None));
        let out = set_up_all(
            root.path(),
            &p,
            &fetched,
            &BTreeMap::new(),
            &NodeIdentity::default(),
        );
        assert_eq!(out.errors.len(), 1);
        assert!(out.unmounted(&p).is_empty(), "still mountable");
        let cfg = volume_dir(root.path(), "uid-web", "kubernetes.io~configmap", "cfg");
        assert_eq!(std::fs::read_to_string(cfg.join("a")).unwrap(), "1");
    }

    #[test]
    fn unsupported_volume_types_are_named() {
        let root = tempfile::tempdir().unwrap();
        let mut nfs = volume("data");
        nfs.nfs = Some(Default::default());
        let p = with_volumes(vec![nfs]);
        let out = set_up_all(
            root.path(),
            &p,
            &Fetched::default(),
            &BTreeMap::new(),
            &NodeIdentity::default(),
        );
        assert_eq!(out.unmounted(&p), vec!["data"]);
        assert!(out.errors[0].1.to_string().contains("not supported"));
    }

    #[test]
    fn claim_volumes_are_their_bound_volumes_on_a_node_they_may_use() {
        use k8s_openapi::api::core::v1::{
            HostPathVolumeSource, LocalVolumeSource, NodeSelector, NodeSelectorRequirement,
            NodeSelectorTerm, PersistentVolume, PersistentVolumeClaim,
            PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, VolumeNodeAffinity,
        };
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let claim_volume = |name: &str, read_only: bool| {
            let mut v = volume(name);
            v.persistent_volume_claim = Some(PersistentVolumeClaimVolumeSource {
                claim_name: format!("{name}-claim"),
                read_only: Some(read_only),
            });
            v
        };
        let bound = |spec: PersistentVolumeSpec| {
            Ok((
                Arc::new(claim::Bound {
                    claim: PersistentVolumeClaim::default(),
                    volume: PersistentVolume {
                        spec: Some(spec),
                        ..Default::default()
                    },
                }),
                true,
            ))
        };
        let here = NodeIdentity {
            name: "n1".into(),
            labels: BTreeMap::from([("disk".to_string(), "ssd".to_string())]),
        };
        let affinity = |value: &str| {
            Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: "disk".into(),
                            operator: "In".into(),
                            values: Some(vec![value.into()]),
                        }]),
                        ..Default::default()
                    }],
                }),
            })
        };
        let local = |value: &str| PersistentVolumeSpec {
            local: Some(LocalVolumeSource {
                path: data.display().to_string(),
                ..Default::default()
            }),
            node_affinity: affinity(value),
            ..Default::default()
        };
        let mut fetched = Fetched::default();
        fetched.claims.insert(
            "host".into(),
            bound(PersistentVolumeSpec {
                host_path: Some(HostPathVolumeSource {
                    path: data.display().to_string(),
                    type_: Some("Directory".into()),
                }),
                ..Default::default()
            }),
        );
        fetched.claims.insert("local".into(), bound(local("ssd")));
        fetched
            .claims
            .insert("elsewhere".into(), bound(local("hdd")));
        fetched.claims.insert(
            "block".into(),
            bound(PersistentVolumeSpec {
                volume_mode: Some("Block".into()),
                ..local("ssd")
            }),
        );
        fetched.claims.insert(
            "pending".into(),
            Err("error processing PVC default/pending-claim: PVC is not bound".into()),
        );
        fetched.claims.insert(
            "mounted-block".into(),
            bound(PersistentVolumeSpec {
                volume_mode: Some("Block".into()),
                ..local("ssd")
            }),
        );
        fetched
            .claims
            .insert("device-fs".into(), bound(local("ssd")));
        let mut p = with_volumes(vec![
            claim_volume("host", true),
            claim_volume("local", false),
            claim_volume("elsewhere", false),
            claim_volume("block", false),
            claim_volume("mounted-block", false),
            claim_volume("device-fs", false),
            claim_volume("pending", false),
        ]);
        // One container mounts a block volume, and names a filesystem one
        // as a device: both refused as the kubelet refuses them.
        p.spec.as_mut().unwrap().containers[0] = serde_json::from_value(serde_json::json!({
            "name": "c", "image": "busybox",
            "volumeMounts": [{"name": "mounted-block", "mountPath": "/m"}],
            "volumeDevices": [{"name": "device-fs", "devicePath": "/dev/x"},
                {"name": "block", "devicePath": "/dev/y"}],
        }))
        .unwrap();
        let out = set_up_all(root.path(), &p, &fetched, &BTreeMap::new(), &here);
        let host = &out.volumes["host"];
        assert_eq!(
            (host.host_path.as_path(), host.read_only),
            (data.as_path(), true)
        );
        assert_eq!(out.volumes["local"].host_path, data);
        assert!(!out.volumes["local"].read_only);
        let errors: BTreeMap<&str, String> = out
            .errors
            .iter()
            .map(|(v, e)| (v.as_str(), e.to_string()))
            .collect();
        assert_eq!(
            errors["elsewhere"],
            "NodeAffinity check failed: no matching NodeSelectorTerms"
        );
        assert_eq!(
            errors["mounted-block"],
            "volume mounted-block has volumeMode Block, but is specified in volumeMounts"
        );
        assert_eq!(
            errors["device-fs"],
            "volume device-fs has volumeMode Filesystem, but is specified in volumeDevices"
        );
        // A local block volume must be a block device (here a directory).
        assert!(
            errors["block"].contains("is not a block device"),
            "{errors:?}"
        );
        assert!(matches!(
            out.errors
                .iter()
                .find(|(v, _)| v == "pending")
                .map(|(_, e)| e),
            Some(Error::Claim(_))
        ));
        assert_eq!(
            out.unmounted(&p),
            [
                "elsewhere",
                "block",
                "mounted-block",
                "device-fs",
                "pending"
            ]
        );
    }

    /// An image volume needs nothing on the node; a reference that cannot
    /// be one (empty, with blanks, huge with blanks) is refused, no other
    /// volume held up; a volume of no known type, or not a claim yet named
    /// as a device, is refused.
    #[test]
    fn image_volumes_and_odd_volumes() {
        use k8s_openapi::api::core::v1::ImageVolumeSource;
        let root = tempfile::tempdir().unwrap();
        let image = |name: &str, reference: &str| Volume {
            name: name.into(),
            image: Some(ImageVolumeSource {
                reference: Some(reference.into()),
                pull_policy: None,
            }),
            ..Default::default()
        };
        let huge = format!("{} x", "a".repeat(1 << 20));
        let mut p = with_volumes(vec![
            image("good", "registry.example/data:1"),
            image("empty", ""),
            image("blank", "a b"),
            image("huge", &huge),
            volume("nothing"),
            Volume {
                empty_dir: Some(Default::default()),
                ..volume("scratch")
            },
        ]);
        p.spec.as_mut().unwrap().containers[0].volume_devices =
            Some(vec![k8s_openapi::api::core::v1::VolumeDevice {
                name: "scratch".into(),
                device_path: "/dev/x".into(),
            }]);
        let here = NodeIdentity {
            name: "n1".into(),
            labels: BTreeMap::new(),
        };
        let out = set_up_all(
            root.path(),
            &p,
            &Fetched::default(),
            &BTreeMap::new(),
            &here,
        );
        assert_eq!(
            out.volumes["good"],
            MountedVolume {
                host_path: PathBuf::new(),
                read_only: true,
                image: Some("registry.example/data:1".into()),
                block: false,
            }
        );
        let errors: BTreeMap<&str, String> = out
            .errors
            .iter()
            .map(|(v, e)| (v.as_str(), e.to_string()))
            .collect();
        for bad in ["empty", "blank", "huge"] {
            assert!(
                errors[bad].contains("invalid image reference"),
                "{bad}: {errors:?}"
            );
        }
        assert!(errors["nothing"].contains("not supported"), "{errors:?}");
        assert_eq!(
            errors["scratch"],
            "volume scratch has volumeMode Filesystem, but is specified in volumeDevices"
        );
    }

    #[test]
    fn references_list_every_object_once() {
        let mut cm = volume("a");
        cm.config_map = Some(ConfigMapVolumeSource {
            name: "shared".into(),
            ..Default::default()
        });
        let mut s = volume("b");
        s.secret = Some(SecretVolumeSource {
            secret_name: Some("creds".into()),
            ..Default::default()
        });
        let p = with_volumes(vec![
            cm.clone(),
            s,
            Volume {
                name: "c".into(),
                ..cm
            },
        ]);
        let (cms, secrets, tokens) = references(&p);
        assert_eq!(cms.into_iter().collect::<Vec<_>>(), ["shared"]);
        assert_eq!(secrets.into_iter().collect::<Vec<_>>(), ["creds"]);
        assert!(tokens.is_empty());
    }

    #[test]
    fn memory_volumes_are_tmpfs_and_teardown_unmounts_them() {
        if !subpath::tests::need_root() {
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let mut s = volume("sec");
        s.secret = Some(SecretVolumeSource {
            secret_name: Some("creds".into()),
            ..Default::default()
        });
        let mut mem = volume("mem");
        mem.empty_dir = Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(ApiQuantity("1Mi".into())),
            ..Default::default()
        });
        let p = with_volumes(vec![s, mem]);
        let mut fetched = Fetched::default();
        fetched.secrets.insert(
            "creds".into(),
            Ok(Some(Arc::new(Secret {
                data: Some([("k".to_string(), k8s_openapi::ByteString(b"v".to_vec()))].into()),
                ..Default::default()
            }))),
        );
        let alloc = BTreeMap::from([("memory".to_string(), ApiQuantity("1Gi".into()))]);
        for _ in 0..2 {
            let out = set_up_all(root.path(), &p, &fetched, &alloc, &NodeIdentity::default());
            assert!(out.errors.is_empty(), "{:?}", out.errors);
        }
        let pod = pod_dir(root.path(), "uid-web");
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mounts = mount::mounts_under(&text, &pod);
        assert_eq!(
            mounts.len(),
            2,
            "one tmpfs per volume, not remounted: {mounts:?}"
        );
        let sec = volume_dir(root.path(), "uid-web", secret::PLUGIN_DIR, "sec");
        assert!(mount::is_mount_point(&sec));
        assert_eq!(std::fs::read_to_string(sec.join("k")).unwrap(), "v");
        let line = text
            .lines()
            .find(|l| l.contains("kubernetes.io~empty-dir/mem"))
            .unwrap();
        assert!(line.contains("size=1024k"), "{line}");
        remove_pod_dir(&pod).unwrap();
        assert!(!pod.exists());
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(mount::mounts_under(&text, &pod).is_empty());
    }

    #[test]
    fn teardown_unmounts_sub_paths_before_removing_anything() {
        if !subpath::tests::need_root() {
            return;
        }
        let root = subpath::tests::TestDir::new();
        let pod = pod_dir(root.path(), "u1");
        let vol = volume_dir(root.path(), "u1", empty_dir::PLUGIN_DIR, "x");
        std::fs::create_dir_all(vol.join("d")).unwrap();
        std::fs::write(vol.join("d/f"), "x").unwrap();
        let outside = root.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "host").unwrap();
        let sp = subpath::SubPath {
            volume_path: &vol,
            sub_path: "d",
            pod_dir: &pod,
            volume_name: "x",
            container_name: "c",
            index: 0,
        };
        let target = subpath::bind_sub_path(&sp).unwrap();
        assert!(target.join("f").exists());
        tear_down_pod_dir(&pod).unwrap();
        assert!(!pod.exists());
        let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(mount::mounts_under(&text, root.path()).is_empty());
        assert_eq!(
            std::fs::read_to_string(outside.join("keep")).unwrap(),
            "host"
        );
    }

    #[test]
    fn teardown_of_a_plain_dir_removes_it() {
        let root = tempfile::tempdir().unwrap();
        let dir = volume_dir(root.path(), "u1", empty_dir::PLUGIN_DIR, "x");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("f"), "x").unwrap();
        remove_pod_dir(&pod_dir(root.path(), "u1")).unwrap();
        assert!(!pod_dir(root.path(), "u1").exists());
        remove_pod_dir(&pod_dir(root.path(), "u1")).unwrap();
    }
}
