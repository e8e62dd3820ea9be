//! The node's allocated resources, as the kubelet's allocation manager
//! (pkg/kubelet/allocation) keeps them: each admitted pod's allocation
//! ([`crate::pod_core::allocation`]) by UID, kept in
//! `<root-dir>/allocated_pods_state` (JSON, written through a temporary
//! file), so a restarted agent goes on from them; one kept by an earlier
//! version, which held only the regular containers and sidecars, takes the
//! rest from the pod's spec (that version declared neither resize to the
//! API server, which therefore let none through).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::pod_core::allocation::{Allocation, apply, of};

/// The file allocations are kept in, under the root directory: the
/// kubelet's `allocated_pods_state` with the agent's prefix, because the
/// format is the agent's own (the kubelet stops on a checkpoint it cannot
/// read).
pub const STATE_FILE: &str = "rustlet_allocated_pods_state";
/// Where an earlier version of the agent kept them (the kubelet's name):
/// taken over once, when the file there is in this agent's format.
pub const LEGACY_STATE_FILE: &str = "allocated_pods_state";

/// The version of [`STATE_FILE`] this agent writes. Version 1 held only
/// the regular containers and sidecars.
const STATE_VERSION: u32 = 2;

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    version: u32,
    pods: BTreeMap<String, Allocation>,
}

/// The allocations of the node's pods, by UID; cheap to share behind an
/// `Arc`.
#[derive(Debug)]
pub struct Allocations {
    path: Option<PathBuf>,
    pods: Mutex<BTreeMap<String, Allocation>>,
    /// Held from a resize's admission to its allocation, so that two pods
    /// resized at once are not both admitted against the same room.
    admitting: Mutex<()>,
}

impl Allocations {
    /// The allocations kept under `root_dir`; none when the file is missing
    /// or unreadable (logged), as after a first start.
    #[must_use]
    pub fn load(root_dir: &Path) -> Self {
        let path = root_dir.join(STATE_FILE);
        take_over_legacy(&root_dir.join(LEGACY_STATE_FILE), &path);
        let pods = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<State>(&bytes) {
                Ok(mut state) => {
                    if state.version < STATE_VERSION {
                        for a in state.pods.values_mut() {
                            a.partial = true;
                        }
                    }
                    state.pods
                }
                Err(e) => {
                    warn!(path = %path.display(), error = %e, "allocated resources unreadable; starting from the pods' specs");
                    BTreeMap::new()
                }
            },
            Err(_) => BTreeMap::new(),
        };
        Self {
            path: Some(path),
            pods: Mutex::new(pods),
            admitting: Mutex::new(()),
        }
    }

    /// Allocations kept in memory only (tests).
    #[must_use]
    pub fn in_memory() -> Self {
        Self {
            path: None,
            pods: Mutex::new(BTreeMap::new()),
            admitting: Mutex::new(()),
        }
    }

    /// The allocation of pod `uid`, if one was made.
    #[must_use]
    pub fn get(&self, uid: &str) -> Option<Allocation> {
        self.lock().get(uid).cloned()
    }

    /// Makes `pod`'s spec resources its allocation, and keeps it on disk.
    pub fn allocate(&self, pod: &Pod) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let mut pods = self.lock();
        let new = of(pod);
        if pods.get(&uid) != Some(&new) {
            pods.insert(uid, new);
            self.save(&pods);
        }
    }

    /// The lock a resize holds from its admission to its allocation.
    pub fn admitting(&self) -> std::sync::MutexGuard<'_, ()> {
        self.admitting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets every pod whose UID `keep` refuses.
    pub fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut pods = self.lock();
        let before = pods.len();
        pods.retain(|uid, _| keep(uid));
        if pods.len() != before {
            self.save(&pods);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Allocation>> {
        self.pods.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn save(&self, pods: &BTreeMap<String, Allocation>) {
        let Some(path) = &self.path else { return };
        let state = State {
            version: STATE_VERSION,
            pods: pods.clone(),
        };
        let written = serde_json::to_string(&state)
            .map_err(std::io::Error::other)
            .and_then(|text| crate::certificate::write_private(path, &text, 0o600));
        if let Err(e) = written {
            warn!(path = %path.display(), error = %e, "allocated resources not kept");
        }
    }
}

/// Moves the allocations an earlier version kept at `legacy` (the
/// kubelet's file name) to `path`, when there is no file at `path` yet and
/// `legacy` is in this agent's format; a file there in any other format is
/// the kubelet's own, and stays untouched.
fn take_over_legacy(legacy: &Path, path: &Path) {
    if path.exists() {
        return;
    }
    let Ok(bytes) = std::fs::read(legacy) else {
        return;
    };
    if serde_json::from_slice::<State>(&bytes).is_err() {
        return;
    }
    if let Err(e) = std::fs::rename(legacy, path) {
        warn!(path = %legacy.display(), error = %e, "allocated resources of an earlier version not moved");
    }
}

/// `pods`, each with the resources `allocations` holds for it (its spec's
/// when it has none yet).
#[must_use]
pub fn allocated(pods: &[std::sync::Arc<Pod>], allocations: &Allocations) -> Vec<Pod> {
    pods.iter()
        .map(
            |p| match p.metadata.uid.as_deref().and_then(|u| allocations.get(u)) {
                Some(a) => apply(p, &a),
                None => (**p).clone(),
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;
    use crate::pod_core::allocation::resize_requested;
    use k8s_openapi::api::core::v1::ResourceRequirements;

    #[test]
    fn allocations_are_kept_on_disk_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = pod("web").container("c", "busybox").build();
        p.metadata.uid = Some("u1".into());
        let r = ResourceRequirements {
            requests: Some(BTreeMap::from([(
                "cpu".to_string(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity("250m".into()),
            )])),
            ..Default::default()
        };
        p.spec.as_mut().unwrap().containers[0].resources = Some(r.clone());
        let a = Allocations::load(dir.path());
        assert!(a.get("u1").is_none());
        a.allocate(&p);
        let again = Allocations::load(dir.path());
        assert_eq!(again.get("u1").unwrap().containers["c"], r);
        again.retain(|_| false);
        assert!(Allocations::load(dir.path()).get("u1").is_none());
        // A file that is not ours is set aside: nothing allocated.
        std::fs::write(dir.path().join(STATE_FILE), "{not json").unwrap();
        assert!(Allocations::load(dir.path()).get("u1").is_none());
        // The kubelet's own checkpoint under its name (its shape: the data
        // as a string and a checksum) is neither read nor moved.
        let other = tempfile::tempdir().unwrap();
        let kubelets = r#"{"Data":"{\"allocationEntries\":{}}","Checksum":1234}"#;
        std::fs::write(other.path().join(LEGACY_STATE_FILE), kubelets).unwrap();
        let a = Allocations::load(other.path());
        a.allocate(&p);
        assert_eq!(
            std::fs::read_to_string(other.path().join(LEGACY_STATE_FILE)).unwrap(),
            kubelets
        );
        assert!(Allocations::load(other.path()).get("u1").is_some());
    }

    #[test]
    fn an_allocation_kept_by_an_earlier_version_takes_the_rest_from_the_spec() {
        let q = |v: &str| k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.into());
        let cpu = |v: &str| ResourceRequirements {
            requests: Some(BTreeMap::from([("cpu".to_string(), q(v))])),
            ..Default::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let mut p = pod("web")
            .init_container("setup", "busybox")
            .container("c", "busybox")
            .build();
        p.metadata.uid = Some("u1".into());
        let spec = p.spec.as_mut().unwrap();
        spec.resources = Some(cpu("500m"));
        spec.containers[0].resources = Some(cpu("100m"));
        spec.init_containers.as_mut().unwrap()[0].resources = Some(cpu("200m"));
        // Version 1 held the regular containers only.
        let v1 = r#"{"version":1,"pods":{"u1":{"containers":{"c":{"requests":{"cpu":"100m"}}}}}}"#;
        // It was kept under the kubelet's file name, and moves to the
        // agent's own.
        std::fs::write(dir.path().join(LEGACY_STATE_FILE), v1).unwrap();
        let a = Allocations::load(dir.path());
        assert!(!dir.path().join(LEGACY_STATE_FILE).exists());
        assert!(dir.path().join(STATE_FILE).is_file());
        let kept = a.get("u1").unwrap();
        assert!(kept.partial);
        assert!(!resize_requested(&p, &kept), "nothing was resized");
        assert_eq!(apply(&p, &kept), p);
        // Until it is made whole, only its containers can be resized: the
        // earlier version declared no pod-level or init container resize,
        // so the API server let none through.
        let mut resized = p.clone();
        resized.spec.as_mut().unwrap().containers[0].resources = Some(cpu("150m"));
        assert!(resize_requested(&resized, &kept));
        // Allocated again, it is whole, and read back so.
        a.allocate(&p);
        let again = Allocations::load(dir.path()).get("u1").unwrap();
        assert!(!again.partial);
        assert_eq!(again.pod, Some(cpu("500m")));
        assert_eq!(again.containers["setup"], cpu("200m"));
        // Whole, the pod level and init containers are resized too, and
        // the allocation wins over the spec.
        let mut resized = p.clone();
        let spec = resized.spec.as_mut().unwrap();
        spec.resources = Some(cpu("600m"));
        spec.init_containers.as_mut().unwrap()[0].resources = Some(cpu("300m"));
        assert!(resize_requested(&resized, &again));
        let applied = apply(&resized, &again).spec.unwrap();
        assert_eq!(applied.resources, Some(cpu("500m")));
        assert_eq!(
            applied.init_containers.unwrap()[0].resources,
            Some(cpu("200m"))
        );
    }
}
