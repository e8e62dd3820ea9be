//! The machines of the kubelet's CPU manager unit tests
//! (pkg/kubelet/cm/cpumanager/policy_test.go), as [`CpuTopology`]s: each
//! CPU's NUMA node, socket, core and uncore cache.

use super::topology::CpuTopology;

/// A topology of `cpus` CPUs, each placed by `at(cpu) -> (numa, socket,
/// core, uncore)`.
pub fn machine(cpus: usize, at: impl Fn(usize) -> (usize, usize, usize, usize)) -> CpuTopology {
    let rows: Vec<(usize, usize, usize, usize, usize)> = (0..cpus)
        .map(|cpu| {
            let (numa, socket, core, uncore) = at(cpu);
            (cpu, numa, socket, core, uncore)
        })
        .collect();
    CpuTopology::from_rows(&rows)
}

/// `topoSingleSocketHT`: 1 socket, 4 cores of 2 threads; core `c` is
/// CPUs `c` and `c+4`.
pub fn single_socket_ht() -> CpuTopology {
    machine(8, |cpu| (0, 0, cpu % 4, 0))
}

/// `topoDualSocketHT`: 2 sockets (= NUMA nodes), 6 cores of 2 threads;
/// core `c` is CPUs `c` and `c+6`, on socket `c % 2`.
pub fn dual_socket_ht() -> CpuTopology {
    machine(12, |cpu| (cpu % 2, cpu % 2, cpu % 6, 0))
}

/// `topoDualSocketNoHT`: 2 sockets (= NUMA nodes) of 4 cores, one thread.
pub fn dual_socket_no_ht() -> CpuTopology {
    machine(8, |cpu| (cpu / 4, cpu / 4, cpu, 0))
}

/// `topoDualSocketMultiNumaPerSocketHT`: 2 sockets × 2 NUMA nodes × 10
/// cores × 2 threads; core `c` is CPUs `c` and `c+40`.
pub fn dual_socket_multi_numa_ht() -> CpuTopology {
    machine(80, |cpu| {
        let core = cpu % 40;
        (core / 10, core / 20, core, 0)
    })
}

/// `topoUncoreSingleSocketNoSMT`: 16 single-thread cores, 4 per uncore.
pub fn uncore_single_socket_no_smt() -> CpuTopology {
    machine(16, |cpu| (0, 0, cpu, cpu / 4))
}

/// `topoUncoreDualSocketNoSMT`: 2 sockets of 8 single-thread cores, one
/// NUMA node, 4 cores per uncore.
pub fn uncore_dual_socket_no_smt() -> CpuTopology {
    machine(16, |cpu| (0, cpu / 8, cpu, cpu / 4))
}

/// `topoUncoreSingleSocketSMT`: 8 cores of 2 threads (core `c` is CPUs `c`
/// and `c+8`), 4 cores per uncore.
pub fn uncore_single_socket_smt() -> CpuTopology {
    machine(16, |cpu| (0, 0, cpu % 8, (cpu % 8) / 4))
}

/// The reference machine: 2 sockets × 2 NUMA nodes × 8 cores × 2
/// threads; core `c` is CPUs `c` and `c+32`.
pub fn two_sockets_four_numa_nodes() -> CpuTopology {
    machine(64, |cpu| {
        let core = cpu % 32;
        (core / 8, core / 16, core, core / 8)
    })
}
