//! Persistent volumes from a CSI driver on the local cluster
//! (`hack/local-up.sh --agent rustlet`): the project's hostpath test driver
//! (`src/bin/csi-hostpath.rs`) registers itself with the agent through
//! `<root-dir>/plugins_registry`; the upstream external-provisioner makes a
//! volume for each claim and the upstream external-attacher attaches it
//! (`hack/build-cluster.sh csi`). All three run on the host with the
//! cluster's admin kubeconfig, as a driver's node and controller
//! deployments run them in a cluster. A StatefulSet's pod keeps its data
//! when a new pod replaces it, its fsGroup applied to the volume; the volume's usage is in `/stats/summary`
//! with its claim; when the pods go the volume is unpublished and unstaged,
//! detached, and deleted with its claim. An inline ephemeral CSI volume is
//! made for its pod and goes with it. A raw block claim is a device in its
//! pod, written and read through, and unpublished with it.

use std::time::{Duration, Instant};

use crate::common::csi::*;
use crate::common::*;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::{Api, Client, ResourceExt};

/// Waits for the StatefulSet's pod `keeper-0` to run as a pod other than
/// `not_uid`; the pod.
async fn running_keeper(client: &Client, ns: &str, not_uid: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let p = pods.get_opt("keeper-0").await.expect("get keeper-0");
        if let Some(p) = &p {
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            if running
                && p.uid().as_deref() != Some(not_uid)
                && p.metadata.deletion_timestamp.is_none()
            {
                return p.clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "keeper-0 not running within 180s: {:#?}",
            p.and_then(|p| p.status)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_stateful_set_keeps_its_csi_volume_and_the_volume_goes_with_its_pods() {
    let client = client().await;
    let node = node_name();
    let (_stack, ns, class) = stack_in_namespace(&client, "e2e-csi", 0).await;

    // The driver registered with the agent: the node's CSINode lists it
    // with its topology key.
    let csinodes: Api<CSINode> = Api::all(client.clone());
    eventually(60, "the driver in the node's CSINode", || {
        let csinodes = csinodes.clone();
        let node = node.clone();
        async move {
            let n = csinodes.get_opt(&node).await.map_err(|e| e.to_string())?;
            let drivers = n.map(|n| n.spec.drivers).unwrap_or_default();
            let d = drivers
                .iter()
                .find(|d| d.name == DRIVER)
                .ok_or("not listed")?;
            (d.node_id == node
                && d.topology_keys.as_deref()
                    == Some(&["topology.hostpath.csi.rustlet.io/node".to_string()][..]))
            .then_some(())
            .ok_or_else(|| format!("{d:?}"))
        }
    })
    .await;

    // A StatefulSet whose pod appends a line to its volume at each start.
    apply(&format!(
        "apiVersion: apps/v1
kind: StatefulSet
metadata: {{name: keeper, namespace: {ns}}}
spec:
  replicas: 1
  serviceName: keeper
  selector: {{matchLabels: {{app: keeper}}}}
  template:
    metadata: {{labels: {{app: keeper}}}}
    spec:
      terminationGracePeriodSeconds: 1
      securityContext: {{fsGroup: 2000}}
      containers:
      - name: c
        image: {BUSYBOX}
        imagePullPolicy: IfNotPresent
        command: [sh, -c, 'echo run >> /data/runs && cat /data/runs && stat -c group=%g /data && exec sleep 3600']
        volumeMounts: [{{name: data, mountPath: /data}}]
  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec:
      accessModes: [ReadWriteOnce]
      storageClassName: {class}
      resources: {{requests: {{storage: 16Mi}}}}
"
    ));
    let first = running_keeper(&client, &ns, "").await;
    let first_uid = first.uid().unwrap_or_default();
    // The volume is the pod's fsGroup's (the CSIDriver's policy: File).
    assert_eq!(logs(&ns, "keeper-0").trim(), "run\ngroup=2000");

    // The claim is bound to a volume the provisioner made with the driver.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let claim = claims.get("data-keeper-0").await.expect("claim");
    let pv_name = claim
        .spec
        .and_then(|s| s.volume_name)
        .expect("the claim is bound");
    let handle = volume_handle(&client, &pv_name).await;
    let kept = stack_dir().join("state/volumes").join(&handle);
    assert!(
        kept.join("runs").exists(),
        "the data is in the driver's volume"
    );

    // Staged once for the node, published once for the pod.
    let rustlet_root = rustlet_root();
    let staging = rustlet::volume::csi::staging_path(&rustlet_root, DRIVER, &handle);
    let target =
        |uid: &str| rustlet::volume::csi::volume_dir(&rustlet_root, uid, &pv_name).join("mount");
    assert_eq!(times_mounted(&staging), 1, "{}", staging.display());
    assert_eq!(times_mounted(&target(&first_uid)), 1);

    // Its usage, with its claim, in the node's stats summary.
    let summary_path = format!("/api/v1/nodes/{node}/proxy/stats/summary");
    let ns_ = ns.clone();
    eventually(30, "the volume in /stats/summary", || {
        let (ns, path) = (ns_.clone(), summary_path.clone());
        async move {
            let (code, out, err) = kubectl(&["get", "--raw", &path], "");
            if code != 0 {
                return Err(err);
            }
            let s: serde_json::Value = serde_json::from_str(&out).map_err(|e| e.to_string())?;
            let pod = s["pods"]
                .as_array()
                .and_then(|pods| {
                    pods.iter().find(|p| {
                        p["podRef"]["namespace"] == ns.as_str() && p["podRef"]["name"] == "keeper-0"
                    })
                })
                .ok_or("no stats of keeper-0")?;
            let v = pod["volume"]
                .as_array()
                .and_then(|vs| vs.iter().find(|v| v["name"] == "data"))
                .ok_or_else(|| format!("no volume data in {}", pod["volume"]))?;
            let ok = v["pvcRef"] == serde_json::json!({"name": "data-keeper-0", "namespace": ns})
                && v["usedBytes"].as_u64().is_some_and(|b| b > 0)
                && v["capacityBytes"].as_u64().is_some_and(|b| b > 0)
                && v["inodesUsed"].as_u64().is_some_and(|n| n >= 2);
            ok.then_some(()).ok_or_else(|| v.to_string())
        }
    })
    .await;

    // A new pod in its place finds the data.
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("keeper-0", &Default::default())
        .await
        .expect("delete keeper-0");
    let second = running_keeper(&client, &ns, &first_uid).await;
    let second_uid = second.uid().unwrap_or_default();
    assert_eq!(
        logs(&ns, "keeper-0").trim(),
        "run\nrun\ngroup=2000",
        "the first pod's line is kept"
    );
    assert_eq!(
        times_mounted(&target(&first_uid)),
        0,
        "the first pod's mount is gone"
    );
    assert_eq!(times_mounted(&target(&second_uid)), 1);
    assert_eq!(times_mounted(&staging), 1, "still staged once");

    // No pods: unpublished, unstaged, detached.
    let (code, _, err) = kubectl(
        &["scale", "statefulset/keeper", "-n", &ns, "--replicas=0"],
        "",
    );
    assert_eq!(code, 0, "scale to 0: {err}");
    wait_deleted(&client, &ns, "keeper-0", &second_uid, 60).await;
    eventually(30, "the volume unpublished and unstaged", || {
        let (staging, t) = (staging.clone(), target(&second_uid));
        async move {
            match (times_mounted(&t), times_mounted(&staging)) {
                (0, 0) => Ok(()),
                other => Err(format!("mounted (target, staging): {other:?}")),
            }
        }
    })
    .await;
    let attachment = rustlet::volume::csi::attachment_name(&handle, DRIVER, &node);
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    eventually(120, "the volume detached", || {
        let (attachments, attachment) = (attachments.clone(), attachment.clone());
        async move {
            match attachments
                .get_opt(&attachment)
                .await
                .map_err(|e| e.to_string())?
            {
                None => Ok(()),
                Some(va) => Err(format!("{:?}", va.status)),
            }
        }
    })
    .await;
    assert!(kept.join("runs").exists(), "unstaging keeps the data");

    // The claim deleted: the provisioner deletes the volume with the driver.
    claims
        .delete("data-keeper-0", &Default::default())
        .await
        .expect("delete claim");
    eventually(60, "the volume deleted", || {
        let kept = kept.clone();
        async move {
            (!kept.exists())
                .then_some(())
                .ok_or_else(|| format!("{} is still there", kept.display()))
        }
    })
    .await;
    // An inline ephemeral volume: made for the pod, gone with it.
    let inline: Pod = from_json(serde_json::json!({
        "metadata": {"name": "inline"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "volumes": [{"name": "scratch", "csi": {"driver": DRIVER}}],
            "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "echo here > /scratch/f && cat /scratch/f && exec sleep 3600"],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }],
        },
    }));
    let inline = create(&client, &ns, &inline).await;
    wait_for(&client, &ns, "inline", 60, "Running", phase("Running")).await;
    eventually(30, "the inline pod's line", || async {
        let log = logs(&ns, "inline");
        (log.trim() == "here").then_some(()).ok_or(log)
    })
    .await;
    let uid = inline.uid().unwrap_or_default();
    let handle = format!("csi-{}", hex_sha256(&format!("{uid}scratch")));
    assert!(
        stack_dir().join("state/volumes").join(&handle).exists(),
        "the driver made the inline volume {handle}"
    );
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("inline", &Default::default())
        .await
        .expect("delete inline");
    wait_deleted(&client, &ns, "inline", &uid, 60).await;
    eventually(30, "the inline volume removed", || {
        let gone = stack_dir().join("state/volumes").join(&handle);
        async move {
            (!gone.exists())
                .then_some(())
                .ok_or_else(|| format!("{} is still there", gone.display()))
        }
    })
    .await;

    // A raw block claim: a device in its pod, written and read through,
    // unpublished and its loop device detached when the pod goes.
    apply(&format!(
        "apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: raw, namespace: {ns}}}
spec:
  accessModes: [ReadWriteOnce]
  volumeMode: Block
  storageClassName: {class}
  resources: {{requests: {{storage: 8Mi}}}}
"
    ));
    let raw: Pod = from_json(serde_json::json!({
        "metadata": {"name": "raw"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "dev", "persistentVolumeClaim": {"claimName": "raw"}}],
            "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "printf block-data | dd of=/dev/xvda bs=512 seek=8 conv=notrunc,fsync 2>/dev/null && dd if=/dev/xvda bs=512 skip=8 count=1 2>/dev/null | head -c 10 && echo && exec sleep 3600"],
                "volumeDevices": [{"name": "dev", "devicePath": "/dev/xvda"}],
            }],
        },
    }));
    let raw = create(&client, &ns, &raw).await;
    wait_for(&client, &ns, "raw", 120, "Running", phase("Running")).await;
    eventually(30, "the block pod's read-back", || async {
        let log = logs(&ns, "raw");
        (log.trim() == "block-data").then_some(()).ok_or(log)
    })
    .await;
    let raw_uid = raw.uid().unwrap_or_default();
    let raw_pv = bound_volume(&claims, "raw").await;
    let device = rustlet::volume::csi::block_publish_path(&rustlet_root, &raw_pv, &raw_uid);
    assert_eq!(times_mounted(&device), 1, "{}", device.display());
    let raw_handle = volume_handle(&client, &raw_pv).await;
    let image = stack_dir()
        .join("state/images")
        .join(format!("{raw_handle}.img"));
    let bytes = std::fs::read(&image).expect("the driver's block file");
    assert_eq!(
        &bytes[4096..4106],
        b"block-data",
        "written through the device"
    );
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("raw", &Default::default())
        .await
        .expect("delete raw");
    wait_deleted(&client, &ns, "raw", &raw_uid, 60).await;
    block_volume_gone(&device, &image).await;

    remove_driver_and_class(&class);
    drop_namespace(&client, &ns).await;
}

/// The hex SHA-256 of `text` (the kubelet names an inline volume
/// `csi-<sha256(pod UID + volume name)>`).
fn hex_sha256(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
