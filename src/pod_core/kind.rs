//! What kind of pod a sync handles, decided once from its object: static or
//! mirror, finished or not, critical, and its QoS class. The kubelet asks
//! `kubetypes.IsStaticPod`, `IsMirrorPod`, `IsCriticalPod`,
//! `podutil.IsPodPhaseTerminal` and `v1qos.GetPodQOS` wherever it needs them;
//! here one [`PodKind::of`] answers them all and the answer is passed down.

use k8s_openapi::api::core::v1::Pod;

use super::qos::{QosClass, qos_class};
use super::spec;

/// The lowest priority of a critical pod (`SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

/// The kind of a pod, read once from its object ([`PodKind::of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodKind {
    /// From a source other than the API server (a manifest): `IsStaticPod`.
    pub is_static: bool,
    /// The API's copy of a static pod: `IsMirrorPod`.
    pub is_mirror: bool,
    /// In phase `Succeeded` or `Failed`.
    pub is_terminal: bool,
    /// Never evicted nor refused for pressure, as `IsCriticalPod`: static,
    /// mirror, or of priority at least [`SYSTEM_CRITICAL_PRIORITY`].
    pub is_critical: bool,
    /// Its QoS class.
    pub qos: QosClass,
}

impl PodKind {
    /// The kind of `pod`.
    #[must_use]
    pub fn of(pod: &Pod) -> Self {
        let is_static = spec::is_static(pod);
        let is_mirror = spec::is_mirror(pod);
        let high_priority = pod
            .spec
            .as_ref()
            .and_then(|s| s.priority)
            .is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY);
        Self {
            is_static,
            is_mirror,
            is_terminal: spec::is_terminal(pod),
            is_critical: is_static || is_mirror || high_priority,
            qos: qos_class(pod),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;
    use crate::labels::{CONFIG_MIRROR_ANNOTATION, CONFIG_SOURCE_ANNOTATION};

    fn annotated(p: &mut Pod, k: &str, v: &str) {
        p.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(k.into(), v.into());
    }

    #[test]
    fn the_kind_of_a_pod_is_read_from_its_annotations_priority_and_phase() {
        type Edit = fn(&mut Pod);
        let cases: &[(&str, Edit, [bool; 4])] = &[
            ("plain", |_| {}, [false, false, false, false]),
            (
                "from a file",
                |p| annotated(p, CONFIG_SOURCE_ANNOTATION, "file"),
                [true, false, false, true],
            ),
            (
                "from the API",
                |p| annotated(p, CONFIG_SOURCE_ANNOTATION, "api"),
                [false, false, false, false],
            ),
            (
                "mirror",
                |p| annotated(p, CONFIG_MIRROR_ANNOTATION, "h"),
                [false, true, false, true],
            ),
            (
                "system critical",
                |p| p.spec.as_mut().unwrap().priority = Some(SYSTEM_CRITICAL_PRIORITY),
                [false, false, false, true],
            ),
            (
                "just below critical",
                |p| p.spec.as_mut().unwrap().priority = Some(SYSTEM_CRITICAL_PRIORITY - 1),
                [false, false, false, false],
            ),
            (
                "succeeded",
                |p| p.status.get_or_insert_with(Default::default).phase = Some("Succeeded".into()),
                [false, false, true, false],
            ),
            (
                "running",
                |p| p.status.get_or_insert_with(Default::default).phase = Some("Running".into()),
                [false, false, false, false],
            ),
        ];
        for (name, edit, [is_static, is_mirror, is_terminal, is_critical]) in cases {
            let mut p = pod("p").container("c", "img").build();
            edit(&mut p);
            let kind = PodKind::of(&p);
            assert_eq!(
                (
                    kind.is_static,
                    kind.is_mirror,
                    kind.is_terminal,
                    kind.is_critical
                ),
                (*is_static, *is_mirror, *is_terminal, *is_critical),
                "{name}"
            );
            assert_eq!(kind.qos, QosClass::BestEffort, "{name}");
        }
    }
}
