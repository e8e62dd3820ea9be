//! Image credential provider plugins, as the kubelet's
//! (`pkg/credentialprovider/plugin`, `KubeletCredentialProviders`, GA):
//! executables named in a `CredentialProviderConfig`
//! (`--image-credential-provider-config`, [`config`]) in a plugin directory
//! (`--image-credential-provider-bin-dir`), each run for the images its
//! `matchImages` cover with a `CredentialProviderRequest` on stdin, answering
//! a `CredentialProviderResponse` on stdout: registry credentials, kept for
//! the duration it names (else the provider's `defaultCacheDuration`) under
//! the image, its registry or every image (`cacheKeyType`). A provider with
//! `tokenAttributes` is also given a token of the pod's service account for
//! its audience, and the service account's annotations it asks for
//! (KEP-4412, `KubeletServiceAccountTokenForCredentialProviders`); its
//! answers are kept per service account, or per token.
//!
//! Bounded where the kubelet is not: a run takes at most [`PLUGIN_TIMEOUT`]
//! (the kubelet's minute) and its process group is killed after it; at most
//! [`MAX_RUNNING`] run at once; stdout is read up to [`MAX_OUTPUT_BYTES`]
//! and stderr up to [`MAX_STDERR_BYTES`]; an answer names at most
//! [`MAX_AUTH_ENTRIES`] registries; a provider keeps at most
//! [`MAX_CACHE_ENTRIES`] answers. A plugin that hangs, fails, answers
//! garbage or too much gives no credentials for that pull: the caller
//! says so in an Event and pulls with what else it has, as the kubelet
//! pulls without them. Concurrent lookups of one image share one run (the
//! kubelet's singleflight).

pub mod config;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use futures::future::{BoxFuture, Shared};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::Semaphore;
use tracing::debug;

use crate::redact::Redacted;
use crate::volume::token::{TokenKey, TokenManager};

/// How long a plugin may run (the kubelet's one minute).
pub const PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);
/// How many plugin runs may be under way at once, across providers.
pub const MAX_RUNNING: usize = 4;
/// The most bytes of a plugin's stdout read; more fails the run.
pub const MAX_OUTPUT_BYTES: usize = 1 << 20;
/// The most bytes of a plugin's stderr kept for the error it is shown in.
pub const MAX_STDERR_BYTES: usize = 4096;
/// The most registries one answer may give credentials for.
pub const MAX_AUTH_ENTRIES: usize = 64;
/// The most answers one provider keeps; past it the one expiring first
/// goes.
pub const MAX_CACHE_ENTRIES: usize = 1024;
/// The most configuration files a directory may hold, and the most bytes
/// one may have.
const MAX_CONFIG_FILES: usize = 64;
const MAX_CONFIG_BYTES: u64 = 1 << 20;
/// The lifetime asked for a service account token given to a plugin, seconds
/// (the API server's default for a TokenRequest that names none).
const TOKEN_SECONDS: i64 = 3600;
/// The cache key of an answer for every image (`cacheKeyType: Global`).
const GLOBAL_KEY: &str = "<global>";

/// The service account whose token a plugin was given for a credential
/// (the kubelet's `ServiceAccountCoordinates`): an image pulled with it may
/// be used by the pods running as that service account.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ServiceAccountCoordinates {
    /// The service account's UID.
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// One registry credential a plugin gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credential {
    /// The registry pattern it is for (`host[:port][/path]`, globs per host
    /// label), matched as a pull secret's key.
    pub registry: String,
    /// The user name.
    pub username: String,
    /// The password (never shown by `Debug`).
    pub password: Redacted<String>,
}

/// What one provider gave for one image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Provided {
    /// The provider's name.
    pub provider: String,
    /// The service account whose token it was given, if any.
    pub service_account: Option<ServiceAccountCoordinates>,
    /// Its credentials.
    pub credentials: Arc<Vec<Credential>>,
}

/// The pod an image is pulled for, as a provider with `tokenAttributes`
/// needs it.
#[derive(Clone, Debug, Default)]
pub struct PodIdentity {
    /// The pod's namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
    /// Its `spec.serviceAccountName` (empty: none).
    pub service_account: String,
}

/// The configured providers; cheap to clone.
#[derive(Clone)]
pub struct CredentialProviders {
    inner: Arc<Inner>,
}

struct Inner {
    plugins: Vec<Plugin>,
    client: Client,
    tokens: TokenManager,
    slots: Arc<Semaphore>,
    timeout: Duration,
    /// `sha256:<hex>` of the configuration files.
    hash: String,
    /// What `/configz` shows: the flags and the providers.
    summary: serde_json::Value,
}

type Flight = Shared<BoxFuture<'static, Result<Arc<Response>, String>>>;

/// One provider: its configuration, executable, answers and runs under way.
struct Plugin {
    config: config::Provider,
    path: PathBuf,
    cache: Mutex<HashMap<CacheKey, Entry>>,
    flights: Mutex<HashMap<FlightKey, Flight>>,
}

/// An answer's cache key: its base (the image, its registry or
/// [`GLOBAL_KEY`]) and the service account part, as the kubelet's
/// `generateCacheKey`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct CacheKey {
    base: String,
    account: Option<AccountKey>,
}

/// The service account part of a cache key (the kubelet's
/// `generateServiceAccountCacheKey`): with the token's hash for cache type
/// `Token`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct AccountKey {
    namespace: String,
    name: String,
    uid: String,
    annotations: BTreeMap<String, String>,
    token_hash: Option<String>,
}

/// What concurrent lookups share one run by (the kubelet's singleflight
/// key): the image, the token's hash and the annotations.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct FlightKey {
    image: String,
    token_hash: String,
    annotations: BTreeMap<String, String>,
}

struct Entry {
    credentials: Arc<Vec<Credential>>,
    expires: Instant,
}

/// The request a plugin reads (`CredentialProviderRequest`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Request<'a> {
    kind: &'static str,
    api_version: &'a str,
    image: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    service_account_token: &'a str,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    service_account_annotations: &'a BTreeMap<String, String>,
}

/// The answer's kind and version, read first.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TypeMeta {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
}

/// A plugin's answer (`CredentialProviderResponse`), decoded strictly.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Response {
    #[serde(rename = "kind")]
    _kind: String,
    #[serde(rename = "apiVersion")]
    _api_version: String,
    #[serde(default)]
    cache_key_type: String,
    cache_duration: Option<String>,
    #[serde(default)]
    auth: BTreeMap<String, AuthEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthEntry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: Redacted<String>,
}

impl CredentialProviders {
    /// The providers of the configuration at `config_path` (a file, or a
    /// directory of `*.json`, `*.yaml`, `*.yml` files read in lexical
    /// order), run from `bin_dir`, requesting service account tokens
    /// through `client`; as the kubelet's
    /// `RegisterCredentialProviderPlugins`. Sets
    /// `kubelet_credential_provider_config_info`.
    ///
    /// # Errors
    /// `bin_dir` or a provider's executable in it is missing, the
    /// configuration cannot be read (more than 64 files, or one over 1 MiB,
    /// refused), does not decode or does not validate: the kubelet's
    /// messages, for the agent to stop with.
    pub fn load(config_path: &Path, bin_dir: &Path, client: Client) -> Result<Self, String> {
        match std::fs::metadata(bin_dir) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(format!(
                    "plugin binary directory {} did not exist",
                    bin_dir.display()
                ));
            }
            Err(e) => {
                return Err(format!(
                    "error inspecting binary directory {}: {e}",
                    bin_dir.display()
                ));
            }
        }
        let files = read_config(config_path)?;
        let hash = config_hash(&files);
        let providers = config::parse(&files)?;
        let mut plugins = Vec::new();
        for provider in providers {
            let path = bin_dir.join(&provider.name);
            let executable = std::fs::metadata(&path).map(|m| {
                use std::os::unix::fs::PermissionsExt as _;
                m.is_file() && m.permissions().mode() & 0o111 != 0
            });
            match executable {
                Ok(true) => {}
                Ok(false) => {
                    return Err(format!(
                        "error inspecting binary executable {}: not an executable file",
                        path.display()
                    ));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(format!(
                        "plugin binary executable {} did not exist",
                        path.display()
                    ));
                }
                Err(e) => {
                    return Err(format!(
                        "error inspecting binary executable {}: {e}",
                        path.display()
                    ));
                }
            }
            plugins.push(Plugin {
                config: provider,
                path,
                cache: Mutex::default(),
                flights: Mutex::default(),
            });
        }
        crate::metrics::metrics().set_credential_provider_config(&hash);
        let summary = serde_json::json!({
            "imageCredentialProviderConfig": config_path,
            "imageCredentialProviderBinDir": bin_dir,
            "hash": hash,
            "providers": plugins.iter().map(|p| &p.config).collect::<Vec<_>>(),
        });
        Ok(Self {
            inner: Arc::new(Inner {
                plugins,
                client,
                tokens: TokenManager::default(),
                slots: Arc::new(Semaphore::new(MAX_RUNNING)),
                timeout: PLUGIN_TIMEOUT,
                hash,
                summary,
            }),
        })
    }

    /// The providers, running each plugin for at most `timeout` instead of
    /// [`PLUGIN_TIMEOUT`]; only before they are cloned.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.timeout = timeout;
        }
        self
    }

    /// `sha256:<hex>` of the configuration's files (each length-prefixed),
    /// as the kubelet's.
    #[must_use]
    pub fn hash(&self) -> &str {
        &self.inner.hash
    }

    /// The configuration in effect, for `/configz`: the two flags, the hash
    /// and each provider as validated.
    #[must_use]
    pub fn summary(&self) -> &serde_json::Value {
        &self.inner.summary
    }

    /// What each provider whose `matchImages` cover `image` (a repository,
    /// without tag or digest, as the kubelet passes it) gives for it when
    /// pulled for `pod`, in the configuration's order: credentials (none
    /// when a provider with `tokenAttributes` has nothing to give this pod:
    /// no service account and one required, or a required annotation
    /// missing), or why the provider failed (in the kubelet's words; never
    /// the plugin's stdout).
    pub async fn provide(&self, image: &str, pod: &PodIdentity) -> Vec<Result<Provided, String>> {
        let mut out = Vec::new();
        for plugin in &self.inner.plugins {
            if !plugin
                .config
                .match_images
                .iter()
                .any(|m| crate::registry::registry_matches(m, image))
            {
                continue;
            }
            match self.provide_one(plugin, image, pod).await {
                Ok(Some(p)) => out.push(Ok(p)),
                Ok(None) => {}
                Err(e) => out.push(Err(format!(
                    "credential provider {} failed for image {image}: {e}",
                    plugin.config.name
                ))),
            }
        }
        out
    }

    /// Forgets the service account tokens requested for the pod with UID
    /// `uid`.
    pub fn forget_pod(&self, uid: &str) {
        self.inner.tokens.forget_pod(uid);
    }

    /// Forgets the tokens of the pods whose UID `keep` rejects.
    pub fn retain_pods(&self, keep: impl Fn(&str) -> bool) {
        self.inner.tokens.retain_pods(keep);
    }

    /// One provider's part of [`CredentialProviders::provide`]: the
    /// kubelet's `pluginProvider.provide`.
    async fn provide_one(
        &self,
        plugin: &Plugin,
        image: &str,
        pod: &PodIdentity,
    ) -> Result<Option<Provided>, String> {
        let mut account = None;
        let mut token = String::new();
        if let Some(attrs) = &plugin.config.token_attributes {
            if pod.service_account.is_empty() {
                if attrs.require_service_account {
                    debug!(provider = plugin.config.name, image, "no service account");
                    return Ok(None);
                }
            } else {
                let Some((key, t)) = self.account(attrs, pod).await? else {
                    return Ok(None);
                };
                account = Some(key);
                token = t;
            }
        }
        let coordinates = account.as_ref().map(|a| ServiceAccountCoordinates {
            uid: a.uid.clone(),
            namespace: a.namespace.clone(),
            name: a.name.clone(),
        });
        let provided = |credentials| Provided {
            provider: plugin.config.name.clone(),
            service_account: coordinates.clone(),
            credentials,
        };
        if let Some(credentials) = plugin.cached(image, account.as_ref()) {
            return Ok(Some(provided(credentials)));
        }
        let flight = FlightKey {
            image: image.to_string(),
            token_hash: account
                .as_ref()
                .map(|_| sha256_hex(&token))
                .unwrap_or_default(),
            annotations: account
                .as_ref()
                .map(|a| a.annotations.clone())
                .unwrap_or_default(),
        };
        let request = serde_json::to_vec(&Request {
            kind: "CredentialProviderRequest",
            api_version: &plugin.config.api_version,
            image,
            service_account_token: &token,
            service_account_annotations: &flight.annotations,
        })
        .map_err(|e| format!("failed to encode auth request: {e}"))?;
        let response = self.run_shared(plugin, flight, image, request).await?;
        let token_as_password = !token.is_empty()
            && plugin
                .config
                .token_attributes
                .as_ref()
                .is_some_and(|t| t.cache_type != config::TokenCacheType::Token)
            && response
                .auth
                .values()
                .any(|a| *a.password.expose() == token);
        if token_as_password {
            return Err("credential provider plugin returned the service account token as the password which is not allowed when service account cache type is not set to 'Token'".into());
        }
        let base = match response.cache_key_type.as_str() {
            "Image" => image.to_string(),
            "Registry" => registry(image).to_string(),
            "Global" => GLOBAL_KEY.to_string(),
            other => {
                return Err(format!(
                    "credential provider plugin did not return a valid cacheKeyType: {other}"
                ));
            }
        };
        let credentials: Arc<Vec<Credential>> = Arc::new(
            response
                .auth
                .iter()
                .map(|(registry, a)| Credential {
                    registry: registry.clone(),
                    username: a.username.clone(),
                    password: a.password.clone(),
                })
                .collect(),
        );
        let keep = match &response.cache_duration {
            Some(d) => go_duration(d).unwrap_or_default(),
            None => plugin.config.default_cache_duration,
        };
        if !keep.is_zero() {
            let key = CacheKey {
                base,
                account: account.clone(),
            };
            plugin.remember(key, credentials.clone(), keep);
        }
        Ok(Some(provided(credentials)))
    }

    /// The service account part of a provider's lookup for `pod`: its key
    /// and a token for the provider's audience; none when a required
    /// annotation is missing.
    async fn account(
        &self,
        attrs: &config::TokenAttributes,
        pod: &PodIdentity,
    ) -> Result<Option<(AccountKey, String)>, String> {
        let api: Api<ServiceAccount> = Api::namespaced(self.inner.client.clone(), &pod.namespace);
        let sa = api
            .get(&pod.service_account)
            .await
            .map_err(|e| format!("failed to get service account: {e}"))?;
        let present = sa.metadata.annotations.unwrap_or_default();
        let uid = sa.metadata.uid.unwrap_or_default();
        let mut annotations = BTreeMap::new();
        for k in &attrs.required_service_account_annotation_keys {
            let Some(v) = present.get(k) else {
                debug!(annotation = k, "required annotation not found");
                return Ok(None);
            };
            annotations.insert(k.clone(), v.clone());
        }
        for k in &attrs.optional_service_account_annotation_keys {
            if let Some(v) = present.get(k) {
                annotations.insert(k.clone(), v.clone());
            }
        }
        let token = self
            .inner
            .tokens
            .get(
                &self.inner.client,
                &TokenKey {
                    namespace: pod.namespace.clone(),
                    service_account: pod.service_account.clone(),
                    audience: Some(attrs.service_account_token_audience.clone()),
                    expiration_seconds: TOKEN_SECONDS,
                    pod_name: pod.name.clone(),
                    pod_uid: pod.uid.clone(),
                    // On the condition that the account read is the one
                    // the token is for, as the kubelet's request.
                    service_account_uid: Some(uid.clone()).filter(|u| !u.is_empty()),
                },
            )
            .await
            .map_err(|e| format!("failed to get service account token: {e}"))?;
        let token_hash = (attrs.cache_type == config::TokenCacheType::Token)
            .then(|| format!("sha256:{}", sha256_hex(&token)));
        Ok(Some((
            AccountKey {
                namespace: pod.namespace.clone(),
                name: pod.service_account.clone(),
                uid,
                annotations,
                token_hash,
            },
            token,
        )))
    }

    /// Runs `plugin` for `key`, or waits for its run under way.
    async fn run_shared(
        &self,
        plugin: &Plugin,
        key: FlightKey,
        image: &str,
        request: Vec<u8>,
    ) -> Result<Arc<Response>, String> {
        let flight = {
            let mut flights = lock(&plugin.flights);
            if let Some(f) = flights.get(&key) {
                f.clone()
            } else {
                let run = Run {
                    name: plugin.config.name.clone(),
                    path: plugin.path.clone(),
                    args: plugin.config.args.clone(),
                    env: plugin.config.env.clone(),
                    api_version: plugin.config.api_version.clone(),
                    image: image.to_string(),
                    request,
                    timeout: self.inner.timeout,
                    slots: self.inner.slots.clone(),
                };
                let f = run.go().boxed().shared();
                flights.insert(key.clone(), f.clone());
                f
            }
        };
        let result = flight.clone().await;
        let mut flights = lock(&plugin.flights);
        if flights.get(&key).is_some_and(|f| f.ptr_eq(&flight)) {
            flights.remove(&key);
        }
        result
    }
}

impl Plugin {
    /// A fresh answer for `image` (under the image, its registry, then
    /// every image, as the kubelet's `getCachedCredentials`).
    fn cached(&self, image: &str, account: Option<&AccountKey>) -> Option<Arc<Vec<Credential>>> {
        let now = Instant::now();
        let cache = lock(&self.cache);
        [image, registry(image), GLOBAL_KEY]
            .into_iter()
            .find_map(|base| {
                let key = CacheKey {
                    base: base.to_string(),
                    account: account.cloned(),
                };
                cache.get(&key).filter(|e| e.expires > now)
            })
            .map(|e| e.credentials.clone())
    }

    /// Keeps `credentials` under `key` for `keep`, dropping expired answers
    /// and, past [`MAX_CACHE_ENTRIES`], the one expiring first.
    fn remember(&self, key: CacheKey, credentials: Arc<Vec<Credential>>, keep: Duration) {
        let now = Instant::now();
        let expires = now
            .checked_add(keep)
            .unwrap_or_else(|| now + Duration::from_secs(u64::from(u32::MAX)));
        let mut cache = lock(&self.cache);
        cache.retain(|_, e| e.expires > now);
        if cache.len() >= MAX_CACHE_ENTRIES
            && !cache.contains_key(&key)
            && let Some(first) = cache
                .iter()
                .min_by_key(|(_, e)| e.expires)
                .map(|(k, _)| k.clone())
        {
            cache.remove(&first);
        }
        cache.insert(
            key,
            Entry {
                credentials,
                expires,
            },
        );
    }
}

/// One run of a plugin, owning what it needs.
struct Run {
    name: String,
    path: PathBuf,
    args: Vec<String>,
    env: Vec<config::EnvVar>,
    api_version: String,
    image: String,
    request: Vec<u8>,
    timeout: Duration,
    slots: Arc<Semaphore>,
}

impl Run {
    /// Runs the plugin once a slot is free, within its timeout, and
    /// decodes its answer (the kubelet's `ExecPlugin`).
    async fn go(self) -> Result<Arc<Response>, String> {
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| "shutting down".to_string())?;
        let started = Instant::now();
        let ran = self.exec().await;
        crate::metrics::metrics().record_credential_provider_run(
            &self.name,
            started.elapsed(),
            ran.is_err(),
        );
        let stdout = ran.map_err(|e| {
            format!(
                "error execing credential provider plugin {} for image {}: {e}",
                self.name, self.image
            )
        })?;
        decode(&stdout, &self.api_version).map(Arc::new)
    }

    /// The plugin's stdout once it exited 0; its process group is killed
    /// when it did not end well (timed out, too much output, failed).
    async fn exec(&self) -> Result<Vec<u8>, String> {
        let mut cmd = tokio::process::Command::new(&self.path);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|e| (&e.name, &e.value)))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        let mut child = cmd.spawn().map_err(|e| e.to_string())?;
        let pid = child.id();
        let talked = tokio::time::timeout(self.timeout, self.talk(&mut child)).await;
        let result = match talked {
            Ok(Ok(out)) => Ok(out),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("context deadline exceeded".to_string()),
        };
        if result.is_err() {
            kill_group(pid);
            let _ = child.start_kill();
        }
        result
    }

    /// Writes the request, reads stdout (bounded) and stderr (its head),
    /// and waits for the exit.
    async fn talk(&self, child: &mut tokio::process::Child) -> Result<Vec<u8>, String> {
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let write = async {
            // A plugin that does not read its request is not an error here:
            // its answer decides.
            let _ = stdin.write_all(&self.request).await;
            drop(stdin);
            Ok::<(), String>(())
        };
        let (_, out, err) = tokio::try_join!(
            write,
            read_bounded(stdout, MAX_OUTPUT_BYTES),
            read_head(stderr, MAX_STDERR_BYTES)
        )?;
        let status = child.wait().await.map_err(|e| e.to_string())?;
        if !status.success() {
            let err = String::from_utf8_lossy(&err);
            return Err(format!("{status}: {}", err.trim_end()));
        }
        Ok(out)
    }
}

/// Decodes a plugin's answer as the kubelet does: its version first (it
/// must be the provider's), then the whole, strictly. No error quotes the
/// answer (it may hold passwords).
fn decode(stdout: &[u8], api_version: &str) -> Result<Response, String> {
    let meta: TypeMeta = serde_json::from_slice(stdout)
        .map_err(|_| "error reading GVK from response: not a JSON object".to_string())?;
    if meta.api_version != api_version {
        return Err(format!(
            "apiVersion from credential plugin response did not match expected apiVersion:{api_version}, actual apiVersion:{}",
            meta.api_version
        ));
    }
    if meta.kind != "CredentialProviderResponse" {
        return Err(format!(
            "failed to decode CredentialProviderResponse, unexpected Kind: {:?}",
            meta.kind
        ));
    }
    let response: Response = serde_json::from_slice(stdout).map_err(|_| {
        "error decoding credential provider plugin response from stdout".to_string()
    })?;
    if let Some(d) = &response.cache_duration
        && go_duration(d).is_none()
    {
        return Err("error decoding credential provider plugin response from stdout".into());
    }
    if response.auth.len() > MAX_AUTH_ENTRIES {
        return Err(format!(
            "credential provider plugin answered {} registries, more than {MAX_AUTH_ENTRIES}",
            response.auth.len()
        ));
    }
    Ok(response)
}

/// A Go duration (`6h`, `0s`); a negative one is zero: nothing is kept.
fn go_duration(s: &str) -> Option<Duration> {
    let nanos = go_parse_duration::parse_duration(s).ok()?;
    Some(Duration::from_nanos(u64::try_from(nanos).unwrap_or(0)))
}

/// The registry part of an image (its first path element), as the
/// kubelet's `parseRegistry`.
fn registry(image: &str) -> &str {
    image.split('/').next().unwrap_or(image)
}

/// Reads `r` to its end; more than `max` bytes is an error.
async fn read_bounded(r: impl AsyncRead + Unpin, max: usize) -> Result<Vec<u8>, String> {
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    let mut out = Vec::new();
    r.take(limit)
        .read_to_end(&mut out)
        .await
        .map_err(|e| e.to_string())?;
    if out.len() > max {
        return Err(format!("output larger than {max} bytes"));
    }
    Ok(out)
}

/// Reads `r` to its end, keeping its first `max` bytes.
async fn read_head(mut r: impl AsyncRead + Unpin, max: usize) -> Result<Vec<u8>, String> {
    let mut head = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return Ok(head),
            Ok(n) => {
                let room = max.saturating_sub(head.len());
                head.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

/// Kills the process group led by `pid` (the plugin and what it started).
fn kill_group(pid: Option<u32>) {
    let Some(pid) = pid
        .and_then(|p| i32::try_from(p).ok())
        .and_then(rustix::process::Pid::from_raw)
    else {
        return;
    };
    let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
}

/// The configuration's files (name, content): the file at `path`, or the
/// `*.json`, `*.yaml` and `*.yml` files of the directory at `path` in
/// lexical order.
fn read_config(path: &Path) -> Result<Vec<(String, String)>, String> {
    let meta = std::fs::metadata(path).map_err(|e| {
        format!(
            "unable to access path {:?}: {e}",
            path.display().to_string()
        )
    })?;
    let mut paths = Vec::new();
    if meta.is_dir() {
        let entries = std::fs::read_dir(path).map_err(|e| {
            format!(
                "unable to read directory {:?}: {e}",
                path.display().to_string()
            )
        })?;
        for entry in entries.flatten() {
            let p = entry.path();
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or_default();
            if !p.is_dir() && matches!(ext, "json" | "yaml" | "yml") {
                paths.push(p);
            }
        }
        paths.sort();
        if paths.is_empty() {
            return Err(format!(
                "no configuration files found in directory {:?}",
                path.display().to_string()
            ));
        }
        if paths.len() > MAX_CONFIG_FILES {
            return Err(format!(
                "more than {MAX_CONFIG_FILES} configuration files in directory {:?}",
                path.display().to_string()
            ));
        }
    } else {
        paths.push(path.to_path_buf());
    }
    let mut files = Vec::new();
    for p in paths {
        let name = p.display().to_string();
        let read = std::fs::File::open(&p).and_then(|f| {
            use std::io::Read as _;
            let mut text = String::new();
            f.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text)?;
            Ok(text)
        });
        let text = read.map_err(|e| format!("unable to read file {name:?}: {e}"))?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return Err(format!(
                "unable to read file {name:?}: more than {MAX_CONFIG_BYTES} bytes"
            ));
        }
        files.push((name, text));
    }
    Ok(files)
}

/// `sha256:<hex>` over each file's length (big-endian u64) and content, as
/// the kubelet hashes its configuration.
fn config_hash(files: &[(String, String)]) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for (_, text) in files {
        h.update((text.len() as u64).to_be_bytes());
        h.update(text.as_bytes());
    }
    format!("sha256:{:x}", h.finalize())
}

fn sha256_hex(s: &str) -> String {
    use sha2::Digest as _;
    format!("{:x}", sha2::Sha256::digest(s.as_bytes()))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
