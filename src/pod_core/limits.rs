//! A cgroup's cpu and memory limits, as the kubelet's `cm.ResourceConfig`:
//! what a pod's or a container's resources become in its cgroup, and the
//! comparison with what the kernel holds.

/// The CFS period of pod cgroups, microseconds (the kubelet's 100 ms).
pub const CPU_PERIOD_US: i64 = 100_000;

/// A cgroup's cpu and memory limits, as the kubelet's `ResourceConfig`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// `cpu.shares`.
    pub cpu_shares: u64,
    /// `cpu.cfs_quota_us` (None: no quota, `-1`).
    pub cpu_quota: Option<i64>,
    /// `memory.limit_in_bytes` (None: no limit, `-1`).
    pub memory: Option<i64>,
}

/// The page size the kernel rounds memory limits down to, bytes.
const PAGE_BYTES: i64 = 4096;

impl Limits {
    /// Whether limits read from a cgroup (`self`) are `wanted`: memory
    /// compared in whole pages, as the kernel keeps it; cpu not compared
    /// when none was read (shares of 0: no cpu hierarchy).
    #[must_use]
    pub fn same_as(&self, wanted: &Self) -> bool {
        let pages = |m: Option<i64>| m.map(|b| b / PAGE_BYTES);
        let cpu = self.cpu_shares == 0
            || (self.cpu_shares == wanted.cpu_shares && self.cpu_quota == wanted.cpu_quota);
        cpu && pages(self.memory) == pages(wanted.memory)
    }
}

/// The smallest `cpu.shares` (the kernel's and the kubelet's `MinShares`).
pub const MIN_SHARES: u64 = 2;
