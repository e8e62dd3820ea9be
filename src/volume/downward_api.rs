//! The downwardAPI volume plugin (pkg/volume/downwardapi): pod fields
//! (`fieldRef`: name, namespace, uid, labels, annotations) and container
//! resources (`resourceFieldRef`: limits and requests of cpu, memory and
//! ephemeral-storage, with a divisor) as files. Written with the atomic writer
//! onto a tmpfs under `kubernetes.io~downward-api`, and rewritten when the
//! pod's labels or annotations change.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, Pod, ResourceFieldSelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::atomic_writer::{FileProjection, Payload};
use super::{DEFAULT_MODE, Error, Result, file_mode, to_uid};

/// The plugin's directory name under `<pod>/volumes/`.
pub const PLUGIN_DIR: &str = "kubernetes.io~downward-api";

/// A map as the downward API shows it (`FormatMap`): `key="value"` lines, keys
/// sorted, values quoted as Go's `strconv.Quote` does, no final newline.
#[must_use]
pub fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    map.into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `s` in double quotes with Go's escapes (`\"`, `\\`, `\n`, `\t`, `\x00`, …);
/// printable Unicode is kept as is.
#[must_use]
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => {
                let n = c as u32;
                if n <= 0xffff {
                    out.push_str(&format!("\\u{n:04x}"));
                } else {
                    out.push_str(&format!("\\U{n:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The value of a pod field as the kubelet's `ExtractFieldPathAsString`.
///
/// # Errors
/// [`Error::Payload`] for a field the downward API volume does not offer.
pub fn field_value(pod: &Pod, path: &str) -> Result<String> {
    let m = &pod.metadata;
    let subscript = |prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|rest| rest.strip_prefix("['"))
            .and_then(|rest| rest.strip_suffix("']"))
    };
    if let Some(key) = subscript("metadata.annotations") {
        return Ok(m
            .annotations
            .as_ref()
            .and_then(|a| a.get(key).cloned())
            .unwrap_or_default());
    }
    if let Some(key) = subscript("metadata.labels") {
        return Ok(m
            .labels
            .as_ref()
            .and_then(|a| a.get(key).cloned())
            .unwrap_or_default());
    }
    Ok(match path {
        "metadata.annotations" => format_map(m.annotations.as_ref()),
        "metadata.labels" => format_map(m.labels.as_ref()),
        "metadata.name" => m.name.clone().unwrap_or_default(),
        "metadata.namespace" => m.namespace.clone().unwrap_or_default(),
        "metadata.uid" => m.uid.clone().unwrap_or_default(),
        other => return Err(Error::Payload(format!("unsupported fieldPath: {other}"))),
    })
}

/// The value of a container resource (`resourceFieldRef`), as
/// [`crate::resource::container_resource_value`].
///
/// # Errors
/// [`Error::Payload`] for an unknown container or resource, or a bad quantity.
pub fn resource_value(
    pod: &Pod,
    selector: &ResourceFieldSelector,
    allocatable: &BTreeMap<String, ApiQuantity>,
) -> Result<String> {
    crate::resource::container_resource_value(
        pod,
        selector.container_name.as_deref().unwrap_or_default(),
        &selector.resource,
        selector.divisor.as_ref(),
        allocatable,
    )
    .map_err(|e| Error::Payload(e.to_string()))
}

/// The files of a downwardAPI volume (or projection) as the kubelet's
/// `downwardapi.CollectData`: one file per item, with its mode or `default_mode`.
///
/// # Errors
/// [`Error::Payload`] for every item whose value cannot be computed (joined).
pub fn payload(
    items: &[DownwardAPIVolumeFile],
    pod: &Pod,
    allocatable: &BTreeMap<String, ApiQuantity>,
    default_mode: Option<i32>,
    default_user: Option<i64>,
) -> Result<Payload> {
    let mut out = Payload::new();
    let mut errors = Vec::new();
    for item in items {
        let value = if let Some(f) = &item.field_ref {
            field_value(pod, &f.field_path)
        } else if let Some(r) = &item.resource_field_ref {
            resource_value(pod, r, allocatable)
        } else {
            Ok(String::new())
        };
        match value {
            Ok(v) => {
                out.insert(
                    item.path.clone(),
                    FileProjection {
                        data: v.into_bytes(),
                        mode: file_mode(item.mode.or(default_mode).unwrap_or(DEFAULT_MODE)),
                        fs_user: to_uid(item.user.or(default_user)),
                    },
                );
            }
            Err(e) => errors.push(e.to_string()),
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(Error::Payload(errors.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;
    use k8s_openapi::api::core::v1::{ObjectFieldSelector, ResourceRequirements};

    fn field(path: &str, field: &str) -> DownwardAPIVolumeFile {
        DownwardAPIVolumeFile {
            path: path.into(),
            field_ref: Some(ObjectFieldSelector {
                field_path: field.into(),
                api_version: None,
            }),
            ..Default::default()
        }
    }

    fn resource(path: &str, res: &str, divisor: Option<&str>) -> DownwardAPIVolumeFile {
        DownwardAPIVolumeFile {
            path: path.into(),
            resource_field_ref: Some(ResourceFieldSelector {
                container_name: Some("c".into()),
                resource: res.into(),
                divisor: divisor.map(|d| ApiQuantity(d.into())),
            }),
            ..Default::default()
        }
    }

    fn allocatable() -> BTreeMap<String, ApiQuantity> {
        [
            ("cpu".to_string(), ApiQuantity("2".into())),
            ("memory".to_string(), ApiQuantity("8Gi".into())),
        ]
        .into()
    }

    #[test]
    fn pod_fields_as_the_kubelet_writes_them() {
        let mut p = pod("web")
            .label("app", "web")
            .label("tier", "front \"end\"")
            .container("c", "busybox")
            .build();
        p.metadata.annotations = Some([("note".to_string(), "a\nb".to_string())].into());
        let items = [
            field("name", "metadata.name"),
            field("ns", "metadata.namespace"),
            field("uid", "metadata.uid"),
            field("labels", "metadata.labels"),
            field("annotations", "metadata.annotations"),
            field("app", "metadata.labels['app']"),
            field("missing", "metadata.labels['nope']"),
        ];
        let out = payload(&items, &p, &allocatable(), Some(0o400), None).unwrap();
        let text = |k: &str| String::from_utf8(out[k].data.clone()).unwrap();
        assert_eq!(text("name"), "web");
        assert_eq!(text("ns"), "default");
        assert_eq!(text("uid"), "uid-web");
        assert_eq!(text("labels"), "app=\"web\"\ntier=\"front \\\"end\\\"\"");
        assert_eq!(text("annotations"), "note=\"a\\nb\"");
        assert_eq!(text("app"), "web");
        assert_eq!(text("missing"), "");
        assert_eq!(out["name"].mode, 0o400);
    }

    #[test]
    fn resources_use_divisors_and_fall_back_to_allocatable() {
        let mut p = pod("web").container("c", "busybox").build();
        p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            limits: Some([("memory".to_string(), ApiQuantity("64Mi".into()))].into()),
            requests: Some([("cpu".to_string(), ApiQuantity("250m".into()))].into()),
            ..Default::default()
        });
        let items = [
            resource("cpu_limit", "limits.cpu", None),
            resource("cpu_request", "requests.cpu", None),
            resource("cpu_request_m", "requests.cpu", Some("1m")),
            resource("mem_limit", "limits.memory", None),
            resource("mem_limit_mi", "limits.memory", Some("1Mi")),
            resource("mem_request", "requests.memory", None),
        ];
        let out = payload(&items, &p, &allocatable(), None, None).unwrap();
        let text = |k: &str| String::from_utf8(out[k].data.clone()).unwrap();
        assert_eq!(text("cpu_limit"), "2", "node allocatable");
        assert_eq!(text("cpu_request"), "1", "250m rounds up to 1 core");
        assert_eq!(text("cpu_request_m"), "250");
        assert_eq!(text("mem_limit"), (64 << 20).to_string());
        assert_eq!(text("mem_limit_mi"), "64");
        assert_eq!(text("mem_request"), "0");
        assert_eq!(out["cpu_limit"].mode, 0o644);
    }

    #[test]
    fn unknown_fields_and_containers_fail() {
        let p = pod("web").container("c", "busybox").build();
        let mut bad = resource("x", "limits.cpu", None);
        bad.resource_field_ref.as_mut().unwrap().container_name = Some("nope".into());
        let err = payload(
            &[field("n", "spec.nodeName"), bad],
            &p,
            &allocatable(),
            None,
            None,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "unsupported fieldPath: spec.nodeName, container nope not found"
        );
    }

    #[test]
    fn go_quote_escapes_like_strconv() {
        assert_eq!(go_quote("plain"), "\"plain\"");
        assert_eq!(go_quote("tab\there"), "\"tab\\there\"");
        assert_eq!(go_quote("\u{1}"), "\"\\x01\"");
        assert_eq!(go_quote("ünï"), "\"ünï\"");
        assert_eq!(go_quote("back\\slash"), "\"back\\\\slash\"");
    }
}
