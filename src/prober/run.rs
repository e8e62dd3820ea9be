//! Running one probe action against a container, as the kubelet's prober:
//! exec through CRI `ExecSync`, HTTP GET (200–399 passes), TCP connect, and the
//! gRPC health checking protocol. Each returns pass/fail and the output for events.
//! The HTTP client here also serves the lifecycle hooks' `httpGet` handlers.

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Container, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::net::TcpStream;

use crate::cri::Runtime;

/// The outcome of one probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// True when the probe passed.
    pub ok: bool,
    /// Output or the reason of the failure, for the `Unhealthy` event.
    pub output: String,
    /// The probe passed with a warning (the kubelet's `probe.Warning`: an HTTP
    /// probe that stopped at a redirect to another host); `output` says why,
    /// for the `ProbeWarning` event.
    pub warning: bool,
    /// The probe could not be run at all (the kubelet's `probe.Unknown` with an
    /// error): the runtime failed the `ExecSync` call (container not found,
    /// runtime unavailable), or the probe names a port the container does not
    /// have. Not a failure: the kubelet's worker throws such a result away,
    /// so it neither counts toward a threshold nor is counted in
    /// `prober_probe_total`; `output` is the error, for the `Unhealthy` event.
    pub errored: bool,
}

impl Outcome {
    fn pass(output: impl Into<String>) -> Self {
        Self {
            ok: true,
            output: output.into(),
            warning: false,
            errored: false,
        }
    }
    fn warn(output: impl Into<String>) -> Self {
        Self {
            warning: true,
            ..Self::pass(output)
        }
    }
    fn fail(output: impl Into<String>) -> Self {
        Self {
            ok: false,
            ..Self::pass(output)
        }
    }
    fn error(output: impl Into<String>) -> Self {
        Self {
            errored: true,
            ..Self::fail(output)
        }
    }
}

/// Resolves a probe port: a number, or the name of one of the container's ports.
///
/// # Errors
/// A name no port of the container has, or a number out of range.
pub fn resolve_port(port: &IntOrString, c: &Container) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("invalid port number: {n}")),
        IntOrString::String(name) => match name.parse::<u16>() {
            Ok(n) => Ok(n),
            Err(_) => c
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .ok_or_else(|| format!("couldn't find port: {name} in {}", c.name)),
        },
    }
}

/// The address a network probe dials: `host` if given, else the pod IP, and the
/// resolved port.
fn target(
    host: Option<&String>,
    port: &IntOrString,
    c: &Container,
    pod_ip: Option<IpAddr>,
) -> Result<(String, u16), String> {
    let port = resolve_port(port, c)?;
    let host = host
        .filter(|h| !h.is_empty())
        .cloned()
        .or(pod_ip.map(|ip| ip.to_string()));
    host.map(|h| (h, port))
        .ok_or_else(|| "no pod IP to probe".to_string())
}

/// Runs `probe` once against container `container_id` (spec `c`) of a pod at
/// `pod_ip`, within `timeout`.
pub async fn probe_once(
    runtime: &Runtime,
    probe: &Probe,
    c: &Container,
    container_id: &str,
    pod_ip: Option<IpAddr>,
    timeout: Duration,
) -> Outcome {
    if let Some(exec) = &probe.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        return match runtime.exec_sync(container_id, cmd, timeout).await {
            Ok((0, out)) => Outcome::pass(String::from_utf8_lossy(&out)),
            Ok((code, out)) => Outcome::fail(format!(
                "{}command terminated with exit code {code}",
                String::from_utf8_lossy(&out)
            )),
            // A command that outlives its timeout fails the probe, as the
            // kubelet's exec prober (ExecProbeTimeout); the runtime reports it
            // as DeadlineExceeded, or the call's own deadline passes.
            Err(
                crate::cri::Error::Timeout { .. }
                | crate::cri::Error::Call {
                    code: tonic::Code::DeadlineExceeded,
                    ..
                },
            ) => Outcome::fail(format!("command timed out after {}s", timeout.as_secs())),
            // Any other error of the call says nothing about the container's
            // health: thrown away, as the kubelet's worker does.
            Err(e) => Outcome::error(e.to_string()),
        };
    }
    if let Some(h) = &probe.http_get {
        // A port the container does not have is the kubelet's request error:
        // the probe errored; no address to dial is a failure.
        if let Err(e) = resolve_port(&h.port, c) {
            return Outcome::error(e);
        }
        let target = match HttpTarget::of(h, c, pod_ip) {
            Ok(target) => target,
            Err(e) => return Outcome::fail(e),
        };
        let headers = action_headers(h);
        let url = target.url();
        return match tokio::time::timeout(timeout, http_get(&target, &headers, "probe")).await {
            Ok(Ok(resp)) => http_outcome(&resp),
            Ok(Err(e)) => Outcome::fail(e),
            Err(_) => Outcome::fail(format!(
                "Get \"{url}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
            )),
        };
    }
    if let Some(t) = &probe.tcp_socket {
        if let Err(e) = resolve_port(&t.port, c) {
            return Outcome::error(e);
        }
        let (host, port) = match target(t.host.as_ref(), &t.port, c, pod_ip) {
            Ok(target) => target,
            Err(e) => return Outcome::fail(e),
        };
        return match tokio::time::timeout(timeout, TcpStream::connect((host.as_str(), port))).await
        {
            Ok(Ok(_)) => Outcome::pass(""),
            Ok(Err(e)) => Outcome::fail(format!("dial tcp {host}:{port}: {e}")),
            Err(_) => Outcome::fail(format!("dial tcp {host}:{port}: i/o timeout")),
        };
    }
    if let Some(g) = &probe.grpc {
        let Some(ip) = pod_ip else {
            return Outcome::fail("no pod IP to probe");
        };
        let service = g.service.clone().unwrap_or_default();
        return match tokio::time::timeout(timeout, grpc_health(ip, g.port, service)).await {
            Ok(Ok(true)) => Outcome::pass(""),
            Ok(Ok(false)) => Outcome::fail("service unhealthy (responded with \"NOT_SERVING\")"),
            Ok(Err(e)) => Outcome::fail(e),
            Err(_) => Outcome::fail(format!(
                "timeout: health rpc did not complete within {}s",
                timeout.as_secs()
            )),
        };
    }
    Outcome::error("missing probe handler")
}

/// The most of a response body an HTTP probe or hook reads (the kubelet's
/// `maxRespBodyLength`, 10 KiB).
const MAX_BODY: usize = 10 * 1024;

/// The most redirects an HTTP probe or hook follows (net/http's default, kept
/// by the prober's `RedirectChecker`).
const MAX_REDIRECTS: usize = 10;

/// The scheme of an HTTP probe or hook.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP.
    Http,
    /// HTTPS; the server's certificate is not verified, as the kubelet's prober
    /// and lifecycle hook clients do (`InsecureSkipVerify`).
    Https,
}

impl Scheme {
    fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Https => "https",
        }
    }
}

/// Where an HTTP probe or hook sends its GET: the URL the kubelet's
/// `NewRequestForHTTPGetAction` builds (pkg/probe/http/request.go).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpTarget {
    /// Scheme.
    pub scheme: Scheme,
    /// Host name or IP address (without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
}

impl HttpTarget {
    /// The target of `h` for container `c` of a pod at `pod_ip`: `host` if
    /// given, else the pod IP; the port by number or by the name of one of the
    /// container's ports; scheme `HTTP` unless `HTTPS`.
    ///
    /// # Errors
    /// An unknown port name, a port out of range, or no host and no pod IP.
    pub fn of(h: &HTTPGetAction, c: &Container, pod_ip: Option<IpAddr>) -> Result<Self, String> {
        let (host, port) = target(h.host.as_ref(), &h.port, c, pod_ip)?;
        let scheme = if h
            .scheme
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("HTTPS"))
        {
            Scheme::Https
        } else {
            Scheme::Http
        };
        let path = h.path.clone().unwrap_or_default();
        let path = if path.starts_with('/') {
            path
        } else {
            format!("/{path}")
        };
        Ok(Self {
            scheme,
            host,
            port,
            path,
        })
    }

    /// `host:port`, with an IPv6 address in brackets.
    #[must_use]
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The full URL, as Go's `url.URL.String()` prints it.
    #[must_use]
    pub fn url(&self) -> String {
        format!(
            "{}://{}{}",
            self.scheme.as_str(),
            self.authority(),
            self.path
        )
    }

    /// Where a redirect with `Location: location` leads from this target, as
    /// net/http resolves it (`url.URL.ResolveReference`): an absolute URL, a
    /// scheme-relative `//host/path`, an absolute path, or a path relative to
    /// this target's directory. None for a location that is not a URL.
    #[must_use]
    pub fn redirect(&self, location: &str) -> Option<Self> {
        let location = location.trim();
        if location.starts_with("//") {
            return self.redirect(&format!("{}:{location}", self.scheme.as_str()));
        }
        let lower = location.to_ascii_lowercase();
        if lower.starts_with("http://") || lower.starts_with("https://") {
            let uri: hyper::Uri = location.parse().ok()?;
            let scheme = if uri.scheme_str()?.eq_ignore_ascii_case("https") {
                Scheme::Https
            } else {
                Scheme::Http
            };
            let host = uri
                .host()?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().unwrap_or(match scheme {
                Scheme::Http => 80,
                Scheme::Https => 443,
            });
            let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
            let path = if path.is_empty() { "/".into() } else { path };
            return Some(Self {
                scheme,
                host,
                port,
                path,
            });
        }
        let path = if location.starts_with('/') {
            location.to_string()
        } else if location.starts_with('?') {
            let base = self.path.split('?').next().unwrap_or("/");
            format!("{base}{location}")
        } else {
            let base = self.path.split('?').next().unwrap_or("/");
            let dir = &base[..=base.rfind('/').unwrap_or(0)];
            format!("{dir}{location}")
        };
        let path = if path.is_empty() { "/".into() } else { path };
        Some(Self {
            path,
            ..self.clone()
        })
    }
}

/// The headers of `h`, in order (repeated names are all sent).
#[must_use]
pub fn action_headers(h: &HTTPGetAction) -> Vec<(String, String)> {
    h.http_headers
        .iter()
        .flatten()
        .map(|x| (x.name.clone(), x.value.clone()))
        .collect()
}

/// A response of an HTTP probe or hook, after the redirects that were followed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// The start of the body (at most 10 KiB), lossily decoded.
    pub body: String,
}

/// The probe result of `resp`, as the kubelet's `DoHTTPProbe`: 2xx passes with
/// the body as output; 3xx (a redirect that was not followed) passes with a
/// warning; anything else fails.
#[must_use]
pub fn http_outcome(resp: &HttpResponse) -> Outcome {
    match resp.status {
        200..=299 => Outcome::pass(resp.body.clone()),
        300..=399 => Outcome::warn(format!(
            "Probe terminated redirects, Response body: {}",
            resp.body
        )),
        code => Outcome::fail(format!("HTTP probe failed with statuscode: {code}")),
    }
}

/// The request's `User-Agent`: `kube-<purpose>/<major>.<minor>` (the kubelet's
/// `userAgent`).
fn user_agent(purpose: &str) -> String {
    let v = crate::KUBERNETES_VERSION.trim_start_matches('v');
    let minor: Vec<&str> = v.split('.').take(2).collect();
    format!("kube-{purpose}/{}", minor.join("."))
}

/// Sends GET requests to `target` with `headers`, following redirects as the
/// kubelet's HTTP prober and lifecycle hook clients do (`RedirectChecker(false)`):
/// up to 10 redirects to the same host; a redirect to another host is not
/// followed and its response is returned. `purpose` names the client in the
/// `User-Agent` (`probe`, `lifecycle`). HTTPS does not verify certificates.
///
/// # Errors
/// A connection, TLS or protocol failure, or more than 10 redirects, worded as
/// Go's `Get "<url>": <error>`.
pub async fn http_get(
    target: &HttpTarget,
    headers: &[(String, String)],
    purpose: &str,
) -> Result<HttpResponse, String> {
    let mut current = target.clone();
    let mut redirects = 0;
    loop {
        let url = current.url();
        let (status, location, body) = fetch(&current, headers, purpose)
            .await
            .map_err(|e| format!("Get \"{url}\": {e}"))?;
        let next = match (status, location) {
            (301 | 302 | 303 | 307 | 308, Some(loc)) => current.redirect(&loc),
            _ => None,
        };
        let Some(next) = next else {
            return Ok(HttpResponse { status, body });
        };
        if !next.host.eq_ignore_ascii_case(&target.host) {
            return Ok(HttpResponse { status, body });
        }
        redirects += 1;
        if redirects > MAX_REDIRECTS {
            return Err(format!(
                "Get \"{}\": stopped after 10 redirects",
                next.url()
            ));
        }
        current = next;
    }
}

/// A rustls verifier that accepts any server certificate (Go's
/// `InsecureSkipVerify`), still checking the handshake signatures.
#[derive(Debug)]
struct AcceptAnyCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyCert {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The TLS client configuration of HTTPS probes and hooks (no certificate
/// verification, HTTP/1.1).
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyCert(provider)))
                .with_no_client_auth();
            Ok(Arc::new(config))
        })
        .clone()
}

/// One GET of `target`: status, `Location` header and the start of the body.
async fn fetch(
    target: &HttpTarget,
    headers: &[(String, String)],
    purpose: &str,
) -> Result<(u16, Option<String>, String), String> {
    let stream = TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|e| format!("dial tcp {}: {e}", target.authority()))?;
    match target.scheme {
        Scheme::Http => exchange(TokioIo::new(stream), target, headers, purpose).await,
        Scheme::Https => {
            let name = rustls::pki_types::ServerName::try_from(target.host.clone())
                .map_err(|e| e.to_string())?;
            let tls = tokio_rustls::TlsConnector::from(tls_config()?)
                .connect(name, stream)
                .await
                .map_err(|e| format!("tls: {e}"))?;
            exchange(TokioIo::new(tls), target, headers, purpose).await
        }
    }
}

/// Sends the GET over an established connection `io` (the kubelet's
/// `newProbeRequest`: `User-Agent` and `Accept: */*` unless the action sets
/// them, an empty `Accept` dropped, a `Host` header used as the request's host).
async fn exchange<I>(
    io: I,
    target: &HttpTarget,
    headers: &[(String, String)],
    purpose: &str,
) -> Result<(u16, Option<String>, String), String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
    let host = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("Host"))
        .map_or_else(|| target.authority(), |(_, v)| v.clone());
    let mut req = hyper::Request::get(target.path.as_str()).header("Host", host);
    if !has("User-Agent") {
        req = req.header("User-Agent", user_agent(purpose));
    }
    if !has("Accept") {
        req = req.header("Accept", "*/*");
    }
    for (k, v) in headers {
        if k.eq_ignore_ascii_case("Host") || (k.eq_ignore_ascii_case("Accept") && v.is_empty()) {
            continue;
        }
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let location = resp
        .headers()
        .get(hyper::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut body = resp.into_body();
    let mut bytes = Vec::new();
    while bytes.len() < MAX_BODY {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    bytes.extend_from_slice(data);
                }
            }
            // A body cut short still leaves the status to judge by.
            Some(Err(_)) | None => break,
        }
    }
    bytes.truncate(MAX_BODY);
    Ok((
        status,
        location,
        String::from_utf8_lossy(&bytes).into_owned(),
    ))
}

/// The URL a gRPC probe dials for `ip` and `port`. A port out of range is an
/// error, as the kubelet's dial of it fails: in a URL it would parse with no
/// port and the probe would reach port 80.
fn grpc_url(ip: IpAddr, port: i32) -> Result<String, String> {
    let Ok(port) = u16::try_from(port) else {
        return Err(format!(
            "failed to connect service \"{ip}:{port}\": dial tcp: address {port}: invalid port"
        ));
    };
    Ok(match ip {
        IpAddr::V4(v4) => format!("http://{v4}:{port}"),
        IpAddr::V6(v6) => format!("http://[{v6}]:{port}"),
    })
}

async fn grpc_health(ip: IpAddr, port: i32, service: String) -> Result<bool, String> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let url = grpc_url(ip, port)?;
    let channel = tonic::transport::Endpoint::from_shared(url)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("failed to connect service {ip}:{port} within the timeout: {e}"))?;
    let resp = HealthClient::new(channel)
        .check(HealthCheckRequest { service })
        .await
        .map_err(|s| format!("health rpc failed: {}", s.message()))?;
    Ok(resp.into_inner().status == ServingStatus::Serving as i32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ContainerPort;

    #[test]
    fn ports_by_number_or_name() {
        let c = Container {
            name: "web".into(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert_eq!(resolve_port(&IntOrString::Int(80), &c), Ok(80));
        assert_eq!(
            resolve_port(&IntOrString::String("http".into()), &c),
            Ok(8080)
        );
        assert_eq!(resolve_port(&IntOrString::String("81".into()), &c), Ok(81));
        assert!(
            resolve_port(&IntOrString::String("grpc".into()), &c)
                .unwrap_err()
                .contains("couldn't find port")
        );
        assert!(resolve_port(&IntOrString::Int(70000), &c).is_err());
    }

    #[test]
    fn grpc_ports_out_of_range_fail() {
        let v4: IpAddr = "10.0.0.5".parse().unwrap();
        let v6: IpAddr = "fd00::5".parse().unwrap();
        let ok = |s: &str| Ok(s.to_string());
        assert_eq!(grpc_url(v4, 9090), ok("http://10.0.0.5:9090"));
        assert_eq!(grpc_url(v6, 65535), ok("http://[fd00::5]:65535"));
        assert_eq!(grpc_url(v4, 0), ok("http://10.0.0.5:0"));
        for port in [65536, -1, i32::MAX, i32::MIN] {
            let err = grpc_url(v4, port).unwrap_err();
            assert!(
                err.ends_with(&format!("address {port}: invalid port")),
                "{err}"
            );
        }
    }

    fn local(port: u16, path: &str) -> HttpTarget {
        HttpTarget {
            scheme: Scheme::Http,
            host: "127.0.0.1".into(),
            port,
            path: path.into(),
        }
    }

    /// Answers each request line with the first rule whose path prefix matches.
    async fn serve(listener: tokio::net::TcpListener, tls: Option<tokio_rustls::TlsAcceptor>) {
        use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
        async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) {
            let mut buf = vec![0u8; 4096];
            let n = s.read(&mut buf).await.unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]).to_string();
            let path = req.split_whitespace().nth(1).unwrap_or("/").to_string();
            let (status, extra, body) = if path == "/healthz" && req.contains("x-probe: yes") {
                ("200 OK", String::new(), "ok".to_string())
            } else if path == "/ua" {
                ("200 OK", String::new(), req.clone())
            } else if let Some(n) = path.strip_prefix("/loop/") {
                let n: u32 = n.parse().unwrap_or(0);
                (
                    "302 Found",
                    format!("location: /loop/{}\r\n", n + 1),
                    String::new(),
                )
            } else if path == "/local" {
                ("302 Found", "location: healthz\r\n".into(), String::new())
            } else if path == "/away" {
                (
                    "302 Found",
                    "location: http://0.0.0.0/\r\n".into(),
                    "<a href=\"http://0.0.0.0/\">Found</a>.\n\n".into(),
                )
            } else {
                ("500 Oops", String::new(), String::new())
            };
            let _ = s
                .write_all(
                    format!(
                        "HTTP/1.1 {status}\r\n{extra}content-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
                .await;
            let _ = s.shutdown().await;
        }
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            let tls = tls.clone();
            tokio::spawn(async move {
                match tls {
                    Some(acceptor) => {
                        if let Ok(s) = acceptor.accept(s).await {
                            answer(s).await;
                        }
                    }
                    None => answer(s).await,
                }
            });
        }
    }

    async fn server(tls: bool) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let acceptor = tls.then(|| {
            let key = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
            let cert = key.cert.der().clone();
            let pk = rustls::pki_types::PrivateKeyDer::try_from(key.signing_key.serialize_der())
                .unwrap();
            let config = rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert], pk)
            .unwrap();
            tokio_rustls::TlsAcceptor::from(Arc::new(config))
        });
        tokio::spawn(serve(listener, acceptor));
        port
    }

    #[tokio::test]
    async fn http_and_tcp_probes_against_a_local_server() {
        let port = server(false).await;
        let hdr = [("x-probe".to_string(), "yes".to_string())];
        let ok = http_get(&local(port, "/healthz"), &hdr, "probe").await;
        assert_eq!(ok.map(|r| r.status), Ok(200));
        let other = http_get(&local(port, "/other"), &[], "probe").await;
        assert_eq!(other.map(|r| r.status), Ok(500));
        let err = http_get(&local(1, "/"), &[], "probe").await.unwrap_err();
        assert!(
            err.starts_with("Get \"http://127.0.0.1:1/\": dial tcp"),
            "{err}"
        );
        let ua = http_get(&local(port, "/ua"), &[], "lifecycle")
            .await
            .unwrap();
        assert!(
            ua.body.contains("user-agent: kube-lifecycle/1.37\r\n"),
            "{}",
            ua.body
        );
        assert!(ua.body.contains("accept: */*"), "{}", ua.body);
    }

    #[tokio::test]
    async fn redirects_as_the_kubelet_prober() {
        let port = server(false).await;
        // A redirect to the same host is followed (here to a failing page).
        let r = http_get(&local(port, "/local"), &[], "probe")
            .await
            .unwrap();
        assert_eq!(r.status, 500);
        // A redirect to another host is not: its response passes with a warning.
        let r = http_get(&local(port, "/away"), &[], "probe").await.unwrap();
        assert_eq!(r.status, 302);
        let out = http_outcome(&r);
        assert!(out.ok && out.warning);
        assert_eq!(
            out.output,
            "Probe terminated redirects, Response body: <a href=\"http://0.0.0.0/\">Found</a>.\n\n"
        );
        // More than 10 redirects fail.
        let err = http_get(&local(port, "/loop/0"), &[], "probe")
            .await
            .unwrap_err();
        assert!(err.ends_with("stopped after 10 redirects"), "{err}");
    }

    #[tokio::test]
    async fn https_without_certificate_verification() {
        let port = server(true).await;
        let target = HttpTarget {
            scheme: Scheme::Https,
            ..local(port, "/healthz")
        };
        let hdr = [("x-probe".to_string(), "yes".to_string())];
        assert_eq!(
            http_get(&target, &hdr, "probe").await.map(|r| r.status),
            Ok(200)
        );
        // Plain HTTP against the TLS server gets no HTTP answer.
        assert!(
            http_get(&local(port, "/healthz"), &hdr, "probe")
                .await
                .is_err()
        );
    }

    #[test]
    fn redirect_resolution_table() {
        let base = HttpTarget {
            scheme: Scheme::Http,
            host: "10.0.0.1".into(),
            port: 8080,
            path: "/a/b?x=1".into(),
        };
        let cases = [
            ("/healthz", Some("http://10.0.0.1:8080/healthz")),
            ("c", Some("http://10.0.0.1:8080/a/c")),
            ("?y=2", Some("http://10.0.0.1:8080/a/b?y=2")),
            ("http://0.0.0.0/", Some("http://0.0.0.0:80/")),
            ("https://h:9443/p?q", Some("https://h:9443/p?q")),
            ("//other:81/z", Some("http://other:81/z")),
            ("http://[::1]:81/", Some("http://[::1]:81/")),
        ];
        for (loc, want) in cases {
            assert_eq!(
                base.redirect(loc).map(|t| t.url()).as_deref(),
                want,
                "{loc}"
            );
        }
    }

    #[test]
    fn http_targets_and_outcomes() {
        let c = Container {
            name: "web".into(),
            ports: Some(vec![ContainerPort {
                name: Some("http".into()),
                container_port: 8080,
                ..Default::default()
            }]),
            ..Default::default()
        };
        let ip: Option<IpAddr> = "10.1.2.3".parse().ok();
        let action =
            |scheme: Option<&str>, host: Option<&str>, port, path: Option<&str>| HTTPGetAction {
                scheme: scheme.map(Into::into),
                host: host.map(Into::into),
                port,
                path: path.map(Into::into),
                ..Default::default()
            };
        let cases = [
            (
                action(None, None, IntOrString::Int(80), Some("/x?y=1")),
                "http://10.1.2.3:80/x?y=1",
            ),
            (
                action(
                    Some("HTTPS"),
                    None,
                    IntOrString::String("http".into()),
                    None,
                ),
                "https://10.1.2.3:8080/",
            ),
            (
                action(None, Some("h"), IntOrString::Int(1), Some("p")),
                "http://h:1/p",
            ),
            (
                action(None, Some("::1"), IntOrString::Int(1), None),
                "http://[::1]:1/",
            ),
        ];
        for (a, want) in cases {
            assert_eq!(
                HttpTarget::of(&a, &c, ip).map(|t| t.url()).as_deref(),
                Ok(want)
            );
        }
        let resp = |status| HttpResponse {
            status,
            body: "b".into(),
        };
        assert_eq!(http_outcome(&resp(204)), Outcome::pass("b"));
        assert!(http_outcome(&resp(301)).warning);
        assert_eq!(
            http_outcome(&resp(404)),
            Outcome::fail("HTTP probe failed with statuscode: 404")
        );
    }
}
