//! A private OCI distribution registry for the image tests: `_output/bin/registry`
//! with htpasswd auth (one user `user`/`pass`) on a loopback port, and `ctr`
//! against the local cluster's containerd to push busybox into it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::PostParams;

use super::{BUSYBOX, local, root};

/// The user and password the registry accepts.
pub const USER: &str = "user";
/// See [`USER`].
pub const PASSWORD: &str = "pass";

/// A prebuilt binary of `_output/bin`.
pub fn bin(name: &str) -> PathBuf {
    root().join("_output/bin").join(name)
}

/// Runs `ctr` against the local cluster's containerd, in the `k8s.io`
/// namespace; (success, stderr).
pub fn ctr(args: &[&str]) -> (bool, String) {
    let out = Command::new(bin("ctr"))
        .arg("--address")
        .arg(local().join("containerd/containerd.sock"))
        .args(["--namespace", "k8s.io"])
        .args(args)
        .output()
        .expect("run ctr");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A registry process serving on `addr`, stopped when dropped.
pub struct Registry {
    child: Child,
    _dir: tempfile::TempDir,
    /// `host:port` it serves on.
    pub addr: &'static str,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// Starts the registry on `addr` (a loopback `host:port` no other test
    /// file uses, so that test files may run at once) and waits until it answers.
    pub fn start(addr: &'static str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let htpasswd = Command::new("htpasswd")
            .args(["-Bbn", USER, PASSWORD])
            .output()
            .expect("run htpasswd (apache2-utils)");
        assert!(htpasswd.status.success());
        std::fs::write(dir.path().join("htpasswd"), &htpasswd.stdout).expect("write htpasswd");
        let config = format!(
            "version: 0.1\nlog: {{ level: warn }}\nstorage: {{ filesystem: {{ rootdirectory: {root} }} }}\n\
             http: {{ addr: {addr} }}\n\
             auth: {{ htpasswd: {{ realm: rustlet-e2e, path: {htpasswd} }} }}\n",
            root = dir.path().join("data").display(),
            htpasswd = dir.path().join("htpasswd").display(),
        );
        std::fs::write(dir.path().join("config.yml"), config).expect("write registry config");
        let log = std::fs::File::create(dir.path().join("registry.log")).expect("registry log");
        let child = Command::new(bin("registry"))
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the registry (hack/build-cluster.sh registry)");
        let registry = Self {
            child,
            _dir: dir,
            addr,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "registry did not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        registry
    }

    /// Pushes the local busybox image to the registry as `image` (which names
    /// this registry), then removes that name from the node: only the
    /// registry has it.
    pub fn push_busybox(&self, image: &str) {
        assert!(
            image.starts_with(self.addr),
            "{image} is not in {}",
            self.addr
        );
        let user = format!("{USER}:{PASSWORD}");
        for args in [
            &["images", "tag", "--force", BUSYBOX, image][..],
            &["images", "push", "--plain-http", "--user", &user, image],
            &["images", "rm", image],
        ] {
            let (ok, stderr) = ctr(args);
            assert!(ok, "ctr {args:?}: {stderr}");
        }
    }

    /// A `.dockerconfigjson` with the registry's user and password.
    pub fn docker_config(&self) -> serde_json::Value {
        serde_json::json!({ "auths": { self.addr: { "username": USER, "password": PASSWORD } } })
    }

    /// Creates the pull Secret `name` (`kubernetes.io/dockerconfigjson`,
    /// [`Registry::docker_config`]) in `ns`.
    pub async fn create_pull_secret(&self, client: &kube::Client, ns: &str, name: &str) {
        let secret: Secret = super::from_json(serde_json::json!({
            "metadata": { "name": name },
            "type": "kubernetes.io/dockerconfigjson",
            "stringData": { ".dockerconfigjson": self.docker_config().to_string() }
        }));
        Api::<Secret>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &secret)
            .await
            .expect("create pull secret");
    }
}

/// A pod of one container running `command` from `image` with `pull_policy`,
/// naming `secrets` as its `imagePullSecrets`.
pub fn private_pod(
    name: &str,
    image: &str,
    pull_policy: &str,
    command: &[&str],
    secrets: &[&str],
) -> Pod {
    let mut p = super::pod(name, "Never", image, command);
    let spec = p.spec.as_mut().expect("spec");
    spec.containers[0].image_pull_policy = Some(pull_policy.into());
    spec.image_pull_secrets = Some(
        secrets
            .iter()
            .map(|s| super::from_json(serde_json::json!({ "name": s })))
            .collect(),
    );
    p
}
