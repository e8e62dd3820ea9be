//! No secret in the agent's log, on the local cluster (`hack/local-up.sh
//! --agent rustlet`): an image pull secret whose docker config is valid JSON
//! but not a docker config (the API server accepts it) is reported and skipped
//! without its content reaching `_output/local/logs/rustlet.log`.

use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::PostParams;

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_malformed_pull_secret_never_reaches_the_agent_log() {
    let client = client().await;
    let ns = namespace(&client, "e2e-redact").await;
    let password = format!("hunter2-{ns}");
    let secret: Secret = from_json(serde_json::json!({
        "metadata": { "name": "creds" },
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {
            ".dockerconfigjson": format!(r#"{{"auths": "{password}"}}"#)
        }
    }));
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("create secret");
    // Nothing listens on port 1 of loopback: the pull fails at once, after
    // the pull secrets were read.
    let mut p = pod("pull", "Never", "127.0.0.1:1/none:1", &["true"]);
    let spec = p.spec.as_mut().expect("spec");
    spec.image_pull_secrets = Some(vec![from_json(serde_json::json!({ "name": "creds" }))]);
    create(&client, &ns, &p).await;
    wait_for(
        &client,
        &ns,
        "pull",
        60,
        "ErrImagePull",
        waiting_reason("ErrImagePull"),
    )
    .await;
    // The skipped secret is logged (by name) before the pull fails.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut log = agent_log();
    while !log.contains("image pull secret not used") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        log = agent_log();
    }
    drop_namespace(&client, &ns).await;
    assert!(
        log.contains("image pull secret not used"),
        "the secret was never reported as skipped"
    );
    let leaked: Vec<&str> = log.lines().filter(|l| l.contains(&password)).collect();
    assert!(
        leaked.is_empty(),
        "the secret is in the agent log: {leaked:#?}"
    );
}
