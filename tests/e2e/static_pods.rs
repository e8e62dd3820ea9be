//! Static pods end to end, on the local cluster: a manifest dropped into the
//! agent's `staticPodPath` (`_output/local/rustlet/manifests`) runs and gets
//! a mirror pod; deleting the mirror pod makes it again without touching the
//! pod; editing the manifest replaces the pod; a bad manifest is one log
//! line and changes nothing; removing the manifest stops the containers and
//! deletes the mirror pod.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use rustlet::labels::POD_UID_LABEL;
use rustlet::static_pod::{
    CONFIG_HASH_ANNOTATION, CONFIG_MIRROR_ANNOTATION, CONFIG_SOURCE_ANNOTATION, annotation,
};

/// CRI `CONTAINER_RUNNING`.
const RUNNING: i32 = 1;
/// CRI `SANDBOX_READY`.
const SANDBOX_READY: i32 = 0;

fn manifests() -> PathBuf {
    local().join("rustlet/manifests")
}

fn manifest(ns: &str, message: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  namespace: {ns}\n  labels:\n    app: web\n\
         spec:\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    image: {BUSYBOX}\n\
         \x20   command: [\"sh\", \"-c\", \"echo {message}; exec sleep 3600\"]\n"
    )
}

/// The mirror pod, once it exists with a UID other than `not`, Running.
async fn running_mirror(
    client: &kube::Client,
    ns: &str,
    name: &str,
    not: Option<&str>,
    secs: u64,
) -> Pod {
    let not = not.map(str::to_string);
    let what = "a new mirror pod, Running";
    wait_for(client, ns, name, secs, what, move |p: Option<&Pod>| {
        p.is_some_and(|p| {
            p.metadata.uid != not
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
    })
    .await
}

fn container_id(p: &Pod) -> String {
    container_status(p).container_id.unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_static_pod_lives_and_ends_with_its_manifest() {
    let client = client().await;
    let ns = namespace(&client, "static").await;
    let node = node_name();
    let mirror_name = format!("web-{node}");
    let file = manifests().join(format!("{ns}-web.yaml"));
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // Dropped in: it runs, and its mirror pod appears within 20 s.
    let started = Instant::now();
    std::fs::write(&file, manifest(&ns, "v1")).expect("write the manifest");
    wait_for(
        &client,
        &ns,
        &mirror_name,
        20,
        "a mirror pod",
        |p: Option<&Pod>| p.is_some(),
    )
    .await;
    let appeared = started.elapsed();
    let mirror = running_mirror(&client, &ns, &mirror_name, None, 60).await;
    eprintln!(
        "manifest -> mirror pod: {appeared:?}; -> Running: {:?}",
        started.elapsed()
    );
    let hash = annotation(&mirror, CONFIG_HASH_ANNOTATION)
        .expect("config.hash")
        .to_string();
    assert_eq!(
        annotation(&mirror, CONFIG_MIRROR_ANNOTATION),
        Some(hash.as_str())
    );
    assert_eq!(annotation(&mirror, CONFIG_SOURCE_ANNOTATION), Some("file"));
    assert_ne!(
        mirror.metadata.uid.as_deref(),
        Some(hash.as_str()),
        "the mirror pod has its own UID"
    );
    let owner = &mirror.metadata.owner_references.clone().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("Node", node.as_str())
    );
    assert_eq!(owner.controller, Some(true));
    assert_eq!(
        mirror.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node.as_str())
    );
    // The containers run under the static pod's own UID (its hash).
    let rt = runtime().await;
    let by_uid = |uid: &str| HashMap::from([(POD_UID_LABEL.to_string(), uid.to_string())]);
    let running = rt
        .list_containers(by_uid(&hash))
        .await
        .expect("list containers");
    assert_eq!(running.len(), 1, "one container of the static pod");
    let first_container = container_id(&mirror);
    assert!(
        first_container.ends_with(&running[0].id),
        "{first_container} vs {}",
        running[0].id
    );

    // The pod gauges count it as the kubelet's housekeeping does (every
    // 2 s): a static pod worked on, desired and active, with a mirror pod.
    // Other tests' pods may be counted too, so at least one.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape(&client, "metrics").await;
        let at_least_one = [
            r#"kubelet_working_pods{lifecycle="sync",config="desired",static="true"}"#,
            r#"kubelet_desired_pods{static="true"}"#,
            r#"kubelet_active_pods{static="true"}"#,
            "kubelet_mirror_pods",
        ]
        .map(|series| sample(&text, series).unwrap_or(0.0) >= 1.0);
        if at_least_one.iter().all(|ok| *ok) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the pod gauges do not count the static pod: {:#?}",
            text.lines()
                .filter(|l| l.contains("_pods"))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Its logs, through the API server, as `kubectl logs` reads them.
    let logs = api
        .logs(
            &mirror_name,
            &kube::api::LogParams {
                container: Some("c".into()),
                ..Default::default()
            },
        )
        .await
        .expect("the static pod's logs through its mirror pod");
    assert!(logs.contains("v1"), "{logs:?}");

    // The mirror pod deleted (gracefully, as kubectl does): made again, and
    // the pod itself goes on.
    let mirror_uid = mirror.metadata.uid.clone().expect("uid");
    api.delete(&mirror_name, &DeleteParams::default())
        .await
        .expect("delete the mirror pod");
    let again = running_mirror(&client, &ns, &mirror_name, Some(&mirror_uid), 60).await;
    assert_eq!(
        container_id(&again),
        first_container,
        "the static pod did not restart"
    );
    assert_eq!(container_status(&again).restart_count, 0);

    // A bad manifest beside it: one log line, nothing else changes, even
    // after a periodic reading (20 s).
    let bad = manifests().join(format!("{ns}-bad.yaml"));
    let log_before = agent_log().len();
    std::fs::write(
        &bad,
        "apiVersion: v1\nkind: Pod\nmetadata: [not, a, mapping]\n",
    )
    .expect("bad manifest");
    tokio::time::sleep(Duration::from_secs(25)).await;
    let log = agent_log();
    let bad_name = bad.display().to_string();
    let lines: Vec<&str> = log[log_before.min(log.len())..]
        .lines()
        .filter(|l| l.contains(&bad_name))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "one log line for the bad manifest: {lines:#?}"
    );
    assert!(lines[0].contains("couldn't parse as pod"), "{}", lines[0]);
    let unchanged = api.get(&mirror_name).await.expect("mirror pod");
    assert_eq!(unchanged.metadata.uid, again.metadata.uid);
    assert_eq!(container_id(&unchanged), first_container);
    std::fs::remove_file(&bad).expect("remove the bad manifest");

    // Edited: the old pod stops, the new one runs under a new mirror pod.
    std::fs::write(&file, manifest(&ns, "v2")).expect("edit the manifest");
    let edited = running_mirror(
        &client,
        &ns,
        &mirror_name,
        again.metadata.uid.as_deref(),
        90,
    )
    .await;
    let new_hash = annotation(&edited, CONFIG_HASH_ANNOTATION)
        .expect("config.hash")
        .to_string();
    assert_ne!(new_hash, hash, "an edited manifest is a new pod");
    assert_ne!(container_id(&edited), first_container);
    let old = rt
        .list_containers(by_uid(&hash))
        .await
        .expect("list containers");
    assert!(
        old.iter().all(|c| c.state != RUNNING),
        "the old version's containers stopped: {old:?}"
    );

    // Removed: its containers stop and its mirror pod is deleted.
    std::fs::remove_file(&file).expect("remove the manifest");
    let edited_uid = edited.metadata.uid.clone().expect("uid");
    wait_deleted(&client, &ns, &mirror_name, &edited_uid, 60).await;
    let left = rt
        .list_containers(by_uid(&new_hash))
        .await
        .expect("list containers");
    assert!(
        left.iter().all(|c| c.state != RUNNING),
        "containers running: {left:?}"
    );
    let sandboxes = rt
        .list_pod_sandboxes(by_uid(&new_hash))
        .await
        .expect("list sandboxes");
    assert!(
        sandboxes.iter().all(|s| s.state != SANDBOX_READY),
        "sandboxes ready: {sandboxes:?}"
    );
    drop_namespace(&client, &ns).await;
}
