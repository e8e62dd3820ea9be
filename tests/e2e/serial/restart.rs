//! Restart safety on the local cluster: after `kill -9` of the agent and a
//! restart, every running container is adopted from CRI labels; none restarts
//! and no status changes; pods deleted while it was down are cleaned up; a
//! CSI volume whose mount or teardown the agent died in ends mounted once or
//! not at all, its data kept. On SIGTERM the agent gives its pod workers
//! a few seconds, drains its node API and exits. The tests stop the agent:
//! run them one at a time (`--test-threads 1`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use rustlet::labels::POD_UID_LABEL;

fn snapshot(pods: &[Pod]) -> Vec<(String, String, i32, String)> {
    let mut v: Vec<_> = pods
        .iter()
        .map(|p| {
            let cs = container_status(p);
            let started = format!(
                "{:?}",
                cs.state.and_then(|s| s.running).and_then(|r| r.started_at)
            );
            (
                p.metadata.name.clone().unwrap(),
                cs.container_id.unwrap_or_default(),
                cs.restart_count,
                started,
            )
        })
        .collect();
    v.sort();
    v
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn kill_and_restart_adopts_running_pods() {
    let client = client().await;
    let ns = namespace(&client, "e2e-adopt").await;
    for i in 0..5 {
        create(
            &client,
            &ns,
            &pod(&format!("p{i}"), "Always", BUSYBOX, &["sleep", "3600"]),
        )
        .await;
    }
    for i in 0..5 {
        wait_for(
            &client,
            &ns,
            &format!("p{i}"),
            90,
            "Running",
            phase("Running"),
        )
        .await;
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let before = snapshot(&api.list(&ListParams::default()).await.unwrap().items);

    kill_and_restart_agent();
    // Give the new agent several sync periods to (wrongly) restart anything.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let after_pods = api.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(
        snapshot(&after_pods),
        before,
        "containers, restart counts and start times are unchanged"
    );
    for p in &after_pods {
        assert_eq!(p.status.as_ref().unwrap().phase.as_deref(), Some("Running"));
    }

    // Pods deleted while the agent is down are cleaned up when it is back:
    // p0 gracefully (the pod object waits for the agent), p1 forcefully (only
    // the runtime still knows it).
    let uid = |name: &str| {
        after_pods
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .unwrap()
            .metadata
            .uid
            .clone()
            .unwrap()
    };
    let (uid0, uid1) = (uid("p0"), uid("p1"));
    let pid = agent_pid();
    assert!(
        std::process::Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    api.delete("p0", &DeleteParams::default()).await.unwrap();
    api.delete(
        "p1",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
    )
    .await
    .unwrap();
    let up = std::process::Command::new(root().join("hack/local-up.sh"))
        .args(["--agent", "rustlet"])
        .status()
        .unwrap();
    assert!(up.success());
    wait_deleted(&client, &ns, "p0", &uid0, 20).await;
    let rt = runtime().await;
    for uid in [uid0, uid1] {
        let by_uid = HashMap::from([(POD_UID_LABEL.to_string(), uid.clone())]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !rt
            .list_pod_sandboxes(by_uid.clone())
            .await
            .unwrap()
            .is_empty()
            || !rt.list_containers(by_uid.clone()).await.unwrap().is_empty()
        {
            assert!(
                Instant::now() < deadline,
                "sandboxes or containers of deleted pod {uid} are left"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn sigterm_drains_the_node_api_and_exits() {
    use std::io::BufRead as _;
    let client = client().await;
    let ns = namespace(&client, "e2e-sigterm").await;
    create(
        &client,
        &ns,
        &pod(
            "ticker",
            "Always",
            BUSYBOX,
            &["sh", "-c", "while true; do echo tick; sleep 1; done"],
        ),
    )
    .await;
    wait_for(&client, &ns, "ticker", 60, "Running", phase("Running")).await;
    // A pod whose stop takes a minute (its preStop hook): its worker is
    // busy with it when the signal comes, and does not hold the exit.
    let mut lingering = pod("lingering", "Always", BUSYBOX, &["sleep", "3600"]);
    if let Some(spec) = lingering.spec.as_mut() {
        spec.termination_grace_period_seconds = Some(60);
        spec.containers[0].lifecycle = Some(from_json(serde_json::json!({
            "preStop": {"exec": {"command": ["sleep", "60"]}}
        })));
    }
    create(&client, &ns, &lingering).await;
    wait_for(&client, &ns, "lingering", 60, "Running", phase("Running")).await;
    let mut logs = std::process::Command::new("kubectl")
        .args(["logs", "-f", "-n", &ns, "ticker"])
        .env("KUBECONFIG", local().join("admin.kubeconfig"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("kubectl logs -f");
    let mut lines = std::io::BufReader::new(logs.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "tick", "the follow streams");
    std::thread::spawn(move || lines.for_each(drop));

    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("lingering", &DeleteParams::default())
        .await
        .expect("delete lingering");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pid = agent_pid();
    let term = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    // The follow ends cleanly (not cut off) and the agent exits, both
    // within the workers' grace (5 s) and the drain period (5 s).
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = logs.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "kubectl logs -f still runs");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "kubectl logs -f: {status}");
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            Instant::now() < deadline,
            "the agent still runs after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = agent_log();
    let drained = log
        .rfind("draining the node API")
        .expect("the node API drained");
    assert!(
        log[drained..].contains("rustlet::agent: stopped"),
        "{}",
        &log[drained..]
    );
    assert!(
        log[..drained].contains("pod workers still busy after the grace period"),
        "the busy worker was left behind"
    );

    let up = std::process::Command::new(root().join("hack/local-up.sh"))
        .args(["--agent", "rustlet"])
        .status()
        .unwrap();
    assert!(up.success(), "restart the agent with hack/local-up.sh");
    let p = wait_for(&client, &ns, "ticker", 30, "Running", phase("Running")).await;
    assert_eq!(
        container_status(&p).restart_count,
        0,
        "the container ran on while the agent was away"
    );
    drop_namespace(&client, &ns).await;
}

/// Waits up to 60 s for the CSI driver to log `needle`.
async fn driver_begins(needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !crate::common::csi::driver_logged(needle) {
        assert!(
            Instant::now() < deadline,
            "the driver never logged {needle:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn kill_during_a_csi_mount_and_its_teardown_leaves_it_mounted_once_or_not_at_all() {
    use crate::common::csi::*;
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use kube::ResourceExt;

    let client = client().await;
    // Each mount and unmount of the driver waits 2 s: the agent is killed
    // meanwhile.
    let (_stack, ns, class) = stack_in_namespace(&client, "e2e-csi-kill", 2).await;
    let claim: PersistentVolumeClaim = from_json(serde_json::json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
            "resources": {"requests": {"storage": "16Mi"}}},
    }));
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    claims
        .create(&Default::default(), &claim)
        .await
        .expect("create claim");
    let user = |name: &str| -> Pod {
        from_json(serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                "containers": [{
                    "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", "echo run >> /data/runs && cat /data/runs && exec sleep 3600"],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }],
            },
        }))
    };

    // Killed while the driver stages the volume for the first pod.
    let first = create(&client, &ns, &user("first")).await;
    driver_begins("NodeStageVolume begins").await;
    kill_and_restart_agent();
    wait_for(&client, &ns, "first", 120, "Running", phase("Running")).await;
    let uid = first.uid().unwrap_or_default();
    let pv_name = claims
        .get("data")
        .await
        .expect("claim")
        .spec
        .and_then(|s| s.volume_name)
        .expect("bound");
    let handle = volume_handle(&client, &pv_name).await;
    let rustlet_root = rustlet_root();
    let staging = rustlet::volume::csi::staging_path(&rustlet_root, DRIVER, &handle);
    let target = rustlet::volume::csi::volume_dir(&rustlet_root, &uid, &pv_name).join("mount");
    assert_eq!(times_mounted(&staging), 1, "staged once");
    assert_eq!(times_mounted(&target), 1, "published once");
    let (_, log, _) = kubectl(&["logs", "-n", &ns, "first"], "");
    assert_eq!(log.trim(), "run");

    // Killed while the driver unpublishes it, the pod deleted.
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("first", &DeleteParams::default())
        .await
        .expect("delete first");
    driver_begins("NodeUnpublishVolume begins").await;
    kill_and_restart_agent();
    wait_deleted(&client, &ns, "first", &uid, 120).await;
    eventually(60, "unpublished and unstaged", || {
        let (staging, target) = (staging.clone(), target.clone());
        async move {
            match (times_mounted(&target), times_mounted(&staging)) {
                (0, 0) => Ok(()),
                other => Err(format!("mounted (target, staging): {other:?}")),
            }
        }
    })
    .await;
    let kept = stack_dir().join("state/volumes").join(&handle).join("runs");
    assert_eq!(
        std::fs::read_to_string(&kept).expect("the data").trim(),
        "run"
    );

    // The next pod finds the data.
    let second = create(&client, &ns, &user("second")).await;
    wait_for(&client, &ns, "second", 120, "Running", phase("Running")).await;
    let (_, log, _) = kubectl(&["logs", "-n", &ns, "second"], "");
    assert_eq!(log.trim(), "run\nrun");
    // Torn down before the driver goes.
    Api::<Pod>::namespaced(client.clone(), &ns)
        .delete("second", &DeleteParams::default())
        .await
        .expect("delete second");
    wait_deleted(
        &client,
        &ns,
        "second",
        &second.uid().unwrap_or_default(),
        120,
    )
    .await;
    eventually(60, "the second pod's volume unstaged", || {
        let staging = staging.clone();
        async move {
            (times_mounted(&staging) == 0)
                .then_some(())
                .ok_or_else(|| "still staged".to_string())
        }
    })
    .await;
    let _ = claims.delete("data", &Default::default()).await;
    remove_driver_and_class(&class);
    drop_namespace(&client, &ns).await;
}
