//! Applying a claim's plans: each group's strategy on the host (its whole GPUs' setting, then
//! what it makes, through `strategy::group`), then the CDI spec, then the check that the
//! runtime will resolve every ID.

use super::cdi_spec::driver_spec_error;
use super::effects::ClaimGroup;
use super::plan::GroupPlan;
use super::Service;
use crate::claim::{Claim, Group, Request};
use crate::config::ClaimSpec;
use crate::error::ServiceError;

impl Service {
    /// Applies every group's strategy, then writes the CDI spec. Returns the groups as
    /// applied. On error the caller tears the claim down.
    pub(super) fn apply_plans(
        &self,
        spec: &ClaimSpec,
        plans: &[GroupPlan],
        info: &Claim,
    ) -> Result<(Vec<Group>, Vec<Request>), ServiceError> {
        let mut groups = Vec::with_capacity(plans.len());
        for plan in plans {
            // Whole GPUs first leave MIG mode and get what their strategy needs of them (a MIG
            // group's GPUs enter MIG mode as its strategy makes its devices).
            if let Some(whole) = plan.strategy.whole_gpu() {
                for d in &plan.devices {
                    self.leave_mig_mode(d)?;
                }
                for d in &plan.devices {
                    whole.set_up(self.host.backend.as_ref(), &d.uuid, &d.device)?;
                }
                if whole.has_setting() {
                    crate::crash::point("prepare.gpu_settings_applied");
                }
            }
            let group = ClaimGroup::new(self, &spec.uid, &plan.devices);
            let applied = plan.strategy.apply(&group.effects())?;
            let mut info = plan.info(applied);
            // A placement chosen again when its intent was written (a concurrent prepare took
            // the first choice) names another MIG device: the group shows the one it got.
            let slices = info.slices().to_vec();
            for (d, m) in info.devices.iter_mut().zip(&slices) {
                if d.request == m.request && d.device != m.device {
                    d.device = m.device.clone();
                }
            }
            groups.push(info);
        }
        // The driver's device of each device (a MIG device just made makes the spec
        // generate again), then the claim's own spec, then the check that the runtime will
        // resolve every ID and find every device node they name.
        let requests = self
            .prepared_requests(&spec.uid, &groups, &info.requests)
            .map_err(|e| driver_spec_error(&spec.uid, e))?;
        self.write_cdi(&spec.uid, &groups, info)?;
        crate::crash::point("prepare.cdi_written");
        self.verify_cdi(&spec.uid, &requests)
            .map_err(|m| ServiceError::internal(format!("claim {}: {m}", spec.uid)))?;
        Ok((groups, requests))
    }
}
