//! The status manager: the only writer of `pods/status` and the one place a
//! finished pod is deleted from the API, as the kubelet's `pkg/kubelet/status`
//! manager (`SetPodStatus`, `needsUpdate`, `syncPod` with its final delete).
//! It keeps the status it last sent for each pod with the resourceVersion it
//! was computed from, so a sync that starts from an object the watch has not
//! refreshed yet builds on what was sent (the kubelet's status cache), and a
//! status equal to the one the API has costs no request.
//!
//! A static pod's status goes to its mirror pod (the kubelet's
//! `GetUIDTranslations`): none is written while it has none, and a mirror
//! pod made anew gets the status again.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use super::sources::PodSources;
use crate::pod_core::facts::pod_identity;
use crate::pod_core::status::differs;
use crate::static_pod;

/// How many deleted pods' UIDs the status manager remembers.
const DELETED_KEPT: usize = 1024;

/// A status last sent.
#[derive(Clone)]
struct Sent {
    /// The resourceVersion of the pod object the status was computed from;
    /// of a static pod, the UID of the mirror pod it was written to (empty:
    /// none).
    at: String,
    /// The resourceVersion the API server answered the patch with: the first
    /// version of the object that holds this status (None: not known).
    written: Option<String>,
    /// The status.
    status: PodStatus,
}

/// The status manager; one per agent, shared by every pod worker.
pub struct StatusManager {
    client: Client,
    /// Where the mirror pods of static pods are known.
    sources: PodSources,
    /// The last status sent, by pod UID.
    sent: Mutex<HashMap<String, Sent>>,
    /// The UIDs of the last [`DELETED_KEPT`] pods this agent deleted: the API
    /// server's last update of such a pod (grace period 0) arrives before its
    /// removal and must not sync, and so delete, it again.
    deleted: Mutex<VecDeque<String>>,
}

impl StatusManager {
    /// A status manager writing with `client` (the node's credentials),
    /// finding mirror pods in `sources`.
    #[must_use]
    pub fn new(client: Client, sources: PodSources) -> Self {
        Self {
            client,
            sources,
            sent: Mutex::new(HashMap::new()),
            deleted: Mutex::new(VecDeque::new()),
        }
    }

    fn sent_for(&self, pod: &Pod) -> Option<PodStatus> {
        let uid = pod.metadata.uid.as_deref()?;
        let sent = self.sent.lock().unwrap_or_else(PoisonError::into_inner);
        sent_status_of(pod, sent.get(uid))
    }

    /// `pod` as this agent last left it: when the object is the very version
    /// a status was computed from (the watch has not yet brought the patched
    /// object back), its status is replaced by the one sent, as the kubelet
    /// builds on its status manager's cache rather than the API's.
    #[must_use]
    pub fn with_sent_status(&self, pod: Arc<Pod>) -> Arc<Pod> {
        match self.sent_for(&pod) {
            Some(status) => {
                let mut p = (*pod).clone();
                p.status = Some(status);
                Arc::new(p)
            }
            None => pod,
        }
    }

    /// True once a status of static pod `pod` was written to a mirror pod by
    /// this agent: until then its mirror pod holds what was last reported.
    #[must_use]
    pub fn reported_to_mirror(&self, pod: &Pod) -> bool {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&uid)
            .is_some_and(|s| !s.at.is_empty())
    }

    /// Sets `pod`'s status to `status`: patches `pods/status` (with the pod's
    /// UID as precondition) when it differs from the status last sent for this
    /// object, or else from the object's own; returns whether it patched. A
    /// pod that is gone (404) or was replaced by another of the same name
    /// (409) is not an error: there is nothing left to report on.
    ///
    /// # Errors
    /// The patch failed otherwise.
    pub async fn set_status(&self, pod: &Pod, status: PodStatus) -> Result<bool, kube::Error> {
        if crate::pod_core::kind::PodKind::of(pod).is_static {
            return self.set_static_status(pod, status).await;
        }
        let current = self.sent_for(pod).or_else(|| pod.status.clone());
        if !differs(current.as_ref(), &status) {
            return Ok(false);
        }
        let (ns, name, uid) = pod_identity(pod);
        let Some(written) = self.patch(&ns, &name, &uid, &status).await? else {
            return Ok(false);
        };
        crate::startup_trace::status_sent(pod, status.phase.as_deref());
        let at = pod.metadata.resource_version.clone().unwrap_or_default();
        self.sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                uid,
                Sent {
                    at,
                    written,
                    status,
                },
            );
        Ok(true)
    }

    /// [`StatusManager::set_status`] of a static pod: written to its mirror
    /// pod (UID precondition) when it differs from the status last sent to
    /// that mirror pod; kept as sent either way, as the static pod's own
    /// object never changes.
    async fn set_static_status(&self, pod: &Pod, status: PodStatus) -> Result<bool, kube::Error> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mirror = self
            .sources
            .mirror_of(pod)
            .filter(|m| static_pod::is_mirror_of(m, pod))
            .and_then(|m| m.metadata.uid.clone());
        let last = self
            .sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&uid)
            .cloned();
        let unchanged = last
            .as_ref()
            .is_some_and(|s| !differs(Some(&s.status), &status) && Some(&s.at) == mirror.as_ref());
        if unchanged {
            return Ok(false);
        }
        let mut written_to = String::new();
        if let Some(mirror_uid) = mirror {
            let (ns, name, _) = pod_identity(pod);
            if self
                .patch(&ns, &name, &mirror_uid, &status)
                .await?
                .is_some()
            {
                written_to = mirror_uid;
            }
        }
        let patched = !written_to.is_empty();
        self.sources.set_static_status(pod, &status);
        self.sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                uid,
                Sent {
                    at: written_to,
                    written: None,
                    status,
                },
            );
        Ok(patched)
    }

    /// Patches `pods/status` of pod `ns/name` to `status`, with `uid` as
    /// precondition: the resourceVersion of the object written (None inside
    /// when the answer has none); None when the pod is gone (404) or another
    /// of the same name (409): there is nothing to report on.
    ///
    /// # Errors
    /// The patch failed otherwise.
    async fn patch(
        &self,
        ns: &str,
        name: &str,
        uid: &str,
        status: &PodStatus,
    ) -> Result<Option<Option<String>>, kube::Error> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        tracing::debug!(
            pod = name,
            phase = status.phase.as_deref().unwrap_or_default(),
            containers = ?container_summary(status),
            "patching pod status"
        );
        let patch = serde_json::json!({ "metadata": { "uid": uid }, "status": status });
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(written) => Ok(Some(written.metadata.resource_version)),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Forgets static pod `pod` once it stopped: its UID may run again (the
    /// same manifest put back), from a fresh status.
    pub fn forget(&self, pod: &Pod) {
        if let Some(uid) = pod.metadata.uid.as_deref() {
            self.sent
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(uid);
        }
    }

    /// Deletes a pod whose containers and sandboxes are all gone (grace period
    /// 0, UID precondition), as the status manager's final `deletePod`, and
    /// forgets it. A pod already gone or replaced is fine.
    ///
    /// # Errors
    /// The delete failed otherwise.
    pub async fn delete(&self, pod: &Pod) -> Result<(), kube::Error> {
        super::mirror_client::delete(&self.client, pod).await?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&uid);
        let mut deleted = self.deleted.lock().unwrap_or_else(PoisonError::into_inner);
        if deleted.len() >= DELETED_KEPT {
            deleted.pop_front();
        }
        deleted.push_back(uid);
        Ok(())
    }

    /// Forgets the statuses sent for pods whose UID `keep` rejects (pods gone
    /// from the node without this agent deleting them, e.g. force-deleted).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut sent = self.sent.lock().unwrap_or_else(PoisonError::into_inner);
        sent.retain(|uid, _| keep(uid));
    }

    /// How many pods have a status cached.
    #[must_use]
    pub fn cached(&self) -> usize {
        self.sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// True when this agent deleted pod `uid` from the API.
    #[must_use]
    pub fn was_deleted(&self, uid: &str) -> bool {
        self.deleted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .any(|d| d == uid)
    }
}

/// The status to see `pod` with, given the last status sent and the
/// resourceVersion it was computed from: that status when `pod` is still that
/// version, else none (the API's object is newer and has the last word). A
/// static pod is seen with the last status sent.
/// `name started ready` of each container in `status`, for the debug log.
fn container_summary(status: &PodStatus) -> Vec<String> {
    status
        .container_statuses
        .iter()
        .flatten()
        .map(|c| format!("{} started={:?} ready={}", c.name, c.started, c.ready))
        .collect()
}

/// The status `pod` is to be seen with when `sent` was the last sent for
/// it: that one when the object is the very version it was computed from, or
/// a version older than the one the patch wrote (an update that was under
/// way when the patch went out, its echo not arrived yet), as the kubelet's
/// status manager compares with its own cache; None (the object's own) for
/// the patch's echo and anything newer.
fn sent_status_of(pod: &Pod, sent: Option<&Sent>) -> Option<PodStatus> {
    let sent = sent?;
    if crate::pod_core::kind::PodKind::of(pod).is_static {
        // The static pod's object is the agent's own: the last status sent is its status.
        return Some(sent.status.clone());
    }
    let rv = pod.metadata.resource_version.as_deref()?;
    let older = sent
        .written
        .as_deref()
        .is_some_and(|written| older_version(rv, written));
    (sent.at == rv || older).then(|| sent.status.clone())
}

/// Whether resourceVersion `rv` is older than `than`: both are compared as
/// the decimal integers the API server gives (client-go's
/// `CompareResourceVersion`); versions that are not such integers are never
/// older.
fn older_version(rv: &str, than: &str) -> bool {
    match (rv.parse::<u64>(), than.parse::<u64>()) {
        (Ok(a), Ok(b)) => a < b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;

    #[test]
    fn a_stale_pod_is_seen_with_the_status_last_sent() {
        let status = |phase: &str| PodStatus {
            phase: Some(phase.into()),
            ..PodStatus::default()
        };
        let mut p = pod("web").container("c", "busybox").build();
        p.metadata.resource_version = Some("7".into());
        p.status = Some(status("Pending"));
        let sent = Sent {
            at: "7".into(),
            written: Some("10".into()),
            status: status("Running"),
        };
        // The watch has not brought the patched pod back: it is version 7 still.
        assert_eq!(sent_status_of(&p, Some(&sent)), Some(status("Running")));
        // A version between (the deletion's update, made while the status
        // was computed) is older than the patch: the status sent still holds.
        p.metadata.resource_version = Some("9".into());
        assert_eq!(sent_status_of(&p, Some(&sent)), Some(status("Running")));
        // The patch's echo, or a newer version (someone else's change), wins.
        p.metadata.resource_version = Some("10".into());
        assert_eq!(sent_status_of(&p, Some(&sent)), None);
        p.metadata.resource_version = Some("11".into());
        assert_eq!(sent_status_of(&p, Some(&sent)), None);
        // Versions that are not integers are only ever equal.
        let opaque = Sent {
            written: Some("b".into()),
            ..sent.clone()
        };
        p.metadata.resource_version = Some("a".into());
        assert_eq!(sent_status_of(&p, Some(&opaque)), None);
        p.metadata.resource_version = Some("9".into());
        // Nothing sent, or an object without a version: the API's status.
        assert_eq!(sent_status_of(&p, None), None);
        p.metadata.resource_version = None;
        assert_eq!(sent_status_of(&p, Some(&sent)), None);
    }
}
