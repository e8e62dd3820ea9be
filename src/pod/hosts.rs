//! The pod's agent-managed `/etc/hosts` on disk, as the kubelet's
//! `makeHostsMount` (kubelet_pods.go): the content from
//! [`crate::pod_core::hosts`], written under the pod directory.

use std::path::Path;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;

use crate::pod_core::hosts::{
    ETC_HOSTS_PATH, hostname_and_domain, hosts_file_path, managed_content, node_content,
};

/// Writes the pod's hosts file (mode 0644) under `pod_dir` and returns its
/// mount at `/etc/hosts`, as the kubelet's `makeHostsMount`: the node's hosts
/// file (read from `node_hosts_path`) for `hostNetwork` pods, the managed
/// content otherwise.
///
/// # Errors
/// An invalid hostname, or the node's hosts file or the pod's cannot be read or written.
pub async fn make_hosts_mount(
    pod: &Pod,
    pod_dir: &Path,
    pod_ips: &[String],
    cluster_domain: &str,
    node_hosts_path: &Path,
) -> Result<cri::Mount, String> {
    use std::os::unix::fs::PermissionsExt;
    let spec = pod.spec.as_ref();
    let aliases = spec
        .and_then(|s| s.host_aliases.clone())
        .unwrap_or_default();
    let content = if spec.and_then(|s| s.host_network).unwrap_or(false) {
        let node = tokio::fs::read_to_string(node_hosts_path)
            .await
            .map_err(|e| format!("read {}: {e}", node_hosts_path.display()))?;
        node_content(&node, &aliases)
    } else {
        let (hostname, domain) = hostname_and_domain(pod, cluster_domain)?;
        managed_content(pod_ips, &hostname, &domain, &aliases)
    };
    let path = hosts_file_path(pod_dir);
    let write = async {
        tokio::fs::create_dir_all(pod_dir).await?;
        tokio::fs::write(&path, content).await?;
        tokio::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).await
    };
    write
        .await
        .map_err(|e| format!("write {}: {e}", path.display()))?;
    Ok(cri::Mount {
        container_path: ETC_HOSTS_PATH.into(),
        host_path: path.to_string_lossy().into_owned(),
        selinux_relabel: true,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pod;
    use crate::pod_core::hosts::MANAGED_HEADER_HOST_NETWORK;
    use k8s_openapi::api::core::v1::HostAlias;

    fn alias(ip: &str, names: &[&str]) -> HostAlias {
        HostAlias {
            ip: ip.into(),
            hostnames: Some(names.iter().map(|s| (*s).to_string()).collect()),
        }
    }

    #[tokio::test]
    async fn hosts_file_is_written_under_the_pod_dir() {
        let dir = tempfile::tempdir().unwrap();
        let node_hosts = dir.path().join("node-hosts");
        std::fs::write(&node_hosts, "127.0.0.1 node\n").unwrap();
        let mut p = pod("web").container("c", "busybox").build();
        p.spec.as_mut().unwrap().host_aliases = Some(vec![alias("1.2.3.4", &["foo"])]);
        let pod_dir = dir.path().join("pods/uid-web");
        let ips = vec!["10.88.0.5".to_string()];
        let m = make_hosts_mount(&p, &pod_dir, &ips, "cluster.local", &node_hosts)
            .await
            .unwrap();
        assert_eq!(m.container_path, "/etc/hosts");
        let text = std::fs::read_to_string(pod_dir.join("etc-hosts")).unwrap();
        assert!(text.contains("10.88.0.5\tweb\n"), "{text}");
        assert!(text.ends_with("1.2.3.4\tfoo\n"), "{text}");
        p.spec.as_mut().unwrap().host_network = Some(true);
        make_hosts_mount(&p, &pod_dir, &[], "cluster.local", &node_hosts)
            .await
            .unwrap();
        let text = std::fs::read_to_string(pod_dir.join("etc-hosts")).unwrap();
        assert!(text.starts_with(MANAGED_HEADER_HOST_NETWORK), "{text}");
        assert!(text.contains("127.0.0.1 node\n"), "{text}");
    }
}
