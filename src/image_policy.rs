//! Which images present on the node need a pod's credentials verified
//! before the pod may use them: the KubeletConfiguration's
//! `imagePullCredentialsVerificationPolicy` and
//! `preloadedImagesVerificationAllowlist` (KEP-2535), as the kubelet's
//! `ImagePullPolicyEnforcer` (pkg/kubelet/images/pullmanager), with the
//! image-name helpers the policy, the pull records and the runtime share
//! ([`image_name`], [`is_image_id`]). Pure: the image manager asks it, then
//! checks the pull records.

use std::collections::BTreeSet;

/// `imagePullCredentialsVerificationPolicy`, with its allowlist.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum VerificationPolicy {
    /// `NeverVerify`: any pod uses any image present.
    NeverVerify,
    /// `NeverVerifyPreloadedImages` (the default): images the agent pulled
    /// are verified; images that came onto the node another way are not.
    #[default]
    NeverVerifyPreloadedImages,
    /// `NeverVerifyAllowlistedImages`: images the allowlist names are not
    /// verified, whoever pulled them; every other image is.
    NeverVerifyAllowlistedImages(Allowlist),
    /// `AlwaysVerify`: every image is verified, preloaded ones included.
    AlwaysVerify,
}

/// `preloadedImagesVerificationAllowlist`: image names without tag or
/// digest (`registry.example/team/app`), and prefixes written with a
/// trailing `/*` (`registry.example/team/*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allowlist {
    names: BTreeSet<String>,
    prefixes: Vec<String>,
    /// The patterns as configured, in order, for `/configz`.
    configured: Vec<String>,
}

impl VerificationPolicy {
    /// The policy named `policy` (empty: the default) with `allowlist`, as
    /// the kubelet validates them.
    ///
    /// # Errors
    /// An unknown policy; an allowlist with another policy than
    /// `NeverVerifyAllowlistedImages`; a pattern with surrounding spaces, a
    /// `*` other than a trailing `/*`, a tag or digest, or that is not an
    /// image name. Names are compared as pods write them, without tag or
    /// digest: `busybox` allows a pod's `busybox:1.36`, not its
    /// `docker.io/library/busybox:1.36`, as in the kubelet.
    pub fn parse(policy: &str, allowlist: &[String]) -> Result<Self, String> {
        let parsed = match policy {
            "NeverVerify" => Self::NeverVerify,
            "" | "NeverVerifyPreloadedImages" => Self::NeverVerifyPreloadedImages,
            "NeverVerifyAllowlistedImages" => {
                Self::NeverVerifyAllowlistedImages(Allowlist::parse(allowlist)?)
            }
            "AlwaysVerify" => Self::AlwaysVerify,
            other => {
                return Err(format!(
                    "option {other:?} specified for imagePullCredentialsVerificationPolicy. Valid options are \"NeverVerify\", \"NeverVerifyPreloadedImages\", \"NeverVerifyAllowlistedImages\" or \"AlwaysVerify\""
                ));
            }
        };
        if !allowlist.is_empty() && !matches!(parsed, Self::NeverVerifyAllowlistedImages(_)) {
            return Err("can't set `preloadedImagesVerificationAllowlist` if `imagePullCredentialsVerificationPolicy` is not \"NeverVerifyAllowlistedImages\"".into());
        }
        Ok(parsed)
    }

    /// The policy's name, as the KubeletConfiguration spells it.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::NeverVerify => "NeverVerify",
            Self::NeverVerifyPreloadedImages => "NeverVerifyPreloadedImages",
            Self::NeverVerifyAllowlistedImages(_) => "NeverVerifyAllowlistedImages",
            Self::AlwaysVerify => "AlwaysVerify",
        }
    }

    /// The allowlist as configured (empty unless `NeverVerifyAllowlistedImages`).
    #[must_use]
    pub fn allowlist(&self) -> Vec<String> {
        match self {
            Self::NeverVerifyAllowlistedImages(a) => a.configured.clone(),
            _ => Vec::new(),
        }
    }

    /// Whether a pod's credentials must be verified for `image_name` (the
    /// pod's image without tag or digest), present on the node, which the
    /// agent pulled (`pulled_by_agent`: a pull record or an interrupted
    /// pull) or not: `RequireCredentialVerificationForImage`. When true the
    /// pull records decide; an image without records is pulled again.
    #[must_use]
    pub fn requires_verification(&self, image_name: &str, pulled_by_agent: bool) -> bool {
        match self {
            Self::NeverVerify => false,
            Self::NeverVerifyPreloadedImages => pulled_by_agent,
            Self::NeverVerifyAllowlistedImages(a) => !a.matches(image_name),
            Self::AlwaysVerify => true,
        }
    }
}

impl Allowlist {
    fn parse(patterns: &[String]) -> Result<Self, String> {
        let mut out = Self {
            configured: patterns.to_vec(),
            ..Self::default()
        };
        for p in patterns {
            let bad = |why: &str| {
                Err(format!(
                    "invalid image pattern in `preloadedImagesVerificationAllowlist`: {why}: {p}"
                ))
            };
            if p.trim() != p {
                return bad("leading/trailing spaces are not allowed");
            }
            let (trimmed, wildcard) = match p.strip_suffix('*') {
                Some(t) if t.ends_with('/') => (t, true),
                _ => (p.as_str(), false),
            };
            if trimmed.is_empty() {
                return bad("the supplied pattern is too short");
            }
            if trimmed.contains('*') {
                return bad(
                    "not a valid wildcard pattern, only patterns ending with '/*' are allowed",
                );
            }
            if wildcard {
                if trimmed.len() == 1 {
                    return bad("at least registry hostname is required");
                }
                out.prefixes.push(trimmed.to_string());
                continue;
            }
            if image_name(trimmed) != trimmed {
                return bad("neither tag nor digest is accepted in an image reference");
            }
            if !is_image_name(trimmed) {
                return bad("failed to parse as an image name");
            }
            out.names.insert(trimmed.to_string());
        }
        Ok(out)
    }

    /// Whether `image_name` is named, or under a prefix.
    fn matches(&self, image_name: &str) -> bool {
        self.names.contains(image_name) || self.prefixes.iter().any(|p| image_name.starts_with(p))
    }
}

/// The image name of a reference without its tag and digest
/// (`reg:5000/app:1@sha256:…` → `reg:5000/app`), as the kubelet's
/// `trimImageTagDigest`: how the pull records key images and the allowlist
/// compares them.
#[must_use]
pub fn image_name(image: &str) -> &str {
    let name = image.split('@').next().unwrap_or(image);
    match (name.rfind(':'), name.rfind('/')) {
        (Some(c), Some(s)) if c > s => &name[..c],
        (Some(c), None) => &name[..c],
        _ => name,
    }
}

/// Whether `image` names an image by its ID (`sha256:<hex>`), not by a
/// repository.
#[must_use]
pub fn is_image_id(image: &str) -> bool {
    image
        .strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The longest image name a reference may have (distribution's
/// `NameTotalLengthMax`).
const MAX_NAME: usize = 255;

/// An image name as distribution's reference grammar has it: an optional
/// registry host (a `.` or `:` in it, or `localhost`), then path components
/// of lower-case letters and digits joined by `.`, `_` or `-`.
fn is_image_name(name: &str) -> bool {
    if name.is_empty() || name.len() > MAX_NAME {
        return false;
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    let first = parts[0];
    if parts.len() > 1 && (first.contains('.') || first.contains(':') || first == "localhost") {
        let (host, port) = first.split_once(':').unwrap_or((first, ""));
        let host_ok = !host.is_empty()
            && host.split('.').all(|l| {
                !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        let port_ok =
            !first.contains(':') || (!port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()));
        if !(host_ok && port_ok) {
            return false;
        }
        parts.remove(0);
    }
    parts.iter().all(|c| {
        let bytes = c.as_bytes();
        let edge = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        edge(bytes.first())
            && edge(bytes.last())
            && bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| (*s).to_string()).collect()
    }

    #[test]
    fn each_policy_decides_as_the_kubelets_enforcer() {
        let never = VerificationPolicy::parse("NeverVerify", &[]).unwrap();
        let default = VerificationPolicy::parse("", &[]).unwrap();
        let always = VerificationPolicy::parse("AlwaysVerify", &[]).unwrap();
        let allow = VerificationPolicy::parse(
            "NeverVerifyAllowlistedImages",
            &list(&["registry.example/base/app", "registry.example/tools/*"]),
        )
        .unwrap();
        assert_eq!(default, VerificationPolicy::NeverVerifyPreloadedImages);
        for pulled in [false, true] {
            assert!(!never.requires_verification("registry.example/x", pulled));
            assert!(always.requires_verification("registry.example/x", pulled));
            assert_eq!(
                default.requires_verification("registry.example/x", pulled),
                pulled
            );
            // The allowlist decides whoever pulled the image.
            assert!(!allow.requires_verification("registry.example/base/app", pulled));
            assert!(!allow.requires_verification("registry.example/tools/a/b", pulled));
            assert!(allow.requires_verification("registry.example/base/app2", pulled));
            assert!(allow.requires_verification("registry.example/tools", pulled));
        }
        assert_eq!(
            allow.allowlist(),
            ["registry.example/base/app", "registry.example/tools/*"]
        );
        assert_eq!(always.name(), "AlwaysVerify");
    }

    #[test]
    fn bad_policies_and_patterns_are_refused_with_the_kubelets_reasons() {
        let err =
            |policy: &str, p: &[&str]| VerificationPolicy::parse(policy, &list(p)).unwrap_err();
        assert!(err("Sometimes", &[]).contains("Valid options are"));
        assert!(err("AlwaysVerify", &["registry.example/a"]).contains("can't set"));
        let allow = "NeverVerifyAllowlistedImages";
        for (pattern, why) in [
            (" registry.example/a", "spaces"),
            ("", "too short"),
            ("*", "only patterns ending with '/*'"),
            ("/*", "registry hostname"),
            ("registry.example/*/a", "only patterns ending with '/*'"),
            ("registry.example/a*", "only patterns ending with '/*'"),
            ("registry.example/a:1", "neither tag nor digest"),
            ("registry.example/a@sha256:00", "neither tag nor digest"),
            ("registry.example/App", "failed to parse"),
            ("registry.example/a//b", "failed to parse"),
            ("registry.example/-a", "failed to parse"),
        ] {
            let e = err(allow, &[pattern]);
            assert!(e.contains(why), "{pattern}: {e}");
        }
        // Names as pods write them, with or without a registry host.
        let ok = [
            "localhost:5000/a",
            "docker.io/library/busybox",
            "busybox",
            "team/app",
        ];
        let p = VerificationPolicy::parse(allow, &list(&ok)).unwrap();
        assert!(!p.requires_verification("busybox", true));
        assert!(p.requires_verification("docker.io/library/app", true));
        assert_eq!(p.allowlist(), ok);
    }
}
