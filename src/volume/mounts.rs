//! A container's `volumeMounts` as CRI mounts, as the kubelet's `makeMounts`
//! (pkg/kubelet/kubelet_pods.go): the volume's host path (or, for a `subPath`
//! or a `subPathExpr` expanded from the container's environment, the bind
//! mount of that file made safely by [`subpath`]), read-only when the mount or
//! the volume plugin says so, and the mount propagation mode.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, VolumeMount};
use tracing::warn;

use super::{Error, Result, subpath};
use crate::cri::extension::ImageSubPaths;

/// A pod volume ready to be mounted into its containers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountedVolume {
    /// Where the volume is on the node (empty for an image volume).
    pub host_path: PathBuf,
    /// True when the plugin only allows read-only mounts (configMap, secret,
    /// downwardAPI, projected, image).
    pub read_only: bool,
    /// An image volume's image reference (`image.reference`): the runtime
    /// mounts the image itself (CRI `Mount.image`) once the pod worker has
    /// pulled it.
    pub image: Option<String>,
    /// A raw block volume (`volumeMode: Block`): `host_path` is the block
    /// device, passed to the containers that name it in `volumeDevices`.
    pub block: bool,
}

/// The pod's volumes that are set up, by volume name.
pub type PodVolumes = BTreeMap<String, MountedVolume>;

/// The pulled images of a container's image volumes, by volume name, as the
/// runtime is to mount them (the kubelet's `ImageVolumes`).
pub type ImageVolumes = BTreeMap<String, cri::ImageSpec>;

/// The longest expanded `subPathExpr` (bytes): Linux's `PATH_MAX`, beyond
/// which no path can be opened. The expansion stops as soon as it is passed,
/// so references that multiply a large variable cost at most this much.
pub const MAX_SUB_PATH_BYTES: usize = 4096;

/// `value`, or its start when it is longer than [`MAX_SUB_PATH_BYTES`]: just
/// past the bound (cut at a character boundary), which is enough for the
/// expansion to see that it does not fit.
fn past_the_bound(value: &str) -> &str {
    if value.len() <= MAX_SUB_PATH_BYTES {
        return value;
    }
    let mut end = MAX_SUB_PATH_BYTES + 1;
    while !value.is_char_boundary(end) {
        end += 1;
    }
    &value[..end]
}

/// Expands `$(VAR)` references in a `subPathExpr` from `env` (`$$` is a
/// literal `$`), as the kubelet's `ExpandContainerVolumeMounts`, to at most
/// [`MAX_SUB_PATH_BYTES`].
///
/// # Errors
/// [`Error::Mount`] naming the variables that are undefined or empty, or
/// when the expansion is longer than [`MAX_SUB_PATH_BYTES`].
pub fn expand_sub_path_expr(expr: &str, env: &BTreeMap<String, String>) -> Result<String> {
    let missing = std::cell::RefCell::new(BTreeSet::new());
    let out = crate::expansion::expand_at_most(
        expr,
        |name| {
            // Only values that can still fit are copied: a 2 MiB variable
            // referenced 300 times copies nothing.
            let value = env
                .get(name)
                .filter(|v| !v.is_empty())
                .map(|v| past_the_bound(v).to_string());
            if value.is_none() {
                missing.borrow_mut().insert(name.to_string());
            }
            Some(value.unwrap_or_default())
        },
        MAX_SUB_PATH_BYTES,
    )
    .ok_or_else(|| {
        Error::Mount(format!(
            "subPathExpr {:?} expands to more than {MAX_SUB_PATH_BYTES} bytes",
            expr.chars().take(64).collect::<String>()
        ))
    })?;
    let missing = missing.into_inner();
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(Error::Mount(format!(
            "missing value for {}",
            missing.into_iter().collect::<Vec<_>>().join(", ")
        )))
    }
}

/// The CRI propagation of a `mountPropagation` (`None`/unset: private).
///
/// # Errors
/// [`Error::Mount`] for an unknown mode.
pub fn propagation(mode: Option<&str>) -> Result<cri::MountPropagation> {
    match mode {
        None | Some("None") => Ok(cri::MountPropagation::PropagationPrivate),
        Some("HostToContainer") => Ok(cri::MountPropagation::PropagationHostToContainer),
        Some("Bidirectional") => Ok(cri::MountPropagation::PropagationBidirectional),
        Some(other) => Err(Error::Mount(format!(
            "invalid MountPropagation mode: {other:?}"
        ))),
    }
}

/// The sub path of a mount, expanded and checked: relative, no `..` element.
/// `None` when the mount has none.
///
/// # Errors
/// [`Error::Mount`] for an absolute path, a `..` element, or an expansion error.
pub fn sub_path(m: &VolumeMount, env: &BTreeMap<String, String>) -> Result<Option<String>> {
    let sub = match m.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
        Some(expr) => expand_sub_path_expr(expr, env)?,
        None => m.sub_path.clone().unwrap_or_default(),
    };
    if sub.is_empty() {
        return Ok(None);
    }
    if sub.starts_with('/') {
        return Err(Error::Mount(format!(
            "error SubPath `{sub}` must not be an absolute path"
        )));
    }
    if Path::new(&sub)
        .components()
        .any(|c| c == Component::ParentDir)
    {
        return Err(Error::Mount(format!(
            "unable to provision SubPath `{sub}`: must not contain '..'"
        )));
    }
    Ok(Some(sub))
}

/// The host path to give the runtime for subPath `sub` of the volume
/// mounted at `volume`: the subPath opened beneath the volume (its missing
/// directories made there), bind-mounted onto
/// `<pod_dir>/volume-subpaths/<volume>/<container>/<index>`
/// ([`subpath::bind_sub_path`]), as the kubelet's `makeMounts` with
/// `SafeMakeDir` and `PrepareSafeSubpath`. Blocking.
///
/// # Errors
/// [`Error::Mount`] with the kubelet's messages, which name the volume mount
/// and the container but not the node's paths (those go to the log): "failed
/// to create subPath directory ..." when a missing directory cannot be made
/// inside the volume, "failed to prepare subPath ..." for the rest, such as
/// a subPath that leaves the volume.
pub fn prepare_sub_path(
    volume: &MountedVolume,
    sub: &str,
    pod_dir: &Path,
    mount: &VolumeMount,
    container: &str,
    index: usize,
) -> Result<PathBuf> {
    let sp = subpath::SubPath {
        volume_path: &volume.host_path,
        sub_path: sub,
        pod_dir,
        volume_name: &mount.name,
        container_name: container,
        index,
    };
    subpath::bind_sub_path(&sp).map_err(|e| {
        warn!(
            container,
            volume_mount = mount.name,
            sub_path = sub,
            error = %e,
            "subPath refused"
        );
        let what = match e {
            subpath::Error::MakeDir { .. } => "create subPath directory",
            _ => "prepare subPath",
        };
        Error::Mount(format!(
            "failed to {what} for volumeMount {:?} of container {container:?}",
            mount.name
        ))
    })
}

/// The CRI mounts of container `c` from the pod's set-up `volumes`, with
/// `env` (the container's environment) for `subPathExpr`; `pod_dir` is the
/// pod's directory, where subPaths are bind-mounted ([`prepare_sub_path`]).
/// Blocking: makes directories and mounts for subPaths.
///
/// `recursiveReadOnly: Enabled` asks the runtime for a recursive read-only
/// mount; `IfPossible` stays a plain read-only mount. The subPath of an
/// image volume is the runtime's to resolve (`Mount.image_sub_path`, in
/// [`ContainerMounts::image_sub_paths`]), as the kubelet's `makeMounts`.
///
/// # Errors
/// [`Error::Mount`] for a mount of a volume that is not set up, a bad sub
/// path or propagation (the container waits with `CreateContainerConfigError`).
pub fn container_mounts(
    c: &Container,
    volumes: &PodVolumes,
    images: &ImageVolumes,
    env: &[(String, String)],
    pod_dir: &Path,
    runtime_rro: bool,
) -> Result<ContainerMounts> {
    let env: BTreeMap<String, String> = env.iter().cloned().collect();
    let mut mounts = Vec::new();
    let mut image_sub_paths = ImageSubPaths::new();
    for (index, m) in c.volume_mounts.iter().flatten().enumerate() {
        let Some(vol) = volumes.get(&m.name) else {
            return Err(Error::Mount(format!(
                "cannot find volume {:?} to mount into container {:?}",
                m.name, c.name
            )));
        };
        let sub = sub_path(m, &env)?;
        let image = match &vol.image {
            Some(reference) => {
                let Some(spec) = images.get(&m.name) else {
                    return Err(Error::Mount(format!(
                        "image {reference:?} of volume {:?} is not pulled",
                        m.name
                    )));
                };
                Some(spec.clone())
            }
            None => None,
        };
        let container_path = if m.mount_path.starts_with('/') {
            m.mount_path.clone()
        } else {
            format!("/{}", m.mount_path)
        };
        let host_path = match (&image, sub) {
            (Some(_), Some(sub)) => {
                image_sub_paths.insert(container_path.clone(), sub);
                PathBuf::new()
            }
            (Some(_), None) => PathBuf::new(),
            (None, Some(sub)) => prepare_sub_path(vol, &sub, pod_dir, m, &c.name, index)?,
            (None, None) => vol.host_path.clone(),
        };
        let read_only = m.read_only.unwrap_or(false) || vol.read_only;
        mounts.push(cri::Mount {
            container_path,
            host_path: host_path.to_string_lossy().into_owned(),
            readonly: read_only,
            propagation: propagation(m.mount_propagation.as_deref())? as i32,
            recursive_read_only: crate::pod_core::spec::recursive_read_only(
                m,
                read_only,
                runtime_rro,
            )
            .map_err(Error::Mount)?,
            image,
            ..Default::default()
        });
    }
    Ok(ContainerMounts {
        mounts,
        image_sub_paths,
    })
}

/// A container's volume mounts for the runtime ([`container_mounts`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContainerMounts {
    /// The CRI mounts, in the order of the container's `volumeMounts`.
    pub mounts: Vec<cri::Mount>,
    /// The subPath of each image-volume mount that has one, by container path.
    pub image_sub_paths: ImageSubPaths,
}

/// A container's `volumeDevices` as CRI devices, as the kubelet's
/// `makeBlockVolumes`: each names a block volume of the pod and an absolute
/// path in the container; the device is read-write (`mrw`), or read-only
/// (`r`) when the claim is.
///
/// # Errors
/// [`Error::Mount`] for a relative device path, or a volume that is not a
/// set-up block volume.
pub fn container_devices(c: &Container, volumes: &PodVolumes) -> Result<Vec<cri::Device>> {
    let mut out = Vec::new();
    for d in c.volume_devices.iter().flatten() {
        if !d.device_path.starts_with('/') {
            return Err(Error::Mount(format!(
                "error DevicePath `{}` must be an absolute path",
                d.device_path
            )));
        }
        let Some(vol) = volumes.get(&d.name).filter(|v| v.block) else {
            return Err(Error::Mount(format!(
                "cannot find volume {:?} to pass into container {:?}",
                d.name, c.name
            )));
        };
        out.push(cri::Device {
            container_path: d.device_path.clone(),
            host_path: vol.host_path.to_string_lossy().into_owned(),
            permissions: if vol.read_only { "r" } else { "mrw" }.into(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    fn vm(name: &str, path: &str) -> VolumeMount {
        VolumeMount {
            name: name.into(),
            mount_path: path.into(),
            ..Default::default()
        }
    }

    #[test]
    fn sub_path_expr_expands_from_the_environment() {
        let e = env(&[("POD", "web-1"), ("NS", "prod"), ("EMPTY", "")]);
        assert_eq!(
            expand_sub_path_expr("$(NS)/$(POD)", &e).unwrap(),
            "prod/web-1"
        );
        assert_eq!(expand_sub_path_expr("a$$b$(POD)", &e).unwrap(), "a$bweb-1");
        assert_eq!(expand_sub_path_expr("$x$(", &e).unwrap(), "$x$(");
        assert_eq!(
            expand_sub_path_expr("$(NOPE)/$(EMPTY)", &e)
                .unwrap_err()
                .to_string(),
            "missing value for EMPTY, NOPE"
        );
    }

    #[test]
    fn sub_path_expr_is_bounded_by_path_max() {
        let big = "x".repeat(2 << 20);
        let e = env(&[("BIG", big.as_str()), ("A", "a")]);
        let err = expand_sub_path_expr(&"$(BIG)".repeat(300), &e).unwrap_err();
        assert!(
            err.to_string().contains("expands to more than 4096 bytes"),
            "{err}"
        );
        let fits = "$(A)".repeat(MAX_SUB_PATH_BYTES);
        assert_eq!(expand_sub_path_expr(&fits, &e).unwrap().len(), 4096);
        let over = "$(A)".repeat(MAX_SUB_PATH_BYTES + 1);
        assert!(expand_sub_path_expr(&over, &e).is_err());
    }

    #[test]
    fn sub_paths_must_be_relative_without_backsteps() {
        let e = env(&[("P", "../x")]);
        let mut m = vm("v", "/m");
        assert_eq!(sub_path(&m, &e).unwrap(), None);
        m.sub_path = Some("a/b".into());
        assert_eq!(sub_path(&m, &e).unwrap().as_deref(), Some("a/b"));
        m.sub_path = Some("/abs".into());
        assert!(sub_path(&m, &e).is_err());
        m.sub_path = Some("a/../../b".into());
        assert!(sub_path(&m, &e).is_err());
        m.sub_path = None;
        m.sub_path_expr = Some("$(P)".into());
        assert!(sub_path(&m, &e).is_err(), "expanded paths are checked too");
    }

    #[test]
    fn refused_sub_paths_get_the_kubelet_messages() {
        if !subpath::tests::need_root() {
            return;
        }
        let dir = subpath::tests::TestDir::new();
        let vol = dir.path().join("vol");
        let pod_dir = dir.path().join("pod");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&vol).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, vol.join("escape")).unwrap();
        std::os::unix::fs::symlink("nowhere", vol.join("dangling")).unwrap();
        let volume = MountedVolume {
            host_path: vol.clone(),
            read_only: false,
            image: None,
            block: false,
        };
        let m = vm("v", "/m");
        let err = |sub| {
            prepare_sub_path(&volume, sub, &pod_dir, &m, "c", 0)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err("escape"),
            "failed to prepare subPath for volumeMount \"v\" of container \"c\""
        );
        assert_eq!(
            err("dangling/x"),
            "failed to create subPath directory for volumeMount \"v\" of container \"c\""
        );
        assert!(!vol.join("nowhere").exists());
        assert!(!subpath::tests::mounted_at_or_under(&pod_dir));
    }

    #[test]
    fn recursive_read_only_follows_the_mode_and_the_runtime() {
        let mount = |mode: Option<&str>, propagation: Option<&str>| {
            let mut m = vm("v", "/m");
            m.recursive_read_only = mode.map(str::to_string);
            m.mount_propagation = propagation.map(str::to_string);
            m
        };
        let rro = |m: &VolumeMount, ro: bool, runtime: bool| {
            crate::pod_core::spec::recursive_read_only(m, ro, runtime)
        };
        for runtime in [true, false] {
            assert_eq!(rro(&mount(None, None), true, runtime), Ok(false));
            assert_eq!(
                rro(&mount(Some("Disabled"), None), false, runtime),
                Ok(false)
            );
            assert_eq!(
                rro(&mount(Some("IfPossible"), None), true, runtime),
                Ok(runtime)
            );
        }
        assert_eq!(
            rro(&mount(Some("Enabled"), Some("None")), true, true),
            Ok(true)
        );
        let refused = [
            (
                mount(Some("Enabled"), None),
                true,
                false,
                "not supported by the runtime",
            ),
            (
                mount(Some("IfPossible"), None),
                false,
                true,
                "it is not read-only",
            ),
            (
                mount(Some("Enabled"), Some("HostToContainer")),
                true,
                true,
                "propagation",
            ),
            (
                mount(Some("Sometimes"), None),
                true,
                true,
                "unknown recursive read-only mode",
            ),
        ];
        for (m, ro, runtime, want) in refused {
            let err = rro(&m, ro, runtime).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn mounts_carry_paths_read_only_and_propagation() {
        let dir = subpath::tests::TestDir::new();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        let volumes = PodVolumes::from([
            (
                "cfg".to_string(),
                MountedVolume {
                    host_path: "/r/pods/u/volumes/kubernetes.io~configmap/cfg".into(),
                    read_only: true,
                    image: None,
                    block: false,
                },
            ),
            (
                "data".to_string(),
                MountedVolume {
                    host_path: data.clone(),
                    read_only: false,
                    image: None,
                    block: false,
                },
            ),
        ]);
        let mut ro = vm("data", "/ro");
        ro.read_only = Some(true);
        ro.recursive_read_only = Some("Enabled".into());
        let mut sub = vm("data", "/per-pod");
        sub.sub_path_expr = Some("$(POD_NAME)".into());
        let mut bidi = vm("data", "/shared");
        bidi.mount_propagation = Some("Bidirectional".into());
        let c = Container {
            name: "c".into(),
            volume_mounts: Some(vec![vm("cfg", "/etc/cfg"), ro, sub, bidi]),
            ..Default::default()
        };
        if !subpath::tests::need_root() {
            return;
        }
        let pod_dir = dir.path().join("pod");
        let kv = [("POD_NAME".to_string(), "web-0".to_string())];
        let m = container_mounts(&c, &volumes, &ImageVolumes::new(), &kv, &pod_dir, true);
        let cleaned = subpath::clean_sub_paths(&pod_dir);
        let all = m.unwrap();
        assert!(all.image_sub_paths.is_empty());
        let m = all.mounts;
        assert_eq!(cleaned.unwrap(), 1, "the subPathExpr mount");
        assert_eq!(m.len(), 4);
        assert_eq!(
            (m[0].container_path.as_str(), m[0].readonly),
            ("/etc/cfg", true),
            "configMap volumes are read-only"
        );
        assert_eq!(
            m[0].host_path,
            "/r/pods/u/volumes/kubernetes.io~configmap/cfg"
        );
        assert!(m[1].readonly && m[1].recursive_read_only);
        assert!(!m[2].readonly);
        assert_eq!(
            PathBuf::from(&m[2].host_path),
            pod_dir.join("volume-subpaths/data/c/2"),
            "the subPath's bind mount, at the mount's index"
        );
        assert!(data.join("web-0").is_dir());
        assert_eq!(
            m[3].propagation,
            cri::MountPropagation::PropagationBidirectional as i32
        );
        assert_eq!(
            m[0].propagation,
            cri::MountPropagation::PropagationPrivate as i32
        );
        let missing = Container {
            name: "c".into(),
            volume_mounts: Some(vec![vm("nope", "/x")]),
            ..Default::default()
        };
        assert_eq!(
            container_mounts(
                &missing,
                &volumes,
                &ImageVolumes::new(),
                &kv,
                &pod_dir,
                true
            )
            .unwrap_err()
            .to_string(),
            "cannot find volume \"nope\" to mount into container \"c\""
        );
    }

    /// An image volume is mounted by the runtime from the pulled image,
    /// read-only, with no host path; one not pulled, or mounted with a
    /// subPath, is refused.
    #[test]
    fn image_volumes_are_mounted_by_the_runtime() {
        let volumes: PodVolumes = [(
            "img".to_string(),
            MountedVolume {
                host_path: PathBuf::new(),
                read_only: true,
                image: Some("example.com/data:1".into()),
                block: false,
            },
        )]
        .into();
        let spec = cri::ImageSpec {
            image: "sha256:abc".into(),
            user_specified_image: "example.com/data:1".into(),
            ..Default::default()
        };
        let images: ImageVolumes = [("img".to_string(), spec.clone())].into();
        let c = Container {
            name: "c".into(),
            volume_mounts: Some(vec![vm("img", "/data")]),
            ..Default::default()
        };
        let pod_dir = Path::new("/nonexistent/pod");
        let all = container_mounts(&c, &volumes, &images, &[], pod_dir, true).unwrap();
        assert!(all.image_sub_paths.is_empty());
        let m = all.mounts;
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].image, Some(spec));
        assert_eq!(m[0].host_path, "");
        assert_eq!(m[0].container_path, "/data");
        assert!(m[0].readonly, "image volumes are read-only");

        let err =
            container_mounts(&c, &volumes, &ImageVolumes::new(), &[], pod_dir, true).unwrap_err();
        assert!(err.to_string().contains("is not pulled"), "{err}");
        // A subPath (or subPathExpr) of an image volume is the runtime's to
        // resolve: the mount names the image, and the sub path goes beside.
        let mut sub = vm("img", "data");
        sub.sub_path = Some("dir/sub".into());
        let mut expr = vm("img", "/by-pod");
        expr.sub_path_expr = Some("pods/$(POD)".into());
        let mut escape = vm("img", "/up");
        escape.sub_path = Some("../etc".into());
        let with_sub = Container {
            name: "c".into(),
            volume_mounts: Some(vec![sub, expr, vm("img", "/whole")]),
            ..Default::default()
        };
        let env = [("POD".to_string(), "web-1".to_string())];
        let all = container_mounts(&with_sub, &volumes, &images, &env, pod_dir, true).unwrap();
        let paths: Vec<&str> = all
            .mounts
            .iter()
            .map(|m| m.container_path.as_str())
            .collect();
        assert_eq!(paths, ["/data", "/by-pod", "/whole"]);
        assert!(
            all.mounts
                .iter()
                .all(|m| m.host_path.is_empty() && m.image.is_some())
        );
        let subs: Vec<(&str, &str)> = all
            .image_sub_paths
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(subs, [("/by-pod", "pods/web-1"), ("/data", "dir/sub")]);
        // The kubelet's checks of any subPath hold for image volumes too.
        let escaping = Container {
            name: "c".into(),
            volume_mounts: Some(vec![escape]),
            ..Default::default()
        };
        let err = container_mounts(&escaping, &volumes, &images, &[], pod_dir, true).unwrap_err();
        assert!(err.to_string().contains("must not contain '..'"), "{err}");
    }

    #[test]
    fn volume_devices_pass_block_volumes() {
        let block = |read_only| MountedVolume {
            host_path: PathBuf::from("/dev/loop7"),
            read_only,
            image: None,
            block: true,
        };
        let volumes: PodVolumes = [
            ("rw".to_string(), block(false)),
            ("ro".to_string(), block(true)),
            (
                "fs".to_string(),
                MountedVolume {
                    host_path: PathBuf::from("/data"),
                    ..MountedVolume::default()
                },
            ),
        ]
        .into();
        let dev = |name: &str, path: &str| k8s_openapi::api::core::v1::VolumeDevice {
            name: name.into(),
            device_path: path.into(),
        };
        let c = |devices| Container {
            name: "c".into(),
            volume_devices: Some(devices),
            ..Default::default()
        };
        let got = container_devices(
            &c(vec![dev("rw", "/dev/xvda"), dev("ro", "/dev/xvdb")]),
            &volumes,
        )
        .unwrap();
        assert_eq!(
            got.iter()
                .map(|d| (
                    d.container_path.as_str(),
                    d.host_path.as_str(),
                    d.permissions.as_str()
                ))
                .collect::<Vec<_>>(),
            [
                ("/dev/xvda", "/dev/loop7", "mrw"),
                ("/dev/xvdb", "/dev/loop7", "r")
            ]
        );
        assert!(container_devices(&c(vec![dev("fs", "/dev/x")]), &volumes).is_err());
        assert!(container_devices(&c(vec![dev("nope", "/dev/x")]), &volumes).is_err());
        let err = container_devices(&c(vec![dev("rw", "dev/x")]), &volumes).unwrap_err();
        assert!(
            err.to_string().contains("must be an absolute path"),
            "{err}"
        );
    }
}
