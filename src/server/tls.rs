//! TLS of the node API: the serving certificate (given, or self-signed for the
//! node's name and IPs as the kubelet does without `--tls-cert-file`) and client
//! certificate verification against `--client-ca-file`.
//!
//! The kubelet keeps its self-signed pair in `<cert-dir>/kubelet.crt` and
//! `kubelet.key` and reuses it across restarts; so does this module, under the
//! directory it is given. Clients without a certificate are accepted at the TLS
//! layer (they may still bring a bearer token); a certificate that does not
//! verify against the client CA fails the handshake.
//!
//! Given serving certificate files and the client CA bundle are read again
//! when they change ([`ReloadingConfig`]), as the kubelet's
//! `ReloadKubeletServerCertificateFile` and `ReloadKubeletClientCAFile`
//! feature gates (both on by default) do.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::certificate::write_private;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

/// Errors preparing TLS.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A PEM file could not be read or holds nothing usable.
    #[error("read {what} from {path}: {message}")]
    Pem {
        /// What was expected (`certificate`, `private key`, `client CA`).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The self-signed certificate could not be made.
    #[error("generate self-signed serving certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// The self-signed pair could not be written.
    #[error("write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// rustls refused the configuration (e.g. a key that does not match the certificate).
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    /// The client CA bundle cannot build a verifier.
    #[error("client CA {path}: {message}")]
    ClientCa {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// Where the serving certificate comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServingCert {
    /// PEM files: the certificate (leaf first, then intermediates) and its key.
    Files {
        /// `--tls-cert-file`.
        cert: PathBuf,
        /// `--tls-private-key-file`.
        key: PathBuf,
    },
    /// Issued through the certificates API (`serverTLSBootstrap`): whatever
    /// the [`super::csr::Manager`] feeding this slot holds; no handshake
    /// succeeds before the first certificate is issued.
    Bootstrap(super::csr::CertSlot),
    /// A self-signed certificate for these names and IPs, kept in `dir`
    /// (`kubelet.crt`, `kubelet.key`) and reused when present.
    SelfSigned {
        /// Directory of the pair (`<root-dir>/pki`).
        dir: PathBuf,
        /// DNS names (the node name).
        names: Vec<String>,
        /// IP addresses (the node IPs).
        ips: Vec<IpAddr>,
    },
}

fn pem_err(what: &'static str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Pem {
        what,
        path: path.to_path_buf(),
        message: e.to_string(),
    }
}

fn read_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_err(what, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(what, path, e))?;
    if certs.is_empty() {
        return Err(pem_err(what, path, "no CERTIFICATE block"));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| pem_err("private key", path, e))
}

/// Generates a self-signed serving certificate (ECDSA P-256) for `names` and
/// `ips`, CN the first name; returns the PEM certificate and key.
///
/// # Errors
/// [`Error::Generate`] when a name is not a valid DNS name.
pub fn self_signed(names: &[String], ips: &[IpAddr]) -> Result<(String, String), Error> {
    let sans: Vec<String> = names
        .iter()
        .cloned()
        .chain(ips.iter().map(ToString::to_string))
        .collect();
    let mut params = rcgen::CertificateParams::new(sans)?;
    let cn = names.first().cloned().unwrap_or_else(|| "rustlet".into());
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{cn}@rustlet"));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let key = rcgen::KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

impl ServingCert {
    /// The certificate chain and key, generating and storing a self-signed pair
    /// first when needed.
    ///
    /// # Errors
    /// Unreadable or empty PEM files; a pair that cannot be generated or written.
    pub fn load(&self) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), Error> {
        match self {
            Self::Files { cert, key } => Ok((read_certs("certificate", cert)?, read_key(key)?)),
            Self::Bootstrap(_) => Err(Error::Pem {
                what: "certificate",
                path: PathBuf::from(super::csr::CURRENT),
                message: "issued through the certificates API, not loaded from files".into(),
            }),
            Self::SelfSigned { dir, names, ips } => {
                let cert = dir.join("kubelet.crt");
                let key = dir.join("kubelet.key");
                if !(cert.exists() && key.exists()) {
                    std::fs::create_dir_all(dir).map_err(|source| Error::Write {
                        path: dir.clone(),
                        source,
                    })?;
                    let (c, k) = self_signed(names, ips)?;
                    for (path, text, mode) in [(&key, &k, 0o600), (&cert, &c, 0o644)] {
                        write_private(path, text, mode).map_err(|source| Error::Write {
                            path: path.clone(),
                            source,
                        })?;
                    }
                    tracing::info!(cert = %cert.display(), "generated a self-signed serving certificate");
                }
                Ok((read_certs("certificate", &cert)?, read_key(&key)?))
            }
        }
    }
}

/// The rustls server configuration of the node API: TLS 1.2 and 1.3 with the
/// ring provider, ALPN `h2` and `http/1.1`, optional client certificates
/// verified against `client_ca` (PEM bundle) for client authentication.
///
/// # Errors
/// See [`ServingCert::load`]; an unreadable or invalid client CA bundle.
pub fn server_config(
    serving: &ServingCert,
    client_ca: Option<&Path>,
) -> Result<rustls::ServerConfig, Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = match client_ca {
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for c in read_certs("client CA", path)? {
                roots.add(c).map_err(|e| Error::ClientCa {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                })?;
            }
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .allow_unauthenticated()
                .build()
                .map_err(|e| Error::ClientCa {
                    path: path.to_path_buf(),
                    message: e.to_string(),
                })?
        }
        None => WebPkiClientVerifier::no_client_auth(),
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier);
    let mut cfg = match serving {
        ServingCert::Bootstrap(slot) => builder.with_cert_resolver(Arc::new(slot.clone())),
        _ => {
            let (certs, key) = serving.load()?;
            builder.with_single_cert(certs, key)?
        }
    };
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// What the node API reloads from disk when it changes, as the kubelet's
/// dynamic certificate controllers do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reload {
    /// The serving certificate and key files ([`ServingCert::Files`]): the
    /// `ReloadKubeletServerCertificateFile` feature gate (on by default).
    pub serving_files: bool,
    /// The client CA bundle: the `ReloadKubeletClientCAFile` feature gate
    /// (on by default).
    pub client_ca: bool,
}

impl Default for Reload {
    fn default() -> Self {
        Self {
            serving_files: true,
            client_ca: true,
        }
    }
}

/// How often [`ReloadingConfig::watch`] looks at the files (the kubelet's
/// controllers react to file events, and check once a minute besides).
pub const RELOAD_PERIOD: std::time::Duration = std::time::Duration::from_secs(2);

/// The node API's TLS configuration ([`server_config`]), built again when the
/// files it came from change: each new connection takes the current one
/// ([`Self::current`]). A change that does not build (a file half written,
/// a key that does not match) keeps the configuration in use until the files
/// are whole again.
#[derive(Debug)]
pub struct ReloadingConfig {
    serving: ServingCert,
    client_ca: Option<PathBuf>,
    /// The files reloaded, in a fixed order.
    paths: Vec<PathBuf>,
    /// What those files held at the last build, and what was built.
    current: std::sync::RwLock<(Contents, Arc<rustls::ServerConfig>)>,
    /// What the files held when they last failed to build (tried again only
    /// once they change).
    failed: std::sync::Mutex<Option<Contents>>,
}

/// What each watched file holds (`None`: unreadable), in order.
type Contents = Vec<Option<Vec<u8>>>;

impl ReloadingConfig {
    /// The configuration of `serving` and `client_ca` as it is now.
    ///
    /// # Errors
    /// As [`server_config`].
    pub fn new(
        serving: ServingCert,
        client_ca: Option<PathBuf>,
        reload: Reload,
    ) -> Result<Self, Error> {
        let mut paths = Vec::new();
        if let (ServingCert::Files { cert, key }, true) = (&serving, reload.serving_files) {
            paths.extend([cert.clone(), key.clone()]);
        }
        if let (Some(ca), true) = (&client_ca, reload.client_ca) {
            paths.push(ca.clone());
        }
        // Read before the build: a change in between is seen at the next look.
        let seen = read_all(&paths);
        let cfg = Arc::new(server_config(&serving, client_ca.as_deref())?);
        Ok(Self {
            serving,
            client_ca,
            paths,
            current: std::sync::RwLock::new((seen, cfg)),
            failed: std::sync::Mutex::new(None),
        })
    }

    /// The configuration a new connection uses.
    #[must_use]
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        let held = self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.1.clone()
    }

    /// Builds the configuration again when a reloaded file changed since the
    /// last build: `Ok(true)` when it was replaced. Files that did not build
    /// are tried again only once they change again.
    ///
    /// # Errors
    /// The changed files do not build; the configuration in use stays.
    pub fn reload(&self) -> Result<bool, Error> {
        let now = read_all(&self.paths);
        {
            let held = self
                .current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if held.0 == now {
                return Ok(false);
            }
        }
        let mut failed = self
            .failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if failed.as_ref() == Some(&now) {
            return Ok(false);
        }
        let cfg = match server_config(&self.serving, self.client_ca.as_deref()) {
            Ok(cfg) => cfg,
            Err(e) => {
                *failed = Some(now);
                return Err(e);
            }
        };
        *failed = None;
        *self
            .current
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = (now, Arc::new(cfg));
        Ok(true)
    }

    /// Reloads every [`RELOAD_PERIOD`] for as long as `this` is in use
    /// elsewhere; nothing to watch, it returns at once.
    pub async fn watch(this: std::sync::Weak<Self>) {
        let mut tick = tokio::time::interval(RELOAD_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(cfg) = this.upgrade() else { return };
            if cfg.paths.is_empty() {
                return;
            }
            match cfg.reload() {
                Ok(true) => tracing::info!("node API certificates reloaded from disk"),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "node API certificates not reloaded; the ones in use stay")
                }
            }
        }
    }
}

/// What each of `paths` holds now (`None`: unreadable).
fn read_all(paths: &[PathBuf]) -> Contents {
    paths.iter().map(|p| std::fs::read(p).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_pair_is_made_once_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let s = ServingCert::SelfSigned {
            dir: dir.path().join("pki"),
            names: vec!["n1".into()],
            ips: vec!["127.0.0.1".parse().unwrap()],
        };
        let (first, _) = s.load().unwrap();
        let (again, _) = s.load().unwrap();
        assert_eq!(first, again);
        let (_, cert) = x509_parser::parse_x509_certificate(&first[0]).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        let names = format!("{:?}", san.value.general_names);
        assert_eq!(names, r#"[DNSName("n1"), IPAddress([127, 0, 0, 1])]"#);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(dir.path().join("pki/kubelet.key"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        server_config(&s, None).unwrap();
    }

    #[test]
    fn files_that_do_not_build_are_tried_again_only_once_they_change() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("c.crt"), dir.path().join("c.key"));
        let write = || {
            let (c, k) = self_signed(&["n1".into()], &[]).unwrap();
            std::fs::write(&cert, c).unwrap();
            std::fs::write(&key, k).unwrap();
        };
        write();
        let files = ServingCert::Files {
            cert: cert.clone(),
            key: key.clone(),
        };
        let cfg = ReloadingConfig::new(files, None, Reload::default()).unwrap();
        assert!(!cfg.reload().unwrap(), "nothing changed");
        std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\n").unwrap();
        assert!(cfg.reload().is_err(), "a half-written key");
        assert!(
            !cfg.reload().unwrap(),
            "the same broken files: not tried again"
        );
        write();
        assert!(cfg.reload().unwrap(), "whole again: reloaded");
    }

    #[test]
    fn unreadable_files_are_named() {
        let s = ServingCert::Files {
            cert: "/nonexistent/c.crt".into(),
            key: "/nonexistent/c.key".into(),
        };
        let err = server_config(&s, None).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/c.crt"), "{err}");
    }
}
