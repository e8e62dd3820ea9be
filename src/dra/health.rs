//! Device health from DRA drivers, as the kubelet's (`healthinfo.go`,
//! KEP-4680 `ResourceHealthStatus`): a driver's plugin that serves
//! `DRAResourceHealth` (v1, else v1alpha1) streams its devices' health
//! (`NodeWatchResources`); each device's last word holds for its timeout
//! ([`DEFAULT_TIMEOUT`] unless the driver gives one), then it is `Unknown`,
//! as it is for a driver that went. Containers show the health of the
//! devices they were given in `allocatedResourcesStatus`
//! ([`super::DraManager::update_allocated_resources_status`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a device's health holds when its driver gives no timeout (the
/// kubelet's `DefaultHealthTimeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest message shown; a longer one is cut to 1021 characters and
/// `...` (the kubelet's).
pub const MAX_MESSAGE_CHARS: usize = 1024;
/// The most devices kept for one driver; more in one message are ignored.
pub const MAX_DEVICES_PER_DRIVER: usize = 4096;
/// The longest pool or device name kept, bytes.
const MAX_NAME_BYTES: usize = 512;

/// A device's health (`HealthStatus`; `v1.ResourceHealthStatus`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Health {
    /// Not known: never reported, timed out, or its driver went.
    #[default]
    Unknown,
    /// Working.
    Healthy,
    /// Reported with a problem.
    Unhealthy,
}

impl Health {
    /// Its name in a container's `allocatedResourcesStatus`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "Unknown",
            Self::Healthy => "Healthy",
            Self::Unhealthy => "Unhealthy",
        }
    }

    /// The wire value (`0` unknown, `1` healthy, `2` unhealthy; anything
    /// else unknown).
    #[must_use]
    pub fn from_wire(value: i32) -> Self {
        match value {
            1 => Self::Healthy,
            2 => Self::Unhealthy,
            _ => Self::Unknown,
        }
    }
}

/// One device's health as a driver last reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reported {
    /// Its pool.
    pub pool: String,
    /// Its name in the pool.
    pub device: String,
    /// Its health.
    pub health: Health,
    /// How long it holds (zero: [`DEFAULT_TIMEOUT`]).
    pub timeout: Duration,
    /// The driver's details.
    pub message: String,
}

/// The drivers' devices' health, by driver, pool and device; cheap to
/// clone.
#[derive(Clone, Debug, Default)]
pub struct HealthCache(Arc<Mutex<BTreeMap<DeviceKey, Entry>>>);

/// A device: its driver, pool and name.
type DeviceKey = (String, String, String);

#[derive(Clone, Debug)]
struct Entry {
    health: Health,
    since: Instant,
    timeout: Duration,
    message: String,
}

impl HealthCache {
    /// Takes driver `driver`'s report of its devices at `now`: each listed
    /// device's health (at most [`MAX_DEVICES_PER_DRIVER`], names too long
    /// skipped); devices not listed keep theirs until it times out. Returns
    /// whether the health or message of a device changed.
    pub fn update(&self, driver: &str, devices: Vec<Reported>, now: Instant) -> bool {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut changed = false;
        for d in devices
            .into_iter()
            .filter(|d| d.pool.len() <= MAX_NAME_BYTES && d.device.len() <= MAX_NAME_BYTES)
            .take(MAX_DEVICES_PER_DRIVER)
        {
            let key = (driver.to_string(), d.pool, d.device);
            let message = shown_message(&d.message);
            let timeout = if d.timeout.is_zero() {
                DEFAULT_TIMEOUT
            } else {
                d.timeout
            };
            let before = all.get(&key).map(|e| (e.health, e.message.clone()));
            changed |= before != Some((d.health, message.clone()));
            all.insert(
                key,
                Entry {
                    health: d.health,
                    since: now,
                    timeout,
                    message,
                },
            );
        }
        // A driver's devices are bounded: the oldest go past the bound.
        let of_driver = all.keys().filter(|(d, _, _)| d == driver).count();
        if of_driver > MAX_DEVICES_PER_DRIVER {
            let mut keyed: Vec<(DeviceKey, Instant)> = all
                .iter()
                .filter(|((d, _, _), _)| d == driver)
                .map(|(k, e)| (k.clone(), e.since))
                .collect();
            keyed.sort_by_key(|(_, since)| *since);
            for (k, _) in keyed.into_iter().take(of_driver - MAX_DEVICES_PER_DRIVER) {
                all.remove(&k);
            }
        }
        changed
    }

    /// Forgets driver `driver`'s devices (it went): they are `Unknown`.
    /// Returns whether it had any.
    pub fn forget_driver(&self, driver: &str) -> bool {
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let before = all.len();
        all.retain(|(d, _, _), _| d != driver);
        all.len() != before
    }

    /// Device `device` of `pool` of driver `driver` at `now`: its health
    /// and message (`Unknown` and none when not reported or timed out).
    #[must_use]
    pub fn get(&self, driver: &str, pool: &str, device: &str, now: Instant) -> (Health, String) {
        let all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match all.get(&(driver.to_string(), pool.to_string(), device.to_string())) {
            Some(e) if now.saturating_duration_since(e.since) <= e.timeout => {
                (e.health, e.message.clone())
            }
            _ => (Health::Unknown, String::new()),
        }
    }

    /// Whether some device reported by a driver timed out at `now` while
    /// it was not `Unknown` (its containers' status is to be written
    /// again).
    #[must_use]
    pub fn any_expired(&self, now: Instant, since: Instant) -> bool {
        let all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        all.values().any(|e| {
            let expiry = e.since + e.timeout;
            e.health != Health::Unknown && expiry <= now && expiry > since
        })
    }
}

/// A driver's message as shown: at most [`MAX_MESSAGE_CHARS`] characters,
/// a longer one cut to 1021 and `...`.
fn shown_message(message: &str) -> String {
    if message.chars().count() <= MAX_MESSAGE_CHARS {
        return message.to_string();
    }
    let cut: String = message.chars().take(MAX_MESSAGE_CHARS - 3).collect();
    format!("{cut}...")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reported(device: &str, health: Health, timeout: u64, message: &str) -> Reported {
        Reported {
            pool: "node-1".into(),
            device: device.into(),
            health,
            timeout: Duration::from_secs(timeout),
            message: message.into(),
        }
    }

    #[test]
    fn a_devices_health_holds_for_its_timeout_then_is_unknown() {
        let cache = HealthCache::default();
        let t0 = Instant::now();
        assert!(cache.update(
            "gpu.example.com",
            vec![
                reported("gpu-0", Health::Healthy, 0, ""),
                reported("gpu-1", Health::Unhealthy, 5, "ECC errors"),
            ],
            t0,
        ));
        assert_eq!(
            cache.get("gpu.example.com", "node-1", "gpu-1", t0),
            (Health::Unhealthy, "ECC errors".to_string())
        );
        // The same report again changes nothing.
        assert!(!cache.update(
            "gpu.example.com",
            vec![reported("gpu-1", Health::Unhealthy, 5, "ECC errors")],
            t0,
        ));
        let later = t0 + Duration::from_secs(6);
        assert_eq!(
            cache.get("gpu.example.com", "node-1", "gpu-1", later).0,
            Health::Unknown
        );
        assert!(cache.any_expired(later, t0));
        // The default timeout: 30 s.
        assert_eq!(
            cache.get("gpu.example.com", "node-1", "gpu-0", later).0,
            Health::Healthy
        );
        assert_eq!(
            cache
                .get(
                    "gpu.example.com",
                    "node-1",
                    "gpu-0",
                    t0 + Duration::from_secs(31)
                )
                .0,
            Health::Unknown
        );
        assert_eq!(
            cache.get("other.example.com", "node-1", "gpu-0", t0).0,
            Health::Unknown
        );
        assert!(cache.forget_driver("gpu.example.com"));
        assert_eq!(
            cache.get("gpu.example.com", "node-1", "gpu-0", t0).0,
            Health::Unknown
        );
        assert!(!cache.forget_driver("gpu.example.com"));
    }

    #[test]
    fn long_messages_are_cut_and_a_driver_keeps_a_bounded_number_of_devices() {
        let cache = HealthCache::default();
        let t0 = Instant::now();
        let long = "x".repeat(5000);
        cache.update("d", vec![reported("a", Health::Unhealthy, 0, &long)], t0);
        let (_, message) = cache.get("d", "node-1", "a", t0);
        assert_eq!(message.chars().count(), MAX_MESSAGE_CHARS);
        assert!(message.ends_with("..."));
        let many: Vec<Reported> = (0..MAX_DEVICES_PER_DRIVER + 10)
            .map(|i| reported(&format!("d{i}"), Health::Healthy, 0, ""))
            .collect();
        cache.update("d", many, t0 + Duration::from_secs(1));
        let kept = cache.0.lock().unwrap().len();
        assert_eq!(kept, MAX_DEVICES_PER_DRIVER);
        assert_eq!(Health::from_wire(7), Health::Unknown);
        assert_eq!(Health::from_wire(2).as_str(), "Unhealthy");
    }
}
