//! The DRA manager, as the kubelet's (`pkg/kubelet/cm/dra`): before a pod's
//! sandbox is made, every ResourceClaim the pod uses
//! ([`claims::pod_claims`], [`claims::claim_name`]) is read from the API server and checked
//! ([`claims::check`]: generated for the pod, reserved for it, allocated),
//! and each driver of its allocated devices must be registered on the node
//! to prepare it. A pod whose claims do not pass never gets a sandbox: it
//! waits, with a `FailedPrepareDynamicResources` Event, and is tried again
//! at its next sync, as the kubelet's `SyncPod` returns before
//! `createPodSandbox`.
//!
//! At start the node's ResourceSlices are deleted
//! ([`DraManager::wipe_resource_slices`]), as the kubelet's DRA plugin
//! manager wipes them: no driver has registered yet, and devices advertised
//! by a driver that may never come back would draw pods that cannot start.
//!
//! No DRA driver can register with this agent yet (the plugin manager
//! serves CSI drivers only, `docs/design.md`), so a claim with allocated
//! devices always stops at "DRA driver … is not registered": the pod waits
//! rather than run without its devices. A claim whose allocation holds no
//! device needs no driver, and its pod starts.

pub mod claims;

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use tracing::{debug, info, warn};

/// The first wait between attempts to wipe the node's ResourceSlices.
const WIPE_FIRST_WAIT: Duration = Duration::from_secs(1);
/// The longest wait between attempts: the wipe gives up once a doubled
/// wait would pass it, after about 8.5 minutes and 10 attempts (the
/// kubelet's `wait.Backoff` stops when it reaches its cap).
const WIPE_MAX_WAIT: Duration = Duration::from_secs(300);

/// Reads and checks the claims of the pods the pod workers start.
#[derive(Clone)]
pub struct DraManager {
    client: kube::Client,
}

impl DraManager {
    /// A manager reading claims through `client` (the Node authorizer lets a
    /// node read the claims of the pods bound to it).
    #[must_use]
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    /// As the kubelet's `PrepareResources`: Ok when every claim `pod` uses
    /// is ready for its containers (a pod without claims always is).
    ///
    /// # Errors
    /// Why the pod cannot start yet, in the kubelet's words, prefixed as its
    /// `prepare dynamic resources: …`: a claim not created yet, not found
    /// (`fetch ResourceClaim <name>: …`), not the pod's, not reserved for it
    /// or not allocated ([`claims::check`]), or a driver of its devices not
    /// registered (`DRA driver <name> is not registered`).
    pub async fn prepare(&self, pod: &Pod) -> Result<(), String> {
        self.check_claims(pod)
            .await
            .map_err(|e| format!("prepare dynamic resources: {e}"))
    }

    /// Deletes every ResourceSlice of node `node` (field `spec.nodeName`),
    /// as the kubelet's `wipeResourceSlices` at start: tried again while the
    /// API server refuses (the node's credentials may still be coming), the
    /// wait doubling from 1 s, until a wait would pass 5 min (then a
    /// warning). Returns whether the slices are gone (or there were none).
    pub async fn wipe_resource_slices(&self, node: &str) -> bool {
        let api: Api<ResourceSlice> = Api::all(self.client.clone());
        let of_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let mut wait = WIPE_FIRST_WAIT;
        loop {
            let why = match api
                .delete_collection(&DeleteParams::default(), &of_node)
                .await
            {
                Ok(_) => {
                    info!(
                        node,
                        "deleted the node's ResourceSlices: no DRA driver has registered"
                    );
                    return true;
                }
                Err(kube::Error::Api(s)) if s.code == 404 => return true,
                Err(e) => e.to_string(),
            };
            if wait > WIPE_MAX_WAIT {
                warn!(
                    node,
                    error = why,
                    "gave up deleting the node's ResourceSlices"
                );
                return false;
            }
            debug!(error = why, "delete the node's ResourceSlices; retrying");
            tokio::time::sleep(wait).await;
            wait = wait.saturating_mul(2);
        }
    }

    async fn check_claims(&self, pod: &Pod) -> Result<(), String> {
        let pod_claims = claims::pod_claims(pod);
        if pod_claims.is_empty() {
            return Ok(());
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), ns);
        // One claim after the other, named, read and checked, as the
        // kubelet's validation pass: the first that fails is the reason.
        for pc in &pod_claims {
            let Some(r) = claims::claim_name(pod, pc)? else {
                continue;
            };
            let claim = api.get(&r.name).await.map_err(|e| {
                let why = match e {
                    kube::Error::Api(s) => s.message.clone(),
                    e => e.to_string(),
                };
                format!("fetch ResourceClaim {}: {why}", r.name)
            })?;
            // The first driver (by name) of the claim's devices; none is
            // registered.
            if let Some(driver) = claims::check(pod, &r, &claim)?.into_iter().next() {
                if driver.is_empty() {
                    return Err("DRA driver name is empty".into());
                }
                return Err(format!("DRA driver {driver} is not registered"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_wipe_deletes_the_nodes_slices_by_field_and_retries_a_refusal() {
        let api = crate::fake_api::FakeApi::default();
        let slice = |node: &str| {
            serde_json::json!({ "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": { "name": format!("{node}-gpu") },
                "spec": { "nodeName": node, "driver": "gpu.example.com",
                    "pool": { "name": node, "generation": 1, "resourceSliceCount": 1 } } })
        };
        api.put_cluster("resourceslices", "node-1-gpu", slice("node-1"));
        api.put_cluster("resourceslices", "node-2-gpu", slice("node-2"));
        let dra = DraManager::new(api.client());
        // Refused once (the node's credentials not known yet), then done
        // after the first wait (1 s).
        api.refuse_slice_deletes(1);
        assert!(dra.wipe_resource_slices("node-1").await);
        let seen: Vec<(String, String)> = api
            .take_requests()
            .into_iter()
            .map(|r| (r.line(), r.query))
            .collect();
        let delete = (
            "DELETE /apis/resource.k8s.io/v1/resourceslices".to_string(),
            "fieldSelector=spec.nodeName=node-1".to_string(),
        );
        assert_eq!(seen, [delete.clone(), delete]);
        assert!(api.cluster_object("resourceslices", "node-1-gpu").is_none());
        assert!(api.cluster_object("resourceslices", "node-2-gpu").is_some());
    }
}
