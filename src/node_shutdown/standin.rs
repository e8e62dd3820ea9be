//! Stand-ins of systemd-logind and systemd on a bus of their own, for the
//! node shutdown tests (the library's and the end-to-end ones, which
//! include this file): a private `dbus-daemon`, a logind that grants
//! `Inhibit` locks (one end of a socket pair each, the other kept to see
//! it closed) and serves `InhibitDelayMaxUSec`, and a systemd whose
//! `KillUnit` of logind with SIGHUP reads `InhibitDelayMaxSec` from the
//! drop-in again, as logind does.

use std::io::Read as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A bus daemon of its own, stopped when dropped.
pub struct Bus {
    child: std::process::Child,
    /// The bus's address (`unix:path=...`).
    pub address: String,
    _dir: tempfile::TempDir,
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts a bus daemon on a socket in a directory of its own.
pub fn start_bus() -> Bus {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("bus");
    let config = dir.path().join("bus.conf");
    std::fs::write(
        &config,
        format!(
            r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <allow own="*"/>
    <allow send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_type="method_return"/>
    <allow send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="signal"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
  </policy>
</busconfig>
"#,
            socket.display()
        ),
    )
    .unwrap();
    let child = std::process::Command::new("dbus-daemon")
        .arg(format!("--config-file={}", config.display()))
        .args(["--nofork", "--nopidfile"])
        // It says at start that it cannot raise its file limit.
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("dbus-daemon (hack/install-deps.sh installs it)");
    for _ in 0..100 {
        if socket.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Bus {
        child,
        address: format!("unix:path={}", socket.display()),
        _dir: dir,
    }
}

/// What the stand-in saw and holds.
#[derive(Default)]
pub struct Seen {
    /// Each `Inhibit` call's (what, who, why, mode).
    pub inhibits: Vec<(String, String, String, String)>,
    /// The stand-in's ends of the locks it gave.
    pub locks: Vec<UnixStream>,
    /// `InhibitDelayMaxUSec`.
    pub delay_usec: u64,
}

struct LogindStandIn(Arc<Mutex<Seen>>);

#[zbus::interface(name = "org.freedesktop.login1.Manager")]
impl LogindStandIn {
    async fn inhibit(
        &self,
        what: &str,
        who: &str,
        why: &str,
        mode: &str,
    ) -> zbus::fdo::Result<zbus::zvariant::OwnedFd> {
        let (ours, theirs) =
            UnixStream::pair().map_err(|e| zbus::fdo::Error::Failed(e.to_string()))?;
        let mut seen = self.0.lock().unwrap();
        seen.inhibits
            .push((what.into(), who.into(), why.into(), mode.into()));
        seen.locks.push(ours);
        Ok(std::os::fd::OwnedFd::from(theirs).into())
    }

    #[zbus(property, name = "InhibitDelayMaxUSec")]
    async fn inhibit_delay_max_usec(&self) -> u64 {
        self.0.lock().unwrap().delay_usec
    }
}

struct SystemdStandIn {
    seen: Arc<Mutex<Seen>>,
    drop_ins: PathBuf,
}

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl SystemdStandIn {
    /// SIGHUP to logind: it reads `InhibitDelayMaxSec` from its drop-ins.
    async fn kill_unit(&self, unit: &str, who: &str, signal: i32) -> zbus::fdo::Result<()> {
        if (unit, who, signal) != ("systemd-logind.service", "all", 1) {
            return Err(zbus::fdo::Error::InvalidArgs(format!(
                "{unit} {who} {signal}"
            )));
        }
        let text =
            std::fs::read_to_string(self.drop_ins.join("99-kubelet.conf")).unwrap_or_default();
        if let Some(secs) = text
            .lines()
            .find_map(|l| l.strip_prefix("InhibitDelayMaxSec="))
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            self.seen.lock().unwrap().delay_usec = secs * 1_000_000;
        }
        Ok(())
    }
}

/// Serves the stand-ins on `bus`, logind granting `delay_usec` at first,
/// systemd reading drop-ins from `drop_ins`; the connections serve while
/// they live.
pub async fn serve(
    bus: &Bus,
    drop_ins: &Path,
    delay_usec: u64,
) -> (Arc<Mutex<Seen>>, Vec<zbus::Connection>) {
    let seen = Arc::new(Mutex::new(Seen {
        delay_usec,
        ..Seen::default()
    }));
    let login = zbus::connection::Builder::address(bus.address.as_str())
        .unwrap()
        .name("org.freedesktop.login1")
        .unwrap()
        .serve_at("/org/freedesktop/login1", LogindStandIn(seen.clone()))
        .unwrap()
        .build()
        .await
        .unwrap();
    let systemd = zbus::connection::Builder::address(bus.address.as_str())
        .unwrap()
        .name("org.freedesktop.systemd1")
        .unwrap()
        .serve_at(
            "/org/freedesktop/systemd1",
            SystemdStandIn {
                seen: seen.clone(),
                drop_ins: drop_ins.to_path_buf(),
            },
        )
        .unwrap()
        .build()
        .await
        .unwrap();
    (seen, vec![login, systemd])
}

/// Whether the stand-in's end of lock `i` sees it still open.
pub fn held(seen: &Arc<Mutex<Seen>>, i: usize) -> bool {
    let seen = seen.lock().unwrap();
    let end = &seen.locks[i];
    end.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 1];
    match (&*end).read(&mut buf) {
        Ok(0) => false,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => true,
        other => panic!("{other:?}"),
    }
}

/// Sends `PrepareForShutdown(active)` on `path` from a connection of its
/// own to the bus at `address`, as the upstream node tests send it (not
/// from logind's connection).
pub async fn emit_prepare_for_shutdown(address: &str, path: &str, active: bool) {
    let emitter = zbus::connection::Builder::address(address)
        .expect("a bus address")
        .build()
        .await
        .expect("a connection to the bus");
    emitter
        .emit_signal(
            None::<()>,
            path,
            "org.freedesktop.login1.Manager",
            "PrepareForShutdown",
            &(active,),
        )
        .await
        .expect("emit PrepareForShutdown");
}
