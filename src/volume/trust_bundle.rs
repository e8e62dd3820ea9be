//! ClusterTrustBundle projections (`projected.sources[].clusterTrustBundle`),
//! as the kubelet's `clustertrustbundle` manager serves them to the
//! projected volume plugin: the trust anchors of one bundle by name, or of
//! every bundle of a signer that a label selector picks, each anchor once,
//! written as PEM `CERTIFICATE` blocks.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
use k8s_openapi::api::core::v1::{ClusterTrustBundleProjection, Pod};
use kube::Client;
use kube::api::{Api, ListParams};
use kube::core::labels::Selector;

use super::OBJECT_TTL;

/// The longest label selector a projection may give, in bytes of its string
/// form (the kubelet's `maxLabelSelectorLength`, 100 KiB).
pub const MAX_SELECTOR_BYTES: usize = 100 * 1024;

/// What one projection asks the API server for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TrustKey {
    /// The bundle of this name.
    Name(String),
    /// The bundles of `signer` that `selector` (a label selector's string
    /// form) picks; `None`: the projection has no selector, which picks
    /// nothing, as the kubelet reads it (an empty selector picks every bundle).
    Signer {
        /// `signerName`.
        signer: String,
        /// `labelSelector`, as a selector string.
        selector: Option<String>,
    },
}

/// The request of projection `p`.
///
/// # Errors
/// The kubelet's words for a projection with neither `name` nor
/// `signerName` (which API validation refuses), a selector that does not
/// parse, or one longer than [`MAX_SELECTOR_BYTES`].
pub fn key(p: &ClusterTrustBundleProjection) -> Result<TrustKey, String> {
    if let Some(name) = &p.name {
        return Ok(TrustKey::Name(name.clone()));
    }
    let Some(signer) = p.signer_name.clone() else {
        return Err(
            "ClusterTrustBundle projection requires either name or signerName to be set".into(),
        );
    };
    let selector = match p.label_selector.clone().map(Selector::try_from) {
        None => None,
        Some(Ok(s)) => Some(s.to_string()),
        Some(Err(e)) => return Err(format!("while parsing label selector: {e}")),
    };
    if let Some(s) = &selector
        && s.len() > MAX_SELECTOR_BYTES
    {
        return Err(format!(
            "label selector length ({}) is larger than {MAX_SELECTOR_BYTES}",
            s.len()
        ));
    }
    Ok(TrustKey::Signer { signer, selector })
}

/// The requests of every `clusterTrustBundle` projection of `pod`'s volumes
/// (those that are valid; [`key`] says why the others are not).
#[must_use]
pub fn references(pod: &Pod) -> BTreeSet<TrustKey> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .flat_map(|v| v.projected.iter().flat_map(|p| p.sources.iter().flatten()))
        .filter_map(|p| p.cluster_trust_bundle.as_ref())
        .filter_map(|p| key(p).ok())
        .collect()
}

/// The trust anchors of `bundles` (each a `trustBundle`: PEM blocks): the
/// contents of every block, each once, as `CERTIFICATE` blocks, as the
/// kubelet's `normalizeTrustAnchors`. They come in the order of their bytes:
/// the kubelet shuffles them once per process, so no reader can depend on
/// an order.
#[must_use]
pub fn anchors<'a>(bundles: impl IntoIterator<Item = &'a str>) -> Vec<u8> {
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    let unique: BTreeSet<Vec<u8>> = bundles
        .into_iter()
        .flat_map(|b| pem::parse_many(b).unwrap_or_default())
        .map(pem::Pem::into_contents)
        .collect();
    unique
        .into_iter()
        .flat_map(|der| pem::encode_config(&pem::Pem::new("CERTIFICATE", der), config).into_bytes())
        .collect()
}

/// Anchors read, by request, with when they were read.
type Entries = BTreeMap<TrustKey, (Instant, Vec<u8>)>;

/// Reads the anchors projections ask for, keeping found ones for
/// [`OBJECT_TTL`] (a refresh sees a changed bundle within it).
#[derive(Default)]
pub struct TrustBundles {
    entries: Mutex<Entries>,
}

impl TrustBundles {
    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The anchors `key` asks for; `None` when no bundle matches (a bundle
    /// of that name does not exist, or none of the signer's is selected).
    ///
    /// # Errors
    /// The API server's error, in the kubelet's words.
    pub async fn get(&self, client: &Client, key: &TrustKey) -> Result<Option<Vec<u8>>, String> {
        if let Some((at, anchors)) = self.lock().get(key)
            && at.elapsed() < OBJECT_TTL
        {
            return Ok(Some(anchors.clone()));
        }
        let got = read(client, key).await?;
        let mut entries = self.lock();
        entries.retain(|_, (at, _)| at.elapsed() < OBJECT_TTL * 12);
        match &got {
            Some(anchors) => entries.insert(key.clone(), (Instant::now(), anchors.clone())),
            None => entries.remove(key),
        };
        Ok(got)
    }
}

/// [`TrustBundles::get`] from the API server.
async fn read(client: &Client, key: &TrustKey) -> Result<Option<Vec<u8>>, String> {
    let api: Api<ClusterTrustBundle> = Api::all(client.clone());
    match key {
        TrustKey::Name(name) => {
            let got = api
                .get_opt(name)
                .await
                .map_err(|e| format!("while getting ClusterTrustBundle: {e}"))?;
            Ok(got.map(|b| anchors([b.spec.trust_bundle.as_str()])))
        }
        TrustKey::Signer { selector: None, .. } => Ok(None),
        TrustKey::Signer {
            signer,
            selector: Some(selector),
        } => {
            let list = api
                .list(&ListParams::default().labels(selector))
                .await
                .map_err(|e| {
                    format!(
                        "while listing ClusterTrustBundles matching label selector {selector:?}: {e}"
                    )
                })?;
            let bundles: Vec<&str> = list
                .items
                .iter()
                .filter(|b| b.spec.signer_name.as_deref() == Some(signer.as_str()))
                .map(|b| b.spec.trust_bundle.as_str())
                .collect();
            Ok((!bundles.is_empty()).then(|| anchors(bundles)))
        }
    }
}

/// The file of a projection from its `fetched` anchors: the anchors, or an
/// empty file when none match and the projection is `optional`.
///
/// # Errors
/// None match and it is not optional (the kubelet's words), or the read failed.
pub fn file(
    key: &TrustKey,
    optional: bool,
    fetched: Option<&Result<Option<Vec<u8>>, String>>,
) -> Result<Vec<u8>, String> {
    match fetched {
        Some(Ok(Some(anchors))) => Ok(anchors.clone()),
        Some(Ok(None)) if optional => Ok(Vec::new()),
        Some(Ok(None)) => Err(match key {
            TrustKey::Name(name) => format!(
                "while getting ClusterTrustBundle: clustertrustbundles.certificates.k8s.io \"{name}\" not found"
            ),
            TrustKey::Signer { .. } => {
                "combination of signerName and labelSelector matched zero ClusterTrustBundles"
                    .into()
            }
        }),
        Some(Err(e)) => Err(e.clone()),
        None => Err("ClusterTrustBundle was not read".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

    /// A self-signed root named `name`, PEM.
    fn root(name: &str) -> String {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.self_signed(&key).expect("self-signed").pem()
    }

    fn der(pem_text: &str) -> Vec<u8> {
        pem::parse(pem_text).expect("pem").into_contents()
    }

    #[test]
    fn anchors_are_each_written_once_as_certificate_blocks() {
        let (a, b) = (root("a"), root("b"));
        let both = format!("{a}{b}");
        let got = anchors([both.as_str(), a.as_str(), b.as_str()]);
        let text = String::from_utf8(got.clone()).expect("utf-8");
        let blocks = pem::parse_many(&got).expect("pem");
        assert_eq!(blocks.len(), 2, "{text}");
        assert!(blocks.iter().all(|p| p.tag() == "CERTIFICATE"));
        let mut want = vec![der(&a), der(&b)];
        want.sort();
        let have: Vec<Vec<u8>> = blocks.into_iter().map(pem::Pem::into_contents).collect();
        assert_eq!(have, want, "in the order of their bytes");
        // As Go's pem.EncodeToMemory writes them: LF, no blank line between.
        assert!(!text.contains('\r') && !text.contains("\n\n"), "{text}");
        assert!(
            text.starts_with("-----BEGIN CERTIFICATE-----\n")
                && text.ends_with("-----END CERTIFICATE-----\n")
        );
        // The same anchors in another order give the same file.
        assert_eq!(anchors([b.as_str(), a.as_str()]), got);
        assert!(anchors(["not pem"]).is_empty());
    }

    #[test]
    fn keys_by_name_or_by_signer_and_selector() {
        let by_name = ClusterTrustBundleProjection {
            name: Some("corp-roots".into()),
            path: "ca.pem".into(),
            ..Default::default()
        };
        assert_eq!(key(&by_name), Ok(TrustKey::Name("corp-roots".into())));
        let mut by_signer = ClusterTrustBundleProjection {
            signer_name: Some("example.com/roots".into()),
            path: "ca.pem".into(),
            ..Default::default()
        };
        // No selector picks nothing; an empty one picks every bundle.
        let signer = |selector: Option<&str>| TrustKey::Signer {
            signer: "example.com/roots".into(),
            selector: selector.map(String::from),
        };
        assert_eq!(key(&by_signer), Ok(signer(None)));
        by_signer.label_selector = Some(LabelSelector::default());
        assert_eq!(key(&by_signer), Ok(signer(Some(""))));
        by_signer.label_selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("live".into(), "yes".into())])),
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "In".into(),
                values: Some(vec!["a".into()]),
            }]),
        });
        assert_eq!(key(&by_signer), Ok(signer(Some("live=yes,tier in (a)"))));
        by_signer.label_selector = Some(LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "tier".into(),
                operator: "Sometimes".into(),
                values: None,
            }]),
            ..Default::default()
        });
        assert!(key(&by_signer).is_err_and(|e| e.starts_with("while parsing label selector")));
        by_signer.label_selector = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "k".into(),
                "v".repeat(MAX_SELECTOR_BYTES),
            )])),
            ..Default::default()
        });
        assert!(key(&by_signer).is_err_and(|e| e.starts_with("label selector length (")));
        let neither = ClusterTrustBundleProjection::default();
        assert!(key(&neither).is_err_and(|e| e.contains("either name or signerName")));
    }

    #[test]
    fn a_missing_bundle_is_an_empty_file_when_optional_else_the_kubelets_error() {
        let name = TrustKey::Name("gone".into());
        let none = Ok(None);
        assert_eq!(file(&name, true, Some(&none)), Ok(Vec::new()));
        assert_eq!(
            file(&name, false, Some(&none)),
            Err("while getting ClusterTrustBundle: clustertrustbundles.certificates.k8s.io \"gone\" not found".into())
        );
        let signer = TrustKey::Signer {
            signer: "example.com/roots".into(),
            selector: None,
        };
        assert_eq!(
            file(&signer, false, Some(&none)),
            Err(
                "combination of signerName and labelSelector matched zero ClusterTrustBundles"
                    .into()
            )
        );
        let found = Ok(Some(b"pem".to_vec()));
        assert_eq!(file(&signer, false, Some(&found)), Ok(b"pem".to_vec()));
        let failed = Err("while getting ClusterTrustBundle: forbidden".to_string());
        assert_eq!(
            file(&name, true, Some(&failed)),
            Err("while getting ClusterTrustBundle: forbidden".into())
        );
    }
}
