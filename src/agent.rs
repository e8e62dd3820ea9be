//! Wiring: one `kube::Client`, one CRI handle, the node's registration, status
//! and Lease loops, housekeeping, and the pod controller; shutdown on signal.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};
use clap::{CommandFactory as _, FromArgMatches as _};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{Controller, WatchStreamExt, reflector, watcher};
use kube::{Api, Client};
use tracing::{info, warn};

use crate::cli::{Cli, Command, LogFormat, RunArgs};
use crate::config::{self, Settings};
use crate::cri::Runtime;
use crate::node::MachineInfo;
use crate::node::status::NodeConfig;
use crate::pod::env_sources::SourceReader;
use crate::pod::image_manager::{ImageManager, PullConcurrency};
use crate::pod::runtime_manager::RuntimeManager;
use crate::pod::sources::PodSources;
use crate::pod::status_manager::StatusManager;
use crate::pod::{housekeeping, pleg, worker};
use crate::pod_core::facts::{HostDns, NodeContext};
use crate::pod_core::status::StatusContext;
use crate::reasons::phase;
use crate::volume::VolumeManager;

/// `rustlet report-node-configurations`: the NodeConfigurations' status
/// writer, until a stop signal.
fn report_node_configurations(args: &crate::cli::ReportArgs) -> ExitCode {
    init_logging(LogFormat::Plain, 0);
    let report = async {
        let config = kube_config(args.kubeconfig.as_deref()).await?;
        let client = Client::try_from(config).context("build API client")?;
        tokio::select! {
            () = crate::node::configuration_status::run(client) => {}
            () = stop_signal() => {}
        }
        anyhow::Ok(())
    };
    match block_on_current_thread(report) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rustlet: error: {}", one_line(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// `rustlet explain`: a pod's last sync, from the node it is bound to.
fn explain(args: crate::cli::ExplainArgs) -> ExitCode {
    init_logging(LogFormat::Plain, 0);
    let (namespace, name) = args.pod;
    let fetched = async {
        let config = kube_config(args.kubeconfig.as_deref()).await?;
        let client = Client::try_from(config).context("build API client")?;
        crate::pod::explain::fetch(&client, &namespace, &name)
            .await
            .with_context(|| format!("explain pod {namespace}/{name}"))
    };
    match block_on_current_thread(fetched) {
        Ok(e) if args.json => match serde_json::to_string_pretty(&e) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("rustlet: error: {e}");
                ExitCode::FAILURE
            }
        },
        Ok(e) => {
            print!("{}", crate::pod_core::explain::render(&e));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rustlet: error: {}", one_line(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// Entry point of the `rustlet` binary: parses flags, runs, and turns any error
/// into one line on stderr and exit code 1 (2 for bad flags).
#[must_use]
pub fn main() -> ExitCode {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            // One line for a bad flag: clap's message (the flags it names
            // included), without its usage block.
            let text = e.to_string();
            let message: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            eprintln!("rustlet: {}", message.join(" "));
            return ExitCode::from(2);
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    match cli.command {
        Command::Crds(args) => match write_crds(args.out.as_deref()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("rustlet crds: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Version => {
            println!(
                "rustlet {} (kubelet {})",
                env!("CARGO_PKG_VERSION"),
                crate::KUBERNETES_VERSION
            );
            ExitCode::SUCCESS
        }
        Command::ReportNodeConfigurations(args) => report_node_configurations(&args),
        Command::Explain(args) => explain(args),
        Command::DeleteNodes(args) => {
            init_logging(LogFormat::Plain, 0);
            let (namespace, name) = args.record;
            let deleted = async {
                let config = kube_config(args.kubeconfig.as_deref()).await?;
                let client = Client::try_from(config).context("build API client")?;
                crate::node::reset::delete_nodes(&client, &namespace, &name)
                    .await
                    .with_context(|| format!("delete the nodes recorded in {namespace}/{name}"))
            };
            match block_on_current_thread(deleted) {
                Ok(names) => {
                    println!("deleted {} node(s): {}", names.len(), names.join(" "));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("rustlet: error: {}", one_line(&format!("{e:#}")));
                    ExitCode::FAILURE
                }
            }
        }
        Command::ApproveCsrs(args) => {
            init_logging(LogFormat::Plain, 0);
            let release = crate::csr_approver::Release {
                namespace: args.namespace,
                service_account: args.service_account,
                daemonset: args.daemonset,
                node_name_suffix: args.node_name_suffix,
                record: args.record,
            };
            let approve = async {
                let config = kube_config(args.kubeconfig.as_deref()).await?;
                let client = Client::try_from(config).context("build API client")?;
                tokio::select! {
                    r = crate::csr_approver::run(client, release) => r,
                    () = stop_signal() => Ok(()),
                }
            };
            match block_on_current_thread(approve) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("rustlet: error: {}", one_line(&format!("{e:#}")));
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run(args) => {
            // The file's `logging` sets the log, under the flag and RUST_LOG.
            // This read is quiet (nothing logs yet): the agent reads the
            // file again once logging is set up, and says then what it
            // found wrong in it.
            let (file, tracing) = settings(&args)
                .map(|s| (s.logging, s.tracing))
                .unwrap_or_default();
            let format = args.log_format.unwrap_or(if file.json {
                LogFormat::Json
            } else {
                LogFormat::Plain
            });
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("rustlet: error: start async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            // The exporter's channel is made inside the runtime.
            let provider = match &tracing {
                Some(t) => {
                    let _inside = rt.enter();
                    init_logging_and_tracing(format, file.verbosity, t)
                }
                None => {
                    init_logging(format, file.verbosity);
                    None
                }
            };
            let code = match rt.block_on(run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("rustlet: error: {}", one_line(&format!("{e:#}")));
                    ExitCode::FAILURE
                }
            };
            // The spans still batched are sent before the runtime their
            // channel lives on stops.
            if let Some(provider) = provider
                && let Err(e) = provider.shutdown()
            {
                eprintln!("rustlet: warning: tracing: {e}");
            }
            // Work still under way (a pod worker's blocking volume set-up)
            // does not hold the exit: what it left is adopted at the next
            // start.
            rt.shutdown_timeout(Duration::from_secs(1));
            code
        }
    }
}

/// The command line, as [`clap::Parser::try_parse`], with `rustlet run`'s flags and
/// their values kept in its [`crate::cli::Invocation`] for `/flagz`.
fn parse() -> Result<Cli, clap::Error> {
    let matches = Cli::command().try_get_matches()?;
    let mut cli = Cli::from_arg_matches(&matches)?;
    if let (Command::Run(args), Some(run)) = (&mut cli.command, matches.subcommand_matches("run")) {
        args.invocation.flags = crate::cli::run_flags(run);
    }
    Ok(cli)
}

/// Runs `work` on a single-threaded runtime (the short-lived subcommands).
fn block_on_current_thread<T>(
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(work))
}

/// How long the pod workers have, once SIGTERM or SIGINT came, to finish
/// what they are doing (a preStop hook, a grace period, a pull) before the
/// agent stops without them; the next agent adopts what they leave.
pub const WORKER_GRACE: Duration = Duration::from_secs(5);

/// Resolves at the first SIGTERM or SIGINT.
async fn stop_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = term => info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => info!("SIGINT: stopping"),
    }
}

/// `text` on one line: its lines trimmed and joined with ` | ` (a YAML
/// parser's error, for one, points at the input over several lines).
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Logs to stderr in `format`; `RUST_LOG` filters, or else the kubelet's
/// `verbosity` ([`log_directives`]).
fn init_logging(format: LogFormat, verbosity: u32) {
    let filter = log_filter(verbosity);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn log_filter(verbosity: u32) -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(log_directives(verbosity)))
}

/// [`init_logging`] with spans exported as `tracing` says ([`crate::otel`]):
/// the log's filter applies to the log alone, the export's to the export.
/// Returns the provider to shut down at exit; call it inside the runtime.
/// An exporter that cannot be built is said on stderr, and the log is set
/// up without it.
fn init_logging_and_tracing(
    format: LogFormat,
    verbosity: u32,
    tracing: &config::Tracing,
) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    type Boxed = Box<dyn tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync>;
    let (otel, provider) = match crate::otel::layer(tracing) {
        Ok(parts) => parts,
        Err(e) => {
            eprintln!("rustlet: warning: tracing: {e}; no spans are exported");
            init_logging(format, verbosity);
            return None;
        }
    };
    let log = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let log: Boxed = match format {
        LogFormat::Plain => log.with_filter(log_filter(verbosity)).boxed(),
        LogFormat::Json => log.json().with_filter(log_filter(verbosity)).boxed(),
    };
    tracing_subscriber::registry().with(log).with(otel).init();
    Some(provider)
}

/// The log filter of the kubelet's `logging.verbosity` (klog's `-v`): up to
/// 3 the agent's info lines, as the kubelet's steady-state levels; 4 and 5
/// its debug lines (klog's debug levels); 6 and above its trace lines. Other
/// crates stay at info.
#[must_use]
pub fn log_directives(verbosity: u32) -> &'static str {
    match verbosity {
        0..=3 => "info",
        4..=5 => "info,rustlet=debug",
        _ => "info,rustlet=trace",
    }
}

/// True when the kernel enforces AppArmor: `/sys/module/apparmor/parameters/enabled`
/// starts with `Y` (runc's `apparmor.IsEnabled`, which the kubelet's AppArmor
/// validator uses).
fn apparmor_enabled() -> bool {
    std::fs::read("/sys/module/apparmor/parameters/enabled").is_ok_and(|b| b.first() == Some(&b'Y'))
}

/// With `failSwapOn: true`, refuses to run on a node with swap on, as the
/// kubelet's container manager: `swaps` (`/proc/swaps`) lists a device
/// below its header line.
///
/// # Errors
/// Swap is on, or the file cannot be read.
fn check_no_swap(swaps: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(swaps)
        .with_context(|| format!("failSwapOn: read {}", swaps.display()))?;
    if text.lines().skip(1).any(|l| !l.trim().is_empty()) {
        anyhow::bail!(
            "running with swap on is not supported, please disable swap or set --fail-swap-on flag to false (failSwapOn: false in the config file); {} lists swap",
            swaps.display()
        );
    }
    Ok(())
}

/// Flags over file over defaults.
///
/// # Errors
/// An unreadable or invalid `--config` file.
pub fn settings(args: &RunArgs) -> anyhow::Result<Settings> {
    let mut s = Settings::default();
    if let Some(path) = &args.config {
        let ignored = config::apply_file(&mut s, path)?;
        if !ignored.is_empty() {
            warn!(fields = ?ignored, "config file: these KubeletConfiguration fields are not supported and are ignored");
        }
        if !s.gates_without_effect.is_empty() {
            warn!(gates = ?s.gates_without_effect, "config file: these feature gates are on, as in the kubelet, but this agent does not have their features");
        }
        if s.registry_pull_qps > 0 && s.registry_burst == 0 {
            warn!(
                registry_pull_qps = s.registry_pull_qps,
                "config file: registryBurst 0 lets no image pull through, as in the kubelet: every pull fails with \"pull QPS exceeded\""
            );
        }
    }
    // Where each field a flag sets comes from (`/configz/sources`).
    let given = [
        (
            args.container_runtime_endpoint.is_some(),
            "containerRuntimeEndpoint",
            "container-runtime-endpoint",
        ),
        (args.pod_logs_dir.is_some(), "podLogsDir", "pod-logs-dir"),
        (args.port.is_some(), "port", "port"),
        (args.healthz_port.is_some(), "healthzPort", "healthz-port"),
        (
            args.minimum_image_ttl_duration.is_some(),
            "imageMinimumGCAge",
            "minimum-image-ttl-duration",
        ),
        (args.tls_cert_file.is_some(), "tlsCertFile", "tls-cert-file"),
        (
            args.tls_private_key_file.is_some(),
            "tlsPrivateKeyFile",
            "tls-private-key-file",
        ),
    ];
    for (_, field, flag) in given.into_iter().filter(|g| g.0) {
        s.sources
            .insert(field.to_string(), format!("flag --{flag}"));
    }
    if let Some(v) = &args.container_runtime_endpoint {
        s.container_runtime_endpoint.clone_from(v);
    }
    if let Some(v) = &args.root_dir {
        s.root_dir.clone_from(v);
    }
    if let Some(v) = &args.pod_logs_dir {
        s.pod_logs_dir.clone_from(v);
    }
    if let Some(v) = args.port {
        s.port = i32::from(v);
    }
    if let Some(v) = args.healthz_port {
        s.healthz_port = v;
    }
    if let Some(v) = args.minimum_image_ttl_duration {
        s.image_gc.min_age = v;
    }
    Ok(s)
}

/// `rustlet crds`: the custom resource definitions, printed as one YAML
/// stream or written into `out`.
///
/// # Errors
/// A definition that does not serialize, or a file not written.
fn write_crds(out: Option<&Path>) -> anyhow::Result<()> {
    let crds = crate::node_config::crds_yaml().context("serialize the definitions")?;
    match out {
        None => {
            let docs: Vec<&str> = crds.iter().map(|(_, y)| y.as_str()).collect();
            print!("{}", docs.join("---\n"));
        }
        Some(dir) => {
            for (name, yaml) in &crds {
                let path = dir.join(name);
                std::fs::write(&path, yaml).with_context(|| format!("write {}", path.display()))?;
            }
        }
    }
    Ok(())
}

/// The API client configuration: `--kubeconfig`, else the in-cluster one,
/// else `$KUBECONFIG` or `~/.kube/config`; its requests carry the agent's
/// `User-Agent` ([`crate::user_agent`]).
async fn kube_config(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Config> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .with_context(|| format!("read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("load kubeconfig {}", path.display()))?
        }
        None => match kube::Config::incluster() {
            Ok(c) => c,
            Err(_) => kube::Config::from_kubeconfig(&KubeConfigOptions::default())
                .await
                .context(
                    "no in-cluster config and no usable kubeconfig ($KUBECONFIG or ~/.kube/config)",
                )?,
        },
    };
    Ok(crate::with_user_agent(config))
}

fn hostname() -> String {
    gethostname::gethostname().to_string_lossy().to_lowercase()
}

/// Runs the agent until SIGINT/SIGTERM: builds the node's parts (`build`),
/// then starts them and waits for the stop (`start`), as the kubelet's
/// `NewMainKubelet` then `Kubelet.Run`.
///
/// # Errors
/// Bad configuration, an unreadable kubeconfig or an unreachable runtime at
/// start; later failures are retried and logged instead.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let parts = build(args).await?;
    start(parts).await
}

/// The client certificate's rotation task (`rotateCertificates`), whose
/// end is fatal; without rotation, a future that never resolves.
type Rotation = futures::future::Either<
    tokio::task::JoinHandle<anyhow::Error>,
    std::future::Pending<Result<anyhow::Error, tokio::task::JoinError>>,
>;

/// The agent's DaemonSet of `--reset-when-gone`, read with the pod's own
/// ServiceAccount.
struct ResetOwner {
    /// The ServiceAccount's API client.
    client: Client,
    /// The DaemonSet's namespace.
    ns: String,
    /// The DaemonSet's name.
    name: String,
    /// What was read of it at the start ([`read_owner`]).
    at_start: Option<crate::node::reset::Owner>,
}

/// The container runtime as found at the start.
struct RuntimeInfo {
    /// The CRI handle.
    runtime: Runtime,
    /// The runtime's name (`containerd`), for the containers' status.
    name: String,
    /// `<name>://<version>`, for the Node's status.
    version: String,
    /// True when the default handler supports recursive read-only mounts.
    rro: bool,
}

/// What every part is built from: the flags, the settings (with the
/// runtime's cgroup driver), the node's API client, the runtime, and the
/// node's name and address.
struct Base {
    /// The command line.
    args: RunArgs,
    /// Flags over file over defaults ([`settings`]).
    settings: Settings,
    /// The API client with the node's credentials, behind the
    /// `kubeAPIQPS`/`kubeAPIBurst` token bucket ([`crate::throttle`]).
    client: Client,
    /// The same connection unthrottled: the Lease and node status (the
    /// kubelet's `HeartbeatClient`), and under the event recorder's own
    /// bucket (`eventRecordQPS`/`eventBurst`).
    heartbeat: Client,
    /// The container runtime.
    runtime: RuntimeInfo,
    /// The node's name.
    node_name: String,
    /// The node's IP address.
    node_ip: String,
    /// The image credential provider plugins
    /// (`--image-credential-provider-config`), if configured.
    credential_providers: Option<crate::credential_provider::CredentialProviders>,
}

/// The image credential provider plugins of
/// `--image-credential-provider-config` run from
/// `--image-credential-provider-bin-dir` (clap has both or neither), as the
/// kubelet registers them before it starts.
///
/// # Errors
/// The configuration or a plugin cannot be used
/// ([`crate::credential_provider::CredentialProviders::load`]).
fn credential_providers(
    args: &RunArgs,
    client: &Client,
) -> anyhow::Result<Option<crate::credential_provider::CredentialProviders>> {
    let (Some(config), Some(bin_dir)) = (
        &args.image_credential_provider_config,
        &args.image_credential_provider_bin_dir,
    ) else {
        return Ok(None);
    };
    let providers =
        crate::credential_provider::CredentialProviders::load(config, bin_dir, client.clone())
            .map_err(|e| anyhow::anyhow!("image credential providers: {e}"))?;
    info!(
        config = %config.display(),
        hash = providers.hash(),
        "image credential providers registered"
    );
    Ok(Some(providers))
}

/// The node's own facts: its configuration, machine, eviction thresholds
/// and allocatable resources.
struct NodeFacts {
    /// What the Node object is made of.
    cfg: NodeConfig,
    /// The machine's CPUs, memory and huge pages.
    machine: MachineInfo,
    /// The eviction thresholds and timings of the settings.
    limits: crate::eviction::manager::Limits,
    /// The node's allocatable resources.
    allocatable:
        std::collections::BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
}

/// The pod controller's inputs, from the pod sources, the PLEG and the
/// prober.
struct PodInputs {
    /// The pods to run (API server's and static ones).
    store: reflector::Store<Pod>,
    /// The pods whose sync the sources ask for.
    triggers: tokio::sync::mpsc::UnboundedReceiver<Pod>,
    /// True once every pod source listed. Housekeeping waits for it rather
    /// than for the store's readiness, which wakes only one waiter (the
    /// controller's).
    listed: tokio::sync::watch::Receiver<bool>,
    /// The pods whose containers changed in the runtime.
    pleg_events: futures::stream::BoxStream<'static, reflector::ObjectRef<Pod>>,
    /// The pods a probe result asks to sync.
    probe_rx: tokio::sync::mpsc::UnboundedReceiver<reflector::ObjectRef<Pod>>,
}

/// What the node's loops ([`start_loops`]) take over: the node's facts, the
/// sender of its pressures, the CSI drivers and the pod cgroups.
struct LoopParts {
    /// The node's facts.
    facts: NodeFacts,
    /// Where the eviction manager publishes the node's pressures.
    pressures_tx: tokio::sync::watch::Sender<Vec<crate::eviction::Pressure>>,
    /// Where the node shutdown manager says a shutdown is under way.
    shutdown_tx: tokio::sync::watch::Sender<bool>,
    /// The registered CSI drivers.
    drivers: crate::plugin_manager::Drivers,
    /// The pod cgroups, for the stats.
    stats_cgroups: Option<crate::cgroups::CgroupManager>,
}

/// The node's parts as `build` makes them and `start` runs them: the
/// kubelet's `Kubelet` as `NewMainKubelet` returns it.
struct Parts {
    /// Flags, settings, API client, runtime, node name and address.
    base: Base,
    /// The client certificate's rotation.
    rotation: Rotation,
    /// The DaemonSet of `--reset-when-gone`.
    owner: Option<ResetOwner>,
    /// The pod worker's context.
    ctx: Arc<worker::Context>,
    /// The pod controller's inputs.
    pods: PodInputs,
    /// What the node's loops take over.
    loops: LoopParts,
}

/// Builds the node's parts, as the kubelet's `NewMainKubelet`: the
/// credentials, runtime and host ([`connect`]), the node's facts
/// ([`node_facts`]), its volume manager and pod cgroups, its registration,
/// status and Lease ([`start_node_loops`]), the pod worker's context
/// ([`pod_worker`]) and the pod resources API ([`serve_pod_resources`]).
///
/// # Errors
/// See [`run`].
async fn build(args: RunArgs) -> anyhow::Result<Parts> {
    let (base, rotation, owner) = connect(args).await?;
    let facts = node_facts(&base)?;
    let (pressures_tx, pressures) = tokio::sync::watch::channel(Vec::new());
    let (shutdown_tx, shutting_down) = tokio::sync::watch::channel(false);
    // CSI drivers register through <root-dir>/plugins_registry; the volume
    // manager sets up their volumes.
    let drivers = crate::plugin_manager::Drivers::default();
    let volumes = VolumeManager::new(
        base.client.clone(),
        &base.settings.root_dir,
        facts.allocatable.clone(),
    )
    .with_csi(drivers.clone(), &base.node_name);
    let cgroups = pod_cgroups(&base.settings, &facts.machine)?;
    let enforced = match &cgroups {
        Some(m) => enforce_allocatable(&base.settings, m)?,
        None => Vec::new(),
    };
    let stats_cgroups = cgroups.clone();
    // DRA drivers register through the same directory; what they prepared
    // before a restart is read back from the root dir. No driver has
    // registered yet: the node's ResourceSlices go, in the background, as
    // the kubelet's DRA plugin manager wipes them at start.
    let dra = crate::dra::DraManager::open(
        base.client.clone(),
        &base.node_name,
        &base.settings.root_dir,
    )
    .map_err(anyhow::Error::msg)?;
    tokio::spawn({
        let dra = dra.clone();
        async move { dra.wipe_resource_slices().await }
    });
    tokio::spawn(dra.clone().run_probes());
    let (node_store, devices) =
        start_node_loops(&base, &facts, (&pressures, &shutting_down), &drivers, &dra)?;
    let (cpus, memory, topology) = resource_managers(&base.settings, &facts.machine)?;
    let node = NodeParts {
        volumes,
        cgroups,
        devices,
        dra,
        node_store,
        pressures,
        shutting_down,
        cpus,
        memory,
        topology,
    };
    let (ctx, pods) = pod_worker(&base, &facts, node);
    for note in enforced {
        crate::events::publish_node(
            ctx.recorder(),
            &base.node_name,
            crate::events::EventType::Normal,
            crate::reasons::event::NODE_ALLOCATABLE_ENFORCED,
            note,
        );
    }
    serve_pod_resources(&base.settings, &pods.store, &ctx)?;
    Ok(Parts {
        base,
        rotation,
        owner,
        ctx,
        pods,
        loops: LoopParts {
            facts,
            pressures_tx,
            shutdown_tx,
            drivers,
            stats_cgroups,
        },
    })
}

/// Reads the settings, checks swap, connects to the API server (with the
/// TLS bootstrap: [`api_client`]) and to the runtime ([`connect_runtime`]),
/// reads the `--reset-when-gone` DaemonSet and prepares the host's
/// directories ([`prepare_host`]), as the kubelet's `run` before
/// `NewMainKubelet`.
///
/// # Errors
/// See [`run`].
async fn connect(args: RunArgs) -> anyhow::Result<(Base, Rotation, Option<ResetOwner>)> {
    let mut settings = settings(&args)?;
    if settings.fail_swap_on == Some(true) {
        check_no_swap(Path::new("/proc/swaps"))?;
    }
    let node_name = args.node_name.clone().unwrap_or_else(hostname);
    let (heartbeat, rotation) = api_client(&args, &settings, &node_name).await?;
    let client = crate::throttle::throttled(
        heartbeat.clone(),
        crate::throttle::Rate {
            qps: settings.kube_api_qps,
            burst: settings.kube_api_burst,
        },
    );
    let owner = reset_owner(&args).await?;
    let credential_providers = credential_providers(&args, &client)?;
    let runtime = connect_runtime(&mut settings).await?;
    let node_ip = args
        .node_ip
        .map_or_else(|| "127.0.0.1".to_string(), |ip| ip.to_string());
    info!(node = node_name, runtime = runtime.version, "starting");
    prepare_host(&settings)?;
    let base = Base {
        args,
        settings,
        client,
        heartbeat,
        runtime,
        node_name,
        node_ip,
        credential_providers,
    };
    Ok((base, rotation, owner))
}

/// The TLS bootstrap, when `--bootstrap-kubeconfig` is given and
/// `--kubeconfig` is not usable, as the kubelet's `bootstrapClientCert`:
/// with `rotateCertificates` it runs in the background (static pods, the API
/// server's own included, run meanwhile) and is returned pending; without
/// it, the agent waits here for its certificate.
///
/// # Errors
/// The bootstrap could not start or, without rotation, failed.
async fn tls_bootstrap(
    args: &RunArgs,
    settings: &Settings,
    cert_dir: &Path,
    node: &str,
) -> anyhow::Result<Option<crate::node::bootstrap::Pending>> {
    let mut pending = None;
    if let (Some(bootstrap), Some(kubeconfig)) = (&args.bootstrap_kubeconfig, &args.kubeconfig)
        && !crate::node::bootstrap::kubeconfig_usable(kubeconfig)
    {
        if settings.rotate_certificates {
            pending = Some(
                crate::node::bootstrap::Pending::new(bootstrap, kubeconfig, cert_dir, node)
                    .await
                    .context("TLS bootstrap")?,
            );
        } else {
            crate::node::bootstrap::ensure(kubeconfig, bootstrap, cert_dir, node)
                .await
                .context("TLS bootstrap")?;
        }
    }
    Ok(pending)
}

/// The node's API client, after the TLS bootstrap ([`tls_bootstrap`]), and,
/// with `rotateCertificates`, its certificate's rotation, started: the
/// kubelet's client config with its certificate manager.
///
/// # Errors
/// The bootstrap failed, or the kubeconfig or the certificate is unusable.
async fn api_client(
    args: &RunArgs,
    settings: &Settings,
    node: &str,
) -> anyhow::Result<(Client, Rotation)> {
    let cert_dir = args
        .cert_dir
        .clone()
        .unwrap_or_else(|| settings.root_dir.join("pki"));
    let pending = tls_bootstrap(args, settings, &cert_dir, node).await?;
    Ok(if let Some(pending) = pending {
        let config = pending.anonymous_config().await.context("TLS bootstrap")?;
        let (client, rotation) =
            crate::node::client_cert::Rotation::bootstrapping(&config, &cert_dir, node, pending)
                .context("rotateCertificates")?;
        let rotation = tokio::spawn(rotation.run(client.clone()));
        (client, futures::future::Either::Left(rotation))
    } else if settings.rotate_certificates {
        let config = kube_config(args.kubeconfig.as_deref()).await?;
        let (client, rotation) =
            crate::node::client_cert::Rotation::start(&config, &cert_dir, node)
                .context("rotateCertificates")?;
        // From the start: every request after the certificate's renewal
        // time depends on it.
        let rotation = tokio::spawn(rotation.run(client.clone()));
        (client, futures::future::Either::Left(rotation))
    } else {
        let config = kube_config(args.kubeconfig.as_deref()).await?;
        let client = Client::try_from(config).context("build API client")?;
        (
            client,
            futures::future::Either::Right(std::future::pending()),
        )
    })
}

/// The DaemonSet of `--reset-when-gone` and what can be read of it now.
/// It is read with the pod's own ServiceAccount, which the node's
/// credentials cannot stand in for: the bootstrap kubeconfig's (the chart's
/// carries its token and the API server's address the host network
/// reaches), else the in-cluster one.
///
/// # Errors
/// No usable credentials for the ServiceAccount.
async fn reset_owner(args: &RunArgs) -> anyhow::Result<Option<ResetOwner>> {
    let Some((ns, name)) = &args.reset_when_gone else {
        return Ok(None);
    };
    let config = kube_config(args.bootstrap_kubeconfig.as_deref())
        .await
        .context("--reset-when-gone: the ServiceAccount's credentials")?;
    let owner_client = Client::try_from(config).context("build the ServiceAccount's API client")?;
    let at_start = read_owner(&owner_client, ns, name).await;
    if at_start != Some(crate::node::reset::Owner::There) {
        warn!(
            daemonset = %format!("{ns}/{name}"),
            read = ?at_start,
            "the agent's DaemonSet cannot be read now: an uninstall is known only by its absence"
        );
    }
    Ok(Some(ResetOwner {
        client: owner_client,
        ns: ns.clone(),
        name: name.clone(),
        at_start,
    }))
}

/// Connects to the container runtime and reads its version, its default
/// handler's recursive read-only mounts and its cgroup driver, which wins
/// over the configured one in `settings`, as with the kubelet: the two must
/// agree on how cgroup parents are named.
///
/// # Errors
/// The runtime is unreachable, does not answer, or names an unknown cgroup
/// driver.
async fn connect_runtime(settings: &mut Settings) -> anyhow::Result<RuntimeInfo> {
    let runtime = Runtime::connect(
        &settings.container_runtime_endpoint,
        settings.runtime_request_timeout,
    )
    .await?;
    let version = runtime.version().await.map_err(|e| {
        anyhow!(
            "container runtime at {} is not answering: {e}",
            settings.container_runtime_endpoint
        )
    })?;
    // The default handler's recursive read-only mounts, for the
    // containers' volumeMounts status; unknown counts as none.
    let rro = match runtime.status().await {
        Ok(status) => {
            crate::pod_core::translate::handler_supports_rro(&status.runtime_handlers, "")
        }
        Err(e) => {
            warn!(error = %e, "runtime status: recursive read-only mounts taken as unsupported");
            false
        }
    };
    if let Some(driver) = runtime_cgroup_driver(&runtime, &settings.cgroup_driver).await? {
        settings.cgroup_driver = driver.to_string();
    }
    let runtime_version = format!(
        "{}://{}",
        version.runtime_name,
        version.runtime_version.trim_start_matches('v')
    );
    Ok(RuntimeInfo {
        runtime,
        name: version.runtime_name,
        version: runtime_version,
        rro,
    })
}

/// Raises the open-file limit, sets the agent's own OOM score and makes
/// the root and pod log directories, the root one a shared mount, as the
/// kubelet's `maxOpenFiles`, `oomScoreAdj` and `setupDataDirs`.
///
/// # Errors
/// A directory could not be made or made shared.
fn prepare_host(settings: &Settings) -> anyhow::Result<()> {
    // As the kubelet with maxOpenFiles: every connection, log and volume
    // takes a descriptor.
    match crate::server::raise_open_files_limit(crate::server::MAX_OPEN_FILES) {
        Ok(n) => info!(open_files = n, "open-file limit"),
        Err(e) => warn!(error = %e, "failed to raise the open-file limit"),
    }
    // As the kubelet's ApplyOOMScoreAdj at start: the OOM killer takes the
    // agent last; a refusal (no CAP_SYS_RESOURCE) is only logged, as there.
    match std::fs::write(
        "/proc/self/oom_score_adj",
        settings.oom_score_adj.to_string(),
    ) {
        Ok(()) => info!(
            oom_score_adj = settings.oom_score_adj,
            "the agent's OOM score"
        ),
        Err(e) => {
            warn!(error = %e, oom_score_adj = settings.oom_score_adj, "failed to apply oomScoreAdj")
        }
    }
    for dir in [&settings.root_dir, &settings.pod_logs_dir] {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("create directory {}", dir.display()))?;
    }
    // As the kubelet's setupDataDirs: volumes mounted by a driver's pod
    // (Bidirectional propagation) reach the node only on a shared mount.
    if crate::volume::mount::make_rshared(&settings.root_dir)
        .with_context(|| format!("configure root directory {}", settings.root_dir.display()))?
    {
        info!(dir = %settings.root_dir.display(), "root directory made a shared mount");
    }
    Ok(())
}

/// The node's configuration, machine, eviction thresholds and allocatable
/// resources, with the reservations checked against the machine, as the
/// kubelet's container manager and eviction manager configuration.
///
/// # Errors
/// The reservations exceed the machine, or the eviction configuration is
/// invalid.
fn node_facts(base: &Base) -> anyhow::Result<NodeFacts> {
    let settings = &base.settings;
    let cfg = NodeConfig {
        name: base.node_name.clone(),
        ips: vec![base.node_ip.clone()],
        hostname: base.node_name.clone(),
        max_pods: settings.max_pods,
        port: settings.port,
        version: crate::node_version(),
        reserved: settings.reservations.clone(),
        max_images: settings.node_status_max_images,
        extra_labels: base.args.node_labels.clone(),
        taints: settings.register_with_taints.clone(),
        pod_level_resize_disabled: !settings.pod_level_resize,
    };
    let machine = MachineInfo::read(&settings.root_dir);
    crate::node::status::check_reservations(&machine, settings.max_pods, &settings.reservations)
        .map_err(|e| anyhow::anyhow!(e))?;
    let limits = crate::eviction::limits(settings)
        .map_err(|e| anyhow::anyhow!("invalid eviction configuration: {e}"))?;
    let (_, allocatable) =
        crate::node::status::resources(&machine, settings.max_pods, &settings.reservations);
    Ok(NodeFacts {
        cfg,
        machine,
        limits,
        allocatable,
    })
}

/// Starts the node's registration (retried until the API server answers),
/// its Node watch, the device plugins' registration socket, the node status
/// loop, the plugin manager, the container log manager and the Lease
/// renewal, as the kubelet's `registerWithAPIServer`, node informer, device
/// manager, `syncNodeStatus`, plugin manager, container log manager and
/// node lease controller; returns the Node's store and the device manager.
///
/// # Errors
/// The device plugins' socket cannot be served.
fn start_node_loops(
    base: &Base,
    facts: &NodeFacts,
    (pressures, shutting_down): (
        &tokio::sync::watch::Receiver<Vec<crate::eviction::Pressure>>,
        &tokio::sync::watch::Receiver<bool>,
    ),
    drivers: &crate::plugin_manager::Drivers,
    dra: &crate::dra::DraManager,
) -> anyhow::Result<(
    reflector::Store<k8s_openapi::api::core::v1::Node>,
    crate::device_manager::DeviceManager,
)> {
    let (client, settings, node_name) = (&base.client, &base.settings, &base.node_name);
    let runtime = &base.runtime.runtime;
    // Registration retries until the API server answers, in the background:
    // static pods start meanwhile, as the kubelet runs them without it.
    let registered = tokio::spawn({
        let (client, runtime, node_cfg, machine, version) = (
            client.clone(),
            runtime.clone(),
            facts.cfg.clone(),
            facts.machine.clone(),
            base.runtime.version.clone(),
        );
        async move {
            crate::node::registration::register(&client, &runtime, &node_cfg, &machine, &version)
                .await
        }
    });
    let node_store = crate::node::registration::watch_node(client.clone(), node_name);
    // Device plugins register on <device-plugins-dir>/kubelet.sock.
    let devices = crate::device_manager::DeviceManager::new(
        base.args
            .device_plugins_dir
            .as_deref()
            .unwrap_or(Path::new(crate::device_manager::DEFAULT_DIR)),
    );
    devices.serve()?;
    tokio::spawn(crate::node::registration::status_loop(
        base.heartbeat.clone(),
        crate::node::registration::Observed {
            store: node_store.clone(),
            pressures: pressures.clone(),
            devices: Some(devices.clone()),
            shutting_down: shutting_down.clone(),
        },
        runtime.clone(),
        facts.cfg.clone(),
        facts.machine.clone(),
        base.runtime.version.clone(),
        settings.clone(),
    ));
    tokio::spawn(
        crate::plugin_manager::PluginManager::new(
            client.clone(),
            &settings.root_dir,
            node_name,
            drivers.clone(),
        )
        .with_dra(dra.clone())
        .run(),
    );
    tokio::spawn(crate::log_manager::run(
        runtime.clone(),
        settings.pod_logs_dir.clone(),
        crate::paths::CONTAINER_LOGS_DIR.into(),
        settings.container_logs,
    ));
    tokio::spawn({
        let (client, node_name) = (base.heartbeat.clone(), node_name.clone());
        let duration = settings.node_lease_duration_seconds;
        async move {
            match registered.await {
                Ok(node_uid) => {
                    crate::node::lease::renew_loop(client, node_name, node_uid, duration).await;
                }
                Err(e) => warn!(error = %e, "node registration task"),
            }
        }
    });
    Ok((node_store, devices))
}

/// The node's own parts the pod worker uses.
struct NodeParts {
    /// The volume manager.
    volumes: VolumeManager,
    /// The pod cgroups (`cgroupsPerQOS`).
    cgroups: Option<crate::cgroups::CgroupManager>,
    /// The device plugins' manager.
    devices: crate::device_manager::DeviceManager,
    /// The DRA manager.
    dra: crate::dra::DraManager,
    /// This node's Node object.
    node_store: reflector::Store<k8s_openapi::api::core::v1::Node>,
    /// The node's pressures, from the eviction manager.
    pressures: tokio::sync::watch::Receiver<Vec<crate::eviction::Pressure>>,
    /// Whether a node shutdown is under way, from the node shutdown manager.
    shutting_down: tokio::sync::watch::Receiver<bool>,
    /// The CPU manager.
    cpus: crate::cpu_manager::CpuManager,
    /// The memory manager.
    memory: crate::memory_manager::MemoryManager,
    /// The topology manager's settings.
    topology: crate::topology_manager::TopologyManager,
}

/// The CPU, memory and topology managers of the settings, over the
/// machine's topology as sysfs gives it, as the kubelet's container manager
/// makes them (`NewManager` of each): the managers' states restored and
/// checked, `reservedMemory` against node allocatable, the machine's NUMA
/// nodes counted against the topology manager's limit.
///
/// # Errors
/// The topology cannot be read, a setting does not fit the machine, or a
/// manager's checkpoint is of another policy or does not fit.
fn resource_managers(
    settings: &Settings,
    machine: &MachineInfo,
) -> anyhow::Result<(
    crate::cpu_manager::CpuManager,
    crate::memory_manager::MemoryManager,
    crate::topology_manager::TopologyManager,
)> {
    let sys = std::path::Path::new("/sys");
    let topo = crate::cpu_manager::topology::CpuTopology::discover(sys)?;
    let r = &settings.resource_managers;
    let info = crate::cpu_manager::topology::numa_info(
        sys,
        &topo,
        r.topology_options.prefer_closest_numa_nodes,
    )?;
    r.topology_options
        .check_machine(r.topology_policy, info.nodes.len())
        .map_err(anyhow::Error::msg)?;
    let cpus = crate::cpu_manager::CpuManager::new(
        r,
        crate::cpu_manager::reserved_millicores(&settings.reservations),
        &settings.root_dir,
        topo,
        r.cpu_beta_options,
    )?;
    let nodes = crate::memory_manager::discover(sys, machine.memory_bytes, &machine.huge_pages);
    let reserved = if r.memory_policy == "Static" {
        let held: std::collections::BTreeMap<String, u64> =
            crate::node::status::reservation(machine, &settings.reservations)
                .into_iter()
                .filter(|(k, _)| k == "memory" || k.starts_with("hugepages-"))
                .map(|(k, q)| (k, u64::try_from(q.value()).unwrap_or(0)))
                .collect();
        crate::memory_manager::reserved_by_node(&r.reserved_memory, &nodes, &held)
            .map_err(anyhow::Error::msg)?
    } else {
        std::collections::BTreeMap::new()
    };
    let memory = crate::memory_manager::MemoryManager::new(
        &r.memory_policy,
        nodes,
        reserved,
        &settings.root_dir,
    )
    .map_err(anyhow::Error::msg)?;
    let topology = crate::topology_manager::TopologyManager {
        policy: r.topology_policy,
        scope: r.topology_scope,
        options: r.topology_options.clone(),
        info,
    };
    Ok((cpus, memory, topology))
}

/// The pod worker's context and the pod controller's inputs: the PLEG, the
/// event recorder, the prober, the Services watch ([`watch_services`]), the
/// pod sources ([`start_pod_sources`]) and the runtime, status, volume and
/// admission managers, as the kubelet's `NewMainKubelet` wires its pod
/// workers.
fn pod_worker(
    base: &Base,
    facts: &NodeFacts,
    node: NodeParts,
) -> (Arc<worker::Context>, PodInputs) {
    let (client, settings, runtime) = (&base.client, &base.settings, &base.runtime.runtime);
    let host_dns =
        HostDns::parse(&std::fs::read_to_string(&settings.resolv_conf).unwrap_or_default());
    let (pleg_events, pleg_connected) = pleg::start(runtime);
    let recorder = crate::events::Recorder::new(
        crate::throttle::throttled(
            base.heartbeat.clone(),
            crate::throttle::Rate {
                qps: settings.event_record_qps,
                burst: settings.event_burst,
            },
        ),
        base.node_name.clone(),
    );
    let (probe_tx, probe_rx) = tokio::sync::mpsc::unbounded_channel();
    let prober =
        crate::prober::manager::Manager::new(runtime.clone(), recorder.clone(), probe_tx.clone());
    // The stores exist before the controller, so the context is built once.
    let (services, services_listed) = watch_services(client);
    let (sources, outputs) = start_pod_sources(base);
    let store = sources.store();
    // A device's health changed: the pods using claims here are synced, so
    // that their containers' allocatedResourcesStatus shows it.
    tokio::spawn({
        let (mut changes, dra, store) =
            (node.dra.health_changes(), node.dra.clone(), store.clone());
        async move {
            while changes.changed().await.is_ok() {
                for pod in store.state() {
                    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
                    if dra.has_claims(uid)
                        && probe_tx
                            .send(reflector::ObjectRef::from_obj(&*pod))
                            .is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
    let node_context = node_context(base, facts, host_dns);
    let ctx = Arc::new(worker::Context::new(worker::Parts {
        runtime: RuntimeManager {
            runtime: runtime.clone(),
            images: ImageManager::new(
                runtime.clone(),
                client.clone(),
                recorder.clone(),
                pull_concurrency(settings),
            )
            .with_pull_rate(settings.registry_pull_qps, settings.registry_burst)
            .with_pull_records(&settings.root_dir, settings.image_pull_verification.clone())
            .with_credential_providers_of(base.credential_providers.clone()),
            sources: SourceReader {
                client: client.clone(),
                services,
                services_listed,
            },
            recorder,
            node: node_context,
            pods: store.clone(),
            client: client.clone(),
            userns: crate::pod::userns::UsernsManager::new(
                &settings.root_dir,
                usize::try_from(settings.max_pods).unwrap_or(usize::MAX),
            ),
            log_links_dir: crate::paths::CONTAINER_LOGS_DIR.into(),
            cgroups: node.cgroups,
            devices: Some(node.devices),
            dra: node.dra,
            cpus: Some(node.cpus),
            memory: Some(node.memory),
            topology: node.topology,
        },
        status: Arc::new(StatusManager::new(client.clone(), sources.clone())),
        status_context: StatusContext {
            host_ips: vec![base.node_ip.clone()],
            runtime_name: base.runtime.name.clone(),
            runtime_rro: base.runtime.rro,
            cpu_period_us: base.settings.cpu_period_us(),
        },
        volumes: Arc::new(node.volumes),
        prober,
        pleg_connected,
        node_store: node.node_store,
        pressures: node.pressures,
        shutting_down: node.shutting_down,
        sources: sources.clone(),
        allocations: crate::pod::allocation::Allocations::load(&settings.root_dir),
    }));
    let inputs = PodInputs {
        store,
        triggers: outputs.triggers,
        listed: outputs.ready,
        pleg_events: pleg_events.boxed(),
        probe_rx,
    };
    (ctx, inputs)
}

/// Starts the watch of every Service, for the containers' service
/// environment variables (the kubelet's service informer); returns its
/// store and a flag that turns true once the first list is in it.
fn watch_services(
    client: &Client,
) -> (
    reflector::Store<Service>,
    tokio::sync::watch::Receiver<bool>,
) {
    let (services, services_writer) = reflector::store();
    let (services_listed_tx, services_listed) = tokio::sync::watch::channel(false);
    tokio::spawn(
        watcher(
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        // After the store took the first list in, so that a woken container
        // start reads it.
        .reflect(services_writer)
        .inspect_ok(move |ev| {
            if matches!(ev, watcher::Event::InitDone) {
                services_listed_tx.send_replace(true);
            }
        })
        .for_each(|ev| async move {
            if let Err(e) = ev {
                warn!(error = %e, "watch services");
            }
        }),
    );
    (services, services_listed)
}

/// Starts the pod sources, as the kubelet's `makePodSourceConfig`: the
/// pods bound to the node in the API server, merged with the static pods of
/// the manifests (`staticPodPath`, `staticPodURL`).
fn start_pod_sources(base: &Base) -> (PodSources, crate::pod::sources::Outputs) {
    let (client, settings, node_name) = (&base.client, &base.settings, &base.node_name);
    let static_path = settings.static_pod_path.clone();
    let static_url = settings.static_pod_url.clone();
    let mut static_sources = Vec::new();
    if static_path.is_some() {
        static_sources.push(crate::static_pod::FILE_SOURCE);
    }
    if static_url.is_some() {
        static_sources.push(crate::static_pod::HTTP_SOURCE);
    }
    let (sources, outputs) = PodSources::new(&static_sources);
    tokio::spawn({
        let sources = sources.clone();
        watcher(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields(&format!("spec.nodeName={node_name}")),
        )
        .default_backoff()
        .for_each(move |ev| {
            match ev {
                Ok(ev) => sources.api_event(ev),
                Err(e) => warn!(error = %e, "watch pods"),
            }
            async {}
        })
    });
    if let Some(path) = static_path {
        tokio::spawn(crate::pod::sources::run_file_source(
            path,
            node_name.clone(),
            settings.file_check_frequency,
            sources.clone(),
        ));
    }
    if let Some(url) = static_url {
        tokio::spawn(crate::pod::sources::run_url_source(
            url,
            settings.static_pod_url_header.clone(),
            node_name.clone(),
            settings.http_check_frequency,
            sources.clone(),
        ));
    }
    (sources, outputs)
}

/// The node's facts as the pod worker reads them: names, addresses,
/// directories, DNS, allocatable, sysctls, seccomp, AppArmor, user
/// namespaces, and the labels and taints the node registers with.
fn node_context(base: &Base, facts: &NodeFacts, host_dns: HostDns) -> NodeContext {
    let settings = &base.settings;
    NodeContext {
        node_name: base.node_name.clone(),
        node_ips: vec![base.node_ip.clone()],
        pod_logs_dir: settings.pod_logs_dir.clone(),
        root_dir: settings.root_dir.clone(),
        host_dns,
        cluster_dns: settings.cluster_dns.clone(),
        cluster_domain: settings.cluster_domain.clone(),
        allocatable: facts.allocatable.clone(),
        memory_capacity_bytes: facts.machine.memory_bytes,
        hosts_file: crate::pod_core::hosts::ETC_HOSTS_PATH.into(),
        allowed_unsafe_sysctls: settings.allowed_unsafe_sysctls.clone(),
        seccomp_default: settings.seccomp_default,
        apparmor_enabled: apparmor_enabled(),
        user_namespaces_support: settings.user_namespaces_support,
        pod_level_resources_disabled: !settings.pod_level_resources,
        pod_level_resize_disabled: !settings.pod_level_resize,
        initial_labels: crate::node::status::labels(&facts.cfg),
        initial_taints: facts.cfg.taints.clone(),
        crash_backoff: crate::pod_core::backoff::CrashBackoff::with_max(
            settings.crash_loop_max_restart_period,
        ),
        swap: crate::node::info::swap(settings.limited_swap),
        huge_page_sizes: facts
            .machine
            .huge_pages
            .iter()
            .map(|(kib, _)| kib.saturating_mul(1024))
            .collect(),
        cpu_period_us: settings.cpu_period_us(),
        sync_frequency: settings.sync_frequency,
    }
}

/// Serves the pod resources API on `<root-dir>/pod-resources/kubelet.sock`
/// (the kubelet's `ListenAndServePodResources`): the active pods are those
/// whose phase, as last sent, is not terminal.
///
/// # Errors
/// The socket cannot be served.
fn serve_pod_resources(
    settings: &Settings,
    store: &reflector::Store<Pod>,
    ctx: &Arc<worker::Context>,
) -> anyhow::Result<()> {
    let lister: crate::pod_resources::PodsProvider = {
        let (store, status) = (store.clone(), ctx.status().clone());
        Arc::new(move |which| {
            store
                .state()
                .into_iter()
                .filter(|p| {
                    which == crate::pod_resources::Pods::All
                        || !crate::pod_core::spec::is_terminal(&status.with_sent_status(p.clone()))
                })
                .collect()
        })
    };
    crate::pod_resources::serve(
        &settings.root_dir,
        lister,
        ctx.devices().cloned(),
        ctx.cpus().cloned(),
        ctx.memory().cloned(),
        Some(ctx.dra().clone()),
    )?;
    Ok(())
}

/// Starts the node's parts and runs them until SIGTERM or SIGINT, as the
/// kubelet's `Kubelet.Run`: the stop signal ([`stop_on_signal`]), the pod
/// controller ([`pod_controller`]) and the node's loops ([`start_loops`]);
/// then waits ([`until_stopped`]) and, after a clean stop, resets the node
/// if its DaemonSet is uninstalled ([`reset_if_uninstalled`]).
///
/// # Errors
/// The node API failed, or the client certificate's rotation ended.
async fn start(parts: Parts) -> anyhow::Result<()> {
    let Parts {
        base,
        rotation,
        owner,
        ctx,
        pods,
        loops,
    } = parts;
    let stopping = stop_on_signal();
    let controller = pod_controller(
        pods.triggers,
        &pods.store,
        pods.pleg_events,
        pods.probe_rx,
        &stopping,
    );
    let running = start_loops(&base, &ctx, &pods.store, &pods.listed, loops)?;
    let ctx_volumes = ctx.volumes().clone();
    let ctx_cgroups = ctx.cgroups().cloned();
    let pods = controller
        .run(reconcile_measured, worker::error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "reconcile");
            }
        });
    let result = until_stopped(
        pods,
        stopping,
        running.server,
        running.stop_server,
        rotation,
    )
    .await;
    running.housekeeping.abort();
    if result.is_ok()
        && let Some(owner) = &owner
    {
        let target = crate::node::reset::Target {
            runtime: &base.runtime.runtime,
            volumes: &ctx_volumes,
            pod_logs_dir: &base.settings.pod_logs_dir,
            client: &base.client,
            node: &base.node_name,
            bridge: base.args.reset_cni_bridge.as_deref(),
            cgroups: ctx_cgroups.as_ref(),
        };
        reset_if_uninstalled(owner, target).await;
    }
    info!("stopped");
    result
}

/// The node's loops as [`start_loops`] leaves them running: the node API,
/// the sender that drains it, and housekeeping.
struct Running {
    /// The node API's task.
    server: tokio::task::JoinHandle<crate::server::Result<()>>,
    /// Sent to drain the node API.
    stop_server: tokio::sync::oneshot::Sender<()>,
    /// The housekeeping task.
    housekeeping: tokio::task::JoinHandle<()>,
}

/// Starts the node's loops, as the kubelet's `Kubelet.Run` and
/// `StartGarbageCollection`: the stats ([`stats_provider`]), the image and
/// container GC, the eviction manager, the stats sampling, the node API
/// ([`spawn_server`]) and housekeeping ([`spawn_housekeeping`]).
///
/// # Errors
/// The node API's configuration is invalid ([`server_config`]).
fn start_loops(
    base: &Base,
    ctx: &Arc<worker::Context>,
    store: &reflector::Store<Pod>,
    listed: &tokio::sync::watch::Receiver<bool>,
    loops: LoopParts,
) -> anyhow::Result<Running> {
    let Base {
        args,
        settings,
        client,
        node_name,
        ..
    } = base;
    let runtime = &base.runtime.runtime;
    let LoopParts {
        facts: NodeFacts {
            machine, limits, ..
        },
        pressures_tx,
        shutdown_tx,
        drivers,
        stats_cgroups,
    } = loops;
    let stats = stats_provider(node_name, runtime, settings, &drivers, stats_cgroups);
    let image_gc = crate::image_gc::ImageGc::new(
        runtime.clone(),
        stats.clone(),
        settings.image_gc,
        ctx.recorder().clone(),
        node_name.clone(),
    );
    tokio::spawn(image_gc.clone().run());
    let (limits_tx, limits) = tokio::sync::watch::channel(limits);
    let (configz_tx, configz) = tokio::sync::watch::channel(settings.effective());
    tokio::spawn(
        crate::node::configuration::Controller {
            client: client.clone(),
            node_name: node_name.clone(),
            base: settings.clone(),
            node: ctx.node_store().clone(),
            live: crate::node::configuration::Live {
                image_gc: image_gc.clone(),
                limits: limits_tx,
                configz: configz_tx,
            },
        }
        .run(),
    );
    let container_gc = crate::container_gc::Policy {
        min_age: args.minimum_container_ttl_duration,
        max_per_pod_container: args.maximum_dead_containers_per_container,
        max_containers: args.maximum_dead_containers,
    };
    tokio::spawn(housekeeping::run_container_gc(
        ctx.clone(),
        container_gc,
        listed.clone(),
    ));
    tokio::spawn(crate::pod::cpu_reconciler::run(
        ctx.clone(),
        settings.resource_managers.cpu_reconcile_period,
        listed.clone(),
    ));
    tokio::spawn(crate::eviction::manager::run(
        crate::eviction::manager::Config {
            node_name: node_name.clone(),
            limits,
            hugepages_bytes: if stats.node_memory_counts_hugepages() {
                0
            } else {
                machine.huge_pages.iter().fold(0u64, |sum, (kib, pages)| {
                    sum.saturating_add(kib.saturating_mul(1024).saturating_mul(*pages))
                })
            },
        },
        stats.clone(),
        ctx.recorder().clone(),
        Arc::new(crate::pod::eviction_pods::EvictionPods::new(
            ctx.clone(),
            container_gc,
        )),
        image_gc,
        pressures_tx,
    ));
    // Graceful node shutdown, when a grace period is configured (the
    // kubelet's manager stub otherwise).
    let periods = crate::node_shutdown::plan::periods(
        settings.shutdown_grace_period,
        settings.shutdown_grace_period_critical_pods,
        &settings.shutdown_grace_period_by_pod_priority,
    );
    if !periods.is_empty() {
        tokio::spawn(crate::node_shutdown::manager::run(
            crate::node_shutdown::manager::Config {
                node_name: node_name.clone(),
                periods,
                drop_in_dir: crate::node_shutdown::logind::DROP_IN_DIR.into(),
                bus_address: None,
                state_file: Some(
                    settings
                        .root_dir
                        .join(crate::node_shutdown::manager::STATE_FILE),
                ),
            },
            Arc::new(crate::pod::eviction_pods::EvictionPods::new(
                ctx.clone(),
                container_gc,
            )),
            ctx.recorder().clone(),
            shutdown_tx,
        ));
    }
    tokio::spawn({
        let stats = stats.clone();
        async move { stats.sample().await }
    });
    let (server, stop_server) = spawn_server(base, ctx, store, &stats, configz)?;
    let housekeeping = spawn_housekeeping(
        ctx,
        runtime,
        client,
        settings,
        store.clone(),
        listed.clone(),
    );
    Ok(Running {
        server,
        stop_server,
        housekeeping,
    })
}

/// Starts the node API (the kubelet's server on `port`, `healthzPort` and
/// `readOnlyPort`); it drains once the returned sender is sent to (or
/// dropped): once the pod workers have stopped on SIGTERM/SIGINT.
///
/// # Errors
/// The node API's configuration is invalid ([`server_config`]).
fn spawn_server(
    base: &Base,
    ctx: &Arc<worker::Context>,
    store: &reflector::Store<Pod>,
    stats: &Arc<crate::stats::Provider>,
    configz: tokio::sync::watch::Receiver<crate::config::Effective>,
) -> anyhow::Result<(
    tokio::task::JoinHandle<crate::server::Result<()>>,
    tokio::sync::oneshot::Sender<()>,
)> {
    let (client, node_name) = (&base.client, &base.node_name);
    // The node API drains once the pod workers have stopped on SIGTERM/SIGINT.
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let mut config = server_config(&base.args, &base.settings, client, node_name, &base.node_ip)?;
    config.kubelet_config = configz;
    config.credential_providers = base
        .credential_providers
        .as_ref()
        .map(|p| p.summary().clone());
    let server = tokio::spawn(crate::server::serve_until(
        config,
        crate::server::Deps {
            client: client.clone(),
            pods: store.clone(),
            statuses: ctx.status().clone(),
            explanations: ctx.explanations().clone(),
            runtime: base.runtime.runtime.clone(),
            stats: stats.clone(),
        },
        async {
            let _ = server_stopped.await;
        },
    ));
    Ok((server, stop_server))
}

/// Starts listening for SIGTERM and SIGINT: the flag turns true at the
/// first, and then the pod workers finish what they do (at most
/// [`WORKER_GRACE`]) and the node API drains (the kubelet's shutdown on a
/// signal).
fn stop_on_signal() -> tokio::sync::watch::Receiver<bool> {
    let (stop_tx, stopping) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        stop_signal().await;
        let _ = stop_tx.send(true);
    });
    stopping
}

/// The pod controller: a pod is synced when its source says so
/// (`triggers`), when the PLEG sees its containers change and when a probe
/// asks; it stops taking work once `stopping` turns true (the kubelet's
/// `syncLoop`).
fn pod_controller(
    triggers: tokio::sync::mpsc::UnboundedReceiver<Pod>,
    store: &reflector::Store<Pod>,
    pleg_events: futures::stream::BoxStream<'static, reflector::ObjectRef<Pod>>,
    probe_rx: tokio::sync::mpsc::UnboundedReceiver<reflector::ObjectRef<Pod>>,
    stopping: &tokio::sync::watch::Receiver<bool>,
) -> Controller<Pod> {
    let pod_events = tokio_stream::wrappers::UnboundedReceiverStream::new(triggers)
        .map(Ok::<Pod, watcher::Error>);
    Controller::for_stream(pod_events, store.clone())
        .reconcile_on(futures::stream::select(
            pleg_events,
            tokio_stream::wrappers::UnboundedReceiverStream::new(probe_rx),
        ))
        .graceful_shutdown_on({
            let mut stopping = stopping.clone();
            async move {
                let _ = stopping.wait_for(|s| *s).await;
            }
        })
}

/// The node's, pods' and volumes' stats, with the CSI drivers' volumes and
/// the pod cgroups when there are some (the kubelet's stats provider).
fn stats_provider(
    node_name: &str,
    runtime: &Runtime,
    settings: &Settings,
    drivers: &crate::plugin_manager::Drivers,
    cgroups: Option<crate::cgroups::CgroupManager>,
) -> Arc<crate::stats::Provider> {
    let mut stats = crate::stats::Provider::new(
        node_name,
        runtime.clone(),
        settings.root_dir.clone(),
        settings.pod_logs_dir.clone(),
    )
    .with_csi(drivers.clone())
    .with_volume_stats_agg_period(settings.volume_stats_agg_period);
    if let Some(manager) = cgroups {
        stats = stats.with_pod_cgroups(manager);
    }
    Arc::new(stats)
}

/// Starts housekeeping, every 2 s once every pod source listed, as the
/// kubelet's `HandlePodCleanups`: forgets the pods gone, syncs the pod
/// cgroups, deletes orphaned mirror pods, cleans up what the runtime and
/// the disk hold of pods no source has, and records the pod counts.
fn spawn_housekeeping(
    ctx: &Arc<worker::Context>,
    runtime: &Runtime,
    client: &Client,
    settings: &Settings,
    store: reflector::Store<Pod>,
    mut listed: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let runtime = runtime.clone();
    let pod_logs_dir = settings.pod_logs_dir.clone();
    let volumes = ctx.volumes().clone();
    let client = client.clone();
    let ctx = ctx.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(2));
        let _ = listed.wait_for(|listed| *listed).await;
        loop {
            tick.tick().await;
            housekeeping::forget_gone(&ctx, &store);
            housekeeping::unprepare_inactive_claims(&ctx, &store).await;
            housekeeping::sync_pod_cgroups(&ctx, &store);
            housekeeping::delete_orphan_mirrors(&client, ctx.sources()).await;
            let cleaned =
                housekeeping::cleanup_orphans(&runtime, &client, &store, &volumes, &pod_logs_dir);
            let runtime_only = match cleaned.await {
                Ok(cleaned) => cleaned.left,
                Err(e) => {
                    warn!(error = %e, "housekeeping");
                    0
                }
            };
            housekeeping::record_pod_counts(&ctx, runtime_only);
        }
    })
}

/// Runs the pod workers (`pods`) until a signal (`stopping`) stopped them or
/// [`WORKER_GRACE`] after it, then drains the node API (`stop_server`,
/// awaited at most [`crate::server::DRAIN`] and 1 s); the node API failing
/// or the certificate's rotation ending first is fatal, as for the kubelet.
///
/// # Errors
/// The node API failed (port in use, bad certificate), or the client
/// certificate's rotation ended.
async fn until_stopped(
    pods: impl std::future::Future<Output = ()>,
    mut stopping: tokio::sync::watch::Receiver<bool>,
    mut server: tokio::task::JoinHandle<crate::server::Result<()>>,
    stop_server: tokio::sync::oneshot::Sender<()>,
    rotation: Rotation,
) -> anyhow::Result<()> {
    let workers_overdue = async move {
        let _ = stopping.wait_for(|s| *s).await;
        tokio::time::sleep(WORKER_GRACE).await;
    };
    tokio::select! {
        () = async {
            tokio::select! {
                () = pods => {}
                () = workers_overdue => warn!(
                    grace_seconds = WORKER_GRACE.as_secs(),
                    "pod workers still busy after the grace period; stopping without them"
                ),
            }
        } => {
            // A signal stopped the pod workers: drain the node API, then go.
            let _ = stop_server.send(());
            let drained = tokio::time::timeout(
                crate::server::DRAIN + Duration::from_secs(1),
                &mut server,
            )
            .await;
            match drained {
                Ok(Ok(Ok(()))) | Err(_) => Ok(()),
                Ok(r) => Err(server_failed(r)),
            }
        }
        r = &mut server => Err(server_failed(r)),
        r = rotation => Err(match r {
            Ok(e) => e.context("client certificate rotation"),
            Err(e) => anyhow!("client certificate rotation task: {e}"),
        }),
    }
}

/// The error of the node API's task having ended: its failing to start
/// (port in use, bad certificate) is fatal, as for the kubelet.
fn server_failed(
    r: std::result::Result<crate::server::Result<()>, tokio::task::JoinError>,
) -> anyhow::Error {
    match r {
        Ok(Ok(())) => anyhow!("node API server stopped"),
        Ok(Err(e)) => anyhow!(e).context("node API server"),
        Err(e) => anyhow!("node API server task: {e}"),
    }
}

/// What can be read of DaemonSet `ns`/`name` ([`crate::node::reset::owner`]);
/// None, after a warning, when the read failed.
async fn read_owner(client: &Client, ns: &str, name: &str) -> Option<crate::node::reset::Owner> {
    crate::node::reset::owner(client, ns, name)
        .await
        .inspect_err(|e| warn!(daemonset = %format!("{ns}/{name}"), error = %e, "read the agent's DaemonSet"))
        .ok()
}

/// On a stop with --reset-when-gone: resets the node
/// ([`crate::node::reset::reset`]) when the `owner` DaemonSet was
/// uninstalled ([`crate::node::reset::uninstalled`], from what was read of
/// it at the start and now), and leaves everything running otherwise.
async fn reset_if_uninstalled(owner: &ResetOwner, target: crate::node::reset::Target<'_>) {
    let (ns, name) = (&owner.ns, &owner.name);
    let daemonset = format!("{ns}/{name}");
    let now = read_owner(&owner.client, ns, name).await;
    if crate::node::reset::uninstalled(owner.at_start, now) {
        info!(daemonset, read = ?now, "the agent's DaemonSet is uninstalled: resetting the node");
        let report = crate::node::reset::reset(target).await;
        for e in &report.errors {
            warn!(error = e, "node reset");
        }
    } else {
        info!(daemonset, read = ?now, "not an uninstall: pods left running for the next agent");
    }
}

/// The runtime's cgroup driver (CRI `RuntimeConfig`), asked up to 3 times
/// 2 s apart as the kubelet asks; None when the runtime does not name one
/// (`configured` stands then). A driver other than `configured` is said
/// once.
///
/// # Errors
/// The runtime did not answer the third time, or named an unknown driver.
async fn runtime_cgroup_driver(
    runtime: &Runtime,
    configured: &str,
) -> anyhow::Result<Option<&'static str>> {
    let mut driver = runtime.cgroup_driver().await;
    for _ in 1..3 {
        if driver.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        driver = runtime.cgroup_driver().await;
    }
    match driver {
        Ok(Some(driver)) if driver != configured => info!(
            configured,
            runtime = driver,
            "cgroup driver: the runtime's, not the configured one"
        ),
        Ok(Some(_)) => {}
        Ok(None) => info!(
            driver = configured,
            "the runtime does not name its cgroup driver: the configured one"
        ),
        Err(e) => anyhow::bail!("container runtime's cgroup driver: {e}"),
    }
    Ok(driver.ok().flatten())
}

/// The pod and QoS cgroups of `cgroupsPerQOS` (none when it is off), with
/// the QoS hierarchy made and, with `enforceNodeAllocatable: [pods]`,
/// `kubepods` limited to the machine's capacity less `kubeReserved` and
/// `systemReserved`, as the kubelet's node allocatable enforcement, on
/// cgroup v1 or v2 ([`crate::cgroups::CgroupManager::detect`]), with the
/// `cgroupfs` driver or, for `cgroupDriver: systemd`, as systemd's slices
/// ([`crate::cgroups::CgroupManager::using_systemd`]).
///
/// # Errors
/// Neither cgroup version offers cpu and memory, systemd cannot be reached
/// for the `systemd` driver, or the hierarchy could not be made (the agent
/// would run pods with less isolation than configured), as the kubelet will
/// not start then.
fn pod_cgroups(
    settings: &Settings,
    machine: &MachineInfo,
) -> anyhow::Result<Option<crate::cgroups::CgroupManager>> {
    if !settings.cgroups_per_qos {
        if settings.pod_pids_limit > 0 {
            warn!(
                pod_pids_limit = settings.pod_pids_limit,
                "podPidsLimit has no effect with cgroupsPerQOS false: pods get no cgroups of their own (as the kubelet's)"
            );
        }
        return Ok(None);
    }
    let Some(mut manager) = crate::cgroups::CgroupManager::detect(
        Path::new("/sys/fs/cgroup"),
        &settings.cgroup_root,
        "kubepods",
    ) else {
        anyhow::bail!(
            "cgroupsPerQOS: /sys/fs/cgroup has neither cgroup v1 cpu and memory hierarchies nor a cgroup v2 root offering cpu and memory"
        );
    };
    if settings.cgroup_driver == "systemd" {
        let systemd = crate::systemd::Systemd::connect()
            .map_err(|e| anyhow::anyhow!("cgroupDriver systemd: {e}"))?;
        manager = manager.using_systemd(systemd, &settings.cgroup_root, "kubepods");
    }
    let manager = manager
        .with_pod_pids_limit(settings.pod_pids_limit)?
        .with_cpu_period(settings.cpu_period_us())
        .with_huge_pages(
            machine
                .huge_pages
                .iter()
                .map(|(kib, pages)| {
                    let size = kib.saturating_mul(1024);
                    (size, size.saturating_mul(*pages))
                })
                .collect(),
        );
    if !manager.limits_huge_pages() && machine.huge_pages.iter().any(|(_, pages)| *pages > 0) {
        warn!(
            "the node has huge pages but no hugetlb cgroup controller: pods' huge page requests are not enforced as limits"
        );
    }
    info!(version = ?manager.version(), driver = settings.cgroup_driver, pod_pids_limit = settings.pod_pids_limit, "pod cgroups");
    let reserved = |name: &str| -> i128 {
        [
            &settings.reservations.kube_reserved,
            &settings.reservations.system_reserved,
        ]
        .iter()
        .filter_map(|m| m.get(name))
        .filter_map(|q| crate::resource::Quantity::parse_saturating(q).ok())
        .map(|q| {
            if name == "cpu" {
                q.milli_value()
            } else {
                q.value()
            }
        })
        .fold(0, i128::saturating_add)
    };
    let node = settings
        .enforce_node_allocatable
        .iter()
        .any(|e| e == "pods")
        .then(|| {
            let cpu = i128::from(machine.cpus)
                .saturating_mul(1000)
                .saturating_sub(reserved("cpu"))
                .max(0);
            let memory = i128::from(machine.memory_bytes)
                .saturating_sub(reserved("memory"))
                .max(0);
            crate::cgroups::Limits {
                cpu_shares: u64::try_from(crate::pod_core::translate::cpu_shares(
                    i64::try_from(cpu).unwrap_or(i64::MAX),
                ))
                .unwrap_or(2),
                cpu_quota: None,
                memory: Some(i64::try_from(memory).unwrap_or(i64::MAX)),
            }
        });
    manager
        .ensure_qos(node)
        .context("make the QoS cgroups (cgroupsPerQOS)")?;
    Ok(Some(manager))
}

/// Node allocatable enforced beyond `pods`, as the kubelet's
/// `enforceNodeAllocatableCgroups`: with `system-reserved` and
/// `kube-reserved`, their existing cgroups get what `systemReserved` and
/// `kubeReserved` hold (cpu as shares, memory, `pid`, huge pages). Returns
/// the notes of the kubelet's `NodeAllocatableEnforced` Node events, the
/// `pods` one first.
///
/// # Errors
/// A cgroup missing or refusing a limit, in the kubelet's words (`Failed to
/// enforce System Reserved Cgroup Limits on "/system.slice": …`): the
/// kubelet does not start either.
fn enforce_allocatable(
    settings: &Settings,
    manager: &crate::cgroups::CgroupManager,
) -> anyhow::Result<Vec<String>> {
    let has = |k: &str| settings.enforce_node_allocatable.iter().any(|e| e == k);
    let mut notes = Vec::new();
    if has("pods") {
        notes.push("Updated Node Allocatable limit across pods".to_string());
    }
    let reservations = &settings.reservations;
    for (key, what, title, cgroup, list) in [
        (
            "system-reserved",
            "system reserved",
            "System Reserved",
            &settings.system_reserved_cgroup,
            &reservations.system_reserved,
        ),
        (
            "kube-reserved",
            "kube reserved",
            "Kube Reserved",
            &settings.kube_reserved_cgroup,
            &reservations.kube_reserved,
        ),
    ] {
        if !has(key) {
            continue;
        }
        let parsed: std::collections::BTreeMap<String, crate::resource::Quantity> = list
            .iter()
            .filter_map(|(k, v)| {
                let q = crate::resource::Quantity::parse_saturating(v).ok()?;
                Some((k.clone(), q))
            })
            .collect();
        let quantity = |name: &str| parsed.get(name).copied();
        let to_i64 = |v: i128| i64::try_from(v).unwrap_or(i64::MAX);
        let reserved = crate::cgroups::Reserved {
            cpu_shares: quantity("cpu").map(|q| {
                let shares = crate::pod_core::translate::cpu_shares(to_i64(q.milli_value()));
                u64::try_from(shares).unwrap_or(2)
            }),
            memory: quantity("memory").map(|q| to_i64(q.value())),
            pids: quantity("pid").map(|q| to_i64(q.value())),
            huge_pages: crate::pod_core::limits::huge_page_limits(&parsed),
        };
        manager.enforce_reserved(cgroup, &reserved).map_err(|e| {
            anyhow::anyhow!("Failed to enforce {title} Cgroup Limits on {cgroup:?}: {e}")
        })?;
        info!(cgroup = %cgroup, ?reserved, "{what} cgroup limited");
        notes.push(format!("Updated limits on {what} cgroup {cgroup}"));
    }
    Ok(notes)
}

/// The image pull concurrency of the settings' `serializeImagePulls` and
/// `maxParallelImagePulls`.
fn pull_concurrency(settings: &Settings) -> PullConcurrency {
    match (
        settings.serialize_image_pulls,
        settings.max_parallel_image_pulls,
    ) {
        (true, _) => PullConcurrency::Serial,
        (false, Some(n)) => PullConcurrency::Limited(n),
        (false, None) => PullConcurrency::Unlimited,
    }
}

/// The pod worker, timed into `kubelet_pod_worker_duration_seconds` (`create`
/// on a pod's first pass, `sync` after) and, once the pod is seen Running,
/// `kubelet_pod_start_duration_seconds`, as the kubelet's pod workers record them,
/// in the kubelet's `syncPod` span ([`crate::otel::sync_span`]).
/// A panic in a sync fails that sync only ([`worker::isolated`]).
async fn reconcile_measured(
    pod: Arc<Pod>,
    ctx: Arc<worker::Context>,
) -> Result<kube::runtime::controller::Action, worker::Error> {
    use kube::ResourceExt as _;
    let m = crate::metrics::metrics();
    let uid = pod.uid().unwrap_or_default();
    let pod_phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    let finishing =
        pod.metadata.deletion_timestamp.is_some() || pod_phase.is_some_and(phase::is_terminal);
    let op = if finishing {
        m.pod_gone(&uid);
        "sync"
    } else if m.pod_seen(&uid) {
        "create"
    } else {
        "sync"
    };
    if pod_phase == Some(phase::RUNNING) {
        m.pod_running(&uid);
    }
    let started = Instant::now();
    let terminating = pod.metadata.deletion_timestamp.is_some() || ctx.eviction(&uid).is_some();
    let span = crate::otel::sync_span(&pod, op, terminating);
    let sync = worker::reconcile(pod.clone(), ctx.clone());
    let result =
        tracing::Instrument::instrument(worker::isolated(&pod, &ctx, sync), span.clone()).await;
    if let Err(error) = &result {
        crate::otel::record_error(&span, error);
    }
    m.record_pod_worker(op, started.elapsed());
    result
}

/// The node API's configuration from flags and settings.
fn server_config(
    args: &RunArgs,
    settings: &Settings,
    client: &Client,
    node_name: &str,
    node_ip: &str,
) -> anyhow::Result<crate::server::ServerConfig> {
    let ip = node_ip
        .parse()
        .with_context(|| format!("node IP {node_ip:?}"))?;
    let mut cfg = crate::server::ServerConfig::new(
        node_name,
        vec![ip],
        settings.root_dir.join("pki"),
        settings.pod_logs_dir.clone(),
    );
    cfg.port = u16::try_from(settings.port)
        .with_context(|| format!("port {} is not a TCP port", settings.port))?;
    cfg.healthz_port = (settings.healthz_port != 0).then_some(settings.healthz_port);
    cfg.address = settings.address;
    cfg.healthz_address = settings.healthz_bind_address;
    cfg.read_only_port = (settings.read_only_port != 0).then_some(settings.read_only_port);
    let files = match (&args.tls_cert_file, &args.tls_private_key_file) {
        (Some(cert), Some(key)) => Some((cert, key)),
        _ => settings
            .tls_cert_file
            .as_ref()
            .zip(settings.tls_private_key_file.as_ref()),
    };
    if let Some((cert, key)) = files {
        cfg.serving_cert = crate::server::ServingCert::Files {
            cert: cert.clone(),
            key: key.clone(),
        };
    } else if (settings.server_tls_bootstrap || args.rotate_server_certificates)
        && settings.rotate_server_certificate
    {
        // As the kubelet: given files win over bootstrapping.
        let slot = crate::server::csr::CertSlot::default();
        tokio::spawn(
            crate::server::csr::Manager {
                client: client.clone(),
                node: node_name.to_string(),
                names: vec![node_name.to_string()],
                ips: vec![ip],
                dir: settings.root_dir.join("pki"),
                slot: slot.clone(),
            }
            .run(),
        );
        cfg.serving_cert = crate::server::ServingCert::Bootstrap(slot);
    }
    cfg.client_ca_file = args
        .client_ca_file
        .clone()
        .or_else(|| settings.client_ca_file.clone());
    cfg.reload = crate::server::tls::Reload {
        serving_files: settings.reload_server_certificate_file,
        client_ca: settings.reload_client_ca_file,
    };
    cfg.kubelet_config = tokio::sync::watch::channel(settings.effective()).1;
    cfg.started = args.invocation.started;
    cfg.flags = args.invocation.flags.clone();
    cfg.auth_ttls = crate::server::auth::CacheTtls {
        token: settings.authentication_cache_ttl,
        allowed: settings.authorization_cache_authorized_ttl,
        denied: settings.authorization_cache_unauthorized_ttl,
    };
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbosity_picks_the_agents_log_level() {
        assert_eq!(log_directives(0), "info");
        assert_eq!(log_directives(2), "info");
        assert_eq!(log_directives(4), "info,rustlet=debug");
        assert_eq!(log_directives(10), "info,rustlet=trace");
        for v in [0, 4, 10] {
            assert!(tracing_subscriber::EnvFilter::try_new(log_directives(v)).is_ok());
        }
    }

    #[tokio::test]
    async fn the_node_api_listens_where_the_file_says_and_the_healthz_flag_wins() {
        let run_args = |extra: &[&str]| {
            let mut argv = vec!["rustlet", "run"];
            argv.extend_from_slice(extra);
            match <Cli as clap::Parser>::try_parse_from(argv).unwrap().command {
                Command::Run(args) => args,
                _ => panic!("not run"),
            }
        };
        let api = crate::fake_api::FakeApi::default();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.yaml");
        std::fs::write(
            &file,
            "address: 127.0.0.2\nhealthzPort: 11248\nhealthzBindAddress: 127.0.0.3\nmaxPods: 20\n",
        )
        .unwrap();
        let config = file.to_str().unwrap();
        let settings = super::settings(&run_args(&["--config", config])).unwrap();
        let cfg =
            server_config(&run_args(&[]), &settings, &api.client(), "n1", "10.0.0.1").unwrap();
        assert_eq!(cfg.address.to_string(), "127.0.0.2");
        assert_eq!(cfg.healthz_address.to_string(), "127.0.0.3");
        assert_eq!(cfg.healthz_port, Some(11248));
        // Where each field came from: the file, a flag, or the default.
        let flags = run_args(&[
            "--config",
            config,
            "--healthz-port",
            "0",
            "--pod-logs-dir",
            "/logs",
        ]);
        let settings = super::settings(&flags).unwrap();
        let cfg = server_config(&flags, &settings, &api.client(), "n1", "10.0.0.1").unwrap();
        assert_eq!(cfg.healthz_port, None);
        let sources = settings.configuration_sources();
        let from = |field: &str| {
            sources["kubeletconfig"][field]
                .as_str()
                .unwrap_or("absent")
                .to_string()
        };
        assert_eq!(from("maxPods"), format!("file {config}"));
        assert_eq!(from("address"), format!("file {config}"));
        assert_eq!(from("healthzPort"), "flag --healthz-port");
        assert_eq!(from("podLogsDir"), "flag --pod-logs-dir");
        assert_eq!(from("evictionHard"), "default");
        // Without a file, the kubelet's defaults.
        let cfg = server_config(
            &run_args(&[]),
            &Settings::default(),
            &api.client(),
            "n1",
            "10.0.0.1",
        )
        .unwrap();
        assert_eq!(
            (
                cfg.address.to_string(),
                cfg.healthz_address.to_string(),
                cfg.healthz_port
            ),
            ("0.0.0.0".to_string(), "127.0.0.1".to_string(), Some(10248))
        );
    }
}
