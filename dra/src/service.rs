//! The tonic services: `DRAPlugin` in v1 and v1beta1 (wire-identical messages in two
//! packages, both served from one [`Plugin`]) and `pluginregistration.Registration`.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::grpc::{registration as reg, v1, v1beta1};
use crate::metrics::Metrics;
use crate::plugin::{ClaimRef, Plugin, PREPARE, UNPREPARE};
use crate::state::{Registration, State};

/// `DRAPlugin` of one API version over the shared [`Plugin`].
#[derive(Debug, Clone)]
pub struct DraService {
    plugin: Arc<Plugin>,
    metrics: Arc<Metrics>,
}

impl DraService {
    /// The service over `plugin`.
    pub fn new(plugin: Arc<Plugin>, metrics: Arc<Metrics>) -> DraService {
        DraService { plugin, metrics }
    }
}

macro_rules! dra_version {
    ($m:ident, $name:literal) => {
        // v1's Device has `share_id` (left unset); v1beta1's has not.
        #[allow(clippy::needless_update)]
        #[tonic::async_trait]
        impl $m::dra_plugin_server::DraPlugin for DraService {
            async fn node_prepare_resources(
                &self,
                request: Request<$m::NodePrepareResourcesRequest>,
            ) -> Result<Response<$m::NodePrepareResourcesResponse>, Status> {
                let claims = request.into_inner().claims;
                // A call without claims is a health probe's (`gpushare-dra probe`,
                // NVIDIA's): kubelet never sends one, so it is not counted as its traffic.
                if !claims.is_empty() {
                    self.metrics.call(PREPARE, $name);
                }
                let claims = claims.into_iter().map(|c| ClaimRef {
                    namespace: c.namespace,
                    uid: c.uid,
                    name: c.name,
                });
                let answers = self.plugin.prepare(claims.collect()).await;
                let claims = answers
                    .into_iter()
                    .map(|(uid, r)| {
                        let resp = match r {
                            Ok(devices) => $m::NodePrepareResourceResponse {
                                devices: devices
                                    .into_iter()
                                    .map(|d| $m::Device {
                                        request_names: d.request_names,
                                        pool_name: d.pool_name,
                                        device_name: d.device_name,
                                        cdi_device_ids: d.cdi_device_ids,
                                        ..Default::default()
                                    })
                                    .collect(),
                                error: String::new(),
                            },
                            Err(e) => $m::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error: e.message,
                            },
                        };
                        (uid, resp)
                    })
                    .collect();
                Ok(Response::new($m::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$m::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$m::NodeUnprepareResourcesResponse>, Status> {
                self.metrics.call(UNPREPARE, $name);
                let claims = request.into_inner().claims.into_iter().map(|c| ClaimRef {
                    namespace: c.namespace,
                    uid: c.uid,
                    name: c.name,
                });
                let answers = self.plugin.unprepare(claims.collect()).await;
                let claims = answers
                    .into_iter()
                    .map(|(uid, r)| {
                        let error = r.err().map(|e| e.message).unwrap_or_default();
                        (uid, $m::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Ok(Response::new($m::NodeUnprepareResourcesResponse { claims }))
            }
        }
    };
}

dra_version!(v1, "v1");
dra_version!(v1beta1, "v1beta1");

/// `pluginregistration.Registration`: what kubelet asks on our registration socket.
#[derive(Debug, Clone)]
pub struct RegistrationService {
    info: reg::PluginInfo,
    state: Arc<State>,
}

impl RegistrationService {
    /// Answers `GetInfo` with `info`; records kubelet's verdict in `state`.
    pub fn new(info: reg::PluginInfo, state: Arc<State>) -> RegistrationService {
        RegistrationService { info, state }
    }
}

#[tonic::async_trait]
impl reg::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let s = request.into_inner();
        if s.plugin_registered {
            tracing::info!(driver = %self.info.name, endpoint = %self.info.endpoint, "kubelet registered the plugin");
            self.state.set_registration(Registration::Registered);
            Ok(Response::new(reg::RegistrationStatusResponse {}))
        } else {
            tracing::error!(driver = %self.info.name, error = %s.error, "kubelet refused the plugin's registration");
            self.state
                .set_registration(Registration::Refused(s.error.clone()));
            // As the Go helper does: the refusal is stored and answered with an error.
            Err(Status::internal(format!(
                "registration refused by kubelet: {}",
                s.error
            )))
        }
    }
}
