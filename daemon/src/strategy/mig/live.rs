//! The node's MIG devices as they are, each with the claim that owns it: for `list_gpus`
//! ([`live_mig`]) and for the planner of a layout `gpushare mig apply` applies
//! ([`gpu_states`]).

use gpushare_proto::MigDeviceInfo;

use super::{Claimed, ClaimsView};
use crate::gpu::{Gpu, GpuBackend, MigMode};
use crate::mig::layout::{GpuState, PlannedInstance};
use crate::mig::MigModel;
use crate::placement::Placement;

/// Live MIG mode (current and pending) and instances of `gpu`, each with the claim that
/// owns it.
pub fn live_mig(
    backend: &dyn GpuBackend,
    claims: &dyn ClaimsView,
    gpu: &Gpu,
) -> Option<(MigMode, Vec<MigDeviceInfo>)> {
    if !gpu.mig_capable {
        return None;
    }
    let model = MigModel::from_product_name(&gpu.product_name)?;
    let mode = backend.mig_mode(&gpu.uuid).ok()?;
    let claimed = claims.claimed(None);
    let devices = backend
        .mig_instances(&gpu.uuid)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|i| {
            let p = model.profile_by_id(i.profile)?;
            let owner = claimed.owner(&gpu.uuid, &i).map(str::to_string);
            let mut d = p.device_info(
                i.compute.map(|c| c.uuid).unwrap_or_default(),
                i.placement.start,
            );
            d.gi_id = Some(i.gi_id);
            d.owner = owner;
            Some(d)
        })
        .collect();
    Some((mode, devices))
}

/// What the layout planner needs to know of each GPU: its MIG model, mode and instances (each
/// with the claim of `claimed` that owns it), and the claims `placement` says hold it.
pub fn gpu_states(
    backend: &dyn GpuBackend,
    claimed: &Claimed,
    placement: &Placement,
) -> Vec<GpuState> {
    backend
        .gpus()
        .iter()
        .map(|g| {
            let model = super::mig_model(g);
            let mode = backend.mig_mode(&g.uuid).unwrap_or_default();
            let instances = model
                .as_ref()
                .map(|&m| {
                    backend
                        .mig_instances(&g.uuid)
                        .unwrap_or_default()
                        .into_iter()
                        .map(|i| PlannedInstance {
                            gi_id: Some(i.gi_id),
                            profile: i.profile,
                            profile_name: m
                                .profile_by_id(i.profile)
                                .map_or_else(|| i.profile.to_string(), |p| p.name.to_string()),
                            placement: i.placement,
                            owner: claimed.owner(&g.uuid, &i).map(str::to_string),
                        })
                        .collect()
                })
                .unwrap_or_default();
            GpuState {
                minor: g.minor,
                name: g.device_name(),
                model,
                mig_enabled: mode.current,
                mig_pending: mode.pending,
                instances,
                claims: placement
                    .hold(&g.uuid)
                    .map(|h| h.claims())
                    .unwrap_or_default(),
            }
        })
        .collect()
}
