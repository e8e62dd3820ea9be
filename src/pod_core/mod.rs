//! The pod worker's pure core: what the kubelet decides about a pod, as plain
//! data in and plain data out. Nothing here talks to the API server, the
//! runtime or the host (no `tokio`, `kube::Client`, `tonic` or `std::fs`:
//! `tests/layering.rs` fails on them), and time comes in as a parameter, so
//! every decision is a table test. The managers of [`crate::pod`] observe,
//! call these functions, and carry out what they return.
//!
//! | module | job | the kubelet's part |
//! |---|---|---|
//! | [`plan`] | what to do next for a pod: sandbox, containers to start and kill, back-off | `computePodActions` |
//! | [`backoff`] | the CrashLoopBackOff curve | `newCrashLoopBackOff`, `flowcontrol.Backoff` |
//! | [`status`] | the pod's status from its spec and runtime state | `generateAPIPodStatus`, `getPhase` |
//! | [`translate`] | a pod spec as CRI sandbox and container configs | `kuberuntime_sandbox.go`, `kuberuntime_container.go` |
//! | [`facts`] | what the translators know of the node and of one pod | `kubeGenericRuntimeManager`'s fields |
//! | [`env`] | the container environment, `$(VAR)` expansion | `makeEnvironmentVariables` |
//! | [`hosts`] | the hostname and the managed `/etc/hosts` content | `GeneratePodHostNameAndDomain`, `managedHostsFileContent` |
//! | [`admit`] | admission of a pod to the node | `canAdmitPod`, the admit handlers |
//! | [`fit`] | resources, node selectors and affinity against the node | `GeneralPredicates` |
//! | [`allocation`] | allocated resources and resize requests | `pkg/kubelet/allocation` |
//! | [`explain`] | what holds a pod back, from one sync's runtime state, plan and waits | (none: the agent's own) |
//! | [`kind`] | static, mirror, terminal, critical and QoS, read once per sync | `IsStaticPod`, `IsMirrorPod`, `IsCriticalPod` |
//! | [`qos`] | the pod's QoS class | `v1qos.GetPodQOS` |
//! | [`probes`] | what the probes say of a container | `prober/results` |
//! | [`limits`] | cgroup cpu and memory limits | `cm.ResourceConfig` |
//! | [`spec`] | reading a pod's spec and status | helpers of `pkg/kubelet/container`, `podutil` |

pub mod admit;
pub mod allocation;
pub mod backoff;
pub mod env;
pub mod explain;
pub mod facts;
pub mod fit;
pub mod hosts;
pub mod kind;
pub mod limits;
pub mod plan;
pub mod probes;
pub mod qos;
pub mod runtime;
pub mod spec;
pub mod status;
pub mod translate;
