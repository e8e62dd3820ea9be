//! Registration of the Node and its status loop, as the kubelet's
//! `registerWithAPIServer` and `syncNodeStatus` (kubelet_node_status.go): the
//! Node is created (or adopted) at start, then its status is computed every
//! `nodeStatusUpdateFrequency` and patched when it changed or
//! `nodeStatusReportFrequency` passed.

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tracing::{info, warn};

use super::MachineInfo;
use super::status::{NodeConfig, RuntimeFacts};
use crate::config::Settings;
use crate::cri::Runtime;

/// The runtime's version, readiness, handlers and images, as the node status
/// reports them (CRI `Status`: the `RuntimeReady` and `NetworkReady`
/// conditions and the runtime handlers with their features; CRI
/// `ListImages`, at most `max_images` of them).
async fn runtime_facts(runtime: &Runtime, version: &str, max_images: i32) -> RuntimeFacts {
    let mut facts = RuntimeFacts {
        version: version.to_string(),
        ..Default::default()
    };
    match runtime.status().await {
        Ok(st) => {
            facts.runtime_handlers = Some(super::status::runtime_handlers(&st.runtime_handlers));
            for c in st.status.map(|s| s.conditions).unwrap_or_default() {
                if c.status {
                    continue;
                }
                let text = format!(
                    "{}=false reason:{} message:{}",
                    c.r#type, c.reason, c.message
                );
                match c.r#type.as_str() {
                    "RuntimeReady" => facts.runtime_not_ready = Some(text),
                    "NetworkReady" => facts.network_not_ready = Some(text),
                    _ => {}
                }
            }
        }
        Err(e) => facts.runtime_not_ready = Some(e.to_string()),
    }
    match runtime.list_images().await {
        Ok(list) => facts.images = Some(super::status::node_images(&list, max_images)),
        Err(e) => warn!(error = %e, "list images for node status"),
    }
    facts
}

/// Creates the Node, or adopts an existing one (labels merged); returns its UID.
/// Retries until the API server accepts, as `registerWithAPIServer`.
pub async fn register(
    client: &Client,
    runtime: &Runtime,
    cfg: &NodeConfig,
    m: &MachineInfo,
    version: &str,
) -> String {
    let api: Api<Node> = Api::all(client.clone());
    let mut delay = Duration::from_millis(100);
    loop {
        let facts = runtime_facts(runtime, version, cfg.max_images).await;
        let node = super::status::initial_node(
            cfg,
            super::status::status(cfg, m, &facts, None, Timestamp::now(), &[]),
        );
        let result = match api.create(&PostParams::default(), &node).await {
            Ok(n) => Ok(n),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let patch = serde_json::json!({ "metadata": { "labels": node.metadata.labels } });
                api.patch(&cfg.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(n) => {
                info!(node = cfg.name, "node registered");
                return n.metadata.uid.unwrap_or_default();
            }
            Err(e) => warn!(error = %e, "register node; retrying"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(7));
    }
}

/// A store of this node's Node object kept by a watch (the kubelet's node
/// informer), for the status loop and admission.
#[must_use]
pub fn watch_node(client: Client, name: &str) -> Store<Node> {
    let (store, writer) = reflector::store();
    tokio::spawn(
        watcher(
            Api::<Node>::all(client),
            watcher::Config::default().fields(&format!("metadata.name={name}")),
        )
        .default_backoff()
        .reflect(writer)
        .for_each(|ev| async move {
            if let Err(e) = ev {
                warn!(error = %e, "watch node");
            }
        }),
    );
    store
}

/// Gives the runtime `node`'s pod CIDRs when they differ from `last`, the
/// ones it was last given (kept on success), as the kubelet's
/// `updatePodCIDR`; a failure is logged and tried again on the next call.
async fn sync_pod_cidr(runtime: &Runtime, node: Option<&Node>, last: &mut Option<String>) {
    let Some(cidr) = node.and_then(super::status::pod_cidr) else {
        return;
    };
    if last.as_deref() == Some(cidr.as_str()) {
        return;
    }
    match runtime.update_pod_cidr(&cidr).await {
        Ok(()) => {
            info!(cidr, "the runtime has the node's pod CIDR");
            *last = Some(cidr);
        }
        Err(e) => warn!(error = %e, cidr, "update the runtime's pod CIDR"),
    }
}

/// What the status loop reads besides the machine and the runtime.
#[derive(Clone)]
pub struct Observed {
    /// The Node as the watch has it ([`watch_node`]).
    pub store: Store<Node>,
    /// The eviction manager's pressure conditions.
    pub pressures: tokio::sync::watch::Receiver<Vec<crate::eviction::Pressure>>,
    /// The device plugins' resources (None: no device manager).
    pub devices: Option<crate::device_manager::DeviceManager>,
    /// Whether a node shutdown is under way (the node shutdown manager's).
    pub shutting_down: tokio::sync::watch::Receiver<bool>,
}

/// Computes node status every `nodeStatusUpdateFrequency`, and at once when
/// the eviction manager's pressure conditions or a device plugin's devices
/// change, and patches it when it
/// changed or `nodeStatusReportFrequency` passed, as `syncNodeStatus`. The
/// status it compares with comes from the watch ([`watch_node`]): what other
/// writers add (an administrator's extended resources) is seen at the next
/// update without polling the API server.
pub async fn status_loop(
    client: Client,
    seen: Observed,
    runtime: Runtime,
    cfg: NodeConfig,
    machine: MachineInfo,
    version: String,
    settings: Settings,
) {
    let Observed {
        store,
        mut pressures,
        devices,
        mut shutting_down,
    } = seen;
    let mut shutdown_open = true;
    let mut device_changes = devices
        .as_ref()
        .map(crate::device_manager::DeviceManager::subscribe);
    let mut devices_open = device_changes.is_some();
    let api: Api<Node> = Api::all(client);
    let key = ObjectRef::<Node>::new(&cfg.name);
    let mut last_report: Option<Instant> = None;
    // The first patch zeroes extended resources left on an existing Node.
    let mut starting = true;
    let mut tick = tokio::time::interval(settings.node_status_update_frequency);
    let mut pressures_open = true;
    // The pod CIDR the runtime was last given.
    let mut runtime_cidr: Option<String> = None;
    loop {
        // Every nodeStatusUpdateFrequency, and at once when the eviction
        // manager's pressure conditions change (the control plane taints the
        // node from them).
        tokio::select! {
            _ = tick.tick() => {}
            changed = pressures.changed(), if pressures_open => {
                pressures_open = changed.is_ok();
            }
            // A shutdown began or was cancelled (the kubelet's shutdown
            // manager syncs node status at once).
            changed = shutting_down.changed(), if shutdown_open => {
                shutdown_open = changed.is_ok();
            }
            // A device plugin's devices changed (the kubelet's device
            // manager calls for a node status update).
            changed = async {
                match device_changes.as_mut() {
                    Some(rx) => rx.changed().await,
                    None => std::future::pending().await,
                }
            }, if devices_open => {
                devices_open = changed.is_ok();
            }
        }
        sync_pod_cidr(&runtime, store.get(&key).as_deref(), &mut runtime_cidr).await;
        let old = match store.get(&key) {
            Some(n) => n.status.clone(),
            // Not listed yet: read it once.
            None => match api.get(&cfg.name).await {
                Ok(n) => n.status,
                Err(e) => {
                    warn!(error = %e, "get node status");
                    continue;
                }
            },
        };
        let mut facts = runtime_facts(&runtime, &version, cfg.max_images).await;
        facts.shutting_down = *shutting_down.borrow();
        let current = pressures.borrow().clone();
        let mut new = super::status::status(
            &cfg,
            &machine,
            &facts,
            old.as_ref(),
            Timestamp::now(),
            &current,
        );
        if starting {
            super::status::zero_extended_resources(&mut new);
        }
        if let Some(d) = &devices {
            super::status::set_device_resources(&mut new, &d.resources(Instant::now()));
        }
        super::status::set_volumes_in_use(
            &mut new,
            old.as_ref(),
            crate::volume::csi::in_use(&settings.root_dir),
        );
        let due = last_report.is_none_or(|t| t.elapsed() >= settings.node_status_report_frequency);
        if !due && !super::status::changed(old.as_ref(), &new) {
            continue;
        }
        let patch = match super::status::status_patch(old.as_ref(), &new) {
            Ok(p) => p,
            Err(e) => {
                warn!(error = %e, "node status patch");
                continue;
            }
        };
        match api
            .patch_status(
                &cfg.name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            Ok(_) => {
                starting = false;
                last_report = Some(Instant::now());
            }
            Err(e) => warn!(error = %e, "patch node status"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::fake::FakeRuntime;
    use k8s_openapi::api::core::v1::NodeSpec;

    fn node(pod_cidr: Option<&str>, pod_cidrs: &[&str]) -> Node {
        Node {
            spec: Some(NodeSpec {
                pod_cidr: pod_cidr.map(str::to_string),
                pod_cidrs: Some(pod_cidrs.iter().map(|c| (*c).to_string()).collect()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn the_runtime_gets_the_pod_cidr_once_and_again_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let (fake, _) = FakeRuntime::serve(dir.path()).unwrap();
        let runtime = fake
            .client(std::time::Duration::from_secs(10))
            .await
            .unwrap();
        let mut last = None;
        for n in [None, Some(node(None, &[]))] {
            sync_pod_cidr(&runtime, n.as_ref(), &mut last).await;
        }
        assert!(fake.take_calls().is_empty(), "no CIDR yet: nothing sent");
        let one = node(Some("10.89.1.0/24"), &["10.89.1.0/24"]);
        for _ in 0..3 {
            sync_pod_cidr(&runtime, Some(&one), &mut last).await;
        }
        assert_eq!(fake.take_calls(), ["UpdateRuntimeConfig 10.89.1.0/24"]);
        let dual = node(Some("10.89.1.0/24"), &["10.89.1.0/24", "fd00:1::/64"]);
        sync_pod_cidr(&runtime, Some(&dual), &mut last).await;
        let old_field_only = node(Some("10.89.2.0/24"), &[]);
        sync_pod_cidr(&runtime, Some(&old_field_only), &mut last).await;
        assert_eq!(
            fake.take_calls(),
            [
                "UpdateRuntimeConfig 10.89.1.0/24,fd00:1::/64",
                "UpdateRuntimeConfig 10.89.2.0/24"
            ]
        );
    }
}
