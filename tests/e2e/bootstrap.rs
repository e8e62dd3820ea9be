//! TLS bootstrap end to end, as `kubeadm join` does it: a bootstrap token
//! (a Secret in kube-system, with kubeadm's bindings to
//! `system:node-bootstrapper` and the node-client auto-approval), a
//! bootstrap kubeconfig with that token, and the agent started with
//! `--bootstrap-kubeconfig` and a `--kubeconfig` that does not exist yet. The
//! controller-manager approves and signs its request, and the agent writes
//! the kubeconfig. The API server then knows that kubeconfig's user as the
//! node (`system:node:<name>` in `system:nodes`).
//!
//! The agent is given a runtime socket that does not exist, so it stops
//! right after the bootstrap with one line and a non-zero exit, and never
//! registers a second node on the cluster.

use std::time::Duration;

use crate::common::*;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

/// The group kubeadm's tokens put their user in.
const KUBEADM_GROUP: &str = "system:bootstrappers:kubeadm:default-node-token";

fn binding(name: &str, role: &str) -> ClusterRoleBinding {
    ClusterRoleBinding {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: role.into(),
        },
        subjects: Some(vec![Subject {
            kind: "Group".into(),
            name: KUBEADM_GROUP.into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Default::default()
        }]),
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_node_joins_with_a_bootstrap_token() {
    let client = client().await;
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis()
        % 1_000_000;
    let node = format!("boot-node-{n}");
    // A token: 6 and 16 characters of [a-z0-9].
    let id = format!("{n:06}");
    let secret = format!("{n:016}");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    let token_secret: Secret = from_json(serde_json::json!({
        "metadata": { "name": format!("bootstrap-token-{id}") },
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {
            "token-id": id,
            "token-secret": secret,
            "usage-bootstrap-authentication": "true",
            "auth-extra-groups": KUBEADM_GROUP,
        },
    }));
    secrets
        .create(&PostParams::default(), &token_secret)
        .await
        .expect("bootstrap token");
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    for (name, role) in [
        ("e2e:kubelet-bootstrap", "system:node-bootstrapper"),
        (
            "e2e:node-autoapprove-bootstrap",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        ),
    ] {
        // Kept between runs: the same bindings every time.
        let _ = bindings
            .create(&PostParams::default(), &binding(name, role))
            .await;
    }

    let dir = tempfile::tempdir().expect("temp dir");
    let bootstrap = dir.path().join("bootstrap-kubelet.conf");
    std::fs::write(
        &bootstrap,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    \
             server: https://127.0.0.1:6443\n    certificate-authority: {}\nusers:\n- name: tls-bootstrap-token-user\n  \
             user:\n    token: {id}.{secret}\ncontexts:\n- name: tls-bootstrap\n  context:\n    cluster: local\n    \
             user: tls-bootstrap-token-user\ncurrent-context: tls-bootstrap\n",
            local().join("pki/ca.crt").display()
        ),
    )
    .expect("bootstrap kubeconfig");
    let kubeconfig = dir.path().join("kubelet.conf");
    let log = dir.path().join("rustlet.log");
    let mut agent = std::process::Command::new(env!("CARGO_BIN_EXE_rustlet"))
        .arg("run")
        .arg("--bootstrap-kubeconfig")
        .arg(&bootstrap)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .arg("--cert-dir")
        .arg(dir.path().join("pki"))
        .args(["--node-name", &node, "--node-ip", "127.0.0.1"])
        .arg("--root-dir")
        .arg(dir.path().join("root"))
        .arg("--device-plugins-dir")
        .arg(dir.path().join("device-plugins"))
        .arg("--container-runtime-endpoint")
        .arg(format!("unix://{}", dir.path().join("no.sock").display()))
        .args(["--port", "11352", "--healthz-port", "0"])
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("run the agent");
    // It stops by itself once bootstrapped (no runtime); 2 min at most.
    let mut status = None;
    for _ in 0..240 {
        status = agent.try_wait().expect("wait for the agent");
        if status.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if status.is_none() {
        let _ = agent.kill();
        let _ = agent.wait();
    }
    let _ = secrets
        .delete(&format!("bootstrap-token-{id}"), &DeleteParams::default())
        .await;
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    let status = status.unwrap_or_else(|| panic!("the agent did not stop within 2 min: {stderr}"));
    assert!(!status.success(), "no runtime: the agent stops");
    assert!(
        stderr.contains("client certificate issued; kubeconfig written"),
        "{stderr}"
    );
    assert!(stderr.contains("no.sock"), "the runtime named: {stderr}");
    let current = dir.path().join("pki/kubelet-client-current.pem");
    assert!(
        std::fs::symlink_metadata(&current)
            .expect("kubelet-client-current.pem")
            .file_type()
            .is_symlink()
    );

    // The written kubeconfig is the node's own identity.
    let kc = Kubeconfig::read_from(&kubeconfig).expect("the written kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    let as_node = kube::Client::try_from(cfg).expect("client");
    let review: SelfSubjectReview = Api::all(as_node)
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("SelfSubjectReview as the node");
    let user = review.status.and_then(|s| s.user_info).expect("user info");
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:node:{node}").as_str())
    );
    assert!(
        user.groups
            .unwrap_or_default()
            .contains(&"system:nodes".to_string())
    );
}
