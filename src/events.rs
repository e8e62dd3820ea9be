//! Events about pods and their containers, published through kube's event
//! recorder (which aggregates repeats into series, like the kubelet's recorder)
//! with the kubelet's reasons and the container field path
//! (`spec.containers{name}`) in the reference.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};
use tracing::debug;

/// The field path of a container in events: `spec.containers{name}`, or
/// `spec.initContainers{name}` for init containers and sidecars.
#[must_use]
pub fn field_path(pod: &Pod, container: &str) -> String {
    let init = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.name == container));
    if init {
        format!("spec.initContainers{{{container}}}")
    } else {
        format!("spec.containers{{{container}}}")
    }
}

/// Publishes an event about `pod` (or one of its containers) in the background;
/// a failure to record it is logged, never returned.
pub fn publish(
    recorder: &Recorder,
    pod: &Pod,
    container: Option<&str>,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let mut reference: ObjectReference = pod.object_ref(&());
    reference.field_path = container.map(|c| field_path(pod, c));
    let recorder = recorder.clone();
    let ev = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: reason.to_string(),
        secondary: None,
    };
    tokio::spawn(async move {
        if let Err(e) = recorder.publish(&ev, &reference).await {
            debug!(error = %e, reason = ev.reason, "event not recorded");
        }
    });
}
