//! The logind client against a real bus: a private `dbus-daemon` with a
//! stand-in of logind (`Inhibit`, `InhibitDelayMaxUSec`) and of systemd
//! (`KillUnit`, which makes the stand-in read the drop-in again, as logind
//! does on SIGHUP) serving on it.

use std::io::Read as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;

use super::logind::{self, Logind};

/// A bus daemon of its own, stopped when dropped.
struct Bus {
    child: std::process::Child,
    address: String,
    _dir: tempfile::TempDir,
}

impl Drop for Bus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_bus() -> Bus {
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
struct Seen {
    /// Each `Inhibit` call's (what, who, why, mode).
    inhibits: Vec<(String, String, String, String)>,
    /// The stand-in's ends of the locks it gave.
    locks: Vec<UnixStream>,
    /// `InhibitDelayMaxUSec`.
    delay_usec: u64,
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
        let text = std::fs::read_to_string(self.drop_ins.join(logind::DROP_IN)).unwrap_or_default();
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

async fn serve(bus: &Bus, drop_ins: &Path) -> (Arc<Mutex<Seen>>, Vec<zbus::Connection>) {
    let seen = Arc::new(Mutex::new(Seen {
        delay_usec: 5_000_000,
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
fn held(seen: &Arc<Mutex<Seen>>, i: usize) -> bool {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_the_delay_and_the_shutdown_signal_go_over_the_bus_as_the_kubelets() {
    let bus = start_bus();
    let drop_ins = tempfile::tempdir().unwrap();
    let (seen, _served) = serve(&bus, drop_ins.path()).await;
    let client = Logind::connect(Some(&bus.address)).await.unwrap();

    // The delay logind grants, raised by the drop-in and a reload.
    assert_eq!(
        client.inhibit_delay_max().await.unwrap(),
        Duration::from_secs(5)
    );
    logind::override_inhibit_delay(drop_ins.path(), Duration::from_secs(30)).unwrap();
    assert_eq!(
        std::fs::read_to_string(drop_ins.path().join("99-kubelet.conf")).unwrap(),
        "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec=30\n"
    );
    client.reload().await.unwrap();
    assert_eq!(
        client.inhibit_delay_max().await.unwrap(),
        Duration::from_secs(30)
    );

    // The lock, in the kubelet's words, held while it lives.
    let lock = client.inhibit_shutdown().await.unwrap();
    assert_eq!(
        seen.lock().unwrap().inhibits,
        [(
            "shutdown".to_string(),
            "kubelet".to_string(),
            "Kubelet needs time to handle node shutdown".to_string(),
            "delay".to_string()
        )]
    );
    assert!(held(&seen, 0));
    drop(lock);
    // The bus connection's copy of the reply (with its descriptor) goes
    // with the reply, at once or within moments.
    let mut released = false;
    for _ in 0..100 {
        if !held(&seen, 0) {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(released, "released when dropped");

    // PrepareForShutdown from anyone (here not logind's connection, as the
    // upstream tests send it), true then false.
    let mut signals = Box::pin(client.prepare_for_shutdown().await.unwrap());
    let emitter = zbus::connection::Builder::address(bus.address.as_str())
        .unwrap()
        .build()
        .await
        .unwrap();
    for active in [true, false] {
        emitter
            .emit_signal(
                None::<()>,
                "/org/freedesktop/login1",
                "org.freedesktop.login1.Manager",
                "PrepareForShutdown",
                &(active,),
            )
            .await
            .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(5), signals.next()).await;
        assert_eq!(got.unwrap(), Some(active));
    }
    // Another member or path is not it.
    emitter
        .emit_signal(
            None::<()>,
            "/org/freedesktop/login1/other",
            "org.freedesktop.login1.Manager",
            "PrepareForShutdown",
            &(true,),
        )
        .await
        .unwrap();
    let none = tokio::time::timeout(Duration::from_millis(300), signals.next()).await;
    assert!(
        none.is_err(),
        "a signal of another path was taken: {none:?}"
    );
}

#[tokio::test]
async fn no_bus_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let address = format!("unix:path={}", dir.path().join("none").display());
    let Err(e) = Logind::connect(Some(&address)).await else {
        panic!("connected to nothing");
    };
    assert!(
        e.to_string().starts_with("connect to the system bus"),
        "{e}"
    );
}
