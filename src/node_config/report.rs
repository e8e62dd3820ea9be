//! What the nodes reported of the `NodeConfiguration`s, and each resource's
//! status made from it, pure. A node writes two annotations on its own Node
//! ([`APPLIED_ANNOTATION`], [`REFUSED_ANNOTATION`]); the one status writer
//! (`rustlet report-node-configurations`, in the Helm chart's approver
//! Deployment) reads every Node's metadata and writes each resource's
//! `status`: the nodes it selects that reported, how many applied its
//! generation and refused it, and why, at most [`MAX_REFUSALS`] of them.

use std::collections::BTreeMap;

use kube::core::{Selector, SelectorExt};
use serde::{Deserialize, Serialize};

use super::decide::{Verdict, truncate_to};
use super::resource::{MAX_REFUSALS, NodeConfiguration, NodeConfigurationStatus, Refusal};

/// The Node annotation naming the resources a node applied:
/// `name/generation`, comma-separated, by name.
pub const APPLIED_ANNOTATION: &str = "rustlet.dev/node-configuration";
/// The Node annotation of the resources a node refused: a JSON list of
/// [`Refused`], at most [`MAX_REFUSALS`] of them.
pub const REFUSED_ANNOTATION: &str = "rustlet.dev/node-configuration-refused";
/// The most characters of a refusal's message in the annotation.
pub const MAX_REFUSAL_MESSAGE: usize = 256;

/// One resource a node refused, as its annotation lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    /// The resource's name.
    pub name: String,
    /// The generation refused.
    pub generation: i64,
    /// A CamelCase reason (`Conflict`, `Invalid`).
    pub reason: String,
    /// Why, cut to [`MAX_REFUSAL_MESSAGE`].
    pub message: String,
}

/// The applied annotation's value for `verdicts` (empty: none applied).
#[must_use]
pub fn applied_annotation(verdicts: &[Verdict]) -> String {
    verdicts
        .iter()
        .filter(|v| v.refused.is_none())
        .map(|v| format!("{}/{}", v.name, v.generation))
        .collect::<Vec<_>>()
        .join(",")
}

/// The refused annotation's value for `verdicts` (None: none refused).
#[must_use]
pub fn refused_annotation(verdicts: &[Verdict]) -> Option<String> {
    let refused: Vec<Refused> = verdicts
        .iter()
        .filter_map(|v| {
            let (reason, message) = v.refused.as_ref()?;
            Some(Refused {
                name: v.name.clone(),
                generation: v.generation,
                reason: (*reason).to_string(),
                message: truncate_to(message.clone(), MAX_REFUSAL_MESSAGE),
            })
        })
        .take(MAX_REFUSALS)
        .collect();
    if refused.is_empty() {
        return None;
    }
    serde_json::to_string(&refused).ok()
}

/// What one node reported, read from its Node's name, labels and
/// annotations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeReport {
    /// The node's name.
    pub node: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// The resources it applied: name → generation.
    pub applied: BTreeMap<String, i64>,
    /// The resources it refused, by name.
    pub refused: BTreeMap<String, Refused>,
}

impl NodeReport {
    /// The report of the Node `name` with `labels` and `annotations`; an
    /// annotation that does not parse counts as none.
    #[must_use]
    pub fn read(
        name: &str,
        labels: &BTreeMap<String, String>,
        annotations: &BTreeMap<String, String>,
    ) -> Self {
        let applied = annotations
            .get(APPLIED_ANNOTATION)
            .into_iter()
            .flat_map(|v| v.split(','))
            .filter_map(|item| {
                let (name, generation) = item.rsplit_once('/')?;
                Some((name.to_string(), generation.parse().ok()?))
            })
            .collect();
        let refused = annotations
            .get(REFUSED_ANNOTATION)
            .and_then(|v| serde_json::from_str::<Vec<Refused>>(v).ok())
            .into_iter()
            .flatten()
            .take(MAX_REFUSALS)
            .map(|r| (r.name.clone(), r))
            .collect();
        Self {
            node: name.to_string(),
            labels: labels.clone(),
            applied,
            refused,
        }
    }

    /// True when the node reported anything of resource `name`.
    fn mentions(&self, name: &str) -> bool {
        self.applied.contains_key(name) || self.refused.contains_key(name)
    }
}

/// The status of `resource` from the nodes' reports: `selected` counts the
/// nodes its selector selects that reported it (a node reports every
/// resource that selects it, so a node that has not yet is left out);
/// `applied` and `refused` count those that applied or refused its
/// current generation; `refusals` lists the first [`MAX_REFUSALS`] of the
/// latter by node name.
#[must_use]
pub fn status(resource: &NodeConfiguration, nodes: &[NodeReport]) -> NodeConfigurationStatus {
    let name = resource.metadata.name.as_deref().unwrap_or_default();
    let generation = resource.metadata.generation.unwrap_or(0);
    let selector = Selector::try_from(resource.spec.node_selector.clone()).ok();
    let mut out = NodeConfigurationStatus {
        observed_generation: Some(generation),
        ..NodeConfigurationStatus::default()
    };
    let count = |n: &mut i32| *n = n.saturating_add(1);
    let mut refusals: Vec<Refusal> = Vec::new();
    for n in nodes {
        let selected = selector.as_ref().is_some_and(|s| s.matches(&n.labels));
        if !(selected || n.refused.contains_key(name)) || !n.mentions(name) {
            continue;
        }
        count(&mut out.selected);
        if n.applied.get(name) == Some(&generation) {
            count(&mut out.applied);
        }
        if let Some(r) = n.refused.get(name).filter(|r| r.generation == generation) {
            count(&mut out.refused);
            refusals.push(Refusal {
                node: n.node.clone(),
                field: String::new(),
                reason: r.reason.clone(),
                message: r.message.clone(),
            });
        }
    }
    refusals.sort_by(|a, b| a.node.cmp(&b.node));
    refusals.truncate(MAX_REFUSALS);
    out.refusals = refusals;
    out
}
