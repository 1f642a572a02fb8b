//! The service's glue to MIG (`strategy/mig/`, where everything MIG is decided and done): the
//! calls a prepare, a release, `list_gpus`, `mig apply` and the start make, each lending the
//! strategy what it reads and changes of the service (`mig_effects.rs`), and the holds and
//! stop guard `mig apply` takes.

use gpushare_proto::{MigApplyParams, MigApplyResult, MigDeviceInfo};

use super::mig_effects::Recovering;
use super::Service;
use crate::claim::{Claim, Device};
use crate::error::ServiceError;
use crate::gpu::{Gpu, MigMode};
use crate::mig::layout::GpuPlan;
use crate::strategy::mig::{self as strategy, Claimed, MigRecovery, MigTarget, RecoverEffects};

/// The claim UID `mig_apply` holds GPUs under while it changes them.
const LAYOUT_HOLDER: &str = "mig-layout";

impl Service {
    /// Writes the intent of slice `t` of claim `uid` ([`strategy::reserve_slice`]).
    pub(super) fn reserve_slice(
        &self,
        uid: &str,
        t: &MigTarget,
    ) -> Result<MigTarget, ServiceError> {
        strategy::reserve_slice(
            self.host.backend.as_ref(),
            &self.host.mig_intents,
            self,
            uid,
            t,
        )
    }

    /// After a claim's release destroyed its slices: MIG mode turned off where gpushare
    /// turned it on for them and nothing is left ([`strategy::leave_mig_mode_after`]).
    pub(super) fn leave_mig_mode_after(&self, info: &Claim) {
        strategy::leave_mig_mode_after(
            self.host.backend.as_ref(),
            &self.host.mig_intents,
            self,
            info,
        );
    }

    /// Turns MIG mode off on a whole-GPU claim's GPU where it is on
    /// ([`strategy::leave_mig_mode`]).
    pub(super) fn leave_mig_mode(&self, d: &Device) -> Result<(), ServiceError> {
        strategy::leave_mig_mode(self.host.backend.as_ref(), d)
    }

    /// Live MIG mode and instances of `gpu`, each with its owner ([`strategy::live_mig`]).
    pub(super) fn live_mig(&self, gpu: &Gpu) -> Option<(MigMode, Vec<MigDeviceInfo>)> {
        strategy::live_mig(self.host.backend.as_ref(), self, gpu)
    }

    /// Plans (`dry_run`) or applies config `config` of a mig-parted v1 file: per selected GPU,
    /// sets MIG mode where the pending mode differs (so a pending change is cancelled by a
    /// config with the mode in effect), destroys the instances it has and creates the
    /// config's, each GPU instance at an explicit placement with one full compute instance. A
    /// plan shows GPUs claims hold with their claims (`held_by`); an apply refuses them and
    /// changes nothing; the GPUs being changed are held meanwhile, so no claim is prepared on
    /// them half-way. A MIG mode change that stays pending (Ampere) is left to a reset by the
    /// operator and said so in the GPU's `note`.
    ///
    /// # Errors
    /// `InvalidConfig` for a bad file, config or profile set; `Conflict` for GPUs held by
    /// claims; `Internal` (naming what was done) when the hardware fails half-way.
    pub fn mig_apply(&self, p: &MigApplyParams) -> Result<MigApplyResult, ServiceError> {
        let backend = self.host.backend.as_ref();
        let (plans, mut out) = strategy::plan_layout(p, || {
            let view = self.records.view.load();
            let claimed = Claimed::of(view.claims.values().map(|c| &**c));
            strategy::gpu_states(backend, &claimed, &view.placement)
        })?;
        if p.dry_run {
            return Ok(MigApplyResult {
                config: p.config.clone(),
                dry_run: true,
                gpus: out,
            });
        }
        strategy::refuse_held(&plans)?;
        // A change like prepare and unprepare: refused while gpushared stops, and waited for
        // (bounded) by the graceful stop.
        let _busy = self.begin_change()?;
        let changing: Vec<&GpuPlan> = plans.iter().filter(|g| !g.is_noop()).collect();
        let holds = strategy::layout_holds(backend, &changing);
        self.admit(LAYOUT_HOLDER, &holds)?;
        let result = strategy::apply_layout(backend, &changing, &mut out);
        self.host.modes.release(backend, &holds);
        if !changing.is_empty() {
            // Even a layout that failed half-way changed MIG devices.
            self.regenerate_driver_spec("after mig apply");
        }
        result?;
        Ok(MigApplyResult {
            config: p.config.clone(),
            dry_run: false,
            gpus: out,
        })
    }

    /// The first pass of the start-up recovery of prepared claims' vanished MIG slices
    /// ([`strategy::recreate_slices`]).
    pub(super) fn recreate_mig_slices(&self) -> Vec<MigRecovery> {
        strategy::recreate_slices(&self.recover_effects(&Recovering(self)))
    }

    /// The second pass, after the driver's spec was generated
    /// ([`strategy::settle_recovered`]).
    pub(super) fn settle_mig_claims(&self, recovered: Vec<MigRecovery>) {
        strategy::settle_recovered(&self.recover_effects(&Recovering(self)), recovered);
    }

    /// Whether every MIG slice `c` records is there as recorded
    /// ([`strategy::slices_intact`]).
    pub(super) fn mig_intact(&self, c: &Claim) -> bool {
        strategy::slices_intact(self.host.backend.as_ref(), c)
    }

    fn recover_effects<'a>(&'a self, claims: &'a Recovering<'a>) -> RecoverEffects<'a> {
        RecoverEffects {
            backend: self.host.backend.as_ref(),
            intents: &self.host.mig_intents,
            driver_spec: self.cfg.driver_spec.as_deref(),
            claims,
        }
    }
}
