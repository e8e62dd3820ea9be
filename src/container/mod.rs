//! The runtime's view of a pod, below the pod worker: how what CRI holds for
//! one pod is read ([`observe`], the kubelet's `GetPodStatus`) into plain data
//! ([`crate::pod_core::runtime`], the kubelet's `kubecontainer.PodStatus`).
//! The pod worker, the probe manager and the status computation all read it;
//! it reads CRI, and for an exited container its termination message file or
//! log.

pub mod observe;

pub use observe::observe;
