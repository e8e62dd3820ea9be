//! Projected `podCertificate` sources, as the kubelet's podcertificate
//! `IssuingManager`: for each source of each pod, the agent makes a key
//! pair of the source's `keyType`, asks the source's signer for a
//! certificate with a `PodCertificateRequest` (`certificates.k8s.io/v1`,
//! holding a PKCS#10 request signed by the key), and once the signer has
//! issued it serves the key (PKCS#8 `PRIVATE KEY` PEM) and the chain to
//! the projected volume; from the certificate's `beginRefreshAt` (plus a
//! jitter) it asks again with a new key while the pod keeps the old
//! credentials, until the new ones are issued. A denied or failed request is
//! final for the source, with the kubelet's Event and error. Nothing is
//! kept across a restart: every source is asked again, as the kubelet does.
//!
//! Key types: `ECDSAP256`, `ECDSAP384`, `ED25519`, `RSA3072` and `RSA4096`
//! (made on a blocking thread: an RSA key takes up to seconds), and
//! `ECDSAP521`, whose request is signed with ECDSA over SHA-512 as Go's
//! `x509` signs it (the `p521` crate: ring has no P-521 signing).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::certificates::v1::{PodCertificateRequest, PodCertificateRequestSpec};
use k8s_openapi::api::core::v1::{Node, Pod, PodCertificateProjection, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Client;
use kube::api::{Api, PostParams};

/// How long a request that cannot be read is waited for before it is taken
/// as deleted and asked again (the kubelet's `assumeDeletedThreshold`).
pub const ASSUME_DELETED_AFTER: Duration = Duration::from_secs(600);

/// How long past its refresh time a certificate is overdue (the kubelet's
/// `refreshOverdueDuration`).
pub const OVERDUE_AFTER: Duration = Duration::from_secs(600);

/// The longest refresh jitter (the kubelet's 5 minutes); a certificate with
/// less than ten times that left after `beginRefreshAt` gets a tenth of what
/// is left, so that it is refreshed before it expires.
pub const MAX_JITTER: Duration = Duration::from_secs(300);

/// The most sources one pod may hold credentials for (an API-valid pod has
/// far fewer: the API server bounds volumes and their sources).
pub const MAX_SOURCES_PER_POD: usize = 64;

/// One source: pod UID, volume name, index among the volume's sources.
pub type SourceKey = (String, String, usize);

/// A source's issued credentials: the private key (PEM) and the chain (PEM
/// `CERTIFICATE` blocks, leaf first).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// PKCS#8 `PRIVATE KEY` PEM.
    pub key: Vec<u8>,
    /// The issued chain, its blocks only.
    pub chain: Vec<u8>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("chain_bytes", &self.chain.len())
            .finish_non_exhaustive()
    }
}

/// A source's state, as the kubelet's `credState` machine.
enum State {
    /// A request is out for the first credentials.
    Wait {
        key: Vec<u8>,
        request: String,
        abandon_at: SystemTime,
    },
    /// The signer refused: final.
    Refused(String),
    /// Issued; `next` is the request out for the next ones, if any.
    Fresh {
        issued: Issued,
        next: Option<(Vec<u8>, String, SystemTime)>,
    },
}

/// Credentials in use, with when they are due for refresh and expire, and
/// which of the kubelet's Events about them were given.
struct Issued {
    creds: Credentials,
    refresh_at: SystemTime,
    not_after: SystemTime,
    overdue_said: bool,
    expired_said: bool,
}

impl Issued {
    /// The kubelet's Events, each once: `CertificateOverdueForRefresh` 10
    /// minutes past the refresh time, `CertificateExpired` past `notAfter`.
    fn say(&mut self, now: SystemTime, notices: &mut Vec<Notice>) {
        if now > self.refresh_at + OVERDUE_AFTER && !self.overdue_said {
            self.overdue_said = true;
            notices.push((
                "CertificateOverdueForRefresh".into(),
                "PodCertificate refresh overdue".into(),
            ));
        }
        if now > self.not_after && !self.expired_said {
            self.expired_said = true;
            notices.push(("CertificateExpired".into(), "PodCertificate expired".into()));
        }
    }
}

/// What the signer said of one request.
enum Outcome {
    /// Nothing yet.
    Pending,
    /// The request cannot be read, past its deadline.
    Gone,
    /// A terminal condition.
    Done(Terminal),
}

/// A request's terminal condition.
enum Terminal {
    Refused {
        kind: &'static str,
        reason: String,
        message: String,
    },
    Issued {
        chain: Vec<u8>,
        refresh_at: SystemTime,
        not_after: SystemTime,
    },
}

/// An Event the agent owes a pod (type `Warning`): reason and message.
pub type Notice = (String, String);

/// The pod certificate manager (the kubelet's podcertificate
/// `IssuingManager`): the credentials of every `podCertificate` source of
/// the node's pods.
#[derive(Default)]
pub struct PodCertificateManager {
    states: Mutex<HashMap<SourceKey, State>>,
    node_uid: Mutex<Option<String>>,
}

impl PodCertificateManager {
    /// Drives source `index` of volume `volume` of `pod` one step (asks for
    /// credentials, reads the request out, refreshes when due) and returns
    /// its credentials, with the Events the step owes the pod.
    ///
    /// # Errors
    /// The kubelet's messages: `credential bundle is not issued yet` while
    /// the signer has not answered, `PodCertificateRequest was permanently
    /// denied: reason=… message=…` (or `failed`), or the API error of a step.
    pub async fn get(
        &self,
        client: &Client,
        node_name: &str,
        pod: &Pod,
        volume: &str,
        index: usize,
        source: &PodCertificateProjection,
    ) -> (Result<Credentials, String>, Vec<Notice>) {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let key: SourceKey = (uid.clone(), volume.to_string(), index);
        let mut notices = Vec::new();
        let api: Api<PodCertificateRequest> = Api::namespaced(client.clone(), &ns);
        let now = SystemTime::now();
        let step = self.take(&key);
        let next = match step {
            None => {
                if self.count_for(&uid) >= MAX_SOURCES_PER_POD {
                    return (
                        Err(format!(
                            "more than {MAX_SOURCES_PER_POD} podCertificate sources in one pod"
                        )),
                        notices,
                    );
                }
                match self.request(client, &api, node_name, pod, source).await {
                    Ok((k, name, at)) => State::Wait {
                        key: k,
                        request: name,
                        abandon_at: at,
                    },
                    Err(e) => {
                        return (
                            Err(format!("while creating initial PodCertificateRequest: {e}")),
                            notices,
                        );
                    }
                }
            }
            Some(State::Wait {
                key: k,
                request,
                abandon_at,
            }) => match read(&api, &request, now, abandon_at).await {
                Ok(Outcome::Pending) => State::Wait {
                    key: k,
                    request,
                    abandon_at,
                },
                Ok(Outcome::Gone) => {
                    return (
                        Err(format!(
                            "PodCertificateRequest \"{ns}/{request}\" appears to have been deleted"
                        )),
                        notices,
                    );
                }
                Ok(Outcome::Done(t)) => settle(t, k, &ns, &request, &mut notices),
                Err(e) => {
                    self.put(
                        key,
                        State::Wait {
                            key: k,
                            request: request.clone(),
                            abandon_at,
                        },
                    );
                    return (
                        Err(format!(
                            "while getting PodCertificateRequest \"{ns}/{request}\": {e}"
                        )),
                        notices,
                    );
                }
            },
            Some(State::Refused(why)) => State::Refused(why),
            Some(State::Fresh { issued, next: None }) if now >= issued.refresh_at => {
                match self.request(client, &api, node_name, pod, source).await {
                    Ok(out) => State::Fresh {
                        issued,
                        next: Some(out),
                    },
                    Err(e) => {
                        tracing::warn!(pod = %format!("{ns}/{}", pod.metadata.name.as_deref().unwrap_or_default()), error = %e, "while creating refresh PodCertificateRequest");
                        State::Fresh { issued, next: None }
                    }
                }
            }
            Some(State::Fresh {
                issued,
                next: Some((k, request, abandon_at)),
            }) => match read(&api, &request, now, abandon_at).await {
                Ok(Outcome::Pending) | Err(_) => State::Fresh {
                    issued,
                    next: Some((k, request, abandon_at)),
                },
                Ok(Outcome::Gone) => State::Fresh { issued, next: None },
                Ok(Outcome::Done(t)) => settle(t, k, &ns, &request, &mut notices),
            },
            Some(fresh @ State::Fresh { .. }) => fresh,
        };
        let mut next = next;
        if let State::Fresh { issued, .. } = &mut next {
            issued.say(now, &mut notices);
        }
        let result = match &next {
            State::Wait { .. } => Err("credential bundle is not issued yet".to_string()),
            State::Refused(why) => Err(why.clone()),
            State::Fresh { issued, .. } => Ok(issued.creds.clone()),
        };
        self.put(key, next);
        (result, notices)
    }

    /// Forgets every source of pod `uid` (it has left the node).
    pub fn forget_pod(&self, uid: &str) {
        self.lock().retain(|(u, _, _), _| u != uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SourceKey, State>> {
        self.states.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take(&self, key: &SourceKey) -> Option<State> {
        self.lock().remove(key)
    }

    fn put(&self, key: SourceKey, state: State) {
        self.lock().insert(key, state);
    }

    fn count_for(&self, uid: &str) -> usize {
        self.lock().keys().filter(|(u, _, _)| u == uid).count()
    }

    /// The Node's UID, read once.
    async fn node_uid(&self, client: &Client, node_name: &str) -> Result<String, String> {
        if let Some(uid) = self
            .node_uid
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Ok(uid);
        }
        let node = Api::<Node>::all(client.clone())
            .get(node_name)
            .await
            .map_err(|e| format!("while getting node object: {e}"))?;
        let uid = node.metadata.uid.unwrap_or_default();
        *self.node_uid.lock().unwrap_or_else(PoisonError::into_inner) = Some(uid.clone());
        Ok(uid)
    }

    /// Makes a key pair and asks for its certificate, as the kubelet's
    /// `createPodCertificateRequest`: returns the key (PEM), the request's
    /// name and when it is taken as deleted if it cannot be read.
    async fn request(
        &self,
        client: &Client,
        api: &Api<PodCertificateRequest>,
        node_name: &str,
        pod: &Pod,
        source: &PodCertificateProjection,
    ) -> Result<(Vec<u8>, String, SystemTime), String> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let spec = pod.spec.as_ref();
        let sa_name = spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let sa = Api::<ServiceAccount>::namespaced(client.clone(), &ns)
            .get(&sa_name)
            .await
            .map_err(|e| format!("while fetching service account: {e}"))?;
        let node_uid = self.node_uid(client, node_name).await?;
        let key_type = source.key_type.clone();
        let (key_pem, csr) = tokio::task::spawn_blocking(move || key_and_request(&key_type))
            .await
            .map_err(|e| format!("while generating keypair: {e}"))??;
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        let pod_uid = pod.metadata.uid.clone().unwrap_or_default();
        let request = PodCertificateRequest {
            metadata: ObjectMeta {
                generate_name: Some("req-".into()),
                namespace: Some(ns),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Pod".into(),
                    name: pod_name.clone(),
                    uid: pod_uid.clone(),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: PodCertificateRequestSpec {
                signer_name: source.signer_name.clone(),
                pod_name,
                pod_uid,
                service_account_name: sa_name,
                service_account_uid: sa.metadata.uid.unwrap_or_default(),
                node_name: node_name.to_string(),
                node_uid,
                max_expiration_seconds: source.max_expiration_seconds,
                stub_pkc_s10_request: k8s_openapi::ByteString(csr),
                unverified_user_annotations: source.user_annotations.clone(),
            },
            status: None,
        };
        let made = api
            .create(&PostParams::default(), &request)
            .await
            .map_err(|e| format!("while creating on API: {e}"))?;
        let name = made.metadata.name.unwrap_or_default();
        Ok((key_pem, name, SystemTime::now() + ASSUME_DELETED_AFTER))
    }
}

/// A key pair of `key_type` and a PKCS#10 request signed by it with an
/// empty subject, as the kubelet's stub request: (the key as PKCS#8
/// `PRIVATE KEY` PEM, the request's DER).
///
/// # Errors
/// A key type this agent cannot make, by name.
pub fn key_and_request(key_type: &str) -> Result<(Vec<u8>, Vec<u8>), String> {
    let failed = |e: &dyn std::fmt::Display| format!("while generating keypair: {e}");
    let key = match key_type {
        "ECDSAP256" => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
        "ECDSAP384" => rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384),
        "ED25519" => rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519),
        "RSA3072" | "RSA4096" => {
            let bits = if key_type == "RSA3072" { 3072 } else { 4096 };
            let rsa = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, bits)
                .map_err(|e| failed(&e))?;
            let der = rsa::pkcs8::EncodePrivateKey::to_pkcs8_der(&rsa).map_err(|e| failed(&e))?;
            let der = rustls_pki_types::PrivatePkcs8KeyDer::from(der.as_bytes());
            rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&der, &rcgen::PKCS_RSA_SHA256)
        }
        "ECDSAP521" => return p521_key_and_request().map_err(|e| failed(&e)),
        other => return Err(failed(&format!("unknown key type {other:?}"))),
    }
    .map_err(|e| failed(&e))?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    let csr = params
        .serialize_request(&key)
        .map_err(|e| format!("while making the certificate request: {e}"))?;
    Ok((key.serialize_pem().into_bytes(), csr.der().to_vec()))
}

/// The object identifier of `ecdsa-with-SHA512` (RFC 5758), the signature
/// algorithm Go's `x509.CreateCertificateRequest` picks for a P-521 key.
const ECDSA_WITH_SHA512: x509_cert::spki::ObjectIdentifier =
    x509_cert::spki::ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.4");

/// [`key_and_request`] for `ECDSAP521`: a P-521 key and the stub request
/// signed with ECDSA over SHA-512.
///
/// # Errors
/// An encoding or signing failure, by its message.
fn p521_key_and_request() -> Result<(Vec<u8>, Vec<u8>), String> {
    use p521::ecdsa::signature::RandomizedSigner as _;
    use p521::pkcs8::{EncodePrivateKey as _, EncodePublicKey as _, LineEnding};
    use x509_cert::der::{Decode as _, Encode as _};
    let text = |e: &dyn std::fmt::Display| e.to_string();
    let mut rng = rsa::rand_core::OsRng;
    let signer = p521::ecdsa::SigningKey::random(&mut rng);
    let secret = p521::SecretKey::from_bytes(&signer.to_bytes()).map_err(|e| text(&e))?;
    let key_pem = secret.to_pkcs8_pem(LineEnding::LF).map_err(|e| text(&e))?;
    let spki = secret
        .public_key()
        .to_public_key_der()
        .map_err(|e| text(&e))?;
    let info = x509_cert::request::CertReqInfo {
        version: x509_cert::request::Version::V1,
        subject: x509_cert::name::Name::default(),
        public_key: x509_cert::spki::SubjectPublicKeyInfoOwned::from_der(spki.as_bytes())
            .map_err(|e| text(&e))?,
        attributes: x509_cert::attr::Attributes::default(),
    };
    let signed = info.to_der().map_err(|e| text(&e))?;
    let signature: p521::ecdsa::Signature = signer
        .try_sign_with_rng(&mut rng, &signed)
        .map_err(|e| text(&e))?;
    let request = x509_cert::request::CertReq {
        info,
        algorithm: x509_cert::spki::AlgorithmIdentifierOwned {
            oid: ECDSA_WITH_SHA512,
            parameters: None,
        },
        signature: x509_cert::der::asn1::BitString::from_bytes(signature.to_der().as_bytes())
            .map_err(|e| text(&e))?,
    };
    let der = request.to_der().map_err(|e| text(&e))?;
    Ok((key_pem.as_bytes().to_vec(), der))
}

/// The state a request's terminal outcome leads to: fresh credentials
/// with key `key`, or, refused, the final state with the kubelet's Event.
fn settle(
    outcome: Terminal,
    key: Vec<u8>,
    ns: &str,
    request: &str,
    notices: &mut Vec<Notice>,
) -> State {
    match outcome {
        Terminal::Issued {
            chain,
            refresh_at,
            not_after,
        } => State::Fresh {
            issued: Issued {
                creds: Credentials { key, chain },
                refresh_at: jittered(refresh_at, not_after),
                not_after,
                overdue_said: false,
                expired_said: false,
            },
            next: None,
        },
        Terminal::Refused {
            kind,
            reason,
            message,
        } => refused(ns, request, kind, reason, message, notices),
    }
}

/// The final state of a refused request, with the kubelet's Event.
fn refused(
    ns: &str,
    request: &str,
    kind: &'static str,
    reason: String,
    message: String,
    notices: &mut Vec<Notice>,
) -> State {
    let (verb, past) = if kind == "Denied" {
        ("was denied", "denied")
    } else {
        ("failed", "failed")
    };
    notices.push((
        kind.to_string(),
        format!(
            "PodCertificateRequest {ns}/{request} {verb}, reason={reason:?}, message={message:?}"
        ),
    ));
    State::Refused(format!(
        "PodCertificateRequest was permanently {past}: reason={reason:?} message={message:?}"
    ))
}

/// Reads request `name`: its terminal condition if any, `Gone` when it is
/// missing past `abandon_at`.
async fn read(
    api: &Api<PodCertificateRequest>,
    name: &str,
    now: SystemTime,
    abandon_at: SystemTime,
) -> Result<Outcome, String> {
    let Some(pcr) = api.get_opt(name).await.map_err(|e| e.to_string())? else {
        return Ok(if now >= abandon_at {
            Outcome::Gone
        } else {
            Outcome::Pending
        });
    };
    Ok(outcome(&pcr))
}

/// The terminal condition of a request (`Denied`, `Failed`, `Issued`), as
/// the kubelet reads it; an issued chain is kept as its PEM blocks only.
fn outcome(pcr: &PodCertificateRequest) -> Outcome {
    let Some(status) = pcr.status.as_ref() else {
        return Outcome::Pending;
    };
    for c in status.conditions.iter().flatten() {
        match c.type_.as_str() {
            "Denied" | "Failed" => {
                return Outcome::Done(Terminal::Refused {
                    kind: if c.type_ == "Denied" {
                        "Denied"
                    } else {
                        "Failed"
                    },
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                });
            }
            "Issued" => {
                let time = |t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
                    t.map_or(SystemTime::UNIX_EPOCH, |t| SystemTime::from(t.0))
                };
                return Outcome::Done(Terminal::Issued {
                    chain: clean_chain(status.certificate_chain.as_deref().unwrap_or_default()),
                    refresh_at: time(status.begin_refresh_at.as_ref()),
                    not_after: time(status.not_after.as_ref()),
                });
            }
            _ => {}
        }
    }
    Outcome::Pending
}

/// The PEM blocks of `chain`, headers and text between blocks dropped, with
/// LF line ends (the kubelet's `cleanCertificateChain`, Go's `pem.Encode`).
#[must_use]
pub fn clean_chain(chain: &str) -> Vec<u8> {
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    pem::parse_many(chain)
        .unwrap_or_default()
        .iter()
        .map(|b| pem::encode_config(&pem::Pem::new(b.tag(), b.contents()), config))
        .collect::<String>()
        .into_bytes()
}

/// `refresh_at` plus a jitter of up to [`MAX_JITTER`], at most a tenth of
/// the time from `refresh_at` to `not_after`.
fn jittered(refresh_at: SystemTime, not_after: SystemTime) -> SystemTime {
    let left = not_after.duration_since(refresh_at).unwrap_or_default();
    let bound = MAX_JITTER.min(left / 10);
    let nanos = u64::try_from(bound.as_nanos()).unwrap_or(u64::MAX);
    let spread = match (nanos, getrandom::u64()) {
        (0, _) | (_, Err(_)) => 0,
        (n, Ok(r)) => r % n,
    };
    refresh_at + Duration::from_nanos(spread)
}

/// The files of a `podCertificate` source, as the kubelet's projected
/// volume writes them: the key followed by the chain at
/// `credentialBundlePath`, the key at `keyPath`, the chain at
/// `certificateChainPath`, those that are set.
#[must_use]
pub fn files(source: &PodCertificateProjection, creds: &Credentials) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    if let Some(p) = source
        .credential_bundle_path
        .as_ref()
        .filter(|p| !p.is_empty())
    {
        let mut bundle = creds.key.clone();
        bundle.extend_from_slice(&creds.chain);
        out.insert(p.clone(), bundle);
    }
    if let Some(p) = source.key_path.as_ref().filter(|p| !p.is_empty()) {
        out.insert(p.clone(), creds.key.clone());
    }
    if let Some(p) = source
        .certificate_chain_path
        .as_ref()
        .filter(|p| !p.is_empty())
    {
        out.insert(p.clone(), creds.chain.clone());
    }
    out
}

/// The `podCertificate` sources of `pod`: (volume name, source index, the
/// source).
#[must_use]
pub fn sources(pod: &Pod) -> Vec<(String, usize, PodCertificateProjection)> {
    let mut out = Vec::new();
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        for (i, s) in v
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
            .enumerate()
        {
            if let Some(pc) = &s.pod_certificate {
                out.push((v.name.clone(), i, pc.clone()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_requests_of_each_supported_type() {
        use x509_parser::prelude::FromDer as _;
        for t in ["ECDSAP256", "ECDSAP384", "ED25519", "RSA3072"] {
            let (key, csr) = key_and_request(t).unwrap();
            let key = String::from_utf8(key).unwrap();
            assert!(key.starts_with("-----BEGIN PRIVATE KEY-----"), "{t}");
            let parsed =
                x509_parser::certification_request::X509CertificationRequest::from_der(&csr);
            let (_, req) = parsed.unwrap_or_else(|e| panic!("{t}: {e}"));
            req.verify_signature().unwrap();
            assert_eq!(
                req.certification_request_info.subject.iter().count(),
                0,
                "empty subject"
            );
        }
        // P-521, which ring cannot verify: the request's signature is
        // checked with the key it names, over SHA-512.
        let (key, csr) = key_and_request("ECDSAP521").unwrap();
        let key = String::from_utf8(key).unwrap();
        assert!(key.starts_with("-----BEGIN PRIVATE KEY-----\n"), "{key}");
        let (_, req) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&csr).unwrap();
        assert_eq!(
            req.signature_algorithm.algorithm.to_id_string(),
            "1.2.840.10045.4.3.4"
        );
        let info = &req.certification_request_info;
        assert_eq!(info.subject.iter().count(), 0, "empty subject");
        let public =
            p521::ecdsa::VerifyingKey::from_sec1_bytes(&info.subject_pki.subject_public_key.data)
                .unwrap();
        let signature = p521::ecdsa::Signature::from_der(&req.signature_value.data).unwrap();
        use p521::ecdsa::signature::Verifier as _;
        public.verify(info.raw, &signature).unwrap();
        let mut tampered = info.raw.to_vec();
        tampered[10] ^= 1;
        assert!(public.verify(&tampered, &signature).is_err());
        use p521::pkcs8::DecodePrivateKey as _;
        let secret = p521::SecretKey::from_pkcs8_pem(&key).unwrap();
        assert_eq!(
            secret.public_key().to_sec1_bytes().as_ref(),
            &info.subject_pki.subject_public_key.data[..],
            "the key is the request's"
        );
        assert!(
            key_and_request("DSA")
                .unwrap_err()
                .contains("unknown key type")
        );
    }

    #[test]
    fn a_chain_is_kept_as_its_blocks_and_written_where_asked() {
        let ca = rcgen::generate_simple_self_signed(vec!["x".into()]).unwrap();
        let block = ca.cert.pem();
        let messy = format!("junk before\n{block}between\n{block}");
        let clean = String::from_utf8(clean_chain(&messy)).unwrap();
        assert_eq!(clean.matches("BEGIN CERTIFICATE").count(), 2);
        assert!(!clean.contains("junk") && !clean.contains("between"));
        let creds = Credentials {
            key: b"KEY\n".to_vec(),
            chain: b"CHAIN\n".to_vec(),
        };
        let source = PodCertificateProjection {
            credential_bundle_path: Some("bundle.pem".into()),
            key_path: Some("key.pem".into()),
            certificate_chain_path: Some("chain.pem".into()),
            ..Default::default()
        };
        let f = files(&source, &creds);
        assert_eq!(f["bundle.pem"], b"KEY\nCHAIN\n");
        assert_eq!(f["key.pem"], b"KEY\n");
        assert_eq!(f["chain.pem"], b"CHAIN\n");
        let only = PodCertificateProjection {
            credential_bundle_path: Some("b".into()),
            ..Default::default()
        };
        assert_eq!(files(&only, &creds).len(), 1);
    }

    /// Issues (or refuses, with `refused`) request `name` in the fake API,
    /// with `beginRefreshAt` 2 s ago and `notAfter` a second later (a jitter
    /// of at most 0.1 s: due at once); returns the chain given.
    fn answer(fake: &crate::fake_api::FakeApi, name: &str, refused: Option<&str>) -> String {
        let mut pcr = fake
            .object("podcertificaterequests", "default", name)
            .expect("request");
        let now = k8s_openapi::jiff::Timestamp::now();
        let at = |secs: i64| {
            now.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs))
                .unwrap()
                .to_string()
        };
        let chain = rcgen::generate_simple_self_signed(vec![name.into()])
            .unwrap()
            .cert
            .pem();
        pcr["status"] = match refused {
            Some(kind) => serde_json::json!({ "conditions": [{ "type": kind, "status": "True",
                "reason": "NoWay", "message": "not for you", "lastTransitionTime": at(0) }] }),
            None => serde_json::json!({ "conditions": [{ "type": "Issued", "status": "True",
                "reason": "Signed", "message": "ok", "lastTransitionTime": at(0) }],
                "certificateChain": chain, "notBefore": at(-60), "beginRefreshAt": at(-2),
                "notAfter": at(-1) }),
        };
        fake.put_in("podcertificaterequests", "default", name, pcr);
        chain
    }

    /// A fake API server holding node `n1` and the `default` service
    /// account, its client, and pod `default/p` (UID `pod-uid`).
    fn api_with_pod() -> (crate::fake_api::FakeApi, Client, Pod) {
        let fake = crate::fake_api::FakeApi::default();
        fake.put_node("n1");
        fake.put(
            "serviceaccounts",
            "default",
            serde_json::json!({ "metadata": { "name": "default", "uid": "sa-uid" } }),
        );
        let client = fake.client();
        let mut pod = crate::fixtures::pod("p").container("c", "x").build();
        pod.metadata.namespace = Some("default".into());
        pod.metadata.uid = Some("pod-uid".into());
        (fake, client, pod)
    }

    /// The state machine against a fake API server: a request for the
    /// pod, its service account and the node; pending until issued; the
    /// credentials; from `beginRefreshAt` a second request with a new key
    /// while the first credentials stay; then the second ones. A denied
    /// source is final, with the kubelet's Event and error, and asks no
    /// more. A pod's sources go when it is forgotten.
    #[tokio::test]
    async fn sources_are_requested_issued_refreshed_and_refused() {
        let (fake, client, pod) = api_with_pod();
        let source = PodCertificateProjection {
            signer_name: "example.com/signer".into(),
            key_type: "ECDSAP256".into(),
            credential_bundle_path: Some("bundle.pem".into()),
            ..Default::default()
        };
        let certs = PodCertificateManager::default();
        let get = |index| certs.get(&client, "n1", &pod, "v", index, &source);

        let (got, notices) = get(0).await;
        assert_eq!(got.unwrap_err(), "credential bundle is not issued yet");
        assert!(notices.is_empty());
        let made: Vec<_> = fake
            .take_requests()
            .into_iter()
            .filter(|r| r.method == "POST")
            .collect();
        assert_eq!(made.len(), 1, "{made:?}");
        let spec = &made[0].body["spec"];
        assert_eq!(spec["podUID"], "pod-uid");
        assert_eq!(spec["serviceAccountUID"], "sa-uid");
        assert_eq!(spec["nodeName"], "n1");
        assert_eq!(spec["nodeUID"], "node-uid-n1");
        assert_eq!(spec["signerName"], "example.com/signer");
        assert!(
            spec["stubPKCS10Request"]
                .as_str()
                .is_some_and(|s| !s.is_empty())
        );
        assert_eq!(
            made[0].body["metadata"]["ownerReferences"][0]["uid"],
            "pod-uid"
        );
        let first = format!("req-{}", 1);
        let first = if fake
            .object("podcertificaterequests", "default", &first)
            .is_some()
        {
            first
        } else {
            let stored = fake.take_requests();
            panic!("no request {first}: {stored:?}");
        };
        // Still pending: read, not asked again.
        assert!(get(0).await.0.is_err());
        assert!(fake.take_requests().iter().all(|r| r.method == "GET"));

        let chain1 = answer(&fake, &first, None);
        let (creds1, notices) = get(0).await;
        let creds1 = creds1.unwrap();
        // Issued already past its notAfter: said once.
        assert_eq!(
            notices,
            [(
                "CertificateExpired".to_string(),
                "PodCertificate expired".to_string()
            )]
        );
        assert_eq!(String::from_utf8(creds1.chain.clone()).unwrap(), chain1);
        assert!(String::from_utf8_lossy(&creds1.key).starts_with("-----BEGIN PRIVATE KEY-----"));
        // Due for refresh: a new request, the old credentials meanwhile.
        fake.take_requests();
        assert_eq!(get(0).await.0.unwrap(), creds1);
        let posts: Vec<String> = fake
            .take_requests()
            .into_iter()
            .filter(|r| r.method == "POST")
            .map(|r| r.path)
            .collect();
        assert_eq!(posts.len(), 1, "one refresh request");
        let (still, notices) = get(0).await;
        assert_eq!(still.unwrap(), creds1, "pending: the old credentials");
        assert!(notices.is_empty(), "expiry said once: {notices:?}");
        let second = (2..100)
            .map(|n| format!("req-{n}"))
            .find(|n| {
                fake.object("podcertificaterequests", "default", n)
                    .is_some()
            })
            .expect("the refresh request");
        let chain2 = answer(&fake, &second, None);
        let creds2 = get(0).await.0.unwrap();
        assert_eq!(String::from_utf8(creds2.chain.clone()).unwrap(), chain2);
        assert_ne!(creds2.key, creds1.key, "a new key");

        // Another source, denied: final, with the kubelet's words.
        assert!(get(1).await.0.is_err());
        let third = (2..100)
            .map(|n| format!("req-{n}"))
            .filter(|n| *n != second)
            .find(|n| {
                fake.object("podcertificaterequests", "default", n)
                    .is_some()
            })
            .expect("the third request");
        answer(&fake, &third, Some("Denied"));
        let (got, notices) = get(1).await;
        assert_eq!(
            got.unwrap_err(),
            "PodCertificateRequest was permanently denied: reason=\"NoWay\" message=\"not for you\""
        );
        assert_eq!(notices.len(), 1);
        assert_eq!(notices[0].0, "Denied");
        assert!(
            notices[0]
                .1
                .contains(&format!("PodCertificateRequest default/{third} was denied"))
        );
        fake.take_requests();
        assert!(get(1).await.0.is_err());
        assert!(
            fake.take_requests().is_empty(),
            "a refused source asks nothing"
        );

        certs.forget_pod("pod-uid");
        assert_eq!(certs.count_for("pod-uid"), 0);
    }

    /// Hostile sources: an unknown key type fails by name and asks nothing;
    /// past [`MAX_SOURCES_PER_POD`] sources a pod gets no more requests.
    #[tokio::test]
    async fn hostile_sources_are_bounded() {
        let (fake, client, pod) = api_with_pod();
        let certs = PodCertificateManager::default();
        let odd = PodCertificateProjection {
            signer_name: "x".repeat(100_000),
            key_type: "\u{0}DSA".repeat(1000),
            ..Default::default()
        };
        let (got, _) = certs.get(&client, "n1", &pod, "v", 0, &odd).await;
        assert!(got.unwrap_err().contains("unknown key type"));
        fake.take_requests();
        let source = PodCertificateProjection {
            signer_name: "example.com/s".into(),
            key_type: "ED25519".into(),
            ..Default::default()
        };
        for i in 0..MAX_SOURCES_PER_POD {
            let (got, _) = certs.get(&client, "n1", &pod, "v", i, &source).await;
            assert_eq!(got.unwrap_err(), "credential bundle is not issued yet");
        }
        let made = fake
            .take_requests()
            .iter()
            .filter(|r| r.method == "POST")
            .count();
        assert_eq!(made, MAX_SOURCES_PER_POD);
        let (got, _) = certs
            .get(&client, "n1", &pod, "v", MAX_SOURCES_PER_POD, &source)
            .await;
        assert!(
            got.unwrap_err()
                .contains("more than 64 podCertificate sources")
        );
        assert!(fake.take_requests().iter().all(|r| r.method != "POST"));
        // A chain that is not PEM is no chain, and no panic.
        assert!(clean_chain(&"-----BEGIN CERTIFICATE-----\n%%%".repeat(10_000)).is_empty());
    }

    /// The kubelet's Events about credentials in use, each once.
    #[test]
    fn overdue_and_expired_credentials_are_said_once() {
        let now = SystemTime::now();
        let mut issued = Issued {
            creds: Credentials {
                key: Vec::new(),
                chain: Vec::new(),
            },
            refresh_at: now - Duration::from_secs(300),
            not_after: now + Duration::from_secs(3600),
            overdue_said: false,
            expired_said: false,
        };
        let mut notices = Vec::new();
        issued.say(now, &mut notices);
        assert!(notices.is_empty(), "5 minutes late is not overdue");
        issued.say(now + Duration::from_secs(301), &mut notices);
        issued.say(now + Duration::from_secs(400), &mut notices);
        assert_eq!(notices.len(), 1);
        assert_eq!(notices[0].0, "CertificateOverdueForRefresh");
        issued.say(now + Duration::from_secs(3601), &mut notices);
        issued.say(now + Duration::from_secs(3700), &mut notices);
        assert_eq!(notices.len(), 2);
        assert_eq!(
            notices[1],
            ("CertificateExpired".into(), "PodCertificate expired".into())
        );
    }

    #[test]
    fn refresh_jitter_stays_within_a_tenth_of_what_is_left() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        for left in [0u64, 60, 600, 36_000] {
            let at = jittered(t0, t0 + Duration::from_secs(left));
            let j = at.duration_since(t0).unwrap();
            assert!(
                j <= MAX_JITTER.min(Duration::from_secs(left) / 10),
                "{left}: {j:?}"
            );
        }
        assert_eq!(jittered(t0, t0 - Duration::from_secs(5)), t0);
    }
}
