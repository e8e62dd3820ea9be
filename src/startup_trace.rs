//! The pod startup trace: one debug line per stage of a pod's way from the
//! watch to Running (target [`TARGET`], fields `pod` as `namespace/name`
//! and `stage`), for finding where a start's time goes. Off unless the log
//! filter turns the target on (`RUST_LOG=info,rustlet::startup=debug`), and
//! then costs a log line per stage; it keeps nothing in memory. A stage is
//! marked each time it happens (a container restarted starts again): the
//! first mark of each stage after the pod was first watched is its start.
//! `hack/startup-trace.py` reads the lines of a log into a per-stage table;
//! `hack/bench.sh` keeps that table with every run.
//!
//! The stages, in the order a pod's first start passes them (the kubelet's
//! `SyncPod` steps and its status manager):
//!
//! | stage | marked when |
//! |---|---|
//! | `watched` | the API server's watch delivered the pod (each event) |
//! | `admitted` | admission let it run |
//! | `volumes_ready` | a sync found every volume set up |
//! | `sandbox_ready` | `RunPodSandbox` returned |
//! | `image_ready` | a container's image was present or pulled |
//! | `container_created` | `CreateContainer` returned |
//! | `container_started` | `StartContainer` returned |
//! | `status_sent` | a status patch was sent (field `phase`) |
//! | `running_seen` | the watch delivered the pod with phase Running |

use k8s_openapi::api::core::v1::Pod;

/// The log target of the trace's lines.
pub const TARGET: &str = "rustlet::startup";

/// A stage of a pod's start (the table above).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The watch delivered the pod.
    Watched,
    /// Admission let the pod run.
    Admitted,
    /// Every volume of the pod is set up.
    VolumesReady,
    /// `RunPodSandbox` returned.
    SandboxReady,
    /// A container's image is present or was pulled.
    ImageReady,
    /// `CreateContainer` returned.
    ContainerCreated,
    /// `StartContainer` returned.
    ContainerStarted,
    /// A status patch was sent.
    StatusSent,
    /// The watch delivered the pod with phase Running.
    RunningSeen,
}

impl Stage {
    /// The stage's name in the trace's lines.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Watched => "watched",
            Self::Admitted => "admitted",
            Self::VolumesReady => "volumes_ready",
            Self::SandboxReady => "sandbox_ready",
            Self::ImageReady => "image_ready",
            Self::ContainerCreated => "container_created",
            Self::ContainerStarted => "container_started",
            Self::StatusSent => "status_sent",
            Self::RunningSeen => "running_seen",
        }
    }
}

/// True when the trace's lines are logged: callers skip work done only for
/// them.
#[must_use]
pub fn enabled() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
}

/// Marks `stage` for `pod`.
pub fn mark(pod: &Pod, stage: Stage) {
    line(pod, stage, None);
}

/// Marks [`Stage::StatusSent`] for `pod`, with the phase of the status sent.
pub fn status_sent(pod: &Pod, phase: Option<&str>) {
    line(pod, Stage::StatusSent, Some(phase.unwrap_or_default()));
}

/// The trace's line of `stage` for `pod`, with `phase` when given.
fn line(pod: &Pod, stage: Stage, phase: Option<&str>) {
    if enabled() {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let pod = format_args!("{ns}/{name}");
        match phase {
            Some(phase) => {
                tracing::debug!(target: TARGET, pod = %pod, stage = %stage.as_str(), phase = %phase, "startup")
            }
            None => tracing::debug!(target: TARGET, pod = %pod, stage = %stage.as_str(), "startup"),
        }
    }
}

/// Marks what a watch event of `pod` is: [`Stage::Watched`], and
/// [`Stage::RunningSeen`] when its phase is Running.
pub fn watched(pod: &Pod) {
    if enabled() {
        mark(pod, Stage::Watched);
        if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
            mark(pod, Stage::RunningSeen);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(filter: &str, f: impl FnOnce()) -> String {
        let lines = Lines::default();
        let out = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(move || out.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        String::from_utf8(lines.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn stages_are_logged_only_when_the_target_is_on() {
        let mut pod = crate::fixtures::pod("web")
            .container("c", "busybox")
            .build();
        pod.metadata.namespace = Some("ns".into());
        let run = || {
            mark(&pod, Stage::SandboxReady);
            status_sent(&pod, Some("Running"));
            let mut running = pod.clone();
            running.status.get_or_insert_with(Default::default).phase = Some("Running".into());
            watched(&pod);
            watched(&running);
        };
        assert_eq!(logged("info", run), "");
        let text = logged("info,rustlet::startup=debug", run);
        let stages: Vec<&str> = text
            .lines()
            .map(|l| {
                assert!(l.contains("rustlet::startup"), "{l}");
                assert!(l.contains("pod=ns/web"), "{l}");
                l.split("stage=").nth(1).unwrap().split(' ').next().unwrap()
            })
            .collect();
        assert_eq!(
            stages,
            [
                "sandbox_ready",
                "status_sent",
                "watched",
                "watched",
                "running_seen"
            ]
        );
        assert!(text.lines().nth(1).unwrap().contains("phase=Running"));
    }
}
