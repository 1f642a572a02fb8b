//! Whether a claim's MPS control daemons run, on the hot path (`attach`): the pidfds kept
//! in `strategy::mps::Watches`, forgotten as the set of daemons changes.

use crate::claim::Claim;

use super::Service;

impl Service {
    /// The pid of an MPS control daemon of `claim` that has exited, if any
    /// ([`crate::strategy::mps::Watches::daemon_gone`]).
    pub(super) fn daemon_gone(&self, claim: &Claim) -> Option<i32> {
        self.host
            .watches
            .daemon_gone(self.host.processes.as_ref(), claim)
    }

    /// Forgets the pidfds of daemons no claim records any more (called when the set of
    /// daemons changes), so descriptors do not pile up with restarts.
    pub(super) fn forget_watches(&self) {
        let live = self.supervised().into_iter().map(|d| d.pid).collect();
        self.host.watches.keep_only(&live);
    }
}
