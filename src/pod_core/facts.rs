//! What the translators know of the node and of one pod: the node's names,
//! addresses, directories, resolver and allocatable ([`NodeContext`], the
//! fields of the kubelet's `kubeGenericRuntimeManager` and `Kubelet` that
//! `generatePodSandboxConfig` and `makeEnvironmentVariables` read), the pod's
//! addresses ([`PodFacts`]), and its identity.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The node-side facts a sandbox config needs.
#[derive(Clone, Debug)]
pub struct NodeContext {
    /// The node's name.
    pub node_name: String,
    /// The node's IPs (primary first), for hostNetwork pods and `status.hostIP`.
    pub node_ips: Vec<String>,
    /// Directory of pod logs (`/var/log/pods`).
    pub pod_logs_dir: PathBuf,
    /// The agent's root directory (`/var/lib/rustlet`); pods live under `pods/<uid>`.
    pub root_dir: PathBuf,
    /// The node's resolv.conf as (nameservers, searches, options).
    pub host_dns: HostDns,
    /// `clusterDNS` of the configuration (empty: none).
    pub cluster_dns: Vec<String>,
    /// `clusterDomain` (`cluster.local`).
    pub cluster_domain: String,
    /// The node's allocatable resources (defaults of unset limits in `resourceFieldRef`).
    pub allocatable: BTreeMap<String, Quantity>,
    /// The node's memory capacity in bytes (for Burstable `oom_score_adj`).
    pub memory_capacity_bytes: u64,
    /// The node's hosts file, copied for `hostNetwork` pods (empty: `/etc/hosts`).
    pub hosts_file: PathBuf,
    /// `allowedUnsafeSysctls` of the configuration, for admission.
    pub allowed_unsafe_sysctls: Vec<String>,
    /// `seccompDefault` of the configuration: a container without a seccomp
    /// profile gets the runtime's default instead of none.
    pub seccomp_default: bool,
    /// The kernel enforces AppArmor (`/sys/module/apparmor/parameters/enabled`
    /// is `Y`), for admission.
    pub apparmor_enabled: bool,
    /// The `PodLevelResources` feature gate is off: a pod that sets
    /// pod-level resources is rejected at admission.
    pub pod_level_resources_disabled: bool,
    /// The `InPlacePodLevelResourcesVerticalScaling` feature gate is off: a
    /// resize of pod-level resources is `Infeasible`.
    pub pod_level_resize_disabled: bool,
    /// The `UserNamespacesSupport` feature gate (on by default, as in the
    /// kubelet since 1.33); off, a pod that sets `hostUsers` fails.
    pub user_namespaces_support: bool,
    /// The labels the Node is registered with (`node::status::labels`):
    /// admission reads them for a static pod before the Node is listed, as
    /// the kubelet's `initialNode`.
    pub initial_labels: BTreeMap<String, String>,
    /// `registerWithTaints`, the taints the Node is registered with, read
    /// alike.
    pub initial_taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// The CrashLoopBackOff curve of `crashLoopBackOff.maxContainerRestartPeriod`.
    pub crash_backoff: super::backoff::CrashBackoff,
    /// What containers may swap.
    pub swap: Swap,
    /// The node's huge page sizes in bytes (`/sys/kernel/mm/hugepages`, as
    /// libcontainer's `HugePageSizes`), each of which a container's
    /// resources name.
    pub huge_page_sizes: Vec<u64>,
    /// `cpuCFSQuotaPeriod` in microseconds (the kubelet's default
    /// [`super::limits::CPU_PERIOD_US`], 100 ms): the period of every CPU
    /// quota, containers' and pod cgroups'.
    pub cpu_period_us: i64,
    /// `syncFrequency`: the longest a pod with nothing pending waits for
    /// its next sync while runtime events arrive (1 min).
    pub sync_frequency: std::time::Duration,
}

/// What the node offers containers of swap, for the kubelet's
/// `configureContainerSwapResources`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Swap {
    /// The node has a swap controller (`memory.memsw.limit_in_bytes` on
    /// cgroup v1, `memory.swap.max` on v2: the kubelet's
    /// `swapControllerAvailable`); without one no container gets a swap setting.
    pub controller: bool,
    /// The node's cgroups are v2.
    pub cgroup_v2: bool,
    /// `memorySwap.swapBehavior` is `LimitedSwap` (else `NoSwap`).
    pub limited: bool,
    /// The node's swap in bytes (`SwapTotal`).
    pub capacity_bytes: u64,
}

/// Empty facts, the default 100 ms CFS period.
impl Default for NodeContext {
    fn default() -> Self {
        Self {
            node_name: Default::default(),
            node_ips: Default::default(),
            pod_logs_dir: Default::default(),
            root_dir: Default::default(),
            host_dns: Default::default(),
            cluster_dns: Default::default(),
            cluster_domain: Default::default(),
            allocatable: Default::default(),
            memory_capacity_bytes: Default::default(),
            hosts_file: Default::default(),
            allowed_unsafe_sysctls: Default::default(),
            seccomp_default: Default::default(),
            apparmor_enabled: Default::default(),
            pod_level_resources_disabled: Default::default(),
            pod_level_resize_disabled: Default::default(),
            user_namespaces_support: Default::default(),
            initial_labels: Default::default(),
            initial_taints: Default::default(),
            crash_backoff: Default::default(),
            swap: Default::default(),
            huge_page_sizes: Default::default(),
            cpu_period_us: super::limits::CPU_PERIOD_US,
            sync_frequency: std::time::Duration::from_secs(60),
        }
    }
}

impl NodeContext {
    /// The node's hosts file: [`NodeContext::hosts_file`], else `/etc/hosts`.
    #[must_use]
    pub fn hosts_file(&self) -> &Path {
        if self.hosts_file.as_os_str().is_empty() {
            Path::new(super::hosts::ETC_HOSTS_PATH)
        } else {
            &self.hosts_file
        }
    }
}

/// The node's resolver settings, from its resolv.conf.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostDns {
    /// `nameserver` lines.
    pub servers: Vec<String>,
    /// `search` domains.
    pub searches: Vec<String>,
    /// `options`.
    pub options: Vec<String>,
}

impl HostDns {
    /// Parses resolv.conf text (later `search` lines replace earlier ones, as libc does).
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let mut dns = Self::default();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => dns.servers.extend(words.next().map(str::to_string)),
                Some("search" | "domain") => dns.searches = words.map(str::to_string).collect(),
                Some("options") => dns.options.extend(words.map(str::to_string)),
                _ => {}
            }
        }
        dns
    }
}

/// Pod-level values that `fieldRef` environment variables read.
#[derive(Clone, Debug, Default)]
pub struct PodFacts {
    /// Pod IPs, primary first.
    pub pod_ips: Vec<String>,
    /// Host IPs, primary first.
    pub host_ips: Vec<String>,
}

/// Pod identity: (namespace, name, uid).
#[must_use]
pub fn pod_identity(pod: &Pod) -> (String, String, String) {
    let m = &pod.metadata;
    (
        m.namespace.clone().unwrap_or_else(|| "default".into()),
        m.name.clone().unwrap_or_default(),
        m.uid.clone().unwrap_or_default(),
    )
}
