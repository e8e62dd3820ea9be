//! The emptyDir volume plugin (pkg/volume/emptydir): a directory that lives as
//! long as the pod, shared by its containers, under `kubernetes.io~empty-dir`.
//! On the node's disk with mode 0777 (or the volume's `mode`), or with
//! `medium: Memory` a tmpfs sized as the kubelet sizes it. Also the wrapper of
//! the atomic-writer plugins: configMap on disk; secret, downwardAPI and
//! projected on tmpfs.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::mount;
use crate::resource::Quantity;

/// The plugin's directory name under `<pod>/volumes/`.
pub const PLUGIN_DIR: &str = "kubernetes.io~empty-dir";
/// The mode of an emptyDir directory when the volume sets none.
pub const DEFAULT_DIR_MODE: u32 = 0o777;

/// Where an emptyDir keeps its contents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Medium {
    /// The node's disk (the default medium, `""`).
    Disk,
    /// A tmpfs of at most this many bytes (`Memory`).
    Memory(u64),
}

fn bytes(q: Option<&ApiQuantity>) -> Option<u64> {
    let v = Quantity::parse(&q?.0).ok()?.value();
    u64::try_from(v).ok().filter(|v| *v > 0)
}

/// The pod's memory limit in bytes, as `ResourceConfigForPod` counts it: the
/// sum of its containers' limits (or the largest init container's, if larger),
/// `None` when a container has no memory limit.
#[must_use]
pub fn pod_memory_limit(pod: &Pod) -> Option<u64> {
    let spec = pod.spec.as_ref()?;
    let limit = |c: &k8s_openapi::api::core::v1::Container| {
        bytes(
            c.resources
                .as_ref()
                .and_then(|r| r.limits.as_ref())
                .and_then(|l| l.get("memory")),
        )
    };
    let mut sum = 0u64;
    for c in &spec.containers {
        sum = sum.saturating_add(limit(c)?);
    }
    let mut init_max = 0u64;
    for c in spec.init_containers.iter().flatten() {
        init_max = init_max.max(limit(c)?);
    }
    Some(sum.max(init_max))
}

/// The size of a memory-backed volume, as `calculateEmptyDirMemorySize`: the
/// node's allocatable memory, lowered to the pod's memory limit and then to the
/// volume's `sizeLimit` when those are smaller. `None` when nothing is known.
#[must_use]
pub fn memory_size(
    pod: &Pod,
    size_limit: Option<&ApiQuantity>,
    allocatable: &BTreeMap<String, ApiQuantity>,
) -> Option<u64> {
    let mut size = bytes(allocatable.get("memory"));
    for cap in [pod_memory_limit(pod).filter(|v| *v > 0), bytes(size_limit)]
        .into_iter()
        .flatten()
    {
        size = Some(size.map_or(cap, |s| s.min(cap)));
    }
    size
}

/// The medium of an emptyDir source.
#[must_use]
pub fn medium(
    pod: &Pod,
    source: &k8s_openapi::api::core::v1::EmptyDirVolumeSource,
    allocatable: &BTreeMap<String, ApiQuantity>,
) -> Medium {
    match source.medium.as_deref() {
        Some("Memory") => {
            Medium::Memory(memory_size(pod, source.size_limit.as_ref(), allocatable).unwrap_or(0))
        }
        _ => Medium::Disk,
    }
}

/// Creates the directory `dir` (idempotent) with `mode`, and mounts a tmpfs
/// on it for [`Medium::Memory`] (a size of 0 leaves the kernel's default).
///
/// # Errors
/// The failed create, chmod or mount.
pub fn set_up(dir: &Path, medium: Medium, mode: u32) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    if let Medium::Memory(size) = medium {
        mount::mount_tmpfs(dir, (size > 0).then_some(size))?;
    }
    // As the kubelet: only the permission bits count (an fsGroup's setgid stays).
    let current = fs::metadata(dir)?.permissions().mode() & 0o777;
    if current != mode & 0o777 {
        fs::set_permissions(dir, fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;
    use k8s_openapi::api::core::v1::ResourceRequirements;

    fn with_limit(mut p: Pod, i: usize, mem: &str) -> Pod {
        p.spec.as_mut().unwrap().containers[i].resources = Some(ResourceRequirements {
            limits: Some([("memory".to_string(), ApiQuantity(mem.into()))].into()),
            ..Default::default()
        });
        p
    }

    #[test]
    fn memory_volumes_are_sized_like_the_kubelet() {
        let alloc = BTreeMap::from([("memory".to_string(), ApiQuantity("1Gi".into()))]);
        let p = pod("p").container("a", "x").container("b", "x").build();
        assert_eq!(memory_size(&p, None, &alloc), Some(1 << 30));
        let p = with_limit(p, 0, "64Mi");
        assert_eq!(pod_memory_limit(&p), None, "b has no limit");
        assert_eq!(memory_size(&p, None, &alloc), Some(1 << 30));
        let p = with_limit(p, 1, "64Mi");
        assert_eq!(memory_size(&p, None, &alloc), Some(128 << 20));
        let small = ApiQuantity("10Mi".into());
        assert_eq!(memory_size(&p, Some(&small), &alloc), Some(10 << 20));
        let huge = ApiQuantity("10Gi".into());
        assert_eq!(memory_size(&p, Some(&huge), &alloc), Some(128 << 20));
    }

    #[test]
    fn disk_dirs_get_their_mode() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("kubernetes.io~empty-dir/cache");
        set_up(&d, Medium::Disk, DEFAULT_DIR_MODE).unwrap();
        assert_eq!(
            fs::metadata(&d).unwrap().permissions().mode() & 0o7777,
            0o777
        );
        set_up(&d, Medium::Disk, 0o750).unwrap();
        assert_eq!(
            fs::metadata(&d).unwrap().permissions().mode() & 0o7777,
            0o750
        );
    }
}
