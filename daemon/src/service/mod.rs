//! The claim service: prepare, unprepare, attach, detach and the read-only views.
//!
//! Methods are blocking (they spawn processes and fsync files); the server runs them on
//! tokio's blocking pool. Changing a claim's host setup (prepare, unprepare) is serialized per
//! claim UID, so two kubelet retries of one claim can never interleave while other claims go
//! on. A claim is admitted to its GPUs by each GPU's lock-free mode word (`modes`), before and
//! outside the registry mutex; a release restores GPU settings after dropping it. The
//! registry mutex is held briefly by changes and never across a process spawn or NVML call;
//! readers never take it: they read the view published after every change (`view`).
//!
//! The service is two parts with their own invariants and what coordinates requests:
//! `records.rs` (the registry, its published view, the changes queued for the store and
//! their group commit) and `host.rs` (the GPU backend, MPS control, processes, device nodes,
//! the GPUs' mode words, the MIG intents). The operations are `ops/` (one per request), each
//! a few short named steps; the start-up reconcile is `startup/`, in the order
//! `docs/crash-safety.md` gives.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use gpushare_proto::ErrorCode;

use crate::admission::GpuModes;
use crate::cdi::HookConfig;
use crate::claim::Claim;
use crate::config::ParseContext;
use crate::error::ServiceError;
use crate::gpu::GpuBackend;
use crate::placement::Placement;
use crate::registry::{Claims, Registry, Tombstones};
use crate::store::Store;
use crate::strategy::mps::{MpsControl, Restarts, Watches};
use crate::sys::Processes;
use gpushare_core::Published;
use gpushare_core::Want;

mod apply;
mod asked;
mod cdi_spec;
mod effects;
mod host;
mod liveness;
mod locks;
mod mig;
mod mig_effects;
mod missing_gpus;
mod ops;
mod orphans;
mod persisted;
mod plan;
mod quarantine_name;
mod reconcile;
mod records;
mod restarts;
mod revive;
mod startup;
mod stop;
#[cfg(test)]
mod testing;
mod view;
pub use crate::strategy::mps::{restart_backoff, SupervisedDaemon};
use host::Host;
use locks::ClaimLocks;
pub use reconcile::BOOT_ID_PATH;
use records::Records;
pub use stop::registry_answers;
#[cfg(test)]
pub(crate) use testing::RecordsOnDisk;
use view::{Pending, StateGuard, View};

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
pub(crate) struct State {
    claims: Claims,
    placement: Placement,
    ready: bool,
    /// Boot ID written into the checkpoint.
    boot_id: String,
    /// Last claim generation handed out (see `Claim::generation` and tombstones).
    claim_generation: u64,
    tombstones: Tombstones,
    /// A corrupt checkpoint found at start: where it went and why.
    quarantined: Option<String>,
    /// Claim records refused at start, one line each (see `HealthInfo::quarantined_records`).
    quarantined_records: Vec<String>,
    /// Error of the last checkpoint write, cleared by the next one that succeeds.
    checkpoint_error: Option<String>,
    /// SIGTERM: changing requests are refused.
    stopping: bool,
    /// Restarts of dead MPS control daemons, by claim UID.
    restarts: Restarts,
    /// Counts changes; the published view and the checkpoint on disk say which they hold.
    change: u64,
}

/// The claim service, in two parts with their own invariants (`Records`: the claims as
/// recorded, in memory, published and on disk; `Host`: the leaves through which it changes
/// the node) and what coordinates requests (per-claim locks, requests in flight, the
/// supervisor's wake-up).
#[derive(Debug)]
pub struct Service {
    cfg: ServiceConfig,
    ctx: ParseContext,
    /// The claims as recorded.
    records: Records,
    /// The node's leaves.
    host: Host,
    changes: ClaimLocks,
    /// Prepares and unprepares under way, for a graceful stop.
    in_flight: (Mutex<usize>, Condvar),
    /// Wakes the supervisor when the set of MPS control daemons changes.
    supervisor_wake: Mutex<Option<std::os::unix::net::UnixStream>>,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
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
        let boot_id = mps.ops().machine.boot_id();
        Service::with_boot_id(cfg, backend, mps, boot_id)
    }

    /// As [`Service::new`], with the host's boot ID given. At start every checkpointed claim
    /// is reconciled: an MPS control daemon whose pid, start time and control round trip match
    /// is re-adopted as it runs; a dead one is restarted with its limits re-applied and read
    /// back; `PrepareStarted` and `Unpreparing` claims are rolled back; directories, mounts,
    /// MPS control daemons and CDI specs of ours that no claim owns are removed; after a reboot
    /// (another boot ID) every claim's host setup is redone; then MIG instances that gpushare
    /// made and no remaining claim owns (a crash between making and recording them) are
    /// destroyed, those made by others kept, and last each
    /// prepared claim's MIG slice that vanished meanwhile is recreated at its placement (or
    /// the claim is `Degraded`); then the NVIDIA driver's CDI spec is generated, once, and
    /// the CDI IDs of claims whose slices were made again are checked against it. Only then
    /// is it ready.
    ///
    /// # Errors
    /// The checkpoint exists but cannot be read or moved aside.
    pub fn with_boot_id(
        cfg: ServiceConfig,
        backend: Arc<dyn GpuBackend>,
        mps: MpsControl,
        boot_id: String,
    ) -> Result<Service, ServiceError> {
        let store = Store::beside(&cfg.checkpoint);
        let loaded = store.load().map_err(|e| {
            ServiceError::internal(format!(
                "reading the claim records in {}: {e}",
                store.dir().display()
            ))
        })?;
        // The mode words start with every GPU free; the reconcile takes the checkpointed
        // claims' holds on them (before it rolls any claim back through teardown, which
        // releases through them) and publishes the view as it goes.
        let modes = GpuModes::new(backend.gpus());
        let view = Published::new(View::default());
        let ctx = ParseContext {
            node_name: cfg.node_name.clone(),
            drivers: cfg.drivers.clone(),
        };
        let cfg_run_dir = cfg.run_dir.clone();
        let service = Service {
            cfg,
            ctx,
            records: Records {
                store,
                state: Mutex::new(State::default()),
                pending: Mutex::new(Pending::default()),
                view,
                on_disk: Mutex::new(0),
            },
            host: Host {
                backend,
                processes: Arc::clone(&mps.ops().processes),
                devices: Arc::clone(&mps.ops().devices),
                mps,
                watches: Watches::default(),
                modes,
                host_record_writes: Mutex::new(()),
                mig_intents: crate::strategy::mig::MigIntents::new(&cfg_run_dir),
            },
            changes: ClaimLocks::default(),
            in_flight: (Mutex::new(0), Condvar::new()),
            supervisor_wake: Mutex::new(None),
        };
        // Generates the driver's spec too, once, after the MIG devices it destroys or makes again.
        service.reconcile(loaded, boot_id);
        Ok(service)
    }

    /// The leaf through which other processes are watched and signalled.
    pub(crate) fn processes(&self) -> &Arc<dyn Processes> {
        &self.host.processes
    }

    /// The registry, locked ([`Records::state`]).
    pub(super) fn state(&self) -> StateGuard<'_> {
        self.records.state()
    }

    /// Unlocks the registry after a change and makes it durable ([`Records::commit`]).
    fn commit(&self, st: StateGuard<'_>) -> Result<(), ServiceError> {
        self.records.commit(st)
    }

    fn claim_dir(&self, uid: &str) -> PathBuf {
        self.cfg.run_dir.join("claims").join(uid)
    }

    /// Admits a claim to its GPUs through their mode words, all or nothing, before it is
    /// recorded; no lock is held, so prepares of other claims and GPUs go on meanwhile.
    fn admit(&self, uid: &str, wants: &[(String, String, Want)]) -> Result<(), ServiceError> {
        let view = self.records.view.load();
        self.host
            .modes
            .admit(uid, wants, |uuid| view.placement.hold(uuid).cloned())
            .map_err(|c| ServiceError::new(ErrorCode::Conflict, c.0))
    }

    /// Removes a claim's GPU holds from the registry and returns them; the caller releases
    /// them with `self.host.modes.release` once the registry lock is dropped, which restores what
    /// the last holder leaves (interval Default after the last time-sliced claim, compute mode
    /// DEFAULT after the last MPS one) without holding up other claims.
    #[must_use = "the GPUs stay held until released through self.host.modes"]
    fn release_gpus(&self, st: &mut State, info: &Claim) -> Vec<(String, String, Want)> {
        for g in &info.groups {
            for d in &g.devices {
                st.placement.release(&info.uid, &d.uuid);
            }
        }
        wants_of(info)
    }

    /// The pid of a claim's MPS control daemon known to be gone, if any
    /// ([`crate::strategy::mps::dead_daemon`]).
    fn dead_mps_daemon(&self, claim: &Claim) -> Option<i32> {
        crate::strategy::mps::dead_daemon(&self.host.mps, claim)
    }
}

impl Registry for Service {
    type State = State;
    type Guard<'g> = StateGuard<'g>;
    fn lock(&self) -> StateGuard<'_> {
        self.state()
    }
}

/// Makes every GPU show the settings its holders asked for: after a restart the records are
/// the truth, and a GPU reset or another tool may have changed them meanwhile. A setting no
/// holder asked for (a time-slice interval on a GPU no time-sliced claim holds, compute mode
/// EXCLUSIVE_PROCESS without an MPS claim) is put back to Default, as the last holder's
/// release would have: a gpushared killed between changing a GPU and recording its claim, or
/// between a release and the restore, leaves one behind. Only what reads back otherwise is
/// changed (no call for GPUs already right); where `[gpus] manage_*` leaves a setting to the
/// administrators the change is skipped (logged) as always. Idempotent. On NVML nodes the
/// time-slice interval cannot be read back (nvidia-smi only sets it; the backend remembers
/// what it set, from Default at each start), so there only compute mode, which NVML reads,
/// is caught; the simulation reads both.
fn reapply_gpu_settings(backend: &dyn GpuBackend, placement: &Placement) {
    for gpu in backend.gpus() {
        let name = gpu.device_name();
        let hold = placement.hold(&gpu.uuid);
        if let Some(hold) = hold {
            hold.strategy().check_again(backend, &gpu.uuid, &name);
        }
        crate::strategy::select::clear_leftovers(
            backend,
            &gpu.uuid,
            &name,
            hold.map(crate::placement::Hold::want),
        );
    }
}

/// What each GPU of a claim wants, for (re)building placement: each group's holds, as its
/// strategy says them ([`crate::strategy::GroupLife::holds`]).
/// A GPU held as `Mig` is held once per claim, however many of its groups have slices there.
fn wants_of(info: &Claim) -> Vec<(String, String, Want)> {
    let mut out: Vec<(String, String, Want)> = Vec::new();
    for hold in info
        .groups
        .iter()
        .flat_map(|g| crate::strategy::life_of(g).holds(g))
    {
        let again =
            hold.2 == Want::Mig && out.iter().any(|(u, _, w)| *u == hold.0 && *w == Want::Mig);
        if !again {
            out.push(hold);
        }
    }
    out
}

// What the service's tests (`tests.rs`, `tests/`, `mig_tests*`) take from here by glob.
#[cfg(test)]
use {
    crate::cdi,
    crate::strategy::mps::MpsDirs,
    gpushare_proto::{
        AttachParams, Attachment, ClaimInfo, ClaimState, ComputeMode, DetachParams, GpuInfo,
        GpuSharing, MpsInfo, PrepareResult, StrategyInfo,
    },
    serde_json::Value,
    std::collections::BTreeMap,
    std::path::Path,
};

// A test is a scenario read top to bottom: the 60-line rule is the operations'.
#[cfg(test)]
#[allow(clippy::too_many_lines)]
mod mig_tests;
#[cfg(test)]
#[allow(clippy::too_many_lines)]
mod tests;
