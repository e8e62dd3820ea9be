//! Who is asking, and may they: authentication and authorization of node API
//! requests, as the kubelet's auth filter does it (pkg/kubelet/server/auth.go and
//! `InstallAuthFilter` in server.go).
//!
//! Authentication: a client certificate verified against `--client-ca-file` (the
//! TLS layer verifies it; here its CN becomes the user name and its O entries the
//! groups), else a bearer token checked with a `TokenReview`
//! (authentication.k8s.io/v1). Anonymous requests are refused: 401 `Unauthorized`.
//!
//! Authorization: one `SubjectAccessReview` (authorization.k8s.io/v1) per
//! attribute set of the request: resource `nodes`, name the node, verb from the
//! HTTP method and subresource from the path ([`subresources`]); the first allowed
//! one lets the request through, otherwise 403 `Forbidden (user=…, verb=…,
//! resource=nodes, subresource(s)=[…])`.
//!
//! Decisions are cached as the kubelet's webhook authenticator and authorizer
//! cache them ([`CacheTtls`]): a token review's result for 2 minutes, whether
//! the token authenticated or not, an allowed decision for 5 minutes, a denied
//! one for 30 seconds. Both caches are bounded ([`TOKEN_CACHE_MAX`],
//! [`DECISION_CACHE_MAX`]), tokens are cached under their SHA-256 only, and
//! concurrent identical reviews are made once.
//!
//! Reviews go through the agent's rate-limited API client (the kubelet's
//! `kubeAPIQPS`/`kubeAPIBurst`, [`crate::throttle`]); at most
//! [`MAX_TOKEN_REVIEWS`] token reviews and [`MAX_ACCESS_REVIEWS`] access
//! reviews wait for it at once, each kind on its own so that a flood of bad
//! tokens never holds up the access reviews of certificate users (the API
//! server's); a request past that is answered 429 with `Retry-After: 1`.

use std::collections::BTreeMap;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use sha2::{Digest, Sha256};
use tracing::{debug, warn};

/// Errors asking the API server about a request's credentials.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The `TokenReview` call failed.
    #[error("create tokenreview: {0}")]
    TokenReview(#[source] kube::Error),
    /// The `SubjectAccessReview` call failed.
    #[error("create subjectaccessreview for user {user}: {source}")]
    SubjectAccessReview {
        /// The user asked about.
        user: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// As many reviews of this kind as allowed already wait for the API
    /// server ([`Auth::with_review_caps`]); the request is answered 429.
    #[error("too many {0} reviews are waiting for the API server")]
    Busy(&'static str),
}

/// An authenticated user, as the API server's `user.Info`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct User {
    /// User name (`system:node:n1`, `kube-apiserver-kubelet-client`, a service account).
    pub name: String,
    /// User UID (empty for certificate users).
    pub uid: String,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes from a token review.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The identity a verified client certificate carries: CN → user name, each O →
/// a group (the API server's `CommonNameUserConversion`). `None` when the
/// certificate does not parse or has no CN.
#[must_use]
pub fn cert_user(der: &[u8]) -> Option<User> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let name = subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    if name.is_empty() {
        return None;
    }
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some(User {
        name,
        groups,
        ..User::default()
    })
}

/// The user a connection's verified client certificate names, put into every
/// request of that connection by the TLS accept loop.
#[derive(Clone, Debug, Default)]
pub struct PeerCert(pub Option<User>);

/// The authorization verb of an HTTP method (`GetRequestAttributes`): GET → get,
/// POST → create, PUT → update, PATCH → patch, DELETE → delete; any other method
/// has the empty verb, which no RBAC rule grants.
#[must_use]
pub fn verb(method: &Method) -> &'static str {
    match *method {
        Method::GET => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "",
    }
}

/// `path` is `base` or below it (`isSubpath`); a trailing slash of `base` is ignored.
fn is_subpath(path: &str, base: &str) -> bool {
    let base = base.strip_suffix('/').unwrap_or(base);
    path == base
        || path
            .strip_prefix(base)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The `nodes` subresources a request path is authorized as, tried in order
/// (`GetRequestAttributes` with `KubeletFineGrainedAuthz`, GA since 1.36):
///
/// | path | subresources |
/// |---|---|
/// | `/pods`, `/allocatedPods`, `/runningpods/` | `pods`, `proxy` |
/// | `/healthz…` | `healthz`, `proxy` |
/// | `/configz` | `configz`, `proxy` |
/// | `/stats…` | `stats` |
/// | `/metrics…` | `metrics` |
/// | `/logs…` | `log` |
/// | `/checkpoint…` | `checkpoint` |
/// | `/statusz` | `statusz` |
/// | `/flagz` | `configz` |
/// | anything else (`/containerLogs`, `/exec`, `/attach`, `/portForward`, `/run`, …) | `proxy` |
#[must_use]
pub fn subresources(path: &str) -> Vec<&'static str> {
    let mut out = Vec::with_capacity(2);
    if is_subpath(path, "/allocatedPods")
        || is_subpath(path, "/pods")
        || is_subpath(path, "/runningpods/")
    {
        out.push("pods");
    } else if is_subpath(path, "/healthz") {
        out.push("healthz");
    } else if is_subpath(path, "/configz") {
        out.push("configz");
    }
    out.push(if is_subpath(path, "/stats/") {
        "stats"
    } else if is_subpath(path, "/metrics") {
        "metrics"
    } else if is_subpath(path, "/logs/") {
        "log"
    } else if is_subpath(path, "/checkpoint/") {
        "checkpoint"
    } else if is_subpath(path, "/statusz") {
        "statusz"
    } else if is_subpath(path, "/flagz") {
        "configz"
    } else {
        "proxy"
    });
    out
}

/// The bearer token of an `Authorization: Bearer <token>` header (scheme in any case).
#[must_use]
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = v.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// A decision kept in a cache, with how long it is kept.
#[derive(Clone, Debug)]
struct Cached<V> {
    value: V,
    ttl: Duration,
}

/// Each entry expires after the time-to-live it was stored with.
struct PerEntryTtl;

impl<K, V> moka::Expiry<K, Cached<V>> for PerEntryTtl {
    fn expire_after_create(
        &self,
        _key: &K,
        value: &Cached<V>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(value.ttl)
    }
}

/// A bounded cache whose entries expire, concurrent look-ups of one key
/// sharing one computation (the API server's cached token authenticator and
/// webhook authorizer caches).
type TtlCache<K, V> = moka::future::Cache<K, Cached<V>>;

fn ttl_cache<K, V>(capacity: u64) -> TtlCache<K, V>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    moka::future::Cache::builder()
        .max_capacity(capacity)
        .expire_after(PerEntryTtl)
        .build()
}

/// Token reviews kept at most (the kubelet keeps them in an unbounded
/// expiring map; a flood of distinct tokens must not grow the agent).
pub const TOKEN_CACHE_MAX: u64 = 8192;
/// Access decisions kept at most (the webhook authorizer's LRU of 8192).
pub const DECISION_CACHE_MAX: u64 = 8192;

/// Token reviews waiting for the API server at once, by default (100, the
/// kubelet's `kubeAPIBurst`; the kubelet queues them without bound in its
/// client's rate limiter).
pub const MAX_TOKEN_REVIEWS: usize = 100;
/// Access reviews waiting for the API server at once, by default (100, as
/// [`MAX_TOKEN_REVIEWS`]).
pub const MAX_ACCESS_REVIEWS: usize = 100;

/// How long an authentication result is trusted without asking again (the
/// kubelet's `authentication.webhook.cacheTTL`, 2 min, for tokens that
/// authenticate and for tokens that do not alike).
pub const TOKEN_TTL: Duration = Duration::from_secs(120);
/// How long an allowed decision is kept (`authorization.webhook.cacheAuthorizedTTL`, 5 min).
pub const ALLOWED_TTL: Duration = Duration::from_secs(300);
/// How long a denied decision is kept (`authorization.webhook.cacheUnauthorizedTTL`, 30 s).
pub const DENIED_TTL: Duration = Duration::from_secs(30);

/// How long the webhook caches keep their results (KubeletConfiguration
/// `authentication.webhook.cacheTTL`, `authorization.webhook.cacheAuthorizedTTL`
/// and `cacheUnauthorizedTTL`). Zero keeps nothing, though concurrent
/// identical reviews still share one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheTtls {
    /// A token review's result, authenticated or not (2 min).
    pub token: Duration,
    /// An allowed access review (5 min).
    pub allowed: Duration,
    /// A denied access review (30 s).
    pub denied: Duration,
}

impl Default for CacheTtls {
    fn default() -> Self {
        Self {
            token: TOKEN_TTL,
            allowed: ALLOWED_TTL,
            denied: DENIED_TTL,
        }
    }
}

/// Authenticates and authorizes requests through the API server.
pub struct Auth {
    client: Client,
    node_name: String,
    ttls: CacheTtls,
    /// Keyed by the SHA-256 of the token: the token itself is kept only
    /// while its review is made.
    tokens: TtlCache<[u8; 32], Option<User>>,
    decisions: TtlCache<String, bool>,
    /// Places for token reviews waiting for the API server.
    token_reviews: tokio::sync::Semaphore,
    /// Places for access reviews waiting for the API server.
    access_reviews: tokio::sync::Semaphore,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("node_name", &self.node_name)
            .field("ttls", &self.ttls)
            .finish_non_exhaustive()
    }
}

impl Auth {
    /// An authenticator and authorizer for node `node_name`, asking through
    /// `client`, with the kubelet's default cache TTLs.
    #[must_use]
    pub fn new(client: Client, node_name: String) -> Self {
        Self::with_ttls(client, node_name, CacheTtls::default())
    }

    /// As [`Auth::new`], keeping review results for `ttls`.
    #[must_use]
    pub fn with_ttls(client: Client, node_name: String, ttls: CacheTtls) -> Self {
        Self {
            client,
            node_name,
            ttls,
            tokens: ttl_cache(TOKEN_CACHE_MAX),
            decisions: ttl_cache(DECISION_CACHE_MAX),
            token_reviews: tokio::sync::Semaphore::new(MAX_TOKEN_REVIEWS),
            access_reviews: tokio::sync::Semaphore::new(MAX_ACCESS_REVIEWS),
        }
    }

    /// As it is, with at most `tokens` token reviews and `access` access
    /// reviews waiting for the API server at once (a cached result or a
    /// review already under way for the same question takes no place);
    /// beyond them a look-up fails with [`Error::Busy`].
    #[must_use]
    pub fn with_review_caps(mut self, tokens: usize, access: usize) -> Self {
        self.token_reviews = tokio::sync::Semaphore::new(tokens);
        self.access_reviews = tokio::sync::Semaphore::new(access);
        self
    }

    /// The user a bearer token belongs to, by `TokenReview` (no audiences);
    /// `None` when the API server does not authenticate it. Results are
    /// cached for [`CacheTtls::token`] under the token's hash (the kubelet's
    /// cached token authenticator); concurrent look-ups of one token share
    /// one review; a failed review is not cached.
    ///
    /// # Errors
    /// [`Error::TokenReview`] when the review cannot be made,
    /// [`Error::Busy`] when too many wait already.
    pub async fn authenticate_token(&self, token: &str) -> Result<Option<User>, Arc<Error>> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let review = async {
            let _place = self
                .token_reviews
                .try_acquire()
                .map_err(|_| Error::Busy("token"))?;
            let user = self.review_token(token).await?;
            Ok::<_, Error>(Cached {
                value: user,
                ttl: self.ttls.token,
            })
        };
        self.tokens.try_get_with(key, review).await.map(|c| c.value)
    }

    async fn review_token(&self, token: &str) -> Result<Option<User>, Error> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let got = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(Error::TokenReview)?;
        drop(review);
        let status = got.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            debug!(error = status.error.as_deref(), "token not authenticated");
            return Ok(None);
        }
        let info = status.user.unwrap_or_default();
        let user = User {
            name: info.username.unwrap_or_default(),
            uid: info.uid.unwrap_or_default(),
            groups: info.groups.unwrap_or_default(),
            extra: info.extra.unwrap_or_default(),
        };
        Ok((!user.name.is_empty()).then_some(user))
    }

    /// Whether `user` may `verb` the node's `subresource`, by
    /// `SubjectAccessReview`. Decisions are cached for
    /// [`CacheTtls::allowed`] or [`CacheTtls::denied`] (the webhook
    /// authorizer's cache); concurrent identical reviews share one call; a
    /// failed review is not cached.
    ///
    /// # Errors
    /// [`Error::SubjectAccessReview`] when the review cannot be made,
    /// [`Error::Busy`] when too many wait already.
    pub async fn authorize(
        &self,
        user: &User,
        verb: &str,
        subresource: &str,
    ) -> Result<bool, Arc<Error>> {
        let spec = SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_string()),
                group: Some(String::new()),
                version: Some("v1".into()),
                resource: Some("nodes".into()),
                subresource: Some(subresource.to_string()),
                name: Some(self.node_name.clone()),
                namespace: Some(String::new()),
                ..ResourceAttributes::default()
            }),
            non_resource_attributes: None,
        };
        let key = serde_json::to_string(&spec).unwrap_or_default();
        let review = async {
            let _place = self
                .access_reviews
                .try_acquire()
                .map_err(|_| Error::Busy("access"))?;
            let got = Api::<SubjectAccessReview>::all(self.client.clone())
                .create(
                    &PostParams::default(),
                    &SubjectAccessReview {
                        spec,
                        ..SubjectAccessReview::default()
                    },
                )
                .await
                .map_err(|source| Error::SubjectAccessReview {
                    user: user.name.clone(),
                    source,
                })?;
            let allowed = got.status.is_some_and(|s| s.allowed);
            let ttl = if allowed {
                self.ttls.allowed
            } else {
                self.ttls.denied
            };
            Ok::<_, Error>(Cached {
                value: allowed,
                ttl,
            })
        };
        self.decisions
            .try_get_with(key, review)
            .await
            .map(|c| c.value)
    }
}

fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

/// The auth filter in front of every node API route: 401 `Unauthorized` without
/// valid credentials, 500 `Authorization error (…)` when a review fails, 403
/// `Forbidden (…)` when no attribute set is allowed, 429 with `Retry-After:
/// 1` when too many reviews wait for the API server. A request let through
/// takes its connection out of the pool of unauthenticated connections
/// (a token that authenticates but may not use the node API does not).
pub async fn filter(State(auth): State<Arc<Auth>>, req: Request, next: Next) -> Response {
    let from_cert = req.extensions().get::<PeerCert>().and_then(|p| p.0.clone());
    let user = match from_cert {
        Some(u) => Some(u),
        None => match bearer_token(req.headers()) {
            Some(token) => match auth.authenticate_token(token).await {
                Ok(u) => u,
                Err(e) if matches!(*e, Error::Busy(_)) => {
                    debug!(error = %e, "token review refused");
                    return super::too_many(format!("{e}; try again later\n"));
                }
                Err(e) => {
                    warn!(error = %e, "unable to authenticate the request");
                    None
                }
            },
            None => None,
        },
    };
    let Some(user) = user else {
        return text(StatusCode::UNAUTHORIZED, "Unauthorized".into());
    };
    let verb = verb(req.method());
    let subs = subresources(req.uri().path());
    for sub in &subs {
        match auth.authorize(&user, verb, sub).await {
            Ok(true) => {
                // The connection has proven itself: it leaves the pool of
                // unauthenticated connections.
                if let Some(a) = req.extensions().get::<super::fair::Admission>() {
                    a.admitted();
                }
                return next.run(req).await;
            }
            Ok(false) => {}
            Err(e) if matches!(*e, Error::Busy(_)) => {
                debug!(error = %e, "access review refused");
                return super::too_many(format!("{e}; try again later\n"));
            }
            Err(e) => {
                warn!(error = %e, user = user.name, verb, subresource = sub, "authorization error");
                return text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!(
                        "Authorization error (user={}, verb={verb}, resource=nodes, subresource={sub})",
                        user.name
                    ),
                );
            }
        }
    }
    debug!(user = user.name, verb, subresources = ?subs, "forbidden");
    text(
        StatusCode::FORBIDDEN,
        format!(
            "Forbidden (user={}, verb={verb}, resource=nodes, subresource(s)=[{}])\n",
            user.name,
            subs.join(" ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_subresources_as_in_the_kubelet() {
        let cases: &[(&str, &[&str])] = &[
            ("/pods", &["pods", "proxy"]),
            ("/pods/", &["pods", "proxy"]),
            ("/podsx", &["proxy"]),
            ("/runningpods/", &["pods", "proxy"]),
            ("/runningpods", &["pods", "proxy"]),
            ("/allocatedPods/ns/p", &["pods", "proxy"]),
            ("/healthz", &["healthz", "proxy"]),
            ("/healthz/syncloop", &["healthz", "proxy"]),
            ("/configz", &["configz", "proxy"]),
            ("/stats", &["stats"]),
            ("/stats/summary", &["stats"]),
            ("/statsx", &["proxy"]),
            ("/metrics", &["metrics"]),
            ("/metrics/cadvisor", &["metrics"]),
            ("/metrics/resource", &["metrics"]),
            ("/logs/", &["log"]),
            ("/logs/syslog", &["log"]),
            ("/checkpoint/ns/p/c", &["checkpoint"]),
            ("/statusz", &["statusz"]),
            ("/flagz", &["configz"]),
            ("/containerLogs/ns/p/c", &["proxy"]),
            ("/exec/ns/p/c", &["proxy"]),
            ("/attach/ns/p/c", &["proxy"]),
            ("/portForward/ns/p", &["proxy"]),
            ("/run/ns/p/c", &["proxy"]),
            ("/spec/", &["proxy"]),
            ("/", &["proxy"]),
        ];
        for (path, want) in cases {
            assert_eq!(subresources(path), *want, "{path}");
        }
    }

    #[test]
    fn methods_map_to_verbs() {
        for (m, v) in [
            (Method::GET, "get"),
            (Method::POST, "create"),
            (Method::PUT, "update"),
            (Method::PATCH, "patch"),
            (Method::DELETE, "delete"),
            (Method::HEAD, ""),
            (Method::OPTIONS, ""),
        ] {
            assert_eq!(verb(&m), v, "{m}");
        }
    }

    #[test]
    fn bearer_tokens_are_read_from_the_authorization_header() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::AUTHORIZATION, v.parse().unwrap());
            m
        };
        assert_eq!(bearer_token(&h("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&h("bearer  abc ")), Some("abc"));
        assert_eq!(bearer_token(&h("Bearer ")), None);
        assert_eq!(bearer_token(&h("Basic abc")), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn certificate_subject_names_user_and_groups() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:n1");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        let cert = params.self_signed(&key).unwrap();
        let user = cert_user(cert.der()).unwrap();
        assert_eq!(user.name, "system:node:n1");
        assert_eq!(user.groups, vec!["system:nodes"]);
        assert_eq!(cert_user(b"not a certificate"), None);
    }
}
