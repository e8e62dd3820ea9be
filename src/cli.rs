//! Command line: `rustlet run`, `rustlet approve-csrs`, `rustlet delete-nodes` and `rustlet
//! version` (clap derive). Flags of `run` override the `--config` file, which overrides the
//! kubelet's defaults.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{ArgMatches, CommandFactory as _, Parser, Subcommand, ValueEnum};
use k8s_openapi::jiff::Timestamp;

use crate::redact::{CLASSIFIED, secret_flag};

/// A Kubernetes node agent: runs the pods bound to this node through a CRI runtime.
#[derive(Debug, Parser)]
#[command(name = "rustlet", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
#[allow(
    clippy::large_enum_variant,
    reason = "parsed once at start; boxing buys nothing"
)]
pub enum Command {
    /// Register this node and run the pods bound to it.
    Run(RunArgs),
    /// Approve the client certificate requests of the Helm chart's
    /// companion nodes, each only for the node its DaemonSet pod runs on
    /// (the chart's approver Deployment).
    ApproveCsrs(ApproveCsrsArgs),
    /// Delete the Nodes recorded in a ConfigMap by `approve-csrs`, then the
    /// ConfigMap (the Helm chart's uninstall hook: a node may not delete its
    /// own Node object).
    DeleteNodes(DeleteNodesArgs),
    /// Print the project's custom resource definitions (`crds/`) as YAML,
    /// or write them into a directory.
    Crds(CrdsArgs),
    /// Write the status of every `NodeConfiguration` from what the nodes
    /// report on their Nodes (one replica: the Helm chart's approver
    /// Deployment runs it).
    ReportNodeConfigurations(ReportArgs),
    /// Explain why a pod is not running as its spec asks: the last sync of
    /// the node agent it is bound to, read through the API server's node
    /// proxy.
    Explain(ExplainArgs),
    /// Print the version.
    Version,
}

/// Flags of `rustlet crds`.
#[derive(Debug, Parser)]
pub struct CrdsArgs {
    /// Write each definition as `<dir>/<name>.yaml` instead of printing them
    /// (one YAML stream).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Flags of `rustlet report-node-configurations`.
#[derive(Debug, Parser)]
pub struct ReportArgs {
    /// Kubeconfig to reach the API server (default: in-cluster config, then
    /// $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// Flags of `rustlet explain`.
#[derive(Debug, Parser)]
pub struct ExplainArgs {
    /// `<namespace>/<name>` of the pod.
    #[arg(value_parser = namespaced_name)]
    pub pod: (String, String),
    /// Kubeconfig to reach the API server (default: in-cluster config, then
    /// $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Print the account as JSON (the node API's document) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `rustlet delete-nodes`.
#[derive(Debug, Parser)]
pub struct DeleteNodesArgs {
    /// Kubeconfig to reach the API server (default: in-cluster config, then
    /// $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// `<namespace>/<name>` of the ConfigMap whose keys name the Nodes to
    /// delete (the record `approve-csrs` keeps of the nodes it approved).
    #[arg(long, value_parser = namespaced_name)]
    pub record: (String, String),
}

/// Flags of `rustlet approve-csrs`.
#[derive(Debug, Parser)]
pub struct ApproveCsrsArgs {
    /// Kubeconfig to reach the API server (default: in-cluster config, then
    /// $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// The release's namespace: its DaemonSet's, its agent
    /// ServiceAccount's, and the record's.
    #[arg(long, value_parser = dns_label)]
    pub namespace: String,
    /// The agent's ServiceAccount: only its requests are judged.
    #[arg(long, value_parser = dns_subdomain)]
    pub service_account: String,
    /// The DaemonSet whose pods request certificates.
    #[arg(long, value_parser = dns_subdomain)]
    pub daemonset: String,
    /// The suffix of a companion node's name after its host node's (such
    /// as `-rustlet`).
    #[arg(long, allow_hyphen_values = true)]
    pub node_name_suffix: String,
    /// The ConfigMap (in --namespace) where approved node names are
    /// recorded for the uninstall hook.
    #[arg(long, value_parser = dns_subdomain)]
    pub record: String,
}

/// A DNS label (RFC 1123): a namespace's name.
fn dns_label(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !s.starts_with('-')
        && !s.ends_with('-');
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a DNS label"))
    }
}

/// A DNS subdomain (RFC 1123): most objects' names.
fn dns_subdomain(s: &str) -> Result<String, String> {
    if s.len() <= 253 && s.split('.').all(|l| dns_label(l).is_ok()) {
        Ok(s.to_string())
    } else {
        Err(format!("{s:?} is not a DNS subdomain"))
    }
}

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Plain,
    /// One JSON object per line.
    Json,
}

/// Flags of `rustlet run`.
#[derive(Debug, Parser)]
pub struct RunArgs {
    /// Kubeconfig to reach the API server (default: in-cluster config, then $KUBECONFIG, then ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// A kubeconfig with bootstrap credentials (a bootstrap token): when
    /// --kubeconfig is missing or its client certificate has expired, a
    /// client certificate is requested with it and --kubeconfig written, as
    /// the kubelet's TLS bootstrap.
    #[arg(long, requires = "kubeconfig")]
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// Where the client certificate of the TLS bootstrap is kept
    /// [default: <root-dir>/pki].
    #[arg(long)]
    pub cert_dir: Option<PathBuf>,
    /// Name of this node (default: the hostname).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,
    /// IP address of this node, reported as its InternalIP and the pods' hostIP.
    #[arg(long, env = "NODE_IP")]
    pub node_ip: Option<std::net::IpAddr>,
    /// CRI endpoint [default: unix:///run/containerd/containerd.sock].
    #[arg(long)]
    pub container_runtime_endpoint: Option<String>,
    /// Directory of the agent's own state [default: /var/lib/rustlet].
    #[arg(long)]
    pub root_dir: Option<PathBuf>,
    /// Directory of pod logs [default: /var/log/pods].
    #[arg(long)]
    pub pod_logs_dir: Option<PathBuf>,
    /// Where device plugins register and keep their sockets (the kubelet's
    /// fixed device plugin directory) [default: /var/lib/kubelet/device-plugins].
    #[arg(long)]
    pub device_plugins_dir: Option<PathBuf>,
    /// A KubeletConfiguration (kubelet.config.k8s.io/v1beta1) file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Log format [default: the configuration file's `logging.format`, else plain].
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Port of the node API (HTTPS on 0.0.0.0) [default: 10250].
    #[arg(long)]
    pub port: Option<u16>,
    /// Port of the local health endpoint (plain HTTP on `healthzBindAddress`,
    /// 127.0.0.1; 0 disables it) [default: the configuration's `healthzPort`,
    /// else 10248].
    #[arg(long)]
    pub healthz_port: Option<u16>,
    /// Serving certificate of the node API (PEM, leaf first). Without it a
    /// self-signed one for the node name and IP is kept in <root-dir>/pki.
    #[arg(long, requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// Private key of --tls-cert-file (PEM).
    #[arg(long, requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// Get the node API's serving certificate from the certificates API
    /// (signer kubernetes.io/kubelet-serving) and renew it as it nears
    /// expiry; the same as `serverTLSBootstrap: true` in the config file.
    #[arg(long)]
    pub rotate_server_certificates: bool,
    /// CA bundle (PEM) that node API client certificates are verified against;
    /// without it only bearer tokens authenticate.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// Labels added to the Node when it registers and each start after
    /// (`key=value,key=value`), as the kubelet's `--node-labels`: labels in
    /// the `kubernetes.io` and `k8s.io` namespaces only from the kubelet's
    /// allowed set.
    #[arg(long, value_parser = node_labels, default_value = "")]
    pub node_labels: NodeLabels,
    /// Image GC: an unused image first seen less than this ago is kept (a
    /// Go duration; `0s` keeps none), as the kubelet's deprecated flag of the
    /// same name; it wins over `imageMinimumGCAge`, where `0s` means the
    /// default.
    #[arg(long, value_parser = go_duration)]
    pub minimum_image_ttl_duration: Option<std::time::Duration>,
    /// Container GC: a dead container younger than this (a Go duration,
    /// such as `1m`) is kept, as the kubelet's flag of the same name.
    #[arg(long, value_parser = go_duration, default_value = "0s")]
    pub minimum_container_ttl_duration: std::time::Duration,
    /// Container GC: dead instances kept per pod and container (negative: no limit).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub maximum_dead_containers_per_container: i32,
    /// Container GC: dead containers kept on the node (negative: no limit).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    pub maximum_dead_containers: i32,
    /// `<namespace>/<name>` of the DaemonSet this agent runs in (the Helm
    /// chart's). When the agent stops and that DaemonSet is gone or being
    /// deleted (an uninstall; read with the --bootstrap-kubeconfig
    /// credentials, the chart's ServiceAccount token, or the in-cluster
    /// ones without it), it resets the node: every container and sandbox of
    /// the runtime removed, the pod directories and logs removed, the
    /// pods bound to the node and its Node object deleted, and
    /// --reset-cni-bridge deleted. While the DaemonSet exists (an update),
    /// the pods keep running for the next agent.
    #[arg(long, value_parser = namespaced_name)]
    pub reset_when_gone: Option<(String, String)>,
    /// The CNI bridge a reset (--reset-when-gone) deletes.
    #[arg(long, requires = "reset_when_gone")]
    pub reset_cni_bridge: Option<String>,
    /// The image credential provider configuration (a
    /// `CredentialProviderConfig` file, or a directory of them), as the
    /// kubelet's flag: its plugins give registry credentials for the images
    /// they match.
    #[arg(long, requires = "image_credential_provider_bin_dir")]
    pub image_credential_provider_config: Option<PathBuf>,
    /// The directory of the credential provider plugins' executables.
    #[arg(long, requires = "image_credential_provider_config")]
    pub image_credential_provider_bin_dir: Option<PathBuf>,
    /// Not a flag: when the agent started and the flags it was started with
    /// ([`Invocation`]), for `/statusz` and `/flagz`.
    #[arg(skip = Invocation::now())]
    pub invocation: Invocation,
}

/// When the agent started and with which flags: what the node API's
/// `/statusz` and `/flagz` show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invocation {
    /// When the flags were parsed, which is when the agent started (the
    /// kubelet shows its process's start time).
    pub started: Timestamp,
    /// Every flag of `rustlet run` by name without its dashes, with its value
    /// as given, from the environment or by default (empty when it has
    /// none; `true`/`false` for switches; a secret's [`CLASSIFIED`]), as the
    /// kubelet's `/flagz` lists every flag of its flag set.
    pub flags: BTreeMap<String, String>,
}

impl Invocation {
    /// Started now, flags not read yet.
    #[must_use]
    pub fn now() -> Self {
        Self {
            started: Timestamp::now(),
            flags: BTreeMap::new(),
        }
    }
}

/// The flags of `rustlet run` in `matches` (its subcommand's matches) for
/// [`Invocation::flags`].
#[must_use]
pub fn run_flags(matches: &ArgMatches) -> BTreeMap<String, String> {
    let command = RunArgs::command();
    command
        .get_arguments()
        .filter_map(|arg| {
            let name = arg.get_long()?;
            let value = if secret_flag(name) {
                CLASSIFIED.to_string()
            } else {
                matches
                    .try_get_raw(arg.get_id().as_str())
                    .ok()
                    .flatten()
                    .map(|values| {
                        values
                            .map(|v| v.to_string_lossy().into_owned())
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default()
            };
            Some((name.to_string(), value))
        })
        .collect()
}

/// Parses `<namespace>/<name>`, both non-empty.
fn namespaced_name(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_string(), name.to_string()))
        }
        _ => Err(format!("{s:?} is not <namespace>/<name>")),
    }
}

/// The labels of `--node-labels`, by key.
pub type NodeLabels = std::collections::BTreeMap<String, String>;

/// Label prefixes (of the `kubernetes.io` and `k8s.io` namespaces) a node
/// may set on itself, as the kubelet's `kubeletapis.KubeletLabelNamespaces`.
const NODE_LABEL_NAMESPACES: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];

/// Labels of those namespaces a node may set on itself, as the kubelet's
/// `kubeletapis.KubeletLabels`.
const NODE_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "kubernetes.io/os",
    "kubernetes.io/arch",
];

/// Parses `--node-labels` (`k=v,k=v`); keys and values must be valid label
/// keys and values, and a key in the `kubernetes.io` or `k8s.io` namespace
/// must be one a node may set ([`NODE_LABELS`], [`NODE_LABEL_NAMESPACES`]),
/// as the kubelet refuses the rest.
fn node_labels(s: &str) -> Result<NodeLabels, String> {
    let mut out = NodeLabels::new();
    for pair in s.split(',').filter(|p| !p.is_empty()) {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("{pair:?} is not key=value"))?;
        if !valid_label_key(k) || !valid_label_value(v) {
            return Err(format!("{pair:?} is not a valid label"));
        }
        let (prefix, _) = k.rsplit_once('/').unwrap_or(("", k));
        let restricted = ["kubernetes.io", "k8s.io"]
            .iter()
            .any(|ns| prefix == *ns || prefix.ends_with(&format!(".{ns}")));
        let allowed = NODE_LABELS.contains(&k)
            || NODE_LABEL_NAMESPACES
                .iter()
                .any(|ns| prefix == *ns || prefix.ends_with(&format!(".{ns}")));
        if restricted && !allowed {
            return Err(format!(
                "unknown 'kubernetes.io' or 'k8s.io' label {k:?}: a node may only set {} or labels under {}",
                NODE_LABELS.join(", "),
                NODE_LABEL_NAMESPACES.join(", ")
            ));
        }
        out.insert(k.to_string(), v.to_string());
    }
    Ok(out)
}

/// A label name: at most 63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
fn valid_label_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 63
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        && n.starts_with(|c: char| c.is_ascii_alphanumeric())
        && n.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// A label key: an optional DNS subdomain prefix (at most 253) and `/`, then a name.
fn valid_label_key(k: &str) -> bool {
    match k.split_once('/') {
        Some((prefix, name)) => {
            !prefix.is_empty()
                && prefix.len() <= 253
                && prefix.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                })
                && valid_label_name(name)
        }
        None => valid_label_name(k),
    }
}

/// A label value: empty, or a label name.
fn valid_label_value(v: &str) -> bool {
    v.is_empty() || valid_label_name(v)
}

/// Parses a Go duration (`90s`, `1m30s`); negative ones are refused.
fn go_duration(s: &str) -> Result<std::time::Duration, String> {
    let nanos = go_parse_duration::parse_duration(s).map_err(|e| format!("{e:?}"))?;
    u64::try_from(nanos)
        .map(std::time::Duration::from_nanos)
        .map_err(|_| "a negative duration".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_labels_are_checked_as_the_kubelet_checks_them() {
        let ok = node_labels(
            "team=a,node.kubernetes.io/pool=blue,kubernetes.io/hostname=h,x.example.com/y=",
        )
        .unwrap();
        assert_eq!(ok.len(), 4);
        assert_eq!(ok["node.kubernetes.io/pool"], "blue");
        assert!(node_labels("").unwrap().is_empty());
        for bad in [
            "node-role.kubernetes.io/control-plane=",
            "foo.k8s.io/x=1",
            "novalue",
            "bad key=1",
            "k=-bad-",
        ] {
            assert!(node_labels(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn parses_run_flags() {
        let cli = Cli::try_parse_from([
            "rustlet",
            "run",
            "--node-name",
            "n1",
            "--node-ip",
            "127.0.0.1",
            "--container-runtime-endpoint",
            "unix:///tmp/c.sock",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert_eq!(args.node_name.as_deref(), Some("n1"));
        assert_eq!(
            args.container_runtime_endpoint.as_deref(),
            Some("unix:///tmp/c.sock")
        );
        assert_eq!((args.port, args.healthz_port), (None, None));
        // The kubelet's container GC defaults.
        assert_eq!(
            (
                args.minimum_container_ttl_duration,
                args.maximum_dead_containers_per_container,
                args.maximum_dead_containers
            ),
            (std::time::Duration::ZERO, 1, -1)
        );
    }

    #[test]
    fn container_gc_flags_take_go_durations_and_negative_limits() {
        let cli = Cli::try_parse_from([
            "rustlet",
            "run",
            "--minimum-container-ttl-duration",
            "1m30s",
            "--maximum-dead-containers-per-container",
            "-1",
            "--maximum-dead-containers",
            "100",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert_eq!(
            args.minimum_container_ttl_duration,
            std::time::Duration::from_secs(90)
        );
        assert_eq!(
            (
                args.maximum_dead_containers_per_container,
                args.maximum_dead_containers
            ),
            (-1, 100)
        );
        for bad in ["-1s", "soon"] {
            let r =
                Cli::try_parse_from(["rustlet", "run", "--minimum-container-ttl-duration", bad]);
            assert!(r.is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn node_api_flags_parse_and_tls_files_come_in_pairs() {
        let cli = Cli::try_parse_from([
            "rustlet",
            "run",
            "--port",
            "11250",
            "--healthz-port",
            "0",
            "--client-ca-file",
            "/pki/ca.crt",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        assert_eq!((args.port, args.healthz_port), (Some(11250), Some(0)));
        assert_eq!(args.client_ca_file, Some(PathBuf::from("/pki/ca.crt")));
        assert!(Cli::try_parse_from(["rustlet", "run", "--tls-cert-file", "/c.crt"]).is_err());
    }

    #[test]
    fn approve_csrs_names_its_release_in_full() {
        let cli = Cli::try_parse_from([
            "rustlet",
            "approve-csrs",
            "--namespace=rustlet-system",
            "--service-account=rustlet",
            "--daemonset=rustlet",
            "--node-name-suffix",
            "-rustlet",
            "--record=rustlet-nodes",
        ])
        .unwrap();
        let Command::ApproveCsrs(args) = cli.command else {
            panic!("not approve-csrs")
        };
        assert_eq!(
            (args.namespace.as_str(), args.node_name_suffix.as_str()),
            ("rustlet-system", "-rustlet")
        );
        assert!(Cli::try_parse_from(["rustlet", "approve-csrs", "--namespace=a.b"]).is_err());
        let cli =
            Cli::try_parse_from(["rustlet", "delete-nodes", "--record=ns/rustlet-nodes"]).unwrap();
        let Command::DeleteNodes(args) = cli.command else {
            panic!("not delete-nodes")
        };
        assert_eq!(args.record, ("ns".into(), "rustlet-nodes".into()));
    }

    #[test]
    fn bad_flags_are_rejected() {
        assert!(Cli::try_parse_from(["rustlet", "run", "--node-ip", "not-an-ip"]).is_err());
        assert!(Cli::try_parse_from(["rustlet", "run", "--no-such-flag"]).is_err());
    }

    #[test]
    fn run_flags_list_every_flag_with_its_value_and_hide_secrets() {
        let matches = Cli::command()
            .try_get_matches_from([
                "rustlet",
                "run",
                "--node-ip=10.0.0.1",
                "--rotate-server-certificates",
                "--node-labels",
                "a=1,b=2",
            ])
            .unwrap();
        let flags = run_flags(matches.subcommand_matches("run").unwrap());
        assert_eq!(flags["node-ip"], "10.0.0.1");
        assert_eq!(flags["node-labels"], "a=1,b=2");
        assert_eq!(flags["rotate-server-certificates"], "true");
        // Defaults, and flags without one.
        assert_eq!(flags["healthz-port"], "");
        assert_eq!(flags["maximum-dead-containers"], "-1");
        assert_eq!(flags["kubeconfig"], "");
        assert_eq!(flags["tls-private-key-file"], "");
        assert!(!flags.contains_key("invocation") && !flags.contains_key("help"));
        assert_eq!(flags.len(), RunArgs::command().get_arguments().count());
    }
}
