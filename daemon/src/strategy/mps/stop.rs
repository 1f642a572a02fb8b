//! Finding a group's MPS control daemon by the lock it holds, telling whether it runs, and
//! stopping it (`quit`, bounded, then SIGKILL).

use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use super::{MpsControl, MpsDirs, MpsError};
use crate::fsutil;

impl MpsControl {
    /// The daemon holding `dirs`' pipe directory. A group directory or pipe directory that is
    /// a symbolic link is none of ours (gpushare makes real directories): whatever holds the
    /// lock at the link's target is another group's daemon, never this one's, so none is named
    /// and nothing is signalled through it.
    pub(super) fn holder(&self, dirs: &MpsDirs) -> io::Result<Option<i32>> {
        let linked =
            |p: &Path| std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink());
        if linked(&dirs.root) || linked(&dirs.pipe) {
            tracing::warn!(pipe = %dirs.pipe.display(), "an MPS group or pipe directory is a symbolic link; no daemon of ours is there");
            return Ok(None);
        }
        self.ops
            .processes
            .lock_holder(&dirs.pipe.join("control_lock"))
    }

    /// Whether the daemon recorded as `pid` still runs on its pipe directory. Only the holder
    /// of the directory's `control_lock` counts: a pid alone may have been reused by now.
    pub fn liveness(&self, dirs: &MpsDirs, pid: i32) -> Liveness {
        match self.holder(dirs) {
            Ok(Some(holder)) if holder == pid && self.ops.processes.alive(pid) => Liveness::Running,
            Ok(_) => Liveness::Gone,
            Err(e) => Liveness::Unknown(e.to_string()),
        }
    }

    /// Stops the daemon on `dirs`: `quit` (bounded), then SIGKILL if it still holds the pipe
    /// directory, then unmounts the shm tmpfs and removes the directories. The daemon is found
    /// as the holder of `control_lock`, never by a recorded pid alone, which a dead daemon may
    /// have handed on to an unrelated process. Idempotent: no daemon or directory is fine.
    ///
    /// # Errors
    /// The holder of `control_lock` cannot be asked (then nothing is signalled), or the tmpfs cannot be
    /// unmounted or the directories removed.
    pub fn stop(&self, dirs: &MpsDirs, recorded: Option<i32>) -> Result<(), MpsError> {
        self.stop_daemon(dirs, recorded)?;
        self.ops
            .mounter
            .unmount(&dirs.shm)
            .map_err(|source| MpsError::Mount {
                action: "unmounting",
                path: dirs.shm.clone(),
                source,
            })?;
        fsutil::remove_dir_all_if_exists(&dirs.root).map_err(|source| MpsError::Dir {
            action: "removing",
            path: dirs.root.clone(),
            source,
        })
    }

    /// Stops the daemon holding `dirs` (`quit`, bounded, then SIGKILL) and leaves its
    /// directories and shm tmpfs alone.
    ///
    /// # Errors
    /// The holder of `control_lock` cannot be asked (then nothing is signalled).
    pub fn stop_daemon(&self, dirs: &MpsDirs, recorded: Option<i32>) -> Result<(), MpsError> {
        let holder = self.holder(dirs).map_err(|source| MpsError::Dir {
            action: "finding the daemon (the holder of control_lock) of",
            path: dirs.pipe.clone(),
            source,
        })?;
        if let (Some(recorded), Some(holder)) = (recorded, holder) {
            if recorded != holder {
                tracing::warn!(recorded, holder, pipe = %dirs.pipe.display(), "the daemon on this pipe directory is not the one recorded");
            }
        }
        if let Some(pid) = holder {
            let stopped = self.ops.processes.stopped(pid);
            if stopped || self.is_unanswered(dirs) {
                // A stopped daemon answers nothing until it is continued, and one that let its
                // last control session (the re-adoption probe, say) run out the timeout is
                // not asked again: a `quit` would only wait out another timeout, and keep
                // gpushared from being ready meanwhile.
                let why = if stopped {
                    "is stopped (SIGSTOP or a tracer)"
                } else {
                    "did not answer its last control command within the timeout"
                };
                tracing::warn!(pid, pipe = %dirs.pipe.display(), "MPS control daemon {why}; sending SIGKILL without asking it to quit");
                self.kill_now(dirs, pid);
                return Ok(());
            }
            if let Err(e) = self.ui(dirs, &["quit".to_string()]) {
                if self.ops.processes.stopped(pid) {
                    tracing::warn!(pid, error = %e, "MPS control daemon was stopped while asked to quit; sending SIGKILL now");
                    self.kill_now(dirs, pid);
                    return Ok(());
                }
                // Not killed yet: `quit`'s exit status is the daemon's own, and NVIDIA's `quit`
                // waits for the MPS servers, which wait for their clients: a daemon shutting
                // down can time out or answer with an error too; it gets the timeout to exit.
                tracing::warn!(pid, error = %e, timeout_ms = self.timeout.as_millis() as u64, "MPS control daemon did not take quit; SIGKILL if it has not exited within the timeout");
            }
            if !self.wait_exit(dirs, pid, self.timeout) {
                tracing::warn!(
                    pid,
                    "MPS control daemon still running after quit; sending SIGKILL"
                );
                self.ops.processes.kill(pid);
                self.wait_exit(dirs, pid, self.timeout);
            }
        }
        // Whatever held the pipe directory is gone: nothing is remembered of it.
        self.note_answer(dirs, true);
        Ok(())
    }

    /// SIGKILLs the daemon `pid` on `dirs` (it is asked nothing), waits (bounded) until it
    /// lets go of the pipe directory, and forgets that it did not answer.
    fn kill_now(&self, dirs: &MpsDirs, pid: i32) {
        self.ops.processes.kill(pid);
        self.wait_exit(dirs, pid, self.timeout);
        self.note_answer(dirs, true);
    }

    /// Waits until `pid` no longer holds `dirs` (it exited, or at least let go of the pipe
    /// directory), reaping it when it is our child (we are a child subreaper, so double-forked
    /// daemons become our children). Returns whether it let go.
    fn wait_exit(&self, dirs: &MpsDirs, pid: i32, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            self.ops.processes.reap(pid);
            let holds = matches!(self.holder(dirs), Ok(Some(h)) if h == pid);
            if !holds || !self.ops.processes.alive(pid) {
                self.ops.processes.reap(pid);
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// What is known about a claim's MPS control daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    /// It runs and holds its pipe directory.
    Running,
    /// It is gone (or another process holds its pipe directory).
    Gone,
    /// `/proc` could not be read; nothing is known.
    Unknown(String),
}
