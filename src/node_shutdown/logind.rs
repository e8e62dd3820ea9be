//! systemd-logind over the system bus, as the kubelet's
//! `nodeshutdown/systemd` (`inhibit_linux.go`): the delay inhibitor lock
//! that holds a shutdown back while pods stop (`Inhibit`, a file
//! descriptor: the lock lasts while it is open), the longest delay logind
//! grants (`InhibitDelayMaxUSec`), raised by a drop-in
//! (`<dir>/99-kubelet.conf`) and a reload (systemd's `KillUnit` of
//! `systemd-logind.service` with SIGHUP), and the `PrepareForShutdown`
//! signal, matched by interface, member and path only, as the kubelet
//! matches it (whoever sends it: the upstream node tests emit it
//! themselves).

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::{Stream, StreamExt as _};
use zbus::zvariant::OwnedFd;

const LOGIND: &str = "org.freedesktop.login1";
const LOGIND_PATH: &str = "/org/freedesktop/login1";
const LOGIND_MANAGER: &str = "org.freedesktop.login1.Manager";
const SYSTEMD: &str = "org.freedesktop.systemd1";
const SYSTEMD_PATH: &str = "/org/freedesktop/systemd1";
const SYSTEMD_MANAGER: &str = "org.freedesktop.systemd1.Manager";
/// The drop-in the inhibit delay is raised with (the kubelet's).
pub const DROP_IN: &str = "99-kubelet.conf";
/// Where logind reads drop-ins from.
pub const DROP_IN_DIR: &str = "/etc/systemd/logind.conf.d";
/// How long one call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Errors of the bus.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call, a property read or the connection failed.
    #[error("{what}: {source}")]
    Bus {
        /// What was being done.
        what: String,
        /// The bus's error.
        #[source]
        source: Box<zbus::Error>,
    },
    /// The drop-in could not be written.
    #[error("failed writing logind shutdown inhibit override file {path}: {source}")]
    DropIn {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// A connection to logind.
#[derive(Clone)]
pub struct Logind {
    conn: zbus::Connection,
}

/// The delay inhibitor lock: held while this lives (its file descriptor
/// open), released when dropped.
#[derive(Debug)]
pub struct InhibitLock {
    _fd: OwnedFd,
}

fn bus(what: &str) -> impl FnOnce(zbus::Error) -> Error + '_ {
    move |source| Error::Bus {
        what: what.to_string(),
        source: Box::new(source),
    }
}

impl Logind {
    /// Connects to the system bus (`DBUS_SYSTEM_BUS_ADDRESS`, else
    /// `/run/dbus/system_bus_socket`), or to the bus at `address`.
    ///
    /// # Errors
    /// [`Error::Bus`]: no bus there.
    pub async fn connect(address: Option<&str>) -> Result<Self, Error> {
        let what = "connect to the system bus";
        let builder = match address {
            Some(a) => zbus::connection::Builder::address(a).map_err(bus(what))?,
            None => zbus::connection::Builder::system().map_err(bus(what))?,
        };
        let conn = builder
            .method_timeout(CALL_TIMEOUT)
            .build()
            .await
            .map_err(bus(what))?;
        Ok(Self { conn })
    }

    /// The longest delay logind grants an inhibitor (`InhibitDelayMaxUSec`).
    ///
    /// # Errors
    /// [`Error::Bus`]: logind does not answer, or the property is no
    /// `u64` (the kubelet's messages).
    pub async fn inhibit_delay_max(&self) -> Result<Duration, Error> {
        let what = "failed reading InhibitDelayMaxUSec property from logind";
        let reply = self
            .conn
            .call_method(
                Some(LOGIND),
                LOGIND_PATH,
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &(LOGIND_MANAGER, "InhibitDelayMaxUSec"),
            )
            .await
            .map_err(bus(what))?;
        let value: zbus::zvariant::OwnedValue = reply.body().deserialize().map_err(bus(what))?;
        let usec = u64::try_from(value).map_err(|e| Error::Bus {
            what: "InhibitDelayMaxUSec from logind is not a uint64 as expected".into(),
            source: Box::new(e.into()),
        })?;
        Ok(Duration::from_micros(usec))
    }

    /// Takes a delay inhibitor lock on shutdown, in the kubelet's words
    /// (who `kubelet`, why `Kubelet needs time to handle node shutdown`).
    ///
    /// # Errors
    /// [`Error::Bus`]: logind refused it.
    pub async fn inhibit_shutdown(&self) -> Result<InhibitLock, Error> {
        let what = "failed creating systemd inhibitor";
        let reply = self
            .conn
            .call_method(
                Some(LOGIND),
                LOGIND_PATH,
                Some(LOGIND_MANAGER),
                "Inhibit",
                &(
                    "shutdown",
                    "kubelet",
                    "Kubelet needs time to handle node shutdown",
                    "delay",
                ),
            )
            .await
            .map_err(bus(what))?;
        let fd: OwnedFd = reply.body().deserialize().map_err(bus(what))?;
        Ok(InhibitLock { _fd: fd })
    }

    /// Asks systemd to send SIGHUP to logind, which reads its drop-ins
    /// again (the kubelet's `ReloadLogindConf`).
    ///
    /// # Errors
    /// [`Error::Bus`]: systemd refused it.
    pub async fn reload(&self) -> Result<(), Error> {
        self.conn
            .call_method(
                Some(SYSTEMD),
                SYSTEMD_PATH,
                Some(SYSTEMD_MANAGER),
                "KillUnit",
                &("systemd-logind.service", "all", 1i32),
            )
            .await
            .map_err(bus("unable to reload logind conf"))?;
        Ok(())
    }

    /// The `PrepareForShutdown` signals from now on: true when a shutdown
    /// begins, false when it is cancelled. The stream ends with the
    /// connection.
    ///
    /// # Errors
    /// [`Error::Bus`]: the match rule was refused.
    pub async fn prepare_for_shutdown(&self) -> Result<impl Stream<Item = bool> + use<>, Error> {
        let what = "failed to monitor shutdown";
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .interface(LOGIND_MANAGER)
            .map_err(bus(what))?
            .member("PrepareForShutdown")
            .map_err(bus(what))?
            .path(LOGIND_PATH)
            .map_err(bus(what))?
            .build();
        let stream = zbus::MessageStream::for_match_rule(rule, &self.conn, None)
            .await
            .map_err(bus(what))?;
        Ok(stream.filter_map(|m| async move {
            let m = m.ok()?;
            match m.body().deserialize::<bool>() {
                Ok(active) => Some(active),
                Err(e) => {
                    tracing::error!(error = %e, "Failed obtaining shutdown event, PrepareForShutdown event was not bool type as expected");
                    None
                }
            }
        }))
    }
}

/// Writes the drop-in that lets inhibitors delay a shutdown by `delay`
/// (whole seconds, rounded as the kubelet's `%.0f`) into `dir`, made if
/// missing (the kubelet's `OverrideInhibitDelay`).
///
/// # Errors
/// [`Error::DropIn`].
pub fn override_inhibit_delay(dir: &Path, delay: Duration) -> Result<(), Error> {
    let path = dir.join(DROP_IN);
    let err = |source| Error::DropIn {
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    let secs = delay.as_secs_f64().round();
    let text = format!("# Kubelet logind override\n[Login]\nInhibitDelayMaxSec={secs:.0}\n");
    std::fs::write(&path, text).map_err(err)
}
