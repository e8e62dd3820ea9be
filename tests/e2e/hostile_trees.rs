//! Volume trees a container shapes to defeat the agent's walkers, on the
//! local cluster (`hack/local-up.sh --agent rustlet`): 400 nested
//! directories (a walk with a depth limit could not remove them, and the
//! pod stayed Terminating) and a file below 20 directories with 255-byte
//! names (its path passes PATH_MAX, and a walker by paths left it out of
//! the volume's usage, so of its `sizeLimit` and the pod's ephemeral
//! storage). The usage counts the hidden file, and the pod's deletion
//! completes with its directory gone.

use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;

/// Eight mebibytes, below 20 levels of 255-byte names.
const HIDDEN: u64 = 8 << 20;

/// The script: 400 nested directories, then the PATH_MAX-hiding tree,
/// built from the bottom up (each level moved into a new parent, as no
/// shell can `cd` past PATH_MAX), then `ready`.
const SCRIPT: &str = "set -e; cd /scratch; mkdir deep; cd deep; i=0; \
    while [ $i -lt 400 ]; do mkdir d; cd d; i=$((i+1)); done; echo x > f; \
    cd /scratch; n=$(head -c 255 /dev/zero | tr '\\0' n); mkdir -p a/$n; \
    dd if=/dev/zero of=a/$n/hidden bs=1M count=8 2>/dev/null; i=1; \
    while [ $i -lt 20 ]; do mkdir -p b/$n; mv a/$n b/$n/$n; rmdir a; mv b a; i=$((i+1)); done; \
    sync; touch /scratch/ready; exec sleep 3600";

/// The `usedBytes` of volume `volume` of pod `uid` in the node's stats
/// summary, if it is there yet.
async fn volume_used(client: &kube::Client, uid: &str, volume: &str) -> Option<u64> {
    let summary: serde_json::Value =
        serde_json::from_str(&scrape(client, "stats/summary").await).ok()?;
    summary["pods"]
        .as_array()?
        .iter()
        .find(|p| p["podRef"]["uid"] == uid)?["volume"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == volume)?["usedBytes"]
        .as_u64()
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn deep_and_path_max_hiding_trees_are_counted_and_removed() {
    let client = client().await;
    let ns = namespace(&client, "e2e-trees").await;
    let pod: Pod = from_json(serde_json::json!({
        "metadata": { "name": "trees" },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", SCRIPT],
                "readinessProbe": { "exec": { "command": ["cat", "/scratch/ready"] }, "periodSeconds": 1 },
                "volumeMounts": [{ "name": "scratch", "mountPath": "/scratch" }]
            }],
            "volumes": [{ "name": "scratch", "emptyDir": {} }]
        }
    }));
    let uid = create(&client, &ns, &pod).await.metadata.uid.expect("uid");
    wait_for(
        &client,
        &ns,
        "trees",
        120,
        "ready",
        condition_is("Ready", "True"),
    )
    .await;
    // Measured in the background every volumeStatsAggPeriod (1 m): the
    // measurement after the file was written counts it.
    let start = Instant::now();
    let mut used = None;
    while start.elapsed() < Duration::from_secs(150) {
        used = volume_used(&client, &uid, "scratch").await;
        if used.is_some_and(|b| b >= HIDDEN) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    assert!(
        used.is_some_and(|b| b >= HIDDEN),
        "the volume's usage leaves out the file past PATH_MAX: {used:?} bytes after {:?}",
        start.elapsed()
    );
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("trees", &DeleteParams::default())
        .await
        .expect("delete");
    wait_deleted(&client, &ns, "trees", &uid, 90).await;
    let dir = rustlet_root().join("pods").join(&uid);
    assert!(!dir.exists(), "{} is left", dir.display());
    drop_namespace(&client, &ns).await;
}
