//! Container garbage collection, as the kubelet's container GC
//! (pkg/kubelet/kuberuntime/kuberuntime_gc.go): dead containers are grouped
//! by pod and container name; the groups of pods whose content should go
//! (evicted pods, and terminated ones when the eviction manager reclaims
//! disk) are removed whole, the others trimmed to `maxPerPodContainer` dead
//! instances, newest kept, and the node to `maxContainers`; then the
//! sandboxes no container uses any more, all but the newest of a pod that
//! stays. A removed container takes its log files (the live one and the
//! rotated ones) and its `/var/log/containers` link with it.
//!
//! [`select`] decides, [`collect`] lists, decides and removes.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_cri::v1 as cri;
use tracing::{debug, info, warn};

use crate::cri::{Result, Runtime};

use crate::labels::POD_UID_LABEL;

/// How often the agent collects (the kubelet's `ContainerGCPeriod`).
pub const PERIOD: Duration = Duration::from_secs(60);

/// The container GC policy, as the kubelet's `GCPolicy` (set by its flags
/// `--minimum-container-ttl-duration`, `--maximum-dead-containers-per-container`
/// and `--maximum-dead-containers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// A dead container younger than this (since its creation) stays (0).
    pub min_age: Duration,
    /// Dead instances kept per pod and container name (1); negative: no limit.
    pub max_per_pod_container: i32,
    /// Dead containers kept on the node (-1); negative: no limit.
    pub max_containers: i32,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            min_age: Duration::ZERO,
            max_per_pod_container: 1,
            max_containers: -1,
        }
    }
}

/// What one collection removes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    /// Container IDs, in the order to remove them.
    pub containers: Vec<String>,
    /// Sandbox IDs to stop and remove, after the containers.
    pub sandboxes: Vec<String>,
}

/// A dead container: its ID and creation time (ns).
#[derive(Clone, Debug)]
struct Dead {
    id: String,
    created_at: i64,
}

/// Decides a collection at `now` (Unix ns) over the runtime's `containers`
/// and `sandboxes`, as the kubelet's `evictContainers` and
/// `evictSandboxes`. A container is dead when it is not running and was
/// created before `now − min_age`. `remove_all(pod UID)` names the pods
/// whose dead containers and idle sandboxes all go. Containers and sandboxes
/// without a pod UID label are not the agent's and stay.
#[must_use]
pub fn select(
    containers: &[cri::Container],
    sandboxes: &[cri::PodSandbox],
    policy: Policy,
    now: i64,
    remove_all: impl Fn(&str) -> bool,
) -> Selection {
    let min_age = i64::try_from(policy.min_age.as_nanos()).unwrap_or(i64::MAX);
    let newest = now.saturating_sub(min_age);
    // (pod UID, container name) → dead instances, newest first.
    let mut units: BTreeMap<(String, String), Vec<Dead>> = BTreeMap::new();
    for c in containers {
        let Some(uid) = c.labels.get(POD_UID_LABEL) else {
            continue;
        };
        if c.state == cri::ContainerState::ContainerRunning as i32 || c.created_at > newest {
            continue;
        }
        let name = c
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        units.entry((uid.clone(), name)).or_default().push(Dead {
            id: c.id.clone(),
            created_at: c.created_at,
        });
    }
    for unit in units.values_mut() {
        unit.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
    }
    let mut out = Selection::default();
    units.retain(|(uid, _), unit| {
        if remove_all(uid) {
            out.containers.extend(unit.drain(..).map(|d| d.id));
            false
        } else {
            true
        }
    });
    let trim =
        |units: &mut BTreeMap<(String, String), Vec<Dead>>, keep: usize, out: &mut Selection| {
            for unit in units.values_mut() {
                if unit.len() > keep {
                    out.containers.extend(unit.drain(keep..).map(|d| d.id));
                }
            }
        };
    if let Ok(keep) = usize::try_from(policy.max_per_pod_container) {
        trim(&mut units, keep, &mut out);
    }
    if let Ok(max) = usize::try_from(policy.max_containers) {
        let count = |u: &BTreeMap<_, Vec<Dead>>| u.values().map(Vec::len).sum::<usize>();
        if count(&units) > max {
            let per_unit = (max / units.len().max(1)).max(1);
            trim(&mut units, per_unit, &mut out);
            if count(&units) > max {
                let mut all: Vec<Dead> = units.into_values().flatten().collect();
                all.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
                out.containers.extend(all.drain(max..).map(|d| d.id));
            }
        }
    }
    out.sandboxes = idle_sandboxes(containers, sandboxes, &out.containers, remove_all);
    out
}

/// The sandboxes to remove once `removed` containers are gone, as
/// `evictSandboxes`: a sandbox is active while it is ready or a container
/// still refers to it; of a pod in `remove_all`, every idle sandbox goes,
/// of another pod the idle ones but its newest.
fn idle_sandboxes(
    containers: &[cri::Container],
    sandboxes: &[cri::PodSandbox],
    removed: &[String],
    remove_all: impl Fn(&str) -> bool,
) -> Vec<String> {
    let removed: HashSet<&str> = removed.iter().map(String::as_str).collect();
    let used: HashSet<&str> = containers
        .iter()
        .filter(|c| !removed.contains(c.id.as_str()))
        .map(|c| c.pod_sandbox_id.as_str())
        .collect();
    let mut by_pod: BTreeMap<&str, Vec<&cri::PodSandbox>> = BTreeMap::new();
    for s in sandboxes {
        if let Some(uid) = s.labels.get(POD_UID_LABEL) {
            by_pod.entry(uid.as_str()).or_default().push(s);
        }
    }
    let mut out = Vec::new();
    for (uid, mut list) in by_pod {
        list.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(a.id.cmp(&b.id)));
        let skip = usize::from(!remove_all(uid));
        out.extend(
            list.into_iter()
                .skip(skip)
                .filter(|s| {
                    s.state != cri::PodSandboxState::SandboxReady as i32
                        && !used.contains(s.id.as_str())
                })
                .map(|s| s.id.clone()),
        );
    }
    out
}

/// Removes container `id` as the kubelet's `removeContainer`: its log file
/// and the rotated ones (`<log>.*`) first, then the container, then its
/// `/var/log/containers` link in `links_dir`. A container already gone is
/// not an error.
///
/// # Errors
/// The CRI `RemoveContainer` call failed.
pub async fn remove_container(runtime: &Runtime, id: &str, links_dir: &Path) -> Result<()> {
    let log = match runtime.container_status(id).await {
        Ok(status) => status.map(|s| s.log_path).filter(|p| !p.is_empty()),
        Err(e) => {
            debug!(container = id, error = %e, "container status before removal");
            None
        }
    };
    if let Some(log) = log {
        let log = PathBuf::from(log);
        if let Err(e) = tokio::task::spawn_blocking(move || remove_logs(&log)).await {
            debug!(container = id, error = %e, "remove container logs");
        }
    }
    runtime.remove_container(id).await?;
    if let Err(e) = crate::log_links::remove(links_dir, id) {
        debug!(container = id, error = %e, "remove container log link");
    }
    Ok(())
}

/// Removes the log file `log` and its rotated files (`<log>.<suffix>`).
fn remove_logs(log: &Path) {
    let _ = std::fs::remove_file(log);
    let (Some(dir), Some(name)) = (log.parent(), log.file_name()) else {
        return;
    };
    let prefix = format!("{}.", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// What [`collect`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Collected {
    /// Containers removed.
    pub containers: usize,
    /// Sandboxes removed.
    pub sandboxes: usize,
}

/// One collection at `now` (Unix ns): lists the runtime's containers and
/// sandboxes, [`select`]s, and removes (containers with their logs, see
/// [`remove_container`]; sandboxes stopped first).
///
/// # Errors
/// The first CRI call that failed; what was removed before it stays removed.
pub async fn collect(
    runtime: &Runtime,
    policy: Policy,
    now: i64,
    remove_all: impl Fn(&str) -> bool,
    links_dir: &Path,
) -> Result<Collected> {
    let containers = runtime.list_containers(HashMap::new()).await?;
    let sandboxes = runtime.list_pod_sandboxes(HashMap::new()).await?;
    let chosen = select(&containers, &sandboxes, policy, now, remove_all);
    let mut done = Collected::default();
    for id in &chosen.containers {
        remove_container(runtime, id, links_dir).await?;
        done.containers += 1;
    }
    for id in &chosen.sandboxes {
        runtime.stop_pod_sandbox(id).await?;
        runtime.remove_pod_sandbox(id).await?;
        done.sandboxes += 1;
    }
    if done != Collected::default() {
        info!(
            containers = done.containers,
            sandboxes = done.sandboxes,
            "container GC: removed dead containers and idle sandboxes"
        );
    }
    Ok(done)
}

/// Removes the log directories (`<ns>_<name>_<uid>` under `pod_logs_dir`) of
/// pods `keep` does not name, as the kubelet's container garbage collector
/// removes those of pods whose content is to be removed
/// (kuberuntime_gc.go's `evictPodLogsDirectories`): housekeeping with the
/// pods the node still has, a node reset with none. A directory whose
/// name has no UID, or that is a link, is left alone. Returns how many went.
pub fn remove_orphaned_log_dirs(pod_logs_dir: &Path, keep: impl Fn(&str) -> bool) -> usize {
    let Ok(entries) = std::fs::read_dir(pod_logs_dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((_, uid)) = name.rsplit_once('_') else {
            continue;
        };
        if uid.is_empty() || keep(uid) || !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        match std::fs::remove_dir_all(entry.path()) {
            Ok(()) => {
                removed += 1;
                debug!(dir = %entry.path().display(), "housekeeping: removed the logs of a pod gone");
            }
            Err(e) => {
                warn!(dir = %entry.path().display(), error = %e, "housekeeping: pod log directory")
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(id: &str, uid: &str, name: &str, created: i64, running: bool) -> cri::Container {
        cri::Container {
            id: id.into(),
            pod_sandbox_id: format!("s-{uid}"),
            metadata: Some(cri::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            state: if running {
                cri::ContainerState::ContainerRunning as i32
            } else {
                cri::ContainerState::ContainerExited as i32
            },
            created_at: created,
            labels: HashMap::from([(POD_UID_LABEL.to_string(), uid.to_string())]),
            ..Default::default()
        }
    }

    fn sandbox(id: &str, uid: &str, created: i64, ready: bool) -> cri::PodSandbox {
        cri::PodSandbox {
            id: id.into(),
            state: if ready {
                cri::PodSandboxState::SandboxReady as i32
            } else {
                cri::PodSandboxState::SandboxNotready as i32
            },
            created_at: created,
            labels: HashMap::from([(POD_UID_LABEL.to_string(), uid.to_string())]),
            ..Default::default()
        }
    }

    #[test]
    fn each_container_keeps_its_newest_dead_instance_and_running_ones_stay() {
        let cs = [
            container("a1", "p", "app", 1, false),
            container("a2", "p", "app", 2, false),
            container("a3", "p", "app", 3, false),
            container("a4", "p", "app", 4, true),
            container("b1", "p", "side", 1, false),
            container("x1", "q", "app", 1, false),
        ];
        let got = select(&cs, &[], Policy::default(), 10, |_| false);
        assert_eq!(got.containers, ["a2", "a1"]);
        // No limit per container: nothing goes.
        let unlimited = Policy {
            max_per_pod_container: -1,
            ..Policy::default()
        };
        assert!(
            select(&cs, &[], unlimited, 10, |_| false)
                .containers
                .is_empty()
        );
        // Too young: created after now − min_age.
        let aged = Policy {
            min_age: Duration::from_nanos(8),
            ..Policy::default()
        };
        assert_eq!(select(&cs, &[], aged, 10, |_| false).containers, ["a1"]);
    }

    #[test]
    fn the_node_limit_trims_every_group_then_the_oldest() {
        let cs = [
            container("a1", "p", "app", 1, false),
            container("a2", "p", "app", 5, false),
            container("b1", "p", "side", 2, false),
            container("c1", "q", "app", 3, false),
            container("c2", "q", "app", 6, false),
        ];
        let policy = Policy {
            max_per_pod_container: -1,
            max_containers: 2,
            ..Policy::default()
        };
        // 5 dead in 3 groups over a limit of 2: one per group (a1, c1 go),
        // then the oldest of what is left (b1).
        let got = select(&cs, &[], policy, 10, |_| false);
        assert_eq!(got.containers, ["a1", "c1", "b1"]);
    }

    #[test]
    fn pods_whose_content_goes_lose_every_dead_container_and_idle_sandbox() {
        let cs = [
            container("a1", "gone", "app", 1, false),
            container("r1", "live", "app", 1, true),
        ];
        let ss = [
            sandbox("s-gone", "gone", 1, false),
            sandbox("s-old", "live", 1, false),
            sandbox("s-older", "live", 0, false),
            sandbox("s-live", "live", 2, true),
            sandbox("foreign", "", 0, false),
        ];
        let mut ss = ss.to_vec();
        ss[4].labels.clear();
        let got = select(&cs, &ss, Policy::default(), 10, |uid| uid == "gone");
        assert_eq!(got.containers, ["a1"]);
        // The live pod keeps its newest sandbox (ready anyway); its idle
        // older ones go; the unlabelled one is not the agent's.
        assert_eq!(got.sandboxes, ["s-gone", "s-old", "s-older"]);
        // A sandbox a remaining container uses stays.
        let cs = [container("d1", "gone", "app", 1, true)];
        let got = select(&cs, &ss[..1], Policy::default(), 10, |_| true);
        assert!(got.sandboxes.is_empty());
    }

    #[tokio::test]
    async fn a_collection_over_cri_removes_old_instances_with_their_logs_and_links() {
        use crate::cri::fake::FakeRuntime;
        let dir = tempfile::tempdir().unwrap();
        let (fake, _) = FakeRuntime::serve(dir.path()).unwrap();
        let runtime = fake.client(Duration::from_secs(10)).await.unwrap();
        let logs = dir.path().join("pods/ns_p_uid1");
        let links = dir.path().join("containers");
        std::fs::create_dir_all(&links).unwrap();
        let labels = HashMap::from([(POD_UID_LABEL.to_string(), "uid1".to_string())]);
        let sandbox = fake.insert_sandbox(cri::PodSandboxConfig {
            log_directory: logs.to_string_lossy().into_owned(),
            labels: labels.clone(),
            ..Default::default()
        });
        let mut ids = Vec::new();
        for attempt in 0..3u32 {
            let id = fake
                .insert_container(
                    &sandbox,
                    cri::ContainerConfig {
                        metadata: Some(cri::ContainerMetadata {
                            name: "app".into(),
                            attempt,
                        }),
                        labels: labels.clone(),
                        log_path: format!("app/{attempt}.log"),
                        ..Default::default()
                    },
                    cri::ContainerState::ContainerExited,
                )
                .unwrap();
            std::fs::create_dir_all(logs.join("app")).unwrap();
            std::fs::write(logs.join(format!("app/{attempt}.log")), b"x").unwrap();
            std::fs::write(
                logs.join(format!("app/{attempt}.log.20260101-000000")),
                b"x",
            )
            .unwrap();
            let link = crate::log_links::link_path(&links, "p", "ns", "app", &id).unwrap();
            crate::log_links::create(&link, &logs.join(format!("app/{attempt}.log"))).unwrap();
            ids.push(id);
        }
        let now = i64::MAX;
        let done = collect(&runtime, Policy::default(), now, |_| false, &links)
            .await
            .unwrap();
        assert_eq!(
            done,
            Collected {
                containers: 2,
                sandboxes: 0
            }
        );
        let left: Vec<String> = fake.containers().iter().map(|c| c.id.clone()).collect();
        assert_eq!(left, [ids[2].clone()]);
        let mut files: Vec<String> = std::fs::read_dir(logs.join("app"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(files, ["2.log", "2.log.20260101-000000"]);
        assert_eq!(std::fs::read_dir(&links).unwrap().count(), 1);
        // The pod's content goes: the last container, then its sandbox once stopped.
        runtime.stop_pod_sandbox(&sandbox).await.unwrap();
        let done = collect(
            &runtime,
            Policy::default(),
            now,
            |uid| uid == "uid1",
            &links,
        )
        .await
        .unwrap();
        assert_eq!(
            done,
            Collected {
                containers: 1,
                sandboxes: 1
            }
        );
        assert!(fake.containers().is_empty() && fake.sandboxes().is_empty());
        assert_eq!(std::fs::read_dir(&links).unwrap().count(), 0);
    }

    #[test]
    fn removed_logs_take_their_rotated_files_not_their_neighbours() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        for name in [
            "0.log",
            "0.log.20260101-000000",
            "0.log.20260101-000000.gz",
            "1.log",
        ] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        remove_logs(&log);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["1.log"]);
    }

    #[test]
    fn log_directories_of_pods_gone_are_removed_and_links_left() {
        let tmp = tempfile::tempdir().unwrap();
        let logs = tmp.path().join("pods");
        for d in ["ns_web_uid-live", "ns_old_uid-gone", "no-uid-here_"] {
            std::fs::create_dir_all(logs.join(d).join("c")).unwrap();
            std::fs::write(logs.join(d).join("c/0.log"), "x").unwrap();
        }
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, logs.join("ns_link_uid-link")).unwrap();
        let removed = remove_orphaned_log_dirs(&logs, |uid| uid == "uid-live");
        assert_eq!(removed, 1);
        assert!(logs.join("ns_web_uid-live/c/0.log").exists());
        assert!(!logs.join("ns_old_uid-gone").exists());
        assert!(logs.join("no-uid-here_").exists());
        assert!(outside.exists() && logs.join("ns_link_uid-link").exists());
        assert_eq!(
            remove_orphaned_log_dirs(&tmp.path().join("none"), |_| false),
            0
        );
    }
}
