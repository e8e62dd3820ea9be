//! The end-to-end tests: one test binary, a module per topic, against the
//! local cluster of `hack/local-up.sh --agent rustlet --metrics-server
//! --registry-mirror --test-images` (the real kube-apiserver, containerd
//! and the agent under test). Every test is `#[ignore]`d so that `cargo
//! test` without a cluster skips them; `hack/test-e2e.sh` runs them with
//! `--ignored`: several topics side by side, each topic's tests a few at a
//! time (so a topic's tests must not disturb each other's or another
//! topic's: each works in a namespace of its own), then the [`serial`]
//! topics alone, one test at a time.
//!
//! The helpers every topic shares are in [`common`].
#![allow(
    clippy::too_many_lines,
    reason = "an end-to-end test is one scenario against the cluster, read top to bottom"
)]

mod common;

mod bootstrap;
mod claims;
mod csi;
mod explain;
mod hooks;
mod hostile_isolation;
mod hostile_leaks;
mod hostile_numbers;
mod hostile_redact;
mod hostile_subpath;
mod hostile_trees;
mod hostile_work;
mod images;
mod lifecycle;
mod local_storage;
mod metrics;
mod node;
mod node_configuration;
mod pod;
mod probes;
mod resize;
mod server;
mod static_pods;
mod stats;
mod storage;
mod volumes;

mod serial;
