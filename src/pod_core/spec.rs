//! Helpers that read a pod's spec and status as the kubelet reads them: restart
//! policies (pod, container, init container, restart rules), grace periods,
//! container lists by kind, ephemeral containers as containers, the image pull
//! policy, terminal phases. Pure; shared by the plan, the status and the
//! runtime manager.

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod, VolumeMount};

use crate::labels::{CONFIG_MIRROR_ANNOTATION, CONFIG_SOURCE_ANNOTATION};

/// The pod's restart policy (`Always` when unset).
#[must_use]
pub fn restart_policy(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always")
}

/// Whether a container that exited with `exit_code` is restarted under the
/// pod-level `policy`.
#[must_use]
pub fn should_restart(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// True when `rule` matches `exit_code`: its `exitCodes` operator `In` (the
/// code is listed) or `NotIn` (it is not); a rule without `exitCodes` or with
/// another operator matches nothing (`FindMatchingContainerRestartRule`).
fn rule_matches(rule: &k8s_openapi::api::core::v1::ContainerRestartRule, exit_code: i32) -> bool {
    let Some(codes) = &rule.exit_codes else {
        return false;
    };
    let listed = codes.values.iter().flatten().any(|v| *v == exit_code);
    match codes.operator.as_str() {
        "In" => listed,
        "NotIn" => !listed,
        _ => false,
    }
}

/// Whether container `c` that exited with `exit_code` restarts every
/// container of its pod: its first `restartPolicyRules` entry matching the
/// exit code has the action `RestartAllContainers` (rules apply only with a
/// container-level `restartPolicy`), as the kubelet's
/// `FindMatchingContainerRestartRule` read by `ShouldAllContainersRestart`.
#[must_use]
pub fn restarts_all(c: &Container, exit_code: i32) -> bool {
    c.restart_policy.is_some()
        && c.restart_policy_rules
            .iter()
            .flatten()
            .find(|r| rule_matches(r, exit_code))
            .is_some_and(|r| r.action == "RestartAllContainers")
}

/// Whether some container of `pod` has a `RestartAllContainers` rule (the
/// kubelet's `AllContainersCouldRestart`): its status then carries the
/// `AllContainersRestarting` condition.
#[must_use]
pub fn could_restart_all(pod: &Pod) -> bool {
    main_containers(pod)
        .iter()
        .chain(init_containers(pod))
        .any(|c| {
            c.restart_policy.is_some()
                && c.restart_policy_rules
                    .iter()
                    .flatten()
                    .any(|r| r.action == "RestartAllContainers")
        })
}

/// Whether container `c` that exited with `exit_code` is restarted, as the
/// kubelet's `ContainerShouldRestart` (feature ContainerRestartRules, on by
/// default since v1.35): with a container-level `restartPolicy`, the first
/// `restartPolicyRules` entry matching the exit code decides when its action
/// is `Restart` or `RestartAllContainers`, else the container's policy does;
/// without one, the pod's `policy` does ([`should_restart`]).
#[must_use]
pub fn container_should_restart(c: &Container, policy: &str, exit_code: i32) -> bool {
    if let Some(own) = c.restart_policy.as_deref() {
        let rule = c
            .restart_policy_rules
            .iter()
            .flatten()
            .find(|r| rule_matches(r, exit_code));
        if rule.is_some_and(|r| matches!(r.action.as_str(), "Restart" | "RestartAllContainers")) {
            return true;
        }
        match own {
            "Always" => return true,
            "OnFailure" => return exit_code != 0,
            "Never" => return false,
            _ => {}
        }
    }
    should_restart(policy, exit_code)
}

/// Whether a running container is restarted after a failed liveness or
/// startup probe kills it: the container's own `restartPolicy` when set (not
/// `Never`; its rules are not evaluated, there is no exit code yet), else the
/// pod's (`computePodActions`).
#[must_use]
pub fn restarts_after_kill(c: &Container, policy: &str) -> bool {
    c.restart_policy
        .as_deref()
        .map_or(policy != "Never", |own| own != "Never")
}

/// The pod's grace period for deletion, in seconds: `deletionGracePeriodSeconds`,
/// else `terminationGracePeriodSeconds`, else 30.
#[must_use]
pub fn grace_period(pod: &Pod) -> i64 {
    pod.metadata
        .deletion_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(30)
        .max(0)
}

/// True when the pod's phase in the API is already terminal (Succeeded or Failed).
#[must_use]
pub fn is_terminal(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(crate::reasons::phase::is_terminal)
}

/// True for a pod the eviction manager or the node shutdown manager marked
/// (status reason `Evicted` or `Terminated`) that has not reached its
/// terminal phase yet: its containers are stopped and it fails.
#[must_use]
pub fn is_evicted(pod: &Pod) -> bool {
    !is_terminal(pod)
        && pod
            .status
            .as_ref()
            .and_then(|s| s.reason.as_deref())
            .is_some_and(|r| {
                r == crate::reasons::pod::EVICTED || r == crate::reasons::pod::NODE_SHUTDOWN
            })
}

/// The grace period of an evicted pod's containers, in seconds: the
/// kubelet's `immediateEvictionGracePeriodSeconds`.
pub const EVICTION_GRACE_SECONDS: i64 = 1;

/// True for a sidecar: an init container with `restartPolicy: Always`.
#[must_use]
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Whether init container `c` runs again after exiting with `exit_code`: a
/// sidecar as its own `restartPolicy: Always` says; a regular init container
/// never after success, after failure as [`container_should_restart`] says
/// (the kubelet's `isInitContainerFailed` with `shouldRestartOnFailure`).
#[must_use]
pub fn init_container_should_restart(c: &Container, policy: &str, exit_code: i32) -> bool {
    (is_sidecar(c) || exit_code != 0) && container_should_restart(c, policy, exit_code)
}

/// The pod's init containers (empty when none).
#[must_use]
pub fn init_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
}

/// The pod's main containers.
#[must_use]
pub fn main_containers(pod: &Pod) -> &[Container] {
    pod.spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
}

/// An ephemeral container as the container it is run as (the kubelet's
/// `v1.Container(ec.EphemeralContainerCommon)`: every field but
/// `targetContainerName`).
#[must_use]
pub fn ephemeral_as_container(ec: &EphemeralContainer) -> Container {
    Container {
        args: ec.args.clone(),
        command: ec.command.clone(),
        env: ec.env.clone(),
        env_from: ec.env_from.clone(),
        image: ec.image.clone(),
        image_pull_policy: ec.image_pull_policy.clone(),
        lifecycle: ec.lifecycle.clone(),
        liveness_probe: ec.liveness_probe.clone(),
        name: ec.name.clone(),
        ports: ec.ports.clone(),
        readiness_probe: ec.readiness_probe.clone(),
        resize_policy: ec.resize_policy.clone(),
        resources: ec.resources.clone(),
        restart_policy: ec.restart_policy.clone(),
        restart_policy_rules: ec.restart_policy_rules.clone(),
        security_context: ec.security_context.clone(),
        startup_probe: ec.startup_probe.clone(),
        stdin: ec.stdin,
        stdin_once: ec.stdin_once,
        termination_message_path: ec.termination_message_path.clone(),
        termination_message_policy: ec.termination_message_policy.clone(),
        tty: ec.tty,
        volume_devices: ec.volume_devices.clone(),
        volume_mounts: ec.volume_mounts.clone(),
        working_dir: ec.working_dir.clone(),
    }
}

/// The pod's ephemeral containers as containers ([`ephemeral_as_container`]).
#[must_use]
pub fn ephemeral_containers(pod: &Pod) -> Vec<Container> {
    pod.spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_deref())
        .unwrap_or_default()
        .iter()
        .map(ephemeral_as_container)
        .collect()
}

/// The names of the pod's ephemeral containers.
pub fn ephemeral_names(pod: &Pod) -> impl Iterator<Item = &str> {
    pod.spec
        .iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .map(|ec| ec.name.as_str())
}

/// The image pull policy in effect: the spec's, else `Always` for `:latest` or
/// untagged images and `IfNotPresent` otherwise (API defaulting).
#[must_use]
pub fn pull_policy(c: &k8s_openapi::api::core::v1::Container) -> String {
    policy_of(
        c.image_pull_policy.as_deref(),
        c.image.as_deref().unwrap_or_default(),
    )
}

/// An image volume's pull policy in effect, as [`pull_policy`]'s for its
/// `reference` (the API defaults both alike).
#[must_use]
pub fn image_volume_pull_policy(v: &k8s_openapi::api::core::v1::ImageVolumeSource) -> String {
    policy_of(
        v.pull_policy.as_deref(),
        v.reference.as_deref().unwrap_or_default(),
    )
}

/// `policy`, else the default for `image`.
fn policy_of(policy: Option<&str>, image: &str) -> String {
    if let Some(p) = policy {
        return p.to_string();
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') || (last.contains(':') && !last.ends_with(":latest")) {
        "IfNotPresent".into()
    } else {
        "Always".into()
    }
}

/// The container named `name` among the pod's main and init containers.
#[must_use]
pub fn find_container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    main_containers(pod)
        .iter()
        .chain(init_containers(pod))
        .find(|c| c.name == name)
}

/// True for a pod from a source other than the API server (a manifest),
/// as the kubelet's `IsStaticPod`: `kubernetes.io/config.source` set and
/// not `api`.
#[must_use]
pub fn is_static(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE_ANNOTATION).is_some_and(|s| s != "api")
}

/// True for a mirror pod (`kubernetes.io/config.mirror` set), as the
/// kubelet's `IsMirrorPod`.
#[must_use]
pub fn is_mirror(pod: &Pod) -> bool {
    annotation(pod, CONFIG_MIRROR_ANNOTATION).is_some()
}

/// The value of annotation `key` of `pod`, if set.
#[must_use]
pub fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Whether mount `m` (read-only when `read_only`) is recursively read-only,
/// as the kubelet's `resolveRecursiveReadOnly`: `Enabled` needs the runtime's
/// support (`runtime_rro`, its handler's `recursive_read_only_mounts`
/// feature), `IfPossible` takes it when there is some, `Disabled` or unset
/// never; only a read-only mount without propagation may ask.
///
/// # Errors
/// The kubelet's messages for a mount that may not ask, or for `Enabled`
/// without the runtime's support.
pub fn recursive_read_only(
    m: &VolumeMount,
    read_only: bool,
    runtime_rro: bool,
) -> Result<bool, String> {
    let mode = match m.recursive_read_only.as_deref() {
        None | Some("Disabled") => return Ok(false),
        Some(mode) => mode,
    };
    let name = &m.name;
    if !read_only {
        return Err(format!(
            "volume {name:?} requested recursive read-only mode, but it is not read-only"
        ));
    }
    if let Some(p) = m.mount_propagation.as_deref().filter(|p| *p != "None") {
        return Err(format!(
            "volume {name:?} requested recursive read-only mode, but it is not compatible with propagation {p:?}"
        ));
    }
    match mode {
        "IfPossible" => Ok(runtime_rro),
        "Enabled" if runtime_rro => Ok(true),
        "Enabled" => Err(format!(
            "volume {name:?} requested recursive read-only mode, but it is not supported by the runtime"
        )),
        other => Err(format!("unknown recursive read-only mode {other:?}")),
    }
}

/// A resource a pod may set for itself (`spec.resources`), as
/// component-helpers' `IsSupportedPodLevelResource`: cpu, memory and huge
/// pages.
#[must_use]
pub fn is_pod_level_resource(name: &str) -> bool {
    name == "cpu" || name == "memory" || name.starts_with("hugepages-")
}
