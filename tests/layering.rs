//! The crate's layering: a top-level module may use modules of its own layer
//! and of lower layers, never of a higher one. Reads every `src/**/*.rs` and
//! reports each `crate::<module>` reference, and each `super::` path that
//! leaves its top-level module, that points up the table below.
//!
//! Test code is not held to the layers: a file is read up to its
//! `#[cfg(test)]` `mod tests`, and test-only files are skipped. `src/lib.rs`,
//! which declares every module, is exempt. Inline `mod name { ... }` blocks
//! are not tracked, so `super::` inside one resolves as if written at the file's level.

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::path::Path;

/// The layers, lowest first: (what the layer is, its top-level modules).
const LAYERS: &[(&str, &[&str])] = &[
    (
        "foundations, pure or std-only",
        &[
            "reasons",
            "redact",
            "expansion",
            "paths",
            "resource",
            "node_selector",
            "names",
            "metrics",
            "config",
            "fixtures",
            "fake_api",
            "fake_csi",
        ],
    ),
    (
        "clients of the runtime and of the host's service manager, gRPC servers",
        &["cri", "systemd", "proto", "grpc_socket"],
    ),
    ("runtime's view of a pod", &["container"]),
    (
        "node-side services below the pod worker",
        &[
            "events",
            "volume",
            "prober",
            "log_links",
            "log_manager",
            "stats",
            "image_gc",
            "container_gc",
            "static_pod",
            "certificate",
            "cgroups",
            "plugin_manager",
            "device_manager",
        ],
    ),
    (
        "the pod worker and the node object",
        &["pod", "node", "eviction"],
    ),
    ("the node API", &["server", "pod_resources"]),
    // `bin`: the other programs built on the library (the test CSI driver).
    ("wiring", &["agent", "cli", "main", "bin"]),
];

/// Files exempt from the check: the crate root, and files that hold only test code.
const SKIPPED: &[&str] = &[
    "src/lib.rs",
    "src/fixtures.rs",
    "src/fake_api.rs",
    "src/fake_csi.rs",
    "src/server/tests.rs",
    "src/stats/summary/tests.rs",
    "src/stats/cadvisor/tests.rs",
    "src/device_manager/tests.rs",
];

/// The layer of top-level module `module`, if the table has it.
fn layer_of(module: &str) -> Option<usize> {
    LAYERS
        .iter()
        .position(|(_, modules)| modules.contains(&module))
}

/// One reference from a file of top-level module `from` to module `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Reference {
    file: String,
    line: usize,
    from: String,
    to: String,
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let layer = |m: &str| layer_of(m).unwrap_or(0);
        write!(
            f,
            "{}:{}: {} -> {} (layer {} -> layer {})",
            self.file,
            self.line,
            self.from,
            self.to,
            layer(&self.from),
            layer(&self.to)
        )
    }
}

/// The module path of a file under `src/`: `src/pod/plan.rs` is `pod::plan`,
/// `src/pod/mod.rs` is `pod`.
fn module_path(file: &str) -> Vec<String> {
    let rel = file.strip_prefix("src/").unwrap_or(file);
    let rel = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut path: Vec<String> = rel.split('/').map(str::to_string).collect();
    if path.last().is_some_and(|p| p == "mod") {
        path.pop();
    }
    path
}

/// The part of a file the layers hold: everything before a line
/// `#[cfg(test)]` followed by a line declaring `mod tests`.
fn non_test_part(text: &str) -> &str {
    let mut offset = 0;
    let mut lines = text.split_inclusive('\n').peekable();
    while let Some(line) = lines.next() {
        let next = lines.peek().map_or("", |l| l.trim());
        let declares_tests = ["mod tests", "pub mod tests", "pub(crate) mod tests"]
            .iter()
            .any(|d| next.starts_with(d));
        if line.trim() == "#[cfg(test)]" && declares_tests {
            return &text[..offset];
        }
        offset += line.len();
    }
    text
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The identifier at the start of `s`.
fn ident(s: &str) -> &str {
    let end = s.find(|c: char| !is_ident_char(c)).unwrap_or(s.len());
    &s[..end]
}

/// The first path segments named right after a path to the crate root (the
/// text following `crate::`): one identifier, or the first identifier of each
/// item of a `{...}` group.
fn root_items(after: &str) -> Vec<&str> {
    let after = after.trim_start();
    let Some(group) = after.strip_prefix('{') else {
        return vec![ident(after)];
    };
    let mut items = Vec::new();
    let mut depth = 0usize;
    let mut item_start = true;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => item_start = true,
            c if item_start && depth == 0 && is_ident_char(c) => {
                items.push(ident(&group[i..]));
                item_start = false;
            }
            c if c.is_whitespace() => {}
            _ if depth == 0 => item_start = false,
            _ => {}
        }
    }
    items
}

/// Every (byte offset, top-level module) that `text` refers to from the file
/// whose module path is `path`, for the modules in `modules`.
fn references(text: &str, path: &[String], modules: &BTreeSet<String>) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let starts_word = |at: usize| !text[..at].chars().next_back().is_some_and(is_ident_char);
    for (at, _) in text.match_indices("crate::") {
        if starts_word(at) {
            for item in root_items(&text[at + "crate::".len()..]) {
                found.push((at, item.to_string()));
            }
        }
    }
    let mut at = 0;
    while let Some(i) = text[at..].find("super::") {
        let start = at + i;
        let mut rest = &text[start..];
        let mut ups = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            ups += 1;
            rest = r.trim_start();
        }
        at = text.len() - rest.len();
        if !starts_word(start) || ups > path.len() {
            continue;
        }
        if ups == path.len() {
            // `super` reached the crate root: the next segment is a top-level item.
            for item in root_items(rest) {
                found.push((start, item.to_string()));
            }
        }
    }
    found.retain(|(_, m)| modules.contains(m));
    found.sort();
    found.dedup();
    found
}

/// The references of `files` ((path under the crate, text)) from one
/// top-level module to another, in file order.
fn cross_references(files: &[(String, String)]) -> Vec<Reference> {
    let mut modules: BTreeSet<String> = LAYERS
        .iter()
        .flat_map(|(_, ms)| ms.iter().map(|m| (*m).to_string()))
        .collect();
    modules.extend(
        files
            .iter()
            .filter_map(|(f, _)| module_path(f).first().cloned()),
    );
    let mut found = Vec::new();
    for (file, text) in files {
        if SKIPPED.contains(&file.as_str()) {
            continue;
        }
        let path = module_path(file);
        let Some(from) = path.first() else { continue };
        let text = non_test_part(text);
        for (offset, to) in references(text, &path, &modules) {
            if &to != from {
                found.push(Reference {
                    file: file.clone(),
                    line: text[..offset].matches('\n').count() + 1,
                    from: from.clone(),
                    to,
                });
            }
        }
    }
    found
}

/// The references of `files` that point up the layers.
fn check(files: &[(String, String)]) -> Vec<Reference> {
    cross_references(files)
        .into_iter()
        .filter(|r| match (layer_of(&r.from), layer_of(&r.to)) {
            (Some(from), Some(to)) => to > from,
            // A module missing from the table is reported by `every_module_has_a_layer`.
            _ => false,
        })
        .collect()
}

/// Every `.rs` file under `dir`, as (path relative to the crate, text), sorted.
fn read_sources(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            read_sources(root, &p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            let rel = p.strip_prefix(root).expect("under the crate");
            let rel = rel.to_string_lossy().replace('\\', "/");
            let text = fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {rel}: {e}"));
            out.push((rel, text));
        }
    }
}

fn sources() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    read_sources(root, &root.join("src"), &mut files);
    assert!(!files.is_empty(), "no sources under {}", root.display());
    files
}

#[test]
fn no_module_uses_a_higher_layer() {
    let files = sources();
    // The scan sees the crate's real references (the pod worker drives CRI).
    assert!(
        cross_references(&files)
            .iter()
            .any(|r| r.from == "pod" && r.to == "cri"),
        "no pod -> cri reference found: the scan reads nothing"
    );
    let violations = check(&files);
    let list: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert!(
        list.is_empty(),
        "references up the layers:\n{}",
        list.join("\n")
    );
}

#[test]
fn every_module_has_a_layer() {
    let files = sources();
    let found: BTreeSet<String> = files
        .iter()
        .filter(|(f, _)| f != "src/lib.rs")
        .filter_map(|(f, _)| module_path(f).first().cloned())
        .collect();
    let missing: Vec<&String> = found.iter().filter(|m| layer_of(m).is_none()).collect();
    assert!(
        missing.is_empty(),
        "modules missing from the layers: {missing:?}"
    );
    let stale: Vec<&str> = LAYERS
        .iter()
        .flat_map(|(_, ms)| ms.iter().copied())
        .filter(|m| !found.contains(*m))
        .collect();
    assert!(
        stale.is_empty(),
        "layers name modules that do not exist: {stale:?}"
    );
}

fn file(path: &str, text: &str) -> (String, String) {
    (path.to_string(), text.to_string())
}

#[test]
fn upward_reference_is_reported() {
    let files = [file(
        "src/cri/mod.rs",
        "//! The runtime client.\n\nuse crate::agent::run;\nuse crate::reasons::phase;\n",
    )];
    assert_eq!(
        check(&files),
        vec![Reference {
            file: "src/cri/mod.rs".into(),
            line: 3,
            from: "cri".into(),
            to: "agent".into(),
        }]
    );
    assert_eq!(
        check(&files)[0].to_string(),
        "src/cri/mod.rs:3: cri -> agent (layer 1 -> layer 6)"
    );
}

#[test]
fn groups_and_inline_paths_are_reported() {
    let files = [file(
        "src/volume/mod.rs",
        "use crate::{\n    cri::Runtime,\n    pod::{plan, spec},\n};\n\
         fn f() { crate::server::serve(); }\n",
    )];
    let found: Vec<(usize, String)> = check(&files).into_iter().map(|v| (v.line, v.to)).collect();
    assert_eq!(found, vec![(1, "pod".into()), (5, "server".into())]);
}

#[test]
fn super_leaving_the_module_is_resolved() {
    let files = [
        // From a file at the top, `super` is the crate root.
        file("src/events.rs", "use super::pod::worker;\n"),
        // From `stats::summary`, one `super` stays in `stats`, two reach the root.
        file(
            "src/stats/summary.rs",
            "use super::cri_stats;\nuse super::super::node::info;\n",
        ),
        // Within its own module: not a reference to another module.
        file(
            "src/pod/plan.rs",
            "use super::spec;\nuse super::super::cri;\n",
        ),
    ];
    let found: Vec<String> = check(&files).iter().map(ToString::to_string).collect();
    assert_eq!(
        found,
        vec![
            "src/events.rs:1: events -> pod (layer 3 -> layer 4)",
            "src/stats/summary.rs:2: stats -> node (layer 3 -> layer 4)",
        ]
    );
}

#[test]
fn test_code_and_exempt_files_are_not_checked() {
    let files = [
        file(
            "src/cri/log.rs",
            "use crate::paths;\n\n#[cfg(test)]\nmod tests {\n    use crate::agent;\n}\n",
        ),
        file("src/fixtures.rs", "use crate::pod::worker;\n"),
        file("src/lib.rs", "pub use crate::agent::run;\n"),
        file("src/server/tests.rs", "use crate::agent;\n"),
    ];
    assert_eq!(check(&files), vec![]);
}

#[test]
fn same_and_lower_layers_are_allowed() {
    let files = [
        file(
            "src/pod/worker.rs",
            "use crate::node::x;\nuse crate::cri::Runtime;\n",
        ),
        file("src/agent.rs", "use crate::cli::Cli;\nuse crate::server;\n"),
        // Root items are not modules; `mycrate::` is not `crate::`.
        file(
            "src/paths.rs",
            "crate::node_version(); mycrate::agent::x();\n",
        ),
    ];
    assert_eq!(check(&files), vec![]);
}
