//! The manager over a real checkpoint directory.

use std::collections::BTreeMap;

use super::*;
use crate::config::ResourceManagers;

fn settings(policy: PolicyName, reserved: Option<&str>) -> ResourceManagers {
    ResourceManagers {
        cpu_policy: policy,
        reserved_system_cpus: reserved.map(|r| CpuSet::parse(r).unwrap()),
        ..ResourceManagers::default()
    }
}

fn guaranteed(uid: &str, cpu: &str) -> Pod {
    let mut pod = crate::fixtures::pod(uid).container("c", "busybox").build();
    pod.metadata.uid = Some(uid.into());
    let r: BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity> = [
        (
            "cpu".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(cpu.into()),
        ),
        (
            "memory".to_string(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("64Mi".into()),
        ),
    ]
    .into();
    pod.spec.as_mut().unwrap().containers[0].resources =
        Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: Some(r.clone()),
            limits: Some(r),
            ..Default::default()
        });
    pod
}

#[test]
fn a_pinned_container_keeps_its_cpus_across_a_restart_and_returns_them_when_its_pod_goes() {
    let dir = tempfile::tempdir().unwrap();
    // This machine: two CPUs, CPU 0 reserved.
    let topo = fixtures::machine(2, |cpu| (0, 0, cpu, 0));
    let s = settings(PolicyName::Static, Some("0"));
    let m = CpuManager::new(&s, None, dir.path(), topo.clone(), true).unwrap();
    assert_eq!(m.allocatable().to_string(), "1");
    assert_eq!(m.cpuset("other", "c").unwrap().to_string(), "0-1");
    let pod = guaranteed("p", "1");
    let c = &pod.spec.as_ref().unwrap().containers[0];
    assert_eq!(m.hints(&pod, c), Some(vec![Hint::new(&[0], true)]));
    let requests = crate::metrics::metrics().cpu_manager_pinning_requests.get();
    m.allocate(&pod, c, Some(NumaMask::of(&[0]))).unwrap();
    assert!(crate::metrics::metrics().cpu_manager_pinning_requests.get() > requests);
    assert_eq!(m.cpuset("p", "c").unwrap().to_string(), "1");
    assert_eq!(
        m.cpuset("other", "c").unwrap().to_string(),
        "0",
        "the shared pool shrinks"
    );
    // A second pod finds no CPU to take.
    let second = guaranteed("q", "1");
    let e = m
        .allocate(&second, &second.spec.as_ref().unwrap().containers[0], None)
        .unwrap_err();
    assert_eq!(
        e.message,
        "not enough cpus available to satisfy request: requested=1, available=0"
    );
    // Restarted: the same assignment.
    let again = CpuManager::new(&s, None, dir.path(), topo.clone(), true).unwrap();
    assert_eq!(again.exclusive("p", "c").unwrap().to_string(), "1");
    // The pod is gone: its CPU returns.
    again.remove_stale(&BTreeMap::new());
    assert_eq!(again.cpuset("other", "c").unwrap().to_string(), "0-1");
    // A changed policy over that state stops the manager.
    let e = CpuManager::new(
        &settings(PolicyName::None, None),
        None,
        dir.path(),
        topo,
        true,
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .contains("configured policy \"none\" differs from state checkpoint policy \"static\""),
        "{e}"
    );
}

#[test]
fn start_errors_are_the_kubelets() {
    let dir = tempfile::tempdir().unwrap();
    let topo = fixtures::single_socket_ht();
    let e = CpuManager::new(
        &settings(PolicyName::Static, None),
        None,
        dir.path(),
        topo.clone(),
        true,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "[cpumanager] unable to determine reserved CPU resources for static policy"
    );
    let e = CpuManager::new(
        &settings(PolicyName::Static, None),
        Some(0),
        dir.path(),
        topo.clone(),
        true,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "new static policy error: [cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than zero"
    );
    let mut with_options = settings(PolicyName::None, None);
    with_options
        .cpu_policy_options
        .insert("full-pcpus-only".into(), "true".into());
    let e = CpuManager::new(&with_options, None, dir.path(), topo.clone(), true).unwrap_err();
    assert_eq!(
        e.to_string(),
        "new none policy error: None policy: received unsupported options=map[full-pcpus-only:true]"
    );
    // 1500m reserved is two CPUs, taken by topology: a whole core.
    let m = CpuManager::new(
        &settings(PolicyName::Static, None),
        Some(1500),
        dir.path(),
        topo,
        true,
    )
    .unwrap();
    assert_eq!(m.allocatable().to_string(), "1-3,5-7");
    assert!(
        std::fs::read_to_string(dir.path().join(state::FILE))
            .unwrap()
            .contains("\"policyName\":\"static\"")
    );
}
