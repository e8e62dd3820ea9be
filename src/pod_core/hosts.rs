//! The pod's hostname and the content of its agent-managed `/etc/hosts`, as
//! the kubelet's `GeneratePodHostNameAndDomain`, `GetNodenameForKernel` and
//! `managedHostsFileContent` (kubelet_pods.go, util.go). Pure: the file is
//! written by [`crate::pod::hosts`].

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, HostAlias, Pod};

/// Where every container sees the managed hosts file.
pub const ETC_HOSTS_PATH: &str = "/etc/hosts";
/// First line of the hosts file of a pod on the pod network.
pub const MANAGED_HEADER: &str = "# Kubernetes-managed hosts file.\n";
/// First line of the hosts file of a `hostNetwork` pod.
pub const MANAGED_HEADER_HOST_NETWORK: &str = "# Kubernetes-managed hosts file (host network).\n";
/// The longest hostname the kernel takes (63 characters).
const HOSTNAME_MAX_LEN: usize = 63;
/// The longest FQDN the kernel's nodename field takes (64 characters).
const FQDN_MAX_LEN: usize = 64;

pub use crate::names::{is_dns1123_label, is_dns1123_subdomain};

/// Cuts a hostname to 63 characters and trims trailing `-` and `.`, as the
/// kubelet's `truncatePodHostnameIfNeeded`.
fn truncate_hostname(hostname: &str) -> Result<String, String> {
    if hostname.len() <= HOSTNAME_MAX_LEN {
        return Ok(hostname.to_string());
    }
    let cut: String = hostname.chars().take(HOSTNAME_MAX_LEN).collect();
    let cut = cut.trim_end_matches(['-', '.']);
    if cut.is_empty() {
        return Err(format!("hostname for pod was invalid: {hostname:?}"));
    }
    Ok(cut.to_string())
}

/// The pod's short hostname and its domain (`<subdomain>.<namespace>.svc.<clusterDomain>`,
/// empty without `spec.subdomain`), as the kubelet's `GeneratePodHostNameAndDomain`:
/// `spec.hostnameOverride` wins (with no domain), then `spec.hostname`, then the pod name.
///
/// # Errors
/// The kubelet's message for an invalid `hostnameOverride`, `hostname` or `subdomain`.
pub fn hostname_and_domain(pod: &Pod, cluster_domain: &str) -> Result<(String, String), String> {
    let spec = pod.spec.as_ref();
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if let Some(o) = spec.and_then(|s| s.hostname_override.as_deref()) {
        if !is_dns1123_subdomain(o) {
            return Err(format!(
                "pod HostnameOverride {o:?} is not a valid DNS subdomain"
            ));
        }
        return Ok((truncate_hostname(o)?, String::new()));
    }
    let hostname = match spec.and_then(|s| s.hostname.as_deref()) {
        Some(h) if !h.is_empty() => {
            if !is_dns1123_label(h) {
                return Err(format!("pod Hostname {h:?} is not a valid DNS label"));
            }
            h
        }
        _ => name,
    };
    let hostname = truncate_hostname(hostname)?;
    let domain = match spec.and_then(|s| s.subdomain.as_deref()) {
        Some(sub) if !sub.is_empty() => {
            if !is_dns1123_label(sub) {
                return Err(format!("pod Subdomain {sub:?} is not a valid DNS label"));
            }
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            format!("{sub}.{ns}.svc.{cluster_domain}")
        }
        _ => String::new(),
    };
    Ok((hostname, domain))
}

/// The hostname the sandbox's kernel gets: the FQDN with `setHostnameAsFQDN`
/// and a domain, else the short name, as the kubelet's `GetNodenameForKernel`.
///
/// # Errors
/// An FQDN longer than 64 characters.
pub fn kernel_hostname(pod: &Pod, hostname: &str, domain: &str) -> Result<String, String> {
    let as_fqdn = pod
        .spec
        .as_ref()
        .and_then(|s| s.set_hostname_as_fqdn)
        .unwrap_or(false);
    if domain.is_empty() || !as_fqdn {
        return Ok(hostname.to_string());
    }
    let fqdn = format!("{hostname}.{domain}");
    if fqdn.len() > FQDN_MAX_LEN {
        return Err(format!(
            "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long ({FQDN_MAX_LEN} characters is the max, {} characters requested)",
            fqdn.len()
        ));
    }
    Ok(fqdn)
}

/// The `hostAliases` block: a blank line, a comment, then one line per alias
/// (the IP, then its names separated by tabs), as `hostsEntriesFromHostAliases`.
#[must_use]
pub fn host_alias_entries(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for a in aliases {
        let names = a.hostnames.clone().unwrap_or_default().join("\t");
        out.push_str(&format!("{}\t{names}\n", a.ip));
    }
    out
}

/// The hosts file of a pod on the pod network: the localhost lines, each pod IP
/// with the hostname (FQDN first when there is a domain), then the host
/// aliases, as the kubelet's `managedHostsFileContent`.
#[must_use]
pub fn managed_content(
    pod_ips: &[String],
    hostname: &str,
    domain: &str,
    aliases: &[HostAlias],
) -> String {
    let mut out = String::from(MANAGED_HEADER);
    out.push_str("127.0.0.1\tlocalhost\n");
    out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    out.push_str("fe00::0\tip6-localnet\n");
    out.push_str("fe00::0\tip6-mcastprefix\n");
    out.push_str("fe00::1\tip6-allnodes\n");
    out.push_str("fe00::2\tip6-allrouters\n");
    for ip in pod_ips {
        if domain.is_empty() {
            out.push_str(&format!("{ip}\t{hostname}\n"));
        } else {
            out.push_str(&format!("{ip}\t{hostname}.{domain}\t{hostname}\n"));
        }
    }
    out.push_str(&host_alias_entries(aliases));
    out
}

/// The hosts file of a `hostNetwork` pod: the node's own hosts file plus the
/// host aliases, as the kubelet's `nodeHostsFileContent`.
#[must_use]
pub fn node_content(node_hosts: &str, aliases: &[HostAlias]) -> String {
    format!(
        "{MANAGED_HEADER_HOST_NETWORK}{node_hosts}{}",
        host_alias_entries(aliases)
    )
}

/// True when container `c` gets the managed hosts file, as the kubelet's
/// `shouldMountHostsFile` and `makeMounts`: the pod has an IP (or uses the host
/// network) and the container does not mount something at `/etc/hosts` itself.
#[must_use]
pub fn should_mount(pod: &Pod, c: &Container, pod_ips: &[String]) -> bool {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    (host_network || !pod_ips.is_empty())
        && !c
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == ETC_HOSTS_PATH)
}

/// The managed hosts file's path: `<pod dir>/etc-hosts`, as `getEtcHostsPath`.
#[must_use]
pub fn hosts_file_path(pod_dir: &Path) -> PathBuf {
    pod_dir.join("etc-hosts")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;
    use k8s_openapi::api::core::v1::VolumeMount;

    fn alias(ip: &str, names: &[&str]) -> HostAlias {
        HostAlias {
            ip: ip.into(),
            hostnames: Some(names.iter().map(|s| (*s).to_string()).collect()),
        }
    }

    const LOCALHOST: &str = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n";

    #[test]
    fn managed_content_table() {
        let ips = |v: &[&str]| v.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
        type Case<'a> = (Vec<String>, &'a str, &'a str, Vec<HostAlias>, String);
        let cases: Vec<Case> = vec![
            (ips(&[]), "web", "", vec![], LOCALHOST.to_string()),
            (
                ips(&["10.88.0.5"]),
                "web",
                "",
                vec![],
                format!("{LOCALHOST}10.88.0.5\tweb\n"),
            ),
            (
                ips(&["10.88.0.5", "fd00::5"]),
                "web",
                "sub.ns.svc.cluster.local",
                vec![],
                format!(
                    "{LOCALHOST}10.88.0.5\tweb.sub.ns.svc.cluster.local\tweb\nfd00::5\tweb.sub.ns.svc.cluster.local\tweb\n"
                ),
            ),
            (
                ips(&["10.88.0.5"]),
                "web",
                "",
                vec![
                    alias("123.45.67.89", &["foo", "bar"]),
                    alias("1.2.3.4", &["baz"]),
                ],
                format!(
                    "{LOCALHOST}10.88.0.5\tweb\n\n# Entries added by HostAliases.\n123.45.67.89\tfoo\tbar\n1.2.3.4\tbaz\n"
                ),
            ),
        ];
        for (ips, host, domain, aliases, want) in cases {
            assert_eq!(
                managed_content(&ips, host, domain, &aliases),
                want,
                "{host} {domain}"
            );
        }
    }

    #[test]
    fn node_content_keeps_the_node_file() {
        assert_eq!(
            node_content("127.0.0.1 localhost\n", &[alias("1.2.3.4", &["a"])]),
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n\n# Entries added by HostAliases.\n1.2.3.4\ta\n"
        );
        assert_eq!(
            node_content("x\n", &[]),
            "# Kubernetes-managed hosts file (host network).\nx\n"
        );
    }

    #[test]
    fn hostname_and_domain_table() {
        let long = "a".repeat(70);
        // (hostname, hostnameOverride, subdomain, setHostnameAsFQDN) → (hostname, domain, kernel)
        type Want<'a> = Result<(&'a str, &'a str, &'a str), ()>;
        type Case<'a> = (
            Option<&'a str>,
            Option<&'a str>,
            Option<&'a str>,
            bool,
            Want<'a>,
        );
        let cases: Vec<Case> = vec![
            (None, None, None, false, Ok(("web", "", "web"))),
            (
                Some("custom"),
                None,
                None,
                false,
                Ok(("custom", "", "custom")),
            ),
            (
                Some("custom"),
                None,
                Some("sub"),
                false,
                Ok(("custom", "sub.default.svc.cluster.local", "custom")),
            ),
            (
                Some("custom"),
                None,
                Some("sub"),
                true,
                Ok((
                    "custom",
                    "sub.default.svc.cluster.local",
                    "custom.sub.default.svc.cluster.local",
                )),
            ),
            (
                Some("custom"),
                Some("override-host"),
                Some("sub"),
                false,
                Ok(("override-host", "", "override-host")),
            ),
            (
                None,
                Some("override.example.host"),
                None,
                false,
                Ok(("override.example.host", "", "override.example.host")),
            ),
            (None, Some("Not-RFC1123"), None, false, Err(())),
            (Some("Bad_Name"), None, None, false, Err(())),
            (None, None, Some("bad.sub"), false, Err(())),
            (Some(long.as_str()), None, None, false, Err(())),
        ];
        for (hostname, over, sub, fqdn, want) in cases {
            let mut p = pod("web").container("c", "busybox").build();
            let s = p.spec.as_mut().unwrap();
            s.hostname = hostname.map(str::to_string);
            s.hostname_override = over.map(str::to_string);
            s.subdomain = sub.map(str::to_string);
            s.set_hostname_as_fqdn = Some(fqdn);
            let got = hostname_and_domain(&p, "cluster.local").and_then(|(h, d)| {
                let k = kernel_hostname(&p, &h, &d)?;
                Ok((h, d, k))
            });
            match (got, want) {
                (Ok((h, d, k)), Ok((wh, wd, wk))) => {
                    assert_eq!((h.as_str(), d.as_str(), k.as_str()), (wh, wd, wk));
                }
                (Err(_), Err(())) => {}
                (got, want) => panic!("{hostname:?} {over:?} {sub:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn long_pod_names_are_truncated() {
        let name = format!("{}-x", "a".repeat(62));
        let p = pod(&name).container("c", "busybox").build();
        let (h, _) = hostname_and_domain(&p, "cluster.local").unwrap();
        assert_eq!(h, "a".repeat(62), "63 characters, trailing '-' trimmed");
    }

    #[test]
    fn mount_unless_the_container_mounts_etc_hosts() {
        let mut p = pod("web").container("c", "busybox").build();
        let ip = vec!["10.88.0.5".to_string()];
        let c = p.spec.as_ref().unwrap().containers[0].clone();
        assert!(should_mount(&p, &c, &ip));
        assert!(!should_mount(&p, &c, &[]), "no pod IP yet");
        p.spec.as_mut().unwrap().host_network = Some(true);
        assert!(should_mount(&p, &c, &[]), "host network needs no pod IP");
        let mut own = c.clone();
        own.volume_mounts = Some(vec![VolumeMount {
            name: "h".into(),
            mount_path: "/etc/hosts".into(),
            ..Default::default()
        }]);
        assert!(!should_mount(&p, &own, &ip));
    }
}
