//! Facts about this machine read from /proc, /sys and /etc (the kubelet reads
//! them through cAdvisor): cores, memory, the root dir's filesystem, kernel, OS,
//! machine and boot IDs.

use std::path::Path;

/// What the node reports about its machine.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MachineInfo {
    /// Logical CPUs.
    pub cpus: u64,
    /// Memory in bytes (MemTotal).
    pub memory_bytes: u64,
    /// Size of the filesystem holding the root dir, in bytes.
    pub ephemeral_storage_bytes: u64,
    /// Kernel release (`uname -r`).
    pub kernel_version: String,
    /// OS image (`PRETTY_NAME` of os-release).
    pub os_image: String,
    /// `/etc/machine-id`.
    pub machine_id: String,
    /// System UUID (DMI product UUID, or the machine ID when unreadable).
    pub system_uuid: String,
    /// Boot ID.
    pub boot_id: String,
    /// Huge page pools: (page size in KiB, pages), from /sys/kernel/mm/hugepages.
    pub huge_pages: Vec<(u64, u64)>,
    /// True when this process runs in a user namespace (its uid map is not
    /// the whole range), as runc's `RunningInUserNS`.
    pub in_user_namespace: bool,
}

/// The huge page pools under `dir` (`hugepages-<size>kB/nr_hugepages`):
/// (page size in KiB, pages), sorted by size.
#[must_use]
pub fn huge_pages(dir: &Path) -> Vec<(u64, u64)> {
    let mut pools: Vec<(u64, u64)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let kib = name
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            let pages = std::fs::read_to_string(e.path().join("nr_hugepages"))
                .ok()
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0);
            Some((kib, pages))
        })
        .collect();
    pools.sort_unstable();
    pools
}

/// True unless `uid_map` (of /proc/self) maps the whole uid range from 0.
#[must_use]
pub fn user_namespaced(uid_map: &str) -> bool {
    let fields: Vec<&str> = uid_map.split_whitespace().collect();
    !uid_map.is_empty() && fields != ["0", "0", "4294967295"]
}

fn read_trim(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// Parses `MemTotal` (kB) of /proc/meminfo text into bytes.
#[must_use]
pub fn mem_total_bytes(meminfo: &str) -> u64 {
    crate::stats::summary::meminfo_bytes(meminfo, "MemTotal").unwrap_or(0)
}

/// Reads `PRETTY_NAME` from os-release text.
#[must_use]
pub fn pretty_name(os_release: &str) -> String {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_else(|| "Linux".into())
}

impl MachineInfo {
    /// Reads the machine's facts; `root_dir` names the filesystem for ephemeral storage.
    /// Unreadable facts are left empty or zero.
    #[must_use]
    pub fn read(root_dir: &Path) -> Self {
        let machine_id = read_trim("/etc/machine-id");
        let uuid = read_trim("/sys/class/dmi/id/product_uuid");
        Self {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
            memory_bytes: mem_total_bytes(
                &std::fs::read_to_string("/proc/meminfo").unwrap_or_default(),
            ),
            ephemeral_storage_bytes: fs2::total_space(root_dir).unwrap_or(0),
            kernel_version: read_trim("/proc/sys/kernel/osrelease"),
            os_image: pretty_name(&std::fs::read_to_string("/etc/os-release").unwrap_or_default()),
            system_uuid: if uuid.is_empty() {
                machine_id.clone()
            } else {
                uuid
            },
            machine_id,
            boot_id: read_trim("/proc/sys/kernel/random/boot_id"),
            huge_pages: huge_pages(Path::new("/sys/kernel/mm/hugepages")),
            in_user_namespace: user_namespaced(
                &std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default(),
            ),
        }
    }
}

/// The node's swap, as the kubelet finds its swap controller
/// (`swapControllerAvailable`): `memory.memsw.limit_in_bytes` of the memory
/// hierarchy's root on cgroup v1, `memory.swap.max` of this process's own
/// cgroup on v2 (the unified root has none); `limited` is
/// `memorySwap.swapBehavior: LimitedSwap`.
#[must_use]
pub fn swap(limited: bool) -> crate::pod_core::facts::Swap {
    let root = Path::new("/sys/fs/cgroup");
    let cgroup_v2 = root.join("cgroup.controllers").is_file();
    let controller = if cgroup_v2 {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        unified_cgroup(&own).is_some_and(|p| {
            root.join(p.trim_start_matches('/'))
                .join("memory.swap.max")
                .exists()
        })
    } else {
        root.join("memory/memory.memsw.limit_in_bytes").exists()
    };
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    crate::pod_core::facts::Swap {
        controller,
        cgroup_v2,
        limited,
        capacity_bytes: crate::stats::summary::meminfo_bytes(&meminfo, "SwapTotal").unwrap_or(0),
    }
}

/// The path of the unified hierarchy's line (`0::<path>`) of a
/// `/proc/<pid>/cgroup` text.
#[must_use]
pub fn unified_cgroup(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::"))
}

/// The architecture as Kubernetes names it (`amd64`, `arm64`, …).
#[must_use]
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unified_cgroup_of_a_process() {
        let v2 = "0::/system.slice/rustlet.service\n";
        assert_eq!(unified_cgroup(v2), Some("/system.slice/rustlet.service"));
        let v1 = "12:memory:/user.slice\n11:pids:/user.slice\n";
        assert_eq!(unified_cgroup(v1), None);
        let hybrid = "1:name=systemd:/a\n0::/a\n";
        assert_eq!(unified_cgroup(hybrid), Some("/a"));
    }

    #[test]
    fn parses_meminfo_and_os_release() {
        assert_eq!(
            mem_total_bytes("MemTotal:       24576000 kB\nMemFree: 1 kB\n"),
            24_576_000 * 1024
        );
        assert_eq!(mem_total_bytes(""), 0);
        assert_eq!(
            pretty_name("NAME=x\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n"),
            "Debian GNU/Linux 12 (bookworm)"
        );
    }

    #[test]
    fn reads_huge_page_pools_and_user_namespaces() {
        let dir = tempfile::tempdir().unwrap();
        for (pool, n) in [("hugepages-2048kB", "3\n"), ("hugepages-1048576kB", "0\n")] {
            std::fs::create_dir(dir.path().join(pool)).unwrap();
            std::fs::write(dir.path().join(pool).join("nr_hugepages"), n).unwrap();
        }
        assert_eq!(huge_pages(dir.path()), vec![(2048, 3), (1_048_576, 0)]);
        assert!(huge_pages(&dir.path().join("none")).is_empty());
        assert!(!user_namespaced("         0          0 4294967295\n"));
        assert!(user_namespaced("         0     100000      65536\n"));
    }
}
