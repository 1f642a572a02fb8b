//! Applying a claim plans: each group strategy on the host, then the CDI spec, then the check
//! that the runtime will resolve every ID.

use super::*;

impl Service {
    /// Applies every group's strategy, then writes the CDI spec. Returns the groups as
    /// applied. On error the caller tears the claim down.
    pub(super) fn apply(
        &self,
        spec: &ClaimSpec,
        plans: &[GroupPlan],
        info: &ClaimInfo,
    ) -> Result<(Vec<GroupInfo>, Vec<RequestDevices>), ServiceError> {
        let mut groups = Vec::with_capacity(plans.len());
        for plan in plans {
            if !matches!(plan.kind, PlanKind::Mig { .. }) {
                for d in &plan.devices {
                    self.leave_mig_mode(d)?;
                }
            }
            // Whole GPUs first get what their strategy needs of them (a MIG group's GPUs
            // enter MIG mode as its devices are made, below).
            if let Some(strategy) = plan.kind.whole_gpu_strategy() {
                for d in &plan.devices {
                    strategy.set_up(self.backend.as_ref(), &d.uuid, &d.device)?;
                }
                if !matches!(plan.kind, PlanKind::Exclusive) {
                    crate::crash::point("prepare.gpu_settings_applied");
                }
            }
            let started = match &plan.kind {
                PlanKind::Exclusive | PlanKind::TimeSlicing(_) => None,
                PlanKind::Mps(launch) => {
                    let started = self
                        .mps
                        .start(launch)
                        .map_err(|e| ServiceError::internal(format!("claim {}: {e}", spec.uid)))?;
                    crate::crash::point("prepare.mps_started");
                    // Record the pid at once, so that a failure later in this prepare stops
                    // this daemon too.
                    if let Some(c) = self.state().claims.get_mut(&spec.uid) {
                        if let Some(g) = c.groups.iter_mut().find(|g| g.devices == plan.devices) {
                            g.sharing = StrategyInfo::Mps(started.clone());
                        }
                    }
                    Some(started)
                }
                PlanKind::Mig { targets, mps } => {
                    let records = self.create_mig(&spec.uid, plan, targets)?;
                    let started = match mps {
                        None => None,
                        Some(launch) => {
                            let launch = MpsLaunch {
                                visible_devices: records.iter().map(|r| r.uuid.clone()).collect(),
                                ..launch.clone()
                            };
                            let started = self.mps.start(&launch).map_err(|e| {
                                ServiceError::internal(format!("claim {}: {e}", spec.uid))
                            })?;
                            crate::crash::point("prepare.mps_started");
                            if let Some(c) = self.state().claims.get_mut(&spec.uid) {
                                if let Some(g) =
                                    c.groups.iter_mut().find(|g| g.devices == plan.devices)
                                {
                                    g.sharing = StrategyInfo::Mps(started.clone());
                                }
                            }
                            Some(started)
                        }
                    };
                    let mut g = self.group_info(plan, started);
                    g.mig = records;
                    groups.push(g);
                    continue;
                }
            };
            groups.push(self.group_info(plan, started));
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
