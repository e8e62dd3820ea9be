//! Node selectors, as the API's `NodeSelector` is matched against a Node
//! (component-helpers' `MatchNodeSelectorTerms`): for a pod's required node
//! affinity and a PersistentVolume's node affinity. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};

/// Whether `selector` matches the Node named `name` with `labels`: one of
/// its terms matches (none: no match).
#[must_use]
pub fn matches(selector: &NodeSelector, name: &str, labels: &BTreeMap<String, String>) -> bool {
    selector
        .node_selector_terms
        .iter()
        .any(|t| term_matches(t, name, labels))
}

/// Whether one term matches: every label expression and every field
/// expression (`metadata.name`, the only field) holds; an empty term
/// matches nothing.
#[must_use]
pub fn term_matches(
    term: &NodeSelectorTerm,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if exprs.is_empty() && fields.is_empty() {
        return false;
    }
    let fields_of_node = BTreeMap::from([("metadata.name".to_string(), name.to_string())]);
    exprs.iter().all(|r| requirement_matches(r, labels))
        && fields
            .iter()
            .all(|r| requirement_matches(r, &fields_of_node))
}

/// One requirement of a node selector term (`In`, `NotIn`, `Exists`,
/// `DoesNotExist`, `Gt`, `Lt`); an unknown operator matches nothing.
fn requirement_matches(r: &NodeSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let value = labels.get(&r.key);
    let values = r.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), [want]) = (value.and_then(|v| number(v)), values) else {
                return false;
            };
            let Some(want) = number(want) else {
                return false;
            };
            if r.operator == "Gt" {
                have > want
            } else {
                have < want
            }
        }
        _ => false,
    }
}
