//! The `NodeConfiguration` custom resource (group `rustlet.dev`, version
//! `v1alpha1`, cluster-scoped): KubeletConfiguration fields for the nodes
//! its `nodeSelector` selects. The schema, with its validation, is derived
//! from these types (`kube::CustomResource`, `schemars`) and checked in as
//! `crds/nodeconfigurations.rustlet.dev.yaml`.
//!
//! The fields are those the agent applies without a restart (the image
//! manager's policy and the eviction manager's soft thresholds and
//! timings), with the kubelet's names, units and checks
//! (`docs/configuration.md` lists each and why it is live); a field the
//! kubelet relates to another carries the relation as a CEL rule, so the
//! API server refuses what the kubelet's validation would.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The API group of the project's custom resources.
pub const GROUP: &str = "rustlet.dev";
/// The most entries of an eviction threshold map (there are nine signals).
pub const MAX_SIGNALS: usize = 9;
/// The most refusals a resource's status lists.
pub const MAX_REFUSALS: usize = 20;

/// A Go duration, as `metav1.Duration` is written (`90s`, `1h30m`, `0`).
const DURATION: &str = r"^(0|([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$";

/// The eviction signals of the kubelet (`pkg/kubelet/eviction/api`).
const SIGNALS: &str = "['memory.available', 'allocatableMemory.available', 'nodefs.available', \
                       'nodefs.inodesFree', 'imagefs.available', 'imagefs.inodesFree', \
                       'containerfs.available', 'containerfs.inodesFree', 'pid.available']";

/// The desired state of a `NodeConfiguration`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "rustlet.dev",
    version = "v1alpha1",
    kind = "NodeConfiguration",
    plural = "nodeconfigurations",
    singular = "nodeconfiguration",
    shortname = "nodeconfig",
    status = "NodeConfigurationStatus",
    doc = "KubeletConfiguration fields that rustlet agents apply, without a restart, on the nodes the selector selects.",
    printcolumn = r#"{"name": "Selected", "type": "integer", "jsonPath": ".status.selected", "description": "Nodes the selector selects that reported"}"#,
    printcolumn = r#"{"name": "Applied", "type": "integer", "jsonPath": ".status.applied", "description": "Nodes that applied the observed generation"}"#,
    printcolumn = r#"{"name": "Refused", "type": "integer", "jsonPath": ".status.refused", "description": "Nodes that refused it"}"#,
    printcolumn = r#"{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfigurationSpec {
    /// The Nodes, by their labels, this configuration is for; an empty
    /// selector selects every node.
    #[schemars(schema_with = "label_selector")]
    pub node_selector: LabelSelector,
    /// The KubeletConfiguration fields to set, over each node's file.
    #[serde(default)]
    pub kubelet_configuration: LiveKubeletConfiguration,
}

/// The KubeletConfiguration fields an agent applies without a restart,
/// with the kubelet's names and checks (its `ValidateKubeletConfiguration`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(
    validation = Rule::new("!has(self.imageGCHighThresholdPercent) || !has(self.imageGCLowThresholdPercent) || self.imageGCLowThresholdPercent < self.imageGCHighThresholdPercent")
        .message("imageGCLowThresholdPercent must be less than imageGCHighThresholdPercent"),
)]
pub struct LiveKubeletConfiguration {
    /// Disk usage, percent, at which image garbage collection starts.
    #[serde(
        rename = "imageGCHighThresholdPercent",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 100))]
    pub image_gc_high_threshold_percent: Option<i32>,
    /// Disk usage, percent, image garbage collection brings it under.
    #[serde(
        rename = "imageGCLowThresholdPercent",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = 100))]
    pub image_gc_low_threshold_percent: Option<i32>,
    /// The least age of an unused image before it may be collected.
    #[serde(rename = "imageMinimumGCAge", skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION))]
    pub image_minimum_gc_age: Option<String>,
    /// The age of an unused image past which it is collected (`0`: never).
    #[serde(rename = "imageMaximumGCAge", skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION))]
    pub image_maximum_gc_age: Option<String>,
    /// Soft eviction thresholds: signal to a quantity or a percentage.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = MAX_SIGNALS, "additionalProperties" = {"type": "string", "maxLength": 32}))]
    #[x_kube(validation = thresholds_rule())]
    pub eviction_soft: Option<BTreeMap<String, String>>,
    /// How long each soft threshold must hold: signal to a duration.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = MAX_SIGNALS, "additionalProperties" = {"type": "string", "maxLength": 32}))]
    pub eviction_soft_grace_period: Option<BTreeMap<String, String>>,
    /// The least reclaimed past a threshold: signal to a quantity or a
    /// percentage.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = MAX_SIGNALS, "additionalProperties" = {"type": "string", "maxLength": 32}))]
    #[x_kube(validation = thresholds_rule())]
    pub eviction_minimum_reclaim: Option<BTreeMap<String, String>>,
    /// How long a pressure condition stays after its signal clears.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DURATION))]
    pub eviction_pressure_transition_period: Option<String>,
    /// The most grace, seconds, a pod evicted by a soft threshold gets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_max_pod_grace_period: Option<i32>,
}

fn thresholds_rule() -> kube::core::Rule {
    kube::core::Rule::new(format!(
        "self.all(k, k in {SIGNALS} && (isQuantity(self[k]) || self[k].matches('^[0-9]+(\\\\.[0-9]+)?%$')))"
    ))
    .message("keys must be eviction signals, values quantities or percentages")
}

/// What the agents reported of a `NodeConfiguration`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfigurationStatus {
    /// The generation the counts are of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Nodes the selector selects.
    #[serde(default)]
    pub selected: i32,
    /// Of those, the nodes that applied the observed generation.
    #[serde(default)]
    pub applied: i32,
    /// Of those, the nodes that refused it.
    #[serde(default)]
    pub refused: i32,
    /// Why nodes refused it, at most 20 (`MAX_REFUSALS`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_REFUSALS))]
    pub refusals: Vec<Refusal>,
}

/// One node's refusal of one field.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Refusal {
    /// The node.
    pub node: String,
    /// The field refused (`kubeletConfiguration.maxPods`), or empty for
    /// the whole resource.
    #[serde(default)]
    pub field: String,
    /// A CamelCase reason (`Conflict`, `Invalid`).
    pub reason: String,
    /// A message for a person.
    #[serde(default)]
    pub message: String,
}

/// The schema of a `LabelSelector` (k8s-openapi types have none without
/// its `schemars` feature, which would derive one for every API type).
fn label_selector(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "description": "A label selector over Node labels, as metav1.LabelSelector.",
        "properties": {
            "matchLabels": {
                "type": "object",
                "maxProperties": 64,
                "additionalProperties": { "type": "string" }
            },
            "matchExpressions": {
                "type": "array",
                "maxItems": 32,
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": { "type": "string" },
                        "operator": { "type": "string", "enum": ["In", "NotIn", "Exists", "DoesNotExist"] },
                        "values": { "type": "array", "maxItems": 64, "items": { "type": "string" } }
                    }
                }
            }
        }
    })
}
