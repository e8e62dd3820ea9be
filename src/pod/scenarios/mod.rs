//! Scenario tests of the pod worker, in process and without a cluster, in the
//! manner of the kubelet's `TestSyncPod*` (a fake runtime) and kube-rs
//! controller-rs (a fake API server asserting each request): the real
//! [`reconcile`] runs against the in-memory CRI runtime
//! ([`crate::cri::fake`], served over a unix socket, reached through the real
//! CRI client) and a fake API server behind a real `kube::Client`. Each
//! scenario asserts the exact runtime calls and API requests of each sync.

mod leaks;
mod resize;
mod static_pods;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, EnvVar, EnvVarSource, ExecAction, Lifecycle, LifecycleHandler, Pod,
    PodSecurityContext, PodStatus, Probe, ResourceFieldSelector, ResourceRequirements, SleepAction,
    Sysctl, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use kube::runtime::reflector;
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::mpsc::UnboundedReceiver;

use super::env_sources::SourceReader;
use super::image_manager::{ImageManager, PullConcurrency};
use super::runtime_manager::RuntimeManager;
use super::status_manager::StatusManager;
use super::worker::{Context, Parts, reconcile};
use crate::cri::fake::FakeRuntime;
use crate::events::Recorder;
use crate::fake_api::{self as api, FakeApi};
use crate::fixtures::pod;
use crate::pod_core::facts::NodeContext;
use crate::pod_core::status::StatusContext;
use crate::volume::VolumeManager;

/// An image the runtime has (tagged: pull policy `IfNotPresent`).
const IMAGE: &str = "busybox:1.36";
/// The status path of pod `web`.
const WEB_STATUS: &str = "PATCH /api/v1/namespaces/default/pods/web/status";

/// One node: the fake runtime and API server, and the pod worker's context.
struct Node {
    api: FakeApi,
    cri: FakeRuntime,
    ctx: Arc<Context>,
    pods: super::sources::PodSources,
    _probes: UnboundedReceiver<kube::runtime::reflector::ObjectRef<Pod>>,
    dir: Arc<tempfile::TempDir>,
}

impl Node {
    /// A node with an empty runtime (but [`IMAGE`]) and an empty API.
    async fn start() -> Self {
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        let (cri, _) = FakeRuntime::serve(dir.path()).expect("serve the fake runtime");
        cri.add_image(IMAGE);
        Self::with(FakeApi::default(), cri, dir).await
    }

    /// The same node after an agent restart: the same runtime and API, every
    /// manager new and empty.
    async fn restart(&self) -> Self {
        Self::with(self.api.clone(), self.cri.clone(), self.dir.clone()).await
    }

    async fn with(api: FakeApi, cri: FakeRuntime, dir: Arc<tempfile::TempDir>) -> Self {
        Self::with_node(api, cri, dir, true, None).await
    }

    /// A node whose pods get cgroups of their own in `cgroups`.
    async fn start_with_cgroups(cgroups: crate::cgroups::CgroupManager) -> Self {
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        let (cri, _) = FakeRuntime::serve(dir.path()).expect("serve the fake runtime");
        cri.add_image(IMAGE);
        Self::with_node(FakeApi::default(), cri, dir, true, Some(cgroups)).await
    }

    /// A node whose Node object is not listed yet (the API server has not
    /// answered).
    async fn start_unregistered() -> Self {
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        let (cri, _) = FakeRuntime::serve(dir.path()).expect("serve the fake runtime");
        cri.add_image(IMAGE);
        Self::with_node(FakeApi::default(), cri, dir, false, None).await
    }

    async fn with_node(
        api: FakeApi,
        cri: FakeRuntime,
        dir: Arc<tempfile::TempDir>,
        node_listed: bool,
        cgroups: Option<crate::cgroups::CgroupManager>,
    ) -> Self {
        let runtime = cri.client(Duration::from_secs(10)).await.expect("client");
        let client = api.client();
        let recorder = Recorder::new(client.clone(), "node-1".into());
        let (probe_tx, probes) = tokio::sync::mpsc::unbounded_channel();
        let prober =
            crate::prober::manager::Manager::new(runtime.clone(), recorder.clone(), probe_tx);
        let (pods, _outputs) = super::sources::PodSources::new(&[]);
        let store = pods.store();
        let (services, mut services_writer) = reflector::store();
        services_writer.apply_watcher_event(&watcher::Event::InitDone);
        let (_, services_listed) = tokio::sync::watch::channel(true);
        let root = dir.path().join("root");
        let hosts = dir.path().join("hosts");
        std::fs::write(&hosts, "127.0.0.1 localhost\n").expect("hosts file");
        // Allocatable as the agent computes it; the same as the Node below.
        let node = NodeContext {
            pod_logs_dir: dir.path().join("logs"),
            root_dir: root.clone(),
            memory_capacity_bytes: 1 << 30,
            hosts_file: hosts,
            user_namespaces_support: true,
            initial_labels: BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), "node-1".to_string()),
                ("node.kubernetes.io/pool".to_string(), "blue".to_string()),
            ]),
            ..crate::fixtures::node_context()
        };
        let images = ImageManager::new(
            runtime.clone(),
            client.clone(),
            recorder.clone(),
            PullConcurrency::Serial,
        )
        .with_pull_records(&root);
        // The Node as the watch lists it: 4 cpus, 8Gi, 110 pods.
        let (node_store, mut node_writer) = reflector::store();
        let mut api_node = k8s_openapi::api::core::v1::Node::default();
        api_node.metadata.name = Some("node-1".into());
        api_node.metadata.uid = Some("node-uid-1".into());
        api_node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            allocatable: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("4".into())),
                ("memory".to_string(), Quantity("8Gi".into())),
                ("pods".to_string(), Quantity("110".into())),
            ])),
            ..Default::default()
        });
        if node_listed {
            node_writer.apply_watcher_event(&watcher::Event::Apply(api_node));
        }
        let ctx = Arc::new(Context::new(Parts {
            runtime: RuntimeManager {
                runtime,
                images,
                sources: SourceReader {
                    client: client.clone(),
                    services,
                    services_listed,
                },
                recorder,
                node,
                pods: store,
                client: client.clone(),
                userns: crate::pod::userns::UsernsManager::new(&root, 110),
                log_links_dir: root.join("containers"),
                cgroups,
                devices: None,
            },
            status: Arc::new(StatusManager::new(client.clone(), pods.clone())),
            status_context: StatusContext {
                runtime_name: "fake".into(),
                ..crate::fixtures::status_context()
            },
            volumes: Arc::new(VolumeManager::new(client, &root, BTreeMap::new())),
            prober,
            pleg_connected: Arc::new(AtomicBool::new(false)),
            node_store,
            pressures: tokio::sync::watch::channel(Vec::new()).1,
            sources: pods.clone(),
            allocations: crate::pod::allocation::Allocations::in_memory(),
        }));
        Self {
            api,
            cri,
            ctx,
            pods,
            _probes: probes,
            dir,
        }
    }

    /// Binds `pod` to the node: stored in the API and seen by the watch.
    fn bind(&mut self, pod: Pod) -> Pod {
        let pod = self.api.put_pod(pod);
        self.pods.api_event(watcher::Event::Apply(pod.clone()));
        pod
    }

    /// The pod side the eviction manager is given ([`crate::eviction::Pods`]).
    fn eviction_pods(&self) -> super::eviction_pods::EvictionPods {
        let policy = crate::container_gc::Policy::default();
        super::eviction_pods::EvictionPods::new(self.ctx.clone(), policy)
    }

    /// Evicts running pod `name` with `message` as the eviction manager
    /// does (killed through [`Self::eviction_pods`]: recorded with its grace
    /// period `grace` seconds, 1 when not given, then the status written),
    /// then syncs it.
    async fn evict(&mut self, name: &str, message: &str, grace: Option<i64>) {
        use crate::eviction::Pods as _;
        let running = self.watched(name);
        let eviction = crate::eviction::Eviction {
            message: message.into(),
            disruption: true,
            grace: grace.unwrap_or(1),
            at: Timestamp::now(),
        };
        self.eviction_pods()
            .kill_pod(&running, eviction)
            .await
            .expect("status");
        self.sync_watched(name).await;
    }

    /// Pod `name` as the watch delivers it now.
    fn watched(&mut self, name: &str) -> Pod {
        let pod = self.api.pod(name).expect("the pod in the API");
        self.pods.api_event(watcher::Event::Apply(pod.clone()));
        pod
    }

    /// One sync of `pod`, bounded in time.
    async fn sync(&self, pod: &Pod) -> Action {
        let run = reconcile(Arc::new(pod.clone()), self.ctx.clone());
        tokio::time::timeout(Duration::from_secs(20), run)
            .await
            .expect("a sync ends")
            .expect("a sync succeeds")
    }

    /// One sync of pod `name` as the watch delivers it now.
    async fn sync_watched(&mut self, name: &str) -> Action {
        let pod = self.watched(name);
        self.sync(&pod).await
    }

    /// Syncs pod `name` every 100 ms (at most 50 times) until a sync calls the
    /// runtime, as a probe result arriving on its own timer makes it; those calls.
    async fn sync_until_called(&mut self, name: &str) -> Vec<String> {
        for _ in 0..50 {
            self.sync_watched(name).await;
            let calls = self.cri_calls();
            if !calls.is_empty() {
                return calls;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Vec::new()
    }

    /// Deletes pod `name` as the API server does for a graceful delete: its
    /// deletion timestamp set, with `grace` seconds.
    fn delete_gracefully(&self, name: &str, grace: i64) {
        let mut deleting = self.api.pod(name).expect("pod");
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        deleting.metadata.deletion_grace_period_seconds = Some(grace);
        self.api.put_pod(deleting);
    }

    /// The runtime calls since the last look.
    fn cri_calls(&self) -> Vec<String> {
        self.cri.take_calls()
    }

    /// The API requests (but Events) since the last look, as `METHOD path`.
    fn api_calls(&self) -> Vec<String> {
        self.api
            .take_requests()
            .iter()
            .map(api::Seen::line)
            .collect()
    }

    /// Pod `name`'s status in the API.
    fn status(&self, name: &str) -> PodStatus {
        self.api
            .pod(name)
            .and_then(|p| p.status)
            .unwrap_or_default()
    }

    /// Waits (up to 5 s) for an Event with `reason` whose message contains `text`.
    async fn event(&self, reason: &str, text: &str) {
        for _ in 0..100 {
            let events = self.api.events();
            if events.iter().any(|(r, m)| r == reason && m.contains(text)) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "no {reason} event with {text:?}; events: {:?}",
            self.api.events()
        );
    }
}

/// Container `name`'s state in `st`: `running`, `waiting:<reason>` or
/// `terminated:<reason>`, with its restart count.
fn state(st: &PodStatus, name: &str) -> (String, i32) {
    let all = st
        .init_container_statuses
        .iter()
        .flatten()
        .chain(st.container_statuses.iter().flatten());
    let Some(c) = all.into_iter().find(|c| c.name == name) else {
        return ("absent".into(), 0);
    };
    let s = c.state.clone().unwrap_or_default();
    let text = if s.running.is_some() {
        "running".to_string()
    } else if let Some(w) = s.waiting {
        format!("waiting:{}", w.reason.unwrap_or_default())
    } else if let Some(t) = s.terminated {
        format!("terminated:{}", t.reason.unwrap_or_default())
    } else {
        "none".into()
    };
    (text, c.restart_count)
}

/// A lifecycle whose preStop hook runs `command` in the container.
fn exec_pre_stop(command: &str) -> Lifecycle {
    Lifecycle {
        pre_stop: Some(LifecycleHandler {
            exec: Some(ExecAction {
                command: Some(vec![command.into()]),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The requeue delay of `action` (none: wait for a change).
fn requeue(action: &Action) -> Option<Duration> {
    if *action == Action::await_change() {
        return None;
    }
    // `Action` shows its delay only through Debug: `Some(1.5s)`, `Some(500ms)`.
    let text = format!("{action:?}");
    let d = text.split("Some(").nth(1)?.split(')').next()?;
    let (num, unit) = d.split_at(d.find(|c: char| c.is_ascii_alphabetic() || c == 'µ')?);
    let n: f64 = num.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "ms" => n / 1e3,
        "µs" => n / 1e6,
        "ns" => n / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(secs))
}

fn started(containers: &[&str]) -> Vec<String> {
    let mut calls = vec!["RunPodSandbox default/web".to_string()];
    for c in containers {
        calls.push(format!("CreateContainer {c}"));
        calls.push(format!("StartContainer {c}"));
    }
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_pod_gets_a_sandbox_and_its_containers_and_one_status_patch() {
    let mut n = Node::start().await;
    let web = n.bind(
        pod("web")
            .container("a", IMAGE)
            .container("b", IMAGE)
            .build(),
    );
    let action = n.sync(&web).await;
    assert_eq!(n.cri_calls(), started(&["a", "b"]));
    assert_eq!(n.api_calls(), [WEB_STATUS]);
    let st = n.status("web");
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(state(&st, "a"), ("running".into(), 0));
    assert_eq!(state(&st, "b"), ("running".into(), 0));
    assert!(st.pod_ip.is_some_and(|ip| ip.starts_with("10.244.")));
    assert_eq!(
        requeue(&action),
        Some(Duration::from_secs(2)),
        "resync without PLEG"
    );
    n.event("Pulled", "already present on machine").await;
    n.event("Started", "Started container a").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pull_backs_off_without_pulling_again() {
    let mut n = Node::start().await;
    let image = "registry.example/app:1";
    n.cri.fail_pull(image, "pull access denied");
    let web = n.bind(pod("web").container("c", image).build());
    n.sync(&web).await;
    assert_eq!(
        n.cri_calls(),
        ["RunPodSandbox default/web", &format!("PullImage {image}")]
    );
    assert_eq!(state(&n.status("web"), "c").0, "waiting:ErrImagePull");
    n.event("Failed", "pull access denied").await;
    // The next sync is inside the back-off: no pull, ImagePullBackOff.
    n.cri.allow_pull(image);
    let action = n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    assert_eq!(state(&n.status("web"), "c").0, "waiting:ImagePullBackOff");
    let wait = requeue(&action).expect("a requeue");
    assert!(wait <= Duration::from_secs(10), "{wait:?}");
    n.event("BackOff", "Back-off pulling image").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_while_pending_is_failed_before_it_is_deleted() {
    let mut n = Node::start().await;
    let image = "registry.example/missing:1";
    n.cri.fail_pull(image, "pull access denied");
    let web = n.bind(pod("web").container("c", image).build());
    n.sync(&web).await;
    assert_eq!(n.status("web").phase.as_deref(), Some("Pending"));
    n.delete_gracefully("web", 30);
    n.cri_calls();
    n.api_calls();
    // Nothing runs: the sandbox goes, the final status is written, then the
    // pod is deleted (as the kubelet's TerminatePod, then deletePod).
    for _ in 0..5 {
        n.sync_watched("web").await;
        if n.api.pod("web").is_none() {
            break;
        }
    }
    let requests = n.api.take_requests();
    let lines: Vec<String> = requests.iter().map(api::Seen::line).collect();
    let patch = lines
        .iter()
        .rposition(|l| l == WEB_STATUS)
        .expect("a final status patch");
    let delete = lines
        .iter()
        .position(|l| l == "DELETE /api/v1/namespaces/default/pods/web")
        .expect("the delete");
    assert!(patch < delete, "{lines:?}");
    let status = &requests[patch].body["status"];
    assert_eq!(status["phase"], "Failed", "{status}");
    let terminated = &status["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(terminated["reason"], "ContainerStatusUnknown", "{status}");
    assert_eq!(terminated["exitCode"], 137);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_too_long_fqdn_fails_the_sandbox_in_the_kubelet_words() {
    let mut n = Node::start().await;
    let mut p = pod("hostfqdnveryveryveryverylongforfqdntobemorethan64bytes")
        .container("c", IMAGE)
        .build();
    if let Some(spec) = p.spec.as_mut() {
        spec.subdomain = Some("t".into());
        spec.set_hostname_as_fqdn = Some(true);
    }
    let p = n.bind(p);
    n.sync(&p).await;
    assert_eq!(n.cri_calls(), Vec::<String>::new(), "no sandbox is created");
    n.event(
        "FailedCreatePodSandBox",
        "Failed to create pod sandbox: failed to construct FQDN from pod hostname and cluster domain, FQDN ",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_container_restarts_at_once_then_after_its_back_off_deadline() {
    let mut n = Node::start().await;
    n.cri.script_exit_on_start("c", 1);
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    // The first restart has no back-off.
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["CreateContainer c", "StartContainer c"]);
    // The second waits 10 s: CrashLoopBackOff, requeued for the deadline
    // (sooner than the 30 s resync of a node whose PLEG has runtime events).
    n.ctx.set_pleg_connected(true);
    let action = n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    assert_eq!(
        state(&n.status("web"), "c"),
        ("waiting:CrashLoopBackOff".into(), 1)
    );
    let wait = requeue(&action).expect("a requeue");
    assert!(
        wait > Duration::from_secs(8) && wait <= Duration::from_secs(10),
        "{wait:?}"
    );
    n.event(
        "BackOff",
        "Back-off restarting failed container c in pod web_default(uid-web)",
    )
    .await;
    // Once the deadline has passed, it restarts.
    let last = n.cri.containers().into_iter().max_by_key(|c| c.attempt);
    let past = Timestamp::now().as_nanosecond() - 11_000_000_000;
    let past = i64::try_from(past).expect("nanoseconds");
    assert!(n.cri.set_finished_at(&last.expect("a container").id, past));
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["CreateContainer c", "StartContainer c"]);
    assert_eq!(state(&n.status("web"), "c").1, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_one_at_a_time_before_the_main_ones() {
    let mut n = Node::start().await;
    n.cri.script_exit_on_start("i1", 0);
    n.cri.script_exit_on_start("i2", 0);
    let web = n.bind(
        pod("web")
            .init_container("i1", IMAGE)
            .init_container("i2", IMAGE)
            .container("c", IMAGE)
            .build(),
    );
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), started(&["i1"]));
    assert_eq!(n.status("web").phase.as_deref(), Some("Pending"));
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["CreateContainer i2", "StartContainer i2"]);
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["CreateContainer c", "StartContainer c"]);
    let st = n.status("web");
    assert_eq!(st.phase.as_deref(), Some("Running"));
    assert_eq!(state(&st, "i1").0, "terminated:Completed");
    assert_eq!(state(&st, "c").0, "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_starts_first_and_keeps_running_beside_the_main_container() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").sidecar("s", IMAGE).container("c", IMAGE).build());
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), started(&["s"]));
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["CreateContainer c", "StartContainer c"]);
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new(), "nothing to do");
    let st = n.status("web");
    assert_eq!(state(&st, "s").0, "running");
    assert_eq!(state(&st, "c").0, "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_delete_stops_reports_then_removes_and_deletes_once() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    n.cri_calls();
    n.api_calls();
    n.delete_gracefully("web", 30);
    // Stop within the grace period, then report the terminated container.
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["StopContainer c 30", "StopPodSandbox web"]);
    assert_eq!(n.api_calls(), [WEB_STATUS]);
    assert_eq!(state(&n.status("web"), "c").0, "terminated:Error");
    n.event("Killing", "Stopping container c").await;
    // Then remove everything and delete the pod (grace 0, UID precondition).
    let last = n.watched("web");
    n.sync(&last).await;
    assert_eq!(
        n.cri_calls(),
        [
            "StopPodSandbox web",
            "RemoveContainer c",
            "RemovePodSandbox web"
        ]
    );
    let requests = n.api.take_requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(
        requests[0].line(),
        "DELETE /api/v1/namespaces/default/pods/web"
    );
    assert_eq!(requests[0].body["gracePeriodSeconds"], 0);
    assert_eq!(requests[0].body["preconditions"]["uid"], "uid-web");
    assert!(n.api.pod("web").is_none());
    // The API's last update of the pod arrives after: nothing happens again.
    let action = n.sync(&last).await;
    assert_eq!((n.cri_calls(), n.api_calls()), (vec![], vec![]));
    assert_eq!(action, Action::await_change());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_deleted_pod_is_cleaned_up_once_the_watch_has_dropped_it() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    n.cri_calls();
    n.api.remove_pod("web");
    n.api_calls();
    let (rt, client) = (n.ctx.cri(), n.api.client());
    let store = n.ctx.pods().clone();
    let logs = n.ctx.node().pod_logs_dir.clone();
    let cleanup =
        || super::housekeeping::cleanup_orphans(rt, &client, &store, n.ctx.volumes(), &logs);
    // The watch has not dropped it yet: housekeeping leaves it alone.
    assert_eq!(cleanup().await.expect("housekeeping").removed, 0);
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    n.pods.api_event(watcher::Event::Delete(web));
    assert_eq!(cleanup().await.expect("housekeeping").removed, 1);
    assert_eq!(
        n.cri_calls(),
        [
            "StopContainer c 2",
            "RemoveContainer c",
            "StopPodSandbox web",
            "RemovePodSandbox web"
        ]
    );
    assert_eq!(n.api_calls(), ["GET /api/v1/namespaces/default/pods/web"]);
    assert!(n.cri.sandboxes().is_empty());
    // The managers forget it too.
    assert_eq!(n.ctx.status().cached(), 1);
    super::housekeeping::forget_gone(&n.ctx, n.ctx.pods());
    assert_eq!(n.ctx.status().cached(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_deleted_while_the_agent_was_down_are_removed_but_not_those_the_api_still_has() {
    let mut n = Node::start().await;
    let gone = n.bind(pod("gone").container("c", IMAGE).build());
    let kept = n.bind(pod("kept").container("c", IMAGE).build());
    n.sync(&gone).await;
    n.sync(&kept).await;
    n.cri_calls();
    // The agent restarts: its store is empty (not listed yet); `gone` was
    // deleted from the API meanwhile, `kept` was not.
    n.api.remove_pod("gone");
    let fresh = n.restart().await;
    fresh.api_calls();
    let client = fresh.api.client();
    let removed = super::housekeeping::cleanup_orphans(
        fresh.ctx.cri(),
        &client,
        fresh.ctx.pods(),
        fresh.ctx.volumes(),
        &fresh.ctx.node().pod_logs_dir,
    )
    .await
    .expect("housekeeping")
    .removed;
    assert_eq!(removed, 1);
    let mut calls = fresh.cri_calls();
    calls.sort();
    assert_eq!(
        calls,
        [
            "RemoveContainer c",
            "RemovePodSandbox gone",
            "StopContainer c 2",
            "StopPodSandbox gone"
        ]
    );
    let names: Vec<String> = fresh.cri.sandboxes().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["kept"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_only_the_runtime_has_whose_cleanup_fails_is_counted_until_it_is_gone() {
    let mut n = Node::start().await;
    let gone = n.bind(pod("gone").container("c", IMAGE).build());
    n.sync(&gone).await;
    n.api.remove_pod("gone");
    let fresh = n.restart().await;
    let client = fresh.api.client();
    let cleanup = || {
        super::housekeeping::cleanup_orphans(
            fresh.ctx.cri(),
            &client,
            fresh.ctx.pods(),
            fresh.ctx.volumes(),
            &fresh.ctx.node().pod_logs_dir,
        )
    };
    // The runtime refuses to stop the container: the pod stays, counted as
    // a runtime-only pod still terminating, and the pass goes on.
    fresh
        .cri
        .fail_next("StopContainer", tonic::Code::Unavailable, "runtime busy");
    let first = cleanup().await.expect("housekeeping");
    assert_eq!(first.left, 1);
    assert_eq!(fresh.cri.sandboxes().len(), 1);
    let census = fresh.ctx.sources().census();
    let counts = super::housekeeping::pod_counts(&census, |_| "sync", first.left);
    assert_eq!(
        counts
            .working
            .get(&("terminating", "runtime_only", "unknown")),
        Some(&1)
    );
    // The next pass removes it.
    let second = cleanup().await.expect("housekeeping");
    assert_eq!((second.left, second.removed), (0, 1));
    assert!(fresh.cri.sandboxes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_removes_every_pod_its_directory_and_the_node() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    let db = n.bind(pod("db").container("c", IMAGE).build());
    n.sync(&web).await;
    n.sync(&db).await;
    n.api.put_node("companion");
    let pods_dir = n.ctx.volumes().root_dir().join("pods");
    assert_eq!(std::fs::read_dir(&pods_dir).expect("pod dirs").count(), 2);
    n.api_calls();
    n.cri_calls();

    let client = n.api.client();
    let target = crate::node::reset::Target {
        runtime: n.ctx.cri(),
        volumes: n.ctx.volumes(),
        pod_logs_dir: &n.ctx.node().pod_logs_dir,
        client: &client,
        node: "companion",
        bridge: None,
        cgroups: None,
    };
    let report = crate::node::reset::reset(target).await;
    assert_eq!(report.errors, Vec::<String>::new());
    assert_eq!(
        (
            report.containers,
            report.sandboxes,
            report.pod_dirs,
            report.pods
        ),
        (2, 2, 2, 2)
    );
    assert!(report.node_deleted && report.bridge_deleted);
    assert!(n.cri.sandboxes().is_empty());
    assert_eq!(std::fs::read_dir(&pods_dir).expect("pod dirs").count(), 0);
    assert!(n.api.pod("web").is_none() && n.api.pod("db").is_none());
    assert!(!n.api.has_node("companion"));
    let mut calls = n.api_calls();
    calls.sort();
    assert_eq!(
        calls,
        [
            "DELETE /api/v1/namespaces/default/pods/db",
            "DELETE /api/v1/namespaces/default/pods/web",
            "DELETE /api/v1/nodes/companion",
            "GET /api/v1/pods",
        ]
    );
    // Again: nothing left, and a Node already gone is no error.
    let again = crate::node::reset::reset(target).await;
    assert_eq!(again.errors, Vec::<String>::new());
    assert_eq!((again.containers, again.sandboxes, again.pods), (0, 0, 0));
    assert!(again.node_deleted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_the_node_does_not_admit_is_failed_without_touching_the_runtime() {
    let mut n = Node::start().await;
    let mut p = pod("web").container("c", IMAGE).build();
    if let Some(spec) = p.spec.as_mut() {
        spec.security_context = Some(PodSecurityContext {
            sysctls: Some(vec![Sysctl {
                name: "kernel.msgmax".into(),
                value: "1".into(),
            }]),
            ..Default::default()
        });
    }
    let web = n.bind(p);
    let action = n.sync(&web).await;
    assert_eq!(action, Action::await_change());
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    assert_eq!(n.api_calls(), [WEB_STATUS]);
    let st = n.status("web");
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(st.reason.as_deref(), Some("SysctlForbidden"));
    assert!(
        st.message
            .as_deref()
            .is_some_and(|m| m.starts_with("Pod was rejected: ")),
        "{:?}",
        st.message
    );
    n.event("SysctlForbidden", "kernel.msgmax").await;
    // It stays rejected: the next sync neither starts nor patches it.
    n.sync_watched("web").await;
    assert_eq!((n.cri_calls(), n.api_calls()), (vec![], vec![]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_does_not_fit_beside_the_admitted_ones_is_failed_out_of_cpu() {
    let mut n = Node::start().await;
    let cpu = |p: &mut Pod, amount: &str| {
        edit_container(p, |c| {
            c.resources = Some(ResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "cpu".to_string(),
                    Quantity(amount.into()),
                )])),
                ..Default::default()
            });
        });
    };
    let mut big = pod("big").container("c", IMAGE).build();
    cpu(&mut big, "3");
    big.metadata.creation_timestamp = Some(Time(crate::fixtures::t(0)));
    let mut more = pod("more").container("c", IMAGE).build();
    cpu(&mut more, "1500m");
    more.metadata.creation_timestamp = Some(Time(crate::fixtures::t(10)));
    let big = n.bind(big);
    let more = n.bind(more);
    // The newer pod is synced first; the older one is admitted before it.
    n.sync(&more).await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    let st = n.status("more");
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(st.reason.as_deref(), Some("OutOfcpu"));
    assert_eq!(
        st.message.as_deref(),
        Some(
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 1500, used: 3000, capacity: 4000"
        )
    );
    n.event("OutOfcpu", "Node didn't have enough resource: cpu")
        .await;
    n.sync(&big).await;
    assert_eq!(n.cri_calls()[0], "RunPodSandbox default/big");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_pod_is_stopped_at_once_and_fails_with_the_eviction() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    n.cri_calls();
    let message = "The node was low on resource: memory. ";
    n.evict("web", message, None).await;
    // Grace 1 s, raised to the kubelet's minimum of 2 s for a kill.
    assert_eq!(n.cri_calls(), ["StopContainer c 2", "StopPodSandbox web"]);
    let st = n.status("web");
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(st.reason.as_deref(), Some("Evicted"));
    assert_eq!(st.message.as_deref(), Some(message));
    let target = st
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .expect("DisruptionTarget");
    assert_eq!(
        (target.status.as_str(), target.reason.as_deref()),
        ("True", Some("TerminationByKubelet"))
    );
    assert!(state(&n.status("web"), "c").0.starts_with("terminated:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_evicted_for_a_soft_threshold_stops_with_the_grace_period_it_was_given() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    n.cri_calls();
    n.evict("web", "low on disk", Some(7)).await;
    assert_eq!(n.cri_calls(), ["StopContainer c 7", "StopPodSandbox web"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_whose_status_write_failed_still_stops_the_pod() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    n.cri_calls();
    // Recorded, but the status never reached the API server.
    let eviction = crate::eviction::Eviction {
        message: "The node was low on resource: memory. ".into(),
        disruption: true,
        grace: 1,
        at: Timestamp::now(),
    };
    n.ctx
        .record_eviction(web.metadata.uid.as_deref().unwrap(), eviction);
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["StopContainer c 2", "StopPodSandbox web"]);
    let st = n.status("web");
    assert_eq!(
        (st.phase.as_deref(), st.reason.as_deref()),
        (Some("Failed"), Some("Evicted"))
    );
    assert!(
        st.conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "DisruptionTarget" && c.status == "True")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_pod_leaves_the_active_pods_and_is_cleaned_up_once_stopped() {
    use crate::eviction::Pods as _;
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    let other = n.bind(pod("other").container("c", IMAGE).build());
    n.sync(&web).await;
    n.sync(&other).await;
    let pods = n.eviction_pods();
    let names = |pods: &super::eviction_pods::EvictionPods| {
        let mut names: Vec<String> = pods
            .active_pods()
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(&pods), ["other", "web"]);
    let uid = web.metadata.uid.clone().expect("uid");
    assert!(!pods.pod_cleaned_up(&uid).await, "its container runs");
    n.evict("web", "The node was low on resource: memory. ", None)
        .await;
    // Being evicted: no longer a candidate, and its containers stopped.
    assert_eq!(names(&pods), ["other"]);
    n.sync_watched("web").await;
    assert!(pods.pod_cleaned_up(&uid).await);
    assert!(
        !pods
            .pod_cleaned_up(other.metadata.uid.as_deref().expect("uid"))
            .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_gc_removes_an_evicted_pods_content_and_its_status_stays_failed() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    let other = n.bind(pod("other").container("c", IMAGE).build());
    n.sync(&web).await;
    n.sync(&other).await;
    n.evict(
        "web",
        "The node was low on resource: ephemeral-storage. ",
        None,
    )
    .await;
    let failed = n.status("web");
    assert_eq!(failed.phase.as_deref(), Some("Failed"));
    n.watched("web");
    n.cri_calls();
    // Periodic collection: the failed evicted pod's content goes, the
    // running pod's stays.
    let policy = crate::container_gc::Policy::default();
    let done = super::housekeeping::collect_containers(&n.ctx, policy, false)
        .await
        .expect("collect");
    assert_eq!((done.containers, done.sandboxes), (1, 1));
    let left: Vec<String> = n
        .cri
        .containers()
        .iter()
        .map(|c| c.pod_uid.clone())
        .collect();
    assert_eq!(left, [other.metadata.uid.clone().unwrap()]);
    // The pod worker neither starts it again nor changes what it reported.
    n.cri_calls();
    n.sync_watched("web").await;
    assert!(
        n.cri_calls().iter().all(|c| c.starts_with("List")
            || c.starts_with("ContainerStatus")
            || c.starts_with("PodSandboxStatus")),
        "the runtime was changed"
    );
    let after = n.status("web");
    assert_eq!(after.phase.as_deref(), Some("Failed"));
    assert_eq!(after.container_statuses, failed.container_statuses);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_succeeded_pods_containers_stay_until_the_eviction_manager_reclaims_disk() {
    let mut n = Node::start().await;
    let policy = crate::container_gc::Policy::default();
    let job = n.bind(
        pod("job")
            .container("c", IMAGE)
            .restart_policy("Never")
            .build(),
    );
    n.sync(&job).await;
    let uid = job.metadata.uid.clone().unwrap();
    assert!(n.cri.exit_named(&uid, "c", 0));
    n.sync_watched("job").await;
    n.sync_watched("job").await;
    assert_eq!(n.status("job").phase.as_deref(), Some("Succeeded"));
    n.watched("job");
    let done = super::housekeeping::collect_containers(&n.ctx, policy, false)
        .await
        .expect("collect");
    assert_eq!(done.containers, 0);
    let done = super::housekeeping::collect_containers(&n.ctx, policy, true)
        .await
        .expect("collect");
    assert_eq!(done.containers, 1);
    assert!(n.cri.containers().iter().all(|c| c.pod_uid != uid));
    n.sync_watched("job").await;
    assert_eq!(n.status("job").phase.as_deref(), Some("Succeeded"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_agent_restart_running_containers_are_adopted_not_restarted() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").sidecar("s", IMAGE).container("c", IMAGE).build());
    n.sync(&web).await;
    n.sync_watched("web").await;
    n.cri_calls();
    n.api_calls();
    let mut fresh = n.restart().await;
    fresh.bind(n.api.pod("web").expect("pod"));
    fresh.sync_watched("web").await;
    assert_eq!(fresh.cri_calls(), Vec::<String>::new());
    assert_eq!(
        fresh.api_calls(),
        Vec::<String>::new(),
        "the status is unchanged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restart_keeps_a_ready_container_ready_until_its_probes_run() {
    let mut n = Node::start().await;
    // Readiness and startup probes that pass, checked once a minute: the
    // restarted agent has no result of its own for a while.
    let probe = |cmd: &str| Probe {
        exec: Some(ExecAction {
            command: Some(vec![cmd.into()]),
        }),
        period_seconds: Some(60),
        ..Default::default()
    };
    let mut p = pod("web").container("c", IMAGE).build();
    if let Some(c) = p.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.readiness_probe = Some(probe("ready"));
        c.startup_probe = Some(probe("started"));
    }
    let web = n.bind(p);
    n.sync(&web).await;
    let ready = |n: &Node| {
        let st = n.status("web");
        let c = st.container_statuses.unwrap_or_default();
        c.first().map(|c| (c.started, c.ready))
    };
    for _ in 0..100 {
        n.sync_watched("web").await;
        if ready(&n) == Some((Some(true), true)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(ready(&n), Some((Some(true), true)), "ready before");
    // The container has run for a minute when the agent restarts.
    let a_minute_ago = Timestamp::now()
        .checked_sub(Duration::from_secs(60))
        .unwrap()
        .as_nanosecond();
    assert_eq!(
        n.cri
            .set_started_at("c", i64::try_from(a_minute_ago).unwrap()),
        1
    );
    n.cri.script_exec(["ready"], 1, "not now");
    n.cri_calls();
    let mut fresh = n.restart().await;
    fresh.bind(n.api.pod("web").expect("pod"));
    fresh.api_calls();
    fresh.sync_watched("web").await;
    assert_eq!(
        ready(&fresh),
        Some((Some(true), true)),
        "started and ready as last reported"
    );
    assert_eq!(fresh.cri_calls(), Vec::<String>::new(), "nothing restarted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_init_container_the_runtime_lost_after_initialization_is_not_run_again() {
    let mut n = Node::start().await;
    n.cri.script_exit_on_start("init", 0);
    let web = n.bind(
        pod("web")
            .init_container("init", IMAGE)
            .container("c", IMAGE)
            .build(),
    );
    for _ in 0..5 {
        n.sync_watched("web").await;
    }
    assert_eq!(state(&n.status("web"), "c"), ("running".into(), 0));
    let init = n
        .cri
        .containers()
        .into_iter()
        .find(|c| c.name == "init")
        .expect("the init container's record");
    let runtime = n.cri.client(Duration::from_secs(5)).await.unwrap();
    runtime.remove_container(&init.id).await.unwrap();
    n.cri_calls();
    // The agent restarts without the pod's status (a static pod's is not
    // kept): the init container is not run again, and reads as exited 0.
    let mut fresh = n.restart().await;
    let mut bare = web.clone();
    bare.status = None;
    fresh.bind(bare);
    fresh.sync_watched("web").await;
    assert_eq!(fresh.cri_calls(), Vec::<String>::new(), "nothing run again");
    let st = fresh.status("web");
    let init_status = st
        .init_container_statuses
        .unwrap_or_default()
        .into_iter()
        .next()
        .expect("init status");
    let t = init_status
        .state
        .and_then(|s| s.terminated)
        .expect("terminated");
    assert_eq!(
        (t.exit_code, t.reason.as_deref(), t.message.as_deref()),
        (
            0,
            Some("Completed"),
            Some(crate::pod_core::status::INIT_STATUS_LOST)
        )
    );
    assert!(init_status.ready);
    assert_eq!(state(&fresh.status("web"), "c"), ("running".into(), 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_liveness_probe_kills_and_restarts_the_container() {
    let mut n = Node::start().await;
    n.cri.script_exec(["check"], 1, "unhealthy");
    let mut p = pod("web").container("c", IMAGE).build();
    if let Some(c) = p.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.liveness_probe = Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec!["check".into()]),
            }),
            period_seconds: Some(1),
            failure_threshold: Some(1),
            ..Default::default()
        });
    }
    let web = n.bind(p);
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    // Sync until the probe manager has seen the probe fail.
    let calls = n.sync_until_called("web").await;
    assert_eq!(
        calls,
        [
            "StopContainer c 30",
            "CreateContainer c",
            "StartContainer c"
        ]
    );
    n.event("Unhealthy", "Liveness probe failed").await;
    // As the kubelet's `killContainer`: the event says why.
    n.event(
        "Killing",
        "Container c failed liveness probe, will be restarted",
    )
    .await;
    assert_eq!(state(&n.status("web"), "c"), ("running".into(), 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_that_changes_nothing_sends_no_patch() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    assert_eq!(
        (n.cri_calls(), n.api_calls()),
        (started(&["c"]), vec![WEB_STATUS.into()])
    );
    for _ in 0..3 {
        n.sync_watched("web").await;
        assert_eq!((n.cri_calls(), n.api_calls()), (vec![], vec![]));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_pod_object_is_seen_with_the_status_last_sent() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    assert_eq!(n.api_calls(), [WEB_STATUS]);
    // The watch has not brought the patched object back: the same object
    // again costs no second patch of the same status.
    n.sync(&web).await;
    assert_eq!((n.cri_calls().len(), n.api_calls()), (3, vec![]));
    // A status the API lost (someone else's write) is written again.
    let mut other = n.api.pod("web").expect("pod");
    other.status = Some(PodStatus::default());
    n.api.put_pod(other);
    n.sync_watched("web").await;
    assert_eq!(n.api_calls(), [WEB_STATUS]);
    assert_eq!(n.status("web").phase.as_deref(), Some("Running"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_waits_for_its_volumes_before_anything_starts() {
    let mut n = Node::start().await;
    let mut p = pod("web").container("c", IMAGE).build();
    if let Some(spec) = p.spec.as_mut() {
        spec.volumes = Some(vec![Volume {
            name: "cfg".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: "settings".into(),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        spec.containers[0].volume_mounts = Some(vec![VolumeMount {
            name: "cfg".into(),
            mount_path: "/etc/settings".into(),
            ..Default::default()
        }]);
    }
    let web = n.bind(p);
    let action = n.sync(&web).await;
    assert_eq!(n.cri_calls(), Vec::<String>::new());
    assert_eq!(
        n.api_calls(),
        [
            "GET /api/v1/namespaces/default/configmaps/settings",
            WEB_STATUS
        ]
    );
    assert_eq!(requeue(&action), Some(crate::pod_core::plan::VOLUME_RETRY));
    let st = n.status("web");
    assert_eq!(st.phase.as_deref(), Some("Pending"));
    assert_eq!(state(&st, "c").0, "waiting:ContainerCreating");
    n.event("FailedMount", "settings").await;
    // The ConfigMap appears: the pod starts.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": "default"}, "data": {"k": "v"}});
    n.api.put("configmaps", "settings", cm);
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    assert_eq!(state(&n.status("web"), "c").0, "running");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_waits_for_its_claim_to_be_bound_then_runs_on_the_bound_volume() {
    let mut n = Node::start().await;
    let data = tempfile::tempdir().expect("tempdir");
    let mut p = pod("web").container("c", IMAGE).build();
    if let Some(spec) = p.spec.as_mut() {
        spec.volumes = Some(vec![Volume {
            name: "data".into(),
            persistent_volume_claim: Some(
                k8s_openapi::api::core::v1::PersistentVolumeClaimVolumeSource {
                    claim_name: "data-claim".into(),
                    read_only: None,
                },
            ),
            ..Default::default()
        }]);
        spec.containers[0].volume_mounts = Some(vec![VolumeMount {
            name: "data".into(),
            mount_path: "/data".into(),
            ..Default::default()
        }]);
    }
    let claim = |phase: &str| {
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data-claim", "namespace": "default", "uid": "claim-uid"},
            "spec": {"volumeName": "pv-data"},
            "status": {"phase": phase}})
    };
    n.api
        .put("persistentvolumeclaims", "data-claim", claim("Pending"));
    let web = n.bind(p);
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), Vec::<String>::new(), "nothing starts");
    assert_eq!(
        n.api_calls(),
        [
            "GET /api/v1/namespaces/default/persistentvolumeclaims/data-claim",
            WEB_STATUS
        ]
    );
    n.event(
        "FailedMount",
        "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], failed to process volumes=[data]: error processing PVC default/data-claim: PVC is not bound",
    )
    .await;
    // Bound: the pod starts, with the volume's path mounted.
    n.api
        .put("persistentvolumeclaims", "data-claim", claim("Bound"));
    n.api.put_cluster(
        "persistentvolumes",
        "pv-data",
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-data"},
            "spec": {"hostPath": {"path": data.path()},
                "claimRef": {"name": "data-claim", "namespace": "default", "uid": "claim-uid"}}}),
    );
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    let c = n.cri.containers().pop().expect("container");
    assert_eq!(state(&n.status("web"), "c").0, "running");
    let host = data.path().display().to_string();
    assert!(
        c.mounts
            .iter()
            .any(|m| m.host_path == host && m.container_path == "/data" && !m.readonly),
        "{:?}",
        c.mounts
    );
    // Read once: later syncs do not ask again.
    n.api_calls();
    n.sync_watched("web").await;
    assert!(
        n.api_calls()
            .iter()
            .all(|c| !c.contains("persistentvolume")),
        "the claim is read once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_sandbox_is_replaced_and_its_containers_started_again() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    n.cri_calls();
    let sandbox = n.cri.sandboxes().pop().expect("a sandbox").id;
    n.ctx
        .cri()
        .stop_pod_sandbox(&sandbox)
        .await
        .expect("stop the sandbox");
    n.cri_calls();
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    n.event("SandboxChanged", "Pod sandbox changed").await;
    let attempts: Vec<u32> = n.cri.sandboxes().iter().map(|s| s.attempt).collect();
    assert!(attempts.contains(&1), "{attempts:?}");
    assert_eq!(state(&n.status("web"), "c"), ("running".into(), 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_past_its_active_deadline_is_killed_and_failed() {
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    n.sync(&web).await;
    n.cri_calls();
    let mut p = n.api.pod("web").expect("pod");
    if let Some(spec) = p.spec.as_mut() {
        spec.active_deadline_seconds = Some(1);
    }
    if let Some(st) = p.status.as_mut() {
        st.start_time = Some(Time(Timestamp::now() - Duration::from_secs(5)));
    }
    n.api.put_pod(p);
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["StopContainer c 30", "StopPodSandbox web"]);
    let st = n.status("web");
    assert_eq!(st.phase.as_deref(), Some("Failed"));
    assert_eq!(st.reason.as_deref(), Some("DeadlineExceeded"));
    n.event("DeadlineExceeded", "longer than the specified deadline")
        .await;
}

/// Runs `edit` on the first container of `p`'s spec.
fn edit_container(p: &mut Pod, edit: impl FnOnce(&mut k8s_openapi::api::core::v1::Container)) {
    if let Some(c) = p.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        edit(c);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_with_the_largest_grace_period_runs_its_pre_stop_hook_and_stops() {
    let mut n = Node::start().await;
    let mut p = pod("web").container("c", IMAGE).build();
    if let Some(spec) = p.spec.as_mut() {
        spec.termination_grace_period_seconds = Some(i64::MAX);
    }
    edit_container(&mut p, |c| {
        c.lifecycle = Some(exec_pre_stop("drain"));
    });
    let web = n.bind(p);
    n.sync(&web).await;
    n.cri_calls();
    n.delete_gracefully("web", i64::MAX);
    // The hook returns at once; the container is stopped with what is left
    // of a grace period no clock can count to the end.
    n.sync_watched("web").await;
    assert_eq!(n.cri.execs(), ["c drain"]);
    assert_eq!(
        n.cri_calls(),
        [
            format!("StopContainer c {}", i64::MAX),
            "StopPodSandbox web".into()
        ]
    );
    assert_eq!(state(&n.status("web"), "c").0, "terminated:Error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_with_the_largest_probe_timings_and_active_deadline_starts_and_syncs() {
    for deadline in [i64::from(i32::MAX), i64::MAX] {
        let mut n = Node::start().await;
        let mut p = pod("web").container("c", IMAGE).build();
        if let Some(spec) = p.spec.as_mut() {
            spec.active_deadline_seconds = Some(deadline);
        }
        let probe = Probe {
            exec: Some(ExecAction {
                command: Some(vec!["check".into()]),
            }),
            initial_delay_seconds: Some(i32::MAX),
            period_seconds: Some(i32::MAX),
            timeout_seconds: Some(i32::MAX),
            success_threshold: Some(i32::MAX),
            failure_threshold: Some(i32::MAX),
            termination_grace_period_seconds: Some(i64::MAX),
            ..Default::default()
        };
        edit_container(&mut p, |c| {
            c.startup_probe = Some(probe.clone());
            c.liveness_probe = Some(probe.clone());
            c.readiness_probe = Some(probe);
        });
        let web = n.bind(p);
        n.sync(&web).await;
        assert_eq!(n.cri_calls(), started(&["c"]), "deadline {deadline}");
        // The second sync counts the active deadline from the start time the
        // first one reported; no probe is due for 68 years.
        for _ in 0..2 {
            let action = n.sync_watched("web").await;
            assert_eq!(n.cri_calls(), Vec::<String>::new(), "deadline {deadline}");
            assert_eq!(requeue(&action), Some(Duration::from_secs(2)));
        }
        let st = n.status("web");
        assert_eq!(st.phase.as_deref(), Some("Running"));
        assert_eq!(state(&st, "c").0, "running");
        assert!(st.start_time.is_some());
        assert_eq!(n.cri.execs(), Vec::<String>::new());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_with_huge_limits_is_created_with_clamped_resources() {
    let mut n = Node::start().await;
    let mut p = pod("web").container("c", IMAGE).build();
    edit_container(&mut p, |c| {
        c.resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("9e15".into())),
                ("memory".to_string(), Quantity("8Ei".into())),
            ])),
            ..Default::default()
        });
    });
    let web = n.bind(p);
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    let c = n.cri.containers().pop().expect("the container");
    let r = c.linux_resources.expect("Linux resources");
    // Shares at the kernel's maximum, the quota and the memory limit
    // (2^63 bytes, one past i64) saturated, Guaranteed's OOM score.
    assert_eq!(
        (
            r.cpu_shares,
            r.cpu_quota,
            r.cpu_period,
            r.memory_limit_in_bytes,
            r.oom_score_adj
        ),
        (262_144, i64::MAX, 100_000, i64::MAX, -997)
    );
    assert_eq!(state(&n.status("web"), "c").0, "running");
}

/// A sync that panics with `message`.
async fn panicking_sync(message: String) -> super::worker::Result<Action> {
    panic!("{message}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_that_panics_fails_with_an_event_and_the_pod_syncs_again() {
    use super::worker::{Error, FAILED_SYNC_NOTE, error_policy, isolated};
    let mut n = Node::start().await;
    let web = n.bind(pod("web").container("c", IMAGE).build());
    let sync = panicking_sync(format!("index {} out of range", 7));
    let err = isolated(&web, &n.ctx, sync)
        .await
        .expect_err("a failed sync");
    let Error::Panicked { pod, message } = &err else {
        panic!("not a panic: {err}");
    };
    assert_eq!(
        (pod.as_str(), message.as_str()),
        ("default/web", "index 7 out of range")
    );
    assert_eq!(
        err.to_string(),
        "sync pod default/web: panicked: index 7 out of range"
    );
    n.event("FailedSync", FAILED_SYNC_NOTE).await;
    // The error policy retries it as any failed sync, and the next sync of
    // the pod, through the same wrapper, goes on as usual.
    let action = error_policy(Arc::new(web.clone()), &err, n.ctx.clone());
    assert_eq!(requeue(&action), Some(Duration::from_secs(5)));
    let sync = reconcile(Arc::new(web.clone()), n.ctx.clone());
    isolated(&web, &n.ctx, sync).await.expect("a sync");
    assert_eq!(n.cri_calls(), started(&["c"]));
    assert_eq!(state(&n.status("web"), "c").0, "running");
    // A panic with a static message.
    let sync = async { panic!("static") };
    let err = isolated(&web, &n.ctx, sync)
        .await
        .expect_err("a failed sync");
    assert!(matches!(err, Error::Panicked { message, .. } if message == "static"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_divisor_too_large_to_hold_fails_the_container_config() {
    let mut n = Node::start().await;
    let mut p = pod("web").container("c", IMAGE).build();
    edit_container(&mut p, |c| {
        c.env = Some(vec![EnvVar {
            name: "CPU".into(),
            value_from: Some(EnvVarSource {
                resource_field_ref: Some(ResourceFieldSelector {
                    resource: "limits.cpu".into(),
                    divisor: Some(Quantity("1e2147483647".into())),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }]);
    });
    let web = n.bind(p);
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), ["RunPodSandbox default/web"]);
    let st = n.status("web");
    let waiting = st
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == "c");
    let waiting = waiting
        .and_then(|c| c.state.clone()?.waiting)
        .expect("waiting");
    assert_eq!(
        waiting.reason.as_deref(),
        Some("CreateContainerConfigError")
    );
    assert!(
        waiting
            .message
            .is_some_and(|m| m.contains("invalid quantity \"1e2147483647\"")),
    );
    n.event("Failed", "invalid quantity").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_liveness_kill_with_the_largest_probe_grace_period_runs_the_hook_and_restarts() {
    let mut n = Node::start().await;
    n.cri.script_exec(["check"], 1, "unhealthy");
    let mut p = pod("web").container("c", IMAGE).build();
    edit_container(&mut p, |c| {
        c.liveness_probe = Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec!["check".into()]),
            }),
            period_seconds: Some(1),
            failure_threshold: Some(1),
            termination_grace_period_seconds: Some(i64::MAX),
            ..Default::default()
        });
        c.lifecycle = Some(exec_pre_stop("drain"));
    });
    let web = n.bind(p);
    n.sync(&web).await;
    assert_eq!(n.cri_calls(), started(&["c"]));
    let calls = n.sync_until_called("web").await;
    assert_eq!(
        calls,
        [
            format!("StopContainer c {}", i64::MAX),
            "CreateContainer c".into(),
            "StartContainer c".into()
        ]
    );
    assert!(n.cri.execs().contains(&"c drain".to_string()));
    assert_eq!(state(&n.status("web"), "c"), ("running".into(), 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_start_hook_that_never_returns_does_not_hold_the_pods_deletion() {
    let mut n = Node::start().await;
    let mut p = pod("web")
        .container("c", IMAGE)
        .container("d", IMAGE)
        .build();
    edit_container(&mut p, |c| {
        c.lifecycle = Some(Lifecycle {
            post_start: Some(LifecycleHandler {
                sleep: Some(SleepAction { seconds: 100_000 }),
                ..Default::default()
            }),
            ..Default::default()
        });
    });
    let web = n.bind(p);
    // The hook holds the sync, as the kubelet runs postStart before the
    // container counts as started.
    let ctx = n.ctx.clone();
    let first = tokio::spawn(reconcile(Arc::new(web), ctx));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!first.is_finished(), "the hook runs");
    assert_eq!(n.cri_calls(), started(&["c"]));
    // Deleted meanwhile: the hook is cut short, the rest of the pass
    // starts nothing, and the sync ends.
    n.delete_gracefully("web", 30);
    n.watched("web");
    let ended = tokio::time::timeout(Duration::from_secs(5), first).await;
    ended
        .expect("the sync ends once the pod is being deleted")
        .expect("the sync does not panic")
        .expect("the sync succeeds");
    assert_eq!(n.cri_calls(), Vec::<String>::new(), "d is not started");
    n.event("FailedPostStartHook", "the pod is being deleted")
        .await;
    // The terminating sync stops the container, then the pod goes.
    n.sync_watched("web").await;
    assert_eq!(n.cri_calls(), ["StopContainer c 30", "StopPodSandbox web"]);
    n.sync_watched("web").await;
    assert_eq!(
        n.cri_calls(),
        [
            "StopPodSandbox web",
            "RemoveContainer c",
            "RemovePodSandbox web"
        ]
    );
    assert!(n.api.pod("web").is_none(), "the pod is deleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_exiting_under_restart_all_containers_restarts_the_whole_pod_to_its_mains() {
    let mut n = Node::start().await;
    let mut p = pod("web")
        .restart_policy("Never")
        .init_container("init", IMAGE)
        .sidecar("sidecar", IMAGE)
        .sidecar("source", IMAGE)
        .container("regular", IMAGE)
        .build();
    if let Some(spec) = p.spec.as_mut() {
        let source = &mut spec.init_containers.as_mut().expect("init")[2];
        source.restart_policy_rules =
            Some(vec![k8s_openapi::api::core::v1::ContainerRestartRule {
                action: "RestartAllContainers".into(),
                exit_codes: Some(
                    k8s_openapi::api::core::v1::ContainerRestartRuleOnExitCodes {
                        operator: "In".into(),
                        values: Some(vec![42]),
                    },
                ),
            }]);
    }
    let web = n.bind(p);
    let uid = web.metadata.uid.clone().unwrap_or_default();
    // Up to the main container, one sync per step.
    for _ in 0..6 {
        n.sync_watched("web").await;
        n.cri.exit_named(&uid, "init", 0);
    }
    let running = |n: &Node| {
        n.cri
            .containers()
            .iter()
            .filter(|c| c.state == k8s_cri::v1::ContainerState::ContainerRunning)
            .map(|c| format!("{}/{}", c.name, c.attempt))
            .collect::<Vec<_>>()
    };
    assert_eq!(running(&n), ["sidecar/0", "source/0", "regular/0"]);
    n.cri.exit_named(&uid, "source", 42);
    for _ in 0..8 {
        n.sync_watched("web").await;
        n.cri.exit_named(&uid, "init", 0);
    }
    assert_eq!(running(&n), ["sidecar/1", "source/1", "regular/1"]);
    assert_eq!(n.status("web").phase.as_deref(), Some("Running"));
}

/// After a restart of all containers in place, the container GC (one dead
/// instance kept per container) removes the regular init container's first
/// run: its status keeps its restart count, and loses its last state, as
/// the kubelet's `convertToAPIContainerStatuses` shows an init container
/// with one record left; the others keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_container_gc_after_a_restart_of_all_containers_keeps_every_restart_count() {
    let mut n = Node::start().await;
    let p = pod("web")
        .restart_policy("Never")
        .init_container("init", IMAGE)
        .sidecar("sidecar", IMAGE)
        .container("source", IMAGE)
        .container_restart("Never", &[("RestartAllContainers", "In", &[42])])
        .container("regular", IMAGE)
        .build();
    let web = n.bind(p);
    let uid = web.metadata.uid.clone().unwrap_or_default();
    for _ in 0..6 {
        n.sync_watched("web").await;
        n.cri.exit_named(&uid, "init", 0);
    }
    n.cri.exit_named(&uid, "source", 42);
    for _ in 0..8 {
        n.sync_watched("web").await;
        n.cri.exit_named(&uid, "init", 0);
    }
    // (name, restart count, a terminated last state) of every container.
    let shown = |st: &PodStatus| {
        st.init_container_statuses
            .iter()
            .flatten()
            .chain(st.container_statuses.iter().flatten())
            .map(|c| {
                let last = c
                    .last_state
                    .as_ref()
                    .is_some_and(|s| s.terminated.is_some());
                (c.name.clone(), c.restart_count, last)
            })
            .collect::<Vec<_>>()
    };
    let every = |init_last: bool| {
        vec![
            ("init".to_string(), 1, init_last),
            ("sidecar".to_string(), 1, true),
            ("source".to_string(), 1, true),
            ("regular".to_string(), 1, true),
        ]
    };
    assert_eq!(shown(&n.status("web")), every(true));
    let runtime = n.cri.client(Duration::from_secs(10)).await.expect("client");
    let links = n.dir.path().join("links");
    let policy = crate::container_gc::Policy::default();
    let collected = crate::container_gc::collect(&runtime, policy, i64::MAX, |_| false, &links)
        .await
        .expect("collect");
    assert_eq!(collected.containers, 1, "the init container's first run");
    n.sync_watched("web").await;
    assert_eq!(shown(&n.status("web")), every(false));
}
