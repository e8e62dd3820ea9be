//! The end-to-end tests: one test binary, a module per topic, against the
//! local cluster of `hack/local-up.sh --agent rustlet --metrics-server
//! --registry-mirror` (the real kube-apiserver, containerd and the agent
//! under test). Every test is `#[ignore]`d so that `cargo test` without a
//! cluster skips them; `hack/test.sh` runs them with `--ignored`, each
//! topic's tests together, and the [`serial`] topics one test at a time,
//! after the others.
//!
//! The helpers every topic shares are in [`common`].
#![allow(
    clippy::too_many_lines,
    reason = "an end-to-end test is one scenario against the cluster, read top to bottom"
)]

mod common;

mod bootstrap;
mod csi;
mod hooks;
mod hostile_isolation;
mod hostile_leaks;
mod hostile_numbers;
mod hostile_redact;
mod hostile_subpath;
mod images;
mod lifecycle;
mod local_storage;
mod metrics;
mod node;
mod pod;
mod probes;
mod resize;
mod server;
mod static_pods;
mod stats;
mod storage;
mod volumes;

mod serial;
