//! End-to-end checks of the node API (:10250) on the local cluster
//! (`hack/local-up.sh --agent rustlet`): the API server's node proxy and
//! `pods/log` reach it with its kubelet client certificate; direct requests
//! without credentials get 401, and users without `nodes/proxy` get 403.

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use futures::{AsyncBufReadExt as _, TryStreamExt as _};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::Api;
use kube::api::{LogParams, PostParams};

const NODE_API: &str = "https://127.0.0.1:10250";

/// `curl -k` to the node API: (HTTP status, body).
fn curl(path: &str, extra: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sk", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(extra)
        .arg(format!("{NODE_API}{path}"))
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("curl status line");
    (code.trim().parse().expect("HTTP status"), body.to_string())
}

/// A client certificate for `cn` signed by the local cluster's CA, in `dir`.
fn user_cert(dir: &Path, cn: &str) -> (String, String) {
    let pki = local().join("pki");
    let key = dir.join(format!("{cn}.key"));
    let csr = dir.join(format!("{cn}.csr"));
    let crt = dir.join(format!("{cn}.crt"));
    let ext = dir.join("ext.cnf");
    std::fs::write(&ext, "extendedKeyUsage = clientAuth\n").unwrap();
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let p = |p: &Path| p.to_str().unwrap().to_string();
    run(&["genrsa", "-out", &p(&key), "2048"]);
    run(&[
        "req",
        "-new",
        "-key",
        &p(&key),
        "-subj",
        &format!("/CN={cn}"),
        "-out",
        &p(&csr),
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        &p(&csr),
        "-CA",
        &p(&pki.join("ca.crt")),
        "-CAkey",
        &p(&pki.join("ca.key")),
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        &p(&ext),
        "-out",
        &p(&crt),
    ]);
    (p(&crt), p(&key))
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn the_api_server_reaches_the_node_api_through_its_proxy() {
    let client = client().await;
    let node = node_name();
    let get = |path: String| {
        let client = client.clone();
        async move {
            client
                .request_text(axum::http::Request::get(path).body(Vec::new()).unwrap())
                .await
        }
    };
    // The API server proxies only to addresses it deems proxyable: not to a
    // loopback node IP (rustlet's default on the local cluster; NODE_IP=10.88.0.1
    // puts it on the pod bridge, as the kubelet).
    let ip: IpAddr = Api::<Node>::all(client.clone())
        .get(&node)
        .await
        .expect("node")
        .status
        .and_then(|s| s.addresses)
        .into_iter()
        .flatten()
        .find(|a| a.type_ == "InternalIP")
        .expect("InternalIP")
        .address
        .parse()
        .expect("node IP");
    let healthz = get(format!("/api/v1/nodes/{node}/proxy/healthz")).await;
    if ip.is_loopback() {
        let err = healthz.expect_err("no proxy to a loopback address");
        assert!(err.to_string().contains("address not allowed"), "{err}");
        println!("node IP {ip} is loopback: the API server does not proxy to it");
        return;
    }
    assert_eq!(healthz.expect("proxy/healthz"), "ok");
    let pods = get(format!("/api/v1/nodes/{node}/proxy/pods"))
        .await
        .expect("proxy/pods");
    let list: serde_json::Value = serde_json::from_str(&pods).expect("PodList JSON");
    assert_eq!(list["kind"], "PodList");
    assert!(list["items"].is_array(), "{list}");
}

/// `/statusz` and `/flagz` through the API server's node proxy, as
/// `kubectl get --raw` reads them (text), and as their structured objects.
#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn the_z_pages_answer_through_the_proxy() {
    let node = node_name();
    for (page, kind) in [("statusz", "Statusz"), ("flagz", "Flagz")] {
        let path = format!("/api/v1/nodes/{node}/proxy/{page}");
        let (code, text, err) = kubectl(&["get", "--raw", &path], "");
        assert_eq!(code, 0, "{page}: {err}");
        assert!(text.starts_with(&format!("\nkubelet {page}\n")), "{text}");
        let client = client().await;
        let req = axum::http::Request::get(&path)
            .header(
                "Accept",
                format!("application/json;as={kind};v=v1beta1;g=config.k8s.io"),
            )
            .body(Vec::new())
            .unwrap();
        let body = client.request_text(req).await.expect(page);
        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
        assert_eq!(v["kind"], kind, "{v}");
        assert_eq!(v["apiVersion"], "config.k8s.io/v1beta1");
        assert_eq!(v["metadata"]["name"], "kubelet");
    }
    let (_, text, _) = kubectl(
        &[
            "get",
            "--raw",
            &format!("/api/v1/nodes/{node}/proxy/statusz"),
        ],
        "",
    );
    assert!(text.contains("Paths"), "{text}");
    let (_, flags, _) = kubectl(
        &["get", "--raw", &format!("/api/v1/nodes/{node}/proxy/flagz")],
        "",
    );
    assert!(flags.contains("node-name"), "{flags}");
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn requests_without_credentials_are_unauthorized() {
    assert_eq!(curl("/pods", &[]), (401, "Unauthorized".to_string()));
    assert_eq!(
        curl("/pods", &["-H", "Authorization: Bearer not-a-token"]).0,
        401
    );
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn users_without_nodes_proxy_are_forbidden() {
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = user_cert(dir.path(), "nobody");
    assert_eq!(
        curl("/pods", &["--cert", &crt, "--key", &key]),
        (
            403,
            "Forbidden (user=nobody, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
                .to_string()
        )
    );
    let (code, body) = curl(
        "/containerLogs/default/x/c",
        &["--cert", &crt, "--key", &key],
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("subresource(s)=[proxy]"), "{body}");

    // A service account token is reviewed by the API server; the account may not
    // reach the node either.
    let client = client().await;
    let ns = namespace(&client, "e2e-nodeapi").await;
    let tr: TokenRequest = serde_json::from_value(serde_json::json!({
        "spec": { "audiences": [], "expirationSeconds": 600 }
    }))
    .unwrap();
    let token = Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .create_token_request("default", &PostParams::default(), &tr)
        .await
        .expect("token request")
        .status
        .and_then(|s| s.token)
        .expect("token");
    let (code, body) = curl("/pods", &["-H", &format!("Authorization: Bearer {token}")]);
    assert_eq!(code, 403, "{body}");
    assert!(
        body.starts_with(&format!(
            "Forbidden (user=system:serviceaccount:{ns}:default, verb=get"
        )),
        "{body}"
    );
    drop_namespace(&client, &ns).await;
}

/// Polls the pod's logs with `lp` until `want(text)` holds.
async fn logs_until(
    api: &Api<Pod>,
    name: &str,
    lp: &LogParams,
    want: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = api.logs(name, lp).await;
        if let Ok(text) = &got
            && want(text)
        {
            return text.clone();
        }
        assert!(
            Instant::now() < deadline,
            "logs of {name} with {lp:?}: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn kubectl_logs_reads_the_containers_output() {
    let client = client().await;
    let ns = namespace(&client, "e2e-logs").await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create(
        &client,
        &ns,
        &pod(
            "echo",
            "Always",
            BUSYBOX,
            &[
                "sh",
                "-c",
                "echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three; sleep 3600",
            ],
        ),
    )
    .await;
    wait_for(&client, &ns, "echo", 60, "Running", phase("Running")).await;

    let all = logs_until(&api, "echo", &LogParams::default(), |t| t.contains("three")).await;
    assert_eq!(all, "one\ntwo\nthree\n");
    let tail = LogParams {
        tail_lines: Some(1),
        ..LogParams::default()
    };
    assert_eq!(api.logs("echo", &tail).await.unwrap(), "three\n");
    let limited = LogParams {
        limit_bytes: Some(6),
        ..LogParams::default()
    };
    assert_eq!(api.logs("echo", &limited).await.unwrap(), "one\ntw");
    let stamped = LogParams {
        timestamps: true,
        tail_lines: Some(1),
        ..LogParams::default()
    };
    let line = api.logs("echo", &stamped).await.unwrap();
    let (ts, rest) = line.split_once(' ').unwrap();
    assert_eq!(rest, "three\n");
    assert!(
        ts.parse::<k8s_openapi::jiff::Timestamp>().is_ok() && ts.len() == 30,
        "{ts}"
    );
    // No previous instance yet: the kubelet's message, as a 400 through the API server.
    let err = api
        .logs(
            "echo",
            &LogParams {
                previous: true,
                ..LogParams::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("previous terminated container \"c\" in pod \"echo\" not found"),
        "{err}"
    );
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn kubectl_logs_previous_reads_the_last_terminated_instance() {
    let client = client().await;
    let ns = namespace(&client, "e2e-logs-prev").await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // Every run prints its own ID, stays up for a while, then fails.
    create(
        &client,
        &ns,
        &pod(
            "crasher",
            "Always",
            BUSYBOX,
            &[
                "sh",
                "-c",
                "echo run $(cat /proc/sys/kernel/random/uuid); sleep 15; exit 1",
            ],
        ),
    )
    .await;
    wait_for(
        &client,
        &ns,
        "crasher",
        90,
        "running again after a restart",
        |p: Option<&Pod>| {
            p.and_then(|p| {
                p.status
                    .as_ref()?
                    .container_statuses
                    .as_ref()?
                    .first()
                    .cloned()
            })
            .is_some_and(|c| c.restart_count >= 1 && c.state.and_then(|s| s.running).is_some())
        },
    )
    .await;
    let current = logs_until(&api, "crasher", &LogParams::default(), |t| {
        t.starts_with("run ")
    })
    .await;
    let previous = api
        .logs(
            "crasher",
            &LogParams {
                previous: true,
                ..LogParams::default()
            },
        )
        .await
        .expect("previous logs");
    assert!(
        previous.starts_with("run ") && previous.lines().count() == 1,
        "{previous:?}"
    );
    assert_ne!(
        current, previous,
        "the previous instance's log differs from the current one's"
    );
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn kubectl_logs_follow_streams_until_the_container_exits() {
    let client = client().await;
    let ns = namespace(&client, "e2e-logs-follow").await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create(
        &client,
        &ns,
        &pod(
            "ticker",
            "Never",
            BUSYBOX,
            &[
                "sh",
                "-c",
                "for i in 1 2 3 4; do echo tick $i; sleep 1; done",
            ],
        ),
    )
    .await;
    wait_for(&client, &ns, "ticker", 60, "Running", phase("Running")).await;
    let started = Instant::now();
    let follow = LogParams {
        follow: true,
        ..LogParams::default()
    };
    let lines: Vec<String> = tokio::time::timeout(Duration::from_secs(30), async {
        api.log_stream("ticker", &follow)
            .await
            .expect("log stream")
            .lines()
            .try_collect()
            .await
            .expect("read log stream")
    })
    .await
    .expect("the stream ends once the container has exited");
    assert_eq!(lines, ["tick 1", "tick 2", "tick 3", "tick 4"]);
    println!("follow ended {:?} after Running", started.elapsed());
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn container_logs_are_rotated_compressed_and_followed() {
    let client = client().await;
    let ns = namespace(&client, "e2e-logrotate").await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // Once the follow is open (/tmp/go), each round writes 11 MB (over the
    // default containerLogMaxSize of 10 Mi), then waits longer than the 10 s
    // containerLogMonitorInterval. (Written earlier, a round could be
    // rotated away before the follow opens the log, which then reads only
    // the current file, as the kubelet's.)
    let p = create(
        &client,
        &ns,
        &pod(
            "chatty",
            "Never",
            BUSYBOX,
            &[
                "sh",
                "-c",
                "until [ -e /tmp/go ]; do sleep 0.2; done; l=$(printf '%01000d' 0); for i in 1 2 3; do yes $l | head -n 11000; echo marker $i; sleep 11; done",
            ],
        ),
    )
    .await;
    wait_for(&client, &ns, "chatty", 60, "Running", phase("Running")).await;
    let follow = LogParams {
        follow: true,
        ..LogParams::default()
    };
    let stream = api.log_stream("chatty", &follow).await.expect("log stream");
    let (code, _, err) = kubectl(&["exec", "-n", &ns, "chatty", "--", "touch", "/tmp/go"], "");
    assert_eq!(code, 0, "start the writes: {err}");
    let markers: Vec<String> = tokio::time::timeout(Duration::from_secs(120), async {
        stream
            .lines()
            .try_filter(|l| std::future::ready(l.starts_with("marker")))
            .try_collect()
            .await
            .expect("read log stream")
    })
    .await
    .expect("the stream ends once the container has exited");
    assert_eq!(
        markers,
        ["marker 1", "marker 2", "marker 3"],
        "followed across rotations"
    );
    let dir = local()
        .join("pod-logs")
        .join(format!("{ns}_chatty_{}", p.metadata.uid.unwrap()))
        .join("c");
    // A rotation may be under way as the container exits: the live file is
    // renamed, and renamed back when the runtime cannot reopen it (the
    // kubelet's `rotateLatestLog`). So wait a little for it to be back.
    let list = || {
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .expect("container log dir")
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        files
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut files = list();
    while !files.contains(&"0.log".to_string()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        files = list();
    }
    assert!(files.contains(&"0.log".to_string()), "{files:?}");
    assert!(
        files.iter().any(|f| f.ends_with(".gz")),
        "older rotations compressed: {files:?}"
    );
    assert!(
        files.iter().filter(|f| f.starts_with("0.log.")).count() >= 2,
        "{files:?}"
    );
    assert!(files.len() <= 5, "containerLogMaxFiles: {files:?}");
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn the_serving_certificate_is_issued_through_the_certificates_api() {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    use rustls::pki_types::pem::PemObject as _;
    let client = client().await;
    // The node API presents a certificate that verifies against the cluster CA
    // for the node's IP: one the controller-manager signed for the request
    // hack/local-up.sh approved (a self-signed one would not verify).
    let node = Api::<Node>::all(client.clone())
        .get(&node_name())
        .await
        .unwrap();
    let ip: IpAddr = node.status.unwrap().addresses.unwrap()[0]
        .address
        .parse()
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_file_iter(local().join("pki/ca.crt")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect((ip, 10250)).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
        .connect(rustls::pki_types::ServerName::IpAddress(ip.into()), tcp)
        .await
        .expect("the served certificate verifies against the cluster CA");
    let served = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    // Issued to the node, as the Node authorizer and the kubelet-serving
    // signer require.
    let (_, cert) = x509_parser::parse_x509_certificate(&served).expect("X.509");
    let subject = cert.subject().to_string();
    assert!(
        subject.contains(&format!("CN=system:node:{}", node_name()))
            && subject.contains("O=system:nodes"),
        "{subject}"
    );
    // It is the one the agent keeps for its restarts.
    let stored: Vec<Vec<u8>> = rustls::pki_types::CertificateDer::pem_file_iter(
        local().join("rustlet/pki/kubelet-server-current.pem"),
    )
    .expect("the stored serving certificate")
    .map(|c| c.unwrap().to_vec())
    .collect();
    assert_eq!(stored.first(), Some(&served), "served = stored");
    // While the request is kept (the controller-manager's cleaner removes issued
    // requests after an hour), it holds that same certificate.
    let csrs = Api::<CertificateSigningRequest>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("list CSRs");
    let issued: Vec<Vec<u8>> = csrs
        .items
        .iter()
        .filter(|c| c.spec.signer_name == "kubernetes.io/kubelet-serving")
        .filter(|c| c.spec.username.as_deref() == Some(&format!("system:node:{}", node_name())))
        .filter_map(|c| c.status.as_ref()?.certificate.as_ref())
        .flat_map(|pem| {
            rustls::pki_types::CertificateDer::pem_slice_iter(&pem.0)
                .map(|c| c.unwrap().to_vec())
                .collect::<Vec<_>>()
        })
        .collect();
    let age = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .saturating_sub(u64::try_from(cert.validity().not_before.timestamp()).unwrap_or(0));
    if age < 50 * 60 {
        assert!(
            issued.contains(&served),
            "the node API serves the certificate its request was issued"
        );
    }
}

/// A namespace with a running busybox pod `sh` that sleeps.
async fn running_sleeper(client: &kube::Client, prefix: &str) -> String {
    let ns = namespace(client, prefix).await;
    create(
        client,
        &ns,
        &pod("sh", "Never", BUSYBOX, &["sleep", "3600"]),
    )
    .await;
    wait_for(client, &ns, "sh", 60, "Running", phase("Running")).await;
    ns
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn kubectl_exec_runs_commands_with_stdin_and_exit_codes() {
    let client = client().await;
    let ns = running_sleeper(&client, "e2e-exec").await;
    let (code, out, err) = kubectl(
        &[
            "exec",
            "-n",
            &ns,
            "-i",
            "sh",
            "--",
            "sh",
            "-c",
            "cat; echo to-stderr >&2; exit 3",
        ],
        "from stdin\n",
    );
    assert_eq!(code, 3, "exit code of the command; stderr: {err}");
    assert_eq!(out, "from stdin\n");
    assert!(err.contains("to-stderr"), "{err}");

    let (code, out, err) = kubectl(
        &["exec", "-n", &ns, "sh", "-c", "c", "--", "echo", "a b"],
        "",
    );
    assert_eq!((code, out.as_str()), (0, "a b\n"), "{err}");

    let (code, _, err) = kubectl(&["exec", "-n", &ns, "sh", "-c", "nope", "--", "true"], "");
    assert_ne!(code, 0);
    assert!(err.contains("nope"), "{err}");

    // A terminal: kubectl's standard streams are a pseudoterminal of the
    // test's own, so it asks for a TTY; it is no process group's controlling
    // terminal, so setting it to raw mode stops nobody.
    let (code, text) = kubectl_in_terminal(&[
        "exec",
        "-it",
        "-n",
        &ns,
        "sh",
        "--",
        "sh",
        "-c",
        "tty; stty size; exit 4",
    ]);
    assert!(
        text.contains("/dev/pts/"),
        "kubectl exited {code:?}; its terminal: {text:?}"
    );
    assert_eq!(code, Some(4), "{text}");
    drop_namespace(&client, &ns).await;
}

/// Runs kubectl (the admin's, at most 60 s) with `args`, its standard input,
/// output and error a new pseudoterminal: its exit code and what it wrote.
fn kubectl_in_terminal(args: &[&str]) -> (Option<i32>, String) {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    use std::io::Read as _;
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("open a pseudoterminal");
    grantpt(&master).expect("grantpt");
    unlockpt(&master).expect("unlockpt");
    let name = ptsname(&master, Vec::new()).expect("ptsname");
    // Not as a controlling terminal: a test process that leads its own
    // session (the test script starts it with setsid) would take it as its
    // own, and be hung up when kubectl closes it.
    let user_side = std::fs::File::from(
        rustix::fs::open(
            name.as_c_str(),
            rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY,
            rustix::fs::Mode::empty(),
        )
        .expect("open the terminal's user side"),
    );
    let mut cmd = Command::new("timeout");
    cmd.arg("60")
        .arg("kubectl")
        .args(args)
        .env("KUBECONFIG", local().join("admin.kubeconfig"))
        .stdin(user_side.try_clone().expect("dup"))
        .stdout(user_side.try_clone().expect("dup"))
        .stderr(user_side);
    let mut child = cmd.spawn().expect("run kubectl");
    // Only kubectl holds the user side now: once it exits, reading the
    // master side ends (EIO).
    drop(cmd);
    let mut master = std::fs::File::from(master);
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = master.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&out).into_owned()
    });
    let status = child.wait().expect("wait for kubectl");
    (status.code(), reader.join().expect("the terminal's reader"))
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn kubectl_attach_reaches_the_main_process() {
    let client = client().await;
    let ns = namespace(&client, "e2e-attach").await;
    let mut p = pod(
        "reader",
        "Never",
        BUSYBOX,
        &["sh", "-c", "read l; echo got:$l; sleep 1"],
    );
    let spec = p.spec.as_mut().unwrap();
    spec.containers[0].stdin = Some(true);
    spec.containers[0].stdin_once = Some(true);
    create(&client, &ns, &p).await;
    wait_for(&client, &ns, "reader", 60, "Running", phase("Running")).await;
    let (code, out, err) = kubectl(&["attach", "-n", &ns, "-i", "reader"], "hello\n");
    assert!(
        out.contains("got:hello"),
        "exit {code}; stdout {out:?}; stderr {err}"
    );
    let done = wait_for(&client, &ns, "reader", 30, "Succeeded", phase("Succeeded")).await;
    assert_eq!(container_status(&done).restart_count, 0);
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn kubectl_port_forward_reaches_a_server_in_the_pod() {
    use std::io::{BufRead as _, BufReader};
    let client = client().await;
    let ns = namespace(&client, "e2e-portfwd").await;
    let mut web = pod(
        "web",
        "Never",
        AGNHOST,
        &["/agnhost", "netexec", "--http-port=8080"],
    );
    // Forward only once the server listens: kubectl port-forward gives up
    // after a refused connection.
    web.spec.as_mut().unwrap().containers[0].readiness_probe = Some(
        serde_json::from_value(serde_json::json!({
            "tcpSocket": { "port": 8080 }, "periodSeconds": 1
        }))
        .unwrap(),
    );
    create(&client, &ns, &web).await;
    wait_for(
        &client,
        &ns,
        "web",
        60,
        "Ready",
        condition_is("Ready", "True"),
    )
    .await;
    let mut child = Command::new("kubectl")
        .args(["port-forward", "-n", &ns, "pod/web", ":8080"])
        .env("KUBECONFIG", local().join("admin.kubeconfig"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kubectl port-forward");
    let mut line = String::new();
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    stdout
        .read_line(&mut line)
        .expect("kubectl port-forward output");
    // Keep reading: kubectl dies writing to a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    // "Forwarding from 127.0.0.1:PORT -> 8080"
    let port = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("127.0.0.1:"))
        .unwrap_or_else(|| panic!("no local port in {line:?}"))
        .to_string();
    let mut got = Vec::new();
    for _ in 0..3 {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "10"])
            .arg(format!("http://127.0.0.1:{port}/hostname"))
            .output()
            .expect("run curl");
        got.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let _ = child.kill();
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    let _ = child.wait();
    assert_eq!(got, vec!["web"; 3], "kubectl port-forward: {err}");
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn streaming_endpoints_check_credentials_and_the_pod() {
    let upgrade = [
        "-X",
        "POST",
        "-H",
        "Connection: Upgrade",
        "-H",
        "Upgrade: SPDY/3.1",
    ];
    let (code, body) = curl("/exec/default/p/c?command=true&output=1", &upgrade);
    assert_eq!((code, body.as_str()), (401, "Unauthorized"));

    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = user_cert(dir.path(), "nobody");
    let mut args = upgrade.to_vec();
    args.extend(["--cert", &crt, "--key", &key]);
    for path in [
        "/exec/default/p/c?command=true&output=1",
        "/attach/default/p/c?output=1",
        "/portForward/default/p",
    ] {
        let (code, body) = curl(path, &args);
        assert_eq!(code, 403, "{path}: {body}");
        assert!(
            body.starts_with(
                "Forbidden (user=nobody, verb=create, resource=nodes, subresource(s)=[proxy])"
            ),
            "{path}: {body}"
        );
    }

    // The cluster's admin may; unknown pods and containers are 404.
    let client = client().await;
    let ns = running_sleeper(&client, "e2e-stream404").await;
    let pki = local().join("pki");
    let (crt, key) = (
        pki.join("admin.crt").display().to_string(),
        pki.join("admin.key").display().to_string(),
    );
    let mut args = upgrade.to_vec();
    args.extend(["--cert", &crt, "--key", &key]);
    let cases = [
        (
            format!("/exec/{ns}/missing/c?command=true&output=1"),
            404,
            "pod does not exist",
        ),
        (
            format!("/exec/{ns}/sh/nope?command=true&output=1"),
            404,
            "container \"nope\" not found",
        ),
        (
            format!("/exec/{ns}/sh/wrong-uid/c?command=true&output=1"),
            404,
            "pod not found",
        ),
        (
            format!("/attach/{ns}/sh/nope?output=1"),
            404,
            "container \"nope\" not found",
        ),
        (
            format!("/portForward/{ns}/missing"),
            404,
            "pod does not exist",
        ),
        (
            format!("/exec/{ns}/sh/c?command=true"),
            400,
            "you must specify at least 1 of stdin, stdout, stderr",
        ),
    ];
    for (path, want, msg) in &cases {
        let (code, body) = curl(path, &args);
        assert_eq!(code, *want, "{path}: {body}");
        assert!(body.contains(msg), "{path}: {body}");
    }
    // Without an upgrade there is nothing to proxy.
    let (code, body) = curl(
        &format!("/exec/{ns}/sh/c?command=true&output=1"),
        &["-X", "POST", "--cert", &crt, "--key", &key],
    );
    assert_eq!((code, body.trim()), (500, "Upgrade request required"));
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn configz_shows_the_agents_configuration() {
    let pki = local().join("pki");
    let (crt, key) = (
        pki.join("admin.crt").display().to_string(),
        pki.join("admin.key").display().to_string(),
    );
    let (code, body) = curl("/configz", &["--cert", &crt, "--key", &key]);
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("configz JSON");
    let c = &v["kubeletconfig"];
    assert_eq!(c["port"], 10250, "{v}");
    assert_eq!(c["authentication"]["anonymous"]["enabled"], false, "{v}");
    assert_eq!(c["authorization"]["mode"], "Webhook", "{v}");
    assert!(c["containerRuntimeEndpoint"].as_str().is_some(), "{v}");
}
