//! `system-reserved` and `kube-reserved` enforced, as the kubelet's
//! `enforceExistingCgroup`: the agent, restarted with both in
//! `enforceNodeAllocatable` and a cgroup for each (made beforehand in the
//! `cpu`, `memory` and `pids` hierarchies, as systemd makes its slices),
//! writes each reservation to its cgroup, only what is reserved, and says so
//! in `NodeAllocatableEnforced` Node events. The agent is restarted with its
//! usual configuration at the end and the cgroups removed. It restarts the
//! agent, so it runs alone.

use crate::common::*;

const SYSTEM: &str = "rustlet-e2e-system";
const KUBE: &str = "rustlet-e2e-kube";
const HIERARCHIES: [&str; 3] = ["cpu", "memory", "pids"];

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn reserved_cgroups_get_what_is_reserved_for_them() {
    for h in HIERARCHIES {
        for cg in [SYSTEM, KUBE] {
            std::fs::create_dir_all(format!("/sys/fs/cgroup/{h}/{cg}")).expect("make the cgroup");
        }
    }
    let shares_before = cgroup_file("cpu", KUBE, "cpu.shares");
    let usual = std::fs::read_to_string(local().join("rustlet.yaml")).expect("rustlet.yaml");
    assert!(
        !usual.contains("enforceNodeAllocatable"),
        "the usual configuration leaves enforceNodeAllocatable at its default, [pods]"
    );
    let config = restart_agent_with(
        "reserved",
        &format!(
            "enforceNodeAllocatable: [pods, system-reserved, kube-reserved]\n\
             systemReservedCgroup: /{SYSTEM}\nkubeReservedCgroup: /{KUBE}\n\
             systemReserved: {{cpu: 200m, memory: 128Mi, pid: \"1000\"}}\n\
             kubeReserved: {{memory: 256Mi}}\n"
        ),
    );

    assert_eq!(cgroup_file("cpu", SYSTEM, "cpu.shares"), "204");
    assert_eq!(
        cgroup_file("memory", SYSTEM, "memory.limit_in_bytes"),
        (128u64 << 20).to_string()
    );
    assert_eq!(cgroup_file("pids", SYSTEM, "pids.max"), "1000");
    assert_eq!(
        cgroup_file("memory", KUBE, "memory.limit_in_bytes"),
        (256u64 << 20).to_string()
    );
    assert_eq!(
        cgroup_file("cpu", KUBE, "cpu.shares"),
        shares_before,
        "no cpu reserved"
    );
    assert_eq!(
        cgroup_file("pids", KUBE, "pids.max"),
        "max",
        "no pid reserved"
    );

    let client = client().await;
    let node = node_name();
    let wanted = [
        "Updated Node Allocatable limit across pods".to_string(),
        format!("Updated limits on system reserved cgroup /{SYSTEM}"),
        format!("Updated limits on kube reserved cgroup /{KUBE}"),
    ];
    wait_for_events(
        &client,
        "default",
        Involving::Name(&node),
        60,
        "the NodeAllocatableEnforced events",
        |events| {
            let seen = messages(events, "NodeAllocatableEnforced")?;
            wanted.iter().all(|w| seen.contains(w)).then_some(())
        },
    )
    .await;

    restart_agent(None);
    let _ = std::fs::remove_file(&config);
    for h in HIERARCHIES {
        for cg in [SYSTEM, KUBE] {
            let _ = std::fs::remove_dir(format!("/sys/fs/cgroup/{h}/{cg}"));
        }
    }
}
