//! MPS control daemons and processes of ours that no claim owns, found and stopped at start:
//! a group directory left under a claim's directory, a stray whose environment names a pipe
//! directory of ours. Nothing outside the claims' directory is touched, and a path another
//! process names is trusted only where it is exactly one gpushare would make.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{MpsControl, MpsDirs};
use crate::config;
use crate::parallel::in_parallel;
use crate::sys::Processes;

/// A process and the pipe directory its environment names.
type Named = (i32, PathBuf);

/// Stops the MPS control daemon of each group directory in `roots` (`<claim dir>/mps-*`,
/// owned by no claim) and removes the directories, all at once: each stop may wait out the
/// MPS timeout.
pub fn stop_orphan_groups(mps: &MpsControl, roots: &[PathBuf]) {
    in_parallel(roots, |root| {
        tracing::warn!(path = %root.display(), "stopping an MPS control daemon and removing directories no claim owns");
        if let Err(e) = mps.stop(&MpsDirs::from_pipe(&root.join("pipe")), None) {
            tracing::error!(path = %root.display(), error = %e, "removing an orphan MPS group");
        }
    });
}

/// Kills MPS processes (control daemons, UI sessions, launchers) whose
/// `CUDA_MPS_PIPE_DIRECTORY` lies under `claims_dir` but in no group a claim owns. A crash
/// in the middle of a start can leave a daemon that took its lock only after the restart
/// looked (or whose directory is gone): the lock cannot find it, its environment can.
/// Processes on owned pipe directories (the daemons, and the MPS servers they spawn) are
/// left alone. Repeated until a scan finds none, so a process that forked meanwhile is
/// caught too; bounded. Returns how many strays it found, over all its scans.
pub fn kill_strays(
    mps: &MpsControl,
    processes: &dyn Processes,
    claims_dir: &Path,
    owned_groups: &[PathBuf],
) -> usize {
    const ROUNDS: usize = 20;
    let mut found = 0;
    for round in 0..ROUNDS {
        let (strays, foreign): (Vec<Named>, Vec<Named>) = processes
            .with_env_under("CUDA_MPS_PIPE_DIRECTORY", claims_dir)
            .into_iter()
            .filter(|(_, pipe)| !owned_groups.iter().any(|g| pipe.starts_with(g)))
            .partition(|(_, pipe)| is_our_pipe(claims_dir, pipe));
        // The path is another process's word (any root process, a pod, can set it): one
        // that is not exactly a group directory of ours names nothing gpushare made, so
        // nothing is signalled or removed because of it.
        if round == 0 {
            for (pid, pipe) in &foreign {
                tracing::warn!(pid, pipe = %pipe.display(), "a process names a pipe directory under the claims directory that no MPS group of gpushare has; left alone");
            }
        }
        if strays.is_empty() {
            return found;
        }
        found += strays.len();
        if round == 0 {
            // First the polite way: `quit` to each daemon that holds its directory.
            let pipes: BTreeSet<&PathBuf> = strays.iter().map(|(_, p)| p).collect();
            let pipes: Vec<&PathBuf> = pipes.into_iter().collect();
            in_parallel(&pipes, |pipe| {
                if let Err(e) = mps.stop(&MpsDirs::from_pipe(pipe), None) {
                    tracing::error!(pipe = %pipe.display(), error = %e, "stopping a stray MPS control daemon");
                }
            });
            continue;
        }
        for (pid, pipe) in &strays {
            tracing::warn!(pid, pipe = %pipe.display(), "killing an MPS process no claim owns");
            processes.kill(*pid);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while strays.iter().any(|(pid, _)| {
            processes.reap(*pid);
            processes.alive(*pid)
        }) && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        in_parallel(&strays, |(_, pipe)| {
            // Its directory may have been created after the directory sweep.
            if let Some(root) = pipe.parent().filter(|r| r.starts_with(claims_dir)) {
                let dirs = MpsDirs::from_pipe(pipe);
                if let Err(e) = mps.stop(&dirs, None) {
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
    found
}

/// Whether `pipe` (read from another process's environment, so input) is exactly the pipe
/// directory of an MPS group this daemon would make: `<claims_dir>/<uid>/mps-<5 hex>/pipe`
/// with a valid claim UID, no `.` or `..` anywhere below `claims_dir`, and neither the
/// claim's nor the group's directory a symbolic link. Only such a path may lead a stop of a
/// stray MPS process and the removal of its group.
fn is_our_pipe(claims_dir: &Path, pipe: &Path) -> bool {
    use std::path::Component;
    let Ok(rest) = pipe.strip_prefix(claims_dir) else {
        return false;
    };
    let parts: Vec<&std::ffi::OsStr> = rest
        .components()
        .map_while(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    let [uid, group, leaf] = parts.as_slice() else {
        return false;
    };
    if rest.components().count() != 3 || *leaf != "pipe" {
        return false;
    }
    let group_ok = group
        .to_str()
        .and_then(|n| n.strip_prefix("mps-"))
        .is_some_and(|h| h.len() == 5 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    let uid_ok = uid
        .to_str()
        .is_some_and(|u| config::validate_claim_uid(u).is_ok());
    let not_a_link = |p: &Path| !fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
    group_ok
        && uid_ok
        && not_a_link(&claims_dir.join(uid))
        && not_a_link(&claims_dir.join(uid).join(group))
        && not_a_link(pipe)
}
