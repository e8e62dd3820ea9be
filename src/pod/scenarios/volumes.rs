//! Volumes before containers: a pod waits for its volumes, and for its claim to be bound.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_waits_for_its_volumes_before_anything_starts() {
    let mut n = Node::start().await;
    let mut p = pod("web").container("c", IMAGE).build();
    if let Some(spec) = p.spec.as_mut() {
        spec.volumes = Some(vec![Volume {
            name: "cfg".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: "settings".into(),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        spec.containers[0].volume_mounts = Some(vec![VolumeMount {
            name: "cfg".into(),
            mount_path: "/etc/settings".into(),
            ..Default::default()
        }]);
    }
    let web = n.bind(p);
    let action = n.sync(&web).await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    assert_eq!(
        n.api_calls(),
        [
            "GET /api/v1/namespaces/default/configmaps/settings",
            WEB_STATUS
        ]
    );
    assert_eq!(requeue(&action), Some(crate::pod_core::plan::VOLUME_RETRY));
    let st = n.status("web");
    assert_eq!(st.phase.as_deref(), Some("Pending"));
    assert_eq!(state(&st, "c").0, "waiting:ContainerCreating");
    n.event("FailedMount", "settings").await;
    // The ConfigMap appears: the pod starts.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": "default"}, "data": {"k": "v"}});
    n.api.put("configmaps", "settings", cm);
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    assert_eq!(state(&n.status("web"), "c").0, "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_waits_for_its_claim_to_be_bound_then_runs_on_the_bound_volume() {
    let mut n = Node::start().await;
    let data = tempfile::tempdir().expect("tempdir");
    let mut p = pod("web").container("c", IMAGE).build();
    if let Some(spec) = p.spec.as_mut() {
        spec.volumes = Some(vec![Volume {
            name: "data".into(),
            persistent_volume_claim: Some(
                k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource {
                    claim_name: "data-claim".into(),
                    read_only: None,
                },
            ),
            ..Default::default()
        }]);
        spec.containers[0].volume_mounts = Some(vec![VolumeMount {
            name: "data".into(),
            mount_path: "/data".into(),
            ..Default::default()
        }]);
    }
    let claim = |phase: &str| {
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data-claim", "namespace": "default", "uid": "claim-uid"},
            "spec": {"volumeName": "pv-data"},
            "status": {"phase": phase}})
    };
    n.api
        .put("persistentvolumeclaims", "data-claim", claim("Pending"));
    let web = n.bind(p);
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), Vec::<String>::new(), "nothing starts");
    assert_eq!(
        n.api_calls(),
        [
            "GET /api/v1/namespaces/default/persistentvolumeclaims/data-claim",
            WEB_STATUS
        ]
    );
    n.event(
        "FailedMount",
        "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], failed to process volumes=[data]: error processing PVC default/data-claim: PVC is not bound",
    )
    .await;
    // Bound: the pod starts, with the volume's path mounted.
    n.api
        .put("persistentvolumeclaims", "data-claim", claim("Bound"));
    n.api.put_cluster(
        "persistentvolumes",
        "pv-data",
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-data"},
            "spec": {"hostPath": {"path": data.path()},
                "claimRef": {"name": "data-claim", "namespace": "default", "uid": "claim-uid"}}}),
    );
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    let c = n.cri.containers().pop().expect("container");
    assert_eq!(state(&n.status("web"), "c").0, "running");
    let host = data.path().display().to_string();
    assert!(
        c.mounts
            .iter()
            .any(|m| m.host_path == host && m.container_path == "/data" && !m.readonly),
        "{:?}",
        c.mounts
    );
    // Read once: later syncs do not ask again.
    n.api_calls();
    n.sync_watched("web").await;
    assert!(
        n.api_calls()
            .iter()
            .all(|c| !c.contains("persistentvolume")),
        "the claim is read once"
    );
}
