//! Command line: `rustlet run` and `rustlet version` (clap derive). Flags
//! override the `--config` file, which overrides the kubelet's defaults.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

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
pub enum Command {
    /// Register this node and run the pods bound to it.
    Run(RunArgs),
    /// Print the version.
    Version,
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
    /// A KubeletConfiguration (kubelet.config.k8s.io/v1beta1) file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Plain)]
    pub log_format: LogFormat,
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }

    #[test]
    fn bad_flags_are_rejected() {
        assert!(Cli::try_parse_from(["rustlet", "run", "--node-ip", "not-an-ip"]).is_err());
        assert!(Cli::try_parse_from(["rustlet", "run", "--no-such-flag"]).is_err());
    }
}
