//! A container's `volumeMounts` as CRI mounts, as the kubelet's `makeMounts`
//! (pkg/kubelet/kubelet_pods.go): the volume's host path (or a `subPath`, or a
//! `subPathExpr` expanded from the container's environment, inside it),
//! read-only when the mount or the volume plugin says so, and the mount
//! propagation mode.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, VolumeMount};

use super::{Error, Result};

/// A pod volume ready to be mounted into its containers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountedVolume {
    /// Where the volume is on the node.
    pub host_path: PathBuf,
    /// True when the plugin only allows read-only mounts (configMap, secret,
    /// downwardAPI, projected).
    pub read_only: bool,
}

/// The pod's volumes that are set up, by volume name.
pub type PodVolumes = BTreeMap<String, MountedVolume>;

/// Expands `$(VAR)` references in a `subPathExpr` from `env` (`$$` is a
/// literal `$`), as the kubelet's `ExpandContainerVolumeMounts`.
///
/// # Errors
/// [`Error::Mount`] naming the variables that are undefined or empty.
pub fn expand_sub_path_expr(expr: &str, env: &BTreeMap<String, String>) -> Result<String> {
    let missing = std::cell::RefCell::new(BTreeSet::new());
    let out = crate::expansion::expand(expr, |name| {
        let value = env.get(name).filter(|v| !v.is_empty()).cloned();
        if value.is_none() {
            missing.borrow_mut().insert(name.to_string());
        }
        Some(value.unwrap_or_default())
    });
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

/// The host path of `sub` inside the volume at `volume`: created as a
/// directory with the volume's mode when missing, then resolved (symlinks
/// followed) and required to stay inside the volume, as the kubelet's
/// `SafeMakeDir` and `PrepareSafeSubpath`.
///
/// # Errors
/// [`Error::Mount`] when it cannot be created or resolves outside the volume.
pub fn resolve_sub_path(volume: &Path, sub: &str, mount: &str, container: &str) -> Result<PathBuf> {
    let fail = || {
        Error::Mount(format!(
            "failed to prepare subPath for volumeMount {mount:?} of container {container:?}"
        ))
    };
    let root = volume.canonicalize().map_err(|_| fail())?;
    let path = volume.join(sub);
    if fs::symlink_metadata(&path).is_err() {
        let mode = fs::metadata(&root)
            .map_err(|_| fail())?
            .permissions()
            .mode()
            & 0o7777;
        let create_fail = || {
            Error::Mount(format!(
                "failed to create subPath directory for volumeMount {mount:?} of container {container:?}"
            ))
        };
        // Each missing directory gets the volume's mode, umask or not, as the
        // kubelet's `doSafeMakeDir` (mkdirat, then fchmod to the mode).
        let mut dir = volume.to_path_buf();
        for part in Path::new(sub).components() {
            dir.push(part);
            if fs::symlink_metadata(&dir).is_ok() {
                continue;
            }
            fs::DirBuilder::new()
                .mode(mode)
                .create(&dir)
                .map_err(|_| create_fail())?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode))
                .map_err(|_| create_fail())?;
        }
    }
    let resolved = path.canonicalize().map_err(|_| fail())?;
    if !resolved.starts_with(&root) {
        return Err(fail());
    }
    Ok(resolved)
}

/// The CRI mounts of container `c` from the pod's set-up `volumes`, with
/// `env` (the container's environment) for `subPathExpr`.
///
/// `recursiveReadOnly: Enabled` asks the runtime for a recursive read-only
/// mount; `IfPossible` stays a plain read-only mount.
///
/// # Errors
/// [`Error::Mount`] for a mount of a volume that is not set up, a bad sub
/// path or propagation (the container waits with `CreateContainerConfigError`).
pub fn container_mounts(
    c: &Container,
    volumes: &PodVolumes,
    env: &[(String, String)],
) -> Result<Vec<cri::Mount>> {
    let env: BTreeMap<String, String> = env.iter().cloned().collect();
    let mut mounts = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let Some(vol) = volumes.get(&m.name) else {
            return Err(Error::Mount(format!(
                "cannot find volume {:?} to mount into container {:?}",
                m.name, c.name
            )));
        };
        let host_path = match sub_path(m, &env)? {
            Some(sub) => resolve_sub_path(&vol.host_path, &sub, &m.name, &c.name)?,
            None => vol.host_path.clone(),
        };
        let container_path = if m.mount_path.starts_with('/') {
            m.mount_path.clone()
        } else {
            format!("/{}", m.mount_path)
        };
        let read_only = m.read_only.unwrap_or(false) || vol.read_only;
        mounts.push(cri::Mount {
            container_path,
            host_path: host_path.to_string_lossy().into_owned(),
            readonly: read_only,
            propagation: propagation(m.mount_propagation.as_deref())? as i32,
            recursive_read_only: read_only && m.recursive_read_only.as_deref() == Some("Enabled"),
            ..Default::default()
        });
    }
    Ok(mounts)
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
    fn sub_paths_resolve_inside_the_volume_only() {
        let dir = tempfile::tempdir().unwrap();
        let vol = dir.path().join("vol");
        fs::create_dir(&vol).unwrap();
        fs::set_permissions(&vol, fs::Permissions::from_mode(0o777)).unwrap();
        let made = resolve_sub_path(&vol, "a/b", "v", "c").unwrap();
        assert!(made.is_dir());
        assert_eq!(made, vol.canonicalize().unwrap().join("a/b"));
        for d in ["a", "a/b"] {
            let mode = fs::metadata(vol.join(d)).unwrap().permissions().mode() & 0o7777;
            assert_eq!(mode, 0o777, "{d}: the volume's mode, whatever the umask");
        }
        // A symlink inside the volume to a file inside it is followed.
        fs::write(vol.join("real"), "x").unwrap();
        std::os::unix::fs::symlink("real", vol.join("link")).unwrap();
        assert_eq!(
            resolve_sub_path(&vol, "link", "v", "c").unwrap(),
            vol.canonicalize().unwrap().join("real")
        );
        // A symlink out of the volume is refused.
        std::os::unix::fs::symlink("/etc", vol.join("escape")).unwrap();
        let err = resolve_sub_path(&vol, "escape", "v", "c").unwrap_err();
        assert_eq!(
            err.to_string(),
            "failed to prepare subPath for volumeMount \"v\" of container \"c\""
        );
    }

    #[test]
    fn mounts_carry_paths_read_only_and_propagation() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        fs::create_dir(&data).unwrap();
        let volumes = PodVolumes::from([
            (
                "cfg".to_string(),
                MountedVolume {
                    host_path: "/r/pods/u/volumes/kubernetes.io~configmap/cfg".into(),
                    read_only: true,
                },
            ),
            (
                "data".to_string(),
                MountedVolume {
                    host_path: data.clone(),
                    read_only: false,
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
        let kv = [("POD_NAME".to_string(), "web-0".to_string())];
        let m = container_mounts(&c, &volumes, &kv).unwrap();
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
            data.canonicalize().unwrap().join("web-0")
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
            container_mounts(&missing, &volumes, &kv)
                .unwrap_err()
                .to_string(),
            "cannot find volume \"nope\" to mount into container \"c\""
        );
    }
}
