//! The node's own API, the kubelet server (pkg/kubelet/server/server.go): HTTPS on
//! `--port` (10250) behind the kubelet's authentication and authorization
//! ([`auth`]), and a plain health endpoint on `127.0.0.1:--healthz-port` (10248).
//!
//! Served so far:
//! - `/healthz`, `/healthz/ping`, `/healthz/log`, `/healthz/syncloop`: `ok`
//!   (`?verbose` lists the checks).
//! - `/configz`: the agent's effective KubeletConfiguration as
//!   `{"kubeletconfig": {…}}`; `/configz/sources`: where each of its
//!   top-level fields came from (a default, the file, a flag, a
//!   `NodeConfiguration`).
//! - `/pods`: the pods bound to this node, a v1 `PodList` from the pod reflector.
//! - `/containerLogs/{namespace}/{pod}/{container}`: the container's CRI log file
//!   with the `PodLogOptions` query ([`logs`]), which is what `kubectl logs` reaches
//!   through the API server's `pods/log`.
//! - `/exec/…`, `/attach/…`, `/portForward/…`: the runtime's streaming server
//!   behind an upgrade-aware proxy ([`stream`]), which is what `kubectl exec`,
//!   `attach` and `port-forward` reach through the API server.
//! - `/stats/summary`: the stats API `Summary` of the node and its pods
//!   ([`crate::stats`]); `?only_cpu_and_memory=true` leaves out the rest.
//! - `/metrics`, `/metrics/probes`: the agent's metrics ([`crate::metrics`]);
//!   `/metrics/resource`: node, pod and container cpu and memory under the
//!   kubelet's resource metric names, which metrics-server scrapes;
//!   `/metrics/cadvisor`: containers' cgroups in cAdvisor's names.
//! - `/statusz` and `/flagz`, the kubelet's beta z-pages ([`zpages`]): when
//!   the agent started, its uptime and versions and the paths of
//!   [`HANDLER_PATHS`]; the flags of `rustlet run` with their values. Text,
//!   or `config.k8s.io/v1beta1` `Statusz`/`Flagz` objects for an `Accept`
//!   that asks for them; 406 for one that asks for something else. Not on
//!   the read-only port, as the kubelet's.
//!
//! Any other path answers 404 `404 page not found` after authorization, as the
//! kubelet's router does.
//!
//! Under abuse ([`Limits`]): a connection must finish its TLS handshake and
//! send its first request head within 10 s of being accepted; one without a
//! request in flight is closed after 90 s (the kubelet's `IdleTimeout`; for
//! HTTP/1.1 this is also how long a later request head may take); request
//! heads are limited to 1 MiB (the kubelet's `MaxHeaderBytes`, 431 past
//! it); an HTTP/2 connection carries at most 250 streams at once (Go's
//! default, which the kubelet keeps); connections beyond 4096 are closed as
//! they are accepted. At most 1024 connections may be open without having
//! authenticated (a verified client certificate, or a request let through
//! by the auth filter): a newer one closes the oldest of them, so a flood
//! never keeps out the API server's connections. A write that waits 60 s
//! for the client (its socket full, or an HTTP/2 flow-control window it
//! never opens) ends the connection. At most 256 logs are followed and 512
//! exec/attach/port-forward streams are open at once, 64 and 128 of them in
//! one namespace; at most 100 token reviews and 100 access reviews wait for
//! the agent's rate-limited API client; every refusal is 429 with
//! `Retry-After`. Followed logs are
//! read on the async runtime, not on blocking threads.
//! [`raise_open_files_limit`] lifts the agent's open-file limit at start as
//! the kubelet does with `maxOpenFiles`.

pub mod auth;
pub mod csr;
mod fair;
pub mod logs;
pub mod stream;
pub mod tls;
pub mod zpages;

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use futures::StreamExt as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::net::TcpListener;
use tower::ServiceExt as _;
use tracing::{debug, info, warn};

pub use tls::ServingCert;

/// Errors starting or running the node API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The serving certificate, its key or the client CA are unusable.
    #[error(transparent)]
    Tls(#[from] tls::Error),
    /// A listening socket could not be opened.
    #[error("listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The local health endpoint stopped.
    #[error("serve health endpoint on {addr}: {source}")]
    Healthz {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Result of the node API.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How the node API is served.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The node's name: the `nodes/<name>` that requests are authorized against.
    pub node_name: String,
    /// Address of the HTTPS server (`address`, 0.0.0.0).
    pub address: IpAddr,
    /// Port of the HTTPS server (`port`, 10250; 0 picks a free one).
    pub port: u16,
    /// Address of the plain health endpoint (`healthzBindAddress`, 127.0.0.1).
    pub healthz_address: IpAddr,
    /// Port of the plain health endpoint (`healthzPort`, 10248); `None` disables it.
    pub healthz_port: Option<u16>,
    /// Port of the read-only API on `address` (`readOnlyPort`; `None`, the
    /// kubelet's 0, disables it): plain HTTP, unauthenticated, only
    /// `/healthz`, `/pods`, `/stats/summary` and the metrics, as the
    /// kubelet's read-only server (`InstallDefaultHandlers`).
    pub read_only_port: Option<u16>,
    /// The serving certificate.
    pub serving_cert: ServingCert,
    /// PEM bundle of CAs that client certificates are verified against
    /// (`authentication.x509.clientCAFile`); without it only bearer tokens authenticate.
    pub client_ca_file: Option<PathBuf>,
    /// Which of the certificate files are reloaded when they change.
    pub reload: tls::Reload,
    /// Directory of pod logs (`podLogsDir`, `/var/log/pods`).
    pub pod_logs_dir: PathBuf,
    /// The agent's other effective KubeletConfiguration fields, shown by
    /// `/configz` with this server's own, and where each came from, shown
    /// by `/configz/sources`; the latest value is shown (a
    /// `NodeConfiguration` applied changes it).
    pub kubelet_config: tokio::sync::watch::Receiver<crate::config::Effective>,
    /// The image credential providers in effect (flags, hash, providers),
    /// shown by `/configz` beside `kubeletconfig` as
    /// `imageCredentialProviders`: they are flags, no KubeletConfiguration
    /// field.
    pub credential_providers: Option<serde_json::Value>,
    /// How long token and access reviews are cached.
    pub auth_ttls: auth::CacheTtls,
    /// Timeouts and caps of connections and requests.
    pub limits: Limits,
    /// When the agent started, shown by `/statusz` (defaults to when this
    /// configuration was made).
    pub started: Timestamp,
    /// The agent's flags by name with their values as `/flagz` shows them
    /// (secrets already replaced); empty by default.
    pub flags: BTreeMap<String, String>,
}

/// The paths of the node API's handlers that the kubelet registers on its
/// container directly rather than as REST web services (`Handle`), the
/// z-pages among them: what `/statusz` lists, as first segments
/// ([`zpages::aggregate_paths`]). The kubelet's also have `/debug` (pprof
/// and `/debug/flags/v`), which this agent does not serve; `/pods`,
/// `/stats`, `/containerLogs`, `/exec` and the other web services are not
/// listed by the kubelet either.
pub const HANDLER_PATHS: &[&str] = &[
    "/healthz",
    "/healthz/ping",
    "/healthz/log",
    "/healthz/syncloop",
    "/metrics",
    "/metrics/cadvisor",
    "/metrics/resource",
    "/metrics/probes",
    "/configz",
    "/flagz",
];

/// Timeouts and caps that keep the node API serving under abuse, and fair
/// to its clients (docs/security.md, "The node API under abuse", lists
/// each beside the kubelet's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// From accept to a connection's first request head, its TLS handshake
    /// included (10 s): a connection that sends no request within it is
    /// closed. The kubelet's Go server allows its 4 h read timeout.
    pub first_request_timeout: Duration,
    /// A connection without a request in flight is closed after this long
    /// (the kubelet's `IdleTimeout`, 90 s); an HTTP/2 connection gets a GOAWAY.
    pub idle_timeout: Duration,
    /// How long an HTTP/1.1 request head may take to arrive, counted from
    /// when the connection waits for it (90 s: hyper starts this timer when
    /// a kept-alive connection goes idle, so it is no shorter than the idle
    /// timeout; the kubelet allows 4 h).
    pub header_read_timeout: Duration,
    /// How long one write may wait for the client to take bytes, HTTP/2
    /// flow control included (60 s): a connection whose socket stays full,
    /// or whose response bodies wait that long for a flow-control window
    /// while none of its other responses moves, is closed. Upgraded streams
    /// are sockets too. The kubelet has a 4 h `WriteTimeout` on a whole
    /// response and none on a write.
    pub write_timeout: Duration,
    /// The largest request head, in bytes (the kubelet's `MaxHeaderBytes`,
    /// 1 MiB); a larger HTTP/1.1 head is answered 431.
    pub max_header_bytes: usize,
    /// Connections served at once (4096; the kubelet has no cap); more are
    /// closed as they are accepted, before TLS, so unanswered.
    pub max_connections: usize,
    /// Connections open at once that have not authenticated (1024, a
    /// quarter of [`Limits::max_connections`]; the kubelet has no such
    /// cap): in their handshake, or without a verified client certificate
    /// and with no request yet authenticated and authorized. A new
    /// connection beyond it closes the oldest of them, so connections that
    /// authenticate (the API server's client certificate) always get in.
    pub max_unauthenticated: usize,
    /// Streams one HTTP/2 connection may have open at once (250, Go's
    /// default `MaxConcurrentStreams`).
    pub max_concurrent_streams: u32,
    /// Container logs followed at once on the node (256; the kubelet has no
    /// cap); more are answered 429 with `Retry-After: 1`.
    pub max_log_follows: usize,
    /// Container logs followed at once in one namespace (64, a quarter of
    /// the node's; the kubelet has no cap); more are answered 429 with
    /// `Retry-After: 1`.
    pub max_log_follows_per_namespace: usize,
    /// Upgraded exec, attach and port-forward streams open at once on the
    /// node (512; neither the kubelet nor the runtime's streaming server
    /// has a cap); more are answered 429 with `Retry-After: 1` before the
    /// runtime is asked.
    pub max_streams: usize,
    /// Upgraded streams open at once in one namespace (128, a quarter of
    /// the node's); more are answered 429 with `Retry-After: 1`.
    pub max_streams_per_namespace: usize,
    /// Token reviews waiting for the API server at once
    /// ([`auth::MAX_TOKEN_REVIEWS`], 100, the kubelet's `kubeAPIBurst`; the
    /// kubelet queues them without bound); a request whose token would be
    /// one more is answered 429 with `Retry-After: 1`.
    pub max_token_reviews: usize,
    /// Access reviews waiting for the API server at once
    /// ([`auth::MAX_ACCESS_REVIEWS`], 100), apart from token reviews; more
    /// are answered 429 with `Retry-After: 1`.
    pub max_access_reviews: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            first_request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(90),
            header_read_timeout: Duration::from_secs(90),
            write_timeout: Duration::from_secs(60),
            max_header_bytes: 1 << 20,
            max_connections: 4096,
            max_unauthenticated: 1024,
            max_concurrent_streams: 250,
            max_log_follows: 256,
            max_log_follows_per_namespace: 64,
            max_streams: 512,
            max_streams_per_namespace: 128,
            max_token_reviews: auth::MAX_TOKEN_REVIEWS,
            max_access_reviews: auth::MAX_ACCESS_REVIEWS,
        }
    }
}

impl ServerConfig {
    /// The kubelet's defaults for node `node_name` with IPs `node_ips`: HTTPS on
    /// 0.0.0.0:10250 with a self-signed certificate kept in `cert_dir`, health on
    /// 127.0.0.1:10248, no client CA.
    #[must_use]
    pub fn new(
        node_name: &str,
        node_ips: Vec<IpAddr>,
        cert_dir: PathBuf,
        pod_logs_dir: PathBuf,
    ) -> Self {
        Self {
            node_name: node_name.to_string(),
            address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            port: 10250,
            healthz_address: IpAddr::V4(Ipv4Addr::LOCALHOST),
            healthz_port: Some(10248),
            read_only_port: None,
            serving_cert: ServingCert::SelfSigned {
                dir: cert_dir,
                names: vec![node_name.to_string()],
                ips: node_ips,
            },
            client_ca_file: None,
            reload: tls::Reload::default(),
            pod_logs_dir,
            kubelet_config: tokio::sync::watch::channel(crate::config::Effective::default()).1,
            credential_providers: None,
            auth_ttls: auth::CacheTtls::default(),
            limits: Limits::default(),
            started: Timestamp::now(),
            flags: BTreeMap::new(),
        }
    }
}

/// What the node API reads and asks.
#[derive(Clone)]
pub struct Deps {
    /// The agent's API client for token and subject access reviews: its one
    /// rate-limited client (`kubeAPIQPS`/`kubeAPIBurst`,
    /// [`crate::throttle::throttled`]), never the unthrottled heartbeat
    /// client, so that a flood of requests to the node API cannot push the
    /// API server harder than the agent itself may.
    pub client: Client,
    /// The pods bound to this node (the pod controller's reflector store).
    pub pods: Store<Pod>,
    /// The status manager: a pod the watch has not yet brought back since
    /// its last status patch is shown with the status sent, as the kubelet's
    /// handlers read its status manager's cache.
    pub statuses: Arc<crate::pod::status_manager::StatusManager>,
    /// Each pod's last sync, explained (`/debug/pods/<ns>/<pod>/plan`).
    pub explanations: Arc<crate::pod::explain::Explanations>,
    /// The container runtime: streaming URLs and container lookups.
    pub runtime: crate::cri::Runtime,
    /// Resource statistics for `/stats/summary` and `/metrics/resource`
    /// (the agent keeps its cpu rates fresh with [`crate::stats::Provider::sample`]).
    pub stats: Arc<crate::stats::Provider>,
}

impl std::fmt::Debug for Deps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deps").finish_non_exhaustive()
    }
}

/// How often a followed log file is checked for new lines and its container for
/// having stopped (the runtime's log reader waits for a file event or at most 1 s).
const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// The kubelet's default `maxOpenFiles`.
pub const MAX_OPEN_FILES: u64 = 1_000_000;

/// Raises the process's open-file limit (`RLIMIT_NOFILE`) as the kubelet does
/// at start with `maxOpenFiles`: soft and hard limit to `want` when allowed
/// (that needs `CAP_SYS_RESOURCE` past the hard limit), otherwise the soft
/// limit to the hard one. Never lowers a limit. Returns the soft limit now in
/// force.
///
/// # Errors
/// The `setrlimit` error when not even the soft limit can be raised.
pub fn raise_open_files_limit(want: u64) -> std::io::Result<u64> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let now = getrlimit(Resource::Nofile);
    let soft = now.current.unwrap_or(u64::MAX);
    let hard = now.maximum.unwrap_or(u64::MAX);
    if hard < want {
        let both = Rlimit {
            current: Some(want),
            maximum: Some(want),
        };
        if setrlimit(Resource::Nofile, both).is_ok() {
            return Ok(want);
        }
    }
    // An unlimited hard limit cannot be the soft one (the kernel caps open
    // files at fs.nr_open): take the kubelet's number then.
    let target = if now.maximum.is_none() { want } else { hard };
    if soft >= target {
        return Ok(soft);
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(target),
            maximum: now.maximum,
        },
    )?;
    Ok(target)
}

struct App {
    /// True once the server drains: followed logs and proxied streams end.
    draining: tokio::sync::watch::Receiver<bool>,
    /// Followed logs, per node and per namespace
    /// ([`Limits::max_log_follows`], [`Limits::max_log_follows_per_namespace`]).
    follows: Arc<fair::Quota>,
    /// Upgraded exec, attach and port-forward streams, per node and per
    /// namespace ([`Limits::max_streams`], [`Limits::max_streams_per_namespace`]).
    streams: Arc<fair::Quota>,
    /// The server's own `/configz` fields ([`configz`]).
    configz: serde_json::Value,
    /// The agent's effective KubeletConfiguration and its sources, as they
    /// change.
    kubelet_config: tokio::sync::watch::Receiver<crate::config::Effective>,
    /// What `/statusz` shows.
    status: zpages::Status,
    /// The flags `/flagz` shows.
    flags: BTreeMap<String, String>,
    /// The delimiter of the text `/flagz`, picked once (the kubelet renders
    /// that page once and keeps it).
    flagz_delimiter: &'static str,
    pods: Store<Pod>,
    statuses: Arc<crate::pod::status_manager::StatusManager>,
    explanations: Arc<crate::pod::explain::Explanations>,
    runtime: crate::cri::Runtime,
    pod_logs_dir: PathBuf,
    stats: Arc<crate::stats::Provider>,
}

impl App {
    /// The pod `oref` with the status this agent last sent for it.
    fn pod(&self, oref: &ObjectRef<Pod>) -> Option<Arc<Pod>> {
        self.pods
            .get(oref)
            .map(|p| self.statuses.with_sent_status(p))
    }

    /// Every pod bound to this node, each with the status last sent.
    fn all_pods(&self) -> Vec<Arc<Pod>> {
        self.pods
            .state()
            .into_iter()
            .map(|p| self.statuses.with_sent_status(p))
            .collect()
    }
}

/// The node API with its sockets open, ready to [`run`](Self::run).
pub struct Server {
    /// Set when the server starts draining ([`Server::run_until`]).
    draining: tokio::sync::watch::Sender<bool>,
    listener: TcpListener,
    healthz: Option<TcpListener>,
    /// The read-only API's socket and routes.
    read_only: Option<(TcpListener, Router)>,
    /// The TLS configuration, reloaded from its files as they change.
    tls: Arc<tls::ReloadingConfig>,
    router: Router,
    limits: Limits,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.listener.local_addr().ok())
            .finish_non_exhaustive()
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })
}

impl Server {
    /// Loads TLS material (generating the self-signed pair if needed) and opens
    /// both sockets.
    ///
    /// # Errors
    /// [`Error::Tls`] for unusable certificate files, [`Error::Bind`] for a port in use.
    pub async fn bind(cfg: ServerConfig, deps: Deps) -> Result<Self> {
        let tls = Arc::new(tls::ReloadingConfig::new(
            cfg.serving_cert.clone(),
            cfg.client_ca_file.clone(),
            cfg.reload,
        )?);
        tokio::spawn(tls::ReloadingConfig::watch(Arc::downgrade(&tls)));
        let listener = bind(SocketAddr::new(cfg.address, cfg.port)).await?;
        let healthz = match cfg.healthz_port {
            Some(port) => Some(bind(SocketAddr::new(cfg.healthz_address, port)).await?),
            None => None,
        };
        let auth = Arc::new(
            auth::Auth::with_ttls(deps.client, cfg.node_name.clone(), cfg.auth_ttls)
                .with_review_caps(cfg.limits.max_token_reviews, cfg.limits.max_access_reviews),
        );
        let (draining, draining_rx) = tokio::sync::watch::channel(false);
        let limits = cfg.limits;
        let app = Arc::new(App {
            draining: draining_rx.clone(),
            follows: fair::Quota::new(limits.max_log_follows, limits.max_log_follows_per_namespace),
            streams: fair::Quota::new(limits.max_streams, limits.max_streams_per_namespace),
            configz: configz(&cfg),
            kubelet_config: cfg.kubelet_config.clone(),
            status: zpages::Status::new(cfg.started, HANDLER_PATHS),
            flags: cfg.flags,
            flagz_delimiter: zpages::random_delimiter(),
            pods: deps.pods,
            statuses: deps.statuses,
            explanations: deps.explanations,
            stats: deps.stats,
            runtime: deps.runtime,
            pod_logs_dir: cfg.pod_logs_dir,
        });
        let read_only = match cfg.read_only_port {
            Some(port) => {
                let l = bind(SocketAddr::new(cfg.address, port)).await?;
                let routes = Router::new()
                    .merge(healthz_routes(draining_rx.clone()))
                    .route("/pods", get(pods))
                    .route("/pods/", get(pods))
                    .route("/metrics", get(metrics))
                    .route("/metrics/probes", get(probe_metrics))
                    .route("/metrics/resource", get(resource_metrics))
                    .route("/metrics/cadvisor", get(cadvisor_metrics))
                    .route("/stats/summary", get(stats_summary))
                    .fallback(not_found)
                    .with_state(app.clone());
                Some((l, routes))
            }
            None => None,
        };
        let router = Router::new()
            .merge(healthz_routes(draining_rx))
            .route("/configz", get(configz_handler))
            .route("/configz/sources", get(configz_sources))
            .route("/flagz", any(flagz))
            .route("/statusz", any(statusz))
            .route("/pods", get(pods))
            .route("/pods/", get(pods))
            .route("/metrics", get(metrics))
            .route("/metrics/probes", get(probe_metrics))
            .route("/metrics/resource", get(resource_metrics))
            .route("/metrics/cadvisor", get(cadvisor_metrics))
            .route("/stats/summary", get(stats_summary))
            .route(
                "/containerLogs/{namespace}/{pod}/{container}",
                get(container_logs),
            )
            .route("/debug/pods/{namespace}/{pod}/plan", get(pod_plan))
            .route(
                "/exec/{namespace}/{pod}/{container}",
                get(stream::exec).post(stream::exec),
            )
            .route(
                "/exec/{namespace}/{pod}/{uid}/{container}",
                get(stream::exec).post(stream::exec),
            )
            .route(
                "/attach/{namespace}/{pod}/{container}",
                get(stream::attach).post(stream::attach),
            )
            .route(
                "/attach/{namespace}/{pod}/{uid}/{container}",
                get(stream::attach).post(stream::attach),
            )
            .route(
                "/portForward/{namespace}/{pod}",
                get(stream::port_forward).post(stream::port_forward),
            )
            .route(
                "/portForward/{namespace}/{pod}/{uid}",
                get(stream::port_forward).post(stream::port_forward),
            )
            .fallback(not_found)
            .with_state(app)
            .layer(axum::middleware::from_fn_with_state(auth, auth::filter));
        Ok(Self {
            draining,
            listener,
            healthz,
            read_only,
            tls,
            router,
            limits,
        })
    }

    /// The address of the HTTPS server.
    ///
    /// # Errors
    /// As `getsockname`.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The address of the plain health endpoint, if served.
    #[must_use]
    pub fn healthz_addr(&self) -> Option<SocketAddr> {
        self.healthz.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until the task is dropped. Failed handshakes and connections are
    /// logged at debug level and do not stop the server.
    ///
    /// # Errors
    /// [`Error::Healthz`] when the health endpoint stops.
    pub async fn run(self) -> Result<()> {
        self.run_until(std::future::pending()).await
    }

    /// Serves until `stop` completes, then drains: no new connections are
    /// accepted, `/healthz` answers 500 (`[-]syncloop failed`), followed logs
    /// end as if their container had stopped and proxied exec/attach/
    /// port-forward streams are closed on both sides; in-flight requests get up
    /// to [`DRAIN`] to finish before their connections are dropped.
    ///
    /// # Errors
    /// [`Error::Healthz`] when the health endpoint stops before `stop`.
    pub async fn run_until(self, stop: impl Future<Output = ()>) -> Result<()> {
        let Self {
            draining,
            listener,
            healthz,
            read_only,
            tls,
            router,
            limits,
        } = self;
        let read_only = read_only.map(|(l, routes)| {
            if let Ok(addr) = l.local_addr() {
                info!(%addr, "serving the read-only API (plain HTTP, unauthenticated)");
            }
            tokio::spawn(serve_plain(l, routes, limits, draining.subscribe()))
        });
        if let Ok(addr) = listener.local_addr() {
            info!(%addr, "serving the node API");
        }
        let mut healthz = tokio::spawn({
            let routes = healthz_routes(draining.subscribe());
            async move {
                let Some(l) = healthz else {
                    return std::future::pending().await;
                };
                let addr = l.local_addr().map_err(|source| Error::Healthz {
                    addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
                    source,
                })?;
                info!(%addr, "serving the health endpoint");
                axum::serve(l, routes)
                    .await
                    .map_err(|source| Error::Healthz { addr, source })
            }
        });
        // One permit per open connection; all of them back means all are closed.
        let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
        let unauthenticated = fair::Unauthenticated::new(limits.max_unauthenticated);
        let mut refused: u64 = 0;
        tokio::pin!(stop);
        let result = loop {
            tokio::select! {
                () = &mut stop => break Ok(()),
                r = &mut healthz => break match r {
                    Ok(r) => r,
                    Err(e) => Err(Error::Healthz {
                        addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
                        source: std::io::Error::other(e),
                    }),
                },
                accepted = listener.accept() => match accepted {
                    Ok((tcp, peer)) => {
                        let Some(slot) = take_slot(&slots, &mut refused, peer, limits.max_connections) else {
                            // Full: close it now rather than let it wait.
                            drop(tcp);
                            continue;
                        };
                        let accepted = Accepted {
                            peer,
                            at: tokio::time::Instant::now(),
                            ticket: Some(unauthenticated.admit()),
                            slot,
                        };
                        tokio::spawn(connection(
                            tokio_rustls::TlsAcceptor::from(tls.current()),
                            router.clone(),
                            tcp,
                            accepted,
                            limits,
                            draining.subscribe(),
                        ));
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: back off a little.
                        warn!(error = %e, "accept");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        };
        drop(listener);
        draining.send_replace(true);
        info!("draining the node API");
        let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
        if tokio::time::timeout(DRAIN, slots.acquire_many(all))
            .await
            .is_err()
        {
            warn!(
                seconds = DRAIN.as_secs(),
                "node API connections still open after the drain; dropping them"
            );
        }
        healthz.abort();
        if let Some(t) = read_only {
            t.abort();
        }
        result
    }

    /// The address of the read-only API, if served.
    #[must_use]
    pub fn read_only_addr(&self) -> Option<SocketAddr> {
        self.read_only
            .as_ref()
            .and_then(|(l, _)| l.local_addr().ok())
    }
}

/// A place among the `max` open connections for one from `peer`, or None
/// when all are taken: the connection is to be closed at once; `refused`
/// counts those, and every power of two of them is logged.
fn take_slot(
    slots: &Arc<tokio::sync::Semaphore>,
    refused: &mut u64,
    peer: SocketAddr,
    max: usize,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    let slot = slots.clone().try_acquire_owned().ok();
    if slot.is_none() {
        *refused = refused.saturating_add(1);
        if refused.is_power_of_two() {
            warn!(
                %peer,
                max,
                refused = *refused,
                "node API connection limit reached; closing new connections"
            );
        }
    }
    slot
}

/// Serves `routes` in plain HTTP on `listener` under the node API's
/// `limits` (connections, header and idle timeouts, concurrent streams)
/// until the task is aborted; connections close as the server drains.
async fn serve_plain(
    listener: TcpListener,
    routes: Router,
    limits: Limits,
    draining: tokio::sync::watch::Receiver<bool>,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let mut refused: u64 = 0;
    loop {
        match listener.accept().await {
            Ok((tcp, peer)) => {
                let Some(slot) = take_slot(&slots, &mut refused, peer, limits.max_connections)
                else {
                    drop(tcp);
                    continue;
                };
                // Nothing authenticates here: no pool to wait in.
                let accepted = Accepted {
                    peer,
                    at: tokio::time::Instant::now(),
                    ticket: None,
                    slot,
                };
                tokio::spawn(serve_connection(
                    tcp,
                    false,
                    auth::PeerCert(None),
                    routes.clone(),
                    accepted,
                    limits,
                    draining.clone(),
                ));
            }
            Err(e) => {
                warn!(error = %e, "accept (read-only API)");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// How long in-flight requests of the node API may take to finish once it
/// drains (seconds).
pub const DRAIN: Duration = Duration::from_secs(5);

/// Counts a connection's requests in flight: each holds a [`Busy`] until its
/// response body is done.
#[derive(Clone)]
struct InFlight(Arc<tokio::sync::watch::Sender<usize>>);

/// One request in flight on a connection.
struct Busy(Arc<tokio::sync::watch::Sender<usize>>);

impl InFlight {
    fn new() -> Self {
        Self(Arc::new(tokio::sync::watch::channel(0).0))
    }

    fn begin(&self) -> Busy {
        self.0.send_modify(|n| *n = n.saturating_add(1));
        Busy(self.0.clone())
    }

    /// Completes once no request has been in flight for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        let mut rx = self.0.subscribe();
        loop {
            if rx.wait_for(|n| *n == 0).await.is_err() {
                return;
            }
            // Any change (a request starting) restarts the wait.
            if tokio::time::timeout(timeout, rx.changed()).await.is_err() {
                return;
            }
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Completes once the server drains.
async fn drained(mut draining: tokio::sync::watch::Receiver<bool>) {
    let _ = draining.wait_for(|d| *d).await;
}

/// The hyper connection settings of [`Limits`]: the protocol the TLS
/// handshake agreed on (ALPN `h2`, else HTTP/1.1), the header size and read
/// timeout, the HTTP/2 stream cap.
fn conn_builder(
    limits: &Limits,
    h2: bool,
) -> hyper_util::server::conn::auto::Builder<TokioExecutor> {
    use hyper_util::rt::TokioTimer;
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // hyper's smallest read buffer is 8 KiB.
        .max_buf_size(limits.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    if h2 {
        builder.http2_only()
    } else {
        builder.http1_only()
    }
}

/// A connection as accepted: who from, when, its place in the pool of
/// connections that have not authenticated yet (none where nothing
/// authenticates), and its place among the open connections.
struct Accepted {
    peer: SocketAddr,
    at: tokio::time::Instant,
    ticket: Option<fair::Ticket>,
    slot: tokio::sync::OwnedSemaphorePermit,
}

impl Accepted {
    /// When the first request head must have arrived.
    fn first_request_by(&self, limits: &Limits) -> tokio::time::Instant {
        self.at + limits.first_request_timeout
    }

    /// Completes when the pool of unauthenticated connections closes this
    /// one to make room; never once it has authenticated.
    fn evicted(&self) -> impl Future<Output = ()> + use<> {
        let closed = self.ticket.as_ref().map(fair::Ticket::closed);
        async move {
            match closed {
                Some(c) => c.cancelled_owned().await,
                None => std::future::pending().await,
            }
        }
    }
}

/// The TLS side of one node API connection: the handshake (within the
/// first-request deadline, unless the pool of unauthenticated connections
/// closes it first), then [`serve_connection`]; a verified client
/// certificate takes the connection out of that pool.
async fn connection(
    acceptor: tokio_rustls::TlsAcceptor,
    router: Router,
    tcp: tokio::net::TcpStream,
    mut accepted: Accepted,
    limits: Limits,
    draining: tokio::sync::watch::Receiver<bool>,
) {
    let peer = accepted.peer;
    let handshake =
        tokio::time::timeout_at(accepted.first_request_by(&limits), acceptor.accept(tcp));
    let tls = tokio::select! {
        r = handshake => match r {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                debug!(%peer, error = %e, "TLS handshake");
                return;
            }
            Err(_) => {
                debug!(%peer, "TLS handshake timed out");
                return;
            }
        },
        () = accepted.evicted() => {
            debug!(%peer, "closing a connection still in its TLS handshake to make room");
            return;
        }
    };
    let (_, session) = tls.get_ref();
    let h2 = session.alpn_protocol() == Some(b"h2");
    let cert = auth::PeerCert(
        session
            .peer_certificates()
            .and_then(|c| c.first())
            .and_then(|c| auth::cert_user(c)),
    );
    if cert.0.is_some() {
        // Authenticated by its certificate.
        accepted.ticket = None;
    }
    serve_connection(tls, h2, cert, router, accepted, limits, draining).await;
}

/// Serves one connection `io` (HTTP/2 when `h2`, else HTTP/1.1 with
/// upgrades) with `router`, its requests carrying the client certificate's
/// user `cert` and the connection's [`fair::Admission`]. Closes it when idle
/// for the limit or when the server drains; drops it when no request came
/// by the first-request deadline, when a write waited past the write
/// deadline, or when the pool of unauthenticated connections makes room.
async fn serve_connection<I>(
    io: I,
    h2: bool,
    cert: auth::PeerCert,
    router: Router,
    accepted: Accepted,
    limits: Limits,
    draining: tokio::sync::watch::Receiver<bool>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let peer = accepted.peer;
    let first_request_by = accepted.first_request_by(&limits);
    let evicted = accepted.evicted();
    let Accepted {
        ticket,
        slot: _slot,
        ..
    } = accepted;
    let admission = fair::Admission::waiting(ticket);
    let in_flight = InFlight::new();
    let writes = fair::WriteWatch::new();
    // Cancelled by the first request.
    let first = tokio_util::sync::CancellationToken::new();
    let svc = hyper::service::service_fn({
        let (in_flight, writes, first) = (in_flight.clone(), writes.clone(), first.clone());
        move |mut req: hyper::Request<hyper::body::Incoming>| {
            first.cancel();
            let busy = in_flight.begin();
            req.extensions_mut().insert(cert.clone());
            req.extensions_mut().insert(admission.clone());
            let resp = router.clone().oneshot(req);
            let writes = writes.clone();
            async move {
                let resp = resp.await?;
                // Busy until the body is sent (or dropped); its writes watched.
                Ok::<_, Infallible>(resp.map(|b| fair::Watched::new(b, writes, busy)))
            }
        }
    });
    let builder = conn_builder(&limits, h2);
    let io = fair::WriteDeadline::new(io, limits.write_timeout);
    let io = TokioIo::new(if h2 { io } else { io.relieving(writes.clone()) });
    let conn = builder.serve_connection_with_upgrades(io, svc);
    tokio::pin!(conn);
    let idle = in_flight.idle_for(limits.idle_timeout);
    tokio::pin!(idle);
    let drain = drained(draining);
    tokio::pin!(drain);
    let no_first_request = async {
        tokio::select! {
            () = first.cancelled() => std::future::pending().await,
            () = tokio::time::sleep_until(first_request_by) => {}
        }
    };
    tokio::pin!(no_first_request);
    tokio::pin!(evicted);
    let stalled = writes.stalled(limits.write_timeout);
    tokio::pin!(stalled);
    let mut closing = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    debug!(%peer, error = %e, "connection");
                }
                return;
            }
            () = &mut no_first_request => {
                debug!(%peer, "closing a connection that sent no request in time");
                return;
            }
            () = &mut evicted => {
                debug!(%peer, "closing an unauthenticated connection to make room");
                return;
            }
            () = &mut stalled => {
                debug!(%peer, "closing a connection whose client takes no response bytes");
                return;
            }
            () = &mut idle, if !closing => {
                debug!(%peer, "closing an idle connection");
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            () = &mut drain, if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// Starts the node API and serves until the task is dropped: [`Server::bind`]
/// then [`Server::run`].
///
/// # Errors
/// See [`Server::bind`] and [`Server::run`].
pub async fn serve(cfg: ServerConfig, deps: Deps) -> Result<()> {
    Server::bind(cfg, deps).await?.run().await
}

/// Starts the node API and serves until `stop` completes, then drains it:
/// [`Server::bind`] then [`Server::run_until`].
///
/// # Errors
/// See [`Server::bind`] and [`Server::run_until`].
pub async fn serve_until(
    cfg: ServerConfig,
    deps: Deps,
    stop: impl Future<Output = ()>,
) -> Result<()> {
    Server::bind(cfg, deps).await?.run_until(stop).await
}

/// A refusal for want of room: 429 with `Retry-After: 1` (seconds) and
/// `message`.
fn too_many(message: impl Into<String>) -> Response {
    let mut resp = text(StatusCode::TOO_MANY_REQUESTS, message);
    resp.headers_mut()
        .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    resp
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body.into(),
    )
        .into_response()
}

async fn not_found() -> Response {
    text(StatusCode::NOT_FOUND, "404 page not found\n")
}

/// The kubelet's health checks; all pass while the agent serves, and
/// `syncloop` fails once the node API drains on the way out.
const HEALTH_CHECKS: [&str; 3] = ["ping", "log", "syncloop"];

/// Whether the node API drains, for the health checks.
#[derive(Clone)]
struct Draining(tokio::sync::watch::Receiver<bool>);

fn healthz_routes<S: Clone + Send + Sync + 'static>(
    draining: tokio::sync::watch::Receiver<bool>,
) -> Router<S> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/healthz/{check}", get(healthz_check))
        .layer(axum::Extension(Draining(draining)))
}

/// The checks that fail now: `syncloop` while draining.
fn failing(draining: &Draining) -> &'static [&'static str] {
    if *draining.0.borrow() {
        &["syncloop"]
    } else {
        &[]
    }
}

/// `/healthz` as the apiserver's healthz handler: `ok`, or with `?verbose`
/// every check; when a check fails, 500 with every check and
/// `healthz check failed` (the reason withheld).
async fn healthz(
    axum::Extension(draining): axum::Extension<Draining>,
    RawQuery(q): RawQuery,
) -> Response {
    let verbose = q
        .as_deref()
        .is_some_and(|q| form_urlencoded::parse(q.as_bytes()).any(|(k, _)| k == "verbose"));
    let failed = failing(&draining);
    let checks: String = HEALTH_CHECKS
        .iter()
        .map(|c| {
            if failed.contains(c) {
                format!("[-]{c} failed: reason withheld\n")
            } else {
                format!("[+]{c} ok\n")
            }
        })
        .collect();
    if !failed.is_empty() {
        text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("{checks}healthz check failed\n"),
        )
    } else if verbose {
        text(StatusCode::OK, format!("{checks}healthz check passed\n"))
    } else {
        text(StatusCode::OK, "ok")
    }
}

async fn healthz_check(
    axum::Extension(draining): axum::Extension<Draining>,
    Path(check): Path<String>,
) -> Response {
    if !HEALTH_CHECKS.contains(&check.as_str()) {
        text(StatusCode::NOT_FOUND, "404 page not found\n")
    } else if failing(&draining).contains(&check.as_str()) {
        text(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal server error: the node agent is shutting down\n",
        )
    } else {
        text(StatusCode::OK, "ok")
    }
}

/// `/metrics`: the agent's Prometheus metrics ([`crate::metrics`]), with the
/// running pod and container gauges taken from the pods' reported statuses.
async fn metrics(State(app): State<Arc<App>>) -> Response {
    let m = crate::metrics::metrics();
    let pods = app.all_pods();
    let mut states: HashMap<String, usize> = HashMap::new();
    let mut running_pods = 0;
    for pod in &pods {
        let Some(status) = &pod.status else { continue };
        if status.phase.as_deref() == Some(crate::reasons::phase::RUNNING) {
            running_pods += 1;
        }
        let all = [
            &status.init_container_statuses,
            &status.container_statuses,
            &status.ephemeral_container_statuses,
        ];
        for cs in all.into_iter().flatten().flatten() {
            let state = cs.state.as_ref().map_or("unknown", |s| {
                if s.running.is_some() {
                    "running"
                } else if s.terminated.is_some() {
                    "exited"
                } else {
                    "created"
                }
            });
            *states.entry(state.to_string()).or_default() += 1;
        }
    }
    m.set_running(running_pods, &states.into_iter().collect::<Vec<_>>());
    match m.encode() {
        Ok(body) => ([(header::CONTENT_TYPE, OPENMETRICS)], body).into_response(),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}"),
        ),
    }
}

/// `/metrics/probes`: `prober_probe_total` by probe type, result and container.
async fn probe_metrics() -> Response {
    match crate::metrics::metrics().encode_probes() {
        Ok(body) => ([(header::CONTENT_TYPE, OPENMETRICS)], body).into_response(),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}"),
        ),
    }
}

/// `/metrics/resource`: the node's, pods' and containers' cpu and working
/// set from the stats summary (the kubelet's resource metrics collector);
/// `resource_scrape_error 1` alone when the stats cannot be gathered.
async fn resource_metrics(State(app): State<Arc<App>>) -> Response {
    let summary = match app.stats.summary(true).await {
        Ok(s) => Some(s),
        Err(e) => {
            warn!(error = %e, "resource metrics");
            None
        }
    };
    match crate::stats::summary::resource_metrics(summary.as_ref()) {
        Ok(body) => ([(header::CONTENT_TYPE, OPENMETRICS)], body).into_response(),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}"),
        ),
    }
}

/// `/metrics/cadvisor`: each running container's and sandbox's cgroup in
/// cAdvisor's metric names ([`crate::stats::Provider::cadvisor_metrics`]).
async fn cadvisor_metrics(State(app): State<Arc<App>>) -> Response {
    match app.stats.cadvisor_metrics().await {
        Ok(body) => ([(header::CONTENT_TYPE, OPENMETRICS)], body).into_response(),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("encoding metrics: {e}"),
        ),
    }
}

/// `/stats/summary` as the kubelet's `handleSummary`: the whole summary, or
/// only cpu and memory with `?only_cpu_and_memory=true`; 500 `Internal Error:
/// …` when the runtime cannot be asked.
async fn stats_summary(State(app): State<Arc<App>>, RawQuery(q): RawQuery) -> Response {
    let only: Vec<String> = q
        .as_deref()
        .map(|q| {
            form_urlencoded::parse(q.as_bytes())
                .filter(|(k, _)| k == "only_cpu_and_memory")
                .map(|(_, v)| v.into_owned())
                .collect()
        })
        .unwrap_or_default();
    let only_cpu_and_memory = only.len() == 1 && only[0] == "true";
    match app.stats.summary(only_cpu_and_memory).await {
        Ok(s) => match serde_json::to_vec(&s) {
            Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
            Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        },
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("Internal Error: {e}"),
        ),
    }
}

/// The content type of the metrics endpoints (prometheus-client writes OpenMetrics text).
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The `/configz` document (the kubelet's `configz` for `kubeletconfig`): the
/// agent's KubeletConfiguration with this server's address, ports, TLS files
/// and authentication and authorization settings filled in.
fn configz(cfg: &ServerConfig) -> serde_json::Value {
    let mut doc = serde_json::Map::new();
    let dur = |d| serde_json::Value::from(crate::config::go_duration(d));
    let (cert, key) = match &cfg.serving_cert {
        ServingCert::Files { cert, key } => (cert.display().to_string(), key.display().to_string()),
        ServingCert::SelfSigned { dir, .. } => (
            dir.join("kubelet.crt").display().to_string(),
            dir.join("kubelet.key").display().to_string(),
        ),
        ServingCert::Bootstrap(_) => (String::new(), String::new()),
    };
    let fields = serde_json::json!({
        "address": cfg.address.to_string(),
        "port": cfg.port,
        "healthzBindAddress": cfg.healthz_address.to_string(),
        "healthzPort": cfg.healthz_port.unwrap_or(0),
        "tlsCertFile": cert,
        "tlsPrivateKeyFile": key,
        "authentication": {
            "x509": {
                "clientCAFile": cfg.client_ca_file.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
            },
            "webhook": { "enabled": true, "cacheTTL": dur(cfg.auth_ttls.token) },
            "anonymous": { "enabled": false },
        },
        "authorization": {
            "mode": "Webhook",
            "webhook": {
                "cacheAuthorizedTTL": dur(cfg.auth_ttls.allowed),
                "cacheUnauthorizedTTL": dur(cfg.auth_ttls.denied),
            },
        },
    });
    if let serde_json::Value::Object(m) = fields {
        doc.extend(m);
    }
    let mut out = serde_json::json!({ "kubeletconfig": doc });
    if let Some(providers) = &cfg.credential_providers {
        out["imageCredentialProviders"] = providers.clone();
    }
    out
}

/// The `/configz` document now: the agent's effective KubeletConfiguration
/// (it may change while the agent runs) with this server's own fields over
/// it (`overlay`, made once by [`configz`]).
fn configz_now(
    overlay: &serde_json::Value,
    live: &tokio::sync::watch::Receiver<crate::config::Effective>,
) -> serde_json::Value {
    let mut doc = match &live.borrow().configuration {
        serde_json::Value::Object(m) => m.clone(),
        _ => serde_json::Map::new(),
    };
    if let Some(serde_json::Value::Object(own)) = overlay.get("kubeletconfig") {
        doc.extend(own.clone());
    }
    let mut out = overlay.clone();
    out["kubeletconfig"] = serde_json::Value::Object(doc);
    out
}

async fn configz_handler(State(app): State<Arc<App>>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        configz_now(&app.configz, &app.kubelet_config).to_string(),
    )
        .into_response()
}

/// `/configz/sources`: where each top-level field `/configz` shows came
/// from (`{"kubeletconfig": {field: source}}`, the source `default`, `file
/// <path>`, `flag --<name>` or `NodeConfiguration <name>`), authorized as
/// `/configz` is (its subpath).
async fn configz_sources(State(app): State<Arc<App>>) -> Response {
    let sources = app.kubelet_config.borrow().sources.clone();
    (
        [(header::CONTENT_TYPE, "application/json")],
        sources.to_string(),
    )
        .into_response()
}

/// The request's headers and query as [`zpages::respond`] reads them.
fn zpage_request<'a>(
    headers: &'a axum::http::HeaderMap,
    query: Option<&'a str>,
) -> zpages::Request<'a> {
    let value = |name: header::HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    zpages::Request {
        accept: value(header::ACCEPT),
        query,
        user_agent: value(header::USER_AGENT),
    }
}

fn zpage_response(reply: zpages::Reply) -> Response {
    let mut resp = (
        reply.status,
        [(header::CONTENT_TYPE, reply.content_type)],
        reply.body,
    )
        .into_response();
    if let Some(warning) = reply
        .warning
        .and_then(|w| axum::http::HeaderValue::from_str(&w).ok())
    {
        resp.headers_mut().insert(header::WARNING, warning);
    }
    resp
}

/// `/statusz`, for any method, as the kubelet's handler.
async fn statusz(
    State(app): State<Arc<App>>,
    headers: axum::http::HeaderMap,
    RawQuery(q): RawQuery,
) -> Response {
    let reply = zpages::respond(
        zpages::Content::Statusz(&app.status, Timestamp::now()),
        zpage_request(&headers, q.as_deref()),
        zpages::random_delimiter(),
    );
    zpage_response(reply)
}

/// `/flagz`, for any method, as the kubelet's handler.
async fn flagz(
    State(app): State<Arc<App>>,
    headers: axum::http::HeaderMap,
    RawQuery(q): RawQuery,
) -> Response {
    let reply = zpages::respond(
        zpages::Content::Flagz(&app.flags),
        zpage_request(&headers, q.as_deref()),
        app.flagz_delimiter,
    );
    zpage_response(reply)
}

async fn pods(State(app): State<Arc<App>>) -> Response {
    let mut items: Vec<Arc<Pod>> = app.all_pods();
    items.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    let list = serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "metadata": {},
        "items": items.iter().map(|p| &**p).collect::<Vec<&Pod>>(),
    });
    match serde_json::to_vec(&list) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `GET /debug/pods/{namespace}/{pod}/plan`: the pod worker's last account
/// of the pod ([`crate::pod_core::explain::Explanation`]) as JSON; 404 when
/// the pod is not bound to this node or has not been synced yet.
async fn pod_plan(
    State(app): State<Arc<App>>,
    Path((namespace, name)): Path<(String, String)>,
) -> Response {
    let oref = ObjectRef::<Pod>::new(&name).within(&namespace);
    let Some(pod) = app.pod(&oref) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{name} is not bound to this node"),
        );
    };
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let Some(e) = app.explanations.get(uid) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {namespace}/{name} has not been synced yet"),
        );
    };
    match serde_json::to_vec(&e) {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

fn has_container(pod: &Pod, name: &str) -> bool {
    pod.spec.as_ref().is_some_and(|s| {
        s.containers.iter().any(|c| c.name == name)
            || s.init_containers.iter().flatten().any(|c| c.name == name)
            || s.ephemeral_containers
                .iter()
                .flatten()
                .any(|c| c.name == name)
    })
}

fn container_status<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    let st = pod.status.as_ref()?;
    [
        &st.container_statuses,
        &st.init_container_statuses,
        &st.ephemeral_container_statuses,
    ]
    .into_iter()
    .flatten()
    .flatten()
    .find(|c| c.name == name)
}

/// `/containerLogs/{namespace}/{pod}/{container}` as the kubelet's
/// `getContainerLogs`: 400 for an undecodable query, 422 for invalid options, 404
/// for an unknown pod or container, 400 with the kubelet's message when the
/// container has no log to show; else 200 and the log, streamed.
async fn container_logs(
    State(app): State<Arc<App>>,
    Path((namespace, pod_name, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let opts = match logs::LogOptions::from_query(query.as_deref().unwrap_or(""), Timestamp::now())
    {
        Ok(o) => o,
        Err(logs::OptionsError::Decode(e)) => {
            debug!(error = e, "container logs query");
            return text(
                StatusCode::BAD_REQUEST,
                r#"{"message": "Unable to decode query."}"#,
            );
        }
        Err(logs::OptionsError::Invalid(e)) => {
            debug!(error = e, "container logs query");
            return text(
                StatusCode::UNPROCESSABLE_ENTITY,
                r#"{"message": "Invalid request."}"#,
            );
        }
        Err(e @ logs::OptionsError::Stream(_)) => {
            return text(StatusCode::BAD_REQUEST, e.to_string());
        }
    };
    let oref = ObjectRef::<Pod>::new(&pod_name).within(&namespace);
    let Some(pod) = app.pod(&oref) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {pod_name:?} does not exist"),
        );
    };
    if !has_container(&pod, &container) {
        return text(
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {pod_name:?}"),
        );
    }
    let which = match logs::pick(
        container_status(&pod, &container),
        &container,
        &pod_name,
        opts.previous,
    ) {
        Ok(w) => w,
        Err(message) => return text(StatusCode::BAD_REQUEST, message),
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let dir =
        crate::paths::pod_log_dir(&app.pod_logs_dir, &namespace, &pod_name, &uid).join(&container);
    let restarts = logs::restarts(&dir);
    let Some((restart, path)) = logs::file_for(&dir, &restarts, which) else {
        return text(
            StatusCode::BAD_REQUEST,
            format!(
                "failed to open log file of container {container:?} in pod {pod_name:?}: no log file in {}",
                dir.display()
            ),
        );
    };
    let follow = opts.follow;
    let permit = if follow {
        match app.follows.try_take(&namespace) {
            Ok(p) => Some(p),
            Err(full) => {
                return too_many(match full {
                    fair::Full::Node => {
                        "too many container logs are being followed on this node; try again later\n"
                    }
                    fair::Full::Namespace => {
                        "too many container logs of this namespace are being followed on this node; try again later\n"
                    }
                });
            }
        }
    } else {
        None
    };
    let reader = match logs::LogReader::open(&path, opts).await {
        Ok(r) => r,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("failed to open log file {:?}: {e}", path.display()),
            );
        }
    };
    // Following ends when the container stops: its status says so, or a newer
    // instance started (a later restart has a file); or the server drains.
    let draining = app.draining.clone();
    let pods = app.clone();
    let running = move || {
        if !follow || *draining.borrow() {
            return false;
        }
        let Some(p) = pods.pod(&oref) else {
            return false;
        };
        p.metadata.uid.as_deref() == Some(uid.as_str())
            && container_status(&p, &container)
                .and_then(|s| s.state.as_ref())
                .is_some_and(|s| s.running.is_some())
            && !logs::superseded(&dir, restart)
    };
    // Two chunks in flight at most: a client that does not read holds 64 KiB.
    let (mut tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(2);
    tokio::spawn(async move {
        let _permit = permit;
        if let Err(e) = reader.run(&mut tx, &running, FOLLOW_POLL).await {
            warn!(path = %path.display(), error = %e, "read container log");
        }
    });
    let body =
        Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx).map(Ok::<_, Infallible>));
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests;
