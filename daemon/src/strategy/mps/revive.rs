//! A kept claim's MPS control daemons at start (crash or reboot): each re-adopted where it
//! runs as recorded (pid, start time and a control round trip match), started again in place
//! otherwise; the claim's daemon causes go once all of them run.

use super::restart::{daemons_running, restart_group, MpsNode};

/// Re-adopts or restarts the MPS control daemons of claim `uid` (after a reboot every one is
/// started again: none survived). Returns whether any was restarted (which rewrote the
/// claim's host record).
pub fn revive_daemons(node: &impl MpsNode, uid: &str, rebooted: bool) -> bool {
    // Only what is needed is copied out of the registry: most claims have no MPS group, and
    // this runs for every claim at every start.
    let daemons: Vec<_> = node.read(|claims, _| {
        claims
            .get(uid)
            .map(|c| c.mps_daemons().cloned().collect())
            .unwrap_or_default()
    });
    let mut restarted = false;
    for m in &daemons {
        if !rebooted && m.control_daemon_pid > 0 {
            match node.mps().check_adoptable(m) {
                Ok(()) => {
                    tracing::info!(claim = %uid, pid = m.control_daemon_pid, "re-adopted the running MPS control daemon");
                    continue;
                }
                Err(why) => {
                    tracing::warn!(claim = %uid, pid = m.control_daemon_pid, reason = %why, "MPS control daemon cannot be re-adopted; restarting it")
                }
            }
        }
        // A failure is recorded in the claim (Degraded, a retry scheduled).
        let _ = restart_group(node, uid, &m.pipe_dir, !rebooted);
        restarted = true;
    }
    if !restarted && !daemons.is_empty() {
        // Every daemon re-adopted as it runs: a claim recorded Degraded for one (a record of
        // an older format, whose causes are read from what it holds) is so no more.
        node.change(|claims, _| daemons_running(node, claims, uid));
    }
    restarted
}
