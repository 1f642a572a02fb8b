//! The reading requests: one claim, all claims, the GPUs, health. Served from the published
//! view: they never wait for a change.

use std::sync::Arc;

use gpushare_proto::{ErrorCode, GpuInfo, GpuSharing, HealthInfo};

use super::super::Service;
use crate::claim::{Claim, Phase};
use crate::config;
use crate::error::ServiceError;

impl Service {
    /// One claim, as the published view holds it (shared, not copied).
    ///
    /// # Errors
    /// `InvalidRequest` for a malformed UID, `NotFound`.
    pub fn claim(&self, uid: &str) -> Result<Arc<Claim>, ServiceError> {
        config::validate_claim_uid(uid)?;
        self.records
            .view
            .load()
            .claims
            .get(uid)
            .cloned()
            .ok_or_else(|| {
                ServiceError::new(ErrorCode::NotFound, format!("no claim {uid} on this node"))
            })
    }

    /// All claims, by UID, as the published view holds them.
    pub fn claims(&self) -> Vec<Arc<Claim>> {
        self.records.view.load().claims.values().cloned().collect()
    }

    /// Up to `n` claims after the UID `after` (from the first when `None`), in UID order, as
    /// the published view holds them (shared, not copied): how `list_claims` answers are read,
    /// a few claims at a time, so that no answer holds the whole registry.
    pub fn claims_after(&self, after: Option<&str>, n: usize) -> Vec<Arc<Claim>> {
        use std::ops::Bound;
        let view = self.records.view.load();
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        view.claims
            .range::<_, str>((from, Bound::Unbounded))
            .take(n)
            .map(|(_, c)| Arc::clone(c))
            .collect()
    }

    /// All GPUs with their settings and holders.
    pub fn list_gpus(&self) -> Vec<GpuInfo> {
        let st = self.records.view.load();
        self.host
            .backend
            .gpus()
            .iter()
            .map(|g| {
                let hold = st.placement.hold(&g.uuid);
                let mut info = GpuInfo {
                    compute_mode: self.host.backend.compute_mode(&g.uuid).unwrap_or_default(),
                    time_slice: self.host.backend.time_slice(&g.uuid).unwrap_or_default(),
                    sharing: hold.map_or(GpuSharing::Free, |h| h.sharing()),
                    claims: hold.map(|h| h.claims()).unwrap_or_default(),
                    ..g.info()
                };
                // MIG mode and instances change at runtime: read them live.
                if let Some((mode, devices)) = self.live_mig(g) {
                    info.mig_enabled = mode.current;
                    info.mig_pending = Some(mode.pending);
                    info.mig_devices = devices;
                    info.mig_partitions = crate::mig::partitions::for_gpu(
                        &g.product_name,
                        mode.current,
                        mode.pending,
                        &info.mig_devices,
                    );
                }
                info
            })
            .collect()
    }

    /// Liveness and readiness.
    pub fn health(&self) -> HealthInfo {
        let st = self.records.view.load();
        HealthInfo {
            ready: st.ready,
            node_name: self.cfg.node_name.clone(),
            gpus: self.host.backend.gpus().len(),
            claims: st.claims.len(),
            backend: self.host.backend.describe(),
            mps_control: self.host.mps.program().display().to_string(),
            checkpoint_quarantined: st.quarantined.clone(),
            quarantined_records: st.quarantined_records.clone(),
            checkpoint_error: st.checkpoint_error.clone(),
            degraded_claims: st
                .claims
                .values()
                .filter(|c| c.phase == Phase::Degraded)
                .count(),
            stopping: st.stopping,
            drivers: self.cfg.drivers.clone(),
            driver_spec: self.cfg.driver_spec.as_ref().map(|d| {
                let s = d.status();
                gpushare_proto::DriverSpecHealth {
                    path: s.path.display().to_string(),
                    generator: s.generator,
                    ok: s.ok,
                    error: s.error,
                    failures: s.failures,
                    retry_in_seconds: s.retry_in.map(crate::driver_spec::retry::ceil_secs),
                    generate_timeout_seconds: s.timeout.map(|t| t.as_secs()),
                }
            }),
        }
    }
}
