//! DRA on the local cluster (`hack/local-up.sh --agent rustlet`).
//!
//! The node's ResourceSlices at the agent's start: a slice a driver left
//! for this node goes when the agent starts, deleted with the node's own
//! credentials (the Node authorizer allows a node its own slices), as the
//! kubelet wipes them; another node's slice stays.
//!
//! A claim on the upstream DRA test driver (`hack/dra-driver.sh`, built
//! from k8s.io/kubernetes `test/e2e/dra/test-driver`): a pod whose claim
//! comes from a ResourceClaimTemplate is scheduled (the scheduler allocates
//! one of the driver's devices), the agent has the driver prepare it, and
//! the container runs with the environment of the CDI device the driver
//! wrote, its status lists the device's health, and the pod resources API
//! lists the device; an agent restart
//! changes nothing; once the pod goes, the claim is unprepared (the driver
//! removes its CDI spec).
//!
//! Serial: they restart the agent.

use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Api;

/// The upstream test driver's name.
const TEST_DRIVER: &str = "test-driver.cdi.k8s.io";

/// The upstream DRA test driver, registered with the agent
/// (`hack/dra-driver.sh up`), stopped when dropped (`down`: its DeviceClass
/// and slices go too).
struct TestDriver;

impl TestDriver {
    fn up() -> Self {
        let up = std::process::Command::new(root().join("hack/dra-driver.sh"))
            .args(["up", "--agent", "rustlet"])
            .status()
            .expect("hack/dra-driver.sh");
        assert!(up.success(), "hack/dra-driver.sh up");
        Self
    }
}

impl Drop for TestDriver {
    fn drop(&mut self) {
        let _ = std::process::Command::new(root().join("hack/dra-driver.sh"))
            .arg("down")
            .status();
    }
}

/// The CDI specs the driver wrote for claim `uid`.
fn cdi_specs(uid: &str) -> Vec<String> {
    std::fs::read_dir(local().join("cdi"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("{TEST_DRIVER}-{uid}")))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits up to `secs` seconds for `ok`.
async fn eventually(secs: u64, what: &str, ok: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(Instant::now() < deadline, "{what} within {secs} s");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_claim_on_the_test_driver_gives_the_container_its_device_across_a_restart() {
    let client = client().await;
    let _driver = TestDriver::up();
    let ns = namespace(&client, "e2e-dra").await;
    let (code, _, err) = kubectl(
        &["apply", "-n", &ns, "-f", "-"],
        "apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-device}
spec:
  spec:
    devices:
      requests:
      - name: my-device
        exactly: {deviceClassName: example}
      config:
      - opaque:
          driver: test-driver.cdi.k8s.io
          parameters: {a: b}
",
    );
    assert_eq!(code, 0, "create the claim template: {err}");
    // Not bound: the scheduler allocates the claim on this node.
    let pod = create(
        &client,
        &ns,
        &from_json(serde_json::json!({
            "metadata": { "name": "gpu-user" },
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{ "name": "resource", "resourceClaimTemplateName": "one-device" }],
                "containers": [{
                    "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", "env; sleep 3600"],
                    "resources": { "claims": [{ "name": "resource" }] }
                }]
            }
        })),
    )
    .await;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let running = wait_for(
        &client,
        &ns,
        "gpu-user",
        120,
        "the pod running with its device",
        phase("Running"),
    )
    .await;
    let claim_name = running
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .and_then(|s| s.first())
        .and_then(|s| s.resource_claim_name.clone())
        .expect("the generated claim's name");
    let claims: Api<k8s_openapi::api::resource::v1::ResourceClaim> =
        Api::namespaced(client.clone(), &ns);
    let claim = claims.get(&claim_name).await.expect("the generated claim");
    let claim_uid = claim.metadata.uid.clone().unwrap_or_default();
    // The driver's CDI device set the container's environment.
    let env_name = format!("claim_{claim_name}_my_device=true").replace('-', "_");
    let mut env = String::new();
    for _ in 0..40 {
        env = logs(&ns, "gpu-user");
        if env.contains("user_a=b") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(env.contains("user_a=b"), "{env}");
    assert!(env.contains(&env_name), "{env_name} in {env}");
    assert_eq!(cdi_specs(&claim_uid).len(), 1, "the driver's CDI spec");
    // The pod resources API shows the claim's device, as the kubelet's own
    // Go client reads it.
    let out = std::process::Command::new(root().join("_output/bin/podresources-client"))
        .arg(
            rustlet_root()
                .join(rustlet::pod_resources::DIR_NAME)
                .join(rustlet::pod_resources::SOCKET),
        )
        .output()
        .expect("run _output/bin/podresources-client (hack/build-cluster.sh csi)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).expect("its JSON");
    let listed = view["list"]["pod_resources"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["namespace"] == ns.as_str() && p["name"] == "gpu-user")
        .cloned()
        .unwrap_or_else(|| panic!("the pod in List: {view}"));
    let dynamic = &listed["containers"][0]["dynamic_resources"][0];
    assert_eq!(dynamic["claim_name"], claim_name.as_str(), "{listed}");
    let device = &dynamic["claim_resources"][0];
    assert_eq!(device["driver_name"], TEST_DRIVER, "{listed}");
    assert_eq!(device["pool_name"], node_name().as_str(), "{listed}");
    assert_eq!(
        device["cdi_devices"][0]["name"],
        format!("{TEST_DRIVER}/test=claim-{claim_uid}-my-device").as_str(),
        "{listed}"
    );
    // The container's status lists its device (the test driver's health
    // stream reports no device it was not told about: Unknown).
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let cdi_id = format!("{TEST_DRIVER}/test=claim-{claim_uid}-my-device");
    let mut allocated = serde_json::Value::Null;
    for _ in 0..40 {
        let now = pods.get("gpu-user").await.expect("the pod");
        allocated =
            serde_json::to_value(container_status(&now).allocated_resources_status).expect("json");
        if !allocated.is_null() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(
        allocated,
        serde_json::json!([{ "name": "claim:resource", "resources": [
            { "resourceID": cdi_id, "health": "Unknown" }
        ]}])
    );
    let before = container_status(&running);

    // The agent restarts: the container keeps running, untouched, and the
    // claim stays prepared.
    restart_agent(None);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = container_status(&pods.get("gpu-user").await.expect("the pod"));
    assert_eq!(after.container_id, before.container_id);
    assert_eq!(after.restart_count, 0);
    assert!(after.state.and_then(|s| s.running).is_some());
    assert_eq!(cdi_specs(&claim_uid).len(), 1, "still prepared");

    // The pod goes: its claim is unprepared (through the driver registered
    // again after the restart), and the driver's CDI spec goes.
    pods.delete("gpu-user", &Default::default())
        .await
        .expect("delete the pod");
    wait_deleted(&client, &ns, "gpu-user", &uid, 60).await;
    eventually(30, "the claim unprepared (its CDI spec removed)", || {
        cdi_specs(&claim_uid).is_empty()
    })
    .await;
    drop_namespace(&client, &ns).await;
}

/// A ResourceSlice of `node`, one device, for driver `gpu.example.com`.
fn slice(name: &str, node: &str) -> ResourceSlice {
    from_json(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "driver": "gpu.example.com",
            "nodeName": node,
            "pool": { "name": node, "generation": 1, "resourceSliceCount": 1 },
            "devices": [{ "name": "gpu-0" }]
        }
    }))
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn the_nodes_resource_slices_are_wiped_at_start() {
    let client = client().await;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let node = node_name();
    let ours = format!("e2e-{node}-gpu");
    let theirs = "e2e-elsewhere-gpu".to_string();
    for (name, on) in [(&ours, node.as_str()), (&theirs, "elsewhere")] {
        let _ = slices.delete(name, &Default::default()).await;
        slices
            .create(&Default::default(), &slice(name, on))
            .await
            .unwrap_or_else(|e| panic!("create ResourceSlice {name}: {e}"));
    }
    restart_agent(None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while slices
        .get_opt(&ours)
        .await
        .expect("get the slice")
        .is_some()
    {
        assert!(
            Instant::now() < deadline,
            "the node's ResourceSlice is still there 60 s after the agent started"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        slices.get_opt(&theirs).await.expect("get").is_some(),
        "another node's slice stays"
    );
    slices
        .delete(&theirs, &Default::default())
        .await
        .expect("delete the other node's slice");
}
