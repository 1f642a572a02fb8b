//! The start-up sweep of MIG instances a crash left.

use super::Claimed;
use crate::gpu::{GpuBackend, MigInstance};

/// One MIG instance destroyed (or not) at startup: gpushare made it, and no claim owns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swept {
    /// Parent GPU device name.
    pub gpu: String,
    /// The instance.
    pub instance: MigInstance,
    /// `None` when destroyed; else why it could not be.
    pub error: Option<String>,
}

/// At startup, destroys each MIG instance on the node that no checkpointed claim owns
/// (`claimed`, by identity: [`Claimed::owner`]) and that `made_by_us` says gpushare made (the
/// service asks its intents: what a crash between creating an instance and recording it
/// leaves). Every other instance no claim owns was made by someone else (static MIG) and is
/// left as it is, logged once. Each destroyed one is logged and returned.
pub fn sweep_unowned(
    backend: &dyn GpuBackend,
    claimed: &Claimed,
    made_by_us: impl Fn(&str, &MigInstance) -> bool,
) -> Vec<Swept> {
    let mut out = Vec::new();
    for gpu in backend.gpus() {
        let Ok(instances) = backend.mig_instances(&gpu.uuid) else {
            continue;
        };
        for inst in instances {
            if claimed.owner(&gpu.uuid, &inst).is_some() {
                continue;
            }
            if !made_by_us(&gpu.uuid, &inst) {
                tracing::info!(gpu = %gpu.device_name(), gi = inst.gi_id, placement = %inst.placement, profile = inst.profile.0, "MIG instance no claim holds and no claim's prepare made (static MIG: a layout from `gpushare mig apply`, mig-parted or nvidia-smi); left as it is");
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
                    tracing::warn!(gpu = %gpu.device_name(), gi = inst.gi_id, placement = %inst.placement, profile = inst.profile.0, "destroyed a MIG instance gpushare made that no claim records (a crash came between making and recording it)")
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
