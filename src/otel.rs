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

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
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
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(tracing_subscriber::filter::filter_fn(exported));
    Ok((layer, provider))
}

#[cfg(test)]
mod tests {
    use super::*;

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
