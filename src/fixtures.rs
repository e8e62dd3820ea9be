//! Test fixtures: small builders for pods and runtime state, so tables read as
//! specifications (`pod("web").container("c", "busybox").build()`).

use k8s_openapi::api::core::v1::{Container as ApiContainer, Pod, PodSpec};
use k8s_openapi::jiff::Timestamp;

use crate::pod_core::runtime::{Container, ContainerState, PodRuntime, Sandbox};

/// Builder of a test pod.
pub struct PodBuilder(Pod);

/// A pod named `name` in `default`, UID `uid-<name>`, no containers yet.
pub fn pod(name: &str) -> PodBuilder {
    let mut p = Pod::default();
    p.metadata.name = Some(name.into());
    p.metadata.namespace = Some("default".into());
    p.metadata.uid = Some(format!("uid-{name}"));
    p.spec = Some(PodSpec::default());
    PodBuilder(p)
}

impl PodBuilder {
    /// Adds a container.
    pub fn container(mut self, name: &str, image: &str) -> Self {
        self.spec().containers.push(ApiContainer {
            name: name.into(),
            image: Some(image.into()),
            ..Default::default()
        });
        self
    }
    /// Adds an init container.
    pub fn init_container(mut self, name: &str, image: &str) -> Self {
        self.spec()
            .init_containers
            .get_or_insert_default()
            .push(ApiContainer {
                name: name.into(),
                image: Some(image.into()),
                ..Default::default()
            });
        self
    }
    /// Adds a sidecar (an init container with `restartPolicy: Always`).
    pub fn sidecar(mut self, name: &str, image: &str) -> Self {
        self.spec()
            .init_containers
            .get_or_insert_default()
            .push(ApiContainer {
                name: name.into(),
                image: Some(image.into()),
                restart_policy: Some("Always".into()),
                ..Default::default()
            });
        self
    }
    /// Adds an ephemeral container, sharing the process namespace of `target` if set.
    pub fn ephemeral(mut self, name: &str, image: &str, target: Option<&str>) -> Self {
        self.spec()
            .ephemeral_containers
            .get_or_insert_default()
            .push(k8s_openapi::api::core::v1::EphemeralContainer {
                name: name.into(),
                image: Some(image.into()),
                target_container_name: target.map(Into::into),
                ..Default::default()
            });
        self
    }
    /// Gives the last added main container its own restart policy and rules
    /// (`(action, operator, exit codes)`).
    pub fn container_restart(mut self, policy: &str, rules: &[(&str, &str, &[i32])]) -> Self {
        use k8s_openapi::api::core::v1::{ContainerRestartRule, ContainerRestartRuleOnExitCodes};
        let c = self
            .spec()
            .containers
            .last_mut()
            .expect("a container to give a restart policy");
        c.restart_policy = Some(policy.into());
        c.restart_policy_rules = (!rules.is_empty()).then(|| {
            rules
                .iter()
                .map(|(action, op, codes)| ContainerRestartRule {
                    action: (*action).into(),
                    exit_codes: Some(ContainerRestartRuleOnExitCodes {
                        operator: (*op).into(),
                        values: Some(codes.to_vec()),
                    }),
                })
                .collect()
        });
        self
    }
    /// Sets the restart policy.
    pub fn restart_policy(mut self, policy: &str) -> Self {
        self.spec().restart_policy = Some(policy.into());
        self
    }
    /// Adds a label.
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.0
            .metadata
            .labels
            .get_or_insert_default()
            .insert(k.into(), v.into());
        self
    }
    /// Marks the pod deleted at `at` with a grace period.
    pub fn deleted(mut self, at: Timestamp, grace: i64) -> Self {
        self.0.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at));
        self.0.metadata.deletion_grace_period_seconds = Some(grace);
        self
    }
    fn spec(&mut self) -> &mut PodSpec {
        self.0.spec.get_or_insert_default()
    }
    /// The pod.
    pub fn build(self) -> Pod {
        self.0
    }
}

/// A time `secs` seconds after a fixed epoch.
pub fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_700_000_000 + secs).expect("valid test time")
}

/// A ready sandbox `id` at `attempt`, with IP 10.88.0.2.
pub fn sandbox(id: &str, attempt: u32, ready: bool) -> Sandbox {
    Sandbox {
        id: id.into(),
        attempt,
        ready,
        created_at: t(i64::from(attempt)),
        ips: if ready {
            vec!["10.88.0.2".into()]
        } else {
            vec![]
        },
    }
}

/// A container record.
pub fn ctr(
    id: &str,
    name: &str,
    attempt: u32,
    sandbox_id: &str,
    state: ContainerState,
) -> Container {
    Container {
        id: id.into(),
        name: name.into(),
        attempt,
        sandbox_id: sandbox_id.into(),
        state,
        created_at: t(10 + i64::from(attempt)),
        started_at: (state != ContainerState::Created).then(|| t(11 + i64::from(attempt))),
        image: "busybox".into(),
        image_ref: "sha256:b".into(),
        ..Default::default()
    }
}

/// Container `c` exited with `code` at `at`.
pub fn exited(mut c: Container, code: i32, at: Timestamp) -> Container {
    c.state = ContainerState::Exited;
    c.exit_code = code;
    c.finished_at = Some(at);
    c
}

/// Runtime state from parts (sorted newest first).
pub fn runtime(sandboxes: Vec<Sandbox>, containers: Vec<Container>) -> PodRuntime {
    let mut rt = PodRuntime {
        sandboxes,
        containers,
    };
    rt.sort();
    rt
}

/// Whether a test's requirement `what` (root, a cgroup hierarchy, a mount)
/// is met here (`met`). When it is not, the test says it is skipped and
/// returns false, except under `CI=true`, where it panics: CI's machine has
/// root and the hierarchies, so a requirement missing there is a failure,
/// not a test that passed without checking anything.
///
/// # Panics
/// When `met` is false under `CI=true`.
#[must_use]
pub fn requires(what: &str, met: bool) -> bool {
    if met {
        return true;
    }
    assert!(
        std::env::var("CI").map_or(true, |v| v != "true"),
        "{what} is missing: under CI=true this test must run"
    );
    eprintln!("skipped: {what} is missing");
    false
}

/// The node facts of a test node: `node-1` at `10.0.0.1`, pod logs in
/// `/var/log/pods`, root `/var/lib/rustlet`, domain `cluster.local`, 4 cpus,
/// 8Gi and 110 pods allocatable; tests override what they need with
/// `NodeContext { field, ..node_context() }`.
#[must_use]
pub fn node_context() -> crate::pod_core::facts::NodeContext {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    crate::pod_core::facts::NodeContext {
        node_name: "node-1".into(),
        node_ips: vec!["10.0.0.1".into()],
        pod_logs_dir: "/var/log/pods".into(),
        root_dir: "/var/lib/rustlet".into(),
        cluster_domain: "cluster.local".into(),
        allocatable: std::collections::BTreeMap::from([
            ("cpu".to_string(), Quantity("4".into())),
            ("memory".to_string(), Quantity("8Gi".into())),
            ("pods".to_string(), Quantity("110".into())),
        ]),
        hosts_file: "/etc/hosts".into(),
        ..Default::default()
    }
}

/// The status facts of a test node: host IP `10.0.0.1`, runtime
/// `containerd` mounting recursively read-only, the default 100 ms CFS
/// period.
#[must_use]
pub fn status_context() -> crate::pod_core::status::StatusContext {
    crate::pod_core::status::StatusContext {
        host_ips: vec!["10.0.0.1".into()],
        runtime_name: "containerd".into(),
        runtime_rro: true,
        cpu_period_us: crate::pod_core::limits::CPU_PERIOD_US,
    }
}
