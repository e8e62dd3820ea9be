//! The kubelet's words, in one place: pod phases, pod condition types and
//! reasons, container waiting and terminated reasons, Event reasons, node
//! condition types and reasons, and admission reasons, spelled as the API and
//! the kubelet spell them (core/v1 `PodPhase`, `PodConditionType` and
//! `NodeConditionType`, the kubelet's `events` package, kuberuntime's
//! `ErrImagePull`-style errors, the node status setters and the admit
//! handlers). Code compares and writes these constants rather than string
//! literals.

/// Pod phases (`status.phase`, core/v1 `PodPhase`).
pub mod phase {
    /// Accepted, not every container created yet.
    pub const PENDING: &str = "Pending";
    /// Bound, sandbox up, at least one container running or restarting.
    pub const RUNNING: &str = "Running";
    /// Every container terminated with success and will not restart.
    pub const SUCCEEDED: &str = "Succeeded";
    /// Every container terminated, at least one in failure, none restarting.
    pub const FAILED: &str = "Failed";
    /// The pod's state could not be obtained.
    pub const UNKNOWN: &str = "Unknown";

    /// True for the phases a pod never leaves (`Succeeded`, `Failed`).
    #[must_use]
    pub fn is_terminal(phase: &str) -> bool {
        phase == SUCCEEDED || phase == FAILED
    }
}

/// Pod condition types (`status.conditions[].type`, core/v1 `PodConditionType`).
pub mod condition {
    /// The pod is bound to a node: set by the scheduler, and by the node for
    /// every pod it runs (the kubelet's `generateAPIPodStatus`), so pods bound
    /// without the scheduler have it too.
    pub const POD_SCHEDULED: &str = "PodScheduled";
    /// The sandbox is up with networking (KEP-3085).
    pub const POD_READY_TO_START_CONTAINERS: &str = "PodReadyToStartContainers";
    /// Every init container completed (sidecars: started).
    pub const INITIALIZED: &str = "Initialized";
    /// Every container is ready.
    pub const CONTAINERS_READY: &str = "ContainersReady";
    /// The pod can serve: containers ready and readiness gates true.
    pub const READY: &str = "Ready";
    /// A resize the node has not allocated yet (reasons `Infeasible`,
    /// `Deferred`).
    pub const POD_RESIZE_PENDING: &str = "PodResizePending";
    /// An allocated resize the runtime has not applied yet (reason `Error`
    /// when applying it failed).
    pub const POD_RESIZE_IN_PROGRESS: &str = "PodResizeInProgress";
    /// The pod restarts all its containers in place (a container exited
    /// under a `RestartAllContainers` rule); false otherwise, shown on pods
    /// that have such a rule.
    pub const ALL_CONTAINERS_RESTARTING: &str = "AllContainersRestarting";
    /// Reasons of the conditions above when false, as the kubelet's status manager.
    pub mod reason {
        /// `Initialized` false: init containers have not all completed.
        pub const CONTAINERS_NOT_INITIALIZED: &str = "ContainersNotInitialized";
        /// `ContainersReady`/`Ready` false: some container is not ready.
        pub const CONTAINERS_NOT_READY: &str = "ContainersNotReady";
        /// Every container finished (`Ready` false on a completed pod).
        pub const POD_COMPLETED: &str = "PodCompleted";
        /// `Ready` false: containers ready, some readiness gate is not
        /// (the status manager's `ReadinessGatesNotReady`).
        pub const READINESS_GATES_NOT_READY: &str = "ReadinessGatesNotReady";
        /// `PodResizeInProgress`: applying the resize failed.
        pub const ERROR: &str = "Error";
    }
}

/// Pod-level `status.reason` values the node sets.
pub mod pod {
    /// The pod ran past `spec.activeDeadlineSeconds` (the kubelet's active_deadline.go).
    pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
    /// The eviction manager evicted the pod (eviction's `Reason`); also the
    /// admission reason of a pod refused under node pressure.
    pub const EVICTED: &str = "Evicted";
    /// The node shutdown manager stopped the pod before the node shut down
    /// (the kubelet's `nodeShutdownReason`).
    pub const NODE_SHUTDOWN: &str = "Terminated";
    /// The status message of such a pod (`nodeShutdownMessage`).
    pub const NODE_SHUTDOWN_MESSAGE: &str =
        "Pod was terminated in response to imminent node shutdown.";
    /// The condition type set on a pod the node is about to stop
    /// (`DisruptionTarget`).
    pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
    /// The `DisruptionTarget` reason of a pod the kubelet stops
    /// (`TerminationByKubelet`).
    pub const TERMINATION_BY_KUBELET: &str = "TerminationByKubelet";
}

/// Container `state.waiting.reason` values, as the kubelet reports them
/// (kuberuntime's errors and `images` package errors).
pub mod waiting {
    /// The container is being created (no record yet).
    pub const CONTAINER_CREATING: &str = "ContainerCreating";
    /// Its pod restarts all containers in place, and its record is of the
    /// earlier run (`RestartingAllContainers`).
    pub const RESTARTING_ALL_CONTAINERS: &str = "RestartingAllContainers";
    /// A main container waits for the init containers.
    pub const POD_INITIALIZING: &str = "PodInitializing";
    /// The restart back-off holds a crashed container.
    pub const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";
    /// The image pull back-off holds the container.
    pub const IMAGE_PULL_BACK_OFF: &str = "ImagePullBackOff";
    /// The image pull failed.
    pub const ERR_IMAGE_PULL: &str = "ErrImagePull";
    /// The image is absent and the pull policy is `Never`.
    pub const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
    /// The image reference cannot be parsed.
    pub const INVALID_IMAGE_NAME: &str = "InvalidImageName";
    /// The container's config could not be built (env, mounts, runAsNonRoot, subPath).
    pub const CREATE_CONTAINER_CONFIG_ERROR: &str = "CreateContainerConfigError";
    /// CRI `CreateContainer` failed.
    pub const CREATE_CONTAINER_ERROR: &str = "CreateContainerError";
    /// CRI `StartContainer` failed.
    pub const RUN_CONTAINER_ERROR: &str = "RunContainerError";
    /// The postStart hook failed and the container was killed.
    pub const POST_START_HOOK_ERROR: &str = "PostStartHookError";
}

/// Container `state.terminated.reason` values.
pub mod terminated {
    /// Exited with code 0 (the reason containerd's CRI plugin gives, `completeExitReason`).
    pub const COMPLETED: &str = "Completed";
    /// Exited with a non-zero code (containerd's CRI plugin, `errorExitReason`).
    pub const ERROR: &str = "Error";
    /// Killed by the kernel's OOM killer (containerd's CRI plugin, `oomExitReason`).
    pub const OOM_KILLED: &str = "OOMKilled";
    /// The runtime could not learn how the container exited (containerd's CRI
    /// plugin, `unknownExitReason`); the status reports `Completed` or `Error`
    /// from the exit code instead.
    pub const UNKNOWN: &str = "Unknown";
    /// The container could not be located when the pod was terminated (the
    /// kubelet's `kubecontainer.ContainerReasonStatusUnknown`).
    pub const CONTAINER_STATUS_UNKNOWN: &str = "ContainerStatusUnknown";
}

/// Event reasons, as the kubelet's `pkg/kubelet/events` constants.
pub mod event {
    /// Container created (`CreatedContainer`).
    pub const CREATED: &str = "Created";
    /// Container started (`StartedContainer`).
    pub const STARTED: &str = "Started";
    /// Something failed (`FailedToCreateContainer`, `FailedToStartContainer`, pulls).
    pub const FAILED: &str = "Failed";
    /// Container being stopped (`KillingContainer`).
    pub const KILLING: &str = "Killing";
    /// Back-off of a restart or a pull (`BackOffStartContainer`, `BackOffPullImage`).
    pub const BACK_OFF: &str = "BackOff";
    /// Image pull started (`PullingImage`).
    pub const PULLING: &str = "Pulling";
    /// Image pulled or present (`PulledImage`).
    pub const PULLED: &str = "Pulled";
    /// Image absent under policy `Never` (`ErrImageNeverPullPolicy`).
    pub const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
    /// A credential provider plugin failed for an image; the pull goes on
    /// without its credentials. The agent's own: the kubelet only logs it.
    pub const FAILED_CREDENTIAL_PROVIDER: &str = "FailedCredentialProvider";
    /// Some `imagePullSecrets` could not be read (`FailedToRetrieveImagePullSecret`).
    pub const FAILED_TO_RETRIEVE_IMAGE_PULL_SECRET: &str = "FailedToRetrieveImagePullSecret";
    /// The sandbox is recreated (`SandboxChanged`).
    pub const SANDBOX_CHANGED: &str = "SandboxChanged";
    /// CRI `RunPodSandbox` failed (`FailedCreatePodSandBox`).
    pub const FAILED_CREATE_POD_SANDBOX: &str = "FailedCreatePodSandBox";
    /// The pod's ResourceClaims are not ready for it; no sandbox is made
    /// (`FailedPrepareDynamicResources`, [`crate::dra`]).
    pub const FAILED_PREPARE_DYNAMIC_RESOURCES: &str = "FailedPrepareDynamicResources";
    /// rustlet's own: the pod's labels or annotations are too large to go to
    /// the runtime with its sandbox and were left out
    /// (`translate::MAX_SANDBOX_METADATA_BYTES`; the kubelet has no cap).
    pub const SANDBOX_METADATA_OMITTED: &str = "SandboxMetadataOmitted";
    /// A pod asks for huge pages on a node without a `hugetlb` cgroup
    /// controller, so nothing limits its use of them (the agent's own; the
    /// kubelet skips the limits without a word).
    pub const HUGE_PAGES_NOT_LIMITED: &str = "HugePagesNotLimited";
    /// Node allocatable limits written to the cgroups enforced
    /// (`SuccessfulNodeAllocatableEnforcement`), a Node event.
    pub const NODE_ALLOCATABLE_ENFORCED: &str = "NodeAllocatableEnforced";
    /// A volume could not be set up (`FailedMountVolume`).
    pub const FAILED_MOUNT: &str = "FailedMount";
    /// The postStart hook failed (`FailedPostStartHook`).
    pub const FAILED_POST_START_HOOK: &str = "FailedPostStartHook";
    /// The preStop hook failed (`FailedPreStopHook`).
    pub const FAILED_PRE_STOP_HOOK: &str = "FailedPreStopHook";
    /// A probe failed (`ContainerUnhealthy`).
    pub const UNHEALTHY: &str = "Unhealthy";
    /// A probe succeeded with a warning (`ContainerProbeWarning`).
    pub const PROBE_WARNING: &str = "ProbeWarning";
    /// A pod sync failed (`FailedSync`).
    pub const FAILED_SYNC: &str = "FailedSync";
    /// rustlet's own node event: the eviction manager could not read the
    /// node's statistics (the runtime did not answer, or answered too much)
    /// and takes no decision until it can; the kubelet only logs it.
    pub const EVICTION_STATS_UNAVAILABLE: &str = "EvictionStatsUnavailable";
    /// Node event: an eviction threshold is met, the node reclaims
    /// (`EvictionThresholdMet`).
    pub const EVICTION_THRESHOLD_MET: &str = "EvictionThresholdMet";
    /// Node event: image GC could not free enough (`FreeDiskSpaceFailed`).
    pub const FREE_DISK_SPACE_FAILED: &str = "FreeDiskSpaceFailed";
    /// Node event: image GC failed twice in a row (`ImageGCFailed`).
    pub const IMAGE_GC_FAILED: &str = "ImageGCFailed";
    /// Node event: the image filesystem reports no capacity (`InvalidDiskCapacity`).
    pub const INVALID_DISK_CAPACITY: &str = "InvalidDiskCapacity";
    /// Node event: container GC failed (`ContainerGCFailed`).
    pub const CONTAINER_GC_FAILED: &str = "ContainerGCFailed";
    /// A resize was allocated (`ResizeStarted`).
    pub const RESIZE_STARTED: &str = "ResizeStarted";
    /// An allocated resize is what runs now (`ResizeCompleted`).
    pub const RESIZE_COMPLETED: &str = "ResizeCompleted";
    /// An allocated resize could not be applied (`ResizeError`).
    pub const RESIZE_ERROR: &str = "ResizeError";
    /// A resize waits for room on the node (`ResizeDeferred`).
    pub const RESIZE_DEFERRED: &str = "ResizeDeferred";
    /// A resize can never fit the node (`ResizeInfeasible`).
    pub const RESIZE_INFEASIBLE: &str = "ResizeInfeasible";
}

/// Node condition types (`status.conditions[].type` of a Node, core/v1
/// `NodeConditionType`) and the reasons the kubelet's node status setters
/// (nodestatus/setters.go) give them.
pub mod node {
    /// The node is healthy and ready to accept pods (`NodeReady`).
    pub const READY: &str = "Ready";
    /// The node's memory is low (`NodeMemoryPressure`).
    pub const MEMORY_PRESSURE: &str = "MemoryPressure";
    /// The node's disk space is low (`NodeDiskPressure`).
    pub const DISK_PRESSURE: &str = "DiskPressure";
    /// The node has too few free process IDs (`NodePIDPressure`).
    pub const PID_PRESSURE: &str = "PIDPressure";
    /// Reasons of the node conditions above.
    pub mod reason {
        /// `Ready` true (`ReadyCondition`).
        pub const KUBELET_READY: &str = "KubeletReady";
        /// `Ready` false (`ReadyCondition`).
        pub const KUBELET_NOT_READY: &str = "KubeletNotReady";
        /// `MemoryPressure` false (`MemoryPressureCondition`).
        pub const KUBELET_HAS_SUFFICIENT_MEMORY: &str = "KubeletHasSufficientMemory";
        /// `MemoryPressure` true (`MemoryPressureCondition`).
        pub const KUBELET_HAS_INSUFFICIENT_MEMORY: &str = "KubeletHasInsufficientMemory";
        /// `DiskPressure` false (`DiskPressureCondition`).
        pub const KUBELET_HAS_NO_DISK_PRESSURE: &str = "KubeletHasNoDiskPressure";
        /// `DiskPressure` true (`DiskPressureCondition`).
        pub const KUBELET_HAS_DISK_PRESSURE: &str = "KubeletHasDiskPressure";
        /// `PIDPressure` false (`PIDPressureCondition`).
        pub const KUBELET_HAS_SUFFICIENT_PID: &str = "KubeletHasSufficientPID";
        /// `PIDPressure` true (`PIDPressureCondition`).
        pub const KUBELET_HAS_INSUFFICIENT_PID: &str = "KubeletHasInsufficientPID";
    }
}

/// Pod `status.reason` values of a pod the node does not admit, as the
/// kubelet's admit handlers.
pub mod admission {
    /// The node is shutting down (the node shutdown manager's
    /// `NodeShutdownNotAdmittedReason`).
    pub const NODE_SHUTDOWN: &str = "NodeShutdown";
    /// Its message (`nodeShutdownNotAdmittedMessage`).
    pub const NODE_SHUTDOWN_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
    /// `spec.os.name` is not this node's OS (`predicateAdmitHandler`'s `PodOSNotSupported`).
    pub const POD_OS_NOT_SUPPORTED: &str = "PodOSNotSupported";
    /// A sysctl is not allowed (sysctl allowlist's `ForbiddenReason`, `SysctlForbidden`).
    pub const SYSCTL_FORBIDDEN: &str = "SysctlForbidden";
    /// An AppArmor profile on a node that cannot enforce it (the AppArmor
    /// admit handler's `AppArmorNotAdmittedReason`).
    pub const APPARMOR: &str = "AppArmor";
    /// `supplementalGroupsPolicy: Strict` on a node whose runtime does not
    /// support it (`predicateAdmitHandler`'s `SupplementalGroupsPolicyNotSupported`).
    pub const SUPPLEMENTAL_GROUPS_POLICY_NOT_SUPPORTED: &str =
        "SupplementalGroupsPolicyNotSupported";
    /// Pod-level resources on a node whose `PodLevelResources` gate is off
    /// (the pod features admit handler's `PodLevelResourcesNotAdmittedReason`).
    pub const POD_LEVEL_RESOURCES_NOT_SUPPORTED: &str = "PodLevelResourcesNotSupported";
    /// `spec.nodeSelector` or the required node affinity does not match the
    /// node (the `NodeAffinity` predicate; a selector mismatch too).
    pub const NODE_AFFINITY: &str = "NodeAffinity";
    /// A host port is taken by an admitted pod (the `NodePorts` predicate).
    pub const NODE_PORTS: &str = "NodePorts";
    /// A `NoExecute` taint the pod does not tolerate (the `TaintToleration`
    /// predicate). Resource shortages are `OutOf<resource>`, built from the
    /// resource's name.
    pub const TAINT_TOLERATION: &str = "TaintToleration";
    /// An admit handler failed where it should not (the kubelet's
    /// `UnexpectedAdmissionError`: the device manager could not give a pod
    /// the devices it asks for).
    pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";
}
