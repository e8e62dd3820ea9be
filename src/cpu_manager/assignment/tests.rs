//! The allocation, table-tested with the cases of the kubelet's
//! `TestTakeByTopologyNUMAPacked` and `TestTakeByTopologyNUMADistributed`.

use super::*;
use crate::cpu_manager::fixtures::*;

fn set(list: &str) -> CpuSet {
    CpuSet::parse(list).unwrap()
}

#[test]
fn packed_takes_whole_places_first_as_the_kubelet() {
    let cases: Vec<(&str, CpuTopology, &str, usize, bool, &str)> = vec![
        (
            "a free core's sibling last",
            single_socket_ht(),
            "1,3,5,6,7",
            1,
            false,
            "6",
        ),
        ("a whole core", single_socket_ht(), "0-7", 2, false, "0,4"),
        (
            "the half-used core first",
            single_socket_ht(),
            "0-3,6",
            2,
            false,
            "2,6",
        ),
        (
            "a whole socket",
            dual_socket_ht(),
            "0-11",
            6,
            false,
            "0,2,4,6,8,10",
        ),
        (
            "a single CPU of the fullest socket",
            dual_socket_ht(),
            "1-5,7-11",
            1,
            false,
            "2",
        ),
        (
            "uncore: the first uncore's free CPU",
            dual_socket_ht(),
            "1-5,7-11",
            1,
            true,
            "1",
        ),
        (
            "a socket and a core",
            dual_socket_ht(),
            "0-11",
            8,
            false,
            "0-2,4,6-8,10",
        ),
        (
            "a NUMA node",
            dual_socket_multi_numa_ht(),
            "0-79",
            20,
            false,
            "0-9,40-49",
        ),
        (
            "a socket",
            dual_socket_multi_numa_ht(),
            "0-79",
            40,
            false,
            "0-19,40-59",
        ),
        (
            "a socket and a NUMA node",
            dual_socket_multi_numa_ht(),
            "0-79",
            60,
            false,
            "0-29,40-69",
        ),
        (
            "around a used core",
            dual_socket_multi_numa_ht(),
            "1-39,41-79",
            60,
            false,
            "10-39,50-79",
        ),
        (
            "a socket and cores",
            dual_socket_multi_numa_ht(),
            "0-79",
            64,
            false,
            "0-31,40-71",
        ),
        (
            "uncore: whole caches",
            uncore_single_socket_no_smt(),
            "1-15",
            10,
            true,
            "1-2,4-11",
        ),
        (
            "uncore: one cache",
            uncore_dual_socket_no_smt(),
            "2-15",
            6,
            true,
            "2-7",
        ),
        (
            "uncore, SMT: a free cache's cores",
            uncore_single_socket_smt(),
            "2-7,10-15",
            6,
            true,
            "4-6,12-14",
        ),
        (
            "uncore, SMT: ten CPUs",
            uncore_single_socket_smt(),
            "1-7,9-15",
            10,
            true,
            "1,4-7,9,12-15",
        ),
    ];
    for (case, topo, avail, n, uncore, want) in cases {
        assert_eq!(
            take_packed(&topo, &set(avail), n, uncore).map(|s| s.to_string()),
            Ok(want.to_string()),
            "{case}"
        );
    }
    assert_eq!(
        take_packed(&single_socket_ht(), &set("0,2,4,6"), 5, false)
            .unwrap_err()
            .to_string(),
        "not enough cpus available to satisfy request: requested=5, available=4"
    );
    assert_eq!(
        take_packed(&single_socket_ht(), &set("0-7"), 0, false),
        Ok(CpuSet::new())
    );
}

#[test]
fn distributed_spreads_evenly_over_the_fewest_numa_nodes() {
    let cases: Vec<(CpuTopology, &str, usize, usize, &str)> = vec![
        (
            dual_socket_multi_numa_ht(),
            "0-79",
            26,
            1,
            "0-6,10-16,40-45,50-55",
        ),
        (
            dual_socket_multi_numa_ht(),
            "0-79",
            26,
            2,
            "0-6,10-15,40-46,50-55",
        ),
        (
            dual_socket_multi_numa_ht(),
            "0-79",
            62,
            1,
            "0-7,10-17,20-27,30-37,40-47,50-57,60-66,70-76",
        ),
        (
            dual_socket_multi_numa_ht(),
            "0-8,10-18,20-39,40-48,50-58,60-79",
            62,
            1,
            "0-7,10-17,20-27,30-37,40-46,50-56,60-67,70-77",
        ),
        (dual_socket_ht(), "0-11", 8, 1, "0-3,6-9"),
    ];
    for (topo, avail, n, group, want) in cases {
        assert_eq!(
            take_distributed(&topo, &set(avail), n, group).map(|s| s.to_string()),
            Ok(want.to_string()),
            "{avail} n={n} group={group}"
        );
    }
    // Not a multiple of the group: packed.
    assert_eq!(
        take_distributed(&dual_socket_ht(), &set("0-11"), 3, 2),
        take_packed(&dual_socket_ht(), &set("0-11"), 3, false)
    );
}

#[test]
fn the_reference_machine_packs_within_a_numa_node() {
    // 2 sockets × 2 NUMA nodes × 8 cores × 2 threads.
    let topo = two_sockets_four_numa_nodes();
    assert_eq!(topo.num_cpus(), 64);
    assert_eq!(topo.numa_nodes(), [0, 1, 2, 3]);
    let all = topo.all();
    assert_eq!(
        take_packed(&topo, &all, 4, false).unwrap().to_string(),
        "0-1,32-33"
    );
    assert_eq!(
        take_packed(&topo, &all, 16, false).unwrap().to_string(),
        "0-7,32-39"
    );
    assert_eq!(
        take_packed(&topo, &all, 32, false).unwrap().to_string(),
        "0-15,32-47"
    );
    // Two CPUs of one core already given: the rest of that NUMA node next.
    let rest = all.difference(&set("0,32"));
    assert_eq!(
        take_packed(&topo, &rest, 2, false).unwrap().to_string(),
        "1,33"
    );
    // Spread over two NUMA nodes of a socket evenly.
    assert_eq!(take_distributed(&topo, &all, 20, 2).unwrap().len(), 20);
}
