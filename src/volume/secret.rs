//! The secret volume plugin (pkg/volume/secret): the keys of a Secret as files,
//! all of them or the `items` listed, with `defaultMode` or each item's `mode`.
//! Written with the atomic writer onto a tmpfs (secrets never touch the node's
//! disk), under `kubernetes.io~secret`.

use k8s_openapi::api::core::v1::{KeyToPath, Secret};

use super::atomic_writer::{FileProjection, Payload};
use super::{DEFAULT_MODE, Error, Result, file_mode, to_uid};

/// The plugin's directory name under `<pod>/volumes/`.
pub const PLUGIN_DIR: &str = "kubernetes.io~secret";

/// The files of `secret` as the kubelet's `secret.MakePayload`: every key of
/// `data` with `default_mode` (0644 when unset) without `items`, else each
/// item's key at its path with its mode. A `None` secret is an empty one (a
/// missing optional source).
///
/// # Errors
/// [`Error::Payload`] when an item names a key the secret lacks and the source
/// is not `optional`.
pub fn payload(
    items: Option<&[KeyToPath]>,
    secret: Option<&Secret>,
    default_mode: Option<i32>,
    default_user: Option<i64>,
    optional: bool,
) -> Result<Payload> {
    let mode = default_mode.unwrap_or(DEFAULT_MODE);
    let data = secret.and_then(|s| s.data.as_ref());
    let mut out = Payload::new();
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (k, v) in data.into_iter().flatten() {
                out.insert(
                    k.clone(),
                    FileProjection {
                        data: v.0.clone(),
                        mode: file_mode(mode),
                        fs_user: to_uid(default_user),
                    },
                );
            }
        }
        Some(items) => {
            for item in items {
                let Some(v) = data.and_then(|d| d.get(&item.key)) else {
                    if optional {
                        continue;
                    }
                    return Err(Error::Payload(format!(
                        "references non-existent secret key: {}",
                        item.key
                    )));
                };
                out.insert(
                    item.path.clone(),
                    FileProjection {
                        data: v.0.clone(),
                        mode: file_mode(item.mode.unwrap_or(mode)),
                        fs_user: to_uid(item.user.or(default_user)),
                    },
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

    fn secret() -> Secret {
        Secret {
            data: Some(
                [
                    ("user".into(), ByteString(b"admin".to_vec())),
                    ("pass".into(), ByteString(b"s3cr3t".to_vec())),
                ]
                .into(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn all_keys_or_items_with_modes() {
        let all = payload(None, Some(&secret()), Some(0o440), None, false).unwrap();
        assert_eq!(all.keys().collect::<Vec<_>>(), ["pass", "user"]);
        assert_eq!(all["pass"].data, b"s3cr3t");
        assert_eq!(all["user"].mode, 0o440);
        let items = [KeyToPath {
            key: "pass".into(),
            path: "creds/password".into(),
            mode: Some(0o400),
            user: Some(1000),
        }];
        let some = payload(Some(&items), Some(&secret()), None, None, false).unwrap();
        assert_eq!(some.len(), 1);
        let f = &some["creds/password"];
        assert_eq!((f.mode, f.fs_user), (0o400, Some(1000)));
    }

    #[test]
    fn missing_key_fails_unless_optional() {
        let items = [KeyToPath {
            key: "nope".into(),
            path: "n".into(),
            ..Default::default()
        }];
        let err = payload(Some(&items), Some(&secret()), None, None, false).unwrap_err();
        assert_eq!(err.to_string(), "references non-existent secret key: nope");
        assert!(
            payload(Some(&items), None, None, None, true)
                .unwrap()
                .is_empty()
        );
    }
}
