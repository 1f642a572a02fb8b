//! `mig_apply`: a mig-parted v1 layout planned and applied on the GPUs no claim holds.

use gpushare_proto::{ErrorCode, MigApplyParams, MigApplyResult, MigGpuPlan};

use super::super::Service;
use crate::error::ServiceError;
use crate::gpu::GpuError;
use crate::mig::layout::{self, GpuState, LayoutError, PlannedInstance};
use crate::mig::{MigDeviceName, MigModel};
use crate::strategy::mig::{self as strategy, Claimed, MigTarget};
use gpushare_core::Want;

/// The claim UID `mig_apply` holds GPUs under while it changes them.
const LAYOUT_HOLDER: &str = "mig-layout";

impl Service {
    /// Plans (`dry_run`) or applies config `config` of a mig-parted v1 file: per selected GPU,
    /// sets MIG mode where the pending mode differs (so a pending change is cancelled by a
    /// config with the mode in effect), destroys the instances it has and creates the
    /// config's, each GPU instance at an explicit placement with one full compute instance. A
    /// plan shows GPUs claims hold with their claims (`held_by`); an apply refuses them and
    /// changes nothing; the GPUs being changed are held meanwhile, so no claim is prepared on
    /// them half-way. A MIG mode change that stays pending (Ampere) is left to a reset by the
    /// operator and said so in the GPU's `note`.
    ///
    /// # Errors
    /// `InvalidConfig` for a bad file, config or profile set; `Conflict` for GPUs held by
    /// claims; `Internal` (naming what was done) when the hardware fails half-way.
    pub fn mig_apply(&self, p: &MigApplyParams) -> Result<MigApplyResult, ServiceError> {
        let cfg = layout::parse(&p.layout).map_err(layout_err)?;
        let states = self.gpu_states();
        let plans = layout::plan(&cfg, &p.config, &states).map_err(layout_err)?;
        let mut out: Vec<MigGpuPlan> = plans
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
        if p.dry_run {
            return Ok(MigApplyResult {
                config: p.config.clone(),
                dry_run: true,
                gpus: out,
            });
        }
        layout::refuse_held(&plans).map_err(layout_err)?;
        // A change like prepare and unprepare: refused while gpushared stops, and waited for
        // (bounded) by the graceful stop.
        let _busy = self.begin_change()?;
        let changing: Vec<&layout::GpuPlan> = plans.iter().filter(|g| !g.is_noop()).collect();
        let holds: Vec<(String, String, Want)> = changing
            .iter()
            .filter_map(|g| {
                let gpu = self
                    .host
                    .backend
                    .gpus()
                    .iter()
                    .find(|x| x.minor == g.minor)?;
                Some((gpu.uuid.clone(), g.name.clone(), Want::Exclusive))
            })
            .collect();
        self.admit(LAYOUT_HOLDER, &holds)?;
        let result = self.apply_layout(&changing, &mut out);
        self.host.modes.release(self.host.backend.as_ref(), &holds);
        if !changing.is_empty() {
            // Even a layout that failed half-way changed MIG devices.
            self.regenerate_driver_spec("after mig apply");
        }
        result?;
        Ok(MigApplyResult {
            config: p.config.clone(),
            dry_run: false,
            gpus: out,
        })
    }

    /// Applies each GPU's plan of `plans` in turn, filling its entry of `out` with what was
    /// created (or the note of a MIG mode change that waits for a reset).
    fn apply_layout(
        &self,
        plans: &[&layout::GpuPlan],
        out: &mut [MigGpuPlan],
    ) -> Result<(), ServiceError> {
        for g in plans {
            let Some(gpu) = self.host.backend.gpus().iter().find(|x| x.minor == g.minor) else {
                continue;
            };
            let slot = out.iter_mut().find(|o| o.gpu == g.name);
            let uuid = gpu.uuid.clone();
            self.destroy_planned(g, &uuid)?;
            if let Some(enable) = g.set_mig_mode {
                self.host
                    .backend
                    .set_mig_mode(&uuid, enable)
                    .map_err(|e| strategy::gpu_err(&format!("{}: setting MIG mode", g.name), e))?;
            }
            // Set now or earlier, a change may wait for a reset: nothing to create yet.
            let mode = self
                .host
                .backend
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
            let created = self.create_planned(g, &uuid)?;
            if let Some(o) = slot {
                o.create = created;
            }
        }
        Ok(())
    }

    /// Destroys the instances plan `g` destroys on GPU `uuid`, each compute instance before
    /// its GPU instance; one already gone (`NotFound`) counts as destroyed.
    fn destroy_planned(&self, g: &layout::GpuPlan, uuid: &str) -> Result<(), ServiceError> {
        for i in &g.destroy {
            let Some(gi) = i.gi_id else { continue };
            let live = self
                .host
                .backend
                .mig_instances(uuid)
                .map_err(|e| strategy::gpu_err(&g.name, e))?;
            if let Some(ci) = live
                .iter()
                .find(|x| x.gi_id == gi)
                .and_then(|x| x.compute.clone())
            {
                ignore_not_found(
                    self.host
                        .backend
                        .destroy_compute_instance(uuid, gi, ci.ci_id),
                )
                .map_err(|e| strategy::gpu_err(&instance_name(g.minor, i), e))?;
            }
            ignore_not_found(self.host.backend.destroy_gpu_instance(uuid, gi))
                .map_err(|e| strategy::gpu_err(&instance_name(g.minor, i), e))?;
        }
        Ok(())
    }

    /// Creates the instances plan `g` creates on GPU `uuid`, each at its placement with one
    /// full compute instance; returns them as `<device>=<MIG UUID>` for the GPU's entry of
    /// the result.
    fn create_planned(&self, g: &layout::GpuPlan, uuid: &str) -> Result<Vec<String>, ServiceError> {
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
                self.host.backend.as_ref(),
                &target,
                // MIG mode is as the layout wants it already (checked by `apply_layout`).
                || Ok(()),
                |_| Ok(()),
            )?;
            created.push(format!("{}={}", rec.device, rec.uuid));
        }
        Ok(created)
    }

    /// What the layout planner needs to know of each GPU.
    fn gpu_states(&self) -> Vec<GpuState> {
        let view = self.records.view.load();
        let claimed = Claimed::of(view.claims.values().map(|c| &**c));
        self.host
            .backend
            .gpus()
            .iter()
            .map(|g| {
                let model = g
                    .mig_capable
                    .then(|| MigModel::from_product_name(&g.product_name))
                    .flatten();
                let mode = self.host.backend.mig_mode(&g.uuid).unwrap_or_default();
                let instances = model
                    .map(|m| {
                        self.host
                            .backend
                            .mig_instances(&g.uuid)
                            .unwrap_or_default()
                            .into_iter()
                            .map(|i| PlannedInstance {
                                gi_id: Some(i.gi_id),
                                profile: i.profile,
                                profile_name: m
                                    .profile_by_id(i.profile)
                                    .map_or_else(|| i.profile.to_string(), |p| p.name.to_string()),
                                placement: i.placement,
                                owner: claimed.owner(&g.uuid, &i).map(str::to_string),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                GpuState {
                    minor: g.minor,
                    name: g.device_name(),
                    model,
                    mig_enabled: mode.current,
                    mig_pending: mode.pending,
                    instances,
                    claims: view
                        .placement
                        .hold(&g.uuid)
                        .map(|h| h.claims())
                        .unwrap_or_default(),
                }
            })
            .collect()
    }
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
