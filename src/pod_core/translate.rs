//! How a Pod spec becomes CRI configs: the kubelet's `generatePodSandboxConfig`
//! and `generateContainerConfig` (kuberuntime_sandbox.go, kuberuntime_container.go).
//! Pure: plain data in, CRI messages out.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{
    AppArmorProfile, Container, Pod, PodSecurityContext, SELinuxOptions, SeccompProfile,
    SecurityContext,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use sha2::{Digest, Sha256};

use super::facts::{NodeContext, pod_identity};
use super::qos::{QosClass, qos_class};
use super::runtime::CgroupLimits;
use crate::labels::{
    APPARMOR_ANNOTATION_PREFIX, CONTAINER_HASH_ANNOTATION, CONTAINER_NAME_LABEL, POD_NAME_LABEL,
    POD_NAMESPACE_LABEL, POD_UID_LABEL, RESTART_COUNT_ANNOTATION,
    TERMINATION_GRACE_PERIOD_ANNOTATION, TERMINATION_MESSAGE_PATH_ANNOTATION,
    TERMINATION_MESSAGE_POLICY_ANNOTATION,
};

/// A pod spec that cannot be turned into a CRI config.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spec asks for something invalid or unsupported; the message says
    /// what, in the kubelet's words (events quote it as it is).
    #[error("{0}")]
    InvalidSpec(String),
}

/// The container's hash as the kubelet's `HashContainer` (since 1.31), kept
/// in the `io.kubernetes.container.hash` annotation: FNV-1a (32 bits) of the
/// `%#v` dump of the JSON of `{"image", "name"}` (Go's `json.Marshal` of a
/// map: sorted keys, `<`, `>` and `&` escaped), as lowercase hex without
/// padding. Only a new image changes it: resources are resized in place,
/// and the rest of a container's spec cannot change.
#[must_use]
pub fn container_hash(c: &Container) -> String {
    let go_string = |s: &str| {
        serde_json::to_string(s)
            .unwrap_or_default()
            .replace('<', "\\u003c")
            .replace('>', "\\u003e")
            .replace('&', "\\u0026")
            .replace('\u{2028}', "\\u2028")
            .replace('\u{2029}', "\\u2029")
    };
    let json = format!(
        "{{\"image\":{},\"name\":{}}}",
        go_string(c.image.as_deref().unwrap_or_default()),
        go_string(&c.name)
    );
    // The dump of a byte slice: `([]uint8)[123 34 ...]`.
    let mut dump = String::with_capacity(json.len() * 4 + 12);
    dump.push_str("([]uint8)[");
    for (i, b) in json.bytes().enumerate() {
        if i > 0 {
            dump.push(' ');
        }
        dump.push_str(&b.to_string());
    }
    dump.push(']');
    let hash = dump.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("{hash:x}")
}

/// The hash earlier rustlet versions kept: the first 8 bytes of the SHA-256
/// of the whole container spec's JSON, as 16 hex digits.
fn legacy_container_hash(c: &Container) -> String {
    let json = serde_json::to_vec(c).unwrap_or_default();
    let digest = Sha256::digest(&json);
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// True when a container created with `hash` still runs spec `c`: its
/// [`container_hash`], or, for a container an earlier rustlet version
/// created (16 hex digits), the hash that version kept of the same spec, so
/// an upgrade adopts its containers instead of restarting them.
#[must_use]
pub fn hash_matches(hash: &str, c: &Container) -> bool {
    hash == container_hash(c) || (hash.len() == 16 && hash == legacy_container_hash(c))
}

/// The most bytes a pod's own labels and annotations, together, may take in
/// its sandbox's config (counted as they are encoded: each entry's key and
/// value and [`ENTRY_OVERHEAD_BYTES`]). The kubelet passes them all; every
/// sandbox, ready or not, comes back in each unfiltered `ListPodSandbox`,
/// whose answer is at most [`crate::cri::MAX_MESSAGE_BYTES`], so a few dozen
/// pods with many small labels would make that list fail for every caller.
/// Capped, 110 pods with a ready and a dead sandbox each list in about 7 MiB.
/// Past the cap the labels are left out, and when the annotations alone are
/// still past it they are too; the identifying labels always stay, and
/// [`oversized_metadata`] names what was left out, for an Event. Labels are
/// informational to the runtime; annotations may not be (containerd can
/// hand them to the OCI runtime), which is why they go last and are named.
pub const MAX_SANDBOX_METADATA_BYTES: usize = 32 << 10;

/// The bytes a map entry takes in a protobuf message beside its key and
/// value (tags and lengths), rounded up.
pub const ENTRY_OVERHEAD_BYTES: usize = 8;

/// The encoded bytes of a map's entries, saturating.
fn metadata_bytes(map: Option<&BTreeMap<String, String>>) -> usize {
    map.into_iter().flatten().fold(0usize, |n, (k, v)| {
        n.saturating_add(k.len())
            .saturating_add(v.len())
            .saturating_add(ENTRY_OVERHEAD_BYTES)
    })
}

/// Which of the pod's `labels` and `annotations` its sandbox leaves out
/// ([`MAX_SANDBOX_METADATA_BYTES`]): empty for almost every pod.
#[must_use]
pub fn oversized_metadata(pod: &Pod) -> Vec<&'static str> {
    let m = &pod.metadata;
    let (labels, annotations) = (
        metadata_bytes(m.labels.as_ref()),
        metadata_bytes(m.annotations.as_ref()),
    );
    if labels.saturating_add(annotations) <= MAX_SANDBOX_METADATA_BYTES {
        return Vec::new();
    }
    let mut out = Vec::new();
    if labels > 0 {
        out.push("labels");
    }
    if annotations > MAX_SANDBOX_METADATA_BYTES {
        out.push("annotations");
    }
    out
}

/// The pod's annotations, as the runtime takes them (the sandbox's, and an
/// image volume's `ImageSpec`'s): none when [`oversized_metadata`] leaves
/// them out.
#[must_use]
pub fn pod_annotations(pod: &Pod) -> HashMap<String, String> {
    if oversized_metadata(pod).contains(&"annotations") {
        return HashMap::new();
    }
    pod.metadata
        .annotations
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The sandbox's labels: the pod's own (none when [`oversized_metadata`]
/// leaves them out) and the kubelet's identifying ones.
fn pod_labels(pod: &Pod) -> HashMap<String, String> {
    let (ns, name, uid) = pod_identity(pod);
    let mut labels: HashMap<String, String> = if oversized_metadata(pod).contains(&"labels") {
        HashMap::new()
    } else {
        pod.metadata
            .labels
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    };
    labels.insert(POD_NAME_LABEL.into(), name);
    labels.insert(POD_NAMESPACE_LABEL.into(), ns);
    labels.insert(POD_UID_LABEL.into(), uid);
    labels
}

fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

fn namespace_options(pod: &Pod, isolation: &Isolation) -> cri::NamespaceOption {
    let spec = pod.spec.as_ref();
    let mode = |host: Option<bool>, otherwise: cri::NamespaceMode| {
        if host.unwrap_or(false) {
            cri::NamespaceMode::Node as i32
        } else {
            otherwise as i32
        }
    };
    cri::NamespaceOption {
        network: mode(spec.and_then(|s| s.host_network), cri::NamespaceMode::Pod),
        pid: mode(
            spec.and_then(|s| s.host_pid),
            if spec
                .and_then(|s| s.share_process_namespace)
                .unwrap_or(false)
            {
                cri::NamespaceMode::Pod
            } else {
                cri::NamespaceMode::Container
            },
        ),
        ipc: mode(spec.and_then(|s| s.host_ipc), cri::NamespaceMode::Pod),
        userns_options: isolation.user_namespace.clone(),
        ..Default::default()
    }
}

/// What the cluster and the runtime decide about a pod's isolation beyond its
/// spec, resolved before its sandbox is made: the CRI runtime handler of its
/// RuntimeClass and its user namespace. Plain data, so that translation stays
/// pure.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Isolation {
    /// The RuntimeClass's `handler` (empty: the runtime's default), given to
    /// `RunPodSandbox`.
    pub runtime_handler: String,
    /// `NamespaceOption.userns_options` of the sandbox and of every container:
    /// none (the feature gate is off and `hostUsers` unset), `NODE`, or `POD`
    /// with the pod's ID mappings ([`pod_user_namespace`]).
    pub user_namespace: Option<cri::UserNamespace>,
}

/// Size of a pod's user namespace ID range: 65536 IDs, as the kubelet's
/// `userNsLength` (its default `idsPerPod`).
pub const USER_NS_LENGTH: u32 = 1 << 16;

/// What a pod asks of user namespaces, as the kubelet's
/// `GetOrCreateUserNamespaceMappings` before any range is allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UserNamespaceNeed {
    /// Nothing is said to the runtime (the feature gate is off, `hostUsers` unset).
    Unspecified,
    /// The host's user namespace (`hostUsers` unset or true).
    Host,
    /// A user namespace of the pod's own (`hostUsers: false`), with a range of
    /// [`USER_NS_LENGTH`] IDs to allocate.
    Pod,
}

/// Decides [`UserNamespaceNeed`] for `pod` run with runtime handler
/// `handler`, given the handlers the runtime reports in CRI `Status`
/// (`runtime_handlers`, each with `features.user_namespaces`) and the
/// `UserNamespacesSupport` feature gate: the kubelet's
/// `GetOrCreateUserNamespaceMappings` with `HandlerSupportsUserNamespaces`.
/// A pod that asks for its own user namespace never falls back to the host's.
///
/// # Errors
/// The kubelet's messages: the gate is off but `hostUsers` is set; the
/// runtime reports no handlers, does not know `handler`, or knows it without
/// user namespace support.
pub fn user_namespace_need(
    pod: &Pod,
    handler: &str,
    handlers: &[cri::RuntimeHandler],
    gate: bool,
) -> Result<UserNamespaceNeed, String> {
    let host_users = pod.spec.as_ref().and_then(|s| s.host_users);
    match (host_users, gate) {
        (None, false) => return Ok(UserNamespaceNeed::Unspecified),
        (None | Some(true), true) => return Ok(UserNamespaceNeed::Host),
        (Some(_), false) => {
            return Err(
                "the feature gate \"UserNamespacesSupport\" is disabled: can't set spec.HostUsers"
                    .into(),
            );
        }
        (Some(false), true) => {}
    }
    if handlers.is_empty() {
        return Err("runtime handlers are not set".into());
    }
    let known = handlers
        .iter()
        .find(|h| h.name == handler)
        .ok_or_else(|| format!("the handler {handler:?} is not known"))?;
    if known.features.as_ref().is_some_and(|f| f.user_namespaces) {
        Ok(UserNamespaceNeed::Pod)
    } else {
        Err(format!(
            "RuntimeClass handler {handler:?} does not support user namespaces"
        ))
    }
}

/// Checks that the runtime knows `handler`, when it reports its handlers at
/// all (CRI `Status.runtime_handlers`, where `""` is its default): a pod is
/// never run with another handler than its RuntimeClass names.
///
/// # Errors
/// The kubelet's `the handler "x" is not known`.
pub fn check_runtime_handler(
    handler: &str,
    handlers: &[cri::RuntimeHandler],
) -> Result<(), String> {
    if handlers.is_empty() || handlers.iter().any(|h| h.name == handler) {
        Ok(())
    } else {
        Err(format!("the handler {handler:?} is not known"))
    }
}

/// The user namespace of a pod whose range starts at host ID `first_id`:
/// mode `POD`, container IDs 0..65536 mapped onto `first_id`.., the same
/// for groups, as the kubelet's `createUserNs`.
#[must_use]
pub fn pod_user_namespace(first_id: u32) -> cri::UserNamespace {
    let mapping = cri::IdMapping {
        host_id: first_id,
        container_id: 0,
        length: USER_NS_LENGTH,
    };
    cri::UserNamespace {
        mode: cri::NamespaceMode::Pod as i32,
        uids: vec![mapping],
        gids: vec![mapping],
    }
}

/// The user namespace option of a pod that uses the host's.
#[must_use]
pub fn host_user_namespace() -> cri::UserNamespace {
    cri::UserNamespace {
        mode: cri::NamespaceMode::Node as i32,
        ..Default::default()
    }
}

/// DNS config for the sandbox, as the kubelet's `GetPodDNS` for each `dnsPolicy`.
///
/// # Errors
/// [`Error::InvalidSpec`] for `dnsPolicy: None` without `dnsConfig`.
pub fn dns_config(pod: &Pod, node: &NodeContext) -> Result<cri::DnsConfig, Error> {
    let spec = pod.spec.as_ref();
    let policy = spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst");
    let host = &node.host_dns;
    let mut dns = match policy {
        "None" => cri::DnsConfig::default(),
        "Default" => cri::DnsConfig {
            servers: host.servers.clone(),
            searches: host.searches.clone(),
            options: host.options.clone(),
        },
        "ClusterFirst" | "ClusterFirstWithHostNet" => {
            let use_host =
                node.cluster_dns.is_empty() || (policy == "ClusterFirst" && host_network(pod));
            if use_host {
                // The kubelet falls back to the host's resolver when clusterDNS is not set.
                cri::DnsConfig {
                    servers: host.servers.clone(),
                    searches: host.searches.clone(),
                    options: host.options.clone(),
                }
            } else {
                let (ns, _, _) = pod_identity(pod);
                let d = &node.cluster_domain;
                let mut searches = vec![format!("{ns}.svc.{d}"), format!("svc.{d}"), d.clone()];
                searches.extend(host.searches.iter().cloned());
                cri::DnsConfig {
                    servers: node.cluster_dns.clone(),
                    searches,
                    options: vec!["ndots:5".into()],
                }
            }
        }
        other => return Err(Error::InvalidSpec(format!("unknown dnsPolicy {other:?}"))),
    };
    if let Some(extra) = spec.and_then(|s| s.dns_config.as_ref()) {
        dns.servers
            .extend(extra.nameservers.clone().unwrap_or_default());
        dns.searches
            .extend(extra.searches.clone().unwrap_or_default());
        for o in extra.options.clone().unwrap_or_default() {
            let name = o.name.unwrap_or_default();
            dns.options
                .retain(|x| x.split(':').next() != Some(name.as_str()));
            dns.options.push(match o.value {
                Some(v) => format!("{name}:{v}"),
                None => name,
            });
        }
    } else if policy == "None" {
        return Err(Error::InvalidSpec(
            "dnsPolicy None requires spec.dnsConfig".into(),
        ));
    }
    Ok(dns)
}

/// The sandbox config of attempt `attempt` with the pod's `isolation`, as the
/// kubelet's `generatePodSandboxConfig` and `generatePodSandboxLinuxConfig`:
/// the sandbox runs under the runtime's default seccomp profile, with the
/// pod's SELinux options, supplemental groups policy and user namespace, and
/// the pod's `overhead` (set from its RuntimeClass) as the sandbox's.
///
/// The hostname is the kubelet's `GeneratePodHostNameAndDomain` (see [`super::hosts`]).
///
/// # Errors
/// [`Error::InvalidSpec`] when the DNS settings, the hostname or the
/// supplemental groups policy are invalid.
pub fn sandbox_config(
    pod: &Pod,
    attempt: u32,
    node: &NodeContext,
    isolation: &Isolation,
) -> Result<cri::PodSandboxConfig, Error> {
    let (ns, name, uid) = pod_identity(pod);
    let spec = pod.spec.as_ref();
    let hostname = if host_network(pod) {
        String::new()
    } else {
        let (h, domain) = super::hosts::hostname_and_domain(pod, &node.cluster_domain)
            .map_err(Error::InvalidSpec)?;
        super::hosts::kernel_hostname(pod, &h, &domain).map_err(Error::InvalidSpec)?
    };
    let port_mappings = spec
        .map(|s| s.containers.iter())
        .into_iter()
        .flatten()
        .flat_map(|c| c.ports.clone().unwrap_or_default())
        .filter(|p| p.host_port.unwrap_or(0) > 0)
        .map(|p| cri::PortMapping {
            protocol: match p.protocol.as_deref() {
                Some("UDP") => cri::Protocol::Udp as i32,
                Some("SCTP") => cri::Protocol::Sctp as i32,
                _ => cri::Protocol::Tcp as i32,
            },
            container_port: p.container_port,
            host_port: p.host_port.unwrap_or(0),
            host_ip: p.host_ip.unwrap_or_default(),
        })
        .collect();
    let psc = spec.and_then(|s| s.security_context.as_ref());
    let sysctls = psc
        .and_then(|sc| sc.sysctls.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|s| (s.name, s.value))
        .collect();
    Ok(cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.clone(),
            uid: uid.clone(),
            namespace: ns.clone(),
            attempt,
        }),
        hostname,
        log_directory: crate::paths::pod_log_dir(&node.pod_logs_dir, &ns, &name, &uid)
            .to_string_lossy()
            .into_owned(),
        dns_config: Some(dns_config(pod, node)?),
        port_mappings,
        labels: pod_labels(pod),
        annotations: pod_annotations(pod),
        linux: Some(cri::LinuxPodSandboxConfig {
            overhead: overhead(pod, node.cpu_period_us),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(pod, isolation)),
                selinux_options: psc.and_then(|p| p.se_linux_options.as_ref()).map(selinux),
                supplemental_groups_policy: supplemental_groups_policy(psc)?,
                privileged: has_privileged_container(pod),
                run_as_user: psc
                    .and_then(|p| p.run_as_user)
                    .map(|value| cri::Int64Value { value }),
                run_as_group: psc
                    .and_then(|p| p.run_as_group)
                    .map(|value| cri::Int64Value { value }),
                supplemental_groups: psc
                    .and_then(|p| p.supplemental_groups.clone())
                    .unwrap_or_default()
                    .into_iter()
                    .chain(psc.and_then(|p| p.fs_group))
                    .collect(),
                // As the kubelet: the sandbox always runs under the runtime's
                // default profile, whatever the containers get.
                seccomp: Some(cri::SecurityProfile {
                    profile_type: cri::security_profile::ProfileType::RuntimeDefault as i32,
                    localhost_ref: String::new(),
                }),
                ..Default::default()
            }),
            sysctls,
            ..Default::default()
        }),
        windows: None,
    })
}

/// Millicores (`milli`) or units (bytes, for memory) of a quantity, rounded
/// up as the kubelet's `MilliValue` and `Value`; `None` when unset or not a
/// quantity. An amount beyond `i64` (a cpu of `1e30`, a memory of `8Ei`, one
/// byte past `i64::MAX`) saturates at `i64::MAX` (or `i64::MIN`), where the
/// kubelet's conversion wraps.
fn amount(q: Option<&Quantity>, milli: bool) -> Option<i64> {
    let q = crate::resource::Quantity::parse_saturating(&q?.0).ok()?;
    let v = if milli { q.milli_value() } else { q.value() };
    Some(i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX }))
}

/// Minimum CPU shares (the kubelet's `MinShares`), as the cgroup manager
/// writes it.
pub const MIN_SHARES: i64 = super::limits::MIN_SHARES as i64;
/// Maximum CPU shares (the kubelet's `MaxShares`, the kernel's limit).
pub const MAX_SHARES: i64 = 262_144;
/// The default CFS period in microseconds (100 ms, the kubelet's
/// `QuotaPeriod`); `cpuCFSQuotaPeriod` sets another
/// ([`NodeContext::cpu_period_us`]).
pub const CPU_PERIOD_US: i64 = super::limits::CPU_PERIOD_US;
/// Minimum CFS quota in microseconds (`MinQuotaPeriod`, 1 ms).
pub const MIN_QUOTA_US: i64 = 1_000;

/// The CPU shares of a request of `millicores`, as the kubelet's
/// `MilliCPUToShares`: millicores × 1024 / 1000, clamped to
/// [`MIN_SHARES`]..=[`MAX_SHARES`] (computed wide, so that no request overflows).
#[must_use]
pub fn cpu_shares(millicores: i64) -> i64 {
    let shares = (i128::from(millicores) * 1024 / 1000)
        .clamp(i128::from(MIN_SHARES), i128::from(MAX_SHARES));
    i64::try_from(shares).unwrap_or(MAX_SHARES)
}

/// The CFS quota in microseconds of a limit of `millicores` over a period
/// of `period_us` microseconds, as the kubelet's `milliCPUToQuota`: 0 (no
/// quota) for a zero limit, else millicores × period / 1000, at least
/// [`MIN_QUOTA_US`]; a quota beyond `i64` is `i64::MAX`, where the kubelet's
/// product wraps.
#[must_use]
pub fn cpu_quota(millicores: i64, period_us: i64) -> i64 {
    if millicores == 0 {
        return 0;
    }
    let quota =
        (i128::from(millicores) * i128::from(period_us) / 1000).max(i128::from(MIN_QUOTA_US));
    i64::try_from(quota).unwrap_or(i64::MAX)
}

/// The memory limit in bytes given to the runtime for a limit of `bytes`
/// (already saturated at `i64::MAX`): 0, which sets none, for an
/// unset, zero or negative limit (the kubelet sets the limit only when it is
/// not 0; the API admits no negative quantity, and the runtime would read
/// -1 as unlimited and refuse any other).
#[must_use]
pub fn memory_limit_bytes(bytes: Option<i64>) -> i64 {
    bytes.unwrap_or(0).max(0)
}

/// The `oom_score_adj` of a Burstable container requesting `request_bytes` of
/// memory on a node of `capacity_bytes`, as the kubelet's
/// `GetContainerOOMScoreAdjust`: 1000 − 1000 × request / capacity, computed
/// wide (the kubelet's int64 product wraps beyond 8 PiB), within 3..=999
/// (above Guaranteed's, below BestEffort's 1000; the kubelet leaves a value
/// above 1000, from a negative request, to the kernel, which refuses it).
#[must_use]
pub fn burstable_oom_score_adj(request_bytes: i64, capacity_bytes: u64) -> i64 {
    let capacity = i128::from(capacity_bytes.max(1));
    let adj = (1000 - 1000 * i128::from(request_bytes) / capacity).clamp(3, 999);
    i64::try_from(adj).unwrap_or(999)
}

/// The container's Linux resources, as the kubelet's `calculateLinuxResources`:
/// cpu shares from the request ([`cpu_shares`]), CFS quota from the limit over
/// the node's period ([`NodeContext::cpu_period_us`], [`cpu_quota`]), the memory limit in bytes
/// ([`memory_limit_bytes`]), and `oom_score_adj` from the pod's QoS class
/// (`GetContainerOOMScoreAdjust`, [`burstable_oom_score_adj`]). However large
/// the quantities, nothing overflows.
#[must_use]
pub fn linux_resources(
    pod: &Pod,
    c: &Container,
    node: &NodeContext,
) -> cri::LinuxContainerResources {
    let limits = cgroup_limits(pod, c, node.cpu_period_us);
    let memory_request = {
        let res = c.resources.as_ref();
        let request = res
            .and_then(|r| r.requests.as_ref())
            .and_then(|m| m.get("memory"))
            .or_else(|| {
                res.and_then(|r| r.limits.as_ref())
                    .and_then(|m| m.get("memory"))
            });
        amount(request, false).unwrap_or(0)
    };
    let oom_score_adj = match qos_class(pod) {
        QosClass::Guaranteed => -997,
        QosClass::BestEffort => 1000,
        QosClass::Burstable => burstable_oom_score_adj(memory_request, node.memory_capacity_bytes),
    };
    let mut resources = cri::LinuxContainerResources {
        cpu_period: limits.cpu_period,
        cpu_quota: limits.cpu_quota,
        cpu_shares: limits.cpu_shares,
        memory_limit_in_bytes: limits.memory_limit_in_bytes,
        oom_score_adj,
        hugepage_limits: hugepage_limits(pod, c, &node.huge_page_sizes),
        ..Default::default()
    };
    set_swap(&mut resources, pod, c, node);
    resources
}

/// The container's huge page limits, as the kubelet's
/// `GetHugepageLimitsFromResources`: every page size of the node (`sizes`,
/// bytes) with a limit of 0, but for the sizes of the pod's pod-level
/// `hugepages-<size>` limits and then the container's own, which win; those
/// get their amounts in bytes.
fn hugepage_limits(pod: &Pod, c: &Container, sizes: &[u64]) -> Vec<cri::HugepageLimit> {
    use super::limits::{huge_page_size, huge_page_unit};
    let pod_level = pod
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.limits.as_ref());
    let own = c.resources.as_ref().and_then(|r| r.limits.as_ref());
    let limit_of = |list: Option<&BTreeMap<String, Quantity>>, size: u64| {
        list.into_iter()
            .flatten()
            .filter(|(name, _)| huge_page_size(name) == Some(size))
            .find_map(|(_, q)| amount(Some(q), false))
            .map(|b| u64::try_from(b).unwrap_or(0))
    };
    sizes
        .iter()
        .filter_map(|&size| {
            let limit = limit_of(own, size)
                .or_else(|| limit_of(pod_level, size))
                .unwrap_or(0);
            Some(cri::HugepageLimit {
                page_size: huge_page_unit(size)?,
                limit,
            })
        })
        .collect()
}

/// The huge page limits of `pod`'s cgroup, as the kubelet's
/// `ResourceConfigForPod`: the pod's `hugepages-<size>` requests
/// ([`super::fit::pod_requests`]) in bytes by page size.
#[must_use]
pub fn pod_huge_page_limits(pod: &Pod) -> super::limits::HugePageLimits {
    super::limits::huge_page_limits(&super::fit::pod_requests(pod))
}

/// `memory.swap.max`, the cgroup v2 file of a container's swap.
pub const SWAP_MAX: &str = "memory.swap.max";

/// The container's swap, as the kubelet's `configureContainerSwapResources`
/// (nothing where the node has no swap controller): with `LimitedSwap` on
/// cgroup v2, a container of a Burstable pod that is not critical, whose
/// memory request is set and differs from its limit, may swap its share of
/// the node's swap, in proportion of its request to the node's memory
/// (`calcSwapForBurstablePods`); every other container swaps nothing beyond
/// its limit (`NoSwap`: on cgroup v1 a memory+swap limit equal to the memory
/// limit, on v2 `memory.swap.max` 0).
fn set_swap(r: &mut cri::LinuxContainerResources, pod: &Pod, c: &Container, node: &NodeContext) {
    let swap = node.swap;
    if !swap.controller {
        return;
    }
    if !swap.cgroup_v2 {
        r.memory_swap_limit_in_bytes = r.memory_limit_in_bytes;
        return;
    }
    let bytes = limited_swap(pod, c, node).unwrap_or(0);
    r.unified.insert(SWAP_MAX.into(), bytes.to_string());
}

/// The swap bytes of a container under `LimitedSwap`, or None where it gets none.
fn limited_swap(pod: &Pod, c: &Container, node: &NodeContext) -> Option<i64> {
    if !node.swap.limited
        || qos_class(pod) != QosClass::Burstable
        || super::kind::PodKind::of(pod).is_critical
    {
        return None;
    }
    let limit = memory_limit_bytes(amount(
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|m| m.get("memory")),
        false,
    ));
    let request = memory_request(c).unwrap_or(0);
    if (request == 0 && limit == 0) || request == limit {
        return None;
    }
    let capacity = i64::try_from(node.memory_capacity_bytes)
        .ok()
        .filter(|&m| m > 0)?;
    if request > capacity {
        return None;
    }
    // As the kubelet's float64 arithmetic; a share of the swap, so in range.
    let share = (request as f64 / capacity as f64 * node.swap.capacity_bytes as f64) as i64;
    Some(share)
}

/// The limits of `pod`'s cgroup, as the kubelet's `ResourceConfigForPod`:
/// shares from the pod's cpu requests ([`super::fit::pod_requests`]: containers,
/// init containers, overhead, pod-level resources), a CFS quota from its cpu
/// limits over a period of `period_us` microseconds when every container
/// declares one (or the pod does), a memory limit alike; a BestEffort pod
/// gets the smallest share and no limits.
#[must_use]
pub fn pod_cgroup_limits(pod: &Pod, period_us: i64) -> super::limits::Limits {
    use super::fit::{pod_limits, pod_requests};
    if qos_class(pod) == QosClass::BestEffort {
        return super::limits::Limits {
            cpu_shares: super::limits::MIN_SHARES,
            ..Default::default()
        };
    }
    let pod_level = pod.spec.as_ref().and_then(|s| s.resources.as_ref());
    let declared = |resource: &str| {
        pod_level
            .and_then(|r| r.limits.as_ref())
            .is_some_and(|l| l.contains_key(resource))
            || super::spec::main_containers(pod)
                .iter()
                .chain(super::spec::init_containers(pod))
                .all(|c| {
                    c.resources
                        .as_ref()
                        .and_then(|r| r.limits.as_ref())
                        .is_some_and(|l| l.contains_key(resource))
                })
    };
    let requests = pod_requests(pod);
    let limits = pod_limits(pod);
    let milli = |q: Option<&crate::resource::Quantity>| {
        q.map_or(0, |q| i64::try_from(q.milli_value()).unwrap_or(i64::MAX))
    };
    let bytes = |q: Option<&crate::resource::Quantity>| {
        q.map(|q| i64::try_from(q.value()).unwrap_or(i64::MAX))
    };
    super::limits::Limits {
        cpu_shares: u64::try_from(cpu_shares(milli(requests.get("cpu")))).unwrap_or(2),
        cpu_quota: declared("cpu")
            .then(|| cpu_quota(milli(limits.get("cpu")), period_us))
            .filter(|q| *q > 0),
        memory: declared("memory")
            .then(|| bytes(limits.get("memory")))
            .flatten()
            .filter(|m| *m > 0),
    }
}

/// The cgroup limits of container `c` of `pod`, as the kubelet's
/// `calculateLinuxResources`: cpu shares from the cpu request (the limit when
/// no request, at least 2), CFS quota from the cpu limit over a period of
/// `period_us` microseconds, and the memory limit in bytes (0: none). When
/// the pod sets pod-level cpu or memory resources, a limit the container
/// does not set is the pod's (the kubelet's `getCPULimit` /
/// `getMemoryLimit`).
#[must_use]
pub fn cgroup_limits(pod: &Pod, c: &Container, period_us: i64) -> CgroupLimits {
    let res = c.resources.as_ref();
    let pod_limits = pod
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .filter(|r| pod_level_set(r))
        .and_then(|r| r.limits.as_ref());
    let limit = |name: &str| {
        res.and_then(|r| r.limits.as_ref())
            .and_then(|m| m.get(name))
            .or_else(|| pod_limits.and_then(|m| m.get(name)))
    };
    let request = |name: &str| {
        res.and_then(|r| r.requests.as_ref())
            .and_then(|m| m.get(name))
            .or(limit(name))
    };
    let cpu_request = amount(request("cpu"), true);
    let cpu_limit = amount(limit("cpu"), true);
    let (cpu_quota, cpu_period) = match cpu_limit {
        Some(m) => (cpu_quota(m, period_us), period_us),
        None => (0, 0),
    };
    CgroupLimits {
        cpu_shares: cpu_shares(cpu_request.unwrap_or(0)),
        cpu_quota,
        cpu_period,
        memory_limit_in_bytes: memory_limit_bytes(amount(limit("memory"), false)),
    }
}

/// Container `c`'s memory request in bytes (as allocated), if it sets one.
#[must_use]
pub fn memory_request(c: &Container) -> Option<i64> {
    let request = c
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|m| m.get("memory"));
    amount(request, false)
}

/// Whether pod-level resources `r` set cpu or memory, the resources pod
/// level supports (the kubelet's `IsPodLevelResourcesSet`).
fn pod_level_set(r: &k8s_openapi::api::core::v1::ResourceRequirements) -> bool {
    [r.requests.as_ref(), r.limits.as_ref()]
        .into_iter()
        .flatten()
        .any(|m| m.contains_key("cpu") || m.contains_key("memory"))
}

/// Whether runtime handler `name` (`""`: the default) of `handlers` (CRI
/// `Status.runtime_handlers`) mounts recursively read-only: its
/// `recursive_read_only_mounts` feature; false for a handler not listed.
#[must_use]
pub fn handler_supports_rro(handlers: &[cri::RuntimeHandler], name: &str) -> bool {
    handlers
        .iter()
        .find(|h| h.name == name)
        .and_then(|h| h.features.as_ref())
        .is_some_and(|f| f.recursive_read_only_mounts)
}

/// True when any container of the pod, init and ephemeral ones included, is
/// privileged: its sandbox is then privileged too, as the kubelet's
/// `HasPrivilegedContainer` (a runtime refuses a privileged container in an
/// unprivileged sandbox).
fn has_privileged_container(pod: &Pod) -> bool {
    super::spec::init_containers(pod)
        .iter()
        .chain(super::spec::main_containers(pod))
        .chain(&super::spec::ephemeral_containers(pod))
        .any(|c| {
            c.security_context
                .as_ref()
                .and_then(|sc| sc.privileged)
                .unwrap_or(false)
        })
}

/// Paths of /proc and /sys the runtime masks or makes read-only in every
/// unprivileged container (the kubelet's defaults for `procMount: Default`).
pub const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/interrupts",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
/// Read-only paths of every unprivileged container.
pub const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The directory of Localhost seccomp profiles under the agent's root
/// directory (the kubelet's `<root-dir>/seccomp`).
#[must_use]
pub fn seccomp_root(root_dir: &Path) -> PathBuf {
    root_dir.join("seccomp")
}

fn profile(
    kind: cri::security_profile::ProfileType,
    localhost_ref: String,
) -> cri::SecurityProfile {
    cri::SecurityProfile {
        profile_type: kind as i32,
        localhost_ref,
    }
}

/// The container's seccomp profile, as the kubelet's `getSeccompProfile`:
/// the container's, else the pod's, else `RuntimeDefault` with
/// `seccompDefault`, else `Unconfined`. A `Localhost` profile is the file
/// `<root-dir>/seccomp/<localhostProfile>`; a name that would leave that
/// directory (absolute, or with a `..` component, which API validation
/// refuses too) is an error, and so is a type the API does not define
/// (where the kubelet would run the container unconfined).
///
/// # Errors
/// [`Error::InvalidSpec`] as above, or a `Localhost` profile without a name.
pub fn seccomp(
    container: Option<&SeccompProfile>,
    pod: Option<&SeccompProfile>,
    node: &NodeContext,
) -> Result<cri::SecurityProfile, Error> {
    use cri::security_profile::ProfileType;
    let Some(p) = container.or(pod) else {
        let kind = if node.seccomp_default {
            ProfileType::RuntimeDefault
        } else {
            ProfileType::Unconfined
        };
        return Ok(profile(kind, String::new()));
    };
    match p.type_.as_str() {
        "RuntimeDefault" => Ok(profile(ProfileType::RuntimeDefault, String::new())),
        "Unconfined" => Ok(profile(ProfileType::Unconfined, String::new())),
        "Localhost" => {
            let name = p.localhost_profile.as_deref().unwrap_or_default();
            if name.is_empty() {
                return Err(Error::InvalidSpec(
                    "localhostProfile must be set if seccompProfile type is Localhost.".into(),
                ));
            }
            let path = Path::new(name);
            let escapes = path.is_absolute()
                || path
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir));
            if escapes {
                return Err(Error::InvalidSpec(format!(
                    "seccomp localhostProfile {name:?} must be a relative path below {} without '..'",
                    seccomp_root(&node.root_dir).display()
                )));
            }
            let file = seccomp_root(&node.root_dir).join(path);
            Ok(profile(
                ProfileType::Localhost,
                file.to_string_lossy().into_owned(),
            ))
        }
        other => Err(Error::InvalidSpec(format!(
            "unknown seccomp profile type {other:?}"
        ))),
    }
}

/// The AppArmor profile a deprecated annotation value names
/// (`runtime/default`, `unconfined`, `localhost/<name>`); none for others.
fn apparmor_from_annotation(value: &str) -> Option<AppArmorProfile> {
    let (type_, localhost_profile) = match value {
        "runtime/default" => ("RuntimeDefault", None),
        "unconfined" => ("Unconfined", None),
        v => ("Localhost", Some(v.strip_prefix("localhost/")?.to_string())),
    };
    Some(AppArmorProfile {
        type_: type_.into(),
        localhost_profile,
    })
}

/// The AppArmor profile that applies to container `c`, as the kubelet's
/// `apparmor.GetProfile`: the container's field, else its deprecated
/// annotation, else the pod's field; none when nothing is set.
#[must_use]
pub fn apparmor_profile(pod: &Pod, c: &Container) -> Option<AppArmorProfile> {
    if let Some(p) = c
        .security_context
        .as_ref()
        .and_then(|sc| sc.app_armor_profile.as_ref())
    {
        return Some(p.clone());
    }
    let annotation = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&format!("{APPARMOR_ANNOTATION_PREFIX}{}", c.name)));
    if let Some(p) = annotation.and_then(|v| apparmor_from_annotation(v)) {
        return Some(p);
    }
    pod.spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|sc| sc.app_armor_profile.clone())
}

/// The container's AppArmor profile as CRI's `apparmor` field with the
/// deprecated `apparmor_profile` string, as the kubelet's `getAppArmorProfile`;
/// none when nothing is set (the runtime's default applies).
///
/// # Errors
/// [`Error::InvalidSpec`] for a `Localhost` profile without a name or a type
/// the API does not define.
pub fn apparmor(pod: &Pod, c: &Container) -> Result<Option<(cri::SecurityProfile, String)>, Error> {
    use cri::security_profile::ProfileType;
    let Some(p) = apparmor_profile(pod, c) else {
        return Ok(None);
    };
    let found = match p.type_.as_str() {
        "RuntimeDefault" => (
            profile(ProfileType::RuntimeDefault, String::new()),
            "runtime/default".to_string(),
        ),
        "Unconfined" => (
            profile(ProfileType::Unconfined, String::new()),
            "unconfined".to_string(),
        ),
        "Localhost" => {
            let name = p.localhost_profile.unwrap_or_default();
            if name.is_empty() {
                return Err(Error::InvalidSpec(
                    "missing localhost apparmor profile name".into(),
                ));
            }
            (
                profile(ProfileType::Localhost, name.clone()),
                format!("localhost/{name}"),
            )
        }
        other => {
            return Err(Error::InvalidSpec(format!(
                "unknown apparmor profile type: {other:?}"
            )));
        }
    };
    Ok(Some(found))
}

fn selinux(o: &SELinuxOptions) -> cri::SeLinuxOption {
    cri::SeLinuxOption {
        user: o.user.clone().unwrap_or_default(),
        role: o.role.clone().unwrap_or_default(),
        r#type: o.type_.clone().unwrap_or_default(),
        level: o.level.clone().unwrap_or_default(),
    }
}

/// The pod's `supplementalGroupsPolicy` as CRI's (`Merge` when unset).
///
/// # Errors
/// [`Error::InvalidSpec`] for a policy the API does not define.
fn supplemental_groups_policy(psc: Option<&PodSecurityContext>) -> Result<i32, Error> {
    match psc.and_then(|p| p.supplemental_groups_policy.as_deref()) {
        None | Some("Merge") => Ok(cri::SupplementalGroupsPolicy::Merge as i32),
        Some("Strict") => Ok(cri::SupplementalGroupsPolicy::Strict as i32),
        Some(other) => Err(Error::InvalidSpec(format!(
            "unknown supplementalGroupsPolicy {other:?}"
        ))),
    }
}

/// The pod's `overhead` (set by the API server from its RuntimeClass) as the
/// sandbox's resources, as the kubelet's `convertOverheadToLinuxResources`:
/// cpu as both request and limit, memory as the limit; none without one.
fn overhead(pod: &Pod, period_us: i64) -> Option<cri::LinuxContainerResources> {
    let o = pod.spec.as_ref()?.overhead.as_ref()?;
    let cpu = amount(o.get("cpu"), true).unwrap_or(0);
    let quota = cpu_quota(cpu, period_us);
    Some(cri::LinuxContainerResources {
        cpu_shares: cpu_shares(cpu),
        cpu_quota: quota,
        cpu_period: if quota == 0 { 0 } else { period_us },
        memory_limit_in_bytes: memory_limit_bytes(amount(o.get("memory"), false)),
        ..Default::default()
    })
}

/// The container's security context merged over the pod's, as the kubelet's
/// `determineEffectiveSecurityContext` + `convertToRuntimeSecurityContext`,
/// in the pod's `isolation` (its user namespace): seccomp ([`seccomp`]),
/// AppArmor ([`apparmor`]), SELinux options and the supplemental groups policy
/// all reach the runtime.
///
/// # Errors
/// [`Error::InvalidSpec`] for a seccomp or AppArmor profile that cannot be
/// honoured or an unknown supplemental groups policy.
#[allow(deprecated)] // `apparmor_profile`: the kubelet still sets it for runtimes that read only it
pub fn security_context(
    pod: &Pod,
    c: &Container,
    node: &NodeContext,
    isolation: &Isolation,
) -> Result<cri::LinuxContainerSecurityContext, Error> {
    let psc: Option<&PodSecurityContext> =
        pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc: Option<&SecurityContext> = c.security_context.as_ref();
    let privileged = sc.and_then(|s| s.privileged).unwrap_or(false);
    let run_as_user = sc
        .and_then(|s| s.run_as_user)
        .or(psc.and_then(|p| p.run_as_user));
    let run_as_group = sc
        .and_then(|s| s.run_as_group)
        .or(psc.and_then(|p| p.run_as_group));
    let caps = sc.and_then(|s| s.capabilities.as_ref());
    let mut groups: Vec<i64> = psc
        .and_then(|p| p.supplemental_groups.clone())
        .unwrap_or_default();
    groups.extend(psc.and_then(|p| p.fs_group));
    let unmasked = sc.and_then(|s| s.proc_mount.as_deref()) == Some("Unmasked");
    let paths = |p: &[&str]| {
        if privileged || unmasked {
            Vec::new()
        } else {
            p.iter().map(|s| (*s).to_string()).collect()
        }
    };
    let apparmor = apparmor(pod, c)?;
    Ok(cri::LinuxContainerSecurityContext {
        capabilities: caps.map(|c| cri::Capability {
            add_capabilities: c.add.clone().unwrap_or_default(),
            drop_capabilities: c.drop.clone().unwrap_or_default(),
            add_ambient_capabilities: Vec::new(),
        }),
        privileged,
        namespace_options: Some(namespace_options(pod, isolation)),
        selinux_options: sc
            .and_then(|s| s.se_linux_options.as_ref())
            .or(psc.and_then(|p| p.se_linux_options.as_ref()))
            .map(selinux),
        supplemental_groups_policy: supplemental_groups_policy(psc)?,
        run_as_user: run_as_user.map(|value| cri::Int64Value { value }),
        run_as_group: run_as_group.map(|value| cri::Int64Value { value }),
        readonly_rootfs: sc
            .and_then(|s| s.read_only_root_filesystem)
            .unwrap_or(false),
        supplemental_groups: groups,
        no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        masked_paths: paths(MASKED_PATHS),
        readonly_paths: paths(READONLY_PATHS),
        seccomp: Some(seccomp(
            sc.and_then(|s| s.seccomp_profile.as_ref()),
            psc.and_then(|p| p.seccomp_profile.as_ref()),
            node,
        )?),
        apparmor_profile: apparmor.as_ref().map(|a| a.1.clone()).unwrap_or_default(),
        apparmor: apparmor.map(|a| a.0),
        ..Default::default()
    })
}

/// Checks `runAsNonRoot` against the user the container will run as (the
/// security context's `runAsUser`, else the image's user), as the kubelet's
/// `verifyRunAsNonRoot`. `image_uid` and `image_user` come from CRI ImageStatus.
///
/// # Errors
/// The kubelet's message when the container would run as root or cannot be verified.
pub fn verify_run_as_non_root(
    pod: &Pod,
    c: &Container,
    image_uid: Option<i64>,
    image_user: &str,
) -> Result<(), String> {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let sc = c.security_context.as_ref();
    let non_root = sc
        .and_then(|s| s.run_as_non_root)
        .or(psc.and_then(|p| p.run_as_non_root));
    if non_root != Some(true) {
        return Ok(());
    }
    let (ns, name, _) = pod_identity(pod);
    let who = format!(
        "(pod: \"{name}_{ns}({})\", container: {})",
        pod.metadata.uid.as_deref().unwrap_or_default(),
        c.name
    );
    match sc
        .and_then(|s| s.run_as_user)
        .or(psc.and_then(|p| p.run_as_user))
    {
        Some(0) => Err(format!(
            "container's runAsUser breaks non-root policy {who}"
        )),
        Some(_) => Ok(()),
        // An image without a user runs as root (the kubelet's `getImageUser`).
        None => match (image_uid, image_user.is_empty()) {
            (Some(0), _) | (None, true) => Err(format!(
                "container has runAsNonRoot and image will run as root {who}"
            )),
            (Some(_), _) => Ok(()),
            (None, false) => Err(format!(
                "container has runAsNonRoot and image has non-numeric user ({image_user}), cannot verify user is non-root {who}"
            )),
        },
    }
}

/// The CRI config of container `c` at `attempt`, with the image reference the
/// runtime resolved, the environment from [`super::env::environment`] (command
/// and args expanded against it) and the container's volume `mounts` (from
/// `volume::container_mounts`), as the kubelet's `generateContainerConfig`.
/// The pod's user namespace comes in with [`join_user_namespace`].
///
/// # Errors
/// [`Error::InvalidSpec`] from [`security_context`].
pub fn container_config(
    pod: &Pod,
    c: &Container,
    attempt: u32,
    image_ref: &str,
    env: &[(String, String)],
    node: &NodeContext,
    mounts: Vec<cri::Mount>,
) -> Result<cri::ContainerConfig, Error> {
    let (ns, name, uid) = pod_identity(pod);
    let labels = HashMap::from([
        (CONTAINER_NAME_LABEL.to_string(), c.name.clone()),
        (POD_NAME_LABEL.to_string(), name),
        (POD_NAMESPACE_LABEL.to_string(), ns),
        (POD_UID_LABEL.to_string(), uid),
    ]);
    let grace = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    let mut annotations = HashMap::from([
        (CONTAINER_HASH_ANNOTATION.to_string(), container_hash(c)),
        (RESTART_COUNT_ANNOTATION.to_string(), attempt.to_string()),
        (
            TERMINATION_MESSAGE_PATH_ANNOTATION.to_string(),
            c.termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".into()),
        ),
        (
            TERMINATION_MESSAGE_POLICY_ANNOTATION.to_string(),
            c.termination_message_policy
                .clone()
                .unwrap_or_else(|| "File".into()),
        ),
        (
            TERMINATION_GRACE_PERIOD_ANNOTATION.to_string(),
            grace.to_string(),
        ),
    ]);
    if let Some(bytes) = memory_request(c) {
        annotations.insert(
            crate::labels::MEMORY_REQUEST_ANNOTATION.to_string(),
            bytes.to_string(),
        );
    }
    let (command, args) = super::env::command_and_args(c, env);
    let security_context = security_context(pod, c, node, &Isolation::default())?;
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt,
        }),
        image: Some(cri::ImageSpec {
            image: image_ref.to_string(),
            user_specified_image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command,
        args,
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: env
            .iter()
            .map(|(key, value)| cri::KeyValue {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
        mounts,
        labels,
        annotations,
        log_path: crate::paths::container_log_path(&c.name, attempt),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(linux_resources(pod, c, node)),
            security_context: Some(security_context),
        }),
        ..Default::default()
    })
}

/// Puts the container into its pod's user namespace (`isolation`'s
/// `userns_options`, which the runtime checks against the sandbox's), as
/// the kubelet's `NamespacesForPod` gives both the same.
pub fn join_user_namespace(config: &mut cri::ContainerConfig, isolation: &Isolation) {
    if let Some(ns) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|sc| sc.namespace_options.as_mut())
    {
        ns.userns_options.clone_from(&isolation.user_namespace);
    }
}

/// Makes the container join the process namespace of container `target_id`
/// (`NamespaceMode::Target`), as the kubelet does for an ephemeral container
/// with a `targetContainerName`; only when the container would otherwise get
/// its own (a pod sharing one process namespace, or the host's, keeps it).
pub fn target_pid_namespace(config: &mut cri::ContainerConfig, target_id: &str) {
    let Some(ns) = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|sc| sc.namespace_options.as_mut())
    else {
        return;
    };
    if ns.pid == cri::NamespaceMode::Container as i32 {
        ns.pid = cri::NamespaceMode::Target as i32;
        ns.target_id = target_id.to_string();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;
    use crate::pod_core::facts::{HostDns, PodFacts};
    use k8s_openapi::api::core::v1::EnvVar;
    use std::collections::BTreeMap;

    fn node() -> NodeContext {
        NodeContext {
            node_name: "n1".into(),
            node_ips: vec!["127.0.0.1".into()],
            pod_logs_dir: "/var/log/pods".into(),
            host_dns: HostDns::parse("nameserver 10.0.0.2\nsearch corp.example\noptions edns0\n"),
            cluster_dns: vec![],
            cluster_domain: "cluster.local".into(),
            ..Default::default()
        }
    }

    #[test]
    fn oversized_labels_and_annotations_stay_out_of_the_sandbox() {
        let mut p = pod("web").container("c", "busybox").build();
        // Many small labels: what counts is their encoded size.
        let many: BTreeMap<String, String> =
            (0..4000).map(|i| (format!("{i}"), String::new())).collect();
        p.metadata.labels = Some(many.clone());
        p.metadata.annotations = Some(BTreeMap::from([("a".to_string(), "b".to_string())]));
        assert_eq!(oversized_metadata(&p), vec!["labels"]);
        let cfg = sandbox_config(&p, 0, &node(), &Isolation::default()).unwrap();
        assert_eq!(
            cfg.labels.len(),
            3,
            "identity only: {:?}",
            cfg.labels.keys()
        );
        assert_eq!(cfg.labels[POD_NAME_LABEL], "web");
        assert_eq!(cfg.annotations["a"], "b");
        // Annotations past the cap on their own go too.
        p.metadata.annotations = Some(many);
        p.metadata.labels = Some(BTreeMap::from([("app".to_string(), "web".to_string())]));
        assert_eq!(oversized_metadata(&p), vec!["labels", "annotations"]);
        assert!(pod_annotations(&p).is_empty());
        // At the cap exactly, everything goes.
        let exact = "v".repeat(MAX_SANDBOX_METADATA_BYTES - ENTRY_OVERHEAD_BYTES - 1);
        p.metadata.labels = None;
        p.metadata.annotations = Some(BTreeMap::from([("k".to_string(), exact)]));
        assert!(oversized_metadata(&p).is_empty());
        assert_eq!(pod_annotations(&p).len(), 1);
    }

    #[test]
    fn sandbox_config_carries_identity_labels_and_log_dir() {
        let p = pod("web")
            .label("app", "web")
            .container("c", "busybox")
            .build();
        let cfg = sandbox_config(&p, 1, &node(), &Isolation::default()).unwrap();
        let md = cfg.metadata.unwrap();
        assert_eq!(
            (md.name.as_str(), md.namespace.as_str(), md.attempt),
            ("web", "default", 1)
        );
        assert_eq!(cfg.labels[POD_UID_LABEL], "uid-web");
        assert_eq!(cfg.labels["app"], "web");
        assert_eq!(cfg.log_directory, "/var/log/pods/default_web_uid-web");
        assert_eq!(cfg.hostname, "web");
    }

    #[test]
    fn a_privileged_init_container_makes_the_sandbox_privileged() {
        let privileged_sandbox = |p: &Pod| {
            let cfg = sandbox_config(p, 0, &node(), &Isolation::default()).unwrap();
            cfg.linux.unwrap().security_context.unwrap().privileged
        };
        let mut p = pod("web")
            .init_container("mount", "busybox")
            .container("c", "busybox")
            .build();
        assert!(!privileged_sandbox(&p));
        let spec = p.spec.as_mut().unwrap();
        spec.init_containers.as_mut().unwrap()[0].security_context = Some(SecurityContext {
            privileged: Some(true),
            ..Default::default()
        });
        assert!(
            privileged_sandbox(&p),
            "as the kubelet's HasPrivilegedContainer"
        );
    }

    #[test]
    fn dns_follows_policy() {
        let p = pod("web").container("c", "busybox").build();
        let mut n = node();
        let host = dns_config(&p, &n).unwrap();
        assert_eq!(host.servers, vec!["10.0.0.2"]);
        n.cluster_dns = vec!["10.0.0.10".into()];
        let cluster = dns_config(&p, &n).unwrap();
        assert_eq!(cluster.servers, vec!["10.0.0.10"]);
        assert_eq!(
            cluster.searches,
            vec![
                "default.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example"
            ]
        );
        assert_eq!(cluster.options, vec!["ndots:5"]);
        let mut none = p.clone();
        none.spec.as_mut().unwrap().dns_policy = Some("None".into());
        assert!(dns_config(&none, &n).is_err());
    }

    #[test]
    fn container_config_has_kubelet_labels_and_log_path() {
        let p = pod("web").container("c", "busybox").build();
        let c = &p.spec.as_ref().unwrap().containers[0];
        let facts = PodFacts {
            pod_ips: vec!["10.88.0.5".into()],
            host_ips: vec!["127.0.0.1".into()],
        };
        let mut c2 = c.clone();
        c2.command = Some(vec!["echo".into(), "$(IP)".into()]);
        c2.env = Some(vec![
            EnvVar {
                name: "A".into(),
                value: Some("1".into()),
                value_from: None,
            },
            EnvVar {
                name: "IP".into(),
                value: None,
                value_from: Some(k8s_openapi::api::core::v1::EnvVarSource {
                    field_ref: Some(k8s_openapi::api::core::v1::ObjectFieldSelector {
                        field_path: "status.podIP".into(),
                        api_version: None,
                    }),
                    ..Default::default()
                }),
            },
        ]);
        let env = crate::pod_core::env::environment(&p, &c2, &node(), &facts, &Default::default())
            .unwrap();
        let mount = cri::Mount {
            container_path: "/data".into(),
            host_path: "/var/lib/rustlet/pods/uid-web/volumes/kubernetes.io~empty-dir/data".into(),
            ..Default::default()
        };
        let cfg =
            container_config(&p, &c2, 2, "sha256:abc", &env, &node(), vec![mount.clone()]).unwrap();
        assert_eq!(cfg.mounts, vec![mount]);
        assert_eq!(cfg.log_path, "c/2.log");
        assert_eq!(cfg.labels[CONTAINER_NAME_LABEL], "c");
        assert_eq!(cfg.annotations[RESTART_COUNT_ANNOTATION], "2");
        assert_eq!(cfg.image.unwrap().image, "sha256:abc");
        assert_eq!(cfg.command, vec!["echo", "10.88.0.5"]);
        let env: Vec<_> = cfg
            .envs
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_str()))
            .collect();
        assert_eq!(env, vec![("A", "1"), ("IP", "10.88.0.5")]);
        // Only the image counts, as in the kubelet.
        assert_eq!(container_hash(c), container_hash(&c2));
    }

    /// Every page size of the node reaches the runtime, 0 but for the
    /// container's own huge page limits (`GetHugepageLimitsFromResources`);
    /// the pod cgroup's are the pod's requests by size.
    #[test]
    fn huge_page_limits_name_every_page_size_of_the_node() {
        use k8s_openapi::api::core::v1::ResourceRequirements;
        let mut p = pod("p").container("a", "x").container("b", "x").build();
        let list: BTreeMap<String, Quantity> =
            [("hugepages-2Mi".to_string(), Quantity("6Mi".into()))].into();
        p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            requests: Some(list.clone()),
            limits: Some(list),
            ..Default::default()
        });
        let node = NodeContext {
            huge_page_sizes: vec![2 << 20, 1 << 30],
            ..NodeContext::default()
        };
        let spec = p.spec.as_ref().unwrap();
        let of = |i: usize| -> Vec<(String, u64)> {
            linux_resources(&p, &spec.containers[i], &node)
                .hugepage_limits
                .into_iter()
                .map(|l| (l.page_size, l.limit))
                .collect()
        };
        assert_eq!(
            of(0),
            [("2MB".to_string(), 6 << 20), ("1GB".to_string(), 0)]
        );
        assert_eq!(of(1), [("2MB".to_string(), 0), ("1GB".to_string(), 0)]);
        assert_eq!(
            pod_huge_page_limits(&p),
            super::super::limits::HugePageLimits::from([(2 << 20, 6 << 20)])
        );
        let bare = NodeContext::default();
        assert!(
            linux_resources(&p, &spec.containers[0], &bare)
                .hugepage_limits
                .is_empty()
        );

        // Pod-level huge pages: a container without its own gets the pod's
        // limit; the pod's cgroup gets the pod's request.
        let mut p = p.clone();
        let pod_level: BTreeMap<String, Quantity> =
            [("hugepages-2Mi".to_string(), Quantity("8Mi".into()))].into();
        p.spec.as_mut().unwrap().resources = Some(ResourceRequirements {
            requests: Some(pod_level.clone()),
            limits: Some(pod_level),
            ..Default::default()
        });
        let spec = p.spec.as_ref().unwrap();
        let of =
            |i: usize| linux_resources(&p, &spec.containers[i], &node).hugepage_limits[0].limit;
        assert_eq!((of(0), of(1)), (6 << 20, 8 << 20));
        assert_eq!(
            pod_huge_page_limits(&p),
            super::super::limits::HugePageLimits::from([(2 << 20, 8 << 20)])
        );
    }

    #[test]
    fn pod_cgroup_limits_of_extreme_quantities_saturate() {
        use k8s_openapi::api::core::v1::ResourceRequirements;
        let mut p = pod("big")
            .container("a", "busybox")
            .container("b", "busybox")
            .build();
        let huge = BTreeMap::from([
            ("cpu".to_string(), Quantity("9e18".into())),
            ("memory".to_string(), Quantity("9Ei".into())),
        ]);
        for c in &mut p.spec.as_mut().unwrap().containers {
            c.resources = Some(ResourceRequirements {
                limits: Some(huge.clone()),
                requests: Some(huge.clone()),
                ..Default::default()
            });
        }
        let l = pod_cgroup_limits(&p, CPU_PERIOD_US);
        assert_eq!(l.cpu_shares, 262_144, "the kernel's most");
        assert_eq!(l.cpu_quota, Some(i64::MAX));
        assert_eq!(l.memory, Some(i64::MAX));
        // One container without a memory limit: no pod memory limit.
        p.spec.as_mut().unwrap().containers[1].resources = None;
        let l = pod_cgroup_limits(&p, CPU_PERIOD_US);
        assert_eq!((l.cpu_quota, l.memory), (None, None));
    }

    #[test]
    fn the_container_hash_is_the_kubelets() {
        // The value of the kubelet's own consistency test (v1.31 and on),
        // whatever the rest of the spec.
        let c: Container = serde_json::from_value(serde_json::json!({
            "name": "test_container",
            "image": "foo/image:v1",
            "command": ["/bin/testcmd"],
            "resources": {"limits": {"foo": "1G"}, "requests": {"foo": "500M"}},
        }))
        .unwrap();
        assert_eq!(container_hash(&c), "8e45cbd0");
        let mut odd = c.clone();
        odd.image = Some("a<b>&c".into());
        assert_ne!(container_hash(&odd), container_hash(&c));
    }

    /// As the kubelet's `configureContainerSwapResources` on each kind of node.
    #[test]
    fn swap_is_none_beyond_the_limit_unless_limited_swap_gives_a_share() {
        use super::super::facts::Swap;
        let memory = |request: Option<&str>, limit: Option<&str>| {
            let mut p = pod("web").container("c", "busybox").build();
            let q = |v: Option<&str>| {
                v.map(|v| BTreeMap::from([("memory".to_string(), Quantity(v.into()))]))
            };
            p.spec.as_mut().unwrap().containers[0].resources =
                Some(k8s_openapi::api::core::v1::ResourceRequirements {
                    requests: q(request),
                    limits: q(limit),
                    ..Default::default()
                });
            p
        };
        let burstable = memory(Some("256Mi"), Some("512Mi"));
        let mut n = node();
        n.memory_capacity_bytes = 1 << 30;
        let r = |p: &Pod, n: &NodeContext| {
            linux_resources(p, &p.spec.as_ref().unwrap().containers[0], n)
        };
        // No swap controller: nothing is set.
        let none = r(&burstable, &n);
        assert_eq!(
            (none.memory_swap_limit_in_bytes, none.unified.len()),
            (0, 0)
        );
        // cgroup v1: memory+swap is the memory limit, whatever the behaviour.
        n.swap = Swap {
            controller: true,
            limited: true,
            capacity_bytes: 1 << 30,
            ..Swap::default()
        };
        let v1 = r(&burstable, &n);
        assert_eq!(v1.memory_swap_limit_in_bytes, 512 << 20);
        assert!(v1.unified.is_empty());
        // cgroup v2, LimitedSwap: a quarter of the memory, a quarter of the swap.
        n.swap.cgroup_v2 = true;
        let limited = r(&burstable, &n);
        assert_eq!(
            limited.unified.get(SWAP_MAX).map(String::as_str),
            Some("268435456")
        );
        assert_eq!(limited.memory_swap_limit_in_bytes, 0);
        // Guaranteed, BestEffort, request equal to its limit, or a critical pod: none.
        let guaranteed = {
            let mut p = memory(Some("512Mi"), Some("512Mi"));
            let r = p.spec.as_mut().unwrap().containers[0]
                .resources
                .as_mut()
                .unwrap();
            for m in [&mut r.requests, &mut r.limits] {
                m.as_mut()
                    .unwrap()
                    .insert("cpu".into(), Quantity("1".into()));
            }
            p
        };
        let mut critical = burstable.clone();
        critical.spec.as_mut().unwrap().priority = Some(2_000_000_000);
        let mut other = pod("web").container("c", "busybox").build();
        other.spec.as_mut().unwrap().containers.push(
            memory(Some("64Mi"), None)
                .spec
                .unwrap()
                .containers
                .remove(0),
        );
        other.spec.as_mut().unwrap().containers[1].name = "d".into();
        for (what, p) in [
            ("guaranteed", guaranteed),
            ("best effort", pod("web").container("c", "busybox").build()),
            ("request = limit", memory(Some("512Mi"), Some("512Mi"))),
            ("critical", critical),
            ("no memory asked", other),
        ] {
            let got = r(&p, &n);
            assert_eq!(
                got.unified.get(SWAP_MAX).map(String::as_str),
                Some("0"),
                "{what}"
            );
        }
        // NoSwap on v2: 0.
        n.swap.limited = false;
        assert_eq!(
            r(&burstable, &n).unified.get(SWAP_MAX).map(String::as_str),
            Some("0")
        );
    }

    #[test]
    fn resources_become_shares_quota_and_memory_limit() {
        use k8s_openapi::api::core::v1::ResourceRequirements;
        let q = |s: &str| Quantity(s.into());
        let mut p = pod("web").container("c", "busybox").build();
        let mut n = node();
        n.memory_capacity_bytes = 1 << 30;
        let r = |p: &Pod| linux_resources(p, &p.spec.as_ref().unwrap().containers[0], &n);
        let best_effort = r(&p);
        assert_eq!(
            (
                best_effort.cpu_shares,
                best_effort.cpu_quota,
                best_effort.oom_score_adj
            ),
            (2, 0, 1000)
        );
        p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([
                ("cpu".to_string(), q("500m")),
                ("memory".to_string(), q("128Mi")),
            ])),
            ..Default::default()
        });
        let guaranteed = r(&p);
        assert_eq!(guaranteed.cpu_shares, 512);
        assert_eq!(
            (guaranteed.cpu_quota, guaranteed.cpu_period),
            (50_000, 100_000)
        );
        assert_eq!(guaranteed.memory_limit_in_bytes, 128 << 20);
        assert_eq!(guaranteed.oom_score_adj, -997);
        p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), q("1m")),
                ("memory".to_string(), q("512Mi")),
            ])),
            ..Default::default()
        });
        let burstable = r(&p);
        assert_eq!(burstable.cpu_shares, 2, "at least MinShares");
        assert_eq!(burstable.oom_score_adj, 500);
    }

    #[test]
    fn cpu_and_memory_clamps_at_the_extremes() {
        let max32 = i64::from(i32::MAX);
        // (millicores, shares, quota µs)
        let cpu = [
            (i64::MAX, MAX_SHARES, i64::MAX),
            (i64::MIN, MIN_SHARES, MIN_QUOTA_US),
            (max32, MAX_SHARES, max32 * 100),
            (256_000, MAX_SHARES, 25_600_000),
            (1000, 1024, 100_000),
            (1, MIN_SHARES, MIN_QUOTA_US),
            (0, MIN_SHARES, 0),
            (-1, MIN_SHARES, MIN_QUOTA_US),
        ];
        for (m, shares, quota) in cpu {
            assert_eq!(
                (cpu_shares(m), cpu_quota(m, CPU_PERIOD_US)),
                (shares, quota),
                "{m}m"
            );
        }
        // (limit bytes, CRI limit)
        let memory = [
            (None, 0),
            (Some(i64::MAX), i64::MAX),
            (Some(i64::MIN), 0),
            (Some(-1), 0),
            (Some(0), 0),
            (Some(max32), max32),
        ];
        for (bytes, want) in memory {
            assert_eq!(memory_limit_bytes(bytes), want, "{bytes:?}");
        }
        // (request bytes, capacity bytes, oom_score_adj)
        let gib = 1 << 30;
        let oom = [
            (i64::MAX, gib, 3),
            (i64::MIN, gib, 999),
            (-1, gib, 999),
            (0, gib, 999),
            (max32, gib, 3),
            (1 << 29, gib, 500),
            (i64::MAX, u64::MAX, 501),
            (1, 0, 3),
        ];
        for (request, capacity, want) in oom {
            assert_eq!(
                burstable_oom_score_adj(request, capacity),
                want,
                "{request} of {capacity}"
            );
        }
    }

    #[test]
    fn huge_and_negative_quantities_are_clamped() {
        use k8s_openapi::api::core::v1::ResourceRequirements;
        let q = |s: &str| Quantity(s.into());
        let n = node();
        let with = |limits: &[(&str, &str)], requests: &[(&str, &str)]| {
            let list =
                |l: &[(&str, &str)]| Some(l.iter().map(|(k, v)| (k.to_string(), q(v))).collect());
            let mut p = pod("web").container("c", "busybox").build();
            p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
                limits: list(limits),
                requests: list(requests),
                ..Default::default()
            });
            let r = linux_resources(&p, &p.spec.as_ref().unwrap().containers[0], &n);
            (
                r.cpu_shares,
                r.cpu_quota,
                r.memory_limit_in_bytes,
                r.oom_score_adj,
            )
        };
        let huge = with(&[("cpu", "9e15"), ("memory", "8Ei")], &[]);
        assert_eq!(huge, (MAX_SHARES, i64::MAX, i64::MAX, -997));
        let beyond = with(&[("cpu", "1e30"), ("memory", "1e30")], &[]);
        assert_eq!(beyond, (MAX_SHARES, i64::MAX, i64::MAX, -997));
        let burstable = with(&[], &[("cpu", "9e15"), ("memory", "16Ei")]);
        assert_eq!(burstable, (MAX_SHARES, 0, 0, 3));
        let negative = with(&[("cpu", "-1"), ("memory", "-1Gi")], &[]);
        assert_eq!(negative, (MIN_SHARES, MIN_QUOTA_US, 0, -997));
        let zero = with(&[("cpu", "0"), ("memory", "0")], &[]);
        assert_eq!(zero, (MIN_SHARES, 0, 0, -997));
    }

    #[test]
    fn security_context_merges_pod_and_container() {
        use k8s_openapi::api::core::v1::Capabilities;
        let mut p = pod("web").container("c", "busybox").build();
        p.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
            run_as_user: Some(1000),
            fs_group: Some(2000),
            supplemental_groups: Some(vec![3000]),
            ..Default::default()
        });
        p.spec.as_mut().unwrap().containers[0].security_context = Some(SecurityContext {
            run_as_group: Some(10),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                add: Some(vec!["NET_ADMIN".into()]),
                drop: Some(vec!["ALL".into()]),
            }),
            ..Default::default()
        });
        let sc = security_context(
            &p,
            &p.spec.as_ref().unwrap().containers[0],
            &node(),
            &Isolation::default(),
        )
        .unwrap();
        assert_eq!(sc.run_as_user.map(|v| v.value), Some(1000));
        assert_eq!(sc.run_as_group.map(|v| v.value), Some(10));
        assert_eq!(sc.supplemental_groups, vec![3000, 2000]);
        assert!(sc.no_new_privs);
        assert_eq!(sc.capabilities.unwrap().drop_capabilities, vec!["ALL"]);
        assert!(sc.masked_paths.contains(&"/proc/kcore".to_string()));
    }

    #[test]
    fn run_as_non_root_is_verified() {
        let mut p = pod("web").container("c", "busybox").build();
        let c = |p: &Pod| p.spec.as_ref().unwrap().containers[0].clone();
        assert!(
            verify_run_as_non_root(&p, &c(&p), Some(0), "").is_ok(),
            "not asked"
        );
        p.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
            run_as_non_root: Some(true),
            ..Default::default()
        });
        let err = verify_run_as_non_root(&p, &c(&p), Some(0), "").unwrap_err();
        assert!(
            err.starts_with("container has runAsNonRoot and image will run as root"),
            "{err}"
        );
        assert!(verify_run_as_non_root(&p, &c(&p), Some(1234), "").is_ok());
        assert!(
            verify_run_as_non_root(&p, &c(&p), None, "")
                .unwrap_err()
                .starts_with("container has runAsNonRoot and image will run as root"),
            "no image user: root"
        );
        let err = verify_run_as_non_root(&p, &c(&p), None, "nobody").unwrap_err();
        assert!(err.contains("non-numeric user (nobody)"), "{err}");
        p.spec
            .as_mut()
            .unwrap()
            .security_context
            .as_mut()
            .unwrap()
            .run_as_user = Some(0);
        assert!(
            verify_run_as_non_root(&p, &c(&p), Some(1234), "")
                .unwrap_err()
                .contains("runAsUser breaks non-root policy")
        );
    }

    #[test]
    fn ephemeral_container_joins_its_targets_process_namespace() {
        let pid = |p: &Pod| {
            let c = &p.spec.as_ref().unwrap().containers[0];
            let mut cfg = container_config(p, c, 0, "sha256:b", &[], &node(), vec![]).unwrap();
            target_pid_namespace(&mut cfg, "c1");
            let ns = cfg
                .linux
                .unwrap()
                .security_context
                .unwrap()
                .namespace_options
                .unwrap();
            (ns.pid, ns.target_id)
        };
        let own = pod("web").container("c", "busybox").build();
        assert_eq!(pid(&own), (cri::NamespaceMode::Target as i32, "c1".into()));
        let mut shared = own.clone();
        shared.spec.as_mut().unwrap().share_process_namespace = Some(true);
        assert_eq!(
            pid(&shared),
            (cri::NamespaceMode::Pod as i32, String::new())
        );
        let mut host = own;
        host.spec.as_mut().unwrap().host_pid = Some(true);
        assert_eq!(pid(&host), (cri::NamespaceMode::Node as i32, String::new()));
    }

    fn handler(name: &str, userns: bool) -> cri::RuntimeHandler {
        cri::RuntimeHandler {
            name: name.into(),
            features: Some(cri::RuntimeHandlerFeatures {
                user_namespaces: userns,
                ..Default::default()
            }),
        }
    }

    #[test]
    fn user_namespace_is_the_pods_own_or_the_pod_fails() {
        use UserNamespaceNeed::{Host, Pod as Own, Unspecified};
        let runc = [
            handler("", true),
            handler("runc", true),
            handler("old", false),
        ];
        // (hostUsers, handler, runtime's handlers, gate) → need or the kubelet's error
        type Case<'a> = (
            Option<bool>,
            &'a str,
            &'a [cri::RuntimeHandler],
            bool,
            Result<UserNamespaceNeed, &'a str>,
        );
        let cases: Vec<Case> = vec![
            (None, "", &runc, true, Ok(Host)),
            (Some(true), "", &runc, true, Ok(Host)),
            (None, "", &[], false, Ok(Unspecified)),
            (Some(false), "", &runc, true, Ok(Own)),
            (Some(false), "runc", &runc, true, Ok(Own)),
            (
                Some(false),
                "old",
                &runc,
                true,
                Err("RuntimeClass handler \"old\" does not support user namespaces"),
            ),
            (
                Some(false),
                "kata",
                &runc,
                true,
                Err("the handler \"kata\" is not known"),
            ),
            (
                Some(false),
                "",
                &[],
                true,
                Err("runtime handlers are not set"),
            ),
            (
                Some(false),
                "",
                &runc,
                false,
                Err(
                    "the feature gate \"UserNamespacesSupport\" is disabled: can't set spec.HostUsers",
                ),
            ),
            (
                Some(true),
                "",
                &runc,
                false,
                Err(
                    "the feature gate \"UserNamespacesSupport\" is disabled: can't set spec.HostUsers",
                ),
            ),
        ];
        for (host_users, h, handlers, gate, want) in cases {
            let mut p = pod("web").container("c", "busybox").build();
            p.spec.as_mut().unwrap().host_users = host_users;
            let got = user_namespace_need(&p, h, handlers, gate);
            assert_eq!(
                got.as_ref().map_err(String::as_str),
                want.as_ref().map_err(|e| *e),
                "{host_users:?} {h:?} gate={gate}"
            );
        }
    }

    #[test]
    fn the_pods_user_namespace_reaches_sandbox_and_containers() {
        let mut p = pod("web").container("c", "busybox").build();
        p.spec.as_mut().unwrap().host_users = Some(false);
        let isolation = Isolation {
            runtime_handler: "runc".into(),
            user_namespace: Some(pod_user_namespace(3 * USER_NS_LENGTH)),
        };
        let sandbox = sandbox_config(&p, 0, &node(), &isolation).unwrap();
        let userns = |ns: Option<&cri::NamespaceOption>| ns.and_then(|n| n.userns_options.clone());
        let want = cri::UserNamespace {
            mode: cri::NamespaceMode::Pod as i32,
            uids: vec![cri::IdMapping {
                host_id: 196_608,
                container_id: 0,
                length: 65_536,
            }],
            gids: vec![cri::IdMapping {
                host_id: 196_608,
                container_id: 0,
                length: 65_536,
            }],
        };
        let sc = sandbox
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref());
        assert_eq!(
            userns(sc.and_then(|s| s.namespace_options.as_ref())),
            Some(want.clone())
        );
        let c = &p.spec.as_ref().unwrap().containers[0];
        let mut cfg = container_config(&p, c, 0, "sha256:b", &[], &node(), vec![]).unwrap();
        join_user_namespace(&mut cfg, &isolation);
        let csc = cfg.linux.as_ref().and_then(|l| l.security_context.as_ref());
        assert_eq!(
            userns(csc.and_then(|s| s.namespace_options.as_ref())),
            Some(want)
        );
    }

    #[test]
    fn runtime_handlers_are_checked_when_the_runtime_lists_them() {
        let listed = [handler("", false), handler("runc", false)];
        for (h, handlers, ok) in [
            ("", &listed[..], true),
            ("runc", &listed[..], true),
            ("kata", &listed[..], false),
            ("kata", &[][..], true),
        ] {
            assert_eq!(check_runtime_handler(h, handlers).is_ok(), ok, "{h:?}");
        }
    }

    #[test]
    fn seccomp_profiles_table() {
        use cri::security_profile::ProfileType::{Localhost, RuntimeDefault, Unconfined};
        let sp = |t: &str, l: Option<&str>| SeccompProfile {
            type_: t.into(),
            localhost_profile: l.map(Into::into),
        };
        let mut n = node();
        n.root_dir = "/var/lib/rustlet".into();
        let mut defaulted = n.clone();
        defaulted.seccomp_default = true;
        // (container, pod, seccompDefault) → (type, localhost_ref) or an error
        let cases = [
            (None, None, false, Ok((Unconfined, ""))),
            (None, None, true, Ok((RuntimeDefault, ""))),
            (
                None,
                Some(sp("RuntimeDefault", None)),
                false,
                Ok((RuntimeDefault, "")),
            ),
            (
                Some(sp("Unconfined", None)),
                Some(sp("RuntimeDefault", None)),
                true,
                Ok((Unconfined, "")),
            ),
            (
                Some(sp("Localhost", Some("profiles/audit.json"))),
                None,
                false,
                Ok((Localhost, "/var/lib/rustlet/seccomp/profiles/audit.json")),
            ),
            (
                None,
                Some(sp("Localhost", Some("a.json"))),
                true,
                Ok((Localhost, "/var/lib/rustlet/seccomp/a.json")),
            ),
            (
                Some(sp("Localhost", Some("../../etc/x.json"))),
                None,
                false,
                Err("without '..'"),
            ),
            (
                Some(sp("Localhost", Some("a/../../x.json"))),
                None,
                false,
                Err("without '..'"),
            ),
            (
                Some(sp("Localhost", Some("/etc/x.json"))),
                None,
                false,
                Err("without '..'"),
            ),
            (
                Some(sp("Localhost", None)),
                None,
                false,
                Err("localhostProfile must be set"),
            ),
            (
                Some(sp("Localhost", Some(""))),
                None,
                false,
                Err("localhostProfile must be set"),
            ),
            (
                Some(sp("Whatever", None)),
                None,
                true,
                Err("unknown seccomp profile type"),
            ),
        ];
        for (c, p, default, want) in cases {
            let node = if default { &defaulted } else { &n };
            let got = seccomp(c.as_ref(), p.as_ref(), node);
            match (got, want) {
                (Ok(got), Ok((t, r))) => {
                    assert_eq!(
                        (got.profile_type, got.localhost_ref.as_str()),
                        (t as i32, r),
                        "{c:?} {p:?}"
                    );
                }
                (Err(e), Err(msg)) => assert!(e.to_string().contains(msg), "{c:?}: {e}"),
                (got, want) => panic!("{c:?} {p:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn apparmor_selinux_and_groups_policy_reach_the_runtime() {
        use cri::security_profile::ProfileType;
        use k8s_openapi::api::core::v1::{AppArmorProfile, SELinuxOptions};
        let aa = |t: &str, l: Option<&str>| AppArmorProfile {
            type_: t.into(),
            localhost_profile: l.map(Into::into),
        };
        // (pod field, container field, annotation) → (CRI type, ref, deprecated string) or none
        let cases = [
            (None, None, None, None),
            (
                Some(aa("RuntimeDefault", None)),
                None,
                None,
                Some((ProfileType::RuntimeDefault, "", "runtime/default")),
            ),
            (
                Some(aa("RuntimeDefault", None)),
                Some(aa("Localhost", Some("k8s-x"))),
                None,
                Some((ProfileType::Localhost, "k8s-x", "localhost/k8s-x")),
            ),
            (
                Some(aa("RuntimeDefault", None)),
                None,
                Some("unconfined"),
                Some((ProfileType::Unconfined, "", "unconfined")),
            ),
            (
                None,
                None,
                Some("localhost/k8s-y"),
                Some((ProfileType::Localhost, "k8s-y", "localhost/k8s-y")),
            ),
            (
                None,
                Some(aa("Unconfined", None)),
                Some("runtime/default"),
                Some((ProfileType::Unconfined, "", "unconfined")),
            ),
        ];
        for (pod_aa, c_aa, annotation, want) in cases {
            let mut p = pod("web").container("c", "busybox").build();
            if let Some(a) = annotation {
                p.metadata.annotations = Some(BTreeMap::from([(
                    format!("{APPARMOR_ANNOTATION_PREFIX}c"),
                    a.to_string(),
                )]));
            }
            let spec = p.spec.as_mut().unwrap();
            spec.security_context = Some(PodSecurityContext {
                app_armor_profile: pod_aa.clone(),
                ..Default::default()
            });
            spec.containers[0].security_context = Some(SecurityContext {
                app_armor_profile: c_aa.clone(),
                ..Default::default()
            });
            let c = &p.spec.as_ref().unwrap().containers[0];
            let sc = security_context(&p, c, &node(), &Isolation::default()).unwrap();
            #[allow(deprecated)] // the deprecated string is still sent, as the kubelet does
            let got = sc
                .apparmor
                .map(|a| (a.profile_type, a.localhost_ref, sc.apparmor_profile.clone()));
            let want = want.map(|(t, r, d)| (t as i32, r.to_string(), d.to_string()));
            assert_eq!(got, want, "{pod_aa:?} {c_aa:?} {annotation:?}");
        }
        let bad = {
            let mut p = pod("web").container("c", "busybox").build();
            p.spec.as_mut().unwrap().containers[0].security_context = Some(SecurityContext {
                app_armor_profile: Some(aa("Localhost", None)),
                ..Default::default()
            });
            p
        };
        let c = &bad.spec.as_ref().unwrap().containers[0];
        assert!(security_context(&bad, c, &node(), &Isolation::default()).is_err());

        let mut p = pod("web").container("c", "busybox").build();
        let selinux = |level: &str| SELinuxOptions {
            level: Some(level.into()),
            type_: Some("container_t".into()),
            ..Default::default()
        };
        p.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
            se_linux_options: Some(selinux("s0:c1,c2")),
            supplemental_groups_policy: Some("Strict".into()),
            ..Default::default()
        });
        let sandbox = sandbox_config(&p, 0, &node(), &Isolation::default()).unwrap();
        let ssc = sandbox.linux.unwrap().security_context.unwrap();
        assert_eq!(ssc.selinux_options.unwrap().level, "s0:c1,c2");
        assert_eq!(
            ssc.supplemental_groups_policy,
            cri::SupplementalGroupsPolicy::Strict as i32
        );
        assert_eq!(
            ssc.seccomp.unwrap().profile_type,
            cri::security_profile::ProfileType::RuntimeDefault as i32
        );
        p.spec.as_mut().unwrap().containers[0].security_context = Some(SecurityContext {
            se_linux_options: Some(selinux("s0:c3,c4")),
            ..Default::default()
        });
        let c = &p.spec.as_ref().unwrap().containers[0];
        let sc = security_context(&p, c, &node(), &Isolation::default()).unwrap();
        let o = sc.selinux_options.unwrap();
        assert_eq!(
            (o.level.as_str(), o.r#type.as_str()),
            ("s0:c3,c4", "container_t")
        );
        assert_eq!(
            sc.supplemental_groups_policy,
            cri::SupplementalGroupsPolicy::Strict as i32
        );
        p.spec
            .as_mut()
            .unwrap()
            .security_context
            .as_mut()
            .unwrap()
            .supplemental_groups_policy = Some("Loose".into());
        assert!(sandbox_config(&p, 0, &node(), &Isolation::default()).is_err());
    }

    #[test]
    fn pod_overhead_is_the_sandboxs() {
        let mut p = pod("web").container("c", "busybox").build();
        let none = sandbox_config(&p, 0, &node(), &Isolation::default()).unwrap();
        assert_eq!(none.linux.unwrap().overhead, None);
        p.spec.as_mut().unwrap().overhead = Some(BTreeMap::from([
            ("cpu".to_string(), Quantity("250m".into())),
            ("memory".to_string(), Quantity("120Mi".into())),
        ]));
        let o = sandbox_config(&p, 0, &node(), &Isolation::default())
            .unwrap()
            .linux
            .unwrap()
            .overhead
            .unwrap();
        assert_eq!(
            (
                o.cpu_shares,
                o.cpu_quota,
                o.cpu_period,
                o.memory_limit_in_bytes
            ),
            (256, 25_000, CPU_PERIOD_US, 120 << 20)
        );
    }

    /// With `cpuCFSQuotaPeriod` at 50 ms every quota is over that period, as
    /// the kubelet's `milliCPUToQuota` with `CustomCPUCFSQuotaPeriod`: a
    /// container's, the sandbox's overhead and the pod cgroup's, still at
    /// least 1 ms.
    #[test]
    fn a_custom_cfs_period_is_every_quotas_period() {
        use k8s_openapi::api::core::v1::ResourceRequirements;
        let mut n = node();
        n.cpu_period_us = 50_000;
        let mut p = pod("web").container("c", "busybox").build();
        let spec = p.spec.as_mut().unwrap();
        spec.containers[0].resources = Some(ResourceRequirements {
            limits: Some(BTreeMap::from([(
                "cpu".to_string(),
                Quantity("500m".into()),
            )])),
            ..Default::default()
        });
        spec.overhead = Some(BTreeMap::from([(
            "cpu".to_string(),
            Quantity("250m".into()),
        )]));
        let r = linux_resources(&p, &p.spec.as_ref().unwrap().containers[0], &n);
        assert_eq!((r.cpu_quota, r.cpu_period), (25_000, 50_000));
        let o = sandbox_config(&p, 0, &n, &Isolation::default())
            .unwrap()
            .linux
            .unwrap()
            .overhead
            .unwrap();
        assert_eq!((o.cpu_quota, o.cpu_period), (12_500, 50_000));
        // The pod's cgroup: the container's limit and the overhead.
        assert_eq!(pod_cgroup_limits(&p, 50_000).cpu_quota, Some(37_500));
        assert_eq!(pod_cgroup_limits(&p, CPU_PERIOD_US).cpu_quota, Some(75_000));
        assert_eq!(cpu_quota(1, 50_000), MIN_QUOTA_US);
        assert_eq!(cpu_quota(1, 1_000_000), MIN_QUOTA_US);
        assert_eq!(cpu_quota(1500, 1_000_000), 1_500_000);
    }
}
