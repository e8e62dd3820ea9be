//! Admission at the start of a sync: a pod the node does not admit, and one that does not fit beside the admitted ones.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_the_node_does_not_admit_is_failed_without_touching_the_runtime() {
    let mut n = Node::start().await;
    let mut p = pod("web").container("c", IMAGE).build();
    if let Some(spec) = p.spec.as_mut() {
        spec.security_context = Some(PodSecurityContext {
            sysctls: Some(vec![Sysctl {
                name: "kernel.msgmax".into(),
                value: "1".into(),
            }]),
            ..Default::default()
        });
    }
    let web = n.bind(p);
    let action = n.sync(&web).await;
    assert_eq!(action, Action::await_change());
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    assert_eq!(n.api_calls(), [WEB_STATUS]);
    let st = n.status("web");
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(st.reason.as_deref(), Some("SysctlForbidden"));
    assert!(
        st.message
            .as_deref()
            .is_some_and(|m| m.starts_with("Pod was rejected: ")),
        "{:?}",
        st.message
    );
    n.event("SysctlForbidden", "kernel.msgmax").await;
    // It stays rejected: the next sync neither starts nor patches it.
    n.sync_watched("web").await;
    assert_eq!((n.cri_calls(), n.api_calls()), (vec![], vec![]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_does_not_fit_beside_the_admitted_ones_is_failed_out_of_cpu() {
    let mut n = Node::start().await;
    let cpu = |p: &mut Pod, amount: &str| {
        edit_container(p, |c| {
            c.resources = Some(ResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "cpu".to_string(),
                    Quantity(amount.into()),
                )])),
                ..Default::default()
            });
        });
    };
    let mut big = pod("big").container("c", IMAGE).build();
    cpu(&mut big, "3");
    big.metadata.creation_timestamp = Some(Time(crate::fixtures::t(0)));
    let mut more = pod("more").container("c", IMAGE).build();
    cpu(&mut more, "1500m");
    more.metadata.creation_timestamp = Some(Time(crate::fixtures::t(10)));
    let big = n.bind(big);
    let more = n.bind(more);
    // The newer pod is synced first; the older one is admitted before it.
    n.sync(&more).await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    let st = n.status("more");
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(st.reason.as_deref(), Some("OutOfcpu"));
    assert_eq!(
        st.message.as_deref(),
        Some(
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 1500, used: 3000, capacity: 4000"
        )
    );
    n.event("OutOfcpu", "Node didn't have enough resource: cpu")
        .await;
    n.sync(&big).await;
    assert_eq!(n.cri_calls()[0], "RunPodSandbox default/big");
}
