//! The logind client against a real bus: a private `dbus-daemon` with a
//! stand-in of logind (`Inhibit`, `InhibitDelayMaxUSec`) and of systemd
//! (`KillUnit`, which makes the stand-in read the drop-in again, as logind
//! does on SIGHUP) serving on it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;

use super::logind::{self, Logind};
use super::standin::{emit_prepare_for_shutdown, held, serve, start_bus};

const LOGIN1: &str = "/org/freedesktop/login1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_the_delay_and_the_shutdown_signal_go_over_the_bus_as_the_kubelets() {
    let bus = start_bus();
    let drop_ins = tempfile::tempdir().unwrap();
    let (seen, _served) = serve(&bus, drop_ins.path(), 5_000_000).await;
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
    for active in [true, false] {
        emit_prepare_for_shutdown(&bus.address, LOGIN1, active).await;
        let got = tokio::time::timeout(Duration::from_secs(5), signals.next()).await;
        assert_eq!(got.unwrap(), Some(active));
    }
    // Another member or path is not it.
    emit_prepare_for_shutdown(&bus.address, "/org/freedesktop/login1/other", true).await;
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

/// The pod side as the manager sees it: the pods it is given, the kills it
/// asks for (a pod is cleaned up once killed).
#[derive(Default)]
struct FakePods {
    pods: Vec<Arc<k8s_openapi::api::core::v1::Pod>>,
    killed: Mutex<Vec<(String, crate::eviction::Eviction)>>,
}

impl crate::eviction::Pods for FakePods {
    fn active_pods(&self) -> Vec<Arc<k8s_openapi::api::core::v1::Pod>> {
        self.pods.clone()
    }

    async fn kill_pod(
        &self,
        pod: &k8s_openapi::api::core::v1::Pod,
        eviction: crate::eviction::Eviction,
    ) -> Result<(), kube::Error> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        self.killed.lock().unwrap().push((name, eviction));
        Ok(())
    }

    async fn pod_cleaned_up(&self, uid: &str) -> bool {
        self.killed
            .lock()
            .unwrap()
            .iter()
            .any(|(name, _)| format!("uid-{name}") == uid)
    }

    async fn delete_all_unused_containers(
        &self,
    ) -> crate::cri::Result<crate::container_gc::Collected> {
        Ok(crate::container_gc::Collected::default())
    }
}

fn pod(name: &str, priority: i32, grace: Option<i64>) -> Arc<k8s_openapi::api::core::v1::Pod> {
    let mut p = k8s_openapi::api::core::v1::Pod::default();
    p.metadata.name = Some(name.into());
    p.metadata.uid = Some(format!("uid-{name}"));
    p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
        priority: Some(priority),
        termination_grace_period_seconds: grace,
        ..Default::default()
    });
    Arc::new(p)
}

/// Waits (5 s at most) for `check`.
async fn until(what: &str, check: impl Fn() -> bool) {
    for _ in 0..250 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("not so after 5 s: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_stops_pods_by_priority_then_releases_the_lock_and_a_cancellation_takes_it_again()
 {
    use super::manager;
    use super::plan::SYSTEM_CRITICAL_PRIORITY;
    let bus = start_bus();
    let drop_ins = tempfile::tempdir().unwrap();
    let (seen, _served) = serve(&bus, drop_ins.path(), 5_000_000).await;
    let api = crate::fake_api::FakeApi::default();
    let recorder = crate::events::Recorder::new(api.client(), "node-1".into());
    let pods = Arc::new(FakePods {
        pods: vec![
            pod("critical", SYSTEM_CRITICAL_PRIORITY, None),
            pod("web", 0, Some(5)),
            pod("batch", 0, None),
        ],
        ..FakePods::default()
    });
    let (tx, mut shutting_down) = tokio::sync::watch::channel(false);
    let cfg = manager::Config {
        node_name: "node-1".into(),
        // 20 s for regular pods, 10 s for critical ones: 30 s in all, more
        // than the stand-in's 5 s.
        periods: super::plan::periods(Duration::from_secs(30), Duration::from_secs(10), &[]),
        drop_in_dir: drop_ins.path().to_path_buf(),
        bus_address: Some(bus.address.clone()),
        state_file: Some(drop_ins.path().join(manager::STATE_FILE)),
    };
    let running = tokio::spawn(manager::run(cfg, pods.clone(), recorder, tx));
    until("the lock is taken", || {
        seen.lock().unwrap().locks.len() == 1
    })
    .await;
    assert_eq!(
        seen.lock().unwrap().delay_usec,
        30_000_000,
        "InhibitDelayMaxSec raised"
    );
    assert!(held(&seen, 0));

    let emit = |active: bool| emit_prepare_for_shutdown(&bus.address, LOGIN1, active);
    emit(true).await;
    tokio::time::timeout(Duration::from_secs(5), shutting_down.wait_for(|d| *d))
        .await
        .expect("the node is marked as shutting down")
        .unwrap();
    until("every pod is killed", || {
        pods.killed.lock().unwrap().len() == 3
    })
    .await;
    until("the lock is released", || !held(&seen, 0)).await;
    let killed = pods.killed.lock().unwrap().clone();
    let order: Vec<(&str, i64)> = killed.iter().map(|(n, e)| (n.as_str(), e.grace)).collect();
    // Regular pods first (their own shorter grace kept), critical last.
    assert_eq!(order, [("web", 5), ("batch", 20), ("critical", 10)]);
    for (_, e) in &killed {
        assert_eq!(e.reason, "Terminated");
        assert_eq!(
            e.message,
            "Pod was terminated in response to imminent node shutdown."
        );
        assert!(e.disruption);
    }
    // The start and end kept, and in the kubelet's metrics.
    let kept: manager::State =
        serde_json::from_slice(&std::fs::read(drop_ins.path().join(manager::STATE_FILE)).unwrap())
            .unwrap();
    let (start, end) = (kept.start_time.unwrap(), kept.end_time.unwrap());
    assert!(start <= end);
    let text = crate::metrics::metrics().encode().unwrap();
    assert!(
        text.contains(&format!(
            "kubelet_graceful_shutdown_end_time_seconds {}",
            end.as_second()
        )),
        "{text}"
    );
    until("the NodeShutdown event", || {
        api.events().contains(&(
            "NodeShutdown".into(),
            "Shutdown manager detected shutdown event".into(),
        ))
    })
    .await;

    // Cancelled: the mark goes and the lock is taken again.
    emit(false).await;
    tokio::time::timeout(Duration::from_secs(5), shutting_down.wait_for(|d| !*d))
        .await
        .expect("the mark is cleared")
        .unwrap();
    until("the lock is taken again", || {
        seen.lock().unwrap().locks.len() == 2
    })
    .await;
    assert!(held(&seen, 1));
    until("the cancellation event", || {
        api.events().contains(&(
            "NodeShutdown".into(),
            "Shutdown manager detected shutdown cancellation".into(),
        ))
    })
    .await;
    running.abort();
}

#[tokio::test]
async fn without_a_bus_the_manager_says_so_and_ends() {
    let dir = tempfile::tempdir().unwrap();
    let api = crate::fake_api::FakeApi::default();
    let (tx, _rx) = tokio::sync::watch::channel(false);
    let cfg = super::manager::Config {
        node_name: "node-1".into(),
        periods: vec![super::plan::PriorityPeriod {
            priority: 0,
            seconds: 10,
        }],
        drop_in_dir: dir.path().to_path_buf(),
        bus_address: Some(format!("unix:path={}", dir.path().join("none").display())),
        state_file: None,
    };
    let recorder = crate::events::Recorder::new(api.client(), "node-1".into());
    tokio::time::timeout(
        Duration::from_secs(5),
        super::manager::run(cfg, Arc::new(FakePods::default()), recorder, tx),
    )
    .await
    .expect("the manager ends");
}

#[tokio::test]
async fn a_period_as_long_as_i64_allows_neither_overflows_nor_waits_for_cleaned_up_pods() {
    let pods = FakePods {
        pods: vec![pod("p", 0, None)],
        ..FakePods::default()
    };
    let periods = [super::plan::PriorityPeriod {
        priority: 0,
        seconds: i64::MAX,
    }];
    tokio::time::timeout(
        Duration::from_secs(5),
        super::manager::kill_pods(&pods, &periods),
    )
    .await
    .expect("done once its pod is cleaned up");
    let killed = pods.killed.lock().unwrap();
    assert_eq!(killed.len(), 1);
    assert_eq!(killed[0].1.grace, i64::MAX);
}
