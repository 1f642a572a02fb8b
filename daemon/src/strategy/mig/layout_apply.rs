//! `gpushare mig apply`: a mig-parted v1 layout (`crate::mig::layout`, the pure model)
//! planned against the GPUs as they are ([`plan_layout`]), refused where claims hold a GPU it
//! changes ([`refuse_held`]), and applied ([`apply_layout`]) while the service holds the GPUs
//! being changed ([`layout_holds`]), so that no claim is prepared on them half-way.

use gpushare_proto::{ErrorCode, MigApplyParams, MigGpuPlan};

use crate::error::ServiceError;
use crate::gpu::{GpuBackend, GpuError};
use crate::mig::layout::{self, GpuState, LayoutError, PlannedInstance};
use crate::mig::MigDeviceName;
use crate::strategy::mig::{self as strategy, MigTarget};
use crate::strategy::GpuHold;
use gpushare_core::Want;

/// The plans of config `p.config` of the mig-parted v1 file `p.layout` for the GPUs as `states`
/// reads them once the file is parsed ([`super::gpu_states`]), with what the answer shows of each:
/// per selected GPU, the MIG mode to set where the pending mode differs (so a pending change is
/// cancelled by a config with the mode in effect), the instances it has to destroy and the config's
/// to create (each GPU instance at an explicit placement with one full compute instance), and the
/// claims that hold it (`held_by`).
///
/// # Errors
/// `InvalidConfig` for a bad file, config or profile set.
pub fn plan_layout(
    p: &MigApplyParams,
    states: impl FnOnce() -> Vec<GpuState>,
) -> Result<(Vec<layout::GpuPlan>, Vec<MigGpuPlan>), ServiceError> {
    let cfg = layout::parse(&p.layout).map_err(layout_err)?;
    let plans = layout::plan(&cfg, &p.config, &states()).map_err(layout_err)?;
    let out: Vec<MigGpuPlan> = plans
        .iter()
        .map(|g| MigGpuPlan {
            gpu: g.name.clone(),
            set_mig_mode: g.set_mig_mode,
            destroy: g
                .destroy
                .iter()
                .map(|i| instance_name(g.minor, i))
                .collect(),
            create: g
                .create
                .iter()
                .map(|(prof, pl)| MigDeviceName::format(g.minor, prof, pl.start))
                .collect(),
            note: g.note.clone(),
            held_by: g.held_by.clone(),
        })
        .collect();
    Ok((plans, out))
}

/// An apply refuses GPUs claims hold, and changes nothing.
///
/// # Errors
/// `Conflict`, naming the GPUs and their claims.
pub fn refuse_held(plans: &[layout::GpuPlan]) -> Result<(), ServiceError> {
    layout::refuse_held(plans).map_err(layout_err)
}

/// The holds on the GPUs `changing` changes, each held exclusively while it is changed.
pub fn layout_holds(backend: &dyn GpuBackend, changing: &[&layout::GpuPlan]) -> Vec<GpuHold> {
    changing
        .iter()
        .filter_map(|g| {
            let gpu = backend.gpus().iter().find(|x| x.minor == g.minor)?;
            Some((gpu.uuid.clone(), g.name.clone(), Want::Exclusive))
        })
        .collect()
}

/// Applies each GPU's plan of `plans` in turn, filling its entry of `out` with what was
/// created (or the note of a MIG mode change that waits for a reset).
///
/// # Errors
/// `Internal` (naming what was done) when the hardware fails half-way.
pub fn apply_layout(
    backend: &dyn GpuBackend,
    plans: &[&layout::GpuPlan],
    out: &mut [MigGpuPlan],
) -> Result<(), ServiceError> {
    for g in plans {
        let Some(gpu) = backend.gpus().iter().find(|x| x.minor == g.minor) else {
            continue;
        };
        let slot = out.iter_mut().find(|o| o.gpu == g.name);
        let uuid = gpu.uuid.clone();
        destroy_planned(backend, g, &uuid)?;
        if let Some(enable) = g.set_mig_mode {
            backend
                .set_mig_mode(&uuid, enable)
                .map_err(|e| strategy::gpu_err(&format!("{}: setting MIG mode", g.name), e))?;
        }
        // Set now or earlier, a change may wait for a reset: nothing to create yet.
        let mode = backend
            .mig_mode(&uuid)
            .map_err(|e| strategy::gpu_err(&g.name, e))?;
        if mode.current != g.mig_enabled {
            let note = layout::pending_note(g.mig_enabled);
            tracing::warn!(gpu = %g.name, "{note}");
            if let Some(o) = slot {
                o.note = Some(note);
                o.create.clear();
            }
            continue;
        }
        let created = create_planned(backend, g, &uuid)?;
        if let Some(o) = slot {
            o.create = created;
        }
    }
    Ok(())
}

/// Destroys the instances plan `g` destroys on GPU `uuid`, each compute instance before
/// its GPU instance; one already gone (`NotFound`) counts as destroyed.
fn destroy_planned(
    backend: &dyn GpuBackend,
    g: &layout::GpuPlan,
    uuid: &str,
) -> Result<(), ServiceError> {
    for i in &g.destroy {
        let Some(gi) = i.gi_id else { continue };
        let live = backend
            .mig_instances(uuid)
            .map_err(|e| strategy::gpu_err(&g.name, e))?;
        if let Some(ci) = live
            .iter()
            .find(|x| x.gi_id == gi)
            .and_then(|x| x.compute.clone())
        {
            ignore_not_found(backend.destroy_compute_instance(uuid, gi, ci.ci_id))
                .map_err(|e| strategy::gpu_err(&instance_name(g.minor, i), e))?;
        }
        ignore_not_found(backend.destroy_gpu_instance(uuid, gi))
            .map_err(|e| strategy::gpu_err(&instance_name(g.minor, i), e))?;
    }
    Ok(())
}

/// Creates the instances plan `g` creates on GPU `uuid`, each at its placement with one
/// full compute instance; returns them as `<device>=<MIG UUID>` for the GPU's entry of
/// the result.
fn create_planned(
    backend: &dyn GpuBackend,
    g: &layout::GpuPlan,
    uuid: &str,
) -> Result<Vec<String>, ServiceError> {
    let mut created = Vec::new();
    for (prof, pl) in &g.create {
        let target = MigTarget {
            request: String::new(),
            device: MigDeviceName::format(g.minor, prof, pl.start),
            gpu_uuid: uuid.to_string(),
            gpu_minor: g.minor,
            model: g.model,
            profile: prof.clone(),
            start: pl.start,
            existing: None,
            chosen: false,
            carries_mode_flag: false,
        };
        let rec = strategy::create(
            backend,
            &target,
            // MIG mode is as the layout wants it already (checked by `apply_layout`).
            || Ok(()),
            |_| Ok(()),
        )?;
        created.push(format!("{}={}", rec.device, rec.uuid));
    }
    Ok(created)
}

fn ignore_not_found(r: Result<(), GpuError>) -> Result<(), GpuError> {
    match r {
        Err(GpuError::NotFound(_)) => Ok(()),
        other => other,
    }
}

fn instance_name(minor: u32, i: &PlannedInstance) -> String {
    format!(
        "gpu-{minor}-mig-{}-{}-{}",
        crate::mig::squash(&i.profile_name),
        i.profile,
        i.placement.start
    )
}

fn layout_err(e: LayoutError) -> ServiceError {
    match e {
        LayoutError::Invalid(m) => ServiceError::new(ErrorCode::InvalidConfig, m),
        LayoutError::Refused(m) => ServiceError::new(ErrorCode::Conflict, m),
    }
}
