//! MIG: a MIG device a claim names that exists already (made by `gpushare mig apply`,
//! mig-parted or `nvidia-smi`: NVIDIA's static MIG) is handed to the claim as it is and left
//! at its release; any other is created when the claim is prepared and destroyed when it is
//! released, as NVIDIA's DRA driver does under its `DynamicMIG` gate, with these
//! differences for safety: MIG mode is never toggled where that needs a GPU reset (Ampere,
//! cloud VMs), a GPU instance whose compute instance failed is destroyed at once, and the
//! claim records a GPU instance as soon as it exists, so a later release finds it
//! (NVIDIA/k8s-dra-driver-gpu: its DynamicMIG code in `cmd/gpu-kubelet-plugin`, and its
//! issue #1452).
//!
//! # A MIG claim's prepare, in order, and what undoes it
//!
//! Three files tell it: `plan.rs`, `group.rs` and `slice.rs`.
//!
//! 1. Planned, touching nothing (`MigGroup::plan`, which `super::select::plan` hands a
//!    group of MIG devices; [`plan_group`]): each parent GPU checked to keep the MPS settings
//!    where the config asks for a daemon, each device resolved against the node and checked
//!    ([`resolve`], [`check`]), counting the slices other claims record ([`Claimed`]) as
//!    taken; a [`MigGroup`] of [`MigTarget`]s.
//! 2. Made ([`MigGroup`]'s `GroupStrategy::apply`), slice by slice: its intent written to
//!    the run directory first ([`reserve_slice`], [`MigIntents`]), a chosen placement chosen
//!    again under the intents' lock; then [`create`]: MIG mode turned on where it is off and
//!    the GPU needs no reset (the intent marked first), the GPU instance made and recorded in
//!    the claim on disk at once, then its compute instance; an MPS control daemon started on
//!    the slices where the claim asks for one. The intents are struck once the prepare's
//!    record is on disk.
//! 3. Undone by the release (`GroupLife` for [`Mig`]): the daemon stopped, then each slice
//!    [`destroy`]ed (marked `destroying` on disk first), then MIG mode turned off where
//!    gpushare turned it on and nothing is left on the GPU ([`leave_mig_mode_after`],
//!    `mode.rs`). A failed prepare is undone by the same release.
//!
//! A crash anywhere is finished at the next start: the intents the records vouch for have
//! the bare GPU instances a crash left destroyed (`start.rs`), and the slices of prepared
//! claims that vanished meanwhile are made again or the claim is `Degraded` (`recover.rs`).
//!
//! # Files
//!
//! [`resolve`] and [`check`] decide, touching nothing; [`create`] and [`destroy`] act on one
//! slice (`slice.rs`); [`MigGroup`] is a claim's group of slices (`group.rs`); [`Claimed`] is
//! what the claims record; `intents.rs` the intents; `mode.rs` MIG mode; `live.rs` the
//! node's MIG devices with their owners; `layout_apply.rs` the operator's `mig apply`;
//! [`sweep_unowned`] and `start.rs` the start-up cleanup; `recover.rs` the start-up recovery.
//! Everything goes through [`crate::gpu::GpuBackend`]; what the service lends beyond one
//! group (its claims, the registry, CDI specs, MPS daemons) is `effects.rs`, and the service
//! decides when.

mod claimed;
mod effects;
mod group;
mod intents;
mod layout_apply;
mod live;
mod mode;
mod plan;
mod recover;
mod resolve;
mod slice;
mod start;
mod sweep;

pub use claimed::Claimed;
pub use effects::{ClaimsView, RecoverEffects, RecoveredClaims};
pub use group::MigGroup;
pub use intents::{Intent, MigIntents, Quiet, StrikeOnDrop};
pub use layout_apply::{apply_layout, layout_holds, plan_layout, refuse_held};
pub use live::{gpu_states, live_mig};
pub use mode::{
    check_whole_gpu, leave_mig_mode, leave_mig_mode_after, mode_off_if_bare, toggles_without_reset,
    ModeOffFor,
};
pub use plan::{plan_group, reserve_slice, MpsOnSlices};
pub use recover::{recreate_slices, settle_recovered, slices_intact, MigRecovery};
pub use resolve::{check, repick, resolve};
pub use slice::{create, destroy, driver_name_of, is_instance_of, is_whole_instance_of};
pub use start::{honoured_intents, leave_mig_mode_at_start, sweep_at_start, LeftIntents};
pub use sweep::{sweep_unowned, Swept};

use gpushare_proto::ErrorCode;

use crate::claim::{MigSlice, SliceOrigin};
use crate::error::ServiceError;
use crate::gpu::{Gpu, GpuError, MigInstance};
use crate::mig::{GiProfile, MigModel};

/// MIG's hold on a GPU: no setting of the GPU itself. MIG mode is entered where the GPU
/// allows it without a reset and its instances are made and destroyed per claim
/// ([`MigGroup`], [`create`] and [`destroy`]), so nothing is restored when the last holder
/// leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mig;

impl super::Strategy for Mig {}

/// A MIG device a claim asks for, resolved against the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigTarget {
    /// The request it was allocated for.
    pub request: String,
    /// The allocated device name.
    pub device: String,
    /// Parent GPU UUID.
    pub gpu_uuid: String,
    /// Parent GPU minor.
    pub gpu_minor: u32,
    /// The GPU's model.
    pub model: MigModel,
    /// GPU-instance profile.
    pub profile: GiProfile,
    /// Placement start.
    pub start: u32,
    /// The live instance at exactly this profile and placement that no claim holds, when the
    /// claim takes an existing MIG device (static MIG): nothing is made or destroyed.
    pub existing: Option<MigInstance>,
    /// The placement was chosen here (a whole GPU with `migProfile`), not named by the
    /// allocation: another may be chosen if a concurrent prepare takes this one first.
    pub chosen: bool,
    /// Another claim's slice on the GPU carries [`MigSlice::enabled_mig_mode`]: so will
    /// this one's, so that the last of them turns MIG mode off.
    pub carries_mode_flag: bool,
}

impl MigTarget {
    /// The claim record of this target before anything exists.
    pub fn record(&self, gi_id: u32) -> MigSlice {
        MigSlice {
            request: self.request.clone(),
            device: self.device.clone(),
            gpu_uuid: self.gpu_uuid.clone(),
            gpu_minor: self.gpu_minor,
            profile: self.profile.name.to_string(),
            gi_profile_id: self.profile.id.0,
            placement_start: self.start,
            memory_slices: self.profile.memory_slices,
            gi_id,
            ci_id: None,
            uuid: String::new(),
            original_uuid: String::new(),
            origin: SliceOrigin::Created,
            enabled_mig_mode: self.carries_mode_flag,
            destroying: false,
        }
    }

    /// The memory slices it takes, with its profile.
    pub fn occupied(&self) -> crate::mig::Occupied {
        crate::mig::Occupied {
            profile: self.profile.id,
            placement: crate::mig::MigPlacement {
                start: self.start,
                size: self.profile.memory_slices,
            },
        }
    }

    /// The claim record of the existing instance this target takes, if it takes one.
    pub fn existing_record(&self) -> Option<MigSlice> {
        let inst = self.existing.as_ref()?;
        let ci = inst.compute.as_ref()?;
        Some(MigSlice {
            ci_id: Some(ci.ci_id),
            uuid: ci.uuid.clone(),
            origin: SliceOrigin::Existing,
            ..self.record(inst.gi_id)
        })
    }
}

fn err(code: ErrorCode, msg: impl Into<String>) -> ServiceError {
    ServiceError::new(code, msg)
}

/// The GPU's MIG model, or `Unsupported` naming why it has none ([`mig_model`]).
///
/// # Errors
/// `Unsupported` for GPUs without MIG or without profile tables here.
pub fn model_of(gpu: &Gpu) -> Result<MigModel, ServiceError> {
    mig_model(gpu).map_err(|why| err(ErrorCode::Unsupported, why))
}

/// The GPU's MIG model, or why it has none, in the one wording a prepare and `mig plan`/`mig
/// apply` both give: a GPU without MIG, or a MIG-capable GPU gpushare has no profile tables
/// for (a newer model, such as a B200).
///
/// # Errors
/// Why, naming the GPU and its product.
pub fn mig_model(gpu: &Gpu) -> Result<MigModel, String> {
    let (name, product) = (gpu.device_name(), &gpu.product_name);
    if !gpu.mig_capable {
        return Err(format!("{name} ({product}) does not support MIG"));
    }
    MigModel::from_product_name(product).ok_or_else(|| {
        format!("{name} ({product}): gpushare has no MIG profile tables for this GPU")
    })
}

/// Whether `name`, a device name a claim's allocation holds, names a MIG device in any form:
/// a MIG UUID (`MIG-…`, static MIG by UUID) or a DRA name with `-mig-`. Only one that
/// [`crate::mig::MigDeviceName::parse`] reads (`gpu-<minor>-mig-<profile>-<GI profile ID>-<start>`, the
/// one meaning of "MIG device name" here) is a device gpushare makes or takes; the others are
/// refused as such, not looked up as whole GPUs.
pub fn names_a_mig_device(name: &str) -> bool {
    name.starts_with("MIG-") || name.contains("-mig-")
}

/// A backend error as the service's answer ([`ServiceError::gpu`], the one mapping).
pub fn gpu_err(what: &str, e: GpuError) -> ServiceError {
    ServiceError::gpu(what, &e)
}

#[cfg(test)]
mod tests;
