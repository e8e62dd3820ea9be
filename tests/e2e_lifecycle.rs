//! End-to-end scenarios of the pod lifecycle on the local cluster
//! (`hack/local-up.sh --agent rustlet`): init containers, the container
//! environment with `$(VAR)` expansion and ConfigMap/Secret sources,
//! termination messages, and the runAsNonRoot check.

mod common;

use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::PostParams;
use kube::{Api, ResourceExt};

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("valid object")
}

/// Waits for the container log of the first attempt of `container` to contain `want`.
async fn log_contains(ns: &str, pod: &Pod, container: &str, want: &str) {
    let path = local().join(format!(
        "pod-logs/{ns}_{}_{}/{container}/0.log",
        pod.name_any(),
        pod.uid().unwrap()
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.contains(want) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} does not contain {want:?}: {text:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn init_containers_run_in_order_before_the_main_container() {
    let client = client().await;
    let ns = namespace(&client, "e2e-init").await;
    let p: Pod = from_json(serde_json::json!({
        "metadata": { "name": "init" },
        "spec": {
            "restartPolicy": "Always",
            "initContainers": [
                { "name": "i1", "image": BUSYBOX, "command": ["sh", "-c", "echo first"] },
                { "name": "i2", "image": BUSYBOX, "command": ["sh", "-c", "echo second"] }
            ],
            "containers": [{ "name": "c", "image": BUSYBOX, "command": ["sleep", "3600"] }]
        }
    }));
    let created = create(&client, &ns, &p).await;
    let running = wait_for(&client, &ns, "init", 60, "Running", phase("Running")).await;
    let st = running.status.unwrap();
    let inits = st.init_container_statuses.expect("initContainerStatuses");
    for i in &inits {
        let t = i
            .state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .expect("terminated");
        assert_eq!(
            (t.exit_code, t.reason.as_deref()),
            (0, Some("Completed")),
            "{}",
            i.name
        );
        assert!(i.ready);
    }
    let (f1, s2) = (
        inits[0]
            .state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .finished_at
            .clone()
            .unwrap(),
        inits[1]
            .state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .started_at
            .clone()
            .unwrap(),
    );
    assert!(f1.0 <= s2.0, "i2 started after i1 finished");
    let initialized = st
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Initialized")
        .unwrap();
    assert_eq!(initialized.status, "True");
    log_contains(&ns, &created, "i2", "second").await;

    // A failing init container under restartPolicy Never fails the pod; the app never starts.
    let failing: Pod = from_json(serde_json::json!({
        "metadata": { "name": "init-fails" },
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [{ "name": "i1", "image": BUSYBOX, "command": ["sh", "-c", "exit 7"] }],
            "containers": [{ "name": "c", "image": BUSYBOX, "command": ["sleep", "3600"] }]
        }
    }));
    create(&client, &ns, &failing).await;
    let failed = wait_for(&client, &ns, "init-fails", 60, "Failed", phase("Failed")).await;
    let st = failed.status.unwrap();
    let init = &st.init_container_statuses.unwrap()[0];
    assert_eq!(
        init.state
            .as_ref()
            .unwrap()
            .terminated
            .as_ref()
            .unwrap()
            .exit_code,
        7
    );
    let app = &st.container_statuses.unwrap()[0];
    assert_eq!(
        app.state
            .as_ref()
            .unwrap()
            .waiting
            .as_ref()
            .and_then(|w| w.reason.as_deref()),
        Some("PodInitializing")
    );
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn environment_expands_and_reads_configmaps_and_secrets() {
    let client = client().await;
    let ns = namespace(&client, "e2e-env").await;
    let cm: ConfigMap = from_json(
        serde_json::json!({ "metadata": { "name": "cfg" }, "data": { "color": "blue", "size": "L" } }),
    );
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let secret: Secret = from_json(
        serde_json::json!({ "metadata": { "name": "sec" }, "stringData": { "password": "hunter2" } }),
    );
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let p: Pod = from_json(serde_json::json!({
        "metadata": { "name": "env" },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "c",
                "image": BUSYBOX,
                "command": ["sh", "-c", "echo \"out: $(GREETING) $COLOR $CFG_size $PASSWORD $POD_NAME $0\"", "$$(GREETING)"],
                "envFrom": [{ "prefix": "CFG_", "configMapRef": { "name": "cfg" } }],
                "env": [
                    { "name": "WHO", "value": "world" },
                    { "name": "GREETING", "value": "hello-$(WHO)" },
                    { "name": "COLOR", "valueFrom": { "configMapKeyRef": { "name": "cfg", "key": "color" } } },
                    { "name": "PASSWORD", "valueFrom": { "secretKeyRef": { "name": "sec", "key": "password" } } },
                    { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } }
                ]
            }]
        }
    }));
    let created = create(&client, &ns, &p).await;
    wait_for(&client, &ns, "env", 60, "Succeeded", phase("Succeeded")).await;
    log_contains(
        &ns,
        &created,
        "c",
        "out: hello-world blue L hunter2 env $(GREETING)",
    )
    .await;

    // A missing ConfigMap key: the container waits with CreateContainerConfigError.
    let missing: Pod = from_json(serde_json::json!({
        "metadata": { "name": "missing" },
        "spec": { "containers": [{
            "name": "c", "image": BUSYBOX, "command": ["true"],
            "env": [{ "name": "X", "valueFrom": { "configMapKeyRef": { "name": "cfg", "key": "nope" } } }]
        }] }
    }));
    create(&client, &ns, &missing).await;
    let waiting = wait_for(
        &client,
        &ns,
        "missing",
        60,
        "CreateContainerConfigError",
        waiting_reason("CreateContainerConfigError"),
    )
    .await;
    let w = container_status(&waiting).state.unwrap().waiting.unwrap();
    assert_eq!(
        w.message.as_deref(),
        Some(format!("couldn't find key nope in ConfigMap {ns}/cfg").as_str())
    );
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn termination_messages_from_file_and_logs() {
    let client = client().await;
    let ns = namespace(&client, "e2e-term").await;
    let pod = |name: &str, policy: &str, script: &str| -> Pod {
        from_json(serde_json::json!({
            "metadata": { "name": name },
            "spec": { "restartPolicy": "Never", "containers": [{
                "name": "c", "image": BUSYBOX, "command": ["sh", "-c", script],
                "terminationMessagePolicy": policy
            }] }
        }))
    };
    create(
        &client,
        &ns,
        &pod("file", "File", "printf DONE > /dev/termination-log; exit 1"),
    )
    .await;
    create(
        &client,
        &ns,
        &pod("logs", "FallbackToLogsOnError", "echo from-the-log; exit 2"),
    )
    .await;
    let message = |p: &Pod| {
        container_status(p)
            .state
            .unwrap()
            .terminated
            .unwrap()
            .message
            .unwrap_or_default()
    };
    let file = wait_for(&client, &ns, "file", 60, "Failed", phase("Failed")).await;
    assert_eq!(message(&file), "DONE");
    let logs = wait_for(&client, &ns, "logs", 60, "Failed", phase("Failed")).await;
    assert_eq!(message(&logs), "from-the-log\n");
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn run_as_non_root_refuses_root() {
    let client = client().await;
    let ns = namespace(&client, "e2e-nonroot").await;
    let p: Pod = from_json(serde_json::json!({
        "metadata": { "name": "root" },
        "spec": {
            "securityContext": { "runAsNonRoot": true },
            "containers": [{
                "name": "c", "image": BUSYBOX, "command": ["sleep", "3600"],
                "securityContext": { "runAsUser": 0 }
            }]
        }
    }));
    create(&client, &ns, &p).await;
    let refused = wait_for(
        &client,
        &ns,
        "root",
        60,
        "refused",
        waiting_reason("CreateContainerConfigError"),
    )
    .await;
    let w = container_status(&refused).state.unwrap().waiting.unwrap();
    assert!(
        w.message
            .unwrap()
            .contains("runAsUser breaks non-root policy")
    );
    // With a non-root user it runs.
    let ok: Pod = from_json(serde_json::json!({
        "metadata": { "name": "nonroot" },
        "spec": {
            "securityContext": { "runAsNonRoot": true, "runAsUser": 1234 },
            "containers": [{ "name": "c", "image": BUSYBOX, "command": ["sh", "-c", "id -u; sleep 3600"] }]
        }
    }));
    let created = create(&client, &ns, &ok).await;
    wait_for(&client, &ns, "nonroot", 60, "Running", phase("Running")).await;
    log_contains(&ns, &created, "c", "1234").await;
    drop_namespace(&client, &ns).await;
}
