//! The CPU manager, as the kubelet's (pkg/kubelet/cm/cpumanager).

pub mod assignment;
pub mod cpuset;
#[cfg(test)]
pub mod fixtures;
pub mod policy;
pub mod state;
pub mod topology;

pub use policy::PolicyName;
