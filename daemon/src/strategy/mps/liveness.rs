//! Whether a claim's MPS control daemons run, on the hot path (`attach`): from a pidfd of
//! each daemon, opened once through the leaf (`sys::Processes::watch`) and polled without
//! waiting, as the supervisor watches them, instead of reading `/proc/locks`, which grows
//! with every lock on the host.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex};

use crate::claim::Claim;
use crate::sys::{readable_now, Processes};

/// Pidfds of MPS control daemons, by pid.
#[derive(Debug, Default)]
pub struct Watches(Mutex<BTreeMap<i32, Arc<OwnedFd>>>);

impl Watches {
    /// The pid of an MPS control daemon of `claim` that has exited, if any. A daemon whose
    /// process is another than the recorded one (its start time differs: the pid was reused)
    /// is gone too; one that cannot be watched at all (no pidfds on this kernel) is taken
    /// for running, as the lock-based check at prepare and start still guards it.
    pub fn daemon_gone(&self, processes: &dyn Processes, claim: &Claim) -> Option<i32> {
        claim
            .mps_daemons()
            .filter(|m| m.control_daemon_pid > 0)
            .find(|m| self.exited(processes, m.control_daemon_pid, m.control_daemon_start_time))
            .map(|m| m.control_daemon_pid)
    }

    fn exited(&self, processes: &dyn Processes, pid: i32, start_time: u64) -> bool {
        let known = self.lock().get(&pid).cloned();
        let fd = match known {
            Some(fd) => fd,
            None => match processes.watch(pid) {
                Ok(fd) => {
                    // The descriptor pins the process: a start time other than the recorded
                    // one is another process with the daemon's old pid.
                    if start_time != 0 && processes.start_time(pid) != Some(start_time) {
                        return true;
                    }
                    let fd = Arc::new(fd);
                    self.lock().insert(pid, Arc::clone(&fd));
                    fd
                }
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return true,
                Err(e) => {
                    tracing::warn!(pid, error = %e, "cannot watch the MPS control daemon; taking it for running");
                    return false;
                }
            },
        };
        readable_now(fd.as_raw_fd())
    }

    /// Forgets the pidfds of daemons other than `live` (called when the set of daemons
    /// changes), so descriptors do not pile up with restarts.
    pub fn keep_only(&self, live: &BTreeSet<i32>) {
        self.lock().retain(|pid, _| live.contains(pid));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<i32, Arc<OwnedFd>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
