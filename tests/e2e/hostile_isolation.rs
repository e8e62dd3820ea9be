//! End-to-end: no pod runs with less isolation than it asked for (issue 14,
//! class 4). A pod with `hostUsers: false` never runs in the host's user
//! namespace; a pod whose RuntimeClass does not exist, or names a handler the
//! runtime does not have, never gets a sandbox; a seccomp `Localhost` profile
//! is read from `<root-dir>/seccomp`; an AppArmor profile on a node without
//! AppArmor is refused at admission. Run against the local cluster:
//! `cargo test --test e2e_hostile_isolation -- --ignored`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};

/// Waits up to 60 s for the pod's `FailedCreatePodSandBox` events; returns
/// their messages.
async fn sandbox_failures(client: &Client, ns: &str, uid: &str) -> Vec<String> {
    wait_for_events(
        client,
        ns,
        Involving::Uid(uid),
        60,
        "a FailedCreatePodSandBox event",
        |e| messages(e, "FailedCreatePodSandBox"),
    )
    .await
}

/// How many sandboxes containerd holds for pod `uid`.
async fn sandboxes(uid: &str) -> usize {
    runtime()
        .await
        .list_pod_sandboxes(HashMap::from([(
            "io.kubernetes.pod.uid".to_string(),
            uid.to_string(),
        )]))
        .await
        .expect("list sandboxes")
        .len()
}

/// Deletes the pod at once, so that the namespace goes quickly.
async fn drop_pod(client: &Client, ns: &str, name: &str) {
    let _ = Api::<Pod>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default().grace_period(0))
        .await;
}

/// A RuntimeClass `name` with CRI handler `handler`.
async fn runtime_class(client: &Client, name: &str, handler: &str) {
    let rc: RuntimeClass = from_json(serde_json::json!({
        "metadata": { "name": name }, "handler": handler
    }));
    Api::<RuntimeClass>::all(client.clone())
        .create(&PostParams::default(), &rc)
        .await
        .expect("create RuntimeClass");
}

/// Watches pod `uid` for `secs`: it never gets a sandbox, and its first
/// container is never running.
async fn never_runs(client: &Client, ns: &str, name: &str, uid: &str, secs: u64) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        assert_eq!(sandboxes(uid).await, 0, "pod {ns}/{name} got a sandbox");
        let p = api.get(name).await.expect("get pod");
        let running = p
            .status
            .and_then(|s| s.container_statuses)
            .into_iter()
            .flatten()
            .any(|c| c.state.and_then(|s| s.running).is_some());
        assert!(!running, "pod {ns}/{name} runs");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
#[ignore = "needs the local cluster (hack/local-up.sh)"]
async fn host_users_false_never_runs_in_the_host_user_namespace() {
    let client = client().await;
    let ns = namespace(&client, "e2e-userns").await;
    // What the node's runtime says it can do for the default handler.
    let status = runtime().await.status().await.expect("CRI Status");
    let supported = status
        .runtime_handlers
        .iter()
        .find(|h| h.name.is_empty())
        .and_then(|h| h.features.as_ref())
        .is_some_and(|f| f.user_namespaces);
    let mut p = pod(
        "userns",
        "Never",
        BUSYBOX,
        &["sh", "-c", "cat /proc/self/uid_map"],
    );
    p.spec.as_mut().unwrap().host_users = Some(false);
    let created = create(&client, &ns, &p).await;
    let uid = created.metadata.uid.clone().unwrap();
    eprintln!("the runtime's default handler supports user namespaces: {supported}");
    if supported {
        // It runs, in a user namespace of its own: uid 0 inside is not uid 0 outside.
        wait_for(&client, &ns, "userns", 90, "Succeeded", phase("Succeeded")).await;
        let log = std::fs::read_to_string(log_path(&ns, "userns", &uid, "c")).expect("log");
        let map = log
            .lines()
            .filter_map(|l| l.splitn(4, ' ').nth(3))
            .collect::<Vec<_>>()
            .join("\n");
        let fields: Vec<&str> = map.split_whitespace().collect();
        assert_eq!(fields.len(), 3, "one mapping: {map:?}");
        assert_eq!(fields[0], "0", "{map:?}");
        assert_ne!(fields[1], "0", "container root is host root: {map:?}");
        assert_eq!(fields[2], "65536", "the kubelet's range: {map:?}");
    } else {
        // It fails with the kubelet's reason, and never runs at all.
        let msgs = sandbox_failures(&client, &ns, &uid).await;
        assert!(
            msgs.iter()
                .any(|m| m.contains("does not support user namespaces")),
            "{msgs:?}"
        );
        never_runs(&client, &ns, "userns", &uid, 5).await;
    }
    drop_pod(&client, &ns, "userns").await;
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster (hack/local-up.sh)"]
async fn a_runtime_class_that_does_not_exist_never_runs() {
    let client = client().await;
    let ns = namespace(&client, "e2e-rc-missing").await;
    // The API server refuses a pod whose RuntimeClass does not exist, so the
    // class exists when the pod is made and is gone when the node sees it:
    // a scheduling gate holds the pod until then.
    let class = ns.clone();
    runtime_class(&client, &class, "runc").await;
    let mut p = pod("gone", "Never", BUSYBOX, &["true"]);
    let spec = p.spec.as_mut().unwrap();
    spec.runtime_class_name = Some(class.clone());
    spec.scheduling_gates = Some(vec![from_json(serde_json::json!({ "name": "e2e/hold" }))]);
    let created = create(&client, &ns, &p).await;
    let uid = created.metadata.uid.clone().unwrap();
    Api::<RuntimeClass>::all(client.clone())
        .delete(&class, &DeleteParams::default())
        .await
        .expect("delete RuntimeClass");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let ungate = serde_json::json!({ "spec": { "schedulingGates": null } });
    pods.patch("gone", &PatchParams::default(), &Patch::Merge(&ungate))
        .await
        .expect("remove the scheduling gate");
    let msgs = sandbox_failures(&client, &ns, &uid).await;
    let want =
        format!("Failed to create pod sandbox: runtimeclass.node.k8s.io \"{class}\" not found");
    assert!(msgs.iter().any(|m| m == &want), "{msgs:?}");
    never_runs(&client, &ns, "gone", &uid, 5).await;
    drop_pod(&client, &ns, "gone").await;
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster (hack/local-up.sh)"]
async fn a_runtime_handler_the_runtime_does_not_have_never_runs() {
    let client = client().await;
    let ns = namespace(&client, "e2e-rc-handler").await;
    let class = ns.clone();
    runtime_class(&client, &class, "no-such-handler").await;
    let mut p = pod("kata", "Never", BUSYBOX, &["true"]);
    p.spec.as_mut().unwrap().runtime_class_name = Some(class.clone());
    let created = create(&client, &ns, &p).await;
    let uid = created.metadata.uid.clone().unwrap();
    let msgs = sandbox_failures(&client, &ns, &uid).await;
    assert!(
        msgs.iter()
            .any(|m| m.starts_with("Failed to create pod sandbox: ")
                && m.contains("no-such-handler")),
        "{msgs:?}"
    );
    never_runs(&client, &ns, "kata", &uid, 5).await;
    drop_pod(&client, &ns, "kata").await;
    let _ = Api::<RuntimeClass>::all(client.clone())
        .delete(&class, &DeleteParams::default())
        .await;
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster (hack/local-up.sh)"]
async fn seccomp_localhost_profiles_come_from_the_root_dir() {
    let client = client().await;
    let ns = namespace(&client, "e2e-seccomp").await;
    let dir = local().join("rustlet/seccomp");
    std::fs::create_dir_all(&dir).expect("seccomp directory");
    let present = format!("{ns}-allow.json");
    std::fs::write(dir.join(&present), r#"{"defaultAction":"SCMP_ACT_ALLOW"}"#)
        .expect("write profile");
    let with_profile = |name: &str, profile: &str| {
        let mut p = pod(name, "Never", BUSYBOX, &["true"]);
        p.spec.as_mut().unwrap().security_context = Some(from_json(serde_json::json!({
            "seccompProfile": { "type": "Localhost", "localhostProfile": profile }
        })));
        p
    };
    // A profile that is there: the container runs under it.
    create(&client, &ns, &with_profile("present", &present)).await;
    // A profile that is not: the container fails with the runtime's reason,
    // which names the file under the root dir.
    let missing = format!("{ns}-missing.json");
    create(&client, &ns, &with_profile("missing", &missing)).await;
    let failed = wait_for(
        &client,
        &ns,
        "missing",
        60,
        "CreateContainerError",
        waiting_reason("CreateContainerError"),
    )
    .await;
    let message = container_status(&failed)
        .state
        .and_then(|s| s.waiting)
        .and_then(|w| w.message)
        .unwrap_or_default();
    let path = dir.join(&missing);
    assert!(
        message.contains(&path.display().to_string()),
        "{message:?} names {}",
        path.display()
    );
    wait_for(&client, &ns, "present", 60, "Succeeded", phase("Succeeded")).await;
    let _ = std::fs::remove_file(dir.join(&present));
    drop_pod(&client, &ns, "missing").await;
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster (hack/local-up.sh)"]
async fn an_apparmor_profile_the_node_cannot_enforce_is_refused() {
    let enabled = std::fs::read("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|b| b.first() == Some(&b'Y'));
    let client = client().await;
    let ns = namespace(&client, "e2e-apparmor").await;
    let mut p = pod("confined", "Never", BUSYBOX, &["true"]);
    p.spec.as_mut().unwrap().security_context = Some(from_json(serde_json::json!({
        "appArmorProfile": { "type": "RuntimeDefault" }
    })));
    create(&client, &ns, &p).await;
    if enabled {
        wait_for(
            &client,
            &ns,
            "confined",
            60,
            "Succeeded",
            phase("Succeeded"),
        )
        .await;
    } else {
        let rejected = wait_for(&client, &ns, "confined", 60, "Failed", phase("Failed")).await;
        let status = rejected.status.unwrap_or_default();
        assert_eq!(status.reason.as_deref(), Some("AppArmor"));
        assert!(
            status
                .message
                .unwrap_or_default()
                .contains("Cannot enforce AppArmor: AppArmor is not enabled on the host")
        );
        let uid = rejected.metadata.uid.unwrap_or_default();
        assert_eq!(sandboxes(&uid).await, 0);
    }
    drop_namespace(&client, &ns).await;
}
