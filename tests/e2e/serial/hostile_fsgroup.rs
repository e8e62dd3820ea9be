//! The fsGroup race, on the local cluster (`hack/local-up.sh --agent
//! rustlet`) with the project's CSI test driver (`crate::csi`): pods with
//! an `fsGroup` share a volume whose directories are swapped, again and
//! again, with links to a host directory while the agent applies the pods'
//! group to it. Every file of the host directory keeps its owner, group and
//! mode: the agent changes what its walk opened, never what a name
//! resolves to a moment later.
//!
//! The swaps are made in the volume's directory from the host with
//! `renameat2(RENAME_EXCHANGE)`, which trades a directory and a link in one
//! step: what any process in a pod sharing the volume can do (busybox has no
//! command for it).
//!
//! Serial: the CSI driver runs on the host under the same name as
//! `crate::csi`'s.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;

use crate::common::csi::*;
use crate::common::*;

/// The files the host directory holds, each also made in every swapped
/// directory, so that a walk that resolves `<entry>/<file>` by name after a
/// swap lands on the host's file of the same name.
const FILES: usize = 100;
/// Directory and link pairs the swapper trades.
const ENTRIES: usize = 4;
/// Pods with an fsGroup that start while the swaps go on (after the first,
/// whose start makes the volume).
const GROUPED: usize = 8;
/// Swaps made at least while the pods start: the race was run, not missed.
const MIN_SWAPS: u64 = 10_000;

/// Sets its flag when dropped: the swapper stops when the test ends, also
/// when it fails.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Owner, group and mode of every entry under `dir`, by path relative to it.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u32, u32, u32)> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read the host directory") {
            let e = e.expect("entry");
            let m = std::fs::symlink_metadata(e.path()).expect("lstat");
            if m.is_dir() {
                todo.push(e.path());
            }
            let rel = e.path().strip_prefix(dir).expect("under").to_path_buf();
            out.insert(rel, (m.uid(), m.gid(), m.permissions().mode()));
        }
    }
    out
}

/// A pod mounting claim `shared` with fsGroup 2000 that prints its volume's group.
fn grouped(name: &str) -> k8s_openapi::api::core::v1::Pod {
    from_json(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "securityContext": { "fsGroup": 2000 },
            "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "stat -c group=%g /data && exec sleep 3600"],
                "volumeMounts": [{ "name": "data", "mountPath": "/data" }]
            }],
            "volumes": [{ "name": "data", "persistentVolumeClaim": { "claimName": "shared" } }]
        }
    }))
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_volume_swapped_for_links_during_fs_group_changes_no_host_file() {
    let client = client().await;
    let (_stack, ns, class) = stack_in_namespace(&client, "e2e-fsgroup-race", 0).await;

    // The host directory the links name: files 0600 in a directory 0700,
    // all root's, none of them the pods'.
    let victim = local().join(format!("fsgroup-victim-{ns}"));
    let sub = victim.join("sub");
    std::fs::create_dir_all(&sub).expect("host directory");
    std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    for i in 0..FILES {
        let f = sub.join(format!("f{i}"));
        std::fs::write(&f, b"host").expect("host file");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    let before = snapshot(&victim);
    assert_eq!(before.len(), FILES + 1);

    apply(&format!(
        "apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: shared, namespace: {ns}}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: {class}
  resources: {{requests: {{storage: 16Mi}}}}
"
    ));
    // The first pod makes the volume.
    create(&client, &ns, &grouped("grouped-0")).await;
    wait_for(&client, &ns, "grouped-0", 180, "Running", phase("Running")).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let pv = bound_volume(&claims, "shared").await;
    let handle = volume_handle(&client, &pv).await;
    let volume = stack_dir().join("state/volumes").join(&handle);

    // In the volume, pairs of a directory holding the host directory's file
    // names and a link to the host directory, traded back and forth.
    for k in 0..ENTRIES {
        let d = volume.join(format!("e{k}"));
        std::fs::create_dir(&d).expect("directory in the volume");
        for i in 0..FILES {
            std::fs::write(d.join(format!("f{i}")), b"pod").expect("file in the volume");
        }
        std::os::unix::fs::symlink(&sub, volume.join(format!("l{k}"))).expect("link");
    }
    // The volume's root back to root's group: each pod below must give it
    // the fsGroup again, with the swaps going on.
    std::os::unix::fs::chown(&volume, Some(0), Some(0)).expect("chown the volume");
    let stop = Arc::new(AtomicBool::new(false));
    let stopper = StopOnDrop(stop.clone());
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps, volume) = (stop.clone(), swaps.clone(), volume.clone());
        std::thread::spawn(move || {
            let dir = std::fs::File::open(&volume).expect("open the volume");
            while !stop.load(Ordering::Relaxed) {
                for k in 0..ENTRIES {
                    rustix::fs::renameat_with(
                        &dir,
                        format!("e{k}"),
                        &dir,
                        format!("l{k}"),
                        rustix::fs::RenameFlags::EXCHANGE,
                    )
                    .expect("exchange a directory and a link");
                    swaps.fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };

    // The pods whose fsGroup the agent applies to the volume during the swaps.
    for i in 1..=GROUPED {
        create(&client, &ns, &grouped(&format!("grouped-{i}"))).await;
    }
    for i in 0..=GROUPED {
        let name = format!("grouped-{i}");
        wait_for(&client, &ns, &name, 180, "Running", phase("Running")).await;
        eventually(30, &format!("{name} sees its fsGroup"), || {
            let (ns, name) = (ns.clone(), name.clone());
            async move {
                let log = logs(&ns, &name);
                (log.trim() == "group=2000").then_some(()).ok_or(log)
            }
        })
        .await;
    }
    drop(stopper);
    swapper.join().expect("the swapper");
    let swaps = swaps.load(Ordering::Relaxed);
    println!("{swaps} swaps while {GROUPED} pods with an fsGroup started");
    assert!(swaps >= MIN_SWAPS, "{swaps} swaps: the race was not run");

    let after = snapshot(&victim);
    let changed: Vec<_> = before
        .iter()
        .filter(|(p, was)| after.get(*p) != Some(*was))
        .map(|(p, was)| format!("{}: {was:?} -> {:?}", p.display(), after.get(p)))
        .collect();
    assert!(
        changed.is_empty() && after.len() == before.len(),
        "{} of {} host entries changed: {:?}",
        changed.len(),
        before.len(),
        &changed[..changed.len().min(10)]
    );
    drop_namespace(&client, &ns).await;
    remove_driver_and_class(&class);
    std::fs::remove_dir_all(&victim).expect("remove the host directory");
}
