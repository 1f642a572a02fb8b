//! Resolving a claim's MIG devices against the node and checking they can be made or taken
//! now, touching nothing.

use std::collections::BTreeMap;

use gpushare_proto::ErrorCode;

use super::{err, gpu_err, model_of, Claimed, MigTarget};
use crate::error::ServiceError;
use crate::gpu::{Gpu, GpuBackend, MigInstance};
use crate::mig::{self, GiProfile, MigDeviceName, MigModel, Occupied, PlacementError};

/// Resolves one allocated device of a MIG group: a DRA MIG name
/// (`gpu-2-mig-3g20gb-9-4`, checked against the GPU's profile table and against
/// `mig_profile` when the claim's short form names one), or a whole GPU (`gpu-2`) with
/// `mig_profile`. A named device that exists (any creator) and that no claim holds is taken as
/// it is (static MIG); one that does not is to be made. The whole-GPU form takes an existing
/// instance of the profile no claim holds first, else the profile's lowest placement free of
/// live instances, of the slices `claimed` records and of the `earlier` targets of the same
/// claim. Touches nothing.
///
/// # Errors
/// `UnknownDevice` for a GPU the node lacks; `InvalidConfig` for a profile that does not
/// exist or disagrees with the name, or a placement the profile never takes; `Unsupported`
/// for a GPU without MIG; `Conflict` for an existing device another claim holds or one that
/// has no compute instance, and when no placement is free (whole-GPU form).
pub fn resolve(
    backend: &dyn GpuBackend,
    request: &str,
    device: &str,
    mig_profile: Option<&str>,
    claimed: &Claimed,
    earlier: &[MigTarget],
) -> Result<MigTarget, ServiceError> {
    let parsed = MigDeviceName::parse(device);
    let gpu_name = match &parsed {
        Some(n) => format!("gpu-{}", n.minor),
        None => device.to_string(),
    };
    let gpu = backend.find(&gpu_name).ok_or_else(|| {
        err(
            ErrorCode::UnknownDevice,
            format!("device {device:?} (request {request}): the node has no GPU {gpu_name}"),
        )
    })?;
    let model = model_of(gpu)?;
    let at = Resolving {
        backend,
        request,
        device,
        gpu,
        model,
        claimed,
    };
    let (profile, start, existing, chosen) = match parsed {
        Some(n) => {
            let profile = at.named_profile(&n, mig_profile)?;
            let existing = at.existing_at(&profile, n.start)?;
            (profile, n.start, existing, false)
        }
        None => {
            let (profile, start, existing) = at.whole_gpu(mig_profile, earlier)?;
            (profile, start, existing, true)
        }
    };
    let device = MigDeviceName::format(gpu.minor, &profile, start);
    Ok(MigTarget {
        request: request.to_string(),
        device,
        gpu_uuid: gpu.uuid.clone(),
        gpu_minor: gpu.minor,
        model,
        profile,
        start,
        existing,
        chosen,
        // MIG mode off now on a GPU that gpushare turns it on for: whichever prepare turns it
        // on (this one, or one running beside it), it is gpushare's doing, and this slice
        // carries the flag too, so that the last of them turns it off again.
        carries_mode_flag: claimed.mode_enabled_by_gpushare(&gpu.uuid)
            || (model.reset_free_mode_toggle()
                && backend
                    .mig_mode(&gpu.uuid)
                    .is_ok_and(|m| !m.current && !m.pending)),
    })
}

/// One allocated device being resolved by [`resolve`]: what each of its steps reads, the
/// request and device names included, since every error names them.
struct Resolving<'a> {
    backend: &'a dyn GpuBackend,
    request: &'a str,
    device: &'a str,
    gpu: &'a Gpu,
    model: MigModel,
    claimed: &'a Claimed,
}

impl Resolving<'_> {
    /// The GPU's profile called `name`: both forms take `mig_profile` by name, and an unknown
    /// one is the claim's mistake, so the error lists the names the GPU has.
    fn profile_by_name(&self, name: &str) -> Result<GiProfile, ServiceError> {
        let Resolving {
            request,
            gpu,
            model,
            ..
        } = *self;
        model.profile_by_name(name).ok_or_else(|| {
            err(
                ErrorCode::InvalidConfig,
                format!(
                    "request {request}: {} ({}) has no MIG profile {name:?}; it has {}",
                    gpu.device_name(),
                    gpu.product_name,
                    model.profile_names()
                ),
            )
        })
    }

    /// The profile a DRA MIG name `n` stands for, checked against everything that could
    /// contradict it: the GPU's profile table (by ID and by the name's profile part),
    /// `mig_profile` when the claim names one, and the placements the profile takes. The
    /// name comes from the scheduler's allocation, so a mismatch is refused, not guessed at.
    fn named_profile(
        &self,
        n: &MigDeviceName,
        mig_profile: Option<&str>,
    ) -> Result<GiProfile, ServiceError> {
        let Resolving {
            request,
            device,
            gpu,
            model,
            ..
        } = *self;
        let profile = model.profile_by_id(n.gi_profile).ok_or_else(|| {
            err(
                ErrorCode::InvalidConfig,
                format!(
                    "device {device} (request {request}): GPU-instance profile ID {} does not exist on {}",
                    n.gi_profile, gpu.product_name
                ),
            )
        })?;
        if mig::squash(profile.name) != n.profile {
            return Err(err(
                ErrorCode::InvalidConfig,
                format!(
                    "device {device} (request {request}): profile ID {} is {} on {}, not {:?}",
                    n.gi_profile, profile.name, gpu.product_name, n.profile
                ),
            ));
        }
        if let Some(asked) = mig_profile {
            let asked = self.profile_by_name(asked)?;
            if asked.id != profile.id {
                return Err(err(
                    ErrorCode::InvalidConfig,
                    format!(
                        "request {request}: migProfile {} disagrees with the allocated device {device} ({})",
                        asked.name, profile.name
                    ),
                ));
            }
        }
        mig::check_placement(model, profile.id, n.start, &[])
            .map_err(|e| err(ErrorCode::InvalidConfig, format!("device {device}: {e}")))?;
        Ok(profile)
    }

    /// The live instance exactly at a named device's slice, if any (static MIG: taken as it
    /// is, not made). Only a whole one that no claim holds can be taken: another claim's is
    /// not ours to share, and gpushare never adds a compute instance to a GPU instance it did
    /// not make.
    fn existing_at(
        &self,
        profile: &GiProfile,
        start: u32,
    ) -> Result<Option<MigInstance>, ServiceError> {
        let Resolving {
            backend,
            request,
            device,
            gpu,
            claimed,
            ..
        } = *self;
        let existing = backend
            .mig_instances(&gpu.uuid)
            .unwrap_or_default()
            .into_iter()
            .find(|i| {
                i.profile == profile.id
                    && i.placement.start == start
                    && i.placement.size == profile.memory_slices
            });
        if let Some(inst) = &existing {
            if let Some(holder) = claimed.owner(&gpu.uuid, inst) {
                return Err(err(
                    ErrorCode::Conflict,
                    format!(
                        "device {device} (request {request}): the MIG device is claim {holder}'s"
                    ),
                ));
            }
            if inst.compute.is_none() {
                return Err(err(
                    ErrorCode::Conflict,
                    format!(
                        "device {device} (request {request}): GPU instance {} exists there without a compute instance; gpushare takes an existing MIG device only whole (create its compute instance, or destroy the GPU instance)",
                        inst.gi_id
                    ),
                ));
            }
        }
        Ok(existing)
    }

    /// The whole-GPU form (`gpu-2` with `mig_profile`): the profile named, and the slice
    /// [`pick`] chooses for it with the `earlier` targets of the same claim on this GPU taken
    /// too, since none of them exists yet.
    fn whole_gpu(
        &self,
        mig_profile: Option<&str>,
        earlier: &[MigTarget],
    ) -> Result<(GiProfile, u32, Option<MigInstance>), ServiceError> {
        let Resolving {
            backend,
            request,
            device,
            gpu,
            model,
            claimed,
        } = *self;
        let Some(asked) = mig_profile else {
            return Err(err(
                ErrorCode::InvalidConfig,
                format!(
                    "request {request}: device {device} is a whole GPU; MIG sharing needs a MIG device or migProfile"
                ),
            ));
        };
        let profile = self.profile_by_name(asked)?;
        let busy: Vec<Occupied> = earlier
            .iter()
            .filter(|t| t.gpu_uuid == gpu.uuid)
            .map(MigTarget::occupied)
            .collect();
        let (start, existing) = pick(backend, &gpu.uuid, model, &profile, claimed, &busy)
            .ok_or_else(|| {
                err(
                    ErrorCode::Conflict,
                    format!(
                        "request {request}: no free placement for {} on {device}",
                        profile.name
                    ),
                )
            })?;
        Ok((profile, start, existing))
    }
}

/// The whole-GPU form's choice on GPU `uuid` for `profile`: an existing whole instance of the
/// profile that no claim holds and `busy` does not name (lowest placement first), else the
/// lowest placement free of live instances, claim records and `busy` (slices being made).
fn pick(
    backend: &dyn GpuBackend,
    uuid: &str,
    model: mig::MigModel,
    profile: &mig::GiProfile,
    claimed: &Claimed,
    busy: &[Occupied],
) -> Option<(u32, Option<MigInstance>)> {
    let mut live = backend.mig_instances(uuid).unwrap_or_default();
    live.sort_by_key(|i| i.placement.start);
    let free_existing = live.iter().find(|i| {
        i.profile == profile.id
            && i.compute.is_some()
            && claimed.owner(uuid, i).is_none()
            && claimed.holders(uuid, &i.placement).is_empty()
            && !busy.iter().any(|b| b.placement.overlaps(&i.placement))
    });
    if let Some(i) = free_existing {
        return Some((i.placement.start, Some(i.clone())));
    }
    // Each slice once: the profile's instance count is checked on this list too.
    let mut taken = occupied(backend, uuid, claimed);
    for b in busy {
        if !taken.contains(b) {
            taken.push(*b);
        }
    }
    profile
        .starts
        .iter()
        .copied()
        .find(|s| mig::check_placement(model, profile.id, *s, &taken).is_ok())
        .map(|s| (s, None))
}

/// For a target whose placement was chosen (`chosen`): the same choice made again with
/// `busy`, the slices other prepares are making right now, taken too. Touches nothing.
///
/// # Errors
/// `Conflict` when no placement is left.
pub fn repick(
    backend: &dyn GpuBackend,
    target: &MigTarget,
    claimed: &Claimed,
    busy: &[Occupied],
) -> Result<MigTarget, ServiceError> {
    let (start, existing) = pick(
        backend,
        &target.gpu_uuid,
        target.model,
        &target.profile,
        claimed,
        busy,
    )
    .ok_or_else(|| {
        err(
            ErrorCode::Conflict,
            format!(
                "request {}: no free placement for {} on gpu-{}",
                target.request, target.profile.name, target.gpu_minor
            ),
        )
    })?;
    Ok(MigTarget {
        device: MigDeviceName::format(target.gpu_minor, &target.profile, start),
        start,
        existing,
        ..target.clone()
    })
}

/// What is taken on a GPU: its live instances and the slices claims record (whose instance
/// may have vanished: the slice is still the claim's), each once.
fn occupied(backend: &dyn GpuBackend, uuid: &str, claimed: &Claimed) -> Vec<Occupied> {
    let mut out: Vec<Occupied> = backend
        .mig_instances(uuid)
        .unwrap_or_default()
        .iter()
        .map(|i| Occupied {
            profile: i.profile,
            placement: i.placement,
        })
        .collect();
    for o in claimed.occupied(uuid) {
        if !out.contains(&o) {
            out.push(o);
        }
    }
    out
}

/// Checks, touching nothing, that `targets` can be created or taken now: for one to make, MIG
/// mode is on or can be turned on without a reset on an idle GPU; no placement overlaps an
/// existing instance (but the one a target takes), a slice a claim records (`claimed`, which
/// also names the holders in messages) or another target.
///
/// # Errors
/// `Unsupported` (MIG off on a GPU needing a reset, a change pending), `Conflict` (busy GPU,
/// overlapping placement).
pub fn check(
    backend: &dyn GpuBackend,
    targets: &[MigTarget],
    claimed: &Claimed,
) -> Result<(), ServiceError> {
    let mut planned: BTreeMap<&str, Vec<Occupied>> = BTreeMap::new();
    for t in targets {
        let slot = planned
            .entry(t.gpu_uuid.as_str())
            .or_insert_with(|| occupied(backend, &t.gpu_uuid, claimed));
        if t.existing.is_some() {
            check_taken(t, slot)?;
            continue;
        }
        check_mig_mode(backend, t)?;
        if t.chosen {
            // Chosen by `resolve` past the earlier targets, and chosen again when its intent
            // is written (`repick`): what other prepares make meanwhile is seen then.
            continue;
        }
        let slot = planned.entry(t.gpu_uuid.as_str()).or_default();
        check_placement_free(t, slot, claimed)?;
    }
    Ok(())
}

/// A target taken as it is: MIG mode is on, and its slices may overlap only itself (not a
/// slice a claim records, nor another target). Then `slot`, what is taken on its GPU, holds
/// it once, for the targets after it.
fn check_taken(t: &MigTarget, slot: &mut Vec<Occupied>) -> Result<(), ServiceError> {
    let mine = t.occupied();
    let others: Vec<Occupied> = slot.iter().copied().filter(|o| *o != mine).collect();
    if let Err(e) = mig::check_placement(t.model, t.profile.id, t.start, &others) {
        return Err(err(ErrorCode::Conflict, format!("{}: {e}", t.device)));
    }
    slot.retain(|o| *o != mine);
    slot.push(mine);
    Ok(())
}

/// A target to make needs MIG mode on its GPU, or a mode that can be turned on now: no
/// change pending a reset, a model that toggles without one, and no process on the GPU.
/// gpushare never resets a GPU, so anything else is refused before something is made.
fn check_mig_mode(backend: &dyn GpuBackend, t: &MigTarget) -> Result<(), ServiceError> {
    let name = format!("gpu-{}", t.gpu_minor);
    let mode = backend
        .mig_mode(&t.gpu_uuid)
        .map_err(|e| gpu_err(&name, e))?;
    if mode.current != mode.pending {
        return Err(err(
            ErrorCode::Unsupported,
            format!(
                "{name}: a MIG mode change to {} is pending a GPU reset; gpushare never resets GPUs (reset or reboot the node, then retry)",
                if mode.pending { "enabled" } else { "disabled" }
            ),
        ));
    }
    if !mode.current {
        if !t.model.reset_free_mode_toggle() {
            return Err(err(
                ErrorCode::Unsupported,
                format!(
                    "{name} ({}) has MIG mode disabled, and enabling it on this GPU takes effect only after a GPU reset, which gpushare never does (cloud VMs often cannot reset at all); enable MIG mode at node setup (`gpushare mig apply` or `nvidia-smi -mig 1`, then reboot)",
                    t.model
                ),
            ));
        }
        let pids = backend
            .compute_processes(&t.gpu_uuid)
            .map_err(|e| gpu_err(&name, e))?;
        if !pids.is_empty() {
            return Err(err(
                ErrorCode::Conflict,
                format!(
                    "{name}: MIG mode must be enabled, but {} process(es) use the GPU (pids {pids:?})",
                    pids.len()
                ),
            ));
        }
    }
    Ok(())
}

/// A named slice to make must fit beside what `slot` holds for its GPU (live instances,
/// recorded slices, earlier targets), and then joins it. A slice that is taken names the
/// claims holding it, so the operator sees whose it is.
fn check_placement_free(
    t: &MigTarget,
    slot: &mut Vec<Occupied>,
    claimed: &Claimed,
) -> Result<(), ServiceError> {
    match mig::check_placement(t.model, t.profile.id, t.start, slot) {
        Ok(placement) => slot.push(Occupied {
            profile: t.profile.id,
            placement,
        }),
        Err(PlacementError::Invalid(m)) => {
            return Err(err(ErrorCode::InvalidConfig, format!("{}: {m}", t.device)))
        }
        Err(PlacementError::Taken(m)) => {
            let holders = claimed.holders(
                &t.gpu_uuid,
                &mig::MigPlacement {
                    start: t.start,
                    size: t.profile.memory_slices,
                },
            );
            let by = if holders.is_empty() {
                String::new()
            } else {
                format!(
                    " (held by claim(s) {})",
                    holders.into_iter().collect::<Vec<_>>().join(", ")
                )
            };
            return Err(err(ErrorCode::Conflict, format!("{}: {m}{by}", t.device)));
        }
    }
    Ok(())
}
