//! The pod worker's last account of each pod ([`Explanation`]), kept for the
//! node API's `/debug/pods/<namespace>/<pod>/plan`: one per pod bound to the
//! node, replaced at each sync, dropped with the pod.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};

use crate::pod_core::explain::Explanation;

/// Errors of [`fetch`].
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The API server refused or failed a request.
    #[error("{0}")]
    Api(#[from] kube::Error),
    /// The pod is not bound to a node yet.
    #[error("pod {0} is not bound to a node yet: the scheduler has not placed it")]
    Unbound(String),
    /// The request could not be built (a name no URL can hold).
    #[error("{0}")]
    Request(#[from] http::Error),
    /// The node answered with no account of the pod.
    #[error("the node's answer is not an account of the pod: {0}")]
    Decode(#[from] serde_json::Error),
}

/// The last account of pod `namespace`/`name` from the node it is bound
/// to, through the API server's node proxy
/// (`/api/v1/nodes/<node>/proxy/debug/pods/<namespace>/<name>/plan`): what
/// `rustlet explain` prints, from anywhere the API server is reachable.
///
/// # Errors
/// [`FetchError`]: the pod or the node's answer could not be had.
pub async fn fetch(
    client: &Client,
    namespace: &str,
    name: &str,
) -> Result<Explanation, FetchError> {
    let pod = Api::<Pod>::namespaced(client.clone(), namespace)
        .get(name)
        .await?;
    let node = pod
        .spec
        .and_then(|s| s.node_name)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| FetchError::Unbound(format!("{namespace}/{name}")))?;
    let path = format!("/api/v1/nodes/{node}/proxy/debug/pods/{namespace}/{name}/plan");
    let request = http::Request::get(path).body(Vec::new())?;
    let text = client.request_text(request).await?;
    Ok(serde_json::from_str(&text)?)
}

/// The last [`Explanation`] of each pod, by UID.
#[derive(Debug, Default)]
pub struct Explanations {
    by_uid: Mutex<HashMap<String, Explanation>>,
}

impl Explanations {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Keeps the account of a sync that went no further than admission
    /// ([`crate::pod_core::explain::not_admitted`]), made now.
    pub fn not_admitted(
        &self,
        pod: &Pod,
        rejection: Option<&crate::pod_core::admit::Rejection>,
        requeue: Option<std::time::Duration>,
    ) {
        let now = k8s_openapi::jiff::Timestamp::now();
        self.record(crate::pod_core::explain::not_admitted(
            pod, rejection, now, requeue,
        ));
    }

    /// Keeps `e` as its pod's last account, in place of the one before.
    pub fn record(&self, e: Explanation) {
        self.lock().insert(e.uid.clone(), e);
    }

    /// The last account of pod `uid`.
    #[must_use]
    pub fn get(&self, uid: &str) -> Option<Explanation> {
        self.lock().get(uid).cloned()
    }

    /// Forgets the pods whose UID `keep` rejects (gone from the node).
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        self.lock().retain(|uid, _| keep(uid));
    }

    /// How many pods have an account.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no pod has one.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Explanation>> {
        self.by_uid.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
