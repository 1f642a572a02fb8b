//! Resolving a claim's MIG devices against the node and checking they can be made or taken
//! now, touching nothing.

use std::collections::BTreeMap;

use gpushare_proto::ErrorCode;

use super::{err, gpu_err, model_of, Claimed, MigTarget};
use crate::error::ServiceError;
use crate::gpu::GpuBackend;
use crate::mig::{self, MigDeviceName, Occupied, PlacementError};

/// Resolves one allocated device of a MIG group: a DRA MIG name
/// (`gpu-2-mig-3g20gb-9-4`, checked against the GPU's profile table and against
/// `mig_profile` when the claim's short form names one), or a whole GPU (`gpu-2`) with
/// `mig_profile`, which takes the profile's lowest placement free of live instances and of
/// the slices `claimed` records. Touches nothing.
///
/// # Errors
/// `UnknownDevice` for a GPU the node lacks; `InvalidConfig` for a profile that does not
/// exist or disagrees with the name, or a placement the profile never takes; `Unsupported`
/// for a GPU without MIG; `Conflict` when no placement is free (whole-GPU form).
pub fn resolve(
    backend: &dyn GpuBackend,
    request: &str,
    device: &str,
    mig_profile: Option<&str>,
    claimed: &Claimed,
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
    let by_name = |name: &str| {
        model.profile_by_name(name).ok_or_else(|| {
            err(
                ErrorCode::InvalidConfig,
                format!(
                    "request {request}: {} ({}) has no MIG profile {name:?}; it has {}",
                    gpu.device_name(),
                    gpu.product_name,
                    model
                        .profiles()
                        .iter()
                        .map(|p| p.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
    };
    let (profile, start) = match parsed {
        Some(n) => {
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
                let asked = by_name(asked)?;
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
            (profile, n.start)
        }
        None => {
            let Some(asked) = mig_profile else {
                return Err(err(
                    ErrorCode::InvalidConfig,
                    format!(
                        "request {request}: device {device} is a whole GPU; MIG sharing needs a MIG device or migProfile"
                    ),
                ));
            };
            let profile = by_name(asked)?;
            let taken = occupied(backend, &gpu.uuid, claimed);
            let start = profile
                .starts
                .iter()
                .copied()
                .find(|s| mig::check_placement(model, profile.id, *s, &taken).is_ok())
                .ok_or_else(|| {
                    err(
                        ErrorCode::Conflict,
                        format!(
                            "request {request}: no free placement for {} on {device}",
                            profile.name
                        ),
                    )
                })?;
            (profile, start)
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

/// Checks, touching nothing, that `targets` can be created now: MIG mode is on or can be
/// turned on without a reset on an idle GPU, and no placement overlaps an existing instance,
/// a slice a claim records (`claimed`, which also names the holders in messages) or another
/// target.
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
        let slot = planned
            .entry(t.gpu_uuid.as_str())
            .or_insert_with(|| occupied(backend, &t.gpu_uuid, claimed));
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
    }
    Ok(())
}
