//! The probe manager: startup, liveness and readiness probes of running
//! containers, each on its own timer (the kubelet's pkg/kubelet/prober). A
//! worker per (container, probe) runs the probe every `periodSeconds`, keeps its
//! result through the thresholds ([`ProbeState`], pure), and requeues the pod
//! when a result changes; the pod worker reads the results to set `ready` and
//! `started` and to restart containers whose liveness or startup probe failed.

pub mod manager;
pub mod run;

use std::time::Duration;

use k8s_openapi::api::core::v1::Probe;
use k8s_openapi::jiff::Timestamp;

pub use crate::pod_core::probes::{ContainerProbes, ProbeKind};

/// A probe's timing and thresholds with the API's defaults filled in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Delay after the container started before the first probe (`initialDelaySeconds`, 0).
    pub initial_delay: Duration,
    /// Time between probes (`periodSeconds`, 10 s).
    pub period: Duration,
    /// Time one probe may take (`timeoutSeconds`, 1 s).
    pub timeout: Duration,
    /// Consecutive successes to pass (`successThreshold`, 1).
    pub success_threshold: u32,
    /// Consecutive failures to fail (`failureThreshold`, 3).
    pub failure_threshold: u32,
}

impl Timing {
    /// The timing of `probe`, defaults as the API's: a period, timeout or
    /// threshold that is unset or 0 takes its default, as API defaulting sets
    /// it; a negative one, which API validation refuses, too (the kubelet's
    /// probe ticker would panic on a non-positive period); a negative initial
    /// delay is none. Up to `i32::MAX` seconds (68 years) is kept as given.
    #[must_use]
    pub fn of(probe: &Probe) -> Self {
        let secs = |v: Option<i32>, d: u64| {
            let v = v.and_then(|v| u64::try_from(v).ok()).filter(|v| *v > 0);
            Duration::from_secs(v.unwrap_or(d))
        };
        let count = |v: Option<i32>, d: u32| {
            v.and_then(|v| u32::try_from(v).ok())
                .filter(|v| *v > 0)
                .unwrap_or(d)
        };
        Self {
            initial_delay: secs(probe.initial_delay_seconds, 0),
            period: secs(probe.period_seconds, 10),
            timeout: secs(probe.timeout_seconds, 1),
            success_threshold: count(probe.success_threshold, 1),
            failure_threshold: count(probe.failure_threshold, 3),
        }
    }
}

/// The result a probe reports before it has run: readiness starts failed,
/// liveness succeeded, startup unknown (the kubelet's `initialValue`).
#[must_use]
pub fn initial_result(kind: ProbeKind) -> Option<bool> {
    match kind {
        ProbeKind::Readiness => Some(false),
        ProbeKind::Liveness => Some(true),
        ProbeKind::Startup => None,
    }
}

/// A probe's reported result through its thresholds, as the kubelet's worker
/// `doProbe`: a result is reported once it repeated `successThreshold` or
/// `failureThreshold` times in a row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeState {
    /// The reported result (None: unknown).
    pub result: Option<bool>,
    /// The container ran before the agent started (it was adopted), and no
    /// initial result was set: until its first result, the status keeps
    /// what the pod last reported (the kubelet without
    /// `ChangeContainerStatusOnKubeletRestart`).
    pub adopted: bool,
    last: Option<bool>,
    run: u32,
}

impl ProbeState {
    /// A new state for `kind`.
    #[must_use]
    pub fn new(kind: ProbeKind) -> Self {
        Self {
            result: initial_result(kind),
            adopted: false,
            last: None,
            run: 0,
        }
    }

    /// The state of a `kind` probe of a container that was running before
    /// the agent started: no result yet (liveness: passed), as the kubelet's
    /// worker sets no initial value for it.
    #[must_use]
    pub fn adopted(kind: ProbeKind) -> Self {
        Self {
            result: (kind == ProbeKind::Liveness).then_some(true),
            adopted: true,
            last: None,
            run: 0,
        }
    }

    /// Whether a probe is due: the container started at `started` and the
    /// initial delay has passed at `now`. A delay that ends past the last
    /// time a timestamp holds never passes.
    #[must_use]
    pub fn due(timing: &Timing, started: Timestamp, now: Timestamp) -> bool {
        started
            .checked_add(timing.initial_delay)
            .is_ok_and(|at| now >= at)
    }

    /// Records one probe outcome; returns true when the reported result changed.
    pub fn record(&mut self, ok: bool, timing: &Timing) -> bool {
        if self.last == Some(ok) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(ok);
            self.run = 1;
        }
        let threshold = if ok {
            timing.success_threshold
        } else {
            timing.failure_threshold
        };
        if self.run < threshold || self.result == Some(ok) {
            return false;
        }
        self.result = Some(ok);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(success: u32, failure: u32) -> Timing {
        Timing {
            initial_delay: Duration::from_secs(5),
            period: Duration::from_secs(10),
            timeout: Duration::from_secs(1),
            success_threshold: success,
            failure_threshold: failure,
        }
    }

    #[test]
    fn thresholds_table() {
        // (kind, success threshold, failure threshold, outcomes, reported results after each)
        type Case = (ProbeKind, u32, u32, Vec<bool>, Vec<Option<bool>>);
        let cases: Vec<Case> = vec![
            (ProbeKind::Readiness, 1, 3, vec![true], vec![Some(true)]),
            (
                ProbeKind::Readiness,
                2,
                3,
                vec![true, true],
                vec![Some(false), Some(true)],
            ),
            (
                ProbeKind::Readiness,
                2,
                3,
                vec![true, false, true, true],
                vec![Some(false), Some(false), Some(false), Some(true)],
            ),
            (
                ProbeKind::Liveness,
                1,
                3,
                vec![false, false, false],
                vec![Some(true), Some(true), Some(false)],
            ),
            (
                ProbeKind::Liveness,
                1,
                3,
                vec![false, false, true, false, false],
                vec![Some(true); 5],
            ),
            (
                ProbeKind::Startup,
                1,
                2,
                vec![false, false],
                vec![None, Some(false)],
            ),
            (
                ProbeKind::Startup,
                1,
                2,
                vec![false, true],
                vec![None, Some(true)],
            ),
        ];
        for (kind, s, f, outcomes, want) in cases {
            let t = timing(s, f);
            let mut st = ProbeState::new(kind);
            let got: Vec<Option<bool>> = outcomes
                .iter()
                .map(|ok| {
                    st.record(*ok, &t);
                    st.result
                })
                .collect();
            assert_eq!(got, want, "{kind:?} s={s} f={f} {outcomes:?}");
        }
    }

    #[test]
    fn initial_delay_and_defaults() {
        let t = timing(1, 3);
        let start = Timestamp::from_second(1_700_000_000).unwrap();
        assert!(!ProbeState::due(&t, start, start + Duration::from_secs(4)));
        assert!(ProbeState::due(&t, start, start + Duration::from_secs(5)));
        let d = Timing::of(&Probe::default());
        assert_eq!(
            (
                d.period,
                d.timeout,
                d.success_threshold,
                d.failure_threshold
            ),
            (Duration::from_secs(10), Duration::from_secs(1), 1, 3)
        );
    }

    #[test]
    fn extreme_timings_take_defaults_or_stay_as_given() {
        let s = Duration::from_secs;
        let max = u32::MAX >> 1; // i32::MAX
        // (value of every field, (initial delay, period, timeout, success, failure))
        let cases = [
            (
                i32::MAX,
                (s(max.into()), s(max.into()), s(max.into()), max, max),
            ),
            (1, (s(1), s(1), s(1), 1, 1)),
            (0, (s(0), s(10), s(1), 1, 3)),
            (-1, (s(0), s(10), s(1), 1, 3)),
            (i32::MIN, (s(0), s(10), s(1), 1, 3)),
        ];
        for (v, want) in cases {
            let probe = Probe {
                initial_delay_seconds: Some(v),
                period_seconds: Some(v),
                timeout_seconds: Some(v),
                success_threshold: Some(v),
                failure_threshold: Some(v),
                ..Default::default()
            };
            let t = Timing::of(&probe);
            let got = (
                t.initial_delay,
                t.period,
                t.timeout,
                t.success_threshold,
                t.failure_threshold,
            );
            assert_eq!(got, want, "{v}");
        }
        // The largest delay from a start at the end of time never passes; from
        // now, 68 years on.
        let t = Timing::of(&Probe {
            initial_delay_seconds: Some(i32::MAX),
            ..Default::default()
        });
        assert!(!ProbeState::due(&t, Timestamp::MAX, Timestamp::MAX));
        let now = Timestamp::from_second(1_700_000_000).unwrap();
        assert!(!ProbeState::due(&t, now, now + s(u64::from(max) - 1)));
        assert!(ProbeState::due(&t, now, now + s(max.into())));
        // A threshold of i32::MAX is reached; the run counts on without overflowing.
        let t = Timing {
            failure_threshold: max,
            ..t
        };
        let mut st = ProbeState::new(ProbeKind::Liveness);
        st.last = Some(false);
        st.run = max - 2;
        assert!(!st.record(false, &t));
        assert!(st.record(false, &t));
        assert_eq!(st.result, Some(false));
        st.run = u32::MAX;
        assert!(!st.record(false, &t));
        assert_eq!(st.run, u32::MAX);
    }
}
