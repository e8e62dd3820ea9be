//! The credential providers against real plugin processes: a shell script
//! that answers as its environment says and counts its runs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::*;
use crate::fake_api::FakeApi;

/// The plugin: counts its runs in `$COUNT`, keeps its request in
/// `$COUNT.request`, then answers as `$MODE` says.
const PLUGIN: &str = r#"#!/bin/sh
echo run >> "$COUNT"
cat > "$COUNT.request"
V=credentialprovider.kubelet.k8s.io/v1
answer() {
  printf '{"kind":"CredentialProviderResponse","apiVersion":"%s","cacheKeyType":"%s"%s,"auth":{"registry.example.com":{"username":"u","password":"%s"}}}' \
    "$V" "${KEY:-Registry}" "${DURATION:+,\"cacheDuration\":\"$DURATION\"}" "${PASSWORD:-p}"
}
case "$MODE" in
  good) answer ;;
  slow) sleep 0.5; answer ;;
  token) PASSWORD=$(sed 's/.*"serviceAccountToken":"\([^"]*\)".*/\1/' "$COUNT.request"); answer ;;
  hang) sleep 1000 & echo $! > "$COUNT.child"; wait ;;
  crash) echo "no credentials for you" >&2; exit 3 ;;
  garbage) echo "not json at all" ;;
  huge) head -c 104857600 /dev/zero ;;
  wrong-version) V=credentialprovider.kubelet.k8s.io/v1beta1; answer ;;
  bad-key) KEY=Nonsense; answer ;;
  unknown-field) printf '{"kind":"CredentialProviderResponse","apiVersion":"%s","cacheKeyType":"Image","auth":{"r.io":{"username":"u","password":"hunter2","email":"e"}}}' "$V" ;;
esac
"#;

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    /// A plugin directory with the plugin as `test-plugin`.
    fn new() -> Self {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let plugin = bin.join("test-plugin");
        std::fs::write(&plugin, PLUGIN).unwrap();
        std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self { dir }
    }

    fn count_file(&self) -> PathBuf {
        self.dir.path().join("count")
    }

    fn runs(&self) -> usize {
        std::fs::read_to_string(self.count_file())
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    fn request(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.dir.path().join("count.request")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// Providers of one plugin in `mode` with `env` besides, and `extra`
    /// provider fields (YAML flow entries).
    fn providers(
        &self,
        client: Client,
        mode: &str,
        env: &[(&str, &str)],
        extra: &str,
    ) -> CredentialProviders {
        let mut vars = format!(
            "{{name: MODE, value: {mode}}}, {{name: COUNT, value: '{}'}}",
            self.count_file().display()
        );
        for (k, v) in env {
            vars.push_str(&format!(", {{name: {k}, value: '{v}'}}"));
        }
        let config = self.dir.path().join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
- name: test-plugin
  matchImages: ['*.example.com', 'registry.example.com/private']
  defaultCacheDuration: 10m
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  env: [{vars}]
{extra}"
            ),
        )
        .unwrap();
        CredentialProviders::load(&config, &self.dir.path().join("bin"), client)
            .unwrap()
            .with_timeout(Duration::from_secs(2))
    }
}

fn pod() -> PodIdentity {
    PodIdentity {
        namespace: "default".into(),
        name: "p".into(),
        uid: "pod-uid".into(),
        service_account: String::new(),
    }
}

fn only(results: Vec<Result<Provided, String>>) -> Result<Provided, String> {
    assert_eq!(results.len(), 1, "{results:?}");
    results.into_iter().next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_kept_under_its_key_and_shared_by_concurrent_lookups() {
    let setup = Setup::new();
    let api = FakeApi::default();
    let providers = setup.providers(api.client(), "slow", &[], "");
    let identity = pod();
    let lookups = (0..8).map(|_| providers.provide("registry.example.com/app", &identity));
    for result in futures::future::join_all(lookups).await {
        let p = only(result).unwrap();
        assert_eq!(p.provider, "test-plugin");
        assert_eq!(p.service_account, None);
        assert_eq!(p.credentials[0].registry, "registry.example.com");
        assert_eq!(p.credentials[0].username, "u");
        assert_eq!(p.credentials[0].password.expose(), "p");
    }
    assert_eq!(setup.runs(), 1, "eight lookups at once share one run");
    let req = setup.request();
    assert_eq!(req["kind"], "CredentialProviderRequest");
    assert_eq!(req["apiVersion"], "credentialprovider.kubelet.k8s.io/v1");
    assert_eq!(req["image"], "registry.example.com/app");
    assert!(req.get("serviceAccountToken").is_none(), "{req}");
    // Kept per registry: another image of it is answered from the cache.
    only(
        providers
            .provide("registry.example.com/other", &pod())
            .await,
    )
    .unwrap();
    assert_eq!(setup.runs(), 1);
    // An image no matchImages entry covers runs nothing.
    assert!(
        providers
            .provide("elsewhere.io/app", &pod())
            .await
            .is_empty()
    );
    assert_eq!(setup.runs(), 1);
    let families = crate::metrics::metrics().encode().unwrap();
    assert!(
        families.contains(
            "kubelet_credential_provider_plugin_duration_count{plugin_name=\"test-plugin\"}"
        ),
        "{families}"
    );
    // One configuration in use, by its hash (other tests load their own).
    let info: Vec<&str> = families
        .lines()
        .filter(|l| l.starts_with("kubelet_credential_provider_config_info{hash=\"sha256:"))
        .collect();
    assert_eq!(info.len(), 1, "{families}");
    assert!(info[0].ends_with("} 1"), "{}", info[0]);
}

#[tokio::test]
async fn a_zero_duration_or_an_image_key_keeps_nothing_for_other_images() {
    let setup = Setup::new();
    let api = FakeApi::default();
    let providers = setup.providers(api.client(), "good", &[("DURATION", "0s")], "");
    for _ in 0..2 {
        only(providers.provide("registry.example.com/app", &pod()).await).unwrap();
    }
    assert_eq!(setup.runs(), 2, "cacheDuration 0s keeps nothing");
    let setup = Setup::new();
    let providers = setup.providers(api.client(), "good", &[("KEY", "Image")], "");
    only(providers.provide("registry.example.com/a", &pod()).await).unwrap();
    only(providers.provide("registry.example.com/a", &pod()).await).unwrap();
    only(providers.provide("registry.example.com/b", &pod()).await).unwrap();
    assert_eq!(setup.runs(), 2, "kept for the image alone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_plugins_fail_their_own_lookup_and_nothing_else() {
    let cases = [
        ("hang", "context deadline exceeded"),
        ("crash", "exit status: 3: no credentials for you"),
        ("garbage", "error reading GVK from response"),
        ("huge", "output larger than 1048576 bytes"),
        (
            "wrong-version",
            "did not match expected apiVersion:credentialprovider.kubelet.k8s.io/v1, actual apiVersion:credentialprovider.kubelet.k8s.io/v1beta1",
        ),
        (
            "unknown-field",
            "error decoding credential provider plugin response from stdout",
        ),
        ("bad-key", "did not return a valid cacheKeyType: Nonsense"),
    ];
    let api = FakeApi::default();
    for (mode, want) in cases {
        let setup = Setup::new();
        let providers = setup.providers(api.client(), mode, &[], "");
        let started = Instant::now();
        let e = only(providers.provide("registry.example.com/app", &pod()).await).unwrap_err();
        assert!(e.contains(want), "{mode}: {e}");
        assert!(
            e.starts_with(
                "credential provider test-plugin failed for image registry.example.com/app"
            ),
            "{mode}: {e}"
        );
        assert!(!e.contains("hunter2"), "{mode}: a password in {e}");
        if mode == "huge" {
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "not cut at its limit"
            );
        }
        if mode == "hang" {
            // The plugin's group is killed: its background child too.
            let child = std::fs::read_to_string(setup.dir.path().join("count.child")).unwrap();
            let proc = PathBuf::from(format!("/proc/{}", child.trim()));
            let deadline = Instant::now() + Duration::from_secs(5);
            while alive(&proc) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(!alive(&proc), "the hung plugin's child still runs");
        }
    }
    let errors = crate::metrics::metrics().encode().unwrap();
    assert!(
        errors.contains(
            "kubelet_credential_provider_plugin_errors_total{plugin_name=\"test-plugin\"}"
        ),
        "{errors}"
    );
}

/// A process that exists and is no zombie.
fn alive(proc: &Path) -> bool {
    std::fs::read_to_string(proc.join("stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or_default()
            .trim_start()
            .starts_with('Z')
    })
}

#[tokio::test]
async fn the_pods_service_account_token_and_annotations_go_to_the_plugin() {
    let setup = Setup::new();
    let api = FakeApi::default();
    api.put(
        "serviceaccounts",
        "builder",
        serde_json::json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": { "name": "builder", "namespace": "default", "uid": "sa-uid",
                "annotations": { "example.com/role": "puller", "example.com/extra": "x", "other": "y" } },
        }),
    );
    let attrs = "  tokenAttributes:
    serviceAccountTokenAudience: registry.example.com
    cacheType: ServiceAccount
    requireServiceAccount: true
    requiredServiceAccountAnnotationKeys: [example.com/role]
    optionalServiceAccountAnnotationKeys: [example.com/extra, example.com/absent]
";
    let providers = setup.providers(api.client(), "good", &[], attrs);
    // No service account, one required: nothing, and no run.
    assert!(
        providers
            .provide("registry.example.com/app", &pod())
            .await
            .is_empty()
    );
    assert_eq!(setup.runs(), 0);
    let with_sa = PodIdentity {
        service_account: "builder".into(),
        ..pod()
    };
    let p = only(
        providers
            .provide("registry.example.com/app", &with_sa)
            .await,
    )
    .unwrap();
    assert_eq!(
        p.service_account,
        Some(ServiceAccountCoordinates {
            uid: "sa-uid".into(),
            namespace: "default".into(),
            name: "builder".into(),
        })
    );
    let req = setup.request();
    assert!(
        req["serviceAccountToken"]
            .as_str()
            .is_some_and(|t| t.starts_with("token-builder-")),
        "{req}"
    );
    assert_eq!(
        req["serviceAccountAnnotations"],
        serde_json::json!({ "example.com/role": "puller", "example.com/extra": "x" })
    );
    let tokens: Vec<_> = api
        .take_requests()
        .into_iter()
        .filter(|r| r.line().contains("serviceaccounts/builder/token"))
        .collect();
    assert_eq!(tokens.len(), 1);
    assert_eq!(
        tokens[0].body["spec"]["audiences"],
        serde_json::json!(["registry.example.com"])
    );
    assert_eq!(tokens[0].body["spec"]["boundObjectRef"]["uid"], "pod-uid");
    assert_eq!(
        tokens[0].body["metadata"]["uid"], "sa-uid",
        "on the account's UID"
    );
    // Kept per service account: the same pod again runs nothing.
    only(
        providers
            .provide("registry.example.com/app", &with_sa)
            .await,
    )
    .unwrap();
    assert_eq!(setup.runs(), 1);
    // A service account without the required annotation: nothing.
    api.put(
        "serviceaccounts",
        "plain",
        serde_json::json!({ "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": { "name": "plain", "namespace": "default", "uid": "plain-uid" } }),
    );
    let plain = PodIdentity {
        service_account: "plain".into(),
        ..pod()
    };
    assert!(
        providers
            .provide("registry.example.com/app", &plain)
            .await
            .is_empty()
    );
    assert_eq!(setup.runs(), 1);
}

#[tokio::test]
async fn the_token_as_password_needs_cache_type_token() {
    let api = FakeApi::default();
    api.put(
        "serviceaccounts",
        "builder",
        serde_json::json!({ "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": { "name": "builder", "namespace": "default", "uid": "sa-uid" } }),
    );
    let with_sa = PodIdentity {
        service_account: "builder".into(),
        ..pod()
    };
    let attrs = |cache: &str| {
        format!(
            "  tokenAttributes: {{serviceAccountTokenAudience: aud, cacheType: {cache}, requireServiceAccount: true}}\n"
        )
    };
    let setup = Setup::new();
    let providers = setup.providers(api.client(), "token", &[], &attrs("ServiceAccount"));
    let e = only(
        providers
            .provide("registry.example.com/app", &with_sa)
            .await,
    )
    .unwrap_err();
    assert!(
        e.contains("returned the service account token as the password"),
        "{e}"
    );
    let setup = Setup::new();
    let providers = setup.providers(api.client(), "token", &[], &attrs("Token"));
    let p = only(
        providers
            .provide("registry.example.com/app", &with_sa)
            .await,
    )
    .unwrap();
    assert!(
        p.credentials[0]
            .password
            .expose()
            .starts_with("token-builder-")
    );
}

#[test]
fn a_missing_directory_plugin_or_bad_config_stops_the_start() {
    let setup = Setup::new();
    let config = setup.dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- {name: absent, matchImages: [x.io], defaultCacheDuration: 1m, apiVersion: credentialprovider.kubelet.k8s.io/v1}\n",
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let client = FakeApi::default().client();
    let bin = setup.dir.path().join("bin");
    let err = |config: &Path, bin: &Path| {
        CredentialProviders::load(config, bin, client.clone())
            .err()
            .unwrap()
    };
    let e = err(&config, &setup.dir.path().join("nothing"));
    assert!(
        e.contains("plugin binary directory") && e.ends_with("did not exist"),
        "{e}"
    );
    let e = err(&config, &bin);
    assert!(
        e.starts_with("plugin binary executable") && e.contains("absent"),
        "{e}"
    );
    let e = err(&setup.dir.path().join("none.yaml"), &bin);
    assert!(e.contains("unable to access path"), "{e}");
    let empty = setup.dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let e = err(&empty, &bin);
    assert!(
        e.contains("no configuration files found in directory"),
        "{e}"
    );
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders: []\n",
    )
    .unwrap();
    let e = err(&config, &bin);
    assert!(e.contains("at least 1 item in plugins is required"), "{e}");
}

#[test]
fn the_configuration_hash_is_the_kubelets() {
    // sha256 over each file's big-endian u64 length and content.
    let files = vec![("a".to_string(), "ab".to_string())];
    let mut bytes = 2u64.to_be_bytes().to_vec();
    bytes.extend_from_slice(b"ab");
    use sha2::Digest as _;
    let want = format!("sha256:{:x}", sha2::Sha256::digest(&bytes));
    assert_eq!(config_hash(&files), want);
}
