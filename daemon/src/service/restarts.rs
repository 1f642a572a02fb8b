//! Dead MPS control daemons: reported by the supervisor (`crate::supervise`), their claims
//! `Degraded`, started again with backoff, their limits read back, the claims `Prepared`
//! again.

use std::path::Path;
use std::time::{Duration, Instant};

use gpushare_proto::MpsInfo;

use super::{now_secs, Service};
use crate::claim::{Cause, Causes, Claim, Event, Phase};
use crate::strategy::mps::{launch_of, Liveness, MpsDirs};

/// First delay before restarting a dead MPS control daemon; doubled after each failure.
const RESTART_BASE: Duration = Duration::from_millis(500);

/// Longest delay between two restart attempts.
const RESTART_CAP: Duration = Duration::from_secs(30);

/// A daemon that ran this long before it died counts as a new first failure.
const RESTART_STABLE: Duration = Duration::from_secs(60);

/// What a failed restart's cause says first (the claim's message lists it after the death).
const RESTART_FAILED: &str = "restarting the MPS control daemon failed";

impl Service {
    /// Starts the MPS control daemon of `uid`'s group on `pipe_dir` again, with its limits as
    /// asked, read back. `counted`: a restart after a death (counted in `restarts`), not the
    /// redo after a reboot. On failure the claim is `Degraded` with the error and a retry is
    /// scheduled with backoff.
    pub(super) fn restart_group(
        &self,
        uid: &str,
        pipe_dir: &str,
        counted: bool,
    ) -> Result<(), String> {
        let old = self
            .state()
            .claims
            .get(uid)
            .and_then(|c| c.mps_daemons().find(|m| m.pipe_dir == pipe_dir).cloned());
        let Some(old) = old else {
            return Ok(());
        };
        let result = self.host.mps.restart(&launch_of(&old));
        let mut guard = self.state();
        if !guard.claims.contains_key(uid) {
            return Ok(());
        }
        let outcome = match result {
            Ok(new) => {
                record_restarted(&mut guard, uid, &old, new, counted);
                Ok(())
            }
            Err(e) => {
                let down = (!counted).then(|| "the host was rebooted".to_string());
                Err(record_restart_failed(&mut guard, uid, &old, &e, down))
            }
        };
        if guard.claims.contains_key(uid) {
            if outcome.is_ok() {
                self.daemons_running(&mut guard, uid);
            }
            let _ = self.commit(guard);
            let _ = self.write_host_record(uid);
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
            if let Some(m) = g.mps() {
                let dirs = MpsDirs::from_pipe(Path::new(&m.pipe_dir));
                if self.host.mps.liveness(&dirs, m.control_daemon_pid) == Liveness::Gone
                    && self.restart_group(uid, &m.pipe_dir, true).is_err()
                {
                    return false;
                }
            }
        }
        self.state()
            .claims
            .get(uid)
            .is_some_and(|c| c.phase == Phase::Prepared && self.all_daemons_run(c))
    }

    /// Every MPS control daemon of claim `uid` runs (re-adopted, or started again): its
    /// daemon causes go. It stays `Degraded` while another cause stands (a missing GPU, a lost
    /// MIG slice: one found gone now, a slice that vanished while gpushared ran, is recorded as
    /// such, since a daemon on it cannot serve).
    pub(super) fn daemons_running(&self, st: &mut super::State, uid: &str) {
        let Some(c) = st.claims.get(uid) else {
            return;
        };
        let down = Causes::NONE
            .with(Cause::MpsDaemonDown)
            .with(Cause::MpsRestartFailed);
        if !c.causes().iter().any(|x| down.contains(x)) || !self.all_daemons_run(c) {
            return;
        }
        if !self.mig_intact(c) {
            let detail = format!(
                "at {} s after the epoch: a MIG slice of the claim is not there as recorded (it vanished while gpushared ran); release the claim",
                now_secs()
            );
            if let Err(e) =
                st.claims
                    .degrade(uid, Event::SliceLost, vec![(Cause::SliceLost, detail)])
            {
                tracing::error!(claim = %uid, error = %e, "recording a lost MIG slice");
            }
        }
        if let Err(e) = st.claims.transition(uid, Event::DaemonsRunning) {
            tracing::error!(claim = %uid, error = %e, "recording a restarted daemon");
        }
    }

    pub(super) fn all_daemons_run(&self, c: &Claim) -> bool {
        c.mps_daemons().all(|m| {
            self.host.mps.liveness(
                &MpsDirs::from_pipe(Path::new(&m.pipe_dir)),
                m.control_daemon_pid,
            ) != Liveness::Gone
        })
    }

    /// Every MPS control daemon of a prepared or degraded claim, for the supervisor. Looks
    /// at the claims that run MPS alone (`Claims::running_mps`): it runs at every MPS prepare
    /// and release, which must not cost what the node's other claims hold.
    pub fn supervised(&self) -> Vec<SupervisedDaemon> {
        self.state()
            .claims
            .running_mps()
            .filter(|c| matches!(c.phase, Phase::Prepared | Phase::Degraded))
            .flat_map(|c| {
                c.mps_daemons()
                    .filter(|m| m.control_daemon_pid > 0)
                    .map(|m| SupervisedDaemon {
                        claim_uid: c.uid.clone(),
                        pid: m.control_daemon_pid,
                        start_time: m.control_daemon_start_time,
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

    /// Wakes the supervisor only if `claim` runs an MPS control daemon: the set of daemons to
    /// watch changes only with such a claim, and every wake costs the supervisor a pass over
    /// the MPS claims and a look at each daemon, which a prepare of another strategy need
    /// not pay.
    pub(super) fn wake_supervisor_for(&self, claim: &Claim) {
        if claim.runs_mps() {
            self.wake_supervisor();
        }
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
        self.forget_watches();
    }

    /// Reports that the MPS control daemon `pid` of claim `uid` exited (the supervisor saw
    /// its pidfd become readable). A daemon still running, or no longer the claim's, is
    /// ignored. Otherwise the claim becomes `Degraded` with the reason in `last_error`, and a
    /// restart is scheduled with backoff.
    pub fn mps_daemon_exited(&self, uid: &str, pid: i32) {
        let mut guard = self.state();
        let Some(c) = guard.claims.get(uid) else {
            return;
        };
        if !matches!(c.phase, Phase::Prepared | Phase::Degraded) {
            return;
        }
        // Already known and scheduled: the restart deals with every dead daemon of the claim.
        if c.phase == Phase::Degraded && guard.restarts.get(uid).is_some_and(|p| p.due.is_some()) {
            return;
        }
        let Some(m) = c
            .mps_daemons()
            .find(|m| m.control_daemon_pid == pid)
            .cloned()
        else {
            return;
        };
        let dirs = MpsDirs::from_pipe(Path::new(&m.pipe_dir));
        if self.host.mps.liveness(&dirs, pid) == Liveness::Running
            && (m.control_daemon_start_time == 0
                || self.host.processes.start_time(pid) == Some(m.control_daemon_start_time))
        {
            return;
        }
        self.host.processes.reap(pid);
        let msg = format!(
            "at {} s after the epoch: MPS control daemon (pid {pid}) on {} exited",
            now_secs(),
            m.pipe_dir
        );
        tracing::error!(claim = %uid, pid, "MPS control daemon exited; claim Degraded, restarting it");
        let st = &mut *guard;
        if let Err(e) = st
            .claims
            .degrade(uid, Event::DaemonDied, vec![(Cause::MpsDaemonDown, msg)])
        {
            tracing::error!(claim = %uid, error = %e, "recording an MPS control daemon's death");
            return;
        }
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
            if c.phase != Phase::Degraded {
                if let Some(p) = self.state().restarts.get_mut(&uid) {
                    p.due = None;
                }
                continue;
            }
            for g in &c.groups {
                if let Some(m) = g.mps() {
                    let dirs = MpsDirs::from_pipe(Path::new(&m.pipe_dir));
                    if self.host.mps.liveness(&dirs, m.control_daemon_pid) != Liveness::Running
                        && self.restart_group(&uid, &m.pipe_dir, true).is_err()
                    {
                        break;
                    }
                }
            }
        }
    }
}

/// The cause of a restart of a daemon found dead when gpushared started.
pub(super) fn not_running(old: &MpsInfo) -> String {
    format!(
        "at {} s after the epoch: MPS control daemon (pid {}) on {} was not running when gpushared started",
        now_secs(),
        old.control_daemon_pid,
        old.pipe_dir
    )
}

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

/// Records `new`, the daemon started again in place of `old` on the same pipe directory, as
/// its group's, counting the restart when `counted` (a death, not a reboot's redo); the
/// claim's restart plan is reset.
fn record_restarted(
    st: &mut super::State,
    uid: &str,
    old: &MpsInfo,
    mut new: MpsInfo,
    counted: bool,
) {
    let Some(c) = st.claims.get_mut(uid) else {
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
    let plan = st.restarts.entry(uid.to_string()).or_default();
    plan.due = None;
    plan.started = Some(Instant::now());
}

/// Records that starting `old` again failed with `e`: the next attempt scheduled with
/// backoff, the claim `Degraded` with the failure and why the daemon was restarted at all:
/// `down` when the caller says (a reboot, slices made again), else what the claim says
/// already, else that it was not running when gpushared started. Returns the claim's
/// message.
pub(super) fn record_restart_failed(
    st: &mut super::State,
    uid: &str,
    old: &MpsInfo,
    e: &crate::strategy::mps::MpsError,
    down: Option<String>,
) -> String {
    let plan = st.restarts.entry(uid.to_string()).or_default();
    let delay = restart_backoff(plan.failures);
    plan.failures = plan.failures.saturating_add(1);
    plan.due = Some(Instant::now() + delay);
    tracing::error!(claim = %uid, error = %e, retry_in_ms = delay.as_millis() as u64, "restarting the MPS control daemon failed");
    let mut details = vec![(
        Cause::MpsRestartFailed,
        format!(
            "{RESTART_FAILED} at {} s after the epoch (attempt {}): {e}",
            now_secs(),
            plan.failures
        ),
    )];
    let down_known = st
        .claims
        .get(uid)
        .is_some_and(|c| c.causes().contains(Cause::MpsDaemonDown));
    if let Some(down) = down {
        details.push((Cause::MpsDaemonDown, down));
    } else if !down_known {
        details.push((Cause::MpsDaemonDown, not_running(old)));
    }
    match st.claims.degrade(uid, Event::RestartFailed, details) {
        Ok(_) => st
            .claims
            .get(uid)
            .and_then(|c| c.last_error.clone())
            .unwrap_or_default(),
        Err(te) => {
            tracing::error!(claim = %uid, error = %te, "recording a failed restart");
            format!("{RESTART_FAILED}: {e}")
        }
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
}
