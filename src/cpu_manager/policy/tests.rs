//! The static policy, table-tested with the cases of the kubelet's
//! `TestStaticPolicyAdd`, `TestStaticPolicyStart`, the reuse tests and
//! `TestGetTopologyHints` (pkg/kubelet/cm/cpumanager).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::*;
use crate::cpu_manager::fixtures::*;

fn set(list: &str) -> CpuSet {
    CpuSet::parse(list).unwrap()
}

fn resources(cpu: &str) -> ResourceRequirements {
    let r = BTreeMap::from([
        ("cpu".to_string(), Quantity(cpu.into())),
        ("memory".to_string(), Quantity("1G".into())),
    ]);
    ResourceRequirements {
        requests: Some(r.clone()),
        limits: Some(r),
        ..Default::default()
    }
}

/// A pod `uid` whose containers (`(name, cpu, kind)`, kind `init`,
/// `sidecar` or `app`) each ask for `cpu` with equal limits.
fn pod(uid: &str, containers: &[(&str, &str, &str)]) -> Pod {
    let mut p = crate::fixtures::pod(uid);
    for (name, _, kind) in containers {
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
        let cpu = containers.iter().find(|(n, _, _)| *n == c.name).unwrap().1;
        c.resources = Some(resources(cpu));
    }
    pod
}

fn container<'a>(pod: &'a Pod, name: &str) -> &'a Container {
    let spec = pod.spec.as_ref().unwrap();
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .find(|c| c.name == name)
        .unwrap()
}

fn policy(topo: CpuTopology, reserved: usize, options: PolicyOptions) -> StaticPolicy {
    StaticPolicy::new(topo, reserved, None, options).unwrap()
}

#[test]
fn the_reservation_is_taken_by_topology_or_named() {
    let p = policy(dual_socket_ht(), 2, PolicyOptions::default());
    assert_eq!(p.reserved().to_string(), "0,6");
    let p = policy(dual_socket_ht(), 3, PolicyOptions::default());
    assert_eq!(p.reserved().to_string(), "0,2,6");
    let p = policy(dual_socket_multi_numa_ht(), 3, PolicyOptions::default());
    assert_eq!(p.reserved().to_string(), "0-1,40");
    assert_eq!(p.reserved_physical.to_string(), "0-1,40-41");
    let named = StaticPolicy::new(
        dual_socket_ht(),
        1,
        Some(&set("5")),
        PolicyOptions::default(),
    )
    .unwrap();
    assert_eq!(named.reserved().to_string(), "5");
    assert_eq!(named.allocatable().to_string(), "0-4,6-11");
    assert_eq!(
        StaticPolicy::new(dual_socket_ht(), 0, None, PolicyOptions::default()).unwrap_err(),
        "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"
    );
    assert_eq!(
        StaticPolicy::new(
            dual_socket_ht(),
            1,
            Some(&set("12")),
            PolicyOptions::default()
        )
        .unwrap_err(),
        "reserved-cpus: 12 is not a subset of online-cpus: 0-11"
    );
}

#[test]
fn start_fills_an_empty_state_and_checks_a_restored_one() {
    let p = policy(dual_socket_ht(), 1, PolicyOptions::default());
    let mut s = State::default();
    p.start(&mut s).unwrap();
    assert_eq!(s.default.to_string(), "0-11");
    let p2 = policy(dual_socket_ht(), 2, PolicyOptions::default());
    let mut s = State {
        default: set("0-1"),
        ..State::default()
    };
    assert_eq!(
        p2.start(&mut s).unwrap_err(),
        "not all reserved cpus: \"0,6\" are present in defaultCpuSet: \"0-1\""
    );
    let strict = policy(
        dual_socket_ht(),
        2,
        PolicyOptions {
            strict_cpu_reservation: true,
            ..PolicyOptions::default()
        },
    );
    assert_eq!(
        strict.start(&mut s.clone()).unwrap_err(),
        "some of strictly reserved cpus: \"0\" are present in defaultCpuSet: \"0-1\""
    );
    let mut fresh = State::default();
    strict.start(&mut fresh).unwrap();
    assert_eq!(fresh.default.to_string(), "1-5,7-11");
    let p = StaticPolicy::new(
        dual_socket_ht(),
        1,
        Some(&set("5")),
        PolicyOptions::default(),
    )
    .unwrap();
    let mut overlap = State {
        default: set("2-11"),
        assignments: BTreeMap::from([(
            "fakePod".to_string(),
            BTreeMap::from([("0".to_string(), set("0-2"))]),
        )]),
    };
    assert_eq!(
        p.start(&mut overlap).unwrap_err(),
        "pod: fakePod, container: 0 cpuset: \"0-2\" overlaps with default cpuset \"2-11\""
    );
    let mut missing = State {
        default: set("0-10"),
        ..State::default()
    };
    assert_eq!(
        p.start(&mut missing).unwrap_err(),
        "current set of available CPUs \"0-11\" doesn't match with CPUs in state \"0-10\""
    );
    let mut empty_default = State {
        default: CpuSet::new(),
        assignments: BTreeMap::from([(
            "p".to_string(),
            BTreeMap::from([("c".to_string(), set("1"))]),
        )]),
    };
    assert_eq!(
        p.start(&mut empty_default).unwrap_err(),
        "default cpuset cannot be empty"
    );
}

#[test]
fn allocation_follows_the_kubelets_static_policy_add_cases() {
    // (topology, shared pool, cpu request, expected exclusive CPUs or error)
    type Case = (
        CpuTopology,
        &'static str,
        &'static str,
        Result<Option<&'static str>, &'static str>,
    );
    let cases: Vec<Case> = vec![
        (single_socket_ht(), "0-7", "1", Ok(Some("4"))),
        (single_socket_ht(), "0-1,4-5", "2", Ok(Some("1,5"))),
        (dual_socket_ht(), "0-1,3-11", "6", Ok(Some("1,3,5,7,9,11"))),
        (dual_socket_ht(), "0-1,3-11", "8", Ok(Some("1,3-5,7,9-11"))),
        (dual_socket_ht(), "0,2-4,6-11", "6", Ok(Some("2-4,8-10"))),
        (dual_socket_no_ht(), "0-1,3-7", "4", Ok(Some("4-7"))),
        (single_socket_ht(), "0-7", "977m", Ok(None)),
        (
            single_socket_ht(),
            "0-7",
            "8",
            Err("not enough cpus available to satisfy request: requested=8, available=7"),
        ),
    ];
    for (topo, pool, cpu, want) in cases {
        let mut p = policy(topo, 1, PolicyOptions::default());
        let mut s = State {
            default: set(pool),
            ..State::default()
        };
        let pod = pod("uid", &[("c", cpu, "app")]);
        let got = p.allocate(&mut s, &pod, container(&pod, "c"), None);
        let got = got.map(|o| o.map(|s| s.to_string())).map_err(|e| e.message);
        let want = want.map(|o| o.map(String::from)).map_err(String::from);
        assert_eq!(got, want, "{pool} cpu={cpu}");
        if let Ok(Some(cpus)) = &got {
            assert_eq!(
                s.default,
                set(pool).difference(&set(cpus)),
                "the pool shrinks"
            );
        }
    }
}

#[test]
fn burstable_pods_and_full_pcpus_only() {
    let mut p = policy(single_socket_ht(), 1, PolicyOptions::default());
    let mut s = State {
        default: set("0-7"),
        ..State::default()
    };
    let mut burstable = pod("b", &[("c", "2", "app")]);
    burstable.spec.as_mut().unwrap().containers[0]
        .resources
        .as_mut()
        .unwrap()
        .limits = None;
    assert_eq!(
        p.allocate(&mut s, &burstable, container(&burstable, "c"), None),
        Ok(None)
    );
    let full = PolicyOptions {
        full_pcpus_only: true,
        ..PolicyOptions::default()
    };
    let mut p = policy(single_socket_ht(), 1, full);
    let one = pod("one", &[("c", "1", "app")]);
    let e = p
        .allocate(&mut s, &one, container(&one, "c"), None)
        .unwrap_err();
    assert_eq!(e.reason, SMT_ALIGNMENT_ERROR);
    assert_eq!(
        e.message,
        "SMT Alignment Error: requested 1 cpus not multiple cpus per core = 2"
    );
    let mut p = StaticPolicy::new(dual_socket_ht(), 2, Some(&set("1,6")), full).unwrap();
    let mut s = State {
        default: set("0,2-5,7-11"),
        ..State::default()
    };
    let ten = pod("ten", &[("c", "10", "app")]);
    assert_eq!(
        p.allocate(&mut s, &ten, container(&ten, "c"), None)
            .unwrap_err()
            .message,
        "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = 8, requested CPUs = 10, CPUs per core = 2"
    );
}

#[test]
fn the_hint_places_the_cpus_on_its_numa_node() {
    let mut p = StaticPolicy::new(
        dual_socket_ht(),
        1,
        Some(&set("0")),
        PolicyOptions::default(),
    )
    .unwrap();
    // Nothing reserved in the kubelet's case; CPU 0 is reserved here and
    // sits on NUMA node 0, away from the hint.
    let mut s = State {
        default: set("0-11"),
        ..State::default()
    };
    let two = pod("two", &[("c", "2", "app")]);
    let got = p.allocate(&mut s, &two, container(&two, "c"), Some(NumaMask::of(&[1])));
    assert_eq!(got.unwrap().unwrap().to_string(), "1,7");
    let eight = pod("eight", &[("c", "8", "app")]);
    let got = p.allocate(
        &mut s,
        &eight,
        container(&eight, "c"),
        Some(NumaMask::of(&[1])),
    );
    // NUMA node 1 holds 4 more, the rest come from node 0.
    let got = got.unwrap().unwrap();
    assert_eq!(got.len(), 8);
    assert!(set("3,5,9,11").is_subset(&got), "{got}");
    assert!(!got.contains(0), "the reserved CPU is never given");
}

#[test]
fn init_containers_cpus_are_reused_and_sidecars_keep_theirs() {
    let topo = single_socket_ht();
    // Nothing reserved in the kubelet's test; here CPU 0 and its sibling's
    // core stay free of the pod's CPUs by a named reservation of CPU 3.
    let mut p =
        StaticPolicy::new(topo.clone(), 1, Some(&set("3")), PolicyOptions::default()).unwrap();
    let mut s = State {
        default: set("0-7"),
        ..State::default()
    };
    let reuse = pod("r", &[("init", "4", "init"), ("app", "2", "app")]);
    let init = p
        .allocate(&mut s, &reuse, container(&reuse, "init"), None)
        .unwrap()
        .unwrap();
    assert_eq!(init.len(), 4);
    let app = p
        .allocate(&mut s, &reuse, container(&reuse, "app"), None)
        .unwrap()
        .unwrap();
    assert!(
        app.is_subset(&init),
        "the app container reuses its init container's CPUs"
    );
    p.remove_container(&mut s, "r", "init");
    assert_eq!(s.default, set("0-7").difference(&app));

    let mut p = StaticPolicy::new(topo, 1, Some(&set("3")), PolicyOptions::default()).unwrap();
    let mut s = State {
        default: set("0-7"),
        ..State::default()
    };
    let keep = pod("k", &[("side", "4", "sidecar"), ("app", "2", "app")]);
    let side = p
        .allocate(&mut s, &keep, container(&keep, "side"), None)
        .unwrap()
        .unwrap();
    let app = p
        .allocate(&mut s, &keep, container(&keep, "app"), None)
        .unwrap()
        .unwrap();
    assert!(
        side.intersection(&app).is_empty(),
        "a sidecar keeps its CPUs"
    );
    assert_eq!(s.default.len(), 2);
}

#[test]
fn hints_prefer_the_fewest_numa_nodes_that_could_hold_the_request() {
    // The machine of the kubelet's topology_hints_test: NUMA node 0 holds
    // CPUs 0-2 and their siblings 6-8.
    let topo = machine(12, |cpu| {
        let numa = usize::from(cpu % 6 >= 3);
        (numa, numa, cpu % 6, 0)
    });
    let p = StaticPolicy::new(topo, 1, Some(&set("0")), PolicyOptions::default()).unwrap();
    let s = State {
        default: set("2-11"),
        ..State::default()
    };
    let h = |nodes: &[usize], preferred| Hint::new(nodes, preferred);
    let cases: Vec<(&str, Vec<Hint>)> = vec![
        ("2", vec![h(&[0], true), h(&[1], true), h(&[0, 1], false)]),
        ("5", vec![h(&[1], true), h(&[0, 1], false)]),
        ("7", vec![h(&[0, 1], true)]),
        ("11", vec![]),
    ];
    for (cpu, want) in cases {
        let pod = pod("h", &[("c", cpu, "app")]);
        assert_eq!(
            p.hints(&s, &pod, container(&pod, "c")),
            Some(want),
            "cpu={cpu}"
        );
    }
    let shared = pod("s", &[("c", "500m", "app")]);
    assert_eq!(p.hints(&s, &shared, container(&shared, "c")), None);
    // A pod's hints count its sidecars beside its containers.
    let whole = pod(
        "w",
        &[
            ("i", "1", "init"),
            ("side", "1", "sidecar"),
            ("c", "4", "app"),
        ],
    );
    assert_eq!(pod_guaranteed_cpus(&whole), 5);
    assert_eq!(
        p.pod_hints(&s, &whole),
        Some(vec![h(&[1], true), h(&[0, 1], false)])
    );
}

#[test]
fn options_are_read_with_their_stages() {
    let opts = |pairs: &[(&str, &str)], beta| {
        PolicyOptions::parse(
            &pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
            beta,
            false,
        )
    };
    assert_eq!(
        opts(
            &[
                ("full-pcpus-only", "true"),
                ("strict-cpu-reservation", "True")
            ],
            true
        ),
        Ok(PolicyOptions {
            full_pcpus_only: true,
            strict_cpu_reservation: true,
            ..PolicyOptions::default()
        })
    );
    assert_eq!(
        opts(&[("distribute-cpus-across-numa", "true")], false).unwrap_err(),
        "CPU Manager Policy Beta-level Options not enabled, but option \"distribute-cpus-across-numa\" provided"
    );
    assert_eq!(
        opts(&[("align-by-socket", "true")], true).unwrap_err(),
        "CPU Manager Policy Alpha-level Options not enabled, but option \"align-by-socket\" provided"
    );
    // With the alpha gate on, still refused, by name.
    let alpha = [("align-by-socket".to_string(), "true".to_string())].into();
    assert_eq!(
        PolicyOptions::parse(&alpha, true, true).unwrap_err(),
        "CPU Manager Policy option \"align-by-socket\" is alpha and not supported by this agent"
    );
    assert!(PolicyOptions::parse(&BTreeMap::new(), true, true).is_ok());
    assert_eq!(
        opts(&[("pin", "true")], true).unwrap_err(),
        "unknown CPU Manager Policy option: \"pin\""
    );
    assert_eq!(
        opts(&[("full-pcpus-only", "yes")], true).unwrap_err(),
        "bad value for option \"full-pcpus-only\": strconv.ParseBool: parsing \"yes\": invalid syntax"
    );
    assert_eq!(
        opts(
            &[
                ("distribute-cpus-across-numa", "true"),
                ("prefer-align-cpus-by-uncorecache", "true")
            ],
            true
        )
        .unwrap_err(),
        "static policy options prefer-align-cpus-by-uncorecache and distribute-cpus-across-numa can not be used at the same time"
    );
}
