//! Scenarios of what must not outlive a pod: a force-deleted pod's probe
//! workers, their metrics and what the managers hold of it; and a runtime
//! error while probing, which the kubelet throws away rather than count.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ExecAction, Probe};
use kube::runtime::watcher;
use tonic::Code;

use super::{IMAGE, Node, edit_container, reconcile, state};
use crate::fixtures::pod;

fn exec_probe(command: &str) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec![command.into()]),
        }),
        period_seconds: Some(1),
        failure_threshold: Some(1),
        ..Default::default()
    }
}

/// The `prober_probe_total` lines of pod `uid`.
fn probe_series(uid: &str) -> Vec<String> {
    let label = format!("pod_uid=\"{uid}\"");
    crate::metrics::metrics()
        .encode_probes()
        .expect("encode")
        .lines()
        .filter(|l| l.starts_with("prober_probe_total{") && l.contains(&label))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_deleted_pod_stops_its_probes_and_every_manager_forgets_it() {
    let mut n = Node::start().await;
    let uid = "uid-forced";
    let failing = "registry.example/forced:1";
    n.cri.fail_pull(failing, "pull access denied");
    let mut p = pod("forced")
        .container("c", IMAGE)
        .container("d", failing)
        .build();
    edit_container(&mut p, |c| {
        c.readiness_probe = Some(exec_probe("ready"));
        c.liveness_probe = Some(exec_probe("live"));
    });
    let forced = n.bind(p);
    crate::metrics::metrics().pod_seen(uid);
    n.sync(&forced).await;
    for _ in 0..50 {
        if probe_series(uid).len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(probe_series(uid).len(), 2, "{:?}", probe_series(uid));
    assert!(n.ctx.images().tracks(uid), "a pull back-off");
    assert_eq!(n.ctx.status().cached(), 1);
    // Force-deleted: gone from the API and the watch at once; no sync sees it.
    n.api.remove_pod("forced");
    n.pods.api_event(watcher::Event::Delete(forced.clone()));
    super::super::housekeeping::forget_gone(&n.ctx, n.ctx.pods());
    assert_eq!(n.ctx.prober().pods(), Vec::<String>::new());
    assert_eq!(probe_series(uid), Vec::<String>::new());
    assert!(!crate::metrics::metrics().tracks_pod(uid));
    assert!(!n.ctx.images().tracks(uid));
    assert_eq!(n.ctx.status().cached(), 0);
    // A sync that was under way when the pod went starts no worker again.
    let stale = reconcile(Arc::new(forced.clone()), n.ctx.clone());
    let _ = tokio::time::timeout(Duration::from_secs(20), stale).await;
    assert_eq!(n.ctx.prober().pods(), Vec::<String>::new());
    // And nothing probes it any more.
    let execs = n.cri.execs().len();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(n.cri.execs().len(), execs, "{:?}", n.cri.execs());
    assert_eq!(probe_series(uid), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_error_while_probing_is_thrown_away_not_counted_as_a_failure() {
    let mut n = Node::start().await;
    let uid = "uid-errprobe";
    let mut p = pod("errprobe").container("c", IMAGE).build();
    edit_container(&mut p, |c| c.liveness_probe = Some(exec_probe("check")));
    let errprobe = n.bind(p);
    n.sync(&errprobe).await;
    n.cri_calls();
    // Every ExecSync fails in the runtime: the container is not found, then
    // the runtime is unavailable. With a failure threshold of 1, a single
    // counted failure would restart the container.
    for _ in 0..200 {
        n.cri
            .fail_next("ExecSync", Code::NotFound, "container not found");
        n.cri
            .fail_next("ExecSync", Code::Unavailable, "runtime unavailable");
    }
    n.event(
        "Unhealthy",
        "Liveness probe errored and resulted in unknown state",
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    n.sync_watched("errprobe").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new(), "no restart");
    assert_eq!(state(&n.status("errprobe"), "c"), ("running".into(), 0));
    let failed: Vec<String> = probe_series(uid)
        .into_iter()
        .filter(|l| !l.contains("result=\"successful\""))
        .collect();
    assert_eq!(failed, Vec::<String>::new(), "errors are not counted");
    assert!(
        !n.api
            .events()
            .iter()
            .any(|(r, m)| r == "Unhealthy" && m.contains("probe failed")),
        "{:?}",
        n.api.events()
    );
}

/// A private image on a registry that wants `user`/`pass`.
const PRIVATE: &str = "registry.example/private/app:1";

/// Pod `name` running [`PRIVATE`] under `policy`, with `secrets` as its
/// `imagePullSecrets`.
fn private_pod(name: &str, policy: &str, secrets: &[&str]) -> k8s_openapi::api::core::v1::Pod {
    let mut p = pod(name).container("c", PRIVATE).build();
    if let Some(spec) = p.spec.as_mut() {
        spec.image_pull_secrets = Some(
            secrets
                .iter()
                .map(|s| k8s_openapi::api::core::v1::LocalObjectReference { name: (*s).into() })
                .collect(),
        );
    }
    edit_container(&mut p, |c| c.image_pull_policy = Some(policy.into()));
    p
}

/// Stores the pull secret `name` (UID `uid-<name>`) for registry.example
/// with `user` and `pass`.
fn put_pull_secret(n: &Node, name: &str, user: &str, pass: &str) {
    use base64::Engine as _;
    let config = serde_json::json!({ "auths": { "registry.example": { "username": user, "password": pass } } });
    let data = base64::engine::general_purpose::STANDARD.encode(config.to_string());
    n.api.put(
        "secrets",
        name,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": { "name": name, "namespace": "default", "uid": format!("uid-{name}") },
            "type": "kubernetes.io/dockerconfigjson",
            "data": { ".dockerconfigjson": data }
        }),
    );
}

/// One step of a private image scenario: pod, pull policy, its secrets, the
/// runtime calls of its first sync after its sandbox, the container's state.
type Step<'a> = (&'a str, &'a str, &'a [&'a str], &'a [&'a str], &'a str);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_pulled_with_a_secret_is_pulled_again_for_a_pod_without_it() {
    let mut n = Node::start().await;
    n.cri.require_auth(PRIVATE, "user", "pass");
    put_pull_secret(&n, "regcred", "user", "pass");
    put_pull_secret(&n, "wrong", "user", "guess");
    put_pull_secret(&n, "copy", "user", "pass");
    let pull = format!("PullImage {PRIVATE}");
    let created = ["CreateContainer c", "StartContainer c"];
    // (pod, pull policy, its secrets, the runtime calls of its first sync
    // after its sandbox, the container's state), one after another on one
    // node. One call site of the sync: a debug build's stack frame grows
    // with each.
    let table: [Step<'_>; 7] = [
        // A has the secret: pulled with it, running.
        (
            "a",
            "IfNotPresent",
            &["regcred"],
            &[&pull, created[0], created[1]],
            "running",
        ),
        // B has none: the image is on the node, but B must pull it with its
        // own (absent) credentials, which the registry refuses.
        ("b", "IfNotPresent", &[], &[&pull], "waiting:ErrImagePull"),
        // With pull policy Always, likewise.
        ("always", "Always", &[], &[&pull], "waiting:ErrImagePull"),
        // With pull policy Never it cannot pull: it fails without a pull.
        ("never", "Never", &[], &[], "waiting:ErrImageNeverPull"),
        // A wrong credential for the registry is refused too.
        (
            "wrong",
            "IfNotPresent",
            &["wrong"],
            &[&pull],
            "waiting:ErrImagePull",
        ),
        // C has the same secret: the image is used as it is.
        ("c", "IfNotPresent", &["regcred"], &created, "running"),
        // Another secret with the same credential is as good (same hash).
        ("d", "IfNotPresent", &["copy"], &created, "running"),
    ];
    for (name, policy, secrets, calls, want) in table {
        let p = n.bind(private_pod(name, policy, secrets));
        n.sync(&p).await;
        let mut expected = vec![format!("RunPodSandbox default/{name}")];
        expected.extend(calls.iter().map(ToString::to_string));
        assert_eq!(n.cri_calls(), expected, "{name}");
        assert_eq!(state(&n.status(name), "c").0, want, "{name}");
    }
    n.event("Failed", "pull access denied").await;
    // B's next sync is in its back-off: no pull, ImagePullBackOff.
    n.sync_watched("b").await;
    assert_eq!(n.cri_calls(), Vec::<String>::new(), "in back-off");
    assert_eq!(state(&n.status("b"), "c").0, "waiting:ImagePullBackOff");
    // The records survive a restart of the agent.
    let mut fresh = n.restart().await;
    let e = fresh.bind(private_pod("e", "IfNotPresent", &[]));
    fresh.sync(&e).await;
    assert_eq!(
        fresh.cri_calls(),
        ["RunPodSandbox default/e", pull.as_str()]
    );
    assert_eq!(state(&fresh.status("e"), "c").0, "waiting:ErrImagePull");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_pulled_with_a_secret_named_by_its_id_is_for_holders_of_the_secret() {
    let mut n = Node::start().await;
    n.cri.require_auth(PRIVATE, "user", "pass");
    put_pull_secret(&n, "regcred", "user", "pass");
    let a = n.bind(private_pod("a", "IfNotPresent", &["regcred"]));
    n.sync(&a).await;
    assert_eq!(state(&n.status("a"), "c").0, "running");
    let id = n.cri.add_image(PRIVATE);
    n.cri_calls();
    // The same content by its ID: a pod without the secret must pull it,
    // and an ID cannot be pulled; with Never it fails at once.
    for (name, policy, secrets, calls, want) in [
        (
            "b",
            "IfNotPresent",
            &[][..],
            &[format!("PullImage {id}")][..],
            "waiting:ErrImagePull",
        ),
        ("never", "Never", &[], &[], "waiting:ErrImageNeverPull"),
        // A holder of the secret uses it as it is.
        (
            "c",
            "IfNotPresent",
            &["regcred"],
            &[
                "CreateContainer c".to_string(),
                "StartContainer c".to_string(),
            ],
            "running",
        ),
    ] {
        let mut p = private_pod(name, policy, secrets);
        edit_container(&mut p, |c| c.image = Some(id.clone()));
        let p = n.bind(p);
        n.sync(&p).await;
        let mut expected = vec![format!("RunPodSandbox default/{name}")];
        expected.extend(calls.iter().cloned());
        assert_eq!(n.cri_calls(), expected, "{name}");
        assert_eq!(state(&n.status(name), "c").0, want, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preloaded_images_are_used_without_verification() {
    // An image in the runtime that the agent never pulled (busybox here) is
    // used by a pod without secrets as it is: the default policy,
    // NeverVerifyPreloadedImages. So is a private one.
    let mut n = Node::start().await;
    n.cri.add_image(PRIVATE);
    n.cri.require_auth(PRIVATE, "user", "pass");
    let a = n.bind(private_pod("a", "IfNotPresent", &[]));
    n.sync(&a).await;
    assert_eq!(
        n.cri_calls(),
        [
            "RunPodSandbox default/a",
            "CreateContainer c",
            "StartContainer c"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_verification_policy_decides_for_preloaded_and_pulled_images() {
    use crate::image_policy::VerificationPolicy;
    let pull = format!("PullImage {PRIVATE}");
    let started = ["CreateContainer c", "StartContainer c"];
    let allowlisted = |names: &[&str]| {
        let names: Vec<String> = names.iter().map(ToString::to_string).collect();
        VerificationPolicy::parse("NeverVerifyAllowlistedImages", &names).unwrap()
    };
    // A preloaded private image and a pod without its secret: each policy's
    // runtime calls after the sandbox, and the container's state.
    let preloaded: [(VerificationPolicy, &[&str], &str); 5] = [
        (
            VerificationPolicy::AlwaysVerify,
            &[&pull],
            "waiting:ErrImagePull",
        ),
        (VerificationPolicy::NeverVerify, &started, "running"),
        (
            VerificationPolicy::NeverVerifyPreloadedImages,
            &started,
            "running",
        ),
        (
            allowlisted(&["registry.example/private/*"]),
            &started,
            "running",
        ),
        (
            allowlisted(&["registry.example/other/app"]),
            &[&pull],
            "waiting:ErrImagePull",
        ),
    ];
    for (policy, calls, want) in preloaded {
        let what = format!("{policy:?}");
        let mut n = Node::start_with_image_policy(policy).await;
        n.cri.add_image(PRIVATE);
        n.cri.require_auth(PRIVATE, "user", "pass");
        let a = n.bind(private_pod("a", "IfNotPresent", &[]));
        n.sync(&a).await;
        let mut expected = vec!["RunPodSandbox default/a".to_string()];
        expected.extend(calls.iter().map(ToString::to_string));
        assert_eq!(n.cri_calls(), expected, "{what}");
        assert_eq!(state(&n.status("a"), "c").0, want, "{what}");
    }
    // Pulled with a secret: NeverVerify and an allowlisted name let a pod
    // without it use the image; AlwaysVerify verifies as the default does.
    let pulled: [(VerificationPolicy, &[&str]); 3] = [
        (VerificationPolicy::NeverVerify, &started),
        (allowlisted(&["registry.example/private/app"]), &started),
        (VerificationPolicy::AlwaysVerify, &[&pull]),
    ];
    for (policy, calls) in pulled {
        let what = format!("{policy:?}");
        let mut n = Node::start_with_image_policy(policy).await;
        n.cri.require_auth(PRIVATE, "user", "pass");
        put_pull_secret(&n, "regcred", "user", "pass");
        let a = n.bind(private_pod("a", "IfNotPresent", &["regcred"]));
        n.sync(&a).await;
        assert_eq!(state(&n.status("a"), "c").0, "running", "{what}");
        n.cri_calls();
        let b = n.bind(private_pod("b", "IfNotPresent", &[]));
        n.sync(&b).await;
        let mut expected = vec!["RunPodSandbox default/b".to_string()];
        expected.extend(calls.iter().map(ToString::to_string));
        assert_eq!(n.cri_calls(), expected, "{what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_pulled_anonymously_is_for_every_pod_and_a_crash_mid_pull_is_verified() {
    let mut n = Node::start().await;
    let public = "registry.example/public/app:1";
    let pull = format!("PullImage {public}");
    // Pulled without credentials: any pod may use it afterwards.
    let a = n.bind(pod("a").container("c", public).build());
    n.sync(&a).await;
    assert_eq!(
        n.cri_calls(),
        [
            "RunPodSandbox default/a",
            &pull,
            "CreateContainer c",
            "StartContainer c"
        ]
    );
    let b = n.bind(pod("b").container("c", public).build());
    n.sync(&b).await;
    assert_eq!(
        n.cri_calls(),
        [
            "RunPodSandbox default/b",
            "CreateContainer c",
            "StartContainer c"
        ]
    );
    // An image whose pull was under way when the agent stopped (its intent
    // left behind, no record): pulled by the agent with unknown credentials,
    // so verified.
    let crashed = "registry.example/private/half:1";
    n.cri.add_image(crashed);
    n.cri.require_auth(crashed, "user", "pass");
    let records = super::super::image_manager::PullRecords::new(&n.dir.path().join("root"));
    records.start_pull(crashed).expect("intent");
    let mut fresh = n.restart().await;
    let c = fresh.bind(pod("c").container("c", crashed).build());
    fresh.sync(&c).await;
    assert_eq!(
        fresh.cri_calls(),
        [
            "RunPodSandbox default/c",
            format!("PullImage {crashed}").as_str()
        ]
    );
    assert_eq!(state(&fresh.status("c"), "c").0, "waiting:ErrImagePull");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_directories_whose_sandbox_vanished_are_torn_down_but_not_those_of_live_pods() {
    let mut n = Node::start().await;
    let pods = n.dir.path().join("root/pods");
    let alive = n.bind(pod("alive").container("c", IMAGE).build());
    let gone = n.bind(pod("gone").container("c", IMAGE).build());
    n.sync(&alive).await;
    n.sync(&gone).await;
    // What the pods left on disk: an emptyDir with data, a secret volume on
    // a tmpfs (where the agent may mount), and a link a container planted to
    // a directory outside.
    let outside = n.dir.path().join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("keep"), "x").expect("outside file");
    let mut mounted = Vec::new();
    for uid in ["uid-alive", "uid-gone", "uid-foreign"] {
        let vols = pods.join(uid).join("volumes");
        let data = vols.join("kubernetes.io~empty-dir/data");
        std::fs::create_dir_all(&data).expect("emptyDir");
        std::fs::write(data.join("f"), "y").expect("emptyDir file");
        std::os::unix::fs::symlink(&outside, data.join("escape")).expect("link");
        let secret = vols.join("kubernetes.io~secret/token");
        std::fs::create_dir_all(&secret).expect("secret dir");
        if crate::volume::mount::mount_tmpfs(&secret, Some(1 << 20)).is_ok() {
            mounted.push(secret);
        }
    }
    // A mount the agent never makes, in a pod directory of its own.
    let foreign = pods.join("uid-foreign/elsewhere");
    std::fs::create_dir_all(&foreign).expect("foreign dir");
    let foreign_mounted = crate::volume::mount::mount_tmpfs(&foreign, Some(1 << 20)).is_ok();
    // The sandboxes vanish while the agent is down (a reboot); `gone` is
    // deleted from the API meanwhile, `alive` is not.
    for s in n.cri.sandboxes() {
        let rt = n.ctx.cri();
        rt.stop_pod_sandbox(&s.id).await.expect("stop sandbox");
        rt.remove_pod_sandbox(&s.id).await.expect("remove sandbox");
    }
    n.api.remove_pod("gone");
    n.pods.api_event(watcher::Event::Delete(gone));
    let removed = super::super::housekeeping::cleanup_orphans(
        n.ctx.cri(),
        &n.api.client(),
        n.ctx.pods(),
        n.ctx.volumes(),
        &n.ctx.node().pod_logs_dir,
    )
    .await
    .expect("housekeeping")
    .removed;
    assert!(!pods.join("uid-gone").exists(), "the orphan goes");
    assert!(
        pods.join("uid-alive/volumes").exists(),
        "a live pod's stays"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("keep")).expect("kept"),
        "x"
    );
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let left = crate::volume::mount::mounts_under(&mountinfo, &pods.join("uid-gone"));
    assert_eq!(left, Vec::<std::path::PathBuf>::new());
    if foreign_mounted {
        // Not the agent's mount: left alone, and the directory with it.
        assert_eq!(removed, 1);
        assert!(crate::volume::mount::is_mount_point(&foreign));
        let _ = rustix::mount::unmount(&foreign, rustix::mount::UnmountFlags::DETACH);
    } else {
        assert_eq!(removed, 2);
    }
    for m in mounted.iter().filter(|m| m.exists()) {
        let _ = rustix::mount::unmount(m, rustix::mount::UnmountFlags::DETACH);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_content_preloaded_under_another_name_is_not_verified() {
    // busybox is preloaded; the agent pulls the same content with a secret
    // under a private name. busybox stays usable without a secret; the
    // private name does not.
    let mut n = Node::start().await;
    let private = "registry.example/private/busybox:1.36";
    n.cri.require_auth(private, "user", "pass");
    put_pull_secret(&n, "regcred", "user", "pass");
    let mut a = pod("a").container("c", private).build();
    if let Some(spec) = a.spec.as_mut() {
        spec.image_pull_secrets = Some(vec![k8s_openapi::api::core::v1::LocalObjectReference {
            name: "regcred".into(),
        }]);
    }
    let a = n.bind(a);
    n.sync(&a).await;
    n.cri_calls();
    let image_ref = n.cri.add_image(IMAGE);
    record_private_pull(&n, private, &image_ref);
    let b = n.bind(pod("b").container("c", IMAGE).build());
    n.sync(&b).await;
    assert_eq!(
        n.cri_calls(),
        [
            "RunPodSandbox default/b",
            "CreateContainer c",
            "StartContainer c"
        ]
    );
}

/// Records that `name` was pulled as `image_ref` with Secret `regcred`.
fn record_private_pull(n: &Node, name: &str, image_ref: &str) {
    let records = super::super::image_manager::PullRecords::new(&n.dir.path().join("root"));
    let secret = super::super::image_manager::PullSecret {
        uid: "uid-regcred".into(),
        namespace: "default".into(),
        name: "regcred".into(),
        credential_hash: "h".into(),
    };
    let creds = super::super::image_manager::PullCredentials {
        secrets: vec![secret],
        ..Default::default()
    };
    records
        .record(name, image_ref, &creds, k8s_openapi::jiff::Timestamp::now())
        .expect("record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_image_named_another_way_is_verified() {
    // Pulled with a secret as `myorg/private:1`; the runtime resolves
    // `docker.io/myorg/private:1` (and `index.docker.io/...`) to the same
    // image. A pod without the secret naming it so pulls with its own
    // credentials, which the registry refuses.
    let mut n = Node::start().await;
    let short = "myorg/private:1";
    let long = "docker.io/myorg/private:1";
    n.cri.require_auth(long, "user", "pass");
    let image_ref = n.cri.add_image(long);
    record_private_pull(&n, short, &image_ref);
    let b = n.bind(pod("b").container("c", long).build());
    n.sync(&b).await;
    let pull = format!("PullImage {long}");
    assert_eq!(n.cri_calls(), ["RunPodSandbox default/b", pull.as_str()]);
    assert_eq!(state(&n.status("b"), "c").0, "waiting:ErrImagePull");
}
