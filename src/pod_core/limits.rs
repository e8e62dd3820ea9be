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

/// Huge page limits of a cgroup: bytes allowed per page size in bytes, as
/// the kubelet's `ResourceConfig.HugePageLimit`.
pub type HugePageLimits = std::collections::BTreeMap<u64, u64>;

/// The limit the kubelet's QoS container manager gives the `burstable` and
/// `besteffort` cgroups for every page size (`setHugePagesUnbounded`), bytes.
pub const UNBOUNDED_HUGE_PAGES: u64 = 1 << 62;

/// The page size of resource `hugepages-<size>` in bytes, as
/// `HugePageSizeFromResourceName` (None for another resource, or a size
/// that is not a positive whole quantity).
#[must_use]
pub fn huge_page_size(resource: &str) -> Option<u64> {
    size_of(resource.strip_prefix("hugepages-")?)
}

/// The page size of an emptyDir medium `HugePages-<size>` in bytes, as
/// `HugePageSizeFromMedium` (None for another medium or a bad size).
#[must_use]
pub fn huge_page_size_of_medium(medium: &str) -> Option<u64> {
    size_of(medium.strip_prefix("HugePages-")?)
}

fn size_of(quantity: &str) -> Option<u64> {
    let q = crate::resource::Quantity::parse(quantity).ok()?;
    u64::try_from(q.value()).ok().filter(|v| *v > 0)
}

/// A page size in bytes as cgroup file names spell it (`2MB`, `1GB`), as the
/// kubelet's `HugePageUnitSizeFromByteSize`: divided by 1024 while it
/// divides evenly; None when what is left is over 1024 of a unit below the
/// largest (no cgroup names such a size).
#[must_use]
pub fn huge_page_unit(bytes: u64) -> Option<String> {
    const UNITS: [&str; 6] = ["B", "KB", "MB", "GB", "TB", "PB"];
    let (mut size, mut idx) = (bytes, 0);
    while size != 0 && size.is_multiple_of(1024) && idx < UNITS.len() - 1 {
        size /= 1024;
        idx += 1;
    }
    if size > 1024 && idx < UNITS.len() - 1 {
        return None;
    }
    Some(format!("{size}{}", UNITS[idx]))
}

/// The huge page limits of a resource list (a pod's requests), as the
/// kubelet's `HugePageLimits`: each `hugepages-<size>` amount in bytes by its
/// page size, amounts of one size added up (saturating); negative or
/// unparsable amounts count as none.
#[must_use]
pub fn huge_page_limits<'a>(
    list: impl IntoIterator<Item = (&'a String, &'a crate::resource::Quantity)>,
) -> HugePageLimits {
    let mut out = HugePageLimits::new();
    for (name, q) in list {
        let Some(size) = huge_page_size(name) else {
            continue;
        };
        let v = q.value();
        let amount = u64::try_from(v).unwrap_or(if v < 0 { 0 } else { u64::MAX });
        let sum = out.entry(size).or_default();
        *sum = sum.saturating_add(amount);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::Quantity;

    #[test]
    fn huge_page_names_are_the_kubelets() {
        assert_eq!(huge_page_size("hugepages-2Mi"), Some(2 << 20));
        assert_eq!(huge_page_size("hugepages-1Gi"), Some(1 << 30));
        assert_eq!(huge_page_size("hugepages-0"), None);
        assert_eq!(huge_page_size("memory"), None);
        assert_eq!(huge_page_size_of_medium("HugePages-2Mi"), Some(2 << 20));
        assert_eq!(huge_page_size_of_medium("HugePages"), None);
        assert_eq!(huge_page_unit(2 << 20).as_deref(), Some("2MB"));
        assert_eq!(huge_page_unit(1 << 30).as_deref(), Some("1GB"));
        assert_eq!(huge_page_unit(64 << 10).as_deref(), Some("64KB"));
        assert_eq!(huge_page_unit(16 << 30).as_deref(), Some("16GB"));
        // 1025 KiB cannot be named in a larger unit.
        assert_eq!(huge_page_unit(1025 << 10), None);
        assert_eq!(huge_page_unit(0).as_deref(), Some("0B"));
    }

    /// Amounts a pod controls, however large or odd, add up without
    /// overflow; negative ones count as none.
    #[test]
    fn hostile_huge_page_amounts_saturate() {
        let q = |s: &str| Quantity::parse_saturating(s).unwrap();
        let list = [
            ("hugepages-2Mi".to_string(), q("9000000Ei")),
            ("hugepages-2048Ki".to_string(), q("9000000Ei")),
            ("hugepages-1Gi".to_string(), q("-5Gi")),
            ("hugepages-99999999999999Ei".to_string(), q("1")),
        ];
        let limits = huge_page_limits(list.iter().map(|(k, v)| (k, v)));
        assert_eq!(limits[&(2 << 20)], u64::MAX);
        assert_eq!(limits[&(1 << 30)], 0);
        assert_eq!(limits.len(), 2, "{limits:?}");
    }

    #[test]
    fn huge_page_limits_add_up_by_page_size() {
        let q = |s: &str| Quantity::parse(s).unwrap();
        let list = [
            ("hugepages-2Mi".to_string(), q("4Mi")),
            ("hugepages-2048Ki".to_string(), q("2Mi")),
            ("hugepages-1Gi".to_string(), q("1Gi")),
            ("memory".to_string(), q("1Gi")),
        ];
        let limits = huge_page_limits(list.iter().map(|(k, v)| (k, v)));
        assert_eq!(
            limits,
            HugePageLimits::from([(2 << 20, 6 << 20), (1 << 30, 1 << 30)])
        );
    }
}
