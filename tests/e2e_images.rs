//! End-to-end scenarios of image pulls from a private registry on the local
//! cluster (`hack/local-up.sh --agent rustlet`): an OCI distribution registry
//! (`_output/bin/registry`, htpasswd auth) on loopback holds a copy of
//! busybox; pods pull it with and without `imagePullSecrets`.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::Api;
use kube::api::{ListParams, PostParams};

/// The loopback address of the test registry.
const REGISTRY: &str = "127.0.0.1:5443";

/// A registry process, stopped when dropped.
struct Registry {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bin(name: &str) -> PathBuf {
    root().join("_output/bin").join(name)
}

/// Starts the registry with one user `user`/`pass` and waits until it answers.
fn start_registry() -> Registry {
    let dir = tempfile::tempdir().expect("temp dir");
    let htpasswd = Command::new("htpasswd")
        .args(["-Bbn", "user", "pass"])
        .output()
        .expect("run htpasswd (apache2-utils)");
    assert!(htpasswd.status.success());
    std::fs::write(dir.path().join("htpasswd"), &htpasswd.stdout).unwrap();
    let config = format!(
        "version: 0.1\nlog: {{ level: warn }}\nstorage: {{ filesystem: {{ rootdirectory: {root} }} }}\n\
         http: {{ addr: {REGISTRY} }}\n\
         auth: {{ htpasswd: {{ realm: rustlet-e2e, path: {htpasswd} }} }}\n",
        root = dir.path().join("data").display(),
        htpasswd = dir.path().join("htpasswd").display(),
    );
    std::fs::write(dir.path().join("config.yml"), config).unwrap();
    let child = Command::new(bin("registry"))
        .arg("serve")
        .arg(dir.path().join("config.yml"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("registry.log")).unwrap())
        .spawn()
        .expect("start the registry (hack/build-cluster.sh registry)");
    let registry = Registry { child, _dir: dir };
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(REGISTRY).is_err() {
        assert!(
            Instant::now() < deadline,
            "registry did not listen on {REGISTRY}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    registry
}

/// Pushes the local busybox image to the registry as `image`.
fn push(image: &str) {
    let ctr = |args: &[&str]| {
        let out = Command::new(bin("ctr"))
            .arg("--address")
            .arg(local().join("containerd/containerd.sock"))
            .args(["--namespace", "k8s.io"])
            .args(args)
            .output()
            .expect("run ctr");
        assert!(
            out.status.success(),
            "ctr {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ctr(&["images", "tag", "--force", BUSYBOX, image]);
    ctr(&[
        "images",
        "push",
        "--plain-http",
        "--user",
        "user:pass",
        image,
    ]);
    // The node must pull it: only the registry has it now.
    ctr(&["images", "rm", image]);
}

async fn events_of(client: &kube::Client, ns: &str, pod: &str) -> Vec<(String, String)> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(pod))
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

fn private_pod(name: &str, image: &str, secrets: &[&str]) -> Pod {
    let mut p = pod(
        name,
        "Never",
        image,
        &["sh", "-c", "echo pulled; sleep 3600"],
    );
    let spec = p.spec.as_mut().unwrap();
    spec.containers[0].image_pull_policy = Some("Always".into());
    spec.image_pull_secrets = Some(
        secrets
            .iter()
            .map(|s| serde_json::from_value(serde_json::json!({ "name": s })).unwrap())
            .collect(),
    );
    p
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn image_pull_secrets_authenticate_private_pulls() {
    let _registry = start_registry();
    let client = client().await;
    let ns = namespace(&client, "e2e-private").await;
    let image = format!("{REGISTRY}/private/busybox:{ns}");
    push(&image);

    let config =
        serde_json::json!({ "auths": { REGISTRY: { "username": "user", "password": "pass" } } });
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "regcred" },
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": { ".dockerconfigjson": config.to_string() }
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("create pull secret");

    // With the secret (and a missing one before it): pulled and running.
    create(
        &client,
        &ns,
        &private_pod("with", &image, &["absent", "regcred"]),
    )
    .await;
    wait_for(&client, &ns, "with", 90, "Running", phase("Running")).await;
    let events = events_of(&client, &ns, "with").await;
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "FailedToRetrieveImagePullSecret" && m.contains("absent")),
        "{events:?}"
    );
    assert!(events.iter().any(|(r, _)| r == "Pulled"), "{events:?}");

    // Without it: the registry refuses, and the pod waits in ErrImagePull.
    create(&client, &ns, &private_pod("without", &image, &[])).await;
    wait_for(
        &client,
        &ns,
        "without",
        90,
        "ErrImagePull",
        |p: Option<&Pod>| {
            let waiting = p
                .and_then(|p| p.status.as_ref()?.container_statuses.clone())
                .and_then(|cs| cs.first()?.state.clone()?.waiting?.reason);
            matches!(
                waiting.as_deref(),
                Some("ErrImagePull" | "ImagePullBackOff")
            )
        },
    )
    .await;
    let events = events_of(&client, &ns, "without").await;
    assert!(
        events
            .iter()
            .any(|(r, m)| r == "Failed" && m.contains("Failed to pull image")),
        "{events:?}"
    );
    drop_namespace(&client, &ns).await;
}
