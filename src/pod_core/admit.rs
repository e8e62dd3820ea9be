//! Pod admission on the node, as the kubelet's admit handlers: the OS field
//! and supplemental groups policy checks of `predicateAdmitHandler`
//! (lifecycle/predicate.go), the sysctl allowlist (sysctl/allowlist.go,
//! safe_sysctls.go) and the AppArmor admit handler (lifecycle/handlers.go with
//! security/apparmor/validate.go). Pure: a rejected pod is failed by the
//! worker with the reason and message returned here.

use k8s_openapi::api::core::v1::Pod;

use crate::reasons::admission::{
    APPARMOR, POD_LEVEL_RESOURCES_NOT_SUPPORTED, POD_OS_NOT_SUPPORTED,
    SUPPLEMENTAL_GROUPS_POLICY_NOT_SUPPORTED, SYSCTL_FORBIDDEN,
};

/// What the node can enforce, for admission.
#[derive(Clone, Debug, Default)]
pub struct NodeAbilities<'a> {
    /// `allowedUnsafeSysctls` (names, or prefixes ending in `*`).
    pub allowed_unsafe_sysctls: &'a [String],
    /// The kernel enforces AppArmor.
    pub apparmor_enabled: bool,
    /// The runtime supports `supplementalGroupsPolicy: Strict` (CRI `Status`
    /// `features.supplemental_groups_policy`).
    pub supplemental_groups_policy: bool,
    /// The `PodLevelResources` feature gate is off.
    pub pod_level_resources_disabled: bool,
}

/// True when `pod` sets pod-level requests or limits of a resource pod
/// level supports (component-helpers' `IsPodLevelResourcesSet`).
#[must_use]
pub fn pod_level_resources_set(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .is_some_and(|r| {
            [r.requests.as_ref(), r.limits.as_ref()]
                .into_iter()
                .flatten()
                .flat_map(|m| m.keys())
                .any(|name| super::spec::is_pod_level_resource(name))
        })
}

/// The sysctls the kubelet allows without configuration (`safeSysctls`): namespaced
/// and without influence on other pods.
pub const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    "net.ipv4.tcp_slow_start_after_idle",
    "net.ipv4.tcp_notsent_lowat",
];

/// Why a pod was not admitted: the status reason and message (the message is
/// prefixed with `Pod was rejected: ` in the status, as the kubelet's `rejectPod`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// `PodOSNotSupported`, `SysctlForbidden`, `OutOfcpu`, `NodeAffinity`.
    pub reason: String,
    /// What was wrong.
    pub message: String,
}

/// The kernel namespace of a sysctl, as component-helpers' `sysctl.Namespace`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Namespace {
    Ipc,
    Net,
    Uts,
    User,
    Unknown,
}

impl Namespace {
    fn name(self) -> &'static str {
        match self {
            Self::Ipc => "IPC",
            Self::Net => "Net",
            Self::Uts => "UTS",
            Self::User => "User",
            Self::Unknown => "",
        }
    }
}

/// A sysctl name with `.` as the separator: a name whose first separator is `/`
/// has `/` and `.` swapped, as `NormalizeName`.
#[must_use]
pub fn normalize_sysctl(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes()[i] == b'/' => name
            .chars()
            .map(|c| match c {
                '/' => '.',
                '.' => '/',
                c => c,
            })
            .collect(),
        _ => name.to_string(),
    }
}

fn namespace_of(sysctl: &str) -> Namespace {
    match sysctl {
        "kernel.domainname" => return Namespace::Uts,
        "kernel.sem"
        | "kernel.shmall"
        | "kernel.shmmax"
        | "kernel.shmmni"
        | "kernel.shm_rmid_forced"
        | "kernel.shm"
        | "kernel.msgmax"
        | "kernel.msgmnb"
        | "kernel.msgmni"
        | "kernel.msg" => return Namespace::Ipc,
        _ => {}
    }
    for (prefix, ns) in [
        ("net.", Namespace::Net),
        ("fs.mqueue.", Namespace::Ipc),
        ("user.", Namespace::User),
    ] {
        if sysctl.starts_with(prefix) {
            return ns;
        }
    }
    Namespace::Unknown
}

/// Checks one sysctl against the safe list plus `allowed_unsafe` (names, or
/// prefixes ending in `*`), as the kubelet's `patternAllowlist.validateSysctl`.
fn validate_sysctl(
    sysctl: &str,
    allowed_unsafe: &[String],
    host_net: bool,
    host_ipc: bool,
    host_users: bool,
) -> Result<(), String> {
    let sysctl = normalize_sysctl(sysctl);
    let shared = |ns: Namespace| {
        let host = match ns {
            Namespace::Ipc => host_ipc,
            Namespace::Net => host_net,
            Namespace::User => host_users,
            Namespace::Uts | Namespace::Unknown => false,
        };
        if host {
            Err(format!(
                "{sysctl:?} not allowed with host {} enabled",
                ns.name()
            ))
        } else {
            Ok(())
        }
    };
    let patterns = SAFE_SYSCTLS
        .iter()
        .map(|s| (*s).to_string())
        .chain(allowed_unsafe.iter().map(|s| normalize_sysctl(s)));
    for pattern in patterns {
        let matched = match pattern.strip_suffix('*') {
            Some(prefix) => sysctl.starts_with(prefix),
            None => pattern == sysctl,
        };
        if matched {
            let ns = namespace_of(pattern.trim_end_matches('*'));
            return shared(ns);
        }
    }
    Err(format!("{sysctl:?} not allowlisted"))
}

/// True when `pod` sets `supplementalGroupsPolicy: Strict`.
#[must_use]
pub fn wants_strict_supplemental_groups(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|sc| sc.supplemental_groups_policy.as_deref())
        == Some("Strict")
}

/// True when some container of `pod` would run under an AppArmor profile
/// other than `Unconfined` (pod or container field, or the deprecated
/// annotation), as the kubelet's `apparmor.isRequired`.
#[must_use]
pub fn apparmor_required(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let confined = |p: Option<&k8s_openapi::api::core::v1::AppArmorProfile>| {
        p.is_some_and(|p| p.type_ != "Unconfined")
    };
    if confined(
        spec.security_context
            .as_ref()
            .and_then(|sc| sc.app_armor_profile.as_ref()),
    ) {
        return true;
    }
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter());
    let ephemeral = spec
        .ephemeral_containers
        .iter()
        .flatten()
        .map(|e| e.security_context.as_ref());
    if containers
        .map(|c| c.security_context.as_ref())
        .chain(ephemeral)
        .any(|sc| confined(sc.and_then(|sc| sc.app_armor_profile.as_ref())))
    {
        return true;
    }
    pod.metadata
        .annotations
        .iter()
        .flatten()
        .any(|(k, v)| k.starts_with(crate::labels::APPARMOR_ANNOTATION_PREFIX) && v != "unconfined")
}

/// Admits `pod` on a Linux node that can enforce what `node` says.
///
/// # Errors
/// The [`Rejection`] of the first check that fails, in the kubelet's order:
/// the OS field, `supplementalGroupsPolicy: Strict` the runtime does not
/// support, a sysctl not allowed, an AppArmor profile on a node without
/// AppArmor.
pub fn admit(pod: &Pod, node: &NodeAbilities<'_>) -> Result<(), Rejection> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(());
    };
    if spec.os.as_ref().is_some_and(|os| os.name != "linux") {
        return Err(Rejection {
            reason: POD_OS_NOT_SUPPORTED.into(),
            message: "Failed to admit pod as the OS field doesn't match node OS".into(),
        });
    }
    if wants_strict_supplemental_groups(pod) && !node.supplemental_groups_policy {
        return Err(Rejection {
            reason: SUPPLEMENTAL_GROUPS_POLICY_NOT_SUPPORTED.into(),
            message: "SupplementalGroupsPolicy=Strict is not supported in this node".into(),
        });
    }
    let allowed_unsafe = node.allowed_unsafe_sysctls;
    let sysctls = spec
        .security_context
        .as_ref()
        .and_then(|sc| sc.sysctls.as_ref());
    let host_users = spec.host_users.unwrap_or(true);
    for s in sysctls.into_iter().flatten() {
        validate_sysctl(
            &s.name,
            allowed_unsafe,
            spec.host_network.unwrap_or(false),
            spec.host_ipc.unwrap_or(false),
            host_users,
        )
        .map_err(|e| Rejection {
            reason: SYSCTL_FORBIDDEN.into(),
            message: format!("forbidden sysctl: {e}"),
        })?;
    }
    if !node.apparmor_enabled && apparmor_required(pod) {
        return Err(Rejection {
            reason: APPARMOR.into(),
            message: "Cannot enforce AppArmor: AppArmor is not enabled on the host".into(),
        });
    }
    // The pod features admit handler (`isPodLevelResourcesSupported`).
    if node.pod_level_resources_disabled && pod_level_resources_set(pod) {
        return Err(Rejection {
            reason: POD_LEVEL_RESOURCES_NOT_SUPPORTED.into(),
            message: "PodLevelResources feature gate is disabled".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;
    use k8s_openapi::api::core::v1::{PodOS, PodSecurityContext, Sysctl};

    #[test]
    fn normalize_table() {
        for (input, want) in [
            ("kernel.shm_rmid_forced", "kernel.shm_rmid_forced"),
            ("kernel/shm_rmid_forced", "kernel.shm_rmid_forced"),
            (
                "net/ipv4/conf/eno2.100/rp_filter",
                "net.ipv4.conf.eno2/100.rp_filter",
            ),
            (
                "net.ipv4.conf.eno2/100.rp_filter",
                "net.ipv4.conf.eno2/100.rp_filter",
            ),
        ] {
            assert_eq!(normalize_sysctl(input), want, "{input}");
        }
    }

    #[test]
    fn admission_table() {
        // (os, sysctls, hostNetwork, allowed unsafe) → rejection reason
        let unsafe_ipc = vec!["kernel.msg*".to_string()];
        type Case<'a> = (
            Option<&'a str>,
            Vec<&'a str>,
            bool,
            Vec<String>,
            Option<&'a str>,
        );
        let cases: Vec<Case> = vec![
            (None, vec![], false, vec![], None),
            (Some("linux"), vec![], false, vec![], None),
            (
                Some("windows"),
                vec![],
                false,
                vec![],
                Some(POD_OS_NOT_SUPPORTED),
            ),
            (None, vec!["kernel.shm_rmid_forced"], false, vec![], None),
            (None, vec!["kernel/shm_rmid_forced"], false, vec![], None),
            (
                None,
                vec!["kernel.msgmax"],
                false,
                vec![],
                Some(SYSCTL_FORBIDDEN),
            ),
            (None, vec!["kernel.msgmax"], false, unsafe_ipc.clone(), None),
            (
                None,
                vec!["kernel.msgmax", "kernel.domainname"],
                false,
                unsafe_ipc,
                Some(SYSCTL_FORBIDDEN),
            ),
            (
                None,
                vec!["net.ipv4.ip_local_port_range"],
                false,
                vec![],
                None,
            ),
            (
                None,
                vec!["net.ipv4.ip_local_port_range"],
                true,
                vec![],
                Some(SYSCTL_FORBIDDEN),
            ),
            (
                Some("windows"),
                vec!["kernel.msgmax"],
                false,
                vec![],
                Some(POD_OS_NOT_SUPPORTED),
            ),
        ];
        for (os, sysctls, host_net, allowed, want) in cases {
            let mut p = pod("web").container("c", "busybox").build();
            let s = p.spec.as_mut().unwrap();
            s.os = os.map(|n| PodOS { name: n.into() });
            s.host_network = Some(host_net);
            s.security_context = Some(PodSecurityContext {
                sysctls: Some(
                    sysctls
                        .iter()
                        .map(|n| Sysctl {
                            name: (*n).into(),
                            value: "1".into(),
                        })
                        .collect(),
                ),
                ..Default::default()
            });
            let node = NodeAbilities {
                allowed_unsafe_sysctls: &allowed,
                ..Default::default()
            };
            let got = admit(&p, &node).err().map(|r| r.reason);
            assert_eq!(
                got.as_deref(),
                want,
                "{os:?} {sysctls:?} host_net={host_net} {allowed:?}"
            );
        }
    }

    #[test]
    fn sysctl_message_is_the_kubelets() {
        let mut p = pod("web").container("c", "busybox").build();
        p.spec.as_mut().unwrap().security_context = Some(PodSecurityContext {
            sysctls: Some(vec![Sysctl {
                name: "kernel.msgmax".into(),
                value: "10000000000".into(),
            }]),
            ..Default::default()
        });
        assert_eq!(
            admit(&p, &NodeAbilities::default()).unwrap_err().message,
            "forbidden sysctl: \"kernel.msgmax\" not allowlisted"
        );
    }

    #[test]
    fn apparmor_and_supplemental_groups_policy_table() {
        use k8s_openapi::api::core::v1::{AppArmorProfile, SecurityContext};
        let aa = |t: &str| AppArmorProfile {
            type_: t.into(),
            localhost_profile: (t == "Localhost").then(|| "k8s-x".into()),
        };
        // (pod profile, container profile, annotation, strict, node has AppArmor, runtime has Strict) → reason
        type Case<'a> = (
            Option<&'a str>,
            Option<&'a str>,
            Option<&'a str>,
            bool,
            bool,
            bool,
            Option<&'a str>,
        );
        let cases: Vec<Case> = vec![
            (None, None, None, false, false, false, None),
            (
                Some("RuntimeDefault"),
                None,
                None,
                false,
                false,
                false,
                Some(APPARMOR),
            ),
            (Some("RuntimeDefault"), None, None, false, true, false, None),
            (Some("Unconfined"), None, None, false, false, false, None),
            (
                None,
                Some("Localhost"),
                None,
                false,
                false,
                false,
                Some(APPARMOR),
            ),
            (None, Some("Unconfined"), None, false, false, false, None),
            (
                None,
                None,
                Some("runtime/default"),
                false,
                false,
                false,
                Some(APPARMOR),
            ),
            (None, None, Some("unconfined"), false, false, false, None),
            (
                None,
                None,
                None,
                true,
                true,
                false,
                Some(SUPPLEMENTAL_GROUPS_POLICY_NOT_SUPPORTED),
            ),
            (None, None, None, true, true, true, None),
            (
                Some("RuntimeDefault"),
                None,
                None,
                true,
                false,
                false,
                Some(SUPPLEMENTAL_GROUPS_POLICY_NOT_SUPPORTED),
            ),
        ];
        for (pod_aa, c_aa, annotation, strict, apparmor, sgp, want) in cases {
            let mut p = pod("web").container("c", "busybox").build();
            if let Some(a) = annotation {
                p.metadata.annotations = Some(std::collections::BTreeMap::from([(
                    "container.apparmor.security.beta.kubernetes.io/c".to_string(),
                    a.to_string(),
                )]));
            }
            let s = p.spec.as_mut().unwrap();
            s.security_context = Some(PodSecurityContext {
                app_armor_profile: pod_aa.map(aa),
                supplemental_groups_policy: strict.then(|| "Strict".into()),
                ..Default::default()
            });
            s.containers[0].security_context = Some(SecurityContext {
                app_armor_profile: c_aa.map(aa),
                ..Default::default()
            });
            let node = NodeAbilities {
                allowed_unsafe_sysctls: &[],
                apparmor_enabled: apparmor,
                supplemental_groups_policy: sgp,
                pod_level_resources_disabled: false,
            };
            let got = admit(&p, &node).err();
            assert_eq!(
                got.as_ref().map(|r| r.reason.as_str()),
                want,
                "{pod_aa:?} {c_aa:?} {annotation:?} strict={strict} apparmor={apparmor} sgp={sgp}"
            );
            if let Some(r) = got {
                let message = match r.reason.as_str() {
                    APPARMOR => "Cannot enforce AppArmor: AppArmor is not enabled on the host",
                    _ => "SupplementalGroupsPolicy=Strict is not supported in this node",
                };
                assert_eq!(r.message, message);
            }
        }
    }

    /// With `PodLevelResources` off, a pod that sets pod-level cpu, memory
    /// or huge pages is rejected as the kubelet's pod features handler
    /// rejects it; one that sets only container resources, or another
    /// resource at pod level, is not.
    #[test]
    fn pod_level_resources_are_refused_with_their_gate_off() {
        use k8s_openapi::api::core::v1::ResourceRequirements;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let off = NodeAbilities {
            pod_level_resources_disabled: true,
            ..Default::default()
        };
        for (resources, refused) in [
            (None, false),
            (Some(("requests", "cpu")), true),
            (Some(("limits", "memory")), true),
            (Some(("limits", "hugepages-2Mi")), true),
            (Some(("requests", "example.com/dev")), false),
        ] {
            let mut p = pod("p").container("c", "busybox").build();
            if let Some((kind, name)) = resources {
                let list = Some([(name.to_string(), Quantity("1".into()))].into());
                let mut r = ResourceRequirements::default();
                if kind == "requests" {
                    r.requests = list;
                } else {
                    r.limits = list;
                }
                p.spec.as_mut().unwrap().resources = Some(r);
            }
            assert_eq!(pod_level_resources_set(&p), refused, "{resources:?}");
            let got = admit(&p, &off).err();
            assert_eq!(
                got.map(|r| (r.reason, r.message)),
                refused.then(|| (
                    POD_LEVEL_RESOURCES_NOT_SUPPORTED.to_string(),
                    "PodLevelResources feature gate is disabled".to_string()
                )),
                "{resources:?}"
            );
            assert!(admit(&p, &NodeAbilities::default()).is_ok());
        }
    }
}
