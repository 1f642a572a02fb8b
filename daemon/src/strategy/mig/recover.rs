//! The start-up reconcile of prepared claims' MIG slices: an instance that vanished while
//! gpushared was away (a GPU reset, an administrator's `nvidia-smi mig -dci` / `-dgi`) is
//! recreated at the claim's placement, with the claim's CDI spec rewritten (the capability
//! device nodes follow the new GPU- and compute-instance IDs) and an MPS control daemon on the
//! slice started again on the new MIG UUID; where that cannot be done the claim is `Degraded`
//! with the reason, and its slice stays its own (admission counts recorded placements) until
//! it is released. MIG instances do not survive a GPU reset on hardware, MIG mode does
//! (NVIDIA's MIG user guide, "Device Reset"); NVIDIA's DRA driver tracks the MIG UUID to tell
//! a reused GI ID from its own instance (NVIDIA/k8s-dra-driver-gpu, its DynamicMIG code in
//! `cmd/gpu-kubelet-plugin`).

use super::{driver_name_of, is_whole_instance_of, RecoverEffects};
use crate::claim::{Claim, MigSlice, Phase, SliceOrigin};
use crate::driver_spec::DriverSpecs;
use crate::gpu::GpuBackend;

mod remake;

/// What the reconcile found of one recorded slice.
enum Slice {
    /// Its instance is there, as recorded.
    Intact,
    /// Its instance was gone and is made again: the new record.
    Recreated(MigSlice),
    /// Gone, and why it cannot be made again.
    Lost(String),
}

/// What the first pass of the start-up reconcile did to one claim's slices, for the second
/// pass (after the driver's spec is generated).
#[derive(Debug)]
pub struct MigRecovery {
    uid: String,
    /// The claim as recorded before the reconcile.
    before: Claim,
    /// Why the claim is `Degraded`, so far.
    lost: Vec<String>,
    /// A slice was made again: its CDI IDs are checked in the second pass.
    recreated: bool,
}

/// Checks every prepared (or degraded) claim's MIG slices against the GPUs, at start and after the
/// sweep of instances no claim owns (so a stray left at a claim's placement is gone first): each
/// slice whose instance no longer exists with its recorded identity (GI and CI IDs, placement, MIG
/// UUID) is recreated at its placement, with the claim's spec and MPS control daemon following it,
/// else its claim is to become `Degraded` naming the slice and why. Claims are done in UID order.
/// The claims' CDI IDs are checked by [`settle_recovered`], once the driver's spec is generated
/// with every recreated slice in it.
pub fn recreate_slices(fx: &RecoverEffects<'_>) -> Vec<MigRecovery> {
    let uids = fx.claims.uids(&|c| {
        matches!(c.phase, Phase::Prepared | Phase::Degraded)
            && c.groups.iter().any(|g| !g.slices().is_empty())
    });
    // Nothing is served yet (the start-up reconcile runs before the socket exists): no
    // claim lock is needed, and none may be taken on the runtime's thread.
    uids.iter()
        .filter_map(|uid| recreate_claim_slices(fx, uid))
        .collect()
}

/// The second pass, after the driver's spec was generated (once, with the alias of every
/// slice made again: `driver_spec::alias`): each claim whose slices were made again gets its
/// CDI IDs checked against that spec, without running the generator again; each claim
/// becomes `Degraded` with what was lost, or `Prepared` again when a lost slice of it is
/// back.
pub fn settle_recovered(fx: &RecoverEffects<'_>, recovered: Vec<MigRecovery>) {
    for r in recovered {
        settle_claim(fx, r);
    }
}

fn recreate_claim_slices(fx: &RecoverEffects<'_>, uid: &str) -> Option<MigRecovery> {
    let info = fx.claims.claim(uid)?;
    let mut lost: Vec<String> = Vec::new();
    let mut changed_groups: Vec<usize> = Vec::new();
    for (gi, g) in info.groups.iter().enumerate() {
        for (ri, rec) in g.slices().iter().enumerate() {
            match remake::check_slice(fx, uid, gi, ri, rec) {
                Slice::Intact => {}
                Slice::Recreated(new) => {
                    take_recreated(fx, uid, (gi, ri), rec, new);
                    if !changed_groups.contains(&gi) {
                        changed_groups.push(gi);
                    }
                }
                Slice::Lost(why) => {
                    tracing::error!(claim = %uid, device = %rec.device, reason = %why, "MIG slice vanished while gpushared was away and cannot be recreated; claim Degraded");
                    lost.push(format!(
                        "MIG device {} vanished while gpushared was away (a GPU reset, or destroyed by hand) and could not be recreated at placement {}:{}: {why}",
                        rec.device, rec.placement_start, rec.memory_slices
                    ));
                }
            }
        }
    }
    for &gi in &changed_groups {
        // A daemon that does not start on the new slices is the daemon's fault, not the
        // slices': restarted with backoff like any dead daemon (follow_new_slices).
        fx.claims.follow_new_slices(uid, gi);
    }
    if !changed_groups.is_empty() {
        let after = fx.claims.claim(uid)?;
        // Containers started from now on get the new instances' capability device nodes.
        if let Err(e) = fx.claims.write_cdi(uid, &after) {
            tracing::error!(claim = %uid, error = %e, "rewriting the CDI spec for recreated MIG slices");
            lost.push(format!("rewriting the CDI spec: {}", e.message));
        }
    }
    Some(MigRecovery {
        uid: uid.to_string(),
        before: info,
        lost,
        recreated: !changed_groups.is_empty(),
    })
}

/// Records `new`, slice `rec` (slice `ri` of group `gi` of claim `uid`) made again, in the
/// claim, under the name the claim's CDI IDs were prepared with.
fn take_recreated(
    fx: &RecoverEffects<'_>,
    uid: &str,
    (gi, ri): (usize, usize),
    rec: &MigSlice,
    mut new: MigSlice,
) {
    // The claim's CDI IDs keep the name it was prepared with.
    new.original_uuid = driver_name_of(rec).to_string();
    if new.origin == SliceOrigin::Existing {
        tracing::warn!(claim = %uid, device = %rec.device, old_uuid = %rec.uuid, uuid = %new.uuid, gi = new.gi_id, "MIG slice vanished while gpushared was away; one made again at its placement by someone else is taken as it is");
    } else {
        tracing::warn!(claim = %uid, device = %rec.device, old_uuid = %rec.uuid, uuid = %new.uuid, gi = new.gi_id, "MIG slice vanished while gpushared was away; recreated at its placement");
    }
    fx.claims.set_slice(uid, gi, ri, &new);
}

/// The second pass for one claim (see [`settle_recovered`]): where its slices were made again, its
/// CDI IDs are checked; then its phase follows what was lost, and its host record is written again
/// if the claim changed.
fn settle_claim(fx: &RecoverEffects<'_>, r: MigRecovery) {
    let MigRecovery {
        uid,
        before: info,
        mut lost,
        recreated,
    } = r;
    let uid = uid.as_str();
    let Some(after) = fx.claims.claim(uid) else {
        return;
    };
    if recreated {
        // The driver spec names a MIG slice's device by its MIG UUID, which the new
        // instance does not share, and kubelet keeps the IDs it was handed for the claim's
        // whole life: the spec keeps the slice's first name as an alias of its new device
        // (`driver_spec::alias`), so the same IDs give the recreated slice. The spec was
        // generated after every slice was made again: a name it left out stays out until
        // the node changes, so it is not generated again here (that took one run of the
        // generator per claim). The IDs are checked as a prepare checks them before the
        // claim is ready.
        check_driver_aliases(fx.driver_spec, &after, &mut lost);
        fx.claims.check_cdi_ids(uid, &after, &mut lost);
    }
    if !fx.claims.record_slice_outcome(uid, &lost) {
        return;
    }
    // The registry lock is dropped before the write: `write_host_record` takes it again.
    let now = fx.claims.claim(uid);
    if now.is_some_and(|c| c != info) {
        fx.claims.write_host_record(uid);
    }
}

/// Adds to `lost` each of claim `after`'s slice names the driver's CDI spec could not keep
/// as an alias: the claim's CDI device IDs name its slices by those first names, so a name
/// left out of the spec leaves an ID that resolves to nothing.
fn check_driver_aliases(driver: Option<&DriverSpecs>, after: &Claim, lost: &mut Vec<String>) {
    if let Some(d) = driver {
        for m in after.groups.iter().flat_map(|g| g.slices()) {
            if let Some(why) = d.alias_left_out(&m.original_uuid) {
                lost.push(format!(
                    "the driver's CDI spec cannot keep the name {} the claim's CDI device IDs give MIG device {}: {why}",
                    m.original_uuid, m.device
                ));
            }
        }
    }
}

/// Whether every MIG slice `c` records is there as recorded (what a restarted MPS control
/// daemon on them needs to serve).
pub fn slices_intact(backend: &dyn GpuBackend, c: &Claim) -> bool {
    c.slices().all(|rec| {
        backend
            .mig_instances(&rec.gpu_uuid)
            .unwrap_or_default()
            .iter()
            .any(|i| is_whole_instance_of(rec, i))
    })
}
