//! `rustlet approve-csrs`: the Helm chart's approver of its companion nodes'
//! client certificates, in place of the controller-manager's `nodeclient`
//! auto-approval.
//!
//! The controller-manager's csrapproving controller approves a
//! `kubernetes.io/kube-apiserver-client-kubelet` request whose requester may
//! create `certificatesigningrequests/nodeclient`, whatever node name the
//! request carries: bound to the chart's ServiceAccount it would let that
//! token obtain a certificate for any `system:node:<name>`, control-plane
//! nodes included. An admission policy cannot read the common name inside the
//! PKCS#10 request, so the chart runs this approver instead. It watches the
//! requests of that signer and decides each one ([`decide`], pure):
//!
//! - a request already approved, denied, failed or issued, of another
//!   signer, or from another requester than the chart's agent
//!   ServiceAccount is not its to judge and is left alone (a node's own
//!   renewal, made with its node credentials, is the controller-manager's
//!   `selfnodeclient` approval's, as on a kubeadm node);
//! - a request from the agent ServiceAccount is approved only when it was
//!   made with a token bound to a Running or Pending pod of the release's
//!   DaemonSet (the API server records the pod's name and UID, and the node
//!   the token was bound on, in the request's `extra`), and asks for exactly
//!   what the kubelet asks for on that pod's node: subject
//!   `CN=system:node:<pod's node><suffix>, O=system:nodes` and nothing else,
//!   no subject alternative names, the usages of the controller-manager's
//!   `ValidateKubeletClientCSR` (digital signature and client auth, key
//!   encipherment allowed). Everything else from that ServiceAccount is
//!   denied, with the reason in the condition's message: the agent sees the
//!   denial at once and says why, where an unanswered request would only
//!   time out.
//!
//! Before it approves, the approver records the node name in a ConfigMap of
//! the release's namespace that it creates itself (not Helm's, so it outlives
//! `helm uninstall` until the chart's `post-delete` hook, which deletes the
//! Nodes listed there and then the ConfigMap: [`crate::node::reset::delete_nodes`]).
//! A node cannot write that ConfigMap, so it names only Nodes this release made.
//!
//! The request is attacker-chosen bytes: it is bounded ([`MAX_REQUEST_BYTES`])
//! before it is decoded (PEM, then DER with x509-parser), and nothing in it
//! panics or costs more than a pass over those bytes.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, ResourceExt as _};
use tracing::{info, warn};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::cri_attributes::ParsedCriAttribute;
use x509_parser::extensions::ParsedExtension;
use x509_parser::oid_registry::{OID_X509_COMMON_NAME, OID_X509_ORGANIZATION_NAME};
use x509_parser::prelude::FromDer as _;

use crate::certificate::CLIENT_SIGNER;

/// The largest request (`spec.request`, PEM) decoded: a kubelet client
/// request is well under 1 KiB; a larger one is denied undecoded.
pub const MAX_REQUEST_BYTES: usize = 16 * 1024;

/// The `extra` keys the API server sets from a token bound to a pod.
const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";

/// The organization of every node's client certificate.
const NODES_ORG: &str = "system:nodes";
/// The prefix of a node's user name.
const NODE_USER_PREFIX: &str = "system:node:";

/// How long a request whose decision could not be carried out (the API
/// server unreachable, a conflict) waits before it is tried again.
const RETRY: Duration = Duration::from_secs(5);

/// The Helm release the approver serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// The release's namespace: the DaemonSet's, its pods', the ConfigMap's.
    pub namespace: String,
    /// The agent's ServiceAccount, whose requests are judged.
    pub service_account: String,
    /// The DaemonSet whose pods' nodes get a companion node.
    pub daemonset: String,
    /// The companion node's name is the host node's with this suffix.
    pub node_name_suffix: String,
    /// The ConfigMap where approved node names are recorded.
    pub record: String,
}

impl Release {
    /// The user name of the agent ServiceAccount's tokens.
    #[must_use]
    pub fn requester(&self) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.namespace, self.service_account
        )
    }
}

/// What the approver does with one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Not this approver's to judge: already decided or issued, another
    /// signer, or another requester.
    Ignore,
    /// Approve the client certificate of companion node `node`.
    Approve {
        /// The companion node's name (`<pod's node><suffix>`).
        node: String,
    },
    /// Deny, with this reason (the condition's message).
    Deny(String),
}

/// Whether `csr` is one the approver judges: pending, of the kubelet client
/// signer, from the release's agent ServiceAccount. Pure.
#[must_use]
pub fn is_ours(csr: &CertificateSigningRequest, release: &Release) -> bool {
    let status = csr.status.as_ref();
    let decided = status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
        c.iter()
            .any(|c| matches!(c.type_.as_str(), "Approved" | "Denied" | "Failed"))
    });
    let issued = status
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty());
    !decided
        && !issued
        && csr.spec.signer_name == CLIENT_SIGNER
        && csr.spec.username.as_deref() == Some(release.requester().as_str())
}

/// The one value of `extra` key `key`, if it has exactly one.
fn one_extra<'a>(csr: &'a CertificateSigningRequest, key: &str) -> Option<&'a str> {
    match csr.spec.extra.as_ref()?.get(key)?.as_slice() {
        [one] => Some(one.as_str()),
        _ => None,
    }
}

/// The name of the pod whose bound token made `csr` (the API server's
/// `authentication.kubernetes.io/pod-name`), if it was made with one. Pure.
#[must_use]
pub fn requester_pod(csr: &CertificateSigningRequest) -> Option<&str> {
    one_extra(csr, EXTRA_POD_NAME)
}

/// Decides `csr` (see the module): `pod` is the pod [`requester_pod`] names,
/// as read from the release's namespace (`None`: there is none). Pure; never
/// panics, whatever the request holds.
#[must_use]
pub fn decide(csr: &CertificateSigningRequest, release: &Release, pod: Option<&Pod>) -> Decision {
    if !is_ours(csr, release) {
        return Decision::Ignore;
    }
    match check(csr, release, pod) {
        Ok(node) => Decision::Approve { node },
        Err(reason) => Decision::Deny(reason),
    }
}

/// The companion node `csr` may have a certificate for, or why not.
fn check(
    csr: &CertificateSigningRequest,
    release: &Release,
    pod: Option<&Pod>,
) -> Result<String, String> {
    let (Some(pod_name), Some(pod_uid)) = (requester_pod(csr), one_extra(csr, EXTRA_POD_UID))
    else {
        return Err("not made with a token bound to a pod of the release's DaemonSet".into());
    };
    let host = pod_node(pod, release, pod_name, pod_uid)?;
    // A token bound since ServiceAccountTokenPodNodeInfo names the node too.
    if let Some(extra) = csr.spec.extra.as_ref().and_then(|e| e.get(EXTRA_NODE_NAME))
        && extra.as_slice() != [host.to_string()]
    {
        return Err(format!(
            "the token was bound on node {extra:?}, its pod runs on {host:?}"
        ));
    }
    check_usages(csr.spec.usages.as_deref().unwrap_or_default())?;
    let node = format!("{host}{}", release.node_name_suffix);
    check_request(&csr.spec.request.0, &format!("{NODE_USER_PREFIX}{node}"))?;
    Ok(node)
}

/// The node of `pod`, a Running or Pending pod of the release's DaemonSet
/// named `name` with UID `uid`, or why it is not one.
fn pod_node<'a>(
    pod: Option<&'a Pod>,
    release: &Release,
    name: &str,
    uid: &str,
) -> Result<&'a str, String> {
    let not = |why: &str| Err(format!("pod {}/{name} {why}", release.namespace));
    let Some(pod) = pod else {
        return not("does not exist");
    };
    let meta = &pod.metadata;
    if meta.name.as_deref() != Some(name) || meta.namespace.as_deref() != Some(&release.namespace) {
        return not("is not the pod read");
    }
    if meta.uid.as_deref() != Some(uid) {
        return not("is not the pod the token was bound to (another UID)");
    }
    let owned = meta.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true)
            && o.api_version == "apps/v1"
            && o.kind == "DaemonSet"
            && o.name == release.daemonset
    });
    if !owned {
        return not(&format!("is not a pod of DaemonSet {}", release.daemonset));
    }
    let spec = pod.spec.as_ref();
    if spec.and_then(|s| s.service_account_name.as_deref()) != Some(&release.service_account) {
        return not(&format!(
            "does not run as ServiceAccount {}",
            release.service_account
        ));
    }
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if !matches!(phase, Some("Pending" | "Running")) {
        return not(&format!(
            "is not running (phase {})",
            phase.unwrap_or("unknown")
        ));
    }
    match spec.and_then(|s| s.node_name.as_deref()) {
        Some(node) if !node.is_empty() => Ok(node),
        _ => not("is not bound to a node"),
    }
}

/// The usages of a kubelet client certificate, as the controller-manager's
/// `ValidateKubeletClientCSR`: exactly {digital signature, client auth},
/// or those and key encipherment (an RSA key), in any order.
fn check_usages(usages: &[String]) -> Result<(), String> {
    let got: BTreeSet<&str> = usages.iter().map(String::as_str).collect();
    let plain = BTreeSet::from(["digital signature", "client auth"]);
    let rsa = BTreeSet::from(["digital signature", "key encipherment", "client auth"]);
    if got == plain || got == rsa {
        Ok(())
    } else {
        Err(format!(
            "usages {got:?} are not a kubelet client's (digital signature, client auth; key encipherment allowed)"
        ))
    }
}

/// Checks the PKCS#10 request `pem` (PEM, as `spec.request` holds it): one
/// `CERTIFICATE REQUEST` block first, its DER whole, a subject of exactly
/// `CN=<common_name>` and `O=system:nodes`, no attribute but an extension
/// request, and no subject alternative name in it.
fn check_request(pem_bytes: &[u8], common_name: &str) -> Result<(), String> {
    if pem_bytes.len() > MAX_REQUEST_BYTES {
        return Err(format!(
            "the request is {} bytes, more than {MAX_REQUEST_BYTES}",
            pem_bytes.len()
        ));
    }
    let block = pem::parse(pem_bytes).map_err(|e| format!("the request is not PEM: {e}"))?;
    if block.tag() != "CERTIFICATE REQUEST" {
        return Err(format!(
            "the request is a PEM {:?}, not a CERTIFICATE REQUEST",
            block.tag()
        ));
    }
    let (rest, req) = X509CertificationRequest::from_der(block.contents())
        .map_err(|e| format!("the request is not PKCS#10: {e}"))?;
    if !rest.is_empty() {
        return Err("the request has bytes after its PKCS#10 structure".into());
    }
    let info = &req.certification_request_info;
    let mut cn = Vec::new();
    let mut org = Vec::new();
    let mut others = 0usize;
    for attr in info.subject.iter_attributes() {
        let value = attr
            .as_str()
            .map_err(|_| "the subject has a value that is not a string")?;
        if *attr.attr_type() == OID_X509_COMMON_NAME {
            cn.push(value);
        } else if *attr.attr_type() == OID_X509_ORGANIZATION_NAME {
            org.push(value);
        } else {
            others += 1;
        }
    }
    if others > 0 {
        return Err("the subject has more than a common name and an organization".into());
    }
    if org.as_slice() != [NODES_ORG] {
        return Err(format!(
            "the subject's organizations are {org:?}, not [{NODES_ORG:?}]"
        ));
    }
    if cn.as_slice() != [common_name] {
        return Err(format!(
            "the subject's common names are {cn:?}, not [{common_name:?}]"
        ));
    }
    for attr in info.iter_attributes() {
        match attr.parsed_attribute() {
            ParsedCriAttribute::ExtensionRequest(req) => {
                let san = req.extensions.iter().any(|e| {
                    matches!(
                        e.parsed_extension(),
                        ParsedExtension::SubjectAlternativeName(_)
                    ) || e.oid == x509_parser::oid_registry::OID_X509_EXT_SUBJECT_ALT_NAME
                });
                if san {
                    return Err("the request names subject alternative names".into());
                }
            }
            _ => {
                return Err(format!(
                    "the request has an attribute {} besides its extensions",
                    attr.oid
                ));
            }
        }
    }
    Ok(())
}

/// What a reconcile could not do; the request is tried again after [`RETRY`].
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
}

/// What the reconciler works with.
struct Context {
    client: Client,
    release: Release,
}

/// Approves the release's companion nodes' requests; runs until the
/// controller's stream ends, which it does not on its own (a failed watch is
/// retried with back-off, a request whose decision could not be carried out
/// after [`RETRY`]).
///
/// # Errors
/// The first list of requests failed (the API server unreachable, or the
/// approver's role missing): the approver stops rather than retry unseen.
pub async fn run(client: Client, release: Release) -> anyhow::Result<()> {
    info!(
        namespace = release.namespace,
        requester = release.requester(),
        daemonset = release.daemonset,
        record = release.record,
        "approving the companion nodes' client certificates"
    );
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let signer = format!("spec.signerName={CLIENT_SIGNER}");
    csrs.list_metadata(&ListParams::default().fields(&signer).limit(1))
        .await
        .context("list the certificate signing requests")?;
    let config = watcher::Config::default().fields(&signer);
    let ctx = Arc::new(Context { client, release });
    Controller::new(csrs, config)
        .run(
            reconcile,
            |_, e, _| {
                warn!(error = %e, "certificate request not decided yet; trying again");
                Action::requeue(RETRY)
            },
            ctx,
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                warn!(error = %e, "certificate request controller");
            }
        })
        .await;
    Ok(())
}

/// Decides one request and carries the decision out.
async fn reconcile(
    csr: Arc<CertificateSigningRequest>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    handle(&ctx.client, &ctx.release, &csr).await?;
    Ok(Action::await_change())
}

/// Decides `csr` ([`decide`], after reading the pod its token was bound to)
/// and carries the decision out: an approval is recorded first, then set;
/// a denial is set. Returns the decision.
///
/// # Errors
/// Reading the pod, recording the node or setting the condition failed;
/// nothing was approved then (a recorded node whose approval failed is
/// approved on the next try, or deleted by the uninstall hook).
pub async fn handle(
    client: &Client,
    release: &Release,
    csr: &CertificateSigningRequest,
) -> Result<Decision, Error> {
    if !is_ours(csr, release) {
        return Ok(Decision::Ignore);
    }
    let name = csr.name_any();
    let pod = match requester_pod(csr) {
        Some(pod) => Api::<Pod>::namespaced(client.clone(), &release.namespace)
            .get_opt(pod)
            .await
            .map_err(|source| Error::Api {
                what: format!("read pod {}/{pod}", release.namespace),
                source,
            })?,
        None => None,
    };
    let decision = decide(csr, release, pod.as_ref());
    match &decision {
        Decision::Ignore => {}
        Decision::Approve { node } => {
            record(client, release, node, &name).await?;
            let message = format!(
                "rustlet approve-csrs: the client certificate of companion node {node}, requested by a pod of DaemonSet {}/{}",
                release.namespace, release.daemonset
            );
            set_condition(
                client,
                csr,
                "Approved",
                "RustletCompanionApproved",
                &message,
            )
            .await?;
            info!(csr = name, node, "approved");
        }
        Decision::Deny(reason) => {
            set_condition(client, csr, "Denied", "RustletCompanionDenied", reason).await?;
            warn!(csr = name, reason, "denied");
        }
    }
    Ok(decision)
}

/// Adds `node` (approved through request `csr`) to the release's record,
/// creating it the first time.
async fn record(client: &Client, release: &Release, node: &str, csr: &str) -> Result<(), Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &release.namespace);
    let err = |what: &str| {
        let what = format!("{what} ConfigMap {}/{}", release.namespace, release.record);
        move |source| Error::Api { what, source }
    };
    let patch = Patch::Merge(serde_json::json!({ "data": { node: csr } }));
    let params = PatchParams::default();
    let add = || api.patch(&release.record, &params, &patch);
    match add().await {
        Ok(_) => return Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(err("record the node in")(e)),
    }
    let created = ConfigMap {
        metadata: ObjectMeta {
            name: Some(release.record.clone()),
            labels: Some(
                [
                    ("app.kubernetes.io/name".to_string(), "rustlet".to_string()),
                    (
                        "app.kubernetes.io/component".to_string(),
                        "companion-nodes".to_string(),
                    ),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        data: Some([(node.to_string(), csr.to_string())].into()),
        ..ConfigMap::default()
    };
    match api.create(&PostParams::default(), &created).await {
        Ok(_) => Ok(()),
        // Made meanwhile (by an approver before this one): patch it.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            add().await.map(drop).map_err(err("record the node in"))
        }
        Err(e) => Err(err("create")(e)),
    }
}

/// Adds condition `type_` (`Approved` or `Denied`) to `csr` through its
/// `approval` subresource (a PUT, `update certificatesigningrequests/approval`;
/// a conflict is tried again with the newer request).
async fn set_condition(
    client: &Client,
    csr: &CertificateSigningRequest,
    type_: &str,
    reason: &str,
    message: &str,
) -> Result<(), Error> {
    let mut updated = csr.clone();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    updated
        .status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new)
        .push(CertificateSigningRequestCondition {
            type_: type_.to_string(),
            status: "True".to_string(),
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            last_update_time: Some(now.clone()),
            last_transition_time: Some(now),
        });
    let name = csr.name_any();
    Api::<CertificateSigningRequest>::all(client.clone())
        .replace_subresource("approval", &name, &PostParams::default(), &updated)
        .await
        .map(drop)
        .map_err(|source| Error::Api {
            what: format!("set {type_} on certificate request {name}"),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestSpec, CertificateSigningRequestStatus,
    };
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use proptest::prelude::*;

    fn release() -> Release {
        Release {
            namespace: "rustlet-system".into(),
            service_account: "rustlet".into(),
            daemonset: "rustlet".into(),
            node_name_suffix: "-rustlet".into(),
            record: "rustlet-nodes".into(),
        }
    }

    fn pod(node: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("rustlet-abcde".into()),
                namespace: Some("rustlet-system".into()),
                uid: Some("uid-1".into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "apps/v1".into(),
                    kind: "DaemonSet".into(),
                    name: "rustlet".into(),
                    uid: "ds-uid".into(),
                    controller: Some(true),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                service_account_name: Some("rustlet".into()),
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..PodStatus::default()
            }),
        }
    }

    /// A request as `openssl req` or rcgen makes it: the subject's
    /// attributes in order, and these DNS subject alternative names.
    fn pem_request(subject: &[(rcgen::DnType, &str)], sans: &[&str]) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(
            sans.iter().map(|s| (*s).to_string()).collect::<Vec<_>>(),
        )
        .unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (t, v) in subject {
            params.distinguished_name.push(t.clone(), *v);
        }
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    fn csr(request: &str) -> CertificateSigningRequest {
        CertificateSigningRequest {
            metadata: ObjectMeta {
                name: Some("csr-1".into()),
                ..ObjectMeta::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(request.as_bytes().to_vec()),
                signer_name: CLIENT_SIGNER.into(),
                usages: Some(vec!["digital signature".into(), "client auth".into()]),
                username: Some("system:serviceaccount:rustlet-system:rustlet".into()),
                extra: Some(
                    [
                        (
                            EXTRA_POD_NAME.to_string(),
                            vec!["rustlet-abcde".to_string()],
                        ),
                        (EXTRA_POD_UID.to_string(), vec!["uid-1".to_string()]),
                        (EXTRA_NODE_NAME.to_string(), vec!["host-a".to_string()]),
                    ]
                    .into(),
                ),
                ..CertificateSigningRequestSpec::default()
            },
            status: None,
        }
    }

    fn node_request(cn: &str) -> String {
        pem_request(
            &[
                (rcgen::DnType::OrganizationName, "system:nodes"),
                (rcgen::DnType::CommonName, cn),
            ],
            &[],
        )
    }

    fn good() -> CertificateSigningRequest {
        csr(&node_request("system:node:host-a-rustlet"))
    }

    fn denied(d: Decision, want: &str) {
        match d {
            Decision::Deny(reason) => assert!(reason.contains(want), "{reason:?} lacks {want:?}"),
            other => panic!("{other:?}, not denied for {want:?}"),
        }
    }

    #[test]
    fn the_agents_own_request_is_approved_for_its_companion_node() {
        let approve = Decision::Approve {
            node: "host-a-rustlet".into(),
        };
        assert_eq!(decide(&good(), &release(), Some(&pod("host-a"))), approve);
        // What the agent itself sends (certificate::request), and key
        // encipherment besides, as for an RSA key.
        let (pem, _) =
            crate::certificate::request(&crate::certificate::Template::client("host-a-rustlet"))
                .unwrap();
        let mut agent = csr(&pem);
        assert_eq!(decide(&agent, &release(), Some(&pod("host-a"))), approve);
        agent.spec.usages = Some(
            [
                "client auth",
                "key encipherment",
                "digital signature",
                "client auth",
            ]
            .map(String::from)
            .to_vec(),
        );
        assert_eq!(decide(&agent, &release(), Some(&pod("host-a"))), approve);
        // A Pending pod, and a token without the node in its extra (before
        // ServiceAccountTokenPodNodeInfo).
        let mut pending = pod("host-a");
        pending.status.as_mut().unwrap().phase = Some("Pending".into());
        let mut no_node = good();
        no_node.spec.extra.as_mut().unwrap().remove(EXTRA_NODE_NAME);
        assert_eq!(decide(&no_node, &release(), Some(&pending)), approve);
    }

    #[test]
    fn wrong_names_are_denied() {
        let p = pod("host-a");
        for (cn, why) in [
            // Another node's companion, the host node itself, a control plane.
            ("system:node:host-b-rustlet", "common names"),
            ("system:node:host-a", "common names"),
            ("system:node:control-plane", "common names"),
            ("system:node:host-a-rustlet ", "common names"),
            ("host-a-rustlet", "common names"),
        ] {
            denied(decide(&csr(&node_request(cn)), &release(), Some(&p)), why);
        }
        // The right name, but the pod runs on another node.
        denied(
            decide(&good(), &release(), Some(&pod("host-b"))),
            "bound on node",
        );
        let mut elsewhere = good();
        elsewhere
            .spec
            .extra
            .as_mut()
            .unwrap()
            .remove(EXTRA_NODE_NAME);
        denied(
            decide(&elsewhere, &release(), Some(&pod("host-b"))),
            "common names",
        );
    }

    #[test]
    fn wrong_subjects_and_names_besides_are_denied() {
        let p = pod("host-a");
        let cn = (rcgen::DnType::CommonName, "system:node:host-a-rustlet");
        let o = (rcgen::DnType::OrganizationName, "system:nodes");
        for (subject, sans, why) in [
            (vec![cn.clone()], vec![], "organizations"),
            (
                vec![
                    cn.clone(),
                    (rcgen::DnType::OrganizationName, "system:masters"),
                ],
                vec![],
                "organizations",
            ),
            (
                vec![
                    o.clone(),
                    cn.clone(),
                    (rcgen::DnType::OrganizationName, "system:masters"),
                ],
                vec![],
                "organizations",
            ),
            (vec![o.clone()], vec![], "common names"),
            (
                vec![o.clone(), cn.clone(), (rcgen::DnType::CountryName, "DE")],
                vec![],
                "more than",
            ),
            (
                vec![o.clone(), cn.clone()],
                vec!["host-a-rustlet"],
                "alternative names",
            ),
        ] {
            let request = pem_request(&subject, &sans);
            denied(decide(&csr(&request), &release(), Some(&p)), why);
        }
    }

    #[test]
    fn other_requesters_signers_and_decided_requests_are_left_alone() {
        let p = pod("host-a");
        let mut other = good();
        other.spec.username = Some("system:serviceaccount:default:rustlet".into());
        assert_eq!(decide(&other, &release(), Some(&p)), Decision::Ignore);
        other.spec.username = Some("system:node:host-a-rustlet".into());
        assert_eq!(decide(&other, &release(), Some(&p)), Decision::Ignore);
        other.spec.username = None;
        assert_eq!(decide(&other, &release(), Some(&p)), Decision::Ignore);
        let mut serving = good();
        serving.spec.signer_name = crate::certificate::SERVING_SIGNER.into();
        assert_eq!(decide(&serving, &release(), Some(&p)), Decision::Ignore);
        for done in ["Approved", "Denied", "Failed"] {
            let mut d = good();
            d.status = Some(CertificateSigningRequestStatus {
                conditions: Some(vec![CertificateSigningRequestCondition {
                    type_: done.into(),
                    status: "True".into(),
                    ..CertificateSigningRequestCondition::default()
                }]),
                certificate: None,
            });
            assert_eq!(decide(&d, &release(), Some(&p)), Decision::Ignore, "{done}");
        }
    }

    #[test]
    fn requests_not_from_a_pod_of_the_daemonset_are_denied() {
        let p = pod("host-a");
        // A token not bound to a pod (`kubectl create token`, a Secret's).
        let mut unbound = good();
        unbound.spec.extra = None;
        denied(
            decide(&unbound, &release(), Some(&p)),
            "not made with a token bound",
        );
        denied(decide(&good(), &release(), None), "does not exist");
        let mut stale = pod("host-a");
        stale.metadata.uid = Some("uid-2".into());
        denied(decide(&good(), &release(), Some(&stale)), "another UID");
        let mut orphan = pod("host-a");
        orphan.metadata.owner_references.as_mut().unwrap()[0].name = "other".into();
        denied(
            decide(&good(), &release(), Some(&orphan)),
            "not a pod of DaemonSet",
        );
        let mut owned_not_controlled = pod("host-a");
        owned_not_controlled
            .metadata
            .owner_references
            .as_mut()
            .unwrap()[0]
            .controller = None;
        denied(
            decide(&good(), &release(), Some(&owned_not_controlled)),
            "not a pod of DaemonSet",
        );
        let mut done = pod("host-a");
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        denied(decide(&good(), &release(), Some(&done)), "not running");
        let mut unbound_pod = pod("host-a");
        unbound_pod.spec.as_mut().unwrap().node_name = None;
        denied(
            decide(&good(), &release(), Some(&unbound_pod)),
            "not bound to a node",
        );
        let mut other_sa = pod("host-a");
        other_sa.spec.as_mut().unwrap().service_account_name = Some("default".into());
        denied(
            decide(&good(), &release(), Some(&other_sa)),
            "ServiceAccount",
        );
    }

    #[test]
    fn other_usages_are_denied() {
        let p = pod("host-a");
        for usages in [
            vec![],
            vec!["client auth"],
            vec!["digital signature", "client auth", "server auth"],
            vec!["digital signature", "server auth"],
            vec![
                "digital signature",
                "key encipherment",
                "client auth",
                "cert sign",
            ],
        ] {
            let mut c = good();
            c.spec.usages = Some(usages.iter().map(|u| (*u).to_string()).collect());
            denied(decide(&c, &release(), Some(&p)), "usages");
        }
    }

    #[test]
    fn garbage_requests_are_denied_not_a_panic() {
        let p = pod("host-a");
        let good_pem = node_request("system:node:host-a-rustlet");
        let block = pem::parse(good_pem.as_bytes()).unwrap();
        let der = block.contents().to_vec();
        let wrap = |tag: &str, bytes: Vec<u8>| pem::encode(&pem::Pem::new(tag, bytes));
        let mut trailing = der.clone();
        trailing.push(0);
        for (request, why) in [
            (String::new(), "not PEM"),
            ("not a request".into(), "not PEM"),
            (
                wrap("CERTIFICATE", der.clone()),
                "not a CERTIFICATE REQUEST",
            ),
            (
                wrap("CERTIFICATE REQUEST", der[..der.len() / 2].to_vec()),
                "not PKCS#10",
            ),
            (
                wrap(
                    "CERTIFICATE REQUEST",
                    vec![0x30, 0x84, 0xff, 0xff, 0xff, 0xff],
                ),
                "not PKCS#10",
            ),
            (wrap("CERTIFICATE REQUEST", trailing), "bytes after"),
            ("x".repeat(MAX_REQUEST_BYTES + 1), "more than"),
        ] {
            denied(decide(&csr(&request), &release(), Some(&p)), why);
        }
    }

    proptest! {
        /// Any bytes, and any mutation of a good request, give a decision,
        /// never a panic; a mutation is approved only if it still names
        /// the companion node.
        #[test]
        fn any_request_bytes_are_decided(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let p = pod("host-a");
            let _ = decide(&csr(&String::from_utf8_lossy(&bytes)), &release(), Some(&p));
            let mut c = good();
            c.spec.request = ByteString(bytes);
            let _ = decide(&c, &release(), Some(&p));
        }

        #[test]
        fn mutated_der_is_decided(flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)) {
            let p = pod("host-a");
            let good_pem = node_request("system:node:host-a-rustlet");
            let mut der = pem::parse(good_pem.as_bytes()).unwrap().contents().to_vec();
            for (at, b) in flips {
                let i = at.index(der.len());
                der[i] ^= b;
            }
            let request = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", der));
            match decide(&csr(&request), &release(), Some(&p)) {
                Decision::Approve { node } => prop_assert_eq!(node, "host-a-rustlet"),
                Decision::Deny(_) => {}
                Decision::Ignore => prop_assert!(false, "ignored"),
            }
        }
    }

    #[tokio::test]
    async fn approvals_are_recorded_then_set_and_denials_set_alone() {
        let api = crate::fake_api::FakeApi::default();
        let client = api.client();
        let p = pod("host-a");
        api.put_pod(p);
        let first = good();
        let d = handle(&client, &release(), &first).await.unwrap();
        assert_eq!(
            d,
            Decision::Approve {
                node: "host-a-rustlet".into()
            }
        );
        let mut second = good();
        second.metadata.name = Some("csr-2".into());
        handle(&client, &release(), &second).await.unwrap();
        let mut other = csr(&node_request("system:node:control-plane"));
        other.metadata.name = Some("csr-3".into());
        assert!(matches!(
            handle(&client, &release(), &other).await.unwrap(),
            Decision::Deny(_)
        ));
        let lines: Vec<String> = api
            .take_requests()
            .iter()
            .map(crate::fake_api::Seen::line)
            .collect();
        let cm = "/api/v1/namespaces/rustlet-system/configmaps";
        let approval = |n: &str| {
            format!("PUT /apis/certificates.k8s.io/v1/certificatesigningrequests/{n}/approval")
        };
        assert_eq!(
            lines,
            [
                "GET /api/v1/namespaces/rustlet-system/pods/rustlet-abcde".to_string(),
                format!("PATCH {cm}/rustlet-nodes"),
                format!("POST {cm}"),
                approval("csr-1"),
                "GET /api/v1/namespaces/rustlet-system/pods/rustlet-abcde".to_string(),
                format!("PATCH {cm}/rustlet-nodes"),
                approval("csr-2"),
                "GET /api/v1/namespaces/rustlet-system/pods/rustlet-abcde".to_string(),
                approval("csr-3"),
            ]
        );
        let cond = |n: &str| {
            let v = api.cluster_object("certificatesigningrequests", n).unwrap();
            let c = &v["status"]["conditions"][0];
            (
                c["type"].as_str().unwrap().to_string(),
                c["status"].as_str().unwrap().to_string(),
            )
        };
        assert_eq!(cond("csr-1"), ("Approved".into(), "True".into()));
        assert_eq!(cond("csr-3"), ("Denied".into(), "True".into()));
        // Someone else's request: not even the pod is read.
        let mut theirs = good();
        theirs.spec.username = Some("system:node:host-a-rustlet".into());
        assert_eq!(
            handle(&client, &release(), &theirs).await.unwrap(),
            Decision::Ignore
        );
        assert!(api.take_requests().is_empty());
    }
}
