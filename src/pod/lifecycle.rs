//! Container lifecycle hooks (`lifecycle.postStart`, `lifecycle.preStop`) and
//! the grace-period accounting around them: the kubelet's handler runner
//! (pkg/kubelet/lifecycle/handlers.go `Run`) and the pure parts of
//! kuberuntime's `killContainer` / `executePreStopHook`.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use tokio::time::Instant;

use crate::cri::Runtime;
use crate::prober::run::{HttpTarget, action_headers, http_get};

/// The shortest grace period a container is stopped with, in seconds (the
/// kubelet's `minimumGracePeriodInSeconds`).
pub const MIN_GRACE_SECONDS: i64 = 2;

/// How long an exec postStart hook may run. The kubelet gives `ExecSync` no
/// timeout; this bound only keeps a hook that never returns from holding the
/// pod's worker forever.
pub const POST_START_EXEC_LIMIT: Duration = Duration::from_secs(3600);

/// How long an exec preStop hook may run. The kubelet gives `ExecSync` no
/// timeout and stops only waiting for the hook when the grace period is over:
/// the hook goes on until its container stops (at most 2 s later). This bound
/// only keeps a runtime that never answers from holding the kill forever.
pub const PRE_STOP_EXEC_LIMIT: Duration = Duration::from_secs(3600);

/// Runs `handler` for container `c` (CRI ID `container_id`) of `pod`, whose IP
/// is `pod_ip`: exec through CRI `ExecSync` (bounded by `exec_timeout`), an
/// HTTP(S) GET (host defaults to the pod IP; any response counts as success,
/// as for the kubelet), or a sleep.
///
/// # Errors
/// The kubelet's message for the failed hook, as used in the
/// `FailedPostStartHook` / `FailedPreStopHook` events.
pub async fn run_handler(
    runtime: &Runtime,
    pod: &Pod,
    c: &Container,
    container_id: &str,
    handler: &LifecycleHandler,
    pod_ip: Option<IpAddr>,
    exec_timeout: Duration,
) -> Result<(), String> {
    let who = format!("Container {:?} in Pod {:?}", c.name, format_pod(pod));
    if let Some(exec) = &handler.exec {
        let cmd = exec.command.clone().unwrap_or_default();
        let failed = |err: String, output: &[u8]| {
            format!(
                "Exec lifecycle hook ([{}]) for {who} failed - error: {err}, message: {:?}",
                cmd.join(" "),
                String::from_utf8_lossy(output)
            )
        };
        return match runtime
            .exec_sync(container_id, cmd.clone(), exec_timeout)
            .await
        {
            Ok((0, _)) => Ok(()),
            Ok((code, out)) => Err(failed(
                format!("command '{}' exited with {code}: ", cmd.join(" ")),
                &out,
            )),
            Err(e) => Err(failed(e.to_string(), b"")),
        };
    }
    if let Some(h) = &handler.http_get {
        let path = h.path.clone().unwrap_or_default();
        let target = HttpTarget::of(h, c, pod_ip)
            .map_err(|e| format!("HTTP lifecycle hook ({path}) for {who} failed - error: {e}"))?;
        return http_get(&target, &action_headers(h), "lifecycle")
            .await
            .map(drop)
            .map_err(|e| format!("HTTP lifecycle hook ({path}) for {who} failed - error: {e}"));
    }
    if let Some(s) = &handler.sleep {
        tokio::time::sleep(Duration::from_secs(u64::try_from(s.seconds).unwrap_or(0))).await;
        return Ok(());
    }
    Err("Cannot run handler: invalid handler".to_string())
}

/// `name_namespace(uid)`, as the kubelet's `format.Pod`.
fn format_pod(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.uid.as_deref().unwrap_or_default()
    )
}

/// The grace period `StopContainer` gets after a preStop hook took `spent` of
/// a `grace_seconds` budget: what is left in whole seconds, at least
/// [`MIN_GRACE_SECONDS`] (kubelet `killContainer`: `gracePeriod -
/// executePreStopHook(...)`, then the minimum).
#[must_use]
pub fn grace_after_hook(grace_seconds: i64, spent: Duration) -> i64 {
    let spent = i64::try_from(spent.as_secs()).unwrap_or(i64::MAX);
    grace_seconds.saturating_sub(spent).max(MIN_GRACE_SECONDS)
}

/// The budget of a kill in progress: a grace period counted from a start.
/// A pod deleted again with a shorter grace period restarts the count with the
/// shorter period when that ends sooner (the kubelet's pod worker cancels the
/// kill and kills again with the new grace period).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KillBudget {
    /// When the current count started.
    pub start: Instant,
    /// Its grace period in seconds.
    pub grace_seconds: i64,
}

impl KillBudget {
    /// A budget of `grace_seconds` from `start`.
    #[must_use]
    pub fn new(start: Instant, grace_seconds: i64) -> Self {
        Self {
            start,
            grace_seconds: grace_seconds.max(0),
        }
    }

    /// When the budget runs out; `None` when that lies beyond what the
    /// monotonic clock can hold (a grace period near `i64::MAX` seconds, which
    /// the API admits): the budget never runs out. The kubelet's
    /// `time.Duration(gracePeriod) * time.Second` wraps there instead.
    #[must_use]
    pub fn deadline(&self) -> Option<Instant> {
        let grace = Duration::from_secs(u64::try_from(self.grace_seconds).unwrap_or(0));
        self.start.checked_add(grace)
    }

    /// The budget after the pod's grace period was seen as `grace_seconds` at
    /// `now`: a shorter period that ends before the current deadline replaces
    /// it; anything else changes nothing.
    #[must_use]
    pub fn observe(self, grace_seconds: i64, now: Instant) -> Self {
        let reduced = Self::new(now, grace_seconds);
        let sooner = match (reduced.deadline(), self.deadline()) {
            (Some(new), Some(current)) => new < current,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if grace_seconds < self.grace_seconds && sooner {
            reduced
        } else {
            self
        }
    }

    /// Waits until the budget runs out (forever when it never does).
    pub async fn expired(&self) {
        match self.deadline() {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    }

    /// The grace period `StopContainer` gets at `now`, once the preStop hook
    /// ended or was cut short.
    #[must_use]
    pub fn stop_grace(&self, now: Instant) -> i64 {
        grace_after_hook(
            self.grace_seconds,
            now.saturating_duration_since(self.start),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_after_hook_table() {
        // (grace, spent, stop grace)
        let cases = [
            (30, 0, 30),
            (30, 10, 20),
            (30, 28, 2),
            (30, 45, 2),
            (0, 0, 2),
            (100, 50, 50),
        ];
        for (grace, spent, want) in cases {
            assert_eq!(
                grace_after_hook(grace, Duration::from_millis(spent * 1000 + 400)),
                want,
                "grace {grace} spent {spent}"
            );
        }
    }

    #[test]
    fn extreme_grace_periods_never_overflow_the_clock() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let max32 = u64::from(i32::MAX.unsigned_abs());
        // (grace, deadline: None = never, stop grace 5 s later)
        let cases = [
            (i64::MAX, None, i64::MAX - 5),
            (i64::MIN, Some(t0), 2),
            (-1, Some(t0), 2),
            (0, Some(t0), 2),
            (
                i64::from(i32::MAX),
                Some(t0 + s(max32)),
                i64::from(i32::MAX) - 5,
            ),
        ];
        for (grace, deadline, stop) in cases {
            let b = KillBudget::new(t0, grace);
            assert_eq!(b.deadline(), deadline, "grace {grace}");
            assert_eq!(b.stop_grace(t0 + s(5)), stop, "grace {grace}");
        }
        // A second delete with a shorter grace period ends a budget that never runs out.
        let endless = KillBudget::new(t0, i64::MAX);
        let reduced = endless.observe(30, t0 + s(10));
        assert_eq!(reduced.deadline(), Some(t0 + s(40)));
        assert_eq!(endless.observe(i64::MAX - 1, t0 + s(10)), endless);
        assert_eq!(reduced.observe(i64::MAX, t0 + s(20)), reduced);
        // However long the hook took.
        assert_eq!(grace_after_hook(i64::MAX, Duration::MAX), 2);
        assert_eq!(grace_after_hook(i64::MIN, Duration::MAX), 2);
        assert_eq!(grace_after_hook(i64::MAX, Duration::ZERO), i64::MAX);
    }

    #[test]
    fn budget_reduced_by_a_second_delete() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let b = KillBudget::new(t0, 100);
        assert_eq!(b.deadline(), Some(t0 + s(100)));
        // The same or a longer grace period changes nothing.
        assert_eq!(b.observe(100, t0 + s(5)), b);
        assert_eq!(b.observe(200, t0 + s(5)), b);
        // A shorter one seen at 10 s ends at 40 s.
        let r = b.observe(30, t0 + s(10));
        assert_eq!(r.deadline(), Some(t0 + s(40)));
        assert_eq!(r.stop_grace(t0 + s(40)), 2);
        assert_eq!(r.stop_grace(t0 + s(20)), 20);
        // Seen again later, it does not push the deadline out.
        assert_eq!(r.observe(30, t0 + s(20)), r);
        // A shorter period that would end after the current deadline is ignored.
        assert_eq!(b.observe(95, t0 + s(50)), b);
        assert_eq!(b.stop_grace(t0 + s(60)), 40);
    }
}
