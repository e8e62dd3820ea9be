//! End-to-end scenarios of what the node gives a pod on the local cluster
//! (`hack/local-up.sh --agent rustlet`): the managed /etc/hosts and hostname,
//! service environment variables, admission, hostNetwork pod IPs, subPath
//! modes, and readiness while a pod terminates.

use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};

/// The log of the first attempt of `container` once the pod finished.
async fn finished_log(client: &kube::Client, ns: &str, name: &str, container: &str) -> String {
    let done = wait_for(client, ns, name, 90, "Succeeded", phase("Succeeded")).await;
    let path = log_path(ns, name, &done.uid().unwrap(), container);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if !text.is_empty() || Instant::now() > deadline {
            // CRI log lines: "<time> <stream> <tag> <text>"; keep the text.
            return text
                .lines()
                .map(|l| l.splitn(4, ' ').nth(3).unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn busybox_once(name: &str, script: &str, spec: serde_json::Value) -> Pod {
    let mut p = serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{ "name": "c", "image": BUSYBOX, "command": ["sh", "-c", script] }]
        }
    });
    if let (Some(s), Some(extra)) = (p["spec"].as_object_mut(), spec.as_object()) {
        s.extend(extra.clone());
    }
    from_json(p)
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn hosts_file_has_the_pod_ip_hostname_fqdn_and_host_aliases() {
    let client = client().await;
    let ns = namespace(&client, "e2e-hosts").await;
    let p = busybox_once(
        "hosts",
        "cat /etc/hosts; echo hostname=$(hostname)",
        serde_json::json!({
            "hostname": "web",
            "subdomain": "sub",
            "hostAliases": [{ "ip": "123.45.67.89", "hostnames": ["foo", "bar"] }]
        }),
    );
    create(&client, &ns, &p).await;
    let log = finished_log(&client, &ns, "hosts", "c").await;
    let done = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("hosts")
        .await
        .unwrap();
    let ip = done.status.unwrap().pod_ip.expect("pod IP");
    assert!(log.starts_with("# Kubernetes-managed hosts file."), "{log}");
    assert!(log.contains("127.0.0.1\tlocalhost"), "{log}");
    assert!(
        log.contains(&format!("{ip}\tweb.sub.{ns}.svc.cluster.local\tweb")),
        "{log}"
    );
    assert!(
        log.contains("# Entries added by HostAliases.\n123.45.67.89\tfoo\tbar"),
        "{log}"
    );
    assert!(log.contains("hostname=web"), "{log}");
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn hostname_override_is_the_hostname_and_resolves() {
    let client = client().await;
    let ns = namespace(&client, "e2e-hostname").await;
    let p = busybox_once(
        "override",
        "echo $(hostname)';'; grep override.example.host /etc/hosts",
        serde_json::json!({ "hostname": "custom", "hostnameOverride": "override.example.host" }),
    );
    create(&client, &ns, &p).await;
    let log = finished_log(&client, &ns, "override", "c").await;
    assert!(log.contains("override.example.host;"), "{log}");
    assert!(
        log.contains("\toverride.example.host\n") || log.ends_with("\toverride.example.host"),
        "{log}"
    );
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn host_network_pods_get_the_nodes_hosts_file_aliases_and_ip() {
    let client = client().await;
    let ns = namespace(&client, "e2e-hostnet").await;
    let p = busybox_once(
        "hostnet",
        "head -1 /etc/hosts; tail -1 /etc/hosts; echo POD_IP=$POD_IP HOST_IP=$HOST_IP",
        serde_json::json!({
            "hostNetwork": true,
            "hostAliases": [{ "ip": "1.2.3.4", "hostnames": ["alias"] }],
        }),
    );
    let mut p = p;
    p.spec.as_mut().unwrap().containers[0].env = Some(from_json(serde_json::json!([
        { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
        { "name": "HOST_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.hostIP" } } }
    ])));
    create(&client, &ns, &p).await;
    let log = finished_log(&client, &ns, "hostnet", "c").await;
    assert!(
        log.starts_with("# Kubernetes-managed hosts file (host network)."),
        "{log}"
    );
    assert!(log.contains("1.2.3.4\talias"), "{log}");
    let env = log.lines().last().unwrap_or_default();
    let ips: Vec<&str> = env
        .split(' ')
        .map(|kv| kv.split_once('=').map_or("", |(_, v)| v))
        .collect();
    assert!(!ips[0].is_empty() && ips[0] == ips[1], "{env}");
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn services_of_the_namespace_become_environment_variables() {
    let client = client().await;
    let ns = namespace(&client, "e2e-svcenv").await;
    let svc: Service = from_json(serde_json::json!({
        "metadata": { "name": "fooservice" },
        "spec": { "selector": { "name": "none" }, "ports": [{ "port": 8765, "targetPort": 8080 }] }
    }));
    let svc = Api::<Service>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &svc)
        .await
        .expect("create service");
    let ip = svc.spec.unwrap().cluster_ip.unwrap();
    // Give the agent's Service watch a moment to see it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    create(
        &client,
        &ns,
        &busybox_once("env", "env", serde_json::json!({})),
    )
    .await;
    create(
        &client,
        &ns,
        &busybox_once(
            "nolinks",
            "env",
            serde_json::json!({ "enableServiceLinks": false }),
        ),
    )
    .await;
    let log = finished_log(&client, &ns, "env", "c").await;
    for want in [
        format!("FOOSERVICE_SERVICE_HOST={ip}"),
        "FOOSERVICE_SERVICE_PORT=8765".to_string(),
        format!("FOOSERVICE_PORT=tcp://{ip}:8765"),
        format!("FOOSERVICE_PORT_8765_TCP_ADDR={ip}"),
        "KUBERNETES_SERVICE_HOST=".to_string(),
    ] {
        assert!(log.contains(&want), "{want} not in {log}");
    }
    let log = finished_log(&client, &ns, "nolinks", "c").await;
    assert!(!log.contains("FOOSERVICE_"), "{log}");
    assert!(log.contains("KUBERNETES_SERVICE_HOST="), "{log}");
    drop_namespace(&client, &ns).await;
}

/// The pod's status reason.
fn reason(p: &Pod) -> Option<String> {
    p.status.as_ref()?.reason.clone()
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn pods_the_node_does_not_admit_fail_with_the_kubelets_reasons() {
    let client = client().await;
    let ns = namespace(&client, "e2e-admit").await;
    let windows = busybox_once(
        "windows",
        "true",
        serde_json::json!({ "os": { "name": "windows" } }),
    );
    let sysctl = busybox_once(
        "sysctl",
        "true",
        serde_json::json!({ "securityContext": { "sysctls": [{ "name": "kernel.msgmax", "value": "10000000000" }] } }),
    );
    create(&client, &ns, &windows).await;
    create(&client, &ns, &sysctl).await;
    for (name, want) in [
        ("windows", "PodOSNotSupported"),
        ("sysctl", "SysctlForbidden"),
    ] {
        let failed = wait_for(&client, &ns, name, 60, "Failed", phase("Failed")).await;
        assert_eq!(reason(&failed).as_deref(), Some(want), "{name}");
        let msg = failed.status.unwrap().message.unwrap_or_default();
        assert!(msg.starts_with("Pod was rejected: "), "{msg}");
    }
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn run_as_non_root_refuses_an_image_without_a_user() {
    let client = client().await;
    let ns = namespace(&client, "e2e-nonroot-image").await;
    let p = busybox_once(
        "implicit-root",
        "id -u",
        serde_json::json!({ "securityContext": { "runAsNonRoot": true } }),
    );
    create(&client, &ns, &p).await;
    let refused = wait_for(
        &client,
        &ns,
        "implicit-root",
        60,
        "refused",
        waiting_reason("CreateContainerConfigError"),
    )
    .await;
    let w = container_status(&refused).state.unwrap().waiting.unwrap();
    assert!(
        w.message
            .unwrap_or_default()
            .starts_with("container has runAsNonRoot and image will run as root"),
    );
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_missing_sub_path_gets_the_volumes_mode() {
    let client = client().await;
    let ns = namespace(&client, "e2e-subpath-mode").await;
    let mut p = busybox_once(
        "subpath",
        "stat -c %a /v",
        serde_json::json!({
            "volumes": [{ "name": "v", "emptyDir": { "medium": "Memory" } }],
            "securityContext": { "fsGroup": 123 }
        }),
    );
    p.spec.as_mut().unwrap().containers[0].volume_mounts = Some(from_json(serde_json::json!([
        { "name": "v", "mountPath": "/v", "subPath": "test-sub" }
    ])));
    create(&client, &ns, &p).await;
    let log = finished_log(&client, &ns, "subpath", "c").await;
    assert_eq!(log.trim(), "3777", "setgid from fsGroup, rwx for all");
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_terminating_pod_turns_unready_when_its_readiness_probe_fails() {
    let client = client().await;
    let ns = namespace(&client, "e2e-term-ready").await;
    let script = "trap 'rm -f /tmp/ready; sleep 20; exit 0' TERM; touch /tmp/ready; while true; do sleep 1; done";
    let p: Pod = from_json(serde_json::json!({
        "metadata": { "name": "term" },
        "spec": {
            "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "c", "image": BUSYBOX, "command": ["sh", "-c", script],
                "readinessProbe": {
                    "exec": { "command": ["cat", "/tmp/ready"] },
                    "initialDelaySeconds": 1, "periodSeconds": 1, "failureThreshold": 1
                }
            }]
        }
    }));
    create(&client, &ns, &p).await;
    wait_for(
        &client,
        &ns,
        "term",
        60,
        "ready",
        condition_is("Ready", "True"),
    )
    .await;
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("term", &DeleteParams::default())
        .await
        .expect("delete");
    let unready = wait_for(
        &client,
        &ns,
        "term",
        15,
        "unready while terminating",
        condition_is("Ready", "False"),
    )
    .await;
    assert!(
        unready.metadata.deletion_timestamp.is_some(),
        "still terminating when it turned unready"
    );
    drop_namespace(&client, &ns).await;
}

/// The agent's `pods/status` patches of pod `ns/name` so far, from the API
/// server's audit log of the node's requests.
fn status_patches(ns: &str, name: &str) -> usize {
    let log = std::fs::read_to_string(local().join("logs/audit.log")).unwrap_or_default();
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| {
            let o = &e["objectRef"];
            e["stage"] == "ResponseComplete"
                && e["verb"] == "patch"
                && o["resource"] == "pods"
                && o["subresource"] == "status"
                && o["namespace"] == ns
                && o["name"] == name
        })
        .count()
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn syncs_of_an_unchanged_pod_send_no_status_patch() {
    let client = client().await;
    let ns = namespace(&client, "e2e-nopatch").await;
    let p = pod("quiet", "Always", BUSYBOX, &["sleep", "3600"]);
    create(&client, &ns, &p).await;
    wait_for(
        &client,
        &ns,
        "quiet",
        60,
        "Ready",
        condition_is("Ready", "True"),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = status_patches(&ns, "quiet");
    assert!(
        before >= 1,
        "no status patch of {ns}/quiet in the audit log"
    );
    // Each label change is a watch event, so a sync of the same pod.
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let status_now = || async {
        let p = api.get("quiet").await.expect("get quiet");
        serde_json::to_string_pretty(&p.status).unwrap_or_default()
    };
    let first = status_now().await;
    for i in 0..3 {
        let patch = serde_json::json!({ "metadata": { "labels": { "touch": i.to_string() } } });
        api.patch(
            "quiet",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = status_patches(&ns, "quiet");
    // What a patch changed, should there be one: the status before the
    // label changes and now.
    let last = status_now().await;
    // One change is not the agent's: a test beside this one pulling the same
    // image from a registry gives it a repo digest, which the runtime then
    // reports as the container's image ID, and that is written once.
    let image_id = |status: &str| {
        serde_json::from_str::<serde_json::Value>(status).unwrap_or_default()["containerStatuses"]
            [0]["imageID"]
            .clone()
    };
    let allowed = before + usize::from(image_id(&first) != image_id(&last));
    assert!(
        (before..=allowed).contains(&after),
        "syncs without a change patched the status ({before} patches, then {after}); before:\n{first}\nnow:\n{last}"
    );
    drop_namespace(&client, &ns).await;
}
