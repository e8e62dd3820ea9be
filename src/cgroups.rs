//! Pod and QoS cgroups, as the kubelet's container manager with
//! `cgroupsPerQOS` and the `cgroupfs` driver, on cgroup v1 and v2 (pkg/kubelet/cm:
//! `qos_container_manager_linux.go`, `pod_container_manager_linux.go`,
//! `helpers_linux.go`'s `ResourceConfigForPod`, `cgroup_v2_manager_linux.go`).
//!
//! The hierarchy is `<cgroupRoot>/kubepods` with `burstable` and
//! `besteffort` below it, made in every cgroup v1 hierarchy of the mount, or
//! in the one cgroup v2 hierarchy, with the controllers the kubelet uses
//! (`cpu`, `cpuset`, `memory`, `hugetlb`, `pids`, those the root offers)
//! enabled in `cgroup.subtree_control` down to each new cgroup. On v2 the
//! shares are written as `cpu.weight` (the kubelet's linear
//! `getCPUWeight`), the quota as `cpu.max`, the memory limit as
//! `memory.max`.
//! Each pod gets `pod<uid>`: under `kubepods` when Guaranteed, else under its
//! QoS class's cgroup. Its path is the CRI `cgroup_parent` of the pod's
//! sandbox, so the runtime puts the sandbox and every container below it.
//! The pod's cgroup holds the pod's limits: `cpu.shares` from the sum of its
//! cpu requests, a CFS quota when every container has a cpu limit, and a
//! memory limit when every container has a memory limit. `besteffort` has
//! the smallest share (2), `burstable` the shares of its pods' requests, and
//! `kubepods` the node's allocatable cpu and memory when
//! `enforceNodeAllocatable` has `pods`. With `podPidsLimit` above 0
//! ([`CgroupManager::with_pod_pids_limit`]) each pod's cgroup holds at most
//! that many processes (`pids.max`), as the kubelet's pod container manager.
//! A pod's cgroup is removed once nothing of it runs.
//!
//! With the `systemd` driver ([`CgroupManager::using_systemd`]) the same
//! cgroups are systemd slices named as the kubelet's `CgroupName.ToSystemd`
//! (`kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice`,
//! the UID's dashes as `_`): each is started as a transient unit and given
//! its limits as unit properties, as libcontainer's systemd manager does for
//! the kubelet, and the same limits are then written to the cgroup files;
//! a pod's slice is stopped when it goes. Its expanded path is the CRI
//! `cgroup_parent`, from which containerd names the containers' scopes.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use tracing::debug;

pub use crate::pod_core::limits::{CPU_PERIOD_US, Limits, MIN_SHARES};
use crate::pod_core::qos::QosClass;

/// Errors of the cgroup manager.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A pod UID that is not made of letters, digits and dashes: it would
    /// not be a single directory name.
    #[error("pod UID {0:?} cannot name a cgroup")]
    BadUid(String),
    /// systemd refused a slice or its properties (the `systemd` driver).
    #[error(transparent)]
    Systemd(#[from] crate::systemd::Error),
    /// `podPidsLimit` above 0 where no `pids` controller is.
    #[error("podPidsLimit {0}: the pids cgroup controller is not available")]
    NoPidsController(u64),
    /// An existing cgroup to enforce a reservation on is missing from a
    /// hierarchy, in the kubelet's words (`Validate`).
    #[error("cgroup {name:?} has some missing paths: {}", missing.join(", "))]
    MissingPaths {
        /// The cgroup's name, its path's parts.
        name: Vec<String>,
        /// Where it is missing.
        missing: Vec<String>,
    },
    /// The cgroup filesystem refused a change.
    #[error("cgroup {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The cgroup version a manager writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// Hierarchies per controller (`cpu.shares`, `memory.limit_in_bytes`).
    V1,
    /// One unified hierarchy (`cpu.weight`, `cpu.max`, `memory.max`).
    V2,
}

/// The controllers the kubelet enables for pod cgroups on cgroup v2
/// (`getSupportedUnifiedControllers`), of those the root offers.
pub const V2_CONTROLLERS: [&str; 5] = ["cpu", "cpuset", "memory", "hugetlb", "pids"];

/// The largest `cpu.weight` (cgroup v2).
pub const MAX_WEIGHT: u64 = 10_000;

/// `cpu.shares` as cgroup v2's `cpu.weight`, as the kubelet's linear
/// `getCPUWeight`: 2 shares → 1, 262144 and more → 10000; 0 stays 0.
#[must_use]
pub fn weight_from_shares(shares: u64) -> u64 {
    match shares {
        0 => 0,
        s if s >= 262_144 => MAX_WEIGHT,
        s => 1 + (s.max(MIN_SHARES) - MIN_SHARES) * 9999 / 262_142,
    }
}

/// `cpu.weight` read back as shares, as the kubelet's `cpuWeightToCPUShares`
/// (0 stays 0).
#[must_use]
pub fn shares_from_weight(weight: u64) -> u64 {
    match weight {
        0 => 0,
        w => (w.min(MAX_WEIGHT) - 1) * 262_142 / 9999 + MIN_SHARES,
    }
}

/// The cgroup in `<cgroupRoot>`, beside the QoS hierarchy, where the Helm
/// chart's companion runtime keeps its shims (its `ShimCgroup`, a leaf as
/// cgroup v2 wants); a node reset removes it with the root.
pub const SHIMS_CGROUP: &str = "shims";

/// What a reservation (`systemReserved`, `kubeReserved`) writes to its
/// cgroup, as the kubelet's `getCgroupConfig`: only what is reserved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reserved {
    /// `cpu.shares` from the reserved cpu (the kubelet's `MilliCPUToShares`).
    pub cpu_shares: Option<u64>,
    /// The memory limit, bytes.
    pub memory: Option<i64>,
    /// `pids.max`, from the reserved `pid`.
    pub pids: Option<i64>,
    /// Huge page limits by page size, bytes.
    pub huge_pages: crate::pod_core::limits::HugePageLimits,
}

/// Where huge page limits are written.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Hugetlb {
    /// The hierarchy's root directory.
    dir: PathBuf,
    /// A cgroup v2 hierarchy (`hugetlb.<size>.max`, else
    /// `hugetlb.<size>.limit_in_bytes`).
    v2: bool,
    /// The v2 hierarchy of a hybrid host, whose cgroups the manager makes
    /// only for the limits (runc puts the containers there too).
    hybrid: bool,
}

/// The pod and QoS cgroups of one node.
#[derive(Clone, Debug)]
pub struct CgroupManager {
    /// The cgroup version of the hierarchies.
    version: Version,
    /// The hierarchies' directories (one per cgroup v1 hierarchy mounted
    /// under the mount point, `cpu,cpuacct` once).
    hierarchies: Vec<PathBuf>,
    /// The directory of `cpu` (where shares and quotas are written).
    cpu: Option<PathBuf>,
    /// The directory of `memory`.
    memory: Option<PathBuf>,
    /// The directory of `cpuset` (whose new cgroups need cpus and mems).
    cpuset: Option<PathBuf>,
    /// The directory of `pids` (the v2 root when it offers the controller).
    pids: Option<PathBuf>,
    /// `pids.max` of each pod's cgroup (`podPidsLimit` above 0), or none.
    pod_pids_limit: Option<u64>,
    /// The CFS period of every quota written, microseconds
    /// (`cpuCFSQuotaPeriod`; [`CPU_PERIOD_US`] unless
    /// [`CgroupManager::with_cpu_period`] says otherwise).
    cpu_period_us: i64,
    /// The hierarchy holding the `hugetlb` controller, if any.
    hugetlb: Option<Hugetlb>,
    /// The node's huge page pools: (page size, pool size), bytes
    /// ([`CgroupManager::with_huge_pages`]).
    huge_pages: Vec<(u64, u64)>,
    /// `<cgroupRoot>/kubepods` as a relative path (`kubepods`;
    /// `kubepods.slice` with the `systemd` driver).
    root: PathBuf,
    /// The cgroup name of `root`: `<cgroupRoot>`'s parts, then `kubepods`.
    root_parts: Vec<String>,
    /// systemd, with the `systemd` driver: the cgroups are its slices.
    systemd: Option<crate::systemd::Systemd>,
    /// The cgroup v2 hierarchy of a hybrid host (`unified`), where runc
    /// makes the pods' paths too: nothing is set there, but what is made
    /// there goes with the pod.
    unified: Option<PathBuf>,
}

impl CgroupManager {
    /// The manager of the cgroup v1 hierarchies mounted under `mount`
    /// (`/sys/fs/cgroup`), with the pods' cgroups under `<cgroup_root>/<name>`
    /// (`/` and `kubepods` as the kubelet's). None when `mount` has no cgroup
    /// v1 `cpu` and `memory` hierarchies (cgroup v2 is not built here).
    #[must_use]
    pub fn v1(mount: &Path, cgroup_root: &str, name: &str) -> Option<Self> {
        let mut seen = BTreeSet::new();
        let mut hierarchies = Vec::new();
        let entries = std::fs::read_dir(mount).ok()?;
        let mut names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "unified")
            .collect();
        names.sort();
        for n in names {
            let dir = mount.join(&n);
            // A hierarchy has tasks; `cpu` and `cpuacct` often link to one.
            if !dir.join("cgroup.procs").is_file() {
                continue;
            }
            let Ok(real) = std::fs::canonicalize(&dir) else {
                continue;
            };
            if seen.insert(real) {
                hierarchies.push(dir);
            }
        }
        let find = |file: &str| hierarchies.iter().find(|h| h.join(file).is_file()).cloned();
        let (cpu, memory) = (find("cpu.shares"), find("memory.limit_in_bytes"));
        if cpu.is_none() || memory.is_none() {
            return None;
        }
        let cpuset = find("cpuset.cpus");
        // The `pids` and `hugetlb` hierarchies' roots have no file of the
        // controller: they are found by their names (the controller's, or a
        // list of controllers holding it).
        let named = |controller: &str| {
            hierarchies
                .iter()
                .find(|h| {
                    h.file_name()
                        .is_some_and(|n| n.to_string_lossy().split(',').any(|c| c == controller))
                })
                .cloned()
        };
        let pids = named("pids");
        let root_parts = cgroupfs_parts(cgroup_root, name);
        let unified = Some(mount.join("unified")).filter(|u| u.join("cgroup.procs").is_file());
        // A hybrid host may bind `hugetlb` to its v2 hierarchy instead.
        let hugetlb = named("hugetlb")
            .map(|dir| Hugetlb {
                dir,
                v2: false,
                hybrid: false,
            })
            .or_else(|| {
                let u = unified.as_ref()?;
                let offered = controllers(&u.join("cgroup.controllers")).ok()?;
                offered.contains("hugetlb").then(|| Hugetlb {
                    dir: u.clone(),
                    v2: true,
                    hybrid: true,
                })
            });
        Some(Self {
            version: Version::V1,
            hierarchies,
            cpu,
            memory,
            cpuset,
            pids,
            pod_pids_limit: None,
            cpu_period_us: CPU_PERIOD_US,
            hugetlb,
            huge_pages: Vec::new(),
            root: root_parts.iter().collect(),
            root_parts,
            systemd: None,
            unified,
        })
    }

    /// The manager of the cgroup v2 hierarchy mounted at `mount`
    /// (`/sys/fs/cgroup`), with the pods' cgroups under `<cgroup_root>/<name>`.
    /// None when `mount` is no cgroup v2 root offering the `cpu` and `memory`
    /// controllers.
    #[must_use]
    pub fn v2(mount: &Path, cgroup_root: &str, name: &str) -> Option<Self> {
        let offered = controllers(&mount.join("cgroup.controllers")).ok()?;
        if !(offered.contains("cpu") && offered.contains("memory")) {
            return None;
        }
        Some(Self {
            version: Version::V2,
            hierarchies: vec![mount.to_path_buf()],
            cpu: Some(mount.to_path_buf()),
            memory: Some(mount.to_path_buf()),
            cpuset: None,
            pids: offered.contains("pids").then(|| mount.to_path_buf()),
            pod_pids_limit: None,
            cpu_period_us: CPU_PERIOD_US,
            hugetlb: offered.contains("hugetlb").then(|| Hugetlb {
                dir: mount.to_path_buf(),
                v2: true,
                hybrid: false,
            }),
            huge_pages: Vec::new(),
            root: cgroupfs_parts(cgroup_root, name).iter().collect(),
            root_parts: cgroupfs_parts(cgroup_root, name),
            systemd: None,
            unified: None,
        })
    }

    /// The manager of the host's cgroups at `mount`: cgroup v2 when `mount`
    /// is a unified hierarchy's root (it has `cgroup.controllers`), else the
    /// cgroup v1 hierarchies under it ([`CgroupManager::v1`],
    /// [`CgroupManager::v2`]).
    #[must_use]
    pub fn detect(mount: &Path, cgroup_root: &str, name: &str) -> Option<Self> {
        if mount.join("cgroup.controllers").is_file() {
            Self::v2(mount, cgroup_root, name)
        } else {
            Self::v1(mount, cgroup_root, name)
        }
    }

    /// This manager with the `systemd` driver: its cgroups are `systemd`'s
    /// slices. `cgroup_root` is read as a cgroupfs path, as the kubelet
    /// reads it whatever the driver (`ParseCgroupfsToCgroupName`: `/` gives
    /// `kubepods.slice`, `/a/b` gives `a.slice/a-b.slice/a-b-kubepods.slice`),
    /// and `name` is the QoS hierarchy's part (`kubepods`).
    #[must_use]
    pub fn using_systemd(
        mut self,
        systemd: crate::systemd::Systemd,
        cgroup_root: &str,
        name: &str,
    ) -> Self {
        let parts = cgroupfs_parts(cgroup_root, name);
        self.systemd = Some(systemd);
        self.root = self.dir_of(&parts);
        self.root_parts = parts;
        self
    }

    /// This manager with each pod's cgroup holding at most `limit`
    /// processes (`podPidsLimit`; 0 or below: no limit), as the kubelet's
    /// pod container manager sets `PidsLimit`.
    ///
    /// # Errors
    /// [`Error::NoPidsController`]: a limit above 0 where the hierarchy has
    /// no `pids` controller (the kubelet will not start without it either).
    pub fn with_pod_pids_limit(mut self, limit: i64) -> Result<Self, Error> {
        let Ok(limit @ 1..) = u64::try_from(limit) else {
            self.pod_pids_limit = None;
            return Ok(self);
        };
        if self.pids.is_none() {
            return Err(Error::NoPidsController(limit));
        }
        self.pod_pids_limit = Some(limit);
        Ok(self)
    }

    /// This manager with quotas over a CFS period of `period_us`
    /// microseconds (`cpuCFSQuotaPeriod`, validated from 1 ms to 1 s), as
    /// the kubelet's pod container manager writes `CPUPeriod`.
    #[must_use]
    pub fn with_cpu_period(mut self, period_us: i64) -> Self {
        self.cpu_period_us = period_us;
        self
    }

    /// This manager with the node's huge page pools, (page size, pool size)
    /// in bytes: every page size gets a limit in each cgroup the manager
    /// makes, as the kubelet's cgroup manager sets one for each of
    /// libcontainer's `HugePageSizes`.
    #[must_use]
    pub fn with_huge_pages(mut self, pools: Vec<(u64, u64)>) -> Self {
        self.huge_pages = pools;
        self
    }

    /// Whether huge page limits are written: the node has a `hugetlb`
    /// controller (in a cgroup v1 hierarchy of its own, in the v2
    /// hierarchy, or in a hybrid host's v2 hierarchy). Without one the
    /// kubelet sets no huge page limit and says nothing
    /// (`maybeSetHugetlb`); the agent says so.
    #[must_use]
    pub fn limits_huge_pages(&self) -> bool {
        self.hugetlb.is_some()
    }

    /// Writes huge page limits to `dir`'s cgroup, as the kubelet's
    /// `maybeSetHugetlb`: for each of the node's page sizes, its amount in
    /// `limits`, else `others` (bytes). On a hybrid host the cgroup is made
    /// in the v2 hierarchy first, with `hugetlb` enabled down to it. Nothing
    /// without a `hugetlb` controller.
    fn set_hugetlb(
        &self,
        dir: &Path,
        limits: &crate::pod_core::limits::HugePageLimits,
        others: u64,
    ) -> Result<(), Error> {
        let Some(h) = &self.hugetlb else {
            return Ok(());
        };
        if h.hybrid {
            make_v2_path(&h.dir, dir)?;
        }
        self.write_hugetlb(h, dir, limits, others)
    }

    /// Writes the huge page limits of [`CgroupManager::set_hugetlb`] to
    /// `dir`'s cgroup in hierarchy `h`, which exists.
    fn write_hugetlb(
        &self,
        h: &Hugetlb,
        dir: &Path,
        limits: &crate::pod_core::limits::HugePageLimits,
        others: u64,
    ) -> Result<(), Error> {
        let suffix = if h.v2 { "max" } else { "limit_in_bytes" };
        for (size, _) in &self.huge_pages {
            let Some(unit) = crate::pod_core::limits::huge_page_unit(*size) else {
                continue;
            };
            let limit = limits.get(size).copied().unwrap_or(others);
            let file = h.dir.join(dir).join(format!("hugetlb.{unit}.{suffix}"));
            write(&file, &limit.to_string())?;
        }
        Ok(())
    }

    /// Writes the pod pids limit to pod cgroup `dir`: systemd's `TasksMax`
    /// on its slice first (with the `systemd` driver), then `pids.max`.
    fn set_pod_pids(&self, dir: &Path) -> Result<(), Error> {
        let (Some(limit), Some(pids)) = (self.pod_pids_limit, &self.pids) else {
            return Ok(());
        };
        if let (Some(systemd), Some(unit)) = (&self.systemd, dir.file_name()) {
            use crate::systemd::Property;
            systemd.set_properties(
                &unit.to_string_lossy(),
                &[
                    Property::Bool("TasksAccounting", true),
                    Property::U64("TasksMax", limit),
                ],
            )?;
        }
        write(&pids.join(dir).join("pids.max"), &limit.to_string())
    }

    /// The directory, relative to the hierarchies' roots, of the cgroup
    /// named by `parts` (the kubelet's `CgroupName`): the parts as path
    /// components, or as nested slices with the `systemd` driver.
    fn dir_of<S: AsRef<str>>(&self, parts: &[S]) -> PathBuf {
        if self.systemd.is_some() {
            let parts: Vec<&str> = parts.iter().map(AsRef::as_ref).collect();
            crate::systemd::slice_path(&parts)
        } else {
            parts.iter().map(AsRef::as_ref).collect()
        }
    }

    /// The cgroup name of QoS class `qos`'s cgroup.
    fn qos_parts(&self, qos: QosClass) -> Vec<String> {
        let mut parts = self.root_parts.clone();
        match qos {
            QosClass::Guaranteed => {}
            QosClass::Burstable => parts.push("burstable".into()),
            QosClass::BestEffort => parts.push("besteffort".into()),
        }
        parts
    }

    /// The name of pod `uid`'s own cgroup directory of class `qos`
    /// (`pod<uid>`; `kubepods-burstable-pod<uid_>.slice` with systemd).
    fn pod_name(&self, qos: QosClass, uid: &str) -> String {
        let mut parts = self.qos_parts(qos);
        parts.push(format!("pod{uid}"));
        self.dir_of(&parts)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// The pod UID a cgroup directory of class `qos` is named for
    /// ([`CgroupManager::pod_name`] read back); None for any other name,
    /// and for one that is no UID's or names it in another way (a pod
    /// directory this agent would not have made).
    fn uid_of(&self, qos: QosClass, name: &str) -> Option<String> {
        let uid = if self.systemd.is_none() {
            name.strip_prefix("pod")?.to_string()
        } else {
            let marker = self.pod_name(qos, "\u{0}");
            let (prefix, suffix) = marker.split_once('\u{0}')?;
            name.strip_prefix(prefix)?
                .strip_suffix(suffix)?
                .replace('_', "-")
        };
        (self.pod_dir(qos, &uid).is_ok() && self.pod_name(qos, &uid) == name).then_some(uid)
    }

    /// The cgroup version this manager writes.
    #[must_use]
    pub fn version(&self) -> Version {
        self.version
    }

    /// Limits read from a cgroup (`now`, [`CgroupManager::limits`]) as the
    /// allocation `wanted` would read: on cgroup v2 the shares read back
    /// from `cpu.weight` lose precision (1024 shares are weight 39, read as
    /// 998), so shares that are `wanted`'s after that round trip are taken
    /// as `wanted`'s, as the kubelet's `CPUSharesEqualAfterV2RoundTrip`
    /// keeps the allocated cpu request. Unchanged on cgroup v1.
    #[must_use]
    pub fn as_allocated(&self, now: Limits, wanted: &Limits) -> Limits {
        let mut out = now;
        let round_trip = shares_from_weight(weight_from_shares(wanted.cpu_shares));
        if self.version == Version::V2 && now.cpu_shares == round_trip {
            out.cpu_shares = wanted.cpu_shares;
        }
        // systemd keeps a quota in whole 10 ms a second and writes that
        // when it realizes the slice again (a `daemon-reload`).
        let period = self.cpu_period_us;
        let per_sec = crate::systemd::cpu_quota_per_sec(wanted.cpu_quota, period);
        let systemds =
            i64::try_from(per_sec.saturating_mul(period.unsigned_abs()) / 1_000_000).ok();
        if self.systemd.is_some() && wanted.cpu_quota.is_some() && now.cpu_quota == systemds {
            out.cpu_quota = wanted.cpu_quota;
        }
        out
    }

    /// The cgroup above every pod's (`<cgroupRoot>/kubepods`), relative to
    /// the hierarchies' roots.
    #[must_use]
    pub fn pods_root(&self) -> &Path {
        &self.root
    }

    /// The cgroup of QoS class `qos` relative to the hierarchies' roots.
    fn qos_dir(&self, qos: QosClass) -> PathBuf {
        self.dir_of(&self.qos_parts(qos))
    }

    /// The cgroup of pod `uid` of class `qos`, relative to the hierarchies'
    /// roots (`kubepods/burstable/pod<uid>`).
    ///
    /// # Errors
    /// [`Error::BadUid`] for a UID that is not one directory name.
    pub fn pod_dir(&self, qos: QosClass, uid: &str) -> Result<PathBuf, Error> {
        if uid.is_empty() || !uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return Err(Error::BadUid(uid.to_string()));
        }
        Ok(self.qos_dir(qos).join(self.pod_name(qos, uid)))
    }

    /// The CRI `cgroup_parent` of pod `uid` (`/kubepods/burstable/pod<uid>`).
    ///
    /// # Errors
    /// As [`CgroupManager::pod_dir`].
    pub fn cgroup_parent(&self, qos: QosClass, uid: &str) -> Result<String, Error> {
        Ok(format!("/{}", self.pod_dir(qos, uid)?.display()))
    }

    /// Makes `dir` in every hierarchy (a new cpuset cgroup gets its parent's
    /// cpus and memory nodes, as the kernel leaves them empty); on cgroup v2,
    /// each level from the root down enables its offered controllers of
    /// [`V2_CONTROLLERS`] for the level below (as runc's `CreateCgroupPath`).
    /// With systemd, each slice of the path is started first (one that
    /// exists is left), as libcontainer's `Apply` before it makes the
    /// directories systemd did not.
    fn make(&self, dir: &Path) -> Result<(), Error> {
        if let Some(systemd) = &self.systemd {
            let mut parent = "-.slice".to_string();
            for part in dir.components() {
                let unit = part.as_os_str().to_string_lossy().into_owned();
                let props =
                    crate::systemd::slice_properties(&unit, &parent, self.version == Version::V2);
                systemd.start_slice(&unit, &props)?;
                parent = unit;
            }
        }
        if self.version == Version::V2 {
            return match self.hierarchies.first() {
                Some(root) => make_v2_path(root, dir),
                None => Ok(()),
            };
        }
        for h in &self.hierarchies {
            let path = h.join(dir);
            if path.is_dir() {
                continue;
            }
            std::fs::create_dir_all(&path).map_err(io_err(&path))?;
        }
        if let Some(cpuset) = &self.cpuset {
            let mut at = cpuset.clone();
            for part in dir.components() {
                let parent = at.clone();
                at.push(part);
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let mine = at.join(file);
                    let empty = std::fs::read_to_string(&mine)
                        .map(|s| s.trim().is_empty())
                        .unwrap_or(false);
                    if empty {
                        let from = std::fs::read_to_string(parent.join(file))
                            .map_err(io_err(&parent.join(file)))?;
                        std::fs::write(&mine, from.trim()).map_err(io_err(&mine))?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes `limits` to `dir`'s cgroup (the period with a quota). With
    /// systemd they are set on its slice first, as libcontainer's `Set`
    /// (`CPUShares`/`CPUWeight`, `CPUQuotaPeriodUSec` where systemd has
    /// it, `CPUQuotaPerSecUSec` in whole 10 ms, `MemoryLimit`/`MemoryMax`;
    /// infinity for none), then the exact values to the files.
    fn set(&self, dir: &Path, limits: Limits) -> Result<(), Error> {
        if let Some(systemd) = &self.systemd
            && let Some(unit) = dir.file_name().map(|n| n.to_string_lossy().into_owned())
        {
            use crate::systemd::{INFINITY, Property};
            let v2 = self.version == Version::V2;
            let per_sec = crate::systemd::cpu_quota_per_sec(limits.cpu_quota, self.cpu_period_us);
            let mut props = Vec::new();
            if limits.cpu_shares > 0 {
                props.push(if v2 {
                    Property::U64("CPUWeight", weight_from_shares(limits.cpu_shares))
                } else {
                    Property::U64("CPUShares", limits.cpu_shares)
                });
            }
            if systemd.has_quota_period() {
                props.push(Property::U64(
                    "CPUQuotaPeriodUSec",
                    self.cpu_period_us.unsigned_abs(),
                ));
            }
            props.push(Property::U64("CPUQuotaPerSecUSec", per_sec));
            let memory = limits
                .memory
                .and_then(|m| u64::try_from(m).ok())
                .unwrap_or(INFINITY);
            props.push(Property::U64(
                if v2 { "MemoryMax" } else { "MemoryLimit" },
                memory,
            ));
            systemd.set_properties(&unit, &props)?;
        }
        if self.version == Version::V2 {
            let Some(at) = self.hierarchies.first().map(|h| h.join(dir)) else {
                return Ok(());
            };
            if limits.cpu_shares > 0 {
                let weight = weight_from_shares(limits.cpu_shares);
                write(&at.join("cpu.weight"), &weight.to_string())?;
            }
            let quota = limits
                .cpu_quota
                .map_or_else(|| "max".to_string(), |q| q.to_string());
            write(
                &at.join("cpu.max"),
                &format!("{quota} {}", self.cpu_period_us),
            )?;
            let memory = limits
                .memory
                .map_or_else(|| "max".to_string(), |m| m.to_string());
            return write(&at.join("memory.max"), &memory);
        }
        if let Some(cpu) = &self.cpu {
            let at = cpu.join(dir);
            write(&at.join("cpu.shares"), &limits.cpu_shares.to_string())?;
            if limits.cpu_quota.is_some() {
                write(
                    &at.join("cpu.cfs_period_us"),
                    &self.cpu_period_us.to_string(),
                )?;
            }
            write(
                &at.join("cpu.cfs_quota_us"),
                &limits.cpu_quota.unwrap_or(-1).to_string(),
            )?;
        }
        if let Some(memory) = &self.memory {
            let file = memory.join(dir).join("memory.limit_in_bytes");
            write(&file, &limits.memory.unwrap_or(-1).to_string())?;
        }
        Ok(())
    }

    /// The limits written in `dir`'s cgroup now.
    ///
    /// # Errors
    /// A file that cannot be read or parsed.
    pub fn limits(&self, dir: &Path) -> Result<Limits, Error> {
        let read = |file: PathBuf| -> Result<i64, Error> {
            let text = std::fs::read_to_string(&file).map_err(io_err(&file))?;
            text.trim()
                .parse::<i64>()
                .map_err(|e| io_err(&file)(io::Error::new(io::ErrorKind::InvalidData, e)))
        };
        let mut out = Limits::default();
        if self.version == Version::V2 {
            let Some(at) = self.hierarchies.first().map(|h| h.join(dir)) else {
                return Ok(out);
            };
            let weight = u64::try_from(read(at.join("cpu.weight"))?).unwrap_or(0);
            out.cpu_shares = shares_from_weight(weight);
            let file = at.join("cpu.max");
            let text = std::fs::read_to_string(&file).map_err(io_err(&file))?;
            out.cpu_quota =
                match text.split_whitespace().next() {
                    Some("max") => None,
                    Some(q) => Some(q.parse::<i64>().map_err(|e| {
                        io_err(&file)(io::Error::new(io::ErrorKind::InvalidData, e))
                    })?)
                    .filter(|q| *q > 0),
                    None => None,
                };
            let file = at.join("memory.max");
            let text = std::fs::read_to_string(&file).map_err(io_err(&file))?;
            out.memory =
                match text.trim() {
                    "max" => None,
                    m => Some(m.parse::<i64>().map_err(|e| {
                        io_err(&file)(io::Error::new(io::ErrorKind::InvalidData, e))
                    })?),
                };
            return Ok(out);
        }
        if let Some(cpu) = &self.cpu {
            out.cpu_shares = u64::try_from(read(cpu.join(dir).join("cpu.shares"))?).unwrap_or(0);
            out.cpu_quota = Some(read(cpu.join(dir).join("cpu.cfs_quota_us"))?).filter(|q| *q > 0);
        }
        if let Some(memory) = &self.memory {
            // Unlimited reads as a page-rounded i64::MAX.
            out.memory = Some(read(memory.join(dir).join("memory.limit_in_bytes"))?)
                .filter(|m| *m > 0 && *m < i64::MAX / 2);
        }
        Ok(out)
    }

    /// The memory pod `uid`'s cgroup uses now, in bytes (`memory.usage_in_bytes`,
    /// `memory.current` on cgroup v2; page cache included, as the usage the
    /// kubelet compares a lowered limit with); None without a memory
    /// hierarchy.
    ///
    /// # Errors
    /// A bad UID, or a file that cannot be read or parsed.
    pub fn pod_memory_usage(&self, qos: QosClass, uid: &str) -> Result<Option<u64>, Error> {
        let dir = self.pod_dir(qos, uid)?;
        let Some(memory) = &self.memory else {
            return Ok(None);
        };
        let file = memory.join(dir).join(match self.version {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        });
        let text = std::fs::read_to_string(&file).map_err(io_err(&file))?;
        text.trim()
            .parse::<u64>()
            .map(Some)
            .map_err(|e| io_err(&file)(io::Error::new(io::ErrorKind::InvalidData, e)))
    }

    /// Makes the QoS hierarchy: `kubepods` with `node` as its limits (the
    /// allocatable resources when enforced; None leaves it unlimited) and
    /// the node's huge page pools as its huge page limits, `burstable` and
    /// `besteffort` (2 shares) with unbounded huge pages (the kubelet's
    /// `setHugePagesUnbounded`).
    ///
    /// # Errors
    /// The cgroup filesystem refused a directory or a limit.
    pub fn ensure_qos(&self, node: Option<Limits>) -> Result<(), Error> {
        for qos in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            self.make(&self.qos_dir(qos))?;
        }
        if let Some(limits) = node {
            self.set(&self.root, limits)?;
        }
        let pools = self.huge_pages.iter().copied().collect();
        self.set_hugetlb(&self.root, &pools, 0)?;
        let unbounded = crate::pod_core::limits::UNBOUNDED_HUGE_PAGES;
        for qos in [QosClass::Burstable, QosClass::BestEffort] {
            self.set_hugetlb(&self.qos_dir(qos), &BTreeMap::new(), unbounded)?;
        }
        self.set(
            &self.qos_dir(QosClass::BestEffort),
            Limits {
                cpu_shares: MIN_SHARES,
                ..Limits::default()
            },
        )
    }

    /// Limits the existing cgroup `name` (a cgroupfs path, `/system.slice`)
    /// to a reservation, as the kubelet's `enforceExistingCgroup` for
    /// `system-reserved` and `kube-reserved`: the cgroup must be in the `cpu`
    /// and `memory` hierarchies (and `pids`, for a pid reservation); then
    /// only what is reserved is written (shares from the cpu, the memory
    /// limit, `pids.max`), and huge page limits, 0 for the sizes not
    /// reserved, where the `hugetlb` hierarchy has the cgroup. Nothing is
    /// made.
    ///
    /// # Errors
    /// [`Error::MissingPaths`] in the kubelet's words (also for the root, or
    /// a name with `.` or `..`, which name no cgroup of their own); a write
    /// the kernel refused.
    pub fn enforce_reserved(&self, name: &str, r: &Reserved) -> Result<(), Error> {
        let parts: Vec<String> = name
            .split('/')
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect();
        let dir: PathBuf = parts.iter().collect();
        let unsafe_name = parts.iter().any(|p| p == "." || p == "..");
        let mut needed: Vec<&PathBuf> = self.cpu.iter().chain(&self.memory).collect();
        if r.pids.is_some() {
            needed.extend(&self.pids);
        }
        let missing: Vec<String> = needed
            .into_iter()
            .map(|h| h.join(&dir))
            .filter(|p| unsafe_name || !p.is_dir())
            .map(|p| p.display().to_string())
            .collect();
        if !missing.is_empty() || parts.is_empty() {
            return Err(Error::MissingPaths {
                name: parts,
                missing,
            });
        }
        let v2 = self.version == Version::V2;
        if let (Some(shares), Some(cpu)) = (r.cpu_shares, &self.cpu) {
            let (file, value) = if v2 {
                ("cpu.weight", weight_from_shares(shares))
            } else {
                ("cpu.shares", shares)
            };
            write(&cpu.join(&dir).join(file), &value.to_string())?;
        }
        if let (Some(bytes), Some(memory)) = (r.memory, &self.memory) {
            let file = if v2 {
                "memory.max"
            } else {
                "memory.limit_in_bytes"
            };
            write(&memory.join(&dir).join(file), &bytes.to_string())?;
        }
        if let (Some(n), Some(pids)) = (r.pids, &self.pids) {
            write(&pids.join(&dir).join("pids.max"), &n.to_string())?;
        }
        if let Some(h) = &self.hugetlb
            && h.dir.join(&dir).is_dir()
        {
            self.write_hugetlb(h, &dir, &r.huge_pages, 0)?;
        }
        Ok(())
    }

    /// Sets the `burstable` cgroup's shares to `shares` (those of its pods'
    /// cpu requests), as the kubelet's QoS container manager keeps them: a
    /// file that already holds the value is not written again, one changed
    /// behind the agent's back is put right.
    ///
    /// # Errors
    /// The cgroup filesystem refused it (tried again at the next call).
    pub fn set_burstable_shares(&self, shares: u64) -> Result<(), Error> {
        let shares = shares.max(MIN_SHARES);
        if let Some(cpu) = &self.cpu {
            let (file, value) = match self.version {
                Version::V1 => ("cpu.shares", shares),
                Version::V2 => ("cpu.weight", weight_from_shares(shares)),
            };
            let dir = self.qos_dir(QosClass::Burstable);
            let file = cpu.join(&dir).join(file);
            let now = std::fs::read_to_string(&file).ok();
            if now.as_deref().map(str::trim) != Some(value.to_string().as_str()) {
                if let (Some(systemd), Some(unit)) = (&self.systemd, dir.file_name()) {
                    let prop = match self.version {
                        Version::V1 => crate::systemd::Property::U64("CPUShares", value),
                        Version::V2 => crate::systemd::Property::U64("CPUWeight", value),
                    };
                    systemd.set_properties(&unit.to_string_lossy(), &[prop])?;
                }
                write(&file, &value.to_string())?;
            }
        }
        Ok(())
    }

    /// Makes pod `uid`'s cgroup with `limits` and huge page limits `huge`
    /// (0 for every other page size); returns its CRI `cgroup_parent`.
    ///
    /// # Errors
    /// A bad UID, or the cgroup filesystem refused a directory or a limit.
    pub fn ensure_pod(
        &self,
        qos: QosClass,
        uid: &str,
        limits: Limits,
        huge: &crate::pod_core::limits::HugePageLimits,
    ) -> Result<String, Error> {
        let dir = self.pod_dir(qos, uid)?;
        self.make(&dir)?;
        self.set(&dir, limits)?;
        self.set_hugetlb(&dir, huge, 0)?;
        self.set_pod_pids(&dir)?;
        debug!(cgroup = %dir.display(), ?limits, pids = ?self.pod_pids_limit, "pod cgroup");
        self.cgroup_parent(qos, uid)
    }

    /// Sets pod `uid`'s cgroup limits to `limits` (a resize).
    ///
    /// # Errors
    /// A bad UID, or the cgroup filesystem refused a limit (a memory limit
    /// below what the pod uses, for one).
    pub fn update_pod(&self, qos: QosClass, uid: &str, limits: Limits) -> Result<(), Error> {
        self.set(&self.pod_dir(qos, uid)?, limits)
    }

    /// True when pod `uid` of class `qos` has a cgroup.
    #[must_use]
    pub fn has_pod(&self, qos: QosClass, uid: &str) -> bool {
        match (&self.memory, self.pod_dir(qos, uid)) {
            (Some(memory), Ok(dir)) => memory.join(dir).is_dir(),
            _ => false,
        }
    }

    /// The cgroup of pod `uid` relative to the hierarchies' roots, whatever
    /// its class, when it has one (none for a UID that is not one directory
    /// name).
    #[must_use]
    pub fn find_pod(&self, uid: &str) -> Option<PathBuf> {
        [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ]
        .into_iter()
        .find(|&qos| self.has_pod(qos, uid))
        .and_then(|qos| self.pod_dir(qos, uid).ok())
    }

    /// The UIDs of the pods that have a cgroup.
    #[must_use]
    pub fn pods(&self) -> Vec<(QosClass, String)> {
        let Some(memory) = &self.memory else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for qos in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            let Ok(entries) = std::fs::read_dir(memory.join(self.qos_dir(qos))) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(uid) = self.uid_of(qos, &name)
                    && e.path().is_dir()
                {
                    out.push((qos, uid));
                }
            }
        }
        out
    }

    /// Removes pod `uid`'s cgroup from every hierarchy (the runtime has
    /// removed its containers' own cgroups by then); one already gone is
    /// fine. With systemd its slice is stopped first (libcontainer's
    /// `Destroy`).
    ///
    /// # Errors
    /// A bad UID, a slice systemd would not stop, or a cgroup that still
    /// has tasks (tried again later).
    pub fn remove_pod(&self, qos: QosClass, uid: &str) -> Result<(), Error> {
        let dir = self.pod_dir(qos, uid)?;
        self.stop_slice(&dir)?;
        self.remove_unified(&dir);
        for h in &self.hierarchies {
            let path = h.join(&dir);
            match std::fs::remove_dir(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&path)(e)),
            }
        }
        Ok(())
    }
}

impl CgroupManager {
    /// Removes every pod cgroup, then the QoS hierarchy (`<cgroupRoot>/kubepods`
    /// and below), from every hierarchy, as a node reset leaves the host;
    /// returns how many pod cgroups went. What is already gone is fine.
    ///
    /// # Errors
    /// A cgroup that still has tasks (a pod whose containers run).
    pub fn remove_all(&self) -> Result<usize, Error> {
        let pods = self.pods();
        for (qos, uid) in &pods {
            self.remove_pod(*qos, uid)?;
        }
        for qos in [
            QosClass::Burstable,
            QosClass::BestEffort,
            QosClass::Guaranteed,
        ] {
            self.stop_slice(&self.qos_dir(qos))?;
            self.remove_unified(&self.qos_dir(qos));
            for h in &self.hierarchies {
                let path = h.join(self.qos_dir(qos));
                match std::fs::remove_dir(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err(&path)(e)),
                }
            }
        }
        Ok(pods.len())
    }

    /// Removes `<cgroupRoot>` itself, the directory above the QoS hierarchy,
    /// from every hierarchy (the hybrid host's v2 one too), when it is not the
    /// hierarchies' own root, with the [`SHIMS_CGROUP`] beside the QoS
    /// hierarchy when empty: the last of a node reset, once a companion
    /// runtime's shims have exited. Any other cgroup in the root is not the
    /// agent's and stays, and so does the root then. Returns whether none is
    /// left; one that still holds a process or a cgroup (the QoS hierarchy
    /// while it is there) stays, and is named at debug level.
    ///
    /// With systemd the cgroup root is the host's slice (the kubelet needs
    /// it to exist and never makes nor removes it): it stays.
    pub fn remove_root(&self) -> bool {
        let Some(dir) = self.root.parent().filter(|d| !d.as_os_str().is_empty()) else {
            return true;
        };
        if self.systemd.is_some() {
            return true;
        }
        let mut left = false;
        for h in self.hierarchies.iter().chain(&self.unified) {
            // Holding processes or cgroups, it stays, and so does the root.
            let _ = std::fs::remove_dir(h.join(dir).join(SHIMS_CGROUP));
            match std::fs::remove_dir(h.join(dir)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    debug!(dir = %h.join(dir).display(), error = %e, "remove the cgroup root");
                    left = true;
                }
            }
        }
        !left
    }

    /// Stops the slice of `dir`, with the `systemd` driver.
    /// Stopping a slice would kill what runs in it: as a directory with
    /// tasks or cgroups is not removed, a slice with either is not
    /// stopped (`EBUSY`, tried again later).
    fn stop_slice(&self, dir: &Path) -> Result<(), Error> {
        let (Some(systemd), Some(unit)) = (&self.systemd, dir.file_name()) else {
            return Ok(());
        };
        if let Some(memory) = &self.memory {
            let at = memory.join(dir);
            let tasks = std::fs::read_to_string(at.join("cgroup.procs")).unwrap_or_default();
            let children = std::fs::read_dir(&at)
                .map(|entries| entries.flatten().any(|e| e.path().is_dir()))
                .unwrap_or(false);
            if !tasks.trim().is_empty() || children {
                return Err(io_err(&at)(io::Error::from(io::ErrorKind::ResourceBusy)));
            }
        }
        systemd.stop_unit(&unit.to_string_lossy())?;
        Ok(())
    }

    /// Removes `dir` from the hybrid host's v2 hierarchy, if there: best
    /// effort (nothing is enforced there, and a failure must not keep the
    /// v1 cgroups).
    fn remove_unified(&self, dir: &Path) {
        if let Some(unified) = &self.unified
            && let Err(e) = std::fs::remove_dir(unified.join(dir))
            && e.kind() != io::ErrorKind::NotFound
        {
            debug!(dir = %unified.join(dir).display(), error = %e, "remove a unified cgroup");
        }
    }

    /// Removes the (empty) QoS hierarchy from every hierarchy: the end of a
    /// test that made one of its own.
    #[cfg(test)]
    pub(crate) fn remove_qos(&self) {
        let _ = self.remove_all();
    }
}

/// The cgroup name of `<cgroup_root>/<name>` with the `cgroupfs` driver:
/// the root's path components, then `name`.
fn cgroupfs_parts(cgroup_root: &str, name: &str) -> Vec<String> {
    Path::new(cgroup_root.trim_start_matches('/'))
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .chain(std::iter::once(name.to_string()))
        .collect()
}

fn write(file: &Path, value: &str) -> Result<(), Error> {
    std::fs::write(file, value).map_err(io_err(file))
}

/// The controllers a cgroup v2 file lists (`cgroup.controllers`,
/// `cgroup.subtree_control`).
fn controllers(file: &Path) -> io::Result<BTreeSet<String>> {
    Ok(std::fs::read_to_string(file)?
        .split_whitespace()
        .map(str::to_string)
        .collect())
}

/// Makes `dir` below the cgroup v2 hierarchy `root`, each level from the root
/// down enabling its offered controllers of [`V2_CONTROLLERS`] for the level
/// below (as runc's `CreateCgroupPath`); levels already there are kept.
fn make_v2_path(root: &Path, dir: &Path) -> Result<(), Error> {
    let mut at = root.to_path_buf();
    for part in dir.components() {
        enable_controllers(&at)?;
        at.push(part);
        if !at.is_dir() {
            std::fs::create_dir(&at).map_err(io_err(&at))?;
        }
    }
    Ok(())
}

/// Enables, for the cgroups below cgroup v2 directory `level`, the
/// controllers of [`V2_CONTROLLERS`] it offers and has not enabled yet: all
/// in one write, else (the kernel refused one) each alone, as runc's
/// `CreateCgroupPath`; `cpu` and `memory` must be enabled.
fn enable_controllers(level: &Path) -> Result<(), Error> {
    let offered_file = level.join("cgroup.controllers");
    let offered = controllers(&offered_file).map_err(io_err(&offered_file))?;
    let control = level.join("cgroup.subtree_control");
    let enabled = controllers(&control).unwrap_or_default();
    let wanted: Vec<&str> = V2_CONTROLLERS
        .into_iter()
        .filter(|c| offered.contains(*c) && !enabled.contains(*c))
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let all: Vec<String> = wanted.iter().map(|c| format!("+{c}")).collect();
    if write(&control, &all.join(" ")).is_ok() {
        return Ok(());
    }
    for c in wanted {
        if let Err(e) = write(&control, &format!("+{c}")) {
            if c == "cpu" || c == "memory" {
                return Err(e);
            }
            debug!(controller = c, error = %e, "a cgroup v2 controller not enabled");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_HUGE: crate::pod_core::limits::HugePageLimits = BTreeMap::new();

    /// The real cgroup v1 hierarchies of this machine, under a root of this
    /// test's own (removed at the end), when the test runs as root on
    /// cgroup v1; None elsewhere.
    fn real(name: &str) -> Option<CgroupManager> {
        let m = CgroupManager::v1(Path::new("/sys/fs/cgroup"), "/", name)?;
        std::fs::create_dir_all(m.memory.as_ref()?.join(&m.root)).ok()?;
        Some(m)
    }

    fn cleanup(m: &CgroupManager) {
        m.remove_qos();
    }

    /// Runs `body` against `m`, then removes what it made (the QoS hierarchy
    /// and, above it, the cgroup root), whether or not `body` panicked.
    fn with_cleanup(m: &CgroupManager, body: impl FnOnce()) {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
        cleanup(m);
        m.remove_root();
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
    }

    /// Pod limits for tests that only need a pod cgroup to exist.
    const SMALL: Limits = Limits {
        cpu_shares: 2,
        cpu_quota: None,
        memory: None,
    };

    #[test]
    fn pod_cgroups_are_made_limited_resized_and_removed_on_the_real_hierarchy() {
        let name = format!("rustlet-test-{}", std::process::id());
        let Some(m) = real(&name) else {
            assert!(!crate::fixtures::requires(
                "a writable cgroup v1 hierarchy",
                false
            ));
            return;
        };
        with_cleanup(&m, || {
            m.ensure_qos(Some(Limits {
                cpu_shares: 2048,
                cpu_quota: None,
                memory: Some(1 << 30),
            }))
            .unwrap();
            assert_eq!(m.limits(&m.root).unwrap().memory, Some(1 << 30));
            assert_eq!(
                m.limits(&m.qos_dir(QosClass::BestEffort))
                    .unwrap()
                    .cpu_shares,
                2
            );
            let burstable = m.qos_dir(QosClass::Burstable);
            m.set_burstable_shares(300).unwrap();
            assert_eq!(m.limits(&burstable).unwrap().cpu_shares, 300);
            // A change made behind the manager's back is put right.
            let file = m.cpu.as_ref().unwrap().join(&burstable).join("cpu.shares");
            std::fs::write(&file, "1024").unwrap();
            m.set_burstable_shares(300).unwrap();
            assert_eq!(m.limits(&burstable).unwrap().cpu_shares, 300);
            m.set_burstable_shares(0).unwrap();
            assert_eq!(m.limits(&burstable).unwrap().cpu_shares, MIN_SHARES);
            let limits = Limits {
                cpu_shares: 256,
                cpu_quota: Some(50_000),
                memory: Some(256 << 20),
            };
            let parent = m
                .ensure_pod(QosClass::Burstable, "0a1b-2c", limits, &NO_HUGE)
                .unwrap();
            assert_eq!(parent, format!("/{name}/burstable/pod0a1b-2c"));
            let dir = m.pod_dir(QosClass::Burstable, "0a1b-2c").unwrap();
            assert_eq!(m.limits(&dir).unwrap(), limits);
            for h in &m.hierarchies {
                assert!(h.join(&dir).is_dir(), "{}", h.display());
            }
            if let Some(cpuset) = &m.cpuset {
                let cpus = std::fs::read_to_string(cpuset.join(&dir).join("cpuset.cpus")).unwrap();
                assert!(!cpus.trim().is_empty(), "cpus copied from the parent");
            }
            let usage = m.pod_memory_usage(QosClass::Burstable, "0a1b-2c").unwrap();
            assert!(usage.is_some(), "an empty cgroup's usage reads (0 or more)");
            let bigger = Limits {
                memory: Some(512 << 20),
                cpu_quota: None,
                ..limits
            };
            m.update_pod(QosClass::Burstable, "0a1b-2c", bigger)
                .unwrap();
            assert_eq!(m.limits(&dir).unwrap(), bigger);
            assert_eq!(m.pods(), [(QosClass::Burstable, "0a1b-2c".to_string())]);
            m.remove_pod(QosClass::Burstable, "0a1b-2c").unwrap();
            m.remove_pod(QosClass::Burstable, "0a1b-2c").unwrap();
            assert!(m.pods().is_empty());
            // A UID that would climb out is refused.
            assert!(matches!(
                m.ensure_pod(QosClass::BestEffort, "../../etc", limits, &NO_HUGE),
                Err(Error::BadUid(_))
            ));
        });
    }

    /// On this machine's cgroup v1 `pids` hierarchy, the kernel takes the
    /// pod's `pids.max` and a pod cgroup refuses a process past it.
    #[test]
    fn the_pod_pids_limit_holds_on_the_real_pids_hierarchy() {
        let name = format!("rustlet-pids-test-{}", std::process::id());
        let Some(m) = real(&name) else {
            assert!(!crate::fixtures::requires(
                "a writable cgroup v1 hierarchy",
                false
            ));
            return;
        };
        let Ok(m) = m.with_pod_pids_limit(1) else {
            assert!(!crate::fixtures::requires(
                "a cgroup v1 pids hierarchy",
                false
            ));
            return;
        };
        with_cleanup(&m, || {
            m.ensure_qos(None).unwrap();
            m.ensure_pod(QosClass::BestEffort, "p1", SMALL, &NO_HUGE)
                .unwrap();
            let dir = m
                .pids
                .as_ref()
                .unwrap()
                .join(m.pod_dir(QosClass::BestEffort, "p1").unwrap());
            let max = std::fs::read_to_string(dir.join("pids.max")).unwrap();
            assert_eq!(max.trim(), "1");
            // A shell in the pod's cgroup may not fork a second process.
            let out = std::process::Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "echo $$ > {}/cgroup.procs && /bin/true && echo forked",
                    dir.display()
                ))
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(!stdout.contains("forked"), "a second process ran: {out:?}");
        });
    }

    #[test]
    fn cpu_weight_is_the_kubelets_linear_conversion_of_shares() {
        for (shares, weight) in [
            (0, 0),
            (1, 1),
            (2, 1),
            (1024, 39),
            (262_143, 10_000 - 1),
            (262_144, 10_000),
            (u64::MAX, 10_000),
        ] {
            assert_eq!(weight_from_shares(shares), weight, "{shares} shares");
        }
        assert_eq!(shares_from_weight(0), 0);
        assert_eq!(shares_from_weight(1), 2);
        assert_eq!(shares_from_weight(39), 998);
        assert_eq!(shares_from_weight(10_000), 262_144);
        assert_eq!(shares_from_weight(u64::MAX), 262_144, "no overflow");
        // Reading back is the kubelet's lossy inverse, never above the
        // largest shares.
        for w in 1..=MAX_WEIGHT {
            assert!(shares_from_weight(w) <= 262_144, "weight {w}");
        }
    }

    /// A cgroup v2 tree as the kernel shows it to a manager: the root
    /// offers `offered`; each cgroup made below offers what its parent
    /// enabled (made here as the kernel would, for the levels the test
    /// names).
    fn fake_v2(offered: &str, levels: &[&str]) -> (tempfile::TempDir, CgroupManager) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.controllers"), offered).unwrap();
        std::fs::write(dir.path().join("cgroup.subtree_control"), "").unwrap();
        for level in levels {
            let at = dir.path().join(level);
            std::fs::create_dir_all(&at).unwrap();
            std::fs::write(at.join("cgroup.controllers"), offered).unwrap();
            std::fs::write(at.join("cgroup.subtree_control"), "").unwrap();
        }
        let m = CgroupManager::detect(dir.path(), "/", "kubepods").expect("a v2 root");
        (dir, m)
    }

    /// Only directories this agent would have made for a pod are its pods'
    /// cgroups: housekeeping would otherwise try to remove the others at
    /// every pass, or a node reset stop at them.
    #[test]
    fn pod_cgroups_are_read_back_only_from_names_a_pod_would_get() {
        let (dir, m) = fake_v2("cpu memory", &["kubepods", "kubepods/burstable"]);
        for name in [
            "pod0a-1b",
            "pod",
            "pod_x",
            "podA..b",
            "other",
            "pod0a-1b.slice",
        ] {
            std::fs::create_dir(dir.path().join("kubepods/burstable").join(name)).unwrap();
        }
        assert_eq!(m.pods(), vec![(QosClass::Burstable, "0a-1b".to_string())]);
    }

    /// `podPidsLimit` becomes each pod's `pids.max` (not the QoS
    /// cgroups'); none at 0 or -1; refused where no pids controller is.
    #[test]
    fn the_pod_pids_limit_is_each_pods_pids_max_on_cgroup_v2() {
        let (dir, m) = fake_v2(
            "cpu memory pids",
            &["kubepods", "kubepods/burstable", "kubepods/besteffort"],
        );
        let m = m.with_pod_pids_limit(64).unwrap();
        m.ensure_qos(None).unwrap();
        m.ensure_pod(QosClass::BestEffort, "u1", SMALL, &NO_HUGE)
            .unwrap();
        let root = dir.path();
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
        assert_eq!(read("kubepods/besteffort/podu1/pids.max"), "64");
        assert!(!root.join("kubepods/besteffort/pids.max").exists());
        for none in [0, -1, i64::MIN] {
            let m = m.clone().with_pod_pids_limit(none).unwrap();
            m.ensure_pod(QosClass::BestEffort, "u2", SMALL, &NO_HUGE)
                .unwrap();
            assert!(!root.join("kubepods/besteffort/podu2/pids.max").exists());
        }

        let (_dir, no_pids) = fake_v2("cpu memory", &["kubepods"]);
        let refused = no_pids.with_pod_pids_limit(64).unwrap_err().to_string();
        assert_eq!(
            refused,
            "podPidsLimit 64: the pids cgroup controller is not available"
        );
        assert!(fake_v2("cpu memory", &[]).1.with_pod_pids_limit(-1).is_ok());
    }

    /// A cgroup v1 tree as a manager sees it: `cpu,cpuacct` and `memory`
    /// hierarchies, and `extra` ones named by their controllers; with
    /// `unified`, a hybrid host's v2 hierarchy offering those controllers
    /// at its root and at each of `levels`.
    fn fake_v1(
        extra: &[&str],
        unified: Option<(&str, &[&str])>,
    ) -> (tempfile::TempDir, CgroupManager) {
        let dir = tempfile::tempdir().unwrap();
        for (h, file) in [
            ("cpu,cpuacct", "cpu.shares"),
            ("memory", "memory.limit_in_bytes"),
        ]
        .into_iter()
        .chain(extra.iter().map(|h| (*h, "tasks")))
        {
            std::fs::create_dir(dir.path().join(h)).unwrap();
            std::fs::write(dir.path().join(h).join("cgroup.procs"), "").unwrap();
            std::fs::write(dir.path().join(h).join(file), "").unwrap();
        }
        if let Some((offered, levels)) = unified {
            let u = dir.path().join("unified");
            for at in std::iter::once(u.clone()).chain(levels.iter().map(|l| u.join(l))) {
                std::fs::create_dir_all(&at).unwrap();
                std::fs::write(at.join("cgroup.procs"), "").unwrap();
                std::fs::write(at.join("cgroup.controllers"), offered).unwrap();
                std::fs::write(at.join("cgroup.subtree_control"), "").unwrap();
            }
        }
        let m = CgroupManager::detect(dir.path(), "/", "kubepods").expect("v1 hierarchies");
        (dir, m)
    }

    /// Huge page limits as the kubelet's: the pod's requests by page size
    /// (0 for the node's other sizes), unbounded (2^62) in `burstable` and
    /// `besteffort`, the node's pools in `kubepods`; in a v1 `hugetlb`
    /// hierarchy, in the v2 one, or in a hybrid host's v2 hierarchy, whose
    /// levels get `hugetlb` enabled; nothing where no controller is.
    #[test]
    fn huge_page_limits_go_where_the_hugetlb_controller_is() {
        const MIB2: u64 = 2 << 20;
        const GIB: u64 = 1 << 30;
        let pools = vec![(MIB2, 8 * MIB2), (GIB, 0)];
        let huge = crate::pod_core::limits::HugePageLimits::from([(MIB2, 4 << 20)]);
        let qos_levels = ["kubepods", "kubepods/burstable", "kubepods/besteffort"];
        let (v2, v2m) = fake_v2("cpu memory hugetlb", &qos_levels);
        let (v1, v1m) = fake_v1(&["hugetlb"], None);
        let (hybrid, hybridm) = fake_v1(&[], Some(("hugetlb", &qos_levels)));
        for (root, m, suffix) in [
            (v2.path().to_path_buf(), v2m, "max"),
            (v1.path().join("hugetlb"), v1m, "limit_in_bytes"),
            (hybrid.path().join("unified"), hybridm, "max"),
        ] {
            assert!(m.limits_huge_pages(), "{}", root.display());
            let m = m.with_huge_pages(pools.clone());
            m.ensure_qos(None).unwrap();
            m.ensure_pod(QosClass::Burstable, "u1", SMALL, &huge)
                .unwrap();
            let read = |dir: &str, size: &str| {
                std::fs::read_to_string(root.join(dir).join(format!("hugetlb.{size}.{suffix}")))
                    .unwrap()
            };
            assert_eq!(read("kubepods", "2MB"), (8 * MIB2).to_string());
            assert_eq!(read("kubepods", "1GB"), "0");
            for qos in ["kubepods/burstable", "kubepods/besteffort"] {
                assert_eq!(read(qos, "2MB"), (1u64 << 62).to_string());
                assert_eq!(read(qos, "1GB"), (1u64 << 62).to_string());
            }
            assert_eq!(
                read("kubepods/burstable/podu1", "2MB"),
                (4u64 << 20).to_string()
            );
            assert_eq!(read("kubepods/burstable/podu1", "1GB"), "0");
        }
        let enabled = std::fs::read_to_string(
            hybrid
                .path()
                .join("unified/kubepods/burstable/cgroup.subtree_control"),
        );
        assert_eq!(enabled.unwrap(), "+hugetlb");

        let (none, m) = fake_v1(&[], None);
        assert!(!m.limits_huge_pages());
        let m = m.with_huge_pages(pools);
        m.ensure_qos(None).unwrap();
        m.ensure_pod(QosClass::Burstable, "u1", SMALL, &huge)
            .unwrap();
        assert!(!none.path().join("unified").exists());
        let pod = none.path().join("memory/kubepods/burstable/podu1");
        assert!(pod.is_dir());
        assert!(
            std::fs::read_dir(&pod)
                .unwrap()
                .flatten()
                .all(|e| !e.file_name().to_string_lossy().starts_with("hugetlb"))
        );
    }

    /// A reservation is written to its existing cgroup, only what is
    /// reserved; a cgroup missing from a hierarchy is refused in the
    /// kubelet's words, and nothing is made.
    #[test]
    fn reservations_limit_existing_cgroups_only() {
        let (dir, m) = fake_v1(&["pids"], None);
        let m = m.with_huge_pages(vec![(2 << 20, 0)]);
        let reserved = Reserved {
            cpu_shares: Some(204),
            memory: Some(128 << 20),
            pids: Some(1000),
            huge_pages: crate::pod_core::limits::HugePageLimits::new(),
        };
        let err = m.enforce_reserved("/system.slice", &reserved).unwrap_err();
        let root = dir.path().display().to_string();
        assert_eq!(
            err.to_string(),
            format!(
                "cgroup [\"system.slice\"] has some missing paths: {root}/cpu,cpuacct/system.slice, {root}/memory/system.slice, {root}/pids/system.slice"
            )
        );
        assert!(
            !dir.path().join("memory/system.slice").exists(),
            "nothing made"
        );
        for h in ["cpu,cpuacct", "memory", "pids"] {
            std::fs::create_dir(dir.path().join(h).join("system.slice")).unwrap();
        }
        let quota = dir.path().join("cpu,cpuacct/system.slice/cpu.cfs_quota_us");
        std::fs::write(&quota, "50000").unwrap();
        m.enforce_reserved("/system.slice", &reserved).unwrap();
        let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).unwrap();
        assert_eq!(read("cpu,cpuacct/system.slice/cpu.shares"), "204");
        assert_eq!(
            read("memory/system.slice/memory.limit_in_bytes"),
            (128u64 << 20).to_string()
        );
        assert_eq!(read("pids/system.slice/pids.max"), "1000");
        assert_eq!(
            std::fs::read_to_string(&quota).unwrap(),
            "50000",
            "not reserved, not touched"
        );
        // Only memory reserved: the shares stay as they are.
        std::fs::write(
            dir.path().join("cpu,cpuacct/system.slice/cpu.shares"),
            "1024",
        )
        .unwrap();
        let memory_only = Reserved {
            memory: Some(64 << 20),
            ..Reserved::default()
        };
        m.enforce_reserved("/system.slice", &memory_only).unwrap();
        assert_eq!(read("cpu,cpuacct/system.slice/cpu.shares"), "1024");
        assert_eq!(
            read("memory/system.slice/memory.limit_in_bytes"),
            (64u64 << 20).to_string()
        );
        for bad in ["/", "/system.slice/../..", ""] {
            assert!(m.enforce_reserved(bad, &memory_only).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn on_cgroup_v2_limits_are_written_as_weight_max_and_memory_max_and_read_back() {
        let (dir, m) = fake_v2(
            "cpuset cpu io memory hugetlb pids",
            &["kubepods", "kubepods/burstable", "kubepods/besteffort"],
        );
        assert_eq!(m.version(), Version::V2);
        m.ensure_qos(Some(Limits {
            cpu_shares: 2048,
            cpu_quota: None,
            memory: Some(1 << 30),
        }))
        .unwrap();
        let root = dir.path();
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap();
        assert_eq!(read("kubepods/cpu.weight"), "79");
        assert_eq!(read("kubepods/cpu.max"), "max 100000");
        assert_eq!(read("kubepods/memory.max"), "1073741824");
        assert_eq!(read("kubepods/besteffort/cpu.weight"), "1");
        // The kubelet's controllers the root offers are enabled for its
        // children, `io` (not the kubelet's) is not.
        // (The kernel lists them without `+`; this file keeps what was
        // written.)
        assert_eq!(
            read("cgroup.subtree_control"),
            "+cpu +cpuset +memory +hugetlb +pids"
        );
        m.set_burstable_shares(1024).unwrap();
        assert_eq!(read("kubepods/burstable/cpu.weight"), "39");

        let limits = Limits {
            cpu_shares: 256,
            cpu_quota: Some(50_000),
            memory: Some(256 << 20),
        };
        let parent = m
            .ensure_pod(QosClass::Burstable, "u1", limits, &NO_HUGE)
            .unwrap();
        assert_eq!(parent, "/kubepods/burstable/podu1");
        assert_eq!(read("kubepods/burstable/podu1/cpu.max"), "50000 100000");
        let dir_u1 = m.pod_dir(QosClass::Burstable, "u1").unwrap();
        let now = m.limits(&dir_u1).unwrap();
        assert_eq!(now.cpu_quota, Some(50_000));
        assert_eq!(now.memory, Some(256 << 20));
        assert_ne!(now.cpu_shares, 256, "a weight reads back approximately");
        assert_eq!(m.as_allocated(now, &limits), limits);
        let other = Limits {
            cpu_shares: 512,
            ..limits
        };
        assert_eq!(m.as_allocated(now, &other), now, "another allocation");
        std::fs::write(
            root.join("kubepods/burstable/podu1/memory.current"),
            "4096\n",
        )
        .unwrap();
        assert_eq!(
            m.pod_memory_usage(QosClass::Burstable, "u1").unwrap(),
            Some(4096)
        );
        let unlimited = Limits {
            cpu_shares: 2,
            cpu_quota: None,
            memory: None,
        };
        m.update_pod(QosClass::Burstable, "u1", unlimited).unwrap();
        assert_eq!(read("kubepods/burstable/podu1/memory.max"), "max");
        assert_eq!(m.limits(&dir_u1).unwrap(), unlimited);
        assert_eq!(m.pods(), [(QosClass::Burstable, "u1".to_string())]);

        // Garbage in a file is an error, not a limit.
        std::fs::write(root.join("kubepods/burstable/podu1/cpu.max"), "lots 100000").unwrap();
        assert!(m.limits(&dir_u1).is_err());
    }
    /// With `cpuCFSQuotaPeriod`, a pod cgroup's quota is written over that
    /// period: `cpu.max` on cgroup v2, `cpu.cfs_period_us` on v1.
    #[test]
    fn a_custom_cfs_period_is_written_with_the_quota() {
        let limits = Limits {
            cpu_shares: 256,
            cpu_quota: Some(25_000),
            memory: None,
        };
        let (dir, m) = fake_v2(
            "cpu memory",
            &["kubepods", "kubepods/burstable", "kubepods/besteffort"],
        );
        let m = m.with_cpu_period(50_000);
        m.ensure_qos(None).unwrap();
        m.ensure_pod(QosClass::Burstable, "u1", limits, &NO_HUGE)
            .unwrap();
        let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).unwrap();
        assert_eq!(read("kubepods/burstable/podu1/cpu.max"), "25000 50000");

        let (dir, m) = fake_v1(&[], None);
        let m = m.with_cpu_period(50_000);
        m.ensure_qos(None).unwrap();
        m.ensure_pod(QosClass::Burstable, "u1", limits, &NO_HUGE)
            .unwrap();
        let cpu = dir.path().join("cpu,cpuacct/kubepods/burstable/podu1");
        let read = |f: &str| std::fs::read_to_string(cpu.join(f)).unwrap();
        assert_eq!(read("cpu.cfs_period_us"), "50000");
        assert_eq!(read("cpu.cfs_quota_us"), "25000");
    }

    #[test]
    fn a_v2_root_without_cpu_or_memory_is_no_manager() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.controllers"), "hugetlb pids").unwrap();
        assert!(CgroupManager::detect(dir.path(), "/", "kubepods").is_none());
        assert!(CgroupManager::v2(Path::new("/nonexistent"), "/", "kubepods").is_none());
    }

    /// On the real cgroup v2 hierarchy of a hybrid host (where it offers only
    /// the controllers no v1 hierarchy holds), the levels are made and their
    /// offered controllers enabled down to the pod, as on a v2 host.
    #[test]
    fn on_the_real_unified_hierarchy_controllers_are_enabled_down_to_the_pod() {
        let unified = Path::new("/sys/fs/cgroup/unified");
        let Ok(offered) = controllers(&unified.join("cgroup.controllers")) else {
            let what = format!("a cgroup v2 hierarchy at {}", unified.display());
            assert!(!crate::fixtures::requires(&what, false));
            return;
        };
        let kubelets: BTreeSet<String> = offered
            .iter()
            .filter(|c| V2_CONTROLLERS.contains(&c.as_str()))
            .cloned()
            .collect();
        let name = format!("rustlet-v2-test-{}", std::process::id());
        let m = CgroupManager {
            version: Version::V2,
            hierarchies: vec![unified.to_path_buf()],
            cpu: None,
            memory: None,
            cpuset: None,
            pids: None,
            pod_pids_limit: None,
            cpu_period_us: CPU_PERIOD_US,
            hugetlb: None,
            huge_pages: Vec::new(),
            root: Path::new(&name).join("kubepods"),
            root_parts: vec![name.clone(), "kubepods".into()],
            systemd: None,
            unified: None,
        };
        let dir = m.pod_dir(QosClass::Burstable, "u1").unwrap();
        let made = m.make(&dir);
        let mut levels: Vec<PathBuf> = dir
            .ancestors()
            .filter(|d| !d.as_os_str().is_empty())
            .map(|d| unified.join(d))
            .collect();
        let made = made.map_err(|e| e.to_string());
        let checked = std::panic::catch_unwind(|| {
            made.expect("made on the real hierarchy");
            assert!(unified.join(&dir).is_dir());
            for level in levels.iter().skip(1) {
                let enabled = controllers(&level.join("cgroup.subtree_control")).unwrap();
                assert!(
                    kubelets.is_subset(&enabled),
                    "{}: {enabled:?} of {kubelets:?}",
                    level.display()
                );
            }
            let pod_offers = controllers(&unified.join(&dir).join("cgroup.controllers")).unwrap();
            assert!(kubelets.is_subset(&pod_offers), "{pod_offers:?}");
        });
        levels.sort_by_key(|l| std::cmp::Reverse(l.components().count()));
        for level in &levels {
            let _ = std::fs::remove_dir(level);
        }
        if let Err(e) = checked {
            std::panic::resume_unwind(e);
        }
    }

    #[test]
    fn a_reset_removes_every_pod_cgroup_and_the_qos_hierarchy() {
        let name = format!("rustlet-reset-test-{}", std::process::id());
        let Some(m) = real(&name) else {
            assert!(!crate::fixtures::requires(
                "a writable cgroup v1 hierarchy",
                false
            ));
            return;
        };
        with_cleanup(&m, || {
            m.ensure_qos(None).unwrap();
            let limits = SMALL;
            m.ensure_pod(QosClass::BestEffort, "u1", limits, &NO_HUGE)
                .unwrap();
            m.ensure_pod(QosClass::Burstable, "u2", limits, &NO_HUGE)
                .unwrap();
            m.ensure_pod(QosClass::Guaranteed, "u3", limits, &NO_HUGE)
                .unwrap();
            // runc makes the pod's path in the hybrid host's v2 hierarchy too.
            if let Some(unified) = &m.unified {
                let dir = unified.join(m.pod_dir(QosClass::BestEffort, "u1").unwrap());
                std::fs::create_dir_all(&dir).unwrap();
            }
            assert_eq!(m.remove_all().unwrap(), 3);
            for h in m.hierarchies.iter().chain(&m.unified) {
                assert!(!h.join(&m.root).exists(), "{}", h.join(&m.root).display());
            }
            // Again: nothing left, nothing to do.
            assert_eq!(m.remove_all().unwrap(), 0);
        });
    }

    #[test]
    fn the_cgroup_root_goes_once_empty_and_the_hierarchies_root_never() {
        let name = format!("rustlet-root-test-{}", std::process::id());
        let Some(hierarchy_root) = real(&name) else {
            assert!(!crate::fixtures::requires(
                "a writable cgroup v1 hierarchy",
                false
            ));
            return;
        };
        // cgroupRoot `/`: there is nothing above the QoS hierarchy to remove.
        assert!(hierarchy_root.remove_root());
        cleanup(&hierarchy_root);
        assert!(Path::new("/sys/fs/cgroup/memory/tasks").exists());

        let root = format!("/rustlet-root-test-{}", std::process::id());
        let Some(m) = CgroupManager::v1(Path::new("/sys/fs/cgroup"), &root, "kubepods") else {
            assert!(!crate::fixtures::requires(
                "a writable cgroup v1 hierarchy",
                false
            ));
            return;
        };
        with_cleanup(&m, || {
            m.ensure_qos(None).unwrap();
            let limits = SMALL;
            m.ensure_pod(QosClass::BestEffort, "u1", limits, &NO_HUGE)
                .unwrap();
            assert_eq!(m.find_pod("u1"), Some(m.root.join("besteffort/podu1")));
            for hostile in ["u2", "../u1", "", "u1/..", "besteffort/podu1"] {
                assert_eq!(m.find_pod(hostile), None, "{hostile:?}");
            }
            // Not while the QoS hierarchy is below it; an empty shims cgroup
            // beside it goes, another cgroup (not the agent's) stays.
            let (shims, other) = (
                m.root.parent().unwrap().join(SHIMS_CGROUP),
                m.root.parent().unwrap().join("someone-elses"),
            );
            for h in &m.hierarchies {
                std::fs::create_dir_all(h.join(&shims)).unwrap();
                std::fs::create_dir_all(h.join(&other)).unwrap();
            }
            assert!(!m.remove_root());
            assert!(m.memory.as_ref().unwrap().join(&m.root).exists());
            for h in &m.hierarchies {
                assert!(!h.join(&shims).exists(), "{}", h.join(&shims).display());
                assert!(h.join(&other).exists(), "{}", h.join(&other).display());
                std::fs::remove_dir(h.join(&other)).unwrap();
            }
            assert_eq!(m.remove_all().unwrap(), 1);
            assert!(m.remove_root());
            let above = m.root.parent().unwrap();
            for h in m.hierarchies.iter().chain(&m.unified) {
                assert!(!h.join(above).exists(), "{}", h.join(above).display());
            }
            // Gone already: nothing to do.
            assert!(m.remove_root());
        });
    }

    /// `systemctl show -p NAME --value UNIT`.
    fn systemctl_show(unit: &str, name: &str) -> String {
        let out = std::process::Command::new("systemctl")
            .args(["show", "-p", name, "--value", unit])
            .output()
            .expect("systemctl");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// The `systemd` driver against a real systemd (over the system bus) and
    /// the real cgroup hierarchies, with a sandbox of the real containerd
    /// (`SystemdCgroup = true`) in a pod's slice: run on a systemd node
    /// (hack/kind-e2e.sh runs it on its kind node, where the node's kubelet
    /// owns `kubepods.slice`, so this test keeps to a root of its own).
    #[test]
    #[ignore = "needs systemd, its system bus and containerd with SystemdCgroup (hack/kind-e2e.sh)"]
    fn systemd_driver_makes_limits_and_removes_the_kubelets_slices() {
        use crate::systemd::Systemd;
        // The kubelet's reading of a cgroupfs path: `rustlettest.slice`.
        let root = "/rustlettest";
        let systemd = Systemd::connect().expect("systemd on the system bus");
        assert!(systemd.has_quota_period(), "systemd {}", systemd.version());
        let m = CgroupManager::detect(Path::new("/sys/fs/cgroup"), root, "kubepods")
            .expect("cgroup hierarchies")
            .using_systemd(systemd.clone(), root, "kubepods");
        let v1 = m.version() == Version::V1;
        let mem_dir = m.memory.clone().unwrap();
        let cpu_dir = m.cpu.clone().unwrap();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            m.ensure_qos(Some(Limits {
                cpu_shares: 2048,
                cpu_quota: None,
                memory: Some(1 << 30),
            }))
            .unwrap();
            for unit in [
                "rustlettest.slice",
                "rustlettest-kubepods.slice",
                "rustlettest-kubepods-burstable.slice",
                "rustlettest-kubepods-besteffort.slice",
            ] {
                assert_eq!(
                    systemd.active_state(unit).unwrap().as_deref(),
                    Some("active"),
                    "{unit}"
                );
            }
            assert_eq!(
                m.qos_dir(QosClass::Burstable),
                Path::new(
                    "rustlettest.slice/rustlettest-kubepods.slice/rustlettest-kubepods-burstable.slice"
                )
            );
            let memory_prop = if v1 { "MemoryLimit" } else { "MemoryMax" };
            assert_eq!(
                systemctl_show("rustlettest-kubepods.slice", memory_prop),
                "1073741824"
            );
            assert_eq!(m.limits(&m.root).unwrap().memory, Some(1 << 30));
            assert_eq!(
                m.limits(&m.qos_dir(QosClass::BestEffort))
                    .unwrap()
                    .cpu_shares,
                2
            );
            m.set_burstable_shares(300).unwrap();
            assert_eq!(
                m.limits(&m.qos_dir(QosClass::Burstable))
                    .unwrap()
                    .cpu_shares,
                300
            );
            if v1 {
                assert_eq!(
                    systemctl_show("rustlettest-kubepods-burstable.slice", "CPUShares"),
                    "300"
                );
            }

            // A pod: its slice, named as the kubelet names it, with its limits
            // in systemd (the quota in whole 10 ms) and in the cgroup files.
            let limits = Limits {
                cpu_shares: 256,
                cpu_quota: Some(12_345),
                memory: Some(256 << 20),
            };
            let parent = m
                .ensure_pod(QosClass::Burstable, "0a1b-2c", limits, &NO_HUGE)
                .unwrap();
            let unit = "rustlettest-kubepods-burstable-pod0a1b_2c.slice";
            assert_eq!(
                parent,
                format!(
                    "/rustlettest.slice/rustlettest-kubepods.slice/rustlettest-kubepods-burstable.slice/{unit}"
                )
            );
            assert_eq!(
                systemd.active_state(unit).unwrap().as_deref(),
                Some("active")
            );
            assert_eq!(systemctl_show(unit, "CPUQuotaPerSecUSec"), "130ms");
            assert_eq!(
                systemctl_show(unit, memory_prop),
                (256u64 << 20).to_string()
            );
            let dir = m.pod_dir(QosClass::Burstable, "0a1b-2c").unwrap();
            let now = m.limits(&dir).unwrap();
            assert_eq!(now, limits);
            // As systemd writes the quota again (a daemon-reload), it is
            // still the pod's.
            let rounded = Limits {
                cpu_quota: Some(13_000),
                ..limits
            };
            assert_eq!(m.as_allocated(rounded, &limits), limits);
            assert_eq!(m.pods(), vec![(QosClass::Burstable, "0a1b-2c".to_string())]);
            assert_eq!(m.find_pod("0a1b-2c"), Some(dir.clone()));

            // containerd (SystemdCgroup) puts a sandbox given that parent in
            // a scope of the pod's slice.
            let sandbox = crate::cri::Runtime::connect(
                "unix:///run/containerd/containerd.sock",
                std::time::Duration::from_secs(60),
            );
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let runtime = rt.block_on(sandbox).expect("containerd");
            let config = k8s_cri::v1::PodSandboxConfig {
                metadata: Some(k8s_cri::v1::PodSandboxMetadata {
                    name: "systemd-driver".into(),
                    uid: "0a1b-2c".into(),
                    namespace: "rustlet-test".into(),
                    attempt: 0,
                }),
                linux: Some(k8s_cri::v1::LinuxPodSandboxConfig {
                    cgroup_parent: parent.clone(),
                    security_context: Some(k8s_cri::v1::LinuxSandboxSecurityContext {
                        namespace_options: Some(k8s_cri::v1::NamespaceOption {
                            network: k8s_cri::v1::NamespaceMode::Node.into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            };
            let id = rt
                .block_on(runtime.run_pod_sandbox(config, "", "systemd-driver"))
                .expect("RunPodSandbox");
            let scope = mem_dir
                .join(&dir)
                .join(format!("cri-containerd-{id}.scope"));
            let in_scope = std::fs::read_to_string(scope.join("cgroup.procs")).unwrap_or_default();
            let placed = !in_scope.trim().is_empty();
            // A pod slice with something in it is not stopped (that would
            // kill it): tried again later, as a busy directory.
            let busy = m.remove_pod(QosClass::Burstable, "0a1b-2c");
            let still = systemd.active_state(unit).unwrap();
            rt.block_on(runtime.stop_pod_sandbox(&id)).unwrap();
            rt.block_on(runtime.remove_pod_sandbox(&id)).unwrap();
            assert!(placed, "no process of sandbox {id} in {}", scope.display());
            assert!(
                busy.is_err(),
                "a pod slice with a sandbox in it was removed"
            );
            assert_eq!(still.as_deref(), Some("active"));

            // A resize: systemd and the files follow.
            let bigger = Limits {
                cpu_shares: 512,
                cpu_quota: Some(50_000),
                memory: Some(512 << 20),
            };
            m.update_pod(QosClass::Burstable, "0a1b-2c", bigger)
                .unwrap();
            assert_eq!(systemctl_show(unit, "CPUQuotaPerSecUSec"), "500ms");
            assert_eq!(
                systemctl_show(unit, memory_prop),
                (512u64 << 20).to_string()
            );
            assert_eq!(m.limits(&dir).unwrap(), bigger);

            // Gone: the slice stopped, its directories with it (once the
            // sandbox's scope has gone, as housekeeping tries again).
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while let Err(e) = m.remove_pod(QosClass::Burstable, "0a1b-2c") {
                assert!(std::time::Instant::now() < deadline, "{e}");
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            assert!(matches!(
                systemd.active_state(unit).unwrap().as_deref(),
                None | Some("inactive")
            ));
            assert!(
                !cpu_dir.join(&dir).exists(),
                "{}",
                cpu_dir.join(&dir).display()
            );
            assert!(m.pods().is_empty());
        }));
        let _ = m.remove_all();
        // The cgroup root is the host's: it stays (this test made it).
        assert!(m.remove_root());
        assert_eq!(
            systemd
                .active_state("rustlettest.slice")
                .unwrap()
                .as_deref(),
            Some("active")
        );
        let gone = |unit: &str| {
            matches!(
                systemd.active_state(unit).unwrap().as_deref(),
                None | Some("inactive")
            )
        };
        assert!(gone("rustlettest-kubepods.slice"));
        systemd.stop_unit("rustlettest.slice").unwrap();
        assert!(gone("rustlettest.slice"));
        assert!(!mem_dir.join("rustlettest.slice").exists());
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
    }
}
