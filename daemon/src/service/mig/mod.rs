//! The service's side of MIG: planning a claim's MIG devices (their group, `MigGroup`, makes
//! and destroys them), the intents it writes before making one, MIG mode turned off after the
//! last claim it was turned on for, live MIG state for `list_gpus`; `intents` (how gpushared
//! knows what it made), `start` (the start-up sweep) and `layout` (`mig_apply`) beside.

use std::collections::BTreeSet;

use gpushare_proto::{ErrorCode, MigDeviceInfo};

use crate::claim::Claim;

use super::Service;
use crate::config::{ClaimSpec, MpsSettings};
use crate::error::ServiceError;
use crate::gpu::{Gpu, MigMode};
use crate::mig::MigModel;
use crate::strategy::mig::{self as strategy, Claimed, MigGroup, MigTarget};
use crate::strategy::mps::MpsLaunch;

mod intents;
mod mig_apply;
mod start;

pub(super) use intents::{Intent, MigIntents};
pub(super) use start::{honoured_intents, leave_mig_mode_at_start, sweep_at_start};

impl Service {
    /// Resolves a MIG group's devices and checks they can be created now, touching nothing;
    /// with `mps`, plans the daemon on them too.
    pub(super) fn plan_mig(
        &self,
        spec: &ClaimSpec,
        results: &[usize],
        profile: Option<&str>,
        mps: Option<&MpsSettings>,
        requests: &[String],
    ) -> Result<MigGroup, ServiceError> {
        // Slices claims record count as taken even where their instance vanished (a GPU reset,
        // a destroy by hand): they are those claims' until released.
        let claimed = Claimed::of(self.records.view.load().claims.values().map(|c| &**c));
        let mut targets = Vec::with_capacity(results.len());
        for &i in results {
            let r = &spec.results[i];
            let t = strategy::resolve(
                self.host.backend.as_ref(),
                &r.request,
                &r.device,
                profile,
                &claimed,
                &targets,
            )?;
            targets.push(t);
        }
        strategy::check(self.host.backend.as_ref(), &targets, &claimed)?;
        let Some(settings) = mps else {
            return Ok(MigGroup { targets, mps: None });
        };
        let names: Vec<String> = targets.iter().map(|t| t.device.clone()).collect();
        let launch = crate::strategy::mps::plan_launch(
            &spec.uid,
            &self.claim_dir(&spec.uid),
            &names,
            requests,
            settings,
            self.shm_bytes(),
        )?;
        Ok(MigGroup {
            targets,
            mps: Some(MpsLaunch {
                // The MIG UUIDs, once the instances exist.
                visible_devices: Vec::new(),
                ..launch
            }),
        })
    }

    /// Writes `t`'s intent. A placement chosen here (`chosen`) is chosen again under the
    /// intents' lock, from the live instances, the claims' records and the slices other
    /// prepares are making now, so concurrent prepares never pick the same one. The MIG-mode
    /// flag is decided again there too: a prepare that planned while another was turning MIG
    /// mode on saw the mode on already, and must still carry the flag (the other's intent or
    /// record says it, and both are read under that lock).
    pub(super) fn reserve_slice(
        &self,
        uid: &str,
        t: &MigTarget,
    ) -> Result<MigTarget, ServiceError> {
        if !t.chosen {
            // Under the intents' lock, against the claims as they are now: a prepare that
            // planned before another's record named this slice, and reserves after that one
            // struck its intent, must not get the same slice.
            return self.host.mig_intents.reserve_with(uid, &t.gpu_uuid, |_| {
                let view = self.records.view.load();
                let others =
                    Claimed::of(view.claims.values().map(|c| &**c).filter(|c| c.uid != uid));
                let holders = others.holders(&t.gpu_uuid, &t.occupied().placement);
                if holders.is_empty() {
                    return Ok(MigTarget {
                        carries_mode_flag: t.carries_mode_flag
                            || others.mode_enabled_by_gpushare(&t.gpu_uuid),
                        ..t.clone()
                    });
                }
                Err(ServiceError::new(
                    ErrorCode::Conflict,
                    format!(
                        "{}: its memory slices are held by claim(s) {}",
                        t.device,
                        holders.into_iter().collect::<Vec<_>>().join(", ")
                    ),
                ))
            });
        }
        self.host
            .mig_intents
            .reserve_with(uid, &t.gpu_uuid, |busy| {
                let claimed = Claimed::of(self.records.view.load().claims.values().map(|c| &**c));
                let mut again = strategy::repick(self.host.backend.as_ref(), t, &claimed, busy)?;
                again.carries_mode_flag |= claimed.mode_enabled_by_gpushare(&t.gpu_uuid);
                Ok(again)
            })
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
    pub(super) fn leave_mig_mode_after(&self, info: &Claim) {
        let mut gpus: BTreeSet<String> = info
            .groups
            .iter()
            .flat_map(|g| g.slices())
            .filter(|m| m.enabled_mig_mode)
            .map(|m| m.gpu_uuid.clone())
            .collect();
        gpus.extend(self.host.mig_intents.quiet().mode_flagged(&info.uid));
        for gpu in &gpus {
            let quiet = self.host.mig_intents.quiet();
            let view = self.records.view.load();
            let others = Claimed::of(
                view.claims
                    .values()
                    .map(|c| &**c)
                    .filter(|c| c.uid != info.uid),
            );
            if quiet.busy_for_others(gpu, &info.uid) || others.any_on(gpu) {
                continue;
            }
            if let Some(g) = self.host.backend.find(gpu) {
                strategy::mode_off_if_bare(
                    self.host.backend.as_ref(),
                    g,
                    strategy::ModeOffFor::LastRelease,
                );
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
    pub(super) fn check_whole_gpu(&self, gpu: &Gpu) -> Result<(), ServiceError> {
        let Ok(mode) = self.host.backend.mig_mode(&gpu.uuid) else {
            return Ok(());
        };
        if !mode.current && !mode.pending {
            return Ok(());
        }
        let name = gpu.device_name();
        let live = self
            .host
            .backend
            .mig_instances(&gpu.uuid)
            .unwrap_or_default();
        if !live.is_empty() {
            let claimed = Claimed::of(self.records.view.load().claims.values().map(|c| &**c));
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
        if mode.current != mode.pending || !strategy::toggles_without_reset(gpu) {
            return Err(ServiceError::new(
                ErrorCode::Unsupported,
                format!(
                    "{name} is in MIG mode (or a change is pending), and turning it off on this GPU needs a GPU reset, which gpushare never does; a whole-GPU claim cannot have it"
                ),
            ));
        }
        Ok(())
    }

    /// Turns MIG mode off on a whole-GPU claim's GPU where it is on ([`Self::check_whole_gpu`]
    /// admitted it: Hopper, no instances). The claim holds the GPU, so no MIG claim races it.
    pub(super) fn leave_mig_mode(
        &self,
        d: &gpushare_proto::ClaimDevice,
    ) -> Result<(), ServiceError> {
        let Ok(mode) = self.host.backend.mig_mode(&d.uuid) else {
            return Ok(());
        };
        if !mode.current {
            return Ok(());
        }
        let after = self
            .host
            .backend
            .set_mig_mode(&d.uuid, false)
            .map_err(|e| strategy::gpu_err(&format!("{}: disabling MIG mode", d.device), e))?;
        if after.current {
            return Err(ServiceError::new(
                ErrorCode::Unsupported,
                format!("{}: disabling MIG mode stays pending a GPU reset", d.device),
            ));
        }
        tracing::info!(gpu = %d.device, "MIG mode disabled for a whole-GPU claim");
        Ok(())
    }

    /// Live MIG mode (current and pending) and instances of `gpu`, each with the claim that
    /// owns it.
    pub(super) fn live_mig(&self, gpu: &Gpu) -> Option<(MigMode, Vec<MigDeviceInfo>)> {
        if !gpu.mig_capable {
            return None;
        }
        let model = MigModel::from_product_name(&gpu.product_name)?;
        let mode = self.host.backend.mig_mode(&gpu.uuid).ok()?;
        let claimed = Claimed::of(self.records.view.load().claims.values().map(|c| &**c));
        let devices = self
            .host
            .backend
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
}
