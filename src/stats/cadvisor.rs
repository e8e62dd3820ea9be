//! `/metrics/cadvisor` of the node API: the node's root cgroup (container
//! `id="/"`, with the node's block devices) and each running container's
//! cgroup in cAdvisor's metric names and labels (cadvisor `metrics/prometheus.go`, as
//! the kubelet serves it with `container`, `id`, `image`, `name`,
//! `namespace` and `pod` labels), and the pure parts of reading it: the
//! cgroup and /proc files as cAdvisor's libcontainer handler reads them.
//!
//! What is read is gathered by [`super::Provider::cadvisor_metrics`]; this
//! module turns file texts into numbers and numbers into the exposition.

use std::collections::HashMap;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::kernel_files::{Interface, flat_keyed};

/// The container name of a pod's sandbox in the metrics (the kubelet's
/// `PodInfraContainerName`).
pub const POD_INFRA_CONTAINER: &str = "POD";

/// Nanoseconds per `USER_HZ` tick of `cpuacct.stat` (the kernel's
/// `USER_HZ` is 100 on every architecture Kubernetes runs on).
const NANOS_PER_TICK: u64 = 10_000_000;

/// A limit above this is "unlimited" and reported as 0, as cAdvisor's
/// `specMemoryValue` (the kernel rounds `i64::MAX` down to a page).
const UNLIMITED_MEMORY: u64 = 1 << 62;

/// The base labels of every series of one container (cAdvisor's
/// `containerPrometheusLabelsFunc` in the kubelet).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// The container's name in its pod (`POD` for the sandbox).
    pub container: String,
    /// Its cgroup path (`/kubepods/burstable/pod<uid>/<id>`).
    pub id: String,
    /// Its image.
    pub image: String,
    /// Its runtime id.
    pub name: String,
    /// Its pod's namespace.
    pub namespace: String,
    /// Its pod's name.
    pub pod: String,
}

/// Cumulative cpu time, nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cpu {
    /// All cpu time (`cpuacct.usage`, v2 `usage_usec`).
    pub usage: u64,
    /// User time (`cpuacct.stat` `user`, v2 `user_usec`).
    pub user: u64,
    /// System time (`cpuacct.stat` `system`, v2 `system_usec`).
    pub system: u64,
}

/// The user and system time of a cgroup v1 `cpuacct.stat` (ticks of
/// `USER_HZ`) in nanoseconds; a missing key is 0.
#[must_use]
pub fn cpuacct_stat(text: &str) -> (u64, u64) {
    let stat = flat_keyed(text);
    let ns = |k| {
        stat.get(k)
            .copied()
            .unwrap_or(0)
            .saturating_mul(NANOS_PER_TICK)
    };
    (ns("user"), ns("system"))
}

/// The user and system time of a cgroup v2 `cpu.stat` in nanoseconds.
#[must_use]
pub fn cpu_stat_v2_user_system(text: &str) -> (u64, u64) {
    let stat = flat_keyed(text);
    let ns = |k| stat.get(k).copied().unwrap_or(0).saturating_mul(1000);
    (ns("user_usec"), ns("system_usec"))
}

/// A memory cgroup's numbers, bytes unless said.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// `memory.usage_in_bytes` (v2 `memory.current`).
    pub usage: u64,
    /// `memory.max_usage_in_bytes` (v2 `memory.peak`, 0 where absent).
    pub max_usage: u64,
    /// `memory.failcnt`: times usage hit the limit (v2: 0).
    pub failcnt: u64,
    /// Usage less inactive file pages.
    pub working_set: u64,
    /// Page cache (`total_cache`, v2 `file`).
    pub cache: u64,
    /// Anonymous memory (`total_rss`, v2 `anon`).
    pub rss: u64,
    /// Mapped files (`total_mapped_file`, v2 `file_mapped`).
    pub mapped_file: u64,
    /// Swap (`total_swap`, v2 `memory.swap.current`).
    pub swap: u64,
    /// Page faults (`pgfault`), a count.
    pub pgfault: u64,
    /// Major page faults (`pgmajfault`), a count.
    pub pgmajfault: u64,
    /// `memory.events` `high` (v1: 0), a count.
    pub events_high: u64,
    /// `memory.events` `max` (v1: 0), a count.
    pub events_max: u64,
    /// OOM kills in the cgroup (`memory.oom_control` or `memory.events`
    /// `oom_kill`), a count.
    pub oom_kills: u64,
}

impl Memory {
    /// From a memory cgroup's usage, `memory.stat` and (v2)
    /// `memory.events` texts; `v1` picks cgroup v1's hierarchical `total_*`
    /// keys, as cAdvisor's `setMemoryStats` with `use_hierarchy`.
    #[must_use]
    pub fn parse(usage: u64, memory_stat: &str, memory_events: &str, v1: bool) -> Self {
        let stat = flat_keyed(memory_stat);
        let events = flat_keyed(memory_events);
        let get = |k: &str| stat.get(k).copied().unwrap_or(0);
        let (cache, rss, mapped, swap, inactive) = if v1 {
            (
                "total_cache",
                "total_rss",
                "total_mapped_file",
                "total_swap",
                "total_inactive_file",
            )
        } else {
            ("file", "anon", "file_mapped", "", "inactive_file")
        };
        Self {
            usage,
            working_set: usage.saturating_sub(get(inactive)),
            cache: get(cache),
            rss: get(rss),
            mapped_file: get(mapped),
            swap: get(swap),
            pgfault: get("pgfault"),
            pgmajfault: get("pgmajfault"),
            events_high: events.get("high").copied().unwrap_or(0),
            events_max: events.get("max").copied().unwrap_or(0),
            oom_kills: events.get("oom_kill").copied().unwrap_or(0),
            ..Self::default()
        }
    }
}

/// The resource limits the container was given (its cgroup's settings).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spec {
    /// `cpu.cfs_period_us`, microseconds.
    pub cpu_period: Option<u64>,
    /// `cpu.cfs_quota_us`, microseconds; `None` when unlimited.
    pub cpu_quota: Option<u64>,
    /// `cpu.shares` (v2: `cpu.weight` converted back to shares).
    pub cpu_shares: Option<u64>,
    /// The memory limit, bytes (raw: "unlimited" is reported as 0).
    pub memory_limit: Option<u64>,
    /// Memory plus swap limit, bytes (raw).
    pub memory_swap_limit: Option<u64>,
    /// Soft limit (`memory.soft_limit_in_bytes`, v2 `memory.low`), bytes (raw).
    pub memory_reservation: Option<u64>,
}

/// A cgroup v1 limit file or a v2 file that may say `max`: `max` (and a
/// v1 `-1`) is `u64::MAX`, which [`render`] reports as unlimited.
#[must_use]
pub fn limit_value(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" || t == "-1" {
        return Some(u64::MAX);
    }
    t.parse().ok()
}

/// The first number of a cgroup v2 `cpu.max` (`<quota|max> <period>`) as
/// (quota, period), microseconds; quota `None` when `max`.
#[must_use]
pub fn cpu_max_v2(text: &str) -> Option<(Option<u64>, u64)> {
    let mut it = text.split_whitespace();
    let quota = it.next()?;
    let period = it.next()?.parse().ok()?;
    Some((
        (quota != "max").then(|| quota.parse().ok()).flatten(),
        period,
    ))
}

/// Cgroup v2 `cpu.weight` (1–10000) back to v1 shares (2–262144), the
/// inverse of runc's conversion, as cAdvisor reports v2 cpu shares.
#[must_use]
pub fn weight_to_shares(weight: u64) -> u64 {
    crate::cgroups::shares_from_weight(weight.max(1))
}

/// Block I/O of a container on one device: bytes and operations since the
/// cgroup was made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceIo {
    /// The device's name (`/dev/vda`), or `major:minor` when unknown.
    pub device: String,
    /// Major number.
    pub major: u64,
    /// Minor number.
    pub minor: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Bytes written.
    pub write_bytes: u64,
    /// Read operations.
    pub reads: u64,
    /// Write operations.
    pub writes: u64,
}

/// Devices and their I/O from cgroup v1's `blkio.throttle.io_service_bytes`
/// and `blkio.throttle.io_serviced` texts (`<major>:<minor> <Op> <n>` lines,
/// a final `Total` line), sorted by device number; names are left as
/// `major:minor` for the caller to resolve.
#[must_use]
pub fn blkio_v1(service_bytes: &str, serviced: &str) -> Vec<DeviceIo> {
    let mut devices: HashMap<(u64, u64), DeviceIo> = HashMap::new();
    for (text, bytes) in [(service_bytes, true), (serviced, false)] {
        for line in text.lines() {
            let mut it = line.split_whitespace();
            let (Some(dev), Some(op), Some(n)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let Some((major, minor)) = device_numbers(dev) else {
                continue;
            };
            let Ok(n) = n.parse::<u64>() else {
                continue;
            };
            let d = devices
                .entry((major, minor))
                .or_insert_with(|| new_device(major, minor));
            match (op, bytes) {
                ("Read", true) => d.read_bytes = n,
                ("Write", true) => d.write_bytes = n,
                ("Read", false) => d.reads = n,
                ("Write", false) => d.writes = n,
                _ => {}
            }
        }
    }
    sorted(devices)
}

/// Devices and their I/O from a cgroup v2 `io.stat` text
/// (`<major>:<minor> rbytes=… wbytes=… rios=… wios=…` lines).
#[must_use]
pub fn io_stat_v2(text: &str) -> Vec<DeviceIo> {
    let mut devices: HashMap<(u64, u64), DeviceIo> = HashMap::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let Some((major, minor)) = it.next().and_then(device_numbers) else {
            continue;
        };
        let d = devices
            .entry((major, minor))
            .or_insert_with(|| new_device(major, minor));
        for kv in it {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let Ok(v) = v.parse::<u64>() else {
                continue;
            };
            match k {
                "rbytes" => d.read_bytes = v,
                "wbytes" => d.write_bytes = v,
                "rios" => d.reads = v,
                "wios" => d.writes = v,
                _ => {}
            }
        }
    }
    sorted(devices)
}

fn device_numbers(dev: &str) -> Option<(u64, u64)> {
    let (major, minor) = dev.split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

fn new_device(major: u64, minor: u64) -> DeviceIo {
    DeviceIo {
        device: format!("{major}:{minor}"),
        major,
        minor,
        ..DeviceIo::default()
    }
}

fn sorted(devices: HashMap<(u64, u64), DeviceIo>) -> Vec<DeviceIo> {
    let mut v: Vec<DeviceIo> = devices.into_values().collect();
    v.sort_by_key(|d| (d.major, d.minor));
    v
}

/// The `DEVNAME` of a `/sys/dev/block/<major>:<minor>/uevent` text as a
/// device path (`/dev/vda`).
#[must_use]
pub fn uevent_device(uevent: &str) -> Option<String> {
    uevent
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .map(|n| format!("/dev/{}", n.trim()))
}

/// The soft limit of "Max open files" in a `/proc/<pid>/limits` text;
/// `unlimited` is -1, as cAdvisor's ulimits.
#[must_use]
pub fn max_open_files_soft(limits: &str) -> Option<i64> {
    let rest = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?;
    let soft = rest.split_whitespace().next()?;
    if soft == "unlimited" {
        Some(-1)
    } else {
        soft.parse().ok()
    }
}

/// A container's processes (cAdvisor's `ProcessStats`), counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Processes {
    /// Processes in the cgroup.
    pub processes: u64,
    /// Threads in the cgroup (`pids.current`, else the `tasks` lines).
    pub threads: u64,
    /// `pids.max` (0 when unlimited, as cAdvisor's).
    pub threads_max: u64,
    /// Open file descriptors of its processes.
    pub file_descriptors: u64,
    /// Of those, sockets.
    pub sockets: u64,
    /// The soft "Max open files" of its first process (-1: unlimited).
    pub max_open_files: Option<i64>,
}

/// Everything reported of one container (or of a pod's sandbox, as
/// container `POD`: its network).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// Its labels.
    pub identity: Identity,
    /// Its start, seconds since the epoch.
    pub start_time: i64,
    /// Its cpu time.
    pub cpu: Option<Cpu>,
    /// Its memory.
    pub memory: Option<Memory>,
    /// Its limits.
    pub spec: Spec,
    /// Its block I/O by device.
    pub io: Vec<DeviceIo>,
    /// Its writable layer's usage: (device, bytes).
    pub fs_usage: Option<(String, u64)>,
    /// Its processes.
    pub processes: Option<Processes>,
    /// Its network interfaces (the sandbox's).
    pub network: Vec<Interface>,
    /// The filesystems it sees (the root container's: the node's block
    /// devices), with their I/O counters.
    pub filesystems: Vec<Filesystem>,
}

/// The I/O counters of a block device, from `/proc/diskstats`: operations
/// and sectors since boot, times in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Major number.
    pub major: u64,
    /// Minor number.
    pub minor: u64,
    /// Reads completed.
    pub reads: u64,
    /// Reads merged.
    pub reads_merged: u64,
    /// Sectors read.
    pub sectors_read: u64,
    /// Time spent reading, ms.
    pub read_ms: u64,
    /// Writes completed.
    pub writes: u64,
    /// Writes merged.
    pub writes_merged: u64,
    /// Sectors written.
    pub sectors_written: u64,
    /// Time spent writing, ms.
    pub write_ms: u64,
    /// I/Os in progress.
    pub in_progress: u64,
    /// Time spent doing I/O, ms.
    pub io_ms: u64,
    /// Weighted time spent doing I/O, ms.
    pub weighted_io_ms: u64,
}

/// The devices of a `/proc/diskstats` text (`major minor name` and at least
/// eleven counters); a line that does not parse is skipped.
#[must_use]
pub fn diskstats(text: &str) -> Vec<DiskStats> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 14 {
                return None;
            }
            let n = |i: usize| f[i].parse::<u64>().ok();
            Some(DiskStats {
                major: n(0)?,
                minor: n(1)?,
                reads: n(3)?,
                reads_merged: n(4)?,
                sectors_read: n(5)?,
                read_ms: n(6)?,
                writes: n(7)?,
                writes_merged: n(8)?,
                sectors_written: n(9)?,
                write_ms: n(10)?,
                in_progress: n(11)?,
                io_ms: n(12)?,
                weighted_io_ms: n(13)?,
            })
        })
        .collect()
}

/// The block devices mounted on the node, from a `/proc/self/mountinfo`
/// text: (major, minor, mount point) of each mount whose source is a
/// `/dev/` path, one per device (its first mount).
#[must_use]
pub fn mounted_devices(mountinfo: &str) -> Vec<(u64, u64, String)> {
    let mut out: Vec<(u64, u64, String)> = Vec::new();
    for l in mountinfo.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let Some(dash) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        let (Some(dev), Some(point), Some(source)) = (f.get(2), f.get(4), f.get(dash + 2)) else {
            continue;
        };
        let Some((major, minor)) = device_numbers(dev) else {
            continue;
        };
        if major == 0 || !source.starts_with("/dev/") {
            continue;
        }
        if !out.iter().any(|(a, b, _)| (*a, *b) == (major, minor)) {
            out.push((major, minor, (*point).to_string()));
        }
    }
    out
}

/// A filesystem the root container reports: its device, size and use
/// (bytes, inodes) and its device's I/O counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filesystem {
    /// The device (`/dev/vda`).
    pub device: String,
    /// Size, bytes.
    pub limit: u64,
    /// Used, bytes.
    pub usage: u64,
    /// Inodes.
    pub inodes: u64,
    /// Free inodes.
    pub inodes_free: u64,
    /// The device's counters, when `/proc/diskstats` has it.
    pub stats: Option<DiskStats>,
}

type FloatCounter = Counter<f64, std::sync::atomic::AtomicU64>;
type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;
type Labels = Vec<(&'static str, String)>;

#[allow(clippy::cast_precision_loss)] // byte counts and nanoseconds as Prometheus floats
fn f(v: u64) -> f64 {
    v as f64
}

#[allow(clippy::cast_precision_loss)] // seconds since the epoch and limits as Prometheus floats
fn fi(v: i64) -> f64 {
    v as f64
}

/// A limit as cAdvisor reports it: 0 when unlimited (`specMemoryValue`).
fn spec_memory(v: u64) -> f64 {
    if v > UNLIMITED_MEMORY { 0.0 } else { f(v) }
}

/// One metric family being filled.
enum Metric {
    Gauge(Family<Labels, FloatGauge>),
    Counter(Family<Labels, FloatCounter>),
}

/// The families of the exposition, in the order they are written.
struct Families {
    order: Vec<(&'static str, &'static str)>,
    metrics: HashMap<&'static str, Metric>,
}

impl Families {
    fn new() -> Self {
        Self {
            order: Vec::new(),
            metrics: HashMap::new(),
        }
    }

    /// Adds `v` to gauge `name` (a sample written once per label set).
    fn gauge(&mut self, name: &'static str, help: &'static str, labels: Labels, v: f64) {
        let m = self.metrics.entry(name).or_insert_with(|| {
            self.order.push((name, help));
            Metric::Gauge(Family::default())
        });
        if let Metric::Gauge(fam) = m {
            fam.get_or_create(&labels).set(v);
        }
    }

    /// Adds `v` to counter `name` (written with the `_total` suffix).
    fn counter(&mut self, name: &'static str, help: &'static str, labels: Labels, v: f64) {
        let m = self.metrics.entry(name).or_insert_with(|| {
            self.order.push((name, help));
            Metric::Counter(Family::default())
        });
        if let Metric::Counter(fam) = m {
            fam.get_or_create(&labels).inc_by(v);
        }
    }

    /// The exposition: the families in order, then `container_scrape_error`.
    fn encode(mut self, scrape_error: bool) -> Result<String, std::fmt::Error> {
        let mut reg = Registry::default();
        for (name, help) in self.order {
            match self.metrics.remove(name) {
                Some(Metric::Gauge(fam)) => reg.register(name, help, fam),
                Some(Metric::Counter(fam)) => reg.register(name, help, fam),
                None => {}
            }
        }
        let error = Gauge::<i64>::default();
        error.set(i64::from(scrape_error));
        reg.register(
            "container_scrape_error",
            "1 if there was an error while getting container metrics, 0 otherwise",
            error,
        );
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg)?;
        Ok(out)
    }
}

fn base(id: &Identity) -> Labels {
    vec![
        ("container", id.container.clone()),
        ("id", id.id.clone()),
        ("image", id.image.clone()),
        ("name", id.name.clone()),
        ("namespace", id.namespace.clone()),
        ("pod", id.pod.clone()),
    ]
}

fn with(id: &Identity, extra: &[(&'static str, &str)]) -> Labels {
    let mut l = base(id);
    l.extend(extra.iter().map(|(k, v)| (*k, (*v).to_string())));
    l
}

/// The `/metrics/cadvisor` exposition of `samples` at `now` (seconds since
/// the epoch, written as `container_last_seen`), with
/// `container_scrape_error` 1 when `scrape_error` (the runtime could not be
/// asked). Series without timestamps: each value is as of the scrape.
///
/// # Errors
/// Only if formatting fails, which writing to a `String` does not.
pub fn render(samples: &[Sample], now: i64, scrape_error: bool) -> Result<String, std::fmt::Error> {
    let mut m = Families::new();
    for s in samples {
        let id = &s.identity;
        write_seen(&mut m, s, now);
        write_spec(&mut m, id, &s.spec);
        if let Some(c) = s.cpu {
            write_cpu(&mut m, id, c);
        }
        if let Some(mem) = s.memory {
            write_memory_usage(&mut m, id, mem);
            write_memory_events(&mut m, id, mem);
        }
        for d in &s.io {
            // A device whose filesystem the sample reports has its
            // operation counts from /proc/diskstats (the root container).
            let counted = s.filesystems.iter().any(|fs| fs.device == d.device);
            write_device_io(&mut m, id, d, counted);
        }
        if let Some((device, used)) = &s.fs_usage {
            m.gauge(
                "container_fs_usage_bytes",
                "Number of bytes that are consumed by the container on this filesystem.",
                with(id, &[("device", device)]),
                f(*used),
            );
        }
        if let Some(p) = s.processes {
            write_processes(&mut m, id, p);
        }
        for fs in &s.filesystems {
            write_filesystem(&mut m, id, fs);
        }
        for i in &s.network {
            write_interface(&mut m, id, i);
        }
    }
    m.encode(scrape_error)
}

/// When the container was last seen (`now`) and, when known, when it
/// started.
fn write_seen(m: &mut Families, s: &Sample, now: i64) {
    m.gauge(
        "container_last_seen",
        "Last time a container was seen by the exporter",
        base(&s.identity),
        fi(now),
    );
    if s.start_time > 0 {
        m.gauge(
            "container_start_time_seconds",
            "Start time of the container since unix epoch in seconds.",
            base(&s.identity),
            fi(s.start_time),
        );
    }
}

/// The container's limits (`container_spec_*`): each cpu setting its
/// cgroup has, and, when it has a memory limit, the three memory limits
/// ("unlimited" as 0, as cAdvisor's `specMemoryValue`).
fn write_spec(m: &mut Families, id: &Identity, spec: &Spec) {
    if let Some(p) = spec.cpu_period {
        m.gauge(
            "container_spec_cpu_period",
            "CPU period of the container.",
            base(id),
            f(p),
        );
    }
    if let Some(q) = spec.cpu_quota {
        m.gauge(
            "container_spec_cpu_quota",
            "CPU quota of the container.",
            base(id),
            f(q),
        );
    }
    if let Some(v) = spec.cpu_shares {
        m.gauge(
            "container_spec_cpu_shares",
            "CPU share of the container.",
            base(id),
            f(v),
        );
    }
    if let Some(v) = spec.memory_limit {
        m.gauge(
            "container_spec_memory_limit_bytes",
            "Memory limit for the container.",
            base(id),
            spec_memory(v),
        );
        m.gauge(
            "container_spec_memory_swap_limit_bytes",
            "Memory swap limit for the container.",
            base(id),
            spec.memory_swap_limit.map_or(0.0, spec_memory),
        );
        m.gauge(
            "container_spec_memory_reservation_limit_bytes",
            "Memory reservation limit for the container.",
            base(id),
            spec.memory_reservation.map_or(0.0, spec_memory),
        );
    }
}

/// The container's cpu time, seconds: user, system and all of it (as
/// `cpu="total"`).
fn write_cpu(m: &mut Families, id: &Identity, c: Cpu) {
    m.counter(
        "container_cpu_user_seconds",
        "Cumulative user cpu time consumed in seconds.",
        base(id),
        f(c.user) / 1e9,
    );
    m.counter(
        "container_cpu_system_seconds",
        "Cumulative system cpu time consumed in seconds.",
        base(id),
        f(c.system) / 1e9,
    );
    m.counter(
        "container_cpu_usage_seconds",
        "Cumulative cpu time consumed in seconds.",
        with(id, &[("cpu", "total")]),
        f(c.usage) / 1e9,
    );
}

/// The container's memory use, bytes (cache, rss, mapped files, swap,
/// usage, its peak and the working set), and how often usage hit the
/// limit (`container_memory_failcnt`).
fn write_memory_usage(m: &mut Families, id: &Identity, mem: Memory) {
    let gauges: [(&'static str, &'static str, u64); 7] = [
        (
            "container_memory_cache",
            "Number of bytes of page cache memory.",
            mem.cache,
        ),
        ("container_memory_rss", "Size of RSS in bytes.", mem.rss),
        (
            "container_memory_mapped_file",
            "Size of memory mapped files in bytes.",
            mem.mapped_file,
        ),
        (
            "container_memory_swap",
            "Container swap usage in bytes.",
            mem.swap,
        ),
        (
            "container_memory_usage_bytes",
            "Current memory usage in bytes, including all memory regardless of when it was accessed",
            mem.usage,
        ),
        (
            "container_memory_max_usage_bytes",
            "Maximum memory usage recorded in bytes",
            mem.max_usage,
        ),
        (
            "container_memory_working_set_bytes",
            "Current working set in bytes.",
            mem.working_set,
        ),
    ];
    for (name, help, v) in gauges {
        m.gauge(name, help, base(id), f(v));
    }
    // cAdvisor's counter without the `_total` suffix, which the
    // encoder would add to a counter: written as a gauge.
    m.gauge(
        "container_memory_failcnt",
        "Number of memory usage hits limits",
        base(id),
        f(mem.failcnt),
    );
}

/// The container's memory events, counts: page faults (as
/// `container_memory_failures`, container and hierarchy scope alike),
/// `memory.high` and `memory.max` events, and OOM kills.
fn write_memory_events(m: &mut Families, id: &Identity, mem: Memory) {
    for (kind, scope, v) in [
        ("pgfault", "container", mem.pgfault),
        ("pgmajfault", "container", mem.pgmajfault),
        ("pgfault", "hierarchy", mem.pgfault),
        ("pgmajfault", "hierarchy", mem.pgmajfault),
    ] {
        m.counter(
            "container_memory_failures",
            "Cumulative count of memory allocation failures.",
            with(id, &[("failure_type", kind), ("scope", scope)]),
            f(v),
        );
    }
    m.counter(
        "container_memory_events_high",
        "Cumulative count of memory.high throttle events for the container",
        base(id),
        f(mem.events_high),
    );
    m.counter(
        "container_memory_events_max",
        "Cumulative count of memory.max limit hit events for the container",
        base(id),
        f(mem.events_max),
    );
    m.counter(
        "container_oom_events",
        "Count of out of memory events observed for the container",
        base(id),
        f(mem.oom_kills),
    );
}

/// The container's block I/O on device `d`: bytes and operations read and
/// written (the operations left to [`write_disk_stats`] when `counted`: the
/// sample reports the device's filesystem), and the bytes again as
/// `container_blkio_device_usage` by operation.
fn write_device_io(m: &mut Families, id: &Identity, d: &DeviceIo, counted: bool) {
    let dev = [("device", d.device.as_str())];
    for (name, help, v) in [
        (
            "container_fs_reads_bytes",
            "Cumulative count of bytes read",
            d.read_bytes,
        ),
        (
            "container_fs_reads",
            "Cumulative count of reads completed",
            d.reads,
        ),
        (
            "container_fs_writes_bytes",
            "Cumulative count of bytes written",
            d.write_bytes,
        ),
        (
            "container_fs_writes",
            "Cumulative count of writes completed",
            d.writes,
        ),
    ] {
        if counted && (name == "container_fs_reads" || name == "container_fs_writes") {
            continue;
        }
        m.counter(name, help, with(id, &dev), f(v));
    }
    let (major, minor) = (d.major.to_string(), d.minor.to_string());
    for (op, v) in [("Read", d.read_bytes), ("Write", d.write_bytes)] {
        m.counter(
            "container_blkio_device_usage",
            "Blkio Device bytes usage",
            with(
                id,
                &[
                    ("device", d.device.as_str()),
                    ("major", &major),
                    ("minor", &minor),
                    ("operation", op),
                ],
            ),
            f(v),
        );
    }
}

/// The container's processes, threads, open files and sockets, its thread
/// limit and its first process's open-file limit.
fn write_processes(m: &mut Families, id: &Identity, p: Processes) {
    for (name, help, v) in [
        (
            "container_processes",
            "Number of processes running inside the container.",
            p.processes,
        ),
        (
            "container_file_descriptors",
            "Number of open file descriptors for the container.",
            p.file_descriptors,
        ),
        (
            "container_sockets",
            "Number of open sockets for the container.",
            p.sockets,
        ),
        (
            "container_threads_max",
            "Maximum number of threads allowed inside the container, infinity if value is zero",
            p.threads_max,
        ),
        (
            "container_threads",
            "Number of threads running inside the container",
            p.threads,
        ),
    ] {
        m.gauge(name, help, base(id), f(v));
    }
    if let Some(v) = p.max_open_files {
        m.gauge(
            "container_ulimits_soft",
            "Soft ulimit values for the container root process. Unlimited if -1, except priority and nice",
            with(id, &[("ulimit", "max_open_files")]),
            fi(v),
        );
    }
}

/// A filesystem the container sees (the root container's block devices):
/// its size, use and inodes, and its device's counters when
/// `/proc/diskstats` has them.
fn write_filesystem(m: &mut Families, id: &Identity, fs: &Filesystem) {
    let dev = [("device", fs.device.as_str())];
    for (name, help, v) in [
        (
            "container_fs_limit_bytes",
            "Number of bytes that can be consumed by the container on this filesystem.",
            fs.limit,
        ),
        (
            "container_fs_usage_bytes",
            "Number of bytes that are consumed by the container on this filesystem.",
            fs.usage,
        ),
        ("container_fs_inodes_total", "Number of Inodes", fs.inodes),
        (
            "container_fs_inodes_free",
            "Number of available Inodes",
            fs.inodes_free,
        ),
    ] {
        m.gauge(name, help, with(id, &dev), f(v));
    }
    if let Some(d) = &fs.stats {
        write_disk_stats(m, id, &fs.device, d);
    }
}

/// The `/proc/diskstats` counters of `device`: operations, merges and
/// sectors read and written, the time spent (seconds), and the I/Os in
/// progress.
fn write_disk_stats(m: &mut Families, id: &Identity, device: &str, d: &DiskStats) {
    let dev = [("device", device)];
    let ms = |v: u64| f(v) / 1000.0;
    for (name, help, v) in [
        (
            "container_fs_reads",
            "Cumulative count of reads completed",
            f(d.reads),
        ),
        (
            "container_fs_reads_merged",
            "Cumulative count of reads merged",
            f(d.reads_merged),
        ),
        (
            "container_fs_sector_reads",
            "Cumulative count of sector reads completed",
            f(d.sectors_read),
        ),
        (
            "container_fs_read_seconds",
            "Cumulative count of seconds spent reading",
            ms(d.read_ms),
        ),
        (
            "container_fs_writes",
            "Cumulative count of writes completed",
            f(d.writes),
        ),
        (
            "container_fs_writes_merged",
            "Cumulative count of writes merged",
            f(d.writes_merged),
        ),
        (
            "container_fs_sector_writes",
            "Cumulative count of sector writes completed",
            f(d.sectors_written),
        ),
        (
            "container_fs_write_seconds",
            "Cumulative count of seconds spent writing",
            ms(d.write_ms),
        ),
        (
            "container_fs_io_time_seconds",
            "Cumulative count of seconds spent doing I/Os",
            ms(d.io_ms),
        ),
        (
            "container_fs_io_time_weighted_seconds",
            "Cumulative weighted I/O time in seconds",
            ms(d.weighted_io_ms),
        ),
    ] {
        m.counter(name, help, with(id, &dev), v);
    }
    m.gauge(
        "container_fs_io_current",
        "Number of I/Os currently in progress",
        with(id, &dev),
        f(d.in_progress),
    );
}

/// The counters of network interface `i` of the container's network
/// namespace (a sandbox's): bytes, packets, drops and errors each way.
fn write_interface(m: &mut Families, id: &Identity, i: &Interface) {
    let l = || with(id, &[("interface", i.name.as_str())]);
    for (name, help, v) in [
        (
            "container_network_receive_bytes",
            "Cumulative count of bytes received",
            i.rx_bytes,
        ),
        (
            "container_network_receive_packets",
            "Cumulative count of packets received",
            i.rx_packets,
        ),
        (
            "container_network_receive_packets_dropped",
            "Cumulative count of packets dropped while receiving",
            i.rx_dropped,
        ),
        (
            "container_network_receive_errors",
            "Cumulative count of errors encountered while receiving",
            i.rx_errors,
        ),
        (
            "container_network_transmit_bytes",
            "Cumulative count of bytes transmitted",
            i.tx_bytes,
        ),
        (
            "container_network_transmit_packets",
            "Cumulative count of packets transmitted",
            i.tx_packets,
        ),
        (
            "container_network_transmit_packets_dropped",
            "Cumulative count of packets dropped while transmitting",
            i.tx_dropped,
        ),
        (
            "container_network_transmit_errors",
            "Cumulative count of errors encountered while transmitting",
            i.tx_errors,
        ),
    ] {
        m.counter(name, help, l(), f(v));
    }
}

#[cfg(test)]
mod tests;
