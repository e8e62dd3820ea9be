//! Image and container garbage collection on a node of their own: the test
//! mounts a small tmpfs, starts a second containerd whose root (content and
//! snapshots: the image filesystem) lives on it, imports a few of the local
//! cluster's images into it, and runs a second agent against it as node
//! `gc-node-<n>`. Then:
//! - a crash-looping container keeps at most its newest dead instance, and
//!   the log files of the older ones are gone; once the pod is deleted, its
//!   log directory is gone too;
//! - the agent, restarted with `imageGCHighThresholdPercent` a point below
//!   the image filesystem's usage and `imageGCLowThresholdPercent` three
//!   points below,
//!   removes unused images until usage is at most the low threshold, not all
//!   of them, and never the image a running pod uses or the pinned sandbox
//!   image.
//!
//! The cluster's own containerd and its images are never touched (they cannot
//! be pulled again here). The second node could take the scheduler's pods of
//! other tests, so this runs alone (hack/test.sh).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::DeleteParams;
use rustlet::cri::Runtime;

/// The image the running pod uses.
const IN_USE: &str = "docker.io/library/busybox:1.36";
/// The sandbox image, pinned by containerd.
const PAUSE: &str = "registry.k8s.io/pause:3.10.2";
/// Images no pod uses.
const UNUSED: &[&str] = &[
    "registry.k8s.io/e2e-test-images/nginx:1.28.0-2",
    "registry.k8s.io/e2e-test-images/perl:5.26",
    "registry.k8s.io/e2e-test-images/nonewprivs:1.4",
    "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1",
];

/// The eviction thresholds of the second agent: memory only.
const NO_DISK_EVICTION: &str = "evictionHard:\n  memory.available: 100Mi\n  nodefs.available: \"0%\"\n  \
     nodefs.inodesFree: \"0%\"\n  imagefs.available: \"0%\"\n  imagefs.inodesFree: \"0%\"\n";

/// The second node: its tmpfs, containerd and agent, undone on drop.
struct Scratch {
    base: PathBuf,
    node: String,
    containerd: Option<Child>,
    agent: Option<Child>,
    port: u16,
}

impl Scratch {
    fn fs(&self) -> PathBuf {
        self.base.join("fs")
    }

    fn socket(&self) -> PathBuf {
        self.base.join("containerd.sock")
    }

    fn pod_logs(&self) -> PathBuf {
        self.base.join("pods")
    }

    /// Mounts the tmpfs and starts containerd on it, configured as the
    /// cluster's (same CNI, runtime and pinned sandbox image), with its own
    /// root, state and sockets.
    fn start(size_mib: u32) -> Self {
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            % 1_000_000;
        let base = std::env::temp_dir().join(format!("rustlet-gc-{n}"));
        let mut s = Scratch {
            base: base.clone(),
            node: format!("gc-node-{n}"),
            containerd: None,
            agent: None,
            port: free_port(),
        };
        std::fs::create_dir_all(s.fs()).unwrap();
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size_mib}m"))
            .arg("tmpfs")
            .arg(s.fs()));
        let cluster = local().join("containerd");
        let config = std::fs::read_to_string(cluster.join("config.toml"))
            .expect("the cluster's containerd config");
        let config = config
            .replace(
                &format!("{}/root", cluster.display()),
                &s.fs().join("root").display().to_string(),
            )
            .replace(&cluster.display().to_string(), &base.display().to_string());
        assert!(!config.contains(&cluster.display().to_string()));
        std::fs::write(base.join("config.toml"), config).unwrap();
        let log = std::fs::File::create(base.join("containerd.log")).unwrap();
        let bin = root().join("_output/bin");
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        s.containerd = Some(
            Command::new(bin.join("containerd"))
                .arg("--config")
                .arg(base.join("config.toml"))
                .env("PATH", path)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start containerd"),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while !s.socket().exists() {
            assert!(
                Instant::now() < deadline,
                "containerd did not listen (see {}/containerd.log)",
                base.display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        s
    }

    /// Copies `images` from the cluster's containerd into this one.
    fn import(&self, images: &[&str]) {
        let ctr = root().join("_output/bin/ctr");
        let archive = self.base.join("images.tar");
        let cluster_sock = local().join("containerd/containerd.sock");
        run(Command::new(&ctr)
            .arg("--address")
            .arg(&cluster_sock)
            .args(["-n", "k8s.io", "images", "export"])
            .arg(&archive)
            .args(images));
        run(Command::new(&ctr)
            .arg("--address")
            .arg(self.socket())
            .args([
                "-n",
                "k8s.io",
                "images",
                "import",
                "--snapshotter",
                "overlayfs",
            ])
            .arg(&archive));
        std::fs::remove_file(&archive).unwrap();
    }

    async fn runtime(&self) -> Runtime {
        Runtime::connect(
            &format!("unix://{}", self.socket().display()),
            Duration::from_secs(30),
        )
        .await
        .expect("the second containerd")
    }

    /// Starts the agent for this node with the KubeletConfiguration `config`.
    fn start_agent(&mut self, config: &str) {
        let file = self.base.join("config.yaml");
        std::fs::write(&file, config).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.base.join("rustlet.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_rustlet"))
            .arg("run")
            .arg("--kubeconfig")
            .arg(local().join("admin.kubeconfig"))
            .args(["--node-name", &self.node, "--node-ip", "127.0.0.1"])
            .arg("--container-runtime-endpoint")
            .arg(format!("unix://{}", self.socket().display()))
            .arg("--root-dir")
            .arg(self.base.join("rustlet"))
            .arg("--pod-logs-dir")
            .arg(self.pod_logs())
            // Its own device plugin directory: the node's agent keeps the
            // default one.
            .arg("--device-plugins-dir")
            .arg(self.base.join("device-plugins"))
            .arg("--config")
            .arg(&file)
            .args(["--port", &self.port.to_string(), "--healthz-port", "0"])
            .arg("--minimum-image-ttl-duration=0s")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the agent");
        self.agent = Some(child);
    }

    /// Stops the agent (SIGTERM), leaving its pods running.
    fn stop_agent(&mut self) {
        if let Some(mut child) = self.agent.take() {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Used and capacity bytes of the tmpfs, as `statvfs`.
    fn usage_percent(&self) -> u64 {
        let out = Command::new("df")
            .args(["-B1", "--output=size,avail"])
            .arg(self.fs())
            .output()
            .expect("df");
        let text = String::from_utf8_lossy(&out.stdout);
        let nums: Vec<u64> = text
            .lines()
            .nth(1)
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect();
        let [size, avail] = nums[..] else {
            panic!("df output: {text}")
        };
        // As the kubelet's image GC: 100 − available × 100 / capacity.
        100 - avail * 100 / size
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.stop_agent();
        if let Some(mut c) = self.containerd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // The shims of this containerd run on in their own sessions: stop them.
        let _ = Command::new("pkill")
            .args([
                "-f",
                &format!(
                    "containerd-shim-runc-v2 .*-address {}",
                    self.socket().display()
                ),
            ])
            .status();
        let _ = Command::new("umount").arg("-l").arg(self.fs()).status();
        let _ = std::fs::remove_dir_all(&self.base);
        let _ = kubectl(&["delete", "node", &self.node, "--wait=false"], "");
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().expect("run a command");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A host-network pod on node `node` (no CNI, no scheduler).
fn host_pod(name: &str, node: &str, command: &[&str]) -> Pod {
    from_json(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "nodeName": node,
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": IN_USE, "command": command, "imagePullPolicy": "Never"
            }]
        }
    }))
}

/// The names (tags) of the images of `runtime`.
async fn tags(runtime: &Runtime) -> Vec<String> {
    let mut out: Vec<String> = runtime
        .list_images()
        .await
        .expect("list images")
        .into_iter()
        .flat_map(|i| i.repo_tags)
        .collect();
    out.sort();
    out
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh; adds a second node, so runs alone"]
async fn unused_images_and_dead_containers_are_collected_on_a_small_image_filesystem() {
    let client = client().await;
    let mut node = Scratch::start(128);
    let mut images = vec![IN_USE, PAUSE];
    images.extend(UNUSED);
    node.import(&images);
    let runtime = node.runtime().await;
    assert_eq!(tags(&runtime).await.len(), images.len(), "imported images");
    // Image GC off while the pods start; no disk-pressure eviction (the
    // small image filesystem is meant to be full, and so is this machine's
    // disk).
    node.start_agent(&format!(
        "{NO_DISK_EVICTION}imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n"
    ));
    let ns = namespace(&client, "image-gc").await;
    let nodes: Api<Node> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    while nodes.get_opt(&node.node).await.ok().flatten().is_none() {
        assert!(
            Instant::now() < deadline,
            "node {} did not register",
            node.node
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Container GC: a container that exits at once restarts in back-off;
    // older dead instances and their logs go.
    let crash = create(
        &client,
        &ns,
        &host_pod("crash", &node.node, &["sh", "-c", "echo out; exit 1"]),
    )
    .await;
    let uid = crash.metadata.uid.clone().unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let p = pods.get("crash").await.unwrap();
        let restarts = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .map_or(0, |c| c.restart_count);
        if restarts >= 3 {
            break;
        }
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        assert_ne!(phase, Some("Failed"), "crash failed: {:?}", p.status);
        assert!(
            Instant::now() < deadline,
            "crash did not restart 3 times: {:?}",
            p.status
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let by_uid =
        std::collections::HashMap::from([("io.kubernetes.pod.uid".to_string(), uid.clone())]);
    let instances = runtime.list_containers(by_uid.clone()).await.unwrap();
    assert!(
        instances.len() <= 2,
        "{} instances of the crashing container",
        instances.len()
    );
    let log_dir = node.pod_logs().join(format!("{ns}_crash_{uid}"));
    let logs: Vec<_> = std::fs::read_dir(log_dir.join("c"))
        .expect("the container's log directory")
        .collect();
    assert!(
        (1..=2).contains(&logs.len()),
        "{} log files for at most 2 instances",
        logs.len()
    );

    let sleeper = create(
        &client,
        &ns,
        &host_pod("sleeper", &node.node, &["sleep", "3600"]),
    )
    .await;
    wait_for(&client, &ns, "sleeper", 60, "Running", phase("Running")).await;
    pods.delete("crash", &DeleteParams::default())
        .await
        .unwrap();
    wait_deleted(&client, &ns, "crash", &uid, 60).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while log_dir.exists() {
        assert!(
            Instant::now() < deadline,
            "{} stayed after the pod went",
            log_dir.display()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Image GC: the high threshold a point below the usage now, the low
    // one three points below, no minimum age (the kubelet's flag: in the
    // file, `0s` is the default of 2 min).
    node.stop_agent();
    let usage = node.usage_percent();
    assert!(usage > 5, "the image filesystem is {usage}% used");
    let (high, low) = (usage - 1, usage - 3);
    node.start_agent(&format!(
        "{NO_DISK_EVICTION}imageGCHighThresholdPercent: {high}\nimageGCLowThresholdPercent: {low}\n"
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    let left = loop {
        let left = tags(&runtime).await;
        if left.len() < images.len() && node.usage_percent() <= low {
            break left;
        }
        assert!(
            Instant::now() < deadline,
            "no collection down to {low}% (now {}%): {left:?}",
            node.usage_percent()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert!(
        left.iter().any(|t| t == IN_USE),
        "the image in use was removed: {left:?}"
    );
    assert!(
        left.iter().any(|t| t == PAUSE),
        "the sandbox image was removed: {left:?}"
    );
    let unused_left = UNUSED
        .iter()
        .filter(|u| left.iter().any(|t| t == *u))
        .count();
    assert!(
        unused_left >= 1,
        "every unused image went, more than the low threshold needs: {left:?}"
    );
    let p = pods.get("sleeper").await.unwrap();
    assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Running"));

    pods.delete("sleeper", &DeleteParams::default())
        .await
        .unwrap();
    wait_deleted(
        &client,
        &ns,
        "sleeper",
        sleeper.metadata.uid.as_deref().unwrap(),
        60,
    )
    .await;
    drop_namespace(&client, &ns).await;
    drop(node);
}
