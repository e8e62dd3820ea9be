//! OpenTelemetry traces, as the kubelet's `tracing` configuration makes them
//! (component-base's `TracingConfiguration`, the kubelet's `KubeletTracing`):
//! the agent's spans exported over OTLP gRPC to `endpoint`, sampled at
//! `samplingRatePerMillion` of a million root spans (parent-based: a span
//! under a sampled one is sampled), with the service name `kubelet`.
//!
//! Which spans: the pod worker's `syncPod` (one per pod sync), a span per
//! CRI call (`runtime.v1.RuntimeService/<call>`,
//! `runtime.v1.ImageService/<call>`, as the kubelet's gRPC instrumentation
//! names them) and kube-rs's `HTTP` span per API request; the agent's other
//! spans at info or above. Log events are not exported.
//!
//! A pod sync's span ([`sync_span`]) carries the kubelet's attributes
//! (`k8s.pod.uid`, `k8s.pod`, `k8s.pod.name`, `k8s.namespace.name`, and
//! `k8s.pod.update_type` on `syncPod`) and an error status when the sync
//! fails; every CRI request carries the W3C trace context of its span in a
//! `traceparent` header ([`TraceContext`]), as the kubelet's otelgrpc client
//! sends it, so a runtime that traces continues the pod's trace.

use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::core::v1::Pod;
use opentelemetry::propagation::{Injector, TextMapPropagator as _};
use opentelemetry::trace::{Status, TraceContextExt as _, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::Layer;
use tracing_subscriber::registry::LookupSpan;

use crate::config::Tracing;

/// The service name spans carry (the kubelet's).
pub const SERVICE_NAME: &str = "kubelet";

/// The CRI calls of the image service; every other call is the runtime
/// service's.
const IMAGE_CALLS: &[&str] = &[
    "PullImage",
    "ImageStatus",
    "ListImages",
    "RemoveImage",
    "ImageFsInfo",
];

/// The span name of CRI call `call` (`RunPodSandbox`, `PullImage`, ...):
/// its gRPC method, as the kubelet's otelgrpc instrumentation names it.
#[must_use]
pub fn cri_span_name(call: &str) -> String {
    let service = if IMAGE_CALLS.contains(&call) {
        "ImageService"
    } else {
        "RuntimeService"
    };
    format!("runtime.v1.{service}/{call}")
}

/// Whether spans are exported: set once a [`layer`] is built. Until then
/// nothing here looks up a span's OpenTelemetry context.
static ENABLED: AtomicBool = AtomicBool::new(false);

fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The span of one sync of `pod` by the pod worker, as the kubelet's
/// `SyncPod` and `SyncTerminatingPod` open theirs: `syncTerminatingPod` when
/// the pod is `terminating` (being deleted or evicted), else `syncPod` with
/// `k8s.pod.update_type` = `update_type` (`create` on the pod's first sync,
/// `sync` after). Its `pod` field (`<namespace>/<name>`) names the pod in log
/// lines; the kubelet's attributes are set only while spans are exported.
#[must_use]
pub fn sync_span(pod: &Pod, update_type: &'static str, terminating: bool) -> tracing::Span {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let key = format!("{namespace}/{name}");
    let span = tracing::info_span!("syncPod", pod = %key, otel.name = tracing::field::Empty);
    if terminating {
        span.record("otel.name", "syncTerminatingPod");
    }
    if enabled() {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        span.set_attribute("k8s.pod.uid", uid);
        span.set_attribute("k8s.pod", key);
        span.set_attribute("k8s.pod.name", name.to_string());
        if !terminating {
            span.set_attribute("k8s.pod.update_type", update_type);
        }
        span.set_attribute("k8s.namespace.name", namespace.to_string());
    }
    span
}

/// Marks `span` failed with `error`'s message, as the kubelet's pod sync
/// spans record an error; nothing while spans are not exported.
pub fn record_error(span: &tracing::Span, error: &dyn std::fmt::Display) {
    if enabled() {
        span.set_status(Status::error(error.to_string()));
    }
}

/// The gRPC interceptor of the CRI clients: adds the W3C trace context
/// (`traceparent`, and `tracestate` when there is one) of the current span to
/// each request, as the kubelet's otelgrpc instrumentation does; nothing when
/// spans are not exported or the current span has no trace context.
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceContext;

impl tonic::service::Interceptor for TraceContext {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if enabled() {
            let cx = tracing::Span::current().context();
            if cx.span().span_context().is_valid() {
                TraceContextPropagator::new()
                    .inject_context(&cx, &mut Metadata(request.metadata_mut()));
            }
        }
        Ok(request)
    }
}

/// A request's gRPC metadata as the propagator writes headers into it.
struct Metadata<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for Metadata<'_> {
    fn set(&mut self, key: &str, value: String) {
        let key = tonic::metadata::MetadataKey::from_bytes(key.as_bytes());
        let value = tonic::metadata::MetadataValue::try_from(value);
        if let (Ok(key), Ok(value)) = (key, value) {
            self.0.insert(key, value);
        }
    }
}

/// True for the spans exported: the agent's own and kube-rs's API requests.
fn exported(meta: &tracing::Metadata<'_>) -> bool {
    meta.is_span()
        && (meta.target().starts_with("rustlet")
            || (meta.target().starts_with("kube_client") && meta.name() == "HTTP"))
}

/// A layer exporting spans as `tracing` says, and the provider to shut down
/// (which sends what is still batched) when the agent stops. Call it inside
/// a Tokio runtime: the exporter's gRPC channel lives there.
///
/// # Errors
/// The exporter cannot be built (a bad endpoint).
pub fn layer<S>(
    tracing: &Tracing,
) -> Result<(impl Layer<S> + Send + Sync + 'static, SdkTracerProvider), String>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
{
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(tracing.endpoint_url())
        .build()
        .map_err(|e| format!("OTLP exporter for {}: {e}", tracing.endpoint))?;
    let ratio = f64::from(tracing.sampling_rate_per_million) / 1_000_000.0;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
            ratio,
        ))))
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(SERVICE_NAME)
                .build(),
        )
        .build();
    let tracer = provider.tracer("rustlet");
    ENABLED.store(true, Ordering::Relaxed);
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(tracing_subscriber::filter::filter_fn(exported));
    Ok((layer, provider))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::fake::FakeRuntime;
    use std::time::Duration;
    use tracing::Instrument as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    fn pod() -> Pod {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.name = Some("web".into());
        pod.metadata.uid = Some("uid-1".into());
        pod
    }

    /// A CRI call made in a pod sync's span reaches a real gRPC server with
    /// the W3C trace context of its own span, child of the sync's: same
    /// trace, another span, sampled; a call outside a sync is a trace of its
    /// own; nothing is sent while spans are not exported.
    #[tokio::test(flavor = "current_thread")]
    async fn cri_requests_carry_the_trace_context_of_their_span() {
        let dir = tempfile::tempdir().unwrap();
        let (fake, _) = FakeRuntime::serve(dir.path()).unwrap();
        let runtime = fake.client(Duration::from_secs(5)).await.unwrap();
        let provider = SdkTracerProvider::builder()
            .with_sampler(Sampler::AlwaysOn)
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        let _default = tracing::subscriber::set_default(subscriber);

        // Spans not exported (no `tracing` configured): no header.
        runtime.version().await.unwrap();
        assert!(
            fake.trace_parents().is_empty(),
            "{:?}",
            fake.trace_parents()
        );
        ENABLED.store(true, Ordering::Relaxed);

        let span = sync_span(&pod(), "create", false);
        let sync = span.context().span().span_context().clone();
        assert!(sync.is_valid());
        runtime.version().instrument(span).await.unwrap();
        // Outside a sync, a call is a trace of its own.
        runtime.version().await.unwrap();
        let parents = fake.trace_parents();
        assert_eq!(parents.len(), 2, "{parents:?}");
        assert!(
            !parents[1].contains(&sync.trace_id().to_string()),
            "{parents:?}"
        );
        let fields: Vec<&str> = parents[0].split('-').collect();
        assert_eq!(fields.len(), 4, "{parents:?}");
        assert_eq!(fields[0], "00");
        assert_eq!(fields[1], sync.trace_id().to_string());
        assert_eq!(fields[2].len(), 16);
        assert_ne!(
            fields[2],
            sync.span_id().to_string(),
            "the CRI call's own span"
        );
        assert_eq!(fields[3], "01", "sampled");
    }

    #[test]
    fn cri_spans_are_named_as_grpc_methods() {
        assert_eq!(
            cri_span_name("RunPodSandbox"),
            "runtime.v1.RuntimeService/RunPodSandbox"
        );
        assert_eq!(
            cri_span_name("PullImage"),
            "runtime.v1.ImageService/PullImage"
        );
    }
}
