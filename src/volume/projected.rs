//! The projected volume plugin (pkg/volume/projected): configMap, secret,
//! downwardAPI, serviceAccountToken and clusterTrustBundle sources merged into one directory,
//! written with the atomic writer onto a tmpfs under `kubernetes.io~projected`.
//! The `kube-api-access-*` volume that ServiceAccount admission adds to every
//! pod is one: `token`, `ca.crt` from the `kube-root-ca.crt` config map, and
//! `namespace` from the downward API.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, ProjectedVolumeSource, ServiceAccountTokenProjection};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::atomic_writer::{FileProjection, Payload};
use super::token::{DEFAULT_EXPIRATION_SECONDS, TokenKey};
use super::{
    DEFAULT_MODE, Error, Fetched, Result, aggregate, configmap, downward_api, file_mode,
    pod_certificate, secret, to_uid, trust_bundle,
};

/// The plugin's directory name under `<pod>/volumes/`.
pub const PLUGIN_DIR: &str = "kubernetes.io~projected";

/// The token request a `serviceAccountToken` source of `pod` makes.
#[must_use]
pub fn token_key(pod: &Pod, source: &ServiceAccountTokenProjection) -> TokenKey {
    let spec = pod.spec.as_ref();
    TokenKey {
        namespace: pod.metadata.namespace.clone().unwrap_or_default(),
        service_account: spec
            .and_then(|s| s.service_account_name.clone())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".into()),
        audience: source.audience.clone().filter(|a| !a.is_empty()),
        expiration_seconds: source
            .expiration_seconds
            .unwrap_or(DEFAULT_EXPIRATION_SECONDS),
        pod_name: pod.metadata.name.clone().unwrap_or_default(),
        pod_uid: pod.metadata.uid.clone().unwrap_or_default(),
        service_account_uid: None,
    }
}

/// The files of a projected volume, as the kubelet's `collectData`, from the
/// objects and tokens already `fetched`. A token file gets mode 0600 when the
/// pod has an `fsGroup` or the source a user (the ownership change then adds `g+r`).
///
/// # Errors
/// [`Error::Payload`] joining the message of every source that failed (a
/// missing non-optional config map or secret, a missing key, a failed token
/// request); sources that worked are not written then.
pub fn payload(
    source: &ProjectedVolumeSource,
    volume: &str,
    pod: &Pod,
    fetched: &Fetched,
    allocatable: &BTreeMap<String, ApiQuantity>,
) -> Result<Payload> {
    let default_mode = source.default_mode.or(Some(DEFAULT_MODE));
    let default_user = source.default_user;
    let fs_group = pod
        .spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|sc| sc.fs_group)
        .is_some();
    let mut out = Payload::new();
    let mut errors = Vec::new();
    for (index, p) in source.sources.iter().flatten().enumerate() {
        let part = if let Some(cm) = &p.config_map {
            let optional = cm.optional.unwrap_or(false);
            fetched.config_map(&cm.name, optional).and_then(|obj| {
                configmap::payload(
                    cm.items.as_deref(),
                    obj.as_deref(),
                    default_mode,
                    default_user,
                    optional,
                )
            })
        } else if let Some(s) = &p.secret {
            let optional = s.optional.unwrap_or(false);
            fetched.secret(&s.name, optional).and_then(|obj| {
                secret::payload(
                    s.items.as_deref(),
                    obj.as_deref(),
                    default_mode,
                    default_user,
                    optional,
                )
            })
        } else if let Some(d) = &p.downward_api {
            downward_api::payload(
                d.items.as_deref().unwrap_or_default(),
                pod,
                allocatable,
                default_mode,
                default_user,
            )
        } else if let Some(t) = &p.service_account_token {
            let user = t.user.or(default_user);
            let mode = if user.is_some() || fs_group {
                0o600
            } else {
                default_mode.unwrap_or(DEFAULT_MODE)
            };
            fetched.token(&token_key(pod, t)).map(|token| {
                Payload::from([(
                    t.path.clone(),
                    FileProjection {
                        data: token.into_bytes(),
                        mode: file_mode(mode),
                        fs_user: to_uid(user),
                    },
                )])
            })
        } else if let Some(b) = &p.cluster_trust_bundle {
            let optional = b.optional.unwrap_or(false);
            trust_bundle::key(b)
                .and_then(|key| trust_bundle::file(&key, optional, fetched.trust_bundles.get(&key)))
                .map(|anchors| {
                    Payload::from([(
                        b.path.clone(),
                        FileProjection {
                            data: anchors,
                            mode: file_mode(default_mode.unwrap_or(DEFAULT_MODE)),
                            fs_user: to_uid(default_user),
                        },
                    )])
                })
                .map_err(Error::Payload)
        } else if let Some(pc) = &p.pod_certificate {
            // As the kubelet: the item's user over the default, and 0600
            // when a user or an fsGroup owns the files.
            let user = pc.user.or(default_user);
            let mode = if user.is_some() || fs_group {
                0o600
            } else {
                default_mode.unwrap_or(DEFAULT_MODE)
            };
            match fetched.pod_certificates.get(&(volume.to_string(), index)) {
                Some(Ok(creds)) => Ok(pod_certificate::files(pc, creds)
                    .into_iter()
                    .map(|(path, data)| {
                        let file = FileProjection {
                            data,
                            mode: file_mode(mode),
                            fs_user: to_uid(user),
                        };
                        (path, file)
                    })
                    .collect()),
                Some(Err(e)) => Err(Error::Payload(e.clone())),
                None => Err(Error::Payload("credential bundle is not issued yet".into())),
            }
        } else {
            Ok(Payload::new())
        };
        match part {
            Ok(files) => out.extend(files),
            Err(e) => errors.push(e),
        }
    }
    match aggregate(errors) {
        None => Ok(out),
        Some(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;
    use k8s_openapi::api::core::v1::{
        ConfigMap, ConfigMapProjection, DownwardAPIProjection, DownwardAPIVolumeFile, KeyToPath,
        ObjectFieldSelector, VolumeProjection,
    };
    use std::sync::Arc;

    /// The volume ServiceAccount admission adds.
    fn kube_api_access() -> ProjectedVolumeSource {
        ProjectedVolumeSource {
            default_mode: Some(0o644),
            default_user: None,
            sources: Some(vec![
                VolumeProjection {
                    service_account_token: Some(ServiceAccountTokenProjection {
                        expiration_seconds: Some(3607),
                        path: "token".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    config_map: Some(ConfigMapProjection {
                        name: "kube-root-ca.crt".into(),
                        items: Some(vec![KeyToPath {
                            key: "ca.crt".into(),
                            path: "ca.crt".into(),
                            ..Default::default()
                        }]),
                        optional: None,
                    }),
                    ..Default::default()
                },
                VolumeProjection {
                    downward_api: Some(DownwardAPIProjection {
                        items: Some(vec![DownwardAPIVolumeFile {
                            path: "namespace".into(),
                            field_ref: Some(ObjectFieldSelector {
                                api_version: Some("v1".into()),
                                field_path: "metadata.namespace".into(),
                            }),
                            ..Default::default()
                        }]),
                    }),
                    ..Default::default()
                },
            ]),
        }
    }

    #[test]
    fn kube_api_access_has_token_ca_and_namespace() {
        let p = pod("web").container("c", "busybox").build();
        let key = token_key(
            &p,
            &ServiceAccountTokenProjection {
                expiration_seconds: Some(3607),
                path: "token".into(),
                ..Default::default()
            },
        );
        assert_eq!(key.service_account, "default");
        assert_eq!(
            (key.pod_name.as_str(), key.pod_uid.as_str()),
            ("web", "uid-web")
        );
        let mut fetched = Fetched::default();
        fetched.tokens.insert(key, Ok("jwt".into()));
        fetched.config_maps.insert(
            "kube-root-ca.crt".into(),
            Ok(Some(Arc::new(ConfigMap {
                data: Some([("ca.crt".to_string(), "PEM".to_string())].into()),
                ..Default::default()
            }))),
        );
        let out = payload(&kube_api_access(), "v", &p, &fetched, &BTreeMap::new()).unwrap();
        let files: Vec<_> = out
            .iter()
            .map(|(k, f)| {
                (
                    k.as_str(),
                    String::from_utf8(f.data.clone()).unwrap(),
                    f.mode,
                )
            })
            .collect();
        assert_eq!(
            files,
            vec![
                ("ca.crt", "PEM".to_string(), 0o644),
                ("namespace", "default".to_string(), 0o644),
                ("token", "jwt".to_string(), 0o644),
            ]
        );
    }

    #[test]
    fn failures_of_every_source_are_reported_together() {
        let p = pod("web").container("c", "busybox").build();
        let mut fetched = Fetched::default();
        fetched
            .config_maps
            .insert("kube-root-ca.crt".into(), Ok(None));
        let key = token_key(
            &p,
            &ServiceAccountTokenProjection {
                expiration_seconds: Some(3607),
                path: "token".into(),
                ..Default::default()
            },
        );
        fetched
            .tokens
            .insert(key, Err("serviceaccounts \"default\" not found".into()));
        let err = payload(&kube_api_access(), "v", &p, &fetched, &BTreeMap::new()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "[serviceaccounts \"default\" not found, configmap \"kube-root-ca.crt\" not found]"
        );
    }

    #[test]
    fn token_mode_is_0600_with_fs_group() {
        let mut p = pod("web").container("c", "busybox").build();
        p.spec.as_mut().unwrap().security_context = Some(Default::default());
        p.spec
            .as_mut()
            .unwrap()
            .security_context
            .as_mut()
            .unwrap()
            .fs_group = Some(2000);
        let source = ProjectedVolumeSource {
            sources: Some(vec![kube_api_access().sources.unwrap().remove(0)]),
            ..Default::default()
        };
        let key = token_key(
            &p,
            &ServiceAccountTokenProjection {
                expiration_seconds: Some(3607),
                path: "token".into(),
                ..Default::default()
            },
        );
        let mut fetched = Fetched::default();
        fetched.tokens.insert(key, Ok("jwt".into()));
        let out = payload(&source, "v", &p, &fetched, &BTreeMap::new()).unwrap();
        assert_eq!(out["token"].mode, 0o600);
    }

    #[test]
    fn trust_bundles_are_files_with_the_default_mode_and_missing_ones_fail_unless_optional() {
        use k8s_openapi::api::core::v1::ClusterTrustBundleProjection;
        use trust_bundle::TrustKey;
        let p = pod("web").container("c", "busybox").build();
        let projection = |name: &str, optional: bool, path: &str| VolumeProjection {
            cluster_trust_bundle: Some(ClusterTrustBundleProjection {
                name: Some(name.into()),
                optional: Some(optional),
                path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let source = ProjectedVolumeSource {
            default_mode: Some(0o440),
            sources: Some(vec![
                projection("roots", false, "ca.pem"),
                projection("gone", true, "optional.pem"),
            ]),
            ..Default::default()
        };
        let mut fetched = Fetched::default();
        let anchors = b"-----BEGIN CERTIFICATE-----\n".to_vec();
        fetched
            .trust_bundles
            .insert(TrustKey::Name("roots".into()), Ok(Some(anchors.clone())));
        fetched
            .trust_bundles
            .insert(TrustKey::Name("gone".into()), Ok(None));
        let out = payload(&source, "v", &p, &fetched, &BTreeMap::new()).unwrap();
        assert_eq!(out["ca.pem"].data, anchors);
        assert_eq!(out["ca.pem"].mode, 0o440);
        assert_eq!(out["optional.pem"].data, b"");
        // Not optional, and missing: the volume fails in the kubelet's words.
        let source = ProjectedVolumeSource {
            sources: Some(vec![projection("gone", false, "ca.pem")]),
            ..Default::default()
        };
        let err = payload(&source, "v", &p, &fetched, &BTreeMap::new()).unwrap_err();
        assert!(
            err.to_string()
                .contains("clustertrustbundles.certificates.k8s.io \"gone\" not found"),
            "{err}"
        );
    }
}
