//! Crash safety of the service: the start-up reconcile, tombstones against stale prepares,
//! the restart of dead MPS control daemons (driven by [`crate::supervise`]) and the graceful
//! stop.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpushare_proto::{ClaimInfo, ClaimState, ErrorCode, StrategyInfo};

use super::persisted::{self, Quarantine, HOST_RECORD, MAX_HOST_RECORD_BYTES};
use super::{mig, now_secs, reapply_gpu_settings, wants_of, Service};
use crate::checkpoint::Loaded;
use crate::error::ServiceError;
use crate::fsutil;
use crate::strategy::mps::{launch_of, Liveness, MpsDirs};

/// Where Linux tells the current boot's ID (a new one at every boot).
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// Largest CDI spec file read when looking for orphans of ours, in bytes (ours are a few KiB).
const MAX_SPEC_BYTES: u64 = 4 << 20;

/// First delay before restarting a dead MPS control daemon; doubled after each failure.
const RESTART_BASE: Duration = Duration::from_millis(500);

/// Longest delay between two restart attempts.
const RESTART_CAP: Duration = Duration::from_secs(30);

/// A daemon that ran this long before it died counts as a new first failure.
const RESTART_STABLE: Duration = Duration::from_secs(60);

/// The cause of a restart of a daemon found dead when gpushared started.
fn not_running(old: &gpushare_proto::MpsInfo) -> String {
    format!(
        "at {} s after the epoch: MPS control daemon (pid {}) on {} was not running when gpushared started",
        now_secs(),
        old.control_daemon_pid,
        old.pipe_dir
    )
}

/// Most threads the start-up reconcile runs claims (and orphan MPS daemons) on at once. A
/// node has at most a few dozen MPS control daemons (one per GPU, or per MIG slice), so all
/// of them are stopped or restarted at once and the reconcile takes about as long as its
/// slowest claim, whose every step is bounded by the MPS timeout, however many there are.
const RECONCILE_THREADS: usize = 64;

/// Runs `work` on every item, on up to [`RECONCILE_THREADS`] threads at once (inline for a
/// single item, or when no thread can be started), and returns when all are done.
fn in_parallel<T: Sync>(items: &[T], work: impl Fn(&T) + Sync) {
    if items.len() <= 1 {
        items.iter().for_each(&work);
        return;
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let run = || loop {
        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(item) = items.get(i) else { return };
        work(item);
    };
    std::thread::scope(|s| {
        for n in 0..items.len().min(RECONCILE_THREADS) {
            let spawned = std::thread::Builder::new()
                .name(format!("reconcile-{n}"))
                .spawn_scoped(s, run);
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "cannot start another reconcile thread; going on with those running");
                break;
            }
        }
        // Whatever no thread took (none could be started) is done here.
        run();
    });
}

/// Joins the cause of a restart and why the restart failed, in `last_error`.
const RESTART_FAILED: &str = "; restarting the MPS control daemon failed";

/// Delay before restart attempt number `failures + 1` of a dead MPS control daemon:
/// 0.5 s, 1 s, 2 s, … up to 30 s.
pub fn restart_backoff(failures: u32) -> Duration {
    RESTART_BASE
        .checked_mul(1u32 << failures.min(16))
        .unwrap_or(RESTART_CAP)
        .min(RESTART_CAP)
}

/// An MPS control daemon the supervisor watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SupervisedDaemon {
    /// Its claim.
    pub claim_uid: String,
    /// Its pid.
    pub pid: i32,
    /// Its start time in clock ticks after boot (0: unknown).
    pub start_time: u64,
}

/// Restart bookkeeping of one claim's MPS control daemons.
#[derive(Debug, Default, Clone)]
pub(super) struct RestartPlan {
    /// When the next attempt is due; `None` while the daemons run.
    due: Option<Instant>,
    /// Failed attempts (or quick deaths) in a row.
    failures: u32,
    /// When a daemon of the claim was last started by a restart.
    started: Option<Instant>,
}

/// Counts a prepare or unprepare under way until dropped.
pub(super) struct InFlight<'a>(&'a Service);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let (count, done) = &self.0.in_flight;
        let mut n = count.lock().unwrap_or_else(|p| p.into_inner());
        *n = n.saturating_sub(1);
        done.notify_all();
    }
}

impl Service {
    /// Registers a changing request, or refuses it while the daemon stops.
    pub(super) fn begin_change(&self) -> Result<InFlight<'_>, ServiceError> {
        let (count, _) = &self.in_flight;
        let mut n = count.lock().unwrap_or_else(|p| p.into_inner());
        if self.state().stopping {
            return Err(ServiceError::new(
                ErrorCode::NotReady,
                "gpushared is stopping; retry when it is back",
            ));
        }
        *n += 1;
        Ok(InFlight(self))
    }

    /// Refuses a prepare older than a release of the same claim: one that arrived before the
    /// release's generation, or that carries the very claim object (same `resourceVersion`)
    /// that was released.
    pub(super) fn refuse_stale_prepare(
        &self,
        uid: &str,
        arrived: u64,
        resource_version: Option<&str>,
    ) -> Result<(), ServiceError> {
        let st = self.state();
        let Some(t) = st.tombstones.get(uid) else {
            return Ok(());
        };
        let same_object =
            resource_version.is_some() && t.resource_version.as_deref() == resource_version;
        if t.generation > arrived || same_object {
            let why = if same_object {
                format!(
                    "it carries resourceVersion {} of the claim object that was released",
                    resource_version.unwrap_or_default()
                )
            } else {
                "it arrived before the release finished".to_string()
            };
            tracing::warn!(claim = %uid, generation = t.generation, "refusing a stale prepare of a released claim");
            return Err(ServiceError::new(
                ErrorCode::Stale,
                format!(
                    "claim {uid} was released (at {} s after the epoch, generation {}) and this prepare is older: {why}; nothing was changed",
                    t.released_at, t.generation
                ),
            ));
        }
        Ok(())
    }

    /// Writes `<run-dir>/claims/<uid>/claim.json`, the copy a missing or corrupt checkpoint is
    /// rebuilt from, unless it already holds exactly this record: a restart re-checks every claim,
    /// and a durable rewrite per claim made restart-to-ready grow by ~0.6 ms per claim
    /// (BENCHMARKS.md, "Recovery"). A failure is logged only: the checkpoint stays the record.
    /// Attachments are in it too (written at every attach and detach; the run directory is a
    /// tmpfs, where this costs no disk flush), so a rebuilt claim keeps its containers' slots.
    ///
    /// What is written is the claim as the registry holds it when the write begins, under one
    /// lock for all host-record writes, so that of two changes written at once the later one
    /// is what stays on disk. Only a `Prepared` or `Degraded`
    /// claim has one: a release under way (`Unpreparing`, set before its directory goes) is
    /// never written back.
    pub(super) fn write_host_record(&self, uid: &str) {
        let _writes = self
            .host_record_writes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let Some(info) = self
            .state()
            .claims
            .get(uid)
            .filter(|c| matches!(c.state, ClaimState::Prepared | ClaimState::Degraded))
            .cloned()
        else {
            return;
        };
        let dir = self.claim_dir(&info.uid);
        let result = fsutil::create_dir_if_missing(&dir, 0o755).and_then(|()| {
            let bytes = serde_json::to_vec(&info).map_err(std::io::Error::other)?;
            let path = dir.join(HOST_RECORD);
            if fsutil::read_own_file(&path, MAX_HOST_RECORD_BYTES)
                .is_ok_and(|on_disk| on_disk == bytes)
            {
                return Ok(());
            }
            fsutil::write_atomic(&path, &bytes, 0o600)
        });
        if let Err(e) = result {
            tracing::warn!(claim = %info.uid, error = %e, "writing the claim's host record");
        }
    }

    /// The claims to reconcile: the checkpoint's entries that pass [`persisted::check_record`],
    /// and the host record of every claim the checkpoint does not hold (all of them when it
    /// was missing or corrupt): a claim with a valid host record is never taken for no claim's.
    /// A host record older than its claim's tombstone is of a claim released since: its release
    /// is finished (as `Unpreparing`). Refused records are kept in the quarantine.
    fn claims_to_reconcile(&self, loaded: &mut Loaded) -> BTreeMap<String, ClaimInfo> {
        let quarantine = Quarantine::beside(&self.cfg.checkpoint);
        let cp = &mut loaded.checkpoint;
        let mut claims = BTreeMap::new();
        for (key, mut info) in std::mem::take(&mut cp.claims) {
            match persisted::check_record(&info, &key, &self.cfg.run_dir) {
                Ok(()) => {
                    persisted::normalize(&mut info, &self.cfg.cdi_dir);
                    claims.insert(key, info);
                }
                Err(why) => {
                    let bytes = serde_json::to_vec(&info).ok();
                    quarantine.keep(
                        "checkpoint-claim",
                        &self.cfg.checkpoint,
                        &key,
                        bytes.as_deref(),
                        &why,
                    );
                }
            }
        }
        cp.tombstones
            .retain(|uid, _| crate::config::validate_claim_uid(uid).is_ok());
        let rebuilt =
            persisted::host_records(&self.cfg.run_dir, &self.cfg.cdi_dir, &quarantine, |uid| {
                claims.contains_key(uid)
            });
        if loaded.missing && rebuilt.is_empty() {
            tracing::info!(
                path = %self.cfg.checkpoint.display(),
                "no checkpoint and no host records: a node without claims (a first start)"
            );
        } else if loaded.missing {
            tracing::warn!(
                path = %self.cfg.checkpoint.display(),
                host_records = rebuilt.len(),
                "no checkpoint found; rebuilding the claims from their host records (a missing checkpoint is not a node without claims)"
            );
        } else if loaded.quarantined.is_none() && !rebuilt.is_empty() {
            tracing::warn!(
                claims = ?rebuilt.keys().collect::<Vec<_>>(),
                "the checkpoint lacks claims that have host records; rebuilding them from those"
            );
        }
        for (uid, mut info) in rebuilt {
            if let Some(t) = cp
                .tombstones
                .get(&uid)
                .filter(|t| t.generation > info.generation)
            {
                tracing::warn!(claim = %uid, released_generation = t.generation, record_generation = info.generation, "the host record is of a claim released since; finishing its release");
                info.state = ClaimState::Unpreparing;
            }
            claims.insert(uid, info);
        }
        self.state().quarantined_records = quarantine.refused();
        claims
    }

    /// The start-up reconcile (see [`Service::with_boot_id`]).
    pub(super) fn reconcile(&self, mut loaded: Loaded, boot_id: String) {
        let claims = self.claims_to_reconcile(&mut loaded);
        let cp = loaded.checkpoint;
        let rebooted = !cp.boot_id.is_empty() && !boot_id.is_empty() && cp.boot_id != boot_id;
        {
            let mut st = self.state();
            st.boot_id = boot_id;
            st.claim_generation = cp.generation;
            st.tombstones = cp.tombstones;
            if let Some((aside, why)) = &loaded.quarantined {
                tracing::error!(moved_to = %aside.display(), reason = %why, "checkpoint was corrupt; moved aside, rebuilding the claims from their host records");
                st.quarantined = Some(format!("moved to {}: {why}", aside.display()));
            }
        }
        if rebooted {
            tracing::warn!("the host was rebooted since the checkpoint was written; redoing every claim's host setup");
        }
        {
            let mut st = self.state();
            for (uid, mut info) in claims {
                if let Err(e) = st.placement.reserve(&uid, &wants_of(&info)) {
                    tracing::error!(claim = %uid, error = %e, "checkpointed claim conflicts with another; not re-adopted");
                    continue;
                }
                if rebooted {
                    // No container survives a reboot.
                    info.attached.clear();
                }
                st.claim_generation = st.claim_generation.max(info.generation);
                st.claims.insert(uid, info);
            }
            // The GPUs' mode words hold what the checkpointed claims hold from here on, so that
            // the rollbacks below release through them (restoring a GPU's settings when its
            // last holder goes) like any other release.
            self.modes.take_holds(&st.placement);
        }
        let uids: Vec<(String, ClaimState)> = self
            .state()
            .claims
            .values()
            .map(|c| (c.uid.clone(), c.state))
            .collect();
        // Half-started MPS daemons of claims about to be rolled back (and of no claim at all)
        // go first: one still starting holds no lock yet and would keep writing into the
        // directories the rollback removes.
        let live_groups: Vec<PathBuf> = self
            .state()
            .claims
            .values()
            .filter(|c| matches!(c.state, ClaimState::Prepared | ClaimState::Degraded))
            .flat_map(|c| c.groups.iter())
            .filter_map(|g| match &g.sharing {
                StrategyInfo::Mps(m) => Some(MpsDirs::from_pipe(Path::new(&m.pipe_dir)).root),
                _ => None,
            })
            .collect();
        self.kill_stray_mps_processes(&self.cfg.run_dir.join("claims"), &live_groups);
        // All claims at once: each claim's rollback or re-adoption waits on its own MPS
        // control daemons (a `quit` that is not taken waits out the MPS timeout before the
        // kill), so one after another a start that cannot re-adopt them (say, after the MPS
        // control program changed) took that wait once per claim.
        in_parallel(&uids, |(uid, state)| match state {
            ClaimState::PrepareStarted | ClaimState::Unpreparing => {
                tracing::warn!(claim = %uid, ?state, "rolling back a claim a crash left half-done");
                if let Some(e) = self.teardown(uid, None) {
                    tracing::error!(claim = %uid, error = %e, "rolling back; the next unprepare or prepare of the claim retries");
                }
            }
            ClaimState::Prepared | ClaimState::Degraded => self.revive(uid, rebooted),
        });
        self.remove_orphans();
        // After the rollbacks, so that only what the remaining claims asked is applied.
        reapply_gpu_settings(self.backend.as_ref(), &self.state().placement);
        // After the rollbacks too (which destroyed the rolled-back claims' MIG instances): the
        // sweep destroys MIG instances that neither a remaining claim nor the node's MIG
        // layout record owns, such as one a crash left between creating and recording it.
        {
            let st = self.state();
            mig::sweep_at_start(self.backend.as_ref(), &self.cfg.run_dir, st.claims.values());
        }
        // Then the MIG slices of prepared claims that vanished while gpushared was away (a GPU
        // reset, a destroy by hand): recreated at their placements, or the claim is Degraded
        // (service/mig_recover.rs).
        self.reconcile_mig_claims();
        let mut st = self.state();
        st.ready = true;
        tracing::info!(
            claims = st.claims.len(),
            degraded = st
                .claims
                .values()
                .filter(|c| c.state == ClaimState::Degraded)
                .count(),
            "reconciled the host with the checkpoint"
        );
        // Written even when nothing changed: the file then holds this boot's ID.
        let _ = self.commit(st);
    }

    /// Re-adopts or restarts the MPS control daemons of a prepared claim and makes sure its
    /// CDI spec exists.
    fn revive(&self, uid: &str, rebooted: bool) {
        let Some(info) = self.state().claims.get(uid).cloned() else {
            return;
        };
        for g in &info.groups {
            let StrategyInfo::Mps(m) = &g.sharing else {
                continue;
            };
            if !rebooted && m.control_daemon_pid > 0 {
                match self.mps.check_adoptable(m) {
                    Ok(()) => {
                        tracing::info!(claim = %uid, pid = m.control_daemon_pid, "re-adopted the running MPS control daemon");
                        continue;
                    }
                    Err(why) => {
                        tracing::warn!(claim = %uid, pid = m.control_daemon_pid, reason = %why, "MPS control daemon cannot be re-adopted; restarting it")
                    }
                }
            }
            let _ = self.restart_group(uid, &m.pipe_dir, !rebooted);
        }
        let info = self.state().claims.get(uid).cloned();
        if let Some(info) = info {
            // Ours is a regular file: anything else there (a link, a fifo) is replaced.
            if !fs::symlink_metadata(&info.cdi_spec).is_ok_and(|m| m.is_file()) {
                tracing::warn!(claim = %uid, "CDI spec missing; writing it again");
                if let Err(e) = self.write_cdi(uid, &info.groups, &info) {
                    tracing::error!(claim = %uid, error = %e, "rewriting the CDI spec");
                }
            }
            self.write_host_record(uid);
        }
    }

    /// Starts the MPS control daemon of `uid`'s group on `pipe_dir` again, with its limits as
    /// asked, read back. `counted`: a restart after a death (counted in `restarts`), not the
    /// redo after a reboot. On failure the claim is `Degraded` with the error and a retry is
    /// scheduled with backoff.
    fn restart_group(&self, uid: &str, pipe_dir: &str, counted: bool) -> Result<(), String> {
        let old = self.state().claims.get(uid).and_then(|c| {
            c.groups.iter().find_map(|g| match &g.sharing {
                StrategyInfo::Mps(m) if m.pipe_dir == pipe_dir => Some(m.clone()),
                _ => None,
            })
        });
        let Some(old) = old else {
            return Ok(());
        };
        let result = self.mps.restart(&launch_of(&old));
        let mut guard = self.state();
        let st = &mut *guard;
        let Some(c) = st.claims.get_mut(uid) else {
            return Ok(());
        };
        let outcome = match result {
            Ok(mut new) => {
                new.restarts = old.restarts + u32::from(counted);
                if counted {
                    c.restarts += 1;
                    if c.state != ClaimState::Degraded {
                        // Found dead at start, not by the supervisor: say so in the history.
                        c.last_error = Some(format!("{}; started again", not_running(&old)));
                    }
                }
                tracing::info!(claim = %uid, old_pid = old.control_daemon_pid, pid = new.control_daemon_pid, restarts = new.restarts, "MPS control daemon started again with its limits verified");
                for g in &mut c.groups {
                    if matches!(&g.sharing, StrategyInfo::Mps(m) if m.pipe_dir == pipe_dir) {
                        g.sharing = StrategyInfo::Mps(new.clone());
                    }
                }
                let plan = st.restarts.entry(uid.to_string()).or_default();
                plan.due = None;
                plan.started = Some(Instant::now());
                Ok(())
            }
            Err(e) => {
                let plan = st.restarts.entry(uid.to_string()).or_default();
                let delay = restart_backoff(plan.failures);
                plan.failures = plan.failures.saturating_add(1);
                plan.due = Some(Instant::now() + delay);
                // Keep why it was restarted in the first place (not the previous failure).
                let cause = match (&c.last_error, counted) {
                    (_, false) => "the host was rebooted".to_string(),
                    (Some(l), true) if c.state == ClaimState::Degraded => {
                        l.split(RESTART_FAILED).next().unwrap_or(l).to_string()
                    }
                    _ => not_running(&old),
                };
                let msg = format!(
                    "{cause}{RESTART_FAILED} at {} s after the epoch (attempt {}): {e}",
                    now_secs(),
                    plan.failures
                );
                tracing::error!(claim = %uid, error = %e, retry_in_ms = delay.as_millis() as u64, "restarting the MPS control daemon failed");
                c.state = ClaimState::Degraded;
                c.last_error = Some(msg.clone());
                Err(msg)
            }
        };
        let c = st.claims.get(uid).cloned();
        if let Some(mut c) = c {
            if outcome.is_ok()
                && c.state == ClaimState::Degraded
                && self.all_daemons_run(&c)
                && self.mig_intact(&c)
            {
                c.state = ClaimState::Prepared;
                if let Some(x) = st.claims.get_mut(uid) {
                    x.state = ClaimState::Prepared;
                }
            }
            let _ = self.commit(guard);
            self.write_host_record(uid);
        }
        self.wake_supervisor();
        outcome
    }

    /// Starts every dead MPS control daemon of `uid` again in place (the caller holds the
    /// claim's lock). Returns whether all of them run afterwards.
    pub(super) fn restart_dead_daemons(&self, uid: &str) -> bool {
        let Some(c) = self.state().claims.get(uid).cloned() else {
            return false;
        };
        for g in &c.groups {
            if let StrategyInfo::Mps(m) = &g.sharing {
                let dirs = MpsDirs::from_pipe(Path::new(&m.pipe_dir));
                if self.mps.liveness(&dirs, m.control_daemon_pid) == Liveness::Gone
                    && self.restart_group(uid, &m.pipe_dir, true).is_err()
                {
                    return false;
                }
            }
        }
        self.state()
            .claims
            .get(uid)
            .is_some_and(|c| c.state == ClaimState::Prepared && self.all_daemons_run(c))
    }

    fn all_daemons_run(&self, c: &ClaimInfo) -> bool {
        c.groups.iter().all(|g| match &g.sharing {
            StrategyInfo::Mps(m) => {
                self.mps.liveness(
                    &MpsDirs::from_pipe(Path::new(&m.pipe_dir)),
                    m.control_daemon_pid,
                ) != Liveness::Gone
            }
            _ => true,
        })
    }

    /// Removes what is ours on the host and owned by no claim: MPS control daemons on, mounts
    /// under and directories in `<run-dir>/claims/` (every entry there is ours), and CDI specs
    /// named `gpushare.io-claim_<uid>.json` (and their temporaries) in the CDI directory.
    fn remove_orphans(&self) {
        let (owned_claims, owned_groups): (Vec<String>, Vec<PathBuf>) = {
            let st = self.state();
            let groups = st
                .claims
                .values()
                .flat_map(|c| c.groups.iter())
                .filter_map(|g| match &g.sharing {
                    StrategyInfo::Mps(m) => Some(MpsDirs::from_pipe(Path::new(&m.pipe_dir)).root),
                    _ => None,
                })
                .collect();
            (st.claims.keys().cloned().collect(), groups)
        };
        let claims_dir = self.cfg.run_dir.join("claims");
        self.remove_orphan_dirs(&claims_dir, &owned_claims, &owned_groups);
        self.kill_stray_mps_processes(&claims_dir, &owned_groups);
        // A stray may have made its directories after the first sweep.
        self.remove_orphan_dirs(&claims_dir, &owned_claims, &owned_groups);
        self.remove_orphan_specs(&owned_claims);
    }

    /// Removes `gpushare.io-claim_<uid>.json` specs in the CDI directory that no claim owns and
    /// that are provably this daemon's: their hooks name this daemon's socket. The CDI
    /// directory is shared (with other vendors, and in tests with other gpushared instances),
    /// so a spec of ours by name alone is not enough. Temporaries of interrupted writes go
    /// when the process that wrote them (the pid in their name) is gone.
    fn remove_orphan_specs(&self, owned_claims: &[String]) {
        let Ok(entries) = fs::read_dir(&self.cfg.cdi_dir) else {
            return;
        };
        let socket = format!("{:?}", self.cfg.hook.socket.display().to_string());
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            let orphan = if let Some(rest) = name.strip_prefix(".gpushare.io-claim_") {
                rest.split_once(".json.tmp-")
                    .and_then(|(uid, _)| {
                        fsutil::temporary_writer(&name, &format!("gpushare.io-claim_{uid}.json"))
                    })
                    .is_some_and(|pid| !self.processes.alive(pid))
            } else if let Some(uid) = name
                .strip_prefix("gpushare.io-claim_")
                .and_then(|r| r.strip_suffix(".json"))
            {
                // Read as input: a regular file only, not through a link, bounded; a fifo
                // opened for a blocking read would hold up the start for ever.
                !owned_claims.iter().any(|c| c == uid)
                    && fsutil::read_own_file(&path, MAX_SPEC_BYTES)
                        .is_ok_and(|text| String::from_utf8_lossy(&text).contains(&socket))
            } else {
                false
            };
            if orphan {
                tracing::warn!(path = %path.display(), "removing a CDI spec no claim owns");
                if let Err(e) = fsutil::remove_file_if_exists(&path) {
                    tracing::error!(path = %path.display(), error = %e, "removing an orphan CDI spec");
                }
            }
        }
    }

    /// Stops the MPS groups and removes the claim directories under `claims_dir` that no claim
    /// owns.
    fn remove_orphan_dirs(
        &self,
        claims_dir: &Path,
        owned_claims: &[String],
        owned_groups: &[PathBuf],
    ) {
        // Nothing is followed: a link (or any other non-directory) where a claim or MPS group
        // directory should be is removed as the link it is, never read or stopped through.
        let real_dir = |e: &fs::DirEntry| e.file_type().is_ok_and(|t| t.is_dir());
        let not_a_dir = |path: &Path, what: &str| {
            tracing::warn!(path = %path.display(), "removing what is not a directory where {what} should be");
            if let Err(e) = fsutil::remove_file_if_exists(path) {
                tracing::error!(path = %path.display(), error = %e, "removing it");
            }
        };
        let mut orphan_groups: Vec<PathBuf> = Vec::new();
        let mut orphan_dirs: Vec<PathBuf> = Vec::new();
        if let Ok(entries) = fs::read_dir(claims_dir) {
            for entry in entries.flatten() {
                let dir = entry.path();
                if !real_dir(&entry) {
                    not_a_dir(&dir, "a claim directory");
                    continue;
                }
                let owned = entry
                    .file_name()
                    .to_str()
                    .is_some_and(|n| owned_claims.iter().any(|c| c == n));
                let Ok(groups) = fs::read_dir(&dir) else {
                    continue;
                };
                for g in groups.flatten() {
                    let root = g.path();
                    if !g.file_name().to_string_lossy().starts_with("mps-") {
                        continue;
                    }
                    if !real_dir(&g) {
                        not_a_dir(&root, "an MPS group directory");
                    } else if !owned_groups.contains(&root) {
                        orphan_groups.push(root);
                    }
                }
                if !owned {
                    orphan_dirs.push(dir);
                }
            }
        }
        // Each stop may wait out the MPS timeout: all at once.
        in_parallel(&orphan_groups, |root| {
            tracing::warn!(path = %root.display(), "stopping an MPS control daemon and removing directories no claim owns");
            if let Err(e) = self.mps.stop(&MpsDirs::from_pipe(&root.join("pipe")), None) {
                tracing::error!(path = %root.display(), error = %e, "removing an orphan MPS group");
            }
        });
        for dir in orphan_dirs {
            tracing::warn!(path = %dir.display(), "removing a claim directory no claim owns");
            if let Err(e) = fsutil::remove_dir_all_if_exists(&dir) {
                tracing::error!(path = %dir.display(), error = %e, "removing an orphan claim directory");
            }
        }
    }

    /// Kills MPS processes (control daemons, UI sessions, launchers) whose
    /// `CUDA_MPS_PIPE_DIRECTORY` lies under `claims_dir` but in no group a claim owns. A crash
    /// in the middle of a start can leave a daemon that took its lock only after the restart
    /// looked (or whose directory is gone): the lock cannot find it, its environment can.
    /// Processes on owned pipe directories (the daemons, and the MPS servers they spawn) are
    /// left alone. Repeated until a scan finds none, so a process that forked meanwhile is
    /// caught too; bounded.
    fn kill_stray_mps_processes(&self, claims_dir: &Path, owned_groups: &[PathBuf]) {
        const ROUNDS: usize = 20;
        for round in 0..ROUNDS {
            let strays: Vec<(i32, PathBuf)> = self
                .processes
                .with_env_under("CUDA_MPS_PIPE_DIRECTORY", claims_dir)
                .into_iter()
                .filter(|(_, pipe)| !owned_groups.iter().any(|g| pipe.starts_with(g)))
                .collect();
            if strays.is_empty() {
                return;
            }
            if round == 0 {
                // First the polite way: `quit` to each daemon that holds its directory.
                let pipes: BTreeSet<&PathBuf> = strays.iter().map(|(_, p)| p).collect();
                let pipes: Vec<&PathBuf> = pipes.into_iter().collect();
                in_parallel(&pipes, |pipe| {
                    if let Err(e) = self.mps.stop(&MpsDirs::from_pipe(pipe), None) {
                        tracing::error!(pipe = %pipe.display(), error = %e, "stopping a stray MPS control daemon");
                    }
                });
                continue;
            }
            for (pid, pipe) in &strays {
                tracing::warn!(pid, pipe = %pipe.display(), "killing an MPS process no claim owns");
                self.processes.kill(*pid);
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            while strays.iter().any(|(pid, _)| {
                self.processes.reap(*pid);
                self.processes.alive(*pid)
            }) && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(10));
            }
            in_parallel(&strays, |(_, pipe)| {
                // Its directory may have been created after the directory sweep.
                if let Some(root) = pipe.parent().filter(|r| r.starts_with(claims_dir)) {
                    let dirs = MpsDirs::from_pipe(pipe);
                    if let Err(e) = self.mps.stop(&dirs, None) {
                        tracing::error!(path = %root.display(), error = %e, "removing a stray MPS group");
                    }
                }
            });
        }
        tracing::error!(
            rounds = ROUNDS,
            "MPS processes no claim owns keep appearing under {}",
            claims_dir.display()
        );
    }

    /// Every MPS control daemon of a prepared or degraded claim, for the supervisor.
    pub fn supervised(&self) -> Vec<SupervisedDaemon> {
        self.state()
            .claims
            .values()
            .filter(|c| matches!(c.state, ClaimState::Prepared | ClaimState::Degraded))
            .flat_map(|c| {
                c.groups.iter().filter_map(|g| match &g.sharing {
                    StrategyInfo::Mps(m) if m.control_daemon_pid > 0 => Some(SupervisedDaemon {
                        claim_uid: c.uid.clone(),
                        pid: m.control_daemon_pid,
                        start_time: m.control_daemon_start_time,
                    }),
                    _ => None,
                })
            })
            .collect()
    }

    /// Gives the service the writing end of the supervisor's wake-up socket: a byte is sent
    /// whenever the set of daemons to watch changes.
    pub fn set_supervisor_wake(&self, wake: std::os::unix::net::UnixStream) {
        *self
            .supervisor_wake
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(wake);
    }

    pub(super) fn wake_supervisor(&self) {
        use std::io::Write;
        if let Some(w) = self
            .supervisor_wake
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            // Non-blocking: a full socket already holds a wake-up.
            let _ = w.write(&[1]);
        }
    }

    /// Reports that the MPS control daemon `pid` of claim `uid` exited (the supervisor saw
    /// its pidfd become readable). A daemon still running, or no longer the claim's, is
    /// ignored. Otherwise the claim becomes `Degraded` with the reason in `last_error`, and a
    /// restart is scheduled with backoff.
    pub fn mps_daemon_exited(&self, uid: &str, pid: i32) {
        let mut guard = self.state();
        let st = &mut *guard;
        let Some(c) = st.claims.get_mut(uid) else {
            return;
        };
        if !matches!(c.state, ClaimState::Prepared | ClaimState::Degraded) {
            return;
        }
        // Already known and scheduled: the restart deals with every dead daemon of the claim.
        if c.state == ClaimState::Degraded && st.restarts.get(uid).is_some_and(|p| p.due.is_some())
        {
            return;
        }
        let Some(m) = c.groups.iter().find_map(|g| match &g.sharing {
            StrategyInfo::Mps(m) if m.control_daemon_pid == pid => Some(m.clone()),
            _ => None,
        }) else {
            return;
        };
        let dirs = MpsDirs::from_pipe(Path::new(&m.pipe_dir));
        if self.mps.liveness(&dirs, pid) == Liveness::Running
            && (m.control_daemon_start_time == 0
                || self.processes.start_time(pid) == Some(m.control_daemon_start_time))
        {
            return;
        }
        self.processes.reap(pid);
        let msg = format!(
            "at {} s after the epoch: MPS control daemon (pid {pid}) on {} exited",
            now_secs(),
            m.pipe_dir
        );
        tracing::error!(claim = %uid, pid, "MPS control daemon exited; claim Degraded, restarting it");
        c.state = ClaimState::Degraded;
        c.last_error = Some(msg);
        let plan = st.restarts.entry(uid.to_string()).or_default();
        let ran_long = match plan.started {
            Some(t) => t.elapsed() >= RESTART_STABLE,
            None => true,
        };
        if ran_long {
            plan.failures = 0;
        }
        let delay = restart_backoff(plan.failures);
        plan.failures = plan.failures.saturating_add(1);
        plan.due = Some(Instant::now() + delay);
        let _ = self.commit(guard);
    }

    /// When the next scheduled restart is due, if any.
    pub fn next_restart(&self) -> Option<Instant> {
        self.state().restarts.values().filter_map(|p| p.due).min()
    }

    /// Restarts the dead MPS control daemons whose restart is due. Each claim is changed under
    /// its lock, so a restart never interleaves with the claim's prepare or unprepare.
    pub fn run_due_restarts(&self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .state()
            .restarts
            .iter()
            .filter(|(_, p)| p.due.is_some_and(|d| d <= now))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in due {
            let _claim = self.changes.lock(&uid);
            let Some(c) = self.state().claims.get(&uid).cloned() else {
                self.state().restarts.remove(&uid);
                continue;
            };
            if c.state != ClaimState::Degraded {
                if let Some(p) = self.state().restarts.get_mut(&uid) {
                    p.due = None;
                }
                continue;
            }
            for g in &c.groups {
                if let StrategyInfo::Mps(m) = &g.sharing {
                    let dirs = MpsDirs::from_pipe(Path::new(&m.pipe_dir));
                    if self.mps.liveness(&dirs, m.control_daemon_pid) != Liveness::Running
                        && self.restart_group(&uid, &m.pipe_dir, true).is_err()
                    {
                        break;
                    }
                }
            }
        }
    }

    /// Whether a graceful stop has begun.
    pub fn is_stopping(&self) -> bool {
        self.state().stopping
    }

    /// Graceful stop: refuses new prepares and unprepares, waits at most `bound` for those
    /// under way, then writes the checkpoint. MPS control daemons are left running.
    /// Returns whether everything under way finished within the bound.
    ///
    /// # Errors
    /// The checkpoint cannot be written (the previous one stays).
    pub fn stop(&self, bound: Duration) -> Result<bool, ServiceError> {
        self.state().stopping = true;
        let (count, done) = &self.in_flight;
        let deadline = Instant::now() + bound;
        let mut n = count.lock().unwrap_or_else(|p| p.into_inner());
        while *n > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            n = done
                .wait_timeout(n, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        let finished = *n == 0;
        drop(n);
        if !finished {
            tracing::warn!(
                bound_s = bound.as_secs(),
                "requests still under way at the stop bound; the next start reconciles them"
            );
        }
        // Nothing may have changed since the last write: write anyway, so that the file holds
        // this build's format and the stop is on record.
        let mut st = self.state();
        st.stopping = true;
        self.commit(st)?;
        Ok(finished)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        assert_eq!(restart_backoff(0), Duration::from_millis(500));
        assert_eq!(restart_backoff(1), Duration::from_secs(1));
        assert_eq!(restart_backoff(3), Duration::from_secs(4));
        assert_eq!(restart_backoff(6), RESTART_CAP);
        assert_eq!(restart_backoff(u32::MAX), RESTART_CAP);
    }

    #[test]
    fn every_crash_point_is_used_in_the_code() {
        let sources = [
            include_str!("mod.rs"),
            include_str!("../checkpoint.rs"),
            include_str!("recover.rs"),
        ]
        .concat();
        for p in crate::crash::CRASH_POINTS {
            assert!(
                sources.contains(&format!("point(\"{p}\")")),
                "crash point {p} is listed but never reached"
            );
        }
    }
}
