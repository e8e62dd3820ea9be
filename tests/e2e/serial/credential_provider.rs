//! Image credential provider plugins: the agent, restarted with
//! `--image-credential-provider-config` and
//! `--image-credential-provider-bin-dir`, pulls a private image from the
//! password-protected test registry for a pod with no pull secret, with the
//! credentials the project's plugin (`tests/e2e/plugins/credential-provider`)
//! gives, and keeps them per registry for the next pod. Hostile plugins (one
//! that hangs, one that crashes, one that prints garbage, one that prints
//! 100 MiB) each fail their own pull with a `FailedCredentialProvider` Event
//! saying why, while the good pull goes on. The agent is restarted with its
//! usual flags at the end. It restarts the agent, so it runs alone.

use std::path::{Path, PathBuf};

use crate::common::registry::{PASSWORD, Registry, USER, private_pod};
use crate::common::*;
use k8s_openapi::api::core::v1::Pod;

/// The loopback address of this test's registry.
const REGISTRY: &str = "127.0.0.1:5445";
/// The hostile plugins, by what they do.
const HOSTILE: [(&str, &str); 4] = [
    ("hang", "context deadline exceeded"),
    ("crash", "exit status: 3: no credentials for you"),
    ("garbage", "error reading GVK from response"),
    ("huge", "output larger than 1048576 bytes"),
];

/// The plugin directory and configuration: the good plugin for
/// `<registry>/private` and one hostile plugin for `<registry>/<mode>`
/// each, counting their runs in `<dir>/<name>.count`.
fn write_plugins(dir: &Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt as _;
    let _ = std::fs::remove_dir_all(dir);
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("plugin dir");
    let script = root().join("tests/e2e/plugins/credential-provider");
    let mut providers = String::new();
    for (name, path, mode) in std::iter::once(("e2e-good", "private", "good"))
        .chain(HOSTILE.iter().map(|(m, _)| (*m, *m, *m)))
    {
        let exe = bin.join(name);
        std::fs::copy(&script, &exe).expect("copy the plugin");
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let count = dir.join(format!("{name}.count"));
        providers.push_str(&format!(
            "- name: {name}
  matchImages: ['{REGISTRY}/{path}']
  defaultCacheDuration: 1h
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  env:
  - {{name: MODE, value: {mode}}}
  - {{name: COUNT, value: '{}'}}
  - {{name: REGISTRY, value: '{REGISTRY}'}}
  - {{name: REGISTRY_USER, value: '{USER}'}}
  - {{name: REGISTRY_PASSWORD, value: '{PASSWORD}'}}
",
            count.display()
        ));
    }
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n{providers}"
        ),
    )
    .expect("write the configuration");
    (config, bin)
}

fn runs(dir: &Path, name: &str) -> usize {
    std::fs::read_to_string(dir.join(format!("{name}.count")))
        .map(|s| s.lines().count())
        .unwrap_or(0)
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
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_credential_provider_plugin_authenticates_pulls_and_hostile_ones_fail_alone() {
    let registry = Registry::start(REGISTRY);
    let client = client().await;
    let ns = namespace(&client, "e2e-credprov").await;
    let image = format!("{REGISTRY}/private/busybox:{ns}");
    registry.push_busybox(&image);
    let dir = local().join("credential-providers");
    let (config, bin) = write_plugins(&dir);
    restart_agent_with_flags(&[
        "--image-credential-provider-config",
        &config.display().to_string(),
        "--image-credential-provider-bin-dir",
        &bin.display().to_string(),
    ]);
    let sleep = ["sh", "-c", "sleep 3600"];

    // The hostile plugins' pods first: the good pull must not wait for them.
    for (mode, _) in HOSTILE {
        let image = format!("{REGISTRY}/{mode}/busybox:1");
        create(
            &client,
            &ns,
            &private_pod(mode, &image, "Always", &sleep, &[]),
        )
        .await;
    }
    let pid_file = dir.join("hang.count.pid");
    for _ in 0..300 {
        if pid_file.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let hang_pid = std::fs::read_to_string(&pid_file).expect("the hanging plugin's pid");
    let hang_proc = PathBuf::from(format!("/proc/{}", hang_pid.trim()));
    create(
        &client,
        &ns,
        &private_pod("first", &image, "Always", &sleep, &[]),
    )
    .await;
    wait_for(&client, &ns, "first", 90, "Running", phase("Running")).await;
    assert_eq!(runs(&dir, "e2e-good"), 1);
    assert!(
        alive(&hang_proc),
        "the good pull waited for the hanging plugin"
    );

    // Each hostile plugin fails its own pull, with an Event saying why.
    for (mode, why) in HOSTILE {
        wait_for_events(&client, &ns, Involving::Name(mode), 120, why, |events| {
            events
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("FailedCredentialProvider")
                        && e.message.as_deref().is_some_and(|m| {
                            m.contains(&format!("credential provider {mode} failed"))
                                && m.contains(why)
                        })
                })
                .then_some(())
        })
        .await;
        wait_for(&client, &ns, mode, 60, "ErrImagePull", |p: Option<&Pod>| {
            matches!(
                p.and_then(waiting).as_deref(),
                Some("ErrImagePull" | "ImagePullBackOff")
            )
        })
        .await;
    }

    assert!(!alive(&hang_proc), "the hanging plugin was not killed");

    // The credentials are kept per registry: the next pod's pull runs no
    // plugin.
    create(
        &client,
        &ns,
        &private_pod("second", &image, "Always", &sleep, &[]),
    )
    .await;
    wait_for(&client, &ns, "second", 90, "Running", phase("Running")).await;
    assert_eq!(runs(&dir, "e2e-good"), 1, "the cached answer is used");

    // /configz shows the providers in effect beside the KubeletConfiguration.
    let path = format!("/api/v1/nodes/{}/proxy/configz", node_name());
    let (code, out, err) = kubectl(&["get", "--raw", &path], "");
    assert_eq!(code, 0, "{err}");
    let configz: serde_json::Value = serde_json::from_str(&out).expect("configz JSON");
    let shown = &configz["imageCredentialProviders"];
    assert!(
        shown["hash"]
            .as_str()
            .is_some_and(|h| h.starts_with("sha256:")),
        "{shown}"
    );
    let names: Vec<&str> = shown["providers"]
        .as_array()
        .expect("providers")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, ["e2e-good", "hang", "crash", "garbage", "huge"]);
    assert!(configz["kubeletconfig"].is_object());

    drop_namespace(&client, &ns).await;
    restart_agent(None);
    drop(registry);
}
