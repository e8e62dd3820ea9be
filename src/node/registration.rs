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

/// The runtime's version, readiness and images, as the node status reports
/// them (CRI `Status`: the `RuntimeReady` and `NetworkReady` conditions; CRI
/// `ListImages`, at most `max_images` of them).
async fn runtime_facts(runtime: &Runtime, version: &str, max_images: i32) -> RuntimeFacts {
    let mut facts = RuntimeFacts {
        version: version.to_string(),
        ..Default::default()
    };
    match runtime.status().await {
        Ok(st) => {
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

/// What the status loop reads besides the machine and the runtime.
#[derive(Clone)]
pub struct Observed {
    /// The Node as the watch has it ([`watch_node`]).
    pub store: Store<Node>,
    /// The eviction manager's pressure conditions.
    pub pressures: tokio::sync::watch::Receiver<Vec<crate::eviction::Pressure>>,
}

/// Computes node status every `nodeStatusUpdateFrequency`, and at once when
/// the eviction manager's pressure conditions change, and patches it when it
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
    } = seen;
    let api: Api<Node> = Api::all(client);
    let key = ObjectRef::<Node>::new(&cfg.name);
    let mut last_report: Option<Instant> = None;
    // The first patch zeroes extended resources left on an existing Node.
    let mut starting = true;
    let mut tick = tokio::time::interval(settings.node_status_update_frequency);
    let mut pressures_open = true;
    loop {
        // Every nodeStatusUpdateFrequency, and at once when the eviction
        // manager's pressure conditions change (the control plane taints the
        // node from them).
        tokio::select! {
            _ = tick.tick() => {}
            changed = pressures.changed(), if pressures_open => {
                pressures_open = changed.is_ok();
            }
        }
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
        let facts = runtime_facts(&runtime, &version, cfg.max_images).await;
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
            .patch_status(&cfg.name, &PatchParams::default(), &Patch::Merge(&patch))
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
