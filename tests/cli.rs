//! The command line's answers to bad input: one clear line and a non-zero exit.

use std::process::Command;

fn rustlet(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rustlet"))
        .args(args)
        .env("RUST_LOG", "off")
        .env_remove("KUBECONFIG")
        .output()
        .expect("run rustlet");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

/// Writes a kubeconfig with a token user for a server nothing listens on.
fn write_token_kubeconfig(path: &std::path::Path) {
    write_kubeconfig(path, "https://127.0.0.1:1");
}

/// Writes a kubeconfig with a token user for the API server at `server`.
fn write_kubeconfig(path: &std::path::Path, server: &str) {
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: '{server}'}}\n\
             users:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        ),
    )
    .unwrap();
}

#[test]
fn version_prints_and_succeeds() {
    let out = Command::new(env!("CARGO_BIN_EXE_rustlet"))
        .arg("version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("rustlet "));
}

#[test]
fn bad_flag_is_one_line_and_exit_2() {
    let (code, err) = rustlet(&["run", "--no-such-flag"]);
    assert_eq!(code, 2);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("--no-such-flag"), "{err}");
}

#[test]
fn unreadable_kubeconfig_is_one_line_and_exit_1() {
    let (code, err) = rustlet(&["run", "--kubeconfig", "/nonexistent/kubeconfig"]);
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
}

#[test]
fn dead_runtime_socket_is_one_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    write_token_kubeconfig(&kubeconfig);
    let sock = dir.path().join("nothing.sock");
    let endpoint = format!("unix://{}", sock.display());
    let (code, err) = rustlet(&[
        "run",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--container-runtime-endpoint",
        &endpoint,
    ]);
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&endpoint), "{err}");
}

#[test]
fn credential_provider_flags_go_together_and_a_bad_config_is_one_line() {
    let (code, err) = rustlet(&["run", "--image-credential-provider-config", "/x.yaml"]);
    assert_eq!(code, 2);
    assert!(err.contains("--image-credential-provider-bin-dir"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    write_token_kubeconfig(&kubeconfig);
    let config = dir.path().join("providers.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- {name: ecr, matchImages: ['*.ecr.io'], apiVersion: credentialprovider.kubelet.k8s.io/v1}\n",
    )
    .unwrap();
    let (code, err) = rustlet(&[
        "run",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--image-credential-provider-config",
        config.to_str().unwrap(),
        "--image-credential-provider-bin-dir",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("image credential providers: failed to validate credential provider config")
            && err.contains("defaultCacheDuration: Required value"),
        "{err}"
    );
}

#[test]
fn bad_config_file_is_one_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("kubelet.yaml");
    std::fs::write(&cfg, "maxPods: many\n").unwrap();
    let (code, err) = rustlet(&["run", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert_eq!(
        err,
        format!(
            "rustlet: error: parse config file {}: maxPods: expected a count",
            cfg.display()
        )
    );
}

#[test]
fn bad_bootstrap_kubeconfig_is_one_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubelet.conf");
    let bootstrap = dir.path().join("bootstrap.conf");
    let root = dir.path().join("root");
    let cases: [(&str, &str); 3] = [
        ("users: [not, a, mapping", "bootstrap.conf"),
        ("apiVersion: v1\nkind: Config\n", "bootstrap.conf"),
        (
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n\
             users:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n\
             current-context: nowhere\n",
            "bootstrap.conf",
        ),
    ];
    for (text, named) in cases {
        std::fs::write(&bootstrap, text).unwrap();
        let (code, err) = rustlet(&[
            "run",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--bootstrap-kubeconfig",
            bootstrap.to_str().unwrap(),
            "--root-dir",
            root.to_str().unwrap(),
        ]);
        assert_eq!(code, 1, "{text}: {err}");
        assert_eq!(err.lines().count(), 1, "{text}: {err}");
        assert!(err.contains(named), "{text}: {err}");
        assert!(!kubeconfig.exists(), "{text}: nothing written");
    }
}

#[test]
fn rotation_without_a_client_certificate_is_one_line_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    write_token_kubeconfig(&kubeconfig);
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nrotateCertificates: true\n",
    )
    .unwrap();
    let (code, err) = rustlet(&[
        "run",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--config",
        config.to_str().unwrap(),
        "--root-dir",
        dir.path().join("root").to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("rotateCertificates") && err.contains("no client-certificate"),
        "{err}"
    );
}

#[test]
fn bad_reset_delete_nodes_and_approve_csrs_flags_are_one_line_and_exit_2() {
    for args in [
        &["run", "--reset-when-gone", "no-slash"][..],
        &["run", "--reset-when-gone", "ns/"],
        &["run", "--reset-when-gone", "a/b/c"],
        // The bridge only goes with a reset.
        &["run", "--reset-cni-bridge", "br0"],
        // The record is a namespaced name.
        &["delete-nodes", "--record", ""],
        &["delete-nodes", "--record", "rustlet-nodes"],
        &["delete-nodes", "--selector", "rustlet.dev/companion=true"],
        &["delete-nodes"],
        // A pod to explain is a namespaced name; the status writer takes no
        // other flag than its kubeconfig.
        &["explain"],
        &["explain", "no-slash"],
        &["explain", "ns/p", "--node", "n1"],
        &["report-node-configurations", "--all"],
        // The approver needs its release named in full, with valid names.
        &["approve-csrs"],
        &[
            "approve-csrs",
            "--namespace",
            "ns",
            "--service-account",
            "sa",
            "--daemonset",
            "ds",
            "--node-name-suffix",
            "-x",
        ],
        &[
            "approve-csrs",
            "--namespace",
            "Bad_NS",
            "--service-account",
            "sa",
            "--daemonset",
            "ds",
            "--node-name-suffix",
            "-x",
            "--record",
            "r",
        ],
    ] {
        let (code, err) = rustlet(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
}

#[test]
fn delete_nodes_with_an_unreadable_kubeconfig_is_one_line_and_exit_1() {
    let (code, err) = rustlet(&[
        "delete-nodes",
        "--kubeconfig",
        "/nonexistent/kubeconfig",
        "--record",
        "rustlet-system/rustlet-nodes",
    ]);
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
}

/// `delete-nodes` against a mock API server that asserts each request: the
/// record is read, each node it names is deleted, then the record, every
/// request with the agent's `User-Agent`.
#[test]
fn delete_nodes_deletes_the_recorded_nodes_then_the_record_with_the_agents_user_agent() {
    use std::sync::{Arc, Mutex};
    let seen = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let log = seen.clone();
    rt.spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let log = log.clone();
            let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                let agent = req
                    .headers()
                    .get(hyper::header::USER_AGENT)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let line = format!("{} {}", req.method(), req.uri());
                let answer = if req.method() == hyper::Method::GET {
                    r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"rustlet-nodes","namespace":"rustlet-system"},"data":{"n1-rustlet":"csr-1","n2-rustlet":"csr-2"}}"#
                } else {
                    r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success"}"#
                };
                log.lock().unwrap().push((line, agent));
                let body = http_body_util::Full::new(bytes::Bytes::from(answer));
                async move { Ok::<_, std::convert::Infallible>(hyper::Response::new(body)) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    write_kubeconfig(&kubeconfig, &format!("http://127.0.0.1:{port}"));
    let (code, err) = rustlet(&[
        "delete-nodes",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--record",
        "rustlet-system/rustlet-nodes",
    ]);
    assert_eq!(code, 0, "{err}");
    let seen = seen.lock().unwrap().clone();
    let requests: Vec<&str> = seen.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        requests,
        [
            "GET /api/v1/namespaces/rustlet-system/configmaps/rustlet-nodes",
            "DELETE /api/v1/nodes/n1-rustlet?",
            "DELETE /api/v1/nodes/n2-rustlet?",
            "DELETE /api/v1/namespaces/rustlet-system/configmaps/rustlet-nodes?",
        ]
    );
    let want = rustlet::user_agent();
    assert!(want.starts_with("rustlet/v1."), "{want}");
    assert!(want.contains(" (linux/"), "{want}");
    for (request, agent) in &seen {
        assert_eq!(agent, &want, "{request}");
    }
}
