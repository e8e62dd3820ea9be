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
    /// A hugetlbfs of pages of this many bytes (`HugePages`,
    /// `HugePages-<size>`); the pod cgroup's huge page limit bounds it.
    HugePages(u64),
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

/// The medium of an emptyDir source. `HugePages` takes the page size of the
/// pod's huge page requests, `HugePages-<size>` its own, as the kubelet's
/// `getPageSizeMountOption` (containers, init containers and the pod-level
/// requests counted).
///
/// # Errors
/// The kubelet's message for a huge page medium whose pod requests no huge
/// pages of its size, or requests several sizes under `HugePages`.
pub fn medium(
    pod: &Pod,
    source: &k8s_openapi::api::core::v1::EmptyDirVolumeSource,
    allocatable: &BTreeMap<String, ApiQuantity>,
) -> Result<Medium, String> {
    match source.medium.as_deref() {
        Some("Memory") => Ok(Medium::Memory(
            memory_size(pod, source.size_limit.as_ref(), allocatable).unwrap_or(0),
        )),
        Some(m) if m == "HugePages" || m.starts_with("HugePages-") => {
            huge_page_size(pod, m).map(Medium::HugePages)
        }
        _ => Ok(Medium::Disk),
    }
}

/// The page size, bytes, of huge page medium `medium` for `pod`.
fn huge_page_size(pod: &Pod, medium: &str) -> Result<u64, String> {
    use crate::pod_core::limits;
    let wanted = if medium == "HugePages" {
        None
    } else {
        Some(
            limits::huge_page_size_of_medium(medium)
                .ok_or_else(|| format!("medium {medium}: not a huge page size"))?,
        )
    };
    let spec = pod.spec.as_ref();
    let containers = spec
        .map(|s| s.containers.iter())
        .into_iter()
        .flatten()
        .chain(
            spec.and_then(|s| s.init_containers.as_ref())
                .into_iter()
                .flatten(),
        );
    let pod_level = spec.and_then(|s| s.resources.as_ref());
    let mut found: Option<u64> = None;
    for resources in containers
        .filter_map(|c| c.resources.as_ref())
        .chain(pod_level)
    {
        for name in resources.requests.iter().flat_map(BTreeMap::keys) {
            let Some(size) = limits::huge_page_size(name) else {
                continue;
            };
            match wanted {
                None if found.is_some_and(|f| f != size) => {
                    return Err(format!(
                        "medium: {medium} can't be used if container requests multiple huge page sizes"
                    ));
                }
                Some(w) if w != size => {}
                _ => found = Some(size),
            }
        }
    }
    found.ok_or_else(|| {
        format!(
            "medium {medium}: hugePages storage requested, but there is no resource request for huge pages"
        )
    })
}

/// Creates the directory `dir` (idempotent) with `mode`, and mounts a tmpfs
/// on it for [`Medium::Memory`] (a size of 0 leaves the kernel's default),
/// a hugetlbfs of the page size for [`Medium::HugePages`] (the kubelet's
/// `pagesize=<size>` option).
///
/// # Errors
/// The failed create, chmod or mount.
pub fn set_up(dir: &Path, medium: Medium, mode: u32) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    match medium {
        Medium::Memory(size) => mount::mount_tmpfs(dir, (size > 0).then_some(size))?,
        Medium::HugePages(page) => mount::mount_hugetlbfs(dir, page)?,
        Medium::Disk => {}
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

    fn requesting(mut p: Pod, i: usize, init: bool, sizes: &[&str]) -> Pod {
        let spec = p.spec.as_mut().unwrap();
        let c = if init {
            &mut spec.init_containers.as_mut().unwrap()[i]
        } else {
            &mut spec.containers[i]
        };
        let list: BTreeMap<String, ApiQuantity> = sizes
            .iter()
            .map(|s| (format!("hugepages-{s}"), ApiQuantity("4Mi".into())))
            .collect();
        c.resources = Some(ResourceRequirements {
            requests: Some(list.clone()),
            limits: Some(list),
            ..Default::default()
        });
        p
    }

    /// The page size of a huge page medium, and its refusals, in the
    /// kubelet's words (`getPageSizeMountOption`).
    #[test]
    fn huge_page_media_take_the_pods_page_size() {
        use k8s_openapi::api::core::v1::EmptyDirVolumeSource;
        let src = |m: &str| EmptyDirVolumeSource {
            medium: Some(m.into()),
            ..Default::default()
        };
        let alloc = BTreeMap::new();
        let p = pod("p").container("a", "x").container("b", "x").build();
        assert_eq!(
            medium(&p, &src("HugePages"), &alloc).unwrap_err(),
            "medium HugePages: hugePages storage requested, but there is no resource request for huge pages"
        );
        let p = requesting(p, 1, false, &["2Mi"]);
        assert_eq!(
            medium(&p, &src("HugePages"), &alloc),
            Ok(Medium::HugePages(2 << 20))
        );
        assert_eq!(
            medium(&p, &src("HugePages-2Mi"), &alloc),
            Ok(Medium::HugePages(2 << 20))
        );
        assert_eq!(
            medium(&p, &src("HugePages-1Gi"), &alloc).unwrap_err(),
            "medium HugePages-1Gi: hugePages storage requested, but there is no resource request for huge pages"
        );
        let p = requesting(p, 0, false, &["1Gi"]);
        assert_eq!(
            medium(&p, &src("HugePages"), &alloc).unwrap_err(),
            "medium: HugePages can't be used if container requests multiple huge page sizes"
        );
        assert_eq!(
            medium(&p, &src("HugePages-1Gi"), &alloc),
            Ok(Medium::HugePages(1 << 30))
        );
        // An init container's request counts too.
        let p = pod("q")
            .init_container("i", "x")
            .container("a", "x")
            .build();
        let p = requesting(p, 0, true, &["2Mi"]);
        assert_eq!(
            medium(&p, &src("HugePages"), &alloc),
            Ok(Medium::HugePages(2 << 20))
        );
        assert_eq!(medium(&p, &src(""), &alloc), Ok(Medium::Disk));
    }

    /// Hostile media and requests: sizes that are no page size, huge or
    /// negative amounts; each an error or no limit, never a panic.
    #[test]
    fn hostile_huge_page_media_are_refused() {
        use k8s_openapi::api::core::v1::EmptyDirVolumeSource;
        let src = |m: &str| EmptyDirVolumeSource {
            medium: Some(m.into()),
            ..Default::default()
        };
        let alloc = BTreeMap::new();
        let p = requesting(pod("p").container("a", "x").build(), 0, false, &["2Mi"]);
        for m in [
            "HugePages-",
            "HugePages-1e400",
            "HugePages--2Mi",
            "HugePages-0",
            "HugePages-x",
        ] {
            assert!(medium(&p, &src(m), &alloc).is_err(), "{m}");
        }
        let p = requesting(
            pod("q").container("a", "x").build(),
            0,
            false,
            &["99999999Ei", "-1Mi", "abc"],
        );
        assert!(medium(&p, &src("HugePages"), &alloc).is_err());
        let unit = crate::pod_core::limits::huge_page_unit(u64::MAX);
        assert!(unit.is_none() || unit.is_some_and(|u| u.ends_with('B')));
    }

    /// A huge page medium is a real hugetlbfs of its page size (as root,
    /// where the kernel has 2 MiB pages); set up again, it is left.
    #[test]
    fn huge_page_dirs_are_hugetlbfs_mounts() {
        if !Path::new("/sys/kernel/mm/hugepages/hugepages-2048kB").is_dir() {
            eprintln!("skipped: this kernel has no 2 MiB huge pages");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("huge");
        set_up(&d, Medium::HugePages(2 << 20), DEFAULT_DIR_MODE).unwrap();
        set_up(&d, Medium::HugePages(2 << 20), DEFAULT_DIR_MODE).unwrap();
        let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
        let ours: Vec<&str> = mounts
            .lines()
            .filter(|l| l.split(' ').nth(1) == Some(d.to_str().unwrap()))
            .collect();
        rustix::mount::unmount(&d, rustix::mount::UnmountFlags::empty()).unwrap();
        assert_eq!(ours.len(), 1, "{ours:?}");
        assert!(
            ours[0].contains(" hugetlbfs ") && ours[0].contains("pagesize=2M"),
            "{ours:?}"
        );
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
