//! The service's side of MPS supervision (`strategy::mps::restart` decides and acts): what
//! it lends the strategy ([`MpsNode`]: the registry under its lock, the claim's host record,
//! the supervisor's wake-up), the supervisor's entry points, and each due restart run under
//! its claim's lock so that it never interleaves with the claim's prepare or unprepare.

use std::time::Instant;

use super::Service;
use crate::claim::{Claim, MpsDaemon};
use crate::registry::Claims;
use crate::strategy::mps::{self, MpsControl, MpsError, MpsNode, Restarts, SupervisedDaemon};
use crate::sys::Processes;

impl MpsNode for Service {
    fn mps(&self) -> &MpsControl {
        &self.host.mps
    }

    fn processes(&self) -> &dyn Processes {
        self.host.processes.as_ref()
    }

    fn read_with(&self, f: &mut dyn FnMut(&Claims, &Restarts)) {
        let st = self.state();
        f(&st.claims, &st.restarts);
    }

    fn change_with(&self, f: &mut dyn FnMut(&mut Claims, &mut Restarts)) {
        let mut guard = self.state();
        let st = &mut *guard;
        f(&mut st.claims, &mut st.restarts);
        // A failed write is the checkpoint error, which `health` reports; the change stands.
        let _ = self.commit(guard);
    }

    fn write_host_record(&self, uid: &str) {
        let _ = Service::write_host_record(self, uid);
    }

    fn wake_supervisor(&self) {
        Service::wake_supervisor(self);
    }

    fn slices_intact(&self, claim: &Claim) -> bool {
        self.mig_intact(claim)
    }
}

impl Service {
    /// Starts every dead MPS control daemon of `uid` again in place (the caller holds the
    /// claim's lock); whether all of them run afterwards ([`mps::restart_dead`]).
    pub(super) fn restart_dead_daemons(&self, uid: &str) -> bool {
        mps::restart_dead(self, uid)
    }

    /// Every MPS control daemon of claim `uid` runs: its daemon causes go
    /// ([`mps::daemons_running`]). Called under the registry's lock.
    pub(super) fn daemons_running(&self, st: &mut super::State, uid: &str) {
        mps::daemons_running(self, &mut st.claims, uid);
    }

    /// Every MPS control daemon of a prepared or degraded claim, for the supervisor. Looks
    /// at the claims that run MPS alone (`Claims::running_mps`): it runs at every MPS prepare
    /// and release, which must not cost what the node's other claims hold.
    pub fn supervised(&self) -> Vec<SupervisedDaemon> {
        mps::supervised(self.state().claims.running_mps())
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
    /// its pidfd become readable): the claim `Degraded` and a restart scheduled with backoff
    /// ([`mps::daemon_exited`]).
    pub fn mps_daemon_exited(&self, uid: &str, pid: i32) {
        mps::daemon_exited(self, uid, pid);
    }

    /// When the next scheduled restart is due, if any.
    pub fn next_restart(&self) -> Option<Instant> {
        self.state().restarts.next_due()
    }

    /// Restarts the dead MPS control daemons whose restart is due. Each claim is changed under
    /// its lock, so a restart never interleaves with the claim's prepare or unprepare.
    pub fn run_due_restarts(&self) {
        let due = self.state().restarts.due(Instant::now());
        for uid in due {
            let _claim = self.changes.lock(&uid);
            mps::restart_due(self, &uid);
        }
    }
}

/// Records that starting `old` again failed with `e` ([`mps::record_restart_failed`]), under
/// the registry's lock; returns the claim's message.
pub(super) fn record_restart_failed(
    st: &mut super::State,
    uid: &str,
    old: &MpsDaemon,
    e: &MpsError,
    down: Option<String>,
) -> String {
    mps::record_restart_failed(&mut st.claims, &mut st.restarts, uid, old, e, down)
}
