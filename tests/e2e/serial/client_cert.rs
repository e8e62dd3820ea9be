//! Client certificate rotation on the local cluster (`hack/local-up.sh
//! --agent rustlet`, which sets `rotateCertificates: true` and binds
//! `selfnodeclient` to `system:nodes`, as kubeadm does): the agent is
//! restarted with a node certificate that is due for renewal and expires a
//! couple of minutes later. It asks the certificates API for a new one, the
//! controller-manager approves and signs it, and the agent keeps reaching the
//! API server after the old certificate has expired: its Lease is renewed.

use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::ListParams;

/// The CN of the certificate in `pem` and its expiry (seconds since the epoch).
fn subject_and_expiry(pem: &str) -> (String, i64) {
    let der =
        rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).expect("a certificate");
    let (_, cert) = x509_parser::parse_x509_certificate(&der).expect("x509");
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())
        .unwrap_or_default()
        .to_string();
    (cn, cert.validity().not_after.timestamp())
}

use rustls_pki_types::pem::PemObject as _;

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_due_client_certificate_is_renewed_and_the_agent_goes_on_after_it_expires() {
    let client = client().await;
    let node = node_name();
    let pki = local().join("pki");
    let store = local().join("rustlet/pki");
    // A node certificate of the cluster CA, valid from 20 minutes ago until
    // 75 s from now: past 80 % of its life, so due now (the restart below
    // must not outlast it, or the agent starts on the kubeconfig's).
    let ca_pem = std::fs::read_to_string(pki.join("ca.crt")).expect("cluster CA");
    let ca_key =
        rcgen::KeyPair::from_pem(&std::fs::read_to_string(pki.join("ca.key")).expect("CA key"))
            .expect("CA key");
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca_pem, ca_key).expect("CA");
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::minutes(20);
    params.not_after = now + time::Duration::seconds(75);
    let short = params.signed_by(&key, &issuer).expect("sign");
    let short_pem = format!("{}{}", short.pem(), key.serialize_pem());
    std::fs::create_dir_all(&store).expect("cert dir");
    let short_path = store.join("kubelet-client-e2e-short.pem");
    std::fs::write(&short_path, &short_pem).expect("write");
    let current = store.join("kubelet-client-current.pem");
    let _ = std::fs::remove_file(&current);
    std::os::unix::fs::symlink(&short_path, &current).expect("link");
    let expires = subject_and_expiry(&short_pem).1;

    // Restarted, the agent starts with it.
    let csrs: Api<CertificateSigningRequest> = Api::all(client.clone());
    let before: Vec<String> = csrs
        .list(&ListParams::default())
        .await
        .expect("csrs")
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect();
    let restart = Instant::now();
    kill_and_restart_agent();
    let left = expires - time::OffsetDateTime::now_utc().unix_timestamp();
    assert!(
        left > 30,
        "the agent's restart took {:?}: the due certificate expires in {left} s, too soon to see it renewed",
        restart.elapsed()
    );

    // It renews at once: a new file, linked, of a new certificate for the node.
    let deadline = Instant::now() + Duration::from_secs(60);
    let renewed = loop {
        let target = std::fs::read_link(&current).unwrap_or_default();
        if target != short_path && target.exists() {
            break target;
        }
        assert!(Instant::now() < deadline, "no renewal within 60 s");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let (cn, until) = subject_and_expiry(&std::fs::read_to_string(&renewed).expect("renewed"));
    assert_eq!(cn, format!("system:node:{node}"));
    assert!(until > expires + 3600, "a full-length certificate");
    let mine: Vec<CertificateSigningRequest> = csrs
        .list(&ListParams::default())
        .await
        .expect("csrs")
        .items
        .into_iter()
        .filter(|c| !before.contains(c.metadata.name.as_ref().unwrap_or(&String::new())))
        .filter(|c| c.spec.username.as_deref() == Some(&format!("system:node:{node}")))
        .filter(|c| c.spec.signer_name == "kubernetes.io/kube-apiserver-client-kubelet")
        .collect();
    assert_eq!(
        mine.len(),
        1,
        "one new request of the node for its client certificate"
    );
    let approved = mine[0]
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Approved"));
    assert!(
        approved,
        "approved by the controller-manager (selfnodeclient)"
    );

    // After the first certificate expired, the agent still renews its Lease:
    // it no longer uses that certificate on any connection.
    let wait = expires - time::OffsetDateTime::now_utc().unix_timestamp() + 5;
    tokio::time::sleep(Duration::from_secs(u64::try_from(wait.max(0)).unwrap_or(0))).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renew = |l: Lease| l.spec.and_then(|s| s.renew_time).expect("renewTime").0;
    let first = renew(leases.get(&node).await.expect("lease"));
    let deadline = Instant::now() + Duration::from_secs(30);
    while renew(leases.get(&node).await.expect("lease")) <= first {
        assert!(
            Instant::now() < deadline,
            "the Lease was not renewed in 30 s after the old certificate expired"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        std::path::Path::new(&format!("/proc/{}", agent_pid())).exists(),
        "the agent runs"
    );
    let _ = std::fs::remove_file(&short_path);
}
