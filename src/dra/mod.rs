//! The DRA manager, as the kubelet's (`pkg/kubelet/cm/dra`): before a pod's
//! sandbox is made, every ResourceClaim the pod uses
//! ([`claims::pod_claims`], [`claims::claim_name`]) is read from the API
//! server and checked ([`claims::check`]: generated for the pod, reserved
//! for it, allocated), then prepared by each driver of its allocated
//! devices, through the kubelet plugin the driver registered
//! ([`plugins`], `NodePrepareResources`, one call per driver for all the
//! pod's claims). The CDI device IDs the drivers answer go to each
//! container naming the claim ([`DraManager::cdi_devices`]). A pod whose
//! claims do not pass never gets a sandbox: it waits, with a
//! `FailedPrepareDynamicResources` Event, as the kubelet's `SyncPod`
//! returns before `createPodSandbox`, and is tried again after the pod
//! worker's back-off (`crate::pod::context::BACK_OFF_PERIOD`).
//!
//! Once a pod's containers are gone its claims are unprepared
//! (`NodeUnprepareResources`), a claim shared by several pods after the
//! last; housekeeping unprepares those of pods that ended or went
//! ([`DraManager::unprepare_inactive`], the kubelet's reconcile loop).
//! What is prepared is kept in a checkpoint ([`cache::CHECKPOINT`]), so
//! that a restarted agent gives containers their devices and unprepares
//! claims of pods deleted while it was down.
//!
//! At start the node's ResourceSlices are deleted
//! ([`DraManager::wipe_resource_slices`]), and a driver's are deleted
//! [`WIPE_DELAY`] after it was left without a usable plugin (its last
//! plugin unregistered, or no plugin answers on its endpoint,
//! [`DraManager::probe_plugins`]), unless one came back, as the kubelet's
//! DRA plugin manager wipes them: devices advertised by a driver that may
//! never come back would draw pods that cannot start.

pub mod cache;
pub mod claims;
pub mod health;
pub mod plugins;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus, ResourceHealth, ResourceStatus};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use tracing::{debug, info, warn};

use cache::{ClaimCache, ClaimInfo};
use plugins::{Claim, Plugins};

/// The first wait between attempts to wipe the node's ResourceSlices.
const WIPE_FIRST_WAIT: Duration = Duration::from_secs(1);
/// The longest wait between attempts: the wipe gives up once a doubled
/// wait would pass it, after about 8.5 minutes and 10 attempts (the
/// kubelet's `wait.Backoff` stops when it reaches its cap).
const WIPE_MAX_WAIT: Duration = Duration::from_secs(300);
/// How long after a driver's last usable plugin went (unregistered, or
/// stopped answering) its ResourceSlices are deleted, unless one came back
/// (the kubelet's `defaultWipingDelay`).
pub const WIPE_DELAY: Duration = Duration::from_secs(30);
/// How often the registered plugins' endpoints are tried.
pub const PROBE_PERIOD: Duration = Duration::from_secs(2);
/// How long after a health stream ended it is opened again (the kubelet's).
const HEALTH_RETRY: Duration = Duration::from_secs(5);
/// The longest checkpoint read, bytes (a longer one is not read).
const MAX_CHECKPOINT_BYTES: usize = 16 * 1024 * 1024;

/// Prepares and unprepares the claims of the pods the pod workers run;
/// cheap to clone.
#[derive(Clone)]
pub struct DraManager {
    inner: Arc<Inner>,
}

struct Inner {
    client: kube::Client,
    node: String,
    plugins: Plugins,
    cache: Mutex<ClaimCache>,
    /// The checkpoint file (None: none kept).
    checkpoint: Option<PathBuf>,
    /// Serializes checkpoint writes.
    saving: Mutex<()>,
    /// How long after a driver's last plugin went its slices are wiped.
    wipe_delay: Duration,
    /// The drivers whose slices are to be wiped, each with the token of
    /// its pending wipe.
    pending_wipes: Mutex<BTreeMap<String, u64>>,
    /// The next wipe's token.
    wipe_tokens: std::sync::atomic::AtomicU64,
    /// The devices' health, from the drivers' health streams.
    health: health::HealthCache,
    /// Each plugin's health stream (driver, endpoint), to stop it.
    streams: Mutex<BTreeMap<(String, PathBuf), tokio::task::AbortHandle>>,
    /// Bumped when a device's health changed (or timed out).
    health_changed: tokio::sync::watch::Sender<u64>,
}

impl DraManager {
    /// A manager for node `node` reading claims through `client` (the Node
    /// authorizer lets a node read the claims of the pods bound to it),
    /// with no checkpoint: what it prepares is forgotten when it goes.
    #[must_use]
    pub fn new(client: kube::Client, node: &str) -> Self {
        Self::with_cache(client, node, None, ClaimCache::default())
    }

    /// A manager as [`DraManager::new`] keeping its checkpoint in
    /// `state_dir` ([`cache::CHECKPOINT`]) and taking in the claims the
    /// checkpoint there holds (none when there is none yet).
    ///
    /// # Errors
    /// The checkpoint is unreadable, longer than 16 MiB, not UTF-8 or no
    /// checkpoint of this version: as the kubelet's DRA manager, the agent
    /// does not start on it (prepared claims it cannot know of would never
    /// be unprepared), and the message says to drain the node and remove
    /// the file.
    pub fn open(client: kube::Client, node: &str, state_dir: &Path) -> Result<Self, String> {
        let checkpoint = state_dir.join(cache::CHECKPOINT);
        take_over_legacy(&state_dir.join(cache::LEGACY_CHECKPOINT), &checkpoint);
        let cache = restore(&checkpoint).map_err(|e| {
            format!(
                "DRA checkpoint {}: {e}; drain the node and remove the DRA state file",
                checkpoint.display()
            )
        })?;
        if !cache.is_empty() {
            info!(
                claims = cache.len(),
                "ResourceClaims prepared before the restart"
            );
        }
        Ok(Self::with_cache(client, node, Some(checkpoint), cache))
    }

    fn with_cache(
        client: kube::Client,
        node: &str,
        checkpoint: Option<PathBuf>,
        cache: ClaimCache,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                node: node.to_string(),
                plugins: Plugins::default(),
                cache: Mutex::new(cache),
                checkpoint,
                saving: Mutex::new(()),
                wipe_delay: WIPE_DELAY,
                pending_wipes: Mutex::new(BTreeMap::new()),
                wipe_tokens: std::sync::atomic::AtomicU64::new(0),
                health: health::HealthCache::default(),
                streams: Mutex::new(BTreeMap::new()),
                health_changed: tokio::sync::watch::channel(0).0,
            }),
        }
    }

    /// The manager, wiping a driver's ResourceSlices `delay` after its last
    /// plugin went instead of [`WIPE_DELAY`]; only before it is cloned
    /// (later, nothing changes).
    #[must_use]
    pub fn with_wipe_delay(mut self, delay: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.wipe_delay = delay;
        }
        self
    }

    /// The registered DRA drivers' plugins.
    #[must_use]
    pub fn plugins(&self) -> &Plugins {
        &self.inner.plugins
    }

    /// Registers driver `driver`'s plugin on `endpoint`, serving `services`
    /// (the kubelet's `RegisterPlugin`). The driver is usable once a plugin
    /// of it answers on its endpoint ([`DraManager::probe_plugins`]); until
    /// then a wipe of its slices is pending ([`DraManager::sync_driver`]).
    ///
    /// # Errors
    /// The kubelet's messages: no service spoken here
    /// ([`plugins::choose_service`]), the endpoint registered already.
    pub fn register_plugin(
        &self,
        driver: &str,
        endpoint: &Path,
        services: &[String],
    ) -> Result<(), String> {
        let service = plugins::choose_service(services).map_err(|e| {
            format!(
                "invalid supported gRPC versions of DRA driver plugin {driver} at endpoint {}: {e}",
                endpoint.display()
            )
        })?;
        self.inner.plugins.add(driver, endpoint, service)?;
        info!(
            driver,
            endpoint = %endpoint.display(),
            service = service.name(),
            "DRA driver registered"
        );
        self.sync_driver(driver);
        if let Some(health) = plugins::choose_health_service(services) {
            let task = tokio::spawn(self.clone().watch_health(
                driver.to_string(),
                endpoint.to_path_buf(),
                health,
            ));
            let old = self
                .inner
                .streams
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(
                    (driver.to_string(), endpoint.to_path_buf()),
                    task.abort_handle(),
                );
            if let Some(old) = old {
                old.abort();
            }
        }
        Ok(())
    }

    /// Follows driver `driver`'s device health through its plugin on
    /// `endpoint` (`NodeWatchResources` on the plugin's one connection),
    /// through `service`, as the kubelet's health stream handler, while the
    /// plugin is registered: each message is the driver's whole list; a stream that
    /// ends is opened again 5 s later, unless the driver does not
    /// implement it.
    async fn watch_health(
        self,
        driver: String,
        endpoint: PathBuf,
        service: plugins::HealthService,
    ) {
        loop {
            let Some(plugin) = self.inner.plugins.find(&driver, &endpoint) else {
                return;
            };
            let ended = plugin
                .watch_health(service, |devices| {
                    if self
                        .inner
                        .health
                        .update(&driver, devices, std::time::Instant::now())
                    {
                        self.inner.health_changed.send_modify(|n| *n += 1);
                    }
                })
                .await;
            match ended {
                Err(tonic::Code::Unimplemented) => {
                    debug!(driver, "the DRA driver has no health stream");
                    return;
                }
                Err(code) => debug!(
                    driver,
                    ?code,
                    "DRA health stream ended; opened again in 5 s"
                ),
                Ok(()) => debug!(driver, "DRA health stream ended; opened again in 5 s"),
            }
            tokio::time::sleep(HEALTH_RETRY).await;
        }
    }

    /// A receiver told each time a device's health changes, for the pods
    /// whose containers use it to have their status written again.
    #[must_use]
    pub fn health_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.health_changed.subscribe()
    }

    /// Sets `allocatedResourcesStatus` of each container of `status` that
    /// names claims of `pod`, as the kubelet's
    /// `UpdateAllocatedResourcesStatus`: one entry per claim and request it
    /// names (`claim:<name>` or `claim:<name>/<request>`), with each
    /// prepared device serving it, by its first CDI device ID (else
    /// `<driver>/<pool>/<device>`), and its health and message; entries
    /// without a device are dropped.
    pub fn update_allocated_resources_status(&self, pod: &Pod, status: &mut PodStatus) {
        let Some(spec) = pod.spec.as_ref() else {
            return;
        };
        let ns = namespace(pod);
        let now = std::time::Instant::now();
        let cache = self.cache();
        for cs in status.container_statuses.iter_mut().flatten() {
            let Some(c) = spec.containers.iter().find(|c| c.name == cs.name) else {
                continue;
            };
            let mut entries: Vec<ResourceStatus> = Vec::new();
            for (pc, requests) in claims::named_claims(pod, c) {
                let Ok(Some(r)) = claims::claim_name(pod, pc) else {
                    continue;
                };
                let Some(info) = cache.get(ns, &r.name) else {
                    continue;
                };
                for request in requests {
                    let name = if request.is_empty() {
                        format!("claim:{}", pc.name)
                    } else {
                        format!("claim:{}/{request}", pc.name)
                    };
                    let base = request.split('/').next().unwrap_or_default();
                    let mut resources: Vec<ResourceHealth> = Vec::new();
                    for (driver, d) in info.serving(base) {
                        let id = d.cdi_device_ids.first().cloned().unwrap_or_else(|| {
                            format!("{driver}/{}/{}", d.pool_name, d.device_name)
                        });
                        if resources.iter().any(|h| h.resource_id == id) {
                            continue;
                        }
                        let (health, message) =
                            self.inner
                                .health
                                .get(driver, &d.pool_name, &d.device_name, now);
                        resources.push(ResourceHealth {
                            resource_id: id,
                            health: Some(health.as_str().to_string()),
                            message: (!message.is_empty()).then_some(message),
                        });
                    }
                    if !resources.is_empty() && !entries.iter().any(|e| e.name == name) {
                        entries.push(ResourceStatus {
                            name,
                            resources: Some(resources),
                        });
                    }
                }
            }
            cs.allocated_resources_status = (!entries.is_empty()).then_some(entries);
        }
    }

    /// Takes driver `driver`'s plugin on `endpoint` out (the kubelet's
    /// `DeRegisterPlugin`); a driver left without a usable plugin has its
    /// slices wiped after the delay ([`DraManager::sync_driver`]).
    pub fn deregister_plugin(&self, driver: &str, endpoint: &Path) {
        let last = self.inner.plugins.remove(driver, endpoint);
        info!(driver, endpoint = %endpoint.display(), "DRA driver plugin deregistered");
        let stream = self
            .inner
            .streams
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(driver.to_string(), endpoint.to_path_buf()));
        if let Some(stream) = stream {
            stream.abort();
        }
        // A driver that went: its devices' health is not known.
        if last && self.inner.health.forget_driver(driver) {
            self.inner.health_changed.send_modify(|n| *n += 1);
        }
        self.sync_driver(driver);
    }

    /// Tries each registered plugin on its connection
    /// ([`plugins::Plugin::answers`]) and records whether it answers, as
    /// the kubelet follows each plugin's gRPC connection; then
    /// [`DraManager::sync_driver`] for each driver.
    pub async fn probe_plugins(&self) {
        for plugin in self.inner.plugins.all() {
            let answers = plugin.answers().await;
            if plugin.set_connected(answers) {
                info!(
                    driver = plugin.driver,
                    endpoint = %plugin.endpoint.display(),
                    connected = answers,
                    "DRA driver plugin connection changed"
                );
            }
        }
        for driver in self.inner.plugins.drivers() {
            self.sync_driver(&driver);
        }
    }

    /// Probes the registered plugins ([`DraManager::probe_plugins`]) every
    /// [`PROBE_PERIOD`], until the task is dropped.
    pub async fn run_probes(self) {
        let mut last = std::time::Instant::now();
        loop {
            self.probe_plugins().await;
            // A device whose health timed out is Unknown now: its pods'
            // status is written again.
            let now = std::time::Instant::now();
            if self.inner.health.any_expired(now, last) {
                self.inner.health_changed.send_modify(|n| *n += 1);
            }
            last = now;
            tokio::time::sleep(PROBE_PERIOD).await;
        }
    }

    /// As the kubelet's DRA plugin manager's `sync`: a driver with a plugin
    /// that answers has its pending wipe called off; one without gets a
    /// wipe of its ResourceSlices on this node [`WIPE_DELAY`] from now,
    /// unless one is pending already (its time stands) or a plugin answers
    /// by then.
    pub fn sync_driver(&self, driver: &str) {
        let mut pending = self
            .inner
            .pending_wipes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if self.inner.plugins.usable(driver) {
            pending.remove(driver);
            return;
        }
        if pending.contains_key(driver) {
            return;
        }
        let token = self
            .inner
            .wipe_tokens
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        pending.insert(driver.to_string(), token);
        let (dra, driver) = (self.clone(), driver.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(dra.inner.wipe_delay).await;
            let due = {
                let mut pending = dra
                    .inner
                    .pending_wipes
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let due = pending.get(&driver) == Some(&token);
                if due {
                    pending.remove(&driver);
                }
                due
            };
            if due {
                dra.wipe(Some(&driver)).await;
            }
        });
    }

    /// As the kubelet's `PrepareResources`: Ok when every claim `pod` uses
    /// is prepared for its containers (a pod without claims always is).
    ///
    /// # Errors
    /// Why the pod cannot start yet, in the kubelet's words, prefixed as its
    /// `prepare dynamic resources: …`: a claim not created yet, not found
    /// (`fetch ResourceClaim <name>: …`), not the pod's, not reserved for it
    /// or not allocated ([`claims::check`]), a driver of its devices not
    /// registered (`DRA driver <name> is not registered`), a claim of that
    /// name known here with another UID or being unprepared, the driver's
    /// call failing (`NodePrepareResources: …`) or failing for the claim
    /// (`NodePrepareResources failed for ResourceClaim <name>: …`), its
    /// answer out of bounds ([`cache::checked_devices`]), or the
    /// checkpoint not written.
    pub async fn prepare(&self, pod: &Pod) -> Result<(), String> {
        let started = std::time::Instant::now();
        let done = self.prepare_claims(pod).await;
        crate::metrics::metrics().record_dra_operation(
            "PrepareResources",
            started.elapsed(),
            done.is_err(),
        );
        done.map_err(|e| format!("prepare dynamic resources: {e}"))
    }

    /// The CDI device IDs container `c` of `pod` is given (the kubelet's
    /// `GetResources`): those of the prepared devices serving the requests
    /// it uses ([`claims::container_requests`]), without repeats.
    ///
    /// # Errors
    /// A claim it uses cannot be named, or is not prepared here.
    pub fn cdi_devices(&self, pod: &Pod, c: &Container) -> Result<Vec<String>, String> {
        let requests = claims::container_requests(pod, c)?;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let ns = namespace(pod);
        let cache = self.cache();
        let mut out: Vec<String> = Vec::new();
        for (claim, requests) in requests {
            let info = cache.get(ns, &claim).ok_or_else(|| {
                format!("internal error: unable to get claim info for ResourceClaim {claim} in namespace {ns}")
            })?;
            for r in requests {
                for id in info.cdi_devices(&r) {
                    if !out.contains(&id) {
                        out.push(id);
                    }
                }
            }
        }
        Ok(out)
    }

    /// The prepared claims container `c` of `pod` names in
    /// `resources.claims`, as the kubelet's `GetContainerClaimInfos` (for the
    /// pod resources API); none when one cannot be named or is not known
    /// here (the kubelet's answer then).
    #[must_use]
    pub fn container_claims(&self, pod: &Pod, c: &Container) -> Vec<ClaimInfo> {
        let ns = namespace(pod);
        let cache = self.cache();
        let mut out = Vec::new();
        for (pc, _) in claims::named_claims(pod, c) {
            match claims::claim_name(pod, pc) {
                Ok(Some(r)) => match cache.get(ns, &r.name) {
                    Some(info) => out.push(info.clone()),
                    None => return Vec::new(),
                },
                Ok(None) => {}
                Err(_) => return Vec::new(),
            }
        }
        out
    }

    /// As the kubelet's `UnprepareResources`, once `pod`'s containers are
    /// gone: each claim it uses (those known here, else those its spec
    /// names) is unprepared by its drivers when no other pod uses it, and
    /// forgotten. Doing it again does nothing.
    ///
    /// # Errors
    /// Why not, prefixed `unprepare dynamic resources: …`: a claim cannot
    /// be named, a driver is not registered, its call failed or failed for
    /// a claim, or the checkpoint was not written. The pod is to be tried
    /// again.
    pub async fn unprepare(&self, pod: &Pod) -> Result<(), String> {
        let (ns, uid) = (
            namespace(pod),
            pod.metadata.uid.as_deref().unwrap_or_default(),
        );
        let mut names = self.cache().claims_of(uid);
        if names.is_empty() {
            for pc in claims::pod_claims(pod) {
                match claims::claim_name(pod, &pc) {
                    Ok(Some(r)) => names.push(r.name),
                    Ok(None) => {}
                    Err(e) => return Err(format!("unprepare dynamic resources: {e}")),
                }
            }
        }
        let started = std::time::Instant::now();
        let done = self.unprepare_claims(uid, ns, &names).await;
        crate::metrics::metrics().record_dra_operation(
            "UnprepareResources",
            started.elapsed(),
            done.is_err(),
        );
        done.map_err(|e| format!("unprepare dynamic resources: {e}"))
    }

    /// Unprepares the claims of every pod using one here that `active` says
    /// is no longer active (it ended, or is gone), as the kubelet's DRA
    /// reconcile loop; returns how many pods' claims were unprepared. A
    /// failure is logged and tried again at the next call.
    pub async fn unprepare_inactive(&self, active: impl Fn(&str) -> bool) -> usize {
        let inactive: Vec<(String, String)> = self
            .cache()
            .pods()
            .into_iter()
            .filter(|(uid, _)| !active(uid))
            .collect();
        let mut done = 0;
        for (uid, ns) in inactive {
            let names = self.cache().claims_of(&uid);
            match self.unprepare_claims(&uid, &ns, &names).await {
                Ok(()) => done += 1,
                Err(e) => {
                    warn!(
                        pod_uid = uid,
                        error = e,
                        "unprepare the claims of a pod gone; retrying"
                    );
                }
            }
        }
        done
    }

    /// Whether pod `uid` uses a claim prepared (or being prepared) here.
    #[must_use]
    pub fn has_claims(&self, uid: &str) -> bool {
        self.cache().has_pod(uid)
    }

    /// Deletes every ResourceSlice of this node (field `spec.nodeName`),
    /// as the kubelet's `wipeResourceSlices` at start: tried again while the
    /// API server refuses (the node's credentials may still be coming), the
    /// wait doubling from 1 s, until a wait would pass 5 min (then a
    /// warning). Returns whether the slices are gone (or there were none).
    pub async fn wipe_resource_slices(&self) -> bool {
        self.wipe(None).await
    }

    /// Deletes this node's ResourceSlices, of `driver` only if given.
    async fn wipe(&self, driver: Option<&str>) -> bool {
        let api: Api<ResourceSlice> = Api::all(self.inner.client.clone());
        let node = &self.inner.node;
        let mut fields = format!("spec.nodeName={node}");
        if let Some(d) = driver {
            fields.push_str(&format!(",spec.driver={d}"));
        }
        let selected = ListParams::default().fields(&fields);
        let mut wait = WIPE_FIRST_WAIT;
        loop {
            let why = match api
                .delete_collection(&DeleteParams::default(), &selected)
                .await
            {
                Ok(_) => {
                    info!(
                        node,
                        driver,
                        "deleted the node's ResourceSlices: no plugin of their driver is registered"
                    );
                    return true;
                }
                Err(kube::Error::Api(s)) if s.code == 404 => return true,
                Err(e) => e.to_string(),
            };
            if wait > WIPE_MAX_WAIT {
                warn!(
                    node,
                    driver,
                    error = why,
                    "gave up deleting the node's ResourceSlices"
                );
                return false;
            }
            debug!(error = why, "delete the node's ResourceSlices; retrying");
            tokio::time::sleep(wait).await;
            wait = wait.saturating_mul(2);
        }
    }

    fn cache(&self) -> MutexGuard<'_, ClaimCache> {
        self.inner
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes the checkpoint of `cache` (nothing without a checkpoint
    /// file), and counts its claims in `dra_resource_claims_in_use`.
    fn save(&self, cache: &ClaimCache) -> Result<(), String> {
        publish_in_use(cache);
        let Some(path) = &self.inner.checkpoint else {
            return Ok(());
        };
        let _serial = self
            .inner
            .saving
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let text = cache.checkpoint().map_err(|e| e.to_string())?;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        }
        crate::certificate::write_private(path, &text, 0o600).map_err(|e| e.to_string())
    }

    async fn prepare_claims(&self, pod: &Pod) -> Result<(), String> {
        let pod_claims = claims::pod_claims(pod);
        if pod_claims.is_empty() {
            return Ok(());
        }
        let (ns, uid) = (
            namespace(pod),
            pod.metadata.uid.as_deref().unwrap_or_default(),
        );
        let api: Api<ResourceClaim> = Api::namespaced(self.inner.client.clone(), ns);
        // The validation pass, one claim after the other, named, read and
        // checked: the first that fails is the reason, and nothing is
        // recorded.
        let mut found: Vec<ClaimInfo> = Vec::new();
        for pc in &pod_claims {
            let Some(r) = claims::claim_name(pod, pc)? else {
                continue;
            };
            let claim = api.get(&r.name).await.map_err(|e| {
                let why = match e {
                    kube::Error::Api(s) => s.message.clone(),
                    e => e.to_string(),
                };
                format!("fetch ResourceClaim {}: {why}", r.name)
            })?;
            let drivers = claims::check(pod, &r, &claim)?;
            for driver in &drivers {
                self.inner.plugins.get(driver)?;
            }
            found.push(ClaimInfo {
                uid: claim.metadata.uid.clone().unwrap_or_default(),
                name: r.name,
                namespace: ns.to_string(),
                drivers: drivers.into_iter().map(|d| (d, Vec::new())).collect(),
                ..ClaimInfo::default()
            });
        }
        // The pod is recorded as using each claim (and checkpointed) before
        // any driver is called, so that a pod that goes meanwhile is
        // unprepared.
        let mut batches: BTreeMap<String, Vec<Claim>> = BTreeMap::new();
        {
            let mut cache = self.cache();
            for info in found {
                match cache.get(ns, &info.name) {
                    Some(known) if known.uid != info.uid => {
                        return Err(format!(
                            "old ResourceClaim with same name {} and different UID {} still exists (previous pod force-deleted?!)",
                            info.name, known.uid
                        ));
                    }
                    Some(known) if known.unpreparing => {
                        return Err(format!("ResourceClaim {} is being unprepared", info.name));
                    }
                    Some(_) => {}
                    None => cache.insert(info.clone()),
                }
                let Some(entry) = cache.get_mut(ns, &info.name) else {
                    continue;
                };
                entry.pod_uids.insert(uid.to_string());
                if entry.prepared {
                    continue;
                }
                for driver in entry.drivers.keys() {
                    batches.entry(driver.clone()).or_default().push(Claim {
                        namespace: entry.namespace.clone(),
                        uid: entry.uid.clone(),
                        name: entry.name.clone(),
                    });
                }
            }
            self.save(&cache)
                .map_err(|e| format!("checkpoint ResourceClaim cache: {e}"))?;
        }
        // One call per driver for all the pod's claims; the first failure
        // ends the pass (the next sync tries again).
        for (driver, claims) in &batches {
            let plugin = self.inner.plugins.get(driver)?;
            let answer = plugin
                .prepare(claims)
                .await
                .map_err(|e| format!("NodePrepareResources: {e}"))?;
            let answered = answer.len();
            for (claim_uid, outcome) in answer {
                let claim = claims.iter().find(|c| c.uid == claim_uid).ok_or_else(|| {
                    format!(
                        "NodePrepareResources returned result for unknown claim UID {claim_uid}"
                    )
                })?;
                let devices = outcome.map_err(|e| {
                    format!(
                        "NodePrepareResources failed for ResourceClaim {}: {e}",
                        claim.name
                    )
                })?;
                let devices = cache::checked_devices(&claim.name, devices)?;
                let mut cache = self.cache();
                let info = cache.get_mut(&claim.namespace, &claim.name).ok_or_else(|| {
                    format!(
                        "internal error: unable to get claim info for ResourceClaim {} in namespace {}",
                        claim.name, claim.namespace
                    )
                })?;
                info.drivers.insert(driver.clone(), devices);
            }
            let unfinished = claims.len().saturating_sub(answered);
            if unfinished != 0 {
                return Err(format!(
                    "NodePrepareResources skipped {unfinished} ResourceClaims"
                ));
            }
        }
        let mut cache = self.cache();
        for claim in batches.values().flatten() {
            if let Some(info) = cache.get_mut(&claim.namespace, &claim.name) {
                info.prepared = true;
            }
        }
        self.save(&cache)
            .map_err(|e| format!("checkpoint ResourceClaim state: {e}"))
    }

    async fn unprepare_claims(&self, uid: &str, ns: &str, names: &[String]) -> Result<(), String> {
        let mut batches: BTreeMap<String, Vec<Claim>> = BTreeMap::new();
        let mut last_users: Vec<String> = Vec::new();
        {
            let mut cache = self.cache();
            for name in names {
                let Some(info) = cache.get_mut(ns, name) else {
                    continue;
                };
                // A pod the claim does not list never got that far.
                if !info.pod_uids.contains(uid) {
                    continue;
                }
                // Others still use it: this pod just leaves it.
                if info.pod_uids.len() > 1 {
                    info.pod_uids.remove(uid);
                    continue;
                }
                info.unpreparing = true;
                last_users.push(name.clone());
                for driver in info.drivers.keys() {
                    batches.entry(driver.clone()).or_default().push(Claim {
                        namespace: info.namespace.clone(),
                        uid: info.uid.clone(),
                        name: info.name.clone(),
                    });
                }
            }
        }
        for (driver, claims) in &batches {
            let plugin = self.inner.plugins.get(driver)?;
            let answer = plugin
                .unprepare(claims)
                .await
                .map_err(|e| format!("NodeUnprepareResources: {e}"))?;
            let answered = answer.len();
            for (claim_uid, error) in answer {
                let claim = claims.iter().find(|c| c.uid == claim_uid).ok_or_else(|| {
                    format!(
                        "NodeUnprepareResources returned result for unknown claim UID {claim_uid}"
                    )
                })?;
                if !error.is_empty() {
                    return Err(format!(
                        "NodeUnprepareResources failed for ResourceClaim {}: {error}",
                        claim.name
                    ));
                }
            }
            let unfinished = claims.len().saturating_sub(answered);
            if unfinished != 0 {
                return Err(format!(
                    "NodeUnprepareResources skipped {unfinished} ResourceClaims"
                ));
            }
        }
        let mut cache = self.cache();
        for name in &last_users {
            cache.remove(ns, name);
        }
        self.save(&cache)
            .map_err(|e| format!("checkpoint ResourceClaim state: {e}"))
    }
}

/// Sets `dra_resource_claims_in_use` from `cache`: every claim, and the
/// claims with devices of each driver.
fn publish_in_use(cache: &ClaimCache) {
    let mut by_driver: BTreeMap<String, usize> = BTreeMap::new();
    for driver in cache.iter().flat_map(|c| c.drivers.keys()) {
        *by_driver.entry(driver.clone()).or_default() += 1;
    }
    crate::metrics::metrics().set_dra_claims_in_use(cache.len(), &by_driver);
}

/// The pod's namespace (`default` when unset).
fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// Moves the checkpoint an earlier version kept at `legacy` (the kubelet's
/// file name) to `checkpoint`, when there is none at `checkpoint` yet and
/// `legacy` is in this agent's format; a file there in any other format is
/// the kubelet's own, and stays untouched (logged).
fn take_over_legacy(legacy: &Path, checkpoint: &Path) {
    if checkpoint.exists() || !legacy.is_file() {
        return;
    }
    match restore(legacy) {
        Ok(_) => match std::fs::rename(legacy, checkpoint) {
            Ok(()) => {
                info!(from = %legacy.display(), to = %checkpoint.display(), "DRA checkpoint moved to the agent's own file name")
            }
            Err(e) => {
                warn!(path = %legacy.display(), error = %e, "DRA checkpoint of an earlier version not moved")
            }
        },
        Err(_) => {
            info!(path = %legacy.display(), "a DRA checkpoint not in this agent's format (the kubelet's) left as it is")
        }
    }
}

/// The claim cache the checkpoint at `path` holds (empty when there is
/// none).
///
/// # Errors
/// It is unreadable, longer than [`MAX_CHECKPOINT_BYTES`], not UTF-8 or no
/// checkpoint of this version.
fn restore(path: &Path) -> Result<ClaimCache, String> {
    use std::io::Read as _;
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ClaimCache::default()),
        Err(e) => return Err(e.to_string()),
    };
    let limit = u64::try_from(MAX_CHECKPOINT_BYTES).unwrap_or(u64::MAX);
    let mut text = String::new();
    file.take(limit.saturating_add(1))
        .read_to_string(&mut text)
        .map_err(|e| e.to_string())?;
    if text.len() > MAX_CHECKPOINT_BYTES {
        return Err(format!("longer than {MAX_CHECKPOINT_BYTES} bytes"));
    }
    ClaimCache::restore(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache of one claim, `c` in `ns`, used by pod `p1`.
    fn one_claim() -> ClaimCache {
        let mut claims = ClaimCache::default();
        claims.insert(ClaimInfo {
            uid: "claim-uid".into(),
            name: "c".into(),
            namespace: "ns".into(),
            pod_uids: ["p1".to_string()].into(),
            ..Default::default()
        });
        claims
    }

    #[tokio::test]
    async fn a_checkpoint_under_the_kubelets_name_is_taken_over_only_in_this_agents_format() {
        let dir = tempfile::tempdir().unwrap();
        let api = crate::fake_api::FakeApi::default();
        let legacy = dir.path().join(cache::LEGACY_CHECKPOINT);
        // The kubelet's own checkpoint (its shape: the data as a string
        // and a checksum) stays where it is, and the agent starts.
        let kubelets = r#"{"Data":"{\"kind\":\"DRACheckpoint\",\"apiVersion\":\"checkpoint.dra.kubelet.k8s.io/v1\",\"ClaimInfoStateList\":{}}","Checksum":1234}"#;
        std::fs::write(&legacy, kubelets).unwrap();
        let dra = DraManager::open(api.client(), "node-1", dir.path()).unwrap();
        assert!(dra.cache().is_empty());
        assert_eq!(std::fs::read_to_string(&legacy).unwrap(), kubelets);
        assert!(!dir.path().join(cache::CHECKPOINT).exists());
        // One an earlier version of this agent wrote there moves to the
        // agent's own name, with its claims.
        let claims = one_claim();
        std::fs::write(&legacy, claims.checkpoint().unwrap()).unwrap();
        let dra = DraManager::open(api.client(), "node-1", dir.path()).unwrap();
        assert_eq!(dra.cache().claims_of("p1"), ["c"]);
        assert!(!legacy.exists());
        assert!(dir.path().join(cache::CHECKPOINT).is_file());
    }

    #[tokio::test]
    async fn a_checkpoint_that_is_garbage_too_long_or_of_another_version_stops_the_start() {
        let dir = tempfile::tempdir().unwrap();
        let api = crate::fake_api::FakeApi::default();
        let file = dir.path().join(cache::CHECKPOINT);
        // None yet: an empty cache.
        let dra = DraManager::open(api.client(), "node-1", dir.path()).unwrap();
        assert!(dra.cache().is_empty());
        // One written by a manager comes back.
        let claims = one_claim();
        let good = claims.checkpoint().unwrap();
        std::fs::write(&file, &good).unwrap();
        let dra = DraManager::open(api.client(), "node-1", dir.path()).unwrap();
        assert_eq!(dra.cache().claims_of("p1"), ["c"]);
        // The same checkpoint padded past the limit (still JSON) is refused
        // for its length, before it is parsed.
        let mut long = good.clone();
        long.push_str(&" ".repeat(MAX_CHECKPOINT_BYTES + 1 - good.len()));
        let refusals = [
            ("not json".to_string(), "expected ident"),
            (
                good.replace("rustlet/dra/v1", "rustlet/dra/v0"),
                "checkpoint version",
            ),
            (long, "longer than 16777216 bytes"),
        ];
        for (text, why) in refusals {
            std::fs::write(&file, text).unwrap();
            let Err(e) = DraManager::open(api.client(), "node-1", dir.path()) else {
                panic!("a bad checkpoint ({why}) was taken in");
            };
            assert!(e.contains(why), "{e}");
            assert!(e.contains(&file.display().to_string()), "{e}");
            assert!(
                e.ends_with("drain the node and remove the DRA state file"),
                "{e}"
            );
        }
        std::fs::write(&file, [0xff, 0xfe]).unwrap();
        let e = DraManager::open(api.client(), "node-1", dir.path())
            .err()
            .unwrap();
        assert!(e.contains("UTF-8"), "{e}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_driver_whose_plugin_never_answers_loses_its_slices_after_the_delay() {
        let dir = tempfile::tempdir().unwrap();
        let api = crate::fake_api::FakeApi::default();
        let slice = |driver: &str| {
            serde_json::json!({ "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": { "name": format!("node-1-{driver}") },
                "spec": { "nodeName": "node-1", "driver": driver,
                    "pool": { "name": "node-1", "generation": 1, "resourceSliceCount": 1 } } })
        };
        api.put_cluster(
            "resourceslices",
            "node-1-live.example.com",
            slice("live.example.com"),
        );
        api.put_cluster(
            "resourceslices",
            "node-1-mute.example.com",
            slice("mute.example.com"),
        );
        let dra =
            DraManager::new(api.client(), "node-1").with_wipe_delay(Duration::from_millis(300));
        let v1 = ["v1.DRAPlugin".to_string()];
        // One plugin serves its endpoint; the other registered one that
        // nothing listens on.
        // The live driver runs in a runtime of its own, which stops (its
        // listener and connections closed) as a driver's process dies.
        let live = dir.path().join("live.sock");
        let process = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let _driver = {
            let _in = process.enter();
            crate::fake_dra::FakeDraDriver::serve(&live, "live.example.com", false)
        };
        dra.register_plugin("live.example.com", &live, &v1).unwrap();
        let mute = dir.path().join("mute.sock");
        dra.register_plugin("mute.example.com", &mute, &v1).unwrap();
        dra.probe_plugins().await;
        assert!(dra.plugins().usable("live.example.com"));
        assert!(!dra.plugins().usable("mute.example.com"));
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(
            api.cluster_object("resourceslices", "node-1-mute.example.com")
                .is_none()
        );
        assert!(
            api.cluster_object("resourceslices", "node-1-live.example.com")
                .is_some()
        );

        // The live one stops answering and comes back before the delay:
        // its slice stays. Then it stops for good: its slice goes.
        let plugin = dra.plugins().get("live.example.com").unwrap();
        plugin.set_connected(false);
        dra.sync_driver("live.example.com");
        plugin.set_connected(true);
        dra.sync_driver("live.example.com");
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(
            api.cluster_object("resourceslices", "node-1-live.example.com")
                .is_some()
        );
        process.shutdown_background();
        dra.probe_plugins().await;
        assert!(!dra.plugins().usable("live.example.com"));
        tokio::time::sleep(Duration::from_millis(900)).await;
        assert!(
            api.cluster_object("resourceslices", "node-1-live.example.com")
                .is_none()
        );
    }

    #[tokio::test]
    async fn the_wipe_deletes_the_nodes_slices_by_field_and_retries_a_refusal() {
        let api = crate::fake_api::FakeApi::default();
        let slice = |node: &str| {
            serde_json::json!({ "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": { "name": format!("{node}-gpu") },
                "spec": { "nodeName": node, "driver": "gpu.example.com",
                    "pool": { "name": node, "generation": 1, "resourceSliceCount": 1 } } })
        };
        api.put_cluster("resourceslices", "node-1-gpu", slice("node-1"));
        api.put_cluster("resourceslices", "node-2-gpu", slice("node-2"));
        let dra = DraManager::new(api.client(), "node-1");
        // Refused once (the node's credentials not known yet), then done
        // after the first wait (1 s).
        api.refuse_slice_deletes(1);
        assert!(dra.wipe_resource_slices().await);
        let seen: Vec<(String, String)> = api
            .take_requests()
            .into_iter()
            .map(|r| (r.line(), r.query))
            .collect();
        let delete = (
            "DELETE /apis/resource.k8s.io/v1/resourceslices".to_string(),
            "fieldSelector=spec.nodeName=node-1".to_string(),
        );
        assert_eq!(seen, [delete.clone(), delete]);
        assert!(api.cluster_object("resourceslices", "node-1-gpu").is_none());
        assert!(api.cluster_object("resourceslices", "node-2-gpu").is_some());
    }
}
