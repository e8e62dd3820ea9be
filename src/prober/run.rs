//! Running one probe action against a container, as the kubelet's prober:
//! exec through CRI `ExecSync`, HTTP GET (200–399 passes), TCP connect, and the
//! gRPC health checking protocol. Each returns pass/fail and the output for events.

use std::net::IpAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Container, Probe};
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
}

impl Outcome {
    fn pass(output: impl Into<String>) -> Self {
        Self {
            ok: true,
            output: output.into(),
        }
    }
    fn fail(output: impl Into<String>) -> Self {
        Self {
            ok: false,
            output: output.into(),
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
            Err(crate::cri::Error::Timeout { .. }) => {
                Outcome::fail(format!("command timed out after {}s", timeout.as_secs()))
            }
            Err(e) => Outcome::fail(e.to_string()),
        };
    }
    if let Some(h) = &probe.http_get {
        let (host, port) = match target(h.host.as_ref(), &h.port, c, pod_ip) {
            Ok(target) => target,
            Err(e) => return Outcome::fail(e),
        };
        if h.scheme.as_deref() == Some("HTTPS") {
            return Outcome::fail("HTTPS probes are not supported yet");
        }
        let path = h.path.clone().unwrap_or_else(|| "/".into());
        let headers: Vec<(String, String)> = h
            .http_headers
            .iter()
            .flatten()
            .map(|x| (x.name.clone(), x.value.clone()))
            .collect();
        return match tokio::time::timeout(timeout, http_get(&host, port, &path, &headers)).await {
            Ok(Ok(status)) if (200..400).contains(&status) => {
                Outcome::pass(format!("HTTP probe succeeded with statuscode: {status}"))
            }
            Ok(Ok(status)) => Outcome::fail(format!("HTTP probe failed with statuscode: {status}")),
            Ok(Err(e)) => Outcome::fail(format!("Get \"http://{host}:{port}{path}\": {e}")),
            Err(_) => Outcome::fail(format!(
                "Get \"http://{host}:{port}{path}\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
            )),
        };
    }
    if let Some(t) = &probe.tcp_socket {
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
    Outcome::fail("missing probe handler")
}

async fn http_get(
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
) -> Result<u16, String> {
    let stream = TcpStream::connect((host, port))
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut req = hyper::Request::get(path)
        .header("Host", format!("{host}:{port}"))
        .header(
            "User-Agent",
            format!(
                "kube-probe/{}",
                crate::KUBERNETES_VERSION.trim_start_matches('v')
            ),
        )
        .header("Accept", "*/*");
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let req = req.body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    // Drain a little of the body so the server sees a complete exchange.
    let _ = resp.into_body().collect().await;
    Ok(status)
}

async fn grpc_health(ip: IpAddr, port: i32, service: String) -> Result<bool, String> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let url = match ip {
        IpAddr::V4(v4) => format!("http://{v4}:{port}"),
        IpAddr::V6(v6) => format!("http://[{v6}]:{port}"),
    };
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

    #[tokio::test]
    async fn http_and_tcp_probes_against_a_local_server() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = vec![0u8; 4096];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let req = String::from_utf8_lossy(&buf[..n]).to_string();
                    let status = if req.starts_with("GET /healthz") && req.contains("x-probe: yes")
                    {
                        "200 OK"
                    } else {
                        "500 Oops"
                    };
                    let _ = s
                        .write_all(
                            format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n").as_bytes(),
                        )
                        .await;
                });
            }
        });
        let ok = http_get(
            "127.0.0.1",
            port,
            "/healthz",
            &[("x-probe".into(), "yes".into())],
        )
        .await;
        assert_eq!(ok, Ok(200));
        assert_eq!(http_get("127.0.0.1", port, "/other", &[]).await, Ok(500));
        assert!(http_get("127.0.0.1", 1, "/", &[]).await.is_err());
    }
}
