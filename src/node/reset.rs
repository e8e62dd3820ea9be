//! Resetting a node the agent leaves for good, as `kubeadm reset` does for
//! a kubelet's node: every container and sandbox of the runtime stopped and
//! removed (the sandbox's network torn down by the runtime's CNI), the pod
//! and QoS cgroups, the pod directories (volumes and subPath mounts) and pod
//! logs removed, the pods
//! bound to the node deleted with the node's own credentials, and the CNI
//! bridge the pods were attached to deleted; last, the cgroup root itself
//! once the runtime's shims have left it. The Node object too, where the
//! cluster lets a node delete it: the Node authorizer's `system:node` role
//! does not, so the Helm chart deletes companion Nodes from its uninstall
//! hook instead ([`delete_nodes`]), those its approver recorded.
//!
//! The Helm chart's companion node resets itself this way when it stops
//! after its DaemonSet was deleted (`helm uninstall`), and only then: a
//! rolling update keeps the DaemonSet, and the pods keep running for the
//! next agent to adopt ([`uninstalled`]).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use futures::TryStreamExt as _;
use k8s_cri::v1 as cri;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use kube::api::{DeleteParams, ListParams, Preconditions};
use kube::{Api, Client};
use tracing::{info, warn};

use crate::cgroups::CgroupManager;
use crate::cri::Runtime;
use crate::volume::VolumeManager;

/// Seconds each running container gets to stop on a reset (the runtime
/// kills it after), as housekeeping stops an orphaned pod's containers.
const STOP_GRACE_SECONDS: i64 = 2;

/// What a reset did; each step is tried whatever the others did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Containers removed from the runtime.
    pub containers: usize,
    /// Pod sandboxes removed from the runtime.
    pub sandboxes: usize,
    /// Pod directories torn down under the root directory.
    pub pod_dirs: usize,
    /// Pod cgroups removed (the QoS hierarchy goes with them).
    pub pod_cgroups: usize,
    /// True when `<cgroupRoot>` went too (or was the hierarchies' root).
    pub cgroup_root_removed: bool,
    /// Pods bound to the node deleted from the API server.
    pub pods: usize,
    /// True when the Node object was deleted (or was already gone); false
    /// when the node may not delete it (no error then: see the module).
    pub node_deleted: bool,
    /// True when the CNI bridge was deleted (or was not there).
    pub bridge_deleted: bool,
    /// What failed, one line each.
    pub errors: Vec<String>,
}

/// What the agent reads of the DaemonSet it runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// It is there: an update, or a restart.
    There,
    /// It is gone or being deleted.
    Gone,
    /// The credentials that read it no longer may (401 or 403): the
    /// ServiceAccount or its Role was deleted, as `helm uninstall` deletes
    /// them right after the DaemonSet.
    Forbidden,
}

/// Reads DaemonSet `namespace`/`name` with `client` (the chart's
/// ServiceAccount).
///
/// # Errors
/// The API server could not say (unreachable, or an error other than 401
/// and 403).
pub async fn owner(client: &Client, namespace: &str, name: &str) -> kube::Result<Owner> {
    match Api::<DaemonSet>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
    {
        Ok(Some(ds)) if ds.metadata.deletion_timestamp.is_none() => Ok(Owner::There),
        Ok(_) => Ok(Owner::Gone),
        Err(kube::Error::Api(s)) if s.code == 401 || s.code == 403 => Ok(Owner::Forbidden),
        Err(e) => Err(e),
    }
}

/// Whether a stopping agent resets its node, from what it read of its
/// DaemonSet when it started (`at_start`) and now (`now`): when the
/// DaemonSet is gone, or when the permission to read it, which worked at
/// the start, is gone too (an uninstall deletes the ServiceAccount and its
/// Role within the same second as the DaemonSet, before the pod is told to
/// stop). Anything else keeps the pods running. Pure.
#[must_use]
pub fn uninstalled(at_start: Option<Owner>, now: Option<Owner>) -> bool {
    match now {
        Some(Owner::Gone) => true,
        Some(Owner::Forbidden) => at_start == Some(Owner::There),
        Some(Owner::There) | None => false,
    }
}

/// The node a reset works on.
#[derive(Clone, Copy)]
pub struct Target<'a> {
    /// The node's container runtime.
    pub runtime: &'a Runtime,
    /// The volume manager, whose root directory holds the pod directories.
    pub volumes: &'a VolumeManager,
    /// The pod log directory.
    pub pod_logs_dir: &'a Path,
    /// An API client with the node's credentials (a node may delete the
    /// pods bound to it).
    pub client: &'a Client,
    /// The node's name.
    pub node: &'a str,
    /// The CNI bridge to delete, if any.
    pub bridge: Option<&'a str>,
    /// The pod and QoS cgroups (`cgroupsPerQOS`), removed once the pods are.
    pub cgroups: Option<&'a CgroupManager>,
}

/// Resets `target`: see the module's documentation.
pub async fn reset(target: Target<'_>) -> Report {
    let Target {
        runtime,
        volumes,
        pod_logs_dir,
        client,
        node,
        bridge,
        cgroups,
    } = target;
    let mut report = Report::default();
    remove_containers(runtime, &mut report).await;
    remove_sandboxes(runtime, &mut report).await;
    if let Some(cgroups) = cgroups {
        match cgroups.remove_all() {
            Ok(n) => report.pod_cgroups = n,
            Err(e) => report.errors.push(format!("remove the pod cgroups: {e}")),
        }
    }
    let (empty, _writer) = kube::runtime::reflector::store::<Pod>();
    report.pod_dirs = volumes.cleanup_orphans(&empty, |_| false).await;
    crate::container_gc::remove_orphaned_log_dirs(pod_logs_dir, |_| false);
    delete_pods(client, node, &mut report).await;
    match Api::<Node>::all(client.clone())
        .delete(node, &DeleteParams::default())
        .await
    {
        Ok(_) => report.node_deleted = true,
        Err(kube::Error::Api(s)) if s.code == 404 => report.node_deleted = true,
        Err(kube::Error::Api(s)) if s.code == 403 => {
            info!(
                node,
                "the node may not delete its Node object: left to whoever may"
            );
        }
        Err(e) => report.errors.push(format!("delete node {node}: {e}")),
    }
    match bridge {
        Some(name) => match delete_link(name).await {
            Ok(()) => report.bridge_deleted = true,
            Err(e) => report.errors.push(format!("delete bridge {name}: {e}")),
        },
        None => report.bridge_deleted = true,
    }
    // Last, and for a few seconds: the runtime's shims leave the cgroup root
    // as they see their pods removed.
    report.cgroup_root_removed = match cgroups {
        Some(cgroups) => {
            let mut removed = cgroups.remove_root();
            for _ in 0..10 {
                if removed {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                removed = cgroups.remove_root();
            }
            removed
        }
        None => true,
    };
    info!(
        containers = report.containers,
        sandboxes = report.sandboxes,
        pod_dirs = report.pod_dirs,
        pod_cgroups = report.pod_cgroups,
        cgroup_root_removed = report.cgroup_root_removed,
        pods = report.pods,
        node_deleted = report.node_deleted,
        bridge_deleted = report.bridge_deleted,
        errors = report.errors.len(),
        "node reset"
    );
    report
}

/// Deletes every Node named by a key of ConfigMap `namespace`/`record`,
/// then the ConfigMap, with `client` (the chart's uninstall hook, which may
/// delete Nodes and that one ConfigMap); returns the names deleted. The
/// record is the one `rustlet approve-csrs` keeps of the companion nodes it
/// approved ([`crate::csr_approver`]): a node cannot write it, as it can
/// label itself, so only Nodes this release made are deleted. A missing
/// record deletes nothing; a Node already gone is no error.
///
/// # Errors
/// Reading the record failed, or a delete other than a 404 did (the record
/// is then kept, for the hook's next try).
pub async fn delete_nodes(
    client: &Client,
    namespace: &str,
    record: &str,
) -> kube::Result<Vec<String>> {
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let Some(recorded) = configmaps.get_opt(record).await? else {
        return Ok(Vec::new());
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let mut deleted = Vec::new();
    for name in recorded.data.unwrap_or_default().into_keys() {
        match nodes.delete(&name, &DeleteParams::default()).await {
            Ok(_) => deleted.push(name),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    match configmaps.delete(record, &DeleteParams::default()).await {
        Ok(_) => Ok(deleted),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(deleted),
        Err(e) => Err(e),
    }
}

/// Stops (at most [`STOP_GRACE_SECONDS`]) and removes every container,
/// concurrently.
async fn remove_containers(runtime: &Runtime, report: &mut Report) {
    let containers = match runtime.list_containers(HashMap::new()).await {
        Ok(c) => c,
        Err(e) => {
            report.errors.push(format!("list containers: {e}"));
            return;
        }
    };
    let results = futures::future::join_all(containers.iter().map(|c| async move {
        if c.state == cri::ContainerState::ContainerRunning as i32 {
            runtime.stop_container(&c.id, STOP_GRACE_SECONDS).await?;
        }
        runtime.remove_container(&c.id).await
    }))
    .await;
    for (c, r) in containers.iter().zip(results) {
        match r {
            Ok(()) => report.containers += 1,
            Err(e) => report
                .errors
                .push(format!("remove container {}: {e}", c.id)),
        }
    }
}

/// Stops and removes every pod sandbox (the runtime tears its network down).
async fn remove_sandboxes(runtime: &Runtime, report: &mut Report) {
    let sandboxes = match runtime.list_pod_sandboxes(HashMap::new()).await {
        Ok(s) => s,
        Err(e) => {
            report.errors.push(format!("list pod sandboxes: {e}"));
            return;
        }
    };
    for s in sandboxes {
        let removed = async {
            runtime.stop_pod_sandbox(&s.id).await?;
            runtime.remove_pod_sandbox(&s.id).await
        };
        match removed.await {
            Ok(()) => report.sandboxes += 1,
            Err(e) => report
                .errors
                .push(format!("remove pod sandbox {}: {e}", s.id)),
        }
    }
}

/// Deletes every pod bound to `node` at once (grace period 0, this very
/// pod: a UID precondition), as the kubelet's status manager deletes a pod
/// whose containers have stopped.
async fn delete_pods(client: &Client, node: &str, report: &mut Report) {
    let bound = ListParams::default().fields(&format!("spec.nodeName={node}"));
    let pods = match Api::<Pod>::all(client.clone()).list(&bound).await {
        Ok(list) => list.items,
        Err(e) => {
            report
                .errors
                .push(format!("list the pods of node {node}: {e}"));
            return;
        }
    };
    for pod in pods {
        let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
            continue;
        };
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match Api::<Pod>::namespaced(client.clone(), ns)
            .delete(name, &params)
            .await
        {
            Ok(_) => report.pods += 1,
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => {
                warn!(pod = %format!("{ns}/{name}"), error = %e, "reset: delete pod");
                report.errors.push(format!("delete pod {ns}/{name}: {e}"));
            }
        }
    }
}

/// Deletes network link `name` of the agent's network namespace, if there.
///
/// # Errors
/// The netlink socket could not be opened, or the kernel refused.
async fn delete_link(name: &str) -> Result<(), String> {
    let (connection, handle, _) = rtnetlink::new_connection().map_err(|e| e.to_string())?;
    let task = tokio::spawn(connection);
    let result = async {
        let mut links = handle.link().get().match_name(name.to_string()).execute();
        match links.try_next().await {
            Ok(Some(link)) => handle
                .link()
                .del(link.header.index)
                .execute()
                .await
                .map_err(|e| e.to_string()),
            Ok(None) => Ok(()),
            // No such device: nothing to delete.
            Err(rtnetlink::Error::NetlinkError(e))
                if e.code.map(|c| c.get()) == Some(-libc_enodev()) =>
            {
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }
    .await;
    task.abort();
    result
}

/// `ENODEV`, which the kernel answers for a link name it does not know.
fn libc_enodev() -> i32 {
    rustix::io::Errno::NODEV.raw_os_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_gone_daemonset_or_a_lost_permission_that_worked_is_an_uninstall() {
        use Owner::{Forbidden, Gone, There};
        assert!(uninstalled(Some(There), Some(Gone)));
        assert!(uninstalled(None, Some(Gone)));
        assert!(uninstalled(Some(There), Some(Forbidden)));
        // Never allowed: a misconfiguration, not an uninstall.
        assert!(!uninstalled(Some(Forbidden), Some(Forbidden)));
        assert!(!uninstalled(None, Some(Forbidden)));
        // There, or not known now: the pods keep running.
        assert!(!uninstalled(Some(There), Some(There)));
        assert!(!uninstalled(Some(There), None));
    }
}
