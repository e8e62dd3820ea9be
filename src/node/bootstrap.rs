//! TLS bootstrap of the agent's own credentials, as the kubelet's
//! `--bootstrap-kubeconfig` (cmd/kubelet/app/server.go,
//! pkg/kubelet/certificate/bootstrap): when `--kubeconfig` is missing or its
//! client certificate has expired, the agent asks for a client certificate
//! with the bootstrap credentials (a bootstrap token, as `kubeadm join`
//! gives). The request uses the signer `kubernetes.io/kube-apiserver-client-kubelet`,
//! the subject `CN=system:node:<node>, O=system:nodes` and the usages
//! `digital signature` and `client auth`. The agent waits until it is
//! approved and issued (the controller-manager's node-client approver does
//! this for bootstrap tokens), and stores it in the certificate directory as
//! `kubelet-client-<time>.pem` with `kubelet-client-current.pem` linked to
//! it. Then it writes the kubeconfig: the bootstrap kubeconfig's cluster,
//! and that certificate as the user.
//!
//! Without `rotateCertificates` the agent waits for this before it starts
//! ([`ensure`]). With it, as the kubelet ("client rotation is on, will
//! bootstrap in background"), the agent starts at once with no client
//! certificate and the bootstrap runs in the client certificate manager
//! ([`Pending`], `client_cert`): static pods run meanwhile, which is how a
//! node whose API server is one of its own static pods comes up.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use rustls::sign::CertifiedKey;
use tracing::info;

use crate::certificate::{Template, obtain};

/// The link to the current client certificate and key in the certificate
/// directory.
pub const CURRENT: &str = "kubelet-client-current.pem";

/// Errors of the bootstrap.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The bootstrap kubeconfig cannot be used.
    #[error("bootstrap kubeconfig {path}: {message}")]
    Bootstrap {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
    /// No certificate was issued.
    #[error("client certificate: {0}")]
    Certificate(#[from] crate::certificate::Error),
    /// A file could not be written.
    #[error("write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// When the client certificate of the kubeconfig at `path` expires: None
/// when the kubeconfig cannot be read or its current user has no usable
/// certificate (a token, or none), as the kubelet's `isClientConfigStillValid`
/// looks only at certificates.
#[must_use]
pub fn client_certificate_expiry(path: &Path) -> Option<Timestamp> {
    let kc = Kubeconfig::read_from(path).ok()?;
    let context = kc.current_context.as_deref()?;
    let user = kc
        .contexts
        .iter()
        .find(|c| c.name == context)?
        .context
        .as_ref()?
        .user
        .clone()?;
    let auth = kc
        .auth_infos
        .iter()
        .find(|a| a.name == user)?
        .auth_info
        .clone()?;
    let pem = match (&auth.client_certificate_data, &auth.client_certificate) {
        (Some(data), _) => {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(data)
                .ok()?
        }
        (None, Some(file)) => std::fs::read(file).ok()?,
        (None, None) => return None,
    };
    let leaf = CertificateDer::pem_slice_iter(&pem).next()?.ok()?;
    let (_, parsed) = x509_parser::parse_x509_certificate(&leaf).ok()?;
    Timestamp::from_second(parsed.validity().not_after.timestamp()).ok()
}

/// True when the kubeconfig at `path` is usable as it is: it reads, and its
/// user is not a client certificate past its end (the kubelet's
/// `isClientConfigStillValid`).
#[must_use]
pub fn kubeconfig_usable(path: &Path) -> bool {
    let Ok(kc) = Kubeconfig::read_from(path) else {
        return false;
    };
    let uses_certificate = kc.auth_infos.iter().any(|a| {
        a.auth_info
            .as_ref()
            .is_some_and(|i| i.client_certificate.is_some() || i.client_certificate_data.is_some())
    });
    !uses_certificate || client_certificate_expiry(path).is_some_and(|end| end > Timestamp::now())
}

/// The kubeconfig of a bootstrapped node: the cluster of `bootstrap` (its
/// server and CA, kept as a file or as data) and the user whose certificate
/// and key are both in `pem`, as the kubelet writes it (`default-cluster`,
/// `default-auth`, `default-context`).
///
/// # Errors
/// The bootstrap kubeconfig has no current context, or its cluster is missing.
pub fn node_kubeconfig(bootstrap: &Kubeconfig, pem: &Path) -> Result<Kubeconfig, String> {
    let context = bootstrap
        .current_context
        .as_deref()
        .ok_or("no current-context")?;
    let cluster_name = bootstrap
        .contexts
        .iter()
        .find(|c| c.name == context)
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.clone())
        .ok_or_else(|| format!("no context {context:?}"))?;
    let cluster = bootstrap
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| format!("no cluster {cluster_name:?}"))?;
    let pem = pem.display().to_string();
    Ok(Kubeconfig {
        clusters: vec![NamedCluster {
            name: "default-cluster".into(),
            cluster: Some(Cluster {
                server: cluster.server,
                certificate_authority: cluster.certificate_authority,
                certificate_authority_data: cluster.certificate_authority_data,
                insecure_skip_tls_verify: cluster.insecure_skip_tls_verify,
                tls_server_name: cluster.tls_server_name,
                ..Cluster::default()
            }),
            other: std::collections::BTreeMap::new(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "default-auth".into(),
            auth_info: Some(AuthInfo {
                client_certificate: Some(pem.clone()),
                client_key: Some(pem),
                ..AuthInfo::default()
            }),
            other: std::collections::BTreeMap::new(),
        }],
        contexts: vec![NamedContext {
            name: "default-context".into(),
            context: Some(Context {
                cluster: "default-cluster".into(),
                user: Some("default-auth".into()),
                namespace: Some("default".into()),
                ..Context::default()
            }),
            other: std::collections::BTreeMap::new(),
        }],
        current_context: Some("default-context".into()),
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        ..Kubeconfig::default()
    })
}

/// A TLS bootstrap still to do: the bootstrap kubeconfig, a client with its
/// credentials, and where the issued certificate and the node's kubeconfig
/// go.
#[derive(Clone)]
pub struct Pending {
    /// The bootstrap kubeconfig's path, for errors.
    path: PathBuf,
    source: Kubeconfig,
    client: kube::Client,
    kubeconfig: PathBuf,
    cert_dir: PathBuf,
    node: String,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("kubeconfig", &self.kubeconfig)
            .field("cert_dir", &self.cert_dir)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl Pending {
    /// The bootstrap of node `node` with the kubeconfig at `bootstrap`,
    /// writing `kubeconfig` and storing certificates in `cert_dir`.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] when the bootstrap kubeconfig cannot be read or
    /// gives no client.
    pub async fn new(
        bootstrap: &Path,
        kubeconfig: &Path,
        cert_dir: &Path,
        node: &str,
    ) -> Result<Self, Error> {
        let bad = |message: String| Error::Bootstrap {
            path: bootstrap.to_path_buf(),
            message,
        };
        let source = Kubeconfig::read_from(bootstrap).map_err(|e| bad(e.to_string()))?;
        let config =
            kube::Config::from_custom_kubeconfig(source.clone(), &KubeConfigOptions::default())
                .await
                .map_err(|e| bad(e.to_string()))?;
        let client = kube::Client::try_from(crate::with_user_agent(config))
            .map_err(|e| bad(e.to_string()))?;
        Ok(Self {
            path: bootstrap.to_path_buf(),
            source,
            client,
            kubeconfig: kubeconfig.to_path_buf(),
            cert_dir: cert_dir.to_path_buf(),
            node: node.to_string(),
        })
    }

    /// A bootstrap that asks with `client` (tests: a fake certificates API).
    #[cfg(test)]
    pub(crate) fn with_client(
        source: Kubeconfig,
        client: kube::Client,
        kubeconfig: &Path,
        cert_dir: &Path,
        node: &str,
    ) -> Self {
        Self {
            path: PathBuf::from("bootstrap.conf"),
            source,
            client,
            kubeconfig: kubeconfig.to_path_buf(),
            cert_dir: cert_dir.to_path_buf(),
            node: node.to_string(),
        }
    }

    /// The configuration of the bootstrap kubeconfig's cluster with no
    /// credentials (client-go's `AnonymousClientConfig`): the agent's own
    /// client until its certificate is issued, so that the bootstrap token
    /// serves nothing but the certificate request.
    ///
    /// # Errors
    /// [`Error::Bootstrap`] when the cluster's CA or server cannot be used.
    pub async fn anonymous_config(&self) -> Result<kube::Config, Error> {
        let mut source = self.source.clone();
        for user in &mut source.auth_infos {
            user.auth_info = Some(AuthInfo::default());
        }
        let mut config =
            kube::Config::from_custom_kubeconfig(source, &KubeConfigOptions::default())
                .await
                .map_err(|e| Error::Bootstrap {
                    path: self.path.clone(),
                    message: e.to_string(),
                })?;
        config.auth_info = AuthInfo::default();
        Ok(crate::with_user_agent(config))
    }

    /// A valid certificate already in the store (`kubelet-client-current.pem`),
    /// after which the node's kubeconfig is (re)written to use it: the
    /// kubelet's case of an invalid kubeconfig with a valid certificate.
    ///
    /// # Errors
    /// The kubeconfig could not be written.
    pub fn stored(&self) -> Result<Option<Issued>, Error> {
        let current = self.cert_dir.join(CURRENT);
        let Ok(text) = std::fs::read_to_string(&current) else {
            return Ok(None);
        };
        match crate::certificate::certified(&text, &text) {
            Ok(pair) if pair.2 > Timestamp::now() => {
                self.write_kubeconfig()?;
                Ok(Some(pair))
            }
            _ => Ok(None),
        }
    }

    /// Requests the node's client certificate with the bootstrap
    /// credentials and waits until it is issued (as long as the request is
    /// pending), stores it as `kubelet-client-<time>.pem` with
    /// `kubelet-client-current.pem` linked to it, and writes the node's
    /// kubeconfig ([`node_kubeconfig`]). Returns the certificate and its
    /// validity.
    ///
    /// # Errors
    /// The request failed or was denied, or a file could not be written.
    pub async fn issue(&self) -> Result<Issued, Error> {
        info!(kubeconfig = %self.kubeconfig.display(), "requesting a client certificate with the bootstrap credentials");
        let stamp = Timestamp::now().strftime("%Y-%m-%d-%H-%M-%S").to_string();
        let issued = self.cert_dir.join(format!("kubelet-client-{stamp}.pem"));
        let pair = obtain(&self.client, &Template::client(&self.node), &issued).await?;
        let current = self.cert_dir.join(CURRENT);
        link(&issued, &current).map_err(|source| Error::Write {
            path: current.clone(),
            source,
        })?;
        self.write_kubeconfig()?;
        info!(kubeconfig = %self.kubeconfig.display(), certificate = %issued.display(), "client certificate issued; kubeconfig written");
        Ok(pair)
    }

    fn write_kubeconfig(&self) -> Result<(), Error> {
        let bad = |message: String| Error::Bootstrap {
            path: self.path.clone(),
            message,
        };
        let node_kc = node_kubeconfig(&self.source, &self.cert_dir.join(CURRENT)).map_err(bad)?;
        let text = serde_saphyr::to_string(&node_kc).map_err(|e| bad(e.to_string()))?;
        if let Some(dir) = self.kubeconfig.parent() {
            std::fs::create_dir_all(dir).map_err(|source| Error::Write {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        crate::certificate::write_private(&self.kubeconfig, &text, 0o600).map_err(|source| {
            Error::Write {
                path: self.kubeconfig.clone(),
                source,
            }
        })
    }
}

/// An issued client certificate with its key, and its validity (not
/// before, not after).
pub type Issued = (Arc<CertifiedKey>, Timestamp, Timestamp);

/// Makes `kubeconfig` usable for node `node`: when it is not
/// ([`kubeconfig_usable`]), a client certificate is requested with the
/// credentials of `bootstrap` and stored in `cert_dir`, and the kubeconfig
/// is written ([`node_kubeconfig`]). Waits as long as the request is
/// pending: the kubelet's blocking bootstrap without `rotateCertificates`
/// (`bootstrap.LoadClientCert`).
///
/// # Errors
/// The bootstrap kubeconfig cannot be used, the request was denied or
/// failed, or a file could not be written.
pub async fn ensure(
    kubeconfig: &Path,
    bootstrap: &Path,
    cert_dir: &Path,
    node: &str,
) -> Result<(), Error> {
    if kubeconfig_usable(kubeconfig) {
        return Ok(());
    }
    info!(kubeconfig = %kubeconfig.display(), "no usable kubeconfig: bootstrapping");
    Pending::new(bootstrap, kubeconfig, cert_dir, node)
        .await?
        .issue()
        .await
        .map(drop)
}

/// Points the link `current` at `target` (absolute), replacing it in one
/// rename, as the kubelet's certificate store does through
/// `kubelet-client-updated.pem`.
pub(super) fn link(target: &Path, current: &Path) -> std::io::Result<()> {
    let target = std::path::absolute(target)?;
    let updated = current.with_file_name("kubelet-client-updated.pem");
    let _ = std::fs::remove_file(&updated);
    std::os::unix::fs::symlink(&target, &updated)?;
    std::fs::rename(&updated, current)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A self-signed certificate and key valid until January 1st of `year`,
    /// in one PEM.
    fn pem(year: i32) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![]).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(year, 1, 1);
        let cert = params.self_signed(&key).unwrap();
        format!("{}{}", cert.pem(), key.serialize_pem())
    }

    pub(crate) const BOOTSTRAP: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    \
        server: https://10.0.0.1:6443\n    certificate-authority: /pki/ca.crt\nusers:\n- name: b\n  user:\n    \
        token: abcdef.0123456789abcdef\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: b\n\
        current-context: x\n";

    #[test]
    fn the_node_kubeconfig_keeps_the_cluster_and_uses_the_issued_pair() {
        let dir = tempfile::tempdir().unwrap();
        let bootstrap = Kubeconfig::from_yaml(BOOTSTRAP).unwrap();
        let current = dir.path().join(CURRENT);
        let kc = node_kubeconfig(&bootstrap, &current).unwrap();
        let cluster = kc.clusters[0].cluster.as_ref().unwrap();
        assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(
            cluster.certificate_authority.as_deref(),
            Some("/pki/ca.crt")
        );
        let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
        assert!(user.token.is_none(), "the bootstrap token is not kept");
        assert_eq!(
            user.client_certificate.as_deref(),
            Some(current.to_str().unwrap())
        );
        assert_eq!(user.client_key, user.client_certificate);

        // Written, it is usable while the certificate is valid, not after.
        let path = dir.path().join("kubelet.conf");
        std::fs::write(&path, serde_saphyr::to_string(&kc).unwrap()).unwrap();
        assert!(
            !kubeconfig_usable(&path),
            "the certificate is not there yet"
        );
        std::fs::write(dir.path().join("a.pem"), pem(2099)).unwrap();
        link(&dir.path().join("a.pem"), &current).unwrap();
        let end: Timestamp = "2099-01-01T00:00:00Z".parse().unwrap();
        assert_eq!(client_certificate_expiry(&path), Some(end));
        assert!(kubeconfig_usable(&path));
        std::fs::write(dir.path().join("b.pem"), pem(2021)).unwrap();
        link(&dir.path().join("b.pem"), &current).unwrap();
        assert!(!kubeconfig_usable(&path), "an expired certificate");
        assert!(
            std::fs::symlink_metadata(&current)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }

    #[test]
    fn a_token_kubeconfig_is_usable_and_a_missing_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kc");
        std::fs::write(&path, BOOTSTRAP).unwrap();
        assert!(kubeconfig_usable(&path));
        assert!(!kubeconfig_usable(&dir.path().join("missing")));
        let no_context = Kubeconfig::default();
        assert!(node_kubeconfig(&no_context, &path).is_err());
    }

    #[tokio::test]
    async fn the_agent_client_of_a_pending_bootstrap_has_the_cluster_and_no_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let ca = rcgen::CertificateParams::new(vec![])
            .unwrap()
            .self_signed(&rcgen::KeyPair::generate().unwrap())
            .unwrap()
            .pem();
        let ca_path = dir.path().join("ca.crt");
        std::fs::write(&ca_path, ca).unwrap();
        let path = dir.path().join("bootstrap.conf");
        std::fs::write(
            &path,
            BOOTSTRAP.replace("/pki/ca.crt", ca_path.to_str().unwrap()),
        )
        .unwrap();
        let kubeconfig = dir.path().join("kubelet.conf");
        let pending = Pending::new(&path, &kubeconfig, &dir.path().join("pki"), "n1")
            .await
            .unwrap();
        let config = pending.anonymous_config().await.unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://10.0.0.1:6443/");
        assert!(config.root_cert.is_some(), "the cluster's CA is kept");
        assert!(config.auth_info.token.is_none(), "no bootstrap token");
        assert!(config.auth_info.client_certificate_data.is_none());
        // Nothing stored yet: the bootstrap is to run.
        assert!(pending.stored().unwrap().is_none());
        assert!(!kubeconfig.exists());

        // A bootstrap kubeconfig without its cluster fails at start.
        std::fs::write(&path, BOOTSTRAP.replace("cluster: c\n", "cluster: other\n")).unwrap();
        let e = Pending::new(&path, &kubeconfig, dir.path(), "n1")
            .await
            .unwrap_err();
        assert!(e.to_string().contains("bootstrap kubeconfig"), "{e}");
    }
}
