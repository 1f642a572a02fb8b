//! The leaf: every process spawn, mount, `/proc` read and device-node `lstat` the daemon makes goes through the
//! narrow traits here, so everything above runs unchanged against the recording fakes in tests.

mod devices;
#[cfg(test)]
pub(crate) mod fake;
mod host;
mod peer;
mod pidfd;
mod proc;

pub use devices::{DeviceFiles, HostDeviceFiles, NodeKind, NodeStat};
pub use host::{reap_orphans, HostMounter, HostProcesses, HostRunner};
pub use peer::peer_groups;
pub use pidfd::{readable_now, wait_readable, PidFd};
pub use proc::{
    find_lock_holder, parse_status_groups, pid_alive, process_start_time, process_stopped,
    processes_with_env_under, read_cgroup, read_groups, whole_file_write_lock,
};

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A program to run, with exactly this environment (nothing is inherited).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandSpec {
    /// Program path (or a name looked up in `PATH`).
    pub program: PathBuf,
    /// Arguments, without the program name.
    pub args: Vec<String>,
    /// The whole environment of the new process.
    pub env: BTreeMap<String, String>,
    /// Bytes written to the process's stdin (then closed).
    pub stdin: Vec<u8>,
    /// Longest wait for the process to exit; it is killed after that.
    pub timeout: Duration,
    /// Run in a new mount namespace where this host directory is bind-mounted on `/dev/shm`.
    pub private_shm: Option<PathBuf>,
    /// Start it in a process group of its own (`setpgid(0, 0)`), so that signals to
    /// gpushared's process group (a terminal's Ctrl-C, a stop) never reach it or what it forks:
    /// MPS control daemons must outlive gpushared. (Not a new session: std makes one only with
    /// a fork, and a group of its own is what keeps gpushared's signals away.)
    pub new_process_group: bool,
}

/// What a finished process left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutput {
    /// Exit code; `None` when killed by a signal (including our timeout).
    pub code: Option<i32>,
    /// Captured stdout.
    pub stdout: String,
    /// Captured stderr.
    pub stderr: String,
    /// The timeout passed and the process was killed.
    pub timed_out: bool,
}

impl CommandOutput {
    /// Exit code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// stdout and stderr on one line, for error messages.
    pub fn summary(&self) -> String {
        let text = format!("{} {}", self.stdout.trim(), self.stderr.trim());
        let text = text.trim().replace('\n', " / ");
        if self.timed_out {
            format!("timed out; output: {text:?}")
        } else {
            match self.code {
                Some(c) => format!("exit {c}; output: {text:?}"),
                None => format!("killed by a signal; output: {text:?}"),
            }
        }
    }
}

/// Runs processes to completion (bounded). The production implementation is [`HostRunner`].
pub trait CommandRunner: Send + Sync + std::fmt::Debug {
    /// Runs `spec` and waits for it, at most `spec.timeout`.
    ///
    /// # Errors
    /// The process could not be started.
    fn run(&self, spec: &CommandSpec) -> io::Result<CommandOutput>;
}

/// Mounts and unmounts. The production implementation is [`HostMounter`].
pub trait Mounter: Send + Sync + std::fmt::Debug {
    /// Mounts a new tmpfs of `size_bytes` on `target` with `nosuid,nodev,noexec`.
    ///
    /// # Errors
    /// The mount syscall failed (EPERM when not root).
    fn mount_tmpfs(&self, target: &Path, size_bytes: u64) -> io::Result<()>;

    /// Detaches whatever is mounted on `target`; nothing mounted is not an error.
    ///
    /// # Errors
    /// The unmount syscall failed for another reason.
    fn unmount(&self, target: &Path) -> io::Result<()>;

    /// Whether something is mounted exactly on `target` (from `/proc/self/mountinfo`).
    ///
    /// # Errors
    /// mountinfo could not be read.
    fn is_mounted(&self, target: &Path) -> io::Result<bool>;
}

/// Looking at and signalling other processes.
pub trait Processes: Send + Sync + std::fmt::Debug {
    /// The pid holding a POSIX lock on `path` (see [`find_lock_holder`]); `Ok(None)` when
    /// nobody holds one or the file is gone.
    ///
    /// # Errors
    /// The lock file could not be opened or asked (say, out of file descriptors): then
    /// nothing is known, and callers must not take it for "no daemon".
    fn lock_holder(&self, path: &Path) -> io::Result<Option<i32>>;

    /// Whether `pid` runs (zombies count as gone).
    fn alive(&self, pid: i32) -> bool;

    /// Sends SIGKILL to `pid`.
    fn kill(&self, pid: i32);

    /// Reaps `pid` if it is an exited child of ours; anything else is ignored.
    fn reap(&self, pid: i32);

    /// Start time of `pid` in clock ticks after boot (see [`process_start_time`]); `None`
    /// when it does not run. Together with the pid it names one process for good.
    fn start_time(&self, pid: i32) -> Option<u64>;

    /// Whether `pid` is stopped by a signal or a tracer (see [`process_stopped`]): it answers
    /// nothing until continued. `false` when nothing is known.
    fn stopped(&self, pid: i32) -> bool;

    /// Live processes whose environment sets `var` to a path under `dir`, with that path
    /// (see [`processes_with_env_under`]).
    fn with_env_under(&self, var: &str, dir: &Path) -> Vec<(i32, PathBuf)>;

    /// A descriptor that becomes readable when `pid` exits, whoever its parent is: a pidfd
    /// ([`PidFd`]) on the host. It refers to the process, not to its pid, so a reused pid is
    /// never taken for it (check the start time right after opening).
    ///
    /// # Errors
    /// `ESRCH` when no such process runs; `ENOSYS` before Linux 5.3.
    fn watch(&self, pid: i32) -> io::Result<std::os::fd::OwnedFd>;
}

/// What the daemon reads about the machine itself.
pub trait Machine: Send + Sync + std::fmt::Debug {
    /// `MemTotal` of `/proc/meminfo`, in KiB; `None` when it cannot be read.
    fn mem_total_kib(&self) -> Option<u64>;

    /// The current boot's ID (`/proc/sys/kernel/random/boot_id`, a new one at every boot);
    /// empty when it cannot be read.
    fn boot_id(&self) -> String;

    /// The cgroup of a process (see [`read_cgroup`]).
    fn cgroup(&self, pid: i32) -> Option<String>;
}

/// The real machine, through `/proc`.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostMachine;

/// Where Linux tells the current boot's ID.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

impl Machine for HostMachine {
    fn mem_total_kib(&self) -> Option<u64> {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| parse_mem_total_kib(&t))
    }

    fn boot_id(&self) -> String {
        std::fs::read_to_string(BOOT_ID_PATH)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    fn cgroup(&self, pid: i32) -> Option<String> {
        read_cgroup(pid)
    }
}

/// `MemTotal` in KiB from `/proc/meminfo` text.
pub fn parse_mem_total_kib(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// The leaf operations the strategies use, bundled so that tests swap them all at once.
#[derive(Debug, Clone)]
pub struct HostOps {
    /// Runs programs.
    pub runner: Arc<dyn CommandRunner>,
    /// Mounts.
    pub mounter: Arc<dyn Mounter>,
    /// Other processes.
    pub processes: Arc<dyn Processes>,
    /// Device nodes (the check that a claim's CDI spec names only nodes that exist).
    pub devices: Arc<dyn DeviceFiles>,
    /// The machine: memory size, boot ID, cgroups.
    pub machine: Arc<dyn Machine>,
}

impl HostOps {
    /// The real host.
    pub fn host() -> HostOps {
        HostOps {
            runner: Arc::new(HostRunner),
            mounter: Arc::new(HostMounter),
            processes: Arc::new(HostProcesses),
            devices: Arc::new(HostDeviceFiles),
            machine: Arc::new(HostMachine),
        }
    }
}
