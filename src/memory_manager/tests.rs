//! The manager around the static policy: the machine read from sysfs, the
//! reservation checked against node allocatable, and the checkpoint kept
//! across a restart.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::*;
use crate::config::ReservedMemory;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A sysfs with NUMA nodes of `GiB` each and one 2 MiB huge page pool.
fn sysfs(nodes: &[(usize, u64, u64)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (id, gib, pages) in nodes {
        let node = dir.path().join(format!("devices/system/node/node{id}"));
        std::fs::create_dir_all(node.join("hugepages/hugepages-2048kB")).unwrap();
        std::fs::write(
            node.join("meminfo"),
            format!(
                "Node {id} MemTotal:       {} kB\nNode {id} MemFree:        1 kB\n",
                gib * 1024 * 1024
            ),
        )
        .unwrap();
        std::fs::write(
            node.join("hugepages/hugepages-2048kB/nr_hugepages"),
            format!("{pages}\n"),
        )
        .unwrap();
    }
    std::fs::create_dir_all(dir.path().join("devices/system/node/possible")).unwrap();
    dir
}

fn reserved(node: i32, memory: &str) -> ReservedMemory {
    ReservedMemory {
        numa_node: node,
        limits: BTreeMap::from([("memory".to_string(), memory.to_string())]),
    }
}

/// A Guaranteed pod `name` of one container asking for `memory`.
fn guaranteed(name: &str, memory: &str) -> Pod {
    let mut pod = crate::fixtures::pod(name)
        .container("app", "busybox")
        .build();
    let r = BTreeMap::from([
        ("cpu".to_string(), Quantity("1".into())),
        ("memory".to_string(), Quantity(memory.into())),
    ]);
    pod.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
        requests: Some(r.clone()),
        limits: Some(r),
        ..Default::default()
    });
    pod
}

#[test]
fn the_machine_is_read_per_numa_node_with_its_huge_pages() {
    let sys = sysfs(&[(0, 4, 8), (1, 2, 0)]);
    let nodes = discover(sys.path(), 0, &[]);
    assert_eq!(nodes.keys().copied().collect::<Vec<_>>(), [0, 1]);
    assert_eq!(nodes[&0].memory, 4 * GIB);
    assert_eq!(nodes[&0].hugepages["hugepages-2Mi"], 16 * MIB);
    assert_eq!(nodes[&1].memory, 2 * GIB);
    assert_eq!(nodes[&1].hugepages["hugepages-2Mi"], 0);
    // No NUMA nodes listed: one node of the machine's memory.
    let empty = tempfile::tempdir().unwrap();
    let nodes = discover(empty.path(), 3 * GIB, &[(1_048_576, 2)]);
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[&0].memory, 3 * GIB);
    assert_eq!(nodes[&0].hugepages["hugepages-1Gi"], 2 * GIB);
}

#[test]
fn the_reservation_must_match_node_allocatable_and_name_real_nodes() {
    let sys = sysfs(&[(0, 4, 0), (1, 4, 0)]);
    let nodes = discover(sys.path(), 0, &[]);
    let held = BTreeMap::from([("memory".to_string(), 1100 * MIB)]);
    let by_node =
        reserved_by_node(&[reserved(0, "1Gi"), reserved(1, "76Mi")], &nodes, &held).unwrap();
    assert_eq!(by_node[&0]["memory"], GIB);
    assert_eq!(by_node[&1]["memory"], 76 * MIB);
    let e = reserved_by_node(&[reserved(0, "1Gi")], &nodes, &held).unwrap_err();
    assert_eq!(
        e,
        "the total amount \"1Gi\" of type \"memory\" is not equal to the value \"1100Mi\" determined by Node Allocatable feature"
    );
    let e = reserved_by_node(&[], &nodes, &held).unwrap_err();
    assert!(e.starts_with("the total amount \"0\""), "{e}");
    let e = reserved_by_node(&[reserved(2, "1100Mi")], &nodes, &held).unwrap_err();
    assert!(e.contains("NUMA node 2 that does not exist"), "{e}");
    let e = reserved_by_node(&[reserved(-1, "1100Mi")], &nodes, &held).unwrap_err();
    assert!(e.contains("NUMA node -1 that does not exist"), "{e}");
}

#[test]
fn pinned_memory_survives_a_restart_and_returns_when_the_pod_goes() {
    let sys = sysfs(&[(0, 4, 0), (1, 4, 0)]);
    let machine = discover(sys.path(), 0, &[]);
    let root = tempfile::tempdir().unwrap();
    let reserve = || BTreeMap::from([(0, BTreeMap::from([("memory".to_string(), GIB)]))]);
    let m = MemoryManager::new("Static", machine.clone(), reserve(), root.path()).unwrap();
    assert!(m.is_static());
    let pod = guaranteed("db", "5Gi");
    let c = &pod.spec.as_ref().unwrap().containers[0];
    // 5 GiB fits neither node alone (3 GiB and 4 GiB allocatable): both.
    let hints = m.hints(&pod, c).unwrap();
    assert_eq!(hints["memory"], [Hint::new(&[0, 1], true)]);
    let requests = crate::metrics::metrics()
        .memory_manager_pinning_requests
        .get();
    m.allocate(&pod, c, Hint::new(&[0, 1], true)).unwrap();
    assert!(
        crate::metrics::metrics()
            .memory_manager_pinning_requests
            .get()
            > requests
    );
    assert_eq!(m.cpuset_mems("uid-db", "app").as_deref(), Some("0,1"));
    let blocks = m.blocks("uid-db", "app");
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].size, 5 * GIB);
    // Nodes 0 and 1 now serve as one group: a second pod may only use
    // both, a hint not preferred (one node's allocatable could hold it).
    let other = guaranteed("web", "1Gi");
    let oc = &other.spec.as_ref().unwrap().containers[0];
    assert_eq!(
        m.hints(&other, oc).unwrap()["memory"],
        [Hint::new(&[0, 1], false)]
    );
    let big = guaranteed("big", "3Gi");
    let bc = &big.spec.as_ref().unwrap().containers[0];
    assert_eq!(m.hints(&big, bc), Some(BTreeMap::new()));
    // Without a hint it finds no nodes to take it from: an error, counted.
    let errors = crate::metrics::metrics()
        .memory_manager_pinning_errors
        .get();
    let e = m.allocate(&big, bc, Hint::default()).unwrap_err();
    assert_eq!(e, policy::NO_DEFAULT_HINT);
    assert!(
        crate::metrics::metrics()
            .memory_manager_pinning_errors
            .get()
            > errors
    );
    assert_eq!(m.blocks("uid-big", "app"), []);

    // A restart reads the checkpoint back.
    drop(m);
    let m = MemoryManager::new("Static", machine.clone(), reserve(), root.path()).unwrap();
    assert_eq!(m.cpuset_mems("uid-db", "app").as_deref(), Some("0,1"));
    let free: u64 = m.allocatable().iter().map(|b| b.size).sum();
    assert_eq!(free, 7 * GIB);
    // The pod is no longer active: its memory goes back.
    m.remove_stale(&BTreeMap::new());
    assert_eq!(m.cpuset_mems("uid-db", "app"), None);
    assert_eq!(m.hints(&other, oc).unwrap()["memory"].len(), 3);

    // Another policy cannot read the checkpoint; a reservation that no
    // longer fits the machine state is refused.
    let e = MemoryManager::new("None", machine.clone(), BTreeMap::new(), root.path()).unwrap_err();
    assert!(e.contains("policy"), "{e}");
    let more = BTreeMap::from([(0, BTreeMap::from([("memory".to_string(), 2 * GIB)]))]);
    let e = MemoryManager::new("Static", machine, more, root.path()).unwrap_err();
    assert!(e.starts_with("start memory manager error:"), "{e}");
}

#[test]
fn the_static_policy_refuses_a_machine_of_too_many_numa_nodes() {
    let machine: BTreeMap<usize, NumaMemory> = (0..17)
        .map(|n| {
            (
                n,
                NumaMemory {
                    memory: GIB,
                    hugepages: BTreeMap::new(),
                },
            )
        })
        .collect();
    let root = tempfile::tempdir().unwrap();
    let reserve = BTreeMap::from([(0, BTreeMap::from([("memory".to_string(), MIB)]))]);
    let e = MemoryManager::new("Static", machine.clone(), reserve, root.path()).unwrap_err();
    assert!(e.contains("this machine has 17 nodes up to 16"), "{e}");
    // Under None the machine is not weighed.
    assert!(MemoryManager::new("None", machine, BTreeMap::new(), root.path()).is_ok());
}
