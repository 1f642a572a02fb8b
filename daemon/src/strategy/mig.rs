//! Dynamic MIG: a MIG device of a claim is created when the claim is prepared and destroyed
//! when it is released, as NVIDIA's DRA driver does under its `DynamicMIG` gate, with these
//! differences for safety: MIG mode is never toggled where that needs a GPU reset (Ampere,
//! cloud VMs), a GPU instance whose compute instance failed is destroyed at once, and the
//! claim records a GPU instance as soon as it exists, so a later release finds it
//! (`shared/research/dra-driver.md` §4.2, NVIDIA issue #1452).
//!
//! Everything here goes through [`GpuBackend`]; the service decides when.

use std::collections::{BTreeMap, BTreeSet};

use gpushare_proto::{ClaimInfo, ErrorCode, MigInstanceInfo};

use crate::error::ServiceError;
use crate::gpu::{Gpu, GpuBackend, GpuError, MigInstance};
use crate::mig::{self, GiProfile, MigDeviceName, MigModel, Occupied, PlacementError};

/// MIG's hold on a GPU: no setting of the GPU itself. MIG mode is entered where the GPU
/// allows it without a reset and its instances are made and destroyed per claim
/// ([`create`] and [`destroy`], driven by the service), so nothing is restored when the last
/// holder leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mig;

impl super::Strategy for Mig {}

/// A MIG device a claim asks for, resolved against the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigTarget {
    /// The request it was allocated for.
    pub request: String,
    /// The allocated device name.
    pub device: String,
    /// Parent GPU UUID.
    pub gpu_uuid: String,
    /// Parent GPU minor.
    pub gpu_minor: u32,
    /// The GPU's model.
    pub model: MigModel,
    /// GPU-instance profile.
    pub profile: GiProfile,
    /// Placement start.
    pub start: u32,
}

impl MigTarget {
    /// The claim record of this target before anything exists.
    pub fn record(&self, gi_id: u32) -> MigInstanceInfo {
        MigInstanceInfo {
            request: self.request.clone(),
            device: self.device.clone(),
            gpu_uuid: self.gpu_uuid.clone(),
            gpu_minor: self.gpu_minor,
            profile: self.profile.name.to_string(),
            gi_profile_id: self.profile.id.0,
            placement_start: self.start,
            memory_slices: self.profile.memory_slices,
            gi_id,
            ci_id: None,
            uuid: String::new(),
        }
    }
}

fn err(code: ErrorCode, msg: impl Into<String>) -> ServiceError {
    ServiceError::new(code, msg)
}

/// The GPU's MIG model, or `Unsupported` naming why it has none.
///
/// # Errors
/// `Unsupported` for GPUs without MIG or without profile tables here.
pub fn model_of(gpu: &Gpu) -> Result<MigModel, ServiceError> {
    if !gpu.mig_capable {
        return Err(err(
            ErrorCode::Unsupported,
            format!(
                "{} ({}) does not support MIG",
                gpu.device_name(),
                gpu.product_name
            ),
        ));
    }
    MigModel::from_product_name(&gpu.product_name).ok_or_else(|| {
        err(
            ErrorCode::Unsupported,
            format!(
                "{} ({}): gpushare has no MIG profile tables for this GPU",
                gpu.device_name(),
                gpu.product_name
            ),
        )
    })
}

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

/// Maps a backend error to the service's codes.
pub fn gpu_err(what: &str, e: GpuError) -> ServiceError {
    let code = match e {
        GpuError::Unsupported(_) => ErrorCode::Unsupported,
        GpuError::Busy(_) | GpuError::InsufficientResources(_) => ErrorCode::Conflict,
        GpuError::InvalidArgument(_) => ErrorCode::InvalidConfig,
        GpuError::NoSuchGpu(_) => ErrorCode::UnknownDevice,
        GpuError::Failed(_) | GpuError::NotFound(_) => ErrorCode::Internal,
    };
    err(code, format!("{what}: {e}"))
}

/// Creates `target`: enables MIG mode if it is off (only where that needs no reset), creates
/// the GPU instance at the target's placement, calls `created` with its record (so the claim
/// owns it before anything else can fail), then creates the full compute instance and reads
/// the MIG UUID from it. A compute instance that fails takes its GPU instance with it.
///
/// # Errors
/// As [`gpu_err`]; when even the rollback fails, the error says so and the record passed to
/// `created` still names the GPU instance, for the release to retry.
pub fn create(
    backend: &dyn GpuBackend,
    target: &MigTarget,
    mut created: impl FnMut(&MigInstanceInfo),
) -> Result<MigInstanceInfo, ServiceError> {
    let name = format!("gpu-{}", target.gpu_minor);
    let mode = backend
        .mig_mode(&target.gpu_uuid)
        .map_err(|e| gpu_err(&name, e))?;
    if !mode.current {
        if !target.model.reset_free_mode_toggle() {
            return Err(err(
                ErrorCode::Unsupported,
                format!("{name}: MIG mode is disabled and enabling it needs a GPU reset"),
            ));
        }
        let after = backend
            .set_mig_mode(&target.gpu_uuid, true)
            .map_err(|e| gpu_err(&format!("{name}: enabling MIG mode"), e))?;
        if !after.current {
            return Err(err(
                ErrorCode::Unsupported,
                format!("{name}: enabling MIG mode stays pending a GPU reset; gpushare never resets GPUs"),
            ));
        }
        tracing::info!(gpu = %name, "MIG mode enabled");
    }
    let gi_id = backend
        .create_gpu_instance(&target.gpu_uuid, target.profile.id, target.start)
        .map_err(|e| {
            gpu_err(
                &format!(
                    "{}: creating GPU instance {} at {}",
                    target.device, target.profile.name, target.start
                ),
                e,
            )
        })?;
    let mut record = target.record(gi_id);
    created(&record);
    match backend.create_compute_instance(&target.gpu_uuid, gi_id, target.profile.full_ci_profile())
    {
        Ok(ci) => {
            record.ci_id = Some(ci.ci_id);
            record.uuid = ci.uuid;
            tracing::info!(device = %target.device, gi = gi_id, ci = ci.ci_id, uuid = %record.uuid, "MIG device created");
            Ok(record)
        }
        Err(e) => {
            let cause = gpu_err(
                &format!(
                    "{}: creating the compute instance in GPU instance {gi_id}",
                    target.device
                ),
                e,
            );
            match backend.destroy_gpu_instance(&target.gpu_uuid, gi_id) {
                Ok(()) | Err(GpuError::NotFound(_)) => {
                    tracing::warn!(device = %target.device, gi = gi_id, "compute instance failed; GPU instance destroyed");
                    Err(cause)
                }
                Err(undo) => Err(err(
                    cause.code,
                    format!(
                        "{}; destroying GPU instance {gi_id} again also failed: {undo}",
                        cause.message
                    ),
                )),
            }
        }
    }
}

/// Destroys a claim's MIG instance: its compute instance, then its GPU instance; calls
/// `compute_gone` once the compute instance is gone, so the caller's record can say so (a GPU
/// instance whose destroy failed is then known by its IDs and placement alone). Only the
/// instance whose identity matches `rec` ([`is_instance_of`]) is touched: the driver reuses
/// GPU-instance IDs, so an instance made since at the same ID and placement (by hand, by a
/// layout) is another's. Instances already gone count as destroyed (idempotent), and so does a
/// GPU no longer in MIG mode.
///
/// # Errors
/// As [`gpu_err`] (e.g. `Conflict` while processes use the instance).
pub fn destroy(
    backend: &dyn GpuBackend,
    rec: &MigInstanceInfo,
    mut compute_gone: impl FnMut(),
) -> Result<(), ServiceError> {
    let live = match backend.mig_instances(&rec.gpu_uuid) {
        Ok(v) => v,
        Err(GpuError::Unsupported(_)) => return Ok(()),
        Err(e) => return Err(gpu_err(&rec.device, e)),
    };
    let Some(inst) = live.iter().find(|i| i.gi_id == rec.gi_id) else {
        return Ok(());
    };
    if !is_instance_of(rec, inst) {
        tracing::warn!(device = %rec.device, gi = rec.gi_id, uuid = %rec.uuid, found = ?inst, "GPU instance ID now names another instance; not destroying it");
        return Ok(());
    }
    if let Some(ci) = &inst.compute {
        match backend.destroy_compute_instance(&rec.gpu_uuid, rec.gi_id, ci.ci_id) {
            Ok(()) | Err(GpuError::NotFound(_)) => compute_gone(),
            Err(e) => {
                return Err(gpu_err(
                    &format!("{}: destroying compute instance {}", rec.device, ci.ci_id),
                    e,
                ))
            }
        }
    }
    match backend.destroy_gpu_instance(&rec.gpu_uuid, rec.gi_id) {
        Ok(()) | Err(GpuError::NotFound(_)) => {
            tracing::info!(device = %rec.device, gi = rec.gi_id, "MIG device destroyed");
            Ok(())
        }
        Err(e) => Err(gpu_err(
            &format!("{}: destroying GPU instance {}", rec.device, rec.gi_id),
            e,
        )),
    }
}

/// Whether live instance `inst` is the one `rec` records: the same GPU-instance ID, profile
/// and placement, and, once the record has its compute instance, the same compute-instance ID
/// and MIG UUID (a MIG UUID is never handed out twice). A record made before its compute
/// instance existed (a crash in between) matches its GPU instance whatever it holds now.
pub fn is_instance_of(rec: &MigInstanceInfo, inst: &MigInstance) -> bool {
    inst.gi_id == rec.gi_id
        && inst.profile.0 == rec.gi_profile_id
        && inst.placement.start == rec.placement_start
        && inst.placement.size == rec.memory_slices
        && match (rec.ci_id, &inst.compute) {
            (None, _) => true,
            (Some(ci), Some(c)) => c.ci_id == ci && c.uuid == rec.uuid,
            (Some(_), None) => false,
        }
}

/// Whether `inst` is `rec`'s instance, whole: as [`is_instance_of`], with the compute
/// instance recorded and there.
pub fn is_whole_instance_of(rec: &MigInstanceInfo, inst: &MigInstance) -> bool {
    rec.ci_id.is_some() && inst.compute.is_some() && is_instance_of(rec, inst)
}

/// The MIG slices claims record, by parent GPU UUID, with the claim UID recording each: what
/// admission counts besides the live instances (a slice whose instance vanished still belongs
/// to its claim until the claim is released), and what tells whose a live instance is.
#[derive(Debug, Default, Clone)]
pub struct Claimed {
    by_gpu: BTreeMap<String, Vec<(String, MigInstanceInfo)>>,
}

impl Claimed {
    /// The slices every claim in `claims` records, whatever the claim's state.
    pub fn of<'a>(claims: impl IntoIterator<Item = &'a ClaimInfo>) -> Claimed {
        let mut by_gpu: BTreeMap<String, Vec<(String, MigInstanceInfo)>> = BTreeMap::new();
        for c in claims {
            for m in c.groups.iter().flat_map(|g| &g.mig) {
                by_gpu
                    .entry(m.gpu_uuid.clone())
                    .or_default()
                    .push((c.uid.clone(), m.clone()));
            }
        }
        Claimed { by_gpu }
    }

    /// The claim whose record is live instance `inst` of GPU `gpu_uuid` ([`is_instance_of`]).
    pub fn owner(&self, gpu_uuid: &str, inst: &MigInstance) -> Option<&str> {
        self.by_gpu
            .get(gpu_uuid)?
            .iter()
            .find(|(_, m)| is_instance_of(m, inst))
            .map(|(uid, _)| uid.as_str())
    }

    /// The placements recorded on GPU `gpu_uuid`.
    pub fn occupied(&self, gpu_uuid: &str) -> Vec<Occupied> {
        self.by_gpu
            .get(gpu_uuid)
            .into_iter()
            .flatten()
            .map(|(_, m)| Occupied {
                profile: mig::GiProfileId(m.gi_profile_id),
                placement: mig::MigPlacement {
                    start: m.placement_start,
                    size: m.memory_slices,
                },
            })
            .collect()
    }

    /// The claims whose recorded slice on GPU `gpu_uuid` overlaps `placement`.
    pub fn holders(&self, gpu_uuid: &str, placement: &mig::MigPlacement) -> BTreeSet<String> {
        self.by_gpu
            .get(gpu_uuid)
            .into_iter()
            .flatten()
            .filter(|(_, m)| {
                placement.overlaps(&mig::MigPlacement {
                    start: m.placement_start,
                    size: m.memory_slices,
                })
            })
            .map(|(uid, _)| uid.clone())
            .collect()
    }
}

/// One MIG instance destroyed (or not) at startup because no checkpointed claim or applied
/// layout owned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swept {
    /// Parent GPU device name.
    pub gpu: String,
    /// The instance.
    pub instance: MigInstance,
    /// `None` when destroyed; else why it could not be.
    pub error: Option<String>,
}

/// At startup, destroys every MIG instance on the node that neither a checkpointed claim
/// (`claimed`, by identity: [`Claimed::owner`]) nor the node's recorded layout (`kept`:
/// `(GPU UUID, GI ID, MIG UUID)`; GI IDs are reused, so the MIG UUID must match too) owns:
/// what a crash between creating an instance and recording it leaves. Each is logged and
/// returned.
pub fn sweep_unowned(
    backend: &dyn GpuBackend,
    claimed: &Claimed,
    kept: &BTreeSet<(String, u32, String)>,
) -> Vec<Swept> {
    let mut out = Vec::new();
    for gpu in backend.gpus() {
        let Ok(instances) = backend.mig_instances(&gpu.uuid) else {
            continue;
        };
        for inst in instances {
            let mig_uuid = inst
                .compute
                .as_ref()
                .map(|c| c.uuid.clone())
                .unwrap_or_default();
            if claimed.owner(&gpu.uuid, &inst).is_some()
                || kept.contains(&(gpu.uuid.clone(), inst.gi_id, mig_uuid))
            {
                continue;
            }
            let mut error = None;
            if let Some(ci) = &inst.compute {
                if let Err(e) = backend.destroy_compute_instance(&gpu.uuid, inst.gi_id, ci.ci_id) {
                    error = Some(e.to_string());
                }
            }
            if error.is_none() {
                if let Err(e) = backend.destroy_gpu_instance(&gpu.uuid, inst.gi_id) {
                    error = Some(e.to_string());
                }
            }
            match &error {
                None => {
                    tracing::warn!(gpu = %gpu.device_name(), gi = inst.gi_id, placement = %inst.placement, profile = inst.profile.0, "destroyed a MIG instance no claim owns")
                }
                Some(e) => {
                    tracing::error!(gpu = %gpu.device_name(), gi = inst.gi_id, error = %e, "cannot destroy a MIG instance no claim owns")
                }
            }
            out.push(Swept {
                gpu: gpu.device_name(),
                instance: inst,
                error,
            });
        }
    }
    out
}
