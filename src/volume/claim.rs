//! PersistentVolumeClaims, as the kubelet's desired-state populator
//! resolves them (pkg/kubelet/volumemanager/populator,
//! `createVolumeSpec`): a pod volume that names a claim
//! (`persistentVolumeClaim`), or a generic ephemeral volume (`ephemeral`,
//! whose claim the control plane makes as `<pod>-<volume>`), is the
//! PersistentVolume bound to that claim. The claim must be bound and not
//! being deleted (unless the `kubernetes.io/pvc-protection` finalizer holds
//! it), the volume must point back at the claim, and an ephemeral volume's
//! claim must be owned by the pod. The Node authorizer lets a node read the
//! claims of its pods and the volumes bound to them, one `GET` at a time.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Volume};
use kube::{Api, Client};

/// The finalizer that keeps a claim in use from going
/// (`kubernetes.io/pvc-protection`).
pub const PVC_PROTECTION_FINALIZER: &str = "kubernetes.io/pvc-protection";

/// A pod volume's claim: its name, whether the pod mounts it read-only,
/// and whether it is a generic ephemeral volume's.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClaimRef {
    /// The claim's name, in the pod's namespace.
    pub name: String,
    /// `persistentVolumeClaim.readOnly` (false for ephemeral volumes).
    pub read_only: bool,
    /// A generic ephemeral volume's claim (`<pod>-<volume>`).
    pub ephemeral: bool,
}

/// The claim volume `v` of `pod` uses, if it uses one (the kubelet's
/// `ephemeral.VolumeClaimName` for ephemeral volumes).
#[must_use]
pub fn claim_of(pod: &Pod, v: &Volume) -> Option<ClaimRef> {
    if let Some(pvc) = &v.persistent_volume_claim {
        return Some(ClaimRef {
            name: pvc.claim_name.clone(),
            read_only: pvc.read_only.unwrap_or(false),
            ephemeral: false,
        });
    }
    v.ephemeral.as_ref().map(|_| ClaimRef {
        name: format!(
            "{}-{}",
            pod.metadata.name.as_deref().unwrap_or_default(),
            v.name
        ),
        read_only: false,
        ephemeral: true,
    })
}

/// A claim and the volume bound to it.
#[derive(Clone, Debug)]
pub struct Bound {
    /// The claim.
    pub claim: PersistentVolumeClaim,
    /// The PersistentVolume bound to it.
    pub volume: PersistentVolume,
}

/// Reads claim `claim` of `pod` and the volume bound to it, with the
/// kubelet's checks and messages (`error processing PVC <ns>/<name>: …`).
///
/// # Errors
/// The message: the claim cannot be read, is being deleted, is not bound,
/// names no volume, is not the pod's (ephemeral), or its volume cannot be
/// read or does not point back at it.
pub async fn resolve(client: &Client, pod: &Pod, claim: &ClaimRef) -> Result<Bound, String> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let failed = |e: String| format!("error processing PVC {ns}/{}: {e}", claim.name);
    // Never a request path of another object: a name the API would refuse
    // for a claim is not asked for.
    if !crate::names::is_dns1123_subdomain(&claim.name) {
        return Err(failed("not a valid claim name".into()));
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let pvc = claims
        .get(&claim.name)
        .await
        .map_err(|e| failed(format!("failed to fetch PVC from API server: {e}")))?;
    let volume_name = bound_volume(&pvc).map_err(|e| failed(e.to_string()))?;
    if claim.ephemeral {
        owned_by(&pvc, pod)?;
    }
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let pv = volumes.get(&volume_name).await.map_err(|e| {
        failed(format!(
            "failed to fetch PV {volume_name} from API server: {e}"
        ))
    })?;
    points_back(&pv, &pvc).map_err(failed)?;
    Ok(Bound {
        claim: pvc,
        volume: pv,
    })
}

/// The name of the volume bound to `pvc`, as the kubelet's
/// `getPVCExtractPV` checks it.
///
/// # Errors
/// `PVC is being deleted` (without the protection finalizer), `PVC is not
/// bound`, `PVC has empty pvc.Spec.VolumeName`.
pub fn bound_volume(pvc: &PersistentVolumeClaim) -> Result<String, &'static str> {
    let protected = pvc
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == PVC_PROTECTION_FINALIZER);
    if pvc.metadata.deletion_timestamp.is_some() && !protected {
        return Err("PVC is being deleted");
    }
    let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase != Some("Bound") {
        return Err("PVC is not bound");
    }
    match pvc.spec.as_ref().and_then(|s| s.volume_name.clone()) {
        Some(name) if !name.is_empty() => Ok(name),
        _ => Err("PVC has empty pvc.Spec.VolumeName"),
    }
}

/// Whether `pv` is bound to `pvc` (its `claimRef` names the claim's UID), as
/// the kubelet's `getPVSpec` checks it.
///
/// # Errors
/// The kubelet's message.
fn points_back(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> Result<(), String> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return Err(format!(
            "found PV object {name} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
        ));
    };
    let (have, want) = (
        claim_ref.uid.as_deref().unwrap_or_default(),
        pvc.metadata.uid.as_deref().unwrap_or_default(),
    );
    if have != want {
        return Err(format!(
            "found PV object {name} but its pv.Spec.ClaimRef.UID {have} does not point to claim.UID {want}"
        ));
    }
    Ok(())
}

/// Whether ephemeral claim `pvc` was made for `pod` (its controller owner is
/// the pod), as the kubelet's `ephemeral.VolumeIsForPod`.
///
/// # Errors
/// The kubelet's message.
fn owned_by(pvc: &PersistentVolumeClaim, pod: &Pod) -> Result<(), String> {
    let uid = pod.metadata.uid.as_deref();
    let owned = pvc
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && Some(o.uid.as_str()) == uid);
    if owned {
        return Ok(());
    }
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    Err(format!(
        "PVC {ns}/{} was not created for pod {ns}/{} (pod is not owner)",
        pvc.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    ))
}

/// Whether `pv` may be used on the Node named `node` with `labels`: its
/// required node affinity matches (none: any node), as the kubelet's
/// `CheckNodeAffinity`.
///
/// # Errors
/// `no matching NodeSelectorTerms`.
pub fn check_node_affinity(
    pv: &PersistentVolume,
    node: &str,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<(), &'static str> {
    let required = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref());
    match required {
        Some(selector) if !crate::node_selector::matches(selector, node, labels) => {
            Err("no matching NodeSelectorTerms")
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ObjectReference, PersistentVolumeClaimSpec, PersistentVolumeClaimStatus,
        PersistentVolumeSpec,
    };

    fn claim(phase: &str, volume: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: kube::api::ObjectMeta {
                name: Some("data".into()),
                uid: Some("claim-uid".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                volume_name: Some(volume.into()).filter(|v: &String| !v.is_empty()),
                ..Default::default()
            }),
            status: Some(PersistentVolumeClaimStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_claim_must_be_bound_named_and_not_going() {
        assert_eq!(bound_volume(&claim("Bound", "pv1")), Ok("pv1".into()));
        assert_eq!(bound_volume(&claim("Pending", "")), Err("PVC is not bound"));
        assert_eq!(
            bound_volume(&claim("Bound", "")),
            Err("PVC has empty pvc.Spec.VolumeName")
        );
        let mut going = claim("Bound", "pv1");
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(bound_volume(&going), Err("PVC is being deleted"));
        going.metadata.finalizers = Some(vec![PVC_PROTECTION_FINALIZER.into()]);
        assert_eq!(bound_volume(&going), Ok("pv1".into()), "still protected");
    }

    #[test]
    fn a_volume_must_point_back_at_its_claim() {
        let mut pv = PersistentVolume {
            metadata: kube::api::ObjectMeta {
                name: Some("pv1".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec::default()),
            ..Default::default()
        };
        let pvc = claim("Bound", "pv1");
        assert!(
            points_back(&pv, &pvc)
                .unwrap_err()
                .contains("nil pv.Spec.ClaimRef")
        );
        pv.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
            uid: Some("other".into()),
            ..Default::default()
        });
        assert!(
            points_back(&pv, &pvc)
                .unwrap_err()
                .contains("does not point to claim.UID claim-uid")
        );
        pv.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("claim-uid".into());
        assert_eq!(points_back(&pv, &pvc), Ok(()));
    }

    #[tokio::test]
    async fn a_claim_name_the_api_would_refuse_is_never_asked_for() {
        let api = crate::fake_api::FakeApi::default();
        let p = crate::fixtures::pod("web").build();
        for name in [
            "../../secrets/token",
            "a/status",
            "",
            "UPPER",
            &"x".repeat(300),
        ] {
            let c = ClaimRef {
                name: name.to_string(),
                read_only: false,
                ephemeral: false,
            };
            let err = resolve(&api.client(), &p, &c).await.unwrap_err();
            assert!(err.ends_with("not a valid claim name"), "{name}: {err}");
        }
        assert_eq!(api.take_requests(), Vec::new(), "no request made");
    }

    #[test]
    fn ephemeral_claims_are_named_after_pod_and_volume_and_owned_by_the_pod() {
        let mut p = crate::fixtures::pod("web").build();
        p.metadata.uid = Some("pod-uid".into());
        let v = Volume {
            name: "scratch".into(),
            ephemeral: Some(Default::default()),
            ..Default::default()
        };
        let c = claim_of(&p, &v).unwrap();
        assert_eq!((c.name.as_str(), c.ephemeral), ("web-scratch", true));
        let mut pvc = claim("Bound", "pv1");
        assert!(owned_by(&pvc, &p).unwrap_err().contains("pod is not owner"));
        pvc.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                uid: "pod-uid".into(),
                controller: Some(true),
                ..Default::default()
            },
        ]);
        assert_eq!(owned_by(&pvc, &p), Ok(()));
    }
}
