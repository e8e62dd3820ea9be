//! The node API (:10250) under abuse, on the local cluster
//! (`hack/local-up.sh --agent rustlet`), with the agent's default limits
//! (`rustlet::server::Limits`):
//! - a flood of 6,000 TLS connections that send nothing (more than the
//!   4,096 the node API serves), then 10,000 requests with bad bearer
//!   tokens, then 600 log followers, while `kubectl logs` and `kubectl exec`
//!   on a running pod keep answering within a few seconds and a new pod
//!   still gets its volumes set up. Prints the TokenReviews per second
//!   (counted in the API server's audit log), the agent's resident memory
//!   (VmRSS, VmHWM) and open files under the load;
//! - HTTP/2 clients that never open their flow-control window, closed after
//!   the write deadline while `kubectl logs` answers;
//! - 300 followers from one namespace, while another namespace's
//!   `kubectl logs -f` still streams.
//!
//! Run with `--nocapture` to see the figures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::*;
use futures::StreamExt as _;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

const NODE_API: &str = "127.0.0.1:10250";
/// TLS connections the flood opens and holds, sending nothing: more than
/// the node API serves at once.
const FLOOD: usize = 6_000;
/// Connections open at once without credentials (the agent's
/// `max_unauthenticated`): a newer one closes the oldest.
const MAX_UNAUTHENTICATED: usize = 1_024;
/// From accept to the first request head (the agent's `first_request_timeout`).
const FIRST_REQUEST: Duration = Duration::from_secs(10);
/// How long a write may wait for the client (the agent's `write_timeout`).
const WRITE_DEADLINE: Duration = Duration::from_secs(60);
const BAD_REQUESTS: usize = 10_000;
/// Distinct bad tokens among the requests: each is reviewed once, then its
/// failure is cached.
const BAD_TOKENS: usize = 1_000;
const BAD_CONNECTIONS: usize = 50;
const FOLLOWERS: usize = 600;
/// Container logs the node API follows at once in one namespace; more are
/// answered 429 (the node's cap, 256, is not reached from one namespace).
const FOLLOW_CAP_PER_NAMESPACE: usize = 64;
/// `kubectl logs` and `kubectl exec` must answer within this, under load.
const SLOW: Duration = Duration::from_secs(5);
/// The agent's peak resident memory under all of it.
const MAX_HWM_KIB: u64 = 160 * 1024;

/// A `/proc/<pid>/status` field in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("agent status");
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("agent fds")
        .count()
}

/// The TokenReviews the node made so far (the API server audits the node's
/// requests).
fn token_reviews() -> usize {
    std::fs::read_to_string(local().join("logs/audit.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(r#""resource":"tokenreviews""#))
        .count()
}

#[derive(Debug)]
struct Usage {
    rss_kib: u64,
    hwm_kib: u64,
    fds: usize,
}

fn usage(pid: u32) -> Usage {
    Usage {
        rss_kib: status_kib(pid, "VmRSS"),
        hwm_kib: status_kib(pid, "VmHWM"),
        fds: open_files(pid),
    }
}

/// TLS to the node API, trusting the cluster CA, with the cluster admin's
/// client certificate when `admin`, speaking HTTP/1.1.
fn tls_config(admin: bool) -> Arc<rustls::ClientConfig> {
    tls_config_alpn(admin, b"http/1.1")
}

/// As [`tls_config`], offering `alpn` (`h2`, `http/1.1`).
fn tls_config_alpn(admin: bool, alpn: &[u8]) -> Arc<rustls::ClientConfig> {
    let pki = local().join("pki");
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(pki.join("ca.crt")).expect("cluster CA") {
        roots.add(c.expect("CA certificate")).expect("add CA");
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots);
    let mut cfg = if admin {
        let chain = CertificateDer::pem_file_iter(pki.join("admin.crt"))
            .expect("admin certificate")
            .collect::<Result<Vec<_>, _>>()
            .expect("admin certificate");
        let key = PrivateKeyDer::from_pem_file(pki.join("admin.key")).expect("admin key");
        builder
            .with_client_auth_cert(chain, key)
            .expect("client auth")
    } else {
        builder.with_no_client_auth()
    };
    cfg.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(cfg)
}

type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

async fn connect(cfg: &Arc<rustls::ClientConfig>) -> std::io::Result<Tls> {
    let tcp = tokio::net::TcpStream::connect(NODE_API).await?;
    // The serving certificate names the node.
    let name = ServerName::try_from(node_name()).expect("node name");
    tokio_rustls::TlsConnector::from(cfg.clone())
        .connect(name, tcp)
        .await
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<bytes::Bytes>>;

async fn http1(tls: Tls) -> hyper::Result<Sender> {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// Whether the node API closed `tls` within `within` (a read sees EOF or an
/// error).
async fn closed_within(tls: &mut Tls, within: Duration) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(within, tls.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// How many of `conns` the node API has not closed.
async fn still_open(conns: &mut [Tls]) -> usize {
    futures::stream::iter(conns.iter_mut())
        .map(|tls| closed_within(tls, Duration::from_millis(20)))
        .buffer_unordered(256)
        .filter(|closed| std::future::ready(!*closed))
        .count()
        .await
}

/// GET `/healthz` straight from the node API as the cluster admin (a
/// client certificate, as the API server's): the status, 0 when the
/// connection failed.
async fn admin_healthz() -> u16 {
    let Ok(tls) = connect(&tls_config(true)).await else {
        return 0;
    };
    let Ok(mut s) = http1(tls).await else {
        return 0;
    };
    match s.send_request(get("/healthz", None)).await {
        Ok(resp) => resp.status().as_u16(),
        Err(_) => 0,
    }
}

/// A running pod `ticker` in `ns` that prints `tick <n>` every second.
async fn ticker(client: &kube::Client, ns: &str) {
    let ticker = pod(
        "ticker",
        "Always",
        BUSYBOX,
        &[
            "sh",
            "-c",
            "i=0; while true; do echo tick $i; i=$((i+1)); sleep 1; done",
        ],
    );
    create(client, ns, &ticker).await;
    wait_for(client, ns, "ticker", 60, "Running", phase("Running")).await;
}

/// `n` followers of `ns/ticker` straight to the node API as the cluster
/// admin, each on a connection of its own: the held responses and the
/// statuses (0: the connection failed) by count.
async fn follow_ticker(
    ns: &str,
    n: usize,
) -> (
    Vec<(Sender, hyper::Response<hyper::body::Incoming>)>,
    std::collections::BTreeMap<u16, usize>,
) {
    let admin = tls_config(true);
    let mut followers = Vec::new();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let path = format!("/containerLogs/{ns}/ticker/c?follow=true");
    for _ in 0..n {
        let status = match connect(&admin).await {
            Ok(tls) => match http1(tls).await {
                Ok(mut s) => match s.send_request(get(&path, None)).await {
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        followers.push((s, resp));
                        status
                    }
                    Err(_) => 0,
                },
                Err(_) => 0,
            },
            Err(_) => 0,
        };
        *statuses.entry(status).or_default() += 1;
    }
    (followers, statuses)
}

fn get(path: &str, token: Option<&str>) -> hyper::Request<Empty<bytes::Bytes>> {
    let mut req = hyper::Request::get(path).header(hyper::header::HOST, node_name());
    if let Some(t) = token {
        req = req.header(hyper::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    req.body(Empty::new()).expect("request")
}

/// `kubectl logs` and `kubectl exec` on the ticker pod, every second until
/// `done`: how many rounds, the failures, the slowest answer.
async fn probe(
    ns: String,
    done: tokio::sync::watch::Receiver<bool>,
) -> (usize, Vec<String>, Duration) {
    let mut rounds = 0;
    let mut failures = Vec::new();
    let mut slowest = Duration::ZERO;
    loop {
        for args in [
            vec!["logs", "-n", &ns, "ticker", "--tail=1"],
            vec!["exec", "-n", &ns, "ticker", "--", "echo", "exec-ok"],
        ] {
            let args: Vec<String> = args.into_iter().map(str::to_string).collect();
            let started = Instant::now();
            let (code, out, err) = tokio::task::spawn_blocking(move || {
                let a: Vec<&str> = args.iter().map(String::as_str).collect();
                kubectl(&a, "")
            })
            .await
            .expect("kubectl");
            let took = started.elapsed();
            slowest = slowest.max(took);
            let want = if out.contains("exec-ok") || out.contains("tick") {
                ""
            } else {
                "unexpected output"
            };
            if code != 0 || !want.is_empty() || took > SLOW {
                failures.push(format!("exit {code} after {took:?}: {out} {err} {want}"));
            }
        }
        rounds += 1;
        if *done.borrow() && rounds >= 2 {
            return (rounds, failures, slowest);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test]
#[ignore = "needs the local cluster (hack/local-up.sh --agent rustlet)"]
async fn the_node_api_keeps_serving_under_abuse() {
    // 6,000 connections here too.
    rustlet::server::raise_open_files_limit(rustlet::server::MAX_OPEN_FILES).expect("rlimit");
    let client = client().await;
    let ns = namespace(&client, "hostile-nodeapi").await;
    ticker(&client, &ns).await;
    let pid = agent_pid();
    let before = usage(pid);
    eprintln!("agent {pid} before: {before:?}");

    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn(probe(ns.clone(), done_rx));

    // A flood of TLS connections that send nothing, held; meanwhile the
    // API server's kind of client (a client certificate) asks every 200 ms.
    let anonymous = tls_config(false);
    let started = Instant::now();
    let (flooding_tx, flooding) = tokio::sync::watch::channel(true);
    let admin = async move {
        let mut statuses = Vec::new();
        while *flooding.borrow() || statuses.len() < 5 {
            statuses.push(admin_healthz().await);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        statuses
    };
    let flood = async {
        let flood: Vec<std::io::Result<Tls>> = futures::stream::iter(0..FLOOD)
            .map(|_| connect(&anonymous))
            .buffer_unordered(64)
            .collect()
            .await;
        flooding_tx.send_replace(false);
        flood
    };
    let (flood, admin_statuses) = tokio::join!(flood, admin);
    let handshakes = flood.iter().filter(|c| c.is_ok()).count();
    let mut flood: Vec<Tls> = flood.into_iter().filter_map(Result::ok).collect();
    let flood_took = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let open_in_flood = still_open(&mut flood).await;
    let with_flood = usage(pid);
    eprintln!(
        "{handshakes} of {FLOOD} flood connections finished their handshake in {flood_took:?}; \
         {open_in_flood} still open; admin /healthz: {admin_statuses:?}; agent: {with_flood:?}"
    );
    // Past the first-request deadline every one of them is closed.
    tokio::time::sleep(FIRST_REQUEST + Duration::from_secs(3)).await;
    let open_after_deadline = still_open(&mut flood).await;
    eprintln!("{open_after_deadline} flood connections open after the first-request deadline");
    drop(flood);

    // 10,000 requests with bad tokens over 50 kept-alive connections.
    let reviews_before = token_reviews();
    let started = Instant::now();
    let per_connection = BAD_REQUESTS / BAD_CONNECTIONS;
    let statuses: Vec<Vec<u16>> = futures::future::join_all((0..BAD_CONNECTIONS).map(|c| {
        let cfg = anonymous.clone();
        async move {
            let mut got = Vec::with_capacity(per_connection);
            let mut sender = None;
            for i in 0..per_connection {
                if sender.is_none() {
                    sender = match connect(&cfg).await {
                        Ok(tls) => http1(tls).await.ok(),
                        Err(_) => None,
                    };
                }
                let Some(s) = sender.as_mut() else {
                    got.push(0);
                    continue;
                };
                let token = format!("bad-token-{}", (c * per_connection + i) % BAD_TOKENS);
                match s.send_request(get("/pods", Some(&token))).await {
                    Ok(resp) => {
                        got.push(resp.status().as_u16());
                        let _ = resp.into_body().collect().await;
                    }
                    Err(_) => {
                        got.push(0);
                        sender = None;
                    }
                }
            }
            got
        }
    }))
    .await;
    let took = started.elapsed();
    // The audit log is written as the API server answers: every distinct
    // token's review shows there within seconds.
    let audited = Instant::now() + Duration::from_secs(15);
    while token_reviews() - reviews_before < BAD_TOKENS && Instant::now() < audited {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let reviews = token_reviews() - reviews_before;
    let statuses: Vec<u16> = statuses.into_iter().flatten().collect();
    let unauthorized = statuses.iter().filter(|s| **s == 401).count();
    let with_bad = usage(pid);
    eprintln!(
        "{} bad-token requests in {took:?} ({:.0}/s): {unauthorized} answered 401; \
         {reviews} TokenReviews ({:.1}/s); agent: {with_bad:?}",
        statuses.len(),
        statuses.len() as f64 / took.as_secs_f64(),
        reviews as f64 / took.as_secs_f64(),
    );

    // 600 log followers from one namespace, straight to the node API as the
    // cluster admin.
    let (followers, follow_status) = follow_ticker(&ns, FOLLOWERS).await;
    eprintln!("followers: {follow_status:?} (status: count)");
    // With every follower waiting, a new pod still gets its volumes set up
    // (on the blocking pool) and starts.
    let started = Instant::now();
    create(
        &client,
        &ns,
        &pod(
            "after",
            "Never",
            BUSYBOX,
            &["sh", "-c", "echo started; sleep 30"],
        ),
    )
    .await;
    wait_for(&client, &ns, "after", 60, "Running", phase("Running")).await;
    let pod_start = started.elapsed();
    let under_load = usage(pid);
    eprintln!("a new pod ran after {pod_start:?}; agent under all of it: {under_load:?}");

    done_tx.send_replace(true);
    let (rounds, failures, slowest) = watcher.await.expect("probe");
    eprintln!(
        "kubectl logs/exec: {rounds} rounds, {} failures, slowest {slowest:?}",
        failures.len()
    );
    drop(followers);
    drop_namespace(&client, &ns).await;

    assert!(
        admin_statuses.iter().all(|s| *s == 200),
        "client-certificate requests during the flood: {admin_statuses:?}"
    );
    // The flood holds no more than the unauthenticated connections' share
    // (a few may still be on their way out).
    assert!(
        open_in_flood <= MAX_UNAUTHENTICATED + 64,
        "{open_in_flood} flood connections open at once"
    );
    assert!(
        with_flood.fds <= before.fds + MAX_UNAUTHENTICATED + 256,
        "the agent holds the flood: {before:?} → {with_flood:?}"
    );
    assert_eq!(
        open_after_deadline, 0,
        "connections without a request outlived the first-request deadline"
    );
    assert_eq!(
        unauthorized, BAD_REQUESTS,
        "bad tokens not all answered 401"
    );
    // Each distinct bad token is reviewed once (concurrent requests with one
    // token share the review), then its failure is cached: every token is
    // reviewed (the API server decides, not the agent), none again and again.
    assert!(
        (BAD_TOKENS..=BAD_TOKENS + BAD_CONNECTIONS).contains(&reviews),
        "{reviews} TokenReviews for {BAD_TOKENS} distinct tokens"
    );
    assert!(failures.is_empty(), "kubectl under load: {failures:#?}");
    // The namespace's cap's worth of followers are served, the rest
    // refused with 429.
    assert_eq!(
        follow_status,
        std::collections::BTreeMap::from([
            (200, FOLLOW_CAP_PER_NAMESPACE),
            (429, FOLLOWERS - FOLLOW_CAP_PER_NAMESPACE)
        ]),
        "followers (status: count)"
    );
    assert!(
        pod_start < Duration::from_secs(30),
        "pod start took {pod_start:?}"
    );
    assert!(under_load.rss_kib <= under_load.hwm_kib);
    assert!(
        under_load.hwm_kib < MAX_HWM_KIB,
        "agent peak RSS {} KiB",
        under_load.hwm_kib
    );
}

/// HTTP/2 connections whose client never opens a flow-control window.
const ZERO_WINDOW: usize = 20;

#[tokio::test]
#[ignore = "needs the local cluster (hack/local-up.sh --agent rustlet)"]
async fn a_zero_window_http2_client_is_closed_after_the_write_deadline() {
    let client = client().await;
    let ns = namespace(&client, "hostile-zero-window").await;
    ticker(&client, &ns).await;
    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn(probe(ns.clone(), done_rx));

    // Half as the cluster admin (past the auth filter, a pod list to send),
    // half without credentials (a 401 to send): every body waits for a
    // window the client never opens.
    let mut conns = Vec::new();
    for i in 0..ZERO_WINDOW {
        let admin = i % 2 == 0;
        let tls = connect(&tls_config_alpn(admin, b"h2"))
            .await
            .expect("connect");
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        let (mut sender, conn) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .initial_stream_window_size(0)
                .handshake(TokioIo::new(tls))
                .await
                .expect("HTTP/2 handshake");
        let conn = tokio::spawn(conn);
        let resp = sender
            .send_request(
                hyper::Request::get(format!("https://{}/pods", node_name()))
                    .body(Empty::<bytes::Bytes>::new())
                    .expect("request"),
            )
            .await
            .expect("response head");
        assert_eq!(
            resp.status().as_u16(),
            if admin { 200 } else { 401 },
            "zero-window connection {i}"
        );
        conns.push((sender, resp, conn));
    }
    let started = Instant::now();
    let mut closed_after = Vec::new();
    for (i, (_sender, _resp, conn)) in conns.into_iter().enumerate() {
        let left = (WRITE_DEADLINE + Duration::from_secs(30)).saturating_sub(started.elapsed());
        let ended = tokio::time::timeout(left, conn).await;
        assert!(
            ended.is_ok(),
            "zero-window connection {i} still open after {:?}",
            started.elapsed()
        );
        closed_after.push(started.elapsed());
    }
    eprintln!("zero-window connections closed after {closed_after:?}");
    done_tx.send_replace(true);
    let (rounds, failures, slowest) = watcher.await.expect("probe");
    eprintln!(
        "kubectl logs/exec: {rounds} rounds, {} failures, slowest {slowest:?}",
        failures.len()
    );
    drop_namespace(&client, &ns).await;
    assert!(failures.is_empty(), "kubectl meanwhile: {failures:#?}");
    // Closed by the write deadline, not by anything sooner.
    assert!(
        closed_after[0] >= WRITE_DEADLINE - Duration::from_secs(10),
        "closed after {:?}",
        closed_after[0]
    );
}

/// Followers from one namespace: more than its cap.
const ONE_NAMESPACE_FOLLOWERS: usize = 300;

#[tokio::test]
#[ignore = "needs the local cluster (hack/local-up.sh --agent rustlet)"]
async fn one_namespaces_followers_leave_room_for_another() {
    use futures::AsyncBufReadExt as _;
    rustlet::server::raise_open_files_limit(rustlet::server::MAX_OPEN_FILES).expect("rlimit");
    let client = client().await;
    let busy = namespace(&client, "hostile-followers").await;
    let other = namespace(&client, "hostile-follow-other").await;
    ticker(&client, &busy).await;
    ticker(&client, &other).await;
    let (followers, statuses) = follow_ticker(&busy, ONE_NAMESPACE_FOLLOWERS).await;
    eprintln!("followers of {busy}: {statuses:?} (status: count)");
    // Another namespace's `kubectl logs -f`, through the API server.
    let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(client.clone(), &other);
    let follow = kube::api::LogParams {
        follow: true,
        tail_lines: Some(1),
        ..kube::api::LogParams::default()
    };
    let started = Instant::now();
    let lines = tokio::time::timeout(Duration::from_secs(15), async {
        let mut lines = api
            .log_stream("ticker", &follow)
            .await
            .expect("log stream")
            .lines();
        let mut got = Vec::new();
        while got.len() < 2 {
            match lines.next().await {
                Some(Ok(l)) => got.push(l),
                Some(Err(e)) => panic!("read log stream: {e}"),
                None => break,
            }
        }
        got
    })
    .await;
    eprintln!("{other}'s follow: {lines:?} after {:?}", started.elapsed());
    drop(followers);
    drop_namespace(&client, &busy).await;
    drop_namespace(&client, &other).await;
    assert_eq!(
        statuses,
        std::collections::BTreeMap::from([
            (200, FOLLOW_CAP_PER_NAMESPACE),
            (429, ONE_NAMESPACE_FOLLOWERS - FOLLOW_CAP_PER_NAMESPACE)
        ]),
        "followers of one namespace (status: count)"
    );
    let lines = lines.expect("another namespace's follow streamed nothing within 15 s");
    // The last line, then a new one a second later: it follows.
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines.iter().all(|l| l.starts_with("tick ")), "{lines:?}");
}
