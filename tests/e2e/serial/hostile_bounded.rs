//! Bounded reads of what a pod writes, on the local cluster
//! (`hack/local-up.sh --agent rustlet`): a container that leaves a 400 MiB
//! termination message file, or 400 MiB of log and a failure under
//! `FallbackToLogsOnError`, gets a termination message of at most what the
//! kubelet reads (the last 4 KiB of the file; the last 2 KiB of the last 80 log
//! lines); an environment that doubles itself, and a `subPathExpr` that
//! repeats a 2 MiB variable 300 times, are refused with
//! `CreateContainerConfigError`; and through all of it the agent's peak
//! resident memory (`VmHWM`) grows by less than 32 MiB over what it held
//! before these pods came.

use crate::common::*;
use kube::ResourceExt;

/// How much the agent's peak resident memory may grow over what it held
/// before these pods came, in KiB (32 MiB: a read of the whole 400 MiB file
/// or log would go far past it; the agent's own size, which depends on the
/// build and on the tests run before, is not what is measured).
const MAX_AGENT_GROWTH_KIB: u64 = 32 * 1024;

/// The agent's resident set size (`VmRSS`) when its peak was reset, in KiB.
static BASE_RSS_KIB: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

/// Resets the agent's peak resident set size once per run of this file
/// (`5` to `/proc/<pid>/clear_refs` sets it to the current size) and returns
/// the size it was reset to, in KiB, so that the growth measured is the one
/// these pods cause, not one left by the end-to-end tests run before them on
/// the same agent.
fn reset_agent_hwm_once() -> u64 {
    *BASE_RSS_KIB.get_or_init(|| {
        let pid = agent_pid();
        std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
            .unwrap_or_else(|e| panic!("reset the peak RSS of the agent (pid {pid}): {e}"));
        agent_status_kib("VmRSS")
    })
}

/// One size field of the agent's `/proc/<pid>/status` (`VmHWM`, `VmRSS`), in
/// KiB.
fn agent_status_kib(field: &str) -> u64 {
    let pid = agent_pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e} (did the agent die?)"));
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// Asserts that the agent's peak resident memory grew by less than
/// [`MAX_AGENT_GROWTH_KIB`] since [`reset_agent_hwm_once`]; `what` names the
/// case in the message.
fn assert_bounded_growth(base: u64, what: &str) {
    let hwm = agent_status_kib("VmHWM");
    let growth = hwm.saturating_sub(base);
    assert!(
        growth < MAX_AGENT_GROWTH_KIB,
        "{what}: agent peak RSS {hwm} KiB, {growth} KiB over the {base} KiB it held before, \
         more than {MAX_AGENT_GROWTH_KIB} KiB"
    );
    println!("{what}: agent VmHWM {hwm} KiB, {growth} KiB over {base} KiB");
}

/// A pod whose one busybox container runs `script` once.
fn once(name: &str, script: &str, policy: &str) -> k8s_openapi::api::core::v1::Pod {
    from_json(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c",
                "image": BUSYBOX,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script],
                "terminationMessagePolicy": policy,
            }]
        }
    }))
}

/// The message of the first container's terminated state.
fn terminated_message(p: &k8s_openapi::api::core::v1::Pod) -> String {
    container_status(p)
        .state
        .and_then(|s| s.terminated)
        .and_then(|t| t.message)
        .unwrap_or_default()
}

/// Environment variables `V0` (8 bytes) to `V<last>`, each the one before
/// it twice: `V<n>` is 8·2ⁿ bytes once expanded.
fn doubling_env(last: u32) -> Vec<serde_json::Value> {
    let mut env = vec![serde_json::json!({ "name": "V0", "value": "xxxxxxxx" })];
    for i in 1..=last {
        let prev = format!("$(V{})", i - 1);
        env.push(serde_json::json!({ "name": format!("V{i}"), "value": prev.repeat(2) }));
    }
    env
}

/// Waits for pod `name`'s container to wait with
/// `CreateContainerConfigError`, drops the namespace and returns the
/// waiting message.
async fn config_error(client: &kube::Client, ns: &str, name: &str) -> String {
    let waiting = wait_for(
        client,
        ns,
        name,
        90,
        "CreateContainerConfigError",
        waiting_reason("CreateContainerConfigError"),
    )
    .await;
    drop_namespace(client, ns).await;
    container_status(&waiting)
        .state
        .and_then(|s| s.waiting)
        .and_then(|w| w.message)
        .unwrap_or_default()
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_400_mib_termination_message_file_gives_its_last_4_kib() {
    let base = reset_agent_hwm_once();
    let client = client().await;
    let ns = namespace(&client, "e2e-term-file").await;
    // 400 MiB of `a`, then a marker that only a read from the end sees.
    let script = "head -c 419430400 /dev/zero | tr '\\0' a > /dev/termination-log; \
                  printf THE-END >> /dev/termination-log";
    create(&client, &ns, &once("big", script, "File")).await;
    let done = wait_for(&client, &ns, "big", 180, "Succeeded", phase("Succeeded")).await;
    let message = terminated_message(&done);
    drop_namespace(&client, &ns).await;
    assert_eq!(message.len(), 4096, "the last 4 KiB of the file");
    assert!(
        message.ends_with("aaaTHE-END"),
        "read from the end: {message:.40}…"
    );
    assert_bounded_growth(base, "termination file");
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn fallback_to_a_400_mib_log_gives_the_last_2_kib() {
    let base = reset_agent_hwm_once();
    let client = client().await;
    let ns = namespace(&client, "e2e-term-log").await;
    // 400 MiB on one line (the runtime splits it into 16 KiB partial lines),
    // then two short lines and a failure.
    let script = "head -c 419430400 /dev/zero | tr '\\0' a; echo; echo the end; exit 3";
    create(
        &client,
        &ns,
        &once("biglog", script, "FallbackToLogsOnError"),
    )
    .await;
    let done = wait_for(&client, &ns, "biglog", 180, "Failed", phase("Failed")).await;
    let message = terminated_message(&done);
    let uid = done.uid().unwrap_or_default();
    let log = std::fs::metadata(log_path(&ns, "biglog", &uid, "c")).map_or(0, |m| m.len());
    drop_namespace(&client, &ns).await;
    assert_eq!(message.len(), 2048, "the last 2 KiB of the log");
    assert!(message.ends_with("aaa\nthe end\n"), "{message:.40}…");
    assert_bounded_growth(base, &format!("log fallback ({log} bytes of log)"));
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn an_environment_that_doubles_itself_is_refused_within_bounded_memory() {
    let base = reset_agent_hwm_once();
    let client = client().await;
    let ns = namespace(&client, "e2e-env-bomb").await;
    // V24 alone is 128 MiB.
    let env = doubling_env(24);
    let p = from_json(serde_json::json!({
        "metadata": { "name": "envbomb" },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c",
                "image": BUSYBOX,
                "imagePullPolicy": "IfNotPresent",
                "command": ["true"],
                "env": env,
            }]
        }
    }));
    create(&client, &ns, &p).await;
    let message = config_error(&client, &ns, "envbomb").await;
    assert!(
        message.contains("takes more than 6291456 bytes with variable \"V19\""),
        "{message}"
    );
    assert_bounded_growth(base, "environment bomb");
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_sub_path_expr_that_repeats_a_large_variable_is_refused_within_bounded_memory() {
    let base = reset_agent_hwm_once();
    let client = client().await;
    let ns = namespace(&client, "e2e-subpath-bomb").await;
    // V0 is 8 bytes and each next one twice the last: V18 is 2 MiB, the whole
    // environment 4 MiB (within the 6 MiB an environment may take); the
    // sub path names V18 300 times, 600 MiB if it were expanded.
    let env = doubling_env(18);
    let p = from_json(serde_json::json!({
        "metadata": { "name": "subpathbomb" },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "volumes": [{ "name": "scratch", "emptyDir": {} }],
            "containers": [{
                "name": "c",
                "image": BUSYBOX,
                "imagePullPolicy": "IfNotPresent",
                "command": ["true"],
                "env": env,
                "volumeMounts": [{
                    "name": "scratch",
                    "mountPath": "/scratch",
                    "subPathExpr": "$(V18)".repeat(300),
                }],
            }]
        }
    }));
    create(&client, &ns, &p).await;
    let message = config_error(&client, &ns, "subpathbomb").await;
    assert!(
        message.contains("expands to more than 4096 bytes"),
        "{message}"
    );
    assert_bounded_growth(base, "subPathExpr bomb");
}
