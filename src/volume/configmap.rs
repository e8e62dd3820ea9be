//! The configMap volume plugin (pkg/volume/configmap): the keys of a ConfigMap
//! (`data` and `binaryData`) as files, all of them or the `items` listed, with
//! `defaultMode` or each item's `mode`. Written with the atomic writer on the
//! node's disk, under `kubernetes.io~configmap`.

use k8s_openapi::api::core::v1::{ConfigMap, KeyToPath};

use super::atomic_writer::{FileProjection, Payload};
use super::{DEFAULT_MODE, Error, Result, file_mode, to_uid};

/// The plugin's directory name under `<pod>/volumes/`.
pub const PLUGIN_DIR: &str = "kubernetes.io~configmap";

/// The files of `config_map` as the kubelet's `configmap.MakePayload`:
/// every key with `default_mode` (0644 when unset) without `items`, else each
/// item's key at its path with its mode. A `None` config map is an empty one
/// (a missing optional source).
///
/// # Errors
/// [`Error::Payload`] when an item names a key the config map lacks and the
/// source is not `optional`.
pub fn payload(
    items: Option<&[KeyToPath]>,
    config_map: Option<&ConfigMap>,
    default_mode: Option<i32>,
    default_user: Option<i64>,
    optional: bool,
) -> Result<Payload> {
    let mode = default_mode.unwrap_or(DEFAULT_MODE);
    let data = config_map.and_then(|c| c.data.as_ref());
    let binary = config_map.and_then(|c| c.binary_data.as_ref());
    let mut out = Payload::new();
    let file = |bytes: Vec<u8>, mode: i32, user: Option<i64>| FileProjection {
        data: bytes,
        mode: file_mode(mode),
        fs_user: to_uid(user),
    };
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (k, v) in data.into_iter().flatten() {
                out.insert(k.clone(), file(v.clone().into_bytes(), mode, default_user));
            }
            for (k, v) in binary.into_iter().flatten() {
                out.insert(k.clone(), file(v.0.clone(), mode, default_user));
            }
        }
        Some(items) => {
            for item in items {
                let bytes = if let Some(v) = data.and_then(|d| d.get(&item.key)) {
                    v.clone().into_bytes()
                } else if let Some(v) = binary.and_then(|d| d.get(&item.key)) {
                    v.0.clone()
                } else if optional {
                    continue;
                } else {
                    return Err(Error::Payload(format!(
                        "configmap references non-existent config key: {}",
                        item.key
                    )));
                };
                out.insert(
                    item.path.clone(),
                    file(bytes, item.mode.unwrap_or(mode), item.user.or(default_user)),
                );
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn cm() -> ConfigMap {
        ConfigMap {
            data: Some([("a".into(), "1".into()), ("b".into(), "2".into())].into()),
            binary_data: Some([("bin".into(), ByteString(vec![0, 1]))].into()),
            ..Default::default()
        }
    }

    fn item(key: &str, path: &str, mode: Option<i32>) -> KeyToPath {
        KeyToPath {
            key: key.into(),
            path: path.into(),
            mode,
            user: None,
        }
    }

    #[test]
    fn all_keys_with_default_mode() {
        let p = payload(None, Some(&cm()), Some(0o400), None, false).unwrap();
        let got: Vec<_> = p
            .iter()
            .map(|(k, f)| (k.as_str(), f.data.clone(), f.mode))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a", b"1".to_vec(), 0o400),
                ("b", b"2".to_vec(), 0o400),
                ("bin", vec![0, 1], 0o400)
            ]
        );
        let default = payload(None, Some(&cm()), None, None, false).unwrap();
        assert_eq!(default["a"].mode, 0o644);
    }

    #[test]
    fn items_choose_keys_paths_and_modes() {
        let items = [item("a", "x/first", Some(0o600)), item("bin", "b", None)];
        let p = payload(Some(&items), Some(&cm()), Some(0o444), None, false).unwrap();
        assert_eq!(p.keys().collect::<Vec<_>>(), ["b", "x/first"]);
        assert_eq!(
            (p["x/first"].data.as_slice(), p["x/first"].mode),
            (&b"1"[..], 0o600)
        );
        assert_eq!(p["b"].mode, 0o444);
    }

    #[test]
    fn missing_key_fails_unless_optional() {
        let items = [item("nope", "n", None), item("a", "a", None)];
        let err = payload(Some(&items), Some(&cm()), None, None, false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "configmap references non-existent config key: nope"
        );
        let p = payload(Some(&items), Some(&cm()), None, None, true).unwrap();
        assert_eq!(p.keys().collect::<Vec<_>>(), ["a"]);
        assert!(
            payload(Some(&items), None, None, None, true)
                .unwrap()
                .is_empty()
        );
    }
}
