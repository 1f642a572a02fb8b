//! What supervision of MPS control daemons decides, touching nothing: which daemons the
//! supervisor (`crate::supervise`) watches, when a dead one is started again (backoff per
//! claim, reset by a daemon that ran long enough), and what a claim's history says of a
//! death or a failed restart. `restart.rs` acts on these decisions.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::claim::{Claim, MpsDaemon, Phase};

/// First delay before restarting a dead MPS control daemon; doubled after each failure.
const RESTART_BASE: Duration = Duration::from_millis(500);

/// Longest delay between two restart attempts.
const RESTART_CAP: Duration = Duration::from_secs(30);

/// A daemon that ran this long before it died counts as a new first failure.
const RESTART_STABLE: Duration = Duration::from_secs(60);

/// What a failed restart's cause says first (the claim's message lists it after the death).
pub(super) const RESTART_FAILED: &str = "restarting the MPS control daemon failed";

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

/// Every MPS control daemon of a prepared or degraded claim among `claims` (the claims that
/// run MPS), for the supervisor; a daemon not started yet (pid 0) is not watched.
pub fn supervised<'c>(claims: impl Iterator<Item = &'c Claim>) -> Vec<SupervisedDaemon> {
    claims
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

/// Restart bookkeeping of one claim's MPS control daemons.
#[derive(Debug, Default, Clone)]
struct RestartPlan {
    /// When the next attempt is due; `None` while the daemons run.
    due: Option<Instant>,
    /// Failed attempts (or quick deaths) in a row.
    failures: u32,
    /// When a daemon of the claim was last started by a restart.
    started: Option<Instant>,
}

/// The restarts scheduled, by claim UID: kept in memory only (a restarted gpushared checks
/// every daemon at start anyway), changed under the registry's lock with the claims.
#[derive(Debug, Default)]
pub struct Restarts(BTreeMap<String, RestartPlan>);

impl Restarts {
    /// A daemon of `uid` died at `now`: schedules a restart after the claim's backoff, which
    /// starts over when the last restarted daemon ran a minute (`RESTART_STABLE`) or more.
    pub fn died(&mut self, uid: &str, now: Instant) {
        let plan = self.0.entry(uid.to_string()).or_default();
        let ran_long = plan
            .started
            .is_none_or(|t| now.saturating_duration_since(t) >= RESTART_STABLE);
        if ran_long {
            plan.failures = 0;
        }
        let delay = restart_backoff(plan.failures);
        plan.failures = plan.failures.saturating_add(1);
        plan.due = Some(now + delay);
    }

    /// A restart of `uid`'s daemon failed at `now`: the next attempt is scheduled with
    /// backoff. Returns the delay and the attempt's number (1 for the first).
    pub fn failed(&mut self, uid: &str, now: Instant) -> (Duration, u32) {
        let plan = self.0.entry(uid.to_string()).or_default();
        let delay = restart_backoff(plan.failures);
        plan.failures = plan.failures.saturating_add(1);
        plan.due = Some(now + delay);
        (delay, plan.failures)
    }

    /// `uid`'s daemon was started again at `now`: nothing is due.
    pub fn restarted(&mut self, uid: &str, now: Instant) {
        let plan = self.0.entry(uid.to_string()).or_default();
        plan.due = None;
        plan.started = Some(now);
    }

    /// Whether a restart of `uid` is scheduled.
    pub fn scheduled(&self, uid: &str) -> bool {
        self.0.get(uid).is_some_and(|p| p.due.is_some())
    }

    /// When the next scheduled restart is due, if any.
    pub fn next_due(&self) -> Option<Instant> {
        self.0.values().filter_map(|p| p.due).min()
    }

    /// The claims whose restart is due at `now`.
    pub fn due(&self, now: Instant) -> Vec<String> {
        self.0
            .iter()
            .filter(|(_, p)| p.due.is_some_and(|d| d <= now))
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    /// Nothing is due for `uid` any more (its claim is no longer `Degraded`); its failures
    /// are kept for the backoff of a next death.
    pub fn settle(&mut self, uid: &str) {
        if let Some(p) = self.0.get_mut(uid) {
            p.due = None;
        }
    }

    /// `uid` is gone: its bookkeeping goes with it.
    pub fn forget(&mut self, uid: &str) {
        self.0.remove(uid);
    }
}

/// Seconds after the epoch, for the claim's history.
pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The cause of a restart of a daemon found dead when gpushared started.
pub(super) fn not_running(old: &MpsDaemon) -> String {
    format!(
        "at {} s after the epoch: MPS control daemon (pid {}) on {} was not running when gpushared started",
        now_secs(),
        old.control_daemon_pid,
        old.pipe_dir
    )
}

/// The cause a claim records when the supervisor saw its daemon `pid` on `pipe_dir` exit.
pub(super) fn exited(pid: i32, pipe_dir: &str) -> String {
    format!(
        "at {} s after the epoch: MPS control daemon (pid {pid}) on {pipe_dir} exited",
        now_secs()
    )
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
    fn deaths_back_off_until_a_daemon_runs_long_enough() {
        let t0 = Instant::now();
        let mut r = Restarts::default();
        r.died("a", t0);
        assert_eq!(r.next_due(), Some(t0 + Duration::from_millis(500)));
        assert!(r.scheduled("a"));
        r.restarted("a", t0 + Duration::from_secs(1));
        assert!(!r.scheduled("a"));
        // Died again 2 s after its restart: the second failure in a row.
        r.died("a", t0 + Duration::from_secs(3));
        assert_eq!(r.next_due(), Some(t0 + Duration::from_secs(4)));
        r.restarted("a", t0 + Duration::from_secs(4));
        // Ran a minute: a new first failure.
        r.died("a", t0 + Duration::from_secs(64));
        assert_eq!(
            r.next_due(),
            Some(t0 + Duration::from_secs(64) + Duration::from_millis(500))
        );
    }

    #[test]
    fn failed_restarts_count_attempts_and_only_due_claims_are_returned() {
        let t0 = Instant::now();
        let mut r = Restarts::default();
        assert_eq!(r.failed("a", t0), (Duration::from_millis(500), 1));
        assert_eq!(r.failed("a", t0), (Duration::from_secs(1), 2));
        r.died("b", t0);
        assert_eq!(r.due(t0), Vec::<String>::new());
        assert_eq!(
            r.due(t0 + Duration::from_millis(600)),
            vec!["b".to_string()]
        );
        assert_eq!(
            r.due(t0 + Duration::from_secs(2)),
            vec!["a".to_string(), "b".to_string()]
        );
        r.settle("b");
        assert_eq!(r.due(t0 + Duration::from_secs(2)), vec!["a".to_string()]);
        r.forget("a");
        assert_eq!(r.next_due(), None);
    }
}
