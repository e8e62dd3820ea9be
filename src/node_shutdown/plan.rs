//! The node shutdown manager's arithmetic, as the kubelet's
//! `nodeshutdown_manager.go`: the grace periods by pod priority (given, or
//! made from `shutdownGracePeriod` and `shutdownGracePeriodCriticalPods` as
//! its `migrateConfig`), the inhibit delay they ask of logind, which group a
//! pod falls in (`groupByPriority`) and each pod's grace period. Pure.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

/// The priority of a pod that names none (the scheduler's
/// `DefaultPriorityWhenNoDefaultClassExists`).
pub const DEFAULT_PRIORITY: i32 = 0;
/// `system-cluster-critical` and above (`SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

pub use crate::config::PriorityPeriod;

/// The groups, lowest priority first: `by_priority` when given, else the
/// two of `grace` and `critical` (regular pods get `grace - critical`,
/// critical pods `critical`), as the kubelet's `migrateConfig`; empty (no
/// graceful shutdown) when `grace` is zero or smaller than `critical`.
#[must_use]
pub fn periods(
    grace: Duration,
    critical: Duration,
    by_priority: &[PriorityPeriod],
) -> Vec<PriorityPeriod> {
    let mut out = if by_priority.is_empty() {
        migrate(grace, critical)
    } else {
        by_priority.to_vec()
    };
    out.sort_by_key(|p| p.priority);
    out
}

fn migrate(grace: Duration, critical: Duration) -> Vec<PriorityPeriod> {
    if grace.is_zero() {
        return Vec::new();
    }
    let Some(regular) = grace.checked_sub(critical) else {
        return Vec::new();
    };
    let seconds = |d: Duration| i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
    vec![
        PriorityPeriod {
            priority: DEFAULT_PRIORITY,
            seconds: seconds(regular),
        },
        PriorityPeriod {
            priority: SYSTEM_CRITICAL_PRIORITY,
            seconds: seconds(critical),
        },
    ]
}

/// The whole shutdown's length, the sum of the groups' periods: what logind's
/// `InhibitDelayMaxSec` must allow (the kubelet's `periodRequested`).
/// Saturating; a negative period counts as zero.
#[must_use]
pub fn period_requested(periods: &[PriorityPeriod]) -> Duration {
    let secs = periods
        .iter()
        .map(|p| u64::try_from(p.seconds).unwrap_or(0))
        .fold(0u64, u64::saturating_add);
    Duration::from_secs(secs)
}

/// The index in `periods` (sorted, not empty) of the group of a pod of
/// `priority`: the last group whose priority is at most it, the first
/// group for a priority below every group's (the kubelet's
/// `groupByPriority`). None without groups.
#[must_use]
pub fn group_of(periods: &[PriorityPeriod], priority: i32) -> Option<usize> {
    if periods.is_empty() {
        return None;
    }
    let index = periods.partition_point(|p| p.priority < priority);
    Some(if index == periods.len() {
        periods.len() - 1
    } else if index > 0 && periods[index].priority > priority {
        index - 1
    } else {
        index
    })
}

/// `pods` in their groups, lowest priority first: each group's period and
/// its pods, in the order given (empty groups kept).
#[must_use]
pub fn groups<'a>(
    periods: &[PriorityPeriod],
    pods: &[&'a Pod],
) -> Vec<(PriorityPeriod, Vec<&'a Pod>)> {
    let mut out: Vec<(PriorityPeriod, Vec<&Pod>)> =
        periods.iter().map(|p| (*p, Vec::new())).collect();
    for pod in pods {
        let priority = pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0);
        if let Some(i) = group_of(periods, priority) {
            out[i].1.push(pod);
        }
    }
    out
}

/// A pod's grace period in a group of `group_seconds`: its own
/// `terminationGracePeriodSeconds` when that is shorter, as the kubelet's
/// `killPods`.
#[must_use]
pub fn pod_grace(pod: &Pod, group_seconds: i64) -> i64 {
    match pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
    {
        Some(own) if own <= group_seconds => own,
        _ => group_seconds,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, priority: i32) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            priority: Some(priority),
            ..Default::default()
        });
        p
    }

    fn period(priority: i32, seconds: i64) -> PriorityPeriod {
        PriorityPeriod { priority, seconds }
    }

    #[test]
    fn the_two_periods_become_two_groups_as_the_kubelets_migrate_config() {
        let s = Duration::from_secs;
        let cases = [
            (
                s(300),
                s(120),
                vec![period(0, 180), period(SYSTEM_CRITICAL_PRIORITY, 120)],
            ),
            (
                s(100),
                s(0),
                vec![period(0, 100), period(SYSTEM_CRITICAL_PRIORITY, 0)],
            ),
            (s(0), s(0), vec![]),
            (s(1), s(100), vec![]),
        ];
        for (grace, critical, want) in cases {
            assert_eq!(
                periods(grace, critical, &[]),
                want,
                "{grace:?} {critical:?}"
            );
        }
        // Given by priority, they are sorted and the two periods ignored.
        let given = [period(4, 40), period(1, 10)];
        assert_eq!(periods(s(9), s(1), &given), [period(1, 10), period(4, 40)]);
        assert_eq!(period_requested(&periods(s(300), s(120), &[])), s(300));
        let huge = [
            period(1, i64::MAX),
            period(2, i64::MAX),
            period(3, i64::MAX),
        ];
        assert_eq!(period_requested(&huge), s(u64::MAX));
        assert_eq!(period_requested(&[period(1, -5), period(2, 3)]), s(3));
    }

    #[test]
    fn pods_fall_in_groups_as_the_kubelets_group_by_priority() {
        // The kubelet's "migrate config" case.
        let migrated = periods(Duration::from_secs(300), Duration::from_secs(120), &[]);
        let (normal, highest, critical) = (
            pod("normal", 0),
            pod("highest", 1_000_000_000),
            pod("critical", SYSTEM_CRITICAL_PRIORITY),
        );
        let got = groups(&migrated, &[&normal, &highest, &critical]);
        let names = |g: &[&Pod]| {
            g.iter()
                .map(|p| p.metadata.name.clone().unwrap_or_default())
                .collect::<Vec<_>>()
        };
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, period(0, 180));
        assert_eq!(names(&got[0].1), ["normal", "highest"]);
        assert_eq!(got[1].0, period(SYSTEM_CRITICAL_PRIORITY, 120));
        assert_eq!(names(&got[1].1), ["critical"]);
        // Its "pod priority" case: below the first group goes to the first,
        // above the last to the last.
        let by = [period(1, 10), period(2, 20), period(3, 30), period(4, 40)];
        let pods: Vec<Pod> = (0..6).map(|i| pod(&format!("pod-{i}"), i)).collect();
        let refs: Vec<&Pod> = pods.iter().collect();
        let got = groups(&by, &refs);
        let want: [&[&str]; 4] = [
            &["pod-0", "pod-1"],
            &["pod-2"],
            &["pod-3"],
            &["pod-4", "pod-5"],
        ];
        for (i, w) in want.iter().enumerate() {
            assert_eq!(names(&got[i].1), *w, "group {i}");
        }
        // Between two groups' priorities: the lower group.
        let sparse = [period(10, 1), period(100, 2)];
        assert_eq!(group_of(&sparse, 50), Some(0));
        assert_eq!(group_of(&sparse, 100), Some(1));
        assert_eq!(group_of(&sparse, i32::MIN), Some(0));
        assert_eq!(group_of(&sparse, i32::MAX), Some(1));
        assert_eq!(group_of(&[], 5), None);
    }

    #[test]
    fn a_pod_keeps_a_shorter_grace_period_of_its_own() {
        let mut p = pod("p", 0);
        assert_eq!(pod_grace(&p, 30), 30);
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(5);
        assert_eq!(pod_grace(&p, 30), 5);
        p.spec.as_mut().unwrap().termination_grace_period_seconds = Some(60);
        assert_eq!(pod_grace(&p, 30), 30);
    }
}
