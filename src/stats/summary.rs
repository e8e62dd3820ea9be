//! The pure parts of the node's resource statistics: the kubelet's stats API
//! `Summary` as JSON (k8s.io/kubelet/pkg/apis/stats/v1alpha1), the numbers
//! derived from cgroup and /proc files as cAdvisor derives them, the cpu usage
//! rate from two cumulative samples (the kubelet's CRI stats provider,
//! pkg/kubelet/stats/cri_stats_provider.go), and `/metrics/resource` in the
//! Prometheus text format (pkg/kubelet/metrics/collectors/resource_metrics.go).

use std::collections::HashMap;
use std::time::Duration;

use k8s_cri::v1 as cri;
use k8s_openapi::jiff::Timestamp;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Serialize, Serializer};

use super::kernel_files::{self, flat_keyed};

/// A point in time, nanoseconds since the Unix epoch; serialized as
/// `metav1.Time` is: RFC 3339 in UTC, whole seconds (`2024-05-01T10:00:00Z`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Time(pub i64);

impl Time {
    /// The current time.
    #[must_use]
    pub fn now() -> Self {
        let ns = Timestamp::now().as_nanosecond();
        Self(i64::try_from(ns).unwrap_or(i64::MAX))
    }

    /// Seconds since the epoch, with the fraction.
    #[must_use]
    #[allow(clippy::cast_precision_loss)] // nanoseconds of the next few centuries fit an f64's 53 bits well enough
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }
}

impl Serialize for Time {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let secs = self.0.div_euclid(1_000_000_000);
        let text = Timestamp::from_second(secs)
            .unwrap_or(Timestamp::UNIX_EPOCH)
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string();
        s.serialize_str(&text)
    }
}

/// `Summary`: the node and its pods (`/stats/summary`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    /// The node.
    pub node: NodeStats,
    /// The pods with running containers.
    pub pods: Vec<PodStats>,
}

/// `NodeStats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    /// The node's name.
    pub node_name: String,
    /// When the node booted.
    pub start_time: Time,
    /// CPU of every process on the node (the root cgroup).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory of the node (the root cgroup).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// The node's io pressure (`/proc/pressure/io`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
    /// The host's network interfaces (`/proc/net/dev` of the agent's
    /// network namespace, the host's), `eth0` the default when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// The node's own cgroups as containers: `pods`, the cgroup of every
    /// pod (`<cgroupRoot>/kubepods`) when the agent makes pod cgroups
    /// (the kubelet's `GetSystemContainersStats`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub system_containers: Vec<ContainerStats>,
    /// The filesystem of the agent's root directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<FsStats>,
    /// The container runtime's filesystems.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    /// Process limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<RlimitStats>,
}

/// `RuntimeStats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    /// The filesystem that holds images (and, on one filesystem, writable layers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<FsStats>,
    /// The filesystem of the containers' writable layers: the image
    /// filesystem, unless the runtime names a container filesystem on
    /// another device (a split image filesystem, as the kubelet's
    /// `ImageFsStats` reports it then).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_fs: Option<FsStats>,
}

/// `RlimitStats`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RlimitStats {
    /// When sampled.
    pub time: Time,
    /// The lower of `kernel.pid_max` and `kernel.threads-max`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maxpid: Option<i64>,
    /// Tasks on the node (the total of `/proc/loadavg`'s fourth field).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub curproc: Option<i64>,
}

/// `PodReference`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct PodReference {
    /// The pod's name.
    pub name: String,
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's UID.
    pub uid: String,
}

/// `PodStats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    /// Which pod.
    pub pod_ref: PodReference,
    /// When the pod's sandbox was created.
    pub start_time: Time,
    /// Its running containers.
    pub containers: Vec<ContainerStats>,
    /// The sum of its containers' CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// The sum of its containers' memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// Its network interfaces, when the runtime reports them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkStats>,
    /// Its local volumes (emptyDir).
    #[serde(rename = "volume", skip_serializing_if = "Vec::is_empty")]
    pub volume: Vec<VolumeStats>,
    /// Writable layers, logs and local volumes together.
    #[serde(rename = "ephemeral-storage", skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<FsStats>,
    /// Its processes, when it has a pod cgroup.
    #[serde(rename = "process_stats", skip_serializing_if = "Option::is_none")]
    pub process_stats: Option<ProcessStats>,
}

/// `ProcessStats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ProcessStats {
    /// Processes in the pod cgroup and the cgroups below it.
    #[serde(rename = "process_count", skip_serializing_if = "Option::is_none")]
    pub process_count: Option<u64>,
}

/// `ContainerStats`.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    /// The container's name in the pod.
    pub name: String,
    /// When the container was created.
    pub start_time: Time,
    /// CPU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuStats>,
    /// Memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStats>,
    /// Io pressure (system containers only: the runtime reports none for
    /// containers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io: Option<IoStats>,
    /// The writable layer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<FsStats>,
    /// The container's log directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logs: Option<FsStats>,
}

/// `PSIData`: one line (`some` or `full`) of a pressure stall file
/// (`/proc/pressure/<resource>`, `<resource>.pressure` of a cgroup v2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PsiData {
    /// Total stalled time, microseconds.
    pub total: u64,
    /// Percentage of the last 10 seconds stalled (0 to 100).
    pub avg10: f64,
    /// Percentage of the last 60 seconds stalled (0 to 100).
    pub avg60: f64,
    /// Percentage of the last 300 seconds stalled (0 to 100).
    pub avg300: f64,
}

/// `PSIStats`: the `some` line (some tasks stalled) and the `full` line
/// (all non-idle tasks stalled) of a pressure stall file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PsiStats {
    /// All non-idle tasks stalled at once.
    pub full: PsiData,
    /// At least one task stalled.
    pub some: PsiData,
}

/// `IOStats`: io pressure.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct IoStats {
    /// When sampled.
    pub time: Time,
    /// Io pressure stall information.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

/// A pressure stall file's text (`some avg10=0.00 avg60=0.00 avg300=0.00
/// total=0` and the same for `full`) as `PSIStats`. A file with no `full`
/// line (cpu, before Linux 5.13) has `full` zero, as cAdvisor reads it;
/// `None` without a readable `some` line.
#[must_use]
pub fn psi(text: &str) -> Option<PsiStats> {
    let line = |kind: &str| -> Option<PsiData> {
        let rest = text
            .lines()
            .find_map(|l| l.strip_prefix(kind)?.strip_prefix(' '))?;
        let mut d = PsiData::default();
        for field in rest.split_whitespace() {
            let (k, v) = field.split_once('=')?;
            match k {
                "total" => d.total = v.parse().ok()?,
                "avg10" => d.avg10 = v.parse().ok()?,
                "avg60" => d.avg60 = v.parse().ok()?,
                "avg300" => d.avg300 = v.parse().ok()?,
                _ => {}
            }
        }
        Some(d)
    };
    Some(PsiStats {
        some: line("some")?,
        full: line("full").unwrap_or_default(),
    })
}

/// `CPUStats`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// When sampled.
    pub time: Time,
    /// Usage rate over the last sampling window, in billionths of a core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    /// Cumulative usage, core-nanoseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
    /// Cpu pressure stall information.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

/// `MemoryStats`, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    /// When sampled.
    pub time: Time,
    /// Limit (or machine capacity) minus the working set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// All memory in use, page cache included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    /// Usage minus inactive file pages: what the OOM killer and eviction look at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    /// Anonymous and swap cache memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    /// Cumulative page faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    /// Cumulative major page faults.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
    /// Memory pressure stall information.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub psi: Option<PsiStats>,
}

/// `FsStats`, bytes and inodes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FsStats {
    /// When sampled.
    pub time: Time,
    /// Free to unprivileged users.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    /// Size of the filesystem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// Used by this object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    /// Free inodes of the filesystem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    /// Inodes of the filesystem.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    /// Inodes used by this object.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

/// `VolumeStats`: a volume's [`FsStats`], name and, for a volume used
/// through a claim, the claim.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStats {
    /// Usage.
    #[serde(flatten)]
    pub fs: FsStats,
    /// The volume's name in the pod spec.
    pub name: String,
    /// The PersistentVolumeClaim the pod uses the volume through
    /// (`pvcRef`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pvc_ref: Option<PvcReference>,
}

/// `PVCReference`: a claim's name and namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PvcReference {
    /// The claim's name.
    pub name: String,
    /// Its namespace (the pod's).
    pub namespace: String,
}

/// `InterfaceStats`, bytes and packets since the interface came up.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStats {
    /// Interface name.
    pub name: String,
    /// Bytes received.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    /// Receive errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_errors: Option<u64>,
    /// Bytes sent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    /// Send errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_errors: Option<u64>,
}

/// `NetworkStats`: the default interface inline, then all of them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NetworkStats {
    /// When sampled.
    pub time: Time,
    /// The default interface (`eth0`).
    #[serde(flatten)]
    pub default: InterfaceStats,
    /// Every interface.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStats>,
}

fn value(v: Option<&cri::UInt64Value>) -> Option<u64> {
    v.map(|v| v.value)
}

/// A CRI interface usage as `InterfaceStats` (`criInterfaceToSummary`).
#[must_use]
pub fn interface_from_cri(i: &cri::NetworkInterfaceUsage) -> InterfaceStats {
    InterfaceStats {
        name: i.name.clone(),
        rx_bytes: value(i.rx_bytes.as_ref()),
        rx_errors: value(i.rx_errors.as_ref()),
        tx_bytes: value(i.tx_bytes.as_ref()),
        tx_errors: value(i.tx_errors.as_ref()),
    }
}

/// A sandbox's CRI network usage as `NetworkStats`, if it has a default interface.
#[must_use]
pub fn network_from_cri(n: &cri::NetworkUsage) -> Option<NetworkStats> {
    let default = interface_from_cri(n.default_interface.as_ref()?);
    Some(NetworkStats {
        time: Time(n.timestamp),
        default,
        interfaces: n.interfaces.iter().map(interface_from_cri).collect(),
    })
}

/// The interfaces of a network namespace from its `/proc/<pid>/net/dev`,
/// loopback left out, and the stats with `eth0` as the default interface
/// (cAdvisor's network stats of a pod's sandbox, `cadvisorInfoToNetworkStats`);
/// `None` without `eth0`.
#[must_use]
pub fn network_from_net_dev(net_dev: &str, time: Time) -> Option<NetworkStats> {
    let interfaces = interfaces_from_net_dev(net_dev);
    let default = interfaces.iter().find(|i| i.name == "eth0")?.clone();
    Some(NetworkStats {
        time,
        default,
        interfaces,
    })
}

/// The node's network from the host's `/proc/net/dev`: every interface but
/// those cAdvisor ignores, with `eth0` as the default interface when there
/// is one, else a default with no name and no counters (the kubelet's node
/// network, from cAdvisor's root container).
#[must_use]
pub fn node_network_from_net_dev(net_dev: &str, time: Time) -> NetworkStats {
    let interfaces = interfaces_from_net_dev(net_dev);
    let default = interfaces
        .iter()
        .find(|i| i.name == "eth0")
        .cloned()
        .unwrap_or_default();
    NetworkStats {
        time,
        default,
        interfaces,
    }
}

/// The interfaces of a `/proc/<pid>/net/dev` text, those cAdvisor ignores
/// left out, as `InterfaceStats` ([`kernel_files::net_dev`]).
fn interfaces_from_net_dev(net_dev: &str) -> Vec<InterfaceStats> {
    kernel_files::net_dev(net_dev)
        .into_iter()
        .map(|i| InterfaceStats {
            name: i.name,
            rx_bytes: Some(i.rx_bytes),
            rx_errors: Some(i.rx_errors),
            tx_bytes: Some(i.tx_bytes),
            tx_errors: Some(i.tx_errors),
        })
        .collect()
}

/// CRI cpu usage as `CPUStats`; `rate` is this agent's usage rate over at
/// least [`MIN_RATE_WINDOW`] ([`CpuRates`]), reported in preference to the
/// runtime's: containerd answers each stats call with the rate since the
/// previous call, which is 0 for a mostly idle container asked twice within
/// a moment (the kubelet's cAdvisor rates span its housekeeping interval).
/// The runtime's rate stands in until this agent has one.
#[must_use]
pub fn cpu_from_cri(c: &cri::CpuUsage, rate: Option<u64>) -> CpuStats {
    CpuStats {
        time: Time(c.timestamp),
        usage_nano_cores: rate.or_else(|| value(c.usage_nano_cores.as_ref())),
        usage_core_nano_seconds: value(c.usage_core_nano_seconds.as_ref()),
        psi: None,
    }
}

/// CRI memory usage as `MemoryStats` (`makeContainerStats`).
#[must_use]
pub fn memory_from_cri(m: &cri::MemoryUsage) -> MemoryStats {
    MemoryStats {
        time: Time(m.timestamp),
        available_bytes: value(m.available_bytes.as_ref()),
        usage_bytes: value(m.usage_bytes.as_ref()),
        working_set_bytes: value(m.working_set_bytes.as_ref()),
        rss_bytes: value(m.rss_bytes.as_ref()),
        page_faults: value(m.page_faults.as_ref()),
        major_page_faults: value(m.major_page_faults.as_ref()),
        psi: None,
    }
}

/// CRI cpu usage carries a cumulative usage to report.
#[must_use]
pub fn cri_cpu_usable(c: Option<&cri::CpuUsage>) -> bool {
    c.is_some_and(|c| c.usage_core_nano_seconds.is_some() && c.timestamp > 0)
}

/// CRI memory usage carries a working set to report.
#[must_use]
pub fn cri_memory_usable(m: Option<&cri::MemoryUsage>) -> bool {
    m.is_some_and(|m| m.working_set_bytes.is_some() && m.timestamp > 0)
}

/// The working set as cAdvisor computes it: usage minus inactive file pages
/// (`total_inactive_file` on cgroup v1, `inactive_file` on v2), never below 0.
#[must_use]
pub fn working_set(usage: u64, inactive_file: u64) -> u64 {
    usage.saturating_sub(inactive_file)
}

/// What a memory cgroup's files say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupMemory {
    /// `memory.usage_in_bytes` (v1) or `memory.current` (v2).
    pub usage: u64,
    /// The `memory.stat` text.
    pub inactive_file: u64,
    /// Anonymous memory and swap cache (`total_rss` on v1, `anon` on v2).
    pub rss: u64,
    /// `pgfault`: on cgroup v1 the cgroup's own, not its descendants' (as
    /// cAdvisor's `ContainerData`, which the kubelet reports); on v2 the
    /// file is hierarchical.
    pub page_faults: u64,
    /// `pgmajfault`, as `page_faults`.
    pub major_page_faults: u64,
}

impl CgroupMemory {
    /// From a cgroup's usage file and `memory.stat` text; `v1` picks the
    /// hierarchical `total_*` keys of cgroup v1.
    #[must_use]
    pub fn parse(usage: u64, memory_stat: &str, v1: bool) -> Self {
        let stat = flat_keyed(memory_stat);
        let get = |v1_key: &str, v2_key: &str| {
            stat.get(if v1 { v1_key } else { v2_key })
                .copied()
                .unwrap_or(0)
        };
        Self {
            usage,
            inactive_file: get("total_inactive_file", "inactive_file"),
            rss: if v1 {
                get("total_rss", "")
            } else {
                get("", "anon")
            },
            page_faults: get("pgfault", "pgfault"),
            major_page_faults: get("pgmajfault", "pgmajfault"),
        }
    }

    /// As `MemoryStats` at `time`; `limit` (the cgroup's limit, or the
    /// machine's memory for the root cgroup) gives `availableBytes`
    /// (`cadvisorInfoToCPUandMemoryStats`: limit minus working set).
    #[must_use]
    pub fn stats(&self, time: Time, limit: Option<u64>) -> MemoryStats {
        let ws = working_set(self.usage, self.inactive_file);
        MemoryStats {
            time,
            available_bytes: limit.map(|l| l.saturating_sub(ws)),
            usage_bytes: Some(self.usage),
            working_set_bytes: Some(ws),
            rss_bytes: Some(self.rss),
            page_faults: Some(self.page_faults),
            major_page_faults: Some(self.major_page_faults),
            psi: None,
        }
    }
}

/// A cgroup v2 `cpu.stat`'s `usage_usec` in nanoseconds.
#[must_use]
pub fn cpu_stat_v2_nanos(cpu_stat: &str) -> Option<u64> {
    flat_keyed(cpu_stat)
        .get("usage_usec")
        .map(|us| us.saturating_mul(1000))
}

/// A cgroup limit file's value: `None` for `max` or the v1 "unlimited"
/// value (a page-rounded `i64::MAX`).
#[must_use]
pub fn memory_limit(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    (v < (1 << 62)).then_some(v)
}

/// A /proc/meminfo field (`MemTotal`, `Inactive(file)`) in bytes.
#[must_use]
pub fn meminfo_bytes(meminfo: &str, key: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        if k != key {
            return None;
        }
        let mut it = v.split_whitespace();
        let n: u64 = it.next()?.parse().ok()?;
        Some(if it.next() == Some("kB") { n * 1024 } else { n })
    })
}

/// The boot time (`btime` of /proc/stat), seconds since the epoch.
#[must_use]
pub fn boot_time(proc_stat: &str) -> Option<i64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// Tasks on the node: the total after the `/` of /proc/loadavg's fourth field.
#[must_use]
pub fn loadavg_tasks(loadavg: &str) -> Option<i64> {
    let field = loadavg.split_whitespace().nth(3)?;
    field.split_once('/')?.1.parse().ok()
}

/// The path of a process's cgroup for `controller` (`memory`, `cpuacct`; on
/// v2 the unified `0::` line) from /proc/<pid>/cgroup text, relative to the
/// hierarchy's mount.
#[must_use]
pub fn proc_cgroup_path<'a>(proc_cgroup: &'a str, controller: &str) -> Option<&'a str> {
    proc_cgroup.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        let hit = if controller.is_empty() {
            ctrls.is_empty()
        } else {
            ctrls.split(',').any(|c| c == controller)
        };
        hit.then_some(path)
    })
}

/// One cumulative cpu sample and the rate computed when it was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CpuSample {
    time: i64,
    usage: u64,
    rate: Option<u64>,
}

/// The previous cumulative cpu sample of each container (and of the node), to
/// turn cumulative usage into a rate: the kubelet's `cpuUsageCache` and
/// `getAndUpdateContainerUsageNanoCores`.
#[derive(Debug, Default)]
pub struct CpuRates {
    samples: HashMap<String, CpuSample>,
}

/// Samples closer together than this keep the previous rate rather than
/// replace the previous sample (a rate over a few milliseconds is noise).
pub const MIN_RATE_WINDOW: Duration = Duration::from_secs(1);
/// Samples older than this are dropped (`defaultCachePeriod`, 10 minutes).
pub const RATE_CACHE_PERIOD: Duration = Duration::from_secs(600);

impl CpuRates {
    /// Records `usage` core-nanoseconds of `id` at `time` (ns) and returns the
    /// usage rate in nano-cores since the previous sample: `None` for a first
    /// sample, or when usage went down (a new container with the same ID).
    /// A sample less than [`MIN_RATE_WINDOW`] after the previous one (or
    /// not after it) answers the previous rate and replaces nothing.
    pub fn update(&mut self, id: &str, time: i64, usage: u64) -> Option<u64> {
        let fresh = CpuSample {
            time,
            usage,
            rate: None,
        };
        let Some(prev) = self.samples.get(id).copied() else {
            self.samples.insert(id.to_string(), fresh);
            return None;
        };
        if usage < prev.usage {
            self.samples.insert(id.to_string(), fresh);
            return None;
        }
        let window = time - prev.time;
        if window < i64::try_from(MIN_RATE_WINDOW.as_nanos()).unwrap_or(i64::MAX) {
            return prev.rate;
        }
        #[allow(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss
        )]
        let rate = ((usage - prev.usage) as f64 / window as f64 * 1e9) as u64;
        self.samples.insert(
            id.to_string(),
            CpuSample {
                time,
                usage,
                rate: Some(rate),
            },
        );
        Some(rate)
    }

    /// Drops samples taken more than [`RATE_CACHE_PERIOD`] before `now` (ns)
    /// (`cleanupOutdatedCaches`).
    pub fn prune(&mut self, now: i64) {
        let period = i64::try_from(RATE_CACHE_PERIOD.as_nanos()).unwrap_or(i64::MAX);
        self.samples.retain(|_, s| now - s.time <= period);
    }

    /// How many samples are kept.
    #[must_use]
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// No sample is kept.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

fn add(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
    }
}

/// A pod's cpu and memory as the sum of its containers'
/// (`addPodCPUMemoryStats` without a pod cgroup to read): each field is the
/// sum of the containers that report it, the time the latest container's.
#[must_use]
pub fn pod_cpu_memory(containers: &[ContainerStats]) -> (Option<CpuStats>, Option<MemoryStats>) {
    let mut cpu: Option<CpuStats> = None;
    let mut mem: Option<MemoryStats> = None;
    for c in containers {
        if let Some(cc) = &c.cpu {
            let p = cpu.get_or_insert_with(CpuStats::default);
            p.time = p.time.max(cc.time);
            p.usage_nano_cores = add(p.usage_nano_cores, cc.usage_nano_cores);
            p.usage_core_nano_seconds = add(p.usage_core_nano_seconds, cc.usage_core_nano_seconds);
        }
        if let Some(cm) = &c.memory {
            let p = mem.get_or_insert_with(MemoryStats::default);
            p.time = p.time.max(cm.time);
            p.available_bytes = add(p.available_bytes, cm.available_bytes);
            p.usage_bytes = add(p.usage_bytes, cm.usage_bytes);
            p.working_set_bytes = add(p.working_set_bytes, cm.working_set_bytes);
            p.rss_bytes = add(p.rss_bytes, cm.rss_bytes);
            p.page_faults = add(p.page_faults, cm.page_faults);
            p.major_page_faults = add(p.major_page_faults, cm.major_page_faults);
        }
    }
    (cpu, mem)
}

/// A pod's ephemeral storage (`calcEphemeralStorage` for the CRI stats
/// provider): the root filesystem's size and free space, used bytes and
/// inodes of the containers' writable layers and logs, the local volumes and
/// `extra` (the pod's own files, e.g. its `etc-hosts`).
#[must_use]
pub fn ephemeral_storage(
    rootfs: &FsStats,
    containers: &[ContainerStats],
    volumes: &[VolumeStats],
    extra: Option<&FsStats>,
) -> FsStats {
    let mut out = FsStats {
        time: rootfs.time,
        available_bytes: rootfs.available_bytes,
        capacity_bytes: rootfs.capacity_bytes,
        inodes_free: rootfs.inodes_free,
        inodes: rootfs.inodes,
        ..FsStats::default()
    };
    let mut take = |fs: &FsStats| {
        out.used_bytes = add(out.used_bytes, fs.used_bytes);
        out.inodes_used = add(out.inodes_used, fs.inodes_used);
        out.time = out.time.max(fs.time);
    };
    for c in containers {
        if let Some(r) = &c.rootfs {
            take(r);
            if let Some(l) = &c.logs {
                take(l);
            }
        }
    }
    for v in volumes {
        take(&v.fs);
    }
    if let Some(e) = extra {
        take(e);
    }
    out
}

/// The pod sandboxes whose containers count (`removeTerminatedPods`): of
/// several sandboxes of one pod name and namespace, the ready ones, or else
/// the newest.
#[must_use]
pub fn live_sandboxes(mut sandboxes: Vec<cri::PodSandbox>) -> Vec<cri::PodSandbox> {
    sandboxes.sort_by_key(|s| s.created_at);
    let mut by_pod: HashMap<(String, String), Vec<cri::PodSandbox>> = HashMap::new();
    let mut order = Vec::new();
    for s in sandboxes {
        let key = s
            .metadata
            .as_ref()
            .map(|m| (m.namespace.clone(), m.name.clone()))
            .unwrap_or_default();
        if !by_pod.contains_key(&key) {
            order.push(key.clone());
        }
        by_pod.entry(key).or_default().push(s);
    }
    let ready = cri::PodSandboxState::SandboxReady as i32;
    let mut out = Vec::new();
    for key in order {
        let mut group = by_pod.remove(&key).unwrap_or_default();
        if group.len() > 1 && group.iter().any(|s| s.state == ready) {
            out.extend(group.into_iter().filter(|s| s.state == ready));
        } else if let Some(last) = group.pop() {
            out.push(last);
        }
    }
    out
}

/// Labels of the container series of `/metrics/resource`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContainerLabels {
    container: String,
    pod: String,
    namespace: String,
}

/// Labels of the pod series of `/metrics/resource`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PodLabels {
    pod: String,
    namespace: String,
}

type FloatCounter = Counter<f64, std::sync::atomic::AtomicU64>;
type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

#[allow(clippy::cast_precision_loss)] // byte counts and nanoseconds as Prometheus floats
fn f(v: u64) -> f64 {
    v as f64
}

/// `/metrics/resource` for a summary (`resourceMetricsCollector`): node, pod
/// and container cpu (cumulative, seconds) and working set (bytes), container
/// start times (seconds since the epoch) and `resource_scrape_error` (1 when
/// `summary` is `None`: the stats could not be gathered). Series whose value
/// is unknown are left out, as the kubelet leaves them out.
///
/// # Errors
/// Only if formatting fails, which writing to a `String` does not.
pub fn resource_metrics(summary: Option<&Summary>) -> Result<String, std::fmt::Error> {
    let mut reg = Registry::default();
    let node_cpu = FloatCounter::default();
    let node_mem = FloatGauge::default();
    let container_cpu = Family::<ContainerLabels, FloatCounter>::default();
    let container_mem = Family::<ContainerLabels, FloatGauge>::default();
    let container_start = Family::<ContainerLabels, FloatGauge>::default();
    let pod_cpu = Family::<PodLabels, FloatCounter>::default();
    let pod_mem = Family::<PodLabels, FloatGauge>::default();
    let scrape_error = Gauge::<i64>::default();
    if let Some(s) = summary {
        if let Some(v) = s.node.cpu.and_then(|c| c.usage_core_nano_seconds) {
            reg.register(
                "node_cpu_usage_seconds",
                "Cumulative cpu time consumed by the node in core-seconds",
                node_cpu.clone(),
            );
            node_cpu.inc_by(f(v) / 1e9);
        }
        if let Some(v) = s.node.memory.and_then(|m| m.working_set_bytes) {
            reg.register(
                "node_memory_working_set_bytes",
                "Current working set of the node in bytes",
                node_mem.clone(),
            );
            node_mem.set(f(v));
        }
        for p in &s.pods {
            for c in &p.containers {
                let l = ContainerLabels {
                    container: c.name.clone(),
                    pod: p.pod_ref.name.clone(),
                    namespace: p.pod_ref.namespace.clone(),
                };
                if c.start_time.0 > 0 {
                    container_start
                        .get_or_create(&l)
                        .set(c.start_time.as_secs_f64());
                }
                if let Some(v) = c.cpu.and_then(|c| c.usage_core_nano_seconds) {
                    container_cpu.get_or_create(&l).inc_by(f(v) / 1e9);
                }
                if let Some(v) = c.memory.and_then(|m| m.working_set_bytes) {
                    container_mem.get_or_create(&l).set(f(v));
                }
            }
            let l = PodLabels {
                pod: p.pod_ref.name.clone(),
                namespace: p.pod_ref.namespace.clone(),
            };
            if let Some(v) = p.cpu.and_then(|c| c.usage_core_nano_seconds) {
                pod_cpu.get_or_create(&l).inc_by(f(v) / 1e9);
            }
            if let Some(v) = p.memory.and_then(|m| m.working_set_bytes) {
                pod_mem.get_or_create(&l).set(f(v));
            }
        }
    } else {
        scrape_error.set(1);
    }
    reg.register(
        "container_cpu_usage_seconds",
        "Cumulative cpu time consumed by the container in core-seconds",
        container_cpu,
    );
    reg.register(
        "container_memory_working_set_bytes",
        "Current working set of the container in bytes",
        container_mem,
    );
    reg.register(
        "container_start_time_seconds",
        "Start time of the container since unix epoch in seconds",
        container_start,
    );
    reg.register(
        "pod_cpu_usage_seconds",
        "Cumulative cpu time consumed by the pod in core-seconds",
        pod_cpu,
    );
    reg.register(
        "pod_memory_working_set_bytes",
        "Current working set of the pod in bytes",
        pod_mem,
    );
    reg.register(
        "resource_scrape_error",
        "1 if there was an error while getting container metrics, 0 otherwise",
        scrape_error,
    );
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &reg)?;
    Ok(out)
}

#[cfg(test)]
mod tests;
