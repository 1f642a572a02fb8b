//! A dead MPS control daemon's claim made `Degraded` and the daemon started again in place,
//! with its limits re-applied and read back, the claim `Prepared` again once every daemon
//! runs: what the supervisor's reports (`crate::supervise`), a prepare retried over a dead
//! daemon and the start-up revival (`revive.rs`) do. Each reaches the claims and the host
//! through [`MpsNode`], what the service lends it.

use std::path::Path;
use std::time::Instant;

use super::supervise::{self, not_running, Restarts, RESTART_FAILED};
use super::{launch_of, Liveness, MpsControl, MpsDirs, MpsError};
use crate::claim::{Cause, Causes, Claim, Event, MpsDaemon, Phase};
use crate::registry::Claims;
use crate::sys::Processes;

/// What the service lends MPS supervision: the leaves, the registry (claims and restart
/// bookkeeping, changed under its lock and then made durable), the claim's host record, and
/// the supervisor's wake-up.
pub trait MpsNode {
    /// MPS control: starting, checking and stopping control daemons.
    fn mps(&self) -> &MpsControl;

    /// The leaf through which processes are watched, signalled and reaped.
    fn processes(&self) -> &dyn Processes;

    /// Runs `f` over the registry under its lock (see [`read`]).
    fn read_with(&self, f: &mut dyn FnMut(&Claims, &Restarts));

    /// Runs `f` over the registry under its lock; what it changed is published, then
    /// written to the claims' records (a failed write is the service's checkpoint error).
    /// See [`change`].
    fn change_with(&self, f: &mut dyn FnMut(&mut Claims, &mut Restarts));

    /// Rewrites claim `uid`'s host record (`claims/<uid>/claim.json`) from the registry.
    fn write_host_record(&self, uid: &str);

    /// Tells the supervisor that the set of daemons to watch changed.
    fn wake_supervisor(&self);

    /// Whether every MIG slice `claim` records is there as recorded (a daemon on a slice
    /// that vanished cannot serve).
    fn slices_intact(&self, claim: &Claim) -> bool;
}

/// Reads `node`'s registry under its lock.
pub fn read<R>(node: &dyn MpsNode, f: impl FnOnce(&Claims, &Restarts) -> R) -> R {
    let mut f = Some(f);
    let mut out = None;
    node.read_with(&mut |claims, restarts| {
        if let Some(f) = f.take() {
            out = Some(f(claims, restarts));
        }
    });
    out.expect("MpsNode::read_with runs its function once")
}

/// Changes `node`'s registry under its lock, then makes the change durable.
pub fn change<R>(node: &dyn MpsNode, f: impl FnOnce(&mut Claims, &mut Restarts) -> R) -> R {
    let mut f = Some(f);
    let mut out = None;
    node.change_with(&mut |claims, restarts| {
        if let Some(f) = f.take() {
            out = Some(f(claims, restarts));
        }
    });
    out.expect("MpsNode::change_with runs its function once")
}

/// Why a restart failed: the claim's message, which names the failure and why the daemon
/// was restarted at all.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RestartFailed(pub String);

/// Starts the MPS control daemon of `uid`'s group on `pipe_dir` again, with its limits as
/// asked, read back. `counted`: a restart after a death (counted in the claim's `restarts`),
/// not the redo after a reboot. A group no longer recorded is left alone.
///
/// # Errors
/// [`RestartFailed`]: the claim is `Degraded` with the failure, and a retry is scheduled
/// with backoff.
pub fn restart_group(
    node: &dyn MpsNode,
    uid: &str,
    pipe_dir: &str,
    counted: bool,
) -> Result<(), RestartFailed> {
    let old = read(node, |claims, _| {
        claims
            .get(uid)
            .and_then(|c| c.mps_daemons().find(|m| m.pipe_dir == pipe_dir).cloned())
    });
    let Some(old) = old else {
        return Ok(());
    };
    let result = node.mps().restart(&launch_of(&old));
    let outcome = change(node, |claims, restarts| {
        // No longer recorded: callers hold the claim's lock, so no release runs meanwhile.
        claims.contains_key(uid).then(|| match result {
            Ok(new) => {
                record_restarted(claims, restarts, uid, &old, new, counted);
                daemons_running(node, claims, uid);
                Ok(())
            }
            Err(e) => {
                let down = (!counted).then(|| "the host was rebooted".to_string());
                let msg = record_restart_failed(claims, restarts, uid, &old, &e, down);
                Err(RestartFailed(msg))
            }
        })
    });
    let Some(outcome) = outcome else {
        return Ok(());
    };
    node.write_host_record(uid);
    node.wake_supervisor();
    outcome
}

/// Starts every dead MPS control daemon of `uid` again in place (the caller holds the
/// claim's lock). Returns whether the claim is `Prepared` with all of them running
/// afterwards.
pub fn restart_dead(node: &dyn MpsNode, uid: &str) -> bool {
    let Some(c) = read(node, |claims, _| claims.get(uid).cloned()) else {
        return false;
    };
    for m in c.mps_daemons() {
        let dirs = MpsDirs::from_pipe(Path::new(&m.pipe_dir));
        if node.mps().liveness(&dirs, m.control_daemon_pid) == Liveness::Gone
            && restart_group(node, uid, &m.pipe_dir, true).is_err()
        {
            return false;
        }
    }
    read(node, |claims, _| {
        claims
            .get(uid)
            .is_some_and(|c| c.phase == Phase::Prepared && all_run(node.mps(), c))
    })
}

/// Restarts the daemons of `uid` that do not run, its restart being due (the caller holds
/// the claim's lock); a claim gone or no longer `Degraded` has nothing due any more.
pub fn restart_due(node: &dyn MpsNode, uid: &str) {
    let Some(c) = read(node, |claims, _| claims.get(uid).cloned()) else {
        change(node, |_, restarts| restarts.forget(uid));
        return;
    };
    if c.phase != Phase::Degraded {
        change(node, |_, restarts| restarts.settle(uid));
        return;
    }
    for m in c.mps_daemons() {
        let dirs = MpsDirs::from_pipe(Path::new(&m.pipe_dir));
        if node.mps().liveness(&dirs, m.control_daemon_pid) != Liveness::Running
            && restart_group(node, uid, &m.pipe_dir, true).is_err()
        {
            break;
        }
    }
}

/// The supervisor saw MPS control daemon `pid` of claim `uid` exit (its pidfd became
/// readable). A daemon still running, or no longer the claim's, is ignored. Otherwise the
/// claim becomes `Degraded` with the reason, and a restart is scheduled with backoff.
pub fn daemon_exited(node: &dyn MpsNode, uid: &str, pid: i32) {
    change(node, |claims, restarts| {
        let Some(c) = claims.get(uid) else {
            return;
        };
        if !matches!(c.phase, Phase::Prepared | Phase::Degraded) {
            return;
        }
        // Already known and scheduled: the restart deals with every dead daemon of the claim.
        if c.phase == Phase::Degraded && restarts.scheduled(uid) {
            return;
        }
        let Some(m) = c.mps_daemons().find(|m| m.control_daemon_pid == pid) else {
            return;
        };
        let dirs = MpsDirs::from_pipe(Path::new(&m.pipe_dir));
        if node.mps().liveness(&dirs, pid) == Liveness::Running
            && (m.control_daemon_start_time == 0
                || node.processes().start_time(pid) == Some(m.control_daemon_start_time))
        {
            return;
        }
        node.processes().reap(pid);
        let msg = supervise::exited(pid, &m.pipe_dir);
        tracing::error!(claim = %uid, pid, "MPS control daemon exited; claim Degraded, restarting it");
        if let Err(e) = claims.degrade(uid, Event::DaemonDied, vec![(Cause::MpsDaemonDown, msg)]) {
            tracing::error!(claim = %uid, error = %e, "recording an MPS control daemon's death");
            return;
        }
        restarts.died(uid, Instant::now());
    });
}

/// Every MPS control daemon of claim `uid` runs (re-adopted, or started again): its daemon
/// causes go. It stays `Degraded` while another cause stands (a missing GPU, a lost MIG
/// slice: one found gone now, a slice that vanished while gpushared ran, is recorded as such,
/// since a daemon on it cannot serve). Called under the registry's lock, with its claims.
pub fn daemons_running(node: &dyn MpsNode, claims: &mut Claims, uid: &str) {
    let Some(c) = claims.get(uid) else {
        return;
    };
    let down = Causes::NONE
        .with(Cause::MpsDaemonDown)
        .with(Cause::MpsRestartFailed);
    if !c.causes().iter().any(|x| down.contains(x)) || !all_run(node.mps(), c) {
        return;
    }
    if !node.slices_intact(c) {
        let detail = format!(
            "at {} s after the epoch: a MIG slice of the claim is not there as recorded (it vanished while gpushared ran); release the claim",
            supervise::now_secs()
        );
        if let Err(e) = claims.degrade(uid, Event::SliceLost, vec![(Cause::SliceLost, detail)]) {
            tracing::error!(claim = %uid, error = %e, "recording a lost MIG slice");
        }
    }
    if let Err(e) = claims.transition(uid, Event::DaemonsRunning) {
        tracing::error!(claim = %uid, error = %e, "recording a restarted daemon");
    }
}

/// Whether no MPS control daemon of `claim` is known to be gone.
fn all_run(mps: &MpsControl, claim: &Claim) -> bool {
    claim.mps_daemons().all(|m| {
        mps.liveness(
            &MpsDirs::from_pipe(Path::new(&m.pipe_dir)),
            m.control_daemon_pid,
        ) != Liveness::Gone
    })
}

/// The pid of a claim's MPS control daemon known to be gone, if any. A daemon whose state
/// cannot be read (say, `/proc` is out of reach for want of file descriptors) is not taken
/// for gone: tearing down a healthy claim would be worse than waiting.
pub fn dead_daemon(mps: &MpsControl, claim: &Claim) -> Option<i32> {
    claim.mps_daemons().find_map(|m| {
        let dirs = MpsDirs::from_pipe(Path::new(&m.pipe_dir));
        match mps.liveness(&dirs, m.control_daemon_pid) {
            Liveness::Gone => Some(m.control_daemon_pid),
            Liveness::Running => None,
            Liveness::Unknown(why) => {
                tracing::warn!(claim = %claim.uid, pid = m.control_daemon_pid, error = %why, "cannot tell whether the MPS control daemon runs");
                None
            }
        }
    })
}

/// Records `new`, the daemon started again in place of `old` on the same pipe directory, as
/// its group's, counting the restart when `counted` (a death, not a reboot's redo); nothing
/// is due for the claim any more.
fn record_restarted(
    claims: &mut Claims,
    restarts: &mut Restarts,
    uid: &str,
    old: &MpsDaemon,
    mut new: MpsDaemon,
    counted: bool,
) {
    let Some(c) = claims.get_mut(uid) else {
        return;
    };
    new.restarts = old.restarts + u32::from(counted);
    if counted {
        c.restarts += 1;
        if c.phase != Phase::Degraded {
            // Found dead at start, not by the supervisor: say so in the history.
            c.last_error = Some(format!("{}; started again", not_running(old)));
        }
    }
    tracing::info!(claim = %uid, old_pid = old.control_daemon_pid, pid = new.control_daemon_pid, restarts = new.restarts, "MPS control daemon started again with its limits verified");
    for m in c.groups.iter_mut().filter_map(|g| g.mps_mut()) {
        if m.pipe_dir == old.pipe_dir {
            *m = new.clone();
        }
    }
    restarts.restarted(uid, Instant::now());
}

/// Records that starting `old` again failed with `e`: the next attempt scheduled with
/// backoff, the claim `Degraded` with the failure and why the daemon was restarted at all:
/// `down` when the caller says (a reboot, slices made again), else what the claim says
/// already, else that it was not running when gpushared started. Returns the claim's
/// message.
pub fn record_restart_failed(
    claims: &mut Claims,
    restarts: &mut Restarts,
    uid: &str,
    old: &MpsDaemon,
    e: &MpsError,
    down: Option<String>,
) -> String {
    let (delay, attempt) = restarts.failed(uid, Instant::now());
    tracing::error!(claim = %uid, error = %e, retry_in_ms = delay.as_millis() as u64, "restarting the MPS control daemon failed");
    let mut details = vec![(
        Cause::MpsRestartFailed,
        format!(
            "{RESTART_FAILED} at {} s after the epoch (attempt {attempt}): {e}",
            supervise::now_secs()
        ),
    )];
    let down_known = claims
        .get(uid)
        .is_some_and(|c| c.causes().contains(Cause::MpsDaemonDown));
    if let Some(down) = down {
        details.push((Cause::MpsDaemonDown, down));
    } else if !down_known {
        details.push((Cause::MpsDaemonDown, not_running(old)));
    }
    match claims.degrade(uid, Event::RestartFailed, details) {
        Ok(_) => claims
            .get(uid)
            .and_then(|c| c.last_error.clone())
            .unwrap_or_default(),
        Err(te) => {
            tracing::error!(claim = %uid, error = %te, "recording a failed restart");
            format!("{RESTART_FAILED}: {e}")
        }
    }
}
