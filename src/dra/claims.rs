//! Which ResourceClaims a pod uses and whether it may use them, as the
//! kubelet's DRA manager checks them before preparing anything
//! (`prepareResources`' validation pass, with `resourceclaim.Name`,
//! `IsForPod` and `IsReservedForPod` of k8s.io/dynamic-resource-allocation).
//! Pure: the claims are read by the caller.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, Pod, PodResourceClaim};
use k8s_openapi::api::resource::v1::ResourceClaim;

/// A claim the pod uses, by name in its namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRef {
    /// The ResourceClaim's name.
    pub name: String,
    /// The claim was generated from a template for this pod, which must be
    /// its controlling owner ([`check`]).
    pub must_check_owner: bool,
}

/// The claims `pod` uses, each to be named with [`claim_name`] when its
/// turn comes (the kubelet names, reads and checks one claim after the
/// other): the entries of `spec.resourceClaims`, then the claim behind its
/// extended resources (`status.extendedResourceClaimStatus`,
/// `DRAExtendedResource`), as an entry naming it.
#[must_use]
pub fn pod_claims(pod: &Pod) -> Vec<PodResourceClaim> {
    let mut out: Vec<PodResourceClaim> = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.clone())
        .unwrap_or_default();
    let status = pod.status.as_ref();
    if let Some(ext) = status.and_then(|s| s.extended_resource_claim_status.as_ref()) {
        out.push(PodResourceClaim {
            name: String::new(),
            resource_claim_name: Some(ext.resource_claim_name.clone()),
            ..Default::default()
        });
    }
    out
}

/// `resourceclaim.Name`: the claim a [`pod_claims`] entry names (None: none
/// was generated, nothing to do). A claim from a template is named in
/// `status.resourceClaimStatuses`; an entry there without a name means no
/// claim was needed.
///
/// # Errors
/// The kubelet's messages: a template claim without its status entry
/// (`pod "<ns>/<name>": ResourceClaim not created yet`), or an entry
/// naming neither a claim nor a template.
pub fn claim_name(pod: &Pod, pc: &PodResourceClaim) -> Result<Option<ClaimRef>, String> {
    let (ns, name) = (
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default(),
    );
    if let Some(claim) = &pc.resource_claim_name {
        return Ok(Some(ClaimRef {
            name: claim.clone(),
            must_check_owner: false,
        }));
    }
    if pc.resource_claim_template_name.is_some() {
        let statuses = pod
            .status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref());
        return match statuses.into_iter().flatten().find(|s| s.name == pc.name) {
            Some(s) => Ok(s.resource_claim_name.clone().map(|name| ClaimRef {
                name,
                must_check_owner: true,
            })),
            None => Err(format!(
                "pod \"{ns}/{name}\": ResourceClaim not created yet"
            )),
        };
    }
    Err(format!(
        "pod \"{ns}/{name}\", spec.resourceClaim {:?}: none of the supported fields are set",
        pc.name
    ))
}

/// Checks that `pod` may use `claim` (read for `r`) and returns the drivers
/// that must prepare it: a claim from a template is controlled by the pod
/// (`IsForPod`), the pod is among `status.reservedFor` (`IsReservedForPod`;
/// reservations for a pod group are not honoured), and the claim is
/// allocated; the drivers are those of its allocated devices.
///
/// # Errors
/// The kubelet's messages: `ResourceClaim <ns>/<claim> is not in the same
/// namespace as Pod <ns>/<pod>`, `ResourceClaim <ns>/<claim> was not created
/// for Pod <ns>/<pod> (Pod is not owner)`, `pod <pod> (<uid>) is not allowed
/// to use ResourceClaim <claim> (<uid>)`, `ResourceClaim <claim>: not
/// allocated`.
pub fn check(pod: &Pod, r: &ClaimRef, claim: &ResourceClaim) -> Result<BTreeSet<String>, String> {
    let pod_ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let pod_uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let claim_ns = claim.metadata.namespace.as_deref().unwrap_or_default();
    let claim_uid = claim.metadata.uid.as_deref().unwrap_or_default();
    if r.must_check_owner {
        let controlled = claim
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && o.uid == pod_uid);
        if claim_ns != pod_ns {
            return Err(format!(
                "ResourceClaim {claim_ns}/{} is not in the same namespace as Pod {pod_ns}/{pod_name}",
                r.name
            ));
        }
        if !controlled {
            return Err(format!(
                "ResourceClaim {claim_ns}/{} was not created for Pod {pod_ns}/{pod_name} (Pod is not owner)",
                r.name
            ));
        }
    }
    let status = claim.status.as_ref();
    let reserved = status
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .any(|c| !pod_uid.is_empty() && c.uid == pod_uid);
    if !reserved {
        return Err(format!(
            "pod {pod_name} ({pod_uid}) is not allowed to use ResourceClaim {} ({claim_uid})",
            r.name
        ));
    }
    let Some(allocation) = status.and_then(|s| s.allocation.as_ref()) else {
        return Err(format!("ResourceClaim {}: not allocated", r.name));
    };
    Ok(allocation
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .map(|d| d.driver.clone())
        .collect())
}

/// The prefix of extended resources backed by a DeviceClass
/// (`deviceclass.resource.kubernetes.io/<class>`).
const DEVICE_CLASS_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// The entries of `pod`'s `spec.resourceClaims` container `c` names in its
/// `resources.claims`, each with the requests it names of it (an empty
/// request: all of them), in the pod's order.
pub fn named_claims<'a>(pod: &'a Pod, c: &Container) -> Vec<(&'a PodResourceClaim, Vec<String>)> {
    let used = c.resources.as_ref().and_then(|r| r.claims.as_ref());
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|pc| {
            let requests: Vec<String> = used
                .into_iter()
                .flatten()
                .filter(|u| u.name == pc.name)
                .map(|u| u.request.clone().unwrap_or_default())
                .collect();
            (!requests.is_empty()).then_some((pc, requests))
        })
        .collect()
}

/// The claims container `c` of `pod` uses and the requests of each it
/// names, by claim name, as the kubelet's `GetResources` collects them:
/// each entry of its `resources.claims` (an empty request: all of the
/// claim's requests), and for each extended resource backed by DRA it
/// requests (not zero), the requests `status.extendedResourceClaimStatus`
/// maps to it for this container.
///
/// # Errors
/// A claim it uses cannot be named ([`claim_name`]).
pub fn container_requests(
    pod: &Pod,
    c: &Container,
) -> Result<BTreeMap<String, Vec<String>>, String> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let resources = c.resources.as_ref();
    for (pc, requests) in named_claims(pod, c) {
        if let Some(r) = claim_name(pod, pc)? {
            out.entry(r.name).or_default().extend(requests);
        }
    }
    let ext = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref());
    if let Some(ext) = ext {
        let asked: BTreeSet<&str> = resources
            .and_then(|r| r.requests.as_ref())
            .into_iter()
            .flatten()
            .filter(|(name, q)| {
                (crate::resource::is_extended_resource(name)
                    || name.starts_with(DEVICE_CLASS_PREFIX))
                    && crate::resource::Quantity::parse_saturating(&q.0).is_ok_and(|q| !q.is_zero())
            })
            .map(|(name, _)| name.as_str())
            .collect();
        let mapped = ext
            .request_mappings
            .iter()
            .filter(|m| m.container_name == c.name && asked.contains(m.resource_name.as_str()))
            .map(|m| m.request_name.clone());
        let requests: Vec<String> = mapped.collect();
        if !requests.is_empty() {
            out.entry(ext.resource_claim_name.clone())
                .or_default()
                .extend(requests);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(claims: serde_json::Value, status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "p", "namespace": "ns", "uid": "pod-uid" },
            "spec": { "containers": [], "resourceClaims": claims },
            "status": status,
        }))
        .unwrap()
    }

    fn claim(v: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_container_gets_the_requests_it_names_and_those_of_its_extended_resources() {
        let mut p = pod(
            serde_json::json!([
                { "name": "direct", "resourceClaimName": "shared-gpu" },
                { "name": "templated", "resourceClaimTemplateName": "t" },
                { "name": "unused", "resourceClaimName": "other" }
            ]),
            serde_json::json!({
                "resourceClaimStatuses": [
                    { "name": "templated", "resourceClaimName": "p-templated-x7" }
                ],
                "extendedResourceClaimStatus": {
                    "resourceClaimName": "p-extended-resources-9",
                    "requestMappings": [
                        { "containerName": "c", "resourceName": "example.com/gpu", "requestName": "container-0-request-0" },
                        { "containerName": "c", "resourceName": "example.com/zero", "requestName": "container-0-request-1" },
                        { "containerName": "other", "resourceName": "example.com/gpu", "requestName": "container-1-request-0" }
                    ]
                }
            }),
        );
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "c",
            "resources": {
                "requests": { "example.com/gpu": "1", "example.com/zero": "0", "cpu": "1" },
                "claims": [
                    { "name": "direct", "request": "gpu" },
                    { "name": "direct", "request": "nic" },
                    { "name": "templated" }
                ]
            }
        }))
        .unwrap();
        let got = container_requests(&p, &c).unwrap();
        assert_eq!(
            got,
            BTreeMap::from([
                (
                    "shared-gpu".to_string(),
                    vec!["gpu".to_string(), "nic".to_string()]
                ),
                ("p-templated-x7".to_string(), vec![String::new()]),
                (
                    "p-extended-resources-9".to_string(),
                    vec!["container-0-request-0".to_string()]
                ),
            ])
        );
        // A template claim not created yet cannot be named.
        p.status.as_mut().unwrap().resource_claim_statuses = None;
        assert!(
            container_requests(&p, &c)
                .unwrap_err()
                .contains("ResourceClaim not created yet")
        );
    }

    #[test]
    fn claims_are_named_by_the_spec_the_status_and_extended_resources() {
        let p = pod(
            serde_json::json!([
                { "name": "direct", "resourceClaimName": "shared-gpu" },
                { "name": "templated", "resourceClaimTemplateName": "t" },
                { "name": "skipped", "resourceClaimTemplateName": "t" }
            ]),
            serde_json::json!({
                "resourceClaimStatuses": [
                    { "name": "templated", "resourceClaimName": "p-templated-x7" },
                    { "name": "skipped" }
                ],
                "extendedResourceClaimStatus": {
                    "resourceClaimName": "p-extended-resources-9",
                    "requestMappings": []
                }
            }),
        );
        let names: Vec<(String, bool)> = pod_claims(&p)
            .iter()
            .filter_map(|pc| claim_name(&p, pc).unwrap())
            .map(|r| (r.name, r.must_check_owner))
            .collect();
        assert_eq!(
            names,
            [
                ("shared-gpu".into(), false),
                ("p-templated-x7".into(), true),
                ("p-extended-resources-9".into(), false),
            ]
        );
    }

    #[test]
    fn a_template_claim_not_yet_created_or_an_empty_entry_is_an_error() {
        let p = pod(
            serde_json::json!([{ "name": "gpu", "resourceClaimTemplateName": "t" }]),
            serde_json::json!({}),
        );
        let first = |p: &Pod| claim_name(p, &pod_claims(p)[0]);
        assert_eq!(
            first(&p).unwrap_err(),
            "pod \"ns/p\": ResourceClaim not created yet"
        );
        let p = pod(
            serde_json::json!([{ "name": "gpu" }]),
            serde_json::json!({}),
        );
        assert!(
            first(&p)
                .unwrap_err()
                .ends_with("spec.resourceClaim \"gpu\": none of the supported fields are set")
        );
    }

    fn allocated(reserved_uid: &str, owner_uid: Option<&str>) -> ResourceClaim {
        let owners = owner_uid.map(|uid| {
            serde_json::json!([{
                "apiVersion": "v1", "kind": "Pod", "name": "p", "uid": uid, "controller": true
            }])
        });
        claim(serde_json::json!({
            "metadata": { "name": "c", "namespace": "ns", "uid": "claim-uid", "ownerReferences": owners },
            "spec": {},
            "status": {
                "reservedFor": [{ "resource": "pods", "name": "p", "uid": reserved_uid }],
                "allocation": { "devices": { "results": [
                    { "request": "gpu", "driver": "gpu.example.com", "pool": "n", "device": "gpu-0" },
                    { "request": "nic", "driver": "nic.example.com", "pool": "n", "device": "eth1" },
                    { "request": "gpu2", "driver": "gpu.example.com", "pool": "n", "device": "gpu-1" }
                ] } }
            }
        }))
    }

    #[test]
    fn an_allocated_claim_reserved_for_the_pod_names_its_drivers() {
        let p = pod(serde_json::json!([]), serde_json::json!({}));
        let direct = ClaimRef {
            name: "c".into(),
            must_check_owner: false,
        };
        let drivers = check(&p, &direct, &allocated("pod-uid", None)).unwrap();
        assert_eq!(
            drivers.into_iter().collect::<Vec<_>>(),
            ["gpu.example.com", "nic.example.com"]
        );
        let templated = ClaimRef {
            must_check_owner: true,
            ..direct.clone()
        };
        assert!(check(&p, &templated, &allocated("pod-uid", Some("pod-uid"))).is_ok());
    }

    #[test]
    fn a_claim_of_another_pod_or_unreserved_or_unallocated_is_refused() {
        let p = pod(serde_json::json!([]), serde_json::json!({}));
        let templated = ClaimRef {
            name: "c".into(),
            must_check_owner: true,
        };
        assert_eq!(
            check(&p, &templated, &allocated("pod-uid", Some("other"))).unwrap_err(),
            "ResourceClaim ns/c was not created for Pod ns/p (Pod is not owner)"
        );
        let direct = ClaimRef {
            must_check_owner: false,
            ..templated
        };
        assert_eq!(
            check(&p, &direct, &allocated("other", None)).unwrap_err(),
            "pod p (pod-uid) is not allowed to use ResourceClaim c (claim-uid)"
        );
        let reserved_only = claim(serde_json::json!({
            "metadata": { "name": "c", "namespace": "ns", "uid": "claim-uid" },
            "spec": {},
            "status": { "reservedFor": [{ "resource": "pods", "name": "p", "uid": "pod-uid" }] }
        }));
        assert_eq!(
            check(&p, &direct, &reserved_only).unwrap_err(),
            "ResourceClaim c: not allocated"
        );
    }
}
