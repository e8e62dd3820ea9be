//! Graceful node shutdown, as the kubelet's `pkg/kubelet/nodeshutdown`
//! (`GracefulNodeShutdown`, `GracefulNodeShutdownBasedOnPodPriority`):
//! the agent holds a delay inhibitor lock of systemd-logind ([`logind`]),
//! and when logind announces a shutdown (`PrepareForShutdown(true)`) it
//! stops pods in groups by priority, lowest first, each within its
//! group's share of the grace period ([`plan`]), then releases the lock so
//! the shutdown goes on.

pub mod logind;
pub mod manager;
pub mod plan;

#[cfg(test)]
mod standin;
#[cfg(test)]
mod tests;
