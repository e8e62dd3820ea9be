//! The hostpath test CSI driver deployed in the cluster
//! (`examples/csi-hostpath.yaml`, its image from `hack/image.sh --csi
//! --import`), on the local cluster (`hack/local-up.sh --agent rustlet`): the
//! DaemonSet's driver registers with the agent from inside its pod, the
//! provisioner beside it makes the volumes of the node's claims, a claim's
//! data outlives the pod that wrote it, a raw block claim is a device in its
//! pod, and when the claims and the DaemonSet go, the volumes, the mounts and
//! the driver's registration go too.

use std::path::PathBuf;

use crate::common::csi::{
    DRIVER, block_volume_gone, bound_volume, eventually, loop_files, times_mounted,
};
use crate::common::*;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::CSINode;
use kube::{Api, ResourceExt};

/// The example, for the local cluster: the agent's root dir and the
/// driver's state dir in place of the node's defaults, and the API server
/// at 127.0.0.1:6443, as the example says for a cluster without kube-proxy.
fn manifest(state: &std::path::Path) -> String {
    let text = std::fs::read_to_string(root().join("examples/csi-hostpath.yaml"))
        .expect("examples/csi-hostpath.yaml");
    let text = text
        .replace(
            "/var/lib/kubelet",
            &local().join("rustlet").display().to_string(),
        )
        .replace("/var/lib/csi-hostpath", &state.display().to_string())
        .replace(
            "# - {name: KUBERNETES_SERVICE",
            "- {name: KUBERNETES_SERVICE",
        );
    assert!(text.contains("- {name: KUBERNETES_SERVICE_HOST, value: 127.0.0.1}"));
    text
}

/// Pod `name` with claim `claim` mounted at /data (or, when `block`, as the
/// device /dev/xvda), running `script`.
fn user(name: &str, claim: &str, block: bool, script: &str) -> Pod {
    let mut container = serde_json::json!({
        "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", script],
    });
    if block {
        container["volumeDevices"] = serde_json::json!([{"name": "v", "devicePath": "/dev/xvda"}]);
    } else {
        container["volumeMounts"] = serde_json::json!([{"name": "v", "mountPath": "/data"}]);
    }
    from_json(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}],
            "containers": [container],
        },
    }))
}

/// A claim `name` on the example's class, of `mode`.
fn claim(ns: &str, name: &str, mode: &str) -> String {
    format!(
        "apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: {name}, namespace: {ns}}}
spec:
  accessModes: [ReadWriteOnce]
  volumeMode: {mode}
  storageClassName: csi-hostpath
  resources: {{requests: {{storage: 8Mi}}}}
"
    )
}

/// The example applied and the test's namespace; both deleted when
/// dropped, whatever the test did: the namespace first, and the example once
/// the claims' volumes are gone (a minute at most), so that the driver is
/// still there to delete them.
struct Deployed {
    manifest: String,
    namespace: Option<String>,
    /// The driver's state directory, when the test made it a shared mount.
    shared: Option<PathBuf>,
}

impl Drop for Deployed {
    fn drop(&mut self) {
        if let Some(ns) = &self.namespace {
            let _ = kubectl(
                &[
                    "delete",
                    "namespace",
                    ns,
                    "--ignore-not-found",
                    "--wait=true",
                ],
                "",
            );
        }
        // The claims' volumes, which the provisioner deletes after them.
        let query =
            r#"jsonpath={.items[?(@.spec.storageClassName=="csi-hostpath")].metadata.name}"#;
        for _ in 0..60 {
            let (_, left, _) = kubectl(&["get", "pv", "-o", query], "");
            if left.trim().is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
        let _ = kubectl(
            &["delete", "-f", "-", "--ignore-not-found", "--wait=true"],
            &self.manifest,
        );
        if let Some(state) = &self.shared {
            let _ = rustlet::volume::mount::unmount_all_under(state);
        }
    }
}

#[tokio::test]
#[ignore = "needs the local cluster (hack/local-up.sh --agent rustlet) and hack/image.sh --csi --import"]
async fn the_driver_deployed_in_the_cluster_serves_claims_of_both_modes() {
    let client = client().await;
    let node = node_name();
    let state: PathBuf = local().join("e2e-csi-in-cluster");
    let text = manifest(&state);
    // The driver mounts volumes there with Bidirectional propagation, which
    // needs a shared mount: on a systemd host `/` is one; here it may not be.
    std::fs::create_dir_all(&state).expect("the driver's state directory");
    let made = rustlet::volume::mount::make_rshared(&state).expect("make the state dir shared");
    let (code, _, err) = kubectl(&["apply", "-f", "-"], &text);
    let mut deployed = Deployed {
        manifest: text,
        namespace: None,
        shared: made.then(|| state.clone()),
    };
    assert_eq!(code, 0, "kubectl apply: {err}");

    // Registered from inside its pod: the node's CSINode lists it.
    let csinodes: Api<CSINode> = Api::all(client.clone());
    let listed = |want: bool| {
        let (csinodes, node) = (csinodes.clone(), node.clone());
        async move {
            let n = csinodes.get_opt(&node).await.map_err(|e| e.to_string())?;
            let has = n.is_some_and(|n| n.spec.drivers.iter().any(|d| d.name == DRIVER));
            (has == want)
                .then_some(())
                .ok_or_else(|| format!("listed: {has}"))
        }
    };
    eventually(120, "the in-cluster driver in the node's CSINode", || {
        listed(true)
    })
    .await;

    let ns = namespace(&client, "e2e-csi-cluster").await;
    deployed.namespace = Some(ns.clone());
    let (code, _, err) = kubectl(&["apply", "-f", "-"], &claim(&ns, "data", "Filesystem"));
    assert_eq!(code, 0, "claim: {err}");
    // Written by one pod, read by the next.
    let writer = create(
        &client,
        &ns,
        &user("writer", "data", false, "echo kept > /data/f"),
    )
    .await;
    wait_for(&client, &ns, "writer", 120, "Succeeded", phase("Succeeded")).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let pv = bound_volume(&claims, "data").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    pods.delete("writer", &Default::default())
        .await
        .expect("delete writer");
    wait_deleted(
        &client,
        &ns,
        "writer",
        &writer.uid().unwrap_or_default(),
        60,
    )
    .await;
    create(&client, &ns, &user("reader", "data", false, "cat /data/f")).await;
    wait_for(&client, &ns, "reader", 120, "Succeeded", phase("Succeeded")).await;
    assert_eq!(logs(&ns, "reader").trim(), "kept");

    // A raw block claim: the loop device the driver made in its pod is the
    // pod's device (the pod stays until checked, so that its device does).
    let (code, _, err) = kubectl(&["apply", "-f", "-"], &claim(&ns, "raw", "Block"));
    assert_eq!(code, 0, "block claim: {err}");
    let script = "printf block-data | dd of=/dev/xvda bs=512 seek=8 conv=notrunc,fsync 2>/dev/null \
                  && dd if=/dev/xvda bs=512 skip=8 count=1 2>/dev/null | head -c 10 && echo && exec sleep 3600";
    let raw = create(&client, &ns, &user("raw", "raw", true, script)).await;
    wait_for(&client, &ns, "raw", 120, "Running", phase("Running")).await;
    eventually(30, "the block pod's read-back", || async {
        let log = logs(&ns, "raw");
        (log.trim() == "block-data").then_some(()).ok_or(log)
    })
    .await;
    let raw_pv = bound_volume(&claims, "raw").await;
    let device = rustlet::volume::csi::block_publish_path(
        &local().join("rustlet"),
        &raw_pv,
        &raw.uid().unwrap_or_default(),
    );
    assert_eq!(
        times_mounted(&device),
        1,
        "the driver's bind reached the node: {}",
        device.display()
    );
    let image = state.join("images").join(format!("{raw_pv}.img"));
    assert!(
        loop_files()
            .lines()
            .any(|l| std::path::Path::new(l.trim()) == image),
        "a loop device holds {}: {}",
        image.display(),
        loop_files()
    );
    pods.delete("raw", &Default::default())
        .await
        .expect("delete raw");
    block_volume_gone(&device, &image).await;

    // The claims deleted: the provisioner deletes their volumes.
    drop_namespace(&client, &ns).await;
    eventually(120, "the volumes deleted with their claims", || {
        let (pv, raw_pv) = (pv.clone(), raw_pv.clone());
        let dirs = [state.join("volumes"), state.join("images")];
        async move {
            let mut left = Vec::new();
            for dir in &dirs {
                let entries =
                    std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                left.extend(
                    entries
                        .filter_map(Result::ok)
                        .map(|e| e.file_name().to_string_lossy().into_owned()),
                );
            }
            (left.is_empty())
                .then_some(())
                .ok_or_else(|| format!("left ({pv}, {raw_pv}): {left:?}"))
        }
    })
    .await;

    // The DaemonSet gone: its driver's registration goes with it.
    let (code, _, err) = kubectl(&["delete", "-f", "-", "--wait=true"], &deployed.manifest);
    assert_eq!(code, 0, "kubectl delete: {err}");
    eventually(120, "the driver out of the node's CSINode", || {
        listed(false)
    })
    .await;
}
