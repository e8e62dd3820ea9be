//! The serving certificate from the certificates API, as the kubelet's server
//! certificate manager with `serverTLSBootstrap` (pkg/kubelet/certificate):
//! an ECDSA P-256 key and a CertificateSigningRequest with signer
//! `kubernetes.io/kubelet-serving`, subject `CN=system:node:<node>,
//! O=system:nodes`, the node's names and IPs as subject alternative names and
//! the usages `digital signature` and `server auth`. Once an approver (a
//! cluster admin: `kubectl certificate approve`) approved it and the signer
//! issued the certificate, the node API serves it; it is kept in
//! `<dir>/kubelet-server-current.pem` (certificate and key) for restarts and
//! renewed the same way once 80 % of its lifetime has passed. Until a
//! certificate is issued, TLS handshakes fail, as the kubelet's do.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use tracing::{info, warn};

/// The signer of kubelet serving certificates.
pub const SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The file holding the current certificate and its key.
pub const CURRENT: &str = "kubelet-server-current.pem";
/// How often a pending request is checked.
const POLL: Duration = Duration::from_secs(1);
/// How long to wait before a new request after a denied or failed one.
const RETRY: Duration = Duration::from_secs(30);

/// Errors obtaining a serving certificate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The key or the request could not be made.
    #[error("make the certificate request: {0}")]
    Request(#[from] rcgen::Error),
    /// The certificates API refused or failed.
    #[error("certificates API: {0}")]
    Api(#[from] kube::Error),
    /// The request was denied or failed.
    #[error("certificate request {name} {condition}: {message}")]
    Refused {
        /// The CertificateSigningRequest.
        name: String,
        /// `Denied` or `Failed`.
        condition: String,
        /// Its message.
        message: String,
    },
    /// The issued certificate or the stored pair is unusable.
    #[error("certificate: {0}")]
    Certificate(String),
    /// The pair could not be stored.
    #[error("store {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// The certificate the node API presents, swapped in place when renewed
/// (rustls' certificate resolver); empty until the first is issued.
#[derive(Clone, Debug, Default)]
pub struct CertSlot(Arc<RwLock<Option<Arc<CertifiedKey>>>>);

impl PartialEq for CertSlot {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for CertSlot {}

impl CertSlot {
    fn set(&self, key: Arc<CertifiedKey>) {
        *self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(key);
    }

    /// True once a certificate is in place.
    #[must_use]
    pub fn is_set(&self) -> bool {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .is_some()
    }
}

impl rustls::server::ResolvesServerCert for CertSlot {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// A PEM certificate signing request for the node and its new key (both PEM).
///
/// # Errors
/// [`Error::Request`] for names that are not DNS names.
pub fn request(node: &str, names: &[String], ips: &[IpAddr]) -> Result<(String, String), Error> {
    let mut params = rcgen::CertificateParams::new(names.to_vec())?;
    params
        .subject_alt_names
        .extend(ips.iter().map(|ip| rcgen::SanType::IpAddress(*ip)));
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    let key = rcgen::KeyPair::generate()?;
    let csr = params.serialize_request(&key)?.pem()?;
    Ok((csr, key.serialize_pem()))
}

/// When a certificate valid from `not_before` to `not_after` is renewed: once
/// 80 % of its lifetime has passed (the kubelet picks 70–90 % at random).
#[must_use]
pub fn renew_at(not_before: Timestamp, not_after: Timestamp) -> Timestamp {
    let life = not_after.duration_since(not_before);
    not_before + life.mul_f64(0.8)
}

/// A certificate chain and key (PEM, as stored) as rustls' certified key,
/// with the leaf's validity.
///
/// # Errors
/// [`Error::Certificate`] for a chain or key that does not parse or match.
pub fn certified(
    cert_pem: &str,
    key_pem: &str,
) -> Result<(Arc<CertifiedKey>, Timestamp, Timestamp), Error> {
    let bad = |e: &dyn std::fmt::Display| Error::Certificate(e.to_string());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| bad(&e))?;
    let leaf = chain.first().ok_or_else(|| bad(&"no CERTIFICATE block"))?;
    let (_, parsed) = x509_parser::parse_x509_certificate(leaf).map_err(|e| bad(&e))?;
    let time =
        |t: x509_parser::time::ASN1Time| Timestamp::from_second(t.timestamp()).map_err(|e| bad(&e));
    let (from, until) = (
        time(parsed.validity().not_before)?,
        time(parsed.validity().not_after)?,
    );
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).map_err(|e| bad(&e))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| bad(&e))?;
    let certified = CertifiedKey::new(chain, signer);
    certified.keys_match().map_err(|e| bad(&e))?;
    Ok((Arc::new(certified), from, until))
}

/// The server certificate manager of one node.
#[derive(Clone)]
pub struct Manager {
    /// The node's API client (it may create and read its own requests).
    pub client: Client,
    /// The node name (the subject's CN is `system:node:<node>`).
    pub node: String,
    /// DNS names for the certificate (the node name, the hostname).
    pub names: Vec<String>,
    /// IP addresses for the certificate (the node IPs).
    pub ips: Vec<IpAddr>,
    /// Where the current pair is kept (`<root-dir>/pki`).
    pub dir: PathBuf,
    /// The certificate the node API presents.
    pub slot: CertSlot,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("node", &self.node)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Manager {
    /// Loads the stored certificate if it is still valid, then requests a new
    /// one whenever none is held or the held one is due for renewal, forever.
    /// Failures are logged and retried.
    pub async fn run(self) {
        let path = self.dir.join(CURRENT);
        let mut renew = None;
        if let Ok(text) = std::fs::read_to_string(&path) {
            match certified(&text, &text) {
                Ok((key, from, until)) if until > Timestamp::now() => {
                    info!(path = %path.display(), %until, "serving certificate loaded");
                    self.slot.set(key);
                    renew = Some(renew_at(from, until));
                }
                Ok(_) => info!(path = %path.display(), "stored serving certificate expired"),
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "stored serving certificate unusable")
                }
            }
        }
        loop {
            if let Some(at) = renew {
                let wait = Timestamp::now().duration_until(at);
                if let Ok(wait) = Duration::try_from(wait) {
                    tokio::time::sleep(wait).await;
                }
            }
            match self.obtain().await {
                Ok((key, from, until)) => {
                    info!(%until, "serving certificate issued");
                    self.slot.set(key);
                    renew = Some(renew_at(from, until));
                }
                Err(e) => {
                    warn!(error = %e, "serving certificate");
                    tokio::time::sleep(RETRY).await;
                    renew = None;
                }
            }
        }
    }

    /// One request: create it, wait until it is issued, store the pair.
    async fn obtain(&self) -> Result<(Arc<CertifiedKey>, Timestamp, Timestamp), Error> {
        let (csr, key) = request(&self.node, &self.names, &self.ips)?;
        let api: Api<CertificateSigningRequest> = Api::all(self.client.clone());
        let created = api
            .create(
                &PostParams::default(),
                &CertificateSigningRequest {
                    metadata: ObjectMeta {
                        generate_name: Some("csr-".into()),
                        ..ObjectMeta::default()
                    },
                    spec: CertificateSigningRequestSpec {
                        request: ByteString(csr.into_bytes()),
                        signer_name: SIGNER.into(),
                        usages: Some(vec!["digital signature".into(), "server auth".into()]),
                        ..CertificateSigningRequestSpec::default()
                    },
                    status: None,
                },
            )
            .await?;
        let name = created.metadata.name.unwrap_or_default();
        info!(
            csr = name,
            "serving certificate requested; waiting for approval"
        );
        let cert = loop {
            let current = api.get(&name).await?;
            let status = current.status.unwrap_or_default();
            if let Some(refused) = status
                .conditions
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "Denied" || c.type_ == "Failed")
            {
                return Err(Error::Refused {
                    name,
                    condition: refused.type_,
                    message: refused.message.unwrap_or_default(),
                });
            }
            if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
                break String::from_utf8_lossy(&cert.0).into_owned();
            }
            tokio::time::sleep(POLL).await;
        };
        let certified = certified(&cert, &key)?;
        let path = self.dir.join(CURRENT);
        std::fs::create_dir_all(&self.dir)
            .and_then(|()| super::tls::write_private(&path, &format!("{cert}{key}"), 0o600))
            .map_err(|source| Error::Write { path, source })?;
        Ok(certified)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::FromDer as _;

    #[test]
    fn requests_name_the_node_for_the_serving_signer() {
        let ip: IpAddr = "10.0.0.5".parse().unwrap();
        let (csr, key) = request("n1", &["n1".into()], &[ip]).unwrap();
        assert!(csr.starts_with("-----BEGIN CERTIFICATE REQUEST-----"));
        assert!(key.contains("PRIVATE KEY"));
        let der = rustls::pki_types::CertificateSigningRequestDer::from_pem_slice(csr.as_bytes())
            .unwrap();
        let (_, parsed) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&der).unwrap();
        let subject = parsed.certification_request_info.subject.to_string();
        assert!(subject.contains("CN=system:node:n1"), "{subject}");
        assert!(subject.contains("O=system:nodes"), "{subject}");
        let sans = parsed
            .requested_extensions()
            .into_iter()
            .flatten()
            .find_map(|e| match e {
                x509_parser::extensions::ParsedExtension::SubjectAlternativeName(s) => {
                    Some(format!("{:?}", s.general_names))
                }
                _ => None,
            })
            .unwrap();
        assert!(
            sans.contains("n1") && sans.contains("[10, 0, 0, 5]"),
            "{sans}"
        );
    }

    #[test]
    fn renewal_comes_at_80_percent_of_the_lifetime() {
        let from = Timestamp::from_second(1_800_000_000).unwrap();
        let until = from + Duration::from_secs(100 * 3600);
        assert_eq!(renew_at(from, until), from + Duration::from_secs(80 * 3600));
    }

    #[test]
    fn issued_pairs_become_certified_keys_and_mismatches_are_refused() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["n1".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (certified_key, from, until) = certified(&cert.pem(), &key.serialize_pem()).unwrap();
        assert!(until > from);
        assert_eq!(certified_key.cert.len(), 1);
        let other = rcgen::KeyPair::generate().unwrap();
        assert!(certified(&cert.pem(), &other.serialize_pem()).is_err());
        assert!(certified("", &key.serialize_pem()).is_err());
    }
}
