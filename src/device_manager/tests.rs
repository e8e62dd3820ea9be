//! The device manager against a device plugin served over gRPC on a unix
//! socket, registering through the manager's own socket.

use super::test_plugin::*;
use super::*;
use crate::proto::deviceplugin::DevicePluginOptions;
use crate::proto::deviceplugin::registration_client::RegistrationClient;

#[tokio::test]
async fn a_plugin_whose_options_fail_is_refused_and_never_watched() {
    let s = setup();
    let (_tx, rx) = watch::channel(Some(vec![device("d", true)]));
    let p = TestPlugin {
        fail_options: true,
        ..plugin(rx)
    };
    let calls = p.calls.clone();
    let _srv = serve_plugin(&s.dir, "p.sock", p);
    let err = register(&s.dir, "p.sock", RES).await.unwrap_err();
    assert!(
        err.message()
            .contains("failed to get device plugin options")
            && err.message().contains("GetDevicePluginOptions failed"),
        "{err:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(*calls.lock().unwrap(), ["GetDevicePluginOptions"]);
    assert!(s.manager.resources(Instant::now()).capacity.is_empty());
}

#[tokio::test]
async fn bad_registrations_are_refused_with_the_kubelets_messages() {
    let s = setup();
    let channel = crate::cri::unix_channel(s.dir.join(SOCKET)).await.unwrap();
    let mut client = RegistrationClient::new(channel);
    for (version, endpoint, resource, want) in [
        (
            "v1alpha",
            "p.sock",
            RES,
            "requested API version \"v1alpha\" is not supported by kubelet. Supported version is [\"v1beta1\"]",
        ),
        (
            VERSION,
            "p.sock",
            "cpu",
            "the ResourceName \"cpu\" is invalid",
        ),
        (
            VERSION,
            "p.sock",
            "kubernetes.io/dev",
            "the ResourceName \"kubernetes.io/dev\" is invalid",
        ),
        (
            VERSION,
            "p.sock",
            "example.com/a b",
            "the ResourceName \"example.com/a b\" is invalid",
        ),
        // The socket must be a file of the directory.
        (
            VERSION,
            "../../etc/x.sock",
            RES,
            "is not a socket file name",
        ),
        (VERSION, "", RES, "is not a socket file name"),
        (VERSION, SOCKET, RES, "is not a socket file name"),
        // Nothing listens there.
        (VERSION, "absent.sock", RES, "failed to dial device plugin"),
    ] {
        let err = client
            .register(RegisterRequest {
                version: version.into(),
                endpoint: endpoint.into(),
                resource_name: resource.into(),
                options: None,
            })
            .await
            .unwrap_err();
        assert!(
            err.message().contains(want),
            "{resource} {endpoint}: {err:?}"
        );
    }
    assert!(s.manager.resources(Instant::now()).capacity.is_empty());
}

#[tokio::test]
async fn devices_and_their_health_follow_list_and_watch_until_it_fails() {
    let s = setup();
    let mut changes = s.manager.subscribe();
    let (tx, rx) = watch::channel(Some(vec![device("0", true), device("1", true)]));
    let p = plugin(rx);
    let calls = p.calls.clone();
    let _srv = serve_plugin(&s.dir, "p.sock", p);
    register(&s.dir, "p.sock", RES).await.unwrap();
    wait_counts(&s.manager, RES, Some((2, 2))).await;
    assert!(changes.has_changed().unwrap(), "the node status is told");
    changes.mark_unchanged();
    tx.send(Some(vec![device("0", false), device("1", true)]))
        .unwrap();
    wait_counts(&s.manager, RES, Some((1, 2))).await;
    tx.send(Some(vec![device("0", true), device("1", true)]))
        .unwrap();
    wait_counts(&s.manager, RES, Some((2, 2))).await;
    // The stream fails: every device unhealthy, capacity kept, never asked again.
    tx.send(None).unwrap();
    wait_counts(&s.manager, RES, Some((0, 2))).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        *calls.lock().unwrap(),
        ["GetDevicePluginOptions", "ListAndWatch"]
    );
    // Dropped after the grace period, then reported as zero.
    let later = s.manager.resources(Instant::now() + STOP_GRACE);
    assert!(
        later.capacity.is_empty() && later.removed.contains(RES),
        "{later:?}"
    );
}

#[tokio::test]
async fn a_stopped_plugin_leaves_its_devices_unhealthy() {
    let s = setup();
    let (tx, rx) = watch::channel(Some(vec![device("0", true), device("1", true)]));
    let srv = serve_plugin(&s.dir, "p.sock", plugin(rx));
    register(&s.dir, "p.sock", RES).await.unwrap();
    wait_counts(&s.manager, RES, Some((2, 2))).await;
    // The plugin stops: its stream ends.
    drop(tx);
    srv.abort();
    wait_counts(&s.manager, RES, Some((0, 2))).await;
}

fn pod_asking(uid: &str, n: u32) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": uid, "namespace": "ns", "uid": uid },
        "spec": { "containers": [
            { "name": "c", "image": "busybox",
              "resources": { "limits": { RES: n.to_string() }, "requests": { RES: n.to_string() } } },
            { "name": "plain", "image": "busybox" }
        ] }
    }))
    .unwrap()
}

#[tokio::test]
async fn pods_are_given_free_healthy_devices_and_containers_get_the_plugins_answer() {
    let s = setup();
    let (_tx, rx) = watch::channel(Some(vec![
        device("a", true),
        device("b", false),
        device("c", true),
        device("d", true),
    ]));
    let p = TestPlugin {
        options: DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: true,
        },
        preferred: vec!["d".into()],
        ..plugin(rx)
    };
    let calls = p.calls.clone();
    let _srv = serve_plugin(&s.dir, "p.sock", p);
    register(&s.dir, "p.sock", RES).await.unwrap();
    wait_counts(&s.manager, RES, Some((3, 4))).await;
    calls.lock().unwrap().clear();

    let all = |_: &str| true;
    let p1 = pod_asking("u1", 2);
    s.manager.allocate_pod(&p1, all).await.unwrap();
    assert_eq!(
        *calls.lock().unwrap(),
        ["GetPreferredAllocation 2 of a,c,d", "Allocate a,d"]
    );
    // Allocatable counts healthy devices, held or not (as the kubelet's).
    wait_counts(&s.manager, RES, Some((3, 4))).await;
    // Admitting the pod again asks nothing more.
    s.manager.allocate_pod(&p1, all).await.unwrap();
    let c = &p1.spec.as_ref().unwrap().containers[0];
    let opts = s.manager.run_options(&p1, c, all).await.unwrap();
    assert_eq!(opts.envs["TEST_DEVICES"], "a,d");
    assert_eq!(opts.mounts[0].host_path, "/run/test-devices/a,d");
    assert!(opts.mounts[0].readonly);
    assert_eq!(opts.devices[0].host_path, "/dev/null");
    assert_eq!(opts.annotations["example.com/devices"], "a,d");
    // A container without devices gets nothing, and no call is made.
    let plain = &p1.spec.as_ref().unwrap().containers[1];
    assert_eq!(
        s.manager.run_options(&p1, plain, all).await.unwrap(),
        RunOptions::default()
    );
    assert_eq!(
        calls.lock().unwrap()[2..],
        ["PreStartContainer a,d".to_string()]
    );

    // One device is left: a pod asking for two is refused.
    let err = s
        .manager
        .allocate_pod(&pod_asking("u2", 2), all)
        .await
        .unwrap_err();
    assert_eq!(
        err,
        "requested number of devices unavailable for example.com/dev. Requested: 2, Available: 1"
    );
    // An agent started again reads what containers hold from the
    // checkpoint: the container is created with the same answer, asking
    // the plugin nothing.
    let restarted = DeviceManager::new(&s.dir);
    let calls_before = calls.lock().unwrap().len();
    let again = restarted.run_options(&p1, c, all).await.unwrap();
    assert_eq!(again.envs["TEST_DEVICES"], "a,d");
    assert_eq!(again.mounts, opts.mounts);
    assert_eq!(calls.lock().unwrap().len(), calls_before);
    let held: Vec<String> = restarted
        .devices("u1", &c.name)
        .into_iter()
        .flat_map(|(_, d)| d.into_iter().map(|(id, _)| id))
        .collect();
    assert_eq!(held, ["a", "d"]);
    // Released there, the next start holds nothing.
    restarted.release(|u| u != "u1");
    assert!(DeviceManager::new(&s.dir).devices("u1", &c.name).is_empty());

    // Once the first pod is gone, its devices are free again.
    s.manager.release(|u| u != "u1");
    s.manager
        .allocate_pod(&pod_asking("u2", 2), all)
        .await
        .unwrap();
}

#[tokio::test]
async fn devices_follow_the_merged_hint_and_an_init_containers_devices_are_reused() {
    use crate::topology_manager::{Hint, NumaMask};
    let s = setup();
    let (_tx, rx) = watch::channel(Some(vec![
        on_node("a", 0),
        on_node("b", 0),
        on_node("c", 1),
        on_node("d", 1),
    ]));
    let p = TestPlugin {
        options: DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        },
        ..plugin(rx)
    };
    let calls = p.calls.clone();
    let _srv = serve_plugin(&s.dir, "p.sock", p);
    register(&s.dir, "p.sock", RES).await.unwrap();
    wait_counts(&s.manager, RES, Some((4, 4))).await;
    calls.lock().unwrap().clear();

    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "p", "namespace": "ns", "uid": "u1" },
        "spec": {
            "initContainers": [
                { "name": "init", "image": "busybox", "resources": { "limits": { RES: "1" } } }
            ],
            "containers": [
                { "name": "c", "image": "busybox", "resources": { "limits": { RES: "2" } } }
            ]
        }
    }))
    .unwrap();
    let spec = pod.spec.as_ref().unwrap();
    let (init, app) = (
        &spec.init_containers.as_ref().unwrap()[0],
        &spec.containers[0],
    );
    let all = |_: &str| true;
    let machine = [0, 1];
    let hints = |c| s.manager.hints(&pod, c, all, &machine).unwrap()[RES].clone();
    assert_eq!(
        hints(init),
        Some(vec![
            Hint::new(&[0], true),
            Hint::new(&[1], true),
            Hint::new(&[0, 1], false)
        ])
    );
    // The init container on node 1, as the merged hint says.
    s.manager
        .allocate(&pod, init, all, Some(NumaMask::of(&[1])))
        .await
        .unwrap();
    // The app container reuses it: its hints all hold node 1.
    assert_eq!(
        hints(app),
        Some(vec![Hint::new(&[1], true), Hint::new(&[0, 1], false)])
    );
    s.manager
        .allocate(&pod, app, all, Some(NumaMask::of(&[1])))
        .await
        .unwrap();
    assert_eq!(
        *calls.lock().unwrap(),
        [
            "GetPreferredAllocation 1 of c,d",
            "Allocate c",
            "Allocate c,d"
        ]
    );
    // Another pod sees only node 0's devices free.
    let other = pod_asking("u2", 2);
    assert_eq!(
        s.manager.pod_hints(&other, all, &machine).unwrap()[RES],
        Some(vec![Hint::new(&[0], true), Hint::new(&[0, 1], false)])
    );
    // A pod asking for no plugin's device gives no hints.
    let plain = &other.spec.as_ref().unwrap().containers[1];
    assert_eq!(s.manager.hints(&other, plain, all, &machine), None);
}

#[test]
fn run_options_merge_into_a_container_config() {
    let mut config = cri::ContainerConfig {
        envs: vec![cri::KeyValue {
            key: "TEST_DEVICES".into(),
            value: "mine".into(),
        }],
        mounts: vec![cri::Mount {
            container_path: "/data".into(),
            host_path: "/pod/volume".into(),
            ..cri::Mount::default()
        }],
        ..cri::ContainerConfig::default()
    };
    let opts = RunOptions {
        envs: [("TEST_DEVICES".to_string(), "a".to_string())].into(),
        mounts: vec![
            cri::Mount {
                container_path: "/data".into(),
                host_path: "/elsewhere".into(),
                ..cri::Mount::default()
            },
            cri::Mount {
                container_path: "/dev-info".into(),
                host_path: "/run/x".into(),
                ..cri::Mount::default()
            },
        ],
        devices: vec![cri::Device {
            container_path: "/dev/test0".into(),
            host_path: "/dev/null".into(),
            permissions: "rw".into(),
        }],
        annotations: [("k".to_string(), "v".to_string())].into(),
        cdi_devices: vec!["vendor.com/gpu=0".into()],
    };
    opts.apply(&mut config);
    assert_eq!(config.envs.len(), 1);
    assert_eq!(config.envs[0].value, "a", "the plugin's value wins");
    // The pod's own mount at /data stays; the plugin's other mount is added.
    assert_eq!(config.mounts.len(), 2);
    assert_eq!(config.mounts[0].host_path, "/pod/volume");
    assert_eq!(config.devices.len(), 1);
    assert_eq!(config.annotations["k"], "v");
    assert_eq!(config.cdi_devices[0].name, "vendor.com/gpu=0");
}

#[test]
fn resource_names_a_plugin_may_register() {
    for ok in ["example.com/gpu", "nvidia.com/gpu", "test.device/e2e-abc_1"] {
        assert!(valid_resource_name(ok), "{ok}");
    }
    for bad in [
        "gpu",
        "kubernetes.io/gpu",
        "requests.example.com/gpu",
        "example.com/",
        "example.com/-x",
        "Example_.com/x",
        "example.com/a/b",
    ] {
        assert!(!valid_resource_name(bad), "{bad}");
    }
}

#[tokio::test]
async fn a_pod_asking_for_more_devices_than_exist_is_refused_not_given_none() {
    let s = setup();
    let (_tx, rx) = watch::channel(Some(vec![device("a", true)]));
    let _srv = serve_plugin(&s.dir, "p.sock", plugin(rx));
    register(&s.dir, "p.sock", RES).await.unwrap();
    wait_counts(&s.manager, RES, Some((1, 1))).await;
    for huge in ["1e30", "99999999999999999999999", "9223372036854775807"] {
        let mut p = pod_asking("u9", 1);
        let limits = p.spec.as_mut().unwrap().containers[0]
            .resources
            .as_mut()
            .unwrap()
            .limits
            .as_mut()
            .unwrap();
        limits.insert(
            RES.into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity(huge.into()),
        );
        let err = s.manager.allocate_pod(&p, |_| true).await.unwrap_err();
        assert!(
            err.starts_with("requested number of devices unavailable"),
            "{huge}: {err}"
        );
    }
    // Nothing was given.
    assert_eq!(s.manager.state().available(RES, |_| true), ["a"]);
}

#[test]
fn a_checkpoint_longer_than_the_bound_or_planted_as_garbage_holds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(super::CHECKPOINT);
    // A valid start, then more than MAX_CHECKPOINT_BYTES of device IDs: the
    // read is cut at the bound, so the file is unreadable and ignored.
    let mut text = String::from(
        r#"{"version":1,"registered":[],"entries":[{"pod_uid":"u","container_name":"c","resource_name":"example.com/dev","alloc_resp":"","device_ids":["#,
    );
    let id = r#""x","#;
    let n = usize::try_from(super::MAX_CHECKPOINT_BYTES).unwrap() / id.len() + 1;
    text.push_str(&id.repeat(n));
    text.push_str(r#""x"]}]}"#);
    std::fs::write(&path, &text).unwrap();
    assert!(DeviceManager::new(dir.path()).devices("u", "c").is_empty());
    // Unknown fields and a directory in the checkpoint's place change nothing.
    std::fs::write(
        &path,
        r#"{"version":1,"extra":{"a":1},"entries":[],"registered":["example.com/dev"]}"#,
    )
    .unwrap();
    let m = DeviceManager::new(dir.path());
    assert!(m.devices("u", "c").is_empty());
    std::fs::remove_file(&path).unwrap();
    // A FIFO in its place does not block the start.
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    assert!(DeviceManager::new(dir.path()).devices("u", "c").is_empty());
    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    assert!(DeviceManager::new(dir.path()).devices("u", "c").is_empty());
}
