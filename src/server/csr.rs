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
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::Client;
use tracing::{info, warn};

pub use crate::certificate::CertSlot;
use crate::certificate::{Template, certified, renew_at};

/// The file holding the current certificate and its key.
pub const CURRENT: &str = "kubelet-server-current.pem";
/// How long to wait before a new request after a denied or failed one.
const RETRY: Duration = Duration::from_secs(30);

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
            let template = Template::serving(&self.node, self.names.clone(), self.ips.clone());
            match crate::certificate::obtain(&self.client, &template, &path).await {
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
}
