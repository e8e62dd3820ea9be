//! OpenTelemetry traces (the KubeletConfiguration's `tracing`): the agent,
//! restarted with an OTLP endpoint and every root span sampled, sends the
//! `syncPod` spans of a pod it starts, with the kubelet's attributes (the
//! first with `k8s.pod.update_type` `create`), each with its CRI calls and API
//! requests as child spans, to a real OTLP gRPC receiver (the
//! OpenTelemetry protocol's `TraceService`, served here on loopback). The
//! agent is restarted with its usual configuration at the end. It restarts
//! the agent, so it runs alone.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;

/// What the receiver was sent: each span with its resource's service name.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

fn text(attributes: &[KeyValue], key: &str) -> Option<String> {
    attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| match &v.value {
            Some(Value::StringValue(s)) => Some(s.clone()),
            _ => None,
        })
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().expect("spans");
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|r| text(&r.attributes, "service.name"))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_pod_syncs_trace_reaches_an_otlp_receiver() {
    let receiver = Receiver::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the receiver");
    let port = listener.local_addr().expect("address").port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let config = restart_agent_with(
        "tracing",
        &format!("tracing:\n  endpoint: 127.0.0.1:{port}\n  samplingRatePerMillion: 1000000\n"),
    );
    let client = client().await;
    let ns = namespace(&client, "e2e-tracing").await;
    create(
        &client,
        &ns,
        &pod("traced", "Never", BUSYBOX, &["sh", "-c", "echo traced"]),
    )
    .await;
    wait_for(&client, &ns, "traced", 60, "Succeeded", phase("Succeeded")).await;
    // The batch goes out within 5 s of a span's end.
    let pod_key = format!("{ns}/traced");
    let deadline = Instant::now() + Duration::from_secs(30);
    let (syncs, children) = loop {
        let spans = receiver.spans.lock().expect("spans").clone();
        let syncs: Vec<Span> = spans
            .iter()
            .filter(|(service, s)| {
                service == "kubelet"
                    && s.name == "syncPod"
                    && text(&s.attributes, "k8s.pod").as_deref() == Some(pod_key.as_str())
            })
            .map(|(_, s)| s.clone())
            .collect();
        let ids: BTreeSet<&[u8]> = syncs.iter().map(|s| s.span_id.as_slice()).collect();
        let children: BTreeSet<String> = spans
            .iter()
            .filter(|(_, s)| ids.contains(s.parent_span_id.as_slice()))
            .map(|(_, s)| s.name.clone())
            .collect();
        // The API requests are kube-rs's spans, named after the request.
        let done = children.contains("runtime.v1.RuntimeService/StartContainer")
            && children.iter().any(|n| !n.starts_with("runtime.v1."));
        if done {
            break (syncs, children);
        }
        assert!(
            Instant::now() < deadline,
            "no syncPod span of {pod_key} with its CRI calls and API requests: {} spans in all ({:?}), {} syncPod spans of the pod, children {children:?}",
            spans.len(),
            spans
                .iter()
                .map(|(_, s)| (s.name.as_str(), s.parent_span_id.is_empty()))
                .collect::<BTreeSet<_>>(),
            syncs.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(!syncs.is_empty());
    // The kubelet's attributes, on every sync; the first is the pod's creation.
    for sync in &syncs {
        assert_eq!(
            text(&sync.attributes, "k8s.pod.name").as_deref(),
            Some("traced")
        );
        assert_eq!(
            text(&sync.attributes, "k8s.namespace.name").as_deref(),
            Some(ns.as_str())
        );
        assert!(text(&sync.attributes, "k8s.pod.uid").is_some_and(|u| !u.is_empty()));
    }
    let first = syncs
        .iter()
        .min_by_key(|s| s.start_time_unix_nano)
        .expect("a sync");
    assert_eq!(
        text(&first.attributes, "k8s.pod.update_type").as_deref(),
        Some("create")
    );
    for call in [
        "runtime.v1.RuntimeService/RunPodSandbox",
        "runtime.v1.RuntimeService/CreateContainer",
        "runtime.v1.RuntimeService/StartContainer",
    ] {
        assert!(children.contains(call), "{call} not among {children:?}");
    }
    drop_namespace(&client, &ns).await;
    restart_agent(None);
    let _ = std::fs::remove_file(&config);
}
