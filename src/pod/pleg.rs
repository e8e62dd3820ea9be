//! The PLEG (pod lifecycle event generator): CRI `GetContainerEvents` turned into
//! pod requeues, so a container that exits or is removed is synced at once.
//! Created and started events are not: only this agent creates and starts its
//! pods' containers and sandboxes, and the pod worker observes the runtime
//! again after acting (where the kubelet's SyncPod leaves that to the PLEG), so
//! such a sync would find nothing new while the runtime is busiest. When the
//! runtime has no event stream (containerd 1.6 answers UNIMPLEMENTED) the pod
//! workers' periodic relist is the only source, as the kubelet's generic PLEG.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt};
use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tracing::{debug, info, warn};

use crate::cri::Runtime;

/// Starts the event subscription; returns the stream of pods to sync and a flag
/// that is true while the runtime's event stream is connected.
pub fn start(
    runtime: &Runtime,
) -> (
    impl Stream<Item = ObjectRef<Pod>> + Send + 'static,
    Arc<AtomicBool>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let connected = Arc::new(AtomicBool::new(false));
    let flag = connected.clone();
    let mut client = runtime.runtime_client();
    tokio::spawn(async move {
        let mut retry = Duration::from_millis(500);
        loop {
            match client.get_container_events(cri::GetEventsRequest {}).await {
                Ok(resp) => {
                    info!("PLEG: subscribed to the runtime's container events");
                    flag.store(true, Ordering::Relaxed);
                    retry = Duration::from_millis(500);
                    let mut events = resp.into_inner();
                    while let Some(ev) = events.next().await {
                        match ev {
                            Ok(ev) => {
                                crate::metrics::metrics().pleg_last_seen.set(
                                    std::time::SystemTime::now()
                                        .duration_since(std::time::UNIX_EPOCH)
                                        .map_or(0.0, |d| d.as_secs_f64()),
                                );
                                let Some(md) = ev.pod_sandbox_status.and_then(|s| s.metadata)
                                else {
                                    continue;
                                };
                                debug!(pod = %format!("{}/{}", md.namespace, md.name), kind = ev.container_event_type, "PLEG event");
                                if !requeues(ev.container_event_type) {
                                    continue;
                                }
                                if tx
                                    .send(ObjectRef::new(&md.name).within(&md.namespace))
                                    .is_err()
                                {
                                    return;
                                }
                            }
                            Err(status) => {
                                warn!(%status, "PLEG: container event stream ended");
                                break;
                            }
                        }
                    }
                    flag.store(false, Ordering::Relaxed);
                }
                Err(status) if status.code() == tonic::Code::Unimplemented => {
                    info!("PLEG: the runtime has no container events; relisting instead");
                    return;
                }
                Err(status) => debug!(%status, "PLEG: subscribe failed"),
            }
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(Duration::from_secs(10));
        }
    });
    (UnboundedReceiverStream::new(rx), connected)
}

/// Whether a container event of CRI type `kind` requeues its pod: a stop or
/// a removal does; a creation or a start, which the pod worker itself made and
/// already observed, does not.
fn requeues(kind: i32) -> bool {
    matches!(
        cri::ContainerEventType::try_from(kind),
        Ok(cri::ContainerEventType::ContainerStoppedEvent
            | cri::ContainerEventType::ContainerDeletedEvent)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use cri::ContainerEventType as E;

    #[test]
    fn only_stops_and_removals_requeue() {
        assert!(requeues(E::ContainerStoppedEvent.into()));
        assert!(requeues(E::ContainerDeletedEvent.into()));
        assert!(!requeues(E::ContainerCreatedEvent.into()));
        assert!(!requeues(E::ContainerStartedEvent.into()));
        assert!(!requeues(42), "unknown kinds are not acted on");
    }
}
