//! The DRA manager, as the kubelet's (`pkg/kubelet/cm/dra`): before a pod's
//! sandbox is made, every ResourceClaim the pod uses
//! ([`claims::claim_refs`]) is read from the API server and checked
//! ([`claims::check`]: generated for the pod, reserved for it, allocated),
//! and each driver of its allocated devices must be registered on the node
//! to prepare it. A pod whose claims do not pass never gets a sandbox: it
//! waits, with a `FailedPrepareDynamicResources` Event, and is tried again
//! at its next sync, as the kubelet's `SyncPod` returns before
//! `createPodSandbox`.
//!
//! No DRA driver can register with this agent yet (the plugin manager
//! serves CSI drivers only, `docs/design.md`), so a claim with allocated
//! devices always stops at "DRA driver … is not registered": the pod waits
//! rather than run without its devices. A claim whose allocation holds no
//! device needs no driver, and its pod starts.

pub mod claims;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;

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

    async fn check_claims(&self, pod: &Pod) -> Result<(), String> {
        let refs = claims::claim_refs(pod)?;
        if refs.is_empty() {
            return Ok(());
        }
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), ns);
        for r in &refs {
            let claim = api.get(&r.name).await.map_err(|e| {
                let why = match e {
                    kube::Error::Api(s) => s.message.clone(),
                    e => e.to_string(),
                };
                format!("fetch ResourceClaim {}: {why}", r.name)
            })?;
            // The first driver (by name) of the claim's devices; none is
            // registered.
            if let Some(driver) = claims::check(pod, r, &claim)?.into_iter().next() {
                if driver.is_empty() {
                    return Err("DRA driver name is empty".into());
                }
                return Err(format!("DRA driver {driver} is not registered"));
            }
        }
        Ok(())
    }
}
