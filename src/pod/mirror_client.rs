//! The mirror pods of static pods, as the kubelet's mirror client
//! (`pkg/kubelet/pod/mirror_client.go`) and `tryReconcileMirrorPods`: each
//! static pod has in the API server a mirror pod ([`static_pod::mirror_pod`])
//! carrying its status; one that is missing is created, one that is being
//! deleted or mirrors another version of the pod is deleted (grace period 0,
//! UID precondition) and created again, and one whose static pod is gone is
//! deleted. The node's own credentials suffice: NodeRestriction lets a node
//! create and delete mirror pods bound to it.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client};
use tracing::{debug, info};

use super::sources::PodSources;
use crate::static_pod;

/// Errors keeping a mirror pod current.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The mirror pod could not be made (no Node UID yet).
    #[error("mirror pod of {pod}: {message}")]
    Build {
        /// `namespace/name`.
        pod: String,
        /// Why.
        message: String,
    },
    /// An API call failed.
    #[error("mirror pod of {pod}: {source}")]
    Api {
        /// `namespace/name`.
        pod: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// Keeps the mirror pod of static pod `pod` current, as the kubelet's
/// `tryReconcileMirrorPods`; does nothing for a pod being stopped, or while
/// the Node is not known (not registered yet, or being deleted).
///
/// # Errors
/// A create or delete failed (the next sync tries again).
pub async fn reconcile(
    client: &Client,
    sources: &PodSources,
    node_store: &Store<Node>,
    node_name: &str,
    pod: &Pod,
) -> Result<(), Error> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let key = crate::static_pod::key(pod);
    let api_err = |source| Error::Api {
        pod: key.clone(),
        source,
    };
    if let Some(mirror) = sources.mirror_of(pod) {
        if static_pod::is_mirror_of(&mirror, pod) {
            return Ok(());
        }
        info!(mirror = ?mirror.metadata.uid, "deleting a mirror pod that is out of date");
        delete(client, &mirror).await.map_err(api_err)?;
    }
    let Some(node) = node_store.get(&ObjectRef::new(node_name)) else {
        debug!("no Node yet: the mirror pod waits");
        return Ok(());
    };
    if node.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let node_uid = node.metadata.uid.clone().unwrap_or_default();
    let mirror =
        static_pod::mirror_pod(pod, node_name, &node_uid).map_err(|message| Error::Build {
            pod: key.clone(),
            message,
        })?;
    let ns = mirror
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    match api.create(&PostParams::default(), &mirror).await {
        Ok(created) => {
            info!(mirror = ?created.metadata.uid, "mirror pod created");
            Ok(())
        }
        // One of the same version exists already (the watch has not shown
        // it yet): fine. Another version is deleted on the next sync.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(api_err(e)),
    }
}

/// Deletes `pod` now (grace period 0, its UID as precondition), as the
/// kubelet's `DeleteMirrorPod` and the status manager's final delete; one
/// already gone or replaced is fine.
///
/// # Errors
/// The delete failed otherwise.
pub async fn delete(client: &Client, pod: &Pod) -> Result<(), kube::Error> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}
