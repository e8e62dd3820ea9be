//! The streaming endpoints of the node API, as the kubelet serves them
//! (`getExec`, `getAttach`, `getPortForward` in pkg/kubelet/server/server.go):
//!
//! - `/exec/{namespace}/{pod}[/{uid}]/{container}?command=…&input=1&output=1&error=1&tty=1`
//! - `/attach/{namespace}/{pod}[/{uid}]/{container}?input=1&output=1&…`
//! - `/portForward/{namespace}/{pod}[/{uid}]` (WebSocket clients name `?port=…`)
//!
//! Each asks the container runtime for a URL on its own streaming server (CRI
//! `Exec`, `Attach`, `PortForward`) and then proxies the client's upgraded
//! connection to it (the kubelet's `proxyStream`, apimachinery's
//! `UpgradeAwareHandler`): the upgrade request goes to the runtime with the
//! client's headers (`Connection`, `Upgrade`, `X-Stream-Protocol-Version`,
//! `Sec-WebSocket-*`), the runtime's answer comes back as it is, and after a
//! `101 Switching Protocols` the two connections are spliced until either side
//! ends. The protocol inside (SPDY/3.1 or WebSocket, `v5.channel.k8s.io`,
//! `portforward.k8s.io`, …) is the runtime's business.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, Version, header};
use axum::response::{IntoResponse as _, Response};
use bytes::Bytes;
use http_body_util::Empty;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use serde::Deserialize;
use tokio::io::AsyncWriteExt as _;
use tracing::debug;

use super::{App, fair, text, too_many};
use crate::cri::StreamIo;
use crate::labels::{CONTAINER_NAME_LABEL, POD_UID_LABEL};

/// The path of `/exec` and `/attach`: the pod's UID is optional.
#[derive(Debug, Deserialize)]
pub(super) struct ContainerPath {
    namespace: String,
    pod: String,
    uid: Option<String>,
    container: String,
}

/// The path of `/portForward`.
#[derive(Debug, Deserialize)]
pub(super) struct PodPath {
    namespace: String,
    pod: String,
    uid: Option<String>,
}

/// The first value of query parameter `key`, as Go's `FormValue`.
fn form_value(query: &str, key: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

/// The streams an exec or attach request asks for (`remotecommand.NewOptions`
/// with the core API's `ExecStdinParam` names): `input`, `output`, `error` and
/// `tty`, each on only as `1`; `tty` turns `error` off (a terminal has one output).
///
/// # Errors
/// The kubelet's message when no stream is asked for.
pub fn stream_options(query: &str) -> Result<StreamIo, String> {
    let on = |k: &str| form_value(query, k).as_deref() == Some("1");
    let tty = on("tty");
    let io = StreamIo {
        stdin: on("input"),
        stdout: on("output"),
        stderr: on("error") && !tty,
        tty,
    };
    if !io.stdin && !io.stdout && !io.stderr {
        return Err("you must specify at least 1 of stdin, stdout, stderr".into());
    }
    Ok(io)
}

/// The command of an exec request: every `command` parameter, in order.
#[must_use]
pub fn exec_command(query: &str) -> Vec<String> {
    form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.into_owned())
        .collect()
}

/// Whether `name` lists `token` (comma separated, any case).
fn header_has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// A connection upgrade request: `Connection` names `Upgrade`
/// (`httpstream.IsUpgradeRequest`).
#[must_use]
pub fn is_upgrade_request(headers: &HeaderMap) -> bool {
    header_has_token(headers, header::CONNECTION, "upgrade")
}

/// A WebSocket request: an upgrade to `websocket` (`wsstream.IsWebSocketRequest`).
#[must_use]
pub fn is_websocket_request(headers: &HeaderMap) -> bool {
    is_upgrade_request(headers) && header_has_token(headers, header::UPGRADE, "websocket")
}

/// The ports of a port-forward request (`portforward.NewV4Options`): none for
/// SPDY clients, which name a port per stream; WebSocket clients must give
/// one or more `port` parameters, each a comma-separated list of ports 1–65535.
///
/// # Errors
/// The kubelet's messages for a missing, empty or invalid port.
pub fn port_forward_ports(query: &str, websocket: bool) -> Result<Vec<i32>, String> {
    if !websocket {
        return Ok(Vec::new());
    }
    let values: Vec<String> = form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k == "port")
        .map(|(_, v)| v.into_owned())
        .collect();
    if values.is_empty() {
        return Err(r#"query parameter "port" is required"#.into());
    }
    let mut ports = Vec::new();
    for v in &values {
        if v.is_empty() {
            return Err(r#"query parameter "port" cannot be empty"#.into());
        }
        for p in v.split(',') {
            let port: u16 = p
                .parse()
                .map_err(|e| format!("unable to parse {v:?} as a port: {e}"))?;
            if port == 0 {
                return Err(format!("port {v:?} must be > 0"));
            }
            ports.push(i32::from(port));
        }
    }
    Ok(ports)
}

/// Where a runtime's streaming URL points: (`host:port`, path and query).
///
/// # Errors
/// A message when the URL is not `http://host[:port]/…` (the port defaults to 80).
pub fn stream_target(url: &str) -> Result<(String, String), String> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("runtime streaming URL {url:?}: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!(
            "runtime streaming URL {url:?}: only http:// is supported"
        ));
    }
    let host = uri
        .host()
        .ok_or_else(|| format!("runtime streaming URL {url:?} has no host"))?;
    let port = uri.port_u16().unwrap_or(80);
    let path = uri
        .path_and_query()
        .map_or_else(|| "/".to_string(), ToString::to_string);
    // An IPv6 host keeps its brackets in `host()`.
    Ok((format!("{host}:{port}"), path))
}

/// The request headers sent on to the runtime: all of the client's except
/// `Host` (the runtime's own), its credentials (`Authorization`, meant for this
/// server) and body framing (the upgrade request goes without a body).
#[must_use]
pub fn forwarded_headers(client: &HeaderMap, host: &str) -> HeaderMap {
    let mut out = HeaderMap::with_capacity(client.len() + 1);
    for (k, v) in client {
        if k == header::HOST
            || k == header::AUTHORIZATION
            || k == header::CONTENT_LENGTH
            || k == header::TRANSFER_ENCODING
        {
            continue;
        }
        out.append(k.clone(), v.clone());
    }
    if let Ok(v) = HeaderValue::from_str(host) {
        out.insert(header::HOST, v);
    }
    out
}

/// The answer to a failed CRI call, as the kubelet's `streaming.WriteError`:
/// 404 for `NotFound`, 429 for `ResourceExhausted`, else 500.
fn cri_status(e: &crate::cri::Error) -> Refusal {
    let status = match e.code() {
        Some(tonic::Code::NotFound) => StatusCode::NOT_FOUND,
        Some(tonic::Code::ResourceExhausted) => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    (status, e.to_string())
}

fn cri_error(e: &crate::cri::Error) -> Response {
    let (status, message) = cri_status(e);
    text(status, message)
}

/// A request refused before anything is proxied: status and message.
type Refusal = (StatusCode, String);

/// The pod `namespace/name` from the pod store, checked against `uid` when the
/// path names one; else 404.
fn find_pod(
    app: &App,
    namespace: &str,
    name: &str,
    uid: Option<&str>,
) -> Result<Arc<Pod>, Refusal> {
    let Some(pod) = app.pod(&ObjectRef::<Pod>::new(name).within(namespace)) else {
        return Err((
            StatusCode::NOT_FOUND,
            format!("pod does not exist: {namespace}/{name}"),
        ));
    };
    if let Some(uid) = uid.filter(|u| !u.is_empty())
        && pod.metadata.uid.as_deref() != Some(uid)
    {
        return Err((
            StatusCode::NOT_FOUND,
            format!("pod not found: {namespace}/{name} with UID {uid}"),
        ));
    }
    Ok(pod)
}

/// The container's `tty` from the pod spec (regular, init or ephemeral), or
/// `None` when the pod has no such container.
fn spec_tty(pod: &Pod, name: &str) -> Option<bool> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
        .map(|c| c.tty.unwrap_or(false))
        .or_else(|| {
            spec.ephemeral_containers
                .iter()
                .flatten()
                .find(|c| c.name == name)
                .map(|c| c.tty.unwrap_or(false))
        })
}

/// The CRI ID of the running container `name` of `pod` (the kubelet's
/// `findContainer` over the running pods): 404 when the pod has no such
/// container or it is not running.
async fn running_container(app: &App, pod: &Pod, name: &str) -> Result<(String, bool), Refusal> {
    let full = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    );
    let Some(tty) = spec_tty(pod, name) else {
        return Err((
            StatusCode::NOT_FOUND,
            format!("container {name:?} not found in pod {full}"),
        ));
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let labels = [
        (POD_UID_LABEL.to_string(), uid),
        (CONTAINER_NAME_LABEL.to_string(), name.to_string()),
    ]
    .into();
    let containers = app
        .runtime
        .list_containers(labels)
        .await
        .map_err(|e| cri_status(&e))?;
    containers
        .into_iter()
        .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
        .max_by_key(|c| c.created_at)
        .map(|c| (c.id, tty))
        .ok_or_else(|| {
            (
                StatusCode::NOT_FOUND,
                format!("container {name:?} in pod {full} is not running"),
            )
        })
}

/// What `/exec` and `/attach` resolve before asking the runtime: the stream
/// options of the query (400 if none), and the running container's ID and
/// `tty` setting (404 for an unknown pod, UID or container).
async fn container_target(
    app: &App,
    p: &ContainerPath,
    query: &str,
) -> Result<(StreamIo, String, bool), Response> {
    let io = stream_options(query).map_err(|e| text(StatusCode::BAD_REQUEST, e))?;
    let pod = find_pod(app, &p.namespace, &p.pod, p.uid.as_deref())
        .map_err(|(status, message)| text(status, message))?;
    let (id, tty) = running_container(app, &pod, &p.container)
        .await
        .map_err(|(status, message)| text(status, message))?;
    Ok((io, id, tty))
}

/// `/exec/…` as the kubelet's `getExec`: 400 for a request without streams,
/// 404 for an unknown pod or container, then CRI `Exec` and the proxied upgrade.
pub(super) async fn exec(
    State(app): State<Arc<App>>,
    Path(p): Path<ContainerPath>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let permit = match stream_permit(&app.streams, &p.namespace) {
        Ok(p) => p,
        Err(resp) => return *resp,
    };
    let query = query.unwrap_or_default();
    let (io, id, _) = match container_target(&app, &p, &query).await {
        Ok(t) => t,
        Err(resp) => return resp,
    };
    match app.runtime.exec_url(&id, exec_command(&query), io).await {
        Ok(url) => proxy(req, &url, app.draining.clone(), permit).await,
        Err(e) => cri_error(&e),
    }
}

/// `/attach/…` as the kubelet's `getAttach`; the terminal setting is the
/// container's own (`tty` in its spec), whatever the query says.
pub(super) async fn attach(
    State(app): State<Arc<App>>,
    Path(p): Path<ContainerPath>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let permit = match stream_permit(&app.streams, &p.namespace) {
        Ok(p) => p,
        Err(resp) => return *resp,
    };
    let query = query.unwrap_or_default();
    let (io, id, tty) = match container_target(&app, &p, &query).await {
        Ok(t) => t,
        Err(resp) => return resp,
    };
    let io = StreamIo { tty, ..io };
    match app.runtime.attach_url(&id, io).await {
        Ok(url) => proxy(req, &url, app.draining.clone(), permit).await,
        Err(e) => cri_error(&e),
    }
}

/// `/portForward/…` as the kubelet's `getPortForward`: 400 for bad ports, 404
/// for an unknown pod or one without a sandbox, then CRI `PortForward` on its
/// newest sandbox (a ready one first) and the proxied upgrade.
pub(super) async fn port_forward(
    State(app): State<Arc<App>>,
    Path(p): Path<PodPath>,
    RawQuery(query): RawQuery,
    req: Request,
) -> Response {
    let ports = match port_forward_ports(
        query.as_deref().unwrap_or_default(),
        is_websocket_request(req.headers()),
    ) {
        Ok(ports) => ports,
        Err(e) => return text(StatusCode::BAD_REQUEST, e),
    };
    let permit = match stream_permit(&app.streams, &p.namespace) {
        Ok(p) => p,
        Err(resp) => return *resp,
    };
    let pod = match find_pod(&app, &p.namespace, &p.pod, p.uid.as_deref()) {
        Ok(pod) => pod,
        Err((status, message)) => return text(status, message),
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let sandboxes = match app
        .runtime
        .list_pod_sandboxes([(POD_UID_LABEL.to_string(), uid)].into())
        .await
    {
        Ok(s) => s,
        Err(e) => return cri_error(&e),
    };
    let ready = cri::PodSandboxState::SandboxReady as i32;
    let Some(sandbox) = sandboxes
        .into_iter()
        .max_by_key(|s| (s.state == ready, s.created_at))
    else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod {}/{} has no sandbox", p.namespace, p.pod),
        );
    };
    match app.runtime.port_forward_url(&sandbox.id, ports).await {
        Ok(url) => proxy(req, &url, app.draining.clone(), permit).await,
        Err(e) => cri_error(&e),
    }
}

/// A place for one more upgraded stream in `namespace`
/// ([`super::Limits::max_streams`], [`super::Limits::max_streams_per_namespace`]),
/// held until the stream ends; else 429 with `Retry-After: 1`.
fn stream_permit(
    streams: &Arc<fair::Quota>,
    namespace: &str,
) -> Result<fair::Permit, Box<Response>> {
    streams.try_take(namespace).map_err(|full| {
        Box::new(too_many(match full {
            fair::Full::Node => {
                "too many exec, attach and port-forward streams are open on this node; try again later\n"
            }
            fair::Full::Namespace => {
                "too many exec, attach and port-forward streams of this namespace are open on this node; try again later\n"
            }
        }))
    })
}

/// An error of the proxy itself, as the kubelet's `responder.Error`: 500 and
/// the message.
fn proxy_error(message: impl Into<String>) -> Response {
    let message = message.into();
    debug!(error = message, "stream proxy");
    text(StatusCode::INTERNAL_SERVER_ERROR, message)
}

/// Proxies the upgrade request `req` to the runtime's streaming `url` (the
/// kubelet's `proxyStream`): 500 `Upgrade request required` for a plain
/// request; the runtime's answer relayed; after `101` both connections
/// spliced, `hold` (the stream's place among those open) kept until the
/// stream ends.
async fn proxy<H: Send + 'static>(
    mut req: Request,
    url: &str,
    draining: tokio::sync::watch::Receiver<bool>,
    hold: H,
) -> Response {
    if !is_upgrade_request(req.headers()) {
        return proxy_error("Upgrade request required");
    }
    let (authority, path) = match stream_target(url) {
        Ok(t) => t,
        Err(e) => return proxy_error(e),
    };
    let client_upgrade = hyper::upgrade::on(&mut req);
    let tcp = match tokio::net::TcpStream::connect(&authority).await {
        Ok(s) => s,
        Err(e) => return proxy_error(format!("error dialing backend: {e}")),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await {
        Ok(x) => x,
        Err(e) => return proxy_error(format!("error dialing backend: {e}")),
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            debug!(error = %e, "stream backend connection");
        }
    });
    let mut upstream = hyper::Request::new(Empty::<Bytes>::new());
    *upstream.method_mut() = req.method().clone();
    *upstream.version_mut() = Version::HTTP_11;
    *upstream.uri_mut() = match path.parse() {
        Ok(u) => u,
        Err(e) => return proxy_error(format!("runtime streaming path {path:?}: {e}")),
    };
    *upstream.headers_mut() = forwarded_headers(req.headers(), &authority);
    let mut resp = match sender.send_request(upstream).await {
        Ok(r) => r,
        Err(e) => return proxy_error(format!("error proxying to backend: {e}")),
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // The runtime refused (bad protocol, expired URL): its answer is the client's.
        let (parts, body) = resp.into_parts();
        return Response::from_parts(parts, Body::new(body));
    }
    debug!(url, headers = ?resp.headers(), "runtime switched protocols");
    let backend_upgrade = hyper::upgrade::on(&mut resp);
    tokio::spawn(async move {
        splice(client_upgrade, backend_upgrade, draining).await;
        drop(hold);
    });
    let mut out = Response::new(Body::empty());
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *out.headers_mut() = resp.headers().clone();
    out.into_response()
}

/// Copies bytes both ways between the upgraded client and runtime connections
/// until either direction ends (as `UpgradeAwareHandler`) or the server
/// drains, then closes both.
async fn splice(
    client: OnUpgrade,
    backend: OnUpgrade,
    mut draining: tokio::sync::watch::Receiver<bool>,
) {
    let (client, backend) = match tokio::try_join!(client, backend) {
        Ok(x) => x,
        Err(e) => {
            debug!(error = %e, "stream upgrade");
            return;
        }
    };
    let (mut client_rd, mut client_wr) = tokio::io::split(TokioIo::new(client));
    let (mut backend_rd, mut backend_wr) = tokio::io::split(TokioIo::new(backend));
    let up = async {
        let r = tokio::io::copy(&mut client_rd, &mut backend_wr).await;
        ("client to runtime", r)
    };
    let down = async {
        let r = tokio::io::copy(&mut backend_rd, &mut client_wr).await;
        ("runtime to client", r)
    };
    let drained = async {
        // A server gone without draining (its sender dropped) never drains.
        if draining.wait_for(|d| *d).await.is_err() {
            std::future::pending::<()>().await;
        }
        ("server draining", Ok(0))
    };
    let (dir, r) = tokio::select! {
        r = up => r,
        r = down => r,
        r = drained => r,
    };
    match r {
        Ok(n) => debug!(direction = dir, bytes = n, "stream ended"),
        Err(e) => debug!(direction = dir, error = %e, "stream ended"),
    }
    let _ = tokio::join!(client_wr.shutdown(), backend_wr.shutdown());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_options_follow_the_kubelet() {
        let io = |stdin, stdout, stderr, tty| StreamIo {
            stdin,
            stdout,
            stderr,
            tty,
        };
        let cases: &[(&str, Result<StreamIo, ()>)] = &[
            ("output=1", Ok(io(false, true, false, false))),
            ("input=1&output=1&error=1", Ok(io(true, true, true, false))),
            ("output=1&error=1&tty=1", Ok(io(false, true, false, true))),
            ("input=1&tty=1", Ok(io(true, false, false, true))),
            // Only "1" turns a stream on, and only under the core API's names.
            ("output=true", Err(())),
            ("stdin=1&stdout=1&stderr=1", Err(())),
            ("output=0&error=", Err(())),
            ("tty=1", Err(())),
            ("", Err(())),
            ("error=1&error=0", Ok(io(false, false, true, false))),
        ];
        for (q, want) in cases {
            assert_eq!(stream_options(q).map_err(drop), *want, "{q}");
        }
        assert_eq!(
            stream_options("").unwrap_err(),
            "you must specify at least 1 of stdin, stdout, stderr"
        );
    }

    #[test]
    fn the_command_is_every_command_parameter() {
        assert_eq!(
            exec_command("command=sh&output=1&command=-c&command=echo%20a%26b"),
            vec!["sh", "-c", "echo a&b"]
        );
        assert!(exec_command("output=1").is_empty());
    }

    #[test]
    fn upgrade_and_websocket_requests_are_told_apart() {
        let h = |pairs: &[(&str, &str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.append(
                    header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            m
        };
        let spdy = h(&[("connection", "Upgrade"), ("upgrade", "SPDY/3.1")]);
        let ws = h(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket"),
        ]);
        let plain = h(&[("upgrade", "websocket")]);
        assert!(is_upgrade_request(&spdy) && !is_websocket_request(&spdy));
        assert!(is_upgrade_request(&ws) && is_websocket_request(&ws));
        assert!(!is_upgrade_request(&plain) && !is_websocket_request(&plain));
        assert!(!is_upgrade_request(&HeaderMap::new()));
    }

    #[test]
    fn port_forward_ports_follow_the_kubelet() {
        type Case = (&'static str, bool, Result<Vec<i32>, &'static str>);
        let cases: &[Case] = &[
            ("", false, Ok(vec![])),
            ("port=80", false, Ok(vec![])),
            ("port=80", true, Ok(vec![80])),
            ("port=80,8080&port=443", true, Ok(vec![80, 8080, 443])),
            ("", true, Err(r#"query parameter "port" is required"#)),
            (
                "port=",
                true,
                Err(r#"query parameter "port" cannot be empty"#),
            ),
            ("port=0", true, Err(r#"port "0" must be > 0"#)),
        ];
        for (q, ws, want) in cases {
            let got = port_forward_ports(q, *ws);
            assert_eq!(
                got.as_ref().map_err(String::as_str),
                want.as_ref().map_err(|e| *e),
                "{q}"
            );
        }
        assert!(
            port_forward_ports("port=65536", true)
                .unwrap_err()
                .starts_with(r#"unable to parse "65536" as a port"#)
        );
        assert!(port_forward_ports("port=x", true).is_err());
    }

    #[test]
    fn stream_targets_are_parsed_from_runtime_urls() {
        assert_eq!(
            stream_target("http://127.0.0.1:35123/exec/AbCd").unwrap(),
            ("127.0.0.1:35123".to_string(), "/exec/AbCd".to_string())
        );
        assert_eq!(
            stream_target("http://[::1]:1/portforward/x?a=b").unwrap(),
            ("[::1]:1".to_string(), "/portforward/x?a=b".to_string())
        );
        assert_eq!(
            stream_target("http://node").unwrap(),
            ("node:80".to_string(), "/".to_string())
        );
        assert!(stream_target("https://127.0.0.1:1/exec/x").is_err());
        assert!(stream_target("/exec/x").is_err());
    }

    #[test]
    fn forwarded_headers_keep_the_upgrade_and_drop_credentials() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, "node:10250".parse().unwrap());
        h.insert(header::AUTHORIZATION, "Bearer t".parse().unwrap());
        h.insert(header::CONNECTION, "Upgrade".parse().unwrap());
        h.insert(header::UPGRADE, "SPDY/3.1".parse().unwrap());
        h.append(
            "x-stream-protocol-version",
            "v5.channel.k8s.io".parse().unwrap(),
        );
        h.append(
            "x-stream-protocol-version",
            "v4.channel.k8s.io".parse().unwrap(),
        );
        h.insert(
            "sec-websocket-protocol",
            "v4.channel.k8s.io".parse().unwrap(),
        );
        let out = forwarded_headers(&h, "127.0.0.1:4000");
        assert_eq!(out[header::HOST], "127.0.0.1:4000");
        assert!(out.get(header::AUTHORIZATION).is_none());
        assert_eq!(out[header::CONNECTION], "Upgrade");
        assert_eq!(out[header::UPGRADE], "SPDY/3.1");
        assert_eq!(out.get_all("x-stream-protocol-version").iter().count(), 2);
        assert_eq!(out["sec-websocket-protocol"], "v4.channel.k8s.io");
    }

    /// A runtime streaming server stand-in on loopback: `/exec/tok` upgrades
    /// (echoing the protocol header) and then answers bytes upper-cased; any
    /// other path, or a request with credentials, is 404.
    async fn fake_runtime() -> std::net::SocketAddr {
        use tokio::io::AsyncReadExt as _;
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (tcp, _) = l.accept().await.unwrap();
                let svc = hyper::service::service_fn(
                    |mut req: hyper::Request<hyper::body::Incoming>| async move {
                        let full = http_body_util::Full::<Bytes>::from;
                        if req.uri() != "/exec/tok"
                            || req.headers().contains_key(header::AUTHORIZATION)
                        {
                            return hyper::Response::builder()
                                .status(404)
                                .body(full(Bytes::from_static(b"unknown token")));
                        }
                        let proto = req.headers()["x-stream-protocol-version"].clone();
                        let up = hyper::upgrade::on(&mut req);
                        tokio::spawn(async move {
                            let mut io = TokioIo::new(up.await.unwrap());
                            let mut buf = [0; 64];
                            loop {
                                let n = io.read(&mut buf).await.unwrap();
                                if n == 0 {
                                    break;
                                }
                                io.write_all(&buf[..n].to_ascii_uppercase()).await.unwrap();
                            }
                        });
                        hyper::Response::builder()
                            .status(101)
                            .header(header::CONNECTION, "Upgrade")
                            .header(header::UPGRADE, "SPDY/3.1")
                            .header("x-stream-protocol-version", proto)
                            .body(full(Bytes::new()))
                    },
                );
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .with_upgrades(),
                );
            }
        });
        addr
    }

    #[tokio::test]
    async fn upgrades_are_proxied_and_spliced() {
        use tokio::io::AsyncReadExt as _;
        let runtime = fake_runtime().await;
        let front = axum::Router::new().route(
            "/{token}",
            axum::routing::post(move |Path(token): Path<String>, req: Request| async move {
                proxy(
                    req,
                    &format!("http://{runtime}/exec/{token}"),
                    tokio::sync::watch::channel(false).1,
                    (),
                )
                .await
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front_addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, front).await });

        let send = |path: &'static str, upgrade: bool| async move {
            let tcp = tokio::net::TcpStream::connect(front_addr).await.unwrap();
            let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .unwrap();
            tokio::spawn(conn.with_upgrades());
            let mut req = hyper::Request::post(path).header(header::AUTHORIZATION, "Bearer t");
            if upgrade {
                req = req
                    .header(header::CONNECTION, "Upgrade")
                    .header(header::UPGRADE, "SPDY/3.1")
                    .header("x-stream-protocol-version", "v4.channel.k8s.io");
            }
            tx.send_request(req.body(Empty::<Bytes>::new()).unwrap())
                .await
                .unwrap()
        };

        let mut resp = send("/tok", true).await;
        assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
        assert_eq!(resp.headers()[header::UPGRADE], "SPDY/3.1");
        assert_eq!(
            resp.headers()["x-stream-protocol-version"],
            "v4.channel.k8s.io"
        );
        let mut io = TokioIo::new(hyper::upgrade::on(&mut resp).await.unwrap());
        io.write_all(b"hello").await.unwrap();
        let mut buf = [0; 5];
        io.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"HELLO");

        // The runtime's refusal reaches the client as it is.
        let resp = send("/expired", true).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap();
        assert_eq!(body.to_bytes(), "unknown token");

        // A plain request has nothing to proxy.
        let resp = send("/tok", false).await;
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .unwrap();
        assert_eq!(body.to_bytes().trim_ascii(), b"Upgrade request required");
    }

    /// One stream per namespace: a second in the namespace is refused 429
    /// while the first is open, another namespace's is not, and the place
    /// comes back once the stream ends.
    #[tokio::test]
    async fn upgraded_streams_hold_their_place_until_they_end() {
        let runtime = fake_runtime().await;
        let streams = fair::Quota::new(4, 1);
        let front = axum::Router::new().route(
            "/{namespace}",
            axum::routing::post(move |Path(ns): Path<String>, req: Request| async move {
                match stream_permit(&streams, &ns) {
                    Ok(permit) => {
                        proxy(
                            req,
                            &format!("http://{runtime}/exec/tok"),
                            tokio::sync::watch::channel(false).1,
                            permit,
                        )
                        .await
                    }
                    Err(refused) => *refused,
                }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front_addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, front).await });
        let open = |path: &'static str| async move {
            let tcp = tokio::net::TcpStream::connect(front_addr).await.unwrap();
            let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
                .await
                .unwrap();
            tokio::spawn(conn.with_upgrades());
            let req = hyper::Request::post(path)
                .header(header::CONNECTION, "Upgrade")
                .header(header::UPGRADE, "SPDY/3.1")
                .header("x-stream-protocol-version", "v4.channel.k8s.io")
                .body(Empty::<Bytes>::new())
                .unwrap();
            tx.send_request(req).await.unwrap()
        };
        let mut first = open("/a").await;
        assert_eq!(first.status(), StatusCode::SWITCHING_PROTOCOLS);
        let io = hyper::upgrade::on(&mut first).await.unwrap();
        let refused = open("/a").await;
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
        assert_eq!(open("/b").await.status(), StatusCode::SWITCHING_PROTOCOLS);
        // The first stream ends: its namespace may open another.
        drop(io);
        let mut again = StatusCode::TOO_MANY_REQUESTS;
        for _ in 0..50 {
            again = open("/a").await.status();
            if again == StatusCode::SWITCHING_PROTOCOLS {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        assert_eq!(again, StatusCode::SWITCHING_PROTOCOLS);
    }
}
