//! Persistent storage on the local cluster (`hack/local-up.sh --agent
//! rustlet`), with the control plane's own binder: a PersistentVolumeClaim
//! bound to a `hostPath` PersistentVolume keeps its data from one pod to
//! the next; a `local` PersistentVolume serves a pod on the node its node
//! affinity names and refuses one bound elsewhere; a generic ephemeral
//! volume's claim, made by the control plane for the pod, is bound and
//! served; a claim that never binds keeps its pod Pending with the
//! kubelet's Event while the agent serves every other pod; a `local`
//! PersistentVolume of `volumeMode: Block` (a loop device) is passed to the
//! container that names it in `volumeDevices`; an image volume
//! serves the image's files read-only, a subPath of it that directory of
//! the image (one the image lacks fails the container's creation), and one
//! whose image may not be pulled keeps its container waiting.

use crate::common::*;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client, ResourceExt};

/// A PersistentVolume `name` of class `class` (1 GiB, ReadWriteOnce,
/// Retain) with `source` (`{"hostPath": …}` or `{"local": …}`) and,
/// optionally, node affinity to nodes whose hostname label is `node`.
fn volume(
    name: &str,
    class: &str,
    source: serde_json::Value,
    node: Option<&str>,
) -> PersistentVolume {
    let mut spec = serde_json::json!({
        "capacity": { "storage": "1Gi" },
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": class,
    });
    if let (Some(spec), Some(source)) = (spec.as_object_mut(), source.as_object()) {
        spec.extend(source.clone());
    }
    if let Some(node) = node {
        spec["nodeAffinity"] = serde_json::json!({"required": {"nodeSelectorTerms": [{
            "matchExpressions": [{
                "key": "kubernetes.io/hostname", "operator": "In", "values": [node],
            }],
        }]}});
    }
    from_json(serde_json::json!({ "metadata": { "name": name }, "spec": spec }))
}

/// A claim `name` of class `class` for 1 GiB, ReadWriteOnce.
fn claim(name: &str, class: &str) -> PersistentVolumeClaim {
    from_json(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "resources": { "requests": { "storage": "1Gi" } },
        }
    }))
}

/// A busybox pod `name` running `script` with volume `volume` (a pod
/// volume source, JSON) mounted at `/data`; bound to `node` directly when
/// given (past the scheduler), else scheduled.
fn user(name: &str, volume: serde_json::Value, script: &str, node: Option<&str>) -> Pod {
    let mut v = serde_json::json!({ "name": "data" });
    if let (Some(v), Some(source)) = (v.as_object_mut(), volume.as_object()) {
        v.extend(source.clone());
    }
    let mut pod = serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "volumes": [v],
            "containers": [{
                "name": "c",
                "image": BUSYBOX,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script],
                "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
            }],
        }
    });
    if let Some(node) = node {
        pod["spec"]["nodeName"] = serde_json::json!(node);
    }
    from_json(pod)
}

/// A directory of the host for a volume, made fresh.
fn host_dir(name: &str) -> std::path::PathBuf {
    let dir = local().join("e2e-volumes").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("host dir");
    dir
}

/// The hostname label of the node under test.
async fn hostname(client: &Client) -> String {
    let node = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get(&node_name())
        .await
        .expect("get node");
    node.labels()
        .get("kubernetes.io/hostname")
        .cloned()
        .unwrap_or_else(node_name)
}

/// Creates the volumes (removing any left by an earlier run).
async fn create_volumes(client: &Client, volumes: &[PersistentVolume]) {
    let api: Api<PersistentVolume> = Api::all(client.clone());
    for v in volumes {
        let name = v.name_any();
        let _ = api.delete(&name, &DeleteParams::default()).await;
        for _ in 0..60 {
            if api.get_opt(&name).await.expect("get pv").is_none() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        api.create(&PostParams::default(), v)
            .await
            .expect("create pv");
    }
}

/// A namespace named after `prefix`, and a `hostPath` PersistentVolume of a
/// class of its own on a fresh host directory: (namespace, class, host
/// directory, volume name).
async fn with_host_path_volume(
    client: &Client,
    prefix: &str,
) -> (String, String, std::path::PathBuf, String) {
    let ns = namespace(client, prefix).await;
    let class = format!("{prefix}-{ns}");
    let dir = host_dir(&ns);
    let pv = format!("{ns}-pv");
    let source = serde_json::json!({"hostPath": {"path": dir, "type": "Directory"}});
    create_volumes(client, &[volume(&pv, &class, source, None)]).await;
    (ns, class, dir, pv)
}

/// Creates pod `name` using claim `claim`, bound to the node under test
/// past the scheduler, and waits (60 s) for its `FailedMount` Event whose
/// message contains `needle`; that message.
async fn failed_mount_when_bound_here(
    client: &Client,
    ns: &str,
    name: &str,
    claim: &str,
    needle: &str,
) -> String {
    let source = serde_json::json!({"persistentVolumeClaim": {"claimName": claim}});
    let pod = create(client, ns, &user(name, source, "true", Some(&node_name()))).await;
    let uid = pod.uid().unwrap_or_default();
    wait_for_events(
        client,
        ns,
        Involving::Uid(&uid),
        60,
        "FailedMount",
        |events| {
            messages(events, "FailedMount").and_then(|m| m.into_iter().find(|m| m.contains(needle)))
        },
    )
    .await
}

/// Deletes the volumes (best effort).
async fn delete_volumes(client: &Client, names: &[&str]) {
    let api: Api<PersistentVolume> = Api::all(client.clone());
    for name in names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
}

/// Waits (60 s) for pod `name` to succeed; its log.
async fn succeeded(client: &Client, ns: &str, name: &str) -> String {
    wait_for(client, ns, name, 60, "Succeeded", phase("Succeeded")).await;
    let (code, out, err) = kubectl(&["logs", "-n", ns, name], "");
    assert_eq!(code, 0, "logs of {name}: {err}");
    out
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_claim_keeps_its_data_from_one_pod_to_the_next() {
    let client = client().await;
    let (ns, class, dir, pv) = with_host_path_volume(&client, "e2e-pvc").await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    claims
        .create(&PostParams::default(), &claim("data", &class))
        .await
        .expect("create claim");
    let source = serde_json::json!({"persistentVolumeClaim": {"claimName": "data"}});
    let writer = user(
        "writer",
        source.clone(),
        "echo kept > /data/file && cat /data/file",
        None,
    );
    create(&client, &ns, &writer).await;
    assert_eq!(succeeded(&client, &ns, "writer").await.trim(), "kept");
    assert_eq!(
        std::fs::read_to_string(dir.join("file"))
            .expect("the host's file")
            .trim(),
        "kept",
        "written to the bound volume's path"
    );
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("writer", &DeleteParams::default())
        .await
        .expect("delete writer");
    let reader = user("reader", source, "cat /data/file", None);
    create(&client, &ns, &reader).await;
    assert_eq!(succeeded(&client, &ns, "reader").await.trim(), "kept");
    drop_namespace(&client, &ns).await;
    delete_volumes(&client, &[&pv]).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_local_volume_serves_the_node_it_names_and_no_other() {
    let client = client().await;
    let ns = namespace(&client, "e2e-local-pv").await;
    let class = format!("e2e-local-{ns}");
    let here = hostname(&client).await;
    let (dir, other_dir) = (
        host_dir(&format!("{ns}-here")),
        host_dir(&format!("{ns}-other")),
    );
    let (pv, other_pv) = (format!("{ns}-here"), format!("{ns}-other"));
    create_volumes(
        &client,
        &[
            volume(
                &pv,
                &class,
                serde_json::json!({"local": {"path": dir}}),
                Some(&here),
            ),
            volume(
                &other_pv,
                &format!("{class}-other"),
                serde_json::json!({"local": {"path": other_dir}}),
                Some("some-other-node"),
            ),
        ],
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    for (name, class) in [("here", class.clone()), ("other", format!("{class}-other"))] {
        claims
            .create(&PostParams::default(), &claim(name, &class))
            .await
            .expect("create claim");
    }
    let local_user = user(
        "local",
        serde_json::json!({"persistentVolumeClaim": {"claimName": "here"}}),
        "echo local > /data/file && cat /data/file",
        None,
    );
    create(&client, &ns, &local_user).await;
    assert_eq!(succeeded(&client, &ns, "local").await.trim(), "local");
    assert_eq!(
        std::fs::read_to_string(dir.join("file"))
            .expect("the host's file")
            .trim(),
        "local"
    );
    // Bound to this node past the scheduler: the agent checks the volume's
    // node affinity itself, as the kubelet does.
    let found =
        failed_mount_when_bound_here(&client, &ns, "stray", "other", "NodeAffinity check failed")
            .await;
    assert!(found.contains("no matching NodeSelectorTerms"), "{found}");
    let now = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("stray")
        .await
        .expect("get stray");
    assert_eq!(
        now.status.and_then(|s| s.phase).as_deref(),
        Some("Pending"),
        "nothing of it runs"
    );
    assert!(
        std::fs::read_dir(&other_dir)
            .expect("other dir")
            .next()
            .is_none(),
        "the other node's volume is untouched"
    );
    drop_namespace(&client, &ns).await;
    delete_volumes(&client, &[&pv, &other_pv]).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_generic_ephemeral_volume_is_served_and_an_unbound_claim_waits_alone() {
    let client = client().await;
    let (ns, class, _dir, pv) = with_host_path_volume(&client, "e2e-ephemeral").await;
    // The control plane makes the claim `scratch-data` for the pod, owned
    // by it, and binds it to the volume.
    let scratch = user(
        "scratch",
        serde_json::json!({"ephemeral": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "resources": { "requests": { "storage": "1Gi" } },
        }}}}),
        "echo ephemeral > /data/file && cat /data/file",
        None,
    );
    create(&client, &ns, &scratch).await;
    assert_eq!(succeeded(&client, &ns, "scratch").await.trim(), "ephemeral");
    let made = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns)
        .get("scratch-data")
        .await
        .expect("the pod's claim");
    assert_eq!(
        made.spec.and_then(|s| s.volume_name).as_deref(),
        Some(pv.as_str())
    );

    // A claim of a class no volume has never binds: its pod, bound to the
    // node directly, waits with the kubelet's Event; another pod runs.
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns)
        .create(
            &PostParams::default(),
            &claim("never", &format!("{class}-none")),
        )
        .await
        .expect("create claim");
    let found = failed_mount_when_bound_here(&client, &ns, "waiting", "never", "").await;
    assert_eq!(
        found,
        format!(
            "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], failed to process volumes=[data]: error processing PVC {ns}/never: PVC is not bound"
        )
    );
    let other = pod("other", "Never", BUSYBOX, &["true"]);
    create(&client, &ns, &other).await;
    wait_for(&client, &ns, "other", 60, "Succeeded", phase("Succeeded")).await;
    let still = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("waiting")
        .await
        .expect("get waiting");
    assert_eq!(
        still.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );
    drop_namespace(&client, &ns).await;
    delete_volumes(&client, &[&pv]).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn an_image_volume_serves_the_image_read_only() {
    let client = client().await;
    let ns = namespace(&client, "e2e-image-vol").await;
    // The agnhost image's files, under /data, read-only.
    let image = serde_json::json!({"image": {"reference": AGNHOST, "pullPolicy": "IfNotPresent"}});
    let reader = user(
        "reader",
        image,
        "test -x /data/agnhost && ! touch /data/x 2>/dev/null && echo served",
        None,
    );
    create(&client, &ns, &reader).await;
    assert_eq!(succeeded(&client, &ns, "reader").await.trim(), "served");

    // A subPath of an image volume: the runtime mounts that directory of
    // the image (busybox's /bin) instead of its root.
    let busybox =
        serde_json::json!({"image": {"reference": BUSYBOX, "pullPolicy": "IfNotPresent"}});
    let with_sub_path = |name: &str, sub: &str, script: &str| -> Pod {
        let mut pod = user(name, busybox.clone(), script, None);
        let mount = pod
            .spec
            .as_mut()
            .and_then(|s| s.containers.first_mut())
            .and_then(|c| c.volume_mounts.as_mut())
            .and_then(|m| m.first_mut());
        if let Some(m) = mount {
            m.sub_path = Some(sub.into());
        }
        pod
    };
    let sub = with_sub_path(
        "sub",
        "bin",
        "test -x /data/busybox && test ! -e /data/bin && echo sub",
    );
    create(&client, &ns, &sub).await;
    assert_eq!(succeeded(&client, &ns, "sub").await.trim(), "sub");
    // A subPath the image does not have: the runtime refuses the container.
    create(
        &client,
        &ns,
        &with_sub_path("no-sub", "no/such/dir", "true"),
    )
    .await;
    let p = wait_for(
        &client,
        &ns,
        "no-sub",
        60,
        "CreateContainerError",
        waiting_reason("CreateContainerError"),
    )
    .await;
    assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Pending"));

    // An image that is not on the node, under pull policy Never: the
    // container waits, as one whose own image may not be pulled.
    let absent = serde_json::json!({"image": {
        "reference": "example.invalid/not-here:1", "pullPolicy": "Never"}});
    create(&client, &ns, &user("absent", absent, "true", None)).await;
    let p = wait_for(
        &client,
        &ns,
        "absent",
        60,
        "ErrImageNeverPull",
        waiting_reason("ErrImageNeverPull"),
    )
    .await;
    assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
    drop_namespace(&client, &ns).await;
}

/// A loop device over a file of 8 MiB under `dir`, detached when dropped.
struct Loop(String);

impl Loop {
    fn new(dir: &std::path::Path) -> Self {
        let backing = dir.join("disk.img");
        let file = std::fs::File::create(&backing).expect("backing file");
        file.set_len(8 << 20).expect("size the backing file");
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&backing)
            .output()
            .expect("losetup");
        assert!(
            out.status.success(),
            "losetup: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.0])
            .status();
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_local_block_volume_is_passed_as_a_device() {
    let client = client().await;
    let ns = namespace(&client, "e2e-block").await;
    let class = format!("e2e-block-{ns}");
    let dev = Loop::new(&host_dir(&ns));
    let host = hostname(&client).await;
    let pv_name = format!("{ns}-pv");
    let mut pv = volume(
        &pv_name,
        &class,
        serde_json::json!({"local": {"path": dev.0}}),
        Some(&host),
    );
    if let Some(spec) = pv.spec.as_mut() {
        spec.volume_mode = Some("Block".into());
    }
    create_volumes(&client, &[pv]).await;
    let mut c = claim("disk", &class);
    if let Some(spec) = c.spec.as_mut() {
        spec.volume_mode = Some("Block".into());
    }
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &c)
        .await
        .expect("create claim");
    let pod: Pod = from_json(serde_json::json!({
        "metadata": {"name": "raw"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "volumes": [{"name": "disk", "persistentVolumeClaim": {"claimName": "disk"}}],
            "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c",
                    "test -b /dev/xvda && echo raw-data | dd of=/dev/xvda conv=fsync 2>/dev/null && dd if=/dev/xvda bs=9 count=1 2>/dev/null"],
                "volumeDevices": [{"name": "disk", "devicePath": "/dev/xvda"}],
            }],
        },
    }));
    create(&client, &ns, &pod).await;
    assert_eq!(succeeded(&client, &ns, "raw").await.trim(), "raw-data");
    // What the container wrote is on the device.
    let mut head = vec![0u8; 8];
    std::io::Read::read_exact(
        &mut std::fs::File::open(&dev.0).expect("open the device"),
        &mut head,
    )
    .expect("read the device");
    assert_eq!(&head, b"raw-data");
    drop_namespace(&client, &ns).await;
    delete_volumes(&client, &[&pv_name]).await;
}
