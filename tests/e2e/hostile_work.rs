//! Pod content that asks the agent for unbounded work, on the local cluster
//! (`hack/local-up.sh --agent rustlet`): pull secrets whose registry key is a
//! glob that a backtracking matcher never finishes against the image's host
//! (it held the agent's async workers, its lease and every other pod), and
//! pods with a megabyte of labels each (their sandboxes' labels made
//! the runtime's unfiltered sandbox list larger than a CRI message, and the
//! eviction manager, container GC and stats stopped). Through both, another
//! pod still starts, the Lease is renewed and the eviction manager acts.

use std::time::Instant;

use crate::common::*;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::PostParams;

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_glob_bomb_pull_secret_leaves_the_agent_working() {
    let client = client().await;
    let ns = namespace(&client, "e2e-glob-bomb").await;
    // `*a` 20 times then `*c`, against a host of 60 `a`s: C(60, 20) ways to
    // place the stars for a matcher that backtracks, none of which matches.
    let key = format!("{}*c.x", "*a".repeat(20));
    let host = format!("{}.x", "a".repeat(60));
    let config = serde_json::json!({ "auths": { key: { "auth": "dTpw" } } });
    let secret: Secret = from_json(serde_json::json!({
        "metadata": { "name": "bomb" },
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": { ".dockerconfigjson": config.to_string() }
    }));
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("secret");
    // More pods than the agent has async workers on this machine (one per
    // cpu, two here): each held one for good with a backtracking matcher.
    for i in 0..3 {
        create(&client, &ns, &from_json(serde_json::json!({
            "metadata": { "name": format!("bomb-{i}") },
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "imagePullSecrets": [{ "name": "bomb" }],
                "containers": [{ "name": "c", "image": format!("{host}/img:1"), "imagePullPolicy": "Always" }]
            }
        })))
        .await;
    }
    // Each is looked up against the key (and its pull then fails: no such
    // registry); meanwhile the node goes on.
    wait_for(
        &client,
        &ns,
        "bomb-0",
        60,
        "a pull error",
        |p: Option<&Pod>| {
            p.and_then(waiting)
                .is_some_and(|r| r == "ErrImagePull" || r == "ImagePullBackOff")
        },
    )
    .await;
    let started = Instant::now();
    create(
        &client,
        &ns,
        &pod("normal", "Always", BUSYBOX, &["sleep", "3600"]),
    )
    .await;
    wait_for(&client, &ns, "normal", 60, "Running", phase("Running")).await;
    println!(
        "a normal pod beside the bombs: Running in {:?}",
        started.elapsed()
    );
    lease_renewed(&client, 20).await;
    drop_namespace(&client, &ns).await;
}

/// A pod of `size` bytes of labels (keys `k-<n>`, 63-character values).
fn labelled(name: &str, size: usize) -> k8s_openapi::api::core::v1::Pod {
    let value = "v".repeat(63);
    let labels: serde_json::Map<String, serde_json::Value> = (0..size / 70)
        .map(|i| {
            (
                format!("k-{i:05}"),
                serde_json::Value::String(value.clone()),
            )
        })
        .collect();
    from_json(serde_json::json!({
        "metadata": { "name": name, "labels": labels },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{ "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"] }]
        }
    }))
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn pods_with_a_megabyte_of_labels_leave_the_runtime_lists_and_eviction_working() {
    let client = client().await;
    let ns = namespace(&client, "e2e-big-labels").await;
    // Five pods of 1 MB of labels (each well under etcd's 1.5 MiB object
    // limit): 5 MB of sandbox labels, past the 4 MiB a CRI answer could take.
    for i in 0..5 {
        create(&client, &ns, &labelled(&format!("big-{i}"), 1_000_000)).await;
    }
    for i in 0..5 {
        wait_for(
            &client,
            &ns,
            &format!("big-{i}"),
            120,
            "Running",
            phase("Running"),
        )
        .await;
    }
    // The runtime got the pods without their labels, and said so.
    let note = wait_for_events(
        &client,
        &ns,
        Involving::Any,
        30,
        "five SandboxMetadataOmitted events",
        |evs| messages(evs, "SandboxMetadataOmitted").filter(|m| m.len() >= 5),
    )
    .await;
    assert!(
        note.iter()
            .all(|m| m.ends_with("its labels were not passed to the container runtime")),
        "{note:?}"
    );
    // Every sandbox of the node in one unfiltered list, as the eviction
    // manager, container GC and stats read them.
    let sandboxes = runtime()
        .await
        .list_pod_sandboxes(std::collections::HashMap::new())
        .await
        .expect("ListPodSandbox");
    assert!(sandboxes.len() >= 5, "{} sandboxes", sandboxes.len());
    // And the eviction manager still acts: a pod over its emptyDir limit goes.
    create(&client, &ns, &from_json(serde_json::json!({
        "metadata": { "name": "over" },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "dd if=/dev/zero of=/scratch/fill bs=1M count=20; sleep 3600"],
                "volumeMounts": [{ "name": "scratch", "mountPath": "/scratch" }]
            }],
            "volumes": [{ "name": "scratch", "emptyDir": { "sizeLimit": "10Mi" } }]
        }
    })))
    .await;
    let evicted = wait_for(&client, &ns, "over", 120, "evicted", phase("Failed")).await;
    assert_eq!(
        evicted.status.and_then(|s| s.reason).as_deref(),
        Some("Evicted")
    );
    drop_namespace(&client, &ns).await;
}
