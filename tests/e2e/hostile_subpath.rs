//! A hostile pod against the subPath code (the CVE-2017-1002101 and
//! CVE-2021-25741 class), on the local cluster (`hack/local-up.sh --agent
//! rustlet`): an init container plants symlinks out of an emptyDir (to `/`,
//! to `/etc`, to `../../..`), and containers mount them as subPaths. Those
//! containers wait with `CreateContainerConfigError` and a `Failed` event,
//! nothing is created on the host, and the subPaths that stay in the volume
//! (a directory, a file, missing directories, read-only) are bind-mounted
//! under `<root-dir>/pods/<uid>/volume-subpaths/` and unmounted when the pod
//! goes. The env files of `fileKeyRef` are read the same way: a symlink out
//! of the volume, a FIFO or an oversized file fails its container, never the
//! node.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::DeleteParams;
use kube::runtime::wait::Condition;
use kube::{Api, ResourceExt};

/// The status of container `name`.
fn status_of(p: &Pod, name: &str) -> Option<ContainerStatus> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == name)
        .cloned()
}

/// Container `good` runs and every one of `bad` waits with `CreateContainerConfigError`.
fn settled(bad: &'static [&'static str]) -> impl Condition<Pod> {
    move |p: Option<&Pod>| {
        let Some(p) = p else { return false };
        let running = status_of(p, "good")
            .and_then(|s| s.state?.running)
            .is_some();
        running
            && bad.iter().all(|c| {
                status_of(p, c)
                    .and_then(|s| s.state?.waiting?.reason)
                    .as_deref()
                    == Some("CreateContainerConfigError")
            })
    }
}

/// Waits up to 30 s for the container log at `log` to hold every one of `wanted`.
async fn wait_for_log(log: &Path, wanted: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if wanted.iter().all(|w| text.contains(w)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} lacks {wanted:?}:\n{text}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Creates `pod` in `ns` and waits up to 90 s until it is [`settled`]:
/// returns its UID and the pod as it then is.
async fn create_and_settle(
    client: &kube::Client,
    ns: &str,
    pod: &Pod,
    bad: &'static [&'static str],
) -> (String, Pod) {
    let p = create(client, ns, pod).await;
    let uid = p.uid().unwrap();
    let name = p.name_any();
    let now = wait_for(
        client,
        ns,
        &name,
        90,
        "good running and the others in CreateContainerConfigError",
        settled(bad),
    )
    .await;
    (uid, now)
}

/// Waits up to 30 s until every container in `names` has a `Failed` event
/// whose message is about its subPath, as the kubelet's `Error: ...` events.
async fn failed_events_for(client: &kube::Client, ns: &str, names: &[&str]) {
    wait_for_events(
        client,
        ns,
        Involving::Any,
        30,
        "a Failed event for each bad container",
        |events| {
            let failed: Vec<String> = events
                .iter()
                .filter(|e| e.reason.as_deref() == Some("Failed"))
                .filter_map(|e| {
                    Some(format!(
                        "{}: {}",
                        e.involved_object.field_path.as_deref()?,
                        e.message.as_deref()?
                    ))
                })
                .collect();
            names
                .iter()
                .all(|c| {
                    failed.iter().any(|e| {
                        e.starts_with(&format!("spec.containers{{{c}}}: Error: "))
                            && e.contains("subPath")
                    })
                })
                .then_some(())
        },
    )
    .await;
}

fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}-{}-{nanos}", std::process::id())
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn symlinks_planted_in_a_volume_never_reach_the_host() {
    let client = client().await;
    let ns = namespace(&client, "e2e-subpath").await;
    // Two host paths the hostile subPaths would create: through an absolute
    // symlink to `/` and through a relative one climbing out of the volume.
    let canary = unique("rustlet-subpath-canary");
    let canary_up = unique("rustlet-subpath-canary-up");
    let host_canary = Path::new("/tmp").join(&canary);
    let host_canary_up = Path::new("/tmp").join(&canary_up);
    let plant = "mkdir -p /vol/data && echo from-the-volume > /vol/data/file.txt && \
                 ln -s / /vol/escape && ln -s /etc /vol/etc && \
                 ln -s ../../../../../../../../../../../../../../../../../../../../tmp /vol/up && \
                 ln -s /etc/hostname /vol/hostname && ln -s data /vol/inside";
    let good = "echo \"file=$(cat /file.txt)\"; ls /data/file.txt && echo dir-listed; \
                echo \"link=$(cat /inside/file.txt)\"; \
                echo made > /made/x && echo made-written; \
                touch /ro/y 2>/dev/null || echo ro-refused; sleep 3600";
    let waiter = ["sh", "-c", "echo should-not-run; sleep 3600"];
    let bad = |name: &str, sub: &str| {
        serde_json::json!({
            "name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": waiter,
            "volumeMounts": [{ "name": "vol", "mountPath": "/mnt", "subPath": sub }]
        })
    };
    let pod: Pod = from_json(serde_json::json!({
        "metadata": { "name": "hostile" },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "initContainers": [{
                "name": "plant", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", plant],
                "volumeMounts": [{ "name": "vol", "mountPath": "/vol" }]
            }],
            "containers": [
                {
                    "name": "good", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", good],
                    "volumeMounts": [
                        { "name": "vol", "mountPath": "/data", "subPath": "data" },
                        { "name": "vol", "mountPath": "/file.txt", "subPath": "data/file.txt" },
                        { "name": "vol", "mountPath": "/inside", "subPath": "inside" },
                        { "name": "vol", "mountPath": "/made", "subPath": "made/deep/er" },
                        { "name": "vol", "mountPath": "/ro", "subPath": "data", "readOnly": true }
                    ]
                },
                bad("escape", &format!("escape/tmp/{canary}")),
                bad("etc", "etc"),
                bad("up", &format!("up/{canary_up}")),
                bad("hostname", "hostname")
            ],
            "volumes": [{ "name": "vol", "emptyDir": {} }]
        }
    }));
    let bad_names: &'static [&'static str] = &["escape", "etc", "up", "hostname"];
    let (uid, now) = create_and_settle(&client, &ns, &pod, bad_names).await;

    // Nothing was made on the host through the planted symlinks.
    assert!(
        !host_canary.exists(),
        "{} was created through the symlink to /",
        host_canary.display()
    );
    assert!(
        !host_canary_up.exists(),
        "{} was created through the symlink to ../..",
        host_canary_up.display()
    );

    for c in bad_names {
        let waiting = status_of(&now, c).and_then(|s| s.state?.waiting).unwrap();
        let message = waiting.message.unwrap_or_default();
        assert!(
            message.contains("subPath") && message.contains(&format!("container \"{c}\"")),
            "{c}: {message}"
        );
        assert!(
            !std::fs::read_to_string(log_path(&ns, "hostile", &uid, c))
                .unwrap_or_default()
                .contains("should-not-run"),
            "{c} ran"
        );
    }
    // Events are posted apart from the status, so they may trail it.
    failed_events_for(&client, &ns, bad_names).await;

    // The subPaths inside the volume work: a directory, a file, a symlink
    // inside the volume, missing directories made beneath it, read-only.
    wait_for_log(
        &log_path(&ns, "hostile", &uid, "good"),
        &[
            "file=from-the-volume",
            "dir-listed",
            "link=from-the-volume",
            "made-written",
            "ro-refused",
        ],
    )
    .await;
    let pod_dir = rustlet_root().join("pods").join(&uid);
    let vol = pod_dir.join("volumes/kubernetes.io~empty-dir/vol");
    assert_eq!(
        std::fs::read_to_string(vol.join("made/deep/er/x")).unwrap(),
        "made\n"
    );
    // The runtime was given the bind mounts, one per subPath mount of `good`,
    // at the kubelet's <pod>/volume-subpaths/<volume>/<container>/<index>.
    let subpaths = pod_dir.join("volume-subpaths");
    let mut binds = mounted_under(&subpaths);
    binds.sort();
    let expected: Vec<String> = (0..5)
        .map(|i| subpaths.join(format!("vol/good/{i}")).display().to_string())
        .collect();
    assert_eq!(binds, expected);

    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("hostile", &DeleteParams::default())
        .await
        .expect("delete pod");
    wait_deleted(&client, &ns, "hostile", &uid, 60).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while pod_dir.exists() {
        assert!(
            Instant::now() < deadline,
            "pod directory {} left after deletion",
            pod_dir.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(mounted_under(&pod_dir), Vec::<String>::new());
    assert!(!host_canary.exists() && !host_canary_up.exists());
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn env_files_are_read_from_the_volume_and_nowhere_else() {
    let client = client().await;
    let ns = namespace(&client, "e2e-envfile").await;
    // The init container writes an env file, and plants a symlink to a host
    // file, a FIFO (a reader that opened it would hang) and a file over the cap.
    let plant = "printf \"CONFIG_1='value1'\\nMULTI='a\\nb'\\n\" > /vol/config.env && \
                 ln -s /etc/hostname /vol/host.env && mkfifo /vol/fifo.env && \
                 head -c 1048577 /dev/zero | tr '\\0' x > /vol/big.env";
    let file_env = |name: &str, path: &str, key: &str| {
        serde_json::json!({
            "name": name,
            "valueFrom": { "fileKeyRef": { "volumeName": "vol", "path": path, "key": key } }
        })
    };
    let waiter = |name: &str, path: &str| {
        serde_json::json!({
            "name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "echo should-not-run; sleep 3600"],
            "env": [file_env("X", path, "CONFIG_1")]
        })
    };
    let pod: Pod = from_json(serde_json::json!({
        "metadata": { "name": "envfile" },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "initContainers": [{
                "name": "plant", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", plant],
                "volumeMounts": [{ "name": "vol", "mountPath": "/vol" }]
            }],
            "containers": [
                {
                    "name": "good", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", "echo \"one=$CONFIG_1 multi=$(echo $MULTI)\"; sleep 3600"],
                    "env": [
                        file_env("CONFIG_1", "config.env", "CONFIG_1"),
                        file_env("MULTI", "config.env", "MULTI")
                    ]
                },
                waiter("escape", "host.env"),
                waiter("fifo", "fifo.env"),
                waiter("big", "big.env"),
                waiter("missing", "missing.env")
            ],
            "volumes": [{ "name": "vol", "emptyDir": {} }]
        }
    }));
    let bad: &'static [&'static str] = &["escape", "fifo", "big", "missing"];
    let (uid, now) = create_and_settle(&client, &ns, &pod, bad).await;
    let expected = [
        ("escape", "leaves volume"),
        ("fifo", "is not a regular file"),
        ("big", "is larger than 1048576 bytes"),
        ("missing", "No such file"),
    ];
    for (c, why) in expected {
        let message = status_of(&now, c)
            .and_then(|s| s.state?.waiting?.message)
            .unwrap_or_default();
        assert!(
            message.starts_with("couldn't parse env file: ") && message.contains(why),
            "{c}: {message}"
        );
        assert!(!message.contains(&std::fs::read_to_string("/etc/hostname").unwrap()));
    }
    wait_for_log(
        &log_path(&ns, "envfile", &uid, "good"),
        &["one=value1 multi=a b"],
    )
    .await;
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("envfile", &DeleteParams::default())
        .await
        .expect("delete pod");
    wait_deleted(&client, &ns, "envfile", &uid, 60).await;
    drop_namespace(&client, &ns).await;
}
