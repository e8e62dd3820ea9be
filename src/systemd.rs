//! The few calls of systemd's D-Bus API (`org.freedesktop.systemd1.Manager`)
//! that the `systemd` cgroup driver makes, as the kubelet makes them through
//! libcontainer's systemd cgroup manager: a transient slice per QoS class
//! and per pod (`StartTransientUnit`), its resource properties
//! (`SetUnitProperties`), and its removal (`StopUnit`, `ResetFailedUnit`).
//!
//! The connection is the system bus (`$DBUS_SYSTEM_BUS_ADDRESS`, else
//! `/run/dbus/system_bus_socket`), as libcontainer's first choice, made
//! again once when a call finds it broken (the bus restarted), as
//! libcontainer retries on a closed connection. Calls are blocking (the
//! cgroup manager's callers are); on a multi-threaded Tokio runtime they
//! say so (`block_in_place`), so that the worker's other tasks move on.
//! Each is bounded by the connection's method timeout; a job is awaited by
//! reading the unit's `ActiveState` until it settles, at most
//! [`JOB_TIMEOUT`], as libcontainer waits at most that long for the job's
//! `JobRemoved`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use zbus::blocking::Connection;
use zbus::zvariant::{OwnedObjectPath, OwnedValue, Value};

/// How long a start or stop job may take (libcontainer's 30 s).
pub const JOB_TIMEOUT: Duration = Duration::from_secs(30);

/// How long one D-Bus call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a job's unit is read while waiting.
const POLL: Duration = Duration::from_millis(10);

const DESTINATION: &str = "org.freedesktop.systemd1";
const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
const UNIT: &str = "org.freedesktop.systemd1.Unit";
const PROPERTIES: &str = "org.freedesktop.DBus.Properties";

/// systemd's error when a unit to start exists already.
const UNIT_EXISTS: &str = "org.freedesktop.systemd1.UnitExists";
/// systemd's error for a unit it does not know (never loaded, or collected).
const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";

/// `u64::MAX`: systemd's "infinity" for a limit property (no limit).
pub const INFINITY: u64 = u64::MAX;

/// Errors of the systemd client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The system bus could not be reached, or a call on it failed.
    #[error("systemd over D-Bus: {what}: {source}")]
    Bus {
        /// The call, with the unit it was for.
        what: String,
        /// The error (boxed: it is large, and rare).
        #[source]
        source: Box<zbus::Error>,
    },
    /// A job did not end in time, or its unit failed.
    #[error("systemd: {0}")]
    Job(String),
}

/// The result type of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One unit property, as `StartTransientUnit` and `SetUnitProperties` take
/// them (`(sv)`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Property {
    /// A boolean (`b`).
    Bool(&'static str, bool),
    /// An unsigned 64-bit number (`t`): bytes, shares, microseconds.
    U64(&'static str, u64),
    /// A string (`s`).
    Str(&'static str, String),
    /// A list of strings (`as`).
    Strs(&'static str, Vec<String>),
}

impl Property {
    /// The property's name.
    #[must_use]
    pub fn name(&self) -> &'static str {
        match self {
            Self::Bool(n, _) | Self::U64(n, _) | Self::Str(n, _) | Self::Strs(n, _) => n,
        }
    }

    fn value(&self) -> Value<'_> {
        match self {
            Self::Bool(_, b) => Value::from(*b),
            Self::U64(_, n) => Value::from(*n),
            Self::Str(_, s) => Value::from(s.as_str()),
            Self::Strs(_, l) => Value::from(l.clone()),
        }
    }
}

/// The properties of a new slice `unit` below slice `parent`, as
/// libcontainer starts one for the kubelet (no process: `Wants=` the parent;
/// every accounting on; no default dependencies). `v2` names the block I/O
/// accounting as cgroup v2 does.
#[must_use]
pub fn slice_properties(unit: &str, parent: &str, v2: bool) -> Vec<Property> {
    vec![
        Property::Str("Description", format!("libcontainer container {unit}")),
        Property::Strs("Wants", vec![parent.to_string()]),
        Property::Bool("MemoryAccounting", true),
        Property::Bool("CPUAccounting", true),
        Property::Bool(
            if v2 {
                "IOAccounting"
            } else {
                "BlockIOAccounting"
            },
            true,
        ),
        Property::Bool("TasksAccounting", true),
        Property::Bool("DefaultDependencies", false),
    ]
}

/// The first systemd version with `CPUQuotaPeriodUSec` (libcontainer sends
/// it only from there).
pub const QUOTA_PERIOD_SINCE: u32 = 242;

/// A connection to systemd.
#[derive(Clone, Debug)]
pub struct Systemd {
    conn: Arc<Mutex<Connection>>,
    /// systemd's major version (its `Version` property's leading number).
    version: u32,
}

/// Runs blocking `f`; on a multi-threaded Tokio runtime's worker, as
/// `block_in_place` (its other tasks go on elsewhere meanwhile).
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// A new connection to the system bus.
fn system_bus() -> Result<Connection> {
    let bus = |source| Error::Bus {
        what: "connect to the system bus".into(),
        source: Box::new(source),
    };
    zbus::blocking::connection::Builder::system()
        .map_err(bus)?
        .method_timeout(CALL_TIMEOUT)
        .build()
        .map_err(bus)
}

/// The leading number of a systemd version string (`252.39-1~deb12u2`,
/// `252`); 0 when it has none.
#[must_use]
pub fn major_version(version: &str) -> u32 {
    let digits: String = version
        .chars()
        .take_while(char::is_ascii_digit)
        .take(9)
        .collect();
    digits.parse().unwrap_or(0)
}

impl Systemd {
    /// Connects to systemd over the system bus and reads its version.
    ///
    /// # Errors
    /// [`Error::Bus`]: no bus, or systemd does not answer on it.
    pub fn connect() -> Result<Self> {
        blocking(|| {
            let mut me = Self {
                conn: Arc::new(Mutex::new(system_bus()?)),
                version: 0,
            };
            // systemd answers (a bus without systemd has no such name).
            let version = me.property(MANAGER_PATH, MANAGER, "Version", "systemd")?;
            me.version = major_version(&version);
            Ok(me)
        })
    }

    /// systemd's major version (0 when it could not be read as a number).
    #[must_use]
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Whether this systemd takes `CPUQuotaPeriodUSec`
    /// ([`QUOTA_PERIOD_SINCE`]).
    #[must_use]
    pub fn has_quota_period(&self) -> bool {
        self.version >= QUOTA_PERIOD_SINCE
    }

    /// Calls `method` of `iface` at `path`; a connection found broken (an
    /// error that is not an answer) is made again and the call tried once
    /// more.
    fn call<B>(
        &self,
        path: &str,
        iface: &str,
        method: &str,
        body: &B,
    ) -> zbus::Result<zbus::Message>
    where
        B: serde::ser::Serialize + zbus::zvariant::DynamicType,
    {
        let conn = self
            .conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let first = conn.call_method(Some(DESTINATION), path, Some(iface), method, body);
        match first {
            Ok(_) | Err(zbus::Error::MethodError(..)) => first,
            Err(e) => {
                let Ok(fresh) = system_bus() else {
                    return Err(e);
                };
                *self.conn.lock().unwrap_or_else(PoisonError::into_inner) = fresh.clone();
                fresh.call_method(Some(DESTINATION), path, Some(iface), method, body)
            }
        }
    }

    fn manager<B>(&self, method: &str, unit: &str, body: &B) -> Result<zbus::Message>
    where
        B: serde::ser::Serialize + zbus::zvariant::DynamicType,
    {
        self.call(MANAGER_PATH, MANAGER, method, body)
            .map_err(|source| Error::Bus {
                what: format!("{method} {unit}"),
                source: Box::new(source),
            })
    }

    /// String property `name` of interface `iface` at `path` (of `what`).
    fn property(&self, path: &str, iface: &str, name: &str, what: &str) -> Result<String> {
        let err = |source: zbus::Error| Error::Bus {
            what: format!("{name} of {what}"),
            source: Box::new(source),
        };
        let reply = self
            .call(path, PROPERTIES, "Get", &(iface, name))
            .map_err(err)?;
        let value: OwnedValue = reply.body().deserialize().map_err(err)?;
        String::try_from(value).map_err(|e| err(e.into()))
    }

    /// Starts transient slice `unit` with `properties`, and waits for it to
    /// be active; one that exists already is left as it is (libcontainer's
    /// `UnitExists` case for a unit without processes).
    ///
    /// # Errors
    /// The call failed, or the unit failed or did not start within
    /// [`JOB_TIMEOUT`] (it is then reset, as libcontainer does).
    pub fn start_slice(&self, unit: &str, properties: &[Property]) -> Result<()> {
        blocking(|| self.start_slice_now(unit, properties))
    }

    fn start_slice_now(&self, unit: &str, properties: &[Property]) -> Result<()> {
        let props: Vec<(&str, Value<'_>)> =
            properties.iter().map(|p| (p.name(), p.value())).collect();
        let aux: Vec<(&str, Vec<(&str, Value<'_>)>)> = Vec::new();
        match self.manager("StartTransientUnit", unit, &(unit, "replace", props, aux)) {
            Ok(_) => {}
            Err(e) if is(&e, UNIT_EXISTS) => return Ok(()),
            Err(e) => return Err(e),
        }
        let started = self.await_state(unit, "create", |state| match state {
            Some("active") => Some(Ok(())),
            Some("failed") => Some(Err(Error::Job(format!("{unit} failed to start")))),
            _ => None,
        });
        if started.is_err() {
            self.reset_failed(unit);
        }
        started
    }

    /// Sets `properties` on `unit` for the running system (`runtime`, not
    /// saved), as libcontainer's `Set`.
    ///
    /// # Errors
    /// The call failed (an unknown unit, a property systemd refuses).
    pub fn set_properties(&self, unit: &str, properties: &[Property]) -> Result<()> {
        let props: Vec<(&str, Value<'_>)> =
            properties.iter().map(|p| (p.name(), p.value())).collect();
        blocking(|| self.manager("SetUnitProperties", unit, &(unit, true, props))).map(drop)
    }

    /// Stops `unit` and waits until it is inactive or gone, then resets it
    /// if it failed, as libcontainer's `Destroy`; a unit systemd does not
    /// know is stopped already.
    ///
    /// # Errors
    /// The call failed, or the unit was still active after
    /// [`JOB_TIMEOUT`].
    pub fn stop_unit(&self, unit: &str) -> Result<()> {
        blocking(|| self.stop_unit_now(unit))
    }

    fn stop_unit_now(&self, unit: &str) -> Result<()> {
        match self.manager("StopUnit", unit, &(unit, "replace")) {
            Ok(_) => {}
            Err(e) if is(&e, NO_SUCH_UNIT) => return Ok(()),
            Err(e) => return Err(e),
        }
        self.await_state(unit, "stop", |state| match state {
            None | Some("inactive") => Some(Ok(())),
            Some("failed") => {
                self.reset_failed(unit);
                Some(Ok(()))
            }
            _ => None,
        })
    }

    /// Reads `unit`'s `ActiveState` every [`POLL`] until `settled` maps it
    /// to an outcome, at most [`JOB_TIMEOUT`] (then an [`Error::Job`]
    /// saying systemd did not `what` it in time).
    fn await_state(
        &self,
        unit: &str,
        what: &str,
        settled: impl Fn(Option<&str>) -> Option<Result<()>>,
    ) -> Result<()> {
        let deadline = Instant::now() + JOB_TIMEOUT;
        loop {
            if let Some(outcome) = settled(self.active_state(unit)?.as_deref()) {
                return outcome;
            }
            if Instant::now() >= deadline {
                return Err(Error::Job(format!(
                    "timeout waiting for systemd to {what} {unit}"
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// `unit`'s `ActiveState` (`active`, `activating`, `failed`, …); None
    /// when systemd does not know it.
    ///
    /// # Errors
    /// A call failed for another reason.
    pub fn active_state(&self, unit: &str) -> Result<Option<String>> {
        let path: OwnedObjectPath = match self.manager("GetUnit", unit, &(unit,)) {
            Ok(reply) => reply.body().deserialize().map_err(|source| Error::Bus {
                what: format!("GetUnit {unit}"),
                source: Box::new(source),
            })?,
            Err(e) if is(&e, NO_SUCH_UNIT) => return Ok(None),
            Err(e) => return Err(e),
        };
        self.property(path.as_str(), UNIT, "ActiveState", unit)
            .map(Some)
    }

    /// Resets `unit`'s failed state; errors are ignored (as libcontainer
    /// does: the unit may be gone).
    fn reset_failed(&self, unit: &str) {
        let _ = self.manager("ResetFailedUnit", unit, &(unit,));
    }
}

/// Whether `e` is D-Bus error `name` from systemd.
fn is(e: &Error, name: &str) -> bool {
    matches!(
        e,
        Error::Bus { source, .. }
            if matches!(&**source, zbus::Error::MethodError(n, _, _) if n.as_str() == name)
    )
}

/// systemd's `CPUQuotaPerSecUSec` for a CFS quota of `quota` microseconds
/// per `period_us` ([`INFINITY`] for none), as libcontainer's `addCPUQuota`:
/// systemd keeps the quota in whole 10 ms per second, so a value between is
/// rounded up (the cgroup file itself is then given the exact quota, as
/// libcontainer writes it after the unit's properties).
#[must_use]
pub fn cpu_quota_per_sec(quota: Option<i64>, period_us: i64) -> u64 {
    let (Some(q), Ok(period)) = (quota.filter(|q| *q > 0), u64::try_from(period_us)) else {
        return INFINITY;
    };
    if period == 0 {
        return INFINITY;
    }
    let per_sec = q.unsigned_abs().saturating_mul(1_000_000) / period;
    if per_sec % 10_000 == 0 {
        per_sec
    } else {
        (per_sec / 10_000).saturating_add(1).saturating_mul(10_000)
    }
}

/// A cgroup name's parts as a systemd slice path, as the kubelet's
/// `CgroupName.ToSystemd`: each part with `-` escaped as `_`, joined by `-`
/// into one slice name, expanded into the path of its ancestors
/// (`["kubepods", "burstable", "pod1-2"]` →
/// `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice`,
/// relative). Empty for no parts (the root, `-.slice`).
#[must_use]
pub fn slice_path(parts: &[&str]) -> std::path::PathBuf {
    let mut out = std::path::PathBuf::new();
    let mut prefix = String::new();
    for part in parts {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(&part.replace('-', "_"));
        out.push(format!("{prefix}.slice"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_paths_are_the_kubelets_expanded_names() {
        assert_eq!(
            slice_path(&["kubepods", "burstable", "pod1234-abcd"]),
            std::path::Path::new(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd.slice"
            )
        );
        assert_eq!(
            slice_path(&["kubepods", "pod1-2"]),
            std::path::Path::new("kubepods.slice/kubepods-pod1_2.slice")
        );
        assert_eq!(slice_path(&[]), std::path::Path::new(""));
    }

    #[test]
    fn systemd_versions_read_as_their_major_number() {
        assert_eq!(major_version("252.39-1~deb12u2"), 252);
        assert_eq!(major_version("257"), 257);
        assert_eq!(major_version("v242"), 0);
        assert_eq!(major_version(""), 0);
        assert_eq!(major_version(&"9".repeat(100)), 999_999_999);
    }

    #[test]
    fn cpu_quotas_round_up_to_whole_10ms_per_second_as_libcontainer() {
        // libcontainer's own example: 12345 µs of 100 ms.
        assert_eq!(cpu_quota_per_sec(Some(12_345), 100_000), 130_000);
        assert_eq!(cpu_quota_per_sec(Some(50_000), 100_000), 500_000);
        assert_eq!(cpu_quota_per_sec(Some(1_000), 100_000), 10_000);
        assert_eq!(cpu_quota_per_sec(None, 100_000), INFINITY);
        assert_eq!(cpu_quota_per_sec(Some(-1), 100_000), INFINITY);
        assert_eq!(cpu_quota_per_sec(Some(5), 0), INFINITY);
        // No overflow on a hostile quota.
        assert!(cpu_quota_per_sec(Some(i64::MAX), 1) > 0);
    }

    #[test]
    fn slices_want_their_parent_with_every_accounting() {
        let props = slice_properties("kubepods-burstable.slice", "kubepods.slice", false);
        assert!(props.contains(&Property::Strs("Wants", vec!["kubepods.slice".into()])));
        assert!(props.contains(&Property::Bool("BlockIOAccounting", true)));
        assert!(props.contains(&Property::Bool("DefaultDependencies", false)));
        let v2 = slice_properties("a.slice", "-.slice", true);
        assert!(v2.contains(&Property::Bool("IOAccounting", true)));
        assert!(!v2.iter().any(|p| p.name() == "BlockIOAccounting"));
    }
}
