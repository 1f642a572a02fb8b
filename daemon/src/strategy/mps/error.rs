//! Why an MPS operation failed.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use super::launch::SOCKET_NAME;

/// Why an MPS operation failed. Each message names the claim's pipe directory or the value.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    /// A directory could not be created or removed.
    #[error("{action} {}: {source}", path.display())]
    Dir {
        /// What was being done.
        action: &'static str,
        /// The directory.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// The shm tmpfs could not be mounted or unmounted.
    #[error("{action} tmpfs on {}: {source}", path.display())]
    Mount {
        /// What was being done.
        action: &'static str,
        /// The mount point.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// The control program could not be run at all.
    #[error("cannot run MPS control program {}: {source}", program.display())]
    Spawn {
        /// Program path.
        program: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// `-d` failed.
    #[error("MPS control daemon failed to start on {}: {summary}", pipe.display())]
    StartFailed {
        /// Pipe directory.
        pipe: PathBuf,
        /// Exit code and output.
        summary: String,
    },
    /// The daemon started but no process holds its lock file.
    #[error("MPS control daemon on {} started but holds no lock on control_lock within {timeout:?}", pipe.display())]
    NoPid {
        /// Pipe directory.
        pipe: PathBuf,
        /// How long we looked.
        timeout: Duration,
    },
    /// The pipe directory is too deep for the sockets the daemon makes in it.
    #[error("MPS pipe directory {} is too long: {len} bytes for {} leave no room in a Unix socket address (at most {max} bytes); use a shorter --run-dir", pipe.display(), SOCKET_NAME)]
    PathTooLong {
        /// Pipe directory.
        pipe: PathBuf,
        /// Length of the longest socket path.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A UI session failed (the daemon could not be reached).
    #[error("MPS control UI on {} failed for {commands:?}: {summary}", pipe.display())]
    Ui {
        /// Pipe directory.
        pipe: PathBuf,
        /// Commands sent.
        commands: Vec<String>,
        /// Exit code and output.
        summary: String,
    },
    /// A value read back differs from what was set.
    #[error("MPS control daemon on {} did not take {what}: set {expected:?}, read back {actual:?}", pipe.display())]
    Verify {
        /// Pipe directory.
        pipe: PathBuf,
        /// Which setting.
        what: String,
        /// What the read-back should show.
        expected: String,
        /// What it showed.
        actual: String,
    },
}

/// Why a running MPS control daemon recorded for a claim cannot be re-adopted as it runs
/// ([`MpsControl::check_adoptable`](super::MpsControl::check_adoptable)): it is restarted
/// instead. One line each.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    /// Another process holds the pipe directory's `control_lock`.
    #[error("pid {holder}, not the recorded {pid}, holds {}", pipe.display())]
    OtherHolder {
        /// The process holding the lock.
        holder: i32,
        /// The recorded daemon's pid.
        pid: i32,
        /// The pipe directory.
        pipe: PathBuf,
    },
    /// No process holds the lock: the daemon is gone.
    #[error("MPS control daemon (pid {pid}) is not running")]
    NotRunning {
        /// The recorded daemon's pid.
        pid: i32,
    },
    /// Who holds the lock cannot be asked.
    #[error("asking who holds its control_lock: {source}")]
    Holder {
        /// Why the lock could not be tested.
        #[source]
        source: io::Error,
    },
    /// The recorded pid started at another time: a recycled pid, another process.
    #[error(
        "pid {pid} started at tick {started:?}, not at the recorded {recorded}: another process"
    )]
    Recycled {
        /// The recorded daemon's pid.
        pid: i32,
        /// When the process with that pid started (clock ticks since boot), if it runs.
        started: Option<u64>,
        /// The recorded start time.
        recorded: u64,
    },
    /// The daemon is stopped (SIGSTOP, a tracer) and can answer no control command.
    #[error(
        "pid {pid} is stopped (state T or t in /proc/{pid}/stat) and can answer no control command"
    )]
    Stopped {
        /// The recorded daemon's pid.
        pid: i32,
    },
    /// The control round trip failed or read back other limits than recorded.
    #[error(transparent)]
    ReadBack(#[from] MpsError),
}
