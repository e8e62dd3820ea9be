//! The Node object and its heartbeats: registration (the kubelet's
//! `registerWithAPIServer`), node status (`syncNodeStatus`: capacity,
//! allocatable, addresses, nodeInfo, conditions), and the node Lease in
//! `kube-node-lease` (the kubelet's node lease controller), and the reset of
//! a node the agent leaves for good.

pub mod bootstrap;
pub mod client_cert;
pub mod configuration;
pub mod configuration_status;
pub mod info;
pub mod lease;
pub mod registration;
pub mod reset;
pub mod status;

pub use info::MachineInfo;
