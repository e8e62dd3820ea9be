//! The node API over real HTTPS on a random port: a test CA and client
//! certificates made with rcgen, and the API server's token and subject access
//! reviews answered by an in-process fake behind a real `kube::Client`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::http::{self, StatusCode};
use http_body_util::{BodyExt as _, Empty};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};

use super::*;
use crate::pod::status_manager::StatusManager;
use k8s_openapi::api::core::v1::PodStatus;

type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

struct Ca {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    pem: String,
}

fn ca(cn: &str) -> Ca {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let pem = params.self_signed(&key).unwrap().pem();
    Ca { params, key, pem }
}

fn client_cert(ca: &Ca, cn: &str, org: &str) -> Identity {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, org);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let issuer = rcgen::Issuer::from_params(&ca.params, &ca.key);
    let cert = params.signed_by(&key, &issuer).unwrap();
    (
        vec![cert.der().clone()],
        PrivateKeyDer::try_from(key.serialize_der()).unwrap(),
    )
}

/// A `kube::Client` whose API server allows `tester` everything and no one
/// else anything, and knows one token, `good`, of user `token-user`. Every
/// review it is asked is recorded.
fn fake_api(seen: Arc<Mutex<Vec<Value>>>) -> Client {
    let svc = tower::service_fn(move |req: http::Request<kube::client::Body>| {
        let seen = seen.clone();
        async move {
            let path = req.uri().path().to_string();
            let body = req.into_body().collect().await?.to_bytes();
            // Long enough for concurrent requests to overlap.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut v: Value = serde_json::from_slice(&body)?;
            seen.lock().unwrap().push(v.clone());
            if path == "/apis/authentication.k8s.io/v1/tokenreviews" {
                v["status"] = if v["spec"]["token"] == "good" {
                    json!({"authenticated": true, "user": {"username": "token-user", "groups": ["g"]}})
                } else {
                    json!({"authenticated": false, "error": "invalid token"})
                };
            } else if path == "/apis/authorization.k8s.io/v1/subjectaccessreviews" {
                v["status"] = json!({"allowed": v["spec"]["user"] == "tester"});
            } else if path == "/api/v1/namespaces/ns/pods/fresh/status" {
                // The status manager's merge patch, answered with the pod it makes.
                v["apiVersion"] = json!("v1");
                v["kind"] = json!("Pod");
                v["metadata"]["resourceVersion"] = json!("4");
            } else {
                panic!("unexpected API call {path}");
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(
                http::Response::builder()
                    .status(201)
                    .body(kube::client::Body::from(serde_json::to_vec(&v)?))?,
            )
        }
    });
    Client::new(svc, "default")
}

/// Pod `fresh`: one container, `c`, that has no status yet (resourceVersion 3).
fn fresh_pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": "fresh", "namespace": "ns", "uid": "u2", "resourceVersion": "3" },
        "spec": { "containers": [{ "name": "c", "image": "busybox" }] },
        "status": { "phase": "Pending" }
    }))
    .unwrap()
}

fn pod() -> Pod {
    pod_in("ns", "p", "u1")
}

/// Pod `namespace/name`: one running container, `c`, restarted once.
fn pod_in(namespace: &str, name: &str, uid: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": namespace, "uid": uid },
        "spec": { "containers": [{ "name": "c", "image": "busybox" }] },
        "status": { "containerStatuses": [{
            "name": "c", "image": "busybox", "imageID": "", "ready": true, "restartCount": 1,
            "containerID": "containerd://b",
            "state": { "running": { "startedAt": "2024-05-01T11:00:00Z" } },
            "lastState": { "terminated": { "exitCode": 1, "containerID": "containerd://a" } }
        }] }
    }))
    .unwrap()
}

struct Fixture {
    addr: SocketAddr,
    healthz: SocketAddr,
    /// The read-only API, when configured.
    read_only: Option<SocketAddr>,
    roots: Arc<RootCertStore>,
    ca: Ca,
    seen: Arc<Mutex<Vec<Value>>>,
    /// The status manager the server reads sent statuses from.
    statuses: Arc<StatusManager>,
    /// The pods' last syncs, explained, as the server serves them.
    explanations: Arc<crate::pod::explain::Explanations>,
    _dir: tempfile::TempDir,
    /// Keeps the server running while the fixture lives.
    _stop: Option<tokio::sync::oneshot::Sender<()>>,
}

async fn start() -> Fixture {
    let (f, stop, _server) = start_until().await;
    Fixture {
        _stop: Some(stop),
        ..f
    }
}

/// A server that runs until the returned sender fires (or is dropped), and its task.
async fn start_until() -> (
    Fixture,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<()>>,
) {
    start_until_with(|_| {}).await
}

/// A server whose configuration `tweak` changed first, kept running.
async fn start_with(tweak: impl FnOnce(&mut ServerConfig)) -> Fixture {
    let (f, stop, _server) = start_until_with(tweak).await;
    Fixture {
        _stop: Some(stop),
        ..f
    }
}

async fn start_until_with(
    tweak: impl FnOnce(&mut ServerConfig),
) -> (
    Fixture,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<Result<()>>,
) {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca("test-ca");
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &ca.pem).unwrap();
    let logs = dir.path().join("logs/ns_p_u1/c");
    std::fs::create_dir_all(&logs).unwrap();
    std::fs::write(logs.join("0.log"), "2024-05-01T10:00:00Z stdout F old\n").unwrap();
    std::fs::write(
        logs.join("1.log"),
        "2024-05-01T11:00:00Z stdout F new1\n2024-05-01T11:00:01Z stderr F new2\n",
    )
    .unwrap();

    // The same in another namespace.
    let other = dir.path().join("logs/other_q_u3/c");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("1.log"), "2024-05-01T11:00:00Z stdout F q\n").unwrap();

    let fresh = dir.path().join("logs/ns_fresh_u2/c");
    std::fs::create_dir_all(&fresh).unwrap();
    std::fs::write(fresh.join("0.log"), "2024-05-01T12:00:00Z stdout F hello\n").unwrap();

    let (store, mut writer) = kube::runtime::reflector::store::<Pod>();
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pod()));
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(fresh_pod()));
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(pod_in(
        "other", "q", "u3",
    )));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let statuses = Arc::new(StatusManager::new(
        fake_api(seen.clone()),
        crate::pod::sources::PodSources::new(&[]).0,
    ));
    let explanations = Arc::new(crate::pod::explain::Explanations::new());
    let mut cfg = ServerConfig::new(
        "n1",
        vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
        dir.path().join("pki"),
        dir.path().join("logs"),
    );
    cfg.address = IpAddr::V4(Ipv4Addr::LOCALHOST);
    cfg.port = 0;
    cfg.healthz_port = Some(0);
    cfg.client_ca_file = Some(ca_file);
    cfg.kubelet_config = tokio::sync::watch::channel(crate::config::Effective {
        configuration: json!({"maxPods": 7, "port": 1}),
        sources: json!({"kubeletconfig": {"maxPods": "file /etc/rustlet.yaml", "port": "default"}}),
    })
    .1;
    tweak(&mut cfg);
    let runtime = crate::cri::Runtime::connect_lazy(
        &format!("unix://{}", dir.path().join("no-runtime.sock").display()),
        Duration::from_secs(5),
    )
    .unwrap();
    let server = Server::bind(
        cfg,
        Deps {
            client: fake_api(seen.clone()),
            pods: store,
            statuses: statuses.clone(),
            explanations: explanations.clone(),
            stats: Arc::new(crate::stats::Provider::new(
                "n1",
                runtime.clone(),
                dir.path().to_path_buf(),
                dir.path().join("logs"),
            )),
            runtime,
        },
    )
    .await
    .unwrap();
    let addr = server.local_addr().unwrap();
    let healthz = server.healthz_addr().unwrap();
    let read_only = server.read_only_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        // Keep the writer (and so the store's contents) alive with the server.
        let _writer = writer;
        server
            .run_until(async {
                let _ = stopped.await;
            })
            .await
    });

    // The self-signed serving certificate, unless `tweak` gave another.
    let mut roots = RootCertStore::empty();
    if let Ok(certs) = CertificateDer::pem_file_iter(dir.path().join("pki/kubelet.crt")) {
        for c in certs {
            roots.add(c.unwrap()).unwrap();
        }
    }
    (
        Fixture {
            addr,
            healthz,
            read_only,
            roots: Arc::new(roots),
            ca,
            seen,
            statuses,
            explanations,
            _dir: dir,
            _stop: None,
        },
        stop,
        task,
    )
}

type ClientTls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

impl Fixture {
    /// Follows the log of `ns/p/c` as the tester over a connection of its
    /// own: the request sender, the connection's task and the response.
    async fn follow(
        &self,
    ) -> (
        hyper::client::conn::http1::SendRequest<Empty<bytes::Bytes>>,
        tokio::task::JoinHandle<hyper::Result<()>>,
        http::Response<hyper::body::Incoming>,
    ) {
        self.follow_log("/containerLogs/ns/p/c?follow=true").await
    }

    /// Follows the log at `path` as [`Fixture::follow`] does.
    async fn follow_log(
        &self,
        path: &str,
    ) -> (
        hyper::client::conn::http1::SendRequest<Empty<bytes::Bytes>>,
        tokio::task::JoinHandle<hyper::Result<()>>,
        http::Response<hyper::body::Incoming>,
    ) {
        let tls = self.connect(self.tester(), &[]).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .unwrap();
        let conn = tokio::spawn(conn);
        let resp = sender
            .send_request(
                http::Request::get(path)
                    .header(http::header::HOST, "127.0.0.1")
                    .body(Empty::<bytes::Bytes>::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        (sender, conn, resp)
    }

    /// A TLS connection to the server, verifying its certificate for
    /// 127.0.0.1, with an optional client certificate, offering `alpn`.
    async fn connect(
        &self,
        identity: Option<Identity>,
        alpn: &[&[u8]],
    ) -> std::io::Result<ClientTls> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(self.roots.clone());
        let mut cfg = match identity {
            Some((chain, key)) => builder.with_client_auth_cert(chain, key).unwrap(),
            None => builder.with_no_client_auth(),
        };
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let tcp = tokio::net::TcpStream::connect(self.addr).await?;
        tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(ServerName::IpAddress(Ipv4Addr::LOCALHOST.into()), tcp)
            .await
    }

    /// GET `path` over HTTPS, verifying the server's certificate for 127.0.0.1,
    /// with an optional client certificate and bearer token.
    async fn get(
        &self,
        path: &str,
        identity: Option<Identity>,
        token: Option<&str>,
    ) -> std::io::Result<(StatusCode, String)> {
        let tls = self.connect(identity, &[]).await?;
        request(TokioIo::new(tls), path, token).await
    }

    fn tester(&self) -> Option<Identity> {
        Some(client_cert(&self.ca, "tester", "testers"))
    }

    /// The kinds of the reviews the API server was asked, in order.
    fn review_kinds(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|v| v["kind"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    fn count(&self, kind: &str) -> usize {
        self.review_kinds().iter().filter(|k| *k == kind).count()
    }
}

/// Waits up to `within` for the peer to close `tls` (a read sees EOF or an error).
async fn closed_within(tls: &mut ClientTls, within: Duration) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(within, tls.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

async fn request<T>(io: T, path: &str, token: Option<&str>) -> std::io::Result<(StatusCode, String)>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    let mut req = http::Request::get(path).header(http::header::HOST, "127.0.0.1");
    if let Some(t) = token {
        req = req.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
    }
    let resp = sender
        .send_request(req.body(Empty::<bytes::Bytes>::new()).unwrap())
        .await
        .map_err(std::io::Error::other)?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(std::io::Error::other)?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::test]
async fn anonymous_requests_are_unauthorized() {
    let f = start().await;
    let (status, body) = f.get("/pods", None, None).await.unwrap();
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::UNAUTHORIZED, "Unauthorized")
    );
    let (status, _) = f.get("/healthz", None, Some("bad")).await.unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_client_certificate_authenticates_and_reviews_authorize() {
    let f = start().await;
    let tester = || Some(client_cert(&f.ca, "tester", "testers"));
    assert_eq!(
        f.get("/healthz", tester(), None).await.unwrap(),
        (StatusCode::OK, "ok".to_string())
    );
    let (status, body) = f.get("/healthz?verbose", tester(), None).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.ends_with("[+]syncloop ok\nhealthz check passed\n"),
        "{body}"
    );
    let (status, body) = f.get("/pods", tester(), None).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let list: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["items"][0]["metadata"]["name"], "fresh");
    assert_eq!(list["items"][1]["metadata"]["name"], "p");
    assert_eq!(
        f.get("/nope", tester(), None).await.unwrap(),
        (StatusCode::NOT_FOUND, "404 page not found\n".to_string())
    );

    // The review carries the certificate's user and groups and the node's attributes.
    let seen = f.seen.lock().unwrap().clone();
    let sar = &seen[0];
    assert_eq!(sar["kind"], "SubjectAccessReview");
    assert_eq!(sar["spec"]["user"], "tester");
    assert_eq!(sar["spec"]["groups"], json!(["testers"]));
    assert_eq!(
        sar["spec"]["resourceAttributes"],
        json!({"verb": "get", "resource": "nodes", "subresource": "healthz", "name": "n1", "version": "v1", "group": "", "namespace": ""})
    );
}

/// A pod's last sync, explained, as JSON to a user who may proxy to the
/// node; 404 for a pod not on the node or not synced yet.
#[tokio::test]
async fn a_pods_plan_is_served_to_those_who_may_proxy() {
    let f = start().await;
    let p = pod();
    let rejection = crate::pod_core::admit::Rejection {
        reason: "OutOfcpu".into(),
        message: "Node didn't have enough resource: cpu".into(),
    };
    let now = crate::fixtures::t(0);
    f.explanations
        .record(crate::pod_core::explain::not_admitted(
            &p,
            Some(&rejection),
            now,
            None,
        ));
    let (status, body) = f
        .get("/debug/pods/ns/p/plan", f.tester(), None)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    let e: crate::pod_core::explain::Explanation = serde_json::from_str(&body).unwrap();
    assert_eq!((e.pod.as_str(), e.uid.as_str()), ("ns/p", "u1"));
    assert_eq!(e.blockers[0].reason, "OutOfcpu");
    for (path, message) in [
        (
            "/debug/pods/ns/fresh/plan",
            "pod ns/fresh has not been synced yet",
        ),
        (
            "/debug/pods/ns/gone/plan",
            "pod ns/gone is not bound to this node",
        ),
    ] {
        let (status, body) = f.get(path, f.tester(), None).await.unwrap();
        assert_eq!((status, body.as_str()), (StatusCode::NOT_FOUND, message));
    }
    // Authorized as nodes/proxy, as logs are.
    let (status, body) = f
        .get("/debug/pods/ns/p/plan", None, Some("good"))
        .await
        .unwrap();
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(body.contains("subresource(s)=[proxy]"), "{body}");
}

#[tokio::test]
async fn users_without_access_are_forbidden_with_the_kubelets_message() {
    let f = start().await;
    let (status, body) = f.get("/pods", None, Some("good")).await.unwrap();
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        body,
        "Forbidden (user=token-user, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
    );
    let nobody = client_cert(&f.ca, "nobody", "none");
    let (status, body) = f
        .get("/containerLogs/ns/p/c", Some(nobody), None)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        body.starts_with("Forbidden (user=nobody, verb=get"),
        "{body}"
    );

    // One token review; both subresources of /pods were asked about.
    let seen = f.seen.lock().unwrap().clone();
    let kinds: Vec<_> = seen
        .iter()
        .map(|v| v["kind"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        kinds,
        [
            "TokenReview",
            "SubjectAccessReview",
            "SubjectAccessReview",
            "SubjectAccessReview"
        ]
    );
    assert_eq!(seen[1]["spec"]["resourceAttributes"]["subresource"], "pods");
    assert_eq!(
        seen[2]["spec"]["resourceAttributes"]["subresource"],
        "proxy"
    );
}

#[tokio::test]
async fn a_certificate_from_another_ca_fails_the_handshake() {
    let f = start().await;
    let other = ca("other-ca");
    let stranger = client_cert(&other, "tester", "testers");
    assert!(f.get("/healthz", Some(stranger), None).await.is_err());
}

/// The serving certificate files and the client CA bundle are read again
/// when they change (`ReloadKubeletServerCertificateFile`,
/// `ReloadKubeletClientCAFile`): new connections get the new certificate,
/// and client certificates of the new CA authenticate.
#[tokio::test]
async fn serving_certificate_files_and_the_client_ca_are_reloaded_when_they_change() {
    let files = tempfile::tempdir().unwrap();
    let (cert, key, ca_file) = (
        files.path().join("serving.crt"),
        files.path().join("serving.key"),
        files.path().join("client-ca.crt"),
    );
    let write_pair = || {
        let (c, k) = tls::self_signed(&["n1".into()], &[IpAddr::V4(Ipv4Addr::LOCALHOST)]).unwrap();
        std::fs::write(&cert, &c).unwrap();
        std::fs::write(&key, k).unwrap();
        c
    };
    let first_pem = write_pair();
    let first_ca = ca("first-ca");
    std::fs::write(&ca_file, &first_ca.pem).unwrap();
    let f = start_with(|cfg| {
        cfg.serving_cert = ServingCert::Files {
            cert: cert.clone(),
            key: key.clone(),
        };
        cfg.client_ca_file = Some(ca_file.clone());
    })
    .await;
    // A client that trusts only `serving` (PEM), presenting `identity`.
    let addr = f.addr;
    let healthz = |serving: String, identity: Identity| async move {
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(serving.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_client_auth_cert(identity.0, identity.1)
            .unwrap();
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(ServerName::IpAddress(Ipv4Addr::LOCALHOST.into()), tcp)
            .await?;
        request(TokioIo::new(tls), "/healthz", None).await
    };
    let ok = (StatusCode::OK, "ok".to_string());
    let first_tester = || client_cert(&first_ca, "tester", "testers");
    assert_eq!(
        healthz(first_pem.clone(), first_tester()).await.unwrap(),
        ok
    );

    let second_pem = write_pair();
    let second_ca = ca("second-ca");
    std::fs::write(&ca_file, &second_ca.pem).unwrap();
    let second_tester = || client_cert(&second_ca, "tester", "testers");
    let deadline = tokio::time::Instant::now() + tls::RELOAD_PERIOD * 5;
    loop {
        match healthz(second_pem.clone(), second_tester()).await {
            Ok(got) => {
                assert_eq!(got, ok);
                break;
            }
            Err(e) => assert!(
                tokio::time::Instant::now() < deadline,
                "not reloaded within {:?}: {e}",
                tls::RELOAD_PERIOD * 5
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        healthz(first_pem, second_tester()).await.is_err(),
        "the old serving certificate is gone"
    );
    assert!(
        healthz(second_pem.clone(), first_tester()).await.is_err(),
        "the old CA no longer verifies"
    );

    // A half-written key does not take the server down: the pair in use stays.
    std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\n").unwrap();
    tokio::time::sleep(tls::RELOAD_PERIOD * 2).await;
    assert_eq!(healthz(second_pem, second_tester()).await.unwrap(), ok);
}

#[tokio::test]
async fn a_status_sent_before_the_watch_brings_it_back_is_what_logs_go_by() {
    let f = start().await;
    let logs = || f.get("/containerLogs/ns/fresh/c", f.tester(), None);
    assert_eq!(
        logs().await.unwrap(),
        (
            StatusCode::BAD_REQUEST,
            "container \"c\" in pod \"fresh\" is not available".to_string()
        )
    );
    // The pod worker reports the container running; the store still holds
    // resourceVersion 3, without it.
    let running: PodStatus = serde_json::from_value(json!({
        "phase": "Running",
        "containerStatuses": [{
            "name": "c", "image": "busybox", "imageID": "", "ready": true, "restartCount": 0,
            "containerID": "containerd://f",
            "state": { "running": { "startedAt": "2024-05-01T12:00:00Z" } }
        }]
    }))
    .unwrap();
    assert!(f.statuses.set_status(&fresh_pod(), running).await.unwrap());
    assert_eq!(
        logs().await.unwrap(),
        (StatusCode::OK, "hello\n".to_string())
    );
    let (status, body) = f.get("/pods", f.tester(), None).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    let list: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["items"][0]["metadata"]["name"], "fresh");
    assert_eq!(list["items"][0]["status"]["phase"], "Running");
}

#[tokio::test]
async fn container_logs_are_served_with_options_and_the_kubelets_errors() {
    let f = start().await;
    let get = |path: &'static str| {
        let f = &f;
        async move {
            f.get(path, Some(client_cert(&f.ca, "tester", "testers")), None)
                .await
                .unwrap()
        }
    };
    let ok = |body: &str| (StatusCode::OK, body.to_string());
    assert_eq!(get("/containerLogs/ns/p/c").await, ok("new1\nnew2\n"));
    assert_eq!(get("/containerLogs/ns/p/c?tailLines=1").await, ok("new2\n"));
    assert_eq!(
        get("/containerLogs/ns/p/c?previous=true").await,
        ok("old\n")
    );
    assert_eq!(
        get("/containerLogs/ns/p/c?timestamps=true&limitBytes=34").await,
        ok("2024-05-01T11:00:00.000000000Z new")
    );
    assert_eq!(
        get("/containerLogs/ns/p/x").await,
        (
            StatusCode::NOT_FOUND,
            "container \"x\" not found in pod \"p\"".into()
        )
    );
    assert_eq!(
        get("/containerLogs/ns/q/c").await,
        (StatusCode::NOT_FOUND, "pod \"q\" does not exist".into())
    );
    assert_eq!(
        get("/containerLogs/ns/p/c?tailLines=-1").await,
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            r#"{"message": "Invalid request."}"#.into()
        )
    );
    assert_eq!(
        get("/containerLogs/ns/p/c?sinceTime=soon").await,
        (
            StatusCode::BAD_REQUEST,
            r#"{"message": "Unable to decode query."}"#.into()
        )
    );
}

#[tokio::test]
async fn the_local_health_endpoint_is_plain_http() {
    let f = start().await;
    let tcp = tokio::net::TcpStream::connect(f.healthz).await.unwrap();
    let got = request(TokioIo::new(tcp), "/healthz", None).await.unwrap();
    assert_eq!(got, (StatusCode::OK, "ok".to_string()));
}

#[tokio::test]
async fn the_read_only_port_serves_pods_and_stats_without_credentials_and_nothing_else() {
    // Off by default.
    assert_eq!(start().await.read_only, None);
    let f = start_with(|c| c.read_only_port = Some(0)).await;
    let addr = f.read_only.expect("read-only API");
    let get = |path: &'static str| async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        request(TokioIo::new(tcp), path, None).await.unwrap()
    };
    let (status, body) = get("/pods").await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["items"][1]["metadata"]["name"], "p");
    assert_eq!(get("/healthz").await, (StatusCode::OK, "ok".to_string()));
    for path in [
        "/configz",
        "/containerLogs/ns/p/c",
        "/exec/ns/p/c?command=ls&output=1",
        "/portForward/ns/p",
    ] {
        assert_eq!(get(path).await.0, StatusCode::NOT_FOUND, "{path}");
    }
    // No token or access review was asked for.
    assert!(f.seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn configz_shows_the_effective_configuration() {
    let f = start().await;
    let (status, body) = f
        .get(
            "/configz",
            Some(client_cert(&f.ca, "tester", "testers")),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_str(&body).unwrap();
    let c = &v["kubeletconfig"];
    assert_eq!(c["maxPods"], 7);
    // The server's own fields win over the agent's.
    assert_eq!(c["port"], 0);
    assert_eq!(c["address"], "127.0.0.1");
    assert_eq!(c["authentication"]["anonymous"]["enabled"], false);
    assert_eq!(c["authentication"]["webhook"]["cacheTTL"], "2m0s");
    assert_eq!(c["authorization"]["mode"], "Webhook");
    assert_eq!(c["authorization"]["webhook"]["cacheUnauthorizedTTL"], "30s");
    assert!(
        c["authentication"]["x509"]["clientCAFile"]
            .as_str()
            .unwrap()
            .ends_with("ca.crt")
    );
    assert!(c["tlsCertFile"].as_str().unwrap().ends_with("kubelet.crt"));
}

#[tokio::test]
async fn configz_follows_a_configuration_applied_while_serving() {
    let effective = |configuration: Value, source: &str| crate::config::Effective {
        configuration,
        sources: json!({"kubeletconfig": {"imageGCHighThresholdPercent": source}}),
    };
    let (tx, rx) = tokio::sync::watch::channel(effective(
        json!({"imageGCHighThresholdPercent": 100}),
        "file /etc/rustlet.yaml",
    ));
    let f = start_with(move |cfg| cfg.kubelet_config = rx).await;
    let read = |path: &'static str| {
        let f = &f;
        async move {
            let (status, body) = f
                .get(path, Some(client_cert(&f.ca, "tester", "testers")), None)
                .await
                .unwrap();
            assert_eq!(status, StatusCode::OK, "{path}: {body}");
            serde_json::from_str::<Value>(&body).unwrap()["kubeletconfig"].clone()
        }
    };
    assert_eq!(read("/configz").await["imageGCHighThresholdPercent"], 100);
    assert_eq!(
        read("/configz/sources").await["imageGCHighThresholdPercent"],
        "file /etc/rustlet.yaml"
    );
    tx.send_replace(effective(
        json!({"imageGCHighThresholdPercent": 70, "port": 1}),
        "NodeConfiguration gc",
    ));
    let c = read("/configz").await;
    assert_eq!(c["imageGCHighThresholdPercent"], 70);
    // The server's own fields still win.
    assert_eq!(c["port"], 0);
    assert_eq!(
        read("/configz/sources").await["imageGCHighThresholdPercent"],
        "NodeConfiguration gc"
    );
    // Authorized as /configz: a user without nodes/configz (nor proxy)
    // is refused.
    let (status, _) = f
        .get(
            "/configz/sources",
            Some(client_cert(&f.ca, "nobody", "nogroup")),
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn streaming_requests_are_checked_before_the_runtime_is_asked() {
    let f = start().await;
    let get = |path: &'static str| {
        let f = &f;
        async move {
            f.get(path, Some(client_cert(&f.ca, "tester", "testers")), None)
                .await
                .unwrap()
        }
    };
    let cases: &[(&str, StatusCode, &str)] = &[
        (
            "/exec/ns/p/c?command=ls",
            StatusCode::BAD_REQUEST,
            "you must specify at least 1 of stdin, stdout, stderr",
        ),
        (
            "/exec/ns/nope/c?command=ls&output=1",
            StatusCode::NOT_FOUND,
            "pod does not exist: ns/nope",
        ),
        (
            "/exec/ns/p/other-uid/c?command=ls&output=1",
            StatusCode::NOT_FOUND,
            "pod not found: ns/p with UID other-uid",
        ),
        (
            "/attach/ns/p/nope?output=1",
            StatusCode::NOT_FOUND,
            "container \"nope\" not found in pod ns/p",
        ),
        (
            "/portForward/ns/nope",
            StatusCode::NOT_FOUND,
            "pod does not exist: ns/nope",
        ),
    ];
    for (path, status, body) in cases {
        assert_eq!(get(path).await, (*status, (*body).to_string()), "{path}");
    }
    // Known pod and container: the runtime is asked, and here it is not there.
    let (status, body) = get("/exec/ns/p/u1/c?command=ls&output=1").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    assert!(body.contains("ListContainers"), "{body}");
}

#[tokio::test]
async fn stats_without_a_runtime_answer_the_kubelets_errors() {
    let f = start().await;
    let tester = || Some(client_cert(&f.ca, "tester", "testers"));
    // The runtime's socket does not exist: the summary cannot be gathered.
    let (status, body) = f.get("/stats/summary", tester(), None).await.unwrap();
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(body.starts_with("Internal Error: "), "{body}");
    // The resource metrics still answer, with the scrape error set.
    let (status, body) = f.get("/metrics/resource", tester(), None).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.lines().any(|l| l == "resource_scrape_error 1"),
        "{body}"
    );
    // So do the cAdvisor metrics.
    let (status, body) = f.get("/metrics/cadvisor", tester(), None).await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.lines().any(|l| l == "container_scrape_error 1"),
        "{body}"
    );
    // Authorized as nodes/stats and nodes/metrics.
    let seen = f.seen.lock().unwrap().clone();
    let subresources: Vec<&str> = seen
        .iter()
        .filter_map(|r| r["spec"]["resourceAttributes"]["subresource"].as_str())
        .collect();
    assert!(subresources.contains(&"stats"), "{subresources:?}");
    assert!(subresources.contains(&"metrics"), "{subresources:?}");
}

#[tokio::test]
async fn draining_ends_followed_logs_and_refuses_new_connections() {
    let (f, stop, server) = start_until().await;
    // The container is running: without the drain this follow never ends.
    let follow = f.get(
        "/containerLogs/ns/p/c?follow=true",
        Some(client_cert(&f.ca, "tester", "testers")),
        None,
    );
    let drain = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.send(()).unwrap();
        // Well within the drain period: the follow ended, it was not cut off.
        tokio::time::timeout(DRAIN - Duration::from_secs(2), server).await
    };
    let (followed, stopped) = tokio::join!(follow, drain);
    assert_eq!(
        followed.unwrap(),
        (StatusCode::OK, "new1\nnew2\n".to_string())
    );
    assert!(matches!(stopped, Ok(Ok(Ok(())))), "{stopped:?}");
    assert!(tokio::net::TcpStream::connect(f.addr).await.is_err());
}

#[tokio::test]
async fn health_checks_fail_while_draining() {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let routes: Router = healthz_routes(rx);
    let get = |path: &'static str| {
        let routes = routes.clone();
        async move {
            let resp = routes
                .oneshot(http::Request::get(path).body(Body::empty()).unwrap())
                .await
                .unwrap();
            let status = resp.status();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    assert_eq!(get("/healthz").await, (StatusCode::OK, "ok".into()));
    tx.send_replace(true);
    assert_eq!(
        get("/healthz").await,
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "[+]ping ok\n[+]log ok\n[-]syncloop failed: reason withheld\nhealthz check failed\n"
                .into()
        )
    );
    assert_eq!(
        get("/healthz/syncloop").await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(get("/healthz/ping").await, (StatusCode::OK, "ok".into()));
}

fn fast_idle(cfg: &mut ServerConfig) {
    cfg.limits.idle_timeout = Duration::from_millis(300);
    // Longer than the test: the idle timeout alone closes connections.
    cfg.limits.header_read_timeout = Duration::from_secs(30);
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_closed_after_the_idle_timeout() {
    let f = start_with(fast_idle).await;
    let mut tls = f.connect(None, &[]).await.unwrap();
    assert!(closed_within(&mut tls, Duration::from_secs(3)).await);
}

#[tokio::test]
async fn kept_alive_connections_are_closed_after_the_idle_timeout() {
    let f = start_with(fast_idle).await;
    for alpn in [&b"http/1.1"[..], &b"h2"[..]] {
        let tls = f.connect(f.tester(), &[alpn]).await.unwrap();
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(alpn));
        let io = TokioIo::new(tls);
        let req = || {
            http::Request::get("https://127.0.0.1/healthz")
                .body(Empty::<bytes::Bytes>::new())
                .unwrap()
        };
        let conn: tokio::task::JoinHandle<()> = if alpn == b"h2" {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                    .await
                    .unwrap();
            let task = tokio::spawn(async move {
                let _ = conn.await;
            });
            assert_eq!(sender.send_request(req()).await.unwrap().status(), 200);
            task
        } else {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            let task = tokio::spawn(async move {
                let _ = conn.await;
            });
            let resp = sender.send_request(req()).await.unwrap();
            assert_eq!(resp.status(), 200);
            resp.into_body().collect().await.unwrap();
            task
        };
        // The server closes it (a GOAWAY for HTTP/2); the client's
        // connection task ends.
        tokio::time::timeout(Duration::from_secs(3), conn)
            .await
            .unwrap_or_else(|_| panic!("{alpn:?} connection still open"))
            .unwrap();
    }
}

#[tokio::test]
async fn a_connection_with_a_request_in_flight_is_not_idle() {
    let f = start_with(fast_idle).await;
    let (_sender, conn, resp) = f.follow().await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, "new1\nnew2\n");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !conn.is_finished(),
        "a connection following a log was closed as idle"
    );
}

#[tokio::test]
async fn request_heads_over_a_mebibyte_are_refused_with_431() {
    let f = start().await;
    let get = |filler: usize| {
        let f = &f;
        async move {
            let tls = f.connect(None, &[]).await.unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .unwrap();
            tokio::spawn(conn);
            sender
                .send_request(
                    http::Request::get("/healthz")
                        .header(http::header::HOST, "127.0.0.1")
                        .header("x-filler", "a".repeat(filler))
                        .body(Empty::<bytes::Bytes>::new())
                        .unwrap(),
                )
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(
        get((1 << 20) + 1024).await,
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
    );
    // Below the limit the request is read (and, without credentials, refused).
    assert_eq!(get(900 << 10).await, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed() {
    let f = start_with(|cfg| cfg.limits.max_connections = 2).await;
    let a = f.connect(None, &[]).await.unwrap();
    let _b = f.connect(None, &[]).await.unwrap();
    // The third is closed before its handshake completes.
    assert!(f.connect(None, &[]).await.is_err());
    // A slot is free again once a connection closes.
    drop(a);
    let mut again = None;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if let Ok(c) = f.connect(None, &[]).await {
            again = Some(c);
            break;
        }
    }
    let tls = again.expect("no connection accepted after one closed");
    let (status, _) = request(TokioIo::new(tls), "/healthz", None).await.unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_read_only_port_keeps_the_connection_cap_and_the_header_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let f = start_with(|cfg| {
        cfg.read_only_port = Some(0);
        cfg.limits.max_connections = 2;
        cfg.limits.header_read_timeout = Duration::from_secs(2);
    })
    .await;
    let addr = f.read_only.expect("read-only API");
    // A client that sends half a request line and nothing more is dropped.
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /pods HT").await.unwrap();
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), slow.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the slow client was not dropped");
    // Two open connections fill the cap: a third is closed unanswered.
    let _a = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _b = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = c.write_all(b"GET /pods HTTP/1.1\r\nhost: x\r\n\r\n").await;
    let mut out = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut out))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0, "a connection beyond the cap was answered");
}

#[tokio::test]
async fn token_reviews_are_cached_and_shared() {
    let f = start().await;
    // Twenty requests at once with one token: one review.
    let many = |token: &'static str| {
        let f = &f;
        futures::future::join_all((0..20).map(move |_| f.get("/healthz", None, Some(token))))
    };
    for got in many("good").await {
        assert_eq!(got.unwrap().0, StatusCode::FORBIDDEN);
    }
    assert_eq!(f.count("TokenReview"), 1);
    // The decision for the user is cached too: one review per subresource.
    assert_eq!(f.count("SubjectAccessReview"), 2);
    for got in many("good").await {
        assert_eq!(got.unwrap().0, StatusCode::FORBIDDEN);
    }
    assert_eq!(f.count("TokenReview"), 1);
    // A token that does not authenticate is cached as well (the kubelet keeps
    // both for cacheTTL), under its hash: the token itself is not kept.
    for got in many("bad").await {
        assert_eq!(got.unwrap().0, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(f.count("TokenReview"), 2);
}

#[tokio::test]
async fn unauthenticated_tokens_are_asked_again_after_the_cache_ttl() {
    let f = start_with(|cfg| cfg.auth_ttls.token = Duration::from_millis(400)).await;
    for _ in 0..3 {
        let (status, _) = f.get("/pods", None, Some("bad")).await.unwrap();
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(f.count("TokenReview"), 1);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (status, _) = f.get("/pods", None, Some("bad")).await.unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(f.count("TokenReview"), 2);
}

#[tokio::test]
async fn denied_decisions_expire_before_allowed_ones() {
    let f = start_with(|cfg| {
        cfg.auth_ttls.allowed = Duration::from_secs(60);
        cfg.auth_ttls.denied = Duration::from_millis(400);
    })
    .await;
    let nobody = || Some(client_cert(&f.ca, "nobody", "none"));
    for _ in 0..2 {
        assert_eq!(
            f.get("/healthz", nobody(), None).await.unwrap().0,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            f.get("/healthz", f.tester(), None).await.unwrap().0,
            StatusCode::OK
        );
    }
    // nobody: healthz and proxy denied; tester: healthz allowed.
    assert_eq!(f.count("SubjectAccessReview"), 3);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        f.get("/healthz", nobody(), None).await.unwrap().0,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        f.get("/healthz", f.tester(), None).await.unwrap().0,
        StatusCode::OK
    );
    assert_eq!(f.count("SubjectAccessReview"), 5);
}

#[tokio::test]
async fn followers_beyond_the_cap_get_429() {
    let f = start_with(|cfg| cfg.limits.max_log_follows = 1).await;
    let (sender, _conn, first) = f.follow().await;
    assert_eq!(first.status(), StatusCode::OK);
    let (status, body) = f
        .get("/containerLogs/ns/p/c?follow=true", f.tester(), None)
        .await
        .unwrap();
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    // Reading without following is not limited.
    assert_eq!(
        f.get("/containerLogs/ns/p/c", f.tester(), None)
            .await
            .unwrap(),
        (StatusCode::OK, "new1\nnew2\n".to_string())
    );
    // Once the first follower goes, another may follow.
    drop(first);
    drop(sender);
    let mut followed = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (_sender, _conn, resp) = f.follow().await;
        if resp.status() == StatusCode::OK {
            followed = true;
            break;
        }
    }
    assert!(followed, "the follow slot was not given back");
}

#[test]
fn many_followers_hold_no_blocking_threads() {
    // Four blocking threads, ten times as many followers: were a follower to
    // hold a blocking thread, spawn_blocking (volume set-up, file reads)
    // would wait for them all.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(4)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let f = start().await;
        let mut held = Vec::new();
        for _ in 0..40 {
            let (sender, _conn, resp) = f.follow().await;
            assert_eq!(resp.status(), StatusCode::OK);
            held.push((sender, resp));
        }
        // Let every follower reach its wait for new lines.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = std::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(5), tokio::task::spawn_blocking(|| ()))
            .await
            .expect("spawn_blocking starved by log followers")
            .unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        drop(held);
    });
}

#[test]
fn the_open_file_limit_is_raised_to_what_is_allowed() {
    use rustix::process::{Resource, getrlimit};
    let before = getrlimit(Resource::Nofile);
    let soft = raise_open_files_limit(MAX_OPEN_FILES).unwrap();
    let after = getrlimit(Resource::Nofile);
    assert_eq!(after.current, Some(soft));
    assert!(soft >= before.current.unwrap_or(0));
    // The soft limit reached the hard one, or the kubelet's number.
    assert!(
        after.current == after.maximum || soft == MAX_OPEN_FILES,
        "{after:?}"
    );
    // Asking again changes nothing.
    assert_eq!(raise_open_files_limit(MAX_OPEN_FILES).unwrap(), soft);
}

#[tokio::test]
async fn a_connection_without_a_request_is_closed_after_the_first_request_deadline() {
    use tokio::io::AsyncReadExt as _;
    // The idle timeout stays at 90 s: only the first-request deadline acts.
    let f = start_with(|cfg| cfg.limits.first_request_timeout = Duration::from_millis(500)).await;
    // The handshake finished, no request sent.
    let started = std::time::Instant::now();
    let mut tls = f.connect(None, &[]).await.unwrap();
    assert!(closed_within(&mut tls, Duration::from_secs(5)).await);
    assert!(started.elapsed() >= Duration::from_millis(400));
    // No handshake either.
    let mut tcp = tokio::net::TcpStream::connect(f.addr).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0) | Err(_))), "{read:?}");
    // A connection whose first request came in time is kept alive past
    // the deadline.
    let tls = f.connect(f.tester(), &[]).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let healthz = || {
        http::Request::get("/healthz")
            .header(http::header::HOST, "127.0.0.1")
            .body(Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    let resp = sender.send_request(healthz()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    resp.into_body().collect().await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!conn.is_finished(), "a kept-alive connection was closed");
    let resp = sender.send_request(healthz()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
}

#[tokio::test]
async fn connections_without_credentials_cannot_keep_out_a_client_certificate() {
    let f = start_with(|cfg| {
        cfg.limits.max_connections = 8;
        cfg.limits.max_unauthenticated = 4;
    })
    .await;
    // Opened before the flood: its certificate takes it out of the pool.
    let early = f.connect(f.tester(), &[]).await.unwrap();
    // Twelve idle connections without credentials: more than all the
    // places there are.
    let mut flood = Vec::new();
    for i in 0..12 {
        let tls = f.connect(None, &[]).await;
        flood.push(tls.unwrap_or_else(|e| panic!("flood connection {i} refused: {e}")));
    }
    // The oldest eight were closed to make room; the newest four wait.
    for (i, tls) in flood.iter_mut().enumerate().take(8) {
        assert!(
            closed_within(tls, Duration::from_secs(2)).await,
            "flood connection {i} still open"
        );
    }
    for (i, tls) in flood.iter_mut().enumerate().skip(8) {
        assert!(
            !closed_within(tls, Duration::from_millis(100)).await,
            "flood connection {i} closed"
        );
    }
    // Client certificates still get in and are served, old and new.
    assert_eq!(
        f.get("/healthz", f.tester(), None).await.unwrap(),
        (StatusCode::OK, "ok".to_string())
    );
    assert_eq!(
        request(TokioIo::new(early), "/healthz", None)
            .await
            .unwrap()
            .0,
        StatusCode::OK
    );
    // A token that authenticates but may not use the node API leaves its
    // connection among those that can be closed to make room.
    let tls = f.connect(None, &[]).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let resp = sender
        .send_request(
            http::Request::get("/healthz")
                .header(http::header::HOST, "127.0.0.1")
                .header(http::header::AUTHORIZATION, "Bearer good")
                .body(Empty::<bytes::Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    resp.into_body().collect().await.unwrap();
    for _ in 0..4 {
        flood.push(f.connect(None, &[]).await.unwrap());
    }
    tokio::time::timeout(Duration::from_secs(2), conn)
        .await
        .expect("the forbidden token's connection was kept")
        .unwrap()
        .ok();
}

#[tokio::test]
async fn an_http2_client_that_opens_no_window_is_closed_after_the_write_deadline() {
    let f = start_with(|cfg| cfg.limits.write_timeout = Duration::from_millis(500)).await;
    let tls = f.connect(f.tester(), &[b"h2"]).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake(TokioIo::new(tls))
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let resp = sender
        .send_request(
            http::Request::get("https://127.0.0.1/pods")
                .body(Empty::<bytes::Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    // The head needs no window; the body waits for one that never opens.
    assert_eq!(resp.status(), StatusCode::OK);
    let body = tokio::spawn(resp.into_body().collect());
    // Others are served meanwhile.
    assert_eq!(
        f.get("/healthz", f.tester(), None).await.unwrap(),
        (StatusCode::OK, "ok".to_string())
    );
    tokio::time::timeout(Duration::from_secs(5), conn)
        .await
        .expect("the zero-window connection is still open")
        .unwrap()
        .ok();
    assert!(body.await.unwrap().is_err(), "the body was sent");
}

#[tokio::test]
async fn one_namespaces_followers_do_not_refuse_another_namespaces() {
    let f = start_with(|cfg| {
        cfg.limits.max_log_follows = 4;
        cfg.limits.max_log_follows_per_namespace = 1;
    })
    .await;
    let (_s1, _c1, first) = f.follow().await;
    assert_eq!(first.status(), StatusCode::OK);
    let (_s2, _c2, refused) = f.follow().await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()[http::header::RETRY_AFTER], "1");
    let body = refused.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&body).contains("of this namespace"),
        "{body:?}"
    );
    let (_s3, _c3, other) = f.follow_log("/containerLogs/other/q/c?follow=true").await;
    assert_eq!(other.status(), StatusCode::OK);
    let mut body = other.into_body();
    let line = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(line, "q\n");
}

#[tokio::test]
async fn upgraded_streams_beyond_the_cap_get_429_before_the_runtime_is_asked() {
    let f = start_with(|cfg| cfg.limits.max_streams_per_namespace = 0).await;
    for path in [
        "/exec/ns/p/c?command=ls&output=1",
        "/attach/ns/p/c?output=1",
        "/portForward/ns/p",
    ] {
        let (status, body) = f.get(path, f.tester(), None).await.unwrap();
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{path}: {body}");
        assert!(body.starts_with("too many exec"), "{path}: {body}");
    }
    // Another namespace is not limited by this one's streams: the runtime
    // is asked (and is not there).
    let f = start_with(|cfg| cfg.limits.max_streams_per_namespace = 1).await;
    let (status, body) = f
        .get("/exec/other/q/c?command=ls&output=1", f.tester(), None)
        .await
        .unwrap();
    assert_ne!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
}

#[tokio::test]
async fn token_reviews_beyond_the_cap_get_429_and_spare_certificate_users() {
    let f = start_with(|cfg| cfg.limits.max_token_reviews = 2).await;
    // Twenty distinct bad tokens at once, each review taking 50 ms, and a
    // certificate user among them.
    let tokens: Vec<String> = (0..20).map(|i| format!("bad-{i}")).collect();
    let bad = futures::future::join_all(tokens.iter().map(|t| f.get("/pods", None, Some(t))));
    let (bad, tester) = tokio::join!(bad, f.get("/healthz", f.tester(), None));
    assert_eq!(tester.unwrap(), (StatusCode::OK, "ok".to_string()));
    let statuses: Vec<StatusCode> = bad.into_iter().map(|r| r.unwrap().0).collect();
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    let unauthorized = statuses
        .iter()
        .filter(|s| **s == StatusCode::UNAUTHORIZED)
        .count();
    assert!(refused > 0, "{statuses:?}");
    assert_eq!(refused + unauthorized, statuses.len(), "{statuses:?}");
    // Only the tokens given a place were reviewed.
    assert_eq!(f.count("TokenReview"), unauthorized);
}

/// `GET path` as the tester with `headers`: the status, the response's
/// headers and its body.
async fn get_with(
    f: &Fixture,
    path: &str,
    headers: &[(&str, &str)],
) -> (StatusCode, http::HeaderMap, String) {
    let tls = f.connect(f.tester(), &[]).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = http::Request::get(path).header(http::header::HOST, "127.0.0.1");
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    let resp = sender
        .send_request(req.body(Empty::<bytes::Bytes>::new()).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[tokio::test]
async fn statusz_and_flagz_answer_as_text_as_objects_and_406_otherwise() {
    let started = Timestamp::now()
        .checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(90))
        .unwrap();
    let f = start_with(|c| {
        c.started = started;
        c.flags = [("node-ip", "10.0.0.1"), ("bootstrap-token", "CLASSIFIED")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    })
    .await;
    let content_type = |h: &http::HeaderMap| {
        h.get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };

    // /statusz as text: the default.
    let (status, h, body) = get_with(&f, "/statusz", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type(&h), "text/plain; charset=utf-8");
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(lines[..2], ["", "kubelet statusz"]);
    assert!(lines[2].starts_with("Warning: This endpoint is not meant to be machine parseable"));
    for (line, field) in lines[4..].iter().zip([
        "Started",
        "Up",
        "Go version",
        "Binary version",
        "Emulation version",
        "Paths",
    ]) {
        assert!(line.starts_with(field), "{line:?} is not {field}");
    }
    assert!(body.contains(&format!("rustlet {}", env!("CARGO_PKG_VERSION"))));
    assert!(lines[8].ends_with(" 1.37"), "{body}");
    assert!(
        body.contains("/configz /flagz /healthz /metrics\n"),
        "{body}"
    );
    // .. and as text for `*/*` too.
    let (status, h, _) = get_with(&f, "/statusz", &[("accept", "*/*")]).await;
    assert_eq!(
        (status, content_type(&h).as_str()),
        (StatusCode::OK, "text/plain; charset=utf-8")
    );

    // /statusz as a config.k8s.io/v1beta1 Statusz.
    let accept = "application/json;as=Statusz;v=v1beta1;g=config.k8s.io";
    let (status, h, body) = get_with(&f, "/statusz", &[("accept", accept)]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        content_type(&h),
        "application/json;g=config.k8s.io;v=v1beta1;as=Statusz"
    );
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["kind"], "Statusz");
    assert_eq!(v["apiVersion"], "config.k8s.io/v1beta1");
    assert_eq!(v["metadata"], json!({"name": "kubelet"}));
    let start: Timestamp = v["startTime"].as_str().unwrap().parse().unwrap();
    assert_eq!(start.as_second(), started.as_second());
    assert!(v["uptimeSeconds"].as_i64().unwrap() >= 90);
    assert!(v["goVersion"].as_str().unwrap().starts_with("rustc "));
    assert_eq!(v["emulationVersion"], "1.37");
    assert_eq!(
        v["paths"],
        json!(["/configz", "/flagz", "/healthz", "/metrics"])
    );

    // /flagz as text and as a Flagz; secrets stay hidden.
    let (status, h, body) = get_with(&f, "/flagz", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(content_type(&h), "text/plain; charset=utf-8");
    let lines: Vec<&str> = body.lines().collect();
    assert_eq!(lines[..2], ["", "kubelet flagz"]);
    assert!(lines[3].starts_with("bootstrap-token") && lines[3].ends_with("CLASSIFIED"));
    assert!(lines[4].starts_with("node-ip") && lines[4].ends_with("10.0.0.1"));
    let accept = "application/json;as=Flagz;v=v1beta1;g=config.k8s.io";
    let (status, h, body) = get_with(&f, "/flagz", &[("accept", accept)]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        content_type(&h),
        "application/json;g=config.k8s.io;v=v1beta1;as=Flagz"
    );
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v,
        json!({
            "kind": "Flagz",
            "apiVersion": "config.k8s.io/v1beta1",
            "metadata": {"name": "kubelet"},
            "flags": {"bootstrap-token": "CLASSIFIED", "node-ip": "10.0.0.1"},
        })
    );
    // The deprecated v1alpha1 is served with a warning.
    let accept = "application/json;as=Flagz;v=v1alpha1;g=config.k8s.io";
    let (status, h, _) = get_with(&f, "/flagz", &[("accept", accept)]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        h[http::header::WARNING]
            .to_str()
            .unwrap()
            .starts_with("299 - ")
    );

    // What neither page offers: 406 with a Status.
    for path in ["/statusz", "/flagz"] {
        for accept in ["application/json", "application/xml"] {
            let (status, h, body) = get_with(&f, path, &[("accept", accept)]).await;
            assert_eq!(status, StatusCode::NOT_ACCEPTABLE, "{path} {accept}");
            assert_eq!(content_type(&h), "application/json", "{path} {accept}");
            let v: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["kind"], "Status");
            assert_eq!(v["reason"], "NotAcceptable");
            assert_eq!(v["code"], 406);
            assert_eq!(
                v["message"],
                "only the following media types are accepted: \
                 application/json, application/yaml, text/plain"
            );
        }
    }

    // Authorized as the kubelet authorizes them: nodes/statusz, and
    // nodes/configz for /flagz.
    let subresources: Vec<String> = f
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter_map(|v| v["spec"]["resourceAttributes"]["subresource"].as_str())
        .map(str::to_string)
        .collect();
    assert!(
        subresources.contains(&"statusz".to_string()),
        "{subresources:?}"
    );
    assert!(
        subresources.contains(&"configz".to_string()),
        "{subresources:?}"
    );

    // Every path /statusz lists from is served.
    for path in HANDLER_PATHS {
        let (status, _, _) = get_with(&f, path, &[]).await;
        assert_ne!(status, StatusCode::NOT_FOUND, "{path}");
    }
}
