//! Making and destroying one claim's MIG slice, and telling a live instance is the one a
//! record names.

use gpushare_proto::ErrorCode;

use super::{err, gpu_err, MigTarget};
use crate::claim::{MigSlice, SliceOrigin};
use crate::error::ServiceError;
use crate::gpu::{GpuBackend, GpuError, MigInstance};

/// Creates `target`: enables MIG mode if it is off (only where that needs no reset; the
/// record then carries `enabled_mig_mode`), creates the GPU instance at the target's
/// placement, calls `created` with its record (which records it on disk, so the claim owns it
/// before anything else can happen to it: a compute instance made after is then the record's
/// too), then creates the full compute instance and reads the MIG UUID from it. A compute
/// instance that fails, or a `created` that fails, takes the GPU instance with it. A target
/// that takes an existing instance ([`MigTarget::existing`]) makes nothing: its record is the
/// instance as it is, checked to be still there.
///
/// `entering_mig_mode` is called just before MIG mode is turned on, only where this create
/// turns it on: it records that it does (the slice's intent), so that a crash from then on,
/// before anything on the GPU records it, still tells the next start to turn the mode off
/// again. Where it fails, nothing is changed.
///
/// # Errors
/// As [`gpu_err`], or `entering_mig_mode`'s or `created`'s error; when even the rollback
/// fails, the error says so and the record passed to `created` still names the GPU instance,
/// for the release to retry.
pub fn create(
    backend: &dyn GpuBackend,
    target: &MigTarget,
    entering_mig_mode: impl FnOnce() -> Result<(), ServiceError>,
    mut created: impl FnMut(&MigSlice) -> Result<(), ServiceError>,
) -> Result<MigSlice, ServiceError> {
    if let Some(inst) = &target.existing {
        return take(backend, target, inst);
    }
    let enabled_now = enable_mig_mode(backend, target, entering_mig_mode)?;
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
    record.enabled_mig_mode |= enabled_now;
    if let Err(cause) = created(&record) {
        return Err(undo_gpu_instance(backend, target, gi_id, cause));
    }
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
            Err(undo_gpu_instance(backend, target, gi_id, cause))
        }
    }
}

/// Turns MIG mode on for `target`'s GPU when it is off, where that needs no reset, calling
/// `entering_mig_mode` just before (see [`create`]); returns whether it did, for the slice's
/// record to carry `enabled_mig_mode` (the last slice released turns the mode off again).
fn enable_mig_mode(
    backend: &dyn GpuBackend,
    target: &MigTarget,
    entering_mig_mode: impl FnOnce() -> Result<(), ServiceError>,
) -> Result<bool, ServiceError> {
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
        entering_mig_mode()?;
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
        crate::crash::point("prepare.mig_mode_enabled");
    }
    Ok(!mode.current)
}

/// Destroys GPU instance `gi_id` just made for `target` after `cause` stopped the create;
/// the error to return: `cause`, saying so when the destroy failed too.
fn undo_gpu_instance(
    backend: &dyn GpuBackend,
    target: &MigTarget,
    gi_id: u32,
    cause: ServiceError,
) -> ServiceError {
    match backend.destroy_gpu_instance(&target.gpu_uuid, gi_id) {
        Ok(()) | Err(GpuError::NotFound(_)) => {
            tracing::warn!(device = %target.device, gi = gi_id, error = %cause, "MIG device not made; its GPU instance destroyed");
            cause
        }
        Err(undo) => err(
            cause.code,
            format!(
                "{}; destroying GPU instance {gi_id} again also failed: {undo}",
                cause.message
            ),
        ),
    }
}

/// The record of the existing instance `target` takes, once it is seen to be still there as
/// resolved (another creator may have destroyed or remade it since).
fn take(
    backend: &dyn GpuBackend,
    target: &MigTarget,
    inst: &MigInstance,
) -> Result<MigSlice, ServiceError> {
    let live = backend
        .mig_instances(&target.gpu_uuid)
        .map_err(|e| gpu_err(&target.device, e))?;
    let record = target.existing_record().filter(|_| live.contains(inst));
    let Some(record) = record else {
        return Err(err(
            ErrorCode::Conflict,
            format!(
                "{}: the existing MIG device (GPU instance {}) changed while the claim was being prepared",
                target.device, inst.gi_id
            ),
        ));
    };
    tracing::info!(device = %target.device, gi = inst.gi_id, uuid = %record.uuid, "existing MIG device handed to the claim as it is");
    Ok(record)
}

/// Destroys a claim's MIG instance: its compute instance, then its GPU instance. Before
/// either goes, `begin` records on disk that the destroy has begun
/// ([`MigSlice::destroying`]; not again for a record that says so already), so that a
/// crash between the two leaves a record that still names the GPU instance left without its
/// compute instance, and the next start finishes the job. Only the instance whose identity
/// matches `rec` ([`is_instance_of`]) is touched: the driver reuses GPU-instance IDs, so an
/// instance made since at the same ID and placement (by hand, by a layout) is another's.
/// Instances already gone count as destroyed (idempotent), and so does a GPU no longer in MIG
/// mode. An instance the claim took as it existed ([`SliceOrigin::Existing`]) is left as it is.
///
/// # Errors
/// `begin`'s error (then nothing is destroyed); as [`gpu_err`] (e.g. `Conflict` while
/// processes use the instance).
pub fn destroy(
    backend: &dyn GpuBackend,
    rec: &MigSlice,
    begin: impl FnOnce() -> Result<(), ServiceError>,
) -> Result<(), ServiceError> {
    if rec.origin == SliceOrigin::Existing {
        tracing::info!(device = %rec.device, gi = rec.gi_id, uuid = %rec.uuid, "MIG device existed before the claim; left as it is");
        return Ok(());
    }
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
    if !rec.destroying {
        begin()?;
        crate::crash::point("unprepare.mig_destroy_marked");
    }
    if let Some(ci) = &inst.compute {
        match backend.destroy_compute_instance(&rec.gpu_uuid, rec.gi_id, ci.ci_id) {
            Ok(()) | Err(GpuError::NotFound(_)) => {
                crate::crash::point("unprepare.mig_compute_destroyed");
            }
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
/// instance existed (on disk the moment the GPU instance exists; a crash before the compute
/// instance is recorded) matches its GPU instance whatever it holds now. A record with its
/// compute instance does not match a GPU instance without one (the driver reuses GI IDs, and
/// an operator half-way through making a new instance there is not to be undone), unless the
/// record says its destroy had begun ([`MigSlice::destroying`], on disk before the
/// compute instance went): then the GPU instance left without it is the record's.
pub fn is_instance_of(rec: &MigSlice, inst: &MigInstance) -> bool {
    inst.gi_id == rec.gi_id
        && inst.profile.0 == rec.gi_profile_id
        && inst.placement.start == rec.placement_start
        && inst.placement.size == rec.memory_slices
        && match (rec.ci_id, &inst.compute) {
            (None, _) => true,
            (Some(ci), Some(c)) => c.ci_id == ci && c.uuid == rec.uuid,
            (Some(_), None) => rec.destroying,
        }
}

/// Whether `inst` is `rec`'s instance, whole: as [`is_instance_of`], with the compute
/// instance recorded and there.
pub fn is_whole_instance_of(rec: &MigSlice, inst: &MigInstance) -> bool {
    rec.ci_id.is_some() && inst.compute.is_some() && is_instance_of(rec, inst)
}

/// The driver spec's device name a claim's IDs use for slice `m`: its first MIG UUID when it
/// was made again since ([`MigSlice::original_uuid`]), else its MIG UUID.
pub fn driver_name_of(m: &MigSlice) -> &str {
    if m.original_uuid.is_empty() {
        &m.uuid
    } else {
        &m.original_uuid
    }
}
