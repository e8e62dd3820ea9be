//! The events the pod worker owes a pod for its volumes' setup.

use k8s_openapi::api::core::v1::Pod;

use super::context::Context;
use crate::events::EventType;
use crate::reasons::event;

/// The `FailedMount` events of a volume setup: one per volume that failed,
/// as the kubelet's `MountVolume.SetUp failed for volume "v" : …`, and one
/// for the volumes whose claims could not be processed, as the kubelet's
/// `Unable to attach or mount volumes: unmounted volumes=[…], unattached
/// volumes=[…], failed to process volumes=[…]: …`.
pub fn mount_events(pod: &Pod, outcome: &crate::volume::SetupOutcome, ctx: &Context) {
    let mut unprocessed = Vec::new();
    let mut reasons = Vec::new();
    for (volume, e) in &outcome.errors {
        if let crate::volume::Error::Claim(message) = e {
            unprocessed.push(volume.as_str());
            reasons.push(message.as_str());
            continue;
        }
        let note = format!("MountVolume.SetUp failed for volume \"{volume}\" : {e}");
        ctx.event(pod, None, EventType::Warning, event::FAILED_MOUNT, note);
    }
    for (reason, note) in &outcome.notices {
        ctx.event(pod, None, EventType::Warning, reason, note.clone());
    }
    if !unprocessed.is_empty() {
        let mut unmounted = outcome.unmounted(pod);
        unmounted.sort();
        unprocessed.sort_unstable();
        let note = format!(
            "Unable to attach or mount volumes: unmounted volumes=[{}], unattached volumes=[], failed to process volumes=[{}]: {}",
            unmounted.join(" "),
            unprocessed.join(" "),
            reasons.join("; ")
        );
        ctx.event(pod, None, EventType::Warning, event::FAILED_MOUNT, note);
    }
}
