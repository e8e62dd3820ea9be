//! Image pull credentials from a pod's `imagePullSecrets`, as the kubelet's
//! `credentialprovider` keyring (pkg/credentialprovider/keyring.go,
//! config.go): `kubernetes.io/dockerconfigjson` (`.dockerconfigjson`,
//! `{"auths": {...}}`) and `kubernetes.io/dockercfg` (`.dockercfg`) secrets are
//! read into entries keyed by registry (`host[:port][/path]`, `*` globs
//! allowed per host label, an `http(s)://` scheme ignored), and an image is
//! matched against every key: same host labels (globs matching), same port,
//! and the key's path a prefix of the image's. Matches are tried longest key
//! first, as the kubelet's `Lookup`. Passwords, `auth` and tokens are
//! [`Redacted`]: a `Debug` print of a keyring shows registries and user
//! names only, and a config that does not parse is reported by position, never
//! by its content.

use std::collections::BTreeMap;

use base64::Engine as _;
use k8s_cri::v1 as cri;
use serde::Deserialize;

use crate::credential_provider::{Provided, ServiceAccountCoordinates};
use crate::redact::Redacted;
use crate::registry::{image_location, key_matches, normalize_key};

/// One registry's credentials in a docker config file.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
struct Entry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: Redacted<String>,
    /// base64 of `username:password`.
    #[serde(default)]
    auth: Redacted<String>,
    #[serde(default, rename = "identitytoken")]
    identity_token: Redacted<String>,
    #[serde(default, rename = "registrytoken")]
    registry_token: Redacted<String>,
}

/// The `.dockerconfigjson` shape.
#[derive(Deserialize)]
struct ConfigJson {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
}

/// Credentials from a pod's pull secrets or from credential providers, in
/// the order they are found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keyring {
    entries: Vec<(String, Entry, Source)>,
}

/// Where a credential came from (the kubelet's `CredentialSource`): what
/// an image pulled with it is recorded as usable by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Added without a source: recorded as no one's.
    Unsourced,
    /// One of the pod's pull secrets.
    Secret(SecretSource),
    /// A credential provider given a token of this service account: the
    /// pods running as it.
    ServiceAccount(ServiceAccountCoordinates),
    /// A credential provider given no token: every pod of the node.
    Node,
}

/// The Secret a credential came from (the kubelet's secret coordinates of
/// an image pull record).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SecretSource {
    /// The Secret's namespace.
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
    /// The Secret's UID.
    pub uid: String,
}

/// Why a pull secret was not used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SecretError {
    /// The secret is of another type or lacks its key.
    #[error("secret is not of type kubernetes.io/dockerconfigjson or kubernetes.io/dockercfg")]
    WrongType,
    /// The docker config does not parse: what is wrong and where, never the
    /// content (serde's own message may quote a value, a password among them).
    #[error("invalid docker config: {0}")]
    Invalid(String),
}

impl Keyring {
    /// Adds the credentials of one secret (`type_` and its `data`).
    ///
    /// # Errors
    /// [`SecretError`] for a secret of another type or with unparsable content;
    /// nothing is added then.
    pub fn add_secret(
        &mut self,
        type_: &str,
        data: &BTreeMap<String, Vec<u8>>,
    ) -> Result<(), SecretError> {
        self.add_secret_from(None, type_, data)
    }

    /// As [`Keyring::add_secret`], remembering which Secret the credentials
    /// came from ([`Keyring::lookup_sourced`]).
    ///
    /// # Errors
    /// As [`Keyring::add_secret`].
    pub fn add_secret_from(
        &mut self,
        source: Option<SecretSource>,
        type_: &str,
        data: &BTreeMap<String, Vec<u8>>,
    ) -> Result<(), SecretError> {
        let parsed: BTreeMap<String, Entry> =
            match (type_, data.get(".dockerconfigjson"), data.get(".dockercfg")) {
                ("kubernetes.io/dockerconfigjson", Some(json), _) => {
                    serde_json::from_slice::<ConfigJson>(json)
                        .map_err(invalid)?
                        .auths
                }
                ("kubernetes.io/dockercfg", _, Some(cfg)) => {
                    serde_json::from_slice(cfg).map_err(invalid)?
                }
                _ => return Err(SecretError::WrongType),
            };
        let source = source.map_or(Source::Unsourced, Source::Secret);
        for (key, mut entry) in parsed {
            if let Some((user, pass)) = decode_auth(&entry.auth) {
                entry.username = user;
                entry.password = pass.into();
            }
            self.entries.push((key, entry, source.clone()));
        }
        Ok(())
    }

    /// Adds what a credential provider gave: its registries' user names
    /// and passwords, from its service account, or node-wide when it was
    /// given no token.
    pub fn add_provided(&mut self, provided: &Provided) {
        let source = provided
            .service_account
            .clone()
            .map_or(Source::Node, Source::ServiceAccount);
        for c in provided.credentials.iter() {
            let entry = Entry {
                username: c.username.clone(),
                password: c.password.clone(),
                ..Entry::default()
            };
            self.entries
                .push((c.registry.clone(), entry, source.clone()));
        }
    }

    /// The CRI credentials to try for `image`, longest matching key first; empty
    /// when none match (then the pull is anonymous).
    #[must_use]
    pub fn lookup(&self, image: &str) -> Vec<cri::AuthConfig> {
        self.lookup_sourced(image)
            .into_iter()
            .map(|(_, auth)| auth)
            .collect()
    }

    /// As [`Keyring::lookup`], each credential with where it came from.
    #[must_use]
    pub fn lookup_sourced(&self, image: &str) -> Vec<(Source, cri::AuthConfig)> {
        let (host, path) = image_location(image);
        let mut found: Vec<(usize, &Entry, &Source)> = self
            .entries
            .iter()
            .filter(|(key, _, _)| key_matches(key, &host, &path))
            .map(|(key, e, source)| (normalize_key(key).len(), e, source))
            .collect();
        // Stable: equal lengths keep the secrets' order.
        found.sort_by_key(|f| std::cmp::Reverse(f.0));
        found
            .into_iter()
            .map(|(_, e, source)| (source.clone(), e.auth_config()))
            .collect()
    }

    /// Every credential, whatever registry it is for, each with its Secret:
    /// what a pod holds for an image named by its ID, which names no
    /// registry.
    #[must_use]
    pub fn all_sourced(&self) -> Vec<(Source, cri::AuthConfig)> {
        self.entries
            .iter()
            .map(|(_, e, source)| (source.clone(), e.auth_config()))
            .collect()
    }
}

impl Entry {
    /// The CRI credential of this entry.
    fn auth_config(&self) -> cri::AuthConfig {
        cri::AuthConfig {
            username: self.username.clone(),
            password: self.password.expose().clone(),
            auth: String::new(),
            // Left empty as the kubelet's keyring does: the key already
            // matched the image's registry.
            server_address: String::new(),
            identity_token: self.identity_token.expose().clone(),
            registry_token: self.registry_token.expose().clone(),
        }
    }
}

/// A docker config that does not parse, by the kind of error and its position.
#[allow(clippy::needless_pass_by_value, reason = "used as a map_err function")]
fn invalid(e: serde_json::Error) -> SecretError {
    let what = match e.classify() {
        serde_json::error::Category::Io => "unreadable",
        serde_json::error::Category::Syntax => "not JSON",
        serde_json::error::Category::Data => "not a docker config",
        serde_json::error::Category::Eof => "truncated",
    };
    SecretError::Invalid(format!("{what} at line {} column {}", e.line(), e.column()))
}

/// `username:password` from a base64 `auth` field.
fn decode_auth(auth: &str) -> Option<(String, String)> {
    if auth.is_empty() {
        return None;
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(auth)
        .ok()?;
    let text = String::from_utf8(bytes).ok()?;
    let (user, pass) = text.split_once(':')?;
    Some((user.to_string(), pass.trim_end_matches('\0').to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyring(json: &str) -> Keyring {
        let mut k = Keyring::default();
        let data = BTreeMap::from([(".dockerconfigjson".to_string(), json.as_bytes().to_vec())]);
        k.add_secret("kubernetes.io/dockerconfigjson", &data)
            .unwrap();
        k
    }

    #[test]
    fn lookup_prefers_the_longest_key_and_decodes_auth() {
        // "dTE6cDE=" is u1:p1.
        let k = keyring(
            r#"{"auths": {
                "127.0.0.1:5000": {"auth": "dTE6cDE="},
                "127.0.0.1:5000/private": {"username": "u2", "password": "p2"},
                "quay.io": {"username": "q", "password": "q"}
            }}"#,
        );
        let found = k.lookup("127.0.0.1:5000/private/busybox:1");
        let users: Vec<(&str, &str)> = found
            .iter()
            .map(|a| (a.username.as_str(), a.password.as_str()))
            .collect();
        assert_eq!(users, [("u2", "p2"), ("u1", "p1")]);
        assert!(k.lookup("busybox").is_empty());
    }

    #[test]
    fn both_secret_types_and_bad_ones() {
        let mut k = Keyring::default();
        let cfg = BTreeMap::from([(
            ".dockercfg".to_string(),
            br#"{"r.io": {"username": "a", "password": "b"}}"#.to_vec(),
        )]);
        k.add_secret("kubernetes.io/dockercfg", &cfg).unwrap();
        assert_eq!(k.lookup("r.io/x").len(), 1);
        assert_eq!(k.add_secret("Opaque", &cfg), Err(SecretError::WrongType));
        let bad = BTreeMap::from([(".dockerconfigjson".to_string(), b"{".to_vec())]);
        assert!(matches!(
            k.add_secret("kubernetes.io/dockerconfigjson", &bad),
            Err(SecretError::Invalid(_))
        ));
        assert_eq!(k.lookup("r.io/x").len(), 1, "nothing lost");
    }

    #[test]
    fn no_secret_in_a_debug_print_or_an_error() {
        // "dTE6c2VjcmV0LWF1dGg=" is u1:secret-auth.
        let k = keyring(
            r#"{"auths": {
                "a.io": {"auth": "dTE6c2VjcmV0LWF1dGg="},
                "b.io": {"username": "u2", "password": "secret-password"},
                "c.io": {"identitytoken": "secret-identity", "registrytoken": "secret-registry"}
            }}"#,
        );
        let printed = format!("{k:?} {k:#?}");
        for secret in ["secret", "dTE6c2VjcmV0LWF1dGg=", "c2VjcmV0"] {
            assert!(!printed.contains(secret), "{secret} in {printed}");
        }
        assert!(
            printed.contains("b.io") && printed.contains("u2"),
            "{printed}"
        );
        assert_eq!(k.lookup("c.io/x")[0].identity_token, "secret-identity");
        // serde would quote the misplaced password in its message.
        for bad in [
            r#"{"auths": {"r.io": {"password": ["secret-password"]}}}"#,
            r#"{"auths": "secret-password"}"#,
            r#"{"auths": {"r.io": {"password": "secret-password"}"#,
            "secret-password",
        ] {
            let data = BTreeMap::from([(".dockerconfigjson".to_string(), bad.as_bytes().to_vec())]);
            let err = Keyring::default()
                .add_secret("kubernetes.io/dockerconfigjson", &data)
                .unwrap_err();
            let text = format!("{err} {err:?}");
            assert!(!text.contains("secret"), "{text}");
            assert!(text.contains("line 1 column"), "{text}");
        }
    }

    #[test]
    fn a_glob_bomb_key_in_a_secret_is_looked_up_without_backtracking() {
        let bomb = format!("{}c.x", "*a".repeat(20));
        let host = format!("{}.x", "a".repeat(60));
        let k = keyring(&format!(r#"{{"auths": {{"{bomb}": {{"auth": "dTpw"}}}}}}"#));
        for _ in 0..100 {
            assert!(k.lookup(&format!("{host}/img:1")).is_empty());
        }
    }
}
