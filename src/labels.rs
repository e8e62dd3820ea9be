//! The labels and annotations the agent puts on CRI sandboxes and containers
//! and reads back, and the pod annotations it reads, as the kubelet's
//! kuberuntime `labels.go`: the runtime keeps what the agent must know again
//! after a restart (the pod a container belongs to, its spec's hash, its
//! restart count, its termination message settings).

/// Label the kubelet puts on every sandbox and container: the pod's UID.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
/// Label with the pod's name.
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
/// Label with the pod's namespace.
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
/// Label with the container's name (containers only).
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";
/// Annotation with the hash of the container spec the container was made from.
pub const CONTAINER_HASH_ANNOTATION: &str = "io.kubernetes.container.hash";
/// Annotation with the memory request in bytes the container was made with
/// (rustlet's own; set when the container asks for memory). An in-place
/// resize leaves it: it is what a memory request change under
/// `resizePolicy: RestartContainer` is compared with, as the kubelet
/// compares its actuated resources.
pub const MEMORY_REQUEST_ANNOTATION: &str = "rustlet.io/memory-request";
/// Annotation with the attempt (restart count) the container's
/// CrashLoopBackOff counts from (rustlet's own): the attempt of the first
/// container of its definition, since the kubelet keeps a back-off per
/// container definition (`GetStableKey` hashes the spec), so a changed image
/// starts the back-off anew. Absent (older containers): 0.
pub const BACKOFF_SINCE_ANNOTATION: &str = "rustlet.io/backoff-since";
/// Annotation with the container's restart count.
pub const RESTART_COUNT_ANNOTATION: &str = "io.kubernetes.container.restartCount";
/// Annotation with the container's termination message path.
pub const TERMINATION_MESSAGE_PATH_ANNOTATION: &str =
    "io.kubernetes.container.terminationMessagePath";
/// Annotation with the container's termination message policy.
pub const TERMINATION_MESSAGE_POLICY_ANNOTATION: &str =
    "io.kubernetes.container.terminationMessagePolicy";
/// Annotation with the pod's termination grace period (seconds).
pub const TERMINATION_GRACE_PERIOD_ANNOTATION: &str = "io.kubernetes.pod.terminationGracePeriod";

/// Annotation prefix of the deprecated per-container AppArmor profile
/// (`container.apparmor.security.beta.kubernetes.io/<container>`).
pub const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// Pod annotations of static and mirror pods, as the kubelet's
/// `pkg/kubelet/types`.
/// `kubernetes.io/config.hash`: the static pod's UID.
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// `kubernetes.io/config.source`: where the pod came from (`file`).
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// `kubernetes.io/config.mirror`: on a mirror pod, the static pod's hash.
pub const CONFIG_MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
