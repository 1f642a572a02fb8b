//! The start-up sweep of MIG instances a crash left.

use std::collections::BTreeSet;

use super::Claimed;
use crate::gpu::{GpuBackend, MigInstance};

/// One MIG instance destroyed (or not) at startup because no checkpointed claim or applied
/// layout owned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swept {
    /// Parent GPU device name.
    pub gpu: String,
    /// The instance.
    pub instance: MigInstance,
    /// `None` when destroyed; else why it could not be.
    pub error: Option<String>,
}

/// At startup, destroys every MIG instance on the node that neither a checkpointed claim
/// (`claimed`, by identity: [`Claimed::owner`]) nor the node's recorded layout (`kept`:
/// `(GPU UUID, GI ID, MIG UUID)`; GI IDs are reused, so the MIG UUID must match too) owns:
/// what a crash between creating an instance and recording it leaves. Each is logged and
/// returned.
pub fn sweep_unowned(
    backend: &dyn GpuBackend,
    claimed: &Claimed,
    kept: &BTreeSet<(String, u32, String)>,
) -> Vec<Swept> {
    let mut out = Vec::new();
    for gpu in backend.gpus() {
        let Ok(instances) = backend.mig_instances(&gpu.uuid) else {
            continue;
        };
        for inst in instances {
            let mig_uuid = inst
                .compute
                .as_ref()
                .map(|c| c.uuid.clone())
                .unwrap_or_default();
            if claimed.owner(&gpu.uuid, &inst).is_some()
                || kept.contains(&(gpu.uuid.clone(), inst.gi_id, mig_uuid))
            {
                continue;
            }
            let mut error = None;
            if let Some(ci) = &inst.compute {
                if let Err(e) = backend.destroy_compute_instance(&gpu.uuid, inst.gi_id, ci.ci_id) {
                    error = Some(e.to_string());
                }
            }
            if error.is_none() {
                if let Err(e) = backend.destroy_gpu_instance(&gpu.uuid, inst.gi_id) {
                    error = Some(e.to_string());
                }
            }
            match &error {
                None => {
                    tracing::warn!(gpu = %gpu.device_name(), gi = inst.gi_id, placement = %inst.placement, profile = inst.profile.0, "destroyed a MIG instance no claim owns")
                }
                Some(e) => {
                    tracing::error!(gpu = %gpu.device_name(), gi = inst.gi_id, error = %e, "cannot destroy a MIG instance no claim owns")
                }
            }
            out.push(Swept {
                gpu: gpu.device_name(),
                instance: inst,
                error,
            });
        }
    }
    out
}
