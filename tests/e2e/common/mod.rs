//! Helpers for the end-to-end tests: they run against the local cluster of
//! `hack/local-up.sh` (the real kube-apiserver, containerd and the agent under test).

pub mod csi;
pub mod registry;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{Condition, await_condition};
use kube::{Api, Client};
use rustlet::cri::Runtime;

/// The repository root: `CARGO_MANIFEST_DIR` as cargo (or hack/test-e2e.sh)
/// sets it when the tests run, else as it was when they were built. A build
/// shared between checkouts keeps the path of the first, so the run's wins.
pub fn root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
}

/// The local cluster's state directory.
pub fn local() -> PathBuf {
    root().join("_output/local")
}

/// The agent's root directory in the local cluster.
pub fn rustlet_root() -> PathBuf {
    local().join("rustlet")
}

/// The agent's log so far (empty if there is none yet).
pub fn agent_log() -> String {
    std::fs::read_to_string(local().join("logs/rustlet.log")).unwrap_or_default()
}

/// The mount points at or under `dir` in this process's mount table.
pub fn mounted_under(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| std::path::Path::new(p).starts_with(dir))
        .map(str::to_string)
        .collect()
}

/// The log of container `c` of pod `ns/name`, as `kubectl logs` prints it.
pub fn logs(ns: &str, name: &str) -> String {
    kubectl(&["logs", "-n", ns, name, "-c", "c"], "").1
}

/// The agent's process ID, from the first line of the pid file
/// `hack/local-up.sh` writes (`_output/local/run/rustlet.pid`).
pub fn agent_pid() -> u32 {
    let text = std::fs::read_to_string(local().join("run/rustlet.pid"))
        .expect("rustlet pid file (is the agent rustlet?)");
    text.lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("a pid on the first line of the pid file")
}

/// Kills the agent with `kill -9` and starts it again with
/// `hack/local-up.sh --agent rustlet`; returns the new agent's pid.
pub fn kill_and_restart_agent() -> u32 {
    let pid = agent_pid();
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success(), "kill -9 {pid}");
    let up = std::process::Command::new(root().join("hack/local-up.sh"))
        .args(["--agent", "rustlet"])
        .status()
        .expect("hack/local-up.sh");
    assert!(up.success(), "restart the agent with hack/local-up.sh");
    let new = agent_pid();
    assert_ne!(new, pid, "a new agent process runs");
    new
}

/// Stops the agent (SIGTERM) and starts it again with `hack/local-up.sh
/// --agent rustlet`, reading the KubeletConfiguration `config`, or its usual
/// one (`_output/local/rustlet.yaml`) with `None`.
pub fn restart_agent(config: Option<&std::path::Path>) {
    restart_agent_flagged(config, &[], &[], || {});
}

/// Restarts the agent as [`restart_agent`], running `stopped` while it is
/// down (to remove state a new configuration does not accept).
pub fn restart_agent_after(config: Option<&std::path::Path>, stopped: impl FnOnce()) {
    restart_agent_flagged(config, &[], &[], stopped);
}

/// Restarts the agent as [`restart_agent`] with the usual configuration and
/// the flags `flags` besides (`RUSTLET_FLAGS` of `hack/local-up.sh`; none
/// may hold a space).
pub fn restart_agent_with_flags(flags: &[&str]) {
    restart_agent_flagged(None, flags, &[], || {});
}

/// Restarts the agent as [`restart_agent`] with `config` and the
/// environment variables `env` besides.
pub fn restart_agent_env(config: Option<&std::path::Path>, env: &[(&str, &str)]) {
    restart_agent_flagged(config, &[], env, || {});
}

fn restart_agent_flagged(
    config: Option<&std::path::Path>,
    flags: &[&str],
    env: &[(&str, &str)],
    stopped: impl FnOnce(),
) {
    assert!(flags.iter().all(|f| !f.contains(' ')), "{flags:?}");
    let pid = agent_pid();
    let killed = std::process::Command::new("kill")
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(killed.success(), "kill {pid}");
    for _ in 0..50 {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    stopped();
    let mut up = std::process::Command::new(root().join("hack/local-up.sh"));
    up.args(["--agent", "rustlet"]);
    match config {
        Some(c) => up.env("RUSTLET_CONFIG", c),
        None => up.env_remove("RUSTLET_CONFIG"),
    };
    up.env("RUSTLET_FLAGS", flags.join(" "));
    up.envs(env.iter().copied());
    assert!(
        up.status().expect("local-up").success(),
        "restart the agent"
    );
}

/// Restarts the agent ([`restart_agent`]) with its usual configuration
/// plus the KubeletConfiguration lines `extra`, written to
/// `_output/local/rustlet-<name>.yaml`; returns that file's path.
pub fn restart_agent_with(name: &str, extra: &str) -> std::path::PathBuf {
    let usual = std::fs::read_to_string(local().join("rustlet.yaml")).expect("rustlet.yaml");
    let config = local().join(format!("rustlet-{name}.yaml"));
    std::fs::write(&config, format!("{usual}{extra}")).expect("write the configuration");
    restart_agent(Some(&config));
    config
}

/// File `file` of cgroup `cgroup` (a path below the hierarchy's root) in
/// the host's cgroup v1 hierarchy `hierarchy`, trimmed.
pub fn cgroup_file(hierarchy: &str, cgroup: &str, file: &str) -> String {
    let path = format!("/sys/fs/cgroup/{hierarchy}/{cgroup}/{file}");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .to_string()
}

/// The node under test.
pub fn node_name() -> String {
    std::env::var("NODE_NAME").unwrap_or_else(|_| "local-node".into())
}

/// An admin client of the local cluster.
pub async fn client() -> Client {
    let path = std::env::var("E2E_KUBECONFIG")
        .map_or_else(|_| local().join("admin.kubeconfig"), PathBuf::from);
    let kc = Kubeconfig::read_from(&path)
        .expect("admin kubeconfig of the local cluster (run hack/local-up.sh)");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    Client::try_from(cfg).expect("client")
}

/// The local cluster's containerd, through rustlet's own CRI client.
pub async fn runtime() -> Runtime {
    let sock = local().join("containerd/containerd.sock");
    Runtime::connect(
        &format!("unix://{}", sock.display()),
        Duration::from_secs(30),
    )
    .await
    .expect("containerd of the local cluster")
}

/// Creates a fresh namespace `prefix-<n>` and waits for its default service account.
pub async fn namespace(client: &Client, prefix: &str) -> String {
    let name = format!(
        "{prefix}-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
            % 1_000_000_000
    );
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": name } })).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("create namespace");
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
    let deadline = Instant::now() + Duration::from_secs(30);
    while sas
        .get_opt("default")
        .await
        .expect("get service account")
        .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "no default service account in {name}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    name
}

/// Deletes a namespace (best effort, not waited for).
pub async fn drop_namespace(client: &Client, name: &str) {
    let _ = Api::<Namespace>::all(client.clone())
        .delete(name, &DeleteParams::default())
        .await;
}

/// A pod bound to the node under test (through the scheduler) with one container.
pub fn pod(name: &str, restart_policy: &str, image: &str, command: &[&str]) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "spec": {
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 5,
            "containers": [{ "name": "c", "image": image, "command": command, "imagePullPolicy": "IfNotPresent" }]
        }
    }))
    .unwrap()
}

/// The busybox image of the local cluster.
pub const BUSYBOX: &str = "docker.io/library/busybox:1.36";

/// Creates `pod` in `ns`.
pub async fn create(client: &Client, ns: &str, pod: &Pod) -> Pod {
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), pod)
        .await
        .expect("create pod")
}

/// Waits up to `secs` for `cond` on pod `name`; returns the pod.
pub async fn wait_for(
    client: &Client,
    ns: &str,
    name: &str,
    secs: u64,
    what: &str,
    cond: impl Condition<Pod>,
) -> Pod {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    match tokio::time::timeout(
        Duration::from_secs(secs),
        await_condition(api.clone(), name, cond),
    )
    .await
    {
        Ok(Ok(Some(p))) => p,
        Ok(Ok(None)) => panic!("pod {ns}/{name} was deleted while waiting for it to be {what}"),
        other => {
            let now = api.get_opt(name).await.ok().flatten();
            panic!(
                "pod {ns}/{name}: not {what} within {secs}s ({other:?}); status now: {:#?}",
                now.and_then(|p| p.status)
            )
        }
    }
}

/// Waits up to `secs` for pod `name` (UID `uid`) to be gone from the API.
pub async fn wait_deleted(client: &Client, ns: &str, name: &str, uid: &str, secs: u64) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let gone = kube::runtime::wait::conditions::is_deleted(uid);
    match tokio::time::timeout(
        Duration::from_secs(secs),
        await_condition(api.clone(), name, gone),
    )
    .await
    {
        Ok(Ok(_)) => {}
        other => panic!(
            "pod {ns}/{name}: not deleted within {secs}s ({other:?}); now: {:#?}",
            api.get_opt(name)
                .await
                .ok()
                .flatten()
                .map(|p| (p.metadata.deletion_timestamp, p.status))
        ),
    }
}

/// Pod phase is `phase`.
pub fn phase(phase: &'static str) -> impl Condition<Pod> {
    move |p: Option<&Pod>| p.and_then(|p| p.status.as_ref()?.phase.as_deref()) == Some(phase)
}

/// The first container's state, if it has one.
pub fn first_state(p: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerState> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()
}

/// The first container's waiting reason, if it waits.
pub fn waiting(p: &Pod) -> Option<String> {
    first_state(p)?.waiting.as_ref()?.reason.clone()
}

/// The first container waits with `reason`.
pub fn waiting_reason(reason: &'static str) -> impl Condition<Pod> {
    move |p: Option<&Pod>| p.and_then(waiting).as_deref() == Some(reason)
}

/// The first container's status.
pub fn container_status(p: &Pod) -> k8s_openapi::api::core::v1::ContainerStatus {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .cloned()
        .expect("container status")
}

/// The agnhost image of the local cluster (`netexec` serves HTTP and logs
/// every `/echo?msg=...` it answers).
pub const AGNHOST: &str = "registry.k8s.io/e2e-test-images/agnhost:2.66.1";

/// An API object from its JSON.
pub fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("valid object")
}

/// The pod condition of type `type_`, if the status has it.
pub fn pod_condition(p: &Pod, type_: &str) -> Option<k8s_openapi::api::core::v1::PodCondition> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
}

/// The pod's condition `type_` has status `status` (`"True"`, `"False"`).
pub fn condition_is(type_: &'static str, status: &'static str) -> impl Condition<Pod> {
    move |p: Option<&Pod>| {
        p.and_then(|p| pod_condition(p, type_))
            .is_some_and(|c| c.status == status)
    }
}

/// The log file of the first attempt of container `container` of pod
/// `ns/pod` (UID `uid`), under the local cluster's pod log directory.
pub fn log_path(ns: &str, pod: &str, uid: &str, container: &str) -> PathBuf {
    local().join(format!("pod-logs/{ns}_{pod}_{uid}/{container}/0.log"))
}

/// `kubectl` against the local cluster as its admin, with `stdin` as its
/// input, killed after 60 s: (exit code, stdout, stderr).
pub fn kubectl(args: &[&str], stdin: &str) -> (i32, String, String) {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let mut child = Command::new("timeout")
        .arg("60")
        .arg("kubectl")
        .args(args)
        .env("KUBECONFIG", local().join("admin.kubeconfig"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.as_bytes()).expect("write stdin");
    drop(input);
    let out = child.wait_with_output().expect("kubectl output");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `/<what>` of this node's API (`metrics`, `metrics/probes`), read through
/// the API server's node proxy as Prometheus scrapes it.
pub async fn scrape(client: &Client, what: &str) -> String {
    let path = format!("/api/v1/nodes/{}/proxy/{what}", node_name());
    client
        .request_text(axum::http::Request::get(path).body(Vec::new()).unwrap())
        .await
        .unwrap_or_else(|e| panic!("proxy/{what}: {e}"))
}

/// The value of the Prometheus sample whose line starts with `prefix` (its
/// name and labels).
pub fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix) && l[prefix.len()..].starts_with(' '))
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|v| v.parse().ok())
}

/// Which Events of a namespace [`wait_for_events`] lists.
pub enum Involving<'a> {
    /// The object with this UID.
    Uid(&'a str),
    /// The objects with this name (a pod and its containers).
    Name(&'a str),
    /// Every object of the namespace.
    Any,
}

/// Lists the Events of namespace `ns` about `involving`, every 0.5 s, until
/// `accept` returns `Some`, and returns that; panics after `secs` seconds with
/// `what` and the events last listed (`reason: message`).
///
/// The agent's event recorder posts Events apart from the pod's status, so an
/// Event may trail the status that caused it: tests wait for it.
pub async fn wait_for_events<T>(
    client: &Client,
    ns: &str,
    involving: Involving<'_>,
    secs: u64,
    what: &str,
    mut accept: impl FnMut(&[k8s_openapi::api::core::v1::Event]) -> Option<T>,
) -> T {
    let api: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), ns);
    let mut lp = kube::api::ListParams::default();
    lp = match involving {
        Involving::Uid(uid) => lp.fields(&format!("involvedObject.uid={uid}")),
        Involving::Name(name) => lp.fields(&format!("involvedObject.name={name}")),
        Involving::Any => lp,
    };
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let events = api.list(&lp).await.expect("list events").items;
        if let Some(found) = accept(&events) {
            return found;
        }
        let seen: Vec<String> = events
            .iter()
            .map(|e| {
                let reason = e.reason.as_deref().unwrap_or_default();
                let message = e.message.as_deref().unwrap_or_default();
                format!("{reason}: {message}")
            })
            .collect();
        assert!(
            Instant::now() < deadline,
            "{what}: not within {secs}s; events in {ns}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The first Event of namespace `ns` about `involving` with `reason`,
/// waited for at most 60 s ([`wait_for_events`]).
pub async fn wait_for_event(
    client: &Client,
    ns: &str,
    involving: Involving<'_>,
    reason: &str,
) -> k8s_openapi::api::core::v1::Event {
    wait_for_events(
        client,
        ns,
        involving,
        60,
        &format!("a {reason} event"),
        |events| {
            events
                .iter()
                .find(|e| e.reason.as_deref() == Some(reason))
                .cloned()
        },
    )
    .await
}

/// The messages of the `events` with `reason`, one per occurrence (an Event
/// counted `n` times gives its message `n` times); `None` if there is none,
/// as [`wait_for_events`] takes it.
pub fn messages(events: &[k8s_openapi::api::core::v1::Event], reason: &str) -> Option<Vec<String>> {
    let found: Vec<String> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .flat_map(|e| {
            let times = usize::try_from(e.count.unwrap_or(1).max(1)).unwrap_or(1);
            std::iter::repeat_n(e.message.clone().unwrap_or_default(), times)
        })
        .collect();
    (!found.is_empty()).then_some(found)
}

/// Waits for this node's Lease to be renewed after now, at most `secs`.
pub async fn lease_renewed(client: &Client, secs: u64) {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "kube-node-lease");
    let renew = |l: k8s_openapi::api::coordination::v1::Lease| {
        l.spec.and_then(|s| s.renew_time).expect("renewTime").0
    };
    let first = renew(leases.get(&node_name()).await.expect("lease"));
    let deadline = Instant::now() + Duration::from_secs(secs);
    while renew(leases.get(&node_name()).await.expect("lease")) <= first {
        assert!(
            Instant::now() < deadline,
            "the Lease was not renewed in {secs} s"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
