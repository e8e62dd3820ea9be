//! End-to-end scenarios of the pod lifecycle on the local cluster
//! (`hack/local-up.sh --agent rustlet`): init containers, the container
//! environment with `$(VAR)` expansion and ConfigMap/Secret sources,
//! termination messages, the runAsNonRoot check, ephemeral containers, and
//! container-level restart policies and rules.

use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::core::v1::{ConfigMap, ContainerStatus, Pod, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};

/// Waits for the container log of the first attempt of `container` to contain `want`.
async fn log_contains(ns: &str, pod: &Pod, container: &str, want: &str) {
    let path = log_path(ns, &pod.name_any(), &pod.uid().unwrap(), container);
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

/// The status of ephemeral container `name`, if reported.
fn ephemeral_status(p: &Pod, name: &str) -> Option<ContainerStatus> {
    p.status
        .as_ref()?
        .ephemeral_container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == name)
        .cloned()
}

/// Adds ephemeral container `ec` to pod `name` through the
/// `pods/ephemeralcontainers` subresource, as `kubectl debug` does.
async fn add_ephemeral(client: &kube::Client, ns: &str, name: &str, ec: serde_json::Value) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let patch = serde_json::json!({ "spec": { "ephemeralContainers": [ec] } });
    api.patch_subresource(
        "ephemeralcontainers",
        name,
        &PatchParams::default(),
        &Patch::Strategic(patch),
    )
    .await
    .expect("add an ephemeral container");
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn ephemeral_containers_run_once_in_the_targets_process_namespace() {
    let client = client().await;
    let ns = namespace(&client, "e2e-ephemeral").await;
    create(
        &client,
        &ns,
        &pod("target", "Always", BUSYBOX, &["sleep", "3600"]),
    )
    .await;
    wait_for(&client, &ns, "target", 60, "Running", phase("Running")).await;

    // A debugger in the process namespace of container c: its PID 1 is c's sleep.
    add_ephemeral(
        &client,
        &ns,
        "target",
        serde_json::json!({
            "name": "debugger", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "targetContainerName": "c", "stdin": true, "tty": true,
            "command": ["sh", "-c", "echo polo; exec sleep 1000"]
        }),
    )
    .await;
    let running = wait_for(
        &client,
        &ns,
        "target",
        60,
        "running its debugger",
        |p: Option<&Pod>| {
            p.and_then(|p| ephemeral_status(p, "debugger"))
                .and_then(|s| s.state?.running)
                .is_some()
        },
    )
    .await;
    let st = ephemeral_status(&running, "debugger").unwrap();
    assert!(!st.ready, "ephemeral containers are never ready");
    assert_eq!(st.restart_count, 0);
    assert_eq!(
        running.status.as_ref().unwrap().phase.as_deref(),
        Some("Running")
    );

    let (code, out, err) = kubectl(
        &[
            "exec",
            "-n",
            &ns,
            "target",
            "-c",
            "debugger",
            "--",
            "cat",
            "/proc/1/cmdline",
        ],
        "",
    );
    assert_eq!(code, 0, "exec in the ephemeral container: {err}");
    assert_eq!(out, "sleep\u{0}3600\u{0}", "PID 1 is the target's process");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, logs, err) = kubectl(&["logs", "-n", &ns, "target", "-c", "debugger"], "");
        if logs.contains("polo") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no 'polo' in the logs: {logs:?} {err}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // One that exits is never restarted and leaves the pod's phase alone.
    add_ephemeral(
        &client,
        &ns,
        "target",
        serde_json::json!({
            "name": "once", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", "exit 3"]
        }),
    )
    .await;
    wait_for(
        &client,
        &ns,
        "target",
        60,
        "with its second ephemeral container exited",
        |p: Option<&Pod>| {
            p.and_then(|p| ephemeral_status(p, "once"))
                .and_then(|s| s.state?.terminated)
                .is_some_and(|t| t.exit_code == 3)
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let later = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("target")
        .await
        .unwrap();
    let once = ephemeral_status(&later, "once").unwrap();
    assert!(once.state.unwrap().terminated.is_some(), "still terminated");
    assert_eq!(once.restart_count, 0);
    assert_eq!(later.status.unwrap().phase.as_deref(), Some("Running"));
    drop_namespace(&client, &ns).await;
}

/// A pod whose container `c` fails with `first` on its first run and `then`
/// afterwards (an emptyDir remembers the first run), under the pod's
/// `pod_policy` and the container's own `policy` and `rules`.
fn runs_twice(name: &str, pod_policy: &str, first: i32, then: i32, own: serde_json::Value) -> Pod {
    let script =
        format!("if [ -f /data/ran ]; then exit {then}; fi; touch /data/ran; exit {first}");
    let mut c = serde_json::json!({
        "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", script],
        "volumeMounts": [{ "name": "data", "mountPath": "/data" }]
    });
    c.as_object_mut()
        .unwrap()
        .extend(own.as_object().unwrap().clone());
    from_json(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "restartPolicy": pod_policy,
            "terminationGracePeriodSeconds": 5,
            "containers": [c],
            "volumes": [{ "name": "data", "emptyDir": {} }]
        }
    }))
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn container_restart_policy_and_rules_override_the_pods() {
    let client = client().await;
    let ns = namespace(&client, "e2e-restart-rules").await;
    let rule = serde_json::json!({
        "restartPolicy": "Never",
        "restartPolicyRules": [{ "action": "Restart", "exitCodes": { "operator": "In", "values": [42] } }]
    });
    // (pod, final phase, restarts)
    let cases = [
        (
            // Exit 42 matches the rule: restarted once; exit 1 does not: done.
            runs_twice("rule", "Never", 42, 1, rule),
            "Failed",
            1,
        ),
        (
            // The container's Never wins over the pod's Always.
            runs_twice(
                "own-never",
                "Always",
                1,
                1,
                serde_json::json!({ "restartPolicy": "Never" }),
            ),
            "Failed",
            0,
        ),
        (
            // The container's OnFailure under the pod's Never: a failure is
            // retried in place (the pod stays Running), then it succeeds.
            runs_twice(
                "own-on-failure",
                "Never",
                1,
                0,
                serde_json::json!({ "restartPolicy": "OnFailure" }),
            ),
            "Succeeded",
            1,
        ),
    ];
    for (p, _, _) in &cases {
        create(&client, &ns, p).await;
    }
    for (p, want, restarts) in cases {
        let name = p.name_any();
        let done = wait_for(&client, &ns, &name, 90, want, phase(want)).await;
        let c = container_status(&done);
        assert_eq!(c.restart_count, restarts, "{name}: restarts");
    }
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_restart_all_containers_rule_restarts_every_container_in_the_same_sandbox() {
    let client = client().await;
    let ns = namespace(&client, "e2e-restart-all").await;
    let sh = |name: &str, script: &str| {
        serde_json::json!({
            "name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", script],
            "volumeMounts": [{ "name": "work", "mountPath": "/mnt" }],
        })
    };
    let mut source = sh(
        "source",
        "if [ -f /mnt/restarted ]; then sleep 3600; else touch /mnt/restarted; sleep 2; exit 42; fi",
    );
    source["restartPolicy"] = serde_json::json!("Never");
    source["restartPolicyRules"] = serde_json::json!([{
        "action": "RestartAllContainers",
        "exitCodes": { "operator": "In", "values": [42] },
    }]);
    let mut sidecar = sh("sidecar", "sleep 3600");
    sidecar["restartPolicy"] = serde_json::json!("Always");
    let p: Pod = from_json(serde_json::json!({
        "metadata": { "name": "all" },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "initContainers": [sh("init", "echo init >> /mnt/runs"), sidecar],
            "containers": [source, sh("regular", "sleep 3600")],
            "volumes": [{ "name": "work", "emptyDir": {} }],
        }
    }));
    create(&client, &ns, &p).await;
    let every_container_restarted = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref()).is_some_and(|st| {
            let all: Vec<&ContainerStatus> = st
                .init_container_statuses
                .iter()
                .flatten()
                .chain(st.container_statuses.iter().flatten())
                .collect();
            // The regular init container's first run may be gone by now:
            // the container GC keeps one dead instance per container, and
            // it has two, so its last state may be empty (as with the
            // kubelet). Its restart count stays.
            all.len() == 4
                && all.iter().all(|c| {
                    c.restart_count > 0
                        && (c.name == "init"
                            || c.last_state
                                .as_ref()
                                .is_some_and(|s| s.terminated.is_some()))
                })
                && st
                    .container_statuses
                    .iter()
                    .flatten()
                    .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
    };
    let first_ip = wait_for(&client, &ns, "all", 60, "Running", phase("Running"))
        .await
        .status
        .and_then(|s| s.pod_ip);
    let done = wait_for(
        &client,
        &ns,
        "all",
        120,
        "every container restarted",
        every_container_restarted,
    )
    .await;
    let st = done.status.clone().unwrap_or_default();
    assert_eq!(st.pod_ip, first_ip, "the same sandbox");
    let restarting = st
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "AllContainersRestarting")
        .map(|c| c.status.clone());
    assert_eq!(restarting.as_deref(), Some("False"), "restarted and done");
    // The init container ran twice, in the same emptyDir.
    let (code, out, err) = kubectl(
        &[
            "exec",
            "-n",
            &ns,
            "all",
            "-c",
            "regular",
            "--",
            "cat",
            "/mnt/runs",
        ],
        "",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 2, "{out}");
    drop_namespace(&client, &ns).await;
}

/// When the rest of a pod finished, its sidecars stop as the kubelet's
/// `killContainersWithSyncResult` stops them: every preStop hook at once,
/// then each sidecar in its turn, the later-started first; the pod then
/// succeeds (it is not held `Pending` by its stopped sidecars).
#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn sidecars_stop_together_in_reverse_order_once_the_pod_finished() {
    let client = client().await;
    let ns = namespace(&client, "e2e-sidecar-stop").await;
    // A sidecar logs "exit" when its TERM comes; its preStop hook logs
    // "prestop" to its output, then takes `hook_secs`.
    let sidecar = |name: &str, hook_secs: u32| {
        serde_json::json!({
            "name": name, "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
            "restartPolicy": "Always",
            "command": ["sh", "-c", "trap 'echo exit; exit 0' TERM; while true; do sleep 0.1; done"],
            "lifecycle": { "preStop": { "exec": { "command": [
                "sh", "-c", format!("echo prestop > /proc/1/fd/1; sleep {hook_secs}"),
            ] } } },
        })
    };
    let p: Pod = from_json(serde_json::json!({
        "metadata": { "name": "done" },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 30,
            "initContainers": [sidecar("side-1", 1), sidecar("side-2", 4)],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "2"],
            }],
        }
    }));
    let created = create(&client, &ns, &p).await;
    let done = wait_for(&client, &ns, "done", 90, "Succeeded", phase("Succeeded")).await;
    let st = done.status.unwrap_or_default();
    for s in st.init_container_statuses.iter().flatten() {
        let t = s.state.as_ref().and_then(|s| s.terminated.as_ref());
        assert_eq!(t.map(|t| t.exit_code), Some(0), "{} stopped: {s:?}", s.name);
    }
    // When each sidecar logged `what`, from the CRI log's own timestamps.
    let uid = created.uid().unwrap();
    let when = |container: &str, what: &str| {
        let text = std::fs::read_to_string(log_path(&ns, "done", &uid, container)).unwrap();
        let line = text
            .lines()
            .find(|l| l.ends_with(&format!(" {what}")))
            .unwrap_or_else(|| panic!("{container} logged no {what:?}: {text:?}"));
        let ts = line.split(' ').next().unwrap();
        ts.parse::<k8s_openapi::jiff::Timestamp>().unwrap()
    };
    let apart = when("side-1", "prestop").duration_since(when("side-2", "prestop"));
    assert!(
        apart.abs() < k8s_openapi::jiff::SignedDuration::from_secs(1),
        "the preStop hooks ran {apart:?} apart"
    );
    // side-1's hook ends first, but it stops only after side-2, which started
    // after it.
    assert!(
        when("side-2", "exit") < when("side-1", "exit"),
        "side-2 stopped before side-1"
    );
    drop_namespace(&client, &ns).await;
}

/// restartPolicy Never: a sidecar that keeps failing and an init container
/// after it that fails. The pod fails (as the kubelet's `getPhase`: failed
/// initialization with Never), whatever the sidecar before it does, and
/// nothing of it runs any more.
#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn an_init_container_that_fails_fails_the_pod_behind_a_failing_sidecar() {
    let client = client().await;
    let ns = namespace(&client, "e2e-init-fails").await;
    let p: Pod = from_json(serde_json::json!({
        "metadata": { "name": "fails" },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "initContainers": [
                { "name": "side", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                  "restartPolicy": "Always", "command": ["sh", "-c", "sleep 5; exit 1"] },
                { "name": "init", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                  "command": ["sh", "-c", "sleep 1; exit 1"] },
            ],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "600"],
            }],
        }
    }));
    create(&client, &ns, &p).await;
    let failed = wait_for(&client, &ns, "fails", 60, "Failed", phase("Failed")).await;
    let st = failed.status.unwrap_or_default();
    let init = st
        .init_container_statuses
        .iter()
        .flatten()
        .find(|s| s.name == "init")
        .expect("init's status");
    let t = init.state.as_ref().and_then(|s| s.terminated.as_ref());
    assert_eq!(t.map(|t| t.exit_code), Some(1), "{init:?}");
    // The main container never started.
    for s in st.container_statuses.iter().flatten() {
        assert!(
            s.state.as_ref().is_some_and(|x| x.running.is_none()),
            "{s:?}"
        );
    }
    drop_namespace(&client, &ns).await;
}

/// An init container with a memory limit (the only limit of the pod) that
/// the OOM killer ends: the pod is Burstable (init containers count, as the
/// API server classed it), and with restartPolicy Never it fails with the
/// init container `OOMKilled`.
#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn an_oom_killed_init_container_fails_its_burstable_pod() {
    let client = client().await;
    let ns = namespace(&client, "e2e-init-oom").await;
    let p: Pod = from_json(serde_json::json!({
        "metadata": { "name": "oom" },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "initContainers": [{
                "name": "oom", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "dd if=/dev/zero of=/dev/null bs=64M count=1"],
                "resources": { "limits": { "memory": "15Mi" } },
            }],
            "containers": [{
                "name": "main", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "600"],
            }],
        }
    }));
    create(&client, &ns, &p).await;
    let failed = wait_for(&client, &ns, "oom", 60, "Failed", phase("Failed")).await;
    let st = failed.status.unwrap_or_default();
    assert_eq!(st.qos_class.as_deref(), Some("Burstable"));
    let init = &st.init_container_statuses.unwrap_or_default()[0];
    let t = init.state.as_ref().and_then(|s| s.terminated.as_ref());
    assert_eq!(
        t.and_then(|t| t.reason.as_deref()),
        Some("OOMKilled"),
        "{init:?}"
    );
    drop_namespace(&client, &ns).await;
}
