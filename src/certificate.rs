//! Certificates from the certificates API, as the kubelet's certificate
//! managers (pkg/kubelet/certificate, client-go's `util/certificate`): an
//! ECDSA P-256 key and a CertificateSigningRequest for a [`Template`]
//! (signer, subject, names, usages), then the wait until it is approved and
//! issued, and the certificate and key stored together in one PEM file
//! (mode 0600, renamed into place). Used for the node API's serving
//! certificate (`serverTLSBootstrap`) and the agent's own client
//! certificate (`--bootstrap-kubeconfig`, `rotateCertificates`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
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
use tracing::info;

/// The signer of kubelet serving certificates.
pub const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";
/// The signer of kubelet client certificates (the kubelet's
/// `kube-apiserver-client-kubelet`).
pub const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// How often a pending request is checked.
const POLL: Duration = Duration::from_secs(1);

/// What a certificate is requested for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    /// The signer (`signerName`).
    pub signer: &'static str,
    /// The node: the subject is `CN=system:node:<node>, O=system:nodes`.
    pub node: String,
    /// DNS subject alternative names (none for a client certificate).
    pub names: Vec<String>,
    /// IP subject alternative names (none for a client certificate).
    pub ips: Vec<IpAddr>,
    /// The key usages (`digital signature`, `server auth` or `client auth`).
    pub usages: Vec<&'static str>,
}

impl Template {
    /// The node API's serving certificate of node `node` with its names and IPs.
    #[must_use]
    pub fn serving(node: &str, names: Vec<String>, ips: Vec<IpAddr>) -> Self {
        Self {
            signer: SERVING_SIGNER,
            node: node.to_string(),
            names,
            ips,
            usages: vec!["digital signature", "server auth"],
        }
    }

    /// The client certificate of node `node`, as the kubelet requests it:
    /// no subject alternative names, the usages the node-client approver
    /// accepts.
    #[must_use]
    pub fn client(node: &str) -> Self {
        Self {
            signer: CLIENT_SIGNER,
            node: node.to_string(),
            names: Vec::new(),
            ips: Vec::new(),
            usages: vec!["digital signature", "client auth"],
        }
    }
}

/// Errors obtaining a certificate.
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
    /// No certificate was issued in that time (the request is left to the
    /// API server's garbage collection; a new one is made).
    #[error("no certificate issued within {0:?}")]
    Timeout(std::time::Duration),
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

/// A PEM certificate signing request for `template` and its new key (both PEM).
///
/// # Errors
/// [`Error::Request`] for names that are not DNS names.
pub fn request(template: &Template) -> Result<(String, String), Error> {
    let node = &template.node;
    let mut params = rcgen::CertificateParams::new(template.names.clone())?;
    params
        .subject_alt_names
        .extend(template.ips.iter().map(|ip| rcgen::SanType::IpAddress(*ip)));
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

/// A certificate and its key, swapped in place when renewed: rustls' server
/// certificate resolver for the node API, its client certificate resolver
/// for the agent's API connections; empty until the first is issued.
#[derive(Clone, Debug, Default)]
pub struct CertSlot(Arc<RwLock<Option<Arc<CertifiedKey>>>>);

impl PartialEq for CertSlot {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for CertSlot {}

impl CertSlot {
    /// Puts `key` in place for the handshakes that follow.
    pub fn set(&self, key: Arc<CertifiedKey>) {
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

    /// The certificate in place, if any.
    #[must_use]
    pub fn get(&self) -> Option<Arc<CertifiedKey>> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl rustls::server::ResolvesServerCert for CertSlot {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.get()
    }
}

impl rustls::client::ResolvesClientCert for CertSlot {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.get()
    }

    fn has_certs(&self) -> bool {
        self.is_set()
    }
}

/// One certificate for `template`, as the kubelet's certificate manager
/// gets it: the request is created (`generateName: csr-`), then read every
/// second until it is issued, and the certificate and its key are stored in
/// `path` (mode 0600). Returns the pair and the certificate's validity.
///
/// # Errors
/// The request could not be made or created, it was denied or failed, the
/// issued certificate does not match the key, or the file cannot be written.
pub async fn obtain(
    client: &Client,
    template: &Template,
    path: &Path,
) -> Result<(Arc<CertifiedKey>, Timestamp, Timestamp), Error> {
    let (csr, key) = request(template)?;
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
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
                    signer_name: template.signer.into(),
                    usages: Some(template.usages.iter().map(|u| (*u).to_string()).collect()),
                    ..CertificateSigningRequestSpec::default()
                },
                status: None,
            },
        )
        .await?;
    let name = created.metadata.name.unwrap_or_default();
    info!(
        csr = name,
        signer = template.signer,
        "certificate requested; waiting for approval"
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
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    std::fs::create_dir_all(dir)
        .and_then(|()| write_private(path, &format!("{cert}{key}"), 0o600))
        .map_err(|source| Error::Write {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(certified)
}

/// Writes `text` to `path` with permissions `mode` through a temporary file
/// of a fresh random name in the same directory, created with `mode` (no
/// other reader can open it, from its first byte on) and renamed into place,
/// so a reader never sees half a key.
///
/// # Errors
/// The I/O error of creating, writing, syncing or renaming the file.
pub fn write_private(path: &Path, text: &str, mode: u32) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt as _;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or_else(|| Path::new("."));
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .permissions(std::fs::Permissions::from_mode(mode))
        .tempfile_in(dir)?;
    tmp.write_all(text.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map(drop).map_err(|e| e.error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::FromDer as _;

    #[test]
    fn requests_name_the_node_for_the_serving_signer() {
        let ip: IpAddr = "10.0.0.5".parse().unwrap();
        let (csr, key) = request(&Template::serving("n1", vec!["n1".into()], vec![ip])).unwrap();
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

    #[test]
    fn private_files_have_their_mode_from_the_first_byte() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubelet.key");
        // A world-readable file in the way, and one where the old fixed
        // temporary name was: neither lends its mode to the key.
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(path.with_extension("tmp"), "").unwrap();
        std::fs::set_permissions(
            path.with_extension("tmp"),
            std::fs::Permissions::from_mode(0o666),
        )
        .unwrap();
        write_private(&path, "secret", 0o600).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "secret");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with(".tmp-"))
            .collect();
        assert!(left.is_empty(), "temporary files left: {left:?}");
    }
}
