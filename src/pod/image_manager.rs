//! The image manager: makes sure a container's image is on the node before it
//! is created, as the kubelet's `pkg/kubelet/images` (`EnsureImageExists` with
//! its pull policies, events and back-off) with the credentials of the pod's
//! `imagePullSecrets` (the kubelet's keyring, [`super::credentials`]), the
//! pull concurrency of `serializeImagePulls` / `maxParallelImagePulls` and
//! the pull rate of `registryPullQPS` / `registryBurst`.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use super::credentials::{Keyring, SecretSource, Source};
use crate::credential_provider::{CredentialProviders, PodIdentity, ServiceAccountCoordinates};
use crate::cri::Runtime;
use crate::events::{EventType, Recorder};
use crate::image_policy::{image_name, is_image_id};
use crate::pod_core::backoff::crash_backoff;
use crate::pod_core::plan::{PullBackoff, Waiting};
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

/// The pulls' token bucket (`registryPullQPS`, `registryBurst`), as the
/// kubelet's `throttleImagePulling`: each pull the runtime is asked for
/// takes a token or fails at once, never waits.
struct PullBucket {
    /// None: a burst of 0, which lets no pull through (as a
    /// `flowcontrol.NewTokenBucketRateLimiter` of burst 0).
    limiter: Option<governor::DefaultDirectRateLimiter>,
}

impl PullBucket {
    /// A token for one pull, if the bucket has one.
    fn take(&self) -> bool {
        self.limiter.as_ref().is_some_and(|l| l.check().is_ok())
    }
}

/// Why a pull failed: the runtime's answer, or no token in the bucket.
#[derive(Debug, thiserror::Error)]
enum PullError {
    /// The pull rate's bucket was empty (the kubelet's words).
    #[error("pull QPS exceeded")]
    Throttled,
    /// The runtime refused or failed the pull.
    #[error(transparent)]
    Runtime(#[from] crate::cri::Error),
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
    /// The pull rate; none: unlimited.
    rate: Option<PullBucket>,
    /// Pull back-offs by pod UID, then container name.
    backoffs: Mutex<HashMap<String, Backoffs>>,
    /// Which credentials pulled which image; none: images present are used
    /// without verification.
    records: Option<PullRecords>,
    /// Which present images need a pod's credentials verified.
    policy: crate::image_policy::VerificationPolicy,
    /// The credential provider plugins; none: none configured.
    providers: Option<CredentialProviders>,
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
            rate: None,
            backoffs: Mutex::new(HashMap::new()),
            records: None,
            policy: crate::image_policy::VerificationPolicy::default(),
            providers: None,
        }
    }

    /// Asks `providers`, when some are configured, for credentials for
    /// every image one of them matches, tried after the pod's pull
    /// secrets', as the kubelet's keyring puts the external providers
    /// after the secrets.
    #[must_use]
    pub fn with_credential_providers_of(self, providers: Option<CredentialProviders>) -> Self {
        Self { providers, ..self }
    }

    /// Limits pulls to `qps` a second with a burst of `burst`
    /// (`registryPullQPS`, `registryBurst`): a pull past them fails with
    /// "pull QPS exceeded" and goes through the image back-off, as the
    /// kubelet's `throttleImagePulling`. A `qps` of 0 sets no limit.
    #[must_use]
    pub fn with_pull_rate(mut self, qps: u32, burst: u32) -> Self {
        self.rate = NonZeroU32::new(qps).map(|qps| PullBucket {
            limiter: NonZeroU32::new(burst).map(|burst| {
                governor::RateLimiter::direct(governor::Quota::per_second(qps).allow_burst(burst))
            }),
        });
        self
    }

    /// Keeps image pull records under `root_dir/image_manager` and verifies
    /// a pod's credentials before it may use an image present on the node
    /// (KEP-2535, the kubelet's `KubeletEnsureSecretPulledImages`), where
    /// `policy` (`imagePullCredentialsVerificationPolicy`) asks for it: by
    /// default (`NeverVerifyPreloadedImages`) the images the agent pulled.
    #[must_use]
    pub fn with_pull_records(
        self,
        root_dir: &Path,
        policy: crate::image_policy::VerificationPolicy,
    ) -> Self {
        Self {
            records: Some(PullRecords::new(root_dir)),
            policy,
            ..self
        }
    }

    /// Whether a pod presenting `secrets` (for `image`) must pull the present
    /// image `image_ref` again before it may use it (the kubelet's
    /// `MustAttemptImagePull`). The policy decides first
    /// ([`crate::image_policy::VerificationPolicy::requires_verification`]):
    /// with `NeverVerify`, or an image the allowlist names, nothing is
    /// checked; an image the policy wants verified that has no record
    /// (preloaded) is pulled again. Then an image the agent pulled is used by a pod
    /// whose secrets include one that pulled it (same coordinates, or a
    /// credential with the same hash), or by any pod once it was pulled
    /// without credentials. A record that cannot be read, or a pull of this
    /// name that was cut short, means verifying; under the default policy
    /// an image the agent never pulled (preloaded) is used as it is. An image named
    /// by its ID is used by a pod that could use it under one of the names
    /// it was pulled under, else verified (a pull by ID, which a registry
    /// cannot serve: the pod cannot reach content it has no credential for).
    #[must_use]
    pub fn must_verify(
        &self,
        image: &str,
        image_ref: &str,
        secrets: &[PullSecret],
        account: Option<&ServiceAccountCoordinates>,
    ) -> bool {
        match self.verification(image, image_ref) {
            Verification::Use => false,
            Verification::Pull => true,
            Verification::Credentials(allowed) => {
                !self.presents(image, image_ref, &allowed, secrets, account)
            }
        }
    }

    /// What [`ImageManager::must_verify`] decides before it looks at the
    /// pod's credentials: use the image, pull it, or compare the pod's
    /// credentials with those recorded (the kubelet's `MustAttemptImagePull`
    /// asks for them, and so runs credential providers, only then).
    fn verification(&self, image: &str, image_ref: &str) -> Verification {
        let Some(records) = &self.records else {
            return Verification::Use;
        };
        let policy = &self.policy;
        let by_policy = |pulled: bool| {
            if policy.requires_verification(image_name(image), pulled) {
                Verification::Pull
            } else {
                Verification::Use
            }
        };
        let record = match records.pulled(image_ref) {
            Ok(Some(r)) => r,
            // Preloaded, unless a pull of it was cut short.
            Ok(None) => return by_policy(records.pulling(image)),
            Err(e) => {
                warn!(error = %e, image, "image pull record; verifying the pod's credentials");
                return Verification::Pull;
            }
        };
        // The record is of the image's content. An image named by its ID
        // names the content alone: a pod may use it as it could under any
        // name it was pulled under, with any of its secrets (the kubelet
        // goes further and verifies every ID of an image it pulled).
        if is_image_id(image) {
            if !policy.requires_verification(image, true) {
                return Verification::Use;
            }
            let allowed: Vec<PullCredentials> = record.credential_mapping.into_values().collect();
            if allowed.iter().any(|a| a.node_pods_accessible) {
                return Verification::Use;
            }
            return Verification::Credentials(allowed);
        }
        // The credentials recorded for this repository, under any of its
        // spellings (`x`, `docker.io/library/x`: the runtime resolves them
        // to one image, so a pod cannot reach a private image by another
        // spelling of its name).
        let repository = crate::registry::normalized_repository(image);
        let allowed = record
            .credential_mapping
            .into_iter()
            .find(|(name, _)| crate::registry::normalized_repository(name) == repository)
            .map(|(_, allowed)| allowed);
        // Another repository the agent never pulled this content under came
        // onto the node another way: preloaded, unless a pull of this name
        // was cut short.
        let Some(allowed) = allowed else {
            return by_policy(records.pulling(image));
        };
        if !policy.requires_verification(image_name(image), true) || allowed.node_pods_accessible {
            return Verification::Use;
        }
        Verification::Credentials(vec![allowed])
    }

    /// Whether a pod presenting `secrets` and running as `account` holds one
    /// of the credentials `allowed` records for the present image; a
    /// matching secret of an image named by name is remembered too (a new
    /// one with a known credential, or a known one whose credential
    /// changed), as the kubelet does.
    fn presents(
        &self,
        image: &str,
        image_ref: &str,
        allowed: &[PullCredentials],
        secrets: &[PullSecret],
        account: Option<&ServiceAccountCoordinates>,
    ) -> bool {
        // A provider gave the pod's service account a credential that
        // pulled it (the kubelet's `KubernetesServiceAccounts`).
        let by_account =
            |a: &PullCredentials| account.is_some_and(|s| a.service_accounts.contains(s));
        if is_image_id(image) {
            return allowed
                .iter()
                .any(|a| matching(a, secrets).is_some() || by_account(a));
        }
        let Some(first) = allowed.first() else {
            return false;
        };
        let Some(matching) = matching(first, secrets) else {
            return by_account(first);
        };
        if let Some(records) = &self.records {
            let creds = PullCredentials {
                secrets: vec![matching.clone()],
                ..PullCredentials::default()
            };
            if let Err(e) = records.record(image, image_ref, &creds, Timestamp::now()) {
                warn!(error = %e, image, "update image pull record");
            }
        }
        true
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
        if let Some(p) = &self.providers {
            p.forget_pod(uid);
        }
    }

    /// Forgets the back-offs, and the service account tokens requested for
    /// credential providers, of pods whose UID `keep` rejects.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut map = self.backoffs.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|uid, _| keep(uid));
        if let Some(p) = &self.providers {
            p.retain_pods(&keep);
        }
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
        let mut keyring = None;
        if let Some(found) = present.filter(|_| policy != "Always") {
            // The pod's credentials (its secrets' API calls, the credential
            // providers' runs) are sought only when the record asks for
            // them.
            let verified = match self.verification(image, &found.id) {
                Verification::Use => true,
                Verification::Pull => false,
                Verification::Credentials(allowed) => {
                    // Boxed, as below: the secrets' API calls make a large future.
                    let ring = Box::pin(self.pull_credentials(pod, image)).await;
                    let (secrets, account) = presented(&ring, image);
                    keyring = Some(ring);
                    self.presents(image, &found.id, &allowed, &secrets, account.as_ref())
                }
            };
            if verified {
                let note = format!("Container image \"{image}\" already present on machine");
                self.event(pod, name, EventType::Normal, event::PULLED, note);
                return Ok(ImageInfo::from_cri(found));
            }
            if policy == "Never" {
                let msg = format!(
                    "Container image \"{image}\" is present with pull policy of Never, but was pulled with credentials this pod does not have"
                );
                let reason = event::ERR_IMAGE_NEVER_PULL;
                self.event(pod, name, EventType::Warning, reason, msg.clone());
                return Err(Waiting {
                    reason: waiting::ERR_IMAGE_NEVER_PULL.into(),
                    message: msg,
                });
            }
            debug!(
                image,
                "image pulled with other credentials: pulling it with the pod's"
            );
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
        let keyring = match keyring {
            Some(k) => k,
            None => Box::pin(self.pull_credentials(pod, image)).await,
        };
        let credentials = keyring.lookup_sourced(image);
        let queued = Instant::now();
        let _slot = match &self.slots {
            Some(slots) => slots.acquire().await.ok(),
            None => None,
        };
        let started = Instant::now();
        if let Some(records) = &self.records
            && let Err(e) = records.start_pull(image)
        {
            warn!(error = %e, image, "write image pull intent");
        }
        let pulled = self.pull_with(image, sandbox_config, credentials).await;
        if let (Some(records), Ok((image_ref, used))) = (&self.records, &pulled) {
            let id = self.runtime.image_id(image).await.ok().flatten();
            let id = id.map_or_else(|| image_ref.clone(), |i| i.id);
            if let Err(e) = records.record(image, &id, used, Timestamp::now()) {
                warn!(error = %e, image, "write image pull record");
            }
        }
        if let Some(records) = &self.records {
            records.end_pull(image);
        }
        match pulled.map(|(image_ref, _)| image_ref) {
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
    ///
    /// Returns the image reference and the credentials that worked: the
    /// Secret of the credential, or node-wide access for an anonymous pull.
    async fn pull_with(
        &self,
        image: &str,
        sandbox_config: &cri::PodSandboxConfig,
        credentials: Vec<(Source, cri::AuthConfig)>,
    ) -> Result<(String, PullCredentials), PullError> {
        // As the kubelet's `trackedToImagePullCreds`.
        let used = |source: Source, auth: Option<&cri::AuthConfig>| match (source, auth) {
            (Source::Secret(s), Some(auth)) => PullCredentials {
                secrets: vec![PullSecret {
                    uid: s.uid,
                    namespace: s.namespace,
                    name: s.name,
                    credential_hash: credential_hash(auth),
                }],
                ..PullCredentials::default()
            },
            (Source::ServiceAccount(a), Some(_)) => PullCredentials {
                service_accounts: vec![a],
                ..PullCredentials::default()
            },
            // A credential of no Secret is recorded as none: the image
            // is verified again for every pod.
            (Source::Unsourced, Some(_)) => PullCredentials::default(),
            // Anonymous, or a provider's node-wide credential.
            (_, None) | (Source::Node, Some(_)) => PullCredentials {
                node_pods_accessible: true,
                ..PullCredentials::default()
            },
        };
        let mut tries: Vec<(Source, Option<cri::AuthConfig>)> =
            credentials.into_iter().map(|(s, a)| (s, Some(a))).collect();
        // The last try's outcome is the answer; with no credentials it is anonymous.
        let (last_source, last) = tries.pop().unwrap_or((Source::Unsourced, None));
        for (source, auth) in tries {
            if let Ok(image_ref) = self.pull(image, sandbox_config, auth.clone()).await {
                return Ok((image_ref, used(source, auth.as_ref())));
            }
        }
        let image_ref = self.pull(image, sandbox_config, last.clone()).await?;
        Ok((image_ref, used(last_source, last.as_ref())))
    }

    /// One pull by the runtime, once the pull rate gives a token.
    async fn pull(
        &self,
        image: &str,
        sandbox_config: &cri::PodSandboxConfig,
        auth: Option<cri::AuthConfig>,
    ) -> Result<String, PullError> {
        if self.rate.as_ref().is_some_and(|r| !r.take()) {
            return Err(PullError::Throttled);
        }
        Ok(self
            .runtime
            .pull_image(image, sandbox_config.clone(), auth)
            .await?)
    }

    /// The credentials for `image` as a keyring: the pod's
    /// `imagePullSecrets`, then what the credential providers give
    /// ([`ImageManager::provided`]). Secrets that are missing or of the
    /// wrong type are skipped with the kubelet's
    /// `FailedToRetrieveImagePullSecret` event, and the pull goes on
    /// without them.
    async fn pull_credentials(&self, pod: &Pod, image: &str) -> Keyring {
        let mut keyring = self.secrets_keyring(pod).await;
        self.provided(pod, image, &mut keyring).await;
        keyring
    }

    /// Adds to `keyring` what the credential providers give for `image`
    /// pulled for `pod` (nothing for an image named by its ID); a provider
    /// that failed gives nothing, with a `FailedCredentialProvider` event
    /// naming it and why (the kubelet only logs it).
    async fn provided(&self, pod: &Pod, image: &str, keyring: &mut Keyring) {
        let Some(providers) = &self.providers else {
            return;
        };
        if is_image_id(image) {
            return;
        }
        let repository = crate::registry::normalized_repository(image);
        let (namespace, name, uid) = crate::pod_core::facts::pod_identity(pod);
        let identity = PodIdentity {
            namespace,
            name,
            uid,
            service_account: pod
                .spec
                .as_ref()
                .and_then(|s| s.service_account_name.clone())
                .unwrap_or_default(),
        };
        for result in providers.provide(&repository, &identity).await {
            match result {
                Ok(provided) => keyring.add_provided(&provided),
                Err(e) => {
                    warn!(error = %e, image, "credential provider");
                    let note = format!("{e}; pulling without its credentials");
                    let reason = event::FAILED_CREDENTIAL_PROVIDER;
                    crate::events::publish(
                        &self.recorder,
                        pod,
                        None,
                        EventType::Warning,
                        reason,
                        note,
                    );
                }
            }
        }
    }

    /// The pod's `imagePullSecrets` as a keyring.
    async fn secrets_keyring(&self, pod: &Pod) -> Keyring {
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
            let source = SecretSource {
                namespace: ns.clone(),
                name: name.clone(),
                uid: secret.metadata.uid.clone().unwrap_or_default(),
            };
            if let Err(e) = keyring.add_secret_from(Some(source), type_, &data) {
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

/// What a present image's record asks of a pod ([`ImageManager::verification`]).
enum Verification {
    /// The pod may use it as it is.
    Use,
    /// The pod must pull it.
    Pull,
    /// The pod may use it if it presents one of these recorded credentials.
    Credentials(Vec<PullCredentials>),
}

/// What a pod presents for `image`, as a record would hold it: its pull
/// secrets that have a credential for it, and the first service account a
/// credential provider was given a token of (the kubelet takes one per
/// pod); every credential for an image named by its ID.
fn presented(
    keyring: &Keyring,
    image: &str,
) -> (Vec<PullSecret>, Option<ServiceAccountCoordinates>) {
    let sourced = if is_image_id(image) {
        keyring.all_sourced()
    } else {
        keyring.lookup_sourced(image)
    };
    let mut secrets = Vec::new();
    let mut account = None;
    for (source, auth) in sourced {
        match source {
            Source::Secret(s) => secrets.push(PullSecret {
                uid: s.uid,
                namespace: s.namespace,
                name: s.name,
                credential_hash: credential_hash(&auth),
            }),
            Source::ServiceAccount(a) if account.is_none() => account = Some(a),
            _ => {}
        }
    }
    (secrets, account)
}

/// Errors of the image pull records.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A record could not be read, written or removed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A record file does not hold a record, or is larger than one can be.
    #[error("invalid image pull record {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
}

/// The most bytes a record file is read for; a larger one is not a record.
const MAX_RECORD_BYTES: u64 = 1 << 20;
/// The most secrets one image name keeps in a record; past it the oldest
/// go (a pod presenting one of them is verified again by a pull).
const MAX_SECRETS_PER_IMAGE: usize = 128;
/// The most image names one record keeps; past it the oldest go, likewise.
const MAX_IMAGES_PER_RECORD: usize = 128;

/// The Secret of a pod's pull credential as a record holds it: its
/// coordinates and the hash of the credential it gave (the kubelet's
/// `ImagePullSecret`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullSecret {
    /// The Secret's UID.
    pub uid: String,
    /// The Secret's namespace.
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
    /// SHA-256 (hex) of the credential the Secret gave for the image.
    pub credential_hash: String,
}

/// Who may use an image name of a pulled image (the kubelet's
/// `ImagePullCredentials`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PullCredentials {
    /// Pods presenting one of these Secrets.
    #[serde(
        default,
        rename = "kubernetesSecretCoordinates",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub secrets: Vec<PullSecret>,
    /// Pods running as one of these service accounts: a credential provider
    /// given its token pulled the image.
    #[serde(
        default,
        rename = "kubernetesServiceAccounts",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub service_accounts: Vec<ServiceAccountCoordinates>,
    /// Any pod of the node: the image was pulled without credentials, or
    /// with a credential provider's node-wide ones.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub node_pods_accessible: bool,
}

/// What the agent knows of how an image got onto the node (the kubelet's
/// `ImagePulledRecord`, `kubelet.config.k8s.io/v1alpha1`), one file per
/// image ID under `<root-dir>/image_manager/pulled/`.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PulledRecord {
    /// `ImagePulledRecord`.
    pub kind: String,
    /// `kubelet.config.k8s.io/v1alpha1`.
    pub api_version: String,
    /// When the record last changed (RFC 3339).
    pub last_updated_time: String,
    /// The image ID the runtime gave.
    pub image_ref: String,
    /// Image name (without tag or digest) → who may use it.
    #[serde(default)]
    pub credential_mapping: BTreeMap<String, PullCredentials>,
}

/// An image pull under way (the kubelet's `ImagePullIntent`), written before
/// the pull and removed after it: one left behind by a crash marks the
/// image as pulled by the agent with unknown credentials.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct PullIntent {
    kind: String,
    api_version: String,
    image: String,
}

/// The first of `secrets` that `allowed` names: the same Secret (UID,
/// namespace, name) or the same credential (its hash).
fn matching<'a>(allowed: &PullCredentials, secrets: &'a [PullSecret]) -> Option<&'a PullSecret> {
    secrets.iter().find(|p| {
        allowed.secrets.iter().any(|s| {
            (!s.credential_hash.is_empty() && s.credential_hash == p.credential_hash)
                || (&s.uid, &s.namespace, &s.name) == (&p.uid, &p.namespace, &p.name)
        })
    })
}

/// SHA-256 (hex) of a CRI credential, the hash a record keeps of it.
#[must_use]
pub fn credential_hash(auth: &cri::AuthConfig) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for field in [
        &auth.username,
        &auth.password,
        &auth.auth,
        &auth.server_address,
        &auth.identity_token,
        &auth.registry_token,
    ] {
        // Length-prefixed, so that fields cannot run into each other.
        h.update(u64::try_from(field.len()).unwrap_or(u64::MAX).to_le_bytes());
        h.update(field.as_bytes());
    }
    format!("{:x}", h.finalize())
}

/// The image pull records under `<root-dir>/image_manager` (the kubelet's
/// `fsPullRecordsAccessor`): `pulled/sha256-<hash of the image ID>` and
/// `pulling/sha256-<hash of the image>`, each JSON, each written to a
/// temporary file and renamed into place, so a crash leaves the old record or
/// the new one. They survive restarts; nothing is held in memory.
#[derive(Clone, Debug)]
pub struct PullRecords {
    dir: PathBuf,
}

fn file_name(key: &str) -> String {
    use sha2::Digest as _;
    format!("sha256-{:x}", sha2::Sha256::digest(key.as_bytes()))
}

impl PullRecords {
    /// The records under `root_dir/image_manager`.
    #[must_use]
    pub fn new(root_dir: &Path) -> Self {
        Self {
            dir: root_dir.join("image_manager"),
        }
    }

    fn pulled_path(&self, image_ref: &str) -> PathBuf {
        self.dir.join("pulled").join(file_name(image_ref))
    }

    fn intent_path(&self, image: &str) -> PathBuf {
        self.dir.join("pulling").join(file_name(image))
    }

    /// The record of image ID `image_ref`, if there is one.
    ///
    /// # Errors
    /// A file that cannot be read, is too large or does not parse.
    pub fn pulled(&self, image_ref: &str) -> Result<Option<PulledRecord>, Error> {
        let path = self.pulled_path(image_ref);
        let Some(bytes) = read_bounded(&path)? else {
            return Ok(None);
        };
        let record: PulledRecord = serde_json::from_slice(&bytes).map_err(|e| Error::Invalid {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if record.image_ref != image_ref {
            return Err(Error::Invalid {
                path,
                message: format!("it is the record of {:?}", record.image_ref),
            });
        }
        Ok(Some(record))
    }

    /// Whether a pull of `image` was under way (or left behind by a crash).
    #[must_use]
    pub fn pulling(&self, image: &str) -> bool {
        std::fs::symlink_metadata(self.intent_path(image)).is_ok()
    }

    /// Notes that a pull of `image` starts.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn start_pull(&self, image: &str) -> Result<(), Error> {
        let intent = PullIntent {
            kind: "ImagePullIntent".into(),
            api_version: "kubelet.config.k8s.io/v1alpha1".into(),
            image: image.into(),
        };
        write_json(&self.intent_path(image), &intent)
    }

    /// Notes that the pull of `image` ended (either way).
    pub fn end_pull(&self, image: &str) {
        let path = self.intent_path(image);
        if let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            warn!(path = %path.display(), error = %e, "remove image pull intent");
        }
    }

    /// Records that `image` (image ID `image_ref`) may be used by pods with
    /// `credentials`, merged into what the record already says.
    ///
    /// # Errors
    /// The record cannot be written.
    pub fn record(
        &self,
        image: &str,
        image_ref: &str,
        credentials: &PullCredentials,
        now: Timestamp,
    ) -> Result<(), Error> {
        let mut record = match self.pulled(image_ref) {
            Ok(Some(r)) => r,
            Ok(None) => PulledRecord::default(),
            Err(e) => {
                warn!(error = %e, "replacing an unreadable image pull record");
                PulledRecord::default()
            }
        };
        let before = record.clone();
        record.kind = "ImagePulledRecord".into();
        record.api_version = "kubelet.config.k8s.io/v1alpha1".into();
        record.image_ref = image_ref.into();
        merge(&mut record, image_name(image), credentials);
        if record == before {
            return Ok(());
        }
        record.last_updated_time = now.to_string();
        write_json(&self.pulled_path(image_ref), &record)
    }
}

/// Merges `new` into the credentials `record` keeps for `name`, as the
/// kubelet's `pulledRecordMergeNewCreds`: node-wide access wins and clears
/// the secrets and service accounts; a secret replaces the one with its
/// coordinates; service accounts are a set.
fn merge(record: &mut PulledRecord, name: &str, new: &PullCredentials) {
    if !new.node_pods_accessible && new.secrets.is_empty() && new.service_accounts.is_empty() {
        return;
    }
    if !record.credential_mapping.contains_key(name)
        && record.credential_mapping.len() >= MAX_IMAGES_PER_RECORD
        && let Some(first) = record.credential_mapping.keys().next().cloned()
    {
        record.credential_mapping.remove(&first);
    }
    let old = record
        .credential_mapping
        .entry(name.to_string())
        .or_default();
    if old.node_pods_accessible {
        return;
    }
    if new.node_pods_accessible {
        *old = PullCredentials {
            node_pods_accessible: true,
            ..PullCredentials::default()
        };
        return;
    }
    for a in &new.service_accounts {
        if !old.service_accounts.contains(a) {
            old.service_accounts.push(a.clone());
        }
    }
    old.service_accounts.sort();
    let excess = old
        .service_accounts
        .len()
        .saturating_sub(MAX_SECRETS_PER_IMAGE);
    old.service_accounts.drain(..excess);
    for s in &new.secrets {
        old.secrets
            .retain(|o| (&o.namespace, &o.name, &o.uid) != (&s.namespace, &s.name, &s.uid));
        old.secrets.push(s.clone());
    }
    let excess = old.secrets.len().saturating_sub(MAX_SECRETS_PER_IMAGE);
    old.secrets.drain(..excess);
}

fn read_bounded(path: &Path) -> Result<Option<Vec<u8>>, Error> {
    use std::io::Read as _;
    let io = |op| {
        let path = path.to_path_buf();
        move |source| Error::Io { op, path, source }
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("open")(e)),
    };
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io("read"))?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > MAX_RECORD_BYTES {
        return Err(Error::Invalid {
            path: path.to_path_buf(),
            message: format!("larger than {MAX_RECORD_BYTES} bytes"),
        });
    }
    Ok(Some(bytes))
}

/// Writes `value` as JSON to `path` through a temporary file in the same
/// directory, synced, then renamed into place.
fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), Error> {
    use std::io::Write as _;
    let io = |op, p: &Path| {
        let path = p.to_path_buf();
        move |source| Error::Io { op, path, source }
    };
    let dir = path.parent().unwrap_or(path);
    std::fs::create_dir_all(dir).map_err(io("create directory", dir))?;
    let bytes = serde_json::to_vec(value).map_err(|e| Error::Invalid {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp.{}.{seq}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io("write", path)(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(name: &str, hash: &str) -> PullSecret {
        PullSecret {
            uid: format!("uid-{name}"),
            namespace: "ns".into(),
            name: name.into(),
            credential_hash: hash.into(),
        }
    }

    /// An image manager pulling from a fake runtime on a unix socket, with
    /// events to a fake API server; the runtime is returned to read its calls.
    async fn manager(
        dir: &Path,
        qps: u32,
        burst: u32,
    ) -> (ImageManager, crate::cri::fake::FakeRuntime) {
        std::fs::create_dir_all(dir).expect("runtime directory");
        let (cri, _) = crate::cri::fake::FakeRuntime::serve(dir).expect("serve the fake runtime");
        let runtime = cri
            .client(std::time::Duration::from_secs(10))
            .await
            .expect("client");
        let client = crate::fake_api::FakeApi::default().client();
        let recorder = Recorder::new(client.clone(), "node-1".into());
        let images = ImageManager::new(runtime, client, recorder, PullConcurrency::Unlimited)
            .with_pull_rate(qps, burst);
        (images, cri)
    }

    fn pod() -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some("default".into());
        pod.metadata.uid = Some("uid-p".into());
        pod
    }

    /// How many pulls reached the runtime since the last call.
    fn pulls(cri: &crate::cri::fake::FakeRuntime) -> usize {
        let calls = cri.take_calls();
        calls.iter().filter(|c| c.starts_with("PullImage ")).count()
    }

    #[tokio::test]
    async fn pulls_past_the_registry_burst_fail_without_reaching_the_runtime() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (images, cri) = manager(dir.path(), 1, 2).await;
        let (pod, config) = (pod(), cri::PodSandboxConfig::default());
        for i in 0..2 {
            let image = format!("registry.example/app:{i}");
            let pulled = images.ensure_image(&pod, "c", &image, "IfNotPresent", &config);
            pulled.await.expect("a pull within the burst");
        }
        assert_eq!(pulls(&cri), 2);
        let image = "registry.example/app:2";
        let refused = images.ensure_image(&pod, "c", image, "IfNotPresent", &config);
        let refused = refused.await.expect_err("a pull past the burst");
        assert_eq!(refused.reason, waiting::ERR_IMAGE_PULL);
        assert_eq!(refused.message, "pull QPS exceeded");
        assert_eq!(pulls(&cri), 0, "the runtime is not asked");
        // At 1 a second, a token is back within the second.
        tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
        let pulled = images.ensure_image(&pod, "c", image, "IfNotPresent", &config);
        pulled.await.expect("a pull a second later");
        assert_eq!(pulls(&cri), 1);
    }

    #[tokio::test]
    async fn no_pull_rate_at_qps_zero_and_no_pull_at_burst_zero() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (pod, config) = (pod(), cri::PodSandboxConfig::default());
        let (unlimited, cri) = manager(&dir.path().join("a"), 0, 0).await;
        for i in 0..30 {
            let image = format!("registry.example/app:{i}");
            let pulled = unlimited.ensure_image(&pod, "c", &image, "Always", &config);
            pulled.await.expect("no limit at registryPullQPS 0");
        }
        assert_eq!(pulls(&cri), 30);
        let (closed, cri) = manager(&dir.path().join("b"), 5, 0).await;
        let refused = closed.ensure_image(&pod, "c", "registry.example/app:0", "Always", &config);
        let refused = refused.await.expect_err("burst 0 lets no pull through");
        assert_eq!(refused.message, "pull QPS exceeded");
        assert_eq!(pulls(&cri), 0);
    }

    /// A credential provider plugin giving `u`/`p` for registry.example.com,
    /// or crashing for crash.example.com; `token: true` gives it the pod's
    /// service account token.
    fn providers(dir: &Path, api: &crate::fake_api::FakeApi, token: bool) -> CredentialProviders {
        use std::os::unix::fs::PermissionsExt as _;
        let bin = dir.join("plugins");
        std::fs::create_dir_all(&bin).unwrap();
        for (name, body) in [
            (
                "good",
                r#"printf '{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Image","cacheDuration":"0s","auth":{"registry.example.com":{"username":"u","password":"p"}}}'"#,
            ),
            ("crash", "echo broken >&2; exit 1"),
        ] {
            let exe = bin.join(name);
            std::fs::write(
                &exe,
                format!("#!/bin/sh\necho run >> \"$0.count\"\ncat >/dev/null\n{body}\n"),
            )
            .unwrap();
            std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let attrs = if token {
            "  tokenAttributes: {serviceAccountTokenAudience: registry.example.com, cacheType: ServiceAccount, requireServiceAccount: true}\n"
        } else {
            ""
        };
        let config = dir.join("providers.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n\
                 - name: good\n  matchImages: [registry.example.com]\n  defaultCacheDuration: 0s\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n{attrs}\
                 - name: crash\n  matchImages: [crash.example.com]\n  defaultCacheDuration: 0s\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n"
            ),
        )
        .unwrap();
        CredentialProviders::load(&config, &bin, api.client()).unwrap()
    }

    /// An image manager with pull records and `providers`, over a fake
    /// runtime that wants `u`/`p` for `images`.
    async fn manager_with(
        dir: &Path,
        api: &crate::fake_api::FakeApi,
        providers: CredentialProviders,
        images: &[&str],
    ) -> (ImageManager, crate::cri::fake::FakeRuntime) {
        let run = dir.join("cri");
        std::fs::create_dir_all(&run).unwrap();
        let (cri, _) = crate::cri::fake::FakeRuntime::serve(&run).expect("fake runtime");
        for image in images {
            cri.require_auth(image, "u", "p");
        }
        let runtime = cri
            .client(std::time::Duration::from_secs(10))
            .await
            .unwrap();
        let recorder = Recorder::new(api.client(), "node-1".into());
        let manager =
            ImageManager::new(runtime, api.client(), recorder, PullConcurrency::Unlimited)
                .with_pull_records(dir, crate::image_policy::VerificationPolicy::default())
                .with_credential_providers_of(Some(providers));
        (manager, cri)
    }

    fn pod_as(name: &str, account: &str) -> Pod {
        let mut p = pod();
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(format!("uid-{name}"));
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            service_account_name: Some(account.into()),
            ..Default::default()
        });
        p
    }

    #[tokio::test]
    async fn a_providers_credentials_pull_and_are_recorded_node_wide_or_per_service_account() {
        let dir = tempfile::tempdir().unwrap();
        let api = crate::fake_api::FakeApi::default();
        let config = cri::PodSandboxConfig::default();
        // Without a token: node credentials, the image is every pod's.
        let image = "registry.example.com/app:1";
        let (images, cri) = manager_with(
            &dir.path().join("node"),
            &api,
            providers(&dir.path().join("node"), &api, false),
            &[image],
        )
        .await;
        images
            .ensure_image(&pod(), "c", image, "IfNotPresent", &config)
            .await
            .expect("pulled with the provider's credentials");
        assert_eq!(pulls(&cri), 1);
        let id = images.runtime.image_id(image).await.unwrap().unwrap().id;
        let record = images
            .records
            .as_ref()
            .unwrap()
            .pulled(&id)
            .unwrap()
            .unwrap();
        assert!(record.credential_mapping["registry.example.com/app"].node_pods_accessible);

        // With the pod's service account token: that service account's.
        let sa = |name: &str| {
            serde_json::json!({ "apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": { "name": name, "namespace": "default", "uid": format!("sa-{name}") } })
        };
        api.put("serviceaccounts", "builder", sa("builder"));
        api.put("serviceaccounts", "other", sa("other"));
        let image = "registry.example.com/private:1";
        let (images, cri) = manager_with(
            &dir.path().join("sa"),
            &api,
            providers(&dir.path().join("sa"), &api, true),
            &[image],
        )
        .await;
        let builder = pod_as("b1", "builder");
        images
            .ensure_image(&builder, "c", image, "IfNotPresent", &config)
            .await
            .expect("pulled for the service account");
        assert_eq!(pulls(&cri), 1);
        let id = images.runtime.image_id(image).await.unwrap().unwrap().id;
        let records = images.records.as_ref().unwrap();
        let allowed = &records.pulled(&id).unwrap().unwrap().credential_mapping["registry.example.com/private"];
        assert!(!allowed.node_pods_accessible);
        let coordinates = |name: &str| ServiceAccountCoordinates {
            uid: format!("sa-{name}"),
            namespace: "default".into(),
            name: name.into(),
        };
        assert_eq!(allowed.service_accounts, [coordinates("builder")]);
        // Another pod of that service account uses it as it is.
        images
            .ensure_image(
                &pod_as("b2", "builder"),
                "c",
                image,
                "IfNotPresent",
                &config,
            )
            .await
            .unwrap();
        assert_eq!(pulls(&cri), 0);
        // A pod of another service account pulls it again, with its own.
        images
            .ensure_image(&pod_as("o1", "other"), "c", image, "IfNotPresent", &config)
            .await
            .unwrap();
        assert_eq!(pulls(&cri), 1);
        let allowed = &records.pulled(&id).unwrap().unwrap().credential_mapping["registry.example.com/private"];
        assert_eq!(
            allowed.service_accounts,
            [coordinates("builder"), coordinates("other")]
        );
    }

    #[tokio::test]
    async fn a_failing_provider_gives_an_event_and_the_pull_goes_on_without_it() {
        let dir = tempfile::tempdir().unwrap();
        let api = crate::fake_api::FakeApi::default();
        let image = "crash.example.com/app:1";
        let (images, cri) = manager_with(
            dir.path(),
            &api,
            providers(dir.path(), &api, false),
            &[image],
        )
        .await;
        let refused = images
            .ensure_image(
                &pod(),
                "c",
                image,
                "IfNotPresent",
                &cri::PodSandboxConfig::default(),
            )
            .await
            .expect_err("no credentials: the registry refuses");
        assert_eq!(refused.reason, waiting::ERR_IMAGE_PULL);
        assert_eq!(pulls(&cri), 1, "pulled without credentials");
        let mut events = Vec::new();
        for _ in 0..50 {
            events = api.events();
            if events
                .iter()
                .any(|(r, _)| r == event::FAILED_CREDENTIAL_PROVIDER)
            {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let (_, message) = events
            .iter()
            .find(|(r, _)| r == event::FAILED_CREDENTIAL_PROVIDER)
            .unwrap_or_else(|| panic!("no FailedCredentialProvider event: {events:?}"));
        assert!(
            message.starts_with("credential provider crash failed for image crash.example.com/app")
                && message.contains("broken")
                && message.ends_with("pulling without its credentials"),
            "{message}"
        );
    }

    #[test]
    fn image_names_lose_tag_and_digest() {
        for (image, want) in [
            ("busybox", "busybox"),
            ("busybox:1.36", "busybox"),
            ("reg:5000/a/b:1", "reg:5000/a/b"),
            ("reg:5000/a/b", "reg:5000/a/b"),
            ("reg/a@sha256:abc", "reg/a"),
            ("reg/a:1@sha256:abc", "reg/a"),
        ] {
            assert_eq!(image_name(image), want, "{image}");
        }
    }

    #[test]
    fn records_merge_bounded_and_survive_a_new_instance() {
        let dir = tempfile::tempdir().unwrap();
        let now = Timestamp::now();
        let records = PullRecords::new(dir.path());
        let with = |s: PullSecret| PullCredentials {
            secrets: vec![s],
            ..PullCredentials::default()
        };
        records
            .record("reg/app:1", "sha256:1", &with(secret("a", "h1")), now)
            .unwrap();
        // The same secret with a new credential replaces its hash.
        records
            .record("reg/app:2", "sha256:1", &with(secret("a", "h2")), now)
            .unwrap();
        let again = PullRecords::new(dir.path());
        let r = again.pulled("sha256:1").unwrap().unwrap();
        assert_eq!(r.kind, "ImagePulledRecord");
        assert_eq!(r.credential_mapping["reg/app"].secrets, [secret("a", "h2")]);
        // Past the bound, the oldest secrets go.
        for i in 0..MAX_SECRETS_PER_IMAGE + 5 {
            let s = secret(&format!("s{i}"), &format!("h{i}"));
            records
                .record("reg/app", "sha256:1", &with(s), now)
                .unwrap();
        }
        let r = records.pulled("sha256:1").unwrap().unwrap();
        let kept = &r.credential_mapping["reg/app"].secrets;
        assert_eq!(kept.len(), MAX_SECRETS_PER_IMAGE);
        assert!(!kept.contains(&secret("a", "h2")));
        // An anonymous pull opens it to every pod and clears the secrets.
        let anyone = PullCredentials {
            node_pods_accessible: true,
            ..PullCredentials::default()
        };
        records.record("reg/app", "sha256:1", &anyone, now).unwrap();
        let r = records.pulled("sha256:1").unwrap().unwrap();
        assert_eq!(r.credential_mapping["reg/app"], anyone);
    }

    #[test]
    fn a_bad_record_is_an_error_not_a_pass() {
        let dir = tempfile::tempdir().unwrap();
        let records = PullRecords::new(dir.path());
        let path = records.pulled_path("sha256:1");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, "{not json").unwrap();
        assert!(matches!(
            records.pulled("sha256:1"),
            Err(Error::Invalid { .. })
        ));
        let big = vec![b' '; usize::try_from(MAX_RECORD_BYTES).unwrap() + 1];
        std::fs::write(&path, big).unwrap();
        assert!(matches!(
            records.pulled("sha256:1"),
            Err(Error::Invalid { .. })
        ));
        // Another image's record under this name is not this one's.
        let other = PulledRecord {
            image_ref: "sha256:2".into(),
            ..Default::default()
        };
        std::fs::write(&path, serde_json::to_vec(&other).unwrap()).unwrap();
        assert!(records.pulled("sha256:1").is_err());
        assert_eq!(records.pulled("sha256:3").unwrap(), None);
        // Intents come and go.
        assert!(!records.pulling("reg/app:1"));
        records.start_pull("reg/app:1").unwrap();
        assert!(records.pulling("reg/app:1"));
        records.end_pull("reg/app:1");
        assert!(!records.pulling("reg/app:1"));
    }
}
