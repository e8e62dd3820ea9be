//! The device manager's bookkeeping, pure: each device plugin resource's
//! devices and their health, whether its plugin is still connected, and which
//! devices each container was given (the kubelet's `ManagerImpl`:
//! `healthyDevices`, `unhealthyDevices`, `endpoints` with their stop time,
//! `podDevices`). Time comes in as a parameter.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use base64::Engine as _;

use super::topology::{Picker, ResourceTopology};
use crate::topology_manager::NumaMask;
use prost::Message as _;

/// The most NUMA nodes kept for one device; the rest are ignored.
pub const MAX_NUMA_NODES: usize = 64;

/// How long the devices of a plugin that went away stay in the node's
/// capacity (as unhealthy) before the resource is dropped (the kubelet's
/// `endpointStopGracePeriod`).
pub const STOP_GRACE: Duration = Duration::from_secs(5 * 60);

/// The most resources tracked at once, and the most dropped resources
/// remembered (each is reported as zero on the Node); a plugin registering
/// more is refused.
pub const MAX_RESOURCES: usize = 256;

/// The most devices one plugin may advertise; the rest of a longer list is
/// ignored.
pub const MAX_DEVICES: usize = 4096;

/// The NUMA nodes a device sits on, as its plugin reported them (empty:
/// none reported).
pub type Topology = Vec<i64>;

/// One device as a plugin lists it (`v1beta1.Device`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Device {
    /// Its ID, unique for the plugin.
    pub id: String,
    /// True when the plugin reports it `Healthy`.
    pub healthy: bool,
    /// Its NUMA nodes.
    pub numa: Topology,
}

/// Devices by resource: resource name → (device ID, its NUMA nodes), both
/// sorted, as the pod resources API reads them.
pub type DevicesByResource = Vec<(String, Vec<(String, Topology)>)>;

/// What a plugin asked for at registration (`DevicePluginOptions`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Call `PreStartContainer` before each container with its devices starts.
    pub pre_start_required: bool,
    /// The plugin answers `GetPreferredAllocation`.
    pub preferred_allocation: bool,
}

/// One resource's plugin and devices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Resource {
    /// Device ID → healthy.
    devices: BTreeMap<String, bool>,
    /// Device ID → its NUMA nodes, for devices that have any.
    numa: BTreeMap<String, Topology>,
    /// When its plugin went away (None: connected).
    stopped_at: Option<Instant>,
    /// The registration its plugin made (a newer one replaces it).
    generation: u64,
    /// The plugin's options.
    options: Options,
}

/// What the Node reports of the device plugins' resources: devices
/// (capacity) and healthy devices (allocatable) per resource, and the
/// resources dropped since, each reported as zero (the kubelet's
/// `GetCapacity`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceResources {
    /// Resource name → devices.
    pub capacity: BTreeMap<String, u64>,
    /// Resource name → healthy devices.
    pub allocatable: BTreeMap<String, u64>,
    /// Resources whose plugin went away more than [`STOP_GRACE`] ago.
    pub removed: BTreeSet<String>,
}

/// The devices one container was given of one resource, and what the plugin
/// said the container needs to use them (`ContainerAllocateResponse`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Allocation {
    /// The device IDs, sorted.
    pub devices: Vec<String>,
    /// The plugin's answer for the container.
    pub response: crate::proto::deviceplugin::ContainerAllocateResponse,
    /// Device ID → the NUMA nodes it sat on when it was given (those with
    /// any), as the kubelet's pod devices keep them.
    pub numa: BTreeMap<String, Topology>,
}

/// The version of the checkpoint's format ([`State::checkpoint`]).
pub const CHECKPOINT_VERSION: u32 = 1;

/// The devices one container was given of one resource, as the checkpoint
/// keeps them (the kubelet's `PodDevicesEntry`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct CheckpointEntry {
    pod_uid: String,
    container_name: String,
    resource_name: String,
    device_ids: Vec<String>,
    /// The plugin's `ContainerAllocateResponse`, protobuf, base64.
    alloc_resp: String,
    /// Device ID → its NUMA nodes.
    #[serde(default)]
    numa: BTreeMap<String, Topology>,
}

/// The checkpoint file's content.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Checkpoint {
    version: u32,
    entries: Vec<CheckpointEntry>,
    /// The resources whose plugins were registered (the kubelet's
    /// `RegisteredDevices`).
    #[serde(default)]
    registered: Vec<String>,
}

/// A container: (pod UID, container name).
pub type ContainerKey = (String, String);

/// How a container gets its devices of one resource ([`State::plan`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// The devices it was given before (a container created again).
    Keep(Vec<String>),
    /// Devices to pick, with the plugin's preference where it has one.
    Pick(Picker),
}

/// The device manager's state.
#[derive(Debug, Default)]
pub struct State {
    resources: BTreeMap<String, Resource>,
    removed: BTreeSet<String>,
    allocations: BTreeMap<ContainerKey, BTreeMap<String, Allocation>>,
    generation: u64,
}

impl State {
    /// A registration of `resource`'s plugin with `options`: it replaces the
    /// previous plugin of the resource (whose devices stay until the new one
    /// lists its own). Returns the registration's generation, which its
    /// later updates carry; `None` when [`MAX_RESOURCES`] other resources
    /// are tracked.
    pub fn register(&mut self, resource: &str, options: Options) -> Option<u64> {
        if !self.resources.contains_key(resource) && self.resources.len() >= MAX_RESOURCES {
            return None;
        }
        self.generation += 1;
        let r = self.resources.entry(resource.to_string()).or_default();
        r.generation = self.generation;
        r.stopped_at = None;
        r.options = options;
        self.removed.remove(resource);
        Some(self.generation)
    }

    /// The options of `resource`'s plugin, while it is registered.
    #[must_use]
    pub fn options(&self, resource: &str) -> Option<Options> {
        self.resources.get(resource).map(|r| r.options)
    }

    /// True while `generation` is `resource`'s current registration.
    #[must_use]
    pub fn is_current(&self, resource: &str, generation: u64) -> bool {
        self.resources
            .get(resource)
            .is_some_and(|r| r.generation == generation)
    }

    /// `resource`, while `generation` is its current registration.
    fn current_mut(&mut self, resource: &str, generation: u64) -> Option<&mut Resource> {
        self.resources
            .get_mut(resource)
            .filter(|r| r.generation == generation)
    }

    /// A `ListAndWatch` answer of registration `generation`: `devices`
    /// become the resource's devices, at most [`MAX_DEVICES`] of them (the
    /// kubelet's `genericDeviceUpdateCallback`). Ignored when a newer
    /// registration replaced it. True when the Node's counts may change.
    pub fn update(&mut self, resource: &str, generation: u64, devices: &[Device]) -> bool {
        let Some(r) = self.current_mut(resource, generation) else {
            return false;
        };
        let listed = devices.iter().take(MAX_DEVICES);
        let new: BTreeMap<String, bool> =
            listed.clone().map(|d| (d.id.clone(), d.healthy)).collect();
        r.numa = listed
            .filter(|d| !d.numa.is_empty())
            .map(|d| {
                (
                    d.id.clone(),
                    d.numa.iter().take(MAX_NUMA_NODES).copied().collect(),
                )
            })
            .collect();
        let changed = new != r.devices;
        r.devices = new;
        changed
    }

    /// Registration `generation`'s plugin went away at `now` (its
    /// `ListAndWatch` ended): every device of the resource turns unhealthy,
    /// and the resource is dropped [`STOP_GRACE`] later unless its plugin
    /// registers again (`PluginDisconnected`, `markResourceUnhealthy`).
    /// Ignored when a newer registration replaced it.
    pub fn disconnected(&mut self, resource: &str, generation: u64, now: Instant) -> bool {
        let Some(r) = self.current_mut(resource, generation) else {
            return false;
        };
        r.stopped_at = Some(now);
        r.devices.values_mut().for_each(|h| *h = false);
        true
    }

    /// The Node's view at `now` ([`DeviceResources`]); resources whose plugin
    /// went away [`STOP_GRACE`] or more before `now` are dropped first.
    pub fn resources(&mut self, now: Instant) -> DeviceResources {
        let expired: Vec<String> = self
            .resources
            .iter()
            .filter(|(_, r)| {
                r.stopped_at
                    .is_some_and(|t| now.saturating_duration_since(t) >= STOP_GRACE)
            })
            .map(|(k, _)| k.clone())
            .collect();
        for k in expired {
            self.resources.remove(&k);
            if self.removed.len() < MAX_RESOURCES {
                self.removed.insert(k);
            }
        }
        let mut out = DeviceResources {
            removed: self.removed.clone(),
            ..DeviceResources::default()
        };
        for (name, r) in &self.resources {
            let healthy = r.devices.values().filter(|h| **h).count();
            out.capacity.insert(name.clone(), count(r.devices.len()));
            out.allocatable.insert(name.clone(), count(healthy));
        }
        out
    }

    /// True when `resource` is advertised by a device plugin (registered, or
    /// within its grace period).
    #[must_use]
    pub fn is_device_resource(&self, resource: &str) -> bool {
        self.resources.contains_key(resource)
    }

    /// The healthy devices of every resource, as the pod resources API's
    /// `GetAllocatableResources` lists them (the kubelet's
    /// `GetAllocatableDevices`).
    #[must_use]
    pub fn allocatable_devices(&self) -> DevicesByResource {
        self.resources
            .iter()
            .map(|(name, r)| {
                let healthy = r
                    .devices
                    .iter()
                    .filter(|(_, h)| **h)
                    .map(|(id, _)| (id.clone(), r.numa.get(id).cloned().unwrap_or_default()))
                    .collect::<Vec<_>>();
                (name.clone(), healthy)
            })
            .filter(|(_, d)| !d.is_empty())
            .collect()
    }

    /// The devices container `key` was given, by resource, with the NUMA
    /// nodes they sat on then (the kubelet's `GetDevices`).
    #[must_use]
    pub fn devices(&self, key: &ContainerKey) -> DevicesByResource {
        let Some(given) = self.allocations.get(key) else {
            return Vec::new();
        };
        given
            .iter()
            .filter(|(_, a)| !a.devices.is_empty())
            .map(|(name, a)| {
                let numa = |id: &String| a.numa.get(id).cloned().unwrap_or_default();
                let devices = a.devices.iter().map(|id| (id.clone(), numa(id))).collect();
                (name.clone(), devices)
            })
            .collect()
    }

    /// What container `key` was given.
    #[must_use]
    pub fn allocated(&self, key: &ContainerKey) -> Option<&BTreeMap<String, Allocation>> {
        self.allocations.get(key)
    }

    /// How container `key`, which asks for `needed` devices of `resource`,
    /// gets them: the devices it already has, else a [`Picker`] over the
    /// devices of its pod's init containers it may reuse (`reusable`), then
    /// the healthy devices no container of an active pod (`active` on its
    /// UID) holds, split by `affinity`, the topology manager's merged hint
    /// (the kubelet's `devicesToAllocate`).
    ///
    /// # Errors
    /// The kubelet's messages: the resource has no plugin, a container asks
    /// for another number than it was given, no device is healthy, devices
    /// it was given are no longer healthy, or too few healthy devices are
    /// free.
    pub fn plan(
        &self,
        key: &ContainerKey,
        resource: &str,
        needed: usize,
        active: impl Fn(&str) -> bool,
        reusable: &[String],
        affinity: Option<NumaMask>,
    ) -> Result<Plan, String> {
        let Some(r) = self.resources.get(resource) else {
            return Err(format!("cannot allocate unregistered device {resource}"));
        };
        let had = self.allocations.get(key).and_then(|a| a.get(resource));
        if let Some(had) = had
            && had.devices.len() != needed
        {
            return Err(format!(
                "pod {:?} container {:?} changed request for resource {resource:?} from {} to {needed}",
                key.0,
                key.1,
                had.devices.len()
            ));
        }
        if !r.devices.values().any(|h| *h) {
            return Err(format!(
                "no healthy devices present; cannot allocate unhealthy devices {resource}"
            ));
        }
        if let Some(had) = had {
            if !had.devices.iter().all(|d| r.devices.get(d) == Some(&true)) {
                return Err(format!(
                    "previously allocated devices are no longer healthy; cannot allocate unhealthy devices {resource}"
                ));
            }
            return Ok(Plan::Keep(had.devices.clone()));
        }
        let available = self.available(resource, active);
        let picker = self
            .topology(resource)
            .picker(needed, reusable, &available, affinity);
        if picker.free() < picker.needed() {
            return Err(format!(
                "requested number of devices unavailable for {resource}. Requested: {}, Available: {}",
                picker.needed(),
                available.len()
            ));
        }
        Ok(Plan::Pick(picker))
    }

    /// Where the devices of `resource` sit (every device, healthy or not).
    #[must_use]
    pub fn topology(&self, resource: &str) -> ResourceTopology {
        let Some(r) = self.resources.get(resource) else {
            return ResourceTopology::default();
        };
        ResourceTopology::new(
            r.devices
                .keys()
                .map(|id| (id, r.numa.get(id).map_or(&[][..], Vec::as_slice))),
        )
    }

    /// The devices of `resource` the containers of pod `uid` that `pick`
    /// selects (by name) hold, sorted.
    #[must_use]
    pub fn held_by(&self, uid: &str, resource: &str, pick: impl Fn(&str) -> bool) -> Vec<String> {
        let held: BTreeSet<&String> = self
            .allocations
            .range((uid.to_string(), String::new())..)
            .take_while(|((u, _), _)| u == uid)
            .filter(|((_, c), _)| pick(c))
            .filter_map(|(_, by_resource)| by_resource.get(resource))
            .flat_map(|a| &a.devices)
            .collect();
        held.into_iter().cloned().collect()
    }

    /// The devices of `resource` a container of pod `uid` may reuse, as
    /// the kubelet's `devicesToReuse`: those its init containers that are
    /// not sidecars (`regular_init` on a container name) hold and none of
    /// its other containers holds.
    #[must_use]
    pub fn reusable(
        &self,
        uid: &str,
        resource: &str,
        regular_init: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let kept: BTreeSet<String> = self
            .held_by(uid, resource, |c| !regular_init(c))
            .into_iter()
            .collect();
        self.held_by(uid, resource, &regular_init)
            .into_iter()
            .filter(|d| !kept.contains(d))
            .collect()
    }

    /// The healthy devices of `resource` that no container of an active pod
    /// holds, sorted.
    #[must_use]
    pub fn available(&self, resource: &str, active: impl Fn(&str) -> bool) -> Vec<String> {
        let Some(r) = self.resources.get(resource) else {
            return Vec::new();
        };
        let held: BTreeSet<&str> = self
            .allocations
            .iter()
            .filter(|((uid, _), _)| active(uid))
            .filter_map(|(_, by_resource)| by_resource.get(resource))
            .flat_map(|a| a.devices.iter().map(String::as_str))
            .collect();
        r.devices
            .iter()
            .filter(|(id, healthy)| **healthy && !held.contains(id.as_str()))
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Records what container `key` was given of `resource`, with the NUMA
    /// nodes its plugin reports for those devices now.
    pub fn record(&mut self, key: ContainerKey, resource: &str, mut allocation: Allocation) {
        if let Some(r) = self.resources.get(resource) {
            allocation.numa = allocation
                .devices
                .iter()
                .filter_map(|id| r.numa.get(id).map(|n| (id.clone(), n.clone())))
                .collect();
        }
        self.allocations
            .entry(key)
            .or_default()
            .insert(resource.to_string(), allocation);
    }

    /// What every container was given, as the checkpoint file keeps it
    /// (JSON), so that an agent started again knows which devices running
    /// containers hold (the kubelet's `kubelet_internal_checkpoint`).
    ///
    /// # Errors
    /// The state cannot be encoded (never for these types).
    pub fn checkpoint(&self) -> Result<String, serde_json::Error> {
        let entries = self
            .allocations
            .iter()
            .flat_map(|((uid, container), by_resource)| {
                by_resource
                    .iter()
                    .map(move |(resource, a)| CheckpointEntry {
                        pod_uid: uid.clone(),
                        container_name: container.clone(),
                        resource_name: resource.clone(),
                        device_ids: a.devices.clone(),
                        alloc_resp: base64::engine::general_purpose::STANDARD
                            .encode(a.response.encode_to_vec()),
                        numa: a.numa.clone(),
                    })
            })
            .collect();
        let checkpoint = Checkpoint {
            version: CHECKPOINT_VERSION,
            entries,
            registered: self.resources.keys().cloned().collect(),
        };
        serde_json::to_string(&checkpoint)
    }

    /// Takes the allocations of a checkpoint ([`State::checkpoint`]) in (as
    /// many as its text holds: the caller bounds the text, as
    /// [`super::MAX_CHECKPOINT_BYTES`]), and its registered resources as
    /// plugins that went away at `now`, with no devices, until they register
    /// again (the kubelet's `readCheckpoint`): a pod asking for one is
    /// refused meanwhile, not run without its devices. Returns how many
    /// containers hold devices now.
    ///
    /// # Errors
    /// The text is no checkpoint of this version, or an entry's answer is
    /// not a `ContainerAllocateResponse`; nothing is taken in then.
    pub fn restore(&mut self, text: &str, now: Instant) -> Result<usize, String> {
        let checkpoint: Checkpoint = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if checkpoint.version != CHECKPOINT_VERSION {
            return Err(format!(
                "checkpoint version {} is not {CHECKPOINT_VERSION}",
                checkpoint.version
            ));
        }
        let mut restored: BTreeMap<ContainerKey, BTreeMap<String, Allocation>> = BTreeMap::new();
        for e in checkpoint.entries {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(&e.alloc_resp)
                .map_err(|err| format!("{}/{}: {err}", e.pod_uid, e.container_name))?;
            let response =
                crate::proto::deviceplugin::ContainerAllocateResponse::decode(bytes.as_slice())
                    .map_err(|err| format!("{}/{}: {err}", e.pod_uid, e.container_name))?;
            let mut devices = e.device_ids;
            devices.truncate(MAX_DEVICES);
            devices.sort();
            let numa = e
                .numa
                .into_iter()
                .filter(|(id, _)| devices.binary_search(id).is_ok())
                .map(|(id, mut nodes)| {
                    nodes.truncate(MAX_NUMA_NODES);
                    (id, nodes)
                })
                .collect();
            restored
                .entry((e.pod_uid, e.container_name))
                .or_default()
                .insert(
                    e.resource_name,
                    Allocation {
                        devices,
                        response,
                        numa,
                    },
                );
        }
        self.allocations = restored;
        for name in checkpoint.registered {
            if self.resources.len() >= MAX_RESOURCES {
                break;
            }
            self.resources.entry(name).or_insert_with(|| Resource {
                stopped_at: Some(now),
                ..Resource::default()
            });
        }
        Ok(self.allocations.len())
    }

    /// Forgets what the containers of pods `keep` rejects (by UID) were
    /// given; returns how many containers were forgotten.
    pub fn release(&mut self, keep: impl Fn(&str) -> bool) -> usize {
        let before = self.allocations.len();
        self.allocations.retain(|(uid, _), _| keep(uid));
        before - self.allocations.len()
    }
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devs(list: &[(&str, bool)]) -> Vec<Device> {
        list.iter()
            .map(|(d, h)| Device {
                id: (*d).to_string(),
                healthy: *h,
                numa: Vec::new(),
            })
            .collect()
    }

    fn counts(r: &DeviceResources, name: &str) -> (Option<u64>, Option<u64>) {
        (
            r.allocatable.get(name).copied(),
            r.capacity.get(name).copied(),
        )
    }

    const GPU: &str = "example.com/gpu";

    #[test]
    fn health_sets_allocatable_and_capacity_counts_every_device() {
        let t0 = Instant::now();
        let mut s = State::default();
        let g = s.register(GPU, Options::default()).unwrap();
        // Registered, nothing listed yet: 0 of 0.
        assert_eq!(counts(&s.resources(t0), GPU), (Some(0), Some(0)));
        assert!(s.update(
            GPU,
            g,
            &devs(&[("0", true), ("1", true), ("2", true), ("3", true)])
        ));
        assert_eq!(counts(&s.resources(t0), GPU), (Some(4), Some(4)));
        assert!(s.update(
            GPU,
            g,
            &devs(&[("0", false), ("1", true), ("2", false), ("3", true)])
        ));
        assert_eq!(counts(&s.resources(t0), GPU), (Some(2), Some(4)));
        // The same list again changes nothing.
        assert!(!s.update(
            GPU,
            g,
            &devs(&[("0", false), ("1", true), ("2", false), ("3", true)])
        ));
    }

    #[test]
    fn a_plugin_that_goes_keeps_its_capacity_for_the_grace_period_then_reads_zero() {
        let t0 = Instant::now();
        let mut s = State::default();
        let g = s.register(GPU, Options::default()).unwrap();
        s.update(GPU, g, &devs(&[("0", true), ("1", true)]));
        assert!(s.disconnected(GPU, g, t0));
        assert_eq!(counts(&s.resources(t0), GPU), (Some(0), Some(2)));
        let almost = t0 + STOP_GRACE - Duration::from_secs(1);
        assert_eq!(counts(&s.resources(almost), GPU), (Some(0), Some(2)));
        let r = s.resources(t0 + STOP_GRACE);
        assert_eq!(counts(&r, GPU), (None, None));
        assert!(r.removed.contains(GPU), "{r:?}");
        assert!(!s.is_device_resource(GPU));
        // Registering again brings it back.
        let g2 = s.register(GPU, Options::default()).unwrap();
        s.update(GPU, g2, &devs(&[("0", true)]));
        let r = s.resources(t0 + STOP_GRACE * 2);
        assert_eq!(counts(&r, GPU), (Some(1), Some(1)));
        assert!(r.removed.is_empty());
    }

    #[test]
    fn a_replaced_registrations_late_news_is_ignored() {
        let t0 = Instant::now();
        let mut s = State::default();
        let old = s.register(GPU, Options::default()).unwrap();
        s.update(GPU, old, &devs(&[("0", true)]));
        let new = s.register(GPU, Options::default()).unwrap();
        assert!(!s.disconnected(GPU, old, t0), "the old stream ending");
        assert!(!s.update(GPU, old, &devs(&[])));
        assert_eq!(counts(&s.resources(t0), GPU), (Some(1), Some(1)));
        assert!(s.is_current(GPU, new) && !s.is_current(GPU, old));
    }

    #[test]
    fn hostile_plugins_are_bounded() {
        let mut s = State::default();
        for i in 0..MAX_RESOURCES {
            assert!(
                s.register(&format!("example.com/r{i}"), Options::default())
                    .is_some()
            );
        }
        assert_eq!(s.register("example.com/one-more", Options::default()), None);
        // An existing one may register again.
        let g = s.register("example.com/r0", Options::default()).unwrap();
        let many: Vec<Device> = (0..MAX_DEVICES + 10)
            .map(|i| Device {
                id: i.to_string(),
                healthy: true,
                numa: vec![0; MAX_NUMA_NODES + 1],
            })
            .collect();
        s.update("example.com/r0", g, &many);
        let r = s.resources(Instant::now());
        assert_eq!(r.capacity["example.com/r0"], MAX_DEVICES as u64);
        let healthy = s.allocatable_devices();
        assert_eq!(healthy[0].1.len(), MAX_DEVICES);
        assert_eq!(healthy[0].1[0].1.len(), MAX_NUMA_NODES);
    }

    #[test]
    fn a_checkpoint_brings_every_containers_devices_and_answer_back() {
        let mut s = State::default();
        let g = s.register(GPU, Options::default()).unwrap();
        let mut listed = devs(&[("a", true), ("c", true)]);
        listed[1].numa = vec![1];
        s.update(GPU, g, &listed);
        let mut response = crate::proto::deviceplugin::ContainerAllocateResponse::default();
        response.envs.insert("GPU".into(), "a,c".into());
        s.record(
            ("u1".into(), "c".into()),
            GPU,
            Allocation {
                devices: vec!["a".into(), "c".into()],
                response: response.clone(),
                ..Allocation::default()
            },
        );
        s.record(
            ("u1".into(), "c".into()),
            "example.com/nic",
            Allocation {
                devices: vec!["n0".into()],
                ..Allocation::default()
            },
        );
        s.record(("u2".into(), "d".into()), GPU, Allocation::default());
        s.register("example.com/registered", Options::default())
            .unwrap();
        let text = s.checkpoint().unwrap();
        let t0 = Instant::now();
        let mut again = State::default();
        assert_eq!(again.restore(&text, t0), Ok(2));
        assert_eq!(again.allocations, s.allocations);
        // A resource registered before is known, with no devices, until its
        // plugin registers again: a container asking for it is refused.
        assert!(again.is_device_resource("example.com/registered"));
        assert_eq!(
            counts(&again.resources(t0), "example.com/registered"),
            (Some(0), Some(0))
        );
        assert!(
            choose(
                &again,
                &("u3".into(), "c".into()),
                "example.com/registered",
                1,
                |_| true,
                &[]
            )
            .is_err()
        );
        // A restored container holds its devices: no other pod gets them;
        // they keep the NUMA node they were given on, whatever the plugin
        // now says.
        let g = again.register(GPU, Options::default()).unwrap();
        again.update(GPU, g, &devs(&[("a", true), ("b", true), ("c", true)]));
        assert_eq!(again.available(GPU, |_| true), ["b"]);
        assert_eq!(
            again.devices(&("u1".into(), "c".into()))[0],
            (
                GPU.to_string(),
                vec![("a".to_string(), vec![]), ("c".to_string(), vec![1])]
            )
        );

        // Garbage, another version or a bad answer take nothing in.
        for bad in [
            "",
            "{",
            r#"{"version":2,"entries":[]}"#,
            r#"{"version":1,"entries":[{"pod_uid":"u","container_name":"c","resource_name":"r","device_ids":[],"alloc_resp":"%%"}]}"#,
            r#"{"version":1,"entries":[{"pod_uid":"u","container_name":"c","resource_name":"r","device_ids":[],"alloc_resp":"/w=="}]}"#,
        ] {
            assert!(again.restore(bad, t0).is_err(), "{bad}");
            assert_eq!(again.allocations, s.allocations, "{bad}");
        }
    }

    #[test]
    fn the_pod_resources_view_lists_healthy_devices_and_a_containers_own_with_their_numa_nodes() {
        let mut s = State::default();
        let g = s.register(GPU, Options::default()).unwrap();
        let mut listed = devs(&[("a", true), ("b", false), ("c", true)]);
        listed[2].numa = vec![1];
        s.update(GPU, g, &listed);
        // A resource whose devices are all unhealthy lists nothing.
        let g2 = s.register("example.com/nic", Options::default()).unwrap();
        s.update("example.com/nic", g2, &devs(&[("n0", false)]));
        assert_eq!(
            s.allocatable_devices(),
            vec![(
                GPU.to_string(),
                vec![("a".to_string(), vec![]), ("c".to_string(), vec![1])]
            )]
        );
        let key: ContainerKey = ("u1".into(), "c".into());
        assert!(s.devices(&key).is_empty());
        s.record(
            key.clone(),
            GPU,
            Allocation {
                devices: vec!["a".into(), "c".into()],
                ..Allocation::default()
            },
        );
        assert_eq!(
            s.devices(&key),
            vec![(
                GPU.to_string(),
                vec![("a".to_string(), vec![]), ("c".to_string(), vec![1])]
            )]
        );
        assert!(s.devices(&("u1".into(), "other".into())).is_empty());
    }

    /// The devices `key` gets: the plan, picked with `preferred`.
    fn choose(
        s: &State,
        key: &ContainerKey,
        resource: &str,
        needed: usize,
        active: impl Fn(&str) -> bool,
        preferred: &[String],
    ) -> Result<Vec<String>, String> {
        Ok(match s.plan(key, resource, needed, active, &[], None)? {
            Plan::Keep(d) => d,
            Plan::Pick(p) => p.pick(preferred),
        })
    }

    #[test]
    fn choosing_devices_skips_unhealthy_and_held_ones_and_keeps_a_containers_own() {
        let mut s = State::default();
        let g = s.register(GPU, Options::default()).unwrap();
        s.update(
            GPU,
            g,
            &devs(&[("a", true), ("b", false), ("c", true), ("d", true)]),
        );
        let k1: ContainerKey = ("u1".into(), "c".into());
        let k2: ContainerKey = ("u2".into(), "c".into());
        let all = |_: &str| true;
        assert_eq!(choose(&s, &k1, GPU, 2, all, &[]).unwrap(), ["a", "c"]);
        // The plugin's preference first.
        assert_eq!(
            choose(&s, &k1, GPU, 2, all, &["d".into()]).unwrap(),
            ["a", "d"]
        );
        s.record(
            k1.clone(),
            GPU,
            Allocation {
                devices: vec!["a".into(), "c".into()],
                ..Allocation::default()
            },
        );
        assert_eq!(s.available(GPU, all), ["d"]);
        assert_eq!(
            choose(&s, &k2, GPU, 2, all, &[]).unwrap_err(),
            "requested number of devices unavailable for example.com/gpu. Requested: 2, Available: 1"
        );
        // The container's own devices again (a restart).
        assert_eq!(choose(&s, &k1, GPU, 2, all, &[]).unwrap(), ["a", "c"]);
        // A pod no longer active holds nothing.
        let not_u1 = |u: &str| u != "u1";
        assert_eq!(
            choose(&s, &k2, GPU, 3, not_u1, &[]).unwrap(),
            ["a", "c", "d"]
        );
        assert_eq!(s.release(|u| u != "u1"), 1);
        assert_eq!(s.available(GPU, all), ["a", "c", "d"]);
        assert_eq!(
            choose(&s, &k1, "example.com/none", 1, all, &[]).unwrap_err(),
            "cannot allocate unregistered device example.com/none"
        );
    }
}
