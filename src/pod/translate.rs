//! How a Pod spec becomes CRI configs: the kubelet's `generatePodSandboxConfig`
//! and `generateContainerConfig` (kuberuntime_sandbox.go, kuberuntime_container.go).
//! Pure: plain data in, CRI messages out.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, EnvVar, Pod};
use sha2::{Digest, Sha256};

use crate::cri::{
    CONTAINER_HASH_ANNOTATION, CONTAINER_NAME_LABEL, POD_NAME_LABEL, POD_NAMESPACE_LABEL,
    POD_UID_LABEL, RESTART_COUNT_ANNOTATION, TERMINATION_GRACE_PERIOD_ANNOTATION,
    TERMINATION_MESSAGE_PATH_ANNOTATION,
};

/// A pod spec that cannot be turned into a CRI config.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spec asks for something invalid or unsupported; the message says what.
    #[error("invalid pod spec: {0}")]
    InvalidSpec(String),
}

/// The node-side facts a sandbox config needs.
#[derive(Clone, Debug, Default)]
pub struct NodeContext {
    /// The node's name.
    pub node_name: String,
    /// The node's IPs (primary first), for hostNetwork pods and `status.hostIP`.
    pub node_ips: Vec<String>,
    /// Directory of pod logs (`/var/log/pods`).
    pub pod_logs_dir: PathBuf,
    /// The node's resolv.conf as (nameservers, searches, options).
    pub host_dns: HostDns,
    /// `clusterDNS` of the configuration (empty: none).
    pub cluster_dns: Vec<String>,
    /// `clusterDomain` (`cluster.local`).
    pub cluster_domain: String,
}

/// The node's resolver settings, from its resolv.conf.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostDns {
    /// `nameserver` lines.
    pub servers: Vec<String>,
    /// `search` domains.
    pub searches: Vec<String>,
    /// `options`.
    pub options: Vec<String>,
}

impl HostDns {
    /// Parses resolv.conf text (later `search` lines replace earlier ones, as libc does).
    #[must_use]
    pub fn parse(text: &str) -> Self {
        let mut dns = Self::default();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => dns.servers.extend(words.next().map(str::to_string)),
                Some("search" | "domain") => dns.searches = words.map(str::to_string).collect(),
                Some("options") => dns.options.extend(words.map(str::to_string)),
                _ => {}
            }
        }
        dns
    }
}

/// The pod's log directory: `<pod_logs_dir>/<namespace>_<name>_<uid>`, as the kubelet's `BuildPodLogsDirectory`.
#[must_use]
pub fn pod_log_dir(pod_logs_dir: &Path, namespace: &str, name: &str, uid: &str) -> PathBuf {
    pod_logs_dir.join(format!("{namespace}_{name}_{uid}"))
}

/// The container's log path relative to the pod log directory: `<container>/<restartCount>.log`.
#[must_use]
pub fn container_log_path(container: &str, attempt: u32) -> String {
    format!("{container}/{attempt}.log")
}

/// A stable hash of the container spec (hex, 16 digits), kept in the container's
/// annotations; a change means the spec changed and the container is replaced,
/// as the kubelet's `HashContainer`.
#[must_use]
pub fn container_hash(c: &Container) -> String {
    let json = serde_json::to_vec(c).unwrap_or_default();
    let digest = Sha256::digest(&json);
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Pod identity: (namespace, name, uid).
#[must_use]
pub fn pod_identity(pod: &Pod) -> (String, String, String) {
    let m = &pod.metadata;
    (
        m.namespace.clone().unwrap_or_else(|| "default".into()),
        m.name.clone().unwrap_or_default(),
        m.uid.clone().unwrap_or_default(),
    )
}

fn pod_labels(pod: &Pod) -> HashMap<String, String> {
    let (ns, name, uid) = pod_identity(pod);
    let mut labels: HashMap<String, String> = pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
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

fn namespace_options(pod: &Pod) -> cri::NamespaceOption {
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

/// The sandbox config of attempt `attempt`, as the kubelet's `generatePodSandboxConfig`.
///
/// # Errors
/// [`Error::InvalidSpec`] when the DNS settings are invalid.
pub fn sandbox_config(
    pod: &Pod,
    attempt: u32,
    node: &NodeContext,
) -> Result<cri::PodSandboxConfig, Error> {
    let (ns, name, uid) = pod_identity(pod);
    let spec = pod.spec.as_ref();
    let hostname = if host_network(pod) {
        String::new()
    } else {
        let h = spec
            .and_then(|s| s.hostname.clone())
            .unwrap_or_else(|| name.clone());
        h.chars()
            .take(63)
            .collect::<String>()
            .trim_end_matches(['-', '.'])
            .to_string()
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
    let sysctls = spec
        .and_then(|s| s.security_context.as_ref())
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
        log_directory: pod_log_dir(&node.pod_logs_dir, &ns, &name, &uid)
            .to_string_lossy()
            .into_owned(),
        dns_config: Some(dns_config(pod, node)?),
        port_mappings,
        labels: pod_labels(pod),
        annotations: pod
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(pod)),
                privileged: spec
                    .map(|s| s.containers.iter())
                    .into_iter()
                    .flatten()
                    .any(|c| {
                        c.security_context
                            .as_ref()
                            .and_then(|sc| sc.privileged)
                            .unwrap_or(false)
                    }),
                ..Default::default()
            }),
            sysctls,
            ..Default::default()
        }),
        windows: None,
    })
}

/// Pod-level values that `fieldRef` environment variables read.
#[derive(Clone, Debug, Default)]
pub struct PodFacts {
    /// Pod IPs, primary first.
    pub pod_ips: Vec<String>,
    /// Host IPs, primary first.
    pub host_ips: Vec<String>,
}

fn field_ref(pod: &Pod, path: &str, node: &NodeContext, facts: &PodFacts) -> Option<String> {
    let (ns, name, uid) = pod_identity(pod);
    let spec = pod.spec.as_ref();
    let annotated = |map: &Option<BTreeMap<String, String>>, prefix: &str| {
        path.strip_prefix(prefix)
            .and_then(|k| k.strip_prefix("['").and_then(|k| k.strip_suffix("']")))
            .and_then(|k| map.as_ref().and_then(|m| m.get(k).cloned()))
    };
    Some(match path {
        "metadata.name" => name,
        "metadata.namespace" => ns,
        "metadata.uid" => uid,
        "spec.nodeName" => spec
            .and_then(|s| s.node_name.clone())
            .unwrap_or_else(|| node.node_name.clone()),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        "status.podIP" => facts.pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => facts.pod_ips.join(","),
        "status.hostIP" => facts.host_ips.first().cloned().unwrap_or_default(),
        "status.hostIPs" => facts.host_ips.join(","),
        p if p.starts_with("metadata.labels") => {
            annotated(&pod.metadata.labels, "metadata.labels")?
        }
        p if p.starts_with("metadata.annotations") => {
            annotated(&pod.metadata.annotations, "metadata.annotations")?
        }
        _ => return None,
    })
}

/// The container's environment: plain values and pod `fieldRef`s (other sources
/// resolve to empty values until they are supported), as the kubelet's `makeEnvironmentVariables`.
#[must_use]
pub fn environment(
    pod: &Pod,
    c: &Container,
    node: &NodeContext,
    facts: &PodFacts,
) -> Vec<cri::KeyValue> {
    c.env
        .iter()
        .flatten()
        .map(
            |EnvVar {
                 name,
                 value,
                 value_from,
             }| {
                let value = match (value, value_from) {
                    (Some(v), _) => v.clone(),
                    (None, Some(from)) => from
                        .field_ref
                        .as_ref()
                        .and_then(|f| field_ref(pod, &f.field_path, node, facts))
                        .unwrap_or_default(),
                    (None, None) => String::new(),
                };
                cri::KeyValue {
                    key: name.clone(),
                    value,
                }
            },
        )
        .collect()
}

/// The CRI config of container `c` at `attempt`, with the image reference the
/// runtime resolved and the container's volume `mounts` (from
/// `volume::container_mounts`), as the kubelet's `generateContainerConfig`.
#[must_use]
pub fn container_config(
    pod: &Pod,
    c: &Container,
    attempt: u32,
    image_ref: &str,
    node: &NodeContext,
    facts: &PodFacts,
    mounts: Vec<cri::Mount>,
) -> cri::ContainerConfig {
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
    let annotations = HashMap::from([
        (CONTAINER_HASH_ANNOTATION.to_string(), container_hash(c)),
        (RESTART_COUNT_ANNOTATION.to_string(), attempt.to_string()),
        (
            TERMINATION_MESSAGE_PATH_ANNOTATION.to_string(),
            c.termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".into()),
        ),
        (
            TERMINATION_GRACE_PERIOD_ANNOTATION.to_string(),
            grace.to_string(),
        ),
    ]);
    let sc = c.security_context.as_ref();
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt,
        }),
        image: Some(cri::ImageSpec {
            image: image_ref.to_string(),
            user_specified_image: c.image.clone().unwrap_or_default(),
            ..Default::default()
        }),
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: environment(pod, c, node, facts),
        mounts,
        labels,
        annotations,
        log_path: container_log_path(&c.name, attempt),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(cri::LinuxContainerConfig {
            resources: None,
            security_context: Some(cri::LinuxContainerSecurityContext {
                namespace_options: Some(namespace_options(pod)),
                privileged: sc.and_then(|s| s.privileged).unwrap_or(false),
                readonly_rootfs: sc
                    .and_then(|s| s.read_only_root_filesystem)
                    .unwrap_or(false),
                run_as_user: sc
                    .and_then(|s| s.run_as_user)
                    .map(|value| cri::Int64Value { value }),
                run_as_group: sc
                    .and_then(|s| s.run_as_group)
                    .map(|value| cri::Int64Value { value }),
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::fixtures::pod;

    fn node() -> NodeContext {
        NodeContext {
            node_name: "n1".into(),
            node_ips: vec!["127.0.0.1".into()],
            pod_logs_dir: "/var/log/pods".into(),
            host_dns: HostDns::parse("nameserver 10.0.0.2\nsearch corp.example\noptions edns0\n"),
            cluster_dns: vec![],
            cluster_domain: "cluster.local".into(),
        }
    }

    #[test]
    fn sandbox_config_carries_identity_labels_and_log_dir() {
        let p = pod("web")
            .label("app", "web")
            .container("c", "busybox")
            .build();
        let cfg = sandbox_config(&p, 1, &node()).unwrap();
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
        let mount = cri::Mount {
            container_path: "/data".into(),
            host_path: "/var/lib/rustlet/pods/uid-web/volumes/kubernetes.io~empty-dir/data".into(),
            ..Default::default()
        };
        let cfg = container_config(
            &p,
            &c2,
            2,
            "sha256:abc",
            &node(),
            &facts,
            vec![mount.clone()],
        );
        assert_eq!(cfg.mounts, vec![mount]);
        assert_eq!(cfg.log_path, "c/2.log");
        assert_eq!(cfg.labels[CONTAINER_NAME_LABEL], "c");
        assert_eq!(cfg.annotations[RESTART_COUNT_ANNOTATION], "2");
        assert_eq!(cfg.image.unwrap().image, "sha256:abc");
        let env: Vec<_> = cfg
            .envs
            .iter()
            .map(|kv| (kv.key.as_str(), kv.value.as_str()))
            .collect();
        assert_eq!(env, vec![("A", "1"), ("IP", "10.88.0.5")]);
        assert_ne!(container_hash(c), container_hash(&c2));
    }
}
