//! Service account tokens for projected volumes, as the kubelet's token manager
//! (pkg/kubelet/token/token_manager.go): one TokenRequest per (service account,
//! audience, expiration, pod), bound to the pod, kept in memory and requested
//! again when 80 % of its lifetime has passed or it is 24 h old.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};

use super::{Error, Result};
use crate::redact::Redacted;

/// Tokens are requested again after this age whatever their expiration (24 h).
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);
/// Expiration asked for when the projection sets none (the API default, 1 h).
pub const DEFAULT_EXPIRATION_SECONDS: i64 = 3600;

/// The waits before each quick retry of a key's first TokenRequest that the
/// API server refused (403): 20, 40, 80 and 160 ms, 300 ms in all. Right
/// after a pod is bound, the Node authorizer may not yet have seen the
/// binding, and refuses the node a token for the pod for some milliseconds;
/// without these the pod would wait for the volume retry (500 ms, the
/// kubelet's first mount retry). A key refused through all of them is
/// retried only by the volume retry after that, one request per sync.
pub const FIRST_REFUSAL_RETRIES: [Duration; 4] = [
    Duration::from_millis(20),
    Duration::from_millis(40),
    Duration::from_millis(80),
    Duration::from_millis(160),
];

/// What a token is requested for; also the cache key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenKey {
    /// Namespace of the pod and its service account.
    pub namespace: String,
    /// Service account name.
    pub service_account: String,
    /// Audience (`None`: the API server's default audiences).
    pub audience: Option<String>,
    /// Requested lifetime in seconds.
    pub expiration_seconds: i64,
    /// Name of the pod the token is bound to.
    pub pod_name: String,
    /// UID of the pod the token is bound to.
    pub pod_uid: String,
    /// The service account's UID the request is made on the condition of
    /// (the request's `metadata.uid`: refused if the account was replaced),
    /// when known; None for projected volumes, as the kubelet's.
    pub service_account_uid: Option<String>,
}

/// A token the API server issued.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedToken {
    /// The JWT (never shown by `Debug`).
    pub token: Redacted<String>,
    /// When it expires.
    pub expires: Timestamp,
    /// The lifetime the API server granted, in seconds.
    pub expiration_seconds: i64,
}

/// True when `token` must be requested again at `now`: within the last 20 %
/// of its lifetime, or older than [`MAX_TTL`] (the kubelet's `requiresRefresh`,
/// without its jitter). Counted in whole seconds, saturating: a lifetime up
/// to `i64::MAX` seconds (asked for by the pod's projection, granted by the
/// API server) never overflows, where the kubelet's arithmetic wraps.
#[must_use]
pub fn requires_refresh(token: &IssuedToken, now: Timestamp) -> bool {
    let ttl = token.expiration_seconds.max(0);
    let expires = token.expires.as_second();
    let issued = expires.saturating_sub(ttl);
    let max_ttl = i64::try_from(MAX_TTL.as_secs()).unwrap_or(i64::MAX);
    if now.as_second() > issued.saturating_add(max_ttl) {
        return true;
    }
    let refresh_at = expires.saturating_sub(ttl / 100 * 20 + ttl % 100 * 20 / 100);
    now.as_second() >= refresh_at
}

/// The TokenRequest the kubelet sends for `key`: audience, expiration and a
/// `boundObjectRef` to the pod (so the token dies with the pod).
#[must_use]
pub fn request(key: &TokenKey) -> TokenRequest {
    TokenRequest {
        metadata: kube::api::ObjectMeta {
            uid: key.service_account_uid.clone(),
            ..Default::default()
        },
        spec: Some(TokenRequestSpec {
            audiences: key.audience.as_ref().map(|a| vec![a.clone()]),
            expiration_seconds: Some(key.expiration_seconds),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(key.pod_name.clone()),
                uid: Some(key.pod_uid.clone()),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The token cache; one per agent.
#[derive(Default)]
pub struct TokenManager {
    tokens: Mutex<HashMap<TokenKey, IssuedToken>>,
    /// Keys refused through all of [`FIRST_REFUSAL_RETRIES`] (until issued a
    /// token or forgotten with their pod).
    refused: Mutex<HashSet<TokenKey>>,
}

impl TokenManager {
    /// The token for `key`: the cached one while fresh, else a new one from
    /// `POST serviceaccounts/<sa>/token` (allowed to a node for pods bound to it).
    /// A key's first request refused with 403 is sent again after each wait
    /// of [`FIRST_REFUSAL_RETRIES`] while it is refused.
    ///
    /// # Errors
    /// [`Error::Api`] when the TokenRequest fails, [`Error::Payload`] when its
    /// answer carries no token.
    pub async fn get(&self, client: &Client, key: &TokenKey) -> Result<String> {
        let now = Timestamp::now();
        if let Some(t) = lock(&self.tokens)
            .get(key)
            .filter(|t| !requires_refresh(t, now))
        {
            return Ok(t.token.expose().clone());
        }
        let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &key.namespace);
        let first = !lock(&self.refused).contains(key);
        let mut waits = FIRST_REFUSAL_RETRIES.iter().filter(|_| first);
        let tr = loop {
            let sent = api
                .create_token_request(&key.service_account, &PostParams::default(), &request(key))
                .await;
            match sent {
                Ok(tr) => break tr,
                Err(e)
                    if refused(&e)
                        && let Some(wait) = waits.next() =>
                {
                    tokio::time::sleep(*wait).await;
                }
                Err(source) => {
                    if first && refused(&source) {
                        lock(&self.refused).insert(key.clone());
                    }
                    return Err(Error::Api {
                        what: format!(
                            "request token for service account {:?}",
                            key.service_account
                        ),
                        source,
                    });
                }
            }
        };
        lock(&self.refused).remove(key);
        let status = tr.status.unwrap_or_default();
        let (Some(token), Some(expires)) = (status.token, status.expiration_timestamp) else {
            return Err(Error::Payload(format!(
                "token request for service account {:?} returned no token",
                key.service_account
            )));
        };
        let granted = tr.spec.and_then(|s| s.expiration_seconds);
        let issued = IssuedToken {
            token: token.clone().into(),
            expires: expires.0,
            expiration_seconds: granted.unwrap_or(key.expiration_seconds),
        };
        lock(&self.tokens).insert(key.clone(), issued);
        Ok(token)
    }

    /// Forgets the tokens bound to the pods whose UID `keep` rejects.
    pub fn retain_pods(&self, keep: impl Fn(&str) -> bool) {
        lock(&self.tokens).retain(|k, _| keep(&k.pod_uid));
        lock(&self.refused).retain(|k| keep(&k.pod_uid));
    }

    /// Forgets the tokens bound to the pod with UID `pod_uid`.
    pub fn forget_pod(&self, pod_uid: &str) {
        lock(&self.tokens).retain(|k, _| k.pod_uid != pod_uid);
        lock(&self.refused).retain(|k| k.pod_uid != pod_uid);
    }
}

/// Whether the API server refused the request (403).
fn refused(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    #[test]
    fn refreshes_at_eighty_percent_of_the_lifetime() {
        // Issued at 0 for 3600 s: fresh until 2880 s.
        let t = IssuedToken {
            token: "t".to_string().into(),
            expires: at(3600),
            expiration_seconds: 3600,
        };
        assert!(!requires_refresh(&t, at(0)));
        assert!(!requires_refresh(&t, at(2879)));
        assert!(requires_refresh(&t, at(2880)));
        assert!(requires_refresh(&t, at(4000)));
    }

    #[test]
    fn debug_never_shows_the_token() {
        let t = IssuedToken {
            token: "eyJhbGciOiJSUzI1NiJ9.payload.signature".to_string().into(),
            expires: at(3600),
            expiration_seconds: 3600,
        };
        let printed = format!("{t:?} {t:#?}");
        assert!(
            !printed.contains("eyJ") && !printed.contains("signature"),
            "{printed}"
        );
        assert!(printed.contains("3600"), "{printed}");
    }

    #[test]
    fn refreshes_after_a_day_whatever_the_expiration() {
        let year = 365 * 24 * 3600;
        let t = IssuedToken {
            token: "t".to_string().into(),
            expires: at(year),
            expiration_seconds: year,
        };
        assert!(!requires_refresh(&t, at(24 * 3600)));
        assert!(requires_refresh(&t, at(24 * 3600 + 1)));
    }

    #[test]
    fn extreme_lifetimes_never_overflow() {
        let token = |expires: Timestamp, ttl: i64| IssuedToken {
            token: "t".to_string().into(),
            expires,
            expiration_seconds: ttl,
        };
        // (expires, granted lifetime, now, refresh): a lifetime longer than
        // time itself was issued before it began, more than a day ago.
        let cases = [
            (at(3600), i64::MAX, at(0), true),
            (Timestamp::MAX, i64::MAX, at(0), true),
            (Timestamp::MAX, i64::MAX, Timestamp::MAX, true),
            (Timestamp::MIN, i64::MAX, at(0), true),
            (at(3600), i64::MIN, at(0), false),
            (at(3600), -1, at(3599), false),
            (at(3600), 0, at(3600), true),
            (at(3600), i64::from(i32::MAX), at(0), true),
        ];
        for (expires, ttl, now, want) in cases {
            let t = token(expires, ttl);
            assert_eq!(requires_refresh(&t, now), want, "{expires} {ttl} {now}");
        }
        // A year-long lifetime ending at the last timestamp: fresh for a day.
        let year = 365 * 24 * 3600;
        let t = token(Timestamp::MAX, year);
        let issued = Timestamp::from_second(Timestamp::MAX.as_second() - year).unwrap();
        assert!(!requires_refresh(&t, issued));
        assert!(requires_refresh(
            &t,
            issued + Duration::from_secs(24 * 3600 + 1)
        ));
    }

    #[test]
    fn request_is_bound_to_the_pod() {
        let key = TokenKey {
            namespace: "ns".into(),
            service_account: "default".into(),
            audience: Some("vault".into()),
            expiration_seconds: 3607,
            pod_name: "web".into(),
            pod_uid: "u1".into(),
            service_account_uid: None,
        };
        assert!(request(&key).metadata.uid.is_none());
        let on_condition = TokenKey {
            service_account_uid: Some("sa-uid".into()),
            ..key.clone()
        };
        assert_eq!(
            request(&on_condition).metadata.uid.as_deref(),
            Some("sa-uid")
        );
        let r = request(&key).spec.unwrap();
        assert_eq!(r.audiences, Some(vec!["vault".to_string()]));
        assert_eq!(r.expiration_seconds, Some(3607));
        let b = r.bound_object_ref.unwrap();
        assert_eq!(
            (b.kind.as_deref(), b.name.as_deref(), b.uid.as_deref()),
            (Some("Pod"), Some("web"), Some("u1"))
        );
        let none = request(&TokenKey {
            audience: None,
            ..key
        });
        assert!(none.spec.unwrap().audiences.is_none());
    }

    fn key(pod_uid: &str) -> TokenKey {
        TokenKey {
            namespace: "ns".into(),
            service_account: "default".into(),
            audience: None,
            expiration_seconds: 3607,
            pod_name: "web".into(),
            pod_uid: pod_uid.into(),
            service_account_uid: None,
        }
    }

    /// The TokenRequests the fake API server received, drained.
    fn token_requests(api: &crate::fake_api::FakeApi) -> usize {
        let all = api.take_requests();
        assert!(
            all.iter()
                .all(|r| r.line() == "POST /api/v1/namespaces/ns/serviceaccounts/default/token"),
            "{all:?}"
        );
        all.len()
    }

    #[tokio::test]
    async fn a_first_refusal_is_retried_quickly_until_the_token_is_issued() {
        let api = crate::fake_api::FakeApi::default();
        let tokens = TokenManager::default();
        api.refuse_tokens(2);
        let started = std::time::Instant::now();
        let token = tokens.get(&api.client(), &key("u1")).await.unwrap();
        assert!(token.starts_with("token-default-"), "{token}");
        // Refused twice, issued on the third request, after 20 + 40 ms.
        assert_eq!(token_requests(&api), 3);
        assert!(started.elapsed() >= Duration::from_millis(60));
        // Cached now: no request.
        assert_eq!(tokens.get(&api.client(), &key("u1")).await.unwrap(), token);
        assert_eq!(token_requests(&api), 0);
    }

    #[tokio::test]
    async fn a_key_refused_through_the_quick_retries_is_then_asked_once_per_call() {
        let api = crate::fake_api::FakeApi::default();
        let tokens = TokenManager::default();
        api.refuse_tokens(u32::MAX);
        let err = tokens.get(&api.client(), &key("u1")).await.unwrap_err();
        assert!(
            matches!(&err, Error::Api { source: kube::Error::Api(s), .. } if s.code == 403),
            "{err:?}"
        );
        assert_eq!(token_requests(&api), 1 + FIRST_REFUSAL_RETRIES.len());
        // The same key again: one request, no quick retries.
        tokens.get(&api.client(), &key("u1")).await.unwrap_err();
        assert_eq!(token_requests(&api), 1);
        // Another pod's key has its own quick retries.
        tokens.get(&api.client(), &key("u2")).await.unwrap_err();
        assert_eq!(token_requests(&api), 1 + FIRST_REFUSAL_RETRIES.len());
        // Forgotten with its pod, the key starts over with quick retries.
        tokens.forget_pod("u1");
        api.refuse_tokens(1);
        tokens.get(&api.client(), &key("u1")).await.unwrap();
        assert_eq!(token_requests(&api), 2);
        assert!(lock(&tokens.refused).iter().all(|k| k.pod_uid == "u2"));
    }
}
