//! The image manager: makes sure a container's image is on the node before it
//! is created, as the kubelet's `pkg/kubelet/images` (`EnsureImageExists` with
//! its pull policies, events and back-off) with the credentials of the pod's
//! `imagePullSecrets` (the kubelet's keyring, [`super::credentials`]) and the
//! pull concurrency of `serializeImagePulls` / `maxParallelImagePulls`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client};
use tokio::sync::Semaphore;
use tracing::warn;

use super::credentials::Keyring;
use super::plan::{PullBackoff, Waiting, crash_backoff};
use crate::cri::Runtime;
use crate::events::{EventType, Recorder};
use crate::reasons::{event, waiting};

/// How many image pulls run at once, from the KubeletConfiguration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PullConcurrency {
    /// One pull at a time (`serializeImagePulls: true`, the kubelet's default).
    #[default]
    Serial,
    /// At most this many at once (`serializeImagePulls: false` with `maxParallelImagePulls`).
    Limited(u32),
    /// No limit (`serializeImagePulls: false`, no `maxParallelImagePulls`).
    Unlimited,
}

/// What a container is created from: the image ID and the image's user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageInfo {
    /// Image ID (`sha256:...`), or the reference the pull returned.
    pub id: String,
    /// The image's numeric user, if it has one.
    pub uid: Option<i64>,
    /// The image's user name, if not numeric.
    pub username: String,
}

impl ImageInfo {
    fn from_cri(i: cri::Image) -> Self {
        Self {
            id: i.id,
            uid: i.uid.map(|u| u.value),
            username: i.username,
        }
    }
}

/// Pull back-off of one container: consecutive failures and until when it holds.
type Backoffs = BTreeMap<String, (u32, PullBackoff)>;

/// The image manager; one per agent, shared by every pod worker.
pub struct ImageManager {
    runtime: Runtime,
    client: Client,
    recorder: Recorder,
    /// Pull slots; none: unlimited.
    slots: Option<Semaphore>,
    /// Pull back-offs by pod UID, then container name.
    backoffs: Mutex<HashMap<String, Backoffs>>,
}

impl ImageManager {
    /// An image manager pulling through `runtime`, reading pull secrets with
    /// `client`, publishing events with `recorder`.
    #[must_use]
    pub fn new(
        runtime: Runtime,
        client: Client,
        recorder: Recorder,
        concurrency: PullConcurrency,
    ) -> Self {
        let slots = match concurrency {
            PullConcurrency::Serial => Some(1),
            PullConcurrency::Limited(n) => Some(usize::try_from(n.max(1)).unwrap_or(usize::MAX)),
            PullConcurrency::Unlimited => None,
        };
        Self {
            runtime,
            client,
            recorder,
            slots: slots.map(|n| Semaphore::new(n.min(Semaphore::MAX_PERMITS))),
            backoffs: Mutex::new(HashMap::new()),
        }
    }

    fn with_backoffs<T>(&self, uid: &str, f: impl FnOnce(&mut Backoffs) -> T) -> T {
        let mut map = self.backoffs.lock().unwrap_or_else(PoisonError::into_inner);
        f(map.entry(uid.to_string()).or_default())
    }

    /// The pull back-offs of pod `uid`'s containers by name, an input of the plan.
    #[must_use]
    pub fn backoffs(&self, uid: &str) -> BTreeMap<String, PullBackoff> {
        let map = self.backoffs.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(uid)
            .map(|m| m.iter().map(|(k, (_, b))| (k.clone(), b.clone())).collect())
            .unwrap_or_default()
    }

    /// Whether anything of pod `uid` is held (a pull back-off).
    #[must_use]
    pub fn tracks(&self, uid: &str) -> bool {
        self.backoffs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(uid)
    }

    /// Forgets everything about pod `uid` (it is gone).
    pub fn forget(&self, uid: &str) {
        self.backoffs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(uid);
    }

    /// Forgets the back-offs of pods whose UID `keep` rejects.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut map = self.backoffs.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|uid, _| keep(uid));
    }

    /// Container `name` of pod `uid` started: its pull back-off ends.
    pub fn started(&self, uid: &str, name: &str) {
        let mut map = self.backoffs.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = map.get_mut(uid) {
            m.remove(name);
            if m.is_empty() {
                map.remove(uid);
            }
        }
    }

    fn event(&self, pod: &Pod, c: &str, type_: EventType, reason: &str, note: String) {
        crate::events::publish(&self.recorder, pod, Some(c), type_, reason, note);
    }

    /// Makes sure `image` is on the node for container `name` of `pod` under
    /// pull `policy` (`Always`, `IfNotPresent`, `Never`), as the kubelet's
    /// `EnsureImageExists`, with its `Pulling`/`Pulled`/`Failed` events.
    ///
    /// # Errors
    /// The container's waiting reason: `ErrImageNeverPull`, or `ErrImagePull`
    /// after a failed pull, which starts the pull back-off (10 s doubling to
    /// 300 s) that the plan then shows as `ImagePullBackOff`.
    pub async fn ensure_image(
        &self,
        pod: &Pod,
        name: &str,
        image: &str,
        policy: &str,
        sandbox_config: &cri::PodSandboxConfig,
    ) -> Result<ImageInfo, Waiting> {
        let present = match self.runtime.image_id(image).await {
            Ok(found) => found,
            Err(e) => {
                warn!(error = %e, image, "image status");
                None
            }
        };
        if let Some(found) = present.filter(|_| policy != "Always") {
            let note = format!("Container image \"{image}\" already present on machine");
            self.event(pod, name, EventType::Normal, event::PULLED, note);
            return Ok(ImageInfo::from_cri(found));
        }
        if policy == "Never" {
            let msg =
                format!("Container image \"{image}\" is not present with pull policy of Never");
            let reason = event::ERR_IMAGE_NEVER_PULL;
            self.event(pod, name, EventType::Warning, reason, msg.clone());
            return Err(Waiting {
                reason: waiting::ERR_IMAGE_NEVER_PULL.into(),
                message: msg,
            });
        }
        let note = format!("Pulling image \"{image}\"");
        self.event(pod, name, EventType::Normal, event::PULLING, note);
        let credentials = self.pull_credentials(pod).await.lookup(image);
        let queued = Instant::now();
        let _slot = match &self.slots {
            Some(slots) => slots.acquire().await.ok(),
            None => None,
        };
        let started = Instant::now();
        match self.pull_with(image, sandbox_config, credentials).await {
            Ok(image_ref) => {
                let note = format!(
                    "Successfully pulled image \"{image}\" in {:.3}s ({:.3}s including waiting)",
                    started.elapsed().as_secs_f64(),
                    queued.elapsed().as_secs_f64()
                );
                self.event(pod, name, EventType::Normal, event::PULLED, note);
                let pulled = self.runtime.image_id(image).await.ok().flatten();
                Ok(pulled.map_or_else(
                    || ImageInfo {
                        id: if image_ref.is_empty() {
                            image.to_string()
                        } else {
                            image_ref
                        },
                        uid: None,
                        username: String::new(),
                    },
                    ImageInfo::from_cri,
                ))
            }
            Err(e) => Err(self.pull_failed(pod, name, image, &e.to_string())),
        }
    }

    /// Records a failed pull of `image` for container `name`: its events and
    /// the next step of its back-off; returns the `ErrImagePull` waiting reason.
    fn pull_failed(&self, pod: &Pod, name: &str, image: &str, message: &str) -> Waiting {
        let note = format!("Failed to pull image \"{image}\": {message}");
        self.event(pod, name, EventType::Warning, event::FAILED, note);
        let note = format!("Error: {}", waiting::ERR_IMAGE_PULL);
        self.event(pod, name, EventType::Warning, event::FAILED, note);
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        self.with_backoffs(uid, |m| {
            let failures = m.get(name).map_or(0, |(n, _)| *n).saturating_add(1);
            // The restart back-off's curve: both are the kubelet's
            // `flowcontrol.Backoff`, 10 s doubling to 300 s.
            let delay = crash_backoff(failures);
            let until = Timestamp::now() + delay;
            let image = image.to_string();
            m.insert(name.to_string(), (failures, PullBackoff { until, image }));
        });
        Waiting {
            reason: waiting::ERR_IMAGE_PULL.into(),
            message: message.to_string(),
        }
    }

    /// Pulls `image` with each of `credentials` in turn until one works, or
    /// anonymously when there are none; the last failure otherwise, as the
    /// kubelet's `pullImage` tries the keyring's matches.
    async fn pull_with(
        &self,
        image: &str,
        sandbox_config: &cri::PodSandboxConfig,
        credentials: Vec<cri::AuthConfig>,
    ) -> crate::cri::Result<String> {
        let mut tries: Vec<Option<cri::AuthConfig>> = credentials.into_iter().map(Some).collect();
        // The last try's outcome is the answer; with no credentials it is anonymous.
        let last = tries.pop().unwrap_or(None);
        for auth in tries {
            let pulled = self.runtime.pull_image(image, sandbox_config.clone(), auth);
            if let Ok(image_ref) = pulled.await {
                return Ok(image_ref);
            }
        }
        self.runtime
            .pull_image(image, sandbox_config.clone(), last)
            .await
    }

    /// The pod's `imagePullSecrets` as a keyring. Secrets that are missing or
    /// of the wrong type are skipped with the kubelet's
    /// `FailedToRetrieveImagePullSecret` event, and the pull goes on without them.
    async fn pull_credentials(&self, pod: &Pod) -> Keyring {
        let mut keyring = Keyring::default();
        let names: Vec<String> = pod
            .spec
            .as_ref()
            .and_then(|s| s.image_pull_secrets.as_ref())
            .into_iter()
            .flatten()
            .map(|r| r.name.clone())
            .filter(|n| !n.is_empty())
            .collect();
        if names.is_empty() {
            return keyring;
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &ns);
        let mut missing = Vec::new();
        for name in names {
            let secret = match secrets.get_opt(&name).await {
                Ok(Some(s)) => s,
                Ok(None) => {
                    missing.push(name);
                    continue;
                }
                Err(e) => {
                    warn!(error = %e, secret = name, "get image pull secret");
                    missing.push(name);
                    continue;
                }
            };
            let data: BTreeMap<String, Vec<u8>> = secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect();
            let type_ = secret.type_.as_deref().unwrap_or_default();
            if let Err(e) = keyring.add_secret(type_, &data) {
                warn!(error = %e, secret = name, "image pull secret not used");
                missing.push(name);
            }
        }
        if !missing.is_empty() {
            let note = format!(
                "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                missing.join(", ")
            );
            let reason = event::FAILED_TO_RETRIEVE_IMAGE_PULL_SECRET;
            crate::events::publish(&self.recorder, pod, None, EventType::Warning, reason, note);
        }
        keyring
    }
}
