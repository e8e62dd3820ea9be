//! The runtime's view of a pod, below the pod worker: what CRI holds for one
//! pod as plain data ([`state`], the kubelet's `kubecontainer.PodStatus`) and
//! how it is read ([`observe`], the kubelet's `GetPodStatus`). The pod worker,
//! the probe manager and the status computation all read it; it reads CRI, and
//! for an exited container its termination message file or log.

pub mod observe;
pub mod state;

pub use observe::observe;
pub use state::{Container, ContainerState, PodRuntime, Sandbox};
