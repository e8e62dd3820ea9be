//! The crate's layering: a top-level module may use modules of its own layer
//! and of lower layers, never of a higher one. Reads every `src/**/*.rs` and
//! reports each `crate::<module>` reference, and each `super::` path that
//! leaves its top-level module, that points up the table below (comments,
//! doc links among them, are not references).
//!
//! No import circles either: no file imports a file that imports it back,
//! directly or through others (a `mod.rs` and its own children aside), and
//! no top-level modules import each other in a circle. And the pod worker's
//! pure core (`src/pod_core/`) has no effects: no `tokio`, `tonic`,
//! `kube::Client` or `kube::Api`, no file system, network or processes.
//!
//! Test code is not held to the layers: a file is read up to its
//! `#[cfg(test)]` `mod tests`, and test-only files are skipped. `src/lib.rs`,
//! which declares every module, is exempt. Inline `mod name { ... }` blocks
//! are not tracked, so `super::` inside one resolves as if written at the file's level.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

/// The layers, lowest first: (what the layer is, its top-level modules).
const LAYERS: &[(&str, &[&str])] = &[
    (
        "foundations, pure or std-only",
        &[
            "reasons",
            "labels",
            "redact",
            "registry",
            "expansion",
            "image_policy",
            "paths",
            "yaml",
            "resource",
            "node_selector",
            "names",
            "metrics",
            "startup_trace",
            "feature_gates",
            "cpuset",
            "topology_manager",
            "config",
            "fixtures",
            "fake_api",
            "fake_csi",
            "fake_dra",
        ],
    ),
    (
        "the pod worker's pure core: plain data in, plain data out",
        &["pod_core"],
    ),
    (
        "clients of the runtime and of the host's service manager, gRPC servers",
        &["cri", "systemd", "proto", "grpc_socket", "throttle", "otel"],
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
            "csr_approver",
            "cgroups",
            "plugin_manager",
            "device_manager",
            "cpu_manager",
            "dra",
            "credential_provider",
        ],
    ),
    (
        "the pod worker and the node object",
        &[
            "pod",
            "node",
            "eviction",
            "node_shutdown",
            "memory_manager",
            "node_config",
        ],
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
    "src/fake_dra.rs",
    "src/server/tests.rs",
    "src/stats/summary/tests.rs",
    "src/stats/cadvisor/tests.rs",
    "src/device_manager/tests.rs",
    "src/credential_provider/tests.rs",
    "src/node_shutdown/tests.rs",
    "src/node_shutdown/standin.rs",
    "src/pod/proptests.rs",
];

/// Directories whose files hold only test code (each declared under
/// `#[cfg(test)]`), exempt like [`SKIPPED`].
const SKIPPED_DIRS: &[&str] = &["src/pod/scenarios/"];

/// Whether `file` is exempt from the checks.
fn skipped(file: &str) -> bool {
    SKIPPED.contains(&file) || SKIPPED_DIRS.iter().any(|d| file.starts_with(d))
}

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
        if skipped(file) {
            continue;
        }
        let path = module_path(file);
        let Some(from) = path.first() else { continue };
        // A doc link is not an import: comments are left out.
        let text = without_comments(non_test_part(text));
        for (offset, to) in references(&text, &path, &modules) {
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
    // The run's package root: a build shared between checkouts keeps the
    // path of the first.
    let root = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    let root = root.as_path();
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
        "src/cri/mod.rs:3: cri -> agent (layer 2 -> layer 7)"
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
            "src/events.rs:1: events -> pod (layer 4 -> layer 5)",
            "src/stats/summary.rs:2: stats -> node (layer 4 -> layer 5)",
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

// ------------------------------------------------------------------ circles

/// `text` with the comments of each line blanked (spaces, so that offsets
/// and line numbers stay): a doc link is not an import. A `//` inside a
/// string literal is kept.
fn without_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let mut in_string = false;
        let mut escaped = false;
        let mut cut = None;
        let bytes = line.as_bytes();
        for (i, &b) in bytes.iter().enumerate() {
            match b {
                _ if escaped => escaped = false,
                b'\\' if in_string => escaped = true,
                b'"' => in_string = !in_string,
                b'/' if !in_string && bytes.get(i + 1) == Some(&b'/') => {
                    cut = Some(i);
                    break;
                }
                _ => {}
            }
        }
        match cut {
            Some(i) => {
                out.push_str(&line[..i]);
                out.extend(
                    line[i..]
                        .chars()
                        .map(|c| if c == '\n' { '\n' } else { ' ' }),
                );
            }
            None => out.push_str(line),
        }
    }
    out
}

/// Parses one path of a use tree at the start of `s` (segments, `::`, and a
/// `{…}` group whose items are paths of their own), each full path pushed
/// onto `out` after `prefix`. Returns the bytes read.
fn use_tree(s: &str, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut segments = prefix.to_vec();
    let mut at = 0;
    loop {
        at += s[at..].len() - s[at..].trim_start().len();
        if s[at..].starts_with('{') {
            at += 1;
            loop {
                at += s[at..].len() - s[at..].trim_start_matches([' ', '\n', '\t', ',']).len();
                if at >= s.len() || s[at..].starts_with('}') {
                    return (at + 1).min(s.len());
                }
                let read = use_tree(&s[at..], &segments, out);
                at += read.max(1);
                // Past an item's rest (`as name`, `*`) to its comma or the group's end.
                while at < s.len() && !s[at..].starts_with([',', '}']) {
                    at += s[at..].chars().next().map_or(1, char::len_utf8);
                }
            }
        }
        let name = ident(&s[at..]);
        if name.is_empty() {
            out.push(segments);
            return at;
        }
        segments.push(name.to_string());
        at += name.len();
        let rest = s[at..].trim_start();
        if let Some(after) = rest.strip_prefix("::") {
            at = s.len() - after.len();
        } else {
            out.push(segments);
            return at;
        }
    }
}

/// Every path to an item of the crate that `text` (code of the module at
/// `path`) names, as absolute segments, with its byte offset: `crate::a::b`,
/// and `super::…` resolved from `path` (the path of a `mod.rs` is its
/// directory's module, so its `super` is the parent).
fn item_paths(text: &str, path: &[String]) -> Vec<(usize, Vec<String>)> {
    let mut found = Vec::new();
    let starts_word = |at: usize| !text[..at].chars().next_back().is_some_and(is_ident_char);
    for keyword in ["crate::", "super::"] {
        for (at, _) in text.match_indices(keyword) {
            if !starts_word(at) || (keyword == "super::" && text[..at].ends_with("::")) {
                continue;
            }
            let mut rest = &text[at + keyword.len()..];
            let base: Vec<String> = if keyword == "crate::" {
                Vec::new()
            } else {
                let mut ups = 1;
                while let Some(r) = rest.trim_start().strip_prefix("super::") {
                    ups += 1;
                    rest = r;
                }
                let Some(keep) = path.len().checked_sub(ups) else {
                    continue;
                };
                path[..keep].to_vec()
            };
            let mut paths = Vec::new();
            use_tree(rest, &base, &mut paths);
            found.extend(paths.into_iter().map(|p| (at, p)));
        }
    }
    found.sort();
    found
}

/// One import from a file module to another (`pod::plan` -> `pod::status`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Import {
    file: String,
    line: usize,
    from: String,
    to: String,
}

/// The imports between the file modules of `files`: each path resolved to
/// the longest of its prefixes that is a file. Test code and exempt files
/// are left out, and so are a module's imports of itself and those between
/// a `mod.rs` and its own children.
fn imports(files: &[(String, String)]) -> Vec<Import> {
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(f, _)| module_path(f)).collect();
    let mut found = Vec::new();
    for (file, text) in files {
        if skipped(file) {
            continue;
        }
        let from = module_path(file);
        let code = without_comments(non_test_part(text));
        for (offset, path) in item_paths(&code, &from) {
            let Some(to) = (1..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|p| modules.contains(p))
            else {
                continue;
            };
            let own_child = |parent: &Vec<String>, child: &Vec<String>, parent_is_dir: bool| {
                parent_is_dir && child.len() == parent.len() + 1 && child.starts_with(parent)
            };
            let is_dir = |m: &Vec<String>| {
                files
                    .iter()
                    .any(|(f, _)| f.ends_with("/mod.rs") && &module_path(f) == m)
            };
            if to == from
                || own_child(&from, &to, is_dir(&from))
                || own_child(&to, &from, is_dir(&to))
            {
                continue;
            }
            found.push(Import {
                file: file.clone(),
                line: code[..offset].matches('\n').count() + 1,
                from: from.join("::"),
                to: to.join("::"),
            });
        }
    }
    found.dedup();
    found
}

/// The circles of a directed graph: its strongly connected components of
/// more than one node (Tarjan's algorithm), each sorted, in sorted order.
fn circles(edges: &[(String, String)]) -> Vec<Vec<String>> {
    struct Walk<'a> {
        next: BTreeMap<&'a str, Vec<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.next.get(v).cloned().unwrap_or_default() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        next: BTreeMap::new(),
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for (from, to) in edges {
        walk.next.entry(from).or_default().push(to);
        walk.next.entry(to).or_default();
    }
    let nodes: Vec<&str> = walk.next.keys().copied().collect();
    for v in nodes {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found.sort();
    walk.found
}

/// Each circle of `imports` (by `key`, which maps a file module to the node
/// it counts as), with the imports that close it, as lines of a report.
fn circle_report(imports: &[Import], key: impl Fn(&str) -> String) -> Vec<String> {
    let edges: Vec<(String, String)> = imports
        .iter()
        .map(|i| (key(&i.from), key(&i.to)))
        .filter(|(a, b)| a != b)
        .collect();
    circles(&edges)
        .into_iter()
        .map(|circle| {
            let mut lines = vec![format!("circle: {}", circle.join(", "))];
            for i in imports {
                let (from, to) = (key(&i.from), key(&i.to));
                if from != to && circle.contains(&from) && circle.contains(&to) {
                    lines.push(format!("    {}:{}: {} -> {}", i.file, i.line, i.from, i.to));
                }
            }
            lines.join("\n")
        })
        .collect()
}

/// The top-level module of a file module (`pod::plan` -> `pod`).
fn top(module: &str) -> String {
    module.split("::").next().unwrap_or(module).to_string()
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let files = sources();
    let found = imports(&files);
    assert!(
        found
            .iter()
            .any(|i| i.from == "pod::worker" && i.to == "pod_core::plan"),
        "no pod::worker -> pod_core::plan import found: the scan reads nothing"
    );
    let report = circle_report(&found, str::to_string);
    assert!(
        report.is_empty(),
        "import circles between files:\n{}",
        report.join("\n")
    );
}

#[test]
fn no_top_level_modules_form_a_circle() {
    let files = sources();
    let report = circle_report(&imports(&files), top);
    assert!(
        report.is_empty(),
        "import circles between top-level modules:\n{}",
        report.join("\n")
    );
}

#[test]
fn a_circle_is_reported_with_the_imports_that_close_it() {
    let files = [
        file(
            "src/pod/plan.rs",
            "use super::status::qos;\nuse crate::reasons;\n",
        ),
        file(
            "src/pod/status.rs",
            "//! Uses [`super::spec`].\n\nuse crate::pod::{plan::Plan, spec};\n",
        ),
        file("src/pod/spec.rs", "use crate::reasons::phase;\n"),
        file(
            "src/pod/mod.rs",
            "pub mod plan;\npub mod spec;\npub mod status;\n",
        ),
        file("src/reasons.rs", "use crate::pod::spec;\n"),
    ];
    let found = imports(&files);
    assert_eq!(
        circle_report(&found, str::to_string),
        vec![
            "circle: pod::plan, pod::status\n    src/pod/plan.rs:1: pod::plan -> pod::status\n    \
             src/pod/status.rs:3: pod::status -> pod::plan"
                .to_string(),
            "circle: pod::spec, reasons\n    src/pod/spec.rs:1: pod::spec -> reasons\n    \
             src/reasons.rs:1: reasons -> pod::spec"
                .to_string(),
        ]
    );
    // By top-level module, pod and reasons form one circle.
    let by_top = circle_report(&found, top);
    assert_eq!(by_top.len(), 1);
    assert!(
        by_top[0].starts_with("circle: pod, reasons\n"),
        "{}",
        by_top[0]
    );
}

#[test]
fn doc_links_a_modules_own_children_and_test_code_are_no_circle() {
    let files = [
        // A doc link back is not an import.
        file(
            "src/cri/extension.rs",
            "use crate::proto::cri_extension::M;\n",
        ),
        file(
            "src/proto.rs",
            "/// See [`crate::cri::extension`].\npub mod cri_extension {}\n",
        ),
        file(
            "src/cri/mod.rs",
            "pub mod extension;\npub use extension::M;\n",
        ),
        // A mod.rs and its own children use each other freely.
        file(
            "src/stats/mod.rs",
            "pub mod summary;\nfn f() { summary::g(); }\n",
        ),
        file(
            "src/stats/summary.rs",
            "use super::Stats;\nuse crate::stats::Provider;\n",
        ),
        // Test code is not held to it.
        file(
            "src/pod/plan.rs",
            "use super::spec;\n\n#[cfg(test)]\nmod tests {\n    use crate::pod::spec;\n}\n",
        ),
        // A `//` in a string is no comment: the import after it counts.
        file(
            "src/pod/spec.rs",
            "const S: &str = \"a // b\"; fn f() { crate::cri::extension::g(); }\n",
        ),
    ];
    let found = imports(&files);
    assert!(
        circle_report(&found, str::to_string).is_empty(),
        "{found:?}"
    );
    assert!(circle_report(&found, top).is_empty(), "{found:?}");
    assert_eq!(
        found
            .iter()
            .map(|i| format!("{} -> {}", i.from, i.to))
            .collect::<Vec<_>>(),
        vec![
            "cri::extension -> proto",
            "pod::plan -> pod::spec",
            "pod::spec -> cri::extension"
        ]
    );
}

// ------------------------------------------------------------------ the pure core

/// The pod worker's pure core: its files do nothing but compute.
const PURE_CORE: &str = "src/pod_core/";

/// What the pure core may not use: the async runtime, clients of the API
/// server and of gRPC, HTTP, the file system, processes, the environment,
/// threads, sockets, system calls and the clock (time comes in as a
/// parameter).
const EFFECTS: &[&str] = &[
    "tokio",
    "tonic",
    "kube::Client",
    "kube::Api",
    "kube::runtime",
    "hyper",
    "reqwest",
    "std::fs",
    "fs::",
    "std::process",
    "std::env",
    "std::thread",
    "TcpStream",
    "TcpListener",
    "UdpSocket",
    "UnixStream",
    "rustix",
    "Timestamp::now",
    "Instant::now",
    "SystemTime::now",
];

/// Each (file, line, effect) of `files` under [`PURE_CORE`]: an [`EFFECTS`]
/// entry that starts a path (not the tail of a longer name or path), in code
/// that is not a test or a comment.
fn effects_in_pure_core(files: &[(String, String)]) -> Vec<(String, usize, &'static str)> {
    let mut found = Vec::new();
    for (file, text) in files.iter().filter(|(f, _)| f.starts_with(PURE_CORE)) {
        let code = without_comments(non_test_part(text));
        for effect in EFFECTS {
            for (at, _) in code.match_indices(effect) {
                let before = code[..at].chars().next_back();
                let after = code[at + effect.len()..].chars().next();
                let starts = !before.is_some_and(|c| is_ident_char(c) || c == ':');
                let ends = effect.ends_with(':') || !after.is_some_and(is_ident_char);
                if starts && ends {
                    found.push((file.clone(), code[..at].matches('\n').count() + 1, *effect));
                }
            }
        }
    }
    found.sort();
    found
}

#[test]
fn the_pure_core_has_no_effects() {
    let files = sources();
    assert!(
        files.iter().any(|(f, _)| f == "src/pod_core/plan.rs"),
        "no src/pod_core/plan.rs: the pure core moved; update PURE_CORE"
    );
    let found: Vec<String> = effects_in_pure_core(&files)
        .iter()
        .map(|(f, l, e)| format!("{f}:{l}: {e}"))
        .collect();
    assert!(
        found.is_empty(),
        "effects in the pure core:\n{}",
        found.join("\n")
    );
}

#[test]
fn an_effect_in_the_pure_core_is_reported() {
    let files = [
        file(
            "src/pod_core/plan.rs",
            "use std::collections::BTreeMap;\nuse tokio::sync::watch;\n\
             fn f() { let _ = std::fs::read(\"x\"); let t = Timestamp::now(); }\n\
             // tokio in a comment is no effect\nfn g(c: kube::Client) {}\n\
             fn h() { my_tokio::x(); a::tokio::y(); transfs::z(); }\n\
             \n#[cfg(test)]\nmod tests {\n    use std::fs;\n}\n",
        ),
        // Outside the pure core, effects are the point.
        file("src/pod/worker.rs", "use tokio::sync::watch;\n"),
    ];
    assert_eq!(
        effects_in_pure_core(&files),
        vec![
            ("src/pod_core/plan.rs".to_string(), 2, "tokio"),
            ("src/pod_core/plan.rs".to_string(), 3, "Timestamp::now"),
            ("src/pod_core/plan.rs".to_string(), 3, "std::fs"),
            ("src/pod_core/plan.rs".to_string(), 5, "kube::Client"),
        ]
    );
}
