//! What the runtime holds for one pod: its sandboxes and containers, as plain
//! data read from CRI (the kubelet's `kubecontainer.PodStatus`). Built by
//! [`crate::container::observe`], consumed by [`super::plan`] and [`super::status`].

use k8s_openapi::jiff::Timestamp;

/// A sandbox of the pod, as CRI reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sandbox {
    /// CRI sandbox ID.
    pub id: String,
    /// Sandbox attempt (0 for the first, +1 each time it is recreated).
    pub attempt: u32,
    /// True while the sandbox is SANDBOX_READY.
    pub ready: bool,
    /// Creation time.
    pub created_at: Timestamp,
    /// Pod IPs from the sandbox's network status, primary first.
    pub ips: Vec<String>,
}

/// CRI container state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContainerState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited.
    Exited,
    /// The runtime does not know.
    #[default]
    Unknown,
}

/// A container of the pod, as CRI reports it (`ContainerStatus`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Container {
    /// CRI container ID.
    pub id: String,
    /// Container name (the spec's name).
    pub name: String,
    /// Attempt: the restart count this container was created with.
    pub attempt: u32,
    /// The sandbox it runs in.
    pub sandbox_id: String,
    /// State.
    pub state: ContainerState,
    /// Creation time.
    pub created_at: Timestamp,
    /// Start time, if started.
    pub started_at: Option<Timestamp>,
    /// Finish time, if exited.
    pub finished_at: Option<Timestamp>,
    /// Exit code, if exited.
    pub exit_code: i32,
    /// Runtime's reason (e.g. `OOMKilled`, `Completed`, `Error`).
    pub reason: String,
    /// Runtime's message (termination message when set).
    pub message: String,
    /// Image as the spec named it.
    pub image: String,
    /// Image reference the runtime resolved (digest), for `imageID`.
    pub image_ref: String,
    /// Hash of the container spec it was created from.
    pub hash: String,
    /// The cgroup limits the runtime reports it runs with (CRI
    /// `ContainerStatus.resources.linux`); None when it reports none.
    pub resources: Option<CgroupLimits>,
    /// The attempt its CrashLoopBackOff counts from
    /// ([`crate::labels::BACKOFF_SINCE_ANNOTATION`]; 0 when absent).
    pub backoff_since: u32,
    /// The memory request in bytes it was made with
    /// ([`crate::labels::MEMORY_REQUEST_ANNOTATION`]); None when it asked for
    /// none, or was made without the annotation.
    pub memory_request: Option<i64>,
}

/// The cgroup limits of a container that resize changes, as CRI's
/// `LinuxContainerResources` holds them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    /// `cpu.shares`.
    pub cpu_shares: i64,
    /// CFS quota, microseconds per period (0 or less: none).
    pub cpu_quota: i64,
    /// CFS period, microseconds.
    pub cpu_period: i64,
    /// Memory limit, bytes (0 or less: none).
    pub memory_limit_in_bytes: i64,
}

impl CgroupLimits {
    /// True when `actual` (as a runtime reports it) enforces these limits:
    /// an unset quota or memory limit matches any unset one (0, -1), and the
    /// period counts only with a quota.
    #[must_use]
    pub fn enforced_by(&self, actual: &Self) -> bool {
        let quota = |q: i64| (q > 0).then_some(q);
        let memory = |m: i64| (m > 0 && m < i64::MAX / 2).then_some(m);
        self.cpu_shares == actual.cpu_shares
            && quota(self.cpu_quota) == quota(actual.cpu_quota)
            && (quota(self.cpu_quota).is_none() || self.cpu_period == actual.cpu_period)
            && memory(self.memory_limit_in_bytes) == memory(actual.memory_limit_in_bytes)
    }
}

/// Everything the runtime holds for one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRuntime {
    /// Sandboxes, newest first.
    pub sandboxes: Vec<Sandbox>,
    /// Containers of every sandbox, newest first.
    pub containers: Vec<Container>,
}

impl PodRuntime {
    /// The newest sandbox, if any.
    #[must_use]
    pub fn latest_sandbox(&self) -> Option<&Sandbox> {
        self.sandboxes.first()
    }

    /// The newest container with this name, and the one before it (for `lastState`).
    #[must_use]
    pub fn latest_two(&self, name: &str) -> (Option<&Container>, Option<&Container>) {
        let mut it = self.containers.iter().filter(|c| c.name == name);
        (it.next(), it.next())
    }

    /// True when nothing of the pod is left running.
    #[must_use]
    pub fn all_stopped(&self) -> bool {
        self.sandboxes.iter().all(|s| !s.ready)
            && self
                .containers
                .iter()
                .all(|c| c.state != ContainerState::Running)
    }

    /// Sorts sandboxes and containers newest first (attempt, then creation time).
    pub fn sort(&mut self) {
        self.sandboxes
            .sort_by_key(|x| std::cmp::Reverse((x.attempt, x.created_at)));
        self.containers
            .sort_by_key(|x| std::cmp::Reverse((x.attempt, x.created_at)));
    }
}
