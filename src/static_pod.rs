//! The static pod file source, as the kubelet's `config` package reads
//! `staticPodPath` (pkg/kubelet/config/file.go, common.go): a manifest file,
//! or a directory of them (not recursive; names starting with `.` and
//! anything but regular files, or links to them, skipped; the rest read in
//! name order, whatever their extension), each
//! one Pod in YAML or JSON of at most 10 MiB. A manifest becomes a static
//! pod with the kubelet's defaults (`applyDefaults`): a UID derived from the
//! manifest and where it came from (unless it sets one), the node name
//! appended to the pod's name, namespace `default`, `spec.nodeName`,
//! requests defaulted from limits, the
//! `kubernetes.io/config.hash` and `kubernetes.io/config.source`
//! annotations, a toleration of every `NoExecute` taint, phase `Pending`.
//! Pods that reference API objects (service accounts, secrets, config maps,
//! resource claims, persistent volume claims) are refused, as
//! `HasAPIObjectReference`. Two manifests of the same pod: the later one in
//! name order wins.
//!
//! [`decode`] turns one manifest into a static pod; [`list`] reads a path;
//! [`mirror_pod`] makes the API server's copy of a static pod and
//! [`is_mirror_of`] checks one.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, Toleration};
use sha2::{Digest, Sha256};

/// The largest manifest read, bytes (the kubelet's `maxConfigLength`).
pub const MAX_MANIFEST_BYTES: u64 = 10 << 20;

pub use crate::labels::{
    CONFIG_HASH_ANNOTATION, CONFIG_MIRROR_ANNOTATION, CONFIG_SOURCE_ANNOTATION,
};
pub use crate::pod_core::spec::{annotation, is_mirror, is_static};

/// The source name of manifest files.
pub const FILE_SOURCE: &str = "file";

/// Where a manifest came from.
#[derive(Clone, Copy, Debug)]
pub enum Origin<'a> {
    /// A file of `staticPodPath`.
    File(&'a Path),
    /// The body of `staticPodURL`.
    Url(&'a str),
}

impl Origin<'_> {
    /// The source name (`kubernetes.io/config.source`): `file` or `http`.
    #[must_use]
    pub fn source(&self) -> &'static str {
        match self {
            Origin::File(_) => FILE_SOURCE,
            Origin::Url(_) => HTTP_SOURCE,
        }
    }

    fn shown(&self) -> String {
        match self {
            Origin::File(path) => path.display().to_string(),
            Origin::Url(url) => (*url).to_string(),
        }
    }
}

/// The source name of `staticPodURL`.
pub const HTTP_SOURCE: &str = "http";

/// Decodes the manifest `text` read from `path` into the static pod it
/// defines on node `node`, with the kubelet's defaults (see the module).
///
/// # Errors
/// The text is not one Pod (`<path>: couldn't parse as pod(<why>), please
/// check config file`, as the kubelet words it), the pod has no name, or it
/// references an API object (`static pods may not reference <what>`).
pub fn decode(text: &[u8], path: &Path, node: &str) -> Result<Pod, String> {
    decode_from(text, Origin::File(path), node)
}

/// [`decode`] of a manifest from `origin`: one from a URL has its UID
/// derived from the URL (`url:<url>`) and no toleration added, as the
/// kubelet's http source.
///
/// # Errors
/// As [`decode`].
pub fn decode_from(text: &[u8], origin: Origin<'_>, node: &str) -> Result<Pod, String> {
    let shown = origin.shown();
    let parse_error =
        |why: String| format!("{shown}: couldn't parse as pod({why}), please check config file");
    let value: serde_json::Value =
        crate::yaml::from_slice(text).map_err(|e| parse_error(e.to_string()))?;
    let kind = value
        .get("kind")
        .and_then(|k| k.as_str())
        .unwrap_or_default();
    let version = value
        .get("apiVersion")
        .and_then(|k| k.as_str())
        .unwrap_or_default();
    if kind != "Pod" || version != "v1" {
        return Err(parse_error(format!(
            "expected apiVersion v1 and kind Pod, got {version:?} {kind:?}"
        )));
    }
    let mut pod: Pod = serde_json::from_value(value).map_err(|e| parse_error(e.to_string()))?;
    let name = pod.metadata.name.clone().filter(|n| !n.is_empty());
    let Some(name) = name else {
        return Err(format!("{shown}: invalid pod: name is needed for the pod"));
    };
    if let Some(what) = api_object_reference(&pod) {
        return Err(format!("{shown}: static pods may not reference {what}"));
    }
    let uid = match pod.metadata.uid.clone().filter(|u| !u.is_empty()) {
        Some(uid) => uid,
        None => derived_uid(text, node, origin),
    };
    pod.metadata.uid = Some(uid.clone());
    pod.metadata.name = Some(format!("{name}-{}", node.to_lowercase()));
    if pod.metadata.namespace.as_deref().is_none_or(str::is_empty) {
        pod.metadata.namespace = Some("default".into());
    }
    let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(CONFIG_HASH_ANNOTATION.into(), uid);
    annotations.insert(CONFIG_SOURCE_ANNOTATION.into(), origin.source().into());
    let spec = pod.spec.get_or_insert_with(Default::default);
    spec.node_name = Some(node.to_string());
    // As the API's defaulting (`SetDefaults_Pod`): a limit without a
    // request is also the request.
    let containers = spec
        .containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten());
    for c in containers {
        if let Some(r) = c.resources.as_mut()
            && let Some(limits) = r.limits.clone()
        {
            let requests = r.requests.get_or_insert_with(BTreeMap::new);
            for (name, q) in limits {
                requests.entry(name).or_insert(q);
            }
        }
    }
    if let Origin::File(_) = origin {
        spec.tolerations
            .get_or_insert_with(Vec::new)
            .push(Toleration {
                operator: Some("Exists".into()),
                effect: Some("NoExecute".into()),
                ..Default::default()
            });
    }
    pod.status.get_or_insert_with(Default::default).phase = Some("Pending".into());
    Ok(pod)
}

/// The UID of a manifest that sets none: 32 hex digits of a digest of its
/// text and of where it came from (`host:<node>file:<path>`, or
/// `url:<url>`), so the same file at the same path keeps its UID and a
/// changed or moved one gets a new one (the kubelet hashes the decoded pod
/// the same way).
fn derived_uid(text: &[u8], node: &str, origin: Origin<'_>) -> String {
    let mut h = Sha256::new();
    h.update(text);
    match origin {
        Origin::File(path) => h.update(format!("host:{node}file:{}", path.display()).as_bytes()),
        Origin::Url(url) => h.update(format!("url:{url}").as_bytes()),
    }
    let digest = h.finalize();
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// The static pods of a `staticPodURL` response `body` for node `node`, as
/// the kubelet's http source: one Pod, or else a `v1` `PodList` whose every
/// item must be a good pod (one bad item drops the whole answer); by
/// `namespace/name`, the first of a duplicate name kept.
///
/// # Errors
/// The body is neither, or an item is refused (as [`decode`] words it).
pub fn decode_url_body(
    body: &[u8],
    url: &str,
    node: &str,
) -> Result<BTreeMap<String, Pod>, String> {
    let origin = Origin::Url(url);
    let single = decode_from(body, origin, node);
    let as_list = |single_error: String| -> Result<BTreeMap<String, Pod>, String> {
        let value: serde_json::Value =
            crate::yaml::from_slice(body).map_err(|_| single_error.clone())?;
        if value.get("kind").and_then(|k| k.as_str()) != Some("PodList") {
            return Err(single_error);
        }
        let items = value
            .get("items")
            .and_then(|i| i.as_array())
            .cloned()
            .unwrap_or_default();
        let mut pods = BTreeMap::new();
        for mut item in items {
            // Items of a list carry no kind of their own.
            if let Some(o) = item.as_object_mut() {
                o.entry("apiVersion").or_insert_with(|| "v1".into());
                o.entry("kind").or_insert_with(|| "Pod".into());
            }
            let text = serde_json::to_vec(&item).map_err(|e| format!("{url}: {e}"))?;
            let pod = decode_from(&text, origin, node)?;
            pods.entry(key(&pod)).or_insert(pod);
        }
        Ok(pods)
    };
    match single {
        Ok(pod) => Ok(BTreeMap::from([(key(&pod), pod)])),
        Err(e) => as_list(e),
    }
}

/// The key of `pod` in the pod sources' maps: `namespace/name`.
#[must_use]
pub fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The first API object `pod` references, as `HasAPIObjectReference`
/// words it (`serviceaccounts`, `secrets (imagePullSecrets)`, …); None when
/// it references none.
fn api_object_reference(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let sa = spec
        .service_account_name
        .as_deref()
        .or(spec.service_account.as_deref());
    if sa.is_some_and(|s| !s.is_empty()) {
        return Some("serviceaccounts".into());
    }
    if spec
        .image_pull_secrets
        .as_ref()
        .is_some_and(|s| !s.is_empty())
    {
        return Some("secrets (imagePullSecrets)".into());
    }
    if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
        return Some("resourceclaims".into());
    }
    let containers = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten());
    for c in containers {
        for e in c.env.iter().flatten() {
            let from = e.value_from.as_ref();
            if from.is_some_and(|f| f.secret_key_ref.is_some()) {
                return Some("secrets (env)".into());
            }
            if from.is_some_and(|f| f.config_map_key_ref.is_some()) {
                return Some("configmaps (env)".into());
            }
        }
        for e in c.env_from.iter().flatten() {
            if e.secret_ref.is_some() {
                return Some("secrets (envFrom)".into());
            }
            if e.config_map_ref.is_some() {
                return Some("configmaps (envFrom)".into());
            }
        }
    }
    for v in spec.volumes.iter().flatten() {
        let kind = if v.secret.is_some() {
            "secrets"
        } else if v.config_map.is_some() {
            "configmaps"
        } else if v.persistent_volume_claim.is_some() || v.ephemeral.is_some() {
            "persistentvolumeclaims"
        } else if v.csi.is_some() {
            "csidrivers"
        } else if v.projected.as_ref().is_some_and(|p| {
            p.sources.iter().flatten().any(|s| {
                s.secret.is_some()
                    || s.config_map.is_some()
                    || s.service_account_token.is_some()
                    || s.cluster_trust_bundle.is_some()
            })
        }) {
            "API objects (projected)"
        } else {
            continue;
        };
        return Some(format!("{kind} (volume {})", v.name));
    }
    None
}

/// The mirror pod of `static_pod` on the node named `node` with UID
/// `node_uid`, as the kubelet's `CreateMirrorPod`: a copy keeping every
/// annotation, with `kubernetes.io/config.mirror` set to the static pod's
/// hash, one owner reference to the Node (controller, no
/// `blockOwnerDeletion`), and no UID, status or resource version of its own
/// (the API server gives them).
///
/// # Errors
/// The static pod has no `kubernetes.io/config.hash`, or `node_uid` is
/// empty (the kubelet's "failed to get node UID").
pub fn mirror_pod(static_pod: &Pod, node: &str, node_uid: &str) -> Result<Pod, String> {
    if node_uid.is_empty() {
        return Err("failed to get node UID".into());
    }
    let hash = config_hash(static_pod).ok_or("the static pod has no kubernetes.io/config.hash")?;
    let mut mirror = static_pod.clone();
    mirror.metadata.uid = None;
    mirror.metadata.resource_version = None;
    mirror.status = None;
    mirror
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(CONFIG_MIRROR_ANNOTATION.into(), hash.to_string());
    mirror.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.to_string(),
            uid: node_uid.to_string(),
            controller: Some(true),
            block_owner_deletion: None,
        },
    ]);
    Ok(mirror)
}

/// The static pod's `kubernetes.io/config.hash`.
#[must_use]
pub fn config_hash(pod: &Pod) -> Option<&str> {
    annotation(pod, CONFIG_HASH_ANNOTATION)
}

/// True when `mirror` is the current mirror pod of `static_pod`, as the
/// kubelet's `IsMirrorPodOf`: same name and namespace, its
/// `kubernetes.io/config.mirror` equal to the static pod's hash, and not
/// being deleted (else the kubelet deletes it and creates it again).
#[must_use]
pub fn is_mirror_of(mirror: &Pod, static_pod: &Pod) -> bool {
    let mirrored = mirror
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_MIRROR_ANNOTATION))
        .map(String::as_str);
    mirror.metadata.deletion_timestamp.is_none()
        && mirror.metadata.name == static_pod.metadata.name
        && mirror.metadata.namespace == static_pod.metadata.namespace
        && mirrored.is_some()
        && mirrored == config_hash(static_pod)
}

/// What [`list`] read: the static pods, and one message per manifest it
/// could not use.
#[derive(Debug, Default)]
pub struct Listing {
    /// The pods, by `namespace/name` (a later manifest in name order
    /// replaces an earlier one of the same pod).
    pub pods: BTreeMap<String, Pod>,
    /// The manifest each pod came from, by the same key.
    pub files: BTreeMap<String, PathBuf>,
    /// Why manifests were left out.
    pub errors: Vec<String>,
}

/// Reads the static pods at `path` (a manifest or a directory of them) for
/// node `node`. A path that does not exist holds no pods (the kubelet logs
/// it and goes on).
#[must_use]
pub fn list(path: &Path, node: &str) -> Listing {
    let mut out = Listing::default();
    let Ok(meta) = std::fs::metadata(path) else {
        return out;
    };
    let files: Vec<PathBuf> = if meta.is_dir() {
        let Ok(entries) = std::fs::read_dir(path) else {
            out.errors
                .push(format!("{}: cannot read the directory", path.display()));
            return out;
        };
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            // Regular files, links to them followed (as the kubelet's
            // `os.Stat`); directories are not entered.
            .map(|e| e.path())
            .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()))
            .collect();
        files.sort();
        files
    } else if meta.is_file() {
        vec![path.to_path_buf()]
    } else {
        out.errors.push(format!(
            "{}: path is not a directory or file",
            path.display()
        ));
        return out;
    };
    for file in files {
        match read(&file).and_then(|text| decode(&text, &file, node)) {
            Ok(pod) => {
                out.files.insert(key(&pod), file.clone());
                out.pods.insert(key(&pod), pod);
            }
            Err(e) => out.errors.push(e),
        }
    }
    out
}

/// Reads at most [`MAX_MANIFEST_BYTES`] of `file`; a longer one is refused.
fn read(file: &Path) -> Result<Vec<u8>, String> {
    let f = std::fs::File::open(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut text = Vec::new();
    f.take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(|e| format!("{}: {e}", file.display()))?;
    if text.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(format!(
            "{}: the manifest is larger than {MAX_MANIFEST_BYTES} bytes",
            file.display()
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEB: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: busybox\n";

    #[test]
    fn a_manifest_becomes_a_static_pod_with_the_kubelets_defaults() {
        let pod = decode(WEB.as_bytes(), Path::new("/m/web.yaml"), "Node-1").unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("web-node-1"));
        assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
        let uid = pod.metadata.uid.clone().unwrap();
        assert_eq!(uid.len(), 32);
        let a = pod.metadata.annotations.clone().unwrap();
        assert_eq!(a[CONFIG_HASH_ANNOTATION], uid);
        assert_eq!(a[CONFIG_SOURCE_ANNOTATION], "file");
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("Node-1"));
        let t = &spec.tolerations.unwrap()[0];
        assert_eq!(
            (t.operator.as_deref(), t.effect.as_deref(), t.key.as_deref()),
            (Some("Exists"), Some("NoExecute"), None)
        );
        assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Pending"));
        // Same text, same path: same UID; moved or changed: another.
        let again = decode(WEB.as_bytes(), Path::new("/m/web.yaml"), "Node-1").unwrap();
        assert_eq!(again.metadata.uid.as_deref(), Some(uid.as_str()));
        let moved = decode(WEB.as_bytes(), Path::new("/m/web2.yaml"), "Node-1").unwrap();
        assert_ne!(moved.metadata.uid.as_deref(), Some(uid.as_str()));
        let changed = format!("{WEB}  restartPolicy: Never\n");
        let changed = decode(changed.as_bytes(), Path::new("/m/web.yaml"), "Node-1").unwrap();
        assert_ne!(changed.metadata.uid.as_deref(), Some(uid.as_str()));
        // JSON too, and a UID of its own is kept.
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j","namespace":"kube-system","uid":"fixed"},"spec":{"containers":[{"name":"c","image":"busybox"}]}}"#;
        let pod = decode(json.as_bytes(), Path::new("/m/j.json"), "n").unwrap();
        assert_eq!(
            (
                pod.metadata.uid.as_deref(),
                pod.metadata.namespace.as_deref()
            ),
            (Some("fixed"), Some("kube-system"))
        );
        // Limits without requests are the requests too (Guaranteed).
        let limited = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"l"},"spec":{"containers":[{"name":"c","image":"busybox","resources":{"limits":{"cpu":"1","memory":"1Gi"},"requests":{"cpu":"500m"}}}]}}"#;
        let pod = decode(limited.as_bytes(), Path::new("/m/l.json"), "n").unwrap();
        let r = pod.spec.unwrap().containers[0].resources.clone().unwrap();
        let requests = r.requests.unwrap();
        assert_eq!(requests["cpu"].0, "500m", "a request set is kept");
        assert_eq!(requests["memory"].0, "1Gi");
    }

    #[test]
    fn a_mirror_pod_copies_the_static_pod_and_is_owned_by_the_node() {
        let st = decode(WEB.as_bytes(), Path::new("/m/web.yaml"), "n1").unwrap();
        assert_eq!(
            mirror_pod(&st, "n1", "").unwrap_err(),
            "failed to get node UID"
        );
        let m = mirror_pod(&st, "n1", "node-uid").unwrap();
        assert_eq!(m.metadata.uid, None);
        assert_eq!(m.status, None);
        let a = m.metadata.annotations.clone().unwrap();
        assert_eq!(a[CONFIG_MIRROR_ANNOTATION], a[CONFIG_HASH_ANNOTATION]);
        assert_eq!(a[CONFIG_SOURCE_ANNOTATION], "file");
        let owner = &m.metadata.owner_references.clone().unwrap()[0];
        assert_eq!(
            (
                owner.kind.as_str(),
                owner.name.as_str(),
                owner.uid.as_str(),
                owner.controller
            ),
            ("Node", "n1", "node-uid", Some(true))
        );
        assert_eq!(owner.block_owner_deletion, None);
        assert!(is_mirror_of(&m, &st));
        // Another manifest version (another hash), or a mirror being deleted: not it.
        let changed = format!("{WEB}  restartPolicy: Never\n");
        let st2 = decode(changed.as_bytes(), Path::new("/m/web.yaml"), "n1").unwrap();
        assert!(!is_mirror_of(&m, &st2));
        let mut deleting = m.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(!is_mirror_of(&deleting, &st));
    }

    #[test]
    fn bad_manifests_are_refused_with_the_kubelets_words() {
        let path = Path::new("/m/bad.yaml");
        let cases = [
            ("not: [yaml", "couldn't parse as pod("),
            (
                "apiVersion: v1\nkind: PodList\nitems: []\n",
                "couldn't parse as pod(",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {}\nspec: {containers: []}\n",
                "name is needed for the pod",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  serviceAccountName: sa\n  containers: []\n",
                "static pods may not reference serviceaccounts",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: []\n  volumes:\n  - name: s\n    secret: {secretName: x}\n",
                "static pods may not reference secrets (volume s)",
            ),
            (
                "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    image: i\n    envFrom: [{configMapRef: {name: x}}]\n",
                "static pods may not reference configmaps (envFrom)",
            ),
        ];
        for (text, want) in cases {
            let err = decode(text.as_bytes(), path, "n").unwrap_err();
            assert!(err.starts_with("/m/bad.yaml: "), "{err}");
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn a_directory_is_read_in_name_order_without_hidden_files_or_subdirectories() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("a.yaml"), WEB).unwrap();
        std::fs::write(d.join(".hidden.yaml"), WEB.replace("web", "hidden")).unwrap();
        std::fs::write(d.join("b.bak"), WEB.replace("web", "other")).unwrap();
        std::fs::write(d.join("c.yaml"), "broken: [").unwrap();
        // A later file of the same pod wins.
        std::fs::write(d.join("z.yaml"), format!("{WEB}  restartPolicy: Never\n")).unwrap();
        std::fs::create_dir(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/x.yaml"), WEB.replace("web", "nested")).unwrap();
        // A link to a manifest is read, as the kubelet reads it.
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(
            elsewhere.path().join("l.yaml"),
            WEB.replace("web", "linked"),
        )
        .unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("l.yaml"), d.join("link.yaml")).unwrap();
        std::os::unix::fs::symlink(d.join("sub"), d.join("dirlink")).unwrap();
        let got = list(d, "n");
        let names: Vec<&str> = got.pods.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["default/linked-n", "default/other-n", "default/web-n"]
        );
        let web = &got.pods["default/web-n"];
        assert_eq!(
            web.spec.as_ref().unwrap().restart_policy.as_deref(),
            Some("Never")
        );
        assert_eq!(got.errors.len(), 1, "{:?}", got.errors);
        assert!(got.errors[0].contains("c.yaml"));
        // One file; a path that is not there holds nothing.
        assert_eq!(list(&d.join("a.yaml"), "n").pods.len(), 1);
        assert!(list(&d.join("nothing"), "n").pods.is_empty());
    }

    #[test]
    fn a_manifest_over_ten_mebibytes_is_refused_unread() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.yaml");
        let mut text = WEB.to_string();
        text.push_str(&format!(
            "# {}\n",
            "x".repeat((MAX_MANIFEST_BYTES as usize) + 1)
        ));
        std::fs::write(&big, text).unwrap();
        let got = list(&big, "n");
        assert!(got.pods.is_empty());
        assert!(got.errors[0].contains("larger than"), "{:?}", got.errors);
    }

    #[test]
    fn a_url_serves_a_pod_or_a_list_and_one_bad_item_drops_the_list() {
        let url = "http://example.test/pods";
        let one = decode_url_body(WEB.as_bytes(), url, "n").unwrap();
        let web = &one["default/web-n"];
        assert_eq!(
            web.metadata.annotations.as_ref().unwrap()[CONFIG_SOURCE_ANNOTATION],
            "http"
        );
        assert!(
            web.spec.as_ref().unwrap().tolerations.is_none(),
            "no toleration from a URL"
        );
        // The UID depends on the URL, not a path.
        let elsewhere = decode_url_body(WEB.as_bytes(), "http://other.test/pods", "n").unwrap();
        assert_ne!(web.metadata.uid, elsewhere["default/web-n"].metadata.uid);
        let list = r#"{"apiVersion":"v1","kind":"PodList","items":[
            {"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"busybox"}]}},
            {"metadata":{"name":"b","namespace":"x"},"spec":{"containers":[{"name":"c","image":"busybox"}]}},
            {"metadata":{"name":"a"},"spec":{"containers":[{"name":"d","image":"busybox"}]}}]}"#;
        let pods = decode_url_body(list.as_bytes(), url, "n").unwrap();
        let keys: Vec<&str> = pods.keys().map(String::as_str).collect();
        assert_eq!(keys, ["default/a-n", "x/b-n"]);
        // The first of a duplicate name is kept.
        assert_eq!(
            pods["default/a-n"].spec.as_ref().unwrap().containers[0].name,
            "c"
        );
        let bad = r#"{"apiVersion":"v1","kind":"PodList","items":[
            {"metadata":{"name":"a"},"spec":{"containers":[{"name":"c","image":"busybox"}]}},
            {"metadata":{},"spec":{"containers":[]}}]}"#;
        let err = decode_url_body(bad.as_bytes(), url, "n").unwrap_err();
        assert!(err.contains("name is needed"), "{err}");
        let err = decode_url_body(b"kind: Service\napiVersion: v1\n", url, "n").unwrap_err();
        assert!(
            err.starts_with("http://example.test/pods: couldn't parse as pod("),
            "{err}"
        );
    }
}
