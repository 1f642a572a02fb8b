//! MIG mode on a GPU, which gpushare changes only where the GPU needs no reset for it
//! ([`toggles_without_reset`]): checked for a whole-GPU claim ([`check_whole_gpu`]) and turned
//! off for it ([`leave_mig_mode`]); turned off again after the last claim whose slice it was
//! turned on for is released ([`leave_mig_mode_after`]), all through [`mode_off_if_bare`], the
//! one "MIG mode off" path, which a start uses too (`start.rs`).

use std::collections::BTreeSet;

use gpushare_proto::ErrorCode;

use super::{gpu_err, model_of, ClaimsView, MigIntents};
use crate::claim::{Claim, Device};
use crate::error::ServiceError;
use crate::gpu::{Gpu, GpuBackend};
use crate::mig::MigModel;

/// Whether `gpu` enters and leaves MIG mode without a GPU reset (Hopper and later): the one
/// place that says where gpushare may change a GPU's MIG mode at all.
pub fn toggles_without_reset(gpu: &Gpu) -> bool {
    model_of(gpu).is_ok_and(MigModel::reset_free_mode_toggle)
}

/// Why MIG mode was turned off, for the log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeOffFor {
    /// The last claim whose slice it was turned on for is released.
    LastRelease,
    /// A prepare that crashed had turned it on, and nothing is left on the GPU.
    CrashedPrepare,
}

/// The one "MIG mode off" path for a GPU gpushare turned MIG mode on for: turned off when
/// the GPU leaves MIG mode without a reset ([`toggles_without_reset`]), it is on, and no MIG
/// instance is left on it (one made by others keeps the mode as it is). The caller has
/// checked that no claim records or is making a slice there. Logged whatever happens; never
/// an error (the release or start stands).
pub fn mode_off_if_bare(backend: &dyn GpuBackend, gpu: &Gpu, why: ModeOffFor) {
    let name = gpu.device_name();
    if !toggles_without_reset(gpu) {
        return;
    }
    // Off already (a start finishing a release that a kill cut short after this).
    if backend.mig_mode(&gpu.uuid).is_ok_and(|m| !m.current) {
        return;
    }
    match backend.mig_instances(&gpu.uuid) {
        Ok(live) if !live.is_empty() => {
            tracing::info!(gpu = %name, instances = live.len(), "MIG mode stays on: MIG instances gpushare did not make are there");
            return;
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(gpu = %name, error = %e, "reading MIG instances before turning MIG mode off");
            return;
        }
    }
    let what = match why {
        ModeOffFor::LastRelease => "the last MIG claim it was enabled for is released",
        ModeOffFor::CrashedPrepare => {
            "a prepare that crashed had turned it on, and nothing is left on the GPU"
        }
    };
    match backend.set_mig_mode(&gpu.uuid, false) {
        Ok(m) if !m.current => tracing::info!(gpu = %name, "MIG mode disabled: {what}"),
        Ok(_) => tracing::warn!(gpu = %name, "disabling MIG mode stays pending a reset; left so"),
        Err(e) => tracing::error!(gpu = %name, error = %e, "disabling MIG mode ({what})"),
    }
}

/// After a claim's release destroyed its slices (before the release is on disk: a crash
/// in between finishes the release at the next start, which comes here again): on each
/// GPU where one carried `enabled_mig_mode` (gpushare turned MIG mode on for it), or where
/// the claim's own intent says its prepare turned it on (a prepare that failed after
/// turning the mode on, before its slice was recorded), MIG mode is turned off again when
/// no other claim records a slice there, no other claim's slice is being made there, no
/// instance is left (one made by others keeps the mode as it is), and the GPU leaves MIG
/// mode without a reset (Hopper and later; where gpushare could turn it on, it can turn it
/// off). A failure is logged; the release stands.
pub fn leave_mig_mode_after(
    backend: &dyn GpuBackend,
    intents: &MigIntents,
    claims: &dyn ClaimsView,
    info: &Claim,
) {
    let mut gpus: BTreeSet<String> = info
        .groups
        .iter()
        .flat_map(|g| g.slices())
        .filter(|m| m.enabled_mig_mode)
        .map(|m| m.gpu_uuid.clone())
        .collect();
    gpus.extend(intents.quiet().mode_flagged(&info.uid));
    for gpu in &gpus {
        let quiet = intents.quiet();
        let others = claims.claimed(Some(&info.uid));
        if quiet.busy_for_others(gpu, &info.uid) || others.any_on(gpu) {
            continue;
        }
        if let Some(g) = backend.find(gpu) {
            mode_off_if_bare(backend, g, ModeOffFor::LastRelease);
        }
    }
}

/// Checks, touching nothing, that a whole-GPU claim can have `gpu`: a GPU in MIG mode runs
/// no CUDA work on the whole GPU. With MIG instances it is `Conflict` (naming their
/// owners); with none, MIG mode can be turned off at prepare where that needs no reset
/// (Hopper, idle), else `Unsupported`.
///
/// # Errors
/// As above.
pub fn check_whole_gpu(
    backend: &dyn GpuBackend,
    claims: &dyn ClaimsView,
    gpu: &Gpu,
) -> Result<(), ServiceError> {
    let Ok(mode) = backend.mig_mode(&gpu.uuid) else {
        return Ok(());
    };
    if !mode.current && !mode.pending {
        return Ok(());
    }
    let name = gpu.device_name();
    let live = backend.mig_instances(&gpu.uuid).unwrap_or_default();
    if !live.is_empty() {
        let claimed = claims.claimed(None);
        let mut by: Vec<String> = live
            .iter()
            .map(|i| {
                claimed.owner(&gpu.uuid, i).map_or_else(
                    || "the node's MIG layout".to_string(),
                    |c| format!("claim {c}"),
                )
            })
            .collect();
        by.dedup();
        return Err(ServiceError::new(
            ErrorCode::Conflict,
            format!(
                "{name} is partitioned into {} MIG instance(s) (held by {}); a whole-GPU claim cannot have it",
                live.len(),
                by.join(", ")
            ),
        ));
    }
    if mode.current != mode.pending || !toggles_without_reset(gpu) {
        return Err(ServiceError::new(
            ErrorCode::Unsupported,
            format!(
                "{name} is in MIG mode (or a change is pending), and turning it off on this GPU needs a GPU reset, which gpushare never does; a whole-GPU claim cannot have it"
            ),
        ));
    }
    Ok(())
}

/// Turns MIG mode off on a whole-GPU claim's GPU where it is on ([`check_whole_gpu`]
/// admitted it: Hopper, no instances). The claim holds the GPU, so no MIG claim races it.
///
/// # Errors
/// The backend's, naming the device; `Unsupported` where turning MIG mode off stays pending
/// a GPU reset.
pub fn leave_mig_mode(backend: &dyn GpuBackend, d: &Device) -> Result<(), ServiceError> {
    let Ok(mode) = backend.mig_mode(&d.uuid) else {
        return Ok(());
    };
    if !mode.current {
        return Ok(());
    }
    let after = backend
        .set_mig_mode(&d.uuid, false)
        .map_err(|e| gpu_err(&format!("{}: disabling MIG mode", d.device), e))?;
    if after.current {
        return Err(ServiceError::new(
            ErrorCode::Unsupported,
            format!("{}: disabling MIG mode stays pending a GPU reset", d.device),
        ));
    }
    tracing::info!(gpu = %d.device, "MIG mode disabled for a whole-GPU claim");
    Ok(())
}
