//! The claim service: prepare, unprepare, attach, detach and the read-only views.
//!
//! Methods are blocking (they spawn processes and fsync files); the server runs them on
//! tokio's blocking pool. Changing a claim's host setup (prepare, unprepare) is serialized per
//! claim UID, so two kubelet retries of one claim can never interleave while other claims go
//! on. A claim is admitted to its GPUs by each GPU's lock-free mode word (`modes`), before and
//! outside the registry mutex; a release restores GPU settings after dropping it. The
//! registry mutex is held briefly by changes and never across a process spawn or NVML call;
//! readers never take it: they read the view published after every change (`view`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use gpushare_proto::{
    AttachParams, Attachment, ClaimDevice, ClaimInfo, ClaimState, ComputeMode, DetachParams,
    DetachResult, ErrorCode, GpuInfo, GpuSharing, GroupInfo, HealthInfo, MpsInfo, PrepareResult,
    PreparedDevice, RequestDevices, StrategyInfo, UnprepareResult,
};
use serde_json::Value;

use crate::cdi::{self, ContainerEdits, HookConfig};
use crate::checkpoint::{CheckpointFile, Tombstone};
use crate::config::{self, ClaimSpec, ParseContext, Sharing};
use crate::error::ServiceError;
use crate::fsutil;
use crate::gpu::{Gpu, GpuBackend};
use crate::placement::{Hold, Placement, Want};
use crate::strategy::mig::MigTarget;
use crate::strategy::mps::{default_shm_bytes, Liveness, MpsControl, MpsDirs, MpsLaunch};
use crate::sys::{read_cgroup, DeviceFiles, Processes};
use gpushare_core::Published;

mod asked;
mod locks;
mod mig;
mod mig_recover;
mod modes;
mod persisted;
mod recover;
mod view;
use locks::ClaimLocks;
use modes::GpuModes;
pub use recover::{restart_backoff, SupervisedDaemon, BOOT_ID_PATH};
use view::{StateGuard, View};

/// Where the service keeps things and whom it serves.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Pool name allocations must carry.
    pub node_name: String,
    /// DRA driver names served.
    pub drivers: Vec<String>,
    /// Runtime directory; claims live under `<run_dir>/claims/<uid>/`.
    pub run_dir: PathBuf,
    /// CDI spec directory we write.
    pub cdi_dir: PathBuf,
    /// Checkpoint file.
    pub checkpoint: PathBuf,
    /// The hook named in CDI specs.
    pub hook: HookConfig,
    /// Size of each MPS claim's shm tmpfs in bytes (default: half the host's memory).
    pub shm_bytes: Option<u64>,
    /// The NVIDIA driver's CDI spec, whose device for each GPU every prepared device gets
    /// before the claim's; `None` for `[cdi] driver_spec = "none"`.
    pub driver_spec: Option<Arc<crate::driver_spec::DriverSpecs>>,
}

#[derive(Debug, Default)]
struct State {
    claims: BTreeMap<String, ClaimInfo>,
    placement: Placement,
    ready: bool,
    /// Boot ID written into the checkpoint.
    boot_id: String,
    /// Last claim generation handed out (see `ClaimInfo::generation` and tombstones).
    claim_generation: u64,
    tombstones: BTreeMap<String, Tombstone>,
    /// A corrupt checkpoint found at start: where it went and why.
    quarantined: Option<String>,
    /// Claim records refused at start, one line each (see `HealthInfo::quarantined_records`).
    quarantined_records: Vec<String>,
    /// Error of the last checkpoint write, cleared by the next one that succeeds.
    checkpoint_error: Option<String>,
    /// SIGTERM: changing requests are refused.
    stopping: bool,
    /// Restarts of dead MPS control daemons, by claim UID.
    restarts: BTreeMap<String, recover::RestartPlan>,
    /// Counts changes; the published view and the checkpoint on disk say which they hold.
    generation: u64,
}

/// The claim service.
#[derive(Debug)]
pub struct Service {
    cfg: ServiceConfig,
    ctx: ParseContext,
    backend: Arc<dyn GpuBackend>,
    mps: MpsControl,
    processes: Arc<dyn Processes>,
    /// Host device nodes, for the check that a claim's spec names only nodes that exist.
    devices: Arc<dyn DeviceFiles>,
    checkpoint: CheckpointFile,
    state: Mutex<State>,
    /// The registry as readers see it, republished after every change of `state`.
    view: Published<View>,
    /// Each GPU's mode word: what admits a claim to a GPU (`state.placement` only records
    /// who holds it).
    modes: GpuModes,
    /// The generation of the registry whose checkpoint is on disk; held while writing it.
    on_disk: Mutex<u64>,
    changes: ClaimLocks,
    /// Prepares and unprepares under way, for a graceful stop.
    in_flight: (Mutex<usize>, Condvar),
    /// Wakes the supervisor when the set of MPS control daemons changes.
    supervisor_wake: Mutex<Option<std::os::unix::net::UnixStream>>,
    /// Held while a claim's host record is written, and while a release removes the claim's
    /// directory: see `write_host_record`.
    host_record_writes: Mutex<()>,
}

/// The plan for one device group, before anything is applied.
#[derive(Debug)]
struct GroupPlan {
    requests: Vec<String>,
    devices: Vec<ClaimDevice>,
    kind: PlanKind,
}

#[derive(Debug)]
enum PlanKind {
    Exclusive,
    TimeSlicing(gpushare_proto::TimeSliceInterval),
    Mps(MpsLaunch),
    /// MIG devices to create, with an MPS control daemon on the slices when asked (its
    /// `visible_devices` become the MIG UUIDs once they exist).
    Mig {
        targets: Vec<MigTarget>,
        mps: Option<MpsLaunch>,
    },
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn is_mig_device_name(name: &str) -> bool {
    name.starts_with("MIG-") || name.contains("-mig-")
}

impl Service {
    /// A service over `backend`: loads the checkpoint (a corrupt one is quarantined, logged
    /// and reported in `health`), then reconciles the host with it before reporting ready (see
    /// [`Service::with_boot_id`]); the boot ID is read from [`BOOT_ID_PATH`].
    ///
    /// # Errors
    /// The checkpoint exists but cannot be read or moved aside.
    pub fn new(
        cfg: ServiceConfig,
        backend: Arc<dyn GpuBackend>,
        mps: MpsControl,
    ) -> Result<Service, ServiceError> {
        let boot_id = std::fs::read_to_string(BOOT_ID_PATH)
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Service::with_boot_id(cfg, backend, mps, boot_id)
    }

    /// As [`Service::new`], with the host's boot ID given. At start every checkpointed claim
    /// is reconciled: an MPS control daemon whose pid, start time and control round trip match
    /// is re-adopted as it runs; a dead one is restarted with its limits re-applied and read
    /// back; `PrepareStarted` and `Unpreparing` claims are rolled back; directories, mounts,
    /// MPS control daemons and CDI specs of ours that no claim owns are removed; after a reboot
    /// (another boot ID) every claim's host setup is redone; then MIG instances that no
    /// remaining claim (nor the node's MIG layout record) owns are destroyed, and last each
    /// prepared claim's MIG slice that vanished meanwhile is recreated at its placement (or
    /// the claim is `Degraded`). Only then is it ready.
    ///
    /// # Errors
    /// The checkpoint exists but cannot be read or moved aside.
    pub fn with_boot_id(
        cfg: ServiceConfig,
        backend: Arc<dyn GpuBackend>,
        mps: MpsControl,
        boot_id: String,
    ) -> Result<Service, ServiceError> {
        let checkpoint = CheckpointFile::new(cfg.checkpoint.clone());
        let loaded = checkpoint.load().map_err(|e| {
            ServiceError::internal(format!(
                "reading checkpoint {}: {e}",
                cfg.checkpoint.display()
            ))
        })?;
        // The mode words start with every GPU free; the reconcile takes the checkpointed
        // claims' holds on them (before it rolls any claim back through teardown, which
        // releases through them) and publishes the view as it goes.
        let modes = GpuModes::new(backend.gpus(), &Placement::default());
        let view = Published::new(View::of(&State::default(), None));
        let ctx = ParseContext {
            node_name: cfg.node_name.clone(),
            drivers: cfg.drivers.clone(),
        };
        let service = Service {
            cfg,
            ctx,
            backend,
            processes: Arc::clone(&mps.ops().processes),
            devices: Arc::clone(&mps.ops().devices),
            mps,
            checkpoint,
            state: Mutex::new(State::default()),
            view,
            modes,
            on_disk: Mutex::new(0),
            changes: ClaimLocks::default(),
            in_flight: (Mutex::new(0), Condvar::new()),
            supervisor_wake: Mutex::new(None),
            host_record_writes: Mutex::new(()),
        };
        service.reconcile(loaded, boot_id);
        // The driver's spec of this node as it is now: after the reconcile, which may have
        // destroyed or recreated MIG devices.
        service.regenerate_driver_spec("at start");
        Ok(service)
    }

    fn state(&self) -> StateGuard<'_> {
        // A panic while holding the registry leaves plain data behind, still consistent
        // enough to read and to release claims; refusing all service would be worse.
        StateGuard {
            guard: self.state.lock().unwrap_or_else(|p| p.into_inner()),
            view: &self.view,
            changed: false,
        }
    }

    /// Unlocks the registry after a change and makes the change durable: writes the
    /// checkpoint of the newest published view (claims, boot ID, claim generation,
    /// tombstones), unless a write that started after this change already did. The write
    /// happens outside the registry lock, so other claims' changes and all readers go on
    /// meanwhile, and changes that queue behind one write share the next (group commit): one
    /// fsync for many changes under churn, never a stale checkpoint over a newer one.
    ///
    /// A failed write is recorded as the checkpoint error (`health`, `gpushare status`) until
    /// a write succeeds again.
    ///
    /// # Errors
    /// `Internal` when the checkpoint cannot be written; the change stays in memory (and in
    /// the view) and the caller undoes it.
    fn commit(&self, st: StateGuard<'_>) -> Result<(), ServiceError> {
        let generation = st.unlock();
        let mut on_disk = self.on_disk.lock().unwrap_or_else(|p| p.into_inner());
        if *on_disk >= generation {
            return Ok(());
        }
        // The newest view holds this change: it was published before the registry unlocked.
        let view = self.view.load();
        let cp = view.checkpoint(now_secs());
        let result = self.checkpoint.save(&cp).map_err(|e| {
            ServiceError::internal(format!(
                "writing checkpoint {}: {e}",
                self.checkpoint.path().display()
            ))
        });
        // The registry is taken again only when the error state changes (the lock order is
        // `on_disk` then `state`; nobody takes `on_disk` while holding `state`).
        match &result {
            Ok(()) => {
                *on_disk = view.generation;
                if view.checkpoint_error.is_some() {
                    let mut st = self.state();
                    if st.checkpoint_error.is_some() {
                        st.checkpoint_error = None;
                        tracing::info!(path = %self.checkpoint.path().display(), "checkpoint written again");
                    }
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot write the checkpoint; changing requests fail until it can be written");
                let mut st = self.state();
                if st.checkpoint_error.as_deref() != Some(e.message.as_str()) {
                    st.checkpoint_error = Some(e.message.clone());
                }
            }
        }
        result
    }

    fn claim_dir(&self, uid: &str) -> PathBuf {
        self.cfg.run_dir.join("claims").join(uid)
    }

    /// Prepares the claim in `claim` (a `ResourceClaim` object). Idempotent: a claim already
    /// prepared is returned as it is with `already_prepared: true`. A refused or failed prepare
    /// leaves nothing behind: no process, directory, mount, CDI file or checkpoint entry.
    ///
    /// # Errors
    /// `InvalidRequest`/`InvalidConfig`/`WrongNode` for bad input, `UnknownDevice`,
    /// `Unsupported` (MIG), `Conflict` with other claims, `Internal` for host failures.
    pub fn prepare(&self, claim: &Value) -> Result<PrepareResult, ServiceError> {
        let spec = config::parse_claim(claim, &self.ctx)?;
        let _busy = self.begin_change()?;
        // Taken before waiting for the claim's lock: a release that finishes while this
        // request waits leaves a later generation, and this request is then stale.
        let arrived = self.state().claim_generation;
        let _claim = self.changes.lock(&spec.uid);
        let resource_version = claim
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
        self.refuse_stale_prepare(&spec.uid, arrived, resource_version.as_deref())?;
        let existing = self.state().claims.get(&spec.uid).cloned();
        // Containers still running on a claim that is prepared afresh keep their slots.
        let mut carried: Vec<Attachment> = Vec::new();
        if let Some(existing) = existing {
            if matches!(existing.state, ClaimState::Prepared | ClaimState::Degraded) {
                asked::refuse_changed(&spec, &existing)?;
            }
            if existing.state == ClaimState::Prepared && self.dead_mps_daemon(&existing).is_none() {
                // The kubelet is about to hand these CDI IDs to the runtime: they must resolve
                // (the driver's spec written again if it is gone)…
                let not_ready = |m: String| {
                    ServiceError::new(
                        ErrorCode::NotReady,
                        format!("claim {} is prepared but not usable: {m}", spec.uid),
                    )
                };
                let requests = self
                    .prepared_requests(&spec.uid, &existing.groups, &existing.requests)
                    .map_err(|e| not_ready(e.to_string()))?;
                if !Path::new(&existing.cdi_spec).exists() {
                    tracing::warn!(claim = %spec.uid, path = %existing.cdi_spec, "CDI spec of a prepared claim is missing; writing it again");
                    self.write_cdi(&spec.uid, &existing.groups, &existing)?;
                }
                // …and every device node they name must still be there: a GPU's node removed
                // since (a driver reload, an administrator) would fail the container's start.
                self.verify_cdi(&spec.uid, &requests).map_err(not_ready)?;
                if requests != existing.requests {
                    self.record_requests(&spec.uid, &requests)?;
                }
                return Ok(PrepareResult {
                    uid: existing.uid,
                    requests,
                    already_prepared: true,
                });
            }
            // Prepared (or Degraded) with a dead MPS control daemon: start it again in place,
            // so that running containers, which have its pipe directory bind-mounted, reach
            // the new one.
            if matches!(existing.state, ClaimState::Prepared | ClaimState::Degraded)
                && self.restart_dead_daemons(&spec.uid)
            {
                if let Ok(again) = self.get_claim(&spec.uid) {
                    if !Path::new(&again.cdi_spec).exists() {
                        self.write_cdi(&spec.uid, &again.groups, &again)?;
                    }
                    return Ok(PrepareResult {
                        uid: again.uid,
                        requests: again.requests,
                        already_prepared: false,
                    });
                }
            }
            // Left half-done by a crash (PrepareStarted), by a release that failed part-way
            // (Unpreparing), or prepared but with a dead MPS control daemon: nothing else works
            // on it now (we hold its lock), so undo what is left and prepare afresh.
            tracing::warn!(claim = %spec.uid, state = ?existing.state, "finishing the release of an interrupted claim before preparing it again");
            carried = existing
                .attached
                .iter()
                .filter(|a| a.pid.is_some_and(|pid| self.processes.alive(pid)))
                .cloned()
                .collect();
            if let Some(e) = self.teardown(&spec.uid, None) {
                return Err(ServiceError::new(
                    e.code,
                    format!(
                        "claim {} was left {:?} and cannot be released yet: {}",
                        spec.uid, existing.state, e.message
                    ),
                ));
            }
        }
        let (plans, attach_limit) = self.plan(&spec)?;
        // Before anything changes: a node without the toolkit, or whose toolkit spec lacks a
        // GPU of the claim, refuses it here (MIG devices are checked once they exist).
        self.check_driver_devices(&spec.uid, &plans)?;
        let requests = self.request_devices(&spec);
        let info = ClaimInfo {
            uid: spec.uid.clone(),
            namespace: spec.namespace.clone(),
            name: spec.name.clone(),
            state: ClaimState::PrepareStarted,
            groups: plans.iter().map(|p| self.group_info(p, None)).collect(),
            requests: requests.clone(),
            cdi_spec: cdi::spec_path(&self.cfg.cdi_dir, &spec.uid)
                .display()
                .to_string(),
            attach_limit,
            attached: vec![],
            last_error: None,
            restarts: 0,
            resource_version,
            generation: 0,
        };
        let mut info = info;
        self.admit(&spec.uid, &wants_of(&info))?;
        {
            let mut st = self.state();
            if let Err(c) = st.placement.reserve(&spec.uid, &wants_of(&info)) {
                drop(st);
                tracing::error!(claim = %spec.uid, conflict = %c, "placement refused a claim its GPUs' mode words admitted");
                self.modes.release(self.backend.as_ref(), &wants_of(&info));
                return Err(ServiceError::new(ErrorCode::Conflict, c.0));
            }
            st.claim_generation += 1;
            info.generation = st.claim_generation;
            st.claims.insert(spec.uid.clone(), info.clone());
            if let Err(e) = self.commit(st) {
                let mut st = self.state();
                st.claims.remove(&spec.uid);
                let freed = self.release_gpus(&mut st, &info);
                drop(st);
                self.modes.release(self.backend.as_ref(), &freed);
                return Err(e);
            }
        }
        crate::crash::point("prepare.started_saved");
        tracing::info!(claim = %spec.uid, namespace = %spec.namespace, name = %spec.name, "preparing claim");

        match self.apply(&spec, &plans, &info) {
            Ok((groups, requests)) => {
                let mut st = self.state();
                if let Some(c) = st.claims.get_mut(&spec.uid) {
                    c.groups = groups;
                    c.requests = requests.clone();
                    c.state = ClaimState::Prepared;
                    c.attached = carried;
                }
                // A prepare of this claim is what the kubelet wants now: an older release no
                // longer stands against it.
                let tombstone = st.tombstones.remove(&spec.uid);
                let prepared = st.claims.get(&spec.uid).cloned();
                if let Err(e) = self.commit(st) {
                    if let Some(t) = tombstone {
                        self.state().tombstones.insert(spec.uid.clone(), t);
                    }
                    self.teardown(&spec.uid, None);
                    return Err(e);
                }
                if let Some(c) = &prepared {
                    self.write_host_record(&c.uid);
                }
                crate::crash::point("prepare.completed_saved");
                self.wake_supervisor();
                tracing::info!(claim = %spec.uid, "claim prepared");
                Ok(PrepareResult {
                    uid: spec.uid,
                    requests,
                    already_prepared: false,
                })
            }
            Err(e) => {
                tracing::warn!(claim = %spec.uid, error = %e, "prepare failed; rolling back");
                self.teardown(&spec.uid, None);
                Err(e)
            }
        }
    }

    /// Resolves devices and configs into per-group plans, touching nothing.
    fn plan(&self, spec: &ClaimSpec) -> Result<(Vec<GroupPlan>, Option<u32>), ServiceError> {
        let mut gpus: Vec<&Gpu> = Vec::with_capacity(spec.results.len());
        let mut seen = BTreeSet::new();
        let mut seen_names = BTreeSet::new();
        for r in &spec.results {
            let mig_name = crate::mig::MigDeviceName::parse(&r.device);
            if mig_name.is_none() && is_mig_device_name(&r.device) {
                return Err(ServiceError::new(
                    ErrorCode::Unsupported,
                    format!(
                        "device {} (request {}) is a static MIG device by UUID; gpushare creates MIG devices itself and takes them by name (gpu-<minor>-mig-<profile>-<GI profile ID>-<placement start>)",
                        r.device, r.request
                    ),
                ));
            }
            if !seen_names.insert(r.device.clone()) {
                return Err(ServiceError::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "device {} is allocated twice in claim {}",
                        r.device, spec.uid
                    ),
                ));
            }
            let lookup = mig_name
                .as_ref()
                .map_or_else(|| r.device.clone(), |n| format!("gpu-{}", n.minor));
            let gpu = self.backend.find(&lookup).ok_or_else(|| {
                let known: Vec<String> = self.backend.gpus().iter().map(Gpu::device_name).collect();
                ServiceError::new(
                    ErrorCode::UnknownDevice,
                    format!(
                        "device {:?} (request {}) does not exist on node {}; it has {}",
                        r.device,
                        r.request,
                        self.cfg.node_name,
                        known.join(", ")
                    ),
                )
            })?;
            // Several MIG devices of one GPU may share a claim; whole GPUs may not repeat.
            if mig_name.is_none() && !seen.insert(gpu.uuid.clone()) {
                return Err(ServiceError::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "device {} is allocated twice in claim {}",
                        r.device, spec.uid
                    ),
                ));
            }
            gpus.push(gpu);
        }

        let mut plans = Vec::new();
        let mut limit: Option<u32> = None;
        for group in &spec.groups {
            let mut devices: Vec<ClaimDevice> = group
                .results
                .iter()
                .map(|&i| ClaimDevice {
                    request: spec.results[i].request.clone(),
                    device: spec.results[i].device.clone(),
                    uuid: gpus[i].uuid.clone(),
                    minor: gpus[i].minor,
                })
                .collect();
            devices.sort_by(|a, b| a.uuid.cmp(&b.uuid));
            let mut requests: Vec<String> = Vec::new();
            for &i in &group.results {
                if !requests.contains(&spec.results[i].request) {
                    requests.push(spec.results[i].request.clone());
                }
            }
            let mut cap = |r: Option<u32>| {
                if let Some(r) = r {
                    limit = Some(limit.map_or(r, |l| l.min(r)));
                }
            };
            // MIG devices get MIG whatever the config says: no config means the slice alone,
            // MPS means a daemon on the slice.
            let migs = group
                .results
                .iter()
                .filter(|&&i| crate::mig::MigDeviceName::parse(&spec.results[i].device).is_some())
                .count();
            let sharing = if migs == 0 {
                group.sharing.clone()
            } else if migs != group.results.len() {
                return Err(ServiceError::new(
                    ErrorCode::InvalidRequest,
                    format!(
                        "request(s) {} mix MIG devices and whole GPUs under one config",
                        requests.join(", ")
                    ),
                ));
            } else {
                match &group.sharing {
                    Sharing::Exclusive => Sharing::Mig {
                        profile: None,
                        mps: None,
                    },
                    Sharing::Mps { settings, replicas } => {
                        cap(*replicas);
                        Sharing::Mig {
                            profile: None,
                            mps: Some(settings.clone()),
                        }
                    }
                    Sharing::TimeSlicing { .. } => {
                        return Err(ServiceError::new(
                            ErrorCode::InvalidConfig,
                            format!(
                                "request(s) {}: time-slicing applies to whole GPUs, not MIG devices (use MPS or no sharing)",
                                requests.join(", ")
                            ),
                        ))
                    }
                    m @ Sharing::Mig { .. } => m.clone(),
                }
            };
            if !matches!(sharing, Sharing::Mig { .. }) {
                for &i in &group.results {
                    self.check_whole_gpu(gpus[i])?;
                }
            }
            let kind = match &sharing {
                Sharing::Exclusive => PlanKind::Exclusive,
                Sharing::TimeSlicing { interval, replicas } => {
                    cap(*replicas);
                    PlanKind::TimeSlicing(*interval)
                }
                Sharing::Mps { settings, replicas } => {
                    cap(*replicas);
                    let uuids: Vec<String> = devices.iter().map(|d| d.uuid.clone()).collect();
                    for &i in &group.results {
                        self.check_mps_support(gpus[i], settings)?;
                    }
                    let pinned = settings.resolve_pinned_limits(&uuids).map_err(|e| {
                        ServiceError::new(
                            e.code,
                            format!(
                                "config of request(s) {}: {}",
                                requests.join(", "),
                                e.message
                            ),
                        )
                    })?;
                    let dirs = MpsDirs::for_group(&self.claim_dir(&spec.uid), &uuids);
                    dirs.check_socket_paths().map_err(|e| {
                        ServiceError::new(
                            ErrorCode::InvalidRequest,
                            format!(
                                "claim UID {:?} is too long for an MPS claim here: {e}",
                                spec.uid
                            ),
                        )
                    })?;
                    PlanKind::Mps(MpsLaunch {
                        dirs,
                        visible_devices: uuids,
                        multi_user: settings.multi_user,
                        active_thread_percentage: settings.active_thread_percentage,
                        pinned_limits_mib: pinned,
                        shm_bytes: self.cfg.shm_bytes.unwrap_or_else(default_shm_bytes),
                    })
                }
                Sharing::Mig { profile, mps } => {
                    if let Some(settings) = mps {
                        for &i in &group.results {
                            self.check_mps_support(gpus[i], settings)?;
                        }
                    }
                    let (targets, mps) = self.plan_mig(
                        spec,
                        &group.results,
                        profile.as_deref(),
                        mps.as_ref(),
                        &requests,
                    )?;
                    // The group's devices are the MIG devices, named canonically.
                    devices = targets
                        .iter()
                        .map(|t| ClaimDevice {
                            request: t.request.clone(),
                            device: t.device.clone(),
                            uuid: t.gpu_uuid.clone(),
                            minor: t.gpu_minor,
                        })
                        .collect();
                    PlanKind::Mig { targets, mps }
                }
            };
            plans.push(GroupPlan {
                requests,
                devices,
                kind,
            });
        }
        Ok((plans, limit))
    }

    /// Refuses (`Unsupported`) an MPS group on a GPU whose MPS cannot keep the claim's
    /// settings (see [`crate::strategy::mps_support`]).
    fn check_mps_support(
        &self,
        gpu: &Gpu,
        settings: &config::MpsSettings,
    ) -> Result<(), ServiceError> {
        let pinned = settings.default_pinned_limit_mib.is_some()
            || !settings.per_device_pinned_limit_mib.is_empty();
        crate::strategy::mps_support::check(gpu, pinned)
            .map_err(|m| ServiceError::new(ErrorCode::Unsupported, m))
    }

    fn group_info(&self, plan: &GroupPlan, started: Option<MpsInfo>) -> GroupInfo {
        let sharing = match &plan.kind {
            PlanKind::Exclusive => StrategyInfo::Exclusive,
            PlanKind::TimeSlicing(interval) => StrategyInfo::TimeSlicing {
                interval: *interval,
            },
            // Until the daemon runs, the record holds its directories (so a rollback or a
            // restarted gpushared can clean them) and pid 0.
            PlanKind::Mig { mps: None, .. } => StrategyInfo::Exclusive,
            PlanKind::Mps(launch)
            | PlanKind::Mig {
                mps: Some(launch), ..
            } => StrategyInfo::Mps(started.unwrap_or_else(|| MpsInfo {
                control_daemon_pid: 0,
                pipe_dir: launch.dirs.pipe.display().to_string(),
                log_dir: launch.dirs.log.display().to_string(),
                shm_dir: launch.dirs.shm.display().to_string(),
                visible_devices: launch.visible_devices.clone(),
                active_thread_percentage: String::new(),
                pinned_device_memory_limits: BTreeMap::new(),
                control_daemon_start_time: 0,
                requested: gpushare_proto::MpsRequested {
                    multi_user: launch.multi_user,
                    active_thread_percentage: launch.active_thread_percentage,
                    pinned_limits_mib: launch.pinned_limits_mib.clone(),
                    shm_bytes: launch.shm_bytes,
                },
                restarts: 0,
            })),
        };
        GroupInfo {
            requests: plan.requests.clone(),
            devices: plan.devices.clone(),
            sharing,
            mig: Vec::new(),
        }
    }

    fn request_devices(&self, spec: &ClaimSpec) -> Vec<RequestDevices> {
        let mut out: Vec<RequestDevices> = Vec::new();
        for r in &spec.results {
            let device = PreparedDevice {
                device: r.device.clone(),
                pool: r.pool.clone(),
                cdi_device_ids: Vec::new(),
            };
            match out.iter_mut().find(|x| x.request == r.request) {
                Some(x) => {
                    x.devices.push(r.device.clone());
                    x.per_device.push(device);
                }
                None => out.push(RequestDevices {
                    request: r.request.clone(),
                    cdi_device_ids: vec![],
                    devices: vec![r.device.clone()],
                    per_device: vec![device],
                }),
            }
        }
        let single = out.len() == 1;
        for x in &mut out {
            let claim_device =
                cdi::qualified_name(&cdi::device_name(&spec.uid, &x.request, single));
            // The claim device serves the whole request: on its last device only.
            if let Some(last) = x.per_device.last_mut() {
                last.cdi_device_ids.push(claim_device.clone());
            }
            x.cdi_device_ids = vec![claim_device];
        }
        out
    }

    /// Applies every group's strategy, then writes the CDI spec. Returns the groups as
    /// applied. On error the caller tears the claim down.
    fn apply(
        &self,
        spec: &ClaimSpec,
        plans: &[GroupPlan],
        info: &ClaimInfo,
    ) -> Result<(Vec<GroupInfo>, Vec<RequestDevices>), ServiceError> {
        let mut groups = Vec::with_capacity(plans.len());
        for plan in plans {
            if !matches!(plan.kind, PlanKind::Mig { .. }) {
                for d in &plan.devices {
                    self.leave_mig_mode(d)?;
                }
            }
            let started = match &plan.kind {
                PlanKind::Exclusive => None,
                PlanKind::TimeSlicing(interval) => {
                    for d in &plan.devices {
                        self.backend
                            .set_time_slice(&d.uuid, *interval)
                            .map_err(|e| {
                                ServiceError::new(
                                    match e {
                                        crate::gpu::GpuError::Unsupported(_) => {
                                            ErrorCode::Unsupported
                                        }
                                        crate::gpu::GpuError::Busy(_) => ErrorCode::Conflict,
                                        _ => ErrorCode::Internal,
                                    },
                                    format!(
                                        "setting time-slice {} on {}: {e}",
                                        interval.as_str(),
                                        d.device
                                    ),
                                )
                            })?;
                    }
                    crate::crash::point("prepare.gpu_settings_applied");
                    None
                }
                PlanKind::Mps(launch) => {
                    for d in &plan.devices {
                        self.backend
                            .set_compute_mode(&d.uuid, ComputeMode::ExclusiveProcess)
                            .map_err(|e| {
                                let code = match e {
                                    crate::gpu::GpuError::Busy(_) => ErrorCode::Conflict,
                                    _ => ErrorCode::Internal,
                                };
                                ServiceError::new(
                                    code,
                                    format!(
                                        "setting compute mode EXCLUSIVE_PROCESS on {}: {e}",
                                        d.device
                                    ),
                                )
                            })?;
                    }
                    crate::crash::point("prepare.gpu_settings_applied");
                    let started = self
                        .mps
                        .start(launch)
                        .map_err(|e| ServiceError::internal(format!("claim {}: {e}", spec.uid)))?;
                    crate::crash::point("prepare.mps_started");
                    // Record the pid at once, so that a failure later in this prepare stops
                    // this daemon too.
                    if let Some(c) = self.state().claims.get_mut(&spec.uid) {
                        if let Some(g) = c.groups.iter_mut().find(|g| g.devices == plan.devices) {
                            g.sharing = StrategyInfo::Mps(started.clone());
                        }
                    }
                    Some(started)
                }
                PlanKind::Mig { targets, mps } => {
                    let records = self.create_mig(&spec.uid, plan, targets)?;
                    let started = match mps {
                        None => None,
                        Some(launch) => {
                            let launch = MpsLaunch {
                                visible_devices: records.iter().map(|r| r.uuid.clone()).collect(),
                                ..launch.clone()
                            };
                            let started = self.mps.start(&launch).map_err(|e| {
                                ServiceError::internal(format!("claim {}: {e}", spec.uid))
                            })?;
                            if let Some(c) = self.state().claims.get_mut(&spec.uid) {
                                if let Some(g) =
                                    c.groups.iter_mut().find(|g| g.devices == plan.devices)
                                {
                                    g.sharing = StrategyInfo::Mps(started.clone());
                                }
                            }
                            Some(started)
                        }
                    };
                    let mut g = self.group_info(plan, started);
                    g.mig = records;
                    groups.push(g);
                    continue;
                }
            };
            groups.push(self.group_info(plan, started));
        }
        // The driver's device of each device (a MIG device just made makes the spec
        // generate again), then the claim's own spec, then the check that the runtime will
        // resolve every ID and find every device node they name.
        let requests = self
            .prepared_requests(&spec.uid, &groups, &info.requests)
            .map_err(|e| driver_spec_error(&spec.uid, e))?;
        self.write_cdi(&spec.uid, &groups, info)?;
        crate::crash::point("prepare.cdi_written");
        self.verify_cdi(&spec.uid, &requests)
            .map_err(|m| ServiceError::internal(format!("claim {}: {m}", spec.uid)))?;
        Ok((groups, requests))
    }

    fn write_cdi(
        &self,
        uid: &str,
        groups: &[GroupInfo],
        info: &ClaimInfo,
    ) -> Result<(), ServiceError> {
        let mut devices = Vec::new();
        for req in &info.requests {
            let mut edits = cdi::claim_env_edits();
            for node in self.backend.control_device_nodes() {
                cdi::merge(&mut edits, node_edit(&node));
            }
            for g in groups {
                for d in g.devices.iter().filter(|d| d.request == req.request) {
                    if let Some(gpu) = self.backend.find(&d.uuid) {
                        for node in self.backend.gpu_device_nodes(gpu) {
                            cdi::merge(&mut edits, node_edit(&node));
                        }
                    }
                }
                for m in g.mig.iter().filter(|m| m.request == req.request) {
                    if let (Some(gpu), Some(ci)) = (self.backend.find(&m.gpu_uuid), m.ci_id) {
                        for node in self.backend.mig_device_nodes(gpu, m.gi_id, ci) {
                            cdi::merge(&mut edits, node_edit(&node));
                        }
                    }
                }
                if let StrategyInfo::Mps(m) = &g.sharing {
                    if g.requests.contains(&req.request) {
                        cdi::merge(
                            &mut edits,
                            cdi::mps_edits(Path::new(&m.pipe_dir), Path::new(&m.shm_dir)),
                        );
                    }
                }
            }
            edits.hooks = cdi::claim_hooks(&self.cfg.hook, uid);
            let name = cdi::device_name(uid, &req.request, info.requests.len() == 1);
            devices.push((name, edits));
        }
        let cdi_spec = cdi::build_spec(devices);
        self.check_nodes(cdi_spec.devices.iter().map(|d| &d.container_edits))
            .map_err(|problems| ServiceError::internal(format!("claim {uid}: {problems}")))?;
        cdi::write_spec(&self.cfg.cdi_dir, uid, &cdi_spec).map_err(|e| {
            ServiceError::internal(format!(
                "writing CDI spec for claim {uid} into {}: {e}",
                self.cfg.cdi_dir.display()
            ))
        })?;
        Ok(())
    }

    /// Checks that every device node `edits` name exists on the host as the device the driver
    /// gives it (see [`crate::gpu::nodes`]); `Err` is one line naming every node that does not.
    fn check_nodes<'a>(
        &self,
        edits: impl IntoIterator<Item = &'a ContainerEdits>,
    ) -> Result<(), String> {
        let nodes: Vec<cdi::DeviceNode> = edits
            .into_iter()
            .flat_map(|e| e.device_nodes.iter().cloned())
            .collect();
        crate::gpu::nodes::check_device_nodes(
            &nodes,
            self.devices.as_ref(),
            &self.backend.device_majors(),
        )
        .map_err(|problems| {
            let list: Vec<String> = problems.iter().map(ToString::to_string).collect();
            format!(
                "{}; containers cannot be given a device node the host lacks (the NVIDIA driver creates them: nvidia-modprobe, or nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules)",
                list.join("; ")
            )
        })
    }

    /// Checks, against the claim's spec and the driver's as the runtime will read them, that
    /// every CDI device ID of `requests` resolves and every device node they name exists
    /// (see [`Service::check_nodes`]). `Err` is one line saying what is wrong.
    fn verify_cdi(&self, uid: &str, requests: &[RequestDevices]) -> Result<(), String> {
        let mut files = Vec::new();
        if let Some(d) = &self.cfg.driver_spec {
            files.push(d.spec_path());
        }
        files.push(cdi::spec_path(&self.cfg.cdi_dir, uid));
        let registry = gpushare_cdi::Registry::load_files(&files);
        if let Some(e) = registry.errors().values().flatten().next() {
            return Err(e.to_string());
        }
        for x in requests {
            let edits = registry
                .resolve(&x.cdi_device_ids)
                .map_err(|e| format!("request {}: {e}", x.request))?;
            self.check_nodes([&edits])?;
        }
        Ok(())
    }

    /// The CDI device IDs of each prepared device of `requests`: the driver spec's device of
    /// its GPU (`GPU-<uuid>`) or MIG device (`MIG-<uuid>`, from the group's MIG records, in
    /// allocation order) first, when there is a driver spec, and on the request's last device
    /// the claim's device; `cdi_device_ids` is the same, flattened.
    ///
    /// # Errors
    /// The driver spec cannot be had, or lacks a device.
    fn prepared_requests(
        &self,
        uid: &str,
        groups: &[GroupInfo],
        requests: &[RequestDevices],
    ) -> Result<Vec<RequestDevices>, crate::driver_spec::DriverSpecError> {
        let single = requests.len() == 1;
        let mut out = requests.to_vec();
        for x in &mut out {
            // Records of daemons older than per_device have only the device names.
            if x.per_device.is_empty() {
                x.per_device = x
                    .devices
                    .iter()
                    .map(|d| PreparedDevice {
                        device: d.clone(),
                        pool: self.cfg.node_name.clone(),
                        cdi_device_ids: Vec::new(),
                    })
                    .collect();
            }
            for d in &mut x.per_device {
                d.cdi_device_ids.clear();
            }
        }
        if let Some(driver) = &self.cfg.driver_spec {
            let mut wanted: Vec<(String, String)> = Vec::new();
            let mut slots: Vec<(usize, usize)> = Vec::new();
            for (ri, x) in out.iter().enumerate() {
                let migs: Vec<&gpushare_proto::MigInstanceInfo> = groups
                    .iter()
                    .flat_map(|g| &g.mig)
                    .filter(|m| m.request == x.request)
                    .collect();
                for (di, d) in x.per_device.iter().enumerate() {
                    let device = if migs.is_empty() {
                        self.backend
                            .find(&d.device)
                            .map(|g| (g.device_name(), g.uuid.clone()))
                    } else {
                        migs.get(di)
                            .filter(|m| !m.uuid.is_empty())
                            .map(|m| (m.device.clone(), m.uuid.clone()))
                    };
                    let device = device.ok_or_else(|| {
                        crate::driver_spec::DriverSpecError::Failed(format!(
                            "no GPU or MIG device of this node is device {} of request {}",
                            d.device, x.request
                        ))
                    })?;
                    wanted.push(device);
                    slots.push((ri, di));
                }
            }
            let ids = driver.device_ids(&wanted)?;
            for ((ri, di), id) in slots.into_iter().zip(ids) {
                out[ri].per_device[di].cdi_device_ids.push(id);
            }
        }
        for x in &mut out {
            let claim_device = cdi::qualified_name(&cdi::device_name(uid, &x.request, single));
            // The claim device serves the whole request: on its last device only.
            if let Some(last) = x.per_device.last_mut() {
                last.cdi_device_ids.push(claim_device);
            }
            x.cdi_device_ids = x
                .per_device
                .iter()
                .flat_map(|d| d.cdi_device_ids.iter().cloned())
                .collect();
        }
        Ok(out)
    }

    /// Refuses, before anything is changed, a claim whose whole GPUs the driver's spec has
    /// no device for, or any claim on a node without the toolkit.
    fn check_driver_devices(&self, uid: &str, plans: &[GroupPlan]) -> Result<(), ServiceError> {
        let Some(driver) = &self.cfg.driver_spec else {
            return Ok(());
        };
        let mut wanted: Vec<(String, String)> = Vec::new();
        for p in plans {
            if matches!(p.kind, PlanKind::Mig { .. }) {
                continue;
            }
            for d in &p.devices {
                if let Some(gpu) = self.backend.find(&d.uuid) {
                    wanted.push((gpu.device_name(), gpu.uuid.clone()));
                }
            }
        }
        if wanted.is_empty() {
            // A MIG-only claim still needs the toolkit.
            driver.current().map(|_| ())
        } else {
            driver.device_ids(&wanted).map(|_| ())
        }
        .map_err(|e| driver_spec_error(uid, e))
    }

    /// Generates the driver's CDI spec again (after a MIG change, at start); a failure is
    /// logged, and claims that need the spec are refused until it works.
    pub(crate) fn regenerate_driver_spec(&self, when: &str) {
        if let Some(d) = &self.cfg.driver_spec {
            if let Err(e) = d.refresh() {
                tracing::error!(error = %e, generator = %d.generator(), when, "cannot generate the NVIDIA driver's CDI spec; claims that need it are refused until it can be");
            }
        }
    }

    /// Records `requests` as a prepared claim's CDI device IDs (they changed under it: its MIG
    /// device was made again with a new UUID).
    fn record_requests(&self, uid: &str, requests: &[RequestDevices]) -> Result<(), ServiceError> {
        let mut st = self.state();
        if let Some(c) = st.claims.get_mut(uid) {
            c.requests = requests.to_vec();
        }
        self.commit(st)
    }

    /// Admits a claim to its GPUs through their mode words, all or nothing, before it is
    /// recorded; no lock is held, so prepares of other claims and GPUs go on meanwhile.
    fn admit(&self, uid: &str, wants: &[(String, String, Want)]) -> Result<(), ServiceError> {
        let view = self.view.load();
        self.modes
            .admit(uid, wants, |uuid| view.placement.hold(uuid).cloned())
            .map_err(|c| ServiceError::new(ErrorCode::Conflict, c.0))
    }

    /// Removes a claim's GPU holds from the registry and returns them; the caller releases
    /// them with `self.modes.release` once the registry lock is dropped, which restores what
    /// the last holder leaves (interval Default after the last time-sliced claim, compute mode
    /// DEFAULT after the last MPS one) without holding up other claims.
    #[must_use = "the GPUs stay held until released through self.modes"]
    fn release_gpus(&self, st: &mut State, info: &ClaimInfo) -> Vec<(String, String, Want)> {
        for g in &info.groups {
            for d in &g.devices {
                st.placement.release(&info.uid, &d.uuid);
            }
        }
        wants_of(info)
    }

    /// Undoes everything a claim holds, whatever its state; used by unprepare (which passes
    /// the tombstone's `resource_version`: `Some`), and by a failed prepare and the start-up
    /// reconcile (`None`: a rollback leaves no tombstone, so the kubelet's retry may prepare
    /// the claim). The state `Unpreparing` is written first, so a crash part-way is finished
    /// at the next start instead of bringing the claim back. Errors are logged and the rest
    /// still runs; returns the first error.
    fn teardown(&self, uid: &str, tombstone: Option<Option<String>>) -> Option<ServiceError> {
        let info = self.state().claims.get(uid).cloned()?;
        if info.state != ClaimState::Unpreparing {
            let mut st = self.state();
            if let Some(c) = st.claims.get_mut(uid) {
                c.state = ClaimState::Unpreparing;
            }
            if let Err(e) = self.commit(st) {
                if matches!(info.state, ClaimState::Prepared | ClaimState::Degraded) {
                    // On disk the claim is still prepared: releasing it now would have a
                    // restart bring it back. Refuse, changing nothing.
                    if let Some(c) = self.state().claims.get_mut(uid) {
                        c.state = info.state;
                    }
                    return Some(e);
                }
                // A half-done prepare is rolled back at the next start anyway.
            }
        }
        crate::crash::point("unprepare.unpreparing_saved");
        let mut errors: Vec<ServiceError> = Vec::new();
        let note = |errors: &mut Vec<ServiceError>, e: ServiceError| {
            tracing::error!(claim = %uid, error = %e, "releasing claim");
            errors.push(e);
        };
        for g in &info.groups {
            if let StrategyInfo::Mps(m) = &g.sharing {
                let dirs = MpsDirs::from_pipe(Path::new(&m.pipe_dir));
                let pid = (m.control_daemon_pid > 0).then_some(m.control_daemon_pid);
                if let Err(e) = self.mps.stop(&dirs, pid) {
                    note(
                        &mut errors,
                        ServiceError::internal(format!("claim {uid}: {e}")),
                    );
                }
            }
        }
        crate::crash::point("unprepare.mps_stopped");
        // MIG instances go after the MPS control daemons that ran on them.
        if let Err(e) = self.destroy_mig(&info) {
            note(&mut errors, e);
        }
        if info.groups.iter().any(|g| !g.mig.is_empty()) {
            self.regenerate_driver_spec("after destroying a claim's MIG devices");
        }
        if let Err(e) = fsutil::remove_file_if_exists(&cdi::spec_path(&self.cfg.cdi_dir, uid)) {
            note(
                &mut errors,
                ServiceError::internal(format!("removing CDI spec of claim {uid}: {e}")),
            );
        }
        crate::crash::point("unprepare.cdi_removed");
        // No host record of the claim is being written meanwhile (one that began before saw
        // the claim Prepared and is removed with the directory; one after sees Unpreparing).
        let removed = {
            let _writes = self
                .host_record_writes
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            fsutil::remove_dir_all_if_exists(&self.claim_dir(uid))
        };
        if let Err(e) = removed {
            note(
                &mut errors,
                ServiceError::internal(format!("removing {}: {e}", self.claim_dir(uid).display())),
            );
        }
        crate::crash::point("unprepare.dirs_removed");
        let mut st = self.state();
        st.restarts.remove(uid);
        // Only a complete release frees the GPUs: while a daemon or mount may still be there,
        // the claim keeps its holds (state Unpreparing), so no other claim is placed on top of
        // it, and the next unprepare or prepare of this claim finishes the job.
        let mut freed = Vec::new();
        if errors.is_empty() {
            freed = self.release_gpus(&mut st, &info);
            st.claims.remove(uid);
            if let Some(resource_version) = tombstone {
                st.claim_generation += 1;
                let t = Tombstone {
                    generation: st.claim_generation,
                    resource_version,
                    released_at: now_secs(),
                };
                st.tombstones.insert(uid.to_string(), t);
                crate::checkpoint::prune_tombstones(&mut st.tombstones, now_secs());
            }
        }
        if let Err(e) = self.commit(st) {
            note(&mut errors, e);
        }
        self.modes.release(self.backend.as_ref(), &freed);
        errors.into_iter().next()
    }

    /// The pid of a claim's MPS control daemon known to be gone, if any. A daemon whose state
    /// cannot be read (say, `/proc` is out of reach for want of file descriptors) is not
    /// taken for gone: tearing down a healthy claim would be worse than waiting.
    fn dead_mps_daemon(&self, claim: &ClaimInfo) -> Option<i32> {
        claim.groups.iter().find_map(|g| match &g.sharing {
            StrategyInfo::Mps(m) => {
                let dirs = MpsDirs::from_pipe(Path::new(&m.pipe_dir));
                match self.mps.liveness(&dirs, m.control_daemon_pid) {
                    Liveness::Gone => Some(m.control_daemon_pid),
                    Liveness::Running => None,
                    Liveness::Unknown(why) => {
                        tracing::warn!(claim = %claim.uid, pid = m.control_daemon_pid, error = %why, "cannot tell whether the MPS control daemon runs");
                        None
                    }
                }
            }
            _ => None,
        })
    }

    /// Releases a claim: stops its MPS control daemons (quit, bounded, then kill), restores
    /// GPU settings the last holder leaves, removes its directories and CDI spec and its
    /// checkpoint entry. Idempotent: an unknown claim returns `released: false`.
    ///
    /// # Errors
    /// `InvalidRequest` for a malformed UID; `Internal` when some host step failed (the claim
    /// stays recorded so a retry finishes the job).
    pub fn unprepare(&self, uid: &str) -> Result<UnprepareResult, ServiceError> {
        config::validate_claim_uid(uid)?;
        let _busy = self.begin_change()?;
        let _claim = self.changes.lock(uid);
        let Some(info) = self.state().claims.get(uid).cloned() else {
            return Ok(UnprepareResult {
                uid: uid.to_string(),
                released: false,
            });
        };
        if !info.attached.is_empty() {
            tracing::warn!(claim = %uid, containers = info.attached.len(), "releasing a claim that still has containers attached");
        }
        match self.teardown(uid, Some(info.resource_version.clone())) {
            None => {
                self.wake_supervisor();
                tracing::info!(claim = %uid, "claim released");
                Ok(UnprepareResult {
                    uid: uid.to_string(),
                    released: true,
                })
            }
            Some(e) => Err(e),
        }
    }

    /// Ties a container to its claim (called by the hook at `createRuntime`). Idempotent per
    /// container id.
    ///
    /// # Errors
    /// `NotFound` for an unknown claim, `NotReady` when the claim or its MPS control daemon is
    /// not ready, `LimitReached` at the claim's `replicas`.
    pub fn attach(&self, p: &AttachParams) -> Result<Attachment, ServiceError> {
        config::validate_claim_uid(&p.claim_uid)?;
        if p.container_id.is_empty() {
            return Err(ServiceError::new(
                ErrorCode::InvalidRequest,
                "container_id is empty",
            ));
        }
        if let Some(pid) = p.pid.filter(|pid| *pid <= 0) {
            return Err(ServiceError::new(
                ErrorCode::InvalidRequest,
                format!("pid must be a positive process id, got {pid}"),
            ));
        }

        // What reads /proc (the container's cgroup, whether the claim's MPS control daemon
        // runs) is done before taking the registry lock, on the published view. Only for a
        // claim seen Prepared: any other state (Degraded with its reason, above all) is
        // answered under the lock.
        let cgroup = p.pid.and_then(read_cgroup);
        let seen = self.view.load();
        if let Some(claim) = seen
            .claims
            .get(&p.claim_uid)
            .filter(|c| c.state == ClaimState::Prepared)
        {
            if let Some(pid) = self.dead_mps_daemon(claim) {
                return Err(ServiceError::new(
                    ErrorCode::NotReady,
                    format!(
                        "claim {}: its MPS control daemon (pid {pid}) is not running",
                        p.claim_uid
                    ),
                ));
            }
        }

        let mut st = self.state();
        let claim = st.claims.get(&p.claim_uid).ok_or_else(|| {
            ServiceError::new(
                ErrorCode::NotFound,
                format!(
                    "claim {} is not prepared on node {}",
                    p.claim_uid, self.cfg.node_name
                ),
            )
        })?;
        if claim.state == ClaimState::Degraded {
            let what = if mig_recover::slice_lost(claim) {
                "release the claim; it can be prepared again once its MIG slice can be made"
            } else {
                "gpushared is restarting its MPS control daemon, retry later"
            };
            return Err(ServiceError::new(
                ErrorCode::NotReady,
                format!(
                    "claim {} is Degraded ({}); {what}",
                    p.claim_uid,
                    claim
                        .last_error
                        .as_deref()
                        .unwrap_or("MPS control daemon died")
                ),
            ));
        }
        if claim.state != ClaimState::Prepared {
            return Err(ServiceError::new(
                ErrorCode::NotReady,
                format!("claim {} is {:?}, not ready", p.claim_uid, claim.state),
            ));
        }
        if let Some(a) = claim
            .attached
            .iter()
            .find(|a| a.container_id == p.container_id)
        {
            if a.pid == p.pid {
                return Ok(a.clone());
            }
            // The same container id started again (a restart in place): its record follows
            // the new process, so that the old pid's death does not free a live slot.
            let updated = Attachment {
                pid: p.pid,
                cgroup: cgroup.clone(),
                bundle: p.bundle.clone(),
                ..a.clone()
            };
            if let Some(c) = st.claims.get_mut(&p.claim_uid) {
                if let Some(slot) = c
                    .attached
                    .iter_mut()
                    .find(|x| x.container_id == p.container_id)
                {
                    *slot = updated.clone();
                }
            }
            self.commit(st)?;
            self.write_host_record(&p.claim_uid);
            return Ok(updated);
        }
        // A container whose init process is gone and whose poststop hook never ran (runtime
        // crash, node reboot) must not hold a slot forever.
        let stale: Vec<String> = claim
            .attached
            .iter()
            .filter(|a| a.pid.is_some_and(|pid| !self.processes.alive(pid)))
            .map(|a| a.container_id.clone())
            .collect();
        if !stale.is_empty() {
            tracing::warn!(claim = %p.claim_uid, containers = ?stale, "detaching containers whose process is gone");
            if let Some(c) = st.claims.get_mut(&p.claim_uid) {
                c.attached.retain(|a| !stale.contains(&a.container_id));
            }
        }
        let Some(claim) = st.claims.get(&p.claim_uid) else {
            return Err(ServiceError::internal("claim vanished while attaching"));
        };
        if let Some(limit) = claim.attach_limit {
            if claim.attached.len() >= limit as usize {
                return Err(ServiceError::new(
                    ErrorCode::LimitReached,
                    format!(
                        "claim {} ({}/{}) already has {} of {limit} containers attached (replicas: {limit})",
                        p.claim_uid,
                        claim.namespace,
                        claim.name,
                        claim.attached.len()
                    ),
                ));
            }
        }
        let attachment = Attachment {
            claim_uid: p.claim_uid.clone(),
            container_id: p.container_id.clone(),
            pid: p.pid,
            cgroup,
            bundle: p.bundle.clone(),
            attached_at: now_secs(),
        };
        if let Some(c) = st.claims.get_mut(&p.claim_uid) {
            c.attached.push(attachment.clone());
        }
        if let Err(e) = self.commit(st) {
            if let Some(c) = self.state().claims.get_mut(&p.claim_uid) {
                c.attached.retain(|a| a.container_id != p.container_id);
            }
            return Err(e);
        }
        self.write_host_record(&p.claim_uid);
        tracing::info!(claim = %p.claim_uid, container = %p.container_id, pid = ?p.pid, "container attached");
        Ok(attachment)
    }

    /// Unties a container from its claim (called by the hook at `poststop`). Idempotent.
    ///
    /// # Errors
    /// `InvalidRequest` for a malformed UID; `Internal` if the checkpoint cannot be written.
    pub fn detach(&self, p: &DetachParams) -> Result<DetachResult, ServiceError> {
        config::validate_claim_uid(&p.claim_uid)?;
        let mut st = self.state();
        let Some(claim) = st.claims.get_mut(&p.claim_uid) else {
            return Ok(DetachResult { detached: false });
        };
        let before = claim.attached.len();
        claim.attached.retain(|a| a.container_id != p.container_id);
        let detached = claim.attached.len() != before;
        if detached {
            self.commit(st)?;
            self.write_host_record(&p.claim_uid);
            tracing::info!(claim = %p.claim_uid, container = %p.container_id, "container detached");
        }
        Ok(DetachResult { detached })
    }

    /// One claim.
    ///
    /// # Errors
    /// `InvalidRequest` for a malformed UID, `NotFound`.
    pub fn get_claim(&self, uid: &str) -> Result<ClaimInfo, ServiceError> {
        config::validate_claim_uid(uid)?;
        self.view
            .load()
            .claims
            .get(uid)
            .map(|c| ClaimInfo::clone(c))
            .ok_or_else(|| {
                ServiceError::new(ErrorCode::NotFound, format!("no claim {uid} on this node"))
            })
    }

    /// All claims, by UID.
    pub fn list_claims(&self) -> Vec<ClaimInfo> {
        self.view
            .load()
            .claims
            .values()
            .map(|c| ClaimInfo::clone(c))
            .collect()
    }

    /// All GPUs with their settings and holders.
    pub fn list_gpus(&self) -> Vec<GpuInfo> {
        let st = self.view.load();
        self.backend
            .gpus()
            .iter()
            .map(|g| {
                let hold = st.placement.hold(&g.uuid);
                let mut info = GpuInfo {
                    compute_mode: self.backend.compute_mode(&g.uuid).unwrap_or_default(),
                    time_slice: self.backend.time_slice(&g.uuid).unwrap_or_default(),
                    sharing: hold.map_or(GpuSharing::Free, |h| h.sharing()),
                    claims: hold.map(|h| h.claims()).unwrap_or_default(),
                    ..g.info()
                };
                // MIG mode and instances change at runtime: read them live.
                if let Some((mode, devices)) = self.live_mig(g) {
                    info.mig_enabled = mode.current;
                    info.mig_pending = Some(mode.pending);
                    info.mig_devices = devices;
                    info.mig_partitions = crate::mig::partitions::for_gpu(
                        &g.product_name,
                        mode.current,
                        mode.pending,
                        &info.mig_devices,
                    );
                }
                info
            })
            .collect()
    }

    /// Liveness and readiness.
    pub fn health(&self) -> HealthInfo {
        let st = self.view.load();
        HealthInfo {
            ready: st.ready,
            node_name: self.cfg.node_name.clone(),
            gpus: self.backend.gpus().len(),
            claims: st.claims.len(),
            backend: self.backend.describe(),
            mps_control: self.mps.program().display().to_string(),
            checkpoint_quarantined: st.quarantined.clone(),
            quarantined_records: st.quarantined_records.clone(),
            checkpoint_error: st.checkpoint_error.clone(),
            degraded_claims: st
                .claims
                .values()
                .filter(|c| c.state == ClaimState::Degraded)
                .count(),
            stopping: st.stopping,
            drivers: self.cfg.drivers.clone(),
        }
    }
}

/// Makes every held GPU show the settings its holders asked for: after a restart the
/// checkpoint is the truth, and a GPU reset or another tool may have changed them meanwhile.
/// Idempotent; GPUs nobody holds are left alone.
fn reapply_gpu_settings(backend: &dyn GpuBackend, placement: &Placement) {
    for gpu in backend.gpus() {
        let name = gpu.device_name();
        match placement.hold(&gpu.uuid) {
            Some(Hold::TimeSliced { interval, .. }) => {
                if backend.time_slice(&gpu.uuid).ok() != Some(*interval) {
                    tracing::warn!(gpu = %name, interval = interval.as_str(), "time-slice interval differs from what its claims asked; re-applying");
                    if let Err(e) = backend.set_time_slice(&gpu.uuid, *interval) {
                        tracing::error!(gpu = %name, error = %e, "re-applying the time-slice interval");
                    }
                }
            }
            Some(Hold::Mps(_)) => {
                if backend.compute_mode(&gpu.uuid).ok() != Some(ComputeMode::ExclusiveProcess) {
                    tracing::warn!(gpu = %name, "compute mode is not EXCLUSIVE_PROCESS under an MPS claim; re-applying");
                    if let Err(e) =
                        backend.set_compute_mode(&gpu.uuid, ComputeMode::ExclusiveProcess)
                    {
                        tracing::error!(gpu = %name, error = %e, "re-applying compute mode");
                    }
                }
            }
            Some(Hold::Exclusive(_) | Hold::Mig(_)) | None => {}
        }
    }
}

/// What each GPU of a claim record wants, for (re)building placement.
/// A MIG group's devices are MIG devices; whatever its sharing, it holds its GPUs as `Mig`,
/// once per GPU.
fn wants_of(info: &ClaimInfo) -> Vec<(String, String, Want)> {
    let mut out: Vec<(String, String, Want)> = Vec::new();
    for g in &info.groups {
        for d in &g.devices {
            let want = if crate::mig::MigDeviceName::parse(&d.device).is_some() {
                if out.iter().any(|(u, _, w)| *u == d.uuid && *w == Want::Mig) {
                    continue;
                }
                Want::Mig
            } else {
                match &g.sharing {
                    StrategyInfo::Exclusive => Want::Exclusive,
                    StrategyInfo::TimeSlicing { interval } => Want::TimeSlicing(*interval),
                    StrategyInfo::Mps(_) => Want::Mps,
                }
            };
            let name = if want == Want::Mig {
                format!("gpu-{}", d.minor)
            } else {
                d.device.clone()
            };
            out.push((d.uuid.clone(), name, want));
        }
    }
    out
}

/// A driver-spec failure as a prepare's answer: `Unsupported` on a node without the toolkit,
/// `Internal` otherwise; one line.
fn driver_spec_error(uid: &str, e: crate::driver_spec::DriverSpecError) -> ServiceError {
    let code = match e {
        crate::driver_spec::DriverSpecError::NotInstalled(_) => ErrorCode::Unsupported,
        _ => ErrorCode::Internal,
    };
    ServiceError::new(code, format!("claim {uid}: {e}"))
}

fn node_edit(node: &crate::gpu::DeviceNode) -> ContainerEdits {
    ContainerEdits {
        device_nodes: vec![cdi::device_node(&node.path, &node.host_path)],
        ..ContainerEdits::default()
    }
}

/// The configuration every service unit test uses: everything under `root`, a hook that is
/// never run, a 1 MiB shm size.
#[cfg(test)]
impl ServiceConfig {
    pub(crate) fn for_tests(root: &Path, node_name: &str) -> ServiceConfig {
        ServiceConfig {
            node_name: node_name.into(),
            drivers: vec!["gpu.nvidia.com".into()],
            run_dir: root.join("run"),
            cdi_dir: root.join("cdi"),
            checkpoint: root.join("state/checkpoint.json"),
            hook: HookConfig {
                path: "/usr/bin/gpushare-cdi-hook".into(),
                socket: "/run/gpushare/gpushared.sock".into(),
                timeout_secs: 10,
            },
            shm_bytes: Some(1 << 20),
            driver_spec: None,
        }
    }
}

#[cfg(test)]
mod mig_tests;
#[cfg(test)]
mod tests;
