//! The node's resource statistics, as the kubelet's CRI stats provider
//! gathers them (pkg/kubelet/stats/cri_stats_provider.go) for `/stats/summary`
//! and `/metrics/resource` of the node API.
//!
//! Containers: cpu, memory and writable layer from CRI `ListContainerStats`
//! (running containers of live sandboxes only, as `removeTerminatedContainers`
//! and `removeTerminatedPods`); when the runtime leaves cpu or memory out,
//! the container's own cgroup files (found through its process's
//! `/proc/<pid>/cgroup`). `usageNanoCores` is the runtime's when it reports
//! one, else the rate since the previous sample ([`summary::CpuRates`]), kept
//! fresh by [`Provider::sample`] every 10 seconds as the kubelet's eviction
//! manager housekeeping keeps its cache fresh. Logs: the size of the
//! container's log directory.
//!
//! Pods: cpu and memory from CRI `ListPodSandboxStats`, which reads the pod
//! cgroup (the sandbox's cgroup parent: the sandbox and the pod's overhead
//! count, as in the kubelet's pod stats from the pod cgroup), else the sum
//! of their containers'; network from the same sandbox stats when the
//! runtime reports it, else from the sandbox process's `/proc/<pid>/net/dev`
//! (containerd 2 refuses sandbox stats for sandboxes without a cgroup
//! parent); emptyDir volumes and ephemeral storage from the pod's
//! directories; CSI volumes from their drivers.
//!
//! Node: cpu and memory from the root cgroup (cgroup v1: `cpuacct.usage`,
//! `memory.usage_in_bytes` less `total_inactive_file`, as cAdvisor's root
//! container; v2: `cpu.stat` and /proc/meminfo), their pressure and the io
//! pressure from `/proc/pressure`, the network from the host's
//! `/proc/net/dev`, filesystems from `statvfs`, the image filesystem (also
//! the containers' filesystem, as the kubelet's CRI stats provider reports
//! it) from CRI `ImageFsInfo`, process limits from /proc, and the `pods`
//! system container from the cgroup above every pod's.

pub mod cadvisor;
pub mod kernel_files;
pub mod summary;
pub mod volume_usage;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_cri::v1 as cri;
use tracing::debug;

use crate::cri::Runtime;
use summary::{
    CgroupMemory, ContainerStats, CpuRates, FsStats, MemoryStats, NodeStats, PodReference,
    PodStats, RlimitStats, RuntimeStats, Summary, Time, VolumeStats,
};

/// How often [`Provider::sample`] refreshes the cpu rates (the kubelet's
/// eviction manager monitoring interval, 10 s).
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(10);

/// Errors gathering statistics.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A CRI listing failed.
    #[error(transparent)]
    Cri(#[from] crate::cri::Error),
}

/// Where a cgroup hierarchy is and which version it is.
#[derive(Clone, Debug)]
struct Cgroups {
    root: PathBuf,
    v2: bool,
}

impl Cgroups {
    fn detect(root: PathBuf) -> Self {
        let v2 = root.join("cgroup.controllers").exists();
        Self { root, v2 }
    }

    /// Cumulative cpu usage (ns) of the cgroup at `rel` (for v1 under `cpuacct`).
    fn cpu_usage(&self, rel: &str) -> Option<u64> {
        let rel = rel.trim_start_matches('/');
        if self.v2 {
            summary::cpu_stat_v2_nanos(&read(&self.root.join(rel).join("cpu.stat"))?)
        } else {
            read(&self.root.join("cpuacct").join(rel).join("cpuacct.usage"))?
                .trim()
                .parse()
                .ok()
        }
    }

    /// The directory of the cgroup at `rel` in the hierarchy that counts
    /// its cpu (for v1 `cpuacct`).
    fn cpu_dir(&self, rel: &Path) -> PathBuf {
        if self.v2 {
            self.root.join(rel)
        } else {
            self.root.join("cpuacct").join(rel)
        }
    }

    /// The processes of the cgroup at `rel` and of the cgroups below it
    /// (each one's `cgroup.procs`, in the cpu hierarchy), as cAdvisor's
    /// process count of a pod cgroup; at most [`MAX_CGROUPS_WALKED`]
    /// cgroups are read. `None` when the cgroup is gone.
    fn process_count(&self, rel: &Path) -> Option<u64> {
        let mut dirs = vec![self.cpu_dir(rel)];
        let mut count: u64 = 0;
        let mut walked = 0;
        while let Some(dir) = dirs.pop() {
            walked += 1;
            if walked > MAX_CGROUPS_WALKED {
                break;
            }
            let procs = read(&dir.join("cgroup.procs"))?;
            let n = procs.lines().filter(|l| !l.trim().is_empty()).count();
            count = count.saturating_add(u64::try_from(n).unwrap_or(u64::MAX));
            if let Ok(entries) = std::fs::read_dir(&dir) {
                dirs.extend(
                    entries
                        .flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
        }
        Some(count)
    }

    /// The pressure stall information of `resource` (`cpu`, `memory` or
    /// `io`) of the cgroup at `rel`: its `<resource>.pressure` file (on
    /// cgroup v1, a kernel with `psi=1` has it in the resource's hierarchy).
    fn pressure(&self, rel: &Path, resource: &str) -> Option<summary::PsiStats> {
        let file = format!("{resource}.pressure");
        let path = if self.v2 {
            self.root.join(rel).join(file)
        } else {
            let hierarchy = if resource == "io" { "blkio" } else { resource };
            self.root.join(hierarchy).join(rel).join(file)
        };
        summary::psi(&read(&path)?)
    }

    /// Memory of the cgroup at `rel` (for v1 under `memory`) and its limit.
    fn memory(&self, rel: &str) -> Option<(CgroupMemory, Option<u64>)> {
        let rel = rel.trim_start_matches('/');
        let (dir, usage, limit) = if self.v2 {
            (self.root.join(rel), "memory.current", "memory.max")
        } else {
            (
                self.root.join("memory").join(rel),
                "memory.usage_in_bytes",
                "memory.limit_in_bytes",
            )
        };
        let usage: u64 = read(&dir.join(usage))?.trim().parse().ok()?;
        let stat = read(&dir.join("memory.stat")).unwrap_or_default();
        let limit = read(&dir.join(limit)).and_then(|l| summary::memory_limit(&l));
        Some((CgroupMemory::parse(usage, &stat, !self.v2), limit))
    }

    /// The directory of a process's cgroup (`proc_cgroup`, its
    /// /proc/<pid>/cgroup text) in `controller`'s hierarchy (v2: the
    /// unified one).
    fn controller_dir(&self, proc_cgroup: &str, controller: &str) -> Option<PathBuf> {
        let rel = summary::proc_cgroup_path(proc_cgroup, if self.v2 { "" } else { controller })?;
        let rel = rel.trim_start_matches('/');
        Some(if self.v2 {
            self.root.join(rel)
        } else {
            self.root.join(controller).join(rel)
        })
    }

    /// Process `pid`'s cgroups (`proc_cgroup`, its /proc/<pid>/cgroup
    /// text) read as cAdvisor's libcontainer handler reads a container's:
    /// cpu, memory, limits, block I/O by device, and (with `pid`, the
    /// container's first process) its processes, their file descriptors and
    /// the first one's open-file limit; the identity's `id` is the cgroup's
    /// path. Blocking.
    fn cadvisor_sample(&self, proc_cgroup: &str, pid: Option<u64>) -> cadvisor::Sample {
        let v1 = !self.v2;
        let dir = |c: &str| self.controller_dir(proc_cgroup, c);
        let (cpuacct, cpu, memory, blkio, pids) = (
            dir("cpuacct"),
            dir("cpu"),
            dir("memory"),
            dir("blkio"),
            dir("pids"),
        );
        let text = |d: &Option<PathBuf>, name: &str| d.as_ref().and_then(|d| read(&d.join(name)));
        let num = |d: &Option<PathBuf>, name: &str| {
            text(d, name).and_then(|t| t.trim().parse::<u64>().ok())
        };
        let limit =
            |d: &Option<PathBuf>, name: &str| text(d, name).and_then(|t| cadvisor::limit_value(&t));
        let id = summary::proc_cgroup_path(proc_cgroup, if v1 { "cpu" } else { "" })
            .unwrap_or_default()
            .to_string();

        let cpu_usage = if v1 {
            num(&cpuacct, "cpuacct.usage").map(|usage| {
                let (user, system) =
                    cadvisor::cpuacct_stat(&text(&cpuacct, "cpuacct.stat").unwrap_or_default());
                cadvisor::Cpu {
                    usage,
                    user,
                    system,
                }
            })
        } else {
            text(&cpu, "cpu.stat").and_then(|t| {
                let (user, system) = cadvisor::cpu_stat_v2_user_system(&t);
                Some(cadvisor::Cpu {
                    usage: summary::cpu_stat_v2_nanos(&t)?,
                    user,
                    system,
                })
            })
        };

        let (usage_file, events_file) = if v1 {
            ("memory.usage_in_bytes", "memory.oom_control")
        } else {
            ("memory.current", "memory.events")
        };
        let memory_stats = num(&memory, usage_file).map(|usage| {
            let mut m = cadvisor::Memory::parse(
                usage,
                &text(&memory, "memory.stat").unwrap_or_default(),
                &text(&memory, events_file).unwrap_or_default(),
                v1,
            );
            if v1 {
                m.max_usage = num(&memory, "memory.max_usage_in_bytes").unwrap_or(0);
                m.failcnt = num(&memory, "memory.failcnt").unwrap_or(0);
            } else {
                m.max_usage = num(&memory, "memory.peak").unwrap_or(0);
                m.swap = num(&memory, "memory.swap.current").unwrap_or(0);
            }
            m
        });

        let spec = if v1 {
            cadvisor::Spec {
                cpu_period: num(&cpu, "cpu.cfs_period_us"),
                cpu_quota: limit(&cpu, "cpu.cfs_quota_us").filter(|q| *q != u64::MAX),
                cpu_shares: num(&cpu, "cpu.shares"),
                memory_limit: limit(&memory, "memory.limit_in_bytes"),
                memory_swap_limit: limit(&memory, "memory.memsw.limit_in_bytes"),
                memory_reservation: limit(&memory, "memory.soft_limit_in_bytes"),
            }
        } else {
            let cpu_max = text(&cpu, "cpu.max").and_then(|t| cadvisor::cpu_max_v2(&t));
            cadvisor::Spec {
                cpu_period: cpu_max.map(|(_, p)| p),
                cpu_quota: cpu_max.and_then(|(q, _)| q),
                cpu_shares: num(&cpu, "cpu.weight").map(cadvisor::weight_to_shares),
                memory_limit: limit(&memory, "memory.max"),
                memory_swap_limit: limit(&memory, "memory.swap.max"),
                memory_reservation: limit(&memory, "memory.low"),
            }
        };

        let mut io = if v1 {
            cadvisor::blkio_v1(
                &text(&blkio, "blkio.throttle.io_service_bytes_recursive").unwrap_or_default(),
                &text(&blkio, "blkio.throttle.io_serviced_recursive").unwrap_or_default(),
            )
        } else {
            cadvisor::io_stat_v2(&text(&blkio, "io.stat").unwrap_or_default())
        };
        for d in &mut io {
            d.device = device_name(d.major, d.minor);
        }

        let procs_dir = if v1 { &cpuacct } else { &cpu };
        let processes =
            pid.and_then(|pid| text(procs_dir, "cgroup.procs").map(|procs| (pid, procs)));
        let processes = processes.map(|(pid, procs)| {
            let pids_in: Vec<u64> = procs
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            let (file_descriptors, sockets) = open_files(&pids_in);
            let threads = num(&pids, "pids.current").unwrap_or_else(|| {
                text(procs_dir, "tasks").map_or(0, |t| {
                    u64::try_from(t.lines().filter(|l| !l.trim().is_empty()).count())
                        .unwrap_or(u64::MAX)
                })
            });
            cadvisor::Processes {
                processes: u64::try_from(pids_in.len()).unwrap_or(u64::MAX),
                threads,
                threads_max: limit(&pids, "pids.max")
                    .filter(|m| *m != u64::MAX)
                    .unwrap_or(0),
                file_descriptors,
                sockets,
                max_open_files: read(&PathBuf::from(format!("/proc/{pid}/limits")))
                    .and_then(|t| cadvisor::max_open_files_soft(&t)),
            }
        });

        cadvisor::Sample {
            identity: cadvisor::Identity {
                id,
                ..cadvisor::Identity::default()
            },
            cpu: cpu_usage,
            memory: memory_stats,
            spec,
            io,
            processes,
            ..cadvisor::Sample::default()
        }
    }
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// The most processes of one container whose file descriptors are counted.
const MAX_PROCESSES_READ: usize = 1024;
/// The most file descriptors examined for one container.
const MAX_FDS_READ: u64 = 1 << 20;

/// Open file descriptors of `pids` and how many of them are sockets, from
/// /proc/<pid>/fd; at most [`MAX_PROCESSES_READ`] processes and
/// [`MAX_FDS_READ`] descriptors are examined.
fn open_files(pids: &[u64]) -> (u64, u64) {
    let (mut fds, mut sockets) = (0u64, 0u64);
    for pid in pids.iter().take(MAX_PROCESSES_READ) {
        let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for e in entries.flatten() {
            if fds >= MAX_FDS_READ {
                return (fds, sockets);
            }
            fds += 1;
            if std::fs::read_link(e.path())
                .is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
            {
                sockets += 1;
            }
        }
    }
    (fds, sockets)
}

/// The process id in a runtime's verbose status `info` (its JSON `pid`).
fn info_pid(info: &HashMap<String, String>) -> Option<u64> {
    let info: serde_json::Value = serde_json::from_str(info.get("info")?).ok()?;
    info.get("pid")?.as_u64().filter(|p| *p > 0)
}

/// The block device holding `path` (`/dev/vda`), from its device number and
/// `/sys/dev/block`; `major:minor` when the device has no entry there
/// (overlay and tmpfs mounts), empty when `path` cannot be read.
fn mount_device(path: &str) -> String {
    let Ok(md) = std::fs::metadata(path) else {
        return String::new();
    };
    device_name(
        u64::from(rustix::fs::major(md.dev())),
        u64::from(rustix::fs::minor(md.dev())),
    )
}

/// A block device's path from its numbers, through
/// `/sys/dev/block/<major>:<minor>/uevent`; `major:minor` when unknown.
fn device_name(major: u64, minor: u64) -> String {
    read(&PathBuf::from(format!(
        "/sys/dev/block/{major}:{minor}/uevent"
    )))
    .and_then(|u| cadvisor::uevent_device(&u))
    .unwrap_or_else(|| format!("{major}:{minor}"))
}

/// Where the runtime keeps images and the containers' writable layers
/// relative to the node's filesystem (that of the agent's root directory),
/// as the kubelet's eviction manager tells them apart
/// (`HasDedicatedImageFs`, `HasDedicatedContainerFs`; KEP-4191's split
/// image filesystem).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FsLayout {
    /// Images and writable layers on the node's filesystem.
    #[default]
    Shared,
    /// Images and writable layers together on a filesystem of their own
    /// (the image filesystem).
    DedicatedImageFs,
    /// Images on the image filesystem, writable layers on another one (the
    /// node's, in the layout KEP-4191 describes).
    Split,
}

impl FsLayout {
    /// The layout of the devices (`st_dev`) of the node's filesystem
    /// (`node`), the image filesystem (`image`) and the containers'
    /// filesystem the runtime names, if any (`container`): split when the
    /// containers' device is not the images', else dedicated when the
    /// images' device is not the node's.
    #[must_use]
    pub fn of(node: u64, image: u64, container: Option<u64>) -> Self {
        if container.is_some_and(|c| c != image) {
            Self::Split
        } else if image != node {
            Self::DedicatedImageFs
        } else {
            Self::Shared
        }
    }
}

/// True when `container` (a runtime's container filesystem) is not on the
/// filesystem of `image`: another mount point on another device, as the
/// kubelet's cAdvisor stats provider confirms a split before it reports one.
fn split_from(image: &cri::FilesystemUsage, container: &cri::FilesystemUsage) -> bool {
    let (Some(i), Some(c)) = (mountpoint(image), mountpoint(container)) else {
        return false;
    };
    i != c && device(i).is_some_and(|d| device(c).is_some_and(|e| e != d))
}

/// The mount point a runtime names for a filesystem's usage.
fn mountpoint(usage: &cri::FilesystemUsage) -> Option<&str> {
    usage.fs_id.as_ref().map(|id| id.mountpoint.as_str())
}

/// The device (`st_dev`) of the filesystem holding `path`.
fn device(path: impl AsRef<Path>) -> Option<u64> {
    std::fs::metadata(path).ok().map(|m| m.dev())
}

/// Size, free space and inodes of the filesystem holding `path` (`statvfs`),
/// with `used` the filesystem's own usage.
fn fs_info(path: &Path, time: Time) -> Option<FsStats> {
    let st = rustix::fs::statvfs(path).ok()?;
    let unit = st.f_frsize;
    Some(FsStats {
        time,
        available_bytes: Some(st.f_bavail.saturating_mul(unit)),
        capacity_bytes: Some(st.f_blocks.saturating_mul(unit)),
        used_bytes: Some(st.f_blocks.saturating_sub(st.f_bfree).saturating_mul(unit)),
        inodes_free: Some(st.f_ffree),
        inodes: Some(st.f_files),
        inodes_used: Some(st.f_files.saturating_sub(st.f_ffree)),
    })
}

/// Usage of directory `path` on the filesystem described by `fs`.
async fn dir_stats(path: PathBuf, fs: Option<FsStats>, time: Time) -> Option<FsStats> {
    let usage = tokio::task::spawn_blocking(move || crate::volume::tree::usage(&path))
        .await
        .ok()?
        .ok()?;
    Some(usage_on(fs, time, Some(usage.bytes), Some(usage.inodes)))
}

/// What an object uses (`used`, `inodes`, at `time`) on the filesystem `fs`:
/// the filesystem's size and free space with the object's usage.
fn usage_on(fs: Option<FsStats>, time: Time, used: Option<u64>, inodes: Option<u64>) -> FsStats {
    FsStats {
        time,
        used_bytes: used,
        inodes_used: inodes,
        ..fs.map(|f| FsStats {
            used_bytes: None,
            inodes_used: None,
            ..f
        })
        .unwrap_or_default()
    }
}

/// The usage of a container's writable layer `w` as the runtime reports
/// it, on the layer's filesystem (read once per mount point into
/// `layer_fs`).
fn writable_layer_usage(
    w: &cri::FilesystemUsage,
    layer_fs: &mut HashMap<String, Option<FsStats>>,
    now: Time,
) -> FsStats {
    let fs = match &w.fs_id {
        Some(id) => layer_fs
            .entry(id.mountpoint.clone())
            .or_insert_with(|| fs_info(Path::new(&id.mountpoint), now))
            .to_owned(),
        None => None,
    };
    usage_on(
        fs,
        Time(w.timestamp),
        w.used_bytes.as_ref().map(|v| v.value),
        w.inodes_used.as_ref().map(|v| v.value),
    )
}

/// The pods' networks as the runtime reports them in their sandbox stats,
/// by sandbox id (those with a default interface).
fn sandbox_networks(
    sandbox_stats: &[cri::PodSandboxStats],
) -> HashMap<String, summary::NetworkStats> {
    sandbox_stats
        .iter()
        .filter_map(|s| {
            let id = s.attributes.as_ref()?.id.clone();
            let net = summary::network_from_cri(s.linux.as_ref()?.network.as_ref()?)?;
            Some((id, net))
        })
        .collect()
}

/// A CSI volume's entry of a pod's stats, from its driver's report `u`
/// (sampled at `now`): named as the pod names it, with its claim in
/// namespace `ns` (the kubelet's `PVCRef`).
fn csi_volume_stats(u: crate::volume::csi::Usage, ns: &str, now: Time) -> VolumeStats {
    let name = if u.data.pod_volume_name.is_empty() {
        u.data.spec_vol_id.clone()
    } else {
        u.data.pod_volume_name.clone()
    };
    let pvc_ref = (!u.data.claim_name.is_empty()).then(|| summary::PvcReference {
        name: u.data.claim_name.clone(),
        namespace: ns.to_string(),
    });
    VolumeStats {
        fs: FsStats {
            time: now,
            available_bytes: u.available_bytes,
            capacity_bytes: u.capacity_bytes,
            used_bytes: u.used_bytes,
            inodes_free: u.inodes_free,
            inodes: u.inodes,
            inodes_used: u.inodes_used,
        },
        name,
        pvc_ref,
    }
}

/// Gathers the node's statistics; one per agent, shared by the node API.
pub struct Provider {
    node_name: String,
    runtime: Runtime,
    root_dir: PathBuf,
    pod_logs_dir: PathBuf,
    cgroups: Cgroups,
    rates: Mutex<CpuRates>,
    /// The registered CSI drivers, whose volumes' usage is asked of them
    /// (`None`: CSI volumes are not reported).
    csi: Option<crate::plugin_manager::Drivers>,
    /// The pod cgroups, when this agent makes them.
    pod_cgroups: Option<crate::cgroups::CgroupManager>,
    /// The emptyDir volumes' usage, measured in the background.
    volume_usage: Arc<volume_usage::UsageCache>,
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("node_name", &self.node_name)
            .field("root_dir", &self.root_dir)
            .finish_non_exhaustive()
    }
}

/// The most cgroups [`Cgroups::process_count`] reads for one pod (its pod
/// cgroup and its containers' are a handful).
const MAX_CGROUPS_WALKED: usize = 256;

/// The previous-sample key of the node's own cpu.
const NODE_KEY: &str = "/";
/// The previous-sample key of the `pods` system container's cpu (no
/// container id has a slash).
const PODS_KEY: &str = "/pods";

impl Provider {
    /// True when the node's memory working set already counts the huge
    /// page pools as used: on cgroup v2 it is read from /proc/meminfo
    /// (MemTotal − MemFree, and the pools are never free); the v1 root
    /// cgroup leaves them out.
    #[must_use]
    pub fn node_memory_counts_hugepages(&self) -> bool {
        self.cgroups.v2
    }

    /// A provider for node `node_name` whose agent keeps pods under
    /// `root_dir` and logs under `pod_logs_dir`, reading cgroups under
    /// `/sys/fs/cgroup`.
    #[must_use]
    pub fn new(
        node_name: &str,
        runtime: Runtime,
        root_dir: PathBuf,
        pod_logs_dir: PathBuf,
    ) -> Self {
        Self {
            node_name: node_name.to_string(),
            runtime,
            root_dir,
            pod_logs_dir,
            cgroups: Cgroups::detect(PathBuf::from("/sys/fs/cgroup")),
            rates: Mutex::new(CpuRates::default()),
            csi: None,
            pod_cgroups: None,
            volume_usage: volume_usage::UsageCache::new(Duration::from_secs(60)),
        }
    }

    /// The provider measuring each emptyDir's usage every `period`
    /// (`volumeStatsAggPeriod`; 1 m unless set).
    #[must_use]
    pub fn with_volume_stats_agg_period(mut self, period: Duration) -> Self {
        self.volume_usage = volume_usage::UsageCache::new(period);
        self
    }

    fn rate(&self, id: &str, time: i64, usage: u64) -> Option<u64> {
        self.rates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .update(id, time, usage)
    }

    /// Refreshes the cpu rates every [`SAMPLE_INTERVAL`], forever.
    pub async fn sample(&self) {
        let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = self.summary(true).await {
                debug!(error = %e, "sample resource usage");
            }
        }
    }

    /// The stats summary (`/stats/summary`); `only_cpu_and_memory` leaves out
    /// filesystems, volumes, network and process limits
    /// (`GetCPUAndMemoryStats`, `?only_cpu_and_memory=true`).
    ///
    /// # Errors
    /// [`Error::Cri`] when the runtime cannot list sandboxes, containers or
    /// container stats.
    pub async fn summary(&self, only_cpu_and_memory: bool) -> Result<Summary, Error> {
        let (sandboxes, containers, stats) = tokio::try_join!(
            self.runtime.list_pod_sandboxes(HashMap::new()),
            self.runtime.list_containers(HashMap::new()),
            self.runtime.list_container_stats(),
        )?;
        // The pods' own cpu and memory (their pod cgroups, as the runtime
        // reads them) and networks.
        let sandbox_stats = match self.runtime.list_pod_sandbox_stats().await {
            Ok(s) => s,
            Err(e) => {
                debug!(error = %e, "pod sandbox stats");
                Vec::new()
            }
        };
        let now = Time::now();
        let sandboxes: HashMap<String, cri::PodSandbox> = summary::live_sandboxes(sandboxes)
            .into_iter()
            .map(|s| (s.id.clone(), s))
            .collect();
        let running = cri::ContainerState::ContainerRunning as i32;
        let containers: HashMap<&str, &cri::Container> = containers
            .iter()
            .filter(|c| c.state == running)
            .map(|c| (c.id.as_str(), c))
            .collect();
        let root_fs = if only_cpu_and_memory {
            None
        } else {
            fs_info(&self.root_dir, now)
        };
        let pods = self
            .pods_of_containers(&stats, &containers, &sandboxes, now, only_cpu_and_memory)
            .await;
        let networks = sandbox_networks(&sandbox_stats);
        let mut pod_usage = self.sandbox_cpu_memory(&sandbox_stats);
        let mut out: Vec<PodStats> = Vec::with_capacity(pods.len());
        for (sandbox_id, mut p) in pods {
            p.containers.sort_by(|a, b| a.name.cmp(&b.name));
            let pod_cgroup = self
                .pod_cgroups
                .as_ref()
                .and_then(|m| m.find_pod(&p.pod_ref.uid));
            let usage = pod_usage.remove(&sandbox_id).unwrap_or_default();
            self.set_pod_cpu_memory(&mut p, usage, pod_cgroup.as_deref());
            if !only_cpu_and_memory {
                p.process_stats = pod_cgroup
                    .as_deref()
                    .and_then(|d| self.cgroups.process_count(d))
                    .map(|n| summary::ProcessStats {
                        process_count: Some(n),
                    });
                p.network = match networks.get(&sandbox_id) {
                    Some(n) => Some(n.clone()),
                    None => self.sandbox_network(&sandbox_id, now).await,
                };
                self.set_pod_volumes(&mut p, root_fs, now).await;
            }
            out.push(p);
        }
        out.sort_by(|a, b| {
            (&a.pod_ref.namespace, &a.pod_ref.name).cmp(&(&b.pod_ref.namespace, &b.pod_ref.name))
        });
        let node = self.node(now, root_fs, only_cpu_and_memory).await;
        self.rates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .prune(now.0);
        Ok(Summary { node, pods: out })
    }

    /// The pods of the running `containers` of live `sandboxes` that the
    /// runtime has `stats` of, by sandbox id: each pod's reference and
    /// start (its sandbox's) with its containers' stats, in the order of
    /// `stats`. Unless `only_cpu_and_memory`, each container also has its
    /// writable layer (`rootfs`, on the layer's filesystem) and its log
    /// directory (`logs`, on the log directory's filesystem).
    async fn pods_of_containers(
        &self,
        stats: &[cri::ContainerStats],
        containers: &HashMap<&str, &cri::Container>,
        sandboxes: &HashMap<String, cri::PodSandbox>,
        now: Time,
        only_cpu_and_memory: bool,
    ) -> HashMap<String, PodStats> {
        let logs_fs = if only_cpu_and_memory {
            None
        } else {
            fs_info(&self.pod_logs_dir, now)
        };
        let mut layer_fs: HashMap<String, Option<FsStats>> = HashMap::new();
        let mut pods: HashMap<String, PodStats> = HashMap::new();
        for st in stats {
            let Some(attrs) = &st.attributes else {
                continue;
            };
            let Some(container) = containers.get(attrs.id.as_str()) else {
                continue;
            };
            let Some(sandbox) = sandboxes.get(&container.pod_sandbox_id) else {
                continue;
            };
            let meta = sandbox.metadata.clone().unwrap_or_default();
            let name = container
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default();
            let mut cs = self.container_cpu_memory(&attrs.id, st, now).await;
            cs.name.clone_from(&name);
            cs.start_time = Time(container.created_at);
            if !only_cpu_and_memory {
                if let Some(w) = &st.writable_layer {
                    cs.rootfs = Some(writable_layer_usage(w, &mut layer_fs, now));
                }
                let dir = crate::paths::pod_log_dir(
                    &self.pod_logs_dir,
                    &meta.namespace,
                    &meta.name,
                    &meta.uid,
                )
                .join(&name);
                cs.logs = dir_stats(dir, logs_fs, now).await;
            }
            pods.entry(sandbox.id.clone())
                .or_insert_with(|| PodStats {
                    pod_ref: PodReference {
                        name: meta.name.clone(),
                        namespace: meta.namespace.clone(),
                        uid: meta.uid.clone(),
                    },
                    start_time: Time(sandbox.created_at),
                    ..PodStats::default()
                })
                .containers
                .push(cs);
        }
        pods
    }

    /// The pods' cpu and memory as the runtime reports them from their pod
    /// cgroups (CRI `ListPodSandboxStats`), by sandbox id; each is `None`
    /// where the runtime's numbers are unusable. The cpu rate is kept as
    /// `pod/<sandbox id>`'s.
    fn sandbox_cpu_memory(
        &self,
        sandbox_stats: &[cri::PodSandboxStats],
    ) -> HashMap<String, (Option<summary::CpuStats>, Option<MemoryStats>)> {
        let mut pod_usage = HashMap::new();
        for st in sandbox_stats {
            let (Some(attrs), Some(linux)) = (&st.attributes, &st.linux) else {
                continue;
            };
            let cpu = linux
                .cpu
                .as_ref()
                .filter(|c| summary::cri_cpu_usable(Some(c)))
                .map(|c| {
                    let usage = c.usage_core_nano_seconds.as_ref().map_or(0, |v| v.value);
                    let rate = self.rate(&format!("pod/{}", attrs.id), c.timestamp, usage);
                    summary::cpu_from_cri(c, rate)
                });
            let memory = linux
                .memory
                .as_ref()
                .filter(|m| summary::cri_memory_usable(Some(m)))
                .map(summary::memory_from_cri);
            pod_usage.insert(attrs.id.clone(), (cpu, memory));
        }
        pod_usage
    }

    /// Pod `p`'s cpu and memory: `usage`, its pod cgroup's as the runtime
    /// reports it, where there is one, else the sum of its containers'; with
    /// the pressure of its cgroup at `pod_cgroup`.
    fn set_pod_cpu_memory(
        &self,
        p: &mut PodStats,
        usage: (Option<summary::CpuStats>, Option<MemoryStats>),
        pod_cgroup: Option<&Path>,
    ) {
        // The pod cgroup's usage where the runtime reports it (it counts
        // the sandbox and the pod's overhead, as the kubelet's pod stats
        // do), else the containers' sum.
        let (sum_cpu, sum_memory) = summary::pod_cpu_memory(&p.containers);
        let (cpu, memory) = usage;
        (p.cpu, p.memory) = (cpu.or(sum_cpu), memory.or(sum_memory));
        // The pod cgroup's pressure, zero where the cgroup has none, as
        // the kubelet reports it from cAdvisor's pod cgroup.
        if let Some(dir) = pod_cgroup {
            let pressure = |r| Some(self.cgroups.pressure(dir, r).unwrap_or_default());
            if let Some(c) = p.cpu.as_mut() {
                c.psi = pressure("cpu");
            }
            if let Some(m) = p.memory.as_mut() {
                m.psi = pressure("memory");
            }
        }
    }

    /// Pod `p`'s volumes and ephemeral storage: its emptyDirs (on `root_fs`,
    /// the filesystem of the agent's root directory, unless memory-backed),
    /// its ephemeral storage (writable layers, logs, emptyDirs and its
    /// `etc-hosts` on `root_fs`), then its CSI volumes as their drivers
    /// report them.
    async fn set_pod_volumes(&self, p: &mut PodStats, root_fs: Option<FsStats>, now: Time) {
        let pod_dir = crate::volume::pod_dir(&self.root_dir, &p.pod_ref.uid);
        p.volume = self.empty_dirs(&pod_dir, root_fs, now).await;
        let hosts = dir_stats(pod_dir.join("etc-hosts"), None, now).await;
        if let Some(root) = &root_fs {
            p.ephemeral_storage = Some(summary::ephemeral_storage(
                root,
                &p.containers,
                &p.volume,
                hosts.as_ref(),
            ));
        }
        // Persistent volumes come after: they are not the pod's
        // ephemeral storage.
        if let Some(drivers) = &self.csi {
            let csi = crate::volume::csi::usage(drivers, &self.root_dir, &p.pod_ref.uid);
            p.volume.extend(
                csi.await
                    .into_iter()
                    .map(|u| csi_volume_stats(u, &p.pod_ref.namespace, now)),
            );
        }
    }

    /// A container's cpu and memory: the runtime's numbers, else its cgroup's.
    async fn container_cpu_memory(
        &self,
        id: &str,
        st: &cri::ContainerStats,
        now: Time,
    ) -> ContainerStats {
        let mut cs = ContainerStats::default();
        let cpu_ok = summary::cri_cpu_usable(st.cpu.as_ref());
        let mem_ok = summary::cri_memory_usable(st.memory.as_ref());
        let cgroup = if cpu_ok && mem_ok {
            None
        } else {
            self.container_cgroup(id).await
        };
        if let Some(c) = st.cpu.as_ref().filter(|_| cpu_ok) {
            let usage = c.usage_core_nano_seconds.as_ref().map_or(0, |v| v.value);
            let rate = self.rate(id, c.timestamp, usage);
            cs.cpu = Some(summary::cpu_from_cri(c, rate));
        } else if let Some((cpu_path, _)) = &cgroup
            && let Some(usage) = self.cgroups.cpu_usage(cpu_path)
        {
            cs.cpu = Some(summary::CpuStats {
                time: now,
                usage_nano_cores: self.rate(id, now.0, usage),
                usage_core_nano_seconds: Some(usage),
                psi: None,
            });
        }
        if let Some(m) = st.memory.as_ref().filter(|_| mem_ok) {
            cs.memory = Some(summary::memory_from_cri(m));
        } else if let Some((_, mem_path)) = &cgroup
            && let Some((mem, limit)) = self.cgroups.memory(mem_path)
        {
            cs.memory = Some(mem.stats(now, limit));
        }
        cs
    }

    /// The cpu and memory cgroup paths of a container's process.
    async fn container_cgroup(&self, id: &str) -> Option<(String, String)> {
        let pid = self.container_pid(id).await?;
        let text = read(&PathBuf::from(format!("/proc/{pid}/cgroup")))?;
        if self.cgroups.v2 {
            let p = summary::proc_cgroup_path(&text, "")?.to_string();
            Some((p.clone(), p))
        } else {
            Some((
                summary::proc_cgroup_path(&text, "cpuacct")?.to_string(),
                summary::proc_cgroup_path(&text, "memory")?.to_string(),
            ))
        }
    }

    /// A sandbox's network namespace counters, read through its process
    /// (`/proc/<pid>/net/dev`), when the runtime's sandbox stats have none.
    async fn sandbox_network(&self, id: &str, now: Time) -> Option<summary::NetworkStats> {
        let pid = self.sandbox_pid(id).await?;
        summary::network_from_net_dev(&read(&PathBuf::from(format!("/proc/{pid}/net/dev")))?, now)
    }

    /// The `/metrics/cadvisor` exposition ([`cadvisor::render`]): the node's
    /// root cgroup with its block devices ([`Provider::root_sample`]), every
    /// running container of a live sandbox, and each such sandbox as
    /// container `POD` with its network, read from their cgroups and /proc;
    /// `container_scrape_error 1` alone when the runtime cannot list them.
    pub async fn cadvisor_metrics(&self) -> Result<String, std::fmt::Error> {
        let now = Time::now();
        let listed = tokio::try_join!(
            self.runtime.list_pod_sandboxes(HashMap::new()),
            self.runtime.list_containers(HashMap::new()),
            self.runtime.list_container_stats(),
        );
        let (sandboxes, containers, stats) = match listed {
            Ok(l) => l,
            Err(e) => {
                debug!(error = %e, "list containers for cadvisor metrics");
                return cadvisor::render(&[], now.0 / 1_000_000_000, true);
            }
        };
        let sandboxes: HashMap<String, cri::PodSandbox> = summary::live_sandboxes(sandboxes)
            .into_iter()
            .map(|s| (s.id.clone(), s))
            .collect();
        let layers: HashMap<&str, &cri::FilesystemUsage> = stats
            .iter()
            .filter_map(|s| {
                Some((
                    s.attributes.as_ref()?.id.as_str(),
                    s.writable_layer.as_ref()?,
                ))
            })
            .collect();
        let running = cri::ContainerState::ContainerRunning as i32;
        let mut samples = Vec::new();
        let mut pods_seen: Vec<&str> = Vec::new();
        for c in containers.iter().filter(|c| c.state == running) {
            let Some(sandbox) = sandboxes.get(&c.pod_sandbox_id) else {
                continue;
            };
            let meta = sandbox.metadata.clone().unwrap_or_default();
            let identity = cadvisor::Identity {
                container: c
                    .metadata
                    .as_ref()
                    .map(|m| m.name.clone())
                    .unwrap_or_default(),
                id: String::new(),
                // The image as the pod names it, where the runtime kept it.
                image: c
                    .image
                    .as_ref()
                    .map(|i| {
                        if i.user_specified_image.is_empty() {
                            i.image.clone()
                        } else {
                            i.user_specified_image.clone()
                        }
                    })
                    .unwrap_or_default(),
                name: c.id.clone(),
                namespace: meta.namespace.clone(),
                pod: meta.name.clone(),
            };
            let pid = self.container_pid(&c.id).await;
            let fs_usage = layers.get(c.id.as_str()).and_then(|w| {
                let used = w.used_bytes.as_ref()?.value;
                Some((mount_device(&w.fs_id.as_ref()?.mountpoint), used))
            });
            let mut sample = self.cgroup_sample(pid, identity, c.created_at, false).await;
            sample.fs_usage = fs_usage;
            samples.push(sample);
            if !pods_seen.contains(&c.pod_sandbox_id.as_str()) {
                pods_seen.push(&c.pod_sandbox_id);
            }
        }
        for id in pods_seen {
            let Some(sandbox) = sandboxes.get(id) else {
                continue;
            };
            let meta = sandbox.metadata.clone().unwrap_or_default();
            let identity = cadvisor::Identity {
                container: cadvisor::POD_INFRA_CONTAINER.to_string(),
                id: String::new(),
                image: String::new(),
                name: sandbox.id.clone(),
                namespace: meta.namespace.clone(),
                pod: meta.name.clone(),
            };
            let pid = self.sandbox_pid(&sandbox.id).await;
            samples.push(
                self.cgroup_sample(pid, identity, sandbox.created_at, true)
                    .await,
            );
        }
        samples.insert(0, self.root_sample().await);
        cadvisor::render(&samples, now.0 / 1_000_000_000, false)
    }

    /// The node's root cgroup as cAdvisor's root container (`id="/"`): its
    /// cpu, memory and limits, started at boot, with the node's mounted
    /// block devices (size, use, inodes and `/proc/diskstats` counters).
    async fn root_sample(&self) -> cadvisor::Sample {
        let cgroups = self.cgroups.clone();
        tokio::task::spawn_blocking(move || {
            // Every hierarchy's own root (v2: the unified one).
            let mut s = cgroups.cadvisor_sample("0:cpu,cpuacct,memory,blkio,pids:/\n0::/\n", None);
            s.start_time = read(Path::new("/proc/stat"))
                .and_then(|t| summary::boot_time(&t))
                .unwrap_or(0);
            let stats = read(Path::new("/proc/diskstats"))
                .map(|t| cadvisor::diskstats(&t))
                .unwrap_or_default();
            let mounts = read(Path::new("/proc/self/mountinfo"))
                .map(|t| cadvisor::mounted_devices(&t))
                .unwrap_or_default();
            s.filesystems = mounts
                .into_iter()
                .filter_map(|(major, minor, point)| {
                    let fs = fs_info(Path::new(&point), Time::default())?;
                    Some(cadvisor::Filesystem {
                        device: device_name(major, minor),
                        limit: fs.capacity_bytes.unwrap_or(0),
                        usage: fs.used_bytes.unwrap_or(0),
                        inodes: fs.inodes.unwrap_or(0),
                        inodes_free: fs.inodes_free.unwrap_or(0),
                        stats: stats
                            .iter()
                            .find(|d| (d.major, d.minor) == (major, minor))
                            .cloned(),
                    })
                })
                .collect();
            s
        })
        .await
        .unwrap_or_default()
    }

    /// One container's (or sandbox's) [`cadvisor::Sample`] from its process
    /// `pid`'s cgroups; with `network`, also its network namespace's
    /// interfaces. Only the identity and start time when `pid` is unknown
    /// or gone.
    async fn cgroup_sample(
        &self,
        pid: Option<u64>,
        identity: cadvisor::Identity,
        created_at: i64,
        network: bool,
    ) -> cadvisor::Sample {
        let mut sample = cadvisor::Sample {
            identity,
            start_time: created_at / 1_000_000_000,
            ..cadvisor::Sample::default()
        };
        let Some(pid) = pid else {
            return sample;
        };
        let cgroups = self.cgroups.clone();
        let read = tokio::task::spawn_blocking(move || {
            let proc_cgroup = read(&PathBuf::from(format!("/proc/{pid}/cgroup")))?;
            let mut s = cgroups.cadvisor_sample(&proc_cgroup, Some(pid));
            if network {
                s.network = read(&PathBuf::from(format!("/proc/{pid}/net/dev")))
                    .map(|t| kernel_files::net_dev(&t))
                    .unwrap_or_default();
            }
            Some(s)
        })
        .await
        .ok()
        .flatten();
        if let Some(r) = read {
            sample = cadvisor::Sample {
                identity: cadvisor::Identity {
                    id: r.identity.id,
                    ..sample.identity
                },
                start_time: sample.start_time,
                ..r
            };
        }
        sample
    }

    /// The pid of a container's process, from the runtime's verbose status.
    async fn container_pid(&self, id: &str) -> Option<u64> {
        let resp = match self.runtime.container_status_verbose(id).await {
            Ok(r) => r,
            Err(e) => {
                debug!(container = id, error = %e, "container status for its pid");
                return None;
            }
        };
        info_pid(&resp.info)
    }

    /// The pid of a sandbox's process, from the runtime's verbose status.
    async fn sandbox_pid(&self, id: &str) -> Option<u64> {
        let resp = match self.runtime.pod_sandbox_status_verbose(id).await {
            Ok(r) => r,
            Err(e) => {
                debug!(sandbox = id, error = %e, "sandbox status for its pid");
                return None;
            }
        };
        info_pid(&resp.info)
    }

    /// This provider, also reporting the pods' CSI volumes through the
    /// drivers registered in `drivers` (`NodeGetVolumeStats`).
    #[must_use]
    pub fn with_csi(mut self, drivers: crate::plugin_manager::Drivers) -> Self {
        self.csi = Some(drivers);
        self
    }

    /// Reports the pods' cgroups of `pod_cgroups`: the cgroup above them
    /// (`kubepods`) as the `pods` system container, and each pod's pressure
    /// and processes.
    #[must_use]
    pub fn with_pod_cgroups(mut self, pod_cgroups: crate::cgroups::CgroupManager) -> Self {
        self.pod_cgroups = Some(pod_cgroups);
        self
    }

    /// The pod's emptyDir volumes (`<pod dir>/volumes/kubernetes.io~empty-dir/*`),
    /// each with its last background measurement (none before the first).
    async fn empty_dirs(&self, pod_dir: &Path, fs: Option<FsStats>, now: Time) -> Vec<VolumeStats> {
        let dir = pod_dir
            .join(crate::volume::VOLUMES_DIR)
            .join(crate::volume::empty_dir::PLUGIN_DIR);
        let Ok(rd) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut names: Vec<String> = rd
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let path = dir.join(&name);
            // A memory-backed emptyDir is its own tmpfs: its size and free space.
            let fs = fs_info(&path, now).or(fs);
            if let Some(usage) = self.volume_usage.get(&path) {
                out.push(VolumeStats {
                    fs: usage_on(fs, now, Some(usage.bytes), Some(usage.inodes)),
                    name,
                    pvc_ref: None,
                });
            }
        }
        out
    }

    async fn node(
        &self,
        now: Time,
        root_fs: Option<FsStats>,
        only_cpu_and_memory: bool,
    ) -> NodeStats {
        let start = read(Path::new("/proc/stat"))
            .and_then(|s| summary::boot_time(&s))
            .map_or(Time(0), |s| Time(s.saturating_mul(1_000_000_000)));
        let meminfo = read(Path::new("/proc/meminfo")).unwrap_or_default();
        let capacity = summary::meminfo_bytes(&meminfo, "MemTotal");
        let pressure = |resource: &str| {
            read(&Path::new("/proc/pressure").join(resource)).and_then(|t| summary::psi(&t))
        };
        let cpu = self.cgroups.cpu_usage("/").map(|usage| summary::CpuStats {
            time: now,
            usage_nano_cores: self.rate(NODE_KEY, now.0, usage),
            usage_core_nano_seconds: Some(usage),
            psi: pressure("cpu"),
        });
        let memory = if self.cgroups.v2 {
            // The v2 root has no memory.current: the machine's own counters.
            match (capacity, summary::meminfo_bytes(&meminfo, "MemFree")) {
                (Some(total), Some(free)) => {
                    let usage = total.saturating_sub(free);
                    let inactive = summary::meminfo_bytes(&meminfo, "Inactive(file)").unwrap_or(0);
                    let ws = summary::working_set(usage, inactive);
                    Some(MemoryStats {
                        time: now,
                        available_bytes: Some(total.saturating_sub(ws)),
                        usage_bytes: Some(usage),
                        working_set_bytes: Some(ws),
                        ..MemoryStats::default()
                    })
                }
                _ => None,
            }
        } else {
            self.cgroups
                .memory("/")
                .map(|(m, _)| m.stats(now, capacity))
        }
        .map(|m| MemoryStats {
            psi: pressure("memory"),
            ..m
        });
        let mut node = NodeStats {
            node_name: self.node_name.clone(),
            start_time: start,
            cpu,
            memory,
            system_containers: self.system_containers(now),
            ..NodeStats::default()
        };
        if only_cpu_and_memory {
            return node;
        }
        node.io = pressure("io").map(|psi| summary::IoStats {
            time: now,
            psi: Some(psi),
        });
        node.network =
            read(Path::new("/proc/net/dev")).map(|t| summary::node_network_from_net_dev(&t, now));
        node.fs = root_fs;
        let (image_fs, container_fs) = self.runtime_fs(now).await;
        node.runtime = Some(RuntimeStats {
            image_fs,
            container_fs,
        });
        let limit = |f: &str| read(Path::new(f)).and_then(|s| s.trim().parse::<i64>().ok());
        node.rlimit = Some(RlimitStats {
            time: now,
            maxpid: match (
                limit("/proc/sys/kernel/pid_max"),
                limit("/proc/sys/kernel/threads-max"),
            ) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            },
            curproc: read(Path::new("/proc/loadavg")).and_then(|s| summary::loadavg_tasks(&s)),
        });
        node
    }

    /// The node's own cgroups as containers (the kubelet's
    /// `GetSystemContainersStats`): `pods`, the cgroup above every pod's,
    /// when this agent makes pod cgroups. Its start is the cgroup
    /// directory's change time (set when the cgroup was made); its cpu rate
    /// is kept as a container's. Its pressure is the cgroup's pressure files
    /// or, where the cgroup has none (cgroup v1), zero: the kubelet reads
    /// system containers through cAdvisor, which reports a zero pressure
    /// for such a cgroup.
    fn system_containers(&self, now: Time) -> Vec<ContainerStats> {
        let Some(rel) = self.pod_cgroups.as_ref().map(|m| m.pods_root()) else {
            return Vec::new();
        };
        let Ok(meta) = std::fs::metadata(self.cgroups.cpu_dir(rel)) else {
            return Vec::new();
        };
        let start = Time(meta.ctime().saturating_mul(1_000_000_000));
        let pressure = |resource| Some(self.cgroups.pressure(rel, resource).unwrap_or_default());
        let rel = rel.to_string_lossy();
        let cpu = self.cgroups.cpu_usage(&rel).map(|usage| summary::CpuStats {
            time: now,
            usage_nano_cores: self.rate(PODS_KEY, now.0, usage),
            usage_core_nano_seconds: Some(usage),
            psi: pressure("cpu"),
        });
        let memory = self.cgroups.memory(&rel).map(|(m, limit)| MemoryStats {
            psi: pressure("memory"),
            ..m.stats(now, limit)
        });
        vec![ContainerStats {
            name: "pods".to_string(),
            start_time: start,
            cpu,
            memory,
            io: Some(summary::IoStats {
                time: now,
                psi: pressure("io"),
            }),
            ..ContainerStats::default()
        }]
    }

    /// The image filesystem and the containers' filesystem: the runtime's
    /// usage, the filesystem's size. The containers' filesystem is the image
    /// filesystem unless the runtime keeps writable layers on a filesystem
    /// of their own (the first of `ImageFsInfo`'s `container_filesystems`
    /// on another device), as the kubelet's `ImageFsStats` reports a split
    /// image filesystem.
    async fn runtime_fs(&self, now: Time) -> (Option<FsStats>, Option<FsStats>) {
        let info = match self.runtime.image_fs_info().await {
            Ok(i) => i,
            Err(e) => {
                debug!(error = %e, "image filesystem info");
                return (None, None);
            }
        };
        let stats = |usage: &cri::FilesystemUsage| {
            let fs = usage
                .fs_id
                .as_ref()
                .and_then(|id| fs_info(Path::new(&id.mountpoint), now));
            let time = if usage.timestamp > 0 {
                Time(usage.timestamp)
            } else {
                now
            };
            usage_on(
                fs,
                time,
                usage.used_bytes.as_ref().map(|v| v.value),
                usage.inodes_used.as_ref().map(|v| v.value),
            )
        };
        let Some(image) = info.image_filesystems.first() else {
            return (None, None);
        };
        let image_fs = stats(image);
        let container_fs = match info.container_filesystems.first() {
            Some(c) if split_from(image, c) => stats(c),
            _ => image_fs,
        };
        (Some(image_fs), Some(container_fs))
    }

    /// Where the runtime keeps images and writable layers relative to the
    /// filesystem of the agent's root directory ([`FsLayout::of`] over the
    /// devices of the root directory and of the mount points `ImageFsInfo`
    /// names); None while the runtime does not answer, as the kubelet's
    /// eviction manager retries `HasDedicatedImageFs` then. A runtime that
    /// names no image filesystem, or one this agent cannot see (an agent in
    /// a container without the runtime's directories), keeps everything on
    /// the node's filesystem, with a warning for the second: that is all
    /// the stats can show.
    pub async fn fs_layout(&self) -> Option<FsLayout> {
        let info = match self.runtime.image_fs_info().await {
            Ok(i) => i,
            Err(e) => {
                debug!(error = %e, "image filesystem info");
                return None;
            }
        };
        let Some(image_mount) = info.image_filesystems.first().and_then(mountpoint) else {
            return Some(FsLayout::Shared);
        };
        let (Some(image), Some(node)) = (device(image_mount), device(&self.root_dir)) else {
            tracing::warn!(
                image_filesystem = image_mount,
                root_dir = %self.root_dir.display(),
                "the runtime's image filesystem or the root directory cannot be read: images and writable layers are taken to be on the node's filesystem"
            );
            return Some(FsLayout::Shared);
        };
        let container = info
            .container_filesystems
            .first()
            .and_then(mountpoint)
            .and_then(device);
        Some(FsLayout::of(node, image, container))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_is_where_the_images_and_the_writable_layers_are() {
        assert_eq!(FsLayout::of(1, 1, None), FsLayout::Shared);
        assert_eq!(FsLayout::of(1, 1, Some(1)), FsLayout::Shared);
        assert_eq!(FsLayout::of(1, 2, None), FsLayout::DedicatedImageFs);
        assert_eq!(FsLayout::of(1, 2, Some(2)), FsLayout::DedicatedImageFs);
        assert_eq!(FsLayout::of(1, 2, Some(1)), FsLayout::Split);
        assert_eq!(FsLayout::of(1, 1, Some(3)), FsLayout::Split);
    }

    fn on(path: &Path, used: u64) -> cri::FilesystemUsage {
        cri::FilesystemUsage {
            timestamp: 7,
            fs_id: Some(cri::FilesystemIdentifier {
                mountpoint: path.display().to_string(),
            }),
            used_bytes: Some(cri::UInt64Value { value: used }),
            inodes_used: Some(cri::UInt64Value { value: used / 10 }),
        }
    }

    /// The image and container filesystems a runtime names are told apart by
    /// their devices, and the summary's `containerFs` is the containers' own
    /// only when it is on another device (a real runtime served on a
    /// socket; the node's filesystem is a temporary directory's, the other
    /// device one of the host's pseudo filesystems).
    #[tokio::test]
    async fn a_split_image_filesystem_is_found_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let node = dir.path().join("root");
        std::fs::create_dir(&node).unwrap();
        let other = ["/dev/shm", "/dev", "/proc"]
            .into_iter()
            .map(Path::new)
            .find(|p| device(p).is_some_and(|d| Some(d) != device(&node)))
            .expect("a filesystem on another device");
        let (fake, socket) = crate::cri::fake::FakeRuntime::serve(dir.path()).unwrap();
        let runtime = crate::cri::Runtime::connect_lazy(
            &format!("unix://{}", socket.display()),
            Duration::from_secs(5),
        )
        .unwrap();
        let provider = Provider::new("n1", runtime, node.clone(), dir.path().join("logs"));
        let now = Time(9);
        let set = |images: Vec<cri::FilesystemUsage>, containers: Vec<cri::FilesystemUsage>| {
            fake.set_image_fs_info(cri::ImageFsInfoResponse {
                image_filesystems: images,
                container_filesystems: containers,
            });
        };
        let capacity = |p: &Path| fs_info(p, now).and_then(|f| f.capacity_bytes);

        // No filesystem named: nothing apart, no runtime stats.
        assert_eq!(provider.fs_layout().await, Some(FsLayout::Shared));
        assert_eq!(provider.runtime_fs(now).await, (None, None));

        // Everything on the node's filesystem.
        set(vec![on(&node, 100)], vec![on(&node, 40)]);
        assert_eq!(provider.fs_layout().await, Some(FsLayout::Shared));
        let (image, container) = provider.runtime_fs(now).await;
        assert_eq!(image, container, "one filesystem: containerFs is imageFs");
        let image = image.unwrap();
        assert_eq!((image.used_bytes, image.inodes_used), (Some(100), Some(10)));
        assert_eq!(image.capacity_bytes, capacity(&node));

        // Images and layers on a filesystem of their own.
        set(vec![on(other, 100)], vec![on(other, 40)]);
        assert_eq!(provider.fs_layout().await, Some(FsLayout::DedicatedImageFs));
        let (image, container) = provider.runtime_fs(now).await;
        assert_eq!(image, container);
        assert_eq!(image.unwrap().capacity_bytes, capacity(other));

        // Split: the layers on the node's filesystem.
        set(vec![on(other, 100)], vec![on(&node, 40)]);
        assert_eq!(provider.fs_layout().await, Some(FsLayout::Split));
        let (image, container) = provider.runtime_fs(now).await;
        let (image, container) = (image.unwrap(), container.unwrap());
        assert_eq!(
            (image.used_bytes, image.capacity_bytes),
            (Some(100), capacity(other))
        );
        assert_eq!(
            (
                container.used_bytes,
                container.capacity_bytes,
                container.time
            ),
            (Some(40), capacity(&node), Time(7))
        );

        // Another path on the images' device is not a split.
        let beside = node.join("layers");
        std::fs::create_dir(&beside).unwrap();
        set(vec![on(&node, 100)], vec![on(&beside, 40)]);
        assert_eq!(provider.fs_layout().await, Some(FsLayout::Shared));
        let (image, container) = provider.runtime_fs(now).await;
        assert_eq!(image, container);

        // A mount point this agent cannot see is taken as the node's.
        set(vec![on(Path::new("/no/such/dir"), 1)], vec![on(other, 1)]);
        assert_eq!(provider.fs_layout().await, Some(FsLayout::Shared));

        // No answer: not known yet.
        drop(fake);
        let gone = crate::cri::Runtime::connect_lazy(
            &format!("unix://{}", dir.path().join("none.sock").display()),
            Duration::from_secs(1),
        )
        .unwrap();
        let provider = Provider::new("n1", gone, node, dir.path().join("logs"));
        assert_eq!(provider.fs_layout().await, None);
    }
}
