//! The DRA manager's claim info cache, as the kubelet's (`claiminfo.go`
//! and its `state` checkpoint): for each ResourceClaim prepared on this
//! node, the pods using it, its drivers and the devices each driver
//! prepared with their CDI device IDs. It is what containers are given
//! ([`ClaimCache::cdi_devices`]), what is unprepared once the last pod
//! using a claim is gone, and what a restarted agent reads back
//! ([`ClaimCache::checkpoint`], [`ClaimCache::restore`]). Pure: the caller
//! reads and writes the file.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// The checkpoint's file name in the agent's root directory: the kubelet's
/// `dra_manager_state` with the agent's prefix, because the format is the
/// agent's own (the kubelet refuses to start on a checkpoint it cannot
/// read, and this agent on the kubelet's).
pub const CHECKPOINT: &str = "rustlet_dra_manager_state";
/// Where an earlier version of the agent kept the checkpoint (the kubelet's
/// name): taken over once, when it holds this agent's format.
pub const LEGACY_CHECKPOINT: &str = "dra_manager_state";
/// The version of the checkpoint's format.
const VERSION: &str = "rustlet/dra/v1";
/// The most devices one driver may prepare for one claim (a claim
/// allocates at most 32 devices per request, `AllocationResultsMaxSize`
/// is 32 as of v1.37: a longer answer is refused).
pub const MAX_DEVICES_PER_CLAIM: usize = 128;
/// The most CDI device IDs one prepared device may name.
pub const MAX_CDI_IDS_PER_DEVICE: usize = 16;
/// The longest CDI device ID taken, bytes.
pub const MAX_CDI_ID_BYTES: usize = 512;
/// The longest name (request, pool, device, share ID) taken from a driver,
/// bytes.
pub const MAX_NAME_BYTES: usize = 512;

/// One device a driver prepared for a claim (`Device` of the DRA API).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// The claim's requests it serves (empty: every request).
    #[serde(default)]
    pub request_names: Vec<String>,
    /// Its pool.
    pub pool_name: String,
    /// Its name in the pool.
    pub device_name: String,
    /// Its share, for a device with consumable capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// The fully qualified CDI device names the runtime applies to each
    /// container using it (`vendor.com/class=name`).
    #[serde(default)]
    pub cdi_device_ids: Vec<String>,
}

/// One ResourceClaim known on this node (the kubelet's `ClaimInfoState`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimInfo {
    /// The claim's UID.
    pub uid: String,
    /// Its name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// The UIDs of the pods using it on this node.
    pub pod_uids: BTreeSet<String>,
    /// Each driver of its allocated devices, with the devices it prepared
    /// (empty until prepared).
    pub drivers: BTreeMap<String, Vec<Device>>,
    /// Every driver prepared it since the agent started (not kept: a
    /// restarted agent prepares a claim again before another sandbox uses
    /// it, as the kubelet does; drivers take that without harm).
    #[serde(skip)]
    pub prepared: bool,
    /// Its unprepare has begun: no new pod may use it until it is gone.
    #[serde(skip)]
    pub unpreparing: bool,
}

impl ClaimInfo {
    /// The CDI device IDs of the devices serving request `request` (empty:
    /// every request), as the kubelet's `cdiDevicesAsList`: a device that
    /// names no request serves them all.
    #[must_use]
    pub fn cdi_devices(&self, request: &str) -> Vec<String> {
        self.serving(request)
            .flat_map(|(_, d)| d.cdi_device_ids.iter().cloned())
            .collect()
    }

    /// The prepared devices serving request `request` (empty: every
    /// request), each with its driver: a device that names no request
    /// serves them all.
    pub fn serving<'a>(&'a self, request: &'a str) -> impl Iterator<Item = (&'a str, &'a Device)> {
        self.drivers
            .iter()
            .flat_map(|(driver, devices)| devices.iter().map(move |d| (driver.as_str(), d)))
            .filter(move |(_, d)| {
                request.is_empty()
                    || d.request_names.is_empty()
                    || d.request_names.iter().any(|r| r == request)
            })
    }
}

/// The checkpoint file's content.
#[derive(Serialize, Deserialize)]
struct Checkpoint {
    version: String,
    claims: Vec<ClaimInfo>,
}

/// The claims known on this node, by namespace and name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimCache {
    claims: BTreeMap<(String, String), ClaimInfo>,
}

impl ClaimCache {
    /// Claim `name` of namespace `ns`.
    #[must_use]
    pub fn get(&self, ns: &str, name: &str) -> Option<&ClaimInfo> {
        self.claims.get(&(ns.to_string(), name.to_string()))
    }

    /// Claim `name` of namespace `ns`, to change.
    pub fn get_mut(&mut self, ns: &str, name: &str) -> Option<&mut ClaimInfo> {
        self.claims.get_mut(&(ns.to_string(), name.to_string()))
    }

    /// Adds (or replaces) `info`.
    pub fn insert(&mut self, info: ClaimInfo) {
        self.claims
            .insert((info.namespace.clone(), info.name.clone()), info);
    }

    /// Forgets claim `name` of namespace `ns`.
    pub fn remove(&mut self, ns: &str, name: &str) -> Option<ClaimInfo> {
        self.claims.remove(&(ns.to_string(), name.to_string()))
    }

    /// The names of the claims pod `uid` uses.
    #[must_use]
    pub fn claims_of(&self, uid: &str) -> Vec<String> {
        self.claims
            .values()
            .filter(|c| c.pod_uids.contains(uid))
            .map(|c| c.name.clone())
            .collect()
    }

    /// Every pod using a claim here, with its namespace: (pod UID,
    /// namespace).
    #[must_use]
    pub fn pods(&self) -> BTreeSet<(String, String)> {
        self.claims
            .values()
            .flat_map(|c| c.pod_uids.iter().map(|u| (u.clone(), c.namespace.clone())))
            .collect()
    }

    /// Whether pod `uid` uses a claim here.
    #[must_use]
    pub fn has_pod(&self, uid: &str) -> bool {
        self.claims.values().any(|c| c.pod_uids.contains(uid))
    }

    /// Every claim known.
    pub fn iter(&self) -> impl Iterator<Item = &ClaimInfo> {
        self.claims.values()
    }

    /// How many claims are known.
    #[must_use]
    pub fn len(&self) -> usize {
        self.claims.len()
    }

    /// Whether no claim is known.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    /// The checkpoint of every claim (JSON).
    ///
    /// # Errors
    /// Serialization failed.
    pub fn checkpoint(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(&Checkpoint {
            version: VERSION.into(),
            claims: self.claims.values().cloned().collect(),
        })
    }

    /// The cache a checkpoint ([`ClaimCache::checkpoint`]) holds, every
    /// claim not prepared since this start.
    ///
    /// # Errors
    /// The text is no checkpoint of this version.
    pub fn restore(text: &str) -> Result<Self, String> {
        let checkpoint: Checkpoint = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if checkpoint.version != VERSION {
            return Err(format!(
                "checkpoint version {:?}, not {VERSION:?}",
                checkpoint.version
            ));
        }
        let mut cache = Self::default();
        for claim in checkpoint.claims {
            cache.insert(claim);
        }
        Ok(cache)
    }
}

/// Checks what a driver answered for one claim it prepared, and gives its
/// devices.
///
/// # Errors
/// More than [`MAX_DEVICES_PER_CLAIM`] devices or more than
/// [`MAX_CDI_IDS_PER_DEVICE`] IDs for one, a name longer than
/// [`MAX_NAME_BYTES`], or a CDI device ID that is not a fully qualified CDI
/// name ([`check_cdi_id`]).
pub fn checked_devices(claim: &str, devices: Vec<Device>) -> Result<Vec<Device>, String> {
    if devices.len() > MAX_DEVICES_PER_CLAIM {
        return Err(format!(
            "NodePrepareResources returned {} devices for ResourceClaim {claim}, more than {MAX_DEVICES_PER_CLAIM}",
            devices.len()
        ));
    }
    for d in &devices {
        let names = d
            .request_names
            .iter()
            .chain([&d.pool_name, &d.device_name])
            .chain(&d.share_id);
        if let Some(long) = names.into_iter().find(|n| n.len() > MAX_NAME_BYTES) {
            return Err(format!(
                "NodePrepareResources returned a name of {} bytes for ResourceClaim {claim}, more than {MAX_NAME_BYTES}",
                long.len()
            ));
        }
        if d.cdi_device_ids.len() > MAX_CDI_IDS_PER_DEVICE {
            return Err(format!(
                "NodePrepareResources returned {} CDI devices for device {} of ResourceClaim {claim}, more than {MAX_CDI_IDS_PER_DEVICE}",
                d.cdi_device_ids.len(),
                d.device_name
            ));
        }
        for id in &d.cdi_device_ids {
            check_cdi_id(id).map_err(|e| {
                format!("NodePrepareResources returned an invalid CDI device for ResourceClaim {claim}: {e}")
            })?;
        }
    }
    Ok(devices)
}

/// Checks that `id` is a fully qualified CDI device name,
/// `vendor/class=name` (the CDI specification's `parser.ParseQualifiedName`
/// rules: a vendor and a class each of letters, digits, `_`, `-` and `.`,
/// starting with a letter and ending with a letter or digit; a name of letters, digits, `_`, `-`, `.` and
/// `:`, starting and ending with a letter or digit), at most
/// [`MAX_CDI_ID_BYTES`] long.
///
/// # Errors
/// Why it is not one.
pub fn check_cdi_id(id: &str) -> Result<(), String> {
    if id.len() > MAX_CDI_ID_BYTES {
        return Err(format!(
            "a CDI device name of {} bytes, more than {MAX_CDI_ID_BYTES}",
            id.len()
        ));
    }
    let shown = id.escape_debug();
    let (kind, name) = id
        .split_once('=')
        .ok_or_else(|| format!("\"{shown}\" is not vendor/class=name"))?;
    let (vendor, class) = kind
        .split_once('/')
        .ok_or_else(|| format!("\"{shown}\" is not vendor/class=name"))?;
    let part = |what: &str, s: &str, extra: &[char], first_letter: bool| -> Result<(), String> {
        let ok_char = |c: char| c.is_ascii_alphanumeric() || extra.contains(&c);
        let first = s.chars().next();
        let last = s.chars().last();
        let good = first.is_some_and(|c| {
            if first_letter {
                c.is_ascii_alphabetic()
            } else {
                c.is_ascii_alphanumeric()
            }
        }) && last.is_some_and(|c| c.is_ascii_alphanumeric())
            && s.chars().all(ok_char);
        if good {
            Ok(())
        } else {
            Err(format!("\"{shown}\" has an invalid {what}"))
        }
    };
    part("vendor", vendor, &['_', '-', '.'], true)?;
    part("class", class, &['_', '-', '.'], true)?;
    part("device name", name, &['_', '-', '.', ':'], false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(requests: &[&str], ids: &[&str]) -> Device {
        Device {
            request_names: requests.iter().map(|s| (*s).to_string()).collect(),
            pool_name: "node-1".into(),
            device_name: "device-00".into(),
            share_id: None,
            cdi_device_ids: ids.iter().map(|s| (*s).to_string()).collect(),
        }
    }

    #[test]
    fn a_containers_request_gets_the_devices_serving_it_or_serving_all() {
        let info = ClaimInfo {
            drivers: BTreeMap::from([
                (
                    "gpu.example.com".to_string(),
                    vec![
                        device(&["gpu"], &["example.com/gpu=0"]),
                        device(&["nic"], &["example.com/nic=1"]),
                    ],
                ),
                (
                    "all.example.com".to_string(),
                    vec![device(&[], &["example.com/all=a"])],
                ),
            ]),
            ..Default::default()
        };
        assert_eq!(
            info.cdi_devices("gpu"),
            ["example.com/all=a", "example.com/gpu=0"]
        );
        assert_eq!(
            info.cdi_devices(""),
            [
                "example.com/all=a",
                "example.com/gpu=0",
                "example.com/nic=1"
            ]
        );
        assert_eq!(info.cdi_devices("other"), ["example.com/all=a"]);
    }

    #[test]
    fn the_checkpoint_keeps_pods_and_devices_but_not_that_a_claim_was_prepared() {
        let mut cache = ClaimCache::default();
        cache.insert(ClaimInfo {
            uid: "claim-uid".into(),
            name: "c".into(),
            namespace: "ns".into(),
            pod_uids: BTreeSet::from(["p1".to_string(), "p2".to_string()]),
            drivers: BTreeMap::from([(
                "gpu.example.com".to_string(),
                vec![device(&["gpu"], &["example.com/gpu=0"])],
            )]),
            prepared: true,
            unpreparing: false,
        });
        let text = cache.checkpoint().unwrap();
        let back = ClaimCache::restore(&text).unwrap();
        let claim = back.get("ns", "c").unwrap();
        assert!(!claim.prepared);
        assert_eq!(claim.cdi_devices("gpu"), ["example.com/gpu=0"]);
        assert_eq!(back.claims_of("p2"), ["c"]);
        assert_eq!(
            back.pods(),
            BTreeSet::from([("p1".into(), "ns".into()), ("p2".into(), "ns".into())])
        );
        assert!(ClaimCache::restore("{\"version\":\"v0\",\"claims\":[]}").is_err());
        assert!(ClaimCache::restore("not json").is_err());
    }

    #[test]
    fn cdi_device_names_are_checked_as_the_cdi_parser_checks_them() {
        for good in [
            "test-driver.cdi.k8s.io/test=claim-1234-my-device",
            "nvidia.com/gpu=0",
            "vendor.com/class_1=name:with.dots_0",
        ] {
            assert_eq!(check_cdi_id(good), Ok(()), "{good}");
        }
        for bad in [
            "no-class=dev",
            "vendor.com/class",
            "/class=dev",
            "1vendor.com/class=dev",
            "vendor.com/cla/ss=dev",
            "vendor.com/class=-dev",
            "vendor.com/class=dev/../x",
            "vendor.com/class=",
            "vendor.com/class=dev\n",
        ] {
            assert!(check_cdi_id(bad).is_err(), "{bad}");
        }
        let long = format!("vendor.com/class={}", "a".repeat(MAX_CDI_ID_BYTES));
        assert!(check_cdi_id(&long).unwrap_err().contains("more than"));
    }

    #[test]
    fn a_drivers_answer_is_bounded() {
        let many = vec![device(&[], &["v.com/c=d"]); MAX_DEVICES_PER_CLAIM + 1];
        assert!(checked_devices("c", many).unwrap_err().contains("devices"));
        let ids: Vec<String> = (0..=MAX_CDI_IDS_PER_DEVICE)
            .map(|i| format!("v.com/c=d{i}"))
            .collect();
        let d = Device {
            cdi_device_ids: ids,
            ..Default::default()
        };
        assert!(
            checked_devices("c", vec![d])
                .unwrap_err()
                .contains("CDI devices")
        );
        let d = Device {
            device_name: "x".repeat(MAX_NAME_BYTES + 1),
            ..Default::default()
        };
        assert!(checked_devices("c", vec![d]).unwrap_err().contains("bytes"));
        let fine = vec![device(&["r"], &["v.com/c=d"])];
        assert_eq!(checked_devices("c", fine.clone()), Ok(fine));
    }
}
