//! A CSI driver's Node service for tests, served on a real unix socket: it
//! knows its node (`NodeGetInfo`: node ID `node-1`, 16 volumes, one
//! topology segment), stages (`STAGE_UNSTAGE_VOLUME`), makes the target on
//! publish as a driver does (a directory to mount on, a file for a raw
//! block volume), reports fixed
//! usage (`GET_VOLUME_STATS`: 400 of 1000 bytes used, 600 free; 90 of 100
//! inodes free and a negative used count), and records each call with the
//! paths and contexts it got.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use tonic::{Request, Response, Status};

use crate::proto::csi::node_server::{Node, NodeServer};
use crate::proto::csi::*;

/// The driver; cheap to clone (the clones share the calls).
#[derive(Clone, Default)]
pub struct FakeDriver {
    calls: Arc<Mutex<Vec<String>>>,
}

impl FakeDriver {
    /// Serves a new driver on `socket` until the runtime ends.
    ///
    /// # Panics
    /// The socket cannot be bound.
    pub fn serve(socket: &Path) -> Self {
        let driver = Self::default();
        let listener = tokio::net::UnixListener::bind(socket).expect("bind the driver's socket");
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(NodeServer::new(driver.clone()))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        driver
    }

    /// The calls recorded since the last take, oldest first.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn note(&self, call: String) {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(call);
    }
}

#[tonic::async_trait]
impl Node for FakeDriver {
    async fn node_get_info(
        &self,
        _: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        Ok(Response::new(NodeGetInfoResponse {
            node_id: "node-1".into(),
            max_volumes_per_node: 16,
            accessible_topology: Some(Topology {
                segments: [("topology.test.csi/node".to_string(), "n1".to_string())]
                    .into_iter()
                    .collect(),
            }),
        }))
    }
    async fn node_stage_volume(
        &self,
        r: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let r = r.into_inner();
        let context: BTreeMap<_, _> = r.publish_context.into_iter().collect();
        self.note(format!(
            "stage {} at {} {context:?}",
            r.volume_id, r.staging_target_path
        ));
        Ok(Response::new(NodeStageVolumeResponse {}))
    }
    async fn node_unstage_volume(
        &self,
        r: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let r = r.into_inner();
        self.note(format!(
            "unstage {} at {}",
            r.volume_id, r.staging_target_path
        ));
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }
    async fn node_publish_volume(
        &self,
        r: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let r = r.into_inner();
        // A raw block volume's target is a file, a mounted one's a directory.
        let block = r.volume_capability.as_ref().is_some_and(|c| {
            matches!(c.access_type, Some(volume_capability::AccessType::Block(_)))
        });
        if block {
            std::fs::write(&r.target_path, b"")
        } else {
            std::fs::create_dir_all(&r.target_path)
        }
        .map_err(|e| Status::internal(e.to_string()))?;
        let pod = r
            .volume_context
            .get("csi.storage.k8s.io/pod.name")
            .cloned()
            .unwrap_or_default();
        self.note(format!(
            "publish {} at {} from {} ro={} pod={pod}{}",
            r.volume_id,
            r.target_path,
            r.staging_target_path,
            r.readonly,
            if block { " block" } else { "" }
        ));
        Ok(Response::new(NodePublishVolumeResponse {}))
    }
    async fn node_unpublish_volume(
        &self,
        r: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let r = r.into_inner();
        self.note(format!("unpublish {} at {}", r.volume_id, r.target_path));
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }
    async fn node_get_volume_stats(
        &self,
        r: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let r = r.into_inner();
        self.note(format!(
            "stats {} at {} staged at {}",
            r.volume_id, r.volume_path, r.staging_target_path
        ));
        // Bytes: 1000 in all, 600 free, 400 used; inodes: a negative
        // count (a driver's nonsense) where the used ones should be.
        Ok(Response::new(NodeGetVolumeStatsResponse {
            usage: vec![
                VolumeUsage {
                    available: 600,
                    total: 1000,
                    used: 400,
                    unit: volume_usage::Unit::Bytes.into(),
                },
                VolumeUsage {
                    available: 90,
                    total: 100,
                    used: -1,
                    unit: volume_usage::Unit::Inodes.into(),
                },
            ],
        }))
    }
    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let rpc = |t: node_service_capability::rpc::Type| NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(
                node_service_capability::Rpc { r#type: t.into() },
            )),
        };
        Ok(Response::new(NodeGetCapabilitiesResponse {
            capabilities: vec![
                rpc(node_service_capability::rpc::Type::StageUnstageVolume),
                rpc(node_service_capability::rpc::Type::GetVolumeStats),
            ],
        }))
    }
}
