//! The end of a pod on this node, as the kubelet's `SyncTerminatedPod` and
//! the status manager's final delete: its final status, its volumes and
//! directory torn down, its ResourceClaims unprepared, the Pod object
//! deleted, and the managers forgetting it.

use k8s_openapi::api::core::v1::Pod;
use tracing::info;

use super::context::{Context, Error, Result};
use crate::pod_core::facts::pod_identity;
use crate::pod_core::kind::PodKind;
use crate::pod_core::status;

/// The end of a terminated pod whose containers and sandboxes are removed:
/// its final status is written ([`status::terminated_status`]), its volumes
/// and directory go, the status manager deletes the Pod object, and the
/// managers forget it.
///
/// # Errors
/// The teardown or the delete failed.
pub async fn delete(pod: &Pod, kind: PodKind, ctx: &Context) -> Result<()> {
    let (ns, name, uid) = pod_identity(pod);
    if kind.is_static {
        return finish_static(pod, ctx).await;
    }
    // The final status first: a pod kept by a finalizer shows how it ended.
    // A pod already gone (force-deleted meanwhile) needs none.
    let last = pod.status.clone().unwrap_or_default();
    match ctx
        .status()
        .set_status(pod, status::terminated_status(pod, &last))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(source) => {
            return Err(Error::Api {
                pod: format!("{ns}/{name}"),
                source,
            });
        }
    }
    teardown(pod, ctx).await?;
    ctx.status()
        .delete(pod)
        .await
        .map_err(|source| Error::Api {
            pod: format!("{ns}/{name}"),
            source,
        })?;
    info!("pod terminated and deleted");
    forget(&uid, ctx);
    Ok(())
}

/// Tears down the volumes and directory of pod `pod`, then unprepares its
/// ResourceClaims, as the kubelet's `SyncTerminatedPod`.
///
/// # Errors
/// The teardown or the unprepare failed.
async fn teardown(pod: &Pod, ctx: &Context) -> Result<()> {
    let (ns, name, uid) = pod_identity(pod);
    ctx.volumes()
        .teardown(&uid)
        .await
        .map_err(|source| Error::Volume {
            pod: format!("{ns}/{name}"),
            source,
        })?;
    ctx.dra()
        .unprepare(pod)
        .await
        .map_err(|message| Error::Dra {
            pod: format!("{ns}/{name}"),
            message,
        })
}

/// The managers forget pod `uid`, which has ended here.
fn forget(uid: &str, ctx: &Context) {
    if let Some(devices) = ctx.devices() {
        devices.release(|u| u != uid);
    }
    ctx.images().forget(uid);
    ctx.userns().release(uid);
    ctx.prober().forget(uid);
}

/// The end of a stopped static pod (its manifest went or changed): its
/// volumes go, it leaves the pod sources (the manifest's new
/// version, if any, starts in its place; housekeeping deletes a mirror pod
/// left without a static pod), and the managers forget it, so that the same
/// manifest put back runs it anew.
///
/// # Errors
/// The teardown failed.
pub async fn finish_static(pod: &Pod, ctx: &Context) -> Result<()> {
    teardown(pod, ctx).await?;
    ctx.sources().finished(pod);
    info!("static pod stopped");
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    ctx.status().forget(pod);
    ctx.admission().retain(|u| u != uid);
    forget(uid, ctx);
    Ok(())
}
