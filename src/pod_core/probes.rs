//! What the probe manager says of a container, as the pure core reads it
//! (the kubelet's `prober/results`): which probe, and whether the container
//! is ready, started, or must be restarted.

/// Which probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    /// `startupProbe`: holds the other probes until it succeeds; failure restarts.
    Startup,
    /// `livenessProbe`: failure restarts the container.
    Liveness,
    /// `readinessProbe`: drives the container's `ready` flag.
    Readiness,
}

impl ProbeKind {
    /// The name used in events (`Liveness probe failed: ...`).
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Startup => "Startup",
            Self::Liveness => "Liveness",
            Self::Readiness => "Readiness",
        }
    }
}

/// What the probes say about one running container, for plan and status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContainerProbes {
    /// The readiness probe passes (true when there is none).
    pub ready: bool,
    /// The startup probe passed (true when there is none).
    pub started: bool,
    /// The liveness or startup probe failed: the container must be restarted.
    pub failed: Option<ProbeKind>,
}
