//! The storage tests' CSI stack: the project's hostpath test driver
//! (`src/bin/csi-hostpath.rs`, registering itself with the agent through
//! `<root-dir>/plugins_registry`) and the upstream external-provisioner and
//! external-attacher (`hack/build-cluster.sh csi`), all on the host with the
//! cluster's admin kubeconfig; a CSIDriver and a StorageClass for it; and
//! what the tests check of mounts.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{kubectl, local, node_name, root};

/// The test driver's name.
pub const DRIVER: &str = "hostpath.csi.rustlet.io";

/// The driver and the two sidecars, killed when dropped.
pub struct Stack(Vec<Child>);

impl Drop for Stack {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Where the stack keeps its sockets, volumes and logs.
pub fn stack_dir() -> PathBuf {
    local().join("e2e-csi")
}

/// Starts `program` with `args`, its output in `<stack dir>/<name>.log`.
fn spawn(name: &str, program: &Path, args: &[String]) -> Child {
    assert!(
        program.exists(),
        "{} is missing (run hack/build-cluster.sh csi)",
        program.display()
    );
    let log = std::fs::File::create(stack_dir().join(format!("{name}.log"))).expect("log file");
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", program.display()))
}

/// Starts the driver (registering with the agent; each node call that
/// mounts or unmounts waiting `node_call_delay` seconds) and the sidecars.
pub fn start_stack(node_call_delay: u64) -> Stack {
    let dir = stack_dir();
    std::fs::create_dir_all(&dir).expect("stack dir");
    let socket = dir.join("csi.sock");
    let kubeconfig = local().join("admin.kubeconfig").display().to_string();
    let bin = root().join("_output/bin");
    let driver = spawn(
        "driver",
        Path::new(env!("CARGO_BIN_EXE_csi-hostpath")),
        &[
            format!("--endpoint={}", socket.display()),
            format!("--node-id={}", node_name()),
            format!("--state-dir={}", dir.join("state").display()),
            format!(
                "--registration-dir={}",
                local().join("rustlet/plugins_registry").display()
            ),
            format!("--node-call-delay={node_call_delay}"),
        ],
    );
    let common = [
        format!("--csi-address={}", socket.display()),
        format!("--kubeconfig={kubeconfig}"),
        "--leader-election=false".to_string(),
        "--timeout=30s".to_string(),
    ];
    let provisioner = spawn("provisioner", &bin.join("csi-provisioner"), &common);
    let attacher = spawn("attacher", &bin.join("csi-attacher"), &common);
    Stack(vec![driver, provisioner, attacher])
}

/// How many times `path` is a mount point in the host's mount table.
pub fn times_mounted(path: &Path) -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| Path::new(p) == path)
        .count()
}

/// Polls `check` every 500 ms for up to `secs`; panics with `what` and the
/// last answer when it never holds.
pub async fn eventually<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match check().await {
            Ok(()) => return,
            Err(why) if Instant::now() >= deadline => {
                panic!("{what}: not within {secs}s; last: {why}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// `kubectl apply` of `yaml`.
pub fn apply(yaml: &str) {
    let (code, _, err) = kubectl(&["apply", "-f", "-"], yaml);
    assert_eq!(code, 0, "kubectl apply: {err}\n{yaml}");
}

/// The CSIDriver (attach required, pod info on mount, the pod's fsGroup
/// applied by the agent whatever the volume: `File`; persistent and inline
/// ephemeral volumes) and a StorageClass
/// `class` (late binding, volumes deleted with their claims) for the test
/// driver.
pub fn driver_and_class(class: &str) {
    apply(&format!(
        "apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {{name: {DRIVER}}}
spec: {{attachRequired: true, podInfoOnMount: true, fsGroupPolicy: File, volumeLifecycleModes: [Persistent, Ephemeral]}}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: {class}}}
provisioner: {DRIVER}
reclaimPolicy: Delete
volumeBindingMode: WaitForFirstConsumer
"
    ));
}

/// Deletes StorageClass `class` and the CSIDriver (best effort).
pub fn remove_driver_and_class(class: &str) {
    let _ = kubectl(&["delete", "storageclass", class, "--ignore-not-found"], "");
    let _ = kubectl(&["delete", "csidriver", DRIVER, "--ignore-not-found"], "");
}

/// Whether the driver's log has a line with `needle`.
pub fn driver_logged(needle: &str) -> bool {
    std::fs::read_to_string(stack_dir().join("driver.log"))
        .is_ok_and(|t| t.lines().any(|l| l.contains(needle)))
}

/// The backing files of the host's loop devices (`losetup --list`), a line each.
pub fn loop_files() -> String {
    let out = Command::new("losetup")
        .args(["--list", "--noheadings", "--output", "BACK-FILE"])
        .output()
        .expect("run losetup");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until the block volume published at `device` is unpublished (no
/// longer bound, its file gone), then checks that no loop device is left on
/// `image`.
pub async fn block_volume_gone(device: &Path, image: &Path) {
    eventually(60, "the block volume unpublished", || async {
        (times_mounted(device) == 0 && !device.exists())
            .then_some(())
            .ok_or_else(|| format!("{} still there", device.display()))
    })
    .await;
    let loops = loop_files();
    assert!(
        !loops.lines().any(|l| Path::new(l.trim()) == image),
        "the loop device of {} detached: {loops}",
        image.display()
    );
}

/// The PersistentVolume claim `name` is bound to; panics when it is not bound.
pub async fn bound_volume(
    claims: &kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    name: &str,
) -> String {
    claims
        .get(name)
        .await
        .unwrap_or_else(|e| panic!("claim {name}: {e}"))
        .spec
        .and_then(|s| s.volume_name)
        .unwrap_or_else(|| panic!("claim {name} is not bound"))
}

/// The CSI volume handle of PersistentVolume `pv`; panics when it is not a
/// CSI volume.
pub async fn volume_handle(client: &kube::Client, pv: &str) -> String {
    kube::Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(client.clone())
        .get(pv)
        .await
        .unwrap_or_else(|e| panic!("PersistentVolume {pv}: {e}"))
        .spec
        .and_then(|s| s.csi)
        .map(|c| c.volume_handle)
        .unwrap_or_else(|| panic!("{pv} is not a CSI volume"))
}

/// Starts the stack ([`start_stack`] with `node_call_delay`), makes a
/// namespace named from `prefix`, and the CSIDriver and a StorageClass of
/// its own ([`driver_and_class`]): the stack, the namespace and the class.
pub async fn stack_in_namespace(
    client: &kube::Client,
    prefix: &str,
    node_call_delay: u64,
) -> (Stack, String, String) {
    let stack = start_stack(node_call_delay);
    let ns = super::namespace(client, prefix).await;
    let class = format!("csi-hostpath-{ns}");
    driver_and_class(&class);
    (stack, ns, class)
}
