//! The pod worker: one reconcile per pod at a time (a `kube_runtime::Controller`
//! on the pods bound to this node), each one a pass of the kubelet's `SyncPod`:
//! observe the runtime ([`observe`]), compute the actions ([`plan`]), execute
//! them through CRI, and report the status ([`status`]) to the API server.

pub mod admit;
pub mod credentials;
pub mod env;
pub mod hosts;
pub mod lifecycle;
pub mod observe;
pub mod plan;
pub mod pleg;
pub mod state;
pub mod status;
pub mod translate;
pub mod worker;

#[cfg(test)]
pub mod fixtures;
