//! Per-claim MPS control daemons: started, configured, verified by read-back, and stopped.
//!
//! One control daemon serves one device group of one claim. It runs as `<program> -d` with the
//! claim's own pipe and log directories, `CUDA_VISIBLE_DEVICES` set to the group's sorted UUIDs,
//! and its own mount namespace whose `/dev/shm` is a per-claim tmpfs that the claim's containers
//! get too. The program is NVIDIA's `nvidia-cuda-mps-control` or our emulator: both are reached
//! through the very same [`crate::sys::CommandRunner`] path.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpushare_proto::{ComputeMode, ErrorCode, MpsInfo, MpsRequested};
use sha2::{Digest, Sha256};

use super::Strategy;
use crate::error::ServiceError;
use crate::fsutil;
use crate::gpu::{GpuBackend, GpuError};
use crate::sys::{CommandSpec, HostOps};

/// MPS's hold on a whole GPU: compute mode `EXCLUSIVE_PROCESS`, so that the claim's control
/// daemon is the GPU's only client and every CUDA process of the claim goes through it. One
/// claim per GPU (admission's rule); the last holder puts `DEFAULT` back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mps;

impl Strategy for Mps {
    fn set_up(
        &self,
        backend: &dyn GpuBackend,
        uuid: &str,
        device: &str,
    ) -> Result<(), ServiceError> {
        backend
            .set_compute_mode(uuid, ComputeMode::ExclusiveProcess)
            .map_err(|e| {
                let code = match e {
                    GpuError::Busy(_) => ErrorCode::Conflict,
                    _ => ErrorCode::Internal,
                };
                ServiceError::new(
                    code,
                    format!("setting compute mode EXCLUSIVE_PROCESS on {device}: {e}"),
                )
            })
    }

    fn check_again(&self, backend: &dyn GpuBackend, uuid: &str, device: &str) {
        if backend.compute_mode(uuid).ok() != Some(ComputeMode::ExclusiveProcess) {
            tracing::warn!(gpu = %device, "compute mode is not EXCLUSIVE_PROCESS under an MPS claim; re-applying");
            if let Err(e) = backend.set_compute_mode(uuid, ComputeMode::ExclusiveProcess) {
                tracing::error!(gpu = %device, error = %e, "re-applying compute mode");
            }
        }
    }

    fn restore(&self, backend: &dyn GpuBackend, uuid: &str, device: &str) {
        if let Err(e) = backend.set_compute_mode(uuid, ComputeMode::Default) {
            tracing::error!(gpu = %device, error = %e, "restoring compute mode DEFAULT");
        }
    }
}

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

/// The longest socket the control daemon creates in its pipe directory.
const SOCKET_NAME: &str = "control_privileged";

/// `sun_path` holds 108 bytes including the terminating NUL. NVIDIA's daemon exits 1 without
/// a word when its socket path does not fit, so the length is checked before it runs.
const MAX_SOCKET_PATH: usize = 107;

/// The directories of one MPS control daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsDirs {
    /// `<run-dir>/claims/<uid>/mps-<hash>`.
    pub root: PathBuf,
    /// `root/pipe`: `CUDA_MPS_PIPE_DIRECTORY` of the daemon; `/tmp/nvidia-mps` in containers.
    pub pipe: PathBuf,
    /// `root/log`: `CUDA_MPS_LOG_DIRECTORY` (`control.log`, `server.log`).
    pub log: PathBuf,
    /// `root/shm`: a tmpfs; `/dev/shm` for the daemon, its servers and the containers.
    pub shm: PathBuf,
}

impl MpsDirs {
    /// Directories for the group of `claim_dir` whose GPUs have these sorted UUIDs. The name
    /// carries 5 hex digits of SHA-256 of the UUIDs, so two groups of one claim never collide
    /// and a restarted daemon finds the same path.
    pub fn for_group(claim_dir: &Path, sorted_uuids: &[String]) -> MpsDirs {
        let digest = Sha256::digest(sorted_uuids.join(",").as_bytes());
        let hash: String = digest.iter().take(3).map(|b| format!("{b:02x}")).collect();
        let root = claim_dir.join(format!("mps-{}", &hash[..5]));
        MpsDirs {
            pipe: root.join("pipe"),
            log: root.join("log"),
            shm: root.join("shm"),
            root,
        }
    }
}

impl MpsDirs {
    /// Checks that the daemon's sockets fit in a Unix socket address.
    ///
    /// # Errors
    /// [`MpsError::PathTooLong`].
    pub fn check_socket_paths(&self) -> Result<(), MpsError> {
        let len = self.pipe.join(SOCKET_NAME).as_os_str().len();
        if len > MAX_SOCKET_PATH {
            return Err(MpsError::PathTooLong {
                pipe: self.pipe.clone(),
                len,
                max: MAX_SOCKET_PATH,
            });
        }
        Ok(())
    }

    /// The directories of a daemon whose pipe directory is `pipe` (as recorded in a claim).
    pub fn from_pipe(pipe: &Path) -> MpsDirs {
        let root = pipe
            .parent()
            .map_or_else(|| pipe.to_path_buf(), Path::to_path_buf);
        MpsDirs {
            pipe: root.join("pipe"),
            log: root.join("log"),
            shm: root.join("shm"),
            root,
        }
    }
}

/// What to start: one device group's daemon and its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsLaunch {
    /// Where it lives.
    pub dirs: MpsDirs,
    /// Sorted GPU UUIDs (`CUDA_VISIBLE_DEVICES`); index = CUDA ordinal inside the daemon.
    pub visible_devices: Vec<String>,
    /// Start with `-M` (multi-user).
    pub multi_user: bool,
    /// Default active thread percentage, 1–100.
    pub active_thread_percentage: Option<u32>,
    /// Default pinned device memory limit per CUDA ordinal, in MiB.
    pub pinned_limits_mib: Vec<Option<u64>>,
    /// Size of the shm tmpfs in bytes.
    pub shm_bytes: u64,
}

/// The launch that (re)creates the daemon recorded in `info`: same directories, devices,
/// options and limits as asked.
pub fn launch_of(info: &MpsInfo) -> MpsLaunch {
    MpsLaunch {
        dirs: MpsDirs::from_pipe(Path::new(&info.pipe_dir)),
        visible_devices: info.visible_devices.clone(),
        multi_user: info.requested.multi_user,
        active_thread_percentage: info.requested.active_thread_percentage,
        pinned_limits_mib: if info.requested.pinned_limits_mib.is_empty() {
            vec![None; info.visible_devices.len()]
        } else {
            info.requested.pinned_limits_mib.clone()
        },
        shm_bytes: if info.requested.shm_bytes == 0 {
            64 << 20
        } else {
            info.requested.shm_bytes
        },
    }
}

/// What the control daemon shows for `get_default_active_thread_percentage` after
/// `set_default_active_thread_percentage p` (or by default): one decimal.
pub fn percentage_display(p: Option<u32>) -> String {
    format!("{:.1}", f64::from(p.unwrap_or(100)))
}

/// What the control daemon shows for `get_default_device_pinned_mem_limit` after the limit
/// was set to `mib` MiB: whole GiB (floored) from 1 GiB on, else MiB; empty when unset.
/// NVIDIA's daemon displays lossily (1536M reads back as `1G`), so this is what we compare.
pub fn pinned_limit_display(mib: Option<u64>) -> String {
    match mib {
        None => String::new(),
        Some(m) if m >= 1024 => format!("{}G", m / 1024),
        Some(m) => format!("{m}M"),
    }
}

/// The `set_*` commands for a launch. Pinned limits are keyed by CUDA **ordinal**, never by
/// UUID: NVIDIA's control daemon accepts a UUID key silently, stores nothing for it, and clears
/// device 0's limit instead.
pub fn set_commands(launch: &MpsLaunch) -> Vec<String> {
    let mut cmds = Vec::new();
    if let Some(p) = launch.active_thread_percentage {
        cmds.push(format!("set_default_active_thread_percentage {p}"));
    }
    for (ordinal, mib) in launch.pinned_limits_mib.iter().enumerate() {
        if let Some(mib) = mib {
            cmds.push(format!(
                "set_default_device_pinned_mem_limit {ordinal} {mib}M"
            ));
        }
    }
    cmds
}

/// Half of the host's memory (`mem_total_kib`, from [`crate::sys::Machine`]), as NVIDIA sizes
/// per-claim shm tmpfs (pages are used only when touched). Falls back to 64 MiB when the size
/// is unknown.
pub fn default_shm_bytes(mem_total_kib: Option<u64>) -> u64 {
    mem_total_kib.map(|kib| kib * 1024 / 2).unwrap_or(64 << 20)
}

/// Drives one MPS control program.
#[derive(Debug, Clone)]
pub struct MpsControl {
    program: PathBuf,
    ops: HostOps,
    timeout: Duration,
}

impl MpsControl {
    /// A driver for `program` (NVIDIA's `nvidia-cuda-mps-control` or `gpushare-mps-control`).
    /// `timeout` bounds every run of the program and every wait for a daemon to exit.
    pub fn new(program: PathBuf, ops: HostOps, timeout: Duration) -> MpsControl {
        MpsControl {
            program,
            ops,
            timeout,
        }
    }

    /// The leaf operations it uses.
    pub fn ops(&self) -> &HostOps {
        &self.ops
    }

    /// The program in use.
    pub fn program(&self) -> &Path {
        &self.program
    }

    fn env(&self, dirs: &MpsDirs) -> BTreeMap<String, String> {
        BTreeMap::from([
            (
                "CUDA_MPS_PIPE_DIRECTORY".into(),
                dirs.pipe.display().to_string(),
            ),
            (
                "CUDA_MPS_LOG_DIRECTORY".into(),
                dirs.log.display().to_string(),
            ),
            // The daemon finds nvidia-cuda-mps-server through PATH.
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
        ])
    }

    /// Sends `commands` in one UI session; returns stdout.
    ///
    /// # Errors
    /// [`MpsError::Spawn`] or [`MpsError::Ui`] when the session failed (the UI exits 0
    /// whenever it reached the daemon, even if it rejected every command).
    pub fn ui(&self, dirs: &MpsDirs, commands: &[String]) -> Result<String, MpsError> {
        let mut stdin = commands.join("\n").into_bytes();
        stdin.push(b'\n');
        let out = self
            .ops
            .runner
            .run(&CommandSpec {
                program: self.program.clone(),
                args: vec![],
                env: self.env(dirs),
                stdin,
                timeout: self.timeout,
                private_shm: None,
                new_session: false,
            })
            .map_err(|source| MpsError::Spawn {
                program: self.program.clone(),
                source,
            })?;
        if !out.success() {
            return Err(MpsError::Ui {
                pipe: dirs.pipe.clone(),
                commands: commands.to_vec(),
                summary: out.summary(),
            });
        }
        Ok(out.stdout)
    }

    fn query(&self, dirs: &MpsDirs, command: String) -> Result<String, MpsError> {
        Ok(self.ui(dirs, &[command])?.trim().to_string())
    }

    /// Starts the daemon of `launch`, applies its limits and verifies them by read-back.
    /// On any failure everything started or created is undone before returning.
    ///
    /// # Errors
    /// Any [`MpsError`]; nothing is left behind.
    pub fn start(&self, launch: &MpsLaunch) -> Result<MpsInfo, MpsError> {
        self.start_with(launch, false)
    }

    /// Starts the daemon of a claim that was prepared before (its daemon died, or the host
    /// rebooted), as [`MpsControl::start`] does, except that the directories and the shm tmpfs
    /// are kept, on success and on failure alike: running containers have them bind-mounted,
    /// and only the very same pipe directory lets them reach the new daemon.
    ///
    /// # Errors
    /// Any [`MpsError`]; a daemon started by the failed attempt is stopped.
    pub fn restart(&self, launch: &MpsLaunch) -> Result<MpsInfo, MpsError> {
        self.start_with(launch, true)
    }

    fn start_with(&self, launch: &MpsLaunch, keep_dirs: bool) -> Result<MpsInfo, MpsError> {
        let mut pid = None;
        let result = self.start_inner(launch, &mut pid, keep_dirs);
        if result.is_err() {
            let undone = if keep_dirs {
                self.stop_daemon(&launch.dirs, pid)
            } else {
                self.stop(&launch.dirs, pid)
            };
            if let Err(e) = undone {
                tracing::error!(pipe = %launch.dirs.pipe.display(), error = %e, "rolling back a failed MPS start");
            }
        }
        result
    }

    fn start_inner(
        &self,
        launch: &MpsLaunch,
        pid_out: &mut Option<i32>,
        keep_dirs: bool,
    ) -> Result<MpsInfo, MpsError> {
        let dirs = &launch.dirs;
        dirs.check_socket_paths()?;
        // A daemon still holding this group's pipe directory is a leftover of an earlier run
        // (a quarantined checkpoint, a crash mid-prepare): it would refuse our start with
        // "An instance of this daemon is already running", so it goes first.
        if let Some(old) = self.holder(dirs).ok().flatten() {
            tracing::warn!(pid = old, pipe = %dirs.pipe.display(), "stopping a leftover MPS control daemon on this claim's pipe directory");
            if keep_dirs {
                self.stop_daemon(dirs, Some(old))?;
            } else {
                self.stop(dirs, Some(old))?;
            }
        }
        // Each level is created (or found) without following a symbolic link. The claim's
        // directories are traversable but not listable by other host users: containers reach
        // pipe and shm through their bind mounts, and an MPS server that NVIDIA's daemon starts
        // under a client's uid can still walk to the pipe directory.
        let claim_dir = dirs.root.parent().unwrap_or(&dirs.root).to_path_buf();
        for (path, mode) in [
            (&claim_dir, 0o711),
            (&dirs.root, 0o711),
            (&dirs.pipe, 0o755),
            (&dirs.log, 0o700),
            (&dirs.shm, 0o755),
        ] {
            fsutil::create_dir(path, mode).map_err(|source| MpsError::Dir {
                action: "creating",
                path: path.clone(),
                source,
            })?;
        }
        let mounted = self
            .ops
            .mounter
            .is_mounted(&dirs.shm)
            .map_err(|source| MpsError::Mount {
                action: "checking",
                path: dirs.shm.clone(),
                source,
            })?;
        if !mounted {
            self.ops
                .mounter
                .mount_tmpfs(&dirs.shm, launch.shm_bytes)
                .map_err(|source| MpsError::Mount {
                    action: "mounting",
                    path: dirs.shm.clone(),
                    source,
                })?;
        }

        let mut env = self.env(dirs);
        env.insert(
            "CUDA_VISIBLE_DEVICES".into(),
            launch.visible_devices.join(","),
        );
        let mut args = vec!["-d".to_string()];
        if launch.multi_user {
            args.push("-M".into());
        }
        let out = self
            .ops
            .runner
            .run(&CommandSpec {
                program: self.program.clone(),
                args,
                env,
                stdin: vec![],
                timeout: self.timeout,
                private_shm: Some(dirs.shm.clone()),
                new_session: true,
            })
            .map_err(|source| MpsError::Spawn {
                program: self.program.clone(),
                source,
            })?;
        if !out.success() {
            let mut summary = out.summary();
            if launch.multi_user {
                summary.push_str(
                    " (multiUser: this MPS control program may not know -M; NVIDIA's 535 does not)",
                );
            }
            return Err(MpsError::StartFailed {
                pipe: dirs.pipe.clone(),
                summary,
            });
        }
        let pid = self.wait_for_pid(dirs)?;
        *pid_out = Some(pid);

        let cmds = set_commands(launch);
        if !cmds.is_empty() {
            self.ui(dirs, &cmds)?;
        }
        let (atp, limits) = self.read_back(launch)?;
        Ok(MpsInfo {
            control_daemon_pid: pid,
            pipe_dir: dirs.pipe.display().to_string(),
            log_dir: dirs.log.display().to_string(),
            shm_dir: dirs.shm.display().to_string(),
            visible_devices: launch.visible_devices.clone(),
            active_thread_percentage: atp,
            pinned_device_memory_limits: limits,
            control_daemon_start_time: self.ops.processes.start_time(pid).unwrap_or(0),
            requested: MpsRequested {
                multi_user: launch.multi_user,
                active_thread_percentage: launch.active_thread_percentage,
                pinned_limits_mib: launch.pinned_limits_mib.clone(),
                shm_bytes: launch.shm_bytes,
            },
            restarts: 0,
        })
    }

    /// Reads back the default active thread percentage and every pinned device memory limit
    /// of the daemon on `launch.dirs` and compares them with what `launch` asks (a device
    /// without a limit must read back none). Returns the values as shown (`"50.0"`, ordinal →
    /// `"8G"`, only for devices with a limit).
    ///
    /// NVIDIA's daemon reports most rejected settings only in control.log, so a claim is ready
    /// only when what it shows is what we asked.
    ///
    /// # Errors
    /// [`MpsError::Ui`]/[`MpsError::Spawn`] when the daemon cannot be reached,
    /// [`MpsError::Verify`] when a value differs.
    pub fn read_back(
        &self,
        launch: &MpsLaunch,
    ) -> Result<(String, BTreeMap<String, String>), MpsError> {
        let dirs = &launch.dirs;
        let atp = self.query(dirs, "get_default_active_thread_percentage".into())?;
        let want = percentage_display(launch.active_thread_percentage);
        if atp != want {
            return Err(MpsError::Verify {
                pipe: dirs.pipe.clone(),
                what: "the default active thread percentage".into(),
                expected: want,
                actual: atp,
            });
        }
        let mut limits = BTreeMap::new();
        for (ordinal, mib) in launch.pinned_limits_mib.iter().enumerate() {
            let got = self.query(
                dirs,
                format!("get_default_device_pinned_mem_limit {ordinal}"),
            )?;
            let want = pinned_limit_display(*mib);
            if got != want {
                return Err(MpsError::Verify {
                    pipe: dirs.pipe.clone(),
                    what: format!("the pinned device memory limit of device {ordinal}"),
                    expected: want,
                    actual: got,
                });
            }
            // A device without a limit is verified to have none (above) but not listed: an
            // entry would show an empty limit, as if one had been set to nothing.
            if mib.is_some() {
                limits.insert(ordinal.to_string(), got);
            }
        }
        Ok((atp, limits))
    }

    /// Whether the daemon recorded in `info` can be adopted as it runs: the holder of its
    /// pipe directory is the recorded pid, with the recorded start time (a recycled pid is
    /// another process), and a control round trip reads back the limits it was asked for.
    ///
    /// # Errors
    /// Why it cannot be adopted, in one line.
    pub fn check_adoptable(&self, info: &MpsInfo) -> Result<(), String> {
        let launch = launch_of(info);
        let pid = info.control_daemon_pid;
        match self.holder(&launch.dirs) {
            Ok(Some(h)) if h == pid => {}
            Ok(Some(h)) => {
                return Err(format!(
                    "pid {h}, not the recorded {pid}, holds {}",
                    launch.dirs.pipe.display()
                ))
            }
            Ok(None) => return Err(format!("MPS control daemon (pid {pid}) is not running")),
            Err(e) => return Err(format!("asking who holds its control_lock: {e}")),
        }
        let started = self.ops.processes.start_time(pid);
        if info.control_daemon_start_time != 0 && started != Some(info.control_daemon_start_time) {
            return Err(format!(
                "pid {pid} started at tick {started:?}, not at the recorded {}: another process",
                info.control_daemon_start_time
            ));
        }
        self.read_back(&launch)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    fn wait_for_pid(&self, dirs: &MpsDirs) -> Result<i32, MpsError> {
        let lock = dirs.pipe.join("control_lock");
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Ok(Some(pid)) = self.ops.processes.lock_holder(&lock) {
                return Ok(pid);
            }
            if Instant::now() >= deadline {
                return Err(MpsError::NoPid {
                    pipe: dirs.pipe.clone(),
                    timeout: self.timeout,
                });
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// The daemon holding `dirs`' pipe directory. A group directory or pipe directory that is
    /// a symbolic link is none of ours (gpushare makes real directories): whatever holds the
    /// lock at the link's target is another group's daemon, never this one's, so none is named
    /// and nothing is signalled through it.
    fn holder(&self, dirs: &MpsDirs) -> io::Result<Option<i32>> {
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
            if let Err(e) = self.ui(dirs, &["quit".to_string()]) {
                // Not killed yet: `quit`'s exit status is the daemon's own, so a daemon that is
                // shutting down can answer with an error too; it gets the timeout to exit.
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
        Ok(())
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

#[cfg(test)]
#[path = "mps_tests.rs"]
mod tests;
