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

use crate::redact::Redacted;

/// The Docker Hub registry as keys may name it.
const DOCKER_HUB: &str = "index.docker.io";

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

/// Credentials from a pod's pull secrets, in the order they are found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keyring {
    entries: Vec<(String, Entry, Option<SecretSource>)>,
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
        for (key, mut entry) in parsed {
            if let Some((user, pass)) = decode_auth(&entry.auth) {
                entry.username = user;
                entry.password = pass.into();
            }
            self.entries.push((key, entry, source.clone()));
        }
        Ok(())
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

    /// As [`Keyring::lookup`], each credential with the Secret it came from
    /// (`None` for one added without a source).
    #[must_use]
    pub fn lookup_sourced(&self, image: &str) -> Vec<(Option<SecretSource>, cri::AuthConfig)> {
        let (host, path) = image_location(image);
        let mut found: Vec<(usize, &Entry, &Option<SecretSource>)> = self
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
    pub fn all_sourced(&self) -> Vec<(Option<SecretSource>, cri::AuthConfig)> {
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

/// The repository an image reference names, with Docker Hub's defaults
/// spelt out and tag and digest dropped: `busybox:1.36`,
/// `docker.io/library/busybox` and `index.docker.io/library/busybox@sha256:…`
/// all name `docker.io/library/busybox`, as the runtime resolves them to one
/// image.
#[must_use]
pub fn normalized_repository(image: &str) -> String {
    let (host, path) = image_location(image);
    let host = if host == DOCKER_HUB {
        "docker.io"
    } else {
        host.as_str()
    };
    format!("{host}/{path}")
}

/// The registry host (with port) and repository path of an image reference,
/// with Docker Hub's defaults (`busybox` is `index.docker.io/library/busybox`).
fn image_location(image: &str) -> (String, String) {
    let name = crate::image_policy::image_name(image);
    match name.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            let host = if first == "docker.io" {
                DOCKER_HUB
            } else {
                first
            };
            (host.to_string(), rest.to_string())
        }
        Some(_) => (DOCKER_HUB.to_string(), name.to_string()),
        None => (DOCKER_HUB.to_string(), format!("library/{name}")),
    }
}

/// A key without scheme and trailing slash; Docker Hub's names made one.
fn normalize_key(key: &str) -> String {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key)
        .trim_end_matches('/');
    let k = k
        .strip_suffix("/v1")
        .or_else(|| k.strip_suffix("/v2"))
        .unwrap_or(k);
    match k.split_once('/') {
        Some((h, rest)) if is_docker_hub(h) => format!("{DOCKER_HUB}/{rest}"),
        None if is_docker_hub(k) => DOCKER_HUB.to_string(),
        _ => k.to_string(),
    }
}

fn is_docker_hub(host: &str) -> bool {
    matches!(
        host,
        "docker.io" | "index.docker.io" | "registry-1.docker.io"
    )
}

/// The kubelet's `URLsMatch`: globbed host labels, equal ports, path prefix.
fn key_matches(key: &str, host: &str, path: &str) -> bool {
    let key = normalize_key(key);
    let (key_host, key_path) = key.split_once('/').unwrap_or((&key, ""));
    let split = |h: &str| -> (String, String) {
        match h.rsplit_once(':') {
            Some((name, port)) => (name.to_string(), port.to_string()),
            None => (h.to_string(), String::new()),
        }
    };
    let ((key_name, key_port), (name, port)) = (split(key_host), split(host));
    if key_port != port {
        return false;
    }
    let key_labels: Vec<&str> = key_name.split('.').collect();
    let labels: Vec<&str> = name.split('.').collect();
    if key_labels.len() != labels.len() || !key_labels.iter().zip(&labels).all(|(g, l)| glob(g, l))
    {
        return false;
    }
    key_path.is_empty() || path == key_path || path.starts_with(&format!("{key_path}/"))
}

/// The longest host label (bytes) that is matched at all: a DNS label's
/// 63. A longer label, in a key or in an image's host, names no registry.
pub const MAX_LABEL_BYTES: usize = 63;

/// One host label against a key's glob label, as the kubelet's
/// `filepath.Match` per label: `*` is any run of characters, `?` any one.
/// wildmatch's matcher never backtracks past its last `*`, so the work is
/// at most the product of the two lengths, each at most
/// [`MAX_LABEL_BYTES`]: a pull secret's key cannot make the agent try each
/// way to split a host among its stars.
fn glob(pattern: &str, text: &str) -> bool {
    pattern.len() <= MAX_LABEL_BYTES
        && text.len() <= MAX_LABEL_BYTES
        && wildmatch::WildMatch::new(pattern).matches(text)
}

/// Whether registry `pattern` (`host[:port][/path]`, globs per host label, a
/// scheme ignored) covers `image`, as the kubelet's `URLsMatchStr`: the rule
/// pull secrets' keys are looked up by, which the kubelet also applies to
/// credential provider plugins' `matchImages`.
#[must_use]
pub fn registry_matches(pattern: &str, image: &str) -> bool {
    let (host, path) = image_location(image);
    key_matches(pattern, &host, &path)
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
    fn images_split_into_registry_and_path() {
        let cases = [
            ("busybox", ("index.docker.io", "library/busybox")),
            ("busybox:1.36", ("index.docker.io", "library/busybox")),
            ("me/app:1", ("index.docker.io", "me/app")),
            (
                "docker.io/library/nginx",
                ("index.docker.io", "library/nginx"),
            ),
            (
                "127.0.0.1:5000/private/busybox:1",
                ("127.0.0.1:5000", "private/busybox"),
            ),
            ("localhost/x", ("localhost", "x")),
            ("gcr.io/p/img@sha256:abc", ("gcr.io", "p/img")),
        ];
        for (image, (host, path)) in cases {
            assert_eq!(image_location(image), (host.into(), path.into()), "{image}");
        }
    }

    #[test]
    fn keys_match_as_the_kubelets_keyring() {
        let cases = [
            ("127.0.0.1:5000", "127.0.0.1:5000/private/b:1", true),
            ("127.0.0.1:5000", "127.0.0.1:5001/private/b:1", false),
            ("http://127.0.0.1:5000/", "127.0.0.1:5000/private/b:1", true),
            ("127.0.0.1:5000/private", "127.0.0.1:5000/private/b:1", true),
            ("127.0.0.1:5000/priv", "127.0.0.1:5000/private/b:1", false),
            ("*.gcr.io", "eu.gcr.io/p/i", true),
            ("*.gcr.io", "gcr.io/p/i", false),
            ("*.gcr.io", "a.b.gcr.io/p/i", false),
            ("registry-*.corp", "registry-1.corp/i", true),
            ("https://index.docker.io/v1/", "busybox", true),
            ("docker.io", "me/app", true),
            ("quay.io", "busybox", false),
        ];
        for (key, image, want) in cases {
            let (host, path) = image_location(image);
            assert_eq!(key_matches(key, &host, &path), want, "{key} vs {image}");
        }
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
    fn globs_match_runs_of_characters() {
        assert!(glob("*", "anything"));
        assert!(glob("a*c", "abbbc"));
        assert!(!glob("a*c", "abbb"));
        assert!(glob("*-east", "us-east"));
        assert!(glob("registry-?", "registry-1"));
        assert!(!glob("registry-?", "registry-12"));
    }

    #[test]
    fn a_glob_bomb_key_is_matched_without_backtracking() {
        // C(60, 20) ways to place the stars: a backtracking matcher never
        // returns from these; a linear one answers at once.
        let bomb = format!("{}c.x", "*a".repeat(20));
        let host = format!("{}.x", "a".repeat(60));
        assert!(!registry_matches(&bomb, &format!("{host}/img:1")));
        let near = format!("{}b.x", "a".repeat(60));
        assert!(!glob(&bomb.replace(".x", ""), &near.replace(".x", "")));
        let k = keyring(&format!(r#"{{"auths": {{"{bomb}": {{"auth": "dTpw"}}}}}}"#));
        for _ in 0..100 {
            assert!(k.lookup(&format!("{host}/img:1")).is_empty());
        }
        assert!(registry_matches("*.gcr.io", "eu.gcr.io/p/i:1"));
        // Past a DNS label's length nothing matches, not even `*`: the work
        // stays bounded whatever a key or an image's host holds.
        assert!(glob("*", &"a".repeat(MAX_LABEL_BYTES)));
        assert!(!glob("*", &"a".repeat(MAX_LABEL_BYTES + 1)));
        assert!(!glob(
            &format!("*{}b", "a".repeat(500_000)),
            &"a".repeat(1 << 20)
        ));
    }
}
