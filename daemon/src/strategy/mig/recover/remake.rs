//! One recorded MIG slice of a prepared claim checked against its GPU at start, and made
//! again at its placement where it is gone: the steps of [`check_slice`], for
//! [`super::recreate_slices`].

use super::Slice;
use crate::claim::{MigSlice, SliceOrigin};
use crate::error::ServiceError;
use crate::gpu::{GpuBackend, GpuError, MigInstance};
use crate::mig::{GiProfileId, MigPlacement};
use crate::strategy::mig::{self as strategy, Claimed, MigTarget, RecoverEffects};

/// Whether recorded slice `rec` (group `gi`, record `ri` of claim `uid`) is there, and if
/// not, makes it again at its placement.
pub(super) fn check_slice(
    fx: &RecoverEffects<'_>,
    uid: &str,
    gi: usize,
    ri: usize,
    rec: &MigSlice,
) -> Slice {
    if let Some(found) = slice_as_recorded(fx.backend, uid, rec) {
        return found;
    }
    let placement = MigPlacement {
        start: rec.placement_start,
        size: rec.memory_slices,
    };
    let others = fx.claims.claimed(Some(uid));
    if let Some(found) = slice_at_placement(fx.backend, rec, &placement, &others) {
        return found;
    }
    let target = match target_of(fx.backend, rec) {
        Ok(t) => t,
        Err(why) => return Slice::Lost(why.to_string()),
    };
    make_slice_again(fx, uid, (gi, ri), rec, &target)
}

/// The first step of [`check_slice`]: `Intact` when `rec`'s instance is on its
/// GPU whole, `Lost` when the GPU's instances cannot be read or a half-made instance of it
/// cannot be destroyed; `None` when it is to be made again (a half-made one destroyed
/// first, so that it is made again whole).
fn slice_as_recorded(backend: &dyn GpuBackend, uid: &str, rec: &MigSlice) -> Option<Slice> {
    let gpu_name = format!("gpu-{}", rec.gpu_minor);
    let live = match backend.mig_instances(&rec.gpu_uuid) {
        Ok(v) => v,
        // MIG mode is off: no instance is left.
        Err(GpuError::Unsupported(_)) => Vec::new(),
        Err(e) => {
            return Some(Slice::Lost(format!(
                "reading {gpu_name}'s MIG instances: {e}"
            )))
        }
    };
    if live.iter().any(|i| strategy::is_whole_instance_of(rec, i)) {
        return Some(Slice::Intact);
    }
    // Ours but half made (a crash between its GPU and compute instance): made again whole.
    if let Some(half) = live.iter().find(|i| strategy::is_instance_of(rec, i)) {
        tracing::warn!(claim = %uid, device = %rec.device, gi = half.gi_id, "MIG slice found half made; destroying it to make it again");
        // Its record (Prepared, without a compute instance) matches the GPU instance
        // whatever it holds: nothing to mark before the destroy.
        if let Err(e) = strategy::destroy(backend, rec, || Ok(())) {
            return Some(Slice::Lost(e.message));
        }
    }
    None
}

/// What is at `rec`'s `placement` now: an instance made again there by someone else that
/// the claim takes (`Recreated`), or why the place cannot be had (`Lost`: an instance
/// overlaps it, or another claim of `others` records a slice there); `None` when it is
/// free for the slice to be made again.
fn slice_at_placement(
    backend: &dyn GpuBackend,
    rec: &MigSlice,
    placement: &MigPlacement,
    others: &Claimed,
) -> Option<Slice> {
    let live = backend.mig_instances(&rec.gpu_uuid).unwrap_or_default();
    // Made again by someone else at exactly its place (mig-parted at boot, an
    // administrator): the claim takes that one as it is, and leaves it at its release.
    if let Some(found) = existing_at(rec, &live, placement, others) {
        return Some(Slice::Recreated(found));
    }
    if let Some(o) = live.iter().find(|i| i.placement.overlaps(placement)) {
        return Some(Slice::Lost(taken_by(backend, rec, o, others)));
    }
    if let Some(c) = others.holders(&rec.gpu_uuid, placement).into_iter().next() {
        return Some(Slice::Lost(format!("claim {c} records a slice there")));
    }
    None
}

/// Why `rec`'s place cannot be had: live instance `o` overlaps it, named with its profile
/// and who holds it (a claim of `others`, or the node's MIG layout), for the claim's
/// `Degraded` reason.
fn taken_by(backend: &dyn GpuBackend, rec: &MigSlice, o: &MigInstance, others: &Claimed) -> String {
    let gpu_name = format!("gpu-{}", rec.gpu_minor);
    let by = others.owner(&rec.gpu_uuid, o).map_or_else(
        || "no claim: the node's MIG layout".to_string(),
        |c| format!("claim {c}"),
    );
    let profile = backend
        .find(&rec.gpu_uuid)
        .and_then(|g| crate::mig::MigModel::from_product_name(&g.product_name))
        .and_then(|m| m.profile_by_id(o.profile))
        .map_or_else(|| format!("profile {}", o.profile), |p| p.name.to_string());
    format!(
        "{gpu_name}'s memory slices there are taken by the {profile} GPU instance {} at {} ({by})",
        o.gi_id, o.placement
    )
}

/// Why a recorded slice cannot be made again ([`target_of`]): the claim is `Degraded` with
/// this as its slice's cause.
#[derive(Debug, thiserror::Error)]
enum NoTarget {
    /// The GPU the slice was on is gone from the node.
    #[error("the node has no GPU {uuid}")]
    GpuGone {
        /// The recorded GPU UUID.
        uuid: String,
    },
    /// The GPU no longer has a MIG model gpushare knows: the refusal a prepare would answer,
    /// whose message says it all (not a source: a chain would print it twice).
    #[error("{}", .0.message)]
    NoModel(ServiceError),
    /// The GPU's MIG model has no such GPU-instance profile.
    #[error("{product} has no GPU-instance profile {id}")]
    NoProfile {
        /// The GPU's product name.
        product: String,
        /// The recorded GPU-instance profile ID.
        id: u32,
    },
}

/// The instance to make `rec` again with, at its recorded placement on its GPU; or why
/// there is none (the GPU, its MIG model or the slice's profile is gone).
fn target_of(backend: &dyn GpuBackend, rec: &MigSlice) -> Result<MigTarget, NoTarget> {
    let gpu = backend
        .find(&rec.gpu_uuid)
        .ok_or_else(|| NoTarget::GpuGone {
            uuid: rec.gpu_uuid.clone(),
        })?;
    let model = strategy::model_of(gpu).map_err(NoTarget::NoModel)?;
    let profile = model
        .profile_by_id(GiProfileId(rec.gi_profile_id))
        .ok_or_else(|| NoTarget::NoProfile {
            product: gpu.product_name.clone(),
            id: rec.gi_profile_id,
        })?;
    Ok(MigTarget {
        request: rec.request.clone(),
        device: rec.device.clone(),
        gpu_uuid: rec.gpu_uuid.clone(),
        gpu_minor: rec.gpu_minor,
        model,
        profile,
        start: rec.placement_start,
        existing: None,
        chosen: false,
        carries_mode_flag: rec.enabled_mig_mode,
    })
}

/// Makes slice `rec` (group `gi`, record `ri` of claim `uid`) again as `target`, its
/// intent and each step recorded so that a crash half-way is found at the next start;
/// on failure the record goes back to `rec` (see [`roll_back_slice`]).
fn make_slice_again(
    fx: &RecoverEffects<'_>,
    uid: &str,
    (gi, ri): (usize, usize),
    rec: &MigSlice,
    target: &MigTarget,
) -> Slice {
    // Its intent first (a crash before the record names the new instance leaves it for
    // the next start's sweep); the GPU instance is recorded (and the record kept) the
    // moment it exists: a crash before its compute instance is recorded finds it half
    // made at the next start.
    if let Err(e) = fx.intents.reserve(uid, target) {
        return Slice::Lost(e.message);
    }
    let entering = || fx.intents.entering_mig_mode(uid, target);
    let created = strategy::create(fx.backend, target, entering, |partial| {
        fx.intents.made(uid, partial);
        // Half made, the record keeps the MIG UUID the claim's CDI IDs and its MPS
        // control daemon still name (a record naming a device it does not hold is refused
        // at start); without its compute instance it matches the new GPU instance by IDs
        // alone, so a crash now finds it half made and makes it again.
        let half = MigSlice {
            uuid: rec.uuid.clone(),
            original_uuid: rec.original_uuid.clone(),
            ..partial.clone()
        };
        fx.claims.set_slice(uid, gi, ri, &half);
        fx.claims.commit()
    });
    fx.intents.strike(uid);
    match created {
        Ok(new) => Slice::Recreated(new),
        Err(e) => {
            roll_back_slice(fx, uid, (gi, ri), rec);
            Slice::Lost(e.message)
        }
    }
}

/// After a failed [`make_slice_again`]: the record of slice `ri` of group `gi`
/// of claim `uid` is set back to `rec`, unless the GPU instance it names now is still
/// there.
fn roll_back_slice(fx: &RecoverEffects<'_>, uid: &str, (gi, ri): (usize, usize), rec: &MigSlice) {
    // Back to the old record unless the GPU instance made is still there (its
    // rollback failed): then the record names it, for the release to destroy.
    let still = fx
        .claims
        .claim(uid)
        .and_then(|c| c.groups.get(gi)?.slices().get(ri).cloned())
        .filter(|partial| {
            fx.backend
                .mig_instances(&rec.gpu_uuid)
                .unwrap_or_default()
                .iter()
                .any(|i| strategy::is_instance_of(partial, i))
        });
    if still.is_none() {
        fx.claims.set_slice(uid, gi, ri, rec);
    }
}

/// The live instance (of `live`) at exactly `rec`'s profile and `placement` that no claim of
/// `others` records, as the slice's new record taken as it is (`SliceOrigin::Existing`); only
/// one with its compute instance will do.
fn existing_at(
    rec: &MigSlice,
    live: &[MigInstance],
    placement: &MigPlacement,
    others: &Claimed,
) -> Option<MigSlice> {
    let found = live.iter().find(|i| {
        i.profile.0 == rec.gi_profile_id
            && i.placement == *placement
            && others.owner(&rec.gpu_uuid, i).is_none()
    })?;
    let ci = found.compute.as_ref()?;
    Some(MigSlice {
        gi_id: found.gi_id,
        ci_id: Some(ci.ci_id),
        uuid: ci.uuid.clone(),
        origin: SliceOrigin::Existing,
        ..rec.clone()
    })
}
