//! Pod sources, as the kubelet's `config` package (`PodConfig`,
//! `podStorage.Merge`): the pods the API server binds to this node and the
//! static pods of the manifests, merged into the one set the pod workers
//! sync, a reflector store keyed `namespace/name`.
//!
//! - A mirror pod (the API server's copy of a static pod) is not a pod to
//!   run: it is kept aside ([`PodConfig::mirror`]) and a change to it wakes
//!   the worker of its static pod, which keeps it current.
//! - An API pod with the name of a static pod is hidden behind it (the
//!   kubelet's duplicate-name filter keeps the first source).
//! - A static pod whose manifest goes, or changes (a new UID), is not
//!   dropped: it stays in the set, being deleted (`deletionTimestamp` now,
//!   its `terminationGracePeriodSeconds`, at least 1 s), until its worker has
//!   stopped it ([`PodSources::finished`]). Only then does the new version of
//!   the same pod start, as the kubelet lets one static pod of a full name
//!   run at a time (`allowStaticPodStart`).
//! - The sources are ready ([`PodConfig::ready`]) once each has listed
//!   once (the kubelet's `SeenAllSources`); until then nothing of the
//!   runtime is cleaned up, as a pod not listed yet may be one of them.
//!
//! [`PodConfig`] is the pure merge; [`PodSources`] holds it with the store
//! it writes and the stream of pods to sync.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::watcher;
use tracing::{info, warn};

use crate::static_pod;

/// `kubernetes.io/config.seen`: when the agent first saw a static pod.
pub const CONFIG_SEEN_ANNOTATION: &str = "kubernetes.io/config.seen";

/// The grace period of a static pod that sets none, seconds (the API
/// server's default, which a manifest does not get).
const DEFAULT_GRACE_SECONDS: i64 = 30;

/// The merged pod sources; pure: every change returns the keys whose pod
/// (in [`PodConfig::pod`]) or mirror pod may have changed.
#[derive(Debug, Default)]
pub struct PodConfig {
    /// The API server's pods bound here, mirror pods left out.
    api: BTreeMap<String, Arc<Pod>>,
    /// The mirror pods bound here.
    mirrors: BTreeMap<String, Arc<Pod>>,
    /// The static pods the manifests define now, every source together.
    desired: BTreeMap<String, Pod>,
    /// Each static source's pods (`file`, `http`), once it listed.
    by_source: BTreeMap<String, BTreeMap<String, Pod>>,
    /// The static sources configured that have not listed yet.
    unlisted: BTreeSet<String>,
    /// The static pods in the set, some perhaps being stopped.
    active: BTreeMap<String, Arc<Pod>>,
    api_listed: bool,
}

/// One pod of the set, as the kubelet's pod workers count it
/// (`PodWorkerSync`).
#[derive(Clone, Debug)]
pub struct WorkingPod {
    /// The pod, as the set holds it.
    pub pod: Arc<Pod>,
    /// True for a static pod.
    pub is_static: bool,
    /// True when its source no longer defines it (a static pod whose
    /// manifest went or changed): it is only being stopped.
    pub orphan: bool,
}

/// The set counted for the kubelet's pod gauges ([`PodConfig::census`]).
#[derive(Clone, Debug, Default)]
pub struct Census {
    /// Every pod the workers sync ([`PodConfig::pods`]).
    pub working: Vec<WorkingPod>,
    /// Static pods the manifests define now; one waiting for its
    /// predecessor to stop is counted, and is not in `working` yet.
    pub desired_static: usize,
    /// Mirror pods bound here.
    pub mirrors: usize,
}

impl PodConfig {
    /// The pods the workers have and what the sources define, as the
    /// kubelet's `HandlePodCleanups` counts them.
    #[must_use]
    pub fn census(&self) -> Census {
        let working = self
            .pods()
            .into_iter()
            .map(|pod| {
                let key = static_pod::key(&pod);
                let is_static = self
                    .active
                    .get(&key)
                    .is_some_and(|a| a.metadata.uid == pod.metadata.uid);
                let orphan = is_static
                    && self
                        .desired
                        .get(&key)
                        .is_none_or(|d| d.metadata.uid != pod.metadata.uid);
                WorkingPod {
                    pod,
                    is_static,
                    orphan,
                }
            })
            .collect();
        Census {
            working,
            desired_static: self.desired.len(),
            mirrors: self.mirrors.len(),
        }
    }

    /// The pod the workers sync under `key`: the static pod, else the API's.
    #[must_use]
    pub fn pod(&self, key: &str) -> Option<Arc<Pod>> {
        self.active.get(key).or_else(|| self.api.get(key)).cloned()
    }

    /// Every pod the workers sync.
    #[must_use]
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        let hidden = |k: &String| self.active.contains_key(k);
        self.active
            .values()
            .cloned()
            .chain(
                self.api
                    .iter()
                    .filter(|(k, _)| !hidden(k))
                    .map(|(_, p)| p.clone()),
            )
            .collect()
    }

    /// The mirror pod under `key`, if the API server has one.
    #[must_use]
    pub fn mirror(&self, key: &str) -> Option<Arc<Pod>> {
        self.mirrors.get(key).cloned()
    }

    /// True when an API pod (not a mirror pod) under `key` is hidden by a
    /// static pod of the same name.
    #[must_use]
    pub fn shadowed(&self, key: &str) -> bool {
        self.api.contains_key(key)
            && (self.active.contains_key(key) || self.desired.contains_key(key))
    }

    /// True once the API server's pods and the manifests were each listed.
    #[must_use]
    pub fn ready(&self) -> bool {
        self.api_listed && self.unlisted.is_empty()
    }

    /// Mirror pods whose static pod is gone (neither defined nor still
    /// stopping), to delete, as the kubelet's `HandlePodCleanups`; none
    /// before the sources are ready.
    #[must_use]
    pub fn orphan_mirrors(&self) -> Vec<Arc<Pod>> {
        if !self.ready() {
            return Vec::new();
        }
        self.mirrors
            .iter()
            .filter(|(k, _)| !self.active.contains_key(*k) && !self.desired.contains_key(*k))
            .map(|(_, p)| p.clone())
            .collect()
    }

    /// The API server added or changed `pod`.
    pub fn api_apply(&mut self, pod: Pod) -> String {
        let key = static_pod::key(&pod);
        if static_pod::is_mirror(&pod) {
            self.api.remove(&key);
            self.mirrors.insert(key.clone(), Arc::new(pod));
        } else {
            self.mirrors.remove(&key);
            self.api.insert(key.clone(), Arc::new(pod));
        }
        key
    }

    /// The API server deleted `pod`.
    pub fn api_delete(&mut self, pod: &Pod) -> String {
        let key = static_pod::key(pod);
        let same = |p: &Arc<Pod>| p.metadata.uid == pod.metadata.uid;
        if self.api.get(&key).is_some_and(same) {
            self.api.remove(&key);
        }
        if self.mirrors.get(&key).is_some_and(same) {
            self.mirrors.remove(&key);
        }
        key
    }

    /// The API server's pods, listed anew: every key before or after.
    pub fn api_replace(&mut self, pods: Vec<Pod>) -> BTreeSet<String> {
        let mut keys: BTreeSet<String> = self
            .api
            .keys()
            .chain(self.mirrors.keys())
            .cloned()
            .collect();
        self.api.clear();
        self.mirrors.clear();
        for pod in pods {
            keys.insert(self.api_apply(pod));
        }
        self.api_listed = true;
        keys
    }

    /// Static source `source` (`file`, `http`) now defines `pods` (by key),
    /// read at `now`: see [`PodConfig::set_static`]. The sources are merged
    /// in name order; a pod two of them define is the first one's (the
    /// kubelet's merge keeps the first of a duplicate name).
    pub fn set_source(
        &mut self,
        source: &str,
        pods: BTreeMap<String, Pod>,
        now: Timestamp,
    ) -> BTreeSet<String> {
        self.unlisted.remove(source);
        self.by_source.insert(source.to_string(), pods);
        let mut desired = BTreeMap::new();
        for pods in self.by_source.values() {
            for (key, pod) in pods {
                desired.entry(key.clone()).or_insert_with(|| pod.clone());
            }
        }
        self.set_static(desired, now)
    }

    /// The manifests now define `desired` (by key), read at `now`: new
    /// static pods join the set; one whose manifest went or changed is
    /// stopped first, its successor waiting until [`PodConfig::finished`].
    fn set_static(&mut self, desired: BTreeMap<String, Pod>, now: Timestamp) -> BTreeSet<String> {
        let mut keys = BTreeSet::new();
        for (key, running) in &mut self.active {
            let kept = desired
                .get(key)
                .is_some_and(|d| d.metadata.uid == running.metadata.uid);
            if !kept && running.metadata.deletion_timestamp.is_none() {
                *running = Arc::new(stopping(running, now));
                keys.insert(key.clone());
            }
        }
        for (key, pod) in &desired {
            if !self.active.contains_key(key) {
                self.active
                    .insert(key.clone(), Arc::new(seen(pod.clone(), now)));
                keys.insert(key.clone());
            }
        }
        self.desired = desired;
        keys
    }

    /// The worker stopped static pod `uid` under `key` and removed what it
    /// ran: it leaves the set, and the manifest's current version (if any)
    /// takes its place. Returns false when that pod is not the one in the
    /// set (nothing changes).
    pub fn finished(&mut self, key: &str, uid: &str, now: Timestamp) -> bool {
        if self
            .active
            .get(key)
            .is_none_or(|p| p.metadata.uid.as_deref() != Some(uid))
        {
            return false;
        }
        self.active.remove(key);
        if let Some(next) = self.desired.get(key) {
            self.active
                .insert(key.to_string(), Arc::new(seen(next.clone(), now)));
        }
        true
    }
}

/// `pod` as first seen at `now` (`kubernetes.io/config.seen`, as the
/// kubelet's merge stamps it, in its format with nanoseconds).
fn seen(mut pod: Pod, now: Timestamp) -> Pod {
    let stamp = format!(
        "{}.{:09}Z",
        now.strftime("%Y-%m-%dT%H:%M:%S"),
        now.subsec_nanosecond()
    );
    pod.metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CONFIG_SEEN_ANNOTATION.into(), stamp);
    pod
}

/// `pod` being deleted from `now`, with its own grace period (at least 1 s,
/// as the kubelet's pod workers kill a removed static pod).
fn stopping(pod: &Pod, now: Timestamp) -> Pod {
    let mut pod = pod.clone();
    let grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(DEFAULT_GRACE_SECONDS)
        .max(1);
    pod.metadata.deletion_timestamp = Some(Time(now));
    pod.metadata.deletion_grace_period_seconds = Some(grace);
    pod
}

/// The pod sources of one agent: the merge, the reflector store the pod
/// workers, the node API and housekeeping read (every pod to sync, static
/// ones included), and the stream of pods to sync, which the controller
/// runs on. Clones share all of it.
#[derive(Clone)]
pub struct PodSources {
    inner: Arc<Mutex<Inner>>,
    store: Store<Pod>,
}

struct Inner {
    config: PodConfig,
    writer: Writer<Pod>,
    /// The API server's pods of a listing under way.
    listing: Option<Vec<Pod>>,
    /// True once the store was filled (the first listing of any source).
    filled: bool,
    triggers: tokio::sync::mpsc::UnboundedSender<Pod>,
    ready: tokio::sync::watch::Sender<bool>,
}

/// The receiving ends of [`PodSources::new`].
pub struct Outputs {
    /// Every pod to sync, each time it (or its mirror pod) changes.
    pub triggers: tokio::sync::mpsc::UnboundedReceiver<Pod>,
    /// True once every source has listed ([`PodConfig::ready`]).
    pub ready: tokio::sync::watch::Receiver<bool>,
}

impl PodSources {
    /// Empty sources, with the static sources named in `static_sources`
    /// (`file`, `http`): they are ready once the API server and each of
    /// those listed.
    #[must_use]
    pub fn new(static_sources: &[&str]) -> (Self, Outputs) {
        let (store, writer) = reflector::store();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = tokio::sync::watch::channel(false);
        let config = PodConfig {
            unlisted: static_sources.iter().map(|s| (*s).to_string()).collect(),
            ..PodConfig::default()
        };
        let inner = Inner {
            config,
            writer,
            listing: None,
            filled: false,
            triggers: tx,
            ready: ready_tx,
        };
        let sources = Self {
            inner: Arc::new(Mutex::new(inner)),
            store,
        };
        let outputs = Outputs {
            triggers: rx,
            ready: ready_rx,
        };
        (sources, outputs)
    }

    /// The store of every pod to sync.
    #[must_use]
    pub fn store(&self) -> Store<Pod> {
        self.store.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes one event of the API server's watch of the pods bound here.
    pub fn api_event(&self, event: watcher::Event<Pod>) {
        let mut inner = self.lock();
        match event {
            watcher::Event::Init => inner.listing = Some(Vec::new()),
            watcher::Event::InitApply(pod) => inner.listing.get_or_insert_with(Vec::new).push(pod),
            watcher::Event::InitDone => {
                let pods = inner.listing.take().unwrap_or_default();
                let keys = inner.config.api_replace(pods);
                inner.refill();
                inner.trigger(&keys);
            }
            watcher::Event::Apply(pod) => {
                crate::startup_trace::watched(&pod);
                let key = inner.config.api_apply(pod);
                inner.changed(&BTreeSet::from([key]));
            }
            watcher::Event::Delete(pod) => {
                let key = inner.config.api_delete(&pod);
                inner.changed(&BTreeSet::from([key]));
            }
        }
    }

    /// Static source `source` (`file`, `http`) now defines `pods` (a
    /// [`static_pod::Listing`]'s pods).
    pub fn set_static(&self, source: &str, pods: BTreeMap<String, Pod>) {
        let mut inner = self.lock();
        let keys = inner.config.set_source(source, pods, Timestamp::now());
        if inner.filled {
            inner.changed(&keys);
        } else {
            inner.refill();
            inner.trigger(&keys);
        }
    }

    /// The worker has stopped static pod `pod` and removed what it ran
    /// ([`PodConfig::finished`]): the manifest's current version, if any,
    /// takes its place; without one, its mirror pod becomes an orphan.
    pub fn finished(&self, pod: &Pod) {
        let mut inner = self.lock();
        let key = static_pod::key(pod);
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if inner.config.finished(&key, uid, Timestamp::now()) {
            inner.changed(&BTreeSet::from([key]));
        }
    }

    /// Static pod `pod` now has status `status` (the status manager's):
    /// the store shows it, as the kubelet shows a static pod with its
    /// status manager's status, for the node API (`/pods`, logs). Its
    /// worker is not woken: the status is its own doing.
    pub fn set_static_status(&self, pod: &Pod, status: &k8s_openapi::api::core::v1::PodStatus) {
        let mut inner = self.lock();
        let key = static_pod::key(pod);
        let Some(current) = inner.config.active.get_mut(&key) else {
            return;
        };
        if current.metadata.uid != pod.metadata.uid {
            return;
        }
        let mut updated = (**current).clone();
        updated.status = Some(status.clone());
        *current = Arc::new(updated.clone());
        inner
            .writer
            .apply_watcher_event(&watcher::Event::Apply(updated));
    }

    /// The set counted for the pod gauges ([`PodConfig::census`]).
    #[must_use]
    pub fn census(&self) -> Census {
        self.lock().config.census()
    }

    /// The mirror pod of static pod `pod`, if the API server has one.
    #[must_use]
    pub fn mirror_of(&self, pod: &Pod) -> Option<Arc<Pod>> {
        self.lock().config.mirror(&static_pod::key(pod))
    }

    /// Mirror pods whose static pod is gone ([`PodConfig::orphan_mirrors`]).
    #[must_use]
    pub fn orphan_mirrors(&self) -> Vec<Arc<Pod>> {
        self.lock().config.orphan_mirrors()
    }

    /// True when the API pod under `pod`'s key is hidden by a static pod.
    #[must_use]
    pub fn shadowed(&self, pod: &Pod) -> bool {
        self.lock().config.shadowed(&static_pod::key(pod))
    }
}

impl Inner {
    /// Writes the whole merged set into the store (a relist of it).
    fn refill(&mut self) {
        let pods = self.config.pods();
        self.writer.apply_watcher_event(&watcher::Event::Init);
        for pod in pods {
            self.writer
                .apply_watcher_event(&watcher::Event::InitApply((*pod).clone()));
        }
        self.writer.apply_watcher_event(&watcher::Event::InitDone);
        self.filled = true;
        self.ready.send_replace(self.config.ready());
    }

    /// Writes the pods under `keys` into the store, then wakes their workers.
    fn changed(&mut self, keys: &BTreeSet<String>) {
        for key in keys {
            let event = match self.config.pod(key) {
                Some(pod) => watcher::Event::Apply((*pod).clone()),
                None => {
                    let Some((ns, name)) = key.split_once('/') else {
                        continue;
                    };
                    let Some(old) = self
                        .writer
                        .as_reader()
                        .get(&ObjectRef::new(name).within(ns))
                    else {
                        continue;
                    };
                    watcher::Event::Delete((*old).clone())
                }
            };
            self.writer.apply_watcher_event(&event);
        }
        self.ready.send_replace(self.config.ready());
        self.trigger(keys);
    }

    /// Wakes the workers of the pods under `keys`.
    fn trigger(&self, keys: &BTreeSet<String>) {
        for key in keys {
            if let Some(pod) = self.config.pod(key) {
                let _ = self.triggers.send((*pod).clone());
            }
        }
    }
}

/// How long the file source waits after a change notification before it
/// reads the manifests, so that one edit (often several notifications) is
/// one reading.
const SETTLE: Duration = Duration::from_millis(100);

/// The file source, as the kubelet's (`pkg/kubelet/config/file.go`): reads
/// the static pods at `path` for node `node` ([`static_pod::list`]) into
/// `sources` at start, on each change notification (inotify) and every
/// `period`. A manifest that cannot be used is logged once, with why, for as
/// long as it stays so; it is left out, as the kubelet's directory listing
/// leaves it out. Runs until aborted.
pub async fn run_file_source(path: PathBuf, node: String, period: Duration, sources: PodSources) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<PathBuf>>();
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reported = BTreeSet::<String>::new();
    let mut watch_failed = false;
    let mut last = static_pod::Listing::default();
    info!(path = %path.display(), "static pods from manifests");
    loop {
        // Watched anew before each reading (a manifest replaced by a rename
        // is a new file): a change after this is either read now or notified.
        let _watcher = match watch(&path, tx.clone()) {
            Ok(w) => {
                watch_failed = false;
                Some(w)
            }
            Err(e) => {
                if !watch_failed {
                    info!(path = %path.display(), error = %e, "static pod path not watched; read every period");
                }
                watch_failed = true;
                None
            }
        };
        let listing = tokio::task::spawn_blocking({
            let (path, node) = (path.clone(), node.clone());
            move || static_pod::list(&path, &node)
        })
        .await;
        match listing {
            Ok(mut listing) => {
                let now: BTreeSet<String> =
                    std::mem::take(&mut listing.errors).into_iter().collect();
                for error in now.difference(&reported) {
                    warn!(%error, "static pod manifest not used");
                }
                reported = now;
                sources.set_static(static_pod::FILE_SOURCE, listing.pods.clone());
                last = listing;
            }
            Err(e) => warn!(error = %e, "reading the static pod manifests"),
        }
        tokio::select! {
            _ = tick.tick() => {}
            Some(mut removed) = rx.recv() => {
                tokio::time::sleep(SETTLE).await;
                while let Ok(more) = rx.try_recv() {
                    removed.extend(more);
                }
                // A manifest removed is a removal even when it is back by
                // now, as the kubelet's inotify source sees it: its pod
                // stops, and the one read next starts anew.
                let kept: BTreeMap<String, Pod> = last
                    .pods
                    .iter()
                    .filter(|(k, _)| last.files.get(*k).is_none_or(|f| !removed.contains(f)))
                    .map(|(k, p)| (k.clone(), p.clone()))
                    .collect();
                if kept.len() < last.pods.len() {
                    sources.set_static(static_pod::FILE_SOURCE, kept);
                }
            }
        }
    }
}

/// The deadline of one `staticPodURL` request (the kubelet's).
const URL_TIMEOUT: Duration = Duration::from_secs(10);

/// The http source, as the kubelet's (`pkg/kubelet/config/http.go`): reads
/// `url` with `headers` at start and every `period`, and gives `sources` the
/// static pods of its body ([`static_pod::decode_url_body`]). An answer
/// other than 200 changes nothing; an empty body is no pods; a body equal to
/// the last one is not decoded again; a body that is not good pods changes
/// nothing. Failures are logged at the first three in a row, then once
/// more to say they go on, and a success after them once. Runs until aborted.
pub async fn run_url_source(
    url: String,
    headers: BTreeMap<String, Vec<String>>,
    node: String,
    period: Duration,
    sources: PodSources,
) {
    let client = match reqwest::Client::builder().timeout(URL_TIMEOUT).build() {
        Ok(c) => c,
        Err(e) => {
            warn!(error = %e, "static pod URL: no HTTP client");
            return;
        }
    };
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<Vec<u8>> = None;
    let mut failures: u32 = 0;
    info!(%url, "static pods from a URL");
    loop {
        tick.tick().await;
        let result = fetch(&client, &url, &headers).await.and_then(|body| {
            if last.as_deref() == Some(body.as_slice()) {
                return Ok(None);
            }
            let pods = if body.is_empty() {
                BTreeMap::new()
            } else {
                static_pod::decode_url_body(&body, &url, &node)?
            };
            last = Some(body);
            Ok(Some(pods))
        });
        match result {
            Ok(pods) => {
                if failures > 0 {
                    info!(%url, "read static pods from the URL again");
                }
                failures = 0;
                if let Some(pods) = pods {
                    sources.set_static(static_pod::HTTP_SOURCE, pods);
                }
            }
            Err(error) => {
                failures = failures.saturating_add(1);
                match failures {
                    1..=3 => warn!(%error, "static pod URL not used"),
                    4 => {
                        warn!(%error, "static pod URL still failing; not logged again until it works")
                    }
                    _ => {}
                }
            }
        }
    }
}

/// One GET of `url` with `headers`: its body (at most
/// [`static_pod::MAX_MANIFEST_BYTES`]) when the answer is 200.
async fn fetch(
    client: &reqwest::Client,
    url: &str,
    headers: &BTreeMap<String, Vec<String>>,
) -> Result<Vec<u8>, String> {
    let mut request = client.get(url);
    for (name, values) in headers {
        for value in values {
            request = request.header(name.as_str(), value.as_str());
        }
    }
    let mut response = request.send().await.map_err(|e| format!("{url}: {e}"))?;
    if response.status() != reqwest::StatusCode::OK {
        return Err(format!("{url}: {}", response.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| format!("{url}: {e}"))? {
        body.extend_from_slice(&chunk);
        if body.len() as u64 > static_pod::MAX_MANIFEST_BYTES {
            return Err(format!(
                "{url}: the answer is larger than {} bytes",
                static_pod::MAX_MANIFEST_BYTES
            ));
        }
    }
    Ok(body)
}

/// A watch of `path` (not recursive) that sends on `tx` at every change the
/// paths removed by it (none for other changes; reads are left out: reading
/// the manifests must not wake the reader).
fn watch(
    path: &Path,
    tx: tokio::sync::mpsc::UnboundedSender<Vec<PathBuf>>,
) -> notify::Result<notify::RecommendedWatcher> {
    use notify::Watcher as _;
    use notify::event::{EventKind, ModifyKind, RenameMode};
    let mut w = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        let Ok(ev) = ev else { return };
        let removed = match ev.kind {
            EventKind::Access(_) => return,
            EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(RenameMode::From)) => {
                ev.paths
            }
            _ => Vec::new(),
        };
        let _ = tx.send(removed);
    })?;
    w.watch(path, notify::RecursiveMode::NonRecursive)?;
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).expect("time")
    }

    /// A static pod `name` with UID `uid`, as the file source makes it.
    fn static_pod(name: &str, uid: &str) -> Pod {
        let mut p = pod(name).container("c", "busybox").build();
        p.metadata.uid = Some(uid.into());
        p.metadata.annotations = Some(BTreeMap::from([
            (static_pod::CONFIG_SOURCE_ANNOTATION.into(), "file".into()),
            (static_pod::CONFIG_HASH_ANNOTATION.into(), uid.into()),
        ]));
        p
    }

    /// The mirror pod (UID `uid`) of the static pod `name` with hash `hash`.
    fn mirror_pod(name: &str, uid: &str, hash: &str) -> Pod {
        let mut mirror = static_pod(name, uid);
        mirror
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(static_pod::CONFIG_MIRROR_ANNOTATION.into(), hash.into());
        mirror
    }

    fn with_grace(mut p: Pod, seconds: i64) -> Pod {
        p.spec
            .as_mut()
            .expect("spec")
            .termination_grace_period_seconds = Some(seconds);
        p
    }

    fn desired(pods: &[Pod]) -> BTreeMap<String, Pod> {
        pods.iter()
            .map(|p| (static_pod::key(p), p.clone()))
            .collect()
    }

    fn uid(p: Option<Arc<Pod>>) -> Option<String> {
        p.and_then(|p| p.metadata.uid.clone())
    }

    #[test]
    fn a_changed_manifest_stops_the_old_pod_before_the_new_one_starts() {
        let mut c = PodConfig::default();
        let v1 = static_pod("web", "u1");
        let keys = c.set_source("file", desired(&[v1]), at(0));
        assert_eq!(keys, BTreeSet::from(["default/web".to_string()]));
        let running = c.pod("default/web").expect("web");
        assert!(running.metadata.deletion_timestamp.is_none());
        assert!(
            running
                .metadata
                .annotations
                .as_ref()
                .expect("annotations")
                .contains_key(CONFIG_SEEN_ANNOTATION)
        );

        // The manifest changes: the old pod is stopped, with its grace period.
        let v2 = with_grace(static_pod("web", "u2"), 0);
        c.set_source("file", desired(&[v2]), at(5));
        let stopping = c.pod("default/web").expect("web");
        assert_eq!(stopping.metadata.uid.as_deref(), Some("u1"));
        assert_eq!(stopping.metadata.deletion_timestamp, Some(Time(at(5))));
        assert_eq!(stopping.metadata.deletion_grace_period_seconds, Some(30));
        // A second listing while it stops changes nothing.
        assert!(c.set_source("file", c.desired.clone(), at(6)).is_empty());
        assert!(!c.finished("default/web", "u9", at(7)), "another pod's end");
        assert!(c.finished("default/web", "u1", at(8)));
        assert_eq!(uid(c.pod("default/web")), Some("u2".into()));
    }

    #[test]
    fn a_removed_manifest_stops_the_pod_and_then_it_leaves() {
        let mut c = PodConfig::default();
        let p = with_grace(static_pod("web", "u1"), 0);
        c.set_source("file", desired(&[p]), at(0));
        c.set_source("file", BTreeMap::new(), at(1));
        // At least 1 s of grace, as the kubelet kills a removed static pod.
        assert_eq!(
            c.pod("default/web")
                .expect("web")
                .metadata
                .deletion_grace_period_seconds,
            Some(1)
        );
        assert!(c.finished("default/web", "u1", at(2)));
        assert!(c.pod("default/web").is_none());
        // The same manifest again: the same UID runs anew.
        c.set_source("file", desired(&[static_pod("web", "u1")]), at(3));
        assert_eq!(uid(c.pod("default/web")), Some("u1".into()));
    }

    #[test]
    fn mirror_pods_are_kept_aside_and_api_pods_of_a_static_name_are_hidden() {
        let mut c = PodConfig::default();
        c.set_source("file", desired(&[static_pod("web", "u1")]), at(0));
        let mirror = mirror_pod("web", "m1", "u1");
        let mut other = pod("db").container("c", "busybox").build();
        other.metadata.uid = Some("a1".into());
        let keys = c.api_replace(vec![mirror.clone(), other.clone()]);
        assert_eq!(keys.len(), 2);
        assert!(c.ready());
        // The static pod runs under its name; the mirror is not a pod to run.
        assert_eq!(uid(c.pod("default/web")), Some("u1".into()));
        assert_eq!(uid(c.mirror("default/web")), Some("m1".into()));
        let mut all: Vec<String> = c
            .pods()
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        all.sort();
        assert_eq!(all, ["a1", "u1"]);
        assert!(c.orphan_mirrors().is_empty());

        // An API pod named like the static pod stays hidden behind it.
        let mut impostor = pod("web").container("c", "busybox").build();
        impostor.metadata.uid = Some("x1".into());
        c.api_apply(impostor);
        assert!(c.shadowed("default/web"));
        assert_eq!(uid(c.pod("default/web")), Some("u1".into()));

        // The manifest goes: once the pod stopped, its mirror is an orphan.
        c.set_source("file", BTreeMap::new(), at(1));
        assert!(c.orphan_mirrors().is_empty(), "kept while the pod stops");
        c.finished("default/web", "u1", at(2));
        assert_eq!(
            uid(c.orphan_mirrors().into_iter().next()),
            None,
            "mirror replaced by the API pod"
        );
        // The hidden API pod shows through once the static pod left.
        assert_eq!(uid(c.pod("default/web")), Some("x1".into()));
    }

    #[test]
    fn the_census_tells_desired_from_orphaned_static_pods() {
        let census = |c: &PodConfig| {
            let mut working: Vec<(String, bool, bool)> = c
                .census()
                .working
                .iter()
                .map(|w| {
                    let uid = w.pod.metadata.uid.clone().unwrap_or_default();
                    (uid, w.is_static, w.orphan)
                })
                .collect();
            working.sort();
            let n = c.census();
            (working, n.desired_static, n.mirrors)
        };
        let mut c = PodConfig::default();
        c.set_source("file", desired(&[static_pod("web", "u1")]), at(0));
        let mut api = pod("db").container("c", "busybox").build();
        api.metadata.uid = Some("a1".into());
        c.api_replace(vec![api, mirror_pod("web", "m1", "u1")]);
        assert_eq!(
            census(&c),
            (
                vec![("a1".into(), false, false), ("u1".into(), true, false)],
                1,
                1
            )
        );
        // The manifest changes: the old pod is an orphan while it stops, and
        // its successor, waiting, is desired but not yet worked on.
        c.set_source("file", desired(&[static_pod("web", "u2")]), at(1));
        assert_eq!(
            census(&c),
            (
                vec![("a1".into(), false, false), ("u1".into(), true, true)],
                1,
                1
            )
        );
        c.finished("default/web", "u1", at(2));
        assert_eq!(census(&c).0[1], ("u2".into(), true, false));
        // The manifest goes: an orphan until stopped, then gone.
        c.set_source("file", BTreeMap::new(), at(3));
        assert_eq!(
            census(&c),
            (
                vec![("a1".into(), false, false), ("u2".into(), true, true)],
                0,
                1
            )
        );
        c.finished("default/web", "u2", at(4));
        assert_eq!(census(&c), (vec![("a1".into(), false, false)], 0, 1));
    }

    #[test]
    fn orphan_mirrors_wait_for_every_source() {
        let mut c = PodConfig {
            unlisted: BTreeSet::from(["file".to_string()]),
            ..PodConfig::default()
        };
        let mirror = mirror_pod("web", "m1", "u1");
        c.api_replace(vec![mirror.clone()]);
        assert!(
            c.orphan_mirrors().is_empty(),
            "the manifests are not read yet"
        );
        c.set_source("file", BTreeMap::new(), at(0));
        assert_eq!(
            uid(c.orphan_mirrors().into_iter().next()),
            Some("m1".into())
        );
        // Deleted by the API server: forgotten, by UID.
        let mut stale = mirror.clone();
        stale.metadata.uid = Some("m0".into());
        c.api_delete(&stale);
        assert!(c.mirror("default/web").is_some());
        c.api_delete(&mirror);
        assert!(c.mirror("default/web").is_none());
    }

    #[tokio::test]
    async fn the_store_holds_the_merged_set_and_changes_wake_their_pods() {
        let (sources, mut out) = PodSources::new(&["file"]);
        let store = sources.store();
        sources.set_static("file", desired(&[static_pod("web", "u1")]));
        // Filled by the manifests alone: the workers can start.
        assert_eq!(store.state().len(), 1);
        assert!(!*out.ready.borrow(), "the API server has not listed yet");
        assert_eq!(
            out.triggers.recv().await.and_then(|p| p.metadata.uid),
            Some("u1".into())
        );

        let mut other = pod("db").container("c", "busybox").build();
        other.metadata.uid = Some("a1".into());
        sources.api_event(watcher::Event::Init);
        sources.api_event(watcher::Event::InitApply(other.clone()));
        sources.api_event(watcher::Event::InitDone);
        assert_eq!(store.state().len(), 2);
        assert!(*out.ready.borrow());
        assert_eq!(
            out.triggers.recv().await.and_then(|p| p.metadata.uid),
            Some("a1".into())
        );

        // A mirror pod's change wakes its static pod.
        let mirror = mirror_pod("web", "m1", "u1");
        sources.api_event(watcher::Event::Apply(mirror));
        assert_eq!(
            out.triggers.recv().await.and_then(|p| p.metadata.uid),
            Some("u1".into())
        );
        assert_eq!(store.state().len(), 2, "a mirror pod is not a pod to run");

        // Removed, stopped, finished: it leaves the store, and its mirror is to go.
        sources.set_static("file", BTreeMap::new());
        let stopping = out.triggers.recv().await.expect("stopping");
        assert!(stopping.metadata.deletion_timestamp.is_some());
        sources.finished(&stopping);
        assert_eq!(store.state().len(), 1);
        assert_eq!(sources.orphan_mirrors().len(), 1);

        sources.api_event(watcher::Event::Delete(other));
        assert!(store.state().is_empty());
    }

    /// A pod list as a `staticPodURL` serves it, of pods `names`.
    fn pod_list(names: &[&str]) -> String {
        let items: Vec<serde_json::Value> = names
            .iter()
            .map(|n| serde_json::json!({"metadata": {"name": n}, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}))
            .collect();
        serde_json::json!({"apiVersion": "v1", "kind": "PodList", "items": items}).to_string()
    }

    /// Waits up to 5 s for `check` on the store's pods.
    async fn eventually(store: &Store<Pod>, what: &str, check: impl Fn(&[Arc<Pod>]) -> bool) {
        for _ in 0..100 {
            if check(&store.state()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "{what}: store now {:?}",
            store
                .state()
                .iter()
                .map(|p| static_pod::key(p))
                .collect::<Vec<_>>()
        );
    }

    #[tokio::test]
    async fn the_url_source_reads_pods_with_its_headers_and_an_error_changes_nothing() {
        use http_body_util::Full;
        use hyper::body::Bytes;
        type Answer = Arc<Mutex<(u16, String)>>;
        let answer: Answer = Arc::new(Mutex::new((200, pod_list(&["web", "db"]))));
        let seen = Arc::new(Mutex::new(Vec::<Vec<String>>::new()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/pods", listener.local_addr().expect("addr"));
        let server = tokio::spawn({
            let (answer, seen) = (answer.clone(), seen.clone());
            async move {
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        return;
                    };
                    let (answer, seen) = (answer.clone(), seen.clone());
                    let service = hyper::service::service_fn(
                        move |req: hyper::Request<hyper::body::Incoming>| {
                            let tokens = req
                                .headers()
                                .get_all("x-token")
                                .iter()
                                .map(|v| v.to_str().unwrap_or_default().to_string())
                                .collect();
                            seen.lock().expect("seen").push(tokens);
                            let (code, body) = answer.lock().expect("answer").clone();
                            let resp = hyper::Response::builder()
                                .status(code)
                                .body(Full::new(Bytes::from(body)))
                                .expect("response");
                            async move { Ok::<_, std::convert::Infallible>(resp) }
                        },
                    );
                    tokio::spawn(
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(tcp), service),
                    );
                }
            }
        });
        let (sources, out) = PodSources::new(&["http"]);
        let store = sources.store();
        let headers = BTreeMap::from([(
            "X-Token".to_string(),
            vec!["a".to_string(), "b".to_string()],
        )]);
        let task = tokio::spawn(run_url_source(
            url.clone(),
            headers,
            "node-1".into(),
            Duration::from_millis(100),
            sources.clone(),
        ));
        eventually(&store, "both pods of the list", |pods| pods.len() == 2).await;
        let web = store
            .get(&ObjectRef::new("web-node-1").within("default"))
            .expect("web");
        assert!(crate::pod_core::kind::PodKind::of(&web).is_static);
        assert_eq!(
            web.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(static_pod::CONFIG_SOURCE_ANNOTATION))
                .map(String::as_str),
            Some("http")
        );
        // No toleration added to a pod from a URL.
        assert!(
            web.spec
                .as_ref()
                .and_then(|s| s.tolerations.as_ref())
                .is_none()
        );
        assert!(!*out.ready.borrow(), "the API server has not listed");
        assert_eq!(
            seen.lock().expect("seen")[0],
            ["a", "b"],
            "each header value, in order"
        );

        // A failing answer changes nothing.
        *answer.lock().expect("answer") = (500, String::new());
        let asked = seen.lock().expect("seen").len();
        eventually(&store, "asked again", |_| {
            seen.lock().expect("seen").len() > asked + 2
        })
        .await;
        assert!(
            store
                .state()
                .iter()
                .all(|p| p.metadata.deletion_timestamp.is_none())
        );
        // One pod only now: the other stops.
        *answer.lock().expect("answer") = (200, pod_list(&["web"]));
        eventually(&store, "db stopping", |pods| {
            pods.iter().any(|p| {
                p.metadata.name.as_deref() == Some("db-node-1")
                    && p.metadata.deletion_timestamp.is_some()
            })
        })
        .await;
        // A body with one bad pod is dropped whole.
        *answer.lock().expect("answer") = (200, pod_list(&["web", ""]));
        let asked = seen.lock().expect("seen").len();
        eventually(&store, "asked again", |_| {
            seen.lock().expect("seen").len() > asked + 2
        })
        .await;
        let web_now = store
            .get(&ObjectRef::new("web-node-1").within("default"))
            .expect("web");
        assert!(web_now.metadata.deletion_timestamp.is_none());
        // An answer over 10 MiB is not read to its end, nor used: the pod
        // it adds never comes.
        let mut huge = pod_list(&["web", "extra"]);
        huge.push_str(&" ".repeat(11 << 20));
        *answer.lock().expect("answer") = (200, huge);
        let asked = seen.lock().expect("seen").len();
        eventually(&store, "asked again", |_| {
            seen.lock().expect("seen").len() > asked + 2
        })
        .await;
        assert!(
            store
                .get(&ObjectRef::new("extra-node-1").within("default"))
                .is_none()
        );
        // An empty body: no pods.
        *answer.lock().expect("answer") = (200, String::new());
        eventually(&store, "web stopping", |pods| {
            pods.iter().all(|p| p.metadata.deletion_timestamp.is_some())
        })
        .await;
        task.abort();
        server.abort();
    }

    #[tokio::test]
    async fn a_manifest_removed_and_written_back_at_once_stops_its_pod_and_starts_it_anew() {
        let dir = tempfile::tempdir().expect("dir");
        let manifest = dir.path().join("web.yaml");
        let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox\n";
        std::fs::write(&manifest, text).expect("manifest");
        let (sources, _out) = PodSources::new(&["file"]);
        let store = sources.store();
        let task = tokio::spawn(run_file_source(
            dir.path().to_path_buf(),
            "node-1".into(),
            Duration::from_secs(3600),
            sources.clone(),
        ));
        eventually(&store, "web runs", |pods| pods.len() == 1).await;
        let first = store.state()[0].clone();
        // Removed and written back before any reading could see it gone.
        std::fs::remove_file(&manifest).expect("remove");
        std::fs::write(&manifest, text).expect("write back");
        eventually(&store, "web stopping", |pods| {
            pods.first()
                .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
        })
        .await;
        // Once stopped, the manifest read back runs anew, under the same UID.
        let stopping = store.state()[0].clone();
        sources.finished(&stopping);
        eventually(&store, "web runs again", |pods| {
            pods.first().is_some_and(|p| {
                p.metadata.deletion_timestamp.is_none() && p.metadata.uid == first.metadata.uid
            })
        })
        .await;
        // A change that removes nothing is read as before.
        std::fs::write(&manifest, text.replace("busybox", "busybox:2")).expect("edit");
        eventually(&store, "the old version stopping", |pods| {
            pods.first()
                .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
        })
        .await;
        task.abort();
    }
}
