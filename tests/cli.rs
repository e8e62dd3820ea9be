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
    std::fs::write(
        path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n\
         users:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n",
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
fn bad_reset_and_delete_nodes_flags_are_one_line_and_exit_2() {
    for args in [
        &["run", "--reset-when-gone", "no-slash"][..],
        &["run", "--reset-when-gone", "ns/"],
        &["run", "--reset-when-gone", "a/b/c"],
        // The bridge only goes with a reset.
        &["run", "--reset-cni-bridge", "br0"],
        // An empty selector would select every Node.
        &["delete-nodes", "--selector", ""],
        &["delete-nodes", "--selector", "  "],
        &["delete-nodes"],
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
        "--selector",
        "rustlet.dev/companion=true",
    ]);
    assert_eq!(code, 1);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
}

/// `delete-nodes` against a mock API server that asserts each request: the
/// nodes of the selector are listed, then each is deleted, every request
/// with the agent's `User-Agent`.
#[test]
fn delete_nodes_lists_then_deletes_with_the_agents_user_agent() {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let mut seen = Vec::new();
        // One request per connection: every answer closes it.
        for answer in [
            r#"{"kind":"NodeList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[{"metadata":{"name":"n1"}}]}"#,
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Success"}"#,
        ] {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let request = line.trim_end().to_string();
            let (mut agent, mut length) = (String::new(), 0usize);
            loop {
                let mut header = String::new();
                reader.read_line(&mut header).unwrap();
                let header = header.trim_end();
                if header.is_empty() {
                    break;
                }
                let (name, value) = header.split_once(':').unwrap();
                match name.to_ascii_lowercase().as_str() {
                    "user-agent" => agent = value.trim().to_string(),
                    "content-length" => length = value.trim().parse().unwrap(),
                    _ => {}
                }
            }
            let mut body = vec![0; length];
            reader.read_exact(&mut body).unwrap();
            let mut stream = stream;
            write!(
                stream,
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{answer}",
                answer.len()
            )
            .unwrap();
            seen.push((request, agent));
        }
        seen
    });
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: 'http://127.0.0.1:{port}'}}\n\
             users:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    let (code, err) = rustlet(&[
        "delete-nodes",
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--selector",
        "rustlet.dev/companion=true",
    ]);
    assert_eq!(code, 0, "{err}");
    let seen = server.join().unwrap();
    let requests: Vec<&str> = seen.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        requests,
        [
            "GET /api/v1/nodes?&labelSelector=rustlet.dev%2Fcompanion%3Dtrue HTTP/1.1",
            "DELETE /api/v1/nodes/n1? HTTP/1.1",
        ]
    );
    let want = rustlet::user_agent();
    assert!(want.starts_with("rustlet/v1."), "{want}");
    assert!(want.contains(" (linux/"), "{want}");
    for (request, agent) in &seen {
        assert_eq!(agent, &want, "{request}");
    }
}
