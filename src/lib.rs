//! rustlet: a Kubernetes node agent. It does the kubelet's job on one node,
//! built as a kube-rs controller: a reflector on the pods bound to the node, one
//! reconcile per pod (the pod worker) that drives a CRI runtime, a status
//! manager, and the Node object with its Lease.
#![forbid(unsafe_code)]
#![cfg_attr(
    test,
    allow(
        clippy::too_many_lines,
        reason = "a test is one scenario, read top to bottom; the limit holds for the agent's own functions, which the non-test build checks"
    )
)]

pub mod agent;
pub mod certificate;
pub mod cgroups;
pub mod cli;
pub mod config;
pub mod container;
pub mod container_gc;
pub mod cpu_manager;
pub mod cpuset;
pub mod credential_provider;
pub mod cri;
pub mod csr_approver;
pub mod device_manager;
pub mod dra;
pub mod events;
pub mod eviction;
pub mod expansion;
pub mod feature_gates;
pub mod grpc_socket;
pub mod image_gc;
pub mod image_policy;
pub mod labels;
pub mod log_links;
pub mod log_manager;
pub mod memory_manager;
pub mod metrics;
pub mod names;
pub mod node;
pub mod node_config;
pub mod node_selector;
pub mod node_shutdown;
pub mod otel;
pub mod paths;
pub mod plugin_manager;
pub mod pod;
pub mod pod_core;
pub mod pod_resources;
pub mod prober;
pub mod proto;
pub mod reasons;
pub mod redact;
pub mod registry;
pub mod resource;
pub mod server;
pub mod startup_trace;
pub mod static_pod;
pub mod stats;
pub mod systemd;
pub mod throttle;
pub mod topology_manager;
pub mod volume;
pub mod yaml;

#[cfg(test)]
pub mod fake_api;
#[cfg(test)]
pub mod fake_csi;
#[cfg(test)]
pub mod fake_dra;
#[cfg(test)]
pub mod fixtures;

/// The Kubernetes version whose kubelet this agent follows.
pub const KUBERNETES_VERSION: &str = "v1.37.0";

/// The version reported as the node's `kubeletVersion`: the Kubernetes version
/// followed, with this agent's own version as build metadata.
#[must_use]
pub fn node_version() -> String {
    format!("{KUBERNETES_VERSION}+rustlet-{}", env!("CARGO_PKG_VERSION"))
}

/// The `User-Agent` of the agent's API requests, in client-go's form
/// `<command>/<version> (<os>/<arch>)` (the kubelet's is `kubelet/v1.37.0
/// (linux/amd64) kubernetes/<commit>`): `rustlet/<`[`node_version`]`>
/// (linux/amd64)`, the architecture as the Node reports it
/// ([`node::info::go_arch`]). The API server names the agent's field manager
/// after what comes before the first `/` (`rustlet`, in `managedFields`), and
/// its audit log shows the whole.
#[must_use]
pub fn user_agent() -> String {
    format!(
        "rustlet/{} ({}/{})",
        node_version(),
        std::env::consts::OS,
        node::info::go_arch()
    )
}

/// `config` with [`user_agent`] as the `User-Agent` of every request of a
/// client built from it (in place of any other).
#[must_use]
pub fn with_user_agent(mut config: kube::Config) -> kube::Config {
    if let Ok(value) = http::HeaderValue::from_str(&user_agent()) {
        config
            .headers
            .retain(|(name, _)| name != http::header::USER_AGENT);
        config.headers.push((http::header::USER_AGENT, value));
    }
    config
}
