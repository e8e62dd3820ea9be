//! Rotation of the agent's own client certificate, as the kubelet's client
//! certificate manager with `rotateCertificates: true`
//! (pkg/kubelet/certificate/kubelet.go, client-go's `util/certificate` and
//! `transport.UpdateTransport`).
//!
//! The agent's API client presents whatever certificate a [`CertSlot`]
//! holds at each TLS handshake. The first is the certificate store's
//! `<cert-dir>/kubelet-client-current.pem` while it is valid, else the
//! kubeconfig's client certificate; with neither and a bootstrap kubeconfig
//! ([`Rotation::bootstrapping`]), the slot starts empty (the client is
//! anonymous) and the TLS bootstrap runs first, retried from
//! [`BOOTSTRAP_BACKOFF`] doubling up to [`RETRY`]. A request not answered
//! within [`CSR_WAIT`] is given up for a new one. Once 80 % of its lifetime has passed
//! (the kubelet picks 70–90 % at random), a new one is requested from the
//! certificates API with the current one (signer
//! `kubernetes.io/kube-apiserver-client-kubelet`, subject
//! `CN=system:node:<node>, O=system:nodes`: the controller-manager approves
//! it when the node may create `certificatesigningrequests/selfnodeclient`),
//! stored as `kubelet-client-<time>.pem` with `kubelet-client-current.pem`
//! linked to it, put in the slot, and every connection made with the old
//! one is closed, so that requests and watches go on with the new one.
//! Requests are at least 30 s apart, a failed one tried again after that;
//! the clock is read every 10 s at most. When the certificate has expired
//! and the API server answers (it refuses the expired certificate), the
//! agent exits so that its supervisor restarts it into the TLS bootstrap, as
//! the kubelet does.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use base64::Engine as _;
use hyper::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::client::ConfigExt as _;
use rustls::sign::CertifiedKey;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};
use tracing::{info, warn};

use super::bootstrap::{CURRENT, Pending, link};
use crate::certificate::{CertSlot, Template, certified, obtain, renew_at};

/// The least time between two requests for a certificate.
pub const RETRY: Duration = Duration::from_secs(30);
/// The longest sleep between two readings of the wall clock.
pub const CHECK: Duration = Duration::from_secs(10);
/// The first wait after a failed TLS bootstrap; it doubles up to [`RETRY`].
pub const BOOTSTRAP_BACKOFF: Duration = Duration::from_secs(2);
/// How long one request may wait for its certificate before a new one is
/// made (client-go's certificate manager's `certificateWaitTimeout`).
pub const CSR_WAIT: Duration = Duration::from_secs(15 * 60);

/// Errors setting up rotation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Neither the certificate store nor the kubeconfig has a usable client
    /// certificate.
    #[error("no client certificate to rotate: {0}")]
    NoCertificate(String),
    /// The API client could not be built (a bad CA or server name).
    #[error("API client: {0}")]
    Client(#[from] kube::Error),
}

/// The API connections made since the last rotation, closed together when
/// the certificate changes (client-go's `connrotation.Dialer.CloseAll`).
#[derive(Clone, Debug, Default)]
pub struct Connections(Arc<Mutex<CancellationToken>>);

impl Connections {
    /// The token the connections made now are closed with.
    fn token(&self) -> CancellationToken {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Closes every connection made so far: their reads and writes fail from
    /// now on, and the client's next requests dial new ones.
    pub fn close_all(&self) {
        let mut token = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        token.cancel();
        *token = CancellationToken::new();
    }
}

/// A connector whose connections end at the next [`Connections::close_all`].
#[derive(Clone, Debug)]
struct ClosableConnector<C> {
    inner: C,
    connections: Connections,
}

impl<C> tower::Service<Uri> for ClosableConnector<C>
where
    C: tower::Service<Uri>,
    C::Future: Send + 'static,
{
    type Response = Closable<C::Response>;
    type Error = C::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, C::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), C::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let closed = self.connections.token().cancelled_owned();
        let connecting = self.inner.call(uri);
        Box::pin(async move {
            Ok(Closable {
                inner: connecting.await?,
                closed: Box::pin(closed),
            })
        })
    }
}

/// One connection of a [`ClosableConnector`].
struct Closable<T> {
    inner: T,
    closed: Pin<Box<WaitForCancellationFutureOwned>>,
}

impl<T> Closable<T> {
    /// An error once the connection was closed; registers the waker otherwise.
    fn check(&mut self, cx: &mut Context<'_>) -> Result<(), io::Error> {
        match self.closed.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed: the client certificate was rotated",
            )),
            Poll::Pending => Ok(()),
        }
    }
}

impl<T: Read + Unpin> Read for Closable<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: Write + Unpin> Write for Closable<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.check(cx)?;
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
}

impl<T: Connection> Connection for Closable<T> {
    fn connected(&self) -> Connected {
        self.inner.connected()
    }
}

/// An API client for `config` that presents the certificate in `slot` at
/// each handshake and whose connections `connections` closes. The stack is
/// kube's default one (base URI, server retries, authorization, extra
/// headers, connect/read/write timeouts, HTTP/1.1) without its tracing layer
/// and without TLS session resumption; the CA, server name and proxy-less
/// transport come from `config`.
///
/// # Errors
/// A CA or server name in `config` that rustls refuses.
pub fn client(
    config: &kube::Config,
    slot: CertSlot,
    connections: Connections,
) -> Result<Client, kube::Error> {
    let mut tls = config.rustls_client_config()?;
    tls.client_auth_cert_resolver = Arc::new(slot);
    // A resumed session keeps the identity of the handshake it came from, the
    // old certificate; client-go keeps no session cache either.
    tls.resumption = rustls::client::Resumption::disabled();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let closable = ClosableConnector {
        inner: http,
        connections,
    };
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let builder = match &config.tls_server_name {
        Some(name) => {
            let name = rustls::pki_types::ServerName::try_from(name.clone()).map_err(|e| {
                kube::Error::Service(format!("tls-server-name {name:?}: {e}").into())
            })?;
            builder.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => builder,
    };
    let mut connector =
        hyper_timeout::TimeoutConnector::new(builder.enable_http1().wrap_connector(closable));
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let http_client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Builder::new(hyper_util::rt::TokioExecutor::new())
            .build(connector);
    let service = tower::ServiceBuilder::new()
        .layer(config.base_uri_layer())
        // A span per request, named as client-go's traced transport names
        // them (`HTTP PATCH`); exported when tracing is on (crate::otel).
        .layer(
            tower_http::trace::TraceLayer::new_for_http()
                .make_span_with(|req: &http::Request<kube::client::Body>| {
                    tracing::debug_span!(
                        "HTTP",
                        otel.name = %format_args!("HTTP {}", req.method()),
                        otel.kind = "client",
                        http.method = %req.method(),
                        http.url = %req.uri(),
                    )
                })
                .on_request(())
                .on_response(())
                .on_body_chunk(())
                .on_eos(())
                .on_failure(()),
        )
        .option_layer(config.default_retry.then(|| {
            tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry())
        }))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(http_client);
    Ok(Client::new(service, config.default_namespace.clone()))
}

/// The client certificate manager of one node (see the module).
#[derive(Debug)]
pub struct Rotation {
    slot: CertSlot,
    connections: Connections,
    store: PathBuf,
    node: String,
    from: Timestamp,
    until: Timestamp,
    /// The TLS bootstrap still to do: no certificate yet.
    bootstrap: Option<Pending>,
}

/// The certificate the agent starts with: the store's current one while it
/// is valid, else the kubeconfig's (`client-certificate(-data)` and
/// `client-key(-data)`), with its validity.
fn initial(
    config: &kube::Config,
    store: &Path,
) -> Result<(Arc<CertifiedKey>, Timestamp, Timestamp), Error> {
    let current = store.join(CURRENT);
    if let Ok(text) = std::fs::read_to_string(&current) {
        match certified(&text, &text) {
            Ok(pair) if pair.2 > Timestamp::now() => return Ok(pair),
            Ok(_) => info!(path = %current.display(), "stored client certificate expired"),
            Err(e) => {
                warn!(path = %current.display(), error = %e, "stored client certificate unusable");
            }
        }
    }
    let user = &config.auth_info;
    let read = |data: Option<&str>, file: Option<&String>, what: &str| -> Result<String, Error> {
        if let Some(data) = data.filter(|d| !d.is_empty()) {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|e| Error::NoCertificate(format!("the kubeconfig's {what}-data: {e}")))?;
            return Ok(String::from_utf8_lossy(&bytes).into_owned());
        }
        let file = file.ok_or_else(|| {
            Error::NoCertificate(format!(
                "the kubeconfig has no {what} and {} is not there",
                current.display()
            ))
        })?;
        std::fs::read_to_string(file)
            .map_err(|e| Error::NoCertificate(format!("the kubeconfig's {what} {file}: {e}")))
    };
    let cert = read(
        user.client_certificate_data.as_deref(),
        user.client_certificate.as_ref(),
        "client-certificate",
    )?;
    let key = {
        use secrecy::ExposeSecret as _;
        let data = user.client_key_data.as_ref().map(|k| k.expose_secret());
        read(data, user.client_key.as_ref(), "client-key")?
    };
    certified(&cert, &key).map_err(|e| Error::NoCertificate(e.to_string()))
}

impl Rotation {
    /// The client of `config` with rotation for node `node`, its certificates
    /// stored in `store` (`--cert-dir`).
    ///
    /// # Errors
    /// [`Error::NoCertificate`] when neither the store nor the kubeconfig has
    /// a usable client certificate (a token kubeconfig has nothing to
    /// rotate); [`Error::Client`] when the client cannot be built.
    pub fn start(config: &kube::Config, store: &Path, node: &str) -> Result<(Client, Self), Error> {
        let (key, from, until) = initial(config, store)?;
        let slot = CertSlot::default();
        slot.set(key);
        let connections = Connections::default();
        let client = client(config, slot.clone(), connections.clone())?;
        info!(%until, renew_at = %renew_at(from, until), "client certificate rotation on");
        Ok((
            client,
            Self {
                slot,
                connections,
                store: store.to_path_buf(),
                node: node.to_string(),
                from,
                until,
                bootstrap: None,
            },
        ))
    }

    /// The client of `config` (the bootstrap kubeconfig's cluster, no
    /// credentials: [`Pending::anonymous_config`]) for node `node`, whose
    /// first certificate comes from the TLS bootstrap `pending`, in the
    /// background ([`Rotation::run`]): until then its requests are
    /// anonymous. A valid certificate already in the store is used at once.
    ///
    /// # Errors
    /// [`Error::Client`] when the client cannot be built;
    /// [`Error::NoCertificate`] when the kubeconfig for a stored certificate
    /// cannot be written.
    pub fn bootstrapping(
        config: &kube::Config,
        store: &Path,
        node: &str,
        pending: Pending,
    ) -> Result<(Client, Self), Error> {
        let slot = CertSlot::default();
        let connections = Connections::default();
        let client = client(config, slot.clone(), connections.clone())?;
        let mut rotation = Self {
            slot,
            connections,
            store: store.to_path_buf(),
            node: node.to_string(),
            from: Timestamp::UNIX_EPOCH,
            until: Timestamp::UNIX_EPOCH,
            bootstrap: None,
        };
        match pending
            .stored()
            .map_err(|e| Error::NoCertificate(e.to_string()))?
        {
            Some((key, from, until)) => {
                rotation.slot.set(key);
                (rotation.from, rotation.until) = (from, until);
                info!(%until, renew_at = %renew_at(from, until), "client certificate rotation on (stored certificate)");
            }
            None => {
                info!("client rotation is on, will bootstrap in background");
                rotation.bootstrap = Some(pending);
            }
        }
        Ok((client, rotation))
    }

    /// Runs the TLS bootstrap until a certificate is issued, backing off
    /// from [`BOOTSTRAP_BACKOFF`] to [`RETRY`] between failed attempts
    /// (the API server may be a static pod not yet up), then puts it in
    /// place and closes the anonymous connections.
    async fn bootstrap(&mut self, pending: &Pending) {
        let mut backoff = BOOTSTRAP_BACKOFF;
        loop {
            let issued = tokio::time::timeout(CSR_WAIT, pending.issue())
                .await
                .unwrap_or_else(|_| {
                    Err(super::bootstrap::Error::Certificate(
                        crate::certificate::Error::Timeout(CSR_WAIT),
                    ))
                });
            match issued {
                Ok((key, from, until)) => {
                    self.slot.set(key);
                    self.connections.close_all();
                    (self.from, self.until) = (from, until);
                    info!(%until, renew_at = %renew_at(from, until), "client certificate bootstrapped; rotation on");
                    return;
                }
                Err(e) => {
                    warn!(error = %e, retry_in = ?backoff, "TLS bootstrap");
                    tokio::time::sleep(backoff).await;
                    backoff = backoff.saturating_mul(2).min(RETRY);
                }
            }
        }
    }

    /// Bootstraps the first certificate when there is none
    /// ([`Rotation::bootstrapping`]), then renews it whenever it is due,
    /// forever, with `client` (the one [`Rotation::start`] or
    /// [`Rotation::bootstrapping`] returned), at least [`RETRY`] apart.
    /// The wall clock is read again at least every [`CHECK`] (it may jump:
    /// NTP, a resumed machine). Returns only when the certificate has
    /// expired and the API server answers: the agent must then exit and
    /// bootstrap again.
    pub async fn run(mut self, client: Client) -> anyhow::Error {
        if let Some(pending) = self.bootstrap.take() {
            self.bootstrap(&pending).await;
        }
        let mut not_before = Timestamp::now();
        let mut warned = false;
        loop {
            let now = Timestamp::now();
            if now >= self.until
                && let Some(e) = self.expired(&client, &mut warned).await
            {
                return e;
            }
            let due = renew_at(self.from, self.until).max(not_before);
            if now < due {
                let wait = Duration::try_from(now.duration_until(due)).unwrap_or(CHECK);
                tokio::time::sleep(wait.min(CHECK)).await;
                continue;
            }
            not_before = Timestamp::now().checked_add(RETRY).unwrap_or(now);
            let stamp = Timestamp::now().strftime("%Y-%m-%d-%H-%M-%S").to_string();
            let issued = self.store.join(format!("kubelet-client-{stamp}.pem"));
            let renewed = tokio::time::timeout(
                CSR_WAIT,
                obtain(&client, &Template::client(&self.node), &issued),
            )
            .await
            .unwrap_or_else(|_| Err(crate::certificate::Error::Timeout(CSR_WAIT)));
            let linked = renewed.and_then(|pair| {
                link(&issued, &self.store.join(CURRENT))
                    .map(|()| pair)
                    .map_err(|source| crate::certificate::Error::Write {
                        path: self.store.join(CURRENT),
                        source,
                    })
            });
            match linked {
                Ok((key, from, until)) => {
                    self.slot.set(key);
                    self.connections.close_all();
                    (self.from, self.until) = (from, until);
                    warned = false;
                    info!(certificate = %issued.display(), %until, "client certificate rotated");
                }
                Err(e) => warn!(error = %e, "client certificate renewal"),
            }
        }
    }

    /// The certificate has expired: an error to exit with when the API
    /// server answers (a refusal included: it is up, and the certificate is
    /// what keeps the agent out), else None, said once.
    async fn expired(&self, client: &Client, warned: &mut bool) -> Option<anyhow::Error> {
        match client.apiserver_version().await {
            Ok(_) | Err(kube::Error::Api(_)) => Some(anyhow::anyhow!(
                "the client certificate expired at {} and the API server is responsive: \
                 exiting so that the TLS bootstrap runs again",
                self.until
            )),
            Err(_) => {
                if !*warned {
                    warn!(expired = %self.until, "the client certificate expired, but the API server is not responsive; a restart may be necessary to retrieve new initial credentials");
                    *warned = true;
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::Bytes;
    use futures::AsyncBufReadExt as _;
    use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
    use hyper::body::Frame;
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    use super::*;

    struct Ca {
        params: rcgen::CertificateParams,
        key: rcgen::KeyPair,
        der: CertificateDer<'static>,
    }

    fn ca() -> Ca {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let der = params.self_signed(&key).unwrap().der().clone();
        Ca { params, key, der }
    }

    /// A certificate of `ca` for `cn` (a client one) or for 127.0.0.1 (a
    /// server one), valid until January 1st of `year`, as one PEM with its key.
    fn issue(ca: &Ca, cn: Option<&str>, year: i32) -> String {
        issue_until(ca, cn, rcgen::date_time_ymd(year, 1, 1))
    }

    /// As [`issue`], valid until `until`.
    fn issue_until(ca: &Ca, cn: Option<&str>, until: time::OffsetDateTime) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = until;
        match cn {
            Some(cn) => {
                params
                    .distinguished_name
                    .push(rcgen::DnType::CommonName, cn);
                params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
            }
            None => {
                params.subject_alt_names =
                    vec![rcgen::SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))];
                params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
            }
        }
        let issuer = rcgen::Issuer::from_params(&ca.params, &ca.key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        format!("{}{}", cert.pem(), key.serialize_pem())
    }

    fn key_of(pem: &str) -> Arc<CertifiedKey> {
        certified(pem, pem).unwrap().0
    }

    /// What the test server saw: connections accepted and ended.
    #[derive(Default)]
    struct Seen {
        accepted: AtomicUsize,
        ended: AtomicUsize,
    }

    /// An HTTPS server on a random loopback port that requires a client
    /// certificate of `ca` and answers every request with the common name of
    /// the certificate its connection was made with; `/hold` answers with a
    /// body that never ends, as a watch.
    async fn server(ca: &Ca) -> (u16, Arc<Seen>) {
        let pem = issue(ca, None, 2099);
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.der.clone()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
            .build()
            .unwrap();
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
        let tls = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                chain,
                PrivateKeyDer::from_pem_slice(pem.as_bytes()).unwrap(),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Seen::default());
        let counts = seen.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let acceptor = acceptor.clone();
                let counts = counts.clone();
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    counts.accepted.fetch_add(1, Ordering::SeqCst);
                    let peer = stream.get_ref().1.peer_certificates().unwrap()[0].clone();
                    let (_, parsed) = x509_parser::parse_x509_certificate(&peer).unwrap();
                    let cn = parsed
                        .subject()
                        .iter_common_name()
                        .next()
                        .and_then(|c| c.as_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                        let body: BoxBody<Bytes, std::convert::Infallible> = if req.uri().path()
                            == "/hold"
                        {
                            let first = Ok(Frame::data(Bytes::from(format!("{cn}\n"))));
                            BodyExt::boxed(StreamBody::new(
                                futures::stream::iter([first]).chain(futures::stream::pending()),
                            ))
                        } else {
                            Full::new(Bytes::from(cn.clone())).boxed()
                        };
                        async move { Ok::<_, std::convert::Infallible>(hyper::Response::new(body)) }
                    });
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await;
                    counts.ended.fetch_add(1, Ordering::SeqCst);
                });
            }
        });
        (port, seen)
    }

    async fn whoami(client: &Client) -> String {
        client
            .request_text(hyper::Request::get("/whoami").body(Vec::new()).unwrap())
            .await
            .unwrap()
    }

    async fn eventually(what: &str, check: impl Fn() -> bool) {
        for _ in 0..100 {
            if check() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{what}: not within 5 s");
    }

    use futures::StreamExt as _;

    #[tokio::test]
    async fn a_rotated_certificate_is_presented_on_new_connections_once_the_old_are_closed() {
        let ca = ca();
        let (port, seen) = server(&ca).await;
        let mut config = kube::Config::new(format!("https://127.0.0.1:{port}").parse().unwrap());
        config.root_cert = Some(vec![ca.der.to_vec()]);
        let slot = CertSlot::default();
        slot.set(key_of(&issue(&ca, Some("system:node:a"), 2099)));
        let connections = Connections::default();
        let client = client(&config, slot.clone(), connections.clone()).unwrap();

        assert_eq!(whoami(&client).await, "system:node:a");
        assert_eq!(whoami(&client).await, "system:node:a");
        assert_eq!(
            seen.accepted.load(Ordering::SeqCst),
            1,
            "one pooled connection"
        );
        // A new certificate alone changes nothing for the pooled connection:
        // that is why the old connections are closed.
        slot.set(key_of(&issue(&ca, Some("system:node:b"), 2099)));
        assert_eq!(whoami(&client).await, "system:node:a");
        // A watch-like request stays open on it.
        let held = client
            .request_stream(hyper::Request::get("/hold").body(Vec::new()).unwrap())
            .await
            .unwrap();
        let mut lines = held.lines();
        assert_eq!(lines.next().await.unwrap().unwrap(), "system:node:a");
        let before = seen.accepted.load(Ordering::SeqCst);

        connections.close_all();
        let ended = tokio::time::timeout(Duration::from_secs(5), lines.next())
            .await
            .expect("the held request ends within 5 s");
        assert!(
            !matches!(ended, Some(Ok(_))),
            "the held request ends: {ended:?}"
        );
        eventually("both old connections end", || {
            seen.ended.load(Ordering::SeqCst) == before
        })
        .await;
        assert_eq!(whoami(&client).await, "system:node:b");
        assert_eq!(seen.accepted.load(Ordering::SeqCst), before + 1);
    }

    #[test]
    fn the_first_certificate_is_the_stores_while_valid_else_the_kubeconfigs() {
        let ca = ca();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig_pem = issue(&ca, Some("from-kubeconfig"), 2099);
        let file = dir.path().join("kc.pem");
        std::fs::write(&file, &kubeconfig_pem).unwrap();
        let mut config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        config.auth_info.client_certificate = Some(file.display().to_string());
        config.auth_info.client_key = Some(file.display().to_string());
        let store = dir.path().join("pki");
        std::fs::create_dir(&store).unwrap();
        let end = |year: i32| {
            Timestamp::from_second(rcgen::date_time_ymd(year, 1, 1).unix_timestamp()).unwrap()
        };

        // An empty store: the kubeconfig's.
        assert_eq!(initial(&config, &store).unwrap().2, end(2099));
        // A valid stored one wins.
        std::fs::write(store.join("a.pem"), issue(&ca, Some("stored"), 2098)).unwrap();
        link(&store.join("a.pem"), &store.join(CURRENT)).unwrap();
        assert_eq!(initial(&config, &store).unwrap().2, end(2098));
        // An expired stored one does not.
        std::fs::write(store.join("b.pem"), issue(&ca, Some("stored"), 2021)).unwrap();
        link(&store.join("b.pem"), &store.join(CURRENT)).unwrap();
        assert_eq!(initial(&config, &store).unwrap().2, end(2099));
        // Inline data works as a file does.
        let b64 = base64::engine::general_purpose::STANDARD.encode(&kubeconfig_pem);
        let mut inline = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        inline.auth_info.client_certificate_data = Some(b64.clone());
        inline.auth_info.client_key_data = Some(b64.into());
        assert_eq!(initial(&inline, &store).unwrap().2, end(2099));
        // A token kubeconfig has nothing to rotate; bad data is named.
        let token = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let e = initial(&token, &store).unwrap_err().to_string();
        assert!(e.contains("has no client-certificate"), "{e}");
        inline.auth_info.client_certificate_data = Some("not base64!".into());
        let e = initial(&inline, &store).unwrap_err().to_string();
        assert!(e.contains("client-certificate-data"), "{e}");
    }

    /// A certificates API that signs with `ca` (or denies, when `deny`) the
    /// node client requests it is sent, behind a real `kube::Client`; it
    /// asserts what each request asks and records the paths. `/version`
    /// answers as the API server does.
    fn csr_api(ca: Ca, deny: bool, paths: Arc<Mutex<Vec<String>>>) -> Client {
        let ca = Arc::new(ca);
        let issued = Arc::new(Mutex::new(None::<String>));
        let service = tower::service_fn(move |req: hyper::Request<kube::client::Body>| {
            let (ca, issued, paths) = (ca.clone(), issued.clone(), paths.clone());
            async move {
                let (parts, body) = req.into_parts();
                let body = body.collect_bytes().await.unwrap();
                let path = parts.uri.path().to_string();
                paths
                    .lock()
                    .unwrap()
                    .push(format!("{} {path}", parts.method));
                const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";
                let (code, out) = match (parts.method.as_str(), path.as_str()) {
                    ("POST", CSRS) => {
                        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                        assert_eq!(v["spec"]["signerName"], crate::certificate::CLIENT_SIGNER);
                        assert_eq!(
                            v["spec"]["usages"],
                            serde_json::json!(["digital signature", "client auth"])
                        );
                        let pem = base64::engine::general_purpose::STANDARD
                            .decode(v["spec"]["request"].as_str().unwrap())
                            .unwrap();
                        let csr = rcgen::CertificateSigningRequestParams::from_pem(
                            std::str::from_utf8(&pem).unwrap(),
                        )
                        .unwrap();
                        let cn = csr
                            .params
                            .distinguished_name
                            .get(&rcgen::DnType::CommonName);
                        assert_eq!(
                            cn,
                            Some(&rcgen::DnValue::Utf8String("system:node:n1".into()))
                        );
                        let issuer = rcgen::Issuer::from_params(&ca.params, &ca.key);
                        *issued.lock().unwrap() = Some(csr.signed_by(&issuer).unwrap().pem());
                        (
                            201,
                            serde_json::json!({"metadata": {"name": "csr-1"}, "spec": v["spec"]}),
                        )
                    }
                    ("GET", p) if p == format!("{CSRS}/csr-1") => {
                        let status = if deny {
                            serde_json::json!({"conditions": [{"type": "Denied", "status": "True", "message": "no"}]})
                        } else {
                            let cert = issued.lock().unwrap().clone().unwrap();
                            serde_json::json!({"certificate": base64::engine::general_purpose::STANDARD.encode(cert)})
                        };
                        (
                            200,
                            serde_json::json!({"metadata": {"name": "csr-1"}, "spec": {"request": "", "signerName": crate::certificate::CLIENT_SIGNER}, "status": status}),
                        )
                    }
                    ("GET", "/version") => (
                        200,
                        serde_json::json!({"major": "1", "minor": "37", "gitVersion": "v1.37.2", "gitCommit": "", "gitTreeState": "", "buildDate": "", "goVersion": "", "compiler": "", "platform": ""}),
                    ),
                    other => panic!("unexpected request {other:?}"),
                };
                Ok::<_, std::convert::Infallible>(
                    hyper::Response::builder()
                        .status(code)
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from(out.to_string())))
                        .unwrap(),
                )
            }
        });
        Client::new(service, "default")
    }

    fn rotation(store: &Path, pem: &str) -> Rotation {
        let (key, from, until) = certified(pem, pem).unwrap();
        let slot = CertSlot::default();
        slot.set(key);
        Rotation {
            slot,
            connections: Connections::default(),
            store: store.to_path_buf(),
            node: "n1".into(),
            from,
            until,
            bootstrap: None,
        }
    }

    #[tokio::test]
    async fn a_due_certificate_is_renewed_stored_linked_and_swapped_and_the_connections_closed() {
        let ca = ca();
        // Due (past 80 % of its life), not expired.
        let old = issue_until(
            &ca,
            Some("system:node:n1"),
            time::OffsetDateTime::now_utc() + time::Duration::hours(1),
        );
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("pki");
        let r = rotation(&store, &old);
        let (slot, connections) = (r.slot.clone(), r.connections.clone());
        let closed = connections.token();
        let paths = Arc::new(Mutex::new(Vec::new()));
        let api = csr_api(ca, false, paths.clone());
        let running = tokio::spawn(r.run(api));
        eventually("the new certificate is in the slot", || {
            slot.get().unwrap().cert != key_of(&old).cert && closed.is_cancelled()
        })
        .await;
        // Not due again for decades: the task waits.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!running.is_finished());
        running.abort();
        let current = std::fs::read_to_string(store.join(CURRENT)).unwrap();
        let (key, _, until) = certified(&current, &current).unwrap();
        assert!(until > Timestamp::now(), "a valid certificate stored");
        assert_eq!(
            key.cert,
            slot.get().unwrap().cert,
            "the stored certificate is the one presented"
        );
        let target = std::fs::read_link(store.join(CURRENT)).unwrap();
        let name = target.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("kubelet-client-2"), "{name}");
        assert_eq!(
            *paths.lock().unwrap(),
            [
                "POST /apis/certificates.k8s.io/v1/certificatesigningrequests",
                "GET /apis/certificates.k8s.io/v1/certificatesigningrequests/csr-1",
            ]
        );
    }

    #[tokio::test]
    async fn an_expired_certificate_that_cannot_be_renewed_ends_the_agent_when_the_server_answers()
    {
        let ca = ca();
        let old = issue(&ca, Some("system:node:n1"), 2021);
        let dir = tempfile::tempdir().unwrap();
        let r = rotation(dir.path(), &old);
        let paths = Arc::new(Mutex::new(Vec::new()));
        let api = csr_api(ca, true, paths.clone());
        let e = tokio::time::timeout(Duration::from_secs(5), r.run(api))
            .await
            .expect("ends at once");
        assert!(
            e.to_string().contains("expired at 2021-01-01T00:00:00Z"),
            "{e}"
        );
        assert_eq!(paths.lock().unwrap().last().unwrap(), "GET /version");
        assert!(!dir.path().join(CURRENT).exists(), "nothing linked");
    }

    #[tokio::test]
    async fn the_bootstrap_runs_in_the_background_then_the_certificate_is_presented() {
        let ca = ca();
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("pki");
        let kubeconfig = dir.path().join("kubelet.conf");
        let paths = Arc::new(Mutex::new(Vec::new()));
        let source =
            kube::config::Kubeconfig::from_yaml(crate::node::bootstrap::tests::BOOTSTRAP).unwrap();
        let pending = Pending::with_client(
            source,
            csr_api(ca, false, paths.clone()),
            &kubeconfig,
            &store,
            "n1",
        );
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let (_client, r) = Rotation::bootstrapping(&config, &store, "n1", pending.clone()).unwrap();
        let (slot, closed) = (r.slot.clone(), r.connections.token());
        assert!(!slot.is_set(), "anonymous until the certificate is issued");
        assert!(!kubeconfig.exists());
        // The agent's own client: the bootstrap must not use it.
        let agent_client = Client::new(
            tower::service_fn({
                let paths = paths.clone();
                move |req: hyper::Request<kube::client::Body>| {
                    paths.lock().unwrap().push(format!(
                        "agent client: {} {}",
                        req.method(),
                        req.uri()
                    ));
                    async { Err::<hyper::Response<Full<Bytes>>, _>(std::io::Error::other("no")) }
                }
            }),
            "default",
        );
        let running = tokio::spawn(r.run(agent_client));
        eventually("the issued certificate is in the slot", || {
            slot.is_set() && closed.is_cancelled()
        })
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!running.is_finished(), "then it waits to renew");
        running.abort();
        assert!(
            crate::node::bootstrap::kubeconfig_usable(&kubeconfig),
            "the node's kubeconfig is written"
        );
        let current = std::fs::read_to_string(store.join(CURRENT)).unwrap();
        assert_eq!(key_of(&current).cert, slot.get().unwrap().cert);
        assert_eq!(
            *paths.lock().unwrap(),
            [
                "POST /apis/certificates.k8s.io/v1/certificatesigningrequests",
                "GET /apis/certificates.k8s.io/v1/certificatesigningrequests/csr-1",
            ]
        );

        // Started again with the certificate stored and the kubeconfig gone:
        // no request, the stored certificate at once, the kubeconfig written.
        std::fs::remove_file(&kubeconfig).unwrap();
        let (_client, r) = Rotation::bootstrapping(&config, &store, "n1", pending).unwrap();
        assert!(r.bootstrap.is_none());
        assert_eq!(key_of(&current).cert, r.slot.get().unwrap().cert);
        assert!(crate::node::bootstrap::kubeconfig_usable(&kubeconfig));
        assert_eq!(paths.lock().unwrap().len(), 2);
    }
}
