//! The one writer of the `NodeConfiguration`s' status (`rustlet
//! report-node-configurations`, a container of the Helm chart's approver
//! Deployment, one replica): it watches the resources and the metadata of
//! every Node (labels and annotations only: a few hundred bytes a node, so
//! 5,000 nodes cost a few MiB and no node's status updates reach it), and
//! every [`PERIOD`] writes each resource's status
//! ([`crate::node_config::report::status`]) where it changed. Nodes never
//! write a resource: each reports on its own Node, which the Node
//! authorizer already allows, so there is no conflict however many nodes a
//! resource selects.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tracing::{debug, info, warn};

use crate::node_config::NodeConfiguration;
use crate::node_config::report::{NodeReport, status};

/// How often the statuses are computed and written where they changed.
pub const PERIOD: Duration = Duration::from_secs(5);

/// Follows `stream` into `writer`, saying the first error once.
fn reflect<K>(
    what: &'static str,
    stream: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    writer: reflector::store::Writer<K>,
) where
    K: kube::Resource + Clone + Send + Sync + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    tokio::spawn(
        stream
            .default_backoff()
            .reflect(writer)
            .for_each(move |ev| {
                if let Err(e) = ev {
                    debug!(error = %e, what, "watch; retrying");
                }
                async {}
            }),
    );
}

/// Runs the status writer with `client` until the process stops.
pub async fn run(client: Client) {
    let (resources, writer) = reflector::store::<NodeConfiguration>();
    reflect(
        "NodeConfigurations",
        watcher(Api::all(client.clone()), watcher::Config::default()),
        writer,
    );
    let (nodes, writer) = reflector::store::<PartialObjectMeta<Node>>();
    reflect(
        "Nodes",
        watcher(
            Api::<PartialObjectMeta<Node>>::all(client.clone()),
            watcher::Config::default(),
        ),
        writer,
    );
    info!("writing the NodeConfigurations' status");
    let api = Api::<NodeConfiguration>::all(client);
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        write_all(&api, &resources, &nodes).await;
    }
}

/// One round: each resource whose status differs from what the reports make
/// of it gets the new status.
async fn write_all(
    api: &Api<NodeConfiguration>,
    resources: &Store<NodeConfiguration>,
    nodes: &Store<PartialObjectMeta<Node>>,
) {
    let reports: Vec<NodeReport> = nodes
        .state()
        .iter()
        .map(|n| NodeReport::read(&n.name_any(), n.labels(), n.annotations()))
        .collect();
    for r in resources.state() {
        let new = status(&r, &reports);
        if r.status.as_ref() == Some(&new) {
            continue;
        }
        let name = r.name_any();
        // A merge patch: the list of refusals is sent even when empty, so
        // that it replaces the one before.
        let mut value = serde_json::to_value(&new).unwrap_or_default();
        if let Some(obj) = value.as_object_mut() {
            obj.entry("refusals")
                .or_insert_with(|| serde_json::json!([]));
        }
        let body = serde_json::json!({ "status": value });
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(body))
            .await
        {
            Ok(_) => {
                debug!(resource = %name, applied = new.applied, refused = new.refused, "status written")
            }
            Err(e) => warn!(resource = %name, error = %e, "write the status"),
        }
    }
}
