//! The node Lease in `kube-node-lease`: created owned by the Node, renewed every
//! 10 s with a 40 s duration (the kubelet's `nodeLeaseDurationSeconds` and
//! renew interval of a quarter of it).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use std::time::Duration;
use tracing::warn;

/// Namespace of node leases.
pub const NAMESPACE: &str = "kube-node-lease";

/// The Lease for node `name` (UID `uid`) renewed at `now`.
#[must_use]
pub fn lease(name: &str, uid: &str, duration_seconds: i32, now: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NAMESPACE.into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: name.into(),
                uid: uid.into(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.into()),
            lease_duration_seconds: Some(duration_seconds),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }),
    }
}

/// Renews the node's Lease, creating it on first use.
///
/// # Errors
/// The API error of the patch or create.
pub async fn renew(
    client: &Client,
    name: &str,
    uid: &str,
    duration_seconds: i32,
) -> kube::Result<()> {
    let api: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let now = Timestamp::now();
    let patch = serde_json::json!({
        "spec": { "holderIdentity": name, "leaseDurationSeconds": duration_seconds, "renewTime": MicroTime(now) }
    });
    match api
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => api
            .create(
                &PostParams::default(),
                &lease(name, uid, duration_seconds, now),
            )
            .await
            .map(drop),
        Err(e) => Err(e),
    }
}

/// Renews the node Lease every quarter of its duration (10 s for 40 s).
pub async fn renew_loop(client: Client, name: String, uid: String, duration_seconds: i32) {
    let period = Duration::from_secs(u64::try_from(duration_seconds / 4).unwrap_or(10).max(1));
    let mut tick = tokio::time::interval(period);
    loop {
        tick.tick().await;
        if let Err(e) = renew(&client, &name, &uid, duration_seconds).await {
            warn!(error = %e, "renew node lease");
        }
    }
}
