//! The CrashLoopBackOff curve: the delay before each restart of a container
//! that keeps exiting, as the kubelet's `flowcontrol.Backoff` with the
//! initial and maximum delays of `newCrashLoopBackOff` (10 s doubling to
//! 300 s, the maximum set by `crashLoopBackOff.maxContainerRestartPeriod`
//! under the `KubeletCrashLoopBackOffMax` gate, on by default).

use std::time::Duration;

/// The kubelet's initial CrashLoopBackOff delay (10 s).
pub const INITIAL_BACKOFF: Duration = Duration::from_secs(10);
/// The kubelet's maximum CrashLoopBackOff and image pull back-off delay (300 s).
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// The CrashLoopBackOff curve of a node: `initial`, doubled per restart up
/// to `max`. The default is the kubelet's, 10 s to 300 s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashBackoff {
    /// The delay before the second restart (the first is at once).
    pub initial: Duration,
    /// The most any restart waits.
    pub max: Duration,
}

impl Default for CrashBackoff {
    fn default() -> Self {
        Self {
            initial: INITIAL_BACKOFF,
            max: MAX_BACKOFF,
        }
    }
}

impl CrashBackoff {
    /// The curve with `crashLoopBackOff.maxContainerRestartPeriod` = `max`:
    /// a maximum below the initial 10 s lowers the initial delay with it,
    /// as the kubelet's `newCrashLoopBackOff`.
    #[must_use]
    pub fn with_max(max: Duration) -> Self {
        Self {
            initial: INITIAL_BACKOFF.min(max),
            max,
        }
    }

    /// The delay before restart number `restarts + 1`: none for the first
    /// restart, then `initial` doubling to `max` (the kubelet's `backOff.Next`).
    #[must_use]
    pub fn delay(&self, restarts: u32) -> Duration {
        if restarts == 0 {
            return Duration::ZERO;
        }
        let factor = 1u32.checked_shl(restarts - 1).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// How long after a crash the series is forgotten: twice `max`, as a
    /// `flowcontrol.Backoff` entry expires.
    #[must_use]
    pub fn expiry(&self) -> Duration {
        self.max.saturating_mul(2)
    }
}

/// The delay before restart number `restarts + 1` on the kubelet's default
/// curve, 10 s doubling to 300 s; the image pull back-off's too (the
/// kubelet's image back-off keeps these whatever the crash loop's maximum).
#[must_use]
pub fn crash_backoff(restarts: u32) -> Duration {
    CrashBackoff::default().delay(restarts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_doubles_from_ten_seconds_to_five_minutes() {
        let secs: Vec<u64> = (0..8).map(|n| crash_backoff(n).as_secs()).collect();
        assert_eq!(secs, vec![0, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(crash_backoff(40), MAX_BACKOFF);
        assert_eq!(CrashBackoff::default().expiry(), Duration::from_secs(600));
    }

    #[test]
    fn a_lower_maximum_caps_the_curve_and_the_initial_delay() {
        let one_minute = CrashBackoff::with_max(Duration::from_secs(60));
        let secs: Vec<u64> = (0..6).map(|n| one_minute.delay(n).as_secs()).collect();
        assert_eq!(secs, vec![0, 10, 20, 40, 60, 60]);
        assert_eq!(one_minute.expiry(), Duration::from_secs(120));
        // Below 10 s, every restart waits the maximum.
        let two = CrashBackoff::with_max(Duration::from_secs(2));
        let secs: Vec<u64> = (0..5).map(|n| two.delay(n).as_secs()).collect();
        assert_eq!(secs, vec![0, 2, 2, 2, 2]);
    }
}
