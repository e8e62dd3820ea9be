//! Whether a pod fits the node beside the pods already admitted, as the
//! kubelet's predicate admit handler runs the scheduler's GeneralPredicates
//! (lifecycle/predicate.go, scheduler `AdmissionCheck`): resource fit
//! (`noderesources.Fits`), node selector and required node affinity, host
//! ports and untolerated `NoExecute` taints. Only the first failure is
//! reported, in that order. Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::admit::Rejection;
pub use super::spec::is_pod_level_resource;
use super::spec::is_sidecar;
use crate::reasons::admission::{NODE_AFFINITY, NODE_PORTS, TAINT_TOLERATION};
use crate::resource::Quantity;

/// What admission reads of the Node.
#[derive(Clone, Debug, Default)]
pub struct NodeView {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    pub labels: BTreeMap<String, String>,
    /// `spec.taints`.
    pub taints: Vec<Taint>,
    /// `status.allocatable`.
    pub allocatable: BTreeMap<String, ApiQuantity>,
}

/// A pod's resource requests, as component-helpers' `PodRequests`: regular
/// containers and sidecars (restartable init containers) add up; a plain init
/// container needs its own request plus the sidecars started before it; the
/// pod needs the larger of the two; pod-level `resources.requests` replace
/// cpu, memory and huge pages ([`is_pod_level_resource`]); `overhead` is added. Sums saturate; a request too large
/// to hold counts as the largest quantity, one that does not parse as none
/// (the API server validated it).
#[must_use]
pub fn pod_requests(pod: &Pod) -> BTreeMap<String, Quantity> {
    let Some(spec) = pod.spec.as_ref() else {
        return BTreeMap::new();
    };
    let mut total = aggregate(
        spec,
        requests,
        spec.resources.as_ref().and_then(|r| r.requests.as_ref()),
    );
    if let Some(overhead) = spec.overhead.as_ref() {
        add_all(&mut total, &parsed(overhead));
    }
    total
}

/// A pod's resource limits, as component-helpers' `PodLimits`: added up and
/// peaked as [`pod_requests`] (only the containers that set a limit count),
/// pod-level `resources.limits` replace cpu, memory and huge pages, and
/// `overhead` is added to the limits that are set.
#[must_use]
pub fn pod_limits(pod: &Pod) -> BTreeMap<String, Quantity> {
    let Some(spec) = pod.spec.as_ref() else {
        return BTreeMap::new();
    };
    let mut total = aggregate(
        spec,
        limits,
        spec.resources.as_ref().and_then(|r| r.limits.as_ref()),
    );
    for (name, q) in spec.overhead.iter().flat_map(parsed) {
        if let Some(v) = total.get_mut(&name) {
            *v = v.saturating_add(q);
        }
    }
    total
}

/// The regular containers and sidecars added up, the larger of that and the
/// peak of the init containers, then the pod-level cpu and memory of
/// `pod_level`; `of` reads a container's requests or limits.
fn aggregate(
    spec: &k8s_openapi::api::core::v1::PodSpec,
    of: fn(&Container) -> BTreeMap<String, Quantity>,
    pod_level: Option<&BTreeMap<String, ApiQuantity>>,
) -> BTreeMap<String, Quantity> {
    let mut total: BTreeMap<String, Quantity> = BTreeMap::new();
    for c in &spec.containers {
        add_all(&mut total, &of(c));
    }
    let mut sidecars: BTreeMap<String, Quantity> = BTreeMap::new();
    let mut init_peak: BTreeMap<String, Quantity> = BTreeMap::new();
    for c in spec.init_containers.iter().flatten() {
        let own = of(c);
        if is_sidecar(c) {
            add_all(&mut total, &own);
            add_all(&mut sidecars, &own);
            // A sidecar's start also needs what was running before it.
            max_all(&mut init_peak, &sidecars);
        } else {
            let mut need = sidecars.clone();
            add_all(&mut need, &own);
            max_all(&mut init_peak, &need);
        }
    }
    max_all(&mut total, &init_peak);
    if let Some(pod_level) = pod_level {
        for (name, q) in pod_level {
            if !is_pod_level_resource(name) {
                continue;
            }
            if let Ok(q) = Quantity::parse_saturating(&q.0) {
                total.insert(name.clone(), q);
            }
        }
    }
    total
}

/// The container's limits, parsed.
fn limits(c: &Container) -> BTreeMap<String, Quantity> {
    c.resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .map(parsed)
        .unwrap_or_default()
}

/// The container's requests, parsed.
fn requests(c: &Container) -> BTreeMap<String, Quantity> {
    c.resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .map(parsed)
        .unwrap_or_default()
}

/// The node's allocatable resources, parsed as [`pod_requests`] parses
/// quantities.
#[must_use]
pub fn parsed_allocatable(node: &NodeView) -> BTreeMap<String, Quantity> {
    parsed(&node.allocatable)
}

/// The quantities of `list`; one too large to hold is the largest there is
/// (a request beyond any node then never fits), one that does not parse is
/// left out (the API server validated them).
fn parsed(list: &BTreeMap<String, ApiQuantity>) -> BTreeMap<String, Quantity> {
    list.iter()
        .filter_map(|(k, v)| {
            Quantity::parse_saturating(&v.0)
                .ok()
                .map(|q| (k.clone(), q))
        })
        .collect()
}

fn add_all(into: &mut BTreeMap<String, Quantity>, more: &BTreeMap<String, Quantity>) {
    for (k, v) in more {
        let sum = into.get(k).copied().unwrap_or_default().saturating_add(*v);
        into.insert(k.clone(), sum);
    }
}

fn max_all(into: &mut BTreeMap<String, Quantity>, other: &BTreeMap<String, Quantity>) {
    for (k, v) in other {
        let cur = into.get(k).copied().unwrap_or_default();
        into.insert(k.clone(), cur.max(*v));
    }
}

/// The first GeneralPredicates failure of `pod` on `node` beside `admitted`
/// (the pods already admitted and still active); None when it fits.
/// Reasons and messages as the kubelet's: `OutOf<resource>` with
/// `Node didn't have enough resource: <resource>, requested: <n>, used: <n>,
/// capacity: <n>` (cpu in millicores, the rest in units; capacity is the
/// allocatable amount), then `NodeAffinity`, `NodePorts` and
/// `TaintToleration` with `Predicate <name> failed: <description>`.
#[must_use]
pub fn fit(pod: &Pod, admitted: &[&Pod], node: &NodeView) -> Option<Rejection> {
    if let Some(r) = resource_fit(pod, admitted, node) {
        return Some(r);
    }
    if !matches_node_selector(pod, node) {
        return Some(predicate(
            NODE_AFFINITY,
            "node(s) didn't match Pod's node affinity/selector",
        ));
    }
    if ports_conflict(pod, admitted) {
        return Some(predicate(
            NODE_PORTS,
            "node(s) didn't have free ports for the requested pod ports",
        ));
    }
    if !tolerates_no_execute(pod, &node.taints) {
        return Some(predicate(
            TAINT_TOLERATION,
            "node(s) had taints that the pod didn't tolerate",
        ));
    }
    None
}

fn predicate(name: &str, description: &str) -> Rejection {
    Rejection {
        reason: name.to_string(),
        message: format!("Predicate {name} failed: {description}"),
    }
}

fn insufficient(resource: &str, requested: i128, used: i128, capacity: i128) -> Rejection {
    Rejection {
        reason: format!("OutOf{resource}"),
        message: format!(
            "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
        ),
    }
}

/// `noderesources.Fits`: the pod count first, then each resource the pod
/// requests (cpu, memory, ephemeral-storage, then the others by name);
/// extended resources the node does not list are left out.
fn resource_fit(pod: &Pod, admitted: &[&Pod], node: &NodeView) -> Option<Rejection> {
    let allocatable = parsed(&node.allocatable);
    let pods_allowed = allocatable.get("pods").copied().unwrap_or_default().value();
    let others = i128::try_from(admitted.len()).unwrap_or(i128::MAX);
    if others.saturating_add(1) > pods_allowed {
        return Some(insufficient("pods", 1, others, pods_allowed));
    }
    let wanted = pod_requests(pod);
    let mut used: BTreeMap<String, Quantity> = BTreeMap::new();
    for p in admitted {
        add_all(&mut used, &pod_requests(p));
    }
    let first = ["cpu", "memory", "ephemeral-storage"];
    let order = first.iter().map(|s| (*s).to_string()).chain(
        wanted
            .keys()
            .filter(|k| !first.contains(&k.as_str()))
            .cloned(),
    );
    for name in order {
        let Some(&request) = wanted.get(&name) else {
            continue;
        };
        if request <= Quantity::default() || name == "pods" {
            continue;
        }
        if crate::resource::is_extended_resource(&name) && !allocatable.contains_key(&name) {
            continue;
        }
        let have = allocatable.get(&name).copied().unwrap_or_default();
        let taken = used.get(&name).copied().unwrap_or_default();
        if request > have.saturating_sub(taken) {
            let n = |q: Quantity| {
                if name == "cpu" {
                    q.milli_value()
                } else {
                    q.value()
                }
            };
            return Some(insufficient(&name, n(request), n(taken), n(have)));
        }
    }
    None
}

/// `spec.nodeSelector` and the required node affinity both match the node
/// (`GetRequiredNodeAffinity(pod).Match`): every selector label equal, and
/// one of the affinity's terms matching (an empty term matches nothing).
#[must_use]
pub fn matches_node_selector(pod: &Pod, node: &NodeView) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return true;
    };
    let selector_ok = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(k, v)| node.labels.get(k) == Some(v));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    let affinity_ok =
        required.is_none_or(|r| crate::node_selector::matches(r, &node.name, &node.labels));
    selector_ok && affinity_ok
}

/// A host port a pod asks for: (IP, protocol, port), with an empty IP as
/// `0.0.0.0` and an empty protocol as `TCP`.
type HostPort = (String, String, i32);

/// The host ports of the pod's containers and sidecars (plain init
/// containers hold none while the pod runs), as `GetHostPorts`.
fn host_ports(pod: &Pod) -> Vec<HostPort> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.containers
        .iter()
        .chain(
            spec.init_containers
                .iter()
                .flatten()
                .filter(|c| is_sidecar(c)),
        )
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|&h| h > 0)?;
            let ip = p
                .host_ip
                .clone()
                .filter(|ip| !ip.is_empty())
                .unwrap_or_else(|| "0.0.0.0".into());
            let protocol = p
                .protocol
                .clone()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| "TCP".into());
            Some((ip, protocol, port))
        })
        .collect()
}

/// True when one of the pod's host ports is taken by an admitted pod: same
/// protocol and port, and the same IP or either on `0.0.0.0`
/// (`HostPortInfo.CheckConflict`).
fn ports_conflict(pod: &Pod, admitted: &[&Pod]) -> bool {
    let wanted = host_ports(pod);
    if wanted.is_empty() {
        return false;
    }
    let used: Vec<HostPort> = admitted.iter().flat_map(|p| host_ports(p)).collect();
    wanted.iter().any(|(ip, proto, port)| {
        used.iter().any(|(uip, uproto, uport)| {
            uport == port && uproto == proto && (uip == ip || uip == "0.0.0.0" || ip == "0.0.0.0")
        })
    })
}

/// True when the pod tolerates every `NoExecute` taint of the node (the
/// other effects do not count at admission).
fn tolerates_no_execute(pod: &Pod, taints: &[Taint]) -> bool {
    let tolerations = pod
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_deref())
        .unwrap_or_default();
    taints
        .iter()
        .filter(|t| t.effect == "NoExecute")
        .all(|t| tolerations.iter().any(|tol| tolerates(tol, t)))
}

/// `Toleration.ToleratesTaint`: the effect matches (or is empty), the key
/// matches (or is empty with `Exists`), and the value is equal for `Equal`
/// (the default operator).
#[must_use]
pub fn tolerates(tol: &Toleration, taint: &Taint) -> bool {
    let effect_ok = tol
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = tol.key.as_deref().unwrap_or_default();
    let op = tol.operator.as_deref().unwrap_or("Equal");
    if !effect_ok || (!key.is_empty() && key != taint.key) {
        return false;
    }
    match op {
        "Exists" => true,
        "Equal" | "" => {
            !key.is_empty()
                && tol.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        Affinity, ContainerPort, NodeAffinity, NodeSelector, NodeSelectorRequirement,
        NodeSelectorTerm, PodSpec, ResourceRequirements,
    };

    fn q(s: &str) -> ApiQuantity {
        ApiQuantity(s.into())
    }

    fn ctr(name: &str, cpu: &str, memory: &str) -> Container {
        let mut requests = BTreeMap::new();
        if !cpu.is_empty() {
            requests.insert("cpu".to_string(), q(cpu));
        }
        if !memory.is_empty() {
            requests.insert("memory".to_string(), q(memory));
        }
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                requests: Some(requests),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod_with(containers: Vec<Container>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn node(cpu: &str, memory: &str, pods: &str) -> NodeView {
        NodeView {
            name: "n1".into(),
            labels: BTreeMap::from([("disk".to_string(), "ssd".to_string())]),
            taints: vec![],
            allocatable: BTreeMap::from([
                ("cpu".to_string(), q(cpu)),
                ("memory".to_string(), q(memory)),
                ("pods".to_string(), q(pods)),
            ]),
        }
    }

    #[test]
    fn requests_take_init_peaks_sidecars_pod_level_and_overhead() {
        let mut p = pod_with(vec![ctr("a", "100m", "64Mi"), ctr("b", "200m", "")]);
        let spec = p.spec.as_mut().unwrap();
        let mut sidecar = ctr("side", "50m", "");
        sidecar.restart_policy = Some("Always".into());
        // A plain init container after the sidecar needs 500m + 50m.
        spec.init_containers = Some(vec![sidecar, ctr("init", "500m", "1Gi")]);
        spec.overhead = Some(BTreeMap::from([("cpu".to_string(), q("10m"))]));
        let r = pod_requests(&p);
        assert_eq!(r["cpu"].milli_value(), 550 + 10);
        assert_eq!(r["memory"].value(), 1 << 30);
        p.spec.as_mut().unwrap().resources = Some(ResourceRequirements {
            requests: Some(BTreeMap::from([("cpu".to_string(), q("2"))])),
            ..Default::default()
        });
        assert_eq!(pod_requests(&p)["cpu"].milli_value(), 2010);
    }

    #[test]
    fn resources_are_checked_pods_first_in_the_kubelet_words() {
        let n = node("1", "1Gi", "2");
        let running = pod_with(vec![ctr("a", "600m", "")]);
        let r = fit(&pod_with(vec![ctr("b", "500m", "")]), &[&running], &n).unwrap();
        assert_eq!(r.reason, "OutOfcpu");
        assert_eq!(
            r.message,
            "Node didn't have enough resource: cpu, requested: 500, used: 600, capacity: 1000"
        );
        assert!(fit(&pod_with(vec![ctr("b", "400m", "")]), &[&running], &n).is_none());
        // Hostile sizes never overflow into a fit.
        let huge = pod_with(vec![ctr("h", "1e40", ""), ctr("i", "1e40", "")]);
        assert_eq!(fit(&huge, &[&huge], &n).unwrap().reason, "OutOfcpu");
        let r = fit(&pod_with(vec![ctr("b", "", "2Gi")]), &[], &n).unwrap();
        assert_eq!(r.reason, "OutOfmemory");
        assert!(
            r.message
                .ends_with("requested: 2147483648, used: 0, capacity: 1073741824")
        );
        // A BestEffort pod still counts against maxPods.
        let r = fit(&pod_with(vec![]), &[&running, &running], &n).unwrap();
        assert_eq!(r.reason, "OutOfpods");
        assert_eq!(
            r.message,
            "Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2"
        );
        // Extended resources the node does not list are not checked; listed ones are.
        let mut gpu = pod_with(vec![ctr("g", "", "")]);
        gpu.spec.as_mut().unwrap().containers[0]
            .resources
            .as_mut()
            .unwrap()
            .requests
            .as_mut()
            .unwrap()
            .insert("example.com/gpu".into(), q("1"));
        assert!(fit(&gpu, &[], &n).is_none());
        let mut with_gpu = n.clone();
        with_gpu
            .allocatable
            .insert("example.com/gpu".into(), q("0"));
        assert_eq!(
            fit(&gpu, &[], &with_gpu).unwrap().reason,
            "OutOfexample.com/gpu"
        );
    }

    #[test]
    fn node_selector_affinity_ports_and_taints() {
        let n = node("1", "1Gi", "110");
        let mut p = pod_with(vec![ctr("a", "", "")]);
        p.spec.as_mut().unwrap().node_selector =
            Some(BTreeMap::from([("disk".to_string(), "hdd".to_string())]));
        let r = fit(&p, &[], &n).unwrap();
        assert_eq!(r.reason, "NodeAffinity");
        assert_eq!(
            r.message,
            "Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
        );
        p.spec.as_mut().unwrap().node_selector = None;
        let term = |op: &str, values: &[&str]| NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: "disk".into(),
                operator: op.into(),
                values: Some(values.iter().map(|s| (*s).to_string()).collect()),
            }]),
            ..Default::default()
        };
        let affinity = |terms: Vec<NodeSelectorTerm>| Affinity {
            node_affinity: Some(NodeAffinity {
                required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                    node_selector_terms: terms,
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        p.spec.as_mut().unwrap().affinity = Some(affinity(vec![term("NotIn", &["ssd"])]));
        assert_eq!(fit(&p, &[], &n).unwrap().reason, "NodeAffinity");
        p.spec.as_mut().unwrap().affinity = Some(affinity(vec![
            term("NotIn", &["ssd"]),
            term("In", &["ssd", "nvme"]),
        ]));
        assert!(fit(&p, &[], &n).is_none());
        p.spec.as_mut().unwrap().affinity = Some(affinity(vec![NodeSelectorTerm::default()]));
        assert_eq!(
            fit(&p, &[], &n).unwrap().reason,
            "NodeAffinity",
            "an empty term"
        );

        // Host ports: the same port and protocol on 0.0.0.0 conflicts.
        let port = |ip: &str, port: i32, proto: &str| {
            let mut p = pod_with(vec![ctr("a", "", "")]);
            p.spec.as_mut().unwrap().containers[0].ports = Some(vec![ContainerPort {
                container_port: 80,
                host_port: Some(port),
                host_ip: Some(ip.into()),
                protocol: Some(proto.into()),
                ..Default::default()
            }]);
            p
        };
        let web = port("", 8080, "");
        assert_eq!(
            fit(&port("10.0.0.1", 8080, "TCP"), &[&web], &n)
                .unwrap()
                .reason,
            "NodePorts"
        );
        assert!(fit(&port("10.0.0.1", 8080, "UDP"), &[&web], &n).is_none());
        assert!(fit(&port("", 8081, ""), &[&web], &n).is_none());
        let one = port("10.0.0.1", 9090, "TCP");
        assert!(fit(&port("10.0.0.2", 9090, "TCP"), &[&one], &n).is_none());

        // Only NoExecute taints count.
        let mut tainted = n.clone();
        tainted.taints = vec![
            Taint {
                key: "maint".into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            },
            Taint {
                key: "gone".into(),
                value: Some("yes".into()),
                effect: "NoExecute".into(),
                ..Default::default()
            },
        ];
        let plain = pod_with(vec![ctr("a", "", "")]);
        let r = fit(&plain, &[], &tainted).unwrap();
        assert_eq!(r.reason, "TaintToleration");
        let mut tolerant = plain.clone();
        tolerant.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
            key: Some("gone".into()),
            value: Some("yes".into()),
            ..Default::default()
        }]);
        assert!(fit(&tolerant, &[], &tainted).is_none());
        tolerant.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
            operator: Some("Exists".into()),
            ..Default::default()
        }]);
        assert!(fit(&tolerant, &[], &tainted).is_none());
    }
}
