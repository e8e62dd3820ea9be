//! The machine's CPU topology, as the kubelet's `cpumanager/topology`
//! (`Discover` over cAdvisor's machine info): for each logical CPU its
//! socket, NUMA node, physical core and uncore (last-level) cache, read from
//! sysfs. The allocation of exclusive CPUs ([`super::assignment`]) works over
//! this, so it is plain data any machine can be described with.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::cpuset::CpuSet;

/// Errors reading the topology from sysfs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A sysfs file could not be read.
    #[error("read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// A sysfs file held something else than a number or a CPU list.
    #[error("parse {path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What was wrong.
        message: String,
    },
    /// No CPU was found online.
    #[error("no online CPU under {0}")]
    NoCpus(String),
}

/// Where one logical CPU sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuInfo {
    /// Its NUMA node.
    pub numa: usize,
    /// Its socket (physical package).
    pub socket: usize,
    /// Its physical core, unique across the machine: the lowest CPU ID of
    /// its hyper-thread siblings (the kubelet's `getUniqueCoreID`).
    pub core: usize,
    /// Its uncore (last-level) cache, unique across the machine; the
    /// socket's when sysfs names no L3 cache.
    pub uncore: usize,
}

/// The machine's logical CPUs, by ID (the kubelet's `CPUTopology` with its
/// `CPUDetails`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuTopology {
    /// Each online CPU.
    pub cpus: BTreeMap<usize, CpuInfo>,
}

impl CpuTopology {
    /// Builds a topology from `(cpu, numa, socket, core, uncore)` rows.
    #[must_use]
    pub fn from_rows(rows: &[(usize, usize, usize, usize, usize)]) -> Self {
        Self {
            cpus: rows
                .iter()
                .map(|&(cpu, numa, socket, core, uncore)| {
                    (
                        cpu,
                        CpuInfo {
                            numa,
                            socket,
                            core,
                            uncore,
                        },
                    )
                })
                .collect(),
        }
    }

    /// Every CPU.
    #[must_use]
    pub fn all(&self) -> CpuSet {
        self.cpus.keys().copied().collect()
    }

    /// The number of logical CPUs.
    #[must_use]
    pub fn num_cpus(&self) -> usize {
        self.cpus.len()
    }

    fn distinct(&self, f: impl Fn(&CpuInfo) -> usize) -> BTreeSet<usize> {
        self.cpus.values().map(f).collect()
    }

    /// The number of physical cores.
    #[must_use]
    pub fn num_cores(&self) -> usize {
        self.distinct(|c| c.core).len()
    }

    /// The number of sockets.
    #[must_use]
    pub fn num_sockets(&self) -> usize {
        self.distinct(|c| c.socket).len()
    }

    /// The NUMA nodes, lowest first.
    #[must_use]
    pub fn numa_nodes(&self) -> Vec<usize> {
        self.distinct(|c| c.numa).into_iter().collect()
    }

    /// The number of uncore caches.
    #[must_use]
    pub fn num_uncore(&self) -> usize {
        self.distinct(|c| c.uncore).len()
    }

    /// Logical CPUs per physical core (1 without hyper-threading; at least 1).
    #[must_use]
    pub fn cpus_per_core(&self) -> usize {
        (self.num_cpus() / self.num_cores().max(1)).max(1)
    }

    /// Logical CPUs per socket (at least 1).
    #[must_use]
    pub fn cpus_per_socket(&self) -> usize {
        (self.num_cpus() / self.num_sockets().max(1)).max(1)
    }

    /// Logical CPUs per NUMA node (at least 1).
    #[must_use]
    pub fn cpus_per_numa(&self) -> usize {
        (self.num_cpus() / self.numa_nodes().len().max(1)).max(1)
    }

    /// Logical CPUs per uncore cache (at least 1).
    #[must_use]
    pub fn cpus_per_uncore(&self) -> usize {
        (self.num_cpus() / self.num_uncore().max(1)).max(1)
    }

    /// The CPUs of `set` whose `key` is `value`.
    #[must_use]
    pub fn select(&self, set: &CpuSet, key: impl Fn(&CpuInfo) -> usize, value: usize) -> CpuSet {
        set.iter()
            .filter(|c| self.cpus.get(c).is_some_and(|i| key(i) == value))
            .collect()
    }

    /// The CPUs of NUMA nodes `nodes`.
    #[must_use]
    pub fn cpus_in_numa_nodes(&self, nodes: &[usize]) -> CpuSet {
        self.cpus
            .iter()
            .filter(|(_, i)| nodes.contains(&i.numa))
            .map(|(c, _)| *c)
            .collect()
    }

    /// The NUMA nodes the CPUs of `set` sit on.
    #[must_use]
    pub fn numa_nodes_of(&self, set: &CpuSet) -> Vec<usize> {
        let nodes: BTreeSet<usize> = set
            .iter()
            .filter_map(|c| self.cpus.get(&c).map(|i| i.numa))
            .collect();
        nodes.into_iter().collect()
    }

    /// Reads the topology of the machine from sysfs under `sys` (`/sys`):
    /// the online CPUs (`devices/system/cpu/online`), each one's package
    /// and hyper-thread siblings (`cpuN/topology/physical_package_id`,
    /// `thread_siblings_list`), its L3 cache (`cpuN/cache/index3/id`, when
    /// there is one), and the NUMA nodes' CPU lists
    /// (`devices/system/node/nodeN/cpulist`; node 0 for every CPU when the
    /// kernel has none).
    ///
    /// # Errors
    /// A file that must exist cannot be read or parsed; no CPU is online.
    pub fn discover(sys: &Path) -> Result<Self, Error> {
        let cpu_dir = sys.join("devices/system/cpu");
        let online = CpuSet::parse(&read(&cpu_dir.join("online"))?).map_err(|e| Error::Parse {
            path: cpu_dir.join("online").display().to_string(),
            message: e.to_string(),
        })?;
        if online.is_empty() {
            return Err(Error::NoCpus(cpu_dir.display().to_string()));
        }
        let mut numa_of = BTreeMap::new();
        let node_dir = sys.join("devices/system/node");
        if let Ok(entries) = std::fs::read_dir(&node_dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let Some(id) = name
                    .strip_prefix("node")
                    .and_then(|n| n.parse::<usize>().ok())
                else {
                    continue;
                };
                let path = entry.path().join("cpulist");
                for cpu in parse_list(&path)?.iter() {
                    numa_of.insert(cpu, id);
                }
            }
        }
        let mut cpus = BTreeMap::new();
        for cpu in online.iter() {
            let topo = cpu_dir.join(format!("cpu{cpu}/topology"));
            let socket = parse_number(&topo.join("physical_package_id"))?;
            let siblings = parse_list(&topo.join("thread_siblings_list"))?;
            let core = siblings.iter().next().unwrap_or(cpu).min(cpu);
            let l3 = cpu_dir.join(format!("cpu{cpu}/cache/index3/id"));
            let uncore = if l3.exists() {
                parse_number(&l3)?
            } else {
                socket
            };
            cpus.insert(
                cpu,
                CpuInfo {
                    numa: numa_of.get(&cpu).copied().unwrap_or(0),
                    socket,
                    core,
                    uncore,
                },
            );
        }
        Ok(Self { cpus })
    }
}

/// The machine's NUMA nodes for the topology manager, with their distances
/// (`devices/system/node/nodeN/distance`, needed with `distances`, the
/// `prefer-closest-numa-nodes` option).
///
/// # Errors
/// A distance file that must be read cannot be, or is not numbers.
pub fn numa_info(
    sys: &Path,
    topo: &CpuTopology,
    distances: bool,
) -> Result<crate::topology_manager::NumaInfo, Error> {
    let nodes = topo.numa_nodes();
    let mut info = crate::topology_manager::NumaInfo {
        nodes: nodes.clone(),
        distances: BTreeMap::new(),
    };
    if !distances {
        return Ok(info);
    }
    for node in nodes {
        let path = sys.join(format!("devices/system/node/node{node}/distance"));
        let text = read(&path)?;
        let row: Result<Vec<u64>, _> = text.split_whitespace().map(str::parse).collect();
        let row = row.map_err(|_| Error::Parse {
            path: path.display().to_string(),
            message: format!("{:?} is not a list of distances", text.trim()),
        })?;
        info.distances.insert(node, row);
    }
    Ok(info)
}

fn read(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.display().to_string(),
        source,
    })
}

fn parse_list(path: &Path) -> Result<CpuSet, Error> {
    CpuSet::parse(&read(path)?).map_err(|e| Error::Parse {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

fn parse_number(path: &Path) -> Result<usize, Error> {
    let text = read(path)?;
    let text = text.trim();
    // A package ID of -1 (an unknown package) counts as package 0.
    if text == "-1" {
        return Ok(0);
    }
    text.parse().map_err(|_| Error::Parse {
        path: path.display().to_string(),
        message: format!("{text:?} is not a number"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn a_two_socket_hyper_threaded_machine_is_read_from_sysfs() {
        // 2 sockets × 2 cores × 2 threads; siblings are i and i+4; one NUMA
        // node and one L3 per socket.
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "devices/system/cpu/online", "0-7\n");
        for cpu in 0..8 {
            let socket = (cpu % 4) / 2;
            let core = cpu % 4;
            let base = format!("devices/system/cpu/cpu{cpu}");
            write(
                root,
                &format!("{base}/topology/physical_package_id"),
                &format!("{socket}\n"),
            );
            write(
                root,
                &format!("{base}/topology/thread_siblings_list"),
                &format!("{core},{}\n", core + 4),
            );
            write(
                root,
                &format!("{base}/cache/index3/id"),
                &format!("{socket}\n"),
            );
        }
        write(root, "devices/system/node/node0/cpulist", "0-1,4-5\n");
        write(root, "devices/system/node/node1/cpulist", "2-3,6-7\n");
        write(root, "devices/system/node/possible", "0-1\n");
        let t = CpuTopology::discover(root).unwrap();
        assert_eq!(t.num_cpus(), 8);
        assert_eq!(t.num_cores(), 4);
        assert_eq!(t.num_sockets(), 2);
        assert_eq!(t.numa_nodes(), [0, 1]);
        assert_eq!(t.cpus_per_core(), 2);
        assert_eq!(
            t.cpus[&6],
            CpuInfo {
                numa: 1,
                socket: 1,
                core: 2,
                uncore: 1
            }
        );
        assert_eq!(t.cpus_in_numa_nodes(&[1]).to_string(), "2-3,6-7");
    }

    #[test]
    fn a_machine_without_numa_or_l3_in_sysfs_is_one_node() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "devices/system/cpu/online", "0-1\n");
        for cpu in 0..2 {
            let base = format!("devices/system/cpu/cpu{cpu}/topology");
            write(root, &format!("{base}/physical_package_id"), "0\n");
            write(
                root,
                &format!("{base}/thread_siblings_list"),
                &format!("{cpu}\n"),
            );
        }
        let t = CpuTopology::discover(root).unwrap();
        assert_eq!(t.numa_nodes(), [0]);
        assert_eq!(t.num_cores(), 2);
        assert_eq!(t.cpus[&1].uncore, 0);
        // A file that is not a number is named.
        write(
            root,
            "devices/system/cpu/cpu1/topology/physical_package_id",
            "x\n",
        );
        let e = CpuTopology::discover(root).unwrap_err().to_string();
        assert!(e.contains("cpu1/topology/physical_package_id"), "{e}");
    }

    #[test]
    fn this_machines_topology_is_read() {
        let t = CpuTopology::discover(Path::new("/sys")).unwrap();
        assert!(t.num_cpus() >= 1);
        assert_eq!(t.all().len(), t.num_cpus());
    }
}
