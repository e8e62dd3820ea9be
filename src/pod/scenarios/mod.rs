//! Scenario tests of the pod worker, in process and without a cluster, in the
//! manner of the kubelet's `TestSyncPod*` (a fake runtime) and kube-rs
//! controller-rs (a fake API server asserting each request): the real
//! [`reconcile`] runs against the in-memory CRI runtime
//! ([`crate::cri::fake`], served over a unix socket, reached through the real
//! CRI client) and a fake API server behind a real `kube::Client`. Each
//! scenario asserts the exact runtime calls and API requests of each sync.
//! This module holds the harness ([`Node`]); the scenarios are in a module
//! per topic: lifecycle, deletion, admission, eviction, restart (of the
//! agent), volumes, ResourceClaims, static pods, resize, leaks, hostile
//! numbers, and the node's reset.

mod admission;
mod claims;
mod deletion;
mod eviction;
mod hostile;
mod leaks;
mod lifecycle;
mod reset;
mod resize;
mod restart;
mod static_pods;
mod volumes;

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
        Self::with_node(api, cri, dir, true, None, Default::default()).await
    }

    /// A node whose image manager verifies credentials by `policy`
    /// (`imagePullCredentialsVerificationPolicy`).
    async fn start_with_image_policy(policy: crate::image_policy::VerificationPolicy) -> Self {
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        let (cri, _) = FakeRuntime::serve(dir.path()).expect("serve the fake runtime");
        cri.add_image(IMAGE);
        Self::with_node(FakeApi::default(), cri, dir, true, None, policy).await
    }

    /// A node whose pods get cgroups of their own in `cgroups`.
    async fn start_with_cgroups(cgroups: crate::cgroups::CgroupManager) -> Self {
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        let (cri, _) = FakeRuntime::serve(dir.path()).expect("serve the fake runtime");
        cri.add_image(IMAGE);
        Self::with_node(
            FakeApi::default(),
            cri,
            dir,
            true,
            Some(cgroups),
            Default::default(),
        )
        .await
    }

    /// A node whose Node object is not listed yet (the API server has not
    /// answered).
    async fn start_unregistered() -> Self {
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        let (cri, _) = FakeRuntime::serve(dir.path()).expect("serve the fake runtime");
        cri.add_image(IMAGE);
        Self::with_node(
            FakeApi::default(),
            cri,
            dir,
            false,
            None,
            Default::default(),
        )
        .await
    }

    async fn with_node(
        api: FakeApi,
        cri: FakeRuntime,
        dir: Arc<tempfile::TempDir>,
        node_listed: bool,
        cgroups: Option<crate::cgroups::CgroupManager>,
        image_policy: crate::image_policy::VerificationPolicy,
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
        .with_pull_records(&root, image_policy);
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
                dra: crate::dra::DraManager::open(client.clone(), "node-1", &root).unwrap(),
                cpus: None,
                memory: None,
                topology: crate::topology_manager::TopologyManager::default(),
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
            shutting_down: tokio::sync::watch::channel(false).1,
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
            reason: crate::reasons::pod::EVICTED,
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

/// Runs `edit` on the first container of `p`'s spec.
fn edit_container(p: &mut Pod, edit: impl FnOnce(&mut k8s_openapi::api::core::v1::Container)) {
    if let Some(c) = p.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        edit(c);
    }
}
