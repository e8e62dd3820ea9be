//! End-to-end scenarios of the volume manager on the local cluster
//! (`hack/local-up.sh --agent rustlet`): configMap, secret, emptyDir,
//! downwardAPI, hostPath, the service account token volume and
//! ClusterTrustBundle projections, seen from the node
//! (`_output/local/rustlet/pods/<uid>/volumes/...`) and from inside the
//! containers (their log files), plus missing sources, subPath, and teardown.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::*;
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

/// `<root>/pods/<uid>/volumes/<plugin>/<name>`.
fn volume_path(uid: &str, plugin: &str, name: &str) -> PathBuf {
    rustlet_root()
        .join("pods")
        .join(uid)
        .join("volumes")
        .join(plugin)
        .join(name)
}

/// Waits up to `secs` for `path` to contain every one of `needles`; returns its text.
async fn wait_file_contains(path: &Path, needles: &[&str], secs: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if needles.iter().all(|n| text.contains(n)) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} does not contain all of {needles:?} within {secs}s; it has:\n{text}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn create_config_map(client: &Client, ns: &str, name: &str, data: &[(&str, &str)]) {
    let data: serde_json::Map<String, serde_json::Value> = data
        .iter()
        .map(|(k, v)| ((*k).to_string(), serde_json::Value::from(*v)))
        .collect();
    let cm: ConfigMap =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": name }, "data": data }))
            .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await
        .expect("create config map");
}

async fn delete_and_check_teardown(client: &Client, ns: &str, name: &str, uid: &str) {
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete pod");
    wait_deleted(client, ns, name, uid, 30).await;
    // A finished pod is deleted by the API server at once; housekeeping (every
    // 2 s) removes its directory then.
    let dir = rustlet_root().join("pods").join(uid);
    let deadline = Instant::now() + Duration::from_secs(10);
    while dir.exists() {
        assert!(
            Instant::now() < deadline,
            "pod directory {} left after deletion",
            dir.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        mounted_under(&dir),
        Vec::<String>::new(),
        "mounts left after deletion"
    );
}

/// FailedMount events of pod `name`, by message.
async fn failed_mounts(client: &Client, ns: &str, name: &str) -> Vec<String> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .filter(|e| e.reason.as_deref() == Some("FailedMount"))
        .filter_map(|e| e.message)
        .collect()
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn every_volume_type_is_served_to_containers() {
    let client = client().await;
    let ns = namespace(&client, "e2e-vol").await;
    create_config_map(&client, &ns, "app-config", &[("a", "alpha"), ("b", "beta")]).await;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "app-secret" },
        "stringData": { "password": "s3cret" }
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("create secret");
    let host_dir = local().join(format!("e2e-hostpath-{ns}"));
    std::fs::create_dir_all(&host_dir).unwrap();
    std::fs::write(host_dir.join("host.txt"), "from-host\n").unwrap();
    let created_dir = local().join(format!("e2e-hostpath-{ns}-created"));

    let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
    let reader = format!(
        "until [ -f /shared/from-writer ]; do sleep 0.2; done; \
         echo \"cfg-a=$(cat /etc/cfg/conf/a.txt)\"; \
         echo \"cfg-mode=$(stat -L -c %a /etc/cfg/conf/a.txt)\"; \
         echo \"secret=$(cat /etc/sec/password)\"; \
         echo \"secret-mode=$(stat -L -c %a /etc/sec/password)\"; \
         echo \"shared=$(cat /shared/from-writer)\"; \
         echo \"name=$(cat /info/name)\"; \
         echo \"labels=$(cat /info/labels | tr '\\n' ' ')\"; \
         echo \"mem-limit=$(cat /info/mem)\"; \
         echo \"host=$(cat /host/host.txt)\"; \
         echo \"tmpfs=$(grep ' /mem ' /proc/mounts | cut -d' ' -f3)\"; \
         echo \"sa-ns=$(cat {sa}/namespace)\"; \
         echo \"token-bytes=$(wc -c < {sa}/token)\"; \
         echo \"ca=$(head -1 {sa}/ca.crt)\"; \
         touch /etc/cfg/x 2>/dev/null || echo cfg-read-only; \
         last=''; while true; do cur=$(cat /etc/cfg/conf/a.txt); \
         if [ \"$cur\" != \"$last\" ]; then echo \"now-a=$cur\"; last=$cur; fi; sleep 1; done"
    );
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "vols", "labels": { "app": "vols" } },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "writer", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", "echo shared-data > /shared/from-writer; sleep 3600"],
                    "volumeMounts": [{ "name": "shared", "mountPath": "/shared" }]
                },
                {
                    "name": "reader", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", reader],
                    "resources": { "limits": { "memory": "64Mi" } },
                    "volumeMounts": [
                        { "name": "cfg", "mountPath": "/etc/cfg" },
                        { "name": "sec", "mountPath": "/etc/sec" },
                        { "name": "shared", "mountPath": "/shared" },
                        { "name": "mem", "mountPath": "/mem" },
                        { "name": "info", "mountPath": "/info" },
                        { "name": "host", "mountPath": "/host", "readOnly": true },
                        { "name": "created", "mountPath": "/created" }
                    ]
                }
            ],
            "volumes": [
                { "name": "cfg", "configMap": { "name": "app-config",
                    "items": [{ "key": "a", "path": "conf/a.txt", "mode": 0o400 }] } },
                { "name": "sec", "secret": { "secretName": "app-secret", "defaultMode": 0o440 } },
                { "name": "shared", "emptyDir": {} },
                { "name": "mem", "emptyDir": { "medium": "Memory", "sizeLimit": "16Mi" } },
                { "name": "info", "downwardAPI": { "items": [
                    { "path": "name", "fieldRef": { "fieldPath": "metadata.name" } },
                    { "path": "labels", "fieldRef": { "fieldPath": "metadata.labels" } },
                    { "path": "mem", "resourceFieldRef": { "containerName": "reader",
                        "resource": "limits.memory", "divisor": "1Mi" } }
                ] } },
                { "name": "host", "hostPath": { "path": host_dir, "type": "Directory" } },
                { "name": "created", "hostPath": { "path": created_dir, "type": "DirectoryOrCreate" } }
            ]
        }
    }))
    .unwrap();
    let p = create(&client, &ns, &pod).await;
    let uid = p.uid().unwrap();
    wait_for(&client, &ns, "vols", 60, "Running", phase("Running")).await;

    // Inside the containers.
    let log = log_path(&ns, "vols", &uid, "reader");
    let text = wait_file_contains(&log, &["now-a=alpha"], 30).await;
    for line in [
        "cfg-a=alpha",
        "cfg-mode=400",
        "secret=s3cret",
        "secret-mode=440",
        "shared=shared-data",
        "name=vols",
        "labels=app=\"vols\"",
        "mem-limit=64",
        "host=from-host",
        "tmpfs=tmpfs",
        &format!("sa-ns={ns}"),
        "ca=-----BEGIN CERTIFICATE-----",
        "cfg-read-only",
    ] {
        assert!(text.contains(line), "reader log lacks {line:?}:\n{text}");
    }
    assert!(
        !text.contains("token-bytes=0"),
        "empty service account token:\n{text}"
    );

    // On the node.
    let cfg = volume_path(&uid, "kubernetes.io~configmap", "cfg");
    assert_eq!(
        std::fs::read_to_string(cfg.join("conf/a.txt")).unwrap(),
        "alpha"
    );
    let data = std::fs::read_link(cfg.join("..data")).expect("..data symlink");
    assert!(data.to_string_lossy().starts_with("..2"), "{data:?}");
    assert_eq!(
        std::fs::read_link(cfg.join("conf")).unwrap(),
        Path::new("..data/conf")
    );
    let sec = volume_path(&uid, "kubernetes.io~secret", "sec");
    assert_eq!(
        std::fs::read_to_string(sec.join("password")).unwrap(),
        "s3cret"
    );
    assert!(
        mounted_under(&sec).iter().any(|m| Path::new(m) == sec),
        "secret volume is a tmpfs"
    );
    let info = volume_path(&uid, "kubernetes.io~downward-api", "info");
    assert_eq!(std::fs::read_to_string(info.join("name")).unwrap(), "vols");
    let shared = volume_path(&uid, "kubernetes.io~empty-dir", "shared");
    assert_eq!(
        std::fs::read_to_string(shared.join("from-writer")).unwrap(),
        "shared-data\n"
    );
    assert!(created_dir.is_dir(), "DirectoryOrCreate made the host path");
    let spec_volumes = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("vols")
        .await
        .unwrap()
        .spec
        .unwrap()
        .volumes
        .unwrap();
    let access = spec_volumes
        .iter()
        .find(|v| v.name.starts_with("kube-api-access-"))
        .expect("kube-api-access volume added by admission");
    let projected = volume_path(&uid, "kubernetes.io~projected", &access.name);
    let token = std::fs::read_to_string(projected.join("token")).expect("token file");
    assert_eq!(token.split('.').count(), 3, "a JWT");
    assert_eq!(
        std::fs::read_to_string(projected.join("ca.crt")).unwrap(),
        std::fs::read_to_string(local().join("pki/ca.crt")).unwrap()
    );
    assert_eq!(
        std::fs::read_to_string(projected.join("namespace")).unwrap(),
        ns
    );
    // The token authenticates as the pod's service account.
    let review: TokenReview = serde_json::from_value(serde_json::json!({
        "spec": { "token": token }
    }))
    .unwrap();
    let reviewed = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("token review");
    let st = reviewed.status.expect("token review status");
    assert_eq!(st.authenticated, Some(true), "{st:?}");
    assert_eq!(
        st.user.and_then(|u| u.username).as_deref(),
        Some(format!("system:serviceaccount:{ns}:default").as_str())
    );

    // A change of the config map reaches the running container.
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .patch(
            "app-config",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "data": { "a": "alpha2" } })),
        )
        .await
        .expect("update config map");
    // It is written at the pod's next periodic sync, as the kubelet writes
    // it: within `syncFrequency` (1 min) jittered by up to half again, and
    // the object's cache (upstream's tests wait up to 240 s).
    wait_file_contains(&cfg.join("conf/a.txt"), &["alpha2"], 120).await;
    wait_file_contains(&log, &["now-a=alpha2"], 30).await;
    assert_ne!(
        std::fs::read_link(cfg.join("..data")).unwrap(),
        data,
        "a new timestamped dir"
    );

    delete_and_check_teardown(&client, &ns, "vols", &uid).await;
    let _ = std::fs::remove_dir_all(&host_dir);
    let _ = std::fs::remove_dir_all(&created_dir);
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn missing_config_map_keeps_the_pod_pending_until_it_exists() {
    let client = client().await;
    let ns = namespace(&client, "e2e-volmiss").await;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "waits" },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "echo \"k=$(cat /cfg/k)\"; sleep 3600"],
                "volumeMounts": [{ "name": "cfg", "mountPath": "/cfg" }]
            }],
            "volumes": [{ "name": "cfg", "configMap": { "name": "not-yet" } }]
        }
    }))
    .unwrap();
    let p = create(&client, &ns, &pod).await;
    let uid = p.uid().unwrap();
    let expected = "MountVolume.SetUp failed for volume \"cfg\" : configmap \"not-yet\" not found";
    let deadline = Instant::now() + Duration::from_secs(30);
    while !failed_mounts(&client, &ns, "waits")
        .await
        .iter()
        .any(|m| m == expected)
    {
        assert!(
            Instant::now() < deadline,
            "no FailedMount event {expected:?}: {:?}",
            failed_mounts(&client, &ns, "waits").await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let waiting = wait_for(
        &client,
        &ns,
        "waits",
        30,
        "ContainerCreating",
        |p: Option<&Pod>| {
            p.and_then(|p| p.status.as_ref()?.container_statuses.clone())
                .and_then(|cs| cs.first()?.state.clone()?.waiting?.reason)
                .as_deref()
                == Some("ContainerCreating")
        },
    )
    .await;
    assert_eq!(
        waiting.status.unwrap().phase.as_deref(),
        Some("Pending"),
        "Pending while its volume cannot be set up"
    );
    // Nothing of the pod runs meanwhile.
    let rt = runtime().await;
    let by_uid = std::collections::HashMap::from([(
        rustlet::labels::POD_UID_LABEL.to_string(),
        uid.clone(),
    )]);
    assert!(rt.list_pod_sandboxes(by_uid).await.unwrap().is_empty());

    create_config_map(&client, &ns, "not-yet", &[("k", "finally")]).await;
    wait_for(&client, &ns, "waits", 60, "Running", phase("Running")).await;
    wait_file_contains(&log_path(&ns, "waits", &uid, "c"), &["k=finally"], 30).await;
    delete_and_check_teardown(&client, &ns, "waits", &uid).await;
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn host_path_type_mismatch_keeps_the_pod_pending() {
    let client = client().await;
    let ns = namespace(&client, "e2e-volhp").await;
    let dir = local().join(format!("e2e-hostpath-{ns}"));
    std::fs::create_dir_all(&dir).unwrap();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "wrongtype" },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
                "volumeMounts": [{ "name": "h", "mountPath": "/h" }]
            }],
            "volumes": [{ "name": "h", "hostPath": { "path": dir, "type": "File" } }]
        }
    }))
    .unwrap();
    let p = create(&client, &ns, &pod).await;
    let expected = format!(
        "MountVolume.SetUp failed for volume \"h\" : hostPath type check failed: {} is not a file, it's a Directory",
        dir.display()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !failed_mounts(&client, &ns, "wrongtype")
        .await
        .contains(&expected)
    {
        assert!(
            Instant::now() < deadline,
            "no FailedMount event {expected:?}: {:?}",
            failed_mounts(&client, &ns, "wrongtype").await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let now = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("wrongtype")
        .await
        .unwrap();
    assert_eq!(now.status.unwrap().phase.as_deref(), Some("Pending"));
    delete_and_check_teardown(&client, &ns, "wrongtype", &p.uid().unwrap()).await;
    let _ = std::fs::remove_dir_all(&dir);
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn sub_paths_and_read_only_mounts() {
    let client = client().await;
    let ns = namespace(&client, "e2e-volsub").await;
    create_config_map(&client, &ns, "one-file", &[("app.conf", "setting=1")]).await;
    let script = "echo hello > /per-pod/file; \
                  echo \"conf=$(cat /etc/app.conf)\"; \
                  touch /ro/x 2>/dev/null || echo ro-refused; \
                  ls /etc/app.conf && echo listed; sleep 3600";
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "subs" },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script],
                "env": [{ "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } }],
                "volumeMounts": [
                    { "name": "data", "mountPath": "/per-pod", "subPathExpr": "pods/$(POD_NAME)" },
                    { "name": "data", "mountPath": "/ro", "readOnly": true },
                    { "name": "cfg", "mountPath": "/etc/app.conf", "subPath": "app.conf" }
                ]
            }],
            "volumes": [
                { "name": "data", "emptyDir": {} },
                { "name": "cfg", "configMap": { "name": "one-file" } }
            ]
        }
    }))
    .unwrap();
    let p = create(&client, &ns, &pod).await;
    let uid = p.uid().unwrap();
    wait_for(&client, &ns, "subs", 60, "Running", phase("Running")).await;
    let log = log_path(&ns, "subs", &uid, "c");
    wait_file_contains(&log, &["conf=setting=1", "ro-refused", "listed"], 30).await;
    let data = volume_path(&uid, "kubernetes.io~empty-dir", "data");
    assert_eq!(
        std::fs::read_to_string(data.join("pods/subs/file")).unwrap(),
        "hello\n",
        "subPathExpr expanded from the container's environment"
    );
    delete_and_check_teardown(&client, &ns, "subs", &uid).await;
    drop_namespace(&client, &ns).await;
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn a_finished_pod_gives_its_volumes_back() {
    let client = client().await;
    let ns = namespace(&client, "e2e-voldone").await;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "done" },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c", "image": BUSYBOX, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "echo x > /scratch/f"],
                "volumeMounts": [{ "name": "scratch", "mountPath": "/scratch" }]
            }],
            "volumes": [{ "name": "scratch", "emptyDir": { "medium": "Memory" } }]
        }
    }))
    .unwrap();
    let p = create(&client, &ns, &pod).await;
    let uid = p.uid().unwrap();
    wait_for(&client, &ns, "done", 60, "Succeeded", phase("Succeeded")).await;
    let volumes = rustlet_root().join("pods").join(&uid).join("volumes");
    let deadline = Instant::now() + Duration::from_secs(45);
    while volumes.exists() {
        assert!(
            Instant::now() < deadline,
            "volumes of a finished pod still at {}",
            volumes.display()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(mounted_under(&volumes), Vec::<String>::new());
    delete_and_check_teardown(&client, &ns, "done", &uid).await;
    drop_namespace(&client, &ns).await;
}

/// A self-signed root named `name`, PEM, and its DER.
fn root(name: &str) -> (String, Vec<u8>) {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).expect("self-signed");
    (cert.pem(), cert.der().to_vec())
}

/// The DER of each certificate in PEM file `path` (none while it is missing).
fn ders(path: &Path) -> Vec<Vec<u8>> {
    let text = std::fs::read(path).unwrap_or_default();
    pem::parse_many(text)
        .expect("the file is PEM")
        .into_iter()
        .map(pem::Pem::into_contents)
        .collect()
}

#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn cluster_trust_bundles_are_projected_by_name_and_by_signer_and_refreshed() {
    use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
    let client = client().await;
    let ns = namespace(&client, "e2e-ctb").await;
    let bundles = Api::<ClusterTrustBundle>::all(client.clone());
    // Cluster-scoped: named after the namespace, so that runs never meet.
    let signer = format!("e2e.rustlet.io/{ns}");
    let prefix = signer.replace('/', ":");
    let ((a, a_der), (b, b_der), (c, _), (d, d_der)) = (root("a"), root("b"), root("c"), root("d"));
    let ctb = |name: &str, signer: Option<&str>, live: &str, pem: &str| {
        from_json::<ClusterTrustBundle>(serde_json::json!({
            "metadata": { "name": name, "labels": { "live": live } },
            "spec": { "signerName": signer, "trustBundle": pem }
        }))
    };
    let by_name = format!("{ns}-roots");
    // The signer's bundles "one" and "three" hold the same anchor.
    let made = [
        ctb(&by_name, None, "yes", &a),
        ctb(&format!("{prefix}:one"), Some(&signer), "yes", &b),
        ctb(&format!("{prefix}:two"), Some(&signer), "no", &c),
        ctb(&format!("{prefix}:three"), Some(&signer), "yes", &b),
    ];
    for b in &made {
        bundles
            .create(&PostParams::default(), b)
            .await
            .expect("create bundle");
    }
    let pod = from_json::<Pod>(serde_json::json!({
        "metadata": { "name": "ctb" },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{ "name": "c", "image": BUSYBOX, "command": ["sleep", "3600"],
                "volumeMounts": [{ "name": "roots", "mountPath": "/roots" }] }],
            "volumes": [{ "name": "roots", "projected": { "sources": [
                { "clusterTrustBundle": { "name": by_name, "path": "by-name.pem" } },
                { "clusterTrustBundle": { "signerName": signer,
                    "labelSelector": { "matchLabels": { "live": "yes" } }, "path": "by-signer.pem" } },
                { "clusterTrustBundle": { "name": format!("{ns}-absent"), "optional": true,
                    "path": "optional.pem" } }
            ] } }]
        }
    }));
    let pod = create(&client, &ns, &pod).await;
    let uid = pod.metadata.uid.clone().expect("uid");
    wait_for(&client, &ns, "ctb", 90, "Running", phase("Running")).await;
    let dir = volume_path(&uid, "kubernetes.io~projected", "roots");
    // Each anchor once; the signer's bundle that the selector leaves out is not there.
    assert_eq!(ders(&dir.join("by-name.pem")), vec![a_der.clone()]);
    assert_eq!(ders(&dir.join("by-signer.pem")), vec![b_der]);
    assert_eq!(
        std::fs::read(dir.join("optional.pem")).expect("optional.pem"),
        b""
    );
    // The container sees the same files.
    let (code, out, err) = kubectl(
        &["exec", "-n", &ns, "ctb", "--", "cat", "/roots/by-name.pem"],
        "",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.as_bytes(),
        std::fs::read(dir.join("by-name.pem")).expect("by-name.pem")
    );

    // A bundle changed is projected again at the pod's next sync.
    let mut changed = bundles.get(&by_name).await.expect("get bundle");
    changed.spec.trust_bundle = format!("{a}{d}");
    bundles
        .replace(&by_name, &PostParams::default(), &changed)
        .await
        .expect("replace bundle");
    let mut want = vec![a_der, d_der];
    want.sort();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let mut have = ders(&dir.join("by-name.pem"));
        have.sort();
        if have == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the bundle's change was not projected: {} certificates",
            have.len()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // A bundle that does not exist and is not optional keeps its pod from
    // starting, in the kubelet's words.
    let missing = from_json::<Pod>(serde_json::json!({
        "metadata": { "name": "ctb-missing" },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{ "name": "c", "image": BUSYBOX, "command": ["sleep", "3600"],
                "volumeMounts": [{ "name": "roots", "mountPath": "/roots" }] }],
            "volumes": [{ "name": "roots", "projected": { "sources": [
                { "clusterTrustBundle": { "name": format!("{ns}-absent"), "path": "ca.pem" } }
            ] } }]
        }
    }));
    create(&client, &ns, &missing).await;
    let want = format!("clustertrustbundles.certificates.k8s.io \"{ns}-absent\" not found");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !failed_mounts(&client, &ns, "ctb-missing")
        .await
        .iter()
        .any(|m| m.contains(&want))
    {
        assert!(
            Instant::now() < deadline,
            "no FailedMount naming the missing bundle"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let p = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("ctb-missing")
        .await
        .expect("get");
    assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Pending"));

    drop_namespace(&client, &ns).await;
    for b in &made {
        let _ = bundles
            .delete(&b.name_any(), &DeleteParams::default())
            .await;
    }
}

/// Signs the first unanswered PodCertificateRequest of `ns` for `pod`
/// (waiting up to `secs`): a leaf for the request's key, issued by
/// `ca`, valid from 4 minutes ago for an hour (the API server wants
/// `notBefore` within 5 minutes of its clock), to be refreshed 10 minutes
/// after that (the earliest it allows); or, with `deny`, denies it.
/// Returns its name and the leaf's DER.
async fn sign_next(
    client: &Client,
    ns: &str,
    ca: &(rcgen::CertificateParams, rcgen::KeyPair),
    pod: &str,
    deny: bool,
    secs: u64,
) -> (String, Vec<u8>) {
    use k8s_openapi::api::certificates::v1::PodCertificateRequest;
    let api = Api::<PodCertificateRequest>::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let pcr = loop {
        let list = api
            .list(&ListParams::default())
            .await
            .expect("list requests");
        if let Some(p) = list.items.into_iter().find(|p| {
            let answered = p.status.as_ref().and_then(|s| s.conditions.as_ref());
            p.spec.pod_name == pod && answered.is_none_or(Vec::is_empty)
        }) {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "no new PodCertificateRequest in {ns} within {secs}s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let name = pcr.name_any();
    let now = time::OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .expect("whole seconds");
    let rfc = |t: time::OffsetDateTime| {
        t.format(&time::format_description::well_known::Rfc3339)
            .expect("format")
    };
    let condition = |type_: &str, reason: &str| {
        serde_json::json!([{ "type": type_, "status": "True", "reason": reason,
            "message": format!("{type_} by the e2e signer"), "lastTransitionTime": rfc(now) }])
    };
    let status = if deny {
        serde_json::json!({ "conditions": condition("Denied", "E2EDenied") })
    } else {
        let csr = rcgen::CertificateSigningRequestParams::from_der(
            &pcr.spec.stub_pkc_s10_request.0.clone().into(),
        )
        .expect("the request parses");
        let mut leaf = csr;
        let not_before = now - time::Duration::minutes(4);
        let not_after = not_before + time::Duration::hours(1);
        leaf.params.not_before = not_before;
        leaf.params.not_after = not_after;
        let issuer = rcgen::Issuer::from_params(&ca.0, &ca.1);
        let cert = leaf.signed_by(&issuer).expect("sign");
        let issued = serde_json::json!({
            "conditions": condition("Issued", "E2EIssued"),
            "certificateChain": cert.pem(),
            "notBefore": rfc(not_before),
            "beginRefreshAt": rfc(not_before + time::Duration::minutes(10)),
            "notAfter": rfc(not_after),
        });
        let der = cert.der().to_vec();
        let mut object = serde_json::to_value(&pcr).expect("json");
        object["status"] = issued;
        let object: PodCertificateRequest = serde_json::from_value(object).expect("request");
        api.replace_status(&name, &PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("issue {name}: {e}"));
        return (name, der);
    };
    let mut object = serde_json::to_value(&pcr).expect("json");
    object["status"] = status;
    let object: PodCertificateRequest = serde_json::from_value(object).expect("request");
    api.replace_status(&name, &PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("deny {name}: {e}"));
    (name, Vec::new())
}

/// `podCertificate` projections, as the kubelet's podcertificate manager:
/// the agent asks for a certificate with a PodCertificateRequest naming the
/// pod, its service account and the node; once the test, as the signer,
/// issues it, the pod runs with the key and chain (and beside them a
/// ClusterTrustBundle's anchor). A P-521 key's request is accepted by the
/// API server and signed by that key; a request the signer denies keeps
/// its pod Pending with the kubelet's words. (The refresh, which the API server lets begin no sooner than 10
/// minutes after `notBefore`, is tested against the fake API server in
/// `volume::pod_certificate`.)
#[tokio::test]
#[ignore = "needs the local cluster: hack/local-up.sh --agent rustlet"]
async fn pod_certificates_are_issued_and_projected_or_refused() {
    use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
    let client = client().await;
    let ns = namespace(&client, "e2e-pcr").await;
    let signer = format!("e2e.rustlet.io/{ns}");
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca_params = rcgen::CertificateParams::new(Vec::new()).expect("params");
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "e2e pods");
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).expect("self-signed");
    let bundles = Api::<ClusterTrustBundle>::all(client.clone());
    let bundle_name = format!("{ns}-pods");
    bundles
        .create(
            &PostParams::default(),
            &from_json(serde_json::json!({
                "metadata": { "name": bundle_name },
                "spec": { "trustBundle": ca_cert.pem() }
            })),
        )
        .await
        .expect("create bundle");
    let ca = (ca_params, ca_key);
    let pod_with = |name: &str, key_type: &str| {
        from_json::<Pod>(serde_json::json!({
            "metadata": { "name": name },
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [{ "name": "c", "image": BUSYBOX, "command": ["sleep", "3600"],
                    "volumeMounts": [{ "name": "certs", "mountPath": "/certs" }] }],
                "volumes": [{ "name": "certs", "projected": { "sources": [
                    { "clusterTrustBundle": { "name": bundle_name, "path": "ca.pem" } },
                    { "podCertificate": { "signerName": signer, "keyType": key_type,
                        "credentialBundlePath": "bundle.pem", "keyPath": "key.pem",
                        "certificateChainPath": "chain.pem" } }
                ] } }]
            }
        }))
    };
    let pod = create(&client, &ns, &pod_with("certified", "ECDSAP256")).await;
    let uid = pod.metadata.uid.clone().expect("uid");
    create(&client, &ns, &pod_with("rsa", "RSA3072")).await;
    create(&client, &ns, &pod_with("p521", "ECDSAP521")).await;
    let (first, leaf) = sign_next(&client, &ns, &ca, "certified", false, 60).await;
    wait_for(&client, &ns, "certified", 90, "Running", phase("Running")).await;
    let dir = volume_path(&uid, "kubernetes.io~projected", "certs");
    assert_eq!(ders(&dir.join("chain.pem")), vec![leaf.clone()]);
    assert_eq!(ders(&dir.join("ca.pem")), vec![ca_cert.der().to_vec()]);
    let key = std::fs::read_to_string(dir.join("key.pem")).expect("key.pem");
    let public = rcgen::PublicKeyData::subject_public_key_info(
        &rcgen::KeyPair::from_pem(&key).expect("a PKCS#8 key"),
    );
    let (_, parsed) = x509_parser::parse_x509_certificate(&leaf).expect("leaf");
    assert_eq!(
        parsed.public_key().raw,
        public.as_slice(),
        "the leaf is the key's"
    );
    let bundle = std::fs::read_to_string(dir.join("bundle.pem")).expect("bundle.pem");
    let chain = std::fs::read_to_string(dir.join("chain.pem")).expect("chain.pem");
    assert_eq!(bundle, format!("{key}{chain}"));
    let (code, out, err) = kubectl(
        &[
            "exec",
            "-n",
            &ns,
            "certified",
            "--",
            "cat",
            "/certs/bundle.pem",
        ],
        "",
    );
    assert_eq!((code, out.as_str()), (0, bundle.as_str()), "{err}");
    // The request names the pod, its service account and the node.
    let pcr = Api::<k8s_openapi::api::certificates::v1::PodCertificateRequest>::namespaced(
        client.clone(),
        &ns,
    )
    .get(&first)
    .await
    .expect("request");
    assert_eq!(
        (
            pcr.spec.pod_name.as_str(),
            pcr.spec.pod_uid.as_str(),
            pcr.spec.node_name.as_str()
        ),
        ("certified", uid.as_str(), node_name().as_str())
    );
    assert_eq!(pcr.spec.service_account_name, "default");
    assert_eq!(pcr.spec.signer_name, signer);

    // An RSA key (made apart from ring, which only signs with it) is
    // issued as well; the request holds its key.
    let (_, rsa_leaf) = sign_next(&client, &ns, &ca, "rsa", false, 60).await;
    let rsa = wait_for(&client, &ns, "rsa", 90, "Running", phase("Running")).await;
    let rsa_dir = volume_path(
        rsa.metadata.uid.as_deref().expect("uid"),
        "kubernetes.io~projected",
        "certs",
    );
    let rsa_key = std::fs::read_to_string(rsa_dir.join("key.pem")).expect("key.pem");
    let rsa_public = rcgen::PublicKeyData::subject_public_key_info(
        &rcgen::KeyPair::from_pem(&rsa_key).expect("a PKCS#8 RSA key"),
    );
    let (_, parsed) = x509_parser::parse_x509_certificate(&rsa_leaf).expect("leaf");
    assert_eq!(parsed.public_key().raw, rsa_public.as_slice());
    // A P-521 key, which the test's signer (ring) cannot sign for: the
    // API server accepts the agent's request, whose stub names a P-521 key
    // and is signed by it with ECDSA over SHA-512.
    let p521 = {
        use k8s_openapi::api::certificates::v1::PodCertificateRequest;
        let api = Api::<PodCertificateRequest>::namespaced(client.clone(), &ns);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let list = api.list(&ListParams::default()).await.expect("list");
            if let Some(p) = list.items.into_iter().find(|p| p.spec.pod_name == "p521") {
                break p;
            }
            let failed = failed_mounts(&client, &ns, "p521").await;
            assert!(Instant::now() < deadline, "no request for p521: {failed:?}");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    let stub = p521.spec.stub_pkc_s10_request.0;
    use x509_parser::prelude::FromDer as _;
    let (_, req) = x509_parser::certification_request::X509CertificationRequest::from_der(&stub)
        .expect("the stub request parses");
    let info = &req.certification_request_info;
    let curve = info
        .subject_pki
        .algorithm
        .parameters
        .as_ref()
        .and_then(|p| p.as_oid().ok())
        .map(|o| o.to_id_string());
    assert_eq!(curve.as_deref(), Some("1.3.132.0.35"), "secp521r1");
    assert_eq!(
        req.signature_algorithm.algorithm.to_id_string(),
        "1.2.840.10045.4.3.4",
        "ecdsa-with-SHA512"
    );
    let public =
        p521::ecdsa::VerifyingKey::from_sec1_bytes(&info.subject_pki.subject_public_key.data)
            .expect("a P-521 point");
    let signature =
        p521::ecdsa::Signature::from_der(&req.signature_value.data).expect("a DER signature");
    p521::ecdsa::signature::Verifier::verify(&public, info.raw, &signature)
        .expect("signed by the key it names");
    // A request the signer denies: the kubelet's Event and error.
    create(&client, &ns, &pod_with("denied", "ED25519")).await;
    sign_next(&client, &ns, &ca, "denied", true, 60).await;
    wait_for_events(
        &client,
        &ns,
        Involving::Name("denied"),
        90,
        "the denial",
        |events| {
            let denied = messages(events, "Denied")?;
            let failed = messages(events, "FailedMount")?;
            (denied
                .iter()
                .any(|m| m.contains("was denied, reason=\"E2EDenied\""))
                && failed.iter().any(|m| {
                    m.contains("PodCertificateRequest was permanently denied: reason=\"E2EDenied\"")
                }))
            .then_some(())
        },
    )
    .await;
    let denied = Api::<Pod>::namespaced(client.clone(), &ns)
        .get("denied")
        .await
        .expect("denied");
    assert_eq!(
        denied.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );

    let _ = bundles.delete(&bundle_name, &DeleteParams::default()).await;
    drop_namespace(&client, &ns).await;
}
