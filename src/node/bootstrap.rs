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

use std::path::{Path, PathBuf};

use k8s_openapi::jiff::Timestamp;
use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
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

/// Makes `kubeconfig` usable for node `node`: when it is not
/// ([`kubeconfig_usable`]), a client certificate is requested with the
/// credentials of `bootstrap` and stored in `cert_dir`, and the kubeconfig
/// is written ([`node_kubeconfig`]). Waits as long as the request is
/// pending.
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
    let bad = |message: String| Error::Bootstrap {
        path: bootstrap.to_path_buf(),
        message,
    };
    let kc = Kubeconfig::read_from(bootstrap).map_err(|e| bad(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kc.clone(), &KubeConfigOptions::default())
        .await
        .map_err(|e| bad(e.to_string()))?;
    let client = kube::Client::try_from(config).map_err(|e| bad(e.to_string()))?;
    info!(kubeconfig = %kubeconfig.display(), "no usable kubeconfig: requesting a client certificate with the bootstrap credentials");
    let stamp = Timestamp::now().strftime("%Y-%m-%d-%H-%M-%S").to_string();
    let issued = cert_dir.join(format!("kubelet-client-{stamp}.pem"));
    obtain(&client, &Template::client(node), &issued).await?;
    let current = cert_dir.join(CURRENT);
    link(&issued, &current).map_err(|source| Error::Write {
        path: current.clone(),
        source,
    })?;
    let node_kc = node_kubeconfig(&kc, &current).map_err(bad)?;
    let text = serde_yaml::to_string(&node_kc).map_err(|e| bad(e.to_string()))?;
    if let Some(dir) = kubeconfig.parent() {
        std::fs::create_dir_all(dir).map_err(|source| Error::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    crate::certificate::write_private(kubeconfig, &text, 0o600).map_err(|source| Error::Write {
        path: kubeconfig.to_path_buf(),
        source,
    })?;
    info!(kubeconfig = %kubeconfig.display(), certificate = %issued.display(), "client certificate issued; kubeconfig written");
    Ok(())
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
mod tests {
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

    const BOOTSTRAP: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    \
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
        std::fs::write(&path, serde_yaml::to_string(&kc).unwrap()).unwrap();
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
}
