//! An MPS device group: its daemon planned from the claim's config, started by a prepare
//! (its pid recorded the moment it runs), stopped by a release. MIG groups with MPS reuse
//! these for the daemon on their slices (`strategy::mig`).

use std::collections::BTreeMap;
use std::path::Path;

use gpushare_proto::ErrorCode;

use super::{Mps, MpsDirs, MpsLaunch};
use crate::claim::{Group, MpsDaemon, Sharing};
use crate::config::MpsSettings;
use crate::error::ServiceError;
use gpushare_core::Want;

use crate::cdi::{self, ContainerEdits};
use crate::gpu::GpuBackend;
use crate::strategy::group::{
    check_whole_gpus, whole_gpu_edits, whole_gpu_holds, Applied, GpuHold, GroupEffects, GroupLife,
    GroupStrategy, Revival,
};
use crate::strategy::select::{GroupAsk, Planning};
use crate::strategy::{mps_support, Strategy};

/// An MPS group of whole GPUs: compute mode `EXCLUSIVE_PROCESS` on each ([`Mps`]), then one
/// control daemon for the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsGroup {
    /// The group's daemon; `visible_devices` are the group's sorted GPU UUIDs.
    pub launch: MpsLaunch,
}

impl MpsGroup {
    /// Plans an MPS group of whole GPUs as `settings` ask: each GPU checked to be had whole
    /// and to keep the settings ([`mps_support`]), then the daemon's launch ([`plan_launch`],
    /// keyed by the group's sorted GPU UUIDs).
    ///
    /// # Errors
    /// A GPU that cannot be had whole now, `Unsupported` for one whose MPS cannot keep the
    /// settings, or the launch's refusal.
    pub fn plan(
        p: &Planning<'_>,
        group: &GroupAsk<'_>,
        settings: &MpsSettings,
    ) -> Result<MpsGroup, ServiceError> {
        check_whole_gpus(p, group)?;
        mps_support::check_gpus(group.gpus, settings)?;
        let uuids: Vec<String> = group.devices.iter().map(|d| d.uuid.clone()).collect();
        let launch = plan_launch(
            &group.spec.uid,
            p.claim_dir,
            &uuids,
            group.requests,
            settings,
            p.shm_bytes,
        )?;
        Ok(MpsGroup { launch })
    }
}

impl GroupStrategy for MpsGroup {
    fn whole_gpu(&self) -> Option<&dyn Strategy> {
        Some(&Mps)
    }

    fn planned(&self) -> Sharing {
        Sharing::Mps(planned_record(&self.launch))
    }

    fn apply(&self, fx: &GroupEffects<'_>) -> Result<Applied, ServiceError> {
        let started = start_recorded(fx, &self.launch)?;
        Ok(Applied {
            sharing: Sharing::Mps(started),
        })
    }
}

impl GroupLife for Mps {
    fn holds(&self, group: &Group) -> Vec<GpuHold> {
        whole_gpu_holds(group, Want::Mps)
    }

    /// The whole GPUs' nodes and the daemon's pipe directory and shm.
    fn edits(&self, node: &dyn GpuBackend, group: &Group, request: &str) -> ContainerEdits {
        let mut edits = whole_gpu_edits(node, group, request);
        cdi::merge(&mut edits, daemon_edits(group, request));
        edits
    }

    /// Its MPS control daemon, re-adopted or started again.
    fn revive(&self, fx: &Revival<'_>, group: &Group) -> bool {
        group
            .mps()
            .is_some_and(|m| super::revive_daemon(fx.node, fx.uid, m, fx.rebooted))
    }

    fn stop(&self, fx: &GroupEffects<'_>, group: &Group) -> Result<(), ServiceError> {
        stop_recorded(fx, group)
    }
}

/// The launch of a group's daemon as `settings` ask, touching nothing. `keys` name the
/// group's devices in CUDA ordinal order, as the config's per-device pinned limits name them
/// (the sorted GPU UUIDs; a MIG group's canonical device names); they also name the daemon's
/// directories under `claim_dir`, and are its `visible_devices` (a MIG group replaces them
/// with the MIG UUIDs once its instances exist). `shm_bytes` sizes the shm tmpfs.
///
/// # Errors
/// The config's own code for a pinned limit it cannot resolve, naming `requests`;
/// `InvalidRequest` where the claim UID `uid` leaves the daemon's sockets no room in a Unix
/// socket address.
pub fn plan_launch(
    uid: &str,
    claim_dir: &Path,
    keys: &[String],
    requests: &[String],
    settings: &MpsSettings,
    shm_bytes: u64,
) -> Result<MpsLaunch, ServiceError> {
    let pinned = settings.resolve_pinned_limits(keys).map_err(|e| {
        ServiceError::new(
            e.code,
            format!(
                "config of request(s) {}: {}",
                requests.join(", "),
                e.message
            ),
        )
    })?;
    let dirs = MpsDirs::for_group(claim_dir, keys);
    dirs.check_socket_paths().map_err(|e| {
        ServiceError::new(
            ErrorCode::InvalidRequest,
            format!("claim UID {uid:?} is too long for an MPS claim here: {e}"),
        )
    })?;
    Ok(MpsLaunch {
        dirs,
        visible_devices: keys.to_vec(),
        multi_user: settings.multi_user,
        active_thread_percentage: settings.active_thread_percentage,
        pinned_limits_mib: pinned,
        shm_bytes,
    })
}

/// The record of `launch`'s daemon before it runs: its directories (so that a rollback or a
/// restarted gpushared can clean them), pid 0, nothing read back yet, what was asked.
pub fn planned_record(launch: &MpsLaunch) -> MpsDaemon {
    MpsDaemon {
        control_daemon_pid: 0,
        pipe_dir: launch.dirs.pipe.display().to_string(),
        log_dir: launch.dirs.log.display().to_string(),
        shm_dir: launch.dirs.shm.display().to_string(),
        visible_devices: launch.visible_devices.clone(),
        active_thread_percentage: String::new(),
        pinned_device_memory_limits: BTreeMap::new(),
        control_daemon_start_time: 0,
        requested: launch.requested(),
        restarts: 0,
    }
}

/// Starts `launch`'s daemon (limits set and read back), then records it as the group's
/// sharing at once, so that a failure later in this prepare stops this daemon too.
///
/// # Errors
/// `Internal`, naming the claim, when the daemon did not start (nothing of it is left).
pub fn start_recorded(
    fx: &GroupEffects<'_>,
    launch: &MpsLaunch,
) -> Result<MpsDaemon, ServiceError> {
    let started = fx
        .mps
        .start(launch)
        .map_err(|e| ServiceError::internal(format!("claim {}: {e}", fx.uid)).with_source(e))?;
    crate::crash::point("prepare.mps_started");
    fx.record.mps(&started);
    Ok(started)
}

/// Stops the daemon `group` records (an MPS group's, or a MIG group's on its slices), if it
/// records one (quit, bounded, then kill; its shm
/// tmpfs unmounted and directories removed). A pid of 0 (not started yet, or a crash before
/// its pid was recorded) finds the daemon by its pipe directory alone.
///
/// # Errors
/// `Internal`, naming the claim, as [`super::MpsControl::stop`].
pub fn stop_recorded(fx: &GroupEffects<'_>, group: &Group) -> Result<(), ServiceError> {
    let Some(m) = group.mps() else {
        return Ok(());
    };
    let dirs = MpsDirs::from_pipe(Path::new(&m.pipe_dir));
    let pid = (m.control_daemon_pid > 0).then_some(m.control_daemon_pid);
    fx.mps
        .stop(&dirs, pid)
        .map_err(|e| ServiceError::internal(format!("claim {}: {e}", fx.uid)).with_source(e))
}

/// What a container of request `request` gets of the MPS control daemon `group` records (an
/// MPS group's, or the one on a MIG group's slices): its pipe directory and its shm tmpfs.
pub fn daemon_edits(group: &Group, request: &str) -> ContainerEdits {
    match group.mps() {
        Some(m) if group.requests.iter().any(|r| r == request) => {
            cdi::mps_edits(Path::new(&m.pipe_dir), Path::new(&m.shm_dir))
        }
        _ => ContainerEdits::default(),
    }
}
