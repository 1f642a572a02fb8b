//! One device group of a claim, whatever its strategy: what a prepare makes for it, what its
//! record holds before and after, what its containers get, and what a release undoes. The
//! service walks a claim's groups through these traits and never asks which strategy a group
//! has: a new strategy implements them in its own file, and planning maps its config onto it.
//!
//! Two traits, because a group exists in two shapes. At prepare it is a plan
//! ([`GroupStrategy`]: the config resolved, e.g. an MPS daemon's directories and limits, the
//! MIG slices to make); after it, it may be only a record read back from disk after a
//! restart, so everything else the strategy does for it ([`GroupLife`]: the GPUs it holds,
//! its containers' edits, its release) is read from the record alone
//! ([`super::select::life_of`]). Effects
//! reach the group through [`GroupEffects`], the few the service lends it.

use std::fmt;

use super::mig::MigTarget;
use super::mps::{MpsControl, MpsNode};
use super::select::{GroupAsk, Planning};
use super::Strategy;
use gpushare_core::Want;

use crate::cdi::{self, ContainerEdits};
use crate::claim::{Group, MigSlice, MpsDaemon, Sharing};
use crate::error::ServiceError;
use crate::gpu::GpuBackend;

/// A device group's strategy as planned for a prepare.
pub trait GroupStrategy: fmt::Debug + Send + Sync {
    /// The strategy that holds each of the group's whole GPUs, whose setting a prepare makes
    /// on each before [`GroupStrategy::apply`] (after taking the GPU out of MIG mode where it
    /// is in it); `None` where the group's devices are MIG devices, which set nothing on
    /// their GPU.
    fn whole_gpu(&self) -> Option<&dyn Strategy>;

    /// The group's sharing as its claim records it before anything is made (state
    /// `PrepareStarted`): what a rollback, or a gpushared restarted mid-prepare, reads to find
    /// what the prepare may have left (an MPS daemon's directories, with pid 0).
    fn planned(&self) -> Sharing;

    /// Makes what the group runs on its devices, once their GPUs are set up: records each
    /// thing the moment it exists (through [`GroupEffects::record`]), so that a failure
    /// anywhere later in the prepare has the release find and undo it. Returns the group's
    /// sharing and MIG instances as they are now. The default makes nothing.
    ///
    /// # Errors
    /// What failed, as the prepare's answer (`Internal` for an MPS daemon that did not start,
    /// the backend's code for a MIG slice); what was recorded stays recorded, for the
    /// teardown.
    fn apply(&self, _fx: &GroupEffects<'_>) -> Result<Applied, ServiceError> {
        Ok(Applied {
            sharing: self.planned(),
        })
    }
}

/// One GPU a group holds, as admission and placement know it: its UUID, its DRA device name
/// (`gpu-<minor>`, or the MIG device's for a whole GPU's group), and how it is held.
pub type GpuHold = (String, String, Want);

/// What a strategy does for a recorded group after its prepare, read from the record alone:
/// the GPUs it holds ([`GroupLife::holds`]), what its containers get
/// ([`GroupLife::edits`]), and what a release undoes, in two passes over the claim's groups:
/// every group's [`GroupLife::stop`] before any group's [`GroupLife::destroy`], since a
/// daemon runs on the devices the second pass destroys. A GPU's setting is not here: the
/// GPU's last holder restores it ([`Strategy::restore`]). Each release method tries
/// everything it has and returns its first error; the release goes on with the rest either
/// way.
pub trait GroupLife {
    /// The GPUs `group` holds and how, for admission and placement (at prepare, and rebuilt
    /// at start from the records).
    fn holds(&self, group: &Group) -> Vec<GpuHold>;

    /// What a container of request `request` gets of `group`: the device nodes of the
    /// request's devices (each whole GPU's, from `node`), and what the strategy adds (a MIG
    /// slice's capability nodes, an MPS control daemon's pipe directory and shm). The
    /// default gives the whole GPUs' nodes.
    fn edits(&self, node: &dyn GpuBackend, group: &Group, request: &str) -> ContainerEdits {
        whole_gpu_edits(node, group, request)
    }

    /// Stops what runs on the group's devices (its MPS control daemon). The default stops
    /// nothing.
    ///
    /// # Errors
    /// `Internal`, naming the claim and what could not be stopped.
    fn stop(&self, _fx: &GroupEffects<'_>, _group: &Group) -> Result<(), ServiceError> {
        Ok(())
    }

    /// At start, for a kept claim's group (crash or reboot): brings back what runs on its
    /// devices (an MPS control daemon re-adopted where it runs as recorded, started again
    /// otherwise). Returns whether anything was started again, which rewrote the claim's
    /// host record. A group's devices themselves are checked later in the start (a MIG
    /// slice made again: `strategy::mig`). The default brings back nothing.
    fn revive(&self, _fx: &Revival<'_>, _group: &Group) -> bool {
        false
    }

    /// Destroys the devices made for the group (its MIG instances). The default destroys
    /// nothing.
    ///
    /// # Errors
    /// The first device that could not be destroyed, with the backend's code, naming the
    /// claim.
    fn destroy(&self, _fx: &GroupEffects<'_>, _group: &Group) -> Result<(), ServiceError> {
        Ok(())
    }
}

/// A group as [`GroupStrategy::apply`] made it: what its claim records after the prepare.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    /// The group's sharing: an MPS group's daemon as started and read back, a MIG group's
    /// slices made or taken for it in the order of its devices (and its daemon).
    pub sharing: Sharing,
}

/// The group's record in its claim, in the registry (published to readers, written to disk
/// with the claim's next change): how a group records what it made the moment it exists.
pub trait GroupRecorder {
    /// Records `mps` as the group's MPS control daemon (just started, with its pid): an MPS
    /// group's, or the one on a MIG group's slices.
    fn mps(&self, mps: &MpsDaemon);

    /// Records `rec`, a GPU instance just made, as one of the group's MIG instances and
    /// writes the claim's record to disk before anything else happens to the instance: a
    /// compute instance made in it after is then the record's (a record without its compute
    /// instance matches the GPU instance whatever it holds), whatever a crash leaves.
    ///
    /// # Errors
    /// `Internal` when the record cannot be written (the caller destroys the GPU instance).
    fn mig_made(&self, rec: &MigSlice) -> Result<(), ServiceError>;

    /// Records `rec` as one of the group's MIG instances, replacing the record of the same
    /// GPU instance (the one [`GroupRecorder::mig_made`] recorded, now with its compute
    /// instance); written with the claim's next change.
    fn mig(&self, rec: &MigSlice);

    /// Marks `rec` as being destroyed ([`MigSlice::destroying`]) and writes the claim's
    /// record to disk, before its compute instance is destroyed: a crash between that and the
    /// destroy of its GPU instance leaves a record that still names the GPU instance, which
    /// the next start's release destroys.
    ///
    /// # Errors
    /// `Internal` when the record cannot be written (then nothing is destroyed).
    fn mig_destroying(&self, rec: &MigSlice) -> Result<(), ServiceError>;
}

/// The intents written before a MIG slice is made or taken (how a restarted gpushared knows
/// which instances it made).
pub trait SliceIntents {
    /// Writes `target`'s intent and returns the target to make: the same, or, for a placement
    /// chosen at planning, one chosen again under the intents' lock so that concurrent
    /// prepares never pick the same one.
    ///
    /// # Errors
    /// The intent cannot be written, or no placement is free any more.
    fn reserve(&self, target: &MigTarget) -> Result<MigTarget, ServiceError>;

    /// Marks the intent of the slice `rec` names with its GPU-instance ID, the moment the GPU
    /// instance exists (before its record is on disk).
    fn made(&self, rec: &MigSlice);

    /// Records in `target`'s intent that its prepare turns the GPU's MIG mode on, before the
    /// mode changes: a crash before the slice is recorded then still has the next start turn
    /// the mode off again.
    ///
    /// # Errors
    /// The intent cannot be written (then the mode must not be changed).
    fn entering_mig_mode(&self, target: &MigTarget) -> Result<(), ServiceError>;
}

/// The effects the service lends a group's strategy, for one group of one claim.
#[derive(Clone, Copy)]
pub struct GroupEffects<'a> {
    /// The claim's UID, for error messages and logs.
    pub uid: &'a str,
    /// The GPUs (MIG instances made and destroyed).
    pub backend: &'a dyn GpuBackend,
    /// MPS control daemons started and stopped.
    pub mps: &'a MpsControl,
    /// The group's record in its claim.
    pub record: &'a dyn GroupRecorder,
    /// The MIG intents.
    pub intents: &'a dyn SliceIntents,
}

/// What the service lends a kept claim's group at start ([`GroupLife::revive`]).
#[derive(Clone, Copy)]
pub struct Revival<'a> {
    /// The claim's UID.
    pub uid: &'a str,
    /// The host was rebooted since the records were written: nothing of the claim runs.
    pub rebooted: bool,
    /// The registry and leaves an MPS control daemon is re-adopted or restarted through.
    pub node: &'a dyn MpsNode,
}

impl fmt::Debug for Revival<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Revival")
            .field("uid", &self.uid)
            .field("rebooted", &self.rebooted)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for GroupEffects<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupEffects")
            .field("uid", &self.uid)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
#[path = "group_tests.rs"]
mod tests;

/// The holds of a group of whole GPUs held as `want`: each device's GPU, under its device
/// name.
pub fn whole_gpu_holds(group: &Group, want: Want) -> Vec<GpuHold> {
    group
        .devices
        .iter()
        .map(|d| (d.uuid.clone(), d.device.clone(), want))
        .collect()
}

/// The device nodes of request `request`'s devices of `group`: each device's whole GPU (a MIG
/// device's parent too, which its container opens beside the slice's capability nodes).
pub fn whole_gpu_edits(node: &dyn GpuBackend, group: &Group, request: &str) -> ContainerEdits {
    let mut edits = ContainerEdits::default();
    for d in group.devices.iter().filter(|d| d.request == request) {
        if let Some(gpu) = node.find(&d.uuid) {
            for n in node.gpu_device_nodes(gpu) {
                cdi::merge(&mut edits, node_edit(&n));
            }
        }
    }
    edits
}

/// One device node as container edits.
pub fn node_edit(node: &crate::gpu::DeviceNode) -> ContainerEdits {
    ContainerEdits {
        device_nodes: vec![cdi::device_node(&node.path, &node.host_path)],
        ..ContainerEdits::default()
    }
}

/// Refuses a whole-GPU group's GPUs where a whole GPU cannot be had now (MIG instances on
/// it, or MIG mode that cannot be left without a reset: [`super::mig::check_whole_gpu`]).
///
/// # Errors
/// The first GPU's refusal: `Conflict` or `Unsupported`, naming it.
pub fn check_whole_gpus(p: &Planning<'_>, group: &GroupAsk<'_>) -> Result<(), ServiceError> {
    for gpu in group.gpus {
        super::mig::check_whole_gpu(p.backend, p.claims, gpu)?;
    }
    Ok(())
}
