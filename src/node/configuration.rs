//! The `NodeConfiguration`s that select this node, applied while the agent
//! runs: a watch of the resources (cluster-scoped, few) and the Node's
//! labels from its own watch feed [`crate::node_config::decide`]; what it
//! decides is applied live (the image manager's policy, the eviction
//! manager's thresholds and timings, `/configz`) and reported on this
//! node's own Node, the only object a node may write: the annotation
//! [`ANNOTATION`] names each resource applied with its generation, and the
//! condition [`CONDITION`] says whether all applied (`True`) or why some
//! were refused (`False`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::config::Settings;
use crate::eviction::manager::Limits;
use crate::image_gc::ImageGc;
use crate::node_config::decide::{Decision, Verdict, decide};
use crate::node_config::report::{REFUSED_ANNOTATION, applied_annotation, refused_annotation};
use crate::node_config::{LiveKubeletConfiguration, NodeConfiguration};

/// The Node annotation naming the resources applied: `name/generation`,
/// comma-separated, by name.
pub const ANNOTATION: &str = crate::node_config::report::APPLIED_ANNOTATION;
/// The Node condition of the resources' application.
pub const CONDITION: &str = "NodeConfigurationApplied";
/// How often the resources and the Node's labels are looked at.
pub const PERIOD: Duration = Duration::from_secs(2);
/// The most resources weighed; past it, the first by name.
pub const MAX_RESOURCES: usize = 1000;
/// The most characters of the condition's message.
pub const MAX_MESSAGE: usize = 1024;

/// What a decision was made on: each resource's name and generation, and
/// the Node's labels.
type Seen = (Vec<(String, i64)>, BTreeMap<String, String>);

/// What a decision changes while the agent runs.
pub struct Live {
    /// The image manager, whose policy is replaced.
    pub image_gc: Arc<ImageGc>,
    /// The eviction manager's thresholds and timings.
    pub limits: watch::Sender<Limits>,
    /// The configuration in effect, as `/configz` and `/configz/sources`
    /// show it.
    pub configz: watch::Sender<crate::config::Effective>,
}

/// The controller's inputs.
pub struct Controller {
    /// The API client (the node's identity).
    pub client: Client,
    /// This node's name.
    pub node_name: String,
    /// The settings of the file and flags: the base of every decision.
    pub base: Settings,
    /// This node's Node, as its watch holds it.
    pub node: Store<Node>,
    /// What is changed live.
    pub live: Live,
}

/// The condition's status, reason and message for `verdicts`.
fn condition(verdicts: &[Verdict]) -> (&'static str, &'static str, String) {
    let refused: Vec<&Verdict> = verdicts.iter().filter(|v| v.refused.is_some()).collect();
    let mut message = if verdicts.is_empty() {
        return (
            "True",
            "NoConfiguration",
            "no NodeConfiguration selects this node".into(),
        );
    } else if refused.is_empty() {
        format!(
            "applied {}",
            applied_annotation(verdicts).replace(',', ", ")
        )
    } else {
        refused
            .iter()
            .filter_map(|v| {
                let (reason, why) = v.refused.as_ref()?;
                Some(format!(
                    "{}/{} refused ({reason}): {why}",
                    v.name, v.generation
                ))
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    message = crate::node_config::decide::truncate_to(message, MAX_MESSAGE);
    match refused.first().and_then(|v| v.refused.as_ref()) {
        None => ("True", "Applied", message),
        Some((reason, _)) => ("False", reason, message),
    }
}

impl Controller {
    /// Runs forever: watches the resources, decides every [`PERIOD`] when
    /// they or the Node's labels changed, applies and reports.
    pub async fn run(self) {
        let (store, writer) = reflector::store::<NodeConfiguration>();
        tokio::spawn(
            watcher(
                Api::<NodeConfiguration>::all(self.client.clone()),
                watcher::Config::default(),
            )
            .default_backoff()
            .reflect(writer)
            .for_each({
                let mut said = false;
                move |ev| {
                    if let Err(e) = ev {
                        // The definition not installed, or no permission:
                        // said once, then quietly retried.
                        if said {
                            debug!(error = %e, "watch NodeConfigurations");
                        } else {
                            warn!(error = %e, "watch NodeConfigurations (is crds/ installed?); retrying");
                            said = true;
                        }
                    }
                    async {}
                }
            }),
        );
        let mut seen: Option<Seen> = None;
        let mut applied = LiveKubeletConfiguration::default();
        let mut reported: Option<Vec<Verdict>> = None;
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(node) = self.node.state().into_iter().next() else {
                continue;
            };
            let mut resources: Vec<NodeConfiguration> =
                store.state().iter().map(|r| (**r).clone()).collect();
            resources.sort_by_key(ResourceExt::name_any);
            if resources.len() > MAX_RESOURCES {
                warn!(
                    resources = resources.len(),
                    max = MAX_RESOURCES,
                    "too many NodeConfigurations: the first by name are weighed"
                );
                resources.truncate(MAX_RESOURCES);
            }
            let labels = node.labels().clone();
            let key = (
                resources
                    .iter()
                    .map(|r| (r.name_any(), r.metadata.generation.unwrap_or(0)))
                    .collect(),
                labels.clone(),
            );
            if seen.as_ref() == Some(&key) && reported.is_some() {
                continue;
            }
            let d = decide(&self.base, &resources, &labels, &applied);
            self.apply(&d, &applied);
            applied = d.live.clone();
            seen = Some(key);
            // A node no resource ever selected has nothing to report: no
            // write (most nodes of most clusters).
            let never = d.verdicts.is_empty()
                && !node.annotations().contains_key(ANNOTATION)
                && !node
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == CONDITION));
            if never {
                reported = Some(Vec::new());
            }
            if reported.as_ref() != Some(&d.verdicts) {
                match self.report(&d.verdicts).await {
                    Ok(()) => reported = Some(d.verdicts),
                    Err(e) => {
                        warn!(error = %e, "report the NodeConfigurations applied");
                        seen = None;
                    }
                }
            }
        }
    }

    /// Applies the decision's settings where they differ from `before`.
    fn apply(&self, d: &Decision, before: &LiveKubeletConfiguration) {
        if d.live == *before {
            return;
        }
        let s = &d.settings;
        self.live.image_gc.set_policy(s.image_gc);
        match crate::eviction::limits(s) {
            Ok(l) => {
                self.live.limits.send_if_modified(|cur| {
                    let changed = *cur != l;
                    *cur = l;
                    changed
                });
            }
            // `decide` checked them; kept as they are otherwise.
            Err(e) => warn!(error = %e, "eviction thresholds not applied"),
        }
        self.live.configz.send_replace(s.effective());
        info!(
            applied = %applied_annotation(&d.verdicts),
            "node configuration applied"
        );
    }

    /// Writes the annotation and the condition on this node's Node.
    async fn report(&self, verdicts: &[Verdict]) -> kube::Result<()> {
        let api = Api::<Node>::all(self.client.clone());
        let value = applied_annotation(verdicts);
        let annotations = serde_json::json!({
            ANNOTATION: (!value.is_empty()).then_some(value),
            REFUSED_ANNOTATION: refused_annotation(verdicts),
        });
        api.patch(
            &self.node_name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "metadata": { "annotations": annotations } })),
        )
        .await?;
        let (status, reason, message) = condition(verdicts);
        let now = Timestamp::now().to_string();
        let previous = self.node.state().into_iter().next().and_then(|n| {
            n.status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == CONDITION)
                .cloned()
        });
        let transition = match previous {
            Some(c) if c.status == status => c
                .last_transition_time
                .map_or_else(|| now.clone(), |t| t.0.to_string()),
            _ => now.clone(),
        };
        // A strategic merge patch keyed by `type` (the kubelet's node
        // status writes): the other conditions are left alone.
        let body = serde_json::json!({ "status": { "conditions": [{
            "type": CONDITION,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": transition,
        }] } });
        api.patch_status(
            &self.node_name,
            &PatchParams::default(),
            &Patch::Strategic(body),
        )
        .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(name: &str, generation: i64, refused: Option<(&'static str, &str)>) -> Verdict {
        Verdict {
            name: name.into(),
            generation,
            refused: refused.map(|(r, m)| (r, m.to_string())),
        }
    }

    #[test]
    fn the_report_names_what_was_applied_and_why_others_were_not() {
        assert_eq!(
            condition(&[]),
            (
                "True",
                "NoConfiguration",
                "no NodeConfiguration selects this node".to_string()
            )
        );
        let ok = [verdict("a", 2, None), verdict("b", 1, None)];
        assert_eq!(applied_annotation(&ok), "a/2,b/1");
        assert_eq!(
            condition(&ok),
            ("True", "Applied", "applied a/2, b/1".to_string())
        );
        let mixed = [
            verdict("a", 2, None),
            verdict(
                "b",
                1,
                Some(("Conflict", "imageGCHighThresholdPercent is also set by c")),
            ),
            verdict(
                "c",
                4,
                Some(("Conflict", "imageGCHighThresholdPercent is also set by b")),
            ),
        ];
        assert_eq!(applied_annotation(&mixed), "a/2");
        let (status, reason, message) = condition(&mixed);
        assert_eq!((status, reason), ("False", "Conflict"));
        assert_eq!(
            message,
            "b/1 refused (Conflict): imageGCHighThresholdPercent is also set by c; \
             c/4 refused (Conflict): imageGCHighThresholdPercent is also set by b"
        );
        let long = "x".repeat(4000);
        let (_, _, message) = condition(&[verdict("a", 1, Some(("Invalid", &long)))]);
        assert!(message.chars().count() <= MAX_MESSAGE + 1);
    }
}
