//! The service's side of dynamic MIG: planning a claim's MIG devices, creating and
//! destroying them through `strategy::mig`, the start-up sweep, live MIG state for
//! `list_gpus`, and mig-parted layouts (`mig_apply`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use gpushare_proto::{
    ClaimInfo, ErrorCode, MigApplyParams, MigApplyResult, MigDeviceInfo, MigGpuPlan,
    MigInstanceInfo,
};
use serde::{Deserialize, Serialize};

use super::{PlanKind, Service};
use crate::config::{ClaimSpec, MpsSettings};
use crate::error::ServiceError;
use crate::fsutil;
use crate::gpu::{Gpu, GpuBackend, GpuError, MigMode};
use crate::mig::layout::{self, GpuState, LayoutError, PlannedInstance};
use crate::mig::{MigDeviceName, MigModel};
use crate::strategy::mig::{self as strategy, Claimed, MigTarget};
use crate::strategy::mps::{default_shm_bytes, MpsDirs, MpsLaunch};
use gpushare_core::Want;

/// The claim UID `mig_apply` holds GPUs under while it changes them.
const LAYOUT_HOLDER: &str = "mig-layout";

/// MIG instances an applied layout created, kept across restarts (`<run_dir>/mig-layout.json`)
/// so the start-up sweep leaves them alone.
#[derive(Debug, Default, Serialize, Deserialize)]
struct LayoutFile {
    /// The config last applied.
    config: String,
    /// `(GPU UUID, GI ID, MIG UUID)` of each instance it created.
    instances: Vec<(String, u32, String)>,
}

fn layout_path(run_dir: &Path) -> PathBuf {
    run_dir.join("mig-layout.json")
}

fn load_layout(run_dir: &Path) -> LayoutFile {
    match std::fs::read(layout_path(run_dir)) {
        Ok(raw) => serde_json::from_slice(&raw).unwrap_or_else(|e| {
            tracing::error!(path = %layout_path(run_dir).display(), error = %e, "unreadable MIG layout record; its instances are not kept");
            LayoutFile::default()
        }),
        Err(_) => LayoutFile::default(),
    }
}

/// At start-up: the first start on this boot (no `<run_dir>/mig-layout.json`, which lives on
/// a tmpfs like MIG instances themselves) adopts the MIG instances it finds that no claim
/// owns as the node's static layout (set up before gpushared, e.g. by mig-parted at boot) and
/// records them; every later start destroys the instances neither a checkpointed claim nor
/// that record owns, which only a crash between creating an instance and recording it leaves.
/// Each is logged.
pub(super) fn sweep_at_start<'a>(
    backend: &dyn GpuBackend,
    run_dir: &Path,
    claims: impl IntoIterator<Item = &'a ClaimInfo>,
) {
    let path = layout_path(run_dir);
    let claimed = Claimed::of(claims);
    if !path.exists() {
        let mut record = LayoutFile {
            config: "adopted at start".into(),
            instances: Vec::new(),
        };
        for gpu in backend.gpus() {
            for i in backend.mig_instances(&gpu.uuid).unwrap_or_default() {
                if claimed.owner(&gpu.uuid, &i).is_some() {
                    continue;
                }
                tracing::info!(gpu = %gpu.device_name(), gi = i.gi_id, placement = %i.placement, profile = i.profile.0, "adopting a MIG instance found at first start as part of the node's layout");
                let uuid = i.compute.map(|c| c.uuid).unwrap_or_default();
                record.instances.push((gpu.uuid.clone(), i.gi_id, uuid));
            }
        }
        if let Err(e) = write_layout(run_dir, &record) {
            tracing::error!(path = %path.display(), error = %e, "recording the node's MIG layout");
        }
        return;
    }
    let kept: BTreeSet<(String, u32, String)> =
        load_layout(run_dir).instances.into_iter().collect();
    let swept = strategy::sweep_unowned(backend, &claimed, &kept);
    if !swept.is_empty() {
        tracing::warn!(
            count = swept.len(),
            "start-up: MIG instances no claim owned were found"
        );
    }
}

fn write_layout(run_dir: &Path, record: &LayoutFile) -> Result<(), ServiceError> {
    fsutil::create_dir_if_missing(run_dir, 0o755)
        .map_err(|e| ServiceError::internal(format!("creating {}: {e}", run_dir.display())))?;
    let raw = serde_json::to_vec_pretty(record)
        .map_err(|e| ServiceError::internal(format!("MIG layout record: {e}")))?;
    fsutil::write_atomic(&layout_path(run_dir), &raw, 0o600).map_err(|e| {
        ServiceError::internal(format!("writing {}: {e}", layout_path(run_dir).display()))
    })
}

impl Service {
    /// Resolves a MIG group's devices and checks they can be created now, touching nothing.
    pub(super) fn plan_mig(
        &self,
        spec: &ClaimSpec,
        results: &[usize],
        profile: Option<&str>,
        mps: Option<&MpsSettings>,
        requests: &[String],
    ) -> Result<(Vec<MigTarget>, Option<MpsLaunch>), ServiceError> {
        // Slices claims record count as taken even where their instance vanished (a GPU reset,
        // a destroy by hand): they are those claims' until released.
        let claimed = Claimed::of(self.view.load().claims.values().map(|c| &**c));
        let mut targets = Vec::with_capacity(results.len());
        for &i in results {
            let r = &spec.results[i];
            targets.push(strategy::resolve(
                self.backend.as_ref(),
                &r.request,
                &r.device,
                profile,
                &claimed,
            )?);
        }
        strategy::check(self.backend.as_ref(), &targets, &claimed)?;
        let Some(settings) = mps else {
            return Ok((targets, None));
        };
        let names: Vec<String> = targets.iter().map(|t| t.device.clone()).collect();
        let pinned = settings.resolve_pinned_limits(&names).map_err(|e| {
            ServiceError::new(
                e.code,
                format!(
                    "config of request(s) {}: {}",
                    requests.join(", "),
                    e.message
                ),
            )
        })?;
        let dirs = MpsDirs::for_group(&self.claim_dir(&spec.uid), &names);
        dirs.check_socket_paths().map_err(|e| {
            ServiceError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "claim UID {:?} is too long for an MPS claim here: {e}",
                    spec.uid
                ),
            )
        })?;
        Ok((
            targets,
            Some(MpsLaunch {
                dirs,
                // The MIG UUIDs, once the instances exist.
                visible_devices: Vec::new(),
                multi_user: settings.multi_user,
                active_thread_percentage: settings.active_thread_percentage,
                pinned_limits_mib: pinned,
                shm_bytes: self
                    .cfg
                    .shm_bytes
                    .unwrap_or_else(|| default_shm_bytes(self.mps.ops().machine.mem_total_kib())),
            }),
        ))
    }

    /// Creates a group's MIG devices, recording each GPU instance in the claim the moment it
    /// exists, so that a failure anywhere after lets the release destroy it.
    pub(super) fn create_mig(
        &self,
        uid: &str,
        plan: &super::GroupPlan,
        targets: &[MigTarget],
    ) -> Result<Vec<MigInstanceInfo>, ServiceError> {
        debug_assert!(matches!(plan.kind, PlanKind::Mig { .. }));
        let mut done = Vec::with_capacity(targets.len());
        for t in targets {
            let rec = strategy::create(self.backend.as_ref(), t, |partial| {
                self.set_mig_record(uid, plan, partial);
            })?;
            self.set_mig_record(uid, plan, &rec);
            done.push(rec);
        }
        Ok(done)
    }

    fn set_mig_record(&self, uid: &str, plan: &super::GroupPlan, rec: &MigInstanceInfo) {
        let mut st = self.state();
        if let Some(c) = st.claims.get_mut(uid) {
            if let Some(g) = c.groups.iter_mut().find(|g| g.devices == plan.devices) {
                match g
                    .mig
                    .iter_mut()
                    .find(|m| m.gpu_uuid == rec.gpu_uuid && m.gi_id == rec.gi_id)
                {
                    Some(m) => *m = rec.clone(),
                    None => g.mig.push(rec.clone()),
                }
            }
        }
    }

    /// Destroys every MIG instance of a claim that is still the one its record names; returns
    /// the first error after trying all. A compute instance destroyed is struck from the
    /// claim's record at once, so that a retry after its GPU instance failed to go knows that
    /// GPU instance by its IDs and placement.
    pub(super) fn destroy_mig(&self, info: &ClaimInfo) -> Result<(), ServiceError> {
        let mut first = None;
        for rec in info.groups.iter().flat_map(|g| &g.mig) {
            let forget_compute = || {
                let mut st = self.state();
                if let Some(m) = st
                    .claims
                    .get_mut(&info.uid)
                    .into_iter()
                    .flat_map(|c| c.groups.iter_mut())
                    .flat_map(|g| g.mig.iter_mut())
                    .find(|m| *m == rec)
                {
                    m.ci_id = None;
                    m.uuid.clear();
                }
            };
            if let Err(e) = strategy::destroy(self.backend.as_ref(), rec, forget_compute) {
                tracing::error!(claim = %info.uid, device = %rec.device, error = %e, "destroying MIG device");
                first.get_or_insert(ServiceError::new(
                    e.code,
                    format!("claim {}: {}", info.uid, e.message),
                ));
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Checks, touching nothing, that a whole-GPU claim can have `gpu`: a GPU in MIG mode runs
    /// no CUDA work on the whole GPU. With MIG instances it is `Conflict` (naming their
    /// owners); with none, MIG mode can be turned off at prepare where that needs no reset
    /// (Hopper, idle), else `Unsupported`.
    ///
    /// # Errors
    /// As above.
    pub(super) fn check_whole_gpu(&self, gpu: &Gpu) -> Result<(), ServiceError> {
        let Ok(mode) = self.backend.mig_mode(&gpu.uuid) else {
            return Ok(());
        };
        if !mode.current && !mode.pending {
            return Ok(());
        }
        let name = gpu.device_name();
        let live = self.backend.mig_instances(&gpu.uuid).unwrap_or_default();
        if !live.is_empty() {
            let claimed = Claimed::of(self.view.load().claims.values().map(|c| &**c));
            let mut by: Vec<String> = live
                .iter()
                .map(|i| {
                    claimed.owner(&gpu.uuid, i).map_or_else(
                        || "the node's MIG layout".to_string(),
                        |c| format!("claim {c}"),
                    )
                })
                .collect();
            by.dedup();
            return Err(ServiceError::new(
                ErrorCode::Conflict,
                format!(
                    "{name} is partitioned into {} MIG instance(s) (held by {}); a whole-GPU claim cannot have it",
                    live.len(),
                    by.join(", ")
                ),
            ));
        }
        let resettable = MigModel::from_product_name(&gpu.product_name)
            .is_some_and(MigModel::reset_free_mode_toggle);
        if mode.current != mode.pending || !resettable {
            return Err(ServiceError::new(
                ErrorCode::Unsupported,
                format!(
                    "{name} is in MIG mode (or a change is pending), and turning it off on this GPU needs a GPU reset, which gpushare never does; a whole-GPU claim cannot have it"
                ),
            ));
        }
        Ok(())
    }

    /// Turns MIG mode off on a whole-GPU claim's GPU where it is on ([`Self::check_whole_gpu`]
    /// admitted it: Hopper, no instances). The claim holds the GPU, so no MIG claim races it.
    pub(super) fn leave_mig_mode(
        &self,
        d: &gpushare_proto::ClaimDevice,
    ) -> Result<(), ServiceError> {
        let Ok(mode) = self.backend.mig_mode(&d.uuid) else {
            return Ok(());
        };
        if !mode.current {
            return Ok(());
        }
        let after = self
            .backend
            .set_mig_mode(&d.uuid, false)
            .map_err(|e| strategy::gpu_err(&format!("{}: disabling MIG mode", d.device), e))?;
        if after.current {
            return Err(ServiceError::new(
                ErrorCode::Unsupported,
                format!("{}: disabling MIG mode stays pending a GPU reset", d.device),
            ));
        }
        tracing::info!(gpu = %d.device, "MIG mode disabled for a whole-GPU claim");
        Ok(())
    }

    /// Live MIG mode (current and pending) and instances of `gpu`, each with the claim that
    /// owns it.
    pub(super) fn live_mig(&self, gpu: &Gpu) -> Option<(MigMode, Vec<MigDeviceInfo>)> {
        if !gpu.mig_capable {
            return None;
        }
        let model = MigModel::from_product_name(&gpu.product_name)?;
        let mode = self.backend.mig_mode(&gpu.uuid).ok()?;
        let claimed = Claimed::of(self.view.load().claims.values().map(|c| &**c));
        let devices = self
            .backend
            .mig_instances(&gpu.uuid)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|i| {
                let p = model.profile_by_id(i.profile)?;
                let owner = claimed.owner(&gpu.uuid, &i).map(str::to_string);
                let mut d = p.device_info(
                    i.compute.map(|c| c.uuid).unwrap_or_default(),
                    i.placement.start,
                );
                d.gi_id = Some(i.gi_id);
                d.owner = owner;
                Some(d)
            })
            .collect();
        Some((mode, devices))
    }

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
                let gpu = self.backend.gpus().iter().find(|x| x.minor == g.minor)?;
                Some((gpu.uuid.clone(), g.name.clone(), Want::Exclusive))
            })
            .collect();
        self.admit(LAYOUT_HOLDER, &holds)?;
        let result = self.apply_layout(&p.config, &changing, &mut out);
        self.modes.release(self.backend.as_ref(), &holds);
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

    fn apply_layout(
        &self,
        config: &str,
        plans: &[&layout::GpuPlan],
        out: &mut [MigGpuPlan],
    ) -> Result<(), ServiceError> {
        let mut record = load_layout(&self.cfg.run_dir);
        record.config = config.to_string();
        let result = (|| {
            for g in plans {
                let Some(gpu) = self.backend.gpus().iter().find(|x| x.minor == g.minor) else {
                    continue;
                };
                let slot = out.iter_mut().find(|o| o.gpu == g.name);
                let uuid = gpu.uuid.clone();
                for i in &g.destroy {
                    let Some(gi) = i.gi_id else { continue };
                    let live = self
                        .backend
                        .mig_instances(&uuid)
                        .map_err(|e| strategy::gpu_err(&g.name, e))?;
                    if let Some(ci) = live
                        .iter()
                        .find(|x| x.gi_id == gi)
                        .and_then(|x| x.compute.clone())
                    {
                        ignore_not_found(
                            self.backend.destroy_compute_instance(&uuid, gi, ci.ci_id),
                        )
                        .map_err(|e| strategy::gpu_err(&instance_name(g.minor, i), e))?;
                    }
                    ignore_not_found(self.backend.destroy_gpu_instance(&uuid, gi))
                        .map_err(|e| strategy::gpu_err(&instance_name(g.minor, i), e))?;
                    record
                        .instances
                        .retain(|(u, id, _)| !(*u == uuid && *id == gi));
                }
                if let Some(enable) = g.set_mig_mode {
                    self.backend.set_mig_mode(&uuid, enable).map_err(|e| {
                        strategy::gpu_err(&format!("{}: setting MIG mode", g.name), e)
                    })?;
                }
                // Set now or earlier, a change may wait for a reset: nothing to create yet.
                let mode = self
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
                let mut created = Vec::new();
                for (prof, pl) in &g.create {
                    let target = MigTarget {
                        request: String::new(),
                        device: MigDeviceName::format(g.minor, prof, pl.start),
                        gpu_uuid: uuid.clone(),
                        gpu_minor: g.minor,
                        model: g.model,
                        profile: prof.clone(),
                        start: pl.start,
                    };
                    let rec = strategy::create(self.backend.as_ref(), &target, |_| {})?;
                    record
                        .instances
                        .push((uuid.clone(), rec.gi_id, rec.uuid.clone()));
                    created.push(format!("{}={}", rec.device, rec.uuid));
                }
                if let Some(o) = slot {
                    o.create = created;
                }
            }
            Ok(())
        })();
        write_layout(&self.cfg.run_dir, &record)?;
        result
    }

    /// What the layout planner needs to know of each GPU.
    fn gpu_states(&self) -> Vec<GpuState> {
        let view = self.view.load();
        let claimed = Claimed::of(view.claims.values().map(|c| &**c));
        self.backend
            .gpus()
            .iter()
            .map(|g| {
                let model = g
                    .mig_capable
                    .then(|| MigModel::from_product_name(&g.product_name))
                    .flatten();
                let mode = self.backend.mig_mode(&g.uuid).unwrap_or_default();
                let instances = model
                    .map(|m| {
                        self.backend
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
