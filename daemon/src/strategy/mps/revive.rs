//! A kept claim's MPS control daemon at start (crash or reboot): re-adopted where it runs as
//! recorded (pid, start time and a control round trip match), started again in place
//! otherwise; the claim's daemon causes go once all of its daemons run. What an MPS group's
//! and a MIG group's [`crate::strategy::GroupLife::revive`] do.

use super::restart::{change, daemons_running, restart_group, MpsNode};
use crate::claim::MpsDaemon;

/// Re-adopts or restarts `daemon`, an MPS control daemon of claim `uid` (after a reboot it
/// is started again: none survived). Returns whether it was started again (which rewrote
/// the claim's host record); a failure is recorded in the claim (`Degraded`, a retry
/// scheduled).
pub fn revive_daemon(node: &dyn MpsNode, uid: &str, daemon: &MpsDaemon, rebooted: bool) -> bool {
    if !rebooted && daemon.control_daemon_pid > 0 {
        match node.mps().check_adoptable(daemon) {
            Ok(()) => {
                tracing::info!(claim = %uid, pid = daemon.control_daemon_pid, "re-adopted the running MPS control daemon");
                // A claim recorded Degraded for it (a record of an older format, whose causes
                // are read from what it holds) is so no more once all of its daemons run.
                change(node, |claims, _| daemons_running(node, claims, uid));
                return false;
            }
            Err(why) => {
                tracing::warn!(claim = %uid, pid = daemon.control_daemon_pid, reason = %why, "MPS control daemon cannot be re-adopted; restarting it")
            }
        }
    }
    let _ = restart_group(node, uid, &daemon.pipe_dir, !rebooted);
    true
}
