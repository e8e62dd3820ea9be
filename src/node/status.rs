//! The Node object's content: labels, capacity and allocatable, addresses,
//! nodeInfo, conditions and daemon endpoints, as the kubelet's node status
//! setters (pkg/kubelet/nodestatus/setters.go). Pure: facts and time in, Node out.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerImage, DaemonEndpoint, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints,
    NodeRuntimeHandler, NodeRuntimeHandlerFeatures, NodeSpec, NodeStatus, NodeSystemInfo,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use super::info::{MachineInfo, go_arch};
use crate::config::{Reservations, Threshold};
use crate::device_manager::DeviceResources;
use crate::eviction::Pressure;
use crate::reasons::node::{DISK_PRESSURE, MEMORY_PRESSURE, PID_PRESSURE, READY, reason};

/// What the runtime says about itself (CRI `Version` and `Status`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuntimeFacts {
    /// `containerd://2.4.2`.
    pub version: String,
    /// RuntimeReady condition: None when ready, else the reason and message.
    pub runtime_not_ready: Option<String>,
    /// NetworkReady condition: None when ready, else the reason and message.
    pub network_not_ready: Option<String>,
    /// The node's images as `status.images` lists them ([`node_images`]);
    /// None keeps the list the Node has.
    pub images: Option<Vec<ContainerImage>>,
    /// The runtime's handlers as `status.runtimeHandlers` lists them
    /// ([`runtime_handlers`]); None keeps the list the Node has.
    pub runtime_handlers: Option<Vec<NodeRuntimeHandler>>,
    /// The node shutdown manager's: a shutdown is under way (Ready false,
    /// as the kubelet's `ShutdownStatus` in its `ReadyCondition`).
    pub shutting_down: bool,
}

/// The most runtime handlers the Node lists ([`runtime_handlers`]).
pub const MAX_RUNTIME_HANDLERS: usize = 100;

/// The runtime's handlers (CRI `StatusResponse.runtime_handlers`) as the
/// Node's `status.runtimeHandlers`, in the runtime's order, each with its
/// recursive read-only mounts and user namespaces support (the kubelet's
/// `RuntimeHandlers` setter, with `toKubeRuntimeStatus`): how the control
/// plane and tests learn what the node's runtime can do. Unlike the
/// kubelet's, the list keeps only handlers a RuntimeClass can name (the
/// default, `""`, and DNS labels, as `RuntimeClass.handler` is validated),
/// each once, and at most [`MAX_RUNTIME_HANDLERS`] of them, so that a
/// misconfigured runtime cannot bloat the Node object past what the API
/// server stores.
#[must_use]
pub fn runtime_handlers(handlers: &[k8s_cri::v1::RuntimeHandler]) -> Vec<NodeRuntimeHandler> {
    let mut seen = std::collections::BTreeSet::new();
    handlers
        .iter()
        .filter(|h| h.name.is_empty() || crate::names::is_dns1123_label(&h.name))
        .filter(|h| seen.insert(h.name.as_str()))
        .take(MAX_RUNTIME_HANDLERS)
        .map(|h| {
            let (rro, userns) = h.features.as_ref().map_or((false, false), |f| {
                (f.recursive_read_only_mounts, f.user_namespaces)
            });
            NodeRuntimeHandler {
                name: Some(h.name.clone()),
                features: Some(NodeRuntimeHandlerFeatures {
                    recursive_read_only_mounts: Some(rro),
                    user_namespaces: Some(userns),
                }),
            }
        })
        .collect()
}

/// The node declared features (`status.declaredFeatures`, KEP-5328) this
/// agent reports, sorted: those the kubelet 1.37 declares by default
/// (component-helpers' `nodedeclaredfeatures` registry, with its default
/// feature gates), as rustlet does each: the API server proxies WebSocket
/// streams to it (`ExtendWebSocketsToKubelet`), it resizes pod-level
/// resources and init containers in place
/// (`InPlacePodLevelResourcesVerticalScaling`,
/// `InPlacePodVerticalScalingInitContainers`), and restarts all of a pod's
/// containers in place on a `RestartAllContainers` rule
/// (`RestartAllContainersOnContainerExits`).
pub const DECLARED_FEATURES: &[&str] = &[
    "ExtendWebSocketsToKubelet",
    "InPlacePodLevelResourcesVerticalScaling",
    "InPlacePodVerticalScalingInitContainers",
    "RestartAllContainersOnContainerExits",
];

/// The features the Node declares: [`DECLARED_FEATURES`] but those whose
/// gate is off.
fn declared_features(cfg: &NodeConfig) -> Vec<String> {
    DECLARED_FEATURES
        .iter()
        .filter(|f| {
            !(cfg.pod_level_resize_disabled && **f == "InPlacePodLevelResourcesVerticalScaling")
        })
        .map(|f| (*f).to_string())
        .collect()
}

/// The most names an image has in `status.images`
/// (`MaxNamesPerImageInNodeStatus`).
pub const MAX_NAMES_PER_IMAGE: usize = 5;

/// The images of `status.images`, as the kubelet's `Images` setter: largest
/// first (ties by image ID, descending), at most `max` of them
/// (`nodeStatusMaxImages`, 50; negative: all), each with its repo digests
/// then its repo tags, at most five names, and its size in bytes.
#[must_use]
pub fn node_images(list: &[k8s_cri::v1::Image], max: i32) -> Vec<ContainerImage> {
    let mut sorted: Vec<&k8s_cri::v1::Image> = list.iter().collect();
    sorted.sort_by(|a, b| b.size.cmp(&a.size).then_with(|| b.id.cmp(&a.id)));
    let keep = usize::try_from(max).unwrap_or(usize::MAX);
    sorted
        .into_iter()
        .take(keep)
        .map(|i| ContainerImage {
            names: Some(
                i.repo_digests
                    .iter()
                    .chain(i.repo_tags.iter())
                    .take(MAX_NAMES_PER_IMAGE)
                    .cloned()
                    .collect(),
            ),
            size_bytes: i64::try_from(i.size).ok(),
        })
        .collect()
}

/// The node's configuration that shapes its object.
#[derive(Clone, Debug, Default)]
pub struct NodeConfig {
    /// Node name.
    pub name: String,
    /// Node IPs (InternalIP addresses).
    pub ips: Vec<String>,
    /// Hostname (the Hostname address and the hostname label).
    pub hostname: String,
    /// Maximum pods (`maxPods`, 110).
    pub max_pods: u32,
    /// Port of the node's API (`daemonEndpoints.kubeletEndpoint`, 10250).
    pub port: i32,
    /// The version reported as `kubeletVersion`.
    pub version: String,
    /// What allocatable holds back (`kubeReserved`, `systemReserved`,
    /// `evictionHard`).
    pub reserved: Reservations,
    /// `nodeStatusMaxImages` (50; -1: all): how many images
    /// `status.images` lists.
    pub max_images: i32,
    /// `--node-labels`: labels beside the standard ones.
    pub extra_labels: BTreeMap<String, String>,
    /// `registerWithTaints`: the taints the Node is created with (an
    /// existing Node keeps its own, as the kubelet only sets them at
    /// registration).
    pub taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// The `InPlacePodLevelResourcesVerticalScaling` gate is off: the
    /// feature is not declared.
    pub pod_level_resize_disabled: bool,
}

/// The labels of the node: those of `--node-labels`, then the standard ones
/// (kubernetes.io/hostname, os, arch), which win.
#[must_use]
pub fn labels(cfg: &NodeConfig) -> BTreeMap<String, String> {
    let mut labels = cfg.extra_labels.clone();
    labels.extend([
        ("kubernetes.io/hostname".to_string(), cfg.hostname.clone()),
        ("kubernetes.io/os".to_string(), "linux".to_string()),
        ("kubernetes.io/arch".to_string(), go_arch().to_string()),
        ("beta.kubernetes.io/os".to_string(), "linux".to_string()),
        ("beta.kubernetes.io/arch".to_string(), go_arch().to_string()),
    ]);
    labels
}

/// Capacity and allocatable, as the kubelet's `MachineInfo` setter with
/// `GetNodeAllocatable`: capacity is the machine's cpus, memory and
/// ephemeral storage in KiB, each huge page pool as `hugepages-<size>` in
/// bytes, and `maxPods`; allocatable is capacity less [`reservation`], less
/// the huge page pools for memory, never below zero (cpu in millicores when
/// not whole, memory in KiB, the rest in units).
#[must_use]
pub fn resources(
    m: &MachineInfo,
    max_pods: u32,
    reserved: &Reservations,
) -> (BTreeMap<String, Quantity>, BTreeMap<String, Quantity>) {
    let q = |s: String| Quantity(s);
    let mut capacity = BTreeMap::from([
        ("cpu".to_string(), q(m.cpus.to_string())),
        (
            "memory".to_string(),
            q(format!("{}Ki", m.memory_bytes / 1024)),
        ),
        (
            "ephemeral-storage".to_string(),
            q(format!("{}Ki", m.ephemeral_storage_bytes / 1024)),
        ),
        ("pods".to_string(), q(max_pods.to_string())),
    ]);
    let huge: Vec<(String, u64)> = m
        .huge_pages
        .iter()
        .map(|(kib, pages)| {
            (
                format!(
                    "hugepages-{}",
                    crate::config::binary_quantity(kib.saturating_mul(1024))
                ),
                kib.saturating_mul(1024).saturating_mul(*pages),
            )
        })
        .collect();
    let huge_bytes = huge.iter().fold(0u64, |sum, (_, b)| sum.saturating_add(*b));
    for (name, bytes) in &huge {
        capacity.insert(name.clone(), q(bytes.to_string()));
    }
    let held = reservation(m, reserved);
    let units = |v: u64| Exact::from_units(i64::try_from(v).unwrap_or(i64::MAX));
    let mut allocatable = BTreeMap::new();
    for (name, cap) in capacity_values(m, max_pods, &huge) {
        let mut v = cap.saturating_sub(held.get(&name).copied().unwrap_or_default());
        if name == "memory" {
            v = v.saturating_sub(units(huge_bytes));
        }
        let v = v.max(Exact::default());
        let text = match name.as_str() {
            "cpu" => {
                let milli = v.milli_value();
                if milli % 1000 == 0 {
                    (milli / 1000).to_string()
                } else {
                    format!("{milli}m")
                }
            }
            "memory" if v.value() % 1024 == 0 => format!("{}Ki", v.value() / 1024),
            _ => v.value().to_string(),
        };
        allocatable.insert(name, q(text));
    }
    (capacity, allocatable)
}

type Exact = crate::resource::Quantity;

/// Capacity as exact quantities, by resource name.
fn capacity_values(m: &MachineInfo, max_pods: u32, huge: &[(String, u64)]) -> Vec<(String, Exact)> {
    let units = |v: u64| Exact::from_units(i64::try_from(v).unwrap_or(i64::MAX));
    let mut out = vec![
        ("cpu".to_string(), units(m.cpus)),
        ("memory".to_string(), units(m.memory_bytes / 1024 * 1024)),
        (
            "ephemeral-storage".to_string(),
            units(m.ephemeral_storage_bytes / 1024 * 1024),
        ),
        ("pods".to_string(), units(u64::from(max_pods))),
    ];
    out.extend(huge.iter().map(|(n, b)| (n.clone(), units(*b))));
    out
}

/// What allocatable holds back of each resource, as the kubelet's
/// `GetNodeAllocatableReservation`: `systemReserved` + `kubeReserved`, plus
/// the hard eviction threshold of `memory.available` for memory and of
/// `nodefs.available` for ephemeral storage (a percentage is of capacity).
/// Quantities that do not parse count as none (the configuration was
/// checked when read).
#[must_use]
pub fn reservation(m: &MachineInfo, reserved: &Reservations) -> BTreeMap<String, Exact> {
    let mut held: BTreeMap<String, Exact> = BTreeMap::new();
    for list in [&reserved.kube_reserved, &reserved.system_reserved] {
        for (name, text) in list {
            if let Ok(v) = Exact::parse(text) {
                let sum = held
                    .get(name)
                    .copied()
                    .unwrap_or_default()
                    .saturating_add(v);
                held.insert(name.clone(), sum);
            }
        }
    }
    let hard = [
        ("memory.available", "memory", m.memory_bytes),
        (
            "nodefs.available",
            "ephemeral-storage",
            m.ephemeral_storage_bytes,
        ),
    ];
    for (signal, resource, capacity) in hard {
        let amount = match reserved
            .eviction_hard
            .get(signal)
            .map(|t| Threshold::parse(t))
        {
            Some(Ok(Threshold::Quantity(v))) => v,
            Some(Ok(t)) if t.is_off() => continue,
            Some(Ok(Threshold::Percent(p))) => {
                let capacity = i128::from(capacity);
                let bytes = Threshold::share_of(capacity, p).clamp(0, i128::from(i64::MAX));
                Exact::from_units(i64::try_from(bytes).unwrap_or(i64::MAX))
            }
            _ => continue,
        };
        let sum = held
            .get(resource)
            .copied()
            .unwrap_or_default()
            .saturating_add(amount);
        held.insert(resource.to_string(), sum);
    }
    held
}

/// Checks that no resource reserves more than the machine has, as the
/// kubelet's `validateNodeAllocatable`.
///
/// # Errors
/// The kubelet's message: `invalid Node Allocatable configuration. Resource
/// "<name>" has a reservation of <amount> but capacity of <amount>. Expected
/// capacity >= reservation.`
pub fn check_reservations(
    m: &MachineInfo,
    max_pods: u32,
    reserved: &Reservations,
) -> Result<(), String> {
    let held = reservation(m, reserved);
    for (name, cap) in capacity_values(m, max_pods, &[]) {
        let Some(&r) = held.get(&name) else { continue };
        if r > cap {
            let show = |v: Exact| {
                if name == "cpu" {
                    format!("{}m", v.milli_value())
                } else {
                    v.value().to_string()
                }
            };
            return Err(format!(
                "invalid Node Allocatable configuration. Resource \"{name}\" has a reservation of {} but capacity of {}. Expected capacity >= reservation.",
                show(r),
                show(cap)
            ));
        }
    }
    Ok(())
}

use crate::resource::is_extended_resource;

/// Adds to rustlet's own `capacity` and `allocatable` the resources other
/// writers put on the Node (`old`): extended resources advertised by a cluster
/// administrator or left by a device plugin stay, with allocatable equal to
/// capacity, as the kubelet's `MachineInfo` setter, which edits the stored
/// Node rather than replacing its maps. Huge page sizes the machine no longer
/// has are dropped, as `reconcileHugePageResource`, and so are extended
/// resources left in allocatable without a capacity.
fn keep_others(
    capacity: &mut BTreeMap<String, Quantity>,
    allocatable: &mut BTreeMap<String, Quantity>,
    old: Option<&NodeStatus>,
) {
    let Some(old) = old else { return };
    let own: Vec<String> = capacity.keys().cloned().collect();
    let foreign = |k: &String| !own.contains(k) && !k.starts_with("hugepages-");
    for (k, v) in old.capacity.iter().flatten() {
        if foreign(k) {
            capacity.insert(k.clone(), v.clone());
            allocatable.insert(k.clone(), v.clone());
        }
    }
    for (k, v) in old.allocatable.iter().flatten() {
        if foreign(k) && !capacity.contains_key(k) && !is_extended_resource(k) {
            allocatable.insert(k.clone(), v.clone());
        }
    }
}

/// Sets every extended resource of `status` to zero in capacity and
/// allocatable: at start on an existing Node, until a device plugin
/// advertises it again, as the kubelet's `reconcileExtendedResource` when its
/// device manager has no checkpoint (rustlet's keeps none).
pub fn zero_extended_resources(status: &mut NodeStatus) {
    for map in [status.capacity.as_mut(), status.allocatable.as_mut()]
        .into_iter()
        .flatten()
    {
        for (k, v) in map.iter_mut() {
            if is_extended_resource(k) {
                *v = Quantity("0".into());
            }
        }
    }
}

/// Writes the device plugins' resources into `status`, as the kubelet's
/// `MachineInfo` setter with its device manager's `GetCapacity`: each
/// resource's devices as capacity and its healthy devices as allocatable, and
/// zero for each resource dropped since (its plugin gone for good).
pub fn set_device_resources(status: &mut NodeStatus, devices: &DeviceResources) {
    let zero = || Quantity("0".into());
    let capacity = status.capacity.get_or_insert_with(BTreeMap::new);
    for (k, v) in &devices.capacity {
        capacity.insert(k.clone(), Quantity(v.to_string()));
    }
    for k in &devices.removed {
        capacity.insert(k.clone(), zero());
    }
    let allocatable = status.allocatable.get_or_insert_with(BTreeMap::new);
    for (k, v) in &devices.allocatable {
        allocatable.insert(k.clone(), Quantity(v.to_string()));
    }
    for k in &devices.removed {
        allocatable.insert(k.clone(), zero());
    }
}

/// Sets `status.volumesInUse` to `in_use` (the attached CSI volumes pods
/// use, [`crate::volume::csi::in_use`]), as the kubelet's `VolumesInUse`
/// setter: an empty list where `old` had some (so the patch clears
/// it), else none while empty.
pub fn set_volumes_in_use(new: &mut NodeStatus, old: Option<&NodeStatus>, in_use: Vec<String>) {
    let had = old
        .and_then(|o| o.volumes_in_use.as_ref())
        .is_some_and(|v| !v.is_empty());
    new.volumes_in_use = (had || !in_use.is_empty()).then_some(in_use);
}

/// The condition types this agent writes; every other condition of the
/// Node (node-problem-detector's `KernelDeadlock`, a cloud's
/// `NetworkUnavailable`) belongs to another writer and is never sent.
pub const OWN_CONDITIONS: [&str; 4] = [MEMORY_PRESSURE, DISK_PRESSURE, PID_PRESSURE, READY];

/// The strategic merge patch that writes `new` over the stored `old`, as
/// the kubelet's `PatchNodeStatus`: `{"status": ...}` holding `new` with
/// - `conditions` only of the [`OWN_CONDITIONS`] types: the API server
///   merges them by `type`, so conditions of other writers stay as they are,
///   even when written between the agent's read and its patch;
/// - `addresses` with a `{"$patch": "replace"}` element, as the kubelet's
///   `fixupPatchForNodeStatusAddresses` (the list's merge key, `type`, is not
///   unique: two InternalIPs);
/// - `null` for each capacity and allocatable entry of `old` that `new`
///   drops (maps merge key by key).
///
/// # Errors
/// `new` does not serialize (never for a status built by [`status`]).
pub fn status_patch(
    old: Option<&NodeStatus>,
    new: &NodeStatus,
) -> Result<serde_json::Value, serde_json::Error> {
    let mut own = new.clone();
    if let Some(cs) = own.conditions.as_mut() {
        cs.retain(|c| OWN_CONDITIONS.contains(&c.type_.as_str()));
    }
    let mut status = serde_json::to_value(&own)?;
    let Some(obj) = status.as_object_mut() else {
        return Ok(serde_json::json!({ "status": status }));
    };
    if let Some(serde_json::Value::Array(addresses)) = obj.get_mut("addresses") {
        addresses.push(serde_json::json!({ "$patch": "replace" }));
    }
    if let Some(old) = old {
        for (field, was, now) in [
            ("capacity", &old.capacity, &new.capacity),
            ("allocatable", &old.allocatable, &new.allocatable),
        ] {
            let gone: Vec<&String> = was
                .iter()
                .flatten()
                .map(|(k, _)| k)
                .filter(|k| !now.as_ref().is_some_and(|m| m.contains_key(*k)))
                .collect();
            if gone.is_empty() {
                continue;
            }
            let map = obj
                .entry(field)
                .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
            if let Some(map) = map.as_object_mut() {
                for k in gone {
                    map.insert(k.clone(), serde_json::Value::Null);
                }
            }
        }
    }
    Ok(serde_json::json!({ "status": status }))
}

/// The conditions of the new status: `old`'s list in its order, each of
/// the [`OWN_CONDITIONS`] replaced by its entry in `own` and the others
/// (other writers') kept as they were, then those of `own` that `old`
/// lacks; as the kubelet's setters update the Node it read.
fn merge_conditions(old: Option<&NodeStatus>, own: Vec<NodeCondition>) -> Vec<NodeCondition> {
    let mut own: Vec<Option<NodeCondition>> = own.into_iter().map(Some).collect();
    let mut merged = Vec::with_capacity(own.len());
    for c in old
        .and_then(|o| o.conditions.as_deref())
        .unwrap_or_default()
    {
        match own
            .iter_mut()
            .find(|o| o.as_ref().is_some_and(|o| o.type_ == c.type_))
        {
            Some(slot) => merged.extend(slot.take()),
            None if OWN_CONDITIONS.contains(&c.type_.as_str()) => {}
            None => merged.push(c.clone()),
        }
    }
    merged.extend(own.into_iter().flatten());
    merged
}

fn condition(
    type_: &str,
    ok: bool,
    reasons: (&str, &str),
    messages: (&str, String),
    old: Option<&NodeStatus>,
    now: Timestamp,
) -> NodeCondition {
    // For pressure conditions "ok" means status False.
    let status = if type_ == READY { ok } else { !ok };
    let status = if status { "True" } else { "False" };
    let previous = old
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_));
    let last_transition_time = match previous {
        Some(p) if p.status == status => p.last_transition_time.clone(),
        _ => Some(Time(now)),
    };
    NodeCondition {
        type_: type_.into(),
        status: status.into(),
        reason: Some(if ok { reasons.0 } else { reasons.1 }.into()),
        message: Some(if ok {
            messages.0.to_string()
        } else {
            messages.1
        }),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time,
    }
}

/// The node's status at `now`, keeping the transition times of `old`'s
/// conditions, the conditions of other writers (untouched) and the
/// resources other writers added to its capacity.
/// Conditions and reasons as the kubelet's `MemoryPressureCondition`,
/// `DiskPressureCondition`, `PIDPressureCondition` and `ReadyCondition`;
/// `pressures` are the eviction manager's.
#[must_use]
pub fn status(
    cfg: &NodeConfig,
    m: &MachineInfo,
    rt: &RuntimeFacts,
    old: Option<&NodeStatus>,
    now: Timestamp,
    pressures: &[Pressure],
) -> NodeStatus {
    let (mut capacity, mut allocatable) = resources(m, cfg.max_pods, &cfg.reserved);
    keep_others(&mut capacity, &mut allocatable, old);
    let mut problems = Vec::new();
    if let Some(r) = &rt.runtime_not_ready {
        problems.push(format!(
            "container runtime status check may not have completed yet: {r}"
        ));
    }
    if let Some(n) = &rt.network_not_ready {
        problems.push(format!("container runtime network not ready: {n}"));
    }
    if rt.shutting_down {
        problems.push("node is shutting down".to_string());
    }
    let ready = problems.is_empty();
    let mut addresses: Vec<NodeAddress> = cfg
        .ips
        .iter()
        .map(|ip| NodeAddress {
            type_: "InternalIP".into(),
            address: ip.clone(),
        })
        .collect();
    addresses.push(NodeAddress {
        type_: "Hostname".into(),
        address: cfg.hostname.clone(),
    });
    NodeStatus {
        capacity: Some(capacity),
        allocatable: Some(allocatable),
        addresses: Some(addresses),
        conditions: Some(merge_conditions(
            old,
            vec![
                condition(
                    MEMORY_PRESSURE,
                    !pressures.contains(&Pressure::Memory),
                    (
                        reason::KUBELET_HAS_SUFFICIENT_MEMORY,
                        reason::KUBELET_HAS_INSUFFICIENT_MEMORY,
                    ),
                    (
                        "kubelet has sufficient memory available",
                        "kubelet has insufficient memory available".into(),
                    ),
                    old,
                    now,
                ),
                condition(
                    DISK_PRESSURE,
                    !pressures.contains(&Pressure::Disk),
                    (
                        reason::KUBELET_HAS_NO_DISK_PRESSURE,
                        reason::KUBELET_HAS_DISK_PRESSURE,
                    ),
                    (
                        "kubelet has no disk pressure",
                        "kubelet has disk pressure".into(),
                    ),
                    old,
                    now,
                ),
                condition(
                    PID_PRESSURE,
                    !pressures.contains(&Pressure::Pid),
                    (
                        reason::KUBELET_HAS_SUFFICIENT_PID,
                        reason::KUBELET_HAS_INSUFFICIENT_PID,
                    ),
                    (
                        "kubelet has sufficient PID available",
                        "kubelet has insufficient PID available".into(),
                    ),
                    old,
                    now,
                ),
                condition(
                    READY,
                    ready,
                    (reason::KUBELET_READY, reason::KUBELET_NOT_READY),
                    ("kubelet is posting ready status", problems.join(", ")),
                    old,
                    now,
                ),
            ],
        )),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint { port: cfg.port }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: go_arch().into(),
            boot_id: m.boot_id.clone(),
            container_runtime_version: rt.version.clone(),
            kernel_version: m.kernel_version.clone(),
            kube_proxy_version: String::new(),
            kubelet_version: cfg.version.clone(),
            machine_id: m.machine_id.clone(),
            operating_system: "linux".into(),
            os_image: m.os_image.clone(),
            system_uuid: m.system_uuid.clone(),
            swap: None,
            running_in_user_namespace: Some(m.in_user_namespace),
        }),
        images: rt
            .images
            .clone()
            .or_else(|| old.and_then(|o| o.images.clone())),
        runtime_handlers: rt
            .runtime_handlers
            .clone()
            .or_else(|| old.and_then(|o| o.runtime_handlers.clone())),
        declared_features: Some(declared_features(cfg)),
        ..Default::default()
    }
}

/// The Node object registered for `cfg` (labels, status); as `initialNode`.
#[must_use]
pub fn initial_node(cfg: &NodeConfig, status: NodeStatus) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(cfg.name.clone()),
            labels: Some(labels(cfg)),
            annotations: Some(BTreeMap::from([(
                "volumes.kubernetes.io/controller-managed-attach-detach".to_string(),
                "true".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!cfg.taints.is_empty()).then(|| cfg.taints.clone()),
            ..NodeSpec::default()
        }),
        status: Some(status),
    }
}

/// The pod CIDRs the control plane gave `node` (`spec.podCIDRs`, else
/// `spec.podCIDR`), comma separated, as the kubelet joins them for the
/// runtime (`tryUpdateNodeStatus`); `None` while it has none.
#[must_use]
pub fn pod_cidr(node: &Node) -> Option<String> {
    let spec = node.spec.as_ref()?;
    let cidrs = match spec.pod_cidrs.as_deref() {
        Some(list) if !list.is_empty() => list.join(","),
        _ => spec.pod_cidr.clone().unwrap_or_default(),
    };
    (!cidrs.is_empty()).then_some(cidrs)
}

/// True when `new` differs from `old` in anything rustlet reports other than
/// heartbeat times: the node status must be patched now rather than at the
/// next report period (`nodeStatusReportFrequency`). Only the fields `status`
/// sets are compared (others belong to other writers), and quantities by
/// value, since the API server returns them in canonical form (`24Gi` for
/// `25165824Ki`).
#[must_use]
pub fn changed(old: Option<&NodeStatus>, new: &NodeStatus) -> bool {
    let Some(old) = old else { return true };
    let heartbeats = |s: &NodeStatus| {
        let mut cs = s.conditions.clone().unwrap_or_default();
        for c in &mut cs {
            c.last_heartbeat_time = None;
        }
        cs
    };
    heartbeats(old) != heartbeats(new)
        || !same_quantities(old.capacity.as_ref(), new.capacity.as_ref())
        || !same_quantities(old.allocatable.as_ref(), new.allocatable.as_ref())
        || old.addresses != new.addresses
        || old.daemon_endpoints != new.daemon_endpoints
        || !same_images(old.images.as_deref(), new.images.as_deref())
        || old.declared_features != new.declared_features
        || old.volumes_in_use.as_deref().unwrap_or_default()
            != new.volumes_in_use.as_deref().unwrap_or_default()
        || old.node_info.as_ref().map(|i| NodeSystemInfo {
            swap: None,
            ..i.clone()
        }) != new.node_info
}

/// True when both lists hold the same images, an image without names
/// (an untagged one: `names` sent as `[]`, read back absent) the same
/// either way, as the kubelet's `nodeStatusHasChanged` compares them
/// (semantic equality: an empty list is no list).
fn same_images(a: Option<&[ContainerImage]>, b: Option<&[ContainerImage]>) -> bool {
    let (a, b) = (a.unwrap_or_default(), b.unwrap_or_default());
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.size_bytes == y.size_bytes
                && x.names.as_deref().unwrap_or_default() == y.names.as_deref().unwrap_or_default()
        })
}

/// True when both maps hold the same resources with equal values.
fn same_quantities(
    a: Option<&BTreeMap<String, Quantity>>,
    b: Option<&BTreeMap<String, Quantity>>,
) -> bool {
    let value = |q: &Quantity| kube_quantity::ParsedQuantity::try_from(q).ok();
    let (a, b) = (
        a.cloned().unwrap_or_default(),
        b.cloned().unwrap_or_default(),
    );
    a.len() == b.len()
        && a.iter().all(|(k, qa)| {
            b.get(k)
                .is_some_and(|qb| qa == qb || value(qa).is_some_and(|va| value(qb) == Some(va)))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> MachineInfo {
        MachineInfo {
            cpus: 2,
            memory_bytes: 1024 * 1024 * 1024,
            ephemeral_storage_bytes: 1000 * 1024,
            ..Default::default()
        }
    }

    fn cfg() -> NodeConfig {
        NodeConfig {
            name: "n1".into(),
            ips: vec!["127.0.0.1".into()],
            hostname: "n1".into(),
            max_pods: 110,
            port: 10250,
            version: "v1.37.0".into(),
            ..Default::default()
        }
    }

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    #[test]
    fn canonical_quantities_and_other_writers_fields_are_no_change() {
        let ok = RuntimeFacts::default();
        let mine = status(&cfg(), &machine(), &ok, None, t(0), &[]);
        let mut stored = mine.clone();
        // As the API server returns it: quantities canonical, fields of others set.
        let cap = stored.capacity.as_mut().unwrap();
        cap.insert("memory".into(), Quantity("1Gi".into()));
        stored.volumes_attached = Some(vec![k8s_openapi::api::core::v1::AttachedVolume {
            name: "kubernetes.io/csi/x".into(),
            device_path: String::new(),
        }]);
        let again = status(&cfg(), &machine(), &ok, Some(&stored), t(10), &[]);
        assert!(!changed(Some(&stored), &again));
        stored
            .capacity
            .as_mut()
            .unwrap()
            .insert("memory".into(), Quantity("2Gi".into()));
        assert!(changed(Some(&stored), &again), "a real capacity change");
        assert!(changed(None, &again));
    }

    #[test]
    fn volumes_in_use_are_reported_and_cleared() {
        let ok = RuntimeFacts::default();
        let mut new = status(&cfg(), &machine(), &ok, None, t(0), &[]);
        set_volumes_in_use(&mut new, None, Vec::new());
        assert_eq!(new.volumes_in_use, None);
        let used = vec!["kubernetes.io/csi/d^h".to_string()];
        set_volumes_in_use(&mut new, None, used.clone());
        assert_eq!(new.volumes_in_use.as_ref(), Some(&used));
        let stored = new.clone();
        let mut again = status(&cfg(), &machine(), &ok, Some(&stored), t(10), &[]);
        set_volumes_in_use(&mut again, Some(&stored), Vec::new());
        assert_eq!(again.volumes_in_use, Some(Vec::new()), "cleared explicitly");
        assert!(changed(Some(&stored), &again));
        let patch = status_patch(Some(&stored), &again).unwrap();
        assert_eq!(patch["status"]["volumesInUse"], serde_json::json!([]));
    }

    /// node-problem-detector's conditions (and any other writer's) stay in
    /// the status in their place, are never sent, and are no change; the
    /// agent's own are merged by type; addresses replace the stored list.
    #[test]
    fn conditions_of_other_writers_are_kept_and_never_sent() {
        let ok = RuntimeFacts::default();
        let foreign = |status: &str| NodeCondition {
            type_: "KernelDeadlock".into(),
            status: status.into(),
            reason: Some("KernelHasNoDeadlock".into()),
            message: Some("kernel has no deadlock".into()),
            last_heartbeat_time: Some(Time(t(1))),
            last_transition_time: Some(Time(t(1))),
        };
        let mut stored = status(&cfg(), &machine(), &ok, None, t(0), &[]);
        let conditions = stored.conditions.get_or_insert_with(Vec::new);
        conditions.insert(1, foreign("False"));
        let again = status(&cfg(), &machine(), &ok, Some(&stored), t(10), &[]);
        let types = |s: &NodeStatus| -> Vec<String> {
            s.conditions
                .iter()
                .flatten()
                .map(|c| c.type_.clone())
                .collect()
        };
        assert_eq!(types(&again), types(&stored), "same list, same order");
        assert_eq!(again.conditions.as_ref().unwrap()[1], foreign("False"));
        assert!(!changed(Some(&stored), &again), "only heartbeats moved");

        let patch = status_patch(Some(&stored), &again).unwrap();
        let sent: Vec<&str> = patch["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["type"].as_str().unwrap())
            .collect();
        assert_eq!(sent, OWN_CONDITIONS, "only the agent's own conditions");
        let addresses = patch["status"]["addresses"].as_array().unwrap();
        assert_eq!(
            addresses.last(),
            Some(&serde_json::json!({ "$patch": "replace" }))
        );
        assert_eq!(addresses.len(), again.addresses.as_ref().unwrap().len() + 1);

        // A condition of the agent's type that a stale copy lacks comes back.
        let mut lost = stored.clone();
        lost.conditions
            .as_mut()
            .unwrap()
            .retain(|c| c.type_ != READY);
        let healed = status(&cfg(), &machine(), &ok, Some(&lost), t(20), &[]);
        assert_eq!(types(&healed).len(), 5);
        assert!(types(&healed).iter().any(|c| c == READY));
    }

    /// An untagged image is sent with `names: []` and read back without
    /// them: no change (else every status sync would patch an idle node).
    #[test]
    fn an_untagged_image_read_back_without_names_is_no_change() {
        let image = |names: Option<Vec<String>>, size| ContainerImage {
            names,
            size_bytes: Some(size),
        };
        let facts = RuntimeFacts {
            images: Some(vec![
                image(Some(vec!["busybox:1.37".into()]), 10),
                image(Some(vec![]), 20),
            ]),
            ..RuntimeFacts::default()
        };
        let sent = status(&cfg(), &machine(), &facts, None, t(0), &[]);
        let mut stored = sent.clone();
        stored.images = Some(vec![
            image(Some(vec!["busybox:1.37".into()]), 10),
            image(None, 20),
        ]);
        let again = status(&cfg(), &machine(), &facts, Some(&stored), t(10), &[]);
        assert!(!changed(Some(&stored), &again));
        // A real change still is one.
        stored.images = Some(vec![image(None, 20)]);
        assert!(changed(Some(&stored), &again));
        stored.images = Some(vec![
            image(Some(vec!["busybox:1.37".into()]), 10),
            image(None, 21),
        ]);
        assert!(changed(Some(&stored), &again));
    }

    #[test]
    fn the_declared_features_are_reported_sorted_and_a_change_is_sent() {
        let ok = RuntimeFacts::default();
        let mine = status(&cfg(), &machine(), &ok, None, t(0), &[]);
        let declared = mine.declared_features.clone().unwrap();
        assert!(
            declared
                .iter()
                .any(|f| f == "InPlacePodLevelResourcesVerticalScaling")
        );
        assert!(
            declared
                .iter()
                .any(|f| f == "RestartAllContainersOnContainerExits")
        );
        assert!(
            !declared.iter().any(|f| f == "VolumeBindMountOptions"),
            "its gate is off by default"
        );
        let mut sorted = declared.clone();
        sorted.sort();
        assert_eq!(declared, sorted);
        // With its gate off, pod-level resize is not declared.
        let off = NodeConfig {
            pod_level_resize_disabled: true,
            ..cfg()
        };
        let without = status(&off, &machine(), &ok, None, t(0), &[]);
        let without = without.declared_features.unwrap();
        assert_eq!(without.len(), declared.len() - 1);
        assert!(
            !without
                .iter()
                .any(|f| f == "InPlacePodLevelResourcesVerticalScaling")
        );
        // A Node that declared others (an earlier version) is updated.
        let mut stored = mine.clone();
        stored.declared_features = None;
        let again = status(&cfg(), &machine(), &ok, Some(&stored), t(10), &[]);
        assert!(changed(Some(&stored), &again));
        assert!(!changed(Some(&again), &again.clone()));
    }

    #[test]
    fn resources_of_other_writers_stay_and_vanished_huge_pages_go() {
        let ok = RuntimeFacts::default();
        let mut stored = status(&cfg(), &machine(), &ok, None, t(0), &[]);
        for map in [
            stored.capacity.as_mut().unwrap(),
            stored.allocatable.as_mut().unwrap(),
        ] {
            map.insert("example.com/dongle".into(), Quantity("4".into()));
        }
        let again = status(&cfg(), &machine(), &ok, Some(&stored), t(10), &[]);
        assert!(!changed(Some(&stored), &again), "{again:?}");
        assert_eq!(
            again.allocatable.as_ref().unwrap()["example.com/dongle"].0,
            "4"
        );
        let patch = status_patch(Some(&stored), &again).unwrap();
        assert_eq!(patch["status"]["capacity"]["example.com/dongle"], "4");

        // A huge page size the machine no longer has, and an extended
        // resource left in allocatable alone, are removed by the patch.
        stored
            .capacity
            .as_mut()
            .unwrap()
            .insert("hugepages-32Mi".into(), Quantity("0".into()));
        stored
            .allocatable
            .as_mut()
            .unwrap()
            .insert("example.com/gone".into(), Quantity("1".into()));
        let again = status(&cfg(), &machine(), &ok, Some(&stored), t(20), &[]);
        assert!(changed(Some(&stored), &again));
        let patch = status_patch(Some(&stored), &again).unwrap();
        assert!(patch["status"]["capacity"]["hugepages-32Mi"].is_null());
        assert!(
            patch["status"]["capacity"]
                .as_object()
                .unwrap()
                .contains_key("hugepages-32Mi")
        );
        assert!(patch["status"]["allocatable"]["example.com/gone"].is_null());
        assert_eq!(patch["status"]["capacity"]["cpu"], "2");
        assert!(
            status_patch(None, &again).unwrap()["status"]["capacity"]["hugepages-32Mi"].is_null()
        );
        assert!(
            !status_patch(None, &again).unwrap()["status"]["capacity"]
                .as_object()
                .unwrap()
                .contains_key("hugepages-32Mi")
        );
    }

    #[test]
    fn extended_resources_are_zeroed_native_ones_kept() {
        let mut s = status(
            &cfg(),
            &machine(),
            &RuntimeFacts::default(),
            None,
            t(0),
            &[],
        );
        for map in [
            s.capacity.as_mut().unwrap(),
            s.allocatable.as_mut().unwrap(),
        ] {
            map.insert("test.device/gpu".into(), Quantity("2".into()));
            map.insert("kubernetes.io/batch".into(), Quantity("3".into()));
        }
        zero_extended_resources(&mut s);
        for map in [s.capacity.unwrap(), s.allocatable.unwrap()] {
            assert_eq!(map["test.device/gpu"].0, "0");
            assert_eq!(map["kubernetes.io/batch"].0, "3");
            assert_eq!(map["cpu"].0, "2");
        }
        assert!(is_extended_resource("example.com/dongle"));
        assert!(!is_extended_resource("cpu"));
        assert!(!is_extended_resource("hugepages-2Mi"));
        assert!(!is_extended_resource("requests.example.com/x"));
    }

    #[test]
    fn runtime_handlers_carry_their_features() {
        use k8s_cri::v1 as cri;
        let handlers = [
            cri::RuntimeHandler {
                name: String::new(),
                features: Some(cri::RuntimeHandlerFeatures {
                    recursive_read_only_mounts: true,
                    user_namespaces: true,
                }),
            },
            cri::RuntimeHandler {
                name: "test-handler".into(),
                features: None,
            },
        ];
        let got = runtime_handlers(&handlers);
        assert_eq!(got.len(), 2);
        // A runtime's hostile list: names no RuntimeClass can select,
        // repeats, and more handlers than a Node should carry.
        let named = |name: String| cri::RuntimeHandler {
            name,
            features: None,
        };
        let mut hostile = vec![
            named("UPPER".into()),
            named("a/b".into()),
            named("x".repeat(64)),
            named("test-handler".into()),
        ];
        hostile.extend((0..100_000).map(|i| named(format!("h{}", i % 150))));
        let bounded = runtime_handlers(&hostile);
        assert_eq!(bounded.len(), MAX_RUNTIME_HANDLERS);
        let names: Vec<&str> = bounded.iter().filter_map(|h| h.name.as_deref()).collect();
        assert_eq!(names[..3], ["test-handler", "h0", "h1"]);
        assert_eq!(names.last(), Some(&"h98"));
        assert_eq!(got[0].name.as_deref(), Some(""));
        let f0 = got[0].features.as_ref().unwrap();
        assert_eq!(f0.recursive_read_only_mounts, Some(true));
        assert_eq!(f0.user_namespaces, Some(true));
        assert_eq!(got[1].name.as_deref(), Some("test-handler"));
        let f1 = got[1].features.as_ref().unwrap();
        assert_eq!(f1.recursive_read_only_mounts, Some(false));
        // Into the status, and kept from the Node when the runtime was not asked.
        let rt = RuntimeFacts {
            runtime_handlers: Some(got.clone()),
            ..RuntimeFacts::default()
        };
        let st = status(&cfg(), &machine(), &rt, None, Timestamp::now(), &[]);
        assert_eq!(st.runtime_handlers.as_ref(), Some(&got));
        let again = status(
            &cfg(),
            &machine(),
            &RuntimeFacts::default(),
            Some(&st),
            Timestamp::now(),
            &[],
        );
        assert_eq!(again.runtime_handlers.as_ref(), Some(&got));
    }

    #[test]
    fn device_plugin_resources_count_devices_and_healthy_ones_and_zero_the_dropped() {
        let mut st = NodeStatus {
            capacity: Some(BTreeMap::from([(
                "example.com/old".to_string(),
                Quantity("3".into()),
            )])),
            ..NodeStatus::default()
        };
        let devices = DeviceResources {
            capacity: BTreeMap::from([("example.com/gpu".to_string(), 4)]),
            allocatable: BTreeMap::from([("example.com/gpu".to_string(), 3)]),
            removed: ["example.com/old".to_string()].into(),
        };
        set_device_resources(&mut st, &devices);
        let cap = st.capacity.as_ref().unwrap();
        let alloc = st.allocatable.as_ref().unwrap();
        assert_eq!(cap["example.com/gpu"].0, "4");
        assert_eq!(alloc["example.com/gpu"].0, "3");
        assert_eq!(cap["example.com/old"].0, "0");
        assert_eq!(alloc["example.com/old"].0, "0");
    }

    #[test]
    fn huge_page_pools_are_resources_taken_from_memory() {
        let m = MachineInfo {
            huge_pages: vec![(2048, 10), (1_048_576, 0)],
            ..machine()
        };
        let (cap, alloc) = resources(&m, 110, &Reservations::default());
        assert_eq!(cap["hugepages-2Mi"].0, (20 * 1024 * 1024).to_string());
        assert_eq!(cap["hugepages-1Gi"].0, "0");
        assert_eq!(alloc["hugepages-2Mi"], cap["hugepages-2Mi"]);
        assert_eq!(
            alloc["memory"].0,
            format!("{}Ki", 1024 * 1024 - 100 * 1024 - 20 * 1024)
        );
    }

    #[test]
    fn allocatable_holds_back_kube_and_system_reserved_and_hard_eviction() {
        let reserved = Reservations {
            kube_reserved: BTreeMap::from([
                ("cpu".to_string(), "500m".to_string()),
                ("memory".to_string(), "100Mi".to_string()),
            ]),
            system_reserved: BTreeMap::from([("cpu".to_string(), "250m".to_string())]),
            eviction_hard: BTreeMap::from([
                ("memory.available".to_string(), "10%".to_string()),
                ("nodefs.available".to_string(), "1Ki".to_string()),
            ]),
        };
        let (cap, alloc) = resources(&machine(), 110, &reserved);
        assert_eq!(cap["cpu"].0, "2");
        assert_eq!(alloc["cpu"].0, "1250m");
        // 1Gi less 100Mi less 10% of 1Gi (107374184 bytes: the kubelet
        // keeps 10% as a float32 fraction).
        let mem = 1024 * 1024 * 1024 - 100 * 1024 * 1024 - 107_374_184;
        assert_eq!(alloc["memory"].0, mem.to_string());
        assert_eq!(
            alloc["ephemeral-storage"].0,
            (1000 * 1024 - 1024).to_string()
        );
        assert_eq!(alloc["pods"].0, "110");
        assert!(check_reservations(&machine(), 110, &reserved).is_ok());
        let greedy = Reservations {
            kube_reserved: BTreeMap::from([("cpu".to_string(), "3".to_string())]),
            ..Reservations::default()
        };
        assert_eq!(
            check_reservations(&machine(), 110, &greedy).unwrap_err(),
            "invalid Node Allocatable configuration. Resource \"cpu\" has a reservation of 3000m but capacity of 2000m. Expected capacity >= reservation."
        );
        // Never below zero.
        let (_, alloc) = resources(&machine(), 110, &greedy);
        assert_eq!(alloc["cpu"].0, "0");
    }

    #[test]
    fn images_are_listed_largest_first_digests_before_tags() {
        let image = |id: &str, size: u64, tags: &[&str], digests: &[&str]| k8s_cri::v1::Image {
            id: id.into(),
            size,
            repo_tags: tags.iter().map(|s| (*s).to_string()).collect(),
            repo_digests: digests.iter().map(|s| (*s).to_string()).collect(),
            ..Default::default()
        };
        let list = [
            image("sha256:a", 10, &["a:1"], &["a@sha256:1"]),
            image(
                "sha256:b",
                30,
                &["b:1", "b:2", "b:3", "b:4", "b:5"],
                &["b@sha256:2"],
            ),
            image("sha256:c", 10, &["c:1"], &[]),
        ];
        let got = node_images(&list, 50);
        let names: Vec<Vec<String>> = got.iter().map(|i| i.names.clone().unwrap()).collect();
        assert_eq!(names[0], ["b@sha256:2", "b:1", "b:2", "b:3", "b:4"]);
        assert_eq!(names[1], ["c:1"], "ties by ID, descending");
        assert_eq!(names[2], ["a@sha256:1", "a:1"]);
        assert_eq!(got[0].size_bytes, Some(30));
        assert_eq!(node_images(&list, 1).len(), 1);
        assert_eq!(node_images(&list, -1).len(), 3);
        assert!(node_images(&list, 0).is_empty());
    }

    #[test]
    fn allocatable_subtracts_hard_eviction() {
        let (cap, alloc) = resources(&machine(), 110, &Reservations::default());
        assert_eq!(cap["memory"].0, "1048576Ki");
        assert_eq!(alloc["memory"].0, format!("{}Ki", 1024 * 1024 - 100 * 1024));
        assert_eq!(cap["ephemeral-storage"].0, "1000Ki");
        assert_eq!(
            alloc["ephemeral-storage"].0,
            (1000 * 1024 - 1000 * 1024 / 10).to_string()
        );
        assert_eq!(alloc["pods"].0, "110");
    }

    #[test]
    fn ready_follows_runtime_and_keeps_transition_times() {
        let ok = RuntimeFacts {
            version: "containerd://2.4.2".into(),
            ..Default::default()
        };
        let s1 = status(&cfg(), &machine(), &ok, None, t(0), &[]);
        let ready = |s: &NodeStatus| {
            s.conditions
                .as_ref()
                .unwrap()
                .iter()
                .find(|c| c.type_ == "Ready")
                .cloned()
                .unwrap()
        };
        assert_eq!(ready(&s1).status, "True");
        assert_eq!(ready(&s1).reason.as_deref(), Some("KubeletReady"));
        let s2 = status(&cfg(), &machine(), &ok, Some(&s1), t(10), &[]);
        assert!(!changed(Some(&s1), &s2), "only heartbeats moved");
        assert_eq!(ready(&s2).last_transition_time, Some(Time(t(0))));
        let bad = RuntimeFacts {
            network_not_ready: Some("NetworkReady=false reason:NetworkPluginNotReady".into()),
            ..ok
        };
        let s3 = status(&cfg(), &machine(), &bad, Some(&s2), t(20), &[]);
        assert!(changed(Some(&s2), &s3));
        assert_eq!(ready(&s3).status, "False");
        assert_eq!(ready(&s3).reason.as_deref(), Some("KubeletNotReady"));
        assert!(ready(&s3).message.unwrap().contains("network not ready"));
        let down = RuntimeFacts {
            version: "containerd://2.4.2".into(),
            shutting_down: true,
            ..Default::default()
        };
        let s4 = status(&cfg(), &machine(), &down, Some(&s3), t(30), &[]);
        assert_eq!(ready(&s4).reason.as_deref(), Some("KubeletNotReady"));
        assert_eq!(ready(&s4).message.as_deref(), Some("node is shutting down"));
        let pressure = s3
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "MemoryPressure")
            .cloned()
            .unwrap();
        assert_eq!(
            (pressure.status.as_str(), pressure.reason.as_deref()),
            ("False", Some("KubeletHasSufficientMemory"))
        );
    }
}
