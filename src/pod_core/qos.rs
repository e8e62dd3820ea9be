//! A pod's quality of service class, as the kubelet's `v1qos.GetPodQOS`:
//! what the status reports (`status.qosClass`), where the pod's cgroup
//! goes, its containers' OOM score, and the order of eviction.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// The QoS class of a pod (the API's `PodQOSClass`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QosClass {
    /// Every container's cpu and memory limits equal its requests.
    Guaranteed,
    /// Some request or limit, not Guaranteed.
    Burstable,
    /// No cpu or memory request or limit.
    BestEffort,
}

impl QosClass {
    /// The class as the API writes it (`Guaranteed`, `Burstable`, `BestEffort`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Guaranteed => "Guaranteed",
            Self::Burstable => "Burstable",
            Self::BestEffort => "BestEffort",
        }
    }
}

/// The pod's QoS class, as `GetPodQOS`: Guaranteed when every container's cpu
/// and memory limits equal its requests, BestEffort when none are set, else
/// Burstable. Pod-level `spec.resources` that set cpu or memory decide alone
/// (`ComputePodQOS` with pod-level resources).
#[must_use]
pub fn qos_class(pod: &Pod) -> QosClass {
    let pod_level = pod.spec.as_ref().and_then(|s| s.resources.as_ref());
    let names = ["cpu", "memory"];
    let sets = |m: Option<&BTreeMap<String, Quantity>>| {
        m.is_some_and(|m| names.iter().any(|n| m.contains_key(*n)))
    };
    if let Some(r) = pod_level.filter(|r| sets(r.requests.as_ref()) || sets(r.limits.as_ref())) {
        let empty = BTreeMap::<String, Quantity>::new();
        let limits = r.limits.as_ref().unwrap_or(&empty);
        let requests = r.requests.as_ref().unwrap_or(&empty);
        let guaranteed = names.iter().all(|n| {
            let l = limits.get(*n);
            l.is_some() && requests.get(*n).or(l) == l
        });
        return if guaranteed {
            QosClass::Guaranteed
        } else {
            QosClass::Burstable
        };
    }
    // Init containers count as the others do (`ComputePodQOS` goes
    // through both): a pod the API server classed with them must not be
    // reported otherwise (`status.qosClass` is immutable).
    let spec = pod.spec.as_ref();
    let containers: Vec<&k8s_openapi::api::core::v1::Container> = spec
        .into_iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .collect();
    let mut any = false;
    let mut guaranteed = !containers.is_empty();
    for c in containers {
        let r = c.resources.as_ref();
        let empty = BTreeMap::<String, Quantity>::new();
        let limits = r.and_then(|r| r.limits.as_ref()).unwrap_or(&empty);
        let requests = r.and_then(|r| r.requests.as_ref()).unwrap_or(&empty);
        for res in ["cpu", "memory"] {
            let (l, q) = (limits.get(res), requests.get(res).or(limits.get(res)));
            any |= l.is_some() || q.is_some();
            guaranteed &= l.is_some() && l == q;
        }
    }
    match (any, guaranteed) {
        (false, _) => QosClass::BestEffort,
        (true, true) => QosClass::Guaranteed,
        _ => QosClass::Burstable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;

    #[test]
    fn qos_classes() {
        use k8s_openapi::api::core::v1::ResourceRequirements;
        let mut p = pod("q").container("a", "busybox").build();
        assert_eq!(qos_class(&p), QosClass::BestEffort);
        let q = |s: &str| Quantity(s.into());
        let both = BTreeMap::from([
            ("cpu".to_string(), q("100m")),
            ("memory".to_string(), q("64Mi")),
        ]);
        p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            limits: Some(both.clone()),
            ..Default::default()
        });
        assert_eq!(qos_class(&p), QosClass::Guaranteed);
        p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            requests: Some(BTreeMap::from([("cpu".to_string(), q("50m"))])),
            ..Default::default()
        });
        assert_eq!(qos_class(&p), QosClass::Burstable);
        // An init container's limits count: a memory limit on it alone
        // makes the pod Burstable (the node suite's OOM-killed init
        // container pod).
        let mut init = pod("i")
            .init_container("oom", "busybox")
            .container("a", "busybox")
            .build();
        init.spec
            .as_mut()
            .unwrap()
            .init_containers
            .as_mut()
            .unwrap()[0]
            .resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([("memory".to_string(), q("15Mi"))])),
            ..Default::default()
        });
        assert_eq!(qos_class(&init), QosClass::Burstable);
        // Pod-level resources decide alone: limits alone are Guaranteed,
        // whatever the containers ask.
        p.spec.as_mut().unwrap().resources = Some(ResourceRequirements {
            limits: Some(both.clone()),
            ..Default::default()
        });
        assert_eq!(qos_class(&p), QosClass::Guaranteed);
        p.spec.as_mut().unwrap().resources = Some(ResourceRequirements {
            requests: Some(both),
            ..Default::default()
        });
        assert_eq!(qos_class(&p), QosClass::Burstable);
    }
}
