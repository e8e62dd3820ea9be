//! ResourceClaims before the sandbox: a pod whose claim is missing, not
//! reserved for it, or allocated to a driver this node has not registered
//! gets no sandbox and waits with `FailedPrepareDynamicResources`; a claim
//! whose allocation holds no device lets it start. A registered driver
//! prepares the claim, its container gets the CDI device, an agent restart
//! keeps it, and the claim is unprepared once the pod is gone; a driver
//! that fails, leaves a claim out, answers a bad CDI name or never answers
//! keeps the pod waiting with the kubelet's reasons.

use super::*;

/// `web` with one container naming the pod claim `gpu`, which names
/// ResourceClaim `shared-gpu`.
fn claiming_pod() -> Pod {
    let mut p = pod("web").container("c", IMAGE).build();
    if let Some(spec) = p.spec.as_mut() {
        spec.resource_claims = Some(vec![k8s_openapi::api::core::v1::PodResourceClaim {
            name: "gpu".into(),
            resource_claim_name: Some("shared-gpu".into()),
            ..Default::default()
        }]);
        spec.containers[0].resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            claims: Some(vec![k8s_openapi::api::core::v1::ResourceClaim {
                name: "gpu".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
    }
    p
}

/// ResourceClaim `shared-gpu`, reserved for `reserved_uid`, with `devices`
/// allocated.
fn claim(reserved_uid: &str, devices: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": { "name": "shared-gpu", "namespace": "default", "uid": "claim-uid" },
        "spec": {},
        "status": {
            "reservedFor": [{ "resource": "pods", "name": "web", "uid": reserved_uid }],
            "allocation": { "devices": { "results": devices } }
        }
    })
}

const CLAIM_GET: &str = "GET /apis/resource.k8s.io/v1/namespaces/default/resourceclaims/shared-gpu";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_waits_for_its_claim_and_never_runs_without_its_device() {
    let mut n = Node::start().await;
    let web = n.bind(claiming_pod());
    let uid = web.metadata.uid.clone().unwrap_or_default();

    // No such claim: no sandbox, the claim read once, the pod waiting.
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    assert!(
        n.api_calls().contains(&CLAIM_GET.to_string()),
        "{:?}",
        n.api_calls()
    );
    assert_eq!(state(&n.status("web"), "c").0, "waiting:ContainerCreating");
    n.event(
        "FailedPrepareDynamicResources",
        "Failed to prepare dynamic resources: prepare dynamic resources: fetch ResourceClaim shared-gpu: not found",
    )
    .await;

    // Another pod's claim: still nothing.
    let device = json!([{ "request": "gpu", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0" }]);
    n.api.put(
        "resourceclaims",
        "shared-gpu",
        claim("another-pod", device.clone()),
    );
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    n.event(
        "FailedPrepareDynamicResources",
        &format!("pod web ({uid}) is not allowed to use ResourceClaim shared-gpu (claim-uid)"),
    )
    .await;

    // Reserved for it and allocated, but no driver of its devices is
    // registered here: it waits rather than run without the device, and is
    // tried again after the pod worker's back-off (10 s, jittered by up to
    // half), not at the resync a minute away: nothing tells the agent of a
    // claim's change.
    n.api
        .put("resourceclaims", "shared-gpu", claim(&uid, device));
    n.ctx.set_pleg_connected(true);
    let action = n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    let wait = requeue(&action).expect("a requeue");
    assert!(
        wait >= Duration::from_secs(10) && wait <= Duration::from_secs(15),
        "{wait:?}"
    );
    n.event(
        "FailedPrepareDynamicResources",
        "prepare dynamic resources: DRA driver gpu.example.com is not registered",
    )
    .await;
    assert_eq!(n.status("web").phase.as_deref(), Some("Pending"));

    // An allocation without devices needs no driver: the pod starts.
    n.api
        .put("resourceclaims", "shared-gpu", claim(&uid, json!([])));
    let action = n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    let wait = requeue(&action).expect("a requeue");
    assert!(wait >= Duration::from_secs(60), "{wait:?}");
}

/// The allocation of `shared-gpu`: device `gpu-0` of driver
/// `gpu.example.com`.
fn gpu_device() -> serde_json::Value {
    json!([{ "request": "gpu", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0" }])
}

/// Serves driver `gpu.example.com` on a socket of `n`'s directory and
/// registers it with the node's DRA manager, each call bounded by 2 s.
fn register_gpu_driver(n: &Node, socket: &str) -> crate::fake_dra::FakeDraDriver {
    let socket = n.dir.path().join(socket);
    let driver = crate::fake_dra::FakeDraDriver::serve(&socket, "gpu.example.com", false);
    n.ctx
        .dra()
        .plugins()
        .set_call_timeout(Duration::from_secs(2));
    n.ctx
        .dra()
        .register_plugin("gpu.example.com", &socket, &["v1.DRAPlugin".to_string()])
        .expect("registered");
    driver
}

/// The CDI devices of container `name`'s newest instance.
fn cdi_devices(n: &Node, name: &str) -> Vec<String> {
    n.cri
        .containers()
        .into_iter()
        .filter(|c| c.name == name)
        .max_by_key(|c| c.attempt)
        .map(|c| c.cdi_devices)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_claim_gives_its_container_the_device_across_a_restart_until_the_pod_goes() {
    let mut n = Node::start().await;
    let driver = register_gpu_driver(&n, "gpu.sock");
    let web = n.bind(claiming_pod());
    let uid = web.metadata.uid.clone().unwrap_or_default();
    n.api
        .put("resourceclaims", "shared-gpu", claim(&uid, gpu_device()));
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    assert_eq!(
        driver.take_calls(),
        ["NodePrepareResources default/shared-gpu"]
    );
    assert_eq!(cdi_devices(&n, "c"), ["gpu.example.com/gpu=claim-uid"]);
    // The call and the pod's prepare are counted under the kubelet's names.
    let text = crate::metrics::metrics().encode().expect("metrics");
    for series in [
        "dra_grpc_operations_duration_seconds_count{driver_name=\"gpu.example.com\",method_name=\"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources\",grpc_status_code=\"OK\"}",
        "dra_operations_duration_seconds_count{operation_name=\"PrepareResources\",is_error=\"false\"}",
        "dra_resource_claims_in_use{driver_name=\"<any>\"}",
    ] {
        assert!(text.contains(series), "{series} in {text}");
    }
    let checkpoint = n
        .dir
        .path()
        .join("root")
        .join(crate::dra::cache::CHECKPOINT);
    let kept = std::fs::read_to_string(&checkpoint).expect("the checkpoint");
    assert!(kept.contains("gpu.example.com/gpu=claim-uid"), "{kept}");
    assert!(kept.contains(&uid), "{kept}");

    // The agent restarts and the container exits: the new instance gets the
    // device from the checkpoint, and nothing is prepared again.
    let mut n = n.restart().await;
    assert!(n.ctx.dra().has_claims(&uid));
    assert!(n.cri.exit_named(&uid, "c", 1));
    n.sync_until_called("web").await;
    assert_eq!(cdi_devices(&n, "c").len(), 1);
    assert_eq!(cdi_devices(&n, "c"), ["gpu.example.com/gpu=claim-uid"]);
    assert_eq!(driver.take_calls(), Vec::<String>::new());

    // The pod is deleted: once its containers are gone, its claim is
    // unprepared (through the driver registered again after the restart)
    // and forgotten.
    let again = register_gpu_driver(&n, "gpu-again.sock");
    n.delete_gracefully("web", 30);
    for _ in 0..5 {
        n.sync_watched("web").await;
        if n.api.pod("web").is_none() {
            break;
        }
    }
    assert!(n.api.pod("web").is_none());
    assert_eq!(
        again.take_calls(),
        ["NodeUnprepareResources default/shared-gpu"]
    );
    assert!(!n.ctx.dra().has_claims(&uid));
    let kept = std::fs::read_to_string(&checkpoint).expect("the checkpoint");
    assert!(!kept.contains(&uid), "{kept}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_shared_by_two_pods_is_prepared_once_and_unprepared_after_the_last() {
    let mut n = Node::start().await;
    let driver = register_gpu_driver(&n, "gpu.sock");
    let web = n.bind(claiming_pod());
    let mut second = claiming_pod();
    second.metadata.name = Some("api".into());
    second.metadata.uid = Some("uid-api".into());
    let api_pod = n.bind(second);
    let (web_uid, api_uid) = (
        web.metadata.uid.clone().unwrap_or_default(),
        api_pod.metadata.uid.clone().unwrap_or_default(),
    );
    let mut shared = claim(&web_uid, gpu_device());
    shared["status"]["reservedFor"]
        .as_array_mut()
        .expect("reservations")
        .push(json!({ "resource": "pods", "name": "api", "uid": api_uid }));
    n.api.put("resourceclaims", "shared-gpu", shared);
    n.sync(&web).await;
    n.sync(&api_pod).await;
    assert_eq!(
        driver.take_calls(),
        ["NodePrepareResources default/shared-gpu"]
    );
    // One pod ends (it is gone from the API): the other still uses the
    // claim, so nothing is unprepared.
    let active = |uid: &str| uid == api_uid;
    assert_eq!(n.ctx.dra().unprepare_inactive(active).await, 1);
    assert_eq!(driver.take_calls(), Vec::<String>::new());
    assert!(n.ctx.dra().has_claims(&api_uid));
    // The last one goes: now it is.
    assert_eq!(n.ctx.dra().unprepare_inactive(|_| false).await, 1);
    assert_eq!(
        driver.take_calls(),
        ["NodeUnprepareResources default/shared-gpu"]
    );
    assert!(!n.ctx.dra().has_claims(&api_uid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_that_fails_or_answers_badly_keeps_the_pod_waiting_with_the_reason() {
    use crate::fake_dra::Answer;
    let mut n = Node::start().await;
    let driver = register_gpu_driver(&n, "gpu.sock");
    let web = n.bind(claiming_pod());
    let uid = web.metadata.uid.clone().unwrap_or_default();
    n.api
        .put("resourceclaims", "shared-gpu", claim(&uid, gpu_device()));
    let cases = [
        (
            Answer::ClaimError("device busy".into()),
            "NodePrepareResources failed for ResourceClaim shared-gpu: device busy".to_string(),
        ),
        (
            Answer::CallError("driver crashed".into()),
            "NodePrepareResources: rpc error: code = Internal desc = driver crashed".into(),
        ),
        (
            Answer::Nothing,
            "NodePrepareResources skipped 1 ResourceClaims".into(),
        ),
        (
            Answer::CdiDevice("gpu.example.com/gpu=../../etc".into()),
            "invalid CDI device for ResourceClaim shared-gpu".into(),
        ),
        (
            Answer::CdiDevice(format!("gpu.example.com/gpu={}", "x".repeat(100_000))),
            "a CDI device name of 100020 bytes".into(),
        ),
        (
            Answer::Hang,
            "NodePrepareResources: rpc error: code = DeadlineExceeded".into(),
        ),
    ];
    for (answer, reason) in cases {
        driver.answer(answer);
        n.sync_watched("web").await;
        assert_eq!(n.cri_calls(), Vec::<String>::new(), "{reason}");
        n.event("FailedPrepareDynamicResources", &reason).await;
        assert_eq!(state(&n.status("web"), "c").0, "waiting:ContainerCreating");
    }
    // The driver answers: the pod starts with the device.
    driver.answer(Answer::Devices);
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    assert_eq!(cdi_devices(&n, "c"), ["gpu.example.com/gpu=claim-uid"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_registering_ten_thousand_times_is_refused_past_the_bound() {
    let n = Node::start().await;
    let dra = n.ctx.dra();
    let services = ["v1.DRAPlugin".to_string()];
    let mut refused = 0;
    for i in 0..10_000 {
        let endpoint = n.dir.path().join(format!("gpu-{i}.sock"));
        if dra
            .register_plugin("gpu.example.com", &endpoint, &services)
            .is_err()
        {
            refused += 1;
        }
    }
    assert_eq!(refused, 10_000 - crate::dra::plugins::MAX_PLUGINS);
    // The same endpoint twice, and a driver speaking no version spoken
    // here, are refused with the kubelet's words.
    let first = n.dir.path().join("gpu-0.sock");
    let again = dra.register_plugin("gpu.example.com", &first, &services);
    assert!(again.unwrap_err().contains("already registered"));
    let alpha = dra.register_plugin("old.example.com", &first, &["v1alpha3.Node".to_string()]);
    assert!(
        alpha
            .unwrap_err()
            .contains("invalid supported gRPC versions")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_devices_health_shows_in_its_containers_status_and_is_unknown_once_its_driver_goes() {
    let mut n = Node::start().await;
    let socket = n.dir.path().join("gpu.sock");
    let driver = crate::fake_dra::FakeDraDriver::serve(&socket, "gpu.example.com", false);
    let services = [
        "v1.DRAPlugin".to_string(),
        "v1.DRAResourceHealth".to_string(),
    ];
    n.ctx
        .dra()
        .register_plugin("gpu.example.com", &socket, &services)
        .expect("registered");
    let mut changes = n.ctx.dra().health_changes();
    let web = n.bind(claiming_pod());
    let uid = web.metadata.uid.clone().unwrap_or_default();
    n.api
        .put("resourceclaims", "shared-gpu", claim(&uid, gpu_device()));
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    let shown = |n: &Node| {
        let status = n.status("web");
        let c = status.container_statuses.unwrap_or_default();
        serde_json::to_value(&c[0].allocated_resources_status).expect("json")
    };
    // Nothing reported yet: Unknown.
    assert_eq!(
        shown(&n),
        json!([{ "name": "claim:gpu", "resources": [
            { "resourceID": "gpu.example.com/gpu=claim-uid", "health": "Unknown" }
        ]}])
    );
    // The driver reports the device unhealthy: the agent is told, and the
    // next status shows it with the driver's message.
    driver.set_health(&[("gpu-0", 2, "ECC errors")]);
    tokio::time::timeout(Duration::from_secs(10), changes.changed())
        .await
        .expect("told of the change")
        .expect("the manager lives");
    n.sync_watched("web").await;
    assert_eq!(
        shown(&n),
        json!([{ "name": "claim:gpu", "resources": [
            { "resourceID": "gpu.example.com/gpu=claim-uid", "health": "Unhealthy", "message": "ECC errors" }
        ]}])
    );
    // Calls, the health stream and the probes of the driver share one
    // connection, as the kubelet's.
    n.ctx.dra().probe_plugins().await;
    n.ctx.dra().probe_plugins().await;
    assert!(n.ctx.dra().plugins().usable("gpu.example.com"));
    assert_eq!(driver.accepted(), 1);
    // The driver goes: the device's health is not known any more.
    n.ctx.dra().deregister_plugin("gpu.example.com", &socket);
    n.sync_watched("web").await;
    assert_eq!(
        shown(&n)[0]["resources"][0]["health"],
        "Unknown",
        "{}",
        shown(&n)
    );
}
