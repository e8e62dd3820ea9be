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

pub mod summary;

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
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
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
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

/// Bytes allocated and inodes used under `path` (the kubelet's `du` and
/// `find -xdev` of a directory), without following symbolic links or
/// crossing into other filesystems.
fn disk_usage(path: &Path) -> Option<(u64, u64)> {
    let top = std::fs::symlink_metadata(path).ok()?;
    let dev = top.dev();
    let mut bytes = 0u64;
    let mut inodes = 0u64;
    let mut stack = vec![path.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if md.dev() != dev {
            continue;
        }
        bytes = bytes.saturating_add(md.blocks().saturating_mul(512));
        inodes += 1;
        if md.is_dir()
            && let Ok(rd) = std::fs::read_dir(&p)
        {
            stack.extend(rd.flatten().map(|e| e.path()));
        }
    }
    Some((bytes, inodes))
}

/// Usage of directory `path` on the filesystem described by `fs`.
async fn dir_stats(path: PathBuf, fs: Option<FsStats>, time: Time) -> Option<FsStats> {
    let (used, inodes) = tokio::task::spawn_blocking(move || disk_usage(&path))
        .await
        .ok()
        .flatten()?;
    Some(usage_on(fs, time, Some(used), Some(inodes)))
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
        }
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
        let logs_fs = if only_cpu_and_memory {
            None
        } else {
            fs_info(&self.pod_logs_dir, now)
        };
        let mut layer_fs: HashMap<String, Option<FsStats>> = HashMap::new();

        let mut pods: HashMap<String, PodStats> = HashMap::new();
        for st in &stats {
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
                    let fs = match &w.fs_id {
                        Some(id) => layer_fs
                            .entry(id.mountpoint.clone())
                            .or_insert_with(|| fs_info(Path::new(&id.mountpoint), now))
                            .to_owned(),
                        None => None,
                    };
                    cs.rootfs = Some(usage_on(
                        fs,
                        Time(w.timestamp),
                        w.used_bytes.as_ref().map(|v| v.value),
                        w.inodes_used.as_ref().map(|v| v.value),
                    ));
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
        let networks: HashMap<String, summary::NetworkStats> = sandbox_stats
            .iter()
            .filter_map(|s| {
                let id = s.attributes.as_ref()?.id.clone();
                let net = summary::network_from_cri(s.linux.as_ref()?.network.as_ref()?)?;
                Some((id, net))
            })
            .collect();
        let mut pod_usage: HashMap<String, (Option<summary::CpuStats>, Option<MemoryStats>)> =
            HashMap::new();
        for st in &sandbox_stats {
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
        let mut out: Vec<PodStats> = Vec::with_capacity(pods.len());
        for (sandbox_id, mut p) in pods {
            p.containers.sort_by(|a, b| a.name.cmp(&b.name));
            // The pod cgroup's usage where the runtime reports it (it counts
            // the sandbox and the pod's overhead, as the kubelet's pod stats
            // do), else the containers' sum.
            let (sum_cpu, sum_memory) = summary::pod_cpu_memory(&p.containers);
            let (cpu, memory) = pod_usage.remove(&sandbox_id).unwrap_or_default();
            (p.cpu, p.memory) = (cpu.or(sum_cpu), memory.or(sum_memory));
            // The pod cgroup's pressure, zero where the cgroup has none, as
            // the kubelet reports it from cAdvisor's pod cgroup.
            let pod_cgroup = self
                .pod_cgroups
                .as_ref()
                .and_then(|m| m.find_pod(&p.pod_ref.uid));
            if let Some(dir) = &pod_cgroup {
                let pressure = |r| Some(self.cgroups.pressure(dir, r).unwrap_or_default());
                if let Some(c) = p.cpu.as_mut() {
                    c.psi = pressure("cpu");
                }
                if let Some(m) = p.memory.as_mut() {
                    m.psi = pressure("memory");
                }
            }
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
        let resp = match self.runtime.container_status_verbose(id).await {
            Ok(r) => r,
            Err(e) => {
                debug!(container = id, error = %e, "container status for its cgroup");
                return None;
            }
        };
        let info: serde_json::Value = serde_json::from_str(resp.info.get("info")?).ok()?;
        let pid = info.get("pid")?.as_u64().filter(|p| *p > 0)?;
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
        let resp = match self.runtime.pod_sandbox_status_verbose(id).await {
            Ok(r) => r,
            Err(e) => {
                debug!(sandbox = id, error = %e, "sandbox status for its network");
                return None;
            }
        };
        let info: serde_json::Value = serde_json::from_str(resp.info.get("info")?).ok()?;
        let pid = info.get("pid")?.as_u64().filter(|p| *p > 0)?;
        summary::network_from_net_dev(&read(&PathBuf::from(format!("/proc/{pid}/net/dev")))?, now)
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

    /// The pod's emptyDir volumes (`<pod dir>/volumes/kubernetes.io~empty-dir/*`).
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
            if let Some(st) = dir_stats(path, fs, now).await {
                out.push(VolumeStats {
                    fs: st,
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
        let image_fs = self.image_fs(now).await;
        node.runtime = Some(RuntimeStats {
            image_fs,
            container_fs: image_fs,
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

    /// The image filesystem: the runtime's usage, the filesystem's size.
    async fn image_fs(&self, now: Time) -> Option<FsStats> {
        let info = match self.runtime.image_fs_info().await {
            Ok(i) => i,
            Err(e) => {
                debug!(error = %e, "image filesystem info");
                return None;
            }
        };
        let usage = info.image_filesystems.first()?;
        let fs = usage
            .fs_id
            .as_ref()
            .and_then(|id| fs_info(Path::new(&id.mountpoint), now));
        let time = if usage.timestamp > 0 {
            Time(usage.timestamp)
        } else {
            now
        };
        Some(usage_on(
            fs,
            time,
            usage.used_bytes.as_ref().map(|v| v.value),
            usage.inodes_used.as_ref().map(|v| v.value),
        ))
    }
}
