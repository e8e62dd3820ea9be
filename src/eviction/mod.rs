//! The eviction manager's decisions, as the kubelet's (pkg/kubelet/eviction):
//! the signals observed from the stats summary, the thresholds of
//! `evictionHard` and `evictionSoft` they meet, the node pressure conditions
//! that follow (held for `evictionPressureTransitionPeriod` after the last
//! time a threshold was met), which pod goes first when the node must reclaim
//! (`rankMemoryPressure`, `rankDiskPressureFunc`, `rankPIDPressure`) and the
//! message it is evicted with. Pure: time, stats and pods in, decisions out.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodSpec};

use crate::config::Threshold as Amount;
use crate::pod_core::fit::pod_requests;
use crate::stats::FsLayout;
use crate::stats::summary::{PodStats, Summary};

pub mod manager;
pub mod types;

pub use types::{Eviction, Images, Pods};

/// An eviction signal (`memory.available`, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Signal {
    /// `memory.available`: the node's memory less its working set.
    MemoryAvailable,
    /// `nodefs.available`: free bytes of the agent's root filesystem.
    NodefsAvailable,
    /// `nodefs.inodesFree`.
    NodefsInodesFree,
    /// `imagefs.available`: free bytes of the runtime's image filesystem.
    ImagefsAvailable,
    /// `imagefs.inodesFree`.
    ImagefsInodesFree,
    /// `containerfs.available`: free bytes of the filesystem of the
    /// containers' writable layers. Its thresholds are those of the
    /// filesystem that holds the layers ([`container_fs_thresholds`]).
    ContainerfsAvailable,
    /// `containerfs.inodesFree`.
    ContainerfsInodesFree,
    /// `allocatableMemory.available`: the memory of the pods' cgroup
    /// (`kubepods`) less its working set.
    AllocatableMemoryAvailable,
    /// `pid.available`: process IDs left.
    PidAvailable,
}

/// A node pressure condition type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pressure {
    /// `MemoryPressure`.
    Memory,
    /// `DiskPressure`.
    Disk,
    /// `PIDPressure`.
    Pid,
}

impl Pressure {
    /// The node condition type.
    #[must_use]
    pub fn condition_type(self) -> &'static str {
        match self {
            Self::Memory => crate::reasons::node::MEMORY_PRESSURE,
            Self::Disk => crate::reasons::node::DISK_PRESSURE,
            Self::Pid => crate::reasons::node::PID_PRESSURE,
        }
    }
}

/// The eviction manager's admission of a new pod under `pressures`, as its
/// `Admit`: everything passes without pressure, and critical pods always;
/// under memory pressure alone, pods that are not BestEffort and BestEffort
/// pods that tolerate the `node.kubernetes.io/memory-pressure` taint pass;
/// otherwise reason `Evicted`, message `The node had condition: [<types>]. `.
/// `kind` is the pod's, computed once per sync.
#[must_use]
pub fn admit(
    pod: &Pod,
    kind: crate::pod_core::kind::PodKind,
    pressures: &[Pressure],
) -> Option<crate::pod_core::admit::Rejection> {
    if pressures.is_empty() || kind.is_critical {
        return None;
    }
    if pressures == [Pressure::Memory] {
        if kind.qos != crate::pod_core::qos::QosClass::BestEffort {
            return None;
        }
        let taint = k8s_openapi::api::core::v1::Taint {
            key: "node.kubernetes.io/memory-pressure".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        let tolerations = pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_deref())
            .unwrap_or_default();
        if tolerations
            .iter()
            .any(|t| crate::pod_core::fit::tolerates(t, &taint))
        {
            return None;
        }
    }
    let types: Vec<&str> = pressures.iter().map(|p| p.condition_type()).collect();
    Some(crate::pod_core::admit::Rejection {
        reason: crate::reasons::pod::EVICTED.into(),
        message: format!("The node had condition: [{}]. ", types.join(" ")),
    })
}

impl Signal {
    /// Every signal, memory first (the kubelet's `byEvictionPriority`).
    pub const ALL: [Self; 9] = [
        Self::MemoryAvailable,
        Self::AllocatableMemoryAvailable,
        Self::NodefsAvailable,
        Self::NodefsInodesFree,
        Self::ImagefsAvailable,
        Self::ImagefsInodesFree,
        Self::ContainerfsAvailable,
        Self::ContainerfsInodesFree,
        Self::PidAvailable,
    ];

    /// The signal's name in the configuration.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::MemoryAvailable => "memory.available",
            Self::NodefsAvailable => "nodefs.available",
            Self::NodefsInodesFree => "nodefs.inodesFree",
            Self::ImagefsAvailable => "imagefs.available",
            Self::ImagefsInodesFree => "imagefs.inodesFree",
            Self::ContainerfsAvailable => "containerfs.available",
            Self::ContainerfsInodesFree => "containerfs.inodesFree",
            Self::AllocatableMemoryAvailable => "allocatableMemory.available",
            Self::PidAvailable => "pid.available",
        }
    }

    /// The signal of a configuration name.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The node condition the signal raises.
    #[must_use]
    pub fn pressure(self) -> Pressure {
        match self {
            Self::MemoryAvailable | Self::AllocatableMemoryAvailable => Pressure::Memory,
            Self::PidAvailable => Pressure::Pid,
            _ => Pressure::Disk,
        }
    }

    /// The starved resource the kubelet names (`memory`, `ephemeral-storage`,
    /// `inodes`, `pids`).
    #[must_use]
    pub fn resource(self) -> &'static str {
        match self {
            Self::MemoryAvailable | Self::AllocatableMemoryAvailable => "memory",
            Self::NodefsAvailable | Self::ImagefsAvailable | Self::ContainerfsAvailable => {
                "ephemeral-storage"
            }
            Self::NodefsInodesFree | Self::ImagefsInodesFree | Self::ContainerfsInodesFree => {
                "inodes"
            }
            Self::PidAvailable => "pids",
        }
    }

    /// True when the signal counts bytes (quantities print in binary units).
    fn bytes(self) -> bool {
        matches!(self.resource(), "memory" | "ephemeral-storage")
    }
}

/// One threshold: the signal is met when what is available falls below
/// `amount`. Hard when `grace` is zero.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    /// The signal.
    pub signal: Signal,
    /// The amount, or the share of capacity.
    pub amount: Amount,
    /// `evictionSoftGracePeriod`: how long it must be met before a pod is
    /// evicted (zero for `evictionHard`).
    pub grace: Duration,
    /// `evictionMinimumReclaim`: once met, it stays met until this much more
    /// than `amount` is available.
    pub min_reclaim: Option<Amount>,
}

impl Threshold {
    /// The amount in units (bytes, inodes, pids) for a signal whose capacity
    /// is `capacity`, as the kubelet's `GetThresholdQuantity`.
    #[must_use]
    pub fn quantity(&self, capacity: i128) -> i128 {
        resolve(self.amount, capacity)
    }

    /// True for an `evictionHard` threshold.
    #[must_use]
    pub fn is_hard(&self) -> bool {
        self.grace.is_zero()
    }
}

fn resolve(amount: Amount, capacity: i128) -> i128 {
    match amount {
        Amount::Quantity(q) => q.value(),
        Amount::Percent(p) => Amount::share_of(capacity, p),
    }
}

/// The thresholds of a configuration: `evictionHard`, then `evictionSoft`
/// with `evictionSoftGracePeriod`, each with its `evictionMinimumReclaim`.
/// A threshold of `0%`, `100%` or zero turns its signal off, as the kubelet's
/// `parseThresholdStatement`.
///
/// # Errors
/// An unknown signal (`unsupported eviction signal <name>`), an amount that
/// does not parse, or a soft threshold without a grace period (`grace period
/// must be specified for the soft eviction threshold <name>`).
pub fn thresholds(
    hard: &BTreeMap<String, String>,
    soft: &BTreeMap<String, String>,
    soft_grace: &BTreeMap<String, Duration>,
    min_reclaim: &BTreeMap<String, String>,
) -> Result<Vec<Threshold>, String> {
    let signal = |name: &str| {
        Signal::parse(name).ok_or_else(|| format!("unsupported eviction signal {name}"))
    };
    let reclaim = |name: &str| -> Result<Option<Amount>, String> {
        min_reclaim.get(name).map(|t| Amount::parse(t)).transpose()
    };
    let mut out = Vec::new();
    for (set, soft_set) in [(hard, false), (soft, true)] {
        for (name, text) in set {
            let s = signal(name)?;
            let amount = Amount::parse(text)?;
            if amount.is_off() {
                continue;
            }
            let grace = if soft_set {
                *soft_grace.get(name).ok_or_else(|| {
                    format!("grace period must be specified for the soft eviction threshold {name}")
                })?
            } else {
                Duration::ZERO
            };
            out.push(Threshold {
                signal: s,
                amount,
                grace,
                min_reclaim: reclaim(name)?,
            });
        }
    }
    Ok(out)
}

/// The eviction manager's thresholds and timings of `settings`, as the
/// kubelet's `ParseThresholdConfig` (with the allocatable thresholds when
/// `enforceNodeAllocatable` holds `pods`).
///
/// # Errors
/// A threshold the kubelet refuses, with its message.
pub fn limits(settings: &crate::config::Settings) -> Result<manager::Limits, String> {
    let thresholds = thresholds(
        &settings.reservations.eviction_hard,
        &settings.eviction.soft,
        &settings.eviction.soft_grace,
        &settings.eviction.minimum_reclaim,
    )?;
    let thresholds = if settings
        .enforce_node_allocatable
        .iter()
        .any(|e| e == "pods")
    {
        allocatable_thresholds(&thresholds)
    } else {
        thresholds
    };
    Ok(manager::Limits {
        thresholds,
        transition: settings.eviction.pressure_transition_period,
        max_pod_grace: settings.eviction.max_pod_grace_period,
    })
}

/// `thresholds` with an `allocatableMemory.available` copy of each hard
/// `memory.available` threshold, as the kubelet's `addAllocatableThresholds`
/// does when `enforceNodeAllocatable` holds `pods`.
#[must_use]
pub fn allocatable_thresholds(thresholds: &[Threshold]) -> Vec<Threshold> {
    let copies = thresholds
        .iter()
        .filter(|t| t.signal == Signal::MemoryAvailable && t.is_hard())
        .map(|t| Threshold {
            signal: Signal::AllocatableMemoryAvailable,
            ..*t
        });
    thresholds.iter().copied().chain(copies).collect::<Vec<_>>()
}

/// `thresholds` with the `containerfs.*` ones made from those of the
/// filesystem that holds the writable layers in `layout`, as the kubelet's
/// `UpdateContainerFsThresholds`: the node's (`nodefs.*`) on one filesystem
/// and in a split layout, the image filesystem's (`imagefs.*`) when images
/// and layers share a filesystem of their own; hard and soft alike, with
/// their minimum reclaim. A `containerfs.*` threshold of the configuration
/// gives way; the second value names the last one that did, in the
/// kubelet's words (`found containerfs.available for hard eviction.
/// ignoring`).
#[must_use]
pub fn container_fs_thresholds(
    thresholds: &[Threshold],
    layout: FsLayout,
) -> (Vec<Threshold>, Option<String>) {
    let (bytes, inodes) = match layout {
        FsLayout::DedicatedImageFs => (Signal::ImagefsAvailable, Signal::ImagefsInodesFree),
        FsLayout::Shared | FsLayout::Split => (Signal::NodefsAvailable, Signal::NodefsInodesFree),
    };
    let mut ignored = None;
    let mut out: Vec<Threshold> = Vec::new();
    for t in thresholds {
        if matches!(
            t.signal,
            Signal::ContainerfsAvailable | Signal::ContainerfsInodesFree
        ) {
            let kind = if t.is_hard() { "hard" } else { "soft" };
            ignored = Some(format!(
                "found {} for {kind} eviction. ignoring",
                t.signal.name()
            ));
            continue;
        }
        out.push(*t);
    }
    let copies: Vec<Threshold> = out
        .iter()
        .filter_map(|t| {
            let signal = if t.signal == bytes {
                Signal::ContainerfsAvailable
            } else if t.signal == inodes {
                Signal::ContainerfsInodesFree
            } else {
                return None;
            };
            Some(Threshold { signal, ..*t })
        })
        .collect();
    out.extend(copies);
    (out, ignored)
}

/// What the eviction manager reclaims at node level for a disk `signal` in
/// `layout` before it evicts a pod, as the kubelet's
/// `buildSignalToNodeReclaimFuncs`: (dead containers, unused images).
/// On one filesystem both for every disk signal; with a dedicated image
/// filesystem both for `imagefs.*` and `containerfs.*`, nothing for
/// `nodefs.*` (it holds logs and volumes only); split, containers for
/// `nodefs.*` and `containerfs.*`, images for `imagefs.*`.
#[must_use]
pub fn node_reclaim(signal: Signal, layout: FsLayout) -> (bool, bool) {
    if signal.pressure() != Pressure::Disk {
        return (false, false);
    }
    let image_fs = matches!(signal, Signal::ImagefsAvailable | Signal::ImagefsInodesFree);
    match layout {
        FsLayout::Shared => (true, true),
        FsLayout::DedicatedImageFs => {
            let on_image_fs = !matches!(signal, Signal::NodefsAvailable | Signal::NodefsInodesFree);
            (on_image_fs, on_image_fs)
        }
        FsLayout::Split => (!image_fs, image_fs),
    }
}

/// What is available of a signal and out of how much, and when it was seen
/// (stats time, seconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Observation {
    /// Available units.
    pub available: i128,
    /// Capacity in units.
    pub capacity: i128,
    /// When the stats were taken (Unix nanoseconds).
    pub time: i64,
}

/// The signals the summary shows, as the kubelet's `makeSignalObservations`:
/// memory from the node's available bytes and working set (less the huge
/// page pools, `hugepages_bytes`), allocatable memory from the pods'
/// cgroup (the `pods` system container), the node's, image and container
/// filesystems from their stats, pids from the rlimits. A signal without
/// stats is left out.
#[must_use]
pub fn observe(summary: &Summary, hugepages_bytes: u64) -> BTreeMap<Signal, Observation> {
    let mut out = BTreeMap::new();
    let n = &summary.node;
    if let Some(m) = n.memory.as_ref()
        && let (Some(avail), Some(ws)) = (m.available_bytes, m.working_set_bytes)
    {
        let available = i128::from(avail)
            .saturating_sub(i128::from(hugepages_bytes))
            .max(0);
        out.insert(
            Signal::MemoryAvailable,
            Observation {
                available,
                capacity: i128::from(avail).saturating_add(i128::from(ws)),
                time: m.time.0,
            },
        );
    }
    let pods = n.system_containers.iter().find(|c| c.name == "pods");
    if let Some(m) = pods.and_then(|c| c.memory.as_ref())
        && let (Some(avail), Some(ws)) = (m.available_bytes, m.working_set_bytes)
    {
        out.insert(
            Signal::AllocatableMemoryAvailable,
            Observation {
                available: avail.into(),
                capacity: i128::from(avail).saturating_add(i128::from(ws)),
                time: m.time.0,
            },
        );
    }
    let image_fs = n.runtime.as_ref().and_then(|r| r.image_fs.as_ref());
    let container_fs = n.runtime.as_ref().and_then(|r| r.container_fs.as_ref());
    for (fs, bytes, inodes) in [
        (
            n.fs.as_ref(),
            Signal::NodefsAvailable,
            Signal::NodefsInodesFree,
        ),
        (
            image_fs,
            Signal::ImagefsAvailable,
            Signal::ImagefsInodesFree,
        ),
        (
            container_fs,
            Signal::ContainerfsAvailable,
            Signal::ContainerfsInodesFree,
        ),
    ] {
        let Some(fs) = fs else { continue };
        if let (Some(a), Some(c)) = (fs.available_bytes, fs.capacity_bytes) {
            out.insert(
                bytes,
                Observation {
                    available: a.into(),
                    capacity: c.into(),
                    time: fs.time.0,
                },
            );
        }
        if let (Some(a), Some(c)) = (fs.inodes_free, fs.inodes) {
            out.insert(
                inodes,
                Observation {
                    available: a.into(),
                    capacity: c.into(),
                    time: fs.time.0,
                },
            );
        }
    }
    if let Some(r) = n.rlimit.as_ref()
        && let (Some(max), Some(cur)) = (r.maxpid, r.curproc)
    {
        out.insert(
            Signal::PidAvailable,
            Observation {
                available: i128::from(max).saturating_sub(i128::from(cur)),
                capacity: max.into(),
                time: r.time.0,
            },
        );
    }
    out
}

/// The thresholds `observations` meet (grace periods not considered), as
/// `thresholdsMet`: available below the amount, or, for a threshold met
/// before (`was_met`), below the amount plus its minimum reclaim.
#[must_use]
pub fn met(
    thresholds: &[Threshold],
    observations: &BTreeMap<Signal, Observation>,
    was_met: &[Threshold],
) -> Vec<Threshold> {
    thresholds
        .iter()
        .filter(|t| {
            let Some(o) = observations.get(&t.signal) else {
                return false;
            };
            let mut want = t.quantity(o.capacity);
            if was_met.contains(t)
                && let Some(r) = t.min_reclaim
            {
                want = want.saturating_add(resolve(r, o.capacity));
            }
            o.available < want
        })
        .copied()
        .collect()
}

/// The manager's memory between cycles: when each threshold was first met,
/// when each pressure was last seen, and the thresholds met last time.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// Threshold (by index in the configuration) → when it was first met.
    first_met: BTreeMap<usize, Duration>,
    /// Pressure → the last time a threshold raising it was met.
    last_pressure: BTreeMap<Pressure, Duration>,
    /// The thresholds met in the last cycle.
    was_met: Vec<Threshold>,
    /// The stats time of each signal in the last cycle: a threshold drives
    /// an eviction only on newer stats (`thresholdsUpdatedStats`).
    last_seen: BTreeMap<Signal, i64>,
}

/// What one cycle decided.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cycle {
    /// The node conditions to report True.
    pub pressures: Vec<Pressure>,
    /// The threshold to reclaim for now (its grace period passed, its stats
    /// are new), memory first; None: evict nothing.
    pub reclaim: Option<Threshold>,
}

impl State {
    /// One cycle of `synchronize` at `now` (time since the manager started):
    /// the thresholds met now, the pressures held for `transition` after
    /// they were last met, and the threshold a pod is to be evicted for.
    pub fn cycle(
        &mut self,
        now: Duration,
        thresholds: &[Threshold],
        observations: &BTreeMap<Signal, Observation>,
        transition: Duration,
    ) -> Cycle {
        let met_now = met(thresholds, observations, &self.was_met);
        let index = |t: &Threshold| thresholds.iter().position(|x| x == t);
        let met_idx: Vec<usize> = met_now.iter().filter_map(index).collect();
        self.first_met.retain(|i, _| met_idx.contains(i));
        for &i in &met_idx {
            self.first_met.entry(i).or_insert(now);
        }
        for t in &met_now {
            self.last_pressure.insert(t.signal.pressure(), now);
        }
        let pressures: Vec<Pressure> = self
            .last_pressure
            .iter()
            .filter(|(p, seen)| {
                now.saturating_sub(**seen) < transition
                    || met_now.iter().any(|t| t.signal.pressure() == **p)
            })
            .map(|(p, _)| *p)
            .collect();
        self.last_pressure.retain(|p, _| pressures.contains(p));
        let due: Vec<Threshold> = met_now
            .iter()
            .filter(|t| {
                index(t)
                    .and_then(|i| self.first_met.get(&i))
                    .is_some_and(|first| now.saturating_sub(*first) >= t.grace)
            })
            .filter(|t| {
                let time = observations.get(&t.signal).map(|o| o.time);
                let last = self.last_seen.get(&t.signal).copied();
                time.is_some_and(|now| last.is_none_or(|last| now > last))
            })
            .copied()
            .collect();
        self.was_met = met_now;
        let reclaim = Signal::ALL
            .iter()
            .find_map(|s| due.iter().find(|t| t.signal == *s))
            .copied();
        for (signal, o) in observations {
            self.last_seen.insert(*signal, o.time);
        }
        Cycle { pressures, reclaim }
    }
}

/// The grace period, seconds, of a pod evicted for `threshold`, as the
/// eviction manager's `gracePeriodOverride`: 1 s for a hard threshold
/// (`immediateEvictionGracePeriodSeconds`); for a soft one
/// `evictionMaxPodGracePeriod` (`max_pod_grace`), or the pod's own
/// `terminationGracePeriodSeconds` when that is shorter.
#[must_use]
pub fn grace_period(threshold: &Threshold, max_pod_grace: i64, pod: &Pod) -> i64 {
    if threshold.is_hard() {
        return crate::pod_core::spec::EVICTION_GRACE_SECONDS;
    }
    let own = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds);
    own.map_or(max_pod_grace, |own| own.min(max_pod_grace))
}

/// The usage of a pod that ranks it for `signal` in `layout`, from its
/// `stats`, as `buildSignalToRankFunc`: the working set for memory; for the
/// disk signals the bytes (inodes for the inode signals) the pod holds on
/// the signal's filesystem. On one filesystem that is its writable layers,
/// logs and local volumes for every disk signal; with a dedicated image
/// filesystem its logs and volumes for `nodefs.*` and its writable layers
/// for `imagefs.*` and `containerfs.*`; split, all of it for `nodefs.*` and
/// `containerfs.*` and nothing for `imagefs.*` (images are not counted per
/// pod).
fn usage(signal: Signal, stats: &PodStats, layout: FsLayout) -> Option<i128> {
    let inodes = signal.resource() == "inodes";
    let used = |fs: Option<&crate::stats::summary::FsStats>| {
        fs.and_then(|f| if inodes { f.inodes_used } else { f.used_bytes })
            .map(i128::from)
    };
    match signal {
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => stats
            .memory
            .and_then(|m| m.working_set_bytes)
            .map(i128::from),
        Signal::PidAvailable => None,
        _ => {
            let total = used(stats.ephemeral_storage.as_ref())?;
            let layers = stats
                .containers
                .iter()
                .filter_map(|c| used(c.rootfs.as_ref()))
                .fold(0i128, i128::saturating_add);
            let rest = total.saturating_sub(layers).max(0);
            let node_fs = matches!(signal, Signal::NodefsAvailable | Signal::NodefsInodesFree);
            let image_fs = matches!(signal, Signal::ImagefsAvailable | Signal::ImagefsInodesFree);
            Some(match layout {
                FsLayout::Shared => total,
                FsLayout::DedicatedImageFs if node_fs => rest,
                FsLayout::DedicatedImageFs => layers,
                FsLayout::Split if image_fs => 0,
                FsLayout::Split => total,
            })
        }
    }
}

/// The pod's request of the resource `signal` starves (memory or
/// ephemeral-storage bytes; none for inodes and pids).
fn request(signal: Signal, pod: &Pod) -> i128 {
    let name = signal.resource();
    if !matches!(name, "memory" | "ephemeral-storage") {
        return 0;
    }
    pod_requests(pod).get(name).map_or(0, |q| q.value())
}

/// `pods` in the order the kubelet evicts them for `signal`: pods without
/// stats first, then those using more than they requested, then lower
/// priority, then the larger use above the request (`rankMemoryPressure`,
/// `rankDiskPressureFunc`, usage as [`FsLayout`] places it); for pids
/// lower priority first (`rankPIDPressure`, without process counts here).
#[must_use]
pub fn rank<'a>(
    signal: Signal,
    pods: &[&'a Pod],
    summary: &Summary,
    layout: FsLayout,
) -> Vec<&'a Pod> {
    let stats_of = |p: &Pod| {
        let uid = p.metadata.uid.as_deref().unwrap_or_default();
        summary.pods.iter().find(|s| s.pod_ref.uid == uid)
    };
    let priority = |p: &Pod| p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
    let mut keyed: Vec<(bool, bool, i32, i128, &Pod)> = pods
        .iter()
        .map(|p| {
            let used = stats_of(p).and_then(|s| usage(signal, s, layout));
            let req = request(signal, p);
            let above = used.map_or(0, |u| u.saturating_sub(req));
            (
                used.is_some() || signal == Signal::PidAvailable,
                used.is_none_or(|u| u <= req),
                priority(p),
                -above,
                *p,
            )
        })
        .collect();
    keyed.sort_by_key(|k| (k.0, k.1, k.2, k.3));
    keyed.into_iter().map(|k| k.4).collect()
}

/// `n` units of `signal` as the kubelet prints them: bytes in the largest
/// binary unit that divides them (`100Mi`), counts as they are.
fn show(signal: Signal, n: i128) -> String {
    if signal.bytes() {
        u64::try_from(n).map_or_else(|_| n.to_string(), crate::config::binary_quantity)
    } else {
        n.to_string()
    }
}

/// The message a pod is evicted with, as the kubelet's `evictionMessage`:
/// `The node was low on resource: <resource>. `, then `Threshold quantity:
/// <q>, available: <a>. `, then for memory and ephemeral storage one
/// `Container <name> was using <usage>, request is <request>, has larger
/// consumption of <resource>. ` per container using more than it requested.
/// Each piece ends with a space, as the kubelet's.
///
/// With it, the annotations of the `Evicted` event (none when the summary
/// has no stats of the pod): `starved_resource` (the resource), and
/// `offending_containers` and `offending_containers_usage`, the containers
/// named in the message and their usage, comma-separated.
#[must_use]
pub fn message(
    threshold: &Threshold,
    observation: Option<&Observation>,
    pod: &Pod,
    summary: &Summary,
) -> (String, BTreeMap<String, String>) {
    let signal = threshold.signal;
    let resource = signal.resource();
    let mut out = format!("The node was low on resource: {resource}. ");
    if let Some(o) = observation {
        out.push_str(&format!(
            "Threshold quantity: {}, available: {}. ",
            show(signal, threshold.quantity(o.capacity)),
            show(signal, o.available)
        ));
    }
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let Some(stats) = summary.pods.iter().find(|s| s.pod_ref.uid == uid) else {
        return (out, BTreeMap::new());
    };
    let name = match signal.resource() {
        r @ ("memory" | "ephemeral-storage") => r,
        _ => "",
    };
    let over = match pod.spec.as_ref() {
        Some(spec) if !name.is_empty() => over_request(name, spec, stats),
        _ => Vec::new(),
    };
    let mut offending: Vec<&str> = Vec::new();
    let mut usage: Vec<String> = Vec::new();
    for (container, used, req) in over {
        let shown = show(Signal::MemoryAvailable, used);
        out.push_str(&format!(
            "Container {container} was using {shown}, request is {}, has larger consumption of {name}. ",
            show(Signal::MemoryAvailable, req)
        ));
        offending.push(container);
        usage.push(shown);
    }
    let annotations = BTreeMap::from([
        (OFFENDING_CONTAINERS.to_string(), offending.join(",")),
        (OFFENDING_CONTAINERS_USAGE.to_string(), usage.join(",")),
        (STARVED_RESOURCE.to_string(), resource.to_string()),
    ]);
    (out, annotations)
}

/// The containers of `spec` (regular and init) whose use of `resource`
/// (`memory`: working set; `ephemeral-storage`: writable layer and logs)
/// in `stats` is above their request, in the order of `stats`: (name,
/// usage, request), bytes.
fn over_request<'a>(
    resource: &str,
    spec: &PodSpec,
    stats: &'a PodStats,
) -> Vec<(&'a str, i128, i128)> {
    let mut out = Vec::new();
    for c in &stats.containers {
        let Some(container) = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .find(|x| x.name == c.name)
        else {
            continue;
        };
        let used = if resource == "memory" {
            c.memory.and_then(|m| m.working_set_bytes).map(i128::from)
        } else {
            match (
                c.rootfs.and_then(|r| r.used_bytes),
                c.logs.and_then(|l| l.used_bytes),
            ) {
                (Some(r), Some(l)) => Some(i128::from(r).saturating_add(i128::from(l))),
                _ => None,
            }
        };
        let req = container
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(resource))
            .and_then(|q| crate::resource::Quantity::parse(&q.0).ok())
            .map_or(0, |q| q.value());
        if let Some(used) = used
            && used > req
        {
            out.push((c.name.as_str(), used, req));
        }
    }
    out
}

/// The `Evicted` event's annotation naming the containers that used more
/// than they requested (the kubelet's `OffendingContainersKey`).
pub const OFFENDING_CONTAINERS: &str = "offending_containers";
/// The annotation with those containers' usage (`OffendingContainersUsageKey`).
pub const OFFENDING_CONTAINERS_USAGE: &str = "offending_containers_usage";
/// The annotation naming the resource the node ran low on (`StarvedResourceKey`).
pub const STARVED_RESOURCE: &str = "starved_resource";

/// The first local storage limit `pod` exceeds, as the kubelet's
/// `localStorageEviction` checks them, with the message it is evicted with:
/// an emptyDir over its `sizeLimit` (memory-backed ones are left to the
/// kernel), `Usage of EmptyDir volume "<name>" exceeds the limit "<limit>". `;
/// the pod's use over its containers' summed ephemeral-storage limits,
/// `Pod ephemeral local storage usage exceeds the total limit of containers
/// <limit>. `; a container's logs and writable layer over its own limit,
/// `Container <name> exceeded its local ephemeral storage limit "<limit>". `
/// (its writable layer counts only when it is on the node's filesystem,
/// [`FsLayout::Shared`]).
#[must_use]
pub fn local_storage_violation(pod: &Pod, stats: &PodStats, layout: FsLayout) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let parse = |q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| {
        crate::resource::Quantity::parse_saturating(&q.0)
            .ok()
            .map(|v| v.value())
    };
    for v in spec.volumes.iter().flatten() {
        let Some(dir) = v.empty_dir.as_ref() else {
            continue;
        };
        if dir.medium.as_deref() == Some("Memory") {
            continue;
        }
        let Some(limit) = dir.size_limit.as_ref() else {
            continue;
        };
        let Some(max) = parse(limit).filter(|m| *m > 0) else {
            continue;
        };
        let used = stats
            .volume
            .iter()
            .find(|s| s.name == v.name)
            .and_then(|s| s.fs.used_bytes)
            .map(i128::from);
        if used.is_some_and(|u| u > max) {
            return Some(format!(
                "Usage of EmptyDir volume \"{}\" exceeds the limit \"{}\". ",
                v.name, limit.0
            ));
        }
    }
    let limit_of = |c: &k8s_openapi::api::core::v1::Container| {
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("ephemeral-storage"))
            .and_then(parse)
    };
    // The pod's limit as `PodLimits`: sidecars, init containers and
    // overhead included.
    let pod_limit = crate::pod_core::fit::pod_limits(pod)
        .get("ephemeral-storage")
        .map(|q| q.value());
    if let Some(total) = pod_limit {
        let used = stats
            .ephemeral_storage
            .and_then(|e| e.used_bytes)
            .map(i128::from);
        if used.is_some_and(|u| u > total) {
            return Some(format!(
                "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                show(Signal::NodefsAvailable, total)
            ));
        }
    }
    let with_limits = spec.containers.iter().chain(
        spec.init_containers
            .iter()
            .flatten()
            .filter(|c| crate::pod_core::spec::is_sidecar(c)),
    );
    for c in with_limits {
        let Some(max) = limit_of(c).filter(|m| *m > 0) else {
            continue;
        };
        let Some(cs) = stats.containers.iter().find(|s| s.name == c.name) else {
            continue;
        };
        let layer = cs.rootfs.filter(|_| layout == FsLayout::Shared);
        let used = [cs.logs, layer]
            .iter()
            .flatten()
            .filter_map(|f| f.used_bytes)
            .fold(0i128, |s, v| s.saturating_add(i128::from(v)));
        if used > max {
            let text = c
                .resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get("ephemeral-storage"))
                .map(|q| q.0.clone())
                .unwrap_or_default();
            return Some(format!(
                "Container {} exceeded its local ephemeral storage limit \"{text}\". ",
                c.name
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #[test]
    fn local_storage_limits_evict_in_the_kubelet_words() {
        use crate::stats::summary::VolumeStats;
        use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, Volume};
        let mut p = pod("writer").container("c", "busybox").build();
        let spec = p.spec.as_mut().unwrap();
        let dir = |medium: Option<&str>| EmptyDirVolumeSource {
            medium: medium.map(str::to_string),
            size_limit: Some(Quantity("100Mi".into())),
            ..Default::default()
        };
        spec.volumes = Some(vec![
            Volume {
                name: "mem".into(),
                empty_dir: Some(dir(Some("Memory"))),
                ..Default::default()
            },
            Volume {
                name: "scratch".into(),
                empty_dir: Some(dir(None)),
                ..Default::default()
            },
        ]);
        let fs = |used: u64| FsStats {
            used_bytes: Some(used),
            ..Default::default()
        };
        let mut stats = PodStats {
            volume: vec![
                VolumeStats {
                    fs: fs(200 << 20),
                    name: "mem".into(),
                    pvc_ref: None,
                },
                VolumeStats {
                    fs: fs(50 << 20),
                    name: "scratch".into(),
                    pvc_ref: None,
                },
            ],
            containers: vec![ContainerStats {
                name: "c".into(),
                rootfs: Some(fs(30 << 20)),
                logs: Some(fs(30 << 20)),
                ..Default::default()
            }],
            ephemeral_storage: Some(fs(110 << 20)),
            ..Default::default()
        };
        assert_eq!(
            local_storage_violation(&p, &stats, FsLayout::Shared),
            None,
            "memory-backed: the kernel's"
        );
        stats.volume[1].fs.used_bytes = Some(101 << 20);
        assert_eq!(
            local_storage_violation(&p, &stats, FsLayout::Shared).as_deref(),
            Some("Usage of EmptyDir volume \"scratch\" exceeds the limit \"100Mi\". ")
        );
        stats.volume[1].fs.used_bytes = Some(1);
        p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "ephemeral-storage".to_string(),
                Quantity("100Mi".into()),
            )])),
            ..Default::default()
        });
        assert_eq!(
            local_storage_violation(&p, &stats, FsLayout::Shared).as_deref(),
            Some("Pod ephemeral local storage usage exceeds the total limit of containers 100Mi. ")
        );
        stats.ephemeral_storage = Some(fs(90 << 20));
        p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "ephemeral-storage".to_string(),
                Quantity("50Mi".into()),
            )])),
            ..Default::default()
        });
        stats.ephemeral_storage = Some(fs(40 << 20));
        assert_eq!(
            local_storage_violation(&p, &stats, FsLayout::Shared).as_deref(),
            Some("Container c exceeded its local ephemeral storage limit \"50Mi\". ")
        );
    }

    #[test]
    fn a_pods_storage_limit_counts_its_sidecars_as_the_kubelets_pod_limits() {
        let limit = |q: &str| ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "ephemeral-storage".to_string(),
                Quantity(q.into()),
            )])),
            ..Default::default()
        };
        let mut p = pod("p")
            .container("c", "busybox")
            .sidecar("s", "busybox")
            .build();
        let spec = p.spec.as_mut().unwrap();
        spec.containers[0].resources = Some(limit("100Mi"));
        spec.init_containers.as_mut().unwrap()[0].resources = Some(limit("100Mi"));
        let fs = |used: u64| FsStats {
            used_bytes: Some(used),
            ..Default::default()
        };
        let mut stats = PodStats {
            ephemeral_storage: Some(fs(150 << 20)),
            ..Default::default()
        };
        assert_eq!(
            local_storage_violation(&p, &stats, FsLayout::Shared),
            None,
            "200Mi in all"
        );
        stats.ephemeral_storage = Some(fs(201 << 20));
        assert_eq!(
            local_storage_violation(&p, &stats, FsLayout::Shared).as_deref(),
            Some("Pod ephemeral local storage usage exceeds the total limit of containers 200Mi. ")
        );
    }

    #[test]
    fn percentages_resolve_as_the_kubelets_float32_fractions() {
        assert_eq!(Amount::share_of(1 << 30, 10.0), 107_374_184);
        assert_eq!(Amount::share_of(1000, 15.0), 150);
        let hard = map(&[
            ("memory.available", "100%"),
            ("containerfs.available", "10%"),
            ("allocatableMemory.available", "1Gi"),
        ]);
        let t = thresholds(&hard, &BTreeMap::new(), &BTreeMap::new(), &BTreeMap::new()).unwrap();
        let signals: Vec<Signal> = t.iter().map(|t| t.signal).collect();
        assert_eq!(
            signals,
            [
                Signal::AllocatableMemoryAvailable,
                Signal::ContainerfsAvailable
            ],
            "100% is off; the other signals are read"
        );
    }

    use super::*;
    use crate::fixtures::pod;
    use crate::stats::summary::{
        ContainerStats, FsStats, MemoryStats, NodeStats, PodReference, RlimitStats, Time,
    };
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    const MI: i128 = 1024 * 1024;

    #[test]
    fn hard_evictions_take_a_second_soft_ones_the_shorter_of_the_maximum_and_the_pods_own() {
        let hard = map(&[("memory.available", "100Mi")]);
        let soft = map(&[("nodefs.available", "15%")]);
        let grace = BTreeMap::from([("nodefs.available".to_string(), Duration::from_secs(60))]);
        let t = thresholds(&hard, &soft, &grace, &BTreeMap::new()).unwrap();
        let mut p = pod("p").container("c", "img").build();
        assert_eq!(grace_period(&t[0], 30, &p), 1);
        assert_eq!(
            grace_period(&t[1], 30, &p),
            30,
            "no grace period of its own"
        );
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(10);
        assert_eq!(grace_period(&t[1], 30, &p), 10);
        assert_eq!(grace_period(&t[1], 0, &p), 0, "the default maximum, 0");
    }

    #[test]
    fn thresholds_are_read_as_the_kubelet_reads_them() {
        let hard = map(&[("memory.available", "100Mi"), ("nodefs.available", "0%")]);
        let soft = map(&[("nodefs.available", "15%")]);
        let grace = BTreeMap::from([("nodefs.available".to_string(), Duration::from_secs(60))]);
        let reclaim = map(&[("memory.available", "50Mi")]);
        let t = thresholds(&hard, &soft, &grace, &reclaim).unwrap();
        assert_eq!(t.len(), 2, "0% turns a signal off: {t:?}");
        assert!(t[0].is_hard() && t[0].signal == Signal::MemoryAvailable);
        assert_eq!(t[0].quantity(0), 100 * MI);
        assert_eq!(t[1].grace, Duration::from_secs(60));
        assert_eq!(t[1].quantity(1000), 150);
        let err = thresholds(
            &map(&[("memory.free", "1Mi")]),
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
        );
        assert_eq!(err.unwrap_err(), "unsupported eviction signal memory.free");
        let err = thresholds(&BTreeMap::new(), &soft, &BTreeMap::new(), &BTreeMap::new());
        assert_eq!(
            err.unwrap_err(),
            "grace period must be specified for the soft eviction threshold nodefs.available"
        );
    }

    fn summary(mem_available: u64, time: i64) -> Summary {
        Summary {
            node: NodeStats {
                memory: Some(MemoryStats {
                    time: Time(time),
                    available_bytes: Some(mem_available),
                    working_set_bytes: Some(1 << 30),
                    ..Default::default()
                }),
                fs: Some(FsStats {
                    time: Time(time),
                    available_bytes: Some(500),
                    capacity_bytes: Some(1000),
                    inodes_free: Some(90),
                    inodes: Some(100),
                    ..Default::default()
                }),
                rlimit: Some(RlimitStats {
                    time: Time(time),
                    maxpid: Some(4096),
                    curproc: Some(96),
                }),
                ..Default::default()
            },
            pods: vec![],
        }
    }

    #[test]
    fn under_pressure_only_what_memory_pressure_allows_is_admitted() {
        let best_effort = pod("be").container("c", "busybox").build();
        let (burstable, _) = hog("burst", 0, 10, 0);
        assert_eq!(
            admit(
                &best_effort,
                crate::pod_core::kind::PodKind::of(&best_effort),
                &[]
            ),
            None
        );
        let r = admit(
            &best_effort,
            crate::pod_core::kind::PodKind::of(&best_effort),
            &[Pressure::Memory],
        )
        .expect("refused");
        assert_eq!(r.reason, "Evicted");
        assert_eq!(r.message, "The node had condition: [MemoryPressure]. ");
        assert_eq!(
            admit(
                &burstable,
                crate::pod_core::kind::PodKind::of(&burstable),
                &[Pressure::Memory]
            ),
            None
        );
        let r = admit(
            &burstable,
            crate::pod_core::kind::PodKind::of(&burstable),
            &[Pressure::Memory, Pressure::Disk],
        )
        .expect("refused");
        assert_eq!(
            r.message,
            "The node had condition: [MemoryPressure DiskPressure]. "
        );
        let mut tolerant = best_effort.clone();
        tolerant.spec.as_mut().unwrap().tolerations =
            Some(vec![k8s_openapi::api::core::v1::Toleration {
                key: Some("node.kubernetes.io/memory-pressure".into()),
                operator: Some("Exists".into()),
                effect: Some("NoSchedule".into()),
                ..Default::default()
            }]);
        assert_eq!(
            admit(
                &tolerant,
                crate::pod_core::kind::PodKind::of(&tolerant),
                &[Pressure::Memory]
            ),
            None
        );
        let mut critical = best_effort.clone();
        critical.spec.as_mut().unwrap().priority = Some(2_000_000_000);
        assert_eq!(
            admit(
                &critical,
                crate::pod_core::kind::PodKind::of(&critical),
                &[Pressure::Pid]
            ),
            None
        );
    }

    #[test]
    fn signals_come_from_the_summary() {
        let o = observe(&summary(200 << 20, 7), 64 << 20);
        let m = o[&Signal::MemoryAvailable];
        assert_eq!(m.available, 136 * MI, "huge pages are not available");
        assert_eq!(m.capacity, 200 * MI + 1024 * MI);
        assert_eq!(o[&Signal::NodefsAvailable].available, 500);
        assert_eq!(o[&Signal::NodefsInodesFree].capacity, 100);
        assert_eq!(o[&Signal::PidAvailable].available, 4000);
        assert!(!o.contains_key(&Signal::ImagefsAvailable));
    }

    #[test]
    fn pressure_starts_at_once_evicts_after_grace_and_clears_after_the_transition() {
        let soft = map(&[("memory.available", "300Mi")]);
        let grace = BTreeMap::from([("memory.available".to_string(), Duration::from_secs(30))]);
        let reclaim = map(&[("memory.available", "100Mi")]);
        let t = thresholds(&BTreeMap::new(), &soft, &grace, &reclaim).unwrap();
        let transition = Duration::from_secs(60);
        let mut st = State::default();
        let secs = Duration::from_secs;
        let low = |time| observe(&summary(200 << 20, time), 0);
        // Met: the condition is True at once, but no eviction before the grace period.
        let c = st.cycle(secs(0), &t, &low(1), transition);
        assert_eq!(
            (c.pressures.clone(), c.reclaim),
            (vec![Pressure::Memory], None)
        );
        let c = st.cycle(secs(30), &t, &low(2), transition);
        assert_eq!(c.reclaim.map(|t| t.signal), Some(Signal::MemoryAvailable));
        // The same stats again drive no second eviction.
        assert_eq!(st.cycle(secs(40), &t, &low(2), transition).reclaim, None);
        // 350Mi available: above the threshold but not above it plus the
        // minimum reclaim, so still met.
        let c = st.cycle(
            secs(50),
            &t,
            &observe(&summary(350 << 20, 3), 0),
            transition,
        );
        assert_eq!(c.pressures, vec![Pressure::Memory]);
        // 500Mi: no longer met, but the condition holds for the transition period.
        let high = |time| observe(&summary(500 << 20, time), 0);
        let c = st.cycle(secs(60), &t, &high(4), transition);
        assert_eq!(
            (c.pressures.clone(), c.reclaim),
            (vec![Pressure::Memory], None)
        );
        assert_eq!(
            st.cycle(secs(109), &t, &high(5), transition).pressures,
            vec![Pressure::Memory]
        );
        assert!(
            st.cycle(secs(111), &t, &high(6), transition)
                .pressures
                .is_empty()
        );
    }

    fn hog(name: &str, priority: i32, request_mi: i64, used_mi: u64) -> (Pod, PodStats) {
        let mut p = pod(name).container("c", "busybox").build();
        if let Some(spec) = p.spec.as_mut() {
            spec.priority = Some(priority);
            if request_mi > 0 {
                spec.containers[0].resources = Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "memory".to_string(),
                        Quantity(format!("{request_mi}Mi")),
                    )])),
                    ..Default::default()
                });
            }
        }
        let mem = MemoryStats {
            working_set_bytes: Some(used_mi << 20),
            ..Default::default()
        };
        let stats = PodStats {
            pod_ref: PodReference {
                name: name.into(),
                namespace: "default".into(),
                uid: format!("uid-{name}"),
            },
            containers: vec![ContainerStats {
                name: "c".into(),
                memory: Some(mem),
                ..Default::default()
            }],
            memory: Some(mem),
            ..Default::default()
        };
        (p, stats)
    }

    #[test]
    fn pods_over_their_request_and_of_lower_priority_go_first() {
        let (guaranteed, g) = hog("guaranteed", 0, 300, 290);
        let (low, l) = hog("low", 0, 0, 100);
        let (high, h) = hog("high", 1000, 0, 500);
        let (bigger, b) = hog("bigger", 0, 0, 200);
        let s = Summary {
            pods: vec![g, l, h, b],
            ..Default::default()
        };
        let order: Vec<&str> = rank(
            Signal::MemoryAvailable,
            &[&guaranteed, &high, &low, &bigger],
            &s,
            FsLayout::Shared,
        )
        .iter()
        .map(|p| p.metadata.name.as_deref().unwrap_or_default())
        .collect();
        assert_eq!(order, ["bigger", "low", "high", "guaranteed"]);

        let t = thresholds(
            &map(&[("memory.available", "100Mi")]),
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
        )
        .unwrap();
        let o = Observation {
            available: 52_012 * 1024,
            capacity: 0,
            time: 0,
        };
        let (text, annotations) = message(&t[0], Some(&o), &bigger, &s);
        assert_eq!(
            text,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 52012Ki. Container c was using 200Mi, request is 0, has larger consumption of memory. "
        );
        let expected = |containers: &str, usage: &str| {
            BTreeMap::from([
                (OFFENDING_CONTAINERS.to_string(), containers.to_string()),
                (OFFENDING_CONTAINERS_USAGE.to_string(), usage.to_string()),
                (STARVED_RESOURCE.to_string(), "memory".to_string()),
            ])
        };
        assert_eq!(annotations, expected("c", "200Mi"));
        let (text, annotations) = message(&t[0], Some(&o), &guaranteed, &s);
        assert_eq!(
            text,
            "The node was low on resource: memory. Threshold quantity: 100Mi, available: 52012Ki. "
        );
        assert_eq!(annotations, expected("", ""));
        // No stats of the pod: no annotations, as the kubelet's.
        let none = message(&t[0], Some(&o), &bigger, &Summary::default());
        assert!(none.1.is_empty());
    }

    fn threshold(signal: Signal, amount: &str, grace_secs: u64) -> Threshold {
        Threshold {
            signal,
            amount: Amount::parse(amount).unwrap(),
            grace: Duration::from_secs(grace_secs),
            min_reclaim: Some(Amount::parse("1Gi").unwrap()),
        }
    }

    #[test]
    fn allocatable_memory_copies_each_hard_memory_threshold() {
        let given = [
            threshold(Signal::MemoryAvailable, "100Mi", 0),
            threshold(Signal::MemoryAvailable, "1Gi", 30),
            threshold(Signal::ImagefsAvailable, "150Mi", 0),
        ];
        let got = allocatable_thresholds(&given);
        assert_eq!(got[..3], given, "the configured ones first, unchanged");
        assert_eq!(
            got[3..],
            [threshold(Signal::AllocatableMemoryAvailable, "100Mi", 0)],
            "only the hard memory threshold is copied, with its minimum reclaim"
        );
    }

    #[test]
    fn containerfs_thresholds_follow_the_filesystem_of_the_writable_layers() {
        let given = [
            threshold(Signal::NodefsAvailable, "10%", 0),
            threshold(Signal::NodefsInodesFree, "5%", 0),
            threshold(Signal::ImagefsAvailable, "15%", 0),
            threshold(Signal::ImagefsAvailable, "20%", 60),
            threshold(Signal::MemoryAvailable, "100Mi", 0),
        ];
        let copies = |layout| {
            let (all, ignored) = container_fs_thresholds(&given, layout);
            assert_eq!(all[..given.len()], given, "{layout:?}: the others stay");
            assert_eq!(ignored, None);
            all[given.len()..].to_vec()
        };
        let node = vec![
            threshold(Signal::ContainerfsAvailable, "10%", 0),
            threshold(Signal::ContainerfsInodesFree, "5%", 0),
        ];
        assert_eq!(copies(FsLayout::Shared), node);
        assert_eq!(copies(FsLayout::Split), node);
        assert_eq!(
            copies(FsLayout::DedicatedImageFs),
            [
                threshold(Signal::ContainerfsAvailable, "15%", 0),
                threshold(Signal::ContainerfsAvailable, "20%", 60),
            ],
            "hard and soft, as the image filesystem's"
        );
        // Configured containerfs thresholds give way, in the kubelet's words
        // (the last one named).
        let mut own = given.to_vec();
        own.push(threshold(Signal::ContainerfsAvailable, "50%", 0));
        own.push(threshold(Signal::ContainerfsInodesFree, "50%", 30));
        let (all, ignored) = container_fs_thresholds(&own, FsLayout::Split);
        assert_eq!(all[..given.len()], given);
        assert_eq!(all[given.len()..], node);
        assert_eq!(
            ignored.as_deref(),
            Some("found containerfs.inodesFree for soft eviction. ignoring")
        );
    }

    #[test]
    fn node_level_reclaim_is_what_the_signals_filesystem_holds() {
        use FsLayout::{DedicatedImageFs, Shared, Split};
        use Signal::*;
        let both = (true, true);
        let none = (false, false);
        let containers = (true, false);
        let images = (false, true);
        for (signal, shared, dedicated, split) in [
            (NodefsAvailable, both, none, containers),
            (NodefsInodesFree, both, none, containers),
            (ImagefsAvailable, both, both, images),
            (ImagefsInodesFree, both, both, images),
            (ContainerfsAvailable, both, both, containers),
            (ContainerfsInodesFree, both, both, containers),
            (MemoryAvailable, none, none, none),
            (AllocatableMemoryAvailable, none, none, none),
            (PidAvailable, none, none, none),
        ] {
            assert_eq!(node_reclaim(signal, Shared), shared, "{signal:?}");
            assert_eq!(
                node_reclaim(signal, DedicatedImageFs),
                dedicated,
                "{signal:?}"
            );
            assert_eq!(node_reclaim(signal, Split), split, "{signal:?}");
        }
    }

    /// A pod whose writable layer holds `layer_mi` and whose logs and
    /// volumes hold `rest_mi` (inodes likewise, in thousands).
    fn disk_user(name: &str, priority: i32, layer_mi: u64, rest_mi: u64) -> (Pod, PodStats) {
        let (p, mut stats) = hog(name, priority, 0, 0);
        let fs = |mi: u64| FsStats {
            used_bytes: Some(mi << 20),
            inodes_used: Some(mi * 1000),
            ..Default::default()
        };
        stats.containers[0].rootfs = Some(fs(layer_mi));
        stats.ephemeral_storage = Some(fs(layer_mi + rest_mi));
        (p, stats)
    }

    #[test]
    fn disk_rankings_count_what_the_signals_filesystem_holds_of_each_pod() {
        let (layers, l) = disk_user("layers", 0, 500, 10);
        let (logs, g) = disk_user("logs", 0, 10, 300);
        let (important, i) = disk_user("important", 100, 0, 0);
        let s = Summary {
            pods: vec![l, g, i],
            ..Default::default()
        };
        let order = |signal, layout| -> Vec<String> {
            rank(signal, &[&important, &logs, &layers], &s, layout)
                .iter()
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect()
        };
        use FsLayout::{DedicatedImageFs, Shared, Split};
        use Signal::*;
        for (signal, layout, want) in [
            (NodefsAvailable, Shared, ["layers", "logs", "important"]),
            (ImagefsAvailable, Shared, ["layers", "logs", "important"]),
            (
                NodefsAvailable,
                DedicatedImageFs,
                ["logs", "layers", "important"],
            ),
            (
                NodefsInodesFree,
                DedicatedImageFs,
                ["logs", "layers", "important"],
            ),
            (
                ImagefsAvailable,
                DedicatedImageFs,
                ["layers", "logs", "important"],
            ),
            (
                ContainerfsAvailable,
                DedicatedImageFs,
                ["layers", "logs", "important"],
            ),
            (NodefsAvailable, Split, ["layers", "logs", "important"]),
            (
                ContainerfsInodesFree,
                Split,
                ["layers", "logs", "important"],
            ),
            // Images are not counted per pod: priority alone, then the
            // order given.
            (ImagefsAvailable, Split, ["logs", "layers", "important"]),
        ] {
            assert_eq!(order(signal, layout), want, "{signal:?} {layout:?}");
        }
    }

    #[test]
    fn a_containers_writable_layer_counts_toward_its_limit_on_the_nodes_filesystem_only() {
        let mut p = pod("big").container("c", "busybox").build();
        if let Some(spec) = p.spec.as_mut() {
            spec.containers[0].resources = Some(ResourceRequirements {
                limits: Some(BTreeMap::from([(
                    "ephemeral-storage".to_string(),
                    Quantity("100Mi".into()),
                )])),
                ..Default::default()
            });
        }
        let fs = |mi: u64| FsStats {
            used_bytes: Some(mi << 20),
            ..Default::default()
        };
        let stats = PodStats {
            containers: vec![ContainerStats {
                name: "c".into(),
                rootfs: Some(fs(90)),
                logs: Some(fs(20)),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            local_storage_violation(&p, &stats, FsLayout::Shared).as_deref(),
            Some("Container c exceeded its local ephemeral storage limit \"100Mi\". ")
        );
        for layout in [FsLayout::DedicatedImageFs, FsLayout::Split] {
            assert_eq!(
                local_storage_violation(&p, &stats, layout),
                None,
                "{layout:?}"
            );
        }
    }

    #[test]
    fn containerfs_and_allocatable_memory_are_observed() {
        use crate::stats::summary::RuntimeStats;
        let fs = |avail: u64, cap: u64, time: i64| FsStats {
            time: Time(time),
            available_bytes: Some(avail),
            capacity_bytes: Some(cap),
            inodes_free: Some(avail / 1000),
            inodes: Some(cap / 1000),
            ..Default::default()
        };
        let s = Summary {
            node: NodeStats {
                runtime: Some(RuntimeStats {
                    image_fs: Some(fs(7_000, 10_000, 3)),
                    container_fs: Some(fs(2_000, 5_000, 4)),
                }),
                system_containers: vec![ContainerStats {
                    name: "pods".into(),
                    memory: Some(MemoryStats {
                        time: Time(5),
                        available_bytes: Some(300 << 20),
                        working_set_bytes: Some(700 << 20),
                        ..Default::default()
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            },
            ..Default::default()
        };
        let o = observe(&s, 0);
        let seen = |signal| o.get(&signal).map(|o| (o.available, o.capacity, o.time));
        assert_eq!(seen(Signal::ImagefsAvailable), Some((7_000, 10_000, 3)));
        assert_eq!(seen(Signal::ContainerfsAvailable), Some((2_000, 5_000, 4)));
        assert_eq!(seen(Signal::ContainerfsInodesFree), Some((2, 5, 4)));
        assert_eq!(
            seen(Signal::AllocatableMemoryAvailable),
            Some((300 << 20, 1000 << 20, 5))
        );
        assert_eq!(seen(Signal::MemoryAvailable), None, "no node memory stats");
    }
}
