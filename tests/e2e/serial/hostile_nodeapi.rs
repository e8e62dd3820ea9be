//! The node API (:10250) under abuse, on the local cluster
//! (`hack/local-up.sh --agent rustlet`): 2,000 idle TLS connections held open,
//! 10,000 requests with bad bearer tokens, then 600 log followers, while
//! `kubectl logs` and `kubectl exec` on a running pod keep answering within a
//! few seconds and a new pod still gets its volumes set up. Prints the
//! TokenReviews per second (counted in the API server's audit log), the
//! agent's resident memory (VmRSS, VmHWM) and open files under the load.
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
const IDLE_CONNECTIONS: usize = 2_000;
const BAD_REQUESTS: usize = 10_000;
/// Distinct bad tokens among the requests: each is reviewed once, then its
/// failure is cached.
const BAD_TOKENS: usize = 1_000;
const BAD_CONNECTIONS: usize = 50;
const FOLLOWERS: usize = 600;
/// Container logs the node API follows at once; more are answered 429.
const FOLLOW_CAP: usize = 256;
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
/// client certificate when `admin`.
fn tls_config(admin: bool) -> Arc<rustls::ClientConfig> {
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
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
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
    // 2,000 connections here too.
    rustlet::server::raise_open_files_limit(rustlet::server::MAX_OPEN_FILES).expect("rlimit");
    let client = client().await;
    let ns = namespace(&client, "hostile-nodeapi").await;
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
    create(&client, &ns, &ticker).await;
    wait_for(&client, &ns, "ticker", 60, "Running", phase("Running")).await;
    let pid = agent_pid();
    let before = usage(pid);
    eprintln!("agent {pid} before: {before:?}");

    let (done_tx, done_rx) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn(probe(ns.clone(), done_rx));

    // 2,000 idle TLS connections, held.
    let anonymous = tls_config(false);
    let started = Instant::now();
    let idle: Vec<std::io::Result<Tls>> = futures::stream::iter(0..IDLE_CONNECTIONS)
        .map(|_| connect(&anonymous))
        .buffer_unordered(64)
        .collect()
        .await;
    let idle: Vec<Tls> = idle.into_iter().filter_map(Result::ok).collect();
    eprintln!(
        "{} of {IDLE_CONNECTIONS} idle connections open in {:?}",
        idle.len(),
        started.elapsed()
    );
    let with_idle = usage(pid);
    eprintln!("agent with idle connections: {with_idle:?}");

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

    // 600 log followers, straight to the node API as the cluster admin.
    let admin = tls_config(true);
    let mut followers = Vec::new();
    let mut follow_status = std::collections::BTreeMap::<u16, usize>::new();
    let path = format!("/containerLogs/{ns}/ticker/c?follow=true");
    for _ in 0..FOLLOWERS {
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
        *follow_status.entry(status).or_default() += 1;
    }
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
    let idle_held = idle.len();
    drop(followers);
    drop(idle);
    drop_namespace(&client, &ns).await;

    assert_eq!(idle_held, IDLE_CONNECTIONS, "idle connections refused");
    // Each held connection is one descriptor; the agent's own (pooled API
    // server connections, log files) come and go meanwhile, so the floor is
    // the connections alone.
    assert!(
        with_idle.fds >= IDLE_CONNECTIONS,
        "the idle connections are not held: {before:?} → {with_idle:?}"
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
    // The cap's worth of followers are served, the rest refused with 429.
    assert_eq!(
        follow_status,
        std::collections::BTreeMap::from([(200, FOLLOW_CAP), (429, FOLLOWERS - FOLLOW_CAP)]),
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
