//! A DRA driver's kubelet plugin for tests, served on a real unix socket
//! (`v1.DRAPlugin`, or `v1beta1.DRAPlugin`, and `v1.DRAResourceHealth`,
//! whose stream sends the health [`FakeDraDriver::set_health`] gives, as
//! one message each time): each claim it prepares gets
//! one device, `gpu-0` of pool `node-1`, serving every request, with the
//! CDI device `<vendor>/gpu=<claim UID>`; what it answers can be scripted
//! (an error, no answer for a claim, a given CDI device name, no answer at
//! all), and it records each call with the claims it got.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use tokio_stream::StreamExt as _;
use tonic::{Request, Response, Status};

use crate::proto::dra::{health_v1, v1, v1beta1};

/// How the driver answers `NodePrepareResources`.
#[derive(Clone, Debug, Default)]
pub enum Answer {
    /// One device per claim.
    #[default]
    Devices,
    /// This error for every claim.
    ClaimError(String),
    /// This gRPC error for the call.
    CallError(String),
    /// Answers for no claim.
    Nothing,
    /// One device per claim, with this CDI device name.
    CdiDevice(String),
    /// Never answers.
    Hang,
}

/// The driver; cheap to clone (the clones share the script and calls).
#[derive(Clone)]
pub struct FakeDraDriver {
    vendor: String,
    answer: Arc<Mutex<Answer>>,
    calls: Arc<Mutex<Vec<String>>>,
    /// The devices' health: (device of pool `node-1`, health, message).
    health: Arc<tokio::sync::watch::Sender<Vec<(String, i32, String)>>>,
    /// How many connections it accepted.
    accepted: Arc<std::sync::atomic::AtomicUsize>,
}

impl Default for FakeDraDriver {
    fn default() -> Self {
        Self {
            vendor: String::new(),
            answer: Arc::default(),
            calls: Arc::default(),
            health: Arc::new(tokio::sync::watch::channel(Vec::new()).0),
            accepted: Arc::default(),
        }
    }
}

impl FakeDraDriver {
    /// Serves a driver whose CDI devices are of vendor `vendor`, on
    /// `socket`, as `v1.DRAPlugin` (`v1beta1`: `v1beta1.DRAPlugin`), until
    /// the runtime ends.
    ///
    /// # Panics
    /// The socket cannot be bound.
    pub fn serve(socket: &Path, vendor: &str, v1beta1: bool) -> Self {
        let driver = Self {
            vendor: vendor.to_string(),
            ..Self::default()
        };
        let listener = tokio::net::UnixListener::bind(socket).expect("bind the DRA socket");
        let accepted = driver.accepted.clone();
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener).map(move |c| {
            accepted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            c
        });
        let router = if v1beta1 {
            tonic::transport::Server::builder().add_service(
                v1beta1::dra_plugin_server::DraPluginServer::new(driver.clone()),
            )
        } else {
            tonic::transport::Server::builder()
                .add_service(v1::dra_plugin_server::DraPluginServer::new(driver.clone()))
        }
        .add_service(
            health_v1::dra_resource_health_server::DraResourceHealthServer::new(driver.clone()),
        );
        tokio::spawn(router.serve_with_incoming(incoming));
        driver
    }

    /// Sends the health of its devices (of pool `node-1`): (device, wire
    /// health: 0 unknown, 1 healthy, 2 unhealthy, message).
    pub fn set_health(&self, devices: &[(&str, i32, &str)]) {
        self.health.send_replace(
            devices
                .iter()
                .map(|(d, h, m)| ((*d).to_string(), *h, (*m).to_string()))
                .collect(),
        );
    }

    /// How many connections it accepted.
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Answers `NodePrepareResources` as `answer` says from now on.
    pub fn answer(&self, answer: Answer) {
        *self.answer.lock().unwrap_or_else(PoisonError::into_inner) = answer;
    }

    /// The calls since the last look, as `<method> <ns>/<claim>,…`.
    pub fn take_calls(&self) -> Vec<String> {
        std::mem::take(&mut *self.calls.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn record(&self, method: &str, claims: &[(String, String)]) {
        let names: Vec<String> = claims.iter().map(|(ns, n)| format!("{ns}/{n}")).collect();
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(format!("{method} {}", names.join(",")));
    }

    /// The answer for claims `uids`: (claim UID, its devices' CDI names or
    /// its error), or the call's error.
    async fn prepared(
        &self,
        uids: Vec<String>,
    ) -> Result<Vec<(String, Result<String, String>)>, Status> {
        let answer = self
            .answer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match answer {
            Answer::Devices => Ok(uids
                .into_iter()
                .map(|u| {
                    let id = format!("{}/gpu={u}", self.vendor);
                    (u, Ok(id))
                })
                .collect()),
            Answer::CdiDevice(id) => Ok(uids.into_iter().map(|u| (u, Ok(id.clone()))).collect()),
            Answer::ClaimError(e) => Ok(uids.into_iter().map(|u| (u, Err(e.clone()))).collect()),
            Answer::CallError(e) => Err(Status::internal(e)),
            Answer::Nothing => Ok(Vec::new()),
            Answer::Hang => std::future::pending().await,
        }
    }
}

/// The server of API module `$api` (`v1`, `v1beta1`, of the same
/// messages), each prepared device made by `$device` from its CDI name.
macro_rules! serve_api {
    ($api:ident, $device:expr) => {
        #[tonic::async_trait]
        impl $api::dra_plugin_server::DraPlugin for FakeDraDriver {
            async fn node_prepare_resources(
                &self,
                r: Request<$api::NodePrepareResourcesRequest>,
            ) -> Result<Response<$api::NodePrepareResourcesResponse>, Status> {
                let claims = r.into_inner().claims;
                let named: Vec<(String, String)> = claims
                    .iter()
                    .map(|c| (c.namespace.clone(), c.name.clone()))
                    .collect();
                self.record("NodePrepareResources", &named);
                let uids = claims.into_iter().map(|c| c.uid).collect();
                let claims = self
                    .prepared(uids)
                    .await?
                    .into_iter()
                    .map(|(uid, outcome)| {
                        let r = match outcome {
                            Ok(cdi) => $api::NodePrepareResourceResponse {
                                devices: vec![$device(cdi)],
                                error: String::new(),
                            },
                            Err(error) => $api::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error,
                            },
                        };
                        (uid, r)
                    })
                    .collect();
                Ok(Response::new($api::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                r: Request<$api::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$api::NodeUnprepareResourcesResponse>, Status> {
                let claims = r.into_inner().claims;
                let named: Vec<(String, String)> = claims
                    .iter()
                    .map(|c| (c.namespace.clone(), c.name.clone()))
                    .collect();
                self.record("NodeUnprepareResources", &named);
                let claims = claims
                    .into_iter()
                    .map(|c| (c.uid, $api::NodeUnprepareResourceResponse::default()))
                    .collect();
                Ok(Response::new($api::NodeUnprepareResourcesResponse {
                    claims,
                }))
            }
        }
    };
}

serve_api!(v1, |cdi| v1::Device {
    request_names: Vec::new(),
    pool_name: "node-1".into(),
    device_name: "gpu-0".into(),
    cdi_device_ids: vec![cdi],
    share_id: None,
});

serve_api!(v1beta1, |cdi| v1beta1::Device {
    request_names: Vec::new(),
    pool_name: "node-1".into(),
    device_name: "gpu-0".into(),
    cdi_device_ids: vec![cdi],
});

#[tonic::async_trait]
impl health_v1::dra_resource_health_server::DraResourceHealth for FakeDraDriver {
    type NodeWatchResourcesStream = std::pin::Pin<
        Box<
            dyn tokio_stream::Stream<Item = Result<health_v1::NodeWatchResourcesResponse, Status>>
                + Send,
        >,
    >;

    async fn node_watch_resources(
        &self,
        _: Request<health_v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        let updates = tokio_stream::wrappers::WatchStream::new(self.health.subscribe());
        let stream = updates.map(|devices| {
            Ok(health_v1::NodeWatchResourcesResponse {
                devices: devices
                    .into_iter()
                    .map(|(device, health, message)| health_v1::DeviceHealth {
                        device: Some(health_v1::DeviceIdentifier {
                            pool_name: "node-1".into(),
                            device_name: device,
                        }),
                        health,
                        last_updated_time: 0,
                        health_check_timeout_seconds: 0,
                        message,
                    })
                    .collect(),
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
