//! The static policy, table-tested with the cases of the kubelet's
//! `policy_static_test.go` (pkg/kubelet/cm/memorymanager).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::*;

const MB: u64 = 1 << 20;
const GB: u64 = 1 << 30;

fn table(total: u64, system: u64, allocatable: u64, reserved: u64, free: u64) -> MemoryTable {
    MemoryTable {
        total,
        system_reserved: system,
        allocatable,
        reserved,
        free,
    }
}

fn node(assignments: u64, cells: &[usize], tables: &[(&str, MemoryTable)]) -> NodeState {
    NodeState {
        number_of_assignments: assignments,
        memory_map: tables.iter().map(|(r, t)| ((*r).to_string(), *t)).collect(),
        cells: cells.to_vec(),
    }
}

/// A Guaranteed pod `uid` whose containers (`(name, memory, hugepages-1Gi,
/// kind)`) ask for those bytes.
fn pod(uid: &str, containers: &[(&str, &str, Option<&str>, &str)]) -> Pod {
    let mut p = crate::fixtures::pod(uid);
    for (name, _, _, kind) in containers {
        p = match *kind {
            "init" => p.init_container(name, "busybox"),
            "sidecar" => p.sidecar(name, "busybox"),
            _ => p.container(name, "busybox"),
        };
    }
    let mut pod = p.build();
    pod.metadata.uid = Some(uid.into());
    let spec = pod.spec.as_mut().unwrap();
    for c in spec
        .init_containers
        .iter_mut()
        .flatten()
        .chain(spec.containers.iter_mut())
    {
        let (_, memory, pages, _) = containers.iter().find(|x| x.0 == c.name).unwrap();
        let mut r = BTreeMap::from([
            ("cpu".to_string(), Quantity("1".into())),
            ("memory".to_string(), Quantity((*memory).into())),
        ]);
        if let Some(p) = pages {
            r.insert("hugepages-1Gi".into(), Quantity((*p).into()));
        }
        c.resources = Some(ResourceRequirements {
            requests: Some(r.clone()),
            limits: Some(r),
            ..Default::default()
        });
    }
    pod
}

fn c<'a>(pod: &'a Pod, name: &str) -> &'a Container {
    let spec = pod.spec.as_ref().unwrap();
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .find(|c| c.name == name)
        .unwrap()
}

fn policy(nodes: usize) -> StaticPolicy {
    let machine = (0..nodes)
        .map(|n| {
            (
                n,
                NumaMemory {
                    memory: 2 * GB,
                    hugepages: BTreeMap::from([("hugepages-1Gi".to_string(), GB)]),
                },
            )
        })
        .collect();
    let reserved = (0..nodes)
        .map(|n| (n, BTreeMap::from([("memory".to_string(), 512 * MB)])))
        .collect();
    StaticPolicy::new(machine, reserved).unwrap()
}

#[test]
fn the_default_machine_holds_back_the_reserved_memory_and_the_huge_pages() {
    let p = policy(1);
    let m = p.default_machine();
    assert_eq!(m[&0].cells, [0]);
    // 2 GiB less 512 MiB reserved less the 1 GiB of huge pages.
    assert_eq!(
        m[&0].memory_map["memory"],
        table(2 * GB, 512 * MB, 512 * MB, 0, 512 * MB)
    );
    assert_eq!(m[&0].memory_map["hugepages-1Gi"], table(GB, 0, GB, 0, GB));
    assert_eq!(
        StaticPolicy::new(BTreeMap::new(), BTreeMap::new()).unwrap_err(),
        "[memorymanager] you should specify the system reserved memory"
    );
}

#[test]
fn hints_reuse_an_existing_assignment_or_are_none_when_it_differs() {
    let p = policy(1);
    let pod = pod("pod1", &[("container1", "1Gi", Some("1Gi"), "app")]);
    let blocks = vec![
        Block {
            numa_affinity: vec![0],
            type_: "memory".into(),
            size: GB,
        },
        Block {
            numa_affinity: vec![0],
            type_: "hugepages-1Gi".into(),
            size: GB,
        },
    ];
    let mut s = State {
        machine: p.default_machine(),
        entries: BTreeMap::new(),
    };
    s.entries
        .entry("pod1".into())
        .or_default()
        .insert("container1".into(), blocks.clone());
    let h = p.hints(&s, &pod, c(&pod, "container1")).unwrap();
    assert_eq!(h["memory"], [Hint::new(&[0], true)]);
    assert_eq!(h["hugepages-1Gi"], [Hint::new(&[0], true)]);
    s.entries.get_mut("pod1").unwrap().insert(
        "container1".into(),
        vec![
            Block {
                size: 512 * MB,
                ..blocks[0].clone()
            },
            blocks[1].clone(),
        ],
    );
    assert_eq!(p.hints(&s, &pod, c(&pod, "container1")), None);
}

#[test]
fn hints_keep_away_from_a_group_and_prefer_the_fewest_nodes() {
    let p = policy(4);
    // Nodes 0 and 1 are a group in use; 2 and 3 are empty.
    let mut machine = MachineState::new();
    machine.insert(
        0,
        node(
            2,
            &[0, 1],
            &[
                ("memory", table(2 * GB, 512 * MB, 1536 * MB, 1536 * MB, 0)),
                ("hugepages-1Gi", table(GB, 0, GB, GB, 0)),
            ],
        ),
    );
    machine.insert(
        1,
        node(
            2,
            &[0, 1],
            &[
                ("memory", table(2 * GB, 512 * MB, 1536 * MB, 512 * MB, GB)),
                ("hugepages-1Gi", table(GB, 0, GB, GB, 0)),
            ],
        ),
    );
    for n in [2, 3] {
        machine.insert(
            n,
            node(
                0,
                &[n],
                &[
                    ("memory", table(2 * GB, 512 * MB, 1536 * MB, 0, 1536 * MB)),
                    ("hugepages-1Gi", table(GB, 0, GB, 0, GB)),
                ],
            ),
        );
    }
    let s = State {
        machine,
        entries: BTreeMap::new(),
    };
    let pod = pod("p", &[("c", "1Gi", Some("1Gi"), "app")]);
    let h = p.hints(&s, &pod, c(&pod, "c")).unwrap();
    let want = vec![
        Hint::new(&[2], true),
        Hint::new(&[3], true),
        Hint::new(&[2, 3], false),
    ];
    assert_eq!(h["memory"], want);
    assert_eq!(h["hugepages-1Gi"], want);
}

#[test]
fn allocation_with_the_default_hint_then_none_left() {
    let mut p = policy(1);
    let mut s = State {
        machine: p.default_machine(),
        entries: BTreeMap::new(),
    };
    // The test machine's node 0: 2 GiB total, 512 MiB reserved, 1.5 GiB
    // allocatable beside 1 GiB of huge pages.
    s.machine.get_mut(&0).unwrap().memory_map.insert(
        "memory".into(),
        table(2 * GB, 512 * MB, 1536 * MB, 0, 1536 * MB),
    );
    let first = pod("pod1", &[("container1", "1Gi", Some("1Gi"), "app")]);
    let blocks = p
        .allocate(&mut s, &first, c(&first, "container1"), Hint::default())
        .unwrap()
        .unwrap();
    assert_eq!(blocks.len(), 2);
    assert!(
        blocks
            .iter()
            .all(|b| b.numa_affinity == [0] && b.size == GB)
    );
    let n = &s.machine[&0];
    assert_eq!(n.memory_map["memory"].free, 512 * MB);
    assert_eq!(n.memory_map["memory"].reserved, GB);
    assert_eq!(n.memory_map["hugepages-1Gi"].free, 0);
    assert_eq!(n.number_of_assignments, 2);
    let second = pod("pod2", &[("container1", "1Gi", Some("1Gi"), "app")]);
    assert_eq!(
        p.allocate(&mut s, &second, c(&second, "container1"), Hint::default())
            .unwrap_err(),
        NO_DEFAULT_HINT
    );
    // Removed: everything back.
    p.remove_container(&mut s, "pod1", "container1");
    assert_eq!(s.machine[&0].memory_map["memory"].free, 1536 * MB);
    assert_eq!(s.machine[&0].number_of_assignments, 0);
}

#[test]
fn allocation_across_numa_nodes_and_the_violations() {
    let mut p = policy(4);
    let mut s = State {
        machine: p.default_machine(),
        entries: BTreeMap::new(),
    };
    for n in 0..4 {
        s.machine.get_mut(&n).unwrap().memory_map.insert(
            "memory".into(),
            table(2 * GB, 512 * MB, 512 * MB, 0, 512 * MB),
        );
    }
    let big = pod("pod1", &[("container1", "1Gi", Some("1Gi"), "app")]);
    let any = Hint {
        affinity: None,
        preferred: true,
    };
    let blocks = p
        .allocate(&mut s, &big, c(&big, "container1"), any)
        .unwrap()
        .unwrap();
    assert!(blocks.iter().all(|b| b.numa_affinity == [0, 1]));
    assert_eq!(s.machine[&0].memory_map["memory"].free, 0);
    assert_eq!(s.machine[&1].memory_map["memory"].free, 0);
    assert_eq!(
        s.machine[&0].memory_map["hugepages-1Gi"].free, 0,
        "huge pages from node 0 first"
    );
    assert_eq!(s.machine[&1].memory_map["hugepages-1Gi"].free, GB);
    assert_eq!(s.machine[&0].cells, [0, 1]);
    assert_eq!(s.machine[&0].number_of_assignments, 2);

    // A node serving a single-node block cannot join a group.
    let mut p = policy(4);
    let mut s = State {
        machine: p.default_machine(),
        entries: BTreeMap::new(),
    };
    let small = pod("a", &[("c", "128Mi", None, "app")]);
    p.allocate(&mut s, &small, c(&small, "c"), Hint::new(&[0], true))
        .unwrap();
    let other = pod("b", &[("c", "128Mi", None, "app")]);
    let before = s.clone();
    assert_eq!(
        p.allocate(&mut s, &other, c(&other, "c"), Hint::new(&[0, 1], true))
            .unwrap_err(),
        "[memorymanager] preferred hint violates NUMA node allocation"
    );
    assert_eq!(s, before, "nothing changed");
}

#[test]
fn init_containers_memory_is_reused_by_the_app_containers() {
    let machine = BTreeMap::from([(
        0,
        NumaMemory {
            memory: 8 * GB,
            hugepages: BTreeMap::from([("hugepages-1Gi".to_string(), 8 * GB)]),
        },
    )]);
    let mut p = StaticPolicy::new(
        machine,
        BTreeMap::from([(0, BTreeMap::from([("memory".to_string(), 512 * MB)]))]),
    )
    .unwrap();
    let mut s = State {
        machine: p.default_machine(),
        entries: BTreeMap::new(),
    };
    s.machine.get_mut(&0).unwrap().memory_map.insert(
        "memory".into(),
        table(8 * GB, 512 * MB, 7680 * MB, 0, 7680 * MB),
    );
    let pod = pod(
        "p",
        &[
            ("init1", "1Gi", Some("1Gi"), "init"),
            ("init2", "2Gi", Some("2Gi"), "init"),
            ("app1", "3Gi", Some("3Gi"), "app"),
            ("app2", "4Gi", Some("4Gi"), "app"),
        ],
    );
    for name in ["init1", "init2", "app1", "app2"] {
        p.allocate(&mut s, &pod, c(&pod, name), Hint::default())
            .unwrap();
    }
    let n = &s.machine[&0];
    assert_eq!(n.memory_map["memory"].reserved, 7 * GB);
    assert_eq!(n.memory_map["memory"].free, 512 * MB);
    assert_eq!(n.memory_map["hugepages-1Gi"].reserved, 7 * GB);
    assert_eq!(n.memory_map["hugepages-1Gi"].free, GB);
    assert_eq!(n.number_of_assignments, 8);
    let sizes = |name: &str| {
        s.entries["p"][name]
            .iter()
            .map(|b| b.size)
            .collect::<Vec<_>>()
    };
    assert_eq!(sizes("init1"), [0, 0]);
    assert_eq!(sizes("init2"), [0, 0]);
    assert_eq!(sizes("app1"), [3 * GB, 3 * GB]);
    assert_eq!(sizes("app2"), [4 * GB, 4 * GB]);
    // What the pod needs at once: its app containers together.
    assert_eq!(pod_requests(&pod).unwrap()["memory"], 7 * GB);
}

#[test]
fn a_restored_state_is_checked_against_the_machine() {
    let mut p = policy(1);
    let mut s = State::default();
    p.start(&mut s).unwrap();
    let pod = pod("p", &[("c", "256Mi", None, "app")]);
    p.allocate(&mut s, &pod, c(&pod, "c"), Hint::default())
        .unwrap();
    p.start(&mut s.clone()).unwrap();
    let mut wrong = s.clone();
    wrong
        .machine
        .get_mut(&0)
        .unwrap()
        .memory_map
        .get_mut("memory")
        .unwrap()
        .free += 1;
    assert_eq!(
        p.start(&mut wrong).unwrap_err(),
        "[memorymanager] the expected machine state is different from the real one"
    );
    let mut lost = State {
        machine: MachineState::new(),
        entries: s.entries.clone(),
    };
    assert_eq!(
        p.start(&mut lost).unwrap_err(),
        "[memorymanager] machine state can not be empty when it has memory assignments"
    );
}
