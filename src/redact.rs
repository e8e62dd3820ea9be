//! Secrets that never show in a log line or a `Debug` print: registry
//! credentials, service account tokens, Secret data. [`Redacted`] holds one;
//! its `Debug` prints `<redacted>` and it has no `Display`, so formatting it
//! by mistake shows nothing of it, and reading it takes an explicit
//! [`Redacted::expose`]. The kubelet keeps the same rule by hand (it logs
//! neither pull secrets nor tokens, and sends no hook output in events "so that
//! secrets won't leak"). [`secret_flag`] tells the flags whose values
//! `/flagz` shows as [`CLASSIFIED`].

use std::fmt;

/// A value whose `Debug` never shows it. Compares, hashes, clones and
/// deserializes as the value itself; read it with [`Redacted::expose`] or
/// through `Deref`.
#[derive(Clone, Default, PartialEq, Eq, Hash, serde::Deserialize)]
#[serde(transparent)]
pub struct Redacted<T>(T);

impl<T> Redacted<T> {
    /// Wraps `value`.
    #[must_use]
    pub const fn new(value: T) -> Self {
        Self(value)
    }

    /// The secret itself, for the one place that must send or write it.
    #[must_use]
    pub const fn expose(&self) -> &T {
        &self.0
    }

    /// The secret itself, unwrapped.
    #[must_use]
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> From<T> for Redacted<T> {
    fn from(value: T) -> Self {
        Self(value)
    }
}

impl<T> std::ops::Deref for Redacted<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> fmt::Debug for Redacted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// What `/flagz` shows instead of the value of a flag that carries a secret
/// ([`secret_flag`]), as the apiserver's flagz shows flags annotated
/// `classified`.
pub const CLASSIFIED: &str = "CLASSIFIED";

/// Whether the flag `name` (`bootstrap-token`, `tls-private-key-file`)
/// carries a secret in its value: one of its words is `token`, `password`,
/// `secret`, `key` or `credential(s)` and its last word does not say the
/// value only names where the secret is (`file`, `dir`, `path`, `config`).
#[must_use]
pub fn secret_flag(name: &str) -> bool {
    let words: Vec<String> = name
        .split(['-', '_', '.'])
        .map(str::to_ascii_lowercase)
        .collect();
    let secret = words.iter().any(|w| {
        matches!(
            w.as_str(),
            "token" | "password" | "secret" | "key" | "credential" | "credentials"
        )
    });
    let names_a_place = words
        .last()
        .is_some_and(|w| matches!(w.as_str(), "file" | "dir" | "path" | "config"));
    secret && !names_a_place
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_shows_nothing_of_the_value() {
        let token = Redacted::new("eyJhbGciOi.secret-token".to_string());
        for printed in [format!("{token:?}"), format!("{token:#?}")] {
            assert_eq!(printed, "<redacted>");
        }
        #[derive(Debug)]
        #[allow(dead_code, reason = "only printed")]
        struct Holder {
            user: String,
            password: Redacted<String>,
        }
        let h = Holder {
            user: "admin".into(),
            password: "hunter2".to_string().into(),
        };
        let printed = format!("{h:?}");
        assert!(
            printed.contains("admin") && !printed.contains("hunter2"),
            "{printed}"
        );
        assert_eq!(token.expose(), "eyJhbGciOi.secret-token");
        assert_eq!(token.len(), 23, "Deref reaches the value");
        let parsed: Redacted<String> = serde_json::from_str("\"p\"").unwrap();
        assert_eq!(parsed.into_inner(), "p");
    }

    #[test]
    fn flags_holding_secrets_are_told_from_flags_naming_files() {
        for secret in [
            "bootstrap-token",
            "api-password",
            "tls-private-key",
            "client_secret",
        ] {
            assert!(secret_flag(secret), "{secret}");
        }
        for shown in [
            "tls-private-key-file",
            "image-credential-provider-config",
            "image-credential-provider-bin-dir",
            "bootstrap-kubeconfig",
            "node-ip",
            "keyring",
        ] {
            assert!(!secret_flag(shown), "{shown}");
        }
    }
}
