//! Per-claim MPS control daemons: started, configured, verified by read-back, and stopped.
//!
//! One control daemon serves one device group of one claim. It runs as `<program> -d` with the
//! claim's own pipe and log directories, `CUDA_VISIBLE_DEVICES` set to the group's sorted UUIDs,
//! and its own mount namespace whose `/dev/shm` is a per-claim tmpfs that the claim's containers
//! get too. The program is NVIDIA's `nvidia-cuda-mps-control` or our emulator: both are reached
//! through the very same [`crate::sys::CommandRunner`] path.
//!
//! Here: [`Mps`], MPS's hold on a whole GPU (compute mode); `group`, an MPS device group's
//! plan, what a prepare starts and a release stops for it; `launch`, what a daemon is started
//! with (pure); `control`, starting one and verifying its limits by read-back; `stop`, finding
//! and stopping one; `error`, why an operation failed. After the prepare: `supervise`, what
//! the supervisor watches and when a dead daemon is started again (pure); `restart`, the
//! claim `Degraded` and its daemon started again, through [`MpsNode`] (what the service lends);
//! `revive`, a daemon re-adopted or restarted at start; `liveness`, `attach`'s check from
//! pidfds; `orphans`, daemons and processes of ours that no claim owns, stopped at start.

use gpushare_proto::ComputeMode;

use super::Strategy;
use crate::error::ServiceError;
use crate::gpu::GpuBackend;

mod control;
mod error;
mod group;
mod launch;
mod liveness;
mod orphans;
mod restart;
mod revive;
mod stop;
mod supervise;

pub use control::MpsControl;
pub use error::{AdoptError, MpsError};
pub use group::{
    daemon_edits, plan_launch, planned_record, start_recorded, stop_recorded, MpsGroup,
};
pub use launch::{
    default_shm_bytes, launch_of, percentage_display, pinned_limit_display, set_commands, MpsDirs,
    MpsLaunch,
};
pub use liveness::Watches;
pub use orphans::{kill_strays, stop_orphan_groups};
pub use restart::{
    change, daemon_exited, daemons_running, dead_daemon, read, record_restart_failed, restart_dead,
    restart_due, restart_group, MpsNode, RestartFailed,
};
pub use revive::revive_daemon;
pub use stop::Liveness;
pub use supervise::{restart_backoff, supervised, Restarts, SupervisedDaemon};

/// MPS's hold on a whole GPU: compute mode `EXCLUSIVE_PROCESS`, so that the claim's control
/// daemon is the GPU's only client and every CUDA process of the claim goes through it. One
/// claim per GPU (admission's rule); the last holder puts `DEFAULT` back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mps;

impl Strategy for Mps {
    fn has_setting(&self) -> bool {
        true
    }

    fn set_up(
        &self,
        backend: &dyn GpuBackend,
        uuid: &str,
        device: &str,
    ) -> Result<(), ServiceError> {
        backend
            .set_compute_mode(uuid, ComputeMode::ExclusiveProcess)
            .map_err(|e| {
                ServiceError::gpu(
                    format_args!("setting compute mode EXCLUSIVE_PROCESS on {device}"),
                    &e,
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

    fn clear_leftover(&self, backend: &dyn GpuBackend, uuid: &str, device: &str) {
        if backend.compute_mode(uuid).ok() == Some(ComputeMode::ExclusiveProcess) {
            tracing::warn!(gpu = %device, "compute mode EXCLUSIVE_PROCESS that no MPS claim holds (an interrupted prepare or release left it); back to DEFAULT");
            if let Err(e) = backend.set_compute_mode(uuid, ComputeMode::Default) {
                tracing::error!(gpu = %device, error = %e, "putting the compute mode back to DEFAULT");
            }
        }
    }
}

#[cfg(test)]
mod tests;
