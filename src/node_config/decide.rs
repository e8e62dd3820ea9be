//! Which `NodeConfiguration`s a node applies, and the settings they make:
//! the resources whose selector matches the Node's labels are laid over
//! the node's file configuration (the file is the base), each checked as
//! the kubelet checks its file. Pure.
//!
//! - A resource whose selector does not parse, or whose fields the
//!   kubelet's checks refuse over the file, is refused (`Invalid`).
//! - Two resources that set one field are both refused (`Conflict`).
//! - The fields of a refused resource keep the values the node applied
//!   last: a node keeps its last good configuration.
//! - The others apply, in name order (they set different fields, so the
//!   order changes nothing).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};

use super::resource::{LiveKubeletConfiguration, NodeConfiguration};
use crate::config::Settings;

/// The reason of a resource refused for a value the kubelet refuses.
pub const INVALID: &str = "Invalid";
/// The reason of a resource refused because another sets one of its fields.
pub const CONFLICT: &str = "Conflict";
/// The source `/configz/sources` names for a field whose value was kept from
/// the configuration applied last (its resources were refused).
pub const KEPT_SOURCE: &str = "NodeConfiguration (kept from the last configuration applied)";
/// The most characters of a refusal's message.
pub const MAX_MESSAGE: usize = 512;

/// What the node did with one resource that selects it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// The resource's name.
    pub name: String,
    /// The generation decided on.
    pub generation: i64,
    /// `None` applied; `Some((reason, message))` refused.
    pub refused: Option<(&'static str, String)>,
}

/// The outcome of [`decide`].
#[derive(Clone, Debug)]
pub struct Decision {
    /// The settings to run with: the file's with every applied field.
    pub settings: Settings,
    /// The live fields in effect (the file's aside), as applied.
    pub live: LiveKubeletConfiguration,
    /// One verdict per selecting resource, by name.
    pub verdicts: Vec<Verdict>,
}

/// The live fields `live` sets, by their KubeletConfiguration names, with
/// their values.
fn fields(live: &LiveKubeletConfiguration) -> BTreeMap<String, serde_json::Value> {
    match serde_json::to_value(live) {
        Ok(serde_json::Value::Object(m)) => m.into_iter().collect(),
        _ => BTreeMap::new(),
    }
}

/// `base` with the fields of `values` applied, as the kubelet checks its
/// configuration file; the eviction thresholds are parsed as at start.
///
/// # Errors
/// The kubelet's message for the first field it refuses.
fn over(
    base: &Settings,
    name: &str,
    values: &BTreeMap<String, serde_json::Value>,
) -> Result<Settings, String> {
    let mut s = base.clone();
    let text = serde_json::Value::Object(values.clone().into_iter().collect()).to_string();
    let origin = format!("NodeConfiguration {name}");
    crate::config::apply_file_text(&mut s, Path::new(&origin), &text).map_err(|e| e.to_string())?;
    crate::eviction::thresholds(
        &s.reservations.eviction_hard,
        &s.eviction.soft,
        &s.eviction.soft_grace,
        &s.eviction.minimum_reclaim,
    )
    .map_err(|e| format!("{origin}: invalid eviction configuration: {e}"))?;
    Ok(s)
}

/// `message` cut to at most `max` bytes (on a character boundary), with an
/// ellipsis when cut.
#[must_use]
pub fn truncate_to(mut message: String, max: usize) -> String {
    if message.len() > max {
        let mut end = max;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}

fn truncate(message: String) -> String {
    truncate_to(message, MAX_MESSAGE)
}

/// Decides which of `resources` the node with `labels` applies over its
/// file configuration `base`; `previous` is what it applied last (a field
/// in conflict keeps its value from there).
#[must_use]
pub fn decide(
    base: &Settings,
    resources: &[NodeConfiguration],
    labels: &BTreeMap<String, String>,
    previous: &LiveKubeletConfiguration,
) -> Decision {
    let mut selecting: Vec<&NodeConfiguration> = Vec::new();
    let mut verdicts: Vec<Verdict> = Vec::new();
    for r in resources {
        let verdict = |refused| Verdict {
            name: r.name_any(),
            generation: r.metadata.generation.unwrap_or(0),
            refused,
        };
        match Selector::try_from(r.spec.node_selector.clone()) {
            Ok(sel) if sel.matches(labels) => selecting.push(r),
            Ok(_) => {}
            Err(e) => verdicts.push(verdict(Some((
                INVALID,
                truncate(format!("nodeSelector: {e}")),
            )))),
        }
    }
    selecting.sort_by_key(|r| r.name_any());
    // Who sets each field.
    let mut setters: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &selecting {
        for f in fields(&r.spec.kubelet_configuration).into_keys() {
            setters.entry(f).or_default().push(r.name_any());
        }
    }
    let contested: BTreeSet<&String> = setters
        .iter()
        .filter(|(_, who)| who.len() > 1)
        .map(|(f, _)| f)
        .collect();
    let last = fields(previous);
    let mut merged: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    // Who each applied field is from (a field merged without one was kept
    // from the last configuration applied).
    let mut owners: BTreeMap<String, String> = BTreeMap::new();
    // A refused resource's fields keep the values applied last.
    let keep = |merged: &mut BTreeMap<String, serde_json::Value>,
                mine: &BTreeMap<String, serde_json::Value>| {
        for f in mine.keys() {
            if let Some(v) = last.get(f) {
                merged.insert(f.clone(), v.clone());
            }
        }
    };
    for r in &selecting {
        let mine = fields(&r.spec.kubelet_configuration);
        let name = r.name_any();
        let verdict = |refused| Verdict {
            name: name.clone(),
            generation: r.metadata.generation.unwrap_or(0),
            refused,
        };
        let clashes: Vec<String> = mine
            .keys()
            .filter(|f| contested.contains(f))
            .map(|f| {
                let others: Vec<&str> = setters[f]
                    .iter()
                    .filter(|n| **n != name)
                    .map(String::as_str)
                    .collect();
                format!("{f} is also set by {}", others.join(", "))
            })
            .collect();
        if !clashes.is_empty() {
            keep(&mut merged, &mine);
            verdicts.push(verdict(Some((CONFLICT, truncate(clashes.join("; "))))));
            continue;
        }
        if let Err(e) = over(base, &name, &mine) {
            keep(&mut merged, &mine);
            verdicts.push(verdict(Some((INVALID, truncate(e)))));
            continue;
        }
        for f in mine.keys() {
            owners.insert(f.clone(), format!("NodeConfiguration {name}"));
        }
        merged.extend(mine);
        verdicts.push(verdict(None));
    }
    // Fields checked alone may still clash together (a low threshold from
    // one resource above a high one from another): then none applies.
    let mut settings = match over(base, "(merged)", &merged) {
        Ok(s) => s,
        Err(e) => {
            for v in verdicts.iter_mut().filter(|v| v.refused.is_none()) {
                v.refused = Some((INVALID, truncate(format!("together with the others: {e}"))));
            }
            merged = fields(previous);
            owners.clear();
            over(base, "(previous)", &merged).unwrap_or_else(|_| base.clone())
        }
    };
    // Where each field now comes from, for /configz/sources.
    for f in merged.keys() {
        let source = owners.get(f).map_or(KEPT_SOURCE, String::as_str);
        settings.sources.insert(f.clone(), source.to_string());
    }
    verdicts.sort_by(|a, b| a.name.cmp(&b.name));
    let live = serde_json::from_value(serde_json::Value::Object(merged.into_iter().collect()))
        .unwrap_or_default();
    Decision {
        settings,
        live,
        verdicts,
    }
}
