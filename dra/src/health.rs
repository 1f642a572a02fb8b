//! `v1alpha1.DRAResourceHealth/NodeWatchResources` (only with `--device-health`): the
//! health of every device gpushared reports, as kubelet's `ResourceHealthStatus` gate reads
//! it. A device of a `Degraded` claim (its MPS control daemon died and gpushared is starting
//! it again) is UNHEALTHY until the claim is `Prepared` again; every other device is
//! HEALTHY. Each message is the complete list, sent at start and on every change.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use gpushare_proto::{ClaimInfo, ClaimState, GpuInfo};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::gpushared::Gpushared;
use crate::grpc::health::{
    dra_resource_health_server::DraResourceHealth, DeviceHealth, DeviceIdentifier, HealthStatus,
    NodeWatchResourcesRequest, NodeWatchResourcesResponse,
};

/// The health service.
#[derive(Debug, Clone)]
pub struct HealthService {
    gpushared: Gpushared,
    pool: String,
}

impl HealthService {
    /// Health of the devices of pool `pool` (the node name) as gpushared reports them.
    pub fn new(gpushared: Gpushared, pool: String) -> HealthService {
        HealthService { gpushared, pool }
    }
}

/// Pure: each published device's health, by name, with a message for the unhealthy ones.
pub fn device_health(
    gpus: &[GpuInfo],
    claims: &[ClaimInfo],
) -> BTreeMap<String, (HealthStatus, String)> {
    let mut out: BTreeMap<String, (HealthStatus, String)> = gpushare_slice::devices(gpus)
        .into_iter()
        .map(|d| (d.name, (HealthStatus::Healthy, String::new())))
        .collect();
    for c in claims.iter().filter(|c| c.state == ClaimState::Degraded) {
        for r in &c.requests {
            for d in &r.devices {
                if let Some(h) = out.get_mut(d) {
                    *h = (
                        HealthStatus::Unhealthy,
                        format!(
                            "claim {} is Degraded: its MPS control daemon is being restarted",
                            c.uid
                        ),
                    );
                }
            }
        }
    }
    out
}

type HealthStream = Pin<Box<dyn Stream<Item = Result<NodeWatchResourcesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _request: Request<NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let g = self.gpushared.clone();
        let pool = self.pool.clone();
        tokio::spawn(async move {
            let mut last = None;
            loop {
                if let (Ok(gpus), Ok(claims)) = (g.list_gpus().await, g.list_claims().await) {
                    let now = device_health(&gpus, &claims);
                    if last.as_ref() != Some(&now) {
                        let t = SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(0));
                        let devices = now
                            .iter()
                            .map(|(name, (h, msg))| DeviceHealth {
                                device: Some(DeviceIdentifier {
                                    pool_name: pool.clone(),
                                    device_name: name.clone(),
                                }),
                                health: *h as i32,
                                last_updated_time: t,
                                health_check_timeout_seconds: 30,
                                message: msg.clone(),
                            })
                            .collect();
                        if tx
                            .send(Ok(NodeWatchResourcesResponse { devices }))
                            .await
                            .is_err()
                        {
                            return;
                        }
                        last = Some(now);
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                if tx.is_closed() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_proto::RequestDevices;

    fn gpu(minor: u32) -> GpuInfo {
        serde_json::from_value(serde_json::json!({
            "name": format!("gpu-{minor}"), "minor": minor, "uuid": format!("GPU-{minor}"),
            "product_name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960,
            "compute_mode": "Default", "time_slice": "Default", "sharing": "Free", "claims": []
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn claim(uid: &str, state: ClaimState, device: &str) -> ClaimInfo {
        serde_json::from_value(serde_json::json!({
            "uid": uid, "namespace": "ns", "name": uid, "state": state, "groups": [],
            "requests": [RequestDevices { request: "gpu".into(), cdi_device_ids: vec![], devices: vec![device.into()], per_device: vec![] }],
            "cdi_spec": "", "attach_limit": null, "attached": []
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_degraded_claims_devices_are_unhealthy_and_the_rest_healthy() {
        let gpus = [gpu(0), gpu(1), gpu(2)];
        let claims = [
            claim("a", ClaimState::Degraded, "gpu-1"),
            claim("b", ClaimState::Prepared, "gpu-2"),
        ];
        let h = device_health(&gpus, &claims);
        assert_eq!(h["gpu-0"].0, HealthStatus::Healthy);
        assert_eq!(h["gpu-1"].0, HealthStatus::Unhealthy);
        assert!(h["gpu-1"].1.contains("claim a is Degraded"));
        assert_eq!(h["gpu-2"].0, HealthStatus::Healthy);
        // Back to Prepared: healthy again.
        let h = device_health(&gpus, &[claim("a", ClaimState::Prepared, "gpu-1")]);
        assert_eq!(h["gpu-1"].0, HealthStatus::Healthy);
    }
}
