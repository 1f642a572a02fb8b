//! A group's MPS control daemon as planned, touching nothing: its directories, what it is
//! started with, the commands that set its limits and what it shows when they are read back.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::MpsError;
use crate::claim::{MpsAsked, MpsDaemon};

/// The longest socket the control daemon creates in its pipe directory.
pub(super) const SOCKET_NAME: &str = "control_privileged";

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

impl MpsLaunch {
    /// What the claim asked of its daemon, as recorded beside what was read back.
    pub fn requested(&self) -> MpsAsked {
        MpsAsked {
            multi_user: self.multi_user,
            active_thread_percentage: self.active_thread_percentage,
            pinned_limits_mib: self.pinned_limits_mib.clone(),
            shm_bytes: self.shm_bytes,
        }
    }
}

/// The launch that (re)creates the daemon recorded in `info`: same directories, devices,
/// options and limits as asked.
pub fn launch_of(info: &MpsDaemon) -> MpsLaunch {
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
