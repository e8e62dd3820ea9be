//! Wiring: one `kube::Client`, one CRI handle, the node's registration, status
//! and Lease loops, housekeeping, and the pod controller; shutdown on signal.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};
use clap::Parser;
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

/// Entry point of the `rustlet` binary: parses flags, runs, and turns any error
/// into one line on stderr and exit code 1 (2 for bad flags).
#[must_use]
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            // One line for a bad flag: clap's first line, without its usage block.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            eprintln!("rustlet: {first}");
            return ExitCode::from(2);
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    match cli.command {
        Command::Version => {
            println!(
                "rustlet {} (kubelet {})",
                env!("CARGO_PKG_VERSION"),
                crate::KUBERNETES_VERSION
            );
            ExitCode::SUCCESS
        }
        Command::DeleteNodes(args) => {
            init_logging(LogFormat::Plain);
            let deleted = async {
                let config = kube_config(args.kubeconfig.as_deref()).await?;
                let client = Client::try_from(config).context("build API client")?;
                crate::node::reset::delete_nodes(&client, &args.selector)
                    .await
                    .with_context(|| format!("delete the nodes of {:?}", args.selector))
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build();
            match rt
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(deleted))
            {
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
        Command::Run(args) => {
            init_logging(args.log_format);
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
            let code = match rt.block_on(run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("rustlet: error: {}", one_line(&format!("{e:#}")));
                    ExitCode::FAILURE
                }
            };
            // Work still under way (a pod worker's blocking volume set-up)
            // does not hold the exit: what it left is adopted at the next
            // start.
            rt.shutdown_timeout(Duration::from_secs(1));
            code
        }
    }
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

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder.init(),
        LogFormat::Json => builder.json().init(),
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
    if let Some(v) = args.minimum_image_ttl_duration {
        s.image_gc.min_age = v;
    }
    Ok(s)
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

/// Runs the agent until SIGINT/SIGTERM.
///
/// # Errors
/// Bad configuration, an unreadable kubeconfig or an unreachable runtime at
/// start; later failures are retried and logged instead.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let settings = settings(&args)?;
    if settings.fail_swap_on == Some(true) {
        check_no_swap(Path::new("/proc/swaps"))?;
    }
    let cert_dir = args
        .cert_dir
        .clone()
        .unwrap_or_else(|| settings.root_dir.join("pki"));
    let node = args.node_name.clone().unwrap_or_else(hostname);
    // As the kubelet: with rotateCertificates the TLS bootstrap runs in the
    // background (static pods, the API server's own included, run
    // meanwhile); without it, the agent waits for its certificate.
    let mut pending = None;
    if let (Some(bootstrap), Some(kubeconfig)) = (&args.bootstrap_kubeconfig, &args.kubeconfig)
        && !crate::node::bootstrap::kubeconfig_usable(kubeconfig)
    {
        if settings.rotate_certificates {
            pending = Some(
                crate::node::bootstrap::Pending::new(bootstrap, kubeconfig, &cert_dir, &node)
                    .await
                    .context("TLS bootstrap")?,
            );
        } else {
            crate::node::bootstrap::ensure(kubeconfig, bootstrap, &cert_dir, &node)
                .await
                .context("TLS bootstrap")?;
        }
    }
    let (client, rotation) = if let Some(pending) = pending {
        let config = pending.anonymous_config().await.context("TLS bootstrap")?;
        let (client, rotation) =
            crate::node::client_cert::Rotation::bootstrapping(&config, &cert_dir, &node, pending)
                .context("rotateCertificates")?;
        let rotation = tokio::spawn(rotation.run(client.clone()));
        (client, futures::future::Either::Left(rotation))
    } else if settings.rotate_certificates {
        let config = kube_config(args.kubeconfig.as_deref()).await?;
        let (client, rotation) =
            crate::node::client_cert::Rotation::start(&config, &cert_dir, &node)
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
    };
    // The DaemonSet of --reset-when-gone is read with the pod's own
    // ServiceAccount, which the node's credentials cannot stand in for: the
    // bootstrap kubeconfig's (the chart's carries its token and the API
    // server's address the host network reaches), else the in-cluster one.
    let owner = match &args.reset_when_gone {
        Some((ns, name)) => {
            let config = kube_config(args.bootstrap_kubeconfig.as_deref())
                .await
                .context("--reset-when-gone: the ServiceAccount's credentials")?;
            let owner_client =
                Client::try_from(config).context("build the ServiceAccount's API client")?;
            let at_start = read_owner(&owner_client, ns, name).await;
            if at_start != Some(crate::node::reset::Owner::There) {
                warn!(
                    daemonset = %format!("{ns}/{name}"),
                    read = ?at_start,
                    "the agent's DaemonSet cannot be read now: an uninstall is known only by its absence"
                );
            }
            Some((owner_client, ns.clone(), name.clone(), at_start))
        }
        None => None,
    };
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
    let runtime_rro = match runtime.status().await {
        Ok(status) => {
            crate::pod_core::translate::handler_supports_rro(&status.runtime_handlers, "")
        }
        Err(e) => {
            warn!(error = %e, "runtime status: recursive read-only mounts taken as unsupported");
            false
        }
    };
    // The runtime's cgroup driver wins over the configured one, as with
    // the kubelet: the two must agree on how cgroup parents are named.
    let mut settings = settings;
    if let Some(driver) = runtime_cgroup_driver(&runtime, &settings.cgroup_driver).await? {
        settings.cgroup_driver = driver.to_string();
    }
    let runtime_version = format!(
        "{}://{}",
        version.runtime_name,
        version.runtime_version.trim_start_matches('v')
    );
    let node_name = node.clone();
    let node_ip = args
        .node_ip
        .map_or_else(|| "127.0.0.1".to_string(), |ip| ip.to_string());
    info!(node = node_name, runtime = runtime_version, "starting");
    // As the kubelet with maxOpenFiles: every connection, log and volume
    // takes a descriptor.
    match crate::server::raise_open_files_limit(crate::server::MAX_OPEN_FILES) {
        Ok(n) => info!(open_files = n, "open-file limit"),
        Err(e) => warn!(error = %e, "failed to raise the open-file limit"),
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

    let node_cfg = NodeConfig {
        name: node_name.clone(),
        ips: vec![node_ip.clone()],
        hostname: node_name.clone(),
        max_pods: settings.max_pods,
        port: settings.port,
        version: crate::node_version(),
        reserved: settings.reservations.clone(),
        max_images: settings.node_status_max_images,
        extra_labels: args.node_labels.clone(),
        taints: settings.register_with_taints.clone(),
    };
    let machine = MachineInfo::read(&settings.root_dir);
    crate::node::status::check_reservations(&machine, settings.max_pods, &settings.reservations)
        .map_err(|e| anyhow::anyhow!(e))?;
    let thresholds = crate::eviction::thresholds(
        &settings.reservations.eviction_hard,
        &settings.eviction.soft,
        &settings.eviction.soft_grace,
        &settings.eviction.minimum_reclaim,
    )
    .map_err(|e| anyhow::anyhow!("invalid eviction configuration: {e}"))?;
    let (pressures_tx, pressures) = tokio::sync::watch::channel(Vec::new());
    let (_, allocatable) =
        crate::node::status::resources(&machine, settings.max_pods, &settings.reservations);
    // CSI drivers register through <root-dir>/plugins_registry; the volume
    // manager sets up their volumes.
    let drivers = crate::plugin_manager::Drivers::default();
    let volumes = VolumeManager::new(client.clone(), &settings.root_dir, allocatable.clone())
        .with_csi(drivers.clone(), &node_name);
    let cgroups = pod_cgroups(&settings, &machine)?;
    let stats_cgroups = cgroups.clone();
    // Registration retries until the API server answers, in the background:
    // static pods start meanwhile, as the kubelet runs them without it.
    let registered = tokio::spawn({
        let (client, runtime, node_cfg, machine, version) = (
            client.clone(),
            runtime.clone(),
            node_cfg.clone(),
            machine.clone(),
            runtime_version.clone(),
        );
        async move {
            crate::node::registration::register(&client, &runtime, &node_cfg, &machine, &version)
                .await
        }
    });
    let node_store = crate::node::registration::watch_node(client.clone(), &node_name);
    // Device plugins register on <device-plugins-dir>/kubelet.sock.
    let devices = crate::device_manager::DeviceManager::new(
        args.device_plugins_dir
            .as_deref()
            .unwrap_or(Path::new(crate::device_manager::DEFAULT_DIR)),
    );
    devices.serve()?;
    tokio::spawn(crate::node::registration::status_loop(
        client.clone(),
        crate::node::registration::Observed {
            store: node_store.clone(),
            pressures: pressures.clone(),
            devices: Some(devices.clone()),
        },
        runtime.clone(),
        node_cfg.clone(),
        machine.clone(),
        runtime_version,
        settings.clone(),
    ));
    tokio::spawn(
        crate::plugin_manager::PluginManager::new(
            client.clone(),
            &settings.root_dir,
            &node_name,
            drivers.clone(),
        )
        .run(),
    );
    tokio::spawn(crate::log_manager::run(
        runtime.clone(),
        settings.pod_logs_dir.clone(),
        crate::paths::CONTAINER_LOGS_DIR.into(),
        settings.container_logs,
    ));
    tokio::spawn({
        let (client, node_name) = (client.clone(), node_name.clone());
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

    let host_dns =
        HostDns::parse(&std::fs::read_to_string(&settings.resolv_conf).unwrap_or_default());
    let (pleg_events, pleg_connected) = pleg::start(&runtime);
    let recorder = crate::events::Recorder::new(client.clone(), node_name.clone());
    let (probe_tx, probe_rx) = tokio::sync::mpsc::unbounded_channel();
    let prober = crate::prober::manager::Manager::new(runtime.clone(), recorder.clone(), probe_tx);
    // The stores exist before the controller, so the context is built once.
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
    // The pods to run: those bound to the node in the API server, merged
    // with the static pods of the manifests.
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
    let store = sources.store();
    // True once every source listed. Housekeeping waits for it rather than
    // for the store's readiness, which wakes only one waiter (the controller's).
    let mut listed = outputs.ready;
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
    let pod_events = tokio_stream::wrappers::UnboundedReceiverStream::new(outputs.triggers)
        .map(Ok::<Pod, watcher::Error>);
    let node = NodeContext {
        node_name: node_name.clone(),
        node_ips: vec![node_ip.clone()],
        pod_logs_dir: settings.pod_logs_dir.clone(),
        root_dir: settings.root_dir.clone(),
        host_dns,
        cluster_dns: settings.cluster_dns.clone(),
        cluster_domain: settings.cluster_domain.clone(),
        allocatable: allocatable.clone(),
        memory_capacity_bytes: machine.memory_bytes,
        hosts_file: crate::pod_core::hosts::ETC_HOSTS_PATH.into(),
        allowed_unsafe_sysctls: settings.allowed_unsafe_sysctls.clone(),
        seccomp_default: settings.seccomp_default,
        apparmor_enabled: apparmor_enabled(),
        user_namespaces_support: settings.user_namespaces_support,
        initial_labels: crate::node::status::labels(&node_cfg),
        initial_taints: node_cfg.taints.clone(),
    };
    let ctx = Arc::new(worker::Context {
        runtime: RuntimeManager {
            runtime: runtime.clone(),
            images: ImageManager::new(
                runtime.clone(),
                client.clone(),
                recorder.clone(),
                pull_concurrency(&settings),
            )
            .with_pull_records(&settings.root_dir),
            sources: SourceReader {
                client: client.clone(),
                services,
                services_listed,
            },
            recorder,
            node,
            pods: store.clone(),
            client: client.clone(),
            userns: crate::pod::userns::UsernsManager::new(
                &settings.root_dir,
                usize::try_from(settings.max_pods).unwrap_or(usize::MAX),
            ),
            log_links_dir: crate::paths::CONTAINER_LOGS_DIR.into(),
            cgroups: cgroups.clone(),
            devices: Some(devices),
        },
        status: Arc::new(StatusManager::new(client.clone(), sources.clone())),
        status_context: StatusContext {
            host_ips: vec![node_ip.clone()],
            runtime_name: version.runtime_name.clone(),
            runtime_rro,
        },
        volumes: Arc::new(volumes),
        prober,
        pleg_connected,
        node_store,
        admission: crate::pod::admission_manager::AdmissionManager::new(),
        pressures,
        evictions: std::sync::Mutex::default(),
        sources: sources.clone(),
        allocations: crate::pod::allocation::Allocations::load(&settings.root_dir),
    });
    // The pod resources API on <root-dir>/pod-resources/kubelet.sock: the
    // active pods are those whose phase, as last sent, is not terminal.
    let lister: crate::pod_resources::PodsProvider = {
        let (store, status) = (store.clone(), ctx.status.clone());
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
    crate::pod_resources::serve(&settings.root_dir, lister, ctx.runtime.devices.clone())?;
    // SIGTERM or SIGINT: the pod workers finish what they do (at most
    // WORKER_GRACE), then the node API drains.
    let (stop_tx, stopping) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        stop_signal().await;
        let _ = stop_tx.send(true);
    });
    let controller = Controller::for_stream(pod_events, store.clone())
        .reconcile_on(futures::stream::select(
            pleg_events,
            tokio_stream::wrappers::UnboundedReceiverStream::new(probe_rx),
        ))
        .graceful_shutdown_on({
            let mut stopping = stopping.clone();
            async move {
                let _ = stopping.wait_for(|s| *s).await;
            }
        });
    let mut stats = crate::stats::Provider::new(
        &node_name,
        runtime.clone(),
        settings.root_dir.clone(),
        settings.pod_logs_dir.clone(),
    )
    .with_csi(drivers.clone());
    if let Some(manager) = stats_cgroups {
        stats = stats.with_pod_cgroups(manager);
    }
    let stats = Arc::new(stats);
    let image_gc = crate::image_gc::ImageGc::new(
        runtime.clone(),
        stats.clone(),
        settings.image_gc,
        ctx.runtime.recorder.clone(),
        node_name.clone(),
    );
    tokio::spawn(image_gc.clone().run());
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
    tokio::spawn(crate::eviction::manager::run(
        crate::eviction::manager::Config {
            node_name: node_name.clone(),
            thresholds,
            transition: settings.eviction.pressure_transition_period,
            hugepages_bytes: if stats.node_memory_counts_hugepages() {
                0
            } else {
                machine.huge_pages.iter().fold(0u64, |sum, (kib, pages)| {
                    sum.saturating_add(kib.saturating_mul(1024).saturating_mul(*pages))
                })
            },
            max_pod_grace: settings.eviction.max_pod_grace_period,
        },
        stats.clone(),
        ctx.runtime.recorder.clone(),
        Arc::new(crate::pod::eviction_pods::EvictionPods::new(
            ctx.clone(),
            container_gc,
        )),
        image_gc,
        pressures_tx,
    ));
    tokio::spawn({
        let stats = stats.clone();
        async move { stats.sample().await }
    });
    // The node API drains once the pod workers have stopped on SIGTERM/SIGINT.
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let mut server = tokio::spawn(crate::server::serve_until(
        server_config(&args, &settings, &client, &node_name, &node_ip)?,
        crate::server::Deps {
            client: client.clone(),
            pods: store.clone(),
            statuses: ctx.status.clone(),
            runtime: runtime.clone(),
            stats: stats.clone(),
        },
        async {
            let _ = server_stopped.await;
        },
    ));
    let housekeeping = tokio::spawn({
        let runtime = runtime.clone();
        let pod_logs_dir = settings.pod_logs_dir.clone();
        let volumes = ctx.volumes.clone();
        let client = client.clone();
        let ctx = ctx.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(2));
            let _ = listed.wait_for(|listed| *listed).await;
            loop {
                tick.tick().await;
                housekeeping::forget_gone(&ctx, &store);
                housekeeping::sync_pod_cgroups(&ctx, &store);
                housekeeping::delete_orphan_mirrors(&client, &ctx.sources).await;
                let cleaned = housekeeping::cleanup_orphans(
                    &runtime,
                    &client,
                    &store,
                    &volumes,
                    &pod_logs_dir,
                );
                let runtime_only = match cleaned.await {
                    Ok(cleaned) => cleaned.left,
                    Err(e) => {
                        warn!(error = %e, "housekeeping");
                        0
                    }
                };
                housekeeping::record_pod_counts(&ctx, runtime_only);
            }
        }
    });
    let ctx_volumes = ctx.volumes.clone();
    let ctx_cgroups = ctx.runtime.cgroups.clone();
    let pods = controller
        .run(reconcile_measured, worker::error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "reconcile");
            }
        });
    // The node API failing to start (port in use, bad certificate) is fatal, as
    // for the kubelet.
    let server_failed =
        |r: std::result::Result<crate::server::Result<()>, tokio::task::JoinError>| match r {
            Ok(Ok(())) => anyhow!("node API server stopped"),
            Ok(Err(e)) => anyhow!(e).context("node API server"),
            Err(e) => anyhow!("node API server task: {e}"),
        };
    let workers_overdue = {
        let mut stopping = stopping.clone();
        async move {
            let _ = stopping.wait_for(|s| *s).await;
            tokio::time::sleep(WORKER_GRACE).await;
        }
    };
    let result = tokio::select! {
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
    };
    housekeeping.abort();
    if result.is_ok()
        && let Some((owner_client, ns, name, at_start)) = &owner
    {
        let target = crate::node::reset::Target {
            runtime: &runtime,
            volumes: &ctx_volumes,
            pod_logs_dir: &settings.pod_logs_dir,
            client: &client,
            node: &node_name,
            bridge: args.reset_cni_bridge.as_deref(),
            cgroups: ctx_cgroups.as_ref(),
        };
        reset_if_uninstalled(owner_client, ns, name, *at_start, target).await;
    }
    info!("stopped");
    result
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
/// ([`crate::node::reset::reset`]) when DaemonSet `ns`/`name` was
/// uninstalled ([`crate::node::reset::uninstalled`], from what was read of
/// it at the start, `at_start`, and now), and leaves everything running
/// otherwise.
async fn reset_if_uninstalled(
    owner_client: &Client,
    ns: &str,
    name: &str,
    at_start: Option<crate::node::reset::Owner>,
    target: crate::node::reset::Target<'_>,
) {
    let daemonset = format!("{ns}/{name}");
    let now = read_owner(owner_client, ns, name).await;
    if crate::node::reset::uninstalled(at_start, now) {
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
    info!(version = ?manager.version(), driver = settings.cgroup_driver, "pod cgroups");
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
/// `kubelet_pod_start_duration_seconds`, as the kubelet's pod workers record them.
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
    let sync = worker::reconcile(pod.clone(), ctx.clone());
    let result = worker::isolated(&pod, &ctx, sync).await;
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
    cfg.healthz_port = (args.healthz_port != 0).then_some(args.healthz_port);
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
    cfg.kubelet_config = settings.kubelet_configuration();
    cfg.auth_ttls = crate::server::auth::CacheTtls {
        token: settings.authentication_cache_ttl,
        allowed: settings.authorization_cache_authorized_ttl,
        denied: settings.authorization_cache_unauthorized_ttl,
    };
    Ok(cfg)
}
