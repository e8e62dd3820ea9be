//! What the eviction manager is given by the rest of the agent, as the
//! kubelet's pkg/kubelet/eviction/types.go: the record of an eviction it
//! decides ([`Eviction`]), and the means it works with, injected where the
//! agent is wired — the pods it may evict, how to kill one, whether one
//! has been cleaned up and how to reclaim dead containers ([`Pods`]: the
//! kubelet's `ActivePodsFunc`, `KillPodFunc`, `PodCleanedUpFunc` and
//! `ContainerGC`), and how to reclaim unused images ([`Images`]: its
//! `ImageGC`). The manager knows neither the pod worker nor housekeeping;
//! the pod side implements [`Pods`].

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

/// An eviction the eviction manager decided, kept by the agent so that the
/// pod worker stops the pod whether or not the status write reached the API
/// server, and a status the worker writes keeps it (the kubelet's
/// `killPodNow` with its status function, which sets what
/// [`crate::pod_core::status::evicting`] builds from this record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eviction {
    /// The status reason: `Evicted`, or `Terminated` for the node shutdown
    /// manager's kills ([`crate::reasons::pod`]).
    pub reason: &'static str,
    /// The status message (`The node was low on resource: ...`).
    pub message: String,
    /// True for a threshold eviction: the `DisruptionTarget` condition.
    pub disruption: bool,
    /// The containers' grace period, seconds (the kubelet's `gracePeriodOverride`).
    pub grace: i64,
    /// When it was decided.
    pub at: Timestamp,
}

/// The pods the eviction manager works on and what it may do to them,
/// implemented by the pod side of the agent and injected when it is wired
/// (the kubelet's `ActivePodsFunc`, `KillPodFunc`, `PodCleanedUpFunc` and
/// `ContainerGC`).
pub trait Pods: Send + Sync {
    /// The pods the manager may evict, in a stable order: those bound to
    /// the node that have not finished, are not being deleted, and are
    /// neither evicted (status reason `Evicted`) nor being evicted (an
    /// [`Eviction`] recorded), as the kubelet's `ActivePodsFunc`
    /// (`GetActivePods`: the pods whose termination was not requested).
    /// Critical pods are among them; the manager leaves them out itself
    /// ([`super::manager::is_critical`]).
    fn active_pods(&self) -> Vec<Arc<Pod>>;

    /// Kills `pod` for `eviction`, as the kubelet's `KillPodFunc`
    /// (pod_workers.go's `killPodNow`): the eviction recorded for the pod
    /// worker, which stops its containers with `eviction.grace` seconds,
    /// and the evicting status ([`crate::pod_core::status::evicting`] of
    /// the record) written over the status last reported, so it keeps the
    /// newest one.
    ///
    /// # Errors
    /// Writing the status failed (the eviction stays recorded: the pod
    /// worker applies it on its next sync).
    fn kill_pod(
        &self,
        pod: &Pod,
        eviction: Eviction,
    ) -> impl Future<Output = Result<(), kube::Error>> + Send;

    /// True once the pod of UID `uid` has no running container and its
    /// volumes are torn down, as the kubelet's `PodCleanedUpFunc`
    /// (`podResourcesAreReclaimed`). False when the runtime cannot say.
    fn pod_cleaned_up(&self, uid: &str) -> impl Future<Output = bool> + Send;

    /// Removes every dead container the container GC policy allows, those
    /// of every finished pod included, as the kubelet's
    /// `ContainerGC.DeleteAllUnusedContainers`.
    ///
    /// # Errors
    /// The first CRI call that failed.
    fn delete_all_unused_containers(
        &self,
    ) -> impl Future<Output = crate::cri::Result<crate::container_gc::Collected>> + Send;
}

/// How the eviction manager reclaims unused images, as the kubelet's
/// `ImageGC` interface; implemented by the image garbage collector.
pub trait Images: Send + Sync {
    /// Deletes every image no container uses, as the kubelet's
    /// `ImageGC.DeleteUnusedImages`; returns the bytes freed.
    ///
    /// # Errors
    /// Listing or removing images failed (the message says which).
    fn delete_unused_images(&self) -> impl Future<Output = Result<u64, String>> + Send;
}

impl Images for crate::image_gc::ImageGc {
    async fn delete_unused_images(&self) -> Result<u64, String> {
        self.delete_unused().await
    }
}
