//! Driving one MPS control program: a group's daemon started, its limits set and read back,
//! a running daemon checked before it is adopted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{launch_of, percentage_display, pinned_limit_display, set_commands};
use super::{AdoptError, MpsDirs, MpsError, MpsLaunch};
use crate::claim::MpsDaemon;
use crate::fsutil;
use crate::sys::{CommandSpec, HostOps};

/// Drives one MPS control program.
#[derive(Debug, Clone)]
pub struct MpsControl {
    pub(super) program: PathBuf,
    pub(super) ops: HostOps,
    pub(super) timeout: Duration,
    /// Pipe directories whose daemon let the last control session run out its timeout (a
    /// hung daemon): it is not asked again, so a stop kills it at once instead of spending
    /// another timeout on a `quit` it will not answer either.
    pub(super) unanswered: Arc<Mutex<BTreeSet<PathBuf>>>,
}

impl MpsControl {
    /// A driver for `program` (NVIDIA's `nvidia-cuda-mps-control` or `gpushare-mps-control`).
    /// `timeout` bounds every run of the program and every wait for a daemon to exit.
    pub fn new(program: PathBuf, ops: HostOps, timeout: Duration) -> MpsControl {
        MpsControl {
            program,
            ops,
            timeout,
            unanswered: Arc::default(),
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
                new_process_group: false,
            })
            .map_err(|source| MpsError::Spawn {
                program: self.program.clone(),
                source,
            })?;
        self.note_answer(dirs, !out.timed_out);
        if !out.success() {
            return Err(MpsError::Ui {
                pipe: dirs.pipe.clone(),
                commands: commands.to_vec(),
                summary: out.summary(),
            });
        }
        Ok(out.stdout)
    }

    /// Remembers whether the daemon on `dirs` answered a control session (`false`: the
    /// session ran out its timeout).
    pub(super) fn note_answer(&self, dirs: &MpsDirs, answered: bool) {
        let mut set = self.unanswered.lock().unwrap_or_else(|p| p.into_inner());
        if answered {
            set.remove(&dirs.pipe);
        } else {
            set.insert(dirs.pipe.clone());
        }
    }

    /// Whether the last control session on `dirs` ran out its timeout.
    pub(super) fn is_unanswered(&self, dirs: &MpsDirs) -> bool {
        self.unanswered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&dirs.pipe)
    }

    fn query(&self, dirs: &MpsDirs, command: String) -> Result<String, MpsError> {
        Ok(self.ui(dirs, &[command])?.trim().to_string())
    }

    /// Starts the daemon of `launch`, applies its limits and verifies them by read-back.
    /// On any failure everything started or created is undone before returning.
    ///
    /// # Errors
    /// Any [`MpsError`]; nothing is left behind.
    pub fn start(&self, launch: &MpsLaunch) -> Result<MpsDaemon, MpsError> {
        self.start_with(launch, false)
    }

    /// Starts the daemon of a claim that was prepared before (its daemon died, or the host
    /// rebooted), as [`MpsControl::start`] does, except that the directories and the shm tmpfs
    /// are kept, on success and on failure alike: running containers have them bind-mounted,
    /// and only the very same pipe directory lets them reach the new daemon.
    ///
    /// # Errors
    /// Any [`MpsError`]; a daemon started by the failed attempt is stopped.
    pub fn restart(&self, launch: &MpsLaunch) -> Result<MpsDaemon, MpsError> {
        self.start_with(launch, true)
    }

    fn start_with(&self, launch: &MpsLaunch, keep_dirs: bool) -> Result<MpsDaemon, MpsError> {
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
    ) -> Result<MpsDaemon, MpsError> {
        let dirs = &launch.dirs;
        dirs.check_socket_paths()?;
        self.stop_leftover(dirs, keep_dirs)?;
        create_dirs(dirs)?;
        self.mount_shm(launch)?;
        self.spawn_daemon(launch)?;
        let pid = self.wait_for_pid(dirs)?;
        *pid_out = Some(pid);

        let cmds = set_commands(launch);
        if !cmds.is_empty() {
            self.ui(dirs, &cmds)?;
        }
        let (atp, limits) = self.read_back(launch)?;
        Ok(MpsDaemon {
            control_daemon_pid: pid,
            pipe_dir: dirs.pipe.display().to_string(),
            log_dir: dirs.log.display().to_string(),
            shm_dir: dirs.shm.display().to_string(),
            visible_devices: launch.visible_devices.clone(),
            active_thread_percentage: atp,
            pinned_device_memory_limits: limits,
            control_daemon_start_time: self.ops.processes.start_time(pid).unwrap_or(0),
            requested: launch.requested(),
            restarts: 0,
        })
    }

    /// Stops a daemon still holding this group's pipe directory: a leftover of an earlier run
    /// (a quarantined checkpoint, a crash mid-prepare), which would refuse our start with "An
    /// instance of this daemon is already running". With `keep_dirs` (a restart) only the
    /// daemon goes, not the directories.
    fn stop_leftover(&self, dirs: &MpsDirs, keep_dirs: bool) -> Result<(), MpsError> {
        if let Some(old) = self.holder(dirs).ok().flatten() {
            tracing::warn!(pid = old, pipe = %dirs.pipe.display(), "stopping a leftover MPS control daemon on this claim's pipe directory");
            if keep_dirs {
                self.stop_daemon(dirs, Some(old))?;
            } else {
                self.stop(dirs, Some(old))?;
            }
        }
        Ok(())
    }

    /// Mounts the group's private tmpfs on its shm directory, unless one is mounted there
    /// already (a restart keeps it), sized as `launch` asks.
    fn mount_shm(&self, launch: &MpsLaunch) -> Result<(), MpsError> {
        let dirs = &launch.dirs;
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
        Ok(())
    }

    /// Runs the control program as a daemon (`-d`, `-M` for a multi-user group) on the
    /// group's directories and devices; returns once the program has answered, not when the
    /// daemon is up ([`MpsControl::wait_for_pid`] waits for that).
    fn spawn_daemon(&self, launch: &MpsLaunch) -> Result<(), MpsError> {
        let dirs = &launch.dirs;
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
                new_process_group: true,
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
        Ok(())
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
    /// [`AdoptError`]: why it cannot be adopted, in one line.
    pub fn check_adoptable(&self, info: &MpsDaemon) -> Result<(), AdoptError> {
        let launch = launch_of(info);
        let pid = info.control_daemon_pid;
        match self.holder(&launch.dirs) {
            Ok(Some(h)) if h == pid => {}
            Ok(Some(holder)) => {
                return Err(AdoptError::OtherHolder {
                    holder,
                    pid,
                    pipe: launch.dirs.pipe.clone(),
                })
            }
            Ok(None) => return Err(AdoptError::NotRunning { pid }),
            Err(source) => return Err(AdoptError::Holder { source }),
        }
        let started = self.ops.processes.start_time(pid);
        let recorded = info.control_daemon_start_time;
        if recorded != 0 && started != Some(recorded) {
            return Err(AdoptError::Recycled {
                pid,
                started,
                recorded,
            });
        }
        // A stopped daemon (SIGSTOP, a tracer) cannot answer the round trip: asking would
        // only run out the timeout, and the restart that follows kills it without asking.
        if self.ops.processes.stopped(pid) {
            return Err(AdoptError::Stopped { pid });
        }
        self.read_back(&launch)?;
        Ok(())
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
}

/// Creates the claim's MPS directories, each level without following a symbolic link (or
/// finds them). The claim's directories are traversable but not listable by other host users:
/// containers reach pipe and shm through their bind mounts, and an MPS server that NVIDIA's
/// daemon starts under a client's uid can still walk to the pipe directory.
fn create_dirs(dirs: &MpsDirs) -> Result<(), MpsError> {
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
    Ok(())
}
