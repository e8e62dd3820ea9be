//! The pod worker and the managers it drives, cut as the kubelet's own
//! packages: one reconcile per pod at a time (a `kube_runtime::Controller` on
//! the pods bound to this node), each a pass of the kubelet's `SyncPod` —
//! observe the runtime ([`crate::container`]), compute the actions
//! ([`crate::pod_core::plan`]), carry them out ([`runtime_manager`],
//! [`image_manager`]), and report the status ([`crate::pod_core::status`],
//! written only by [`status_manager`]). What is decided is pure and lives in
//! [`crate::pod_core`]; everything here talks to the API server, the runtime
//! or the disk.
//!
//! | module | job | the kubelet's part |
//! |---|---|---|
//! | [`worker`] | the reconcile loop: observe → admit → volumes → plan → execute → report | `pod_workers.go`, `SyncPod` |
//! | [`context`] | what every pod sync shares: the managers and node facts | the `Kubelet` struct |
//! | [`admission`] | a pod admitted or rejected at the start of its sync | `canAdmitPod`, `rejectPod` |
//! | [`allocate`] | a pod's allocation and in-place resizes at each sync | `handlePodResourcesResize` |
//! | [`static_pods`] | a static pod's status seeded from its mirror, the mirror kept current | status manager, `tryReconcileMirrorPods` |
//! | [`teardown`] | a finished pod's final status, volumes, directory and delete | `SyncTerminatedPod` |
//! | [`admission_manager`] | admission in creation order, verdicts remembered | `HandlePodAdditions` |
//! | [`allocation`] | the node's allocated resources, kept on disk across restarts | `pkg/kubelet/allocation` state |
//! | [`runtime_manager`] | carries out a plan's steps through CRI | kuberuntime manager `SyncPod`, `startContainer`, `killContainer` |
//! | [`image_manager`] | pull policy, credentials, back-off, pull concurrency | `pkg/kubelet/images` |
//! | [`status_manager`] | the only writer of `pods/status`, the final delete | `pkg/kubelet/status` |
//! | [`housekeeping`] | runtime objects of pods no longer bound here | `HandlePodCleanups` |
//! | [`hosts`] | writes the pod's `/etc/hosts` | `makeHostsMount` |
//! | [`eviction_pods`] | what the eviction manager is given of the pods: active pods, kill, cleaned up, container reclaim | `GetActivePods`, `killPodNow`, `PodIsFinished`, `containerGC` |
//! | [`env_sources`] | ConfigMaps, Secrets and Services environments read | `makeEnvironmentVariables`' listers |
//! | [`credentials`] | `imagePullSecrets` as a keyring | `credentialprovider` |
//! | [`lifecycle`] | postStart and preStop hooks | `pkg/kubelet/lifecycle` |
//! | [`pleg`] | runtime events as pod syncs | `pkg/kubelet/pleg` |
//! | [`sources`] | the API server's pods and the static pods merged into one set | `pkg/kubelet/config` |
//! | [`mirror_client`] | the mirror pods of static pods in the API | `pkg/kubelet/pod/mirror_client.go`, `tryReconcileMirrorPods` |
//! | [`userns`] | the host ID range of each pod with its own user namespace | `pkg/kubelet/userns` |

pub mod admission;
pub mod admission_manager;
pub mod allocate;
pub mod allocation;
pub mod context;
pub mod cpu_reconciler;
pub mod credentials;
pub mod env_sources;
pub mod eviction_pods;
pub mod explain;
pub mod hosts;
pub mod housekeeping;
pub mod image_manager;
pub mod lifecycle;
pub mod mirror_client;
pub mod pleg;
pub mod runtime_manager;
pub mod sources;
pub mod static_pods;
pub mod status_manager;
pub mod teardown;
pub mod topology_admission;
pub mod userns;
pub mod volume_events;
pub mod worker;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod scenarios;
