//! A MIG device group: its slices made (or taken, static MIG) by a prepare, each recorded the
//! moment its GPU instance exists, then an MPS control daemon on them where the claim asks
//! for one; a release stops that daemon and then destroys the slices it ran on.

use super::{create, destroy, Mig, MigTarget};
use crate::claim::{Group, MigSharing, MigSlice, Sharing};
use crate::error::ServiceError;
use gpushare_core::Want;

use crate::cdi::{self, ContainerEdits};
use crate::gpu::GpuBackend;
use crate::strategy::group::{
    node_edit, whole_gpu_edits, Applied, GpuHold, GroupEffects, GroupLife, GroupStrategy, Revival,
};
use crate::strategy::mps::{self, MpsLaunch};
use crate::strategy::Strategy;

/// A group of MIG devices, with an MPS control daemon on them when the claim's config is MPS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigGroup {
    /// The slices, resolved against the node, in the order of the group's devices.
    pub targets: Vec<MigTarget>,
    /// The daemon on the slices; its `visible_devices` become the MIG UUIDs once they exist.
    pub mps: Option<MpsLaunch>,
}

impl GroupStrategy for MigGroup {
    /// `None`: a MIG group's GPUs hold MIG devices, not the group; MIG mode is entered as its
    /// first slice is made.
    fn whole_gpu(&self) -> Option<&dyn Strategy> {
        None
    }

    /// No slice yet; until the daemon runs, an MPS group's record holds its directories and
    /// pid 0.
    fn planned(&self) -> Sharing {
        Sharing::Mig(MigSharing {
            slices: Vec::new(),
            mps: self.mps.as_ref().map(mps::planned_record),
        })
    }

    fn apply(&self, fx: &GroupEffects<'_>) -> Result<Applied, ServiceError> {
        let records = make_slices(fx, &self.targets)?;
        let mps = match &self.mps {
            None => None,
            Some(launch) => {
                let launch = MpsLaunch {
                    visible_devices: records.iter().map(|r| r.uuid.clone()).collect(),
                    ..launch.clone()
                };
                Some(mps::start_recorded(fx, &launch)?)
            }
        };
        Ok(Applied {
            sharing: Sharing::Mig(MigSharing {
                slices: records,
                mps,
            }),
        })
    }
}

/// Creates (or takes, static MIG) a group's MIG devices, recording each GPU instance in the
/// claim on disk the moment it exists, so that a failure or a crash anywhere after lets the
/// release destroy it (with whatever compute instance it holds by then). Each slice's intent
/// is written first (struck at the prepare's end) and marked with the GPU-instance ID: what
/// covers a crash before the record is on disk. A placement chosen at planning that a
/// concurrent prepare is making is chosen again.
fn make_slices(
    fx: &GroupEffects<'_>,
    targets: &[MigTarget],
) -> Result<Vec<MigSlice>, ServiceError> {
    let mut done: Vec<MigSlice> = Vec::with_capacity(targets.len());
    for t in targets {
        let mut t = fx.intents.reserve(t)?;
        // A slice after one that turned MIG mode on carries the flag as well.
        t.carries_mode_flag |= done
            .iter()
            .any(|d| d.gpu_uuid == t.gpu_uuid && d.enabled_mig_mode);
        crate::crash::point("prepare.mig_intent_saved");
        let rec = create(
            fx.backend,
            &t,
            || fx.intents.entering_mig_mode(&t),
            |partial| {
                fx.intents.made(partial);
                crate::crash::point("prepare.mig_gpu_instance_created");
                fx.record.mig_made(partial)
            },
        )?;
        fx.record.mig(&rec);
        crate::crash::point("prepare.mig_compute_created");
        done.push(rec);
    }
    Ok(done)
}

impl GroupLife for Mig {
    /// Each parent GPU once, as `Mig`, under its whole GPU's device name: MIG devices of one
    /// GPU share it with other claims' slices.
    fn holds(&self, group: &Group) -> Vec<GpuHold> {
        let mut out: Vec<GpuHold> = Vec::new();
        for d in &group.devices {
            if !out.iter().any(|(u, _, _)| *u == d.uuid) {
                out.push((d.uuid.clone(), format!("gpu-{}", d.minor), Want::Mig));
            }
        }
        out
    }

    /// The parent GPUs' nodes, each slice's capability nodes (once its compute instance
    /// exists), and the MPS control daemon on the slices, if any.
    fn edits(&self, node: &dyn GpuBackend, group: &Group, request: &str) -> ContainerEdits {
        let mut edits = whole_gpu_edits(node, group, request);
        for m in group.slices().iter().filter(|m| m.request == request) {
            if let (Some(gpu), Some(ci)) = (node.find(&m.gpu_uuid), m.ci_id) {
                for n in node.mig_device_nodes(gpu, m.gi_id, ci) {
                    cdi::merge(&mut edits, node_edit(&n));
                }
            }
        }
        cdi::merge(&mut edits, mps::daemon_edits(group, request));
        edits
    }

    /// The MPS control daemon on the slices, if the group records one, re-adopted or
    /// started again (the slices are checked later in the start, `recover.rs`).
    fn revive(&self, fx: &Revival<'_>, group: &Group) -> bool {
        group
            .mps()
            .is_some_and(|m| mps::revive_daemon(fx.node, fx.uid, m, fx.rebooted))
    }

    /// The MPS control daemon on the slices, if the group records one.
    fn stop(&self, fx: &GroupEffects<'_>, group: &Group) -> Result<(), ServiceError> {
        mps::stop_recorded(fx, group)
    }

    /// Destroys every MIG instance of the group that is still the one its record names
    /// ([`destroy`]); returns the first error after trying all. Each slice's record says on
    /// disk that its destroy has begun before its compute instance goes.
    fn destroy(&self, fx: &GroupEffects<'_>, group: &Group) -> Result<(), ServiceError> {
        let mut first = None;
        for rec in group.slices() {
            if let Err(e) = destroy(fx.backend, rec, || fx.record.mig_destroying(rec)) {
                tracing::error!(claim = %fx.uid, device = %rec.device, error = %e, "destroying MIG device");
                first.get_or_insert(ServiceError::new(
                    e.code,
                    format!("claim {}: {}", fx.uid, e.message),
                ));
            }
        }
        first.map_or(Ok(()), Err)
    }
}
