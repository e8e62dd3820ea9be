//! The credential provider configuration, as the kubelet reads it
//! (`pkg/credentialprovider/plugin/config.go`): a `CredentialProviderConfig`
//! (`kubelet.config.k8s.io/v1`, `v1beta1` or `v1alpha1`, decoded strictly:
//! an unknown field is an error) in a file, or in every `*.json`, `*.yaml`
//! and `*.yml` file of a directory in lexical order, their providers merged
//! (a name twice is an error), then validated with the kubelet's rules and
//! messages. Pure: the caller reads the files.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::Deserialize;

/// The `apiVersion`s of the configuration file.
pub const CONFIG_VERSIONS: [&str; 3] = [
    "kubelet.config.k8s.io/v1",
    "kubelet.config.k8s.io/v1beta1",
    "kubelet.config.k8s.io/v1alpha1",
];
/// The exec API versions a provider may speak (its `apiVersion`).
pub const PLUGIN_VERSIONS: [&str; 3] = [
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
];
/// The one exec API version with service account tokens.
pub const TOKEN_VERSION: &str = "credentialprovider.kubelet.k8s.io/v1";

/// One configuration file (`CredentialProviderConfig`).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct File {
    api_version: String,
    kind: String,
    #[serde(default)]
    providers: Vec<RawProvider>,
}

/// A provider as written; durations still Go duration strings.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawProvider {
    name: String,
    #[serde(default)]
    match_images: Vec<String>,
    default_cache_duration: Option<String>,
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<EnvVar>,
    token_attributes: Option<RawTokenAttributes>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawTokenAttributes {
    #[serde(default)]
    service_account_token_audience: String,
    #[serde(default)]
    cache_type: String,
    require_service_account: Option<bool>,
    #[serde(default)]
    required_service_account_annotation_keys: Vec<String>,
    #[serde(default)]
    optional_service_account_annotation_keys: Vec<String>,
}

/// An environment variable a provider runs with (`ExecEnvVar`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct EnvVar {
    /// Its name.
    pub name: String,
    /// Its value.
    pub value: String,
}

/// How plugin answers obtained with a service account token are cached
/// (`ServiceAccountTokenCacheType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum TokenCacheType {
    /// Per service account (namespace, name, UID, annotations): the
    /// credentials do not depend on the token.
    ServiceAccount,
    /// Per token: the credentials are the token's (the plugin may answer
    /// the token itself as the password).
    Token,
}

/// A provider's `tokenAttributes`: the pod's service account token the
/// plugin is given (KEP-4412).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenAttributes {
    /// The audience the token is requested for.
    pub service_account_token_audience: String,
    /// How answers are cached.
    pub cache_type: TokenCacheType,
    /// Whether a pod without a service account gets no credentials from
    /// this provider (true) or the plugin runs without a token (false).
    pub require_service_account: bool,
    /// Annotations of the service account the plugin is given; one
    /// missing: no credentials from this provider for the pod.
    pub required_service_account_annotation_keys: Vec<String>,
    /// Annotations of the service account given when present.
    pub optional_service_account_annotation_keys: Vec<String>,
}

/// One credential provider plugin (`CredentialProvider`), validated.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Provider {
    /// Its name, also its executable's in the plugin directory.
    pub name: String,
    /// Registry patterns of the images it serves (`host[:port][/path]`,
    /// `*` globs per host label), matched as pull secrets' keys are.
    pub match_images: Vec<String>,
    /// How long its answers are kept when they name no duration.
    #[serde(serialize_with = "as_go_duration")]
    pub default_cache_duration: Duration,
    /// The exec API version it speaks.
    pub api_version: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables added to the agent's environment for it.
    pub env: Vec<EnvVar>,
    /// The service account token it is given, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_attributes: Option<TokenAttributes>,
}

fn as_go_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&crate::config::go_duration(*d))
}

/// Parses and validates the configuration `files` (name, content), in the
/// order given: their providers, merged.
///
/// # Errors
/// A file that does not decode (named, with what is wrong), a provider
/// name twice across files, or the kubelet's validation errors, all of
/// them, joined.
pub fn parse(files: &[(String, String)]) -> Result<Vec<Provider>, String> {
    let mut raw = Vec::new();
    let mut names = BTreeSet::new();
    for (name, text) in files {
        let file: File = crate::yaml::from_str(text)
            .map_err(|e| format!("error decoding config {name:?}: {e}"))?;
        if file.kind != "CredentialProviderConfig" {
            return Err(format!(
                "error decoding config {name:?}: failed to decode {:?} (wrong Kind)",
                file.kind
            ));
        }
        if !CONFIG_VERSIONS.contains(&file.api_version.as_str()) {
            return Err(format!(
                "error decoding config {name:?}: apiVersion {:?}, not one of {}",
                file.api_version,
                CONFIG_VERSIONS.join(", ")
            ));
        }
        for p in file.providers {
            if !names.insert(p.name.clone()) {
                return Err(format!(
                    "duplicate provider name {:?} found in configuration file(s)",
                    p.name
                ));
            }
            raw.push(p);
        }
    }
    validate(raw)
}

/// The kubelet's `validateCredentialProviderConfig`, converting as it goes.
fn validate(raw: Vec<RawProvider>) -> Result<Vec<Provider>, String> {
    let mut errs = Vec::new();
    if raw.is_empty() {
        errs.push("providers: Required value: at least 1 item in plugins is required".to_string());
    }
    let mut out = Vec::new();
    for p in raw {
        let name = &p.name;
        for (bad, why) in [
            (name.contains('/'), "provider name cannot contain '/'"),
            (name.contains(' '), "provider name cannot contain spaces"),
            (name == ".", "provider name cannot be '.'"),
            (name == "..", "provider name cannot be '..'"),
            (name.is_empty(), "provider name is required"),
        ] {
            if bad {
                errs.push(format!("providers.name: Invalid value: {name:?}: {why}"));
            }
        }
        if p.api_version.is_empty() {
            errs.push("providers.apiVersion: Required value".to_string());
        } else if !PLUGIN_VERSIONS.contains(&p.api_version.as_str()) {
            let mut valid = PLUGIN_VERSIONS.to_vec();
            valid.sort_unstable();
            errs.push(format!(
                "providers.apiVersion: Unsupported value: {:?}: supported values: {}",
                p.api_version,
                valid.join(", ")
            ));
        }
        if p.match_images.is_empty() {
            errs.push(
                "providers.matchImages: Required value: at least 1 item in matchImages is required"
                    .to_string(),
            );
        }
        for m in &p.match_images {
            if let Err(why) = check_match_image(m) {
                errs.push(format!(
                    "providers.matchImages: Invalid value: {m:?}: match image is invalid: {why}"
                ));
            }
        }
        let duration = match p.default_cache_duration.as_deref() {
            None => {
                errs.push("providers.defaultCacheDuration: Required value".to_string());
                None
            }
            Some(d) => match go_parse_duration::parse_duration(d) {
                Ok(n) if n < 0 => {
                    errs.push(format!(
                        "providers.defaultCacheDuration: Invalid value: {d:?}: must be greater than or equal to 0"
                    ));
                    None
                }
                Ok(n) => Some(Duration::from_nanos(n.unsigned_abs())),
                Err(e) => {
                    errs.push(format!(
                        "providers.defaultCacheDuration: Invalid value: {d:?}: {e:?}"
                    ));
                    None
                }
            },
        };
        let token = p
            .token_attributes
            .as_ref()
            .and_then(|t| token_attributes(t, &p.api_version, &mut errs));
        if let Some(default_cache_duration) = duration {
            out.push(Provider {
                name: p.name,
                match_images: p.match_images,
                default_cache_duration,
                api_version: p.api_version,
                args: p.args,
                env: p.env,
                token_attributes: token,
            });
        }
    }
    if errs.is_empty() {
        Ok(out)
    } else {
        Err(format!(
            "failed to validate credential provider config: [{}]",
            errs.join(", ")
        ))
    }
}

/// The checks of a provider's `tokenAttributes` (the gate
/// `KubeletServiceAccountTokenForCredentialProviders` is on, as in the
/// kubelet of v1.37 by default, and cannot be turned off here).
fn token_attributes(
    t: &RawTokenAttributes,
    api_version: &str,
    errs: &mut Vec<String>,
) -> Option<TokenAttributes> {
    let before = errs.len();
    let path = "providers.tokenAttributes";
    if t.service_account_token_audience.is_empty() {
        errs.push(format!(
            "{path}.serviceAccountTokenAudience: Required value"
        ));
    }
    if t.require_service_account.is_none() {
        errs.push(format!("{path}.requireServiceAccount: Required value"));
    }
    if api_version != TOKEN_VERSION {
        errs.push(format!(
            "{path}: Forbidden: tokenAttributes is only supported for {TOKEN_VERSION} API version"
        ));
    }
    if t.require_service_account == Some(false)
        && !t.required_service_account_annotation_keys.is_empty()
    {
        errs.push(format!(
            "{path}.requiredServiceAccountAnnotationKeys: Forbidden: requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys is set"
        ));
    }
    for (field, keys) in [
        (
            "requiredServiceAccountAnnotationKeys",
            &t.required_service_account_annotation_keys,
        ),
        (
            "optionalServiceAccountAnnotationKeys",
            &t.optional_service_account_annotation_keys,
        ),
    ] {
        let mut seen = BTreeSet::new();
        for k in keys {
            if let Err(why) = crate::names::qualified_name(&k.to_lowercase()) {
                errs.push(format!("{path}.{field}: Invalid value: {k:?}: {why}"));
            }
            if !seen.insert(k) {
                errs.push(format!("{path}.{field}: Duplicate value: {k:?}"));
            }
        }
    }
    let required: BTreeSet<&String> = t.required_service_account_annotation_keys.iter().collect();
    let both: Vec<&str> = t
        .optional_service_account_annotation_keys
        .iter()
        .filter(|k| required.contains(k))
        .map(String::as_str)
        .collect();
    if !both.is_empty() {
        errs.push(format!(
            "{path}: Invalid value: {both:?}: annotation keys cannot be both required and optional"
        ));
    }
    let cache_type = match t.cache_type.as_str() {
        "ServiceAccount" => Some(TokenCacheType::ServiceAccount),
        "Token" => Some(TokenCacheType::Token),
        "" => {
            errs.push(format!(
                "{path}.cacheType: Required value: cacheType is required to be set when tokenAttributes is specified. Supported values are: ServiceAccount, Token"
            ));
            None
        }
        other => {
            errs.push(format!(
                "{path}.cacheType: Unsupported value: {other:?}: supported values: \"ServiceAccount\", \"Token\""
            ));
            None
        }
    };
    if errs.len() > before {
        return None;
    }
    Some(TokenAttributes {
        service_account_token_audience: t.service_account_token_audience.clone(),
        cache_type: cache_type?,
        require_service_account: t.require_service_account?,
        required_service_account_annotation_keys: t
            .required_service_account_annotation_keys
            .clone(),
        optional_service_account_annotation_keys: t
            .optional_service_account_annotation_keys
            .clone(),
    })
}

/// A `matchImages` entry as the kubelet's `ParseSchemelessURL` takes it: a
/// URL once `https://` is put before it (a scheme of its own kept), with
/// a host; a port, when given, a number.
///
/// # Errors
/// What is wrong with it.
pub fn check_match_image(pattern: &str) -> Result<(), String> {
    let with_scheme = if pattern.starts_with("https://") || pattern.starts_with("http://") {
        pattern.to_string()
    } else {
        format!("https://{pattern}")
    };
    let rest = with_scheme
        .split_once("://")
        .map_or(with_scheme.as_str(), |(_, r)| r);
    if pattern.chars().any(|c| c.is_control() || c == ' ') {
        return Err("invalid character in URL".into());
    }
    let host_port = rest.split('/').next().unwrap_or_default();
    if host_port.contains('@') {
        return Err("user information is not allowed".into());
    }
    let (host, port) = match host_port.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || !p.is_empty() => (h, Some(p)),
        _ => (host_port, None),
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    if let Some(port) = port
        && (port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!("invalid port {port:?} after host"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(body: &str) -> Vec<(String, String)> {
        vec![(
            "config.yaml".into(),
            format!("apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\n{body}"),
        )]
    }

    const GOOD: &str = "providers:
- name: test-plugin
  matchImages: ['*.registry.io', '127.0.0.1:5443']
  defaultCacheDuration: 10m
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  args: [get-credentials]
  env: [{name: MODE, value: good}]
";

    #[test]
    fn a_good_config_parses_with_its_fields() {
        let providers = parse(&file(GOOD)).unwrap();
        assert_eq!(providers.len(), 1);
        let p = &providers[0];
        assert_eq!(p.name, "test-plugin");
        assert_eq!(p.match_images, ["*.registry.io", "127.0.0.1:5443"]);
        assert_eq!(p.default_cache_duration, Duration::from_secs(600));
        assert_eq!(p.args, ["get-credentials"]);
        assert_eq!(
            p.env,
            [EnvVar {
                name: "MODE".into(),
                value: "good".into()
            }]
        );
        assert!(p.token_attributes.is_none());
    }

    #[test]
    fn the_kubelets_validation_refuses_bad_providers_all_at_once() {
        let cases = [
            ("providers: []\n", "at least 1 item in plugins is required"),
            (
                "providers:\n- {name: a/b, matchImages: [x.io], defaultCacheDuration: 1m, apiVersion: credentialprovider.kubelet.k8s.io/v1}\n",
                "provider name cannot contain '/'",
            ),
            (
                "providers:\n- {name: '..', matchImages: [x.io], defaultCacheDuration: 1m, apiVersion: credentialprovider.kubelet.k8s.io/v1}\n",
                "provider name cannot be '..'",
            ),
            (
                "providers:\n- {name: a, matchImages: [x.io], defaultCacheDuration: 1m, apiVersion: credentialprovider.kubelet.k8s.io/v2}\n",
                "Unsupported value: \"credentialprovider.kubelet.k8s.io/v2\"",
            ),
            (
                "providers:\n- {name: a, matchImages: [], defaultCacheDuration: 1m, apiVersion: credentialprovider.kubelet.k8s.io/v1}\n",
                "at least 1 item in matchImages is required",
            ),
            (
                "providers:\n- {name: a, matchImages: ['x.io:port'], defaultCacheDuration: 1m, apiVersion: credentialprovider.kubelet.k8s.io/v1}\n",
                "match image is invalid",
            ),
            (
                "providers:\n- {name: a, matchImages: [x.io], apiVersion: credentialprovider.kubelet.k8s.io/v1}\n",
                "defaultCacheDuration: Required value",
            ),
            (
                "providers:\n- {name: a, matchImages: [x.io], defaultCacheDuration: -1m, apiVersion: credentialprovider.kubelet.k8s.io/v1}\n",
                "must be greater than or equal to 0",
            ),
            (
                "providers:\n- {name: a, matchImages: [x.io], defaultCacheDuration: 1m, apiVersion: credentialprovider.kubelet.k8s.io/v1beta1, tokenAttributes: {serviceAccountTokenAudience: aud, cacheType: Token, requireServiceAccount: true}}\n",
                "tokenAttributes is only supported for credentialprovider.kubelet.k8s.io/v1 API version",
            ),
            (
                "providers:\n- {name: a, matchImages: [x.io], defaultCacheDuration: 1m, apiVersion: credentialprovider.kubelet.k8s.io/v1, tokenAttributes: {serviceAccountTokenAudience: aud, requireServiceAccount: true}}\n",
                "cacheType is required",
            ),
            (
                "providers:\n- {name: a, matchImages: [x.io], defaultCacheDuration: 1m, apiVersion: credentialprovider.kubelet.k8s.io/v1, tokenAttributes: {serviceAccountTokenAudience: aud, cacheType: Token, requireServiceAccount: false, requiredServiceAccountAnnotationKeys: [a.io/x]}}\n",
                "requireServiceAccount cannot be false",
            ),
            (
                "providers:\n- {name: a, matchImages: [x.io], defaultCacheDuration: 1m, apiVersion: credentialprovider.kubelet.k8s.io/v1, tokenAttributes: {serviceAccountTokenAudience: aud, cacheType: Token, requireServiceAccount: true, requiredServiceAccountAnnotationKeys: [a.io/x], optionalServiceAccountAnnotationKeys: [a.io/x]}}\n",
                "annotation keys cannot be both required and optional",
            ),
            (
                "providers:\n- {name: a, matchImages: [x.io], defaultCacheDuration: 1m, apiVersion: credentialprovider.kubelet.k8s.io/v1, tokenAttributes: {serviceAccountTokenAudience: aud, cacheType: Token, requireServiceAccount: true, optionalServiceAccountAnnotationKeys: ['-bad-']}}\n",
                "optionalServiceAccountAnnotationKeys: Invalid value: \"-bad-\"",
            ),
            (
                "providers:\n- {name: a, matchImages: [x.io], defaultCacheDuration: 1m, apiVersion: credentialprovider.kubelet.k8s.io/v1, unknownField: 1}\n",
                "unknown field `unknownField`",
            ),
        ];
        for (body, want) in cases {
            let err = parse(&file(body)).unwrap_err();
            assert!(err.contains(want), "{body}: {err}");
        }
        // Every error of a file at once, as the kubelet's aggregate.
        let err = parse(&file(
            "providers:\n- {name: ., matchImages: [], apiVersion: ''}\n",
        ))
        .unwrap_err();
        for want in [
            "cannot be '.'",
            "apiVersion: Required",
            "matchImages: Required",
            "defaultCacheDuration: Required",
        ] {
            assert!(err.contains(want), "{want}: {err}");
        }
    }

    #[test]
    fn files_merge_in_order_and_a_name_twice_is_an_error() {
        let a = (
            "a.yaml".to_string(),
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: CredentialProviderConfig\n{GOOD}"
            ),
        );
        let b = (
            "b.json".to_string(),
            r#"{"apiVersion":"kubelet.config.k8s.io/v1","kind":"CredentialProviderConfig","providers":[{"name":"other","matchImages":["o.io"],"defaultCacheDuration":"0s","apiVersion":"credentialprovider.kubelet.k8s.io/v1"}]}"#.to_string(),
        );
        let both = parse(&[a.clone(), b]).unwrap();
        let names: Vec<&str> = both.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["test-plugin", "other"]);
        let err = parse(&[a.clone(), a]).unwrap_err();
        assert!(
            err.contains("duplicate provider name \"test-plugin\""),
            "{err}"
        );
        let wrong_kind = (
            "c.yaml".to_string(),
            "apiVersion: kubelet.config.k8s.io/v1\nkind: KubeletConfiguration\nproviders: []\n"
                .to_string(),
        );
        assert!(parse(&[wrong_kind]).unwrap_err().contains("wrong Kind"));
    }

    #[test]
    fn token_attributes_are_read() {
        let providers = parse(&file(
            "providers:\n- {name: a, matchImages: [x.io], defaultCacheDuration: 1m, apiVersion: credentialprovider.kubelet.k8s.io/v1, tokenAttributes: {serviceAccountTokenAudience: aud, cacheType: ServiceAccount, requireServiceAccount: true, requiredServiceAccountAnnotationKeys: [a.io/role], optionalServiceAccountAnnotationKeys: [a.io/extra]}}\n",
        ))
        .unwrap();
        let t = providers[0].token_attributes.clone().unwrap();
        assert_eq!(t.service_account_token_audience, "aud");
        assert_eq!(t.cache_type, TokenCacheType::ServiceAccount);
        assert!(t.require_service_account);
        assert_eq!(t.required_service_account_annotation_keys, ["a.io/role"]);
        assert_eq!(t.optional_service_account_annotation_keys, ["a.io/extra"]);
    }

    #[test]
    fn match_images_are_checked_as_schemeless_urls() {
        for good in [
            "registry.io",
            "*.registry.io",
            "registry.io:5000/path/*",
            "https://registry.io",
            "127.0.0.1:5443",
        ] {
            assert!(check_match_image(good).is_ok(), "{good}");
        }
        for bad in ["", ":5000", "registry.io:x", "a b.io", "user@registry.io"] {
            assert!(check_match_image(bad).is_err(), "{bad}");
        }
    }
}
