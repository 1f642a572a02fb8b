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
//! Everything here goes through [`GpuBackend`]; the service decides when. [`resolve`] and
//! [`check`] decide, touching nothing; [`create`] and [`destroy`] act on one slice;
//! [`MigGroup`] is a claim's group of slices, made at prepare and destroyed at release;
//! [`Claimed`] is what the claims record; [`sweep`] is the start-up cleanup.

mod claimed;
mod group;
mod resolve;
mod slice;
mod sweep;

pub use claimed::Claimed;
pub use group::MigGroup;
pub use resolve::{check, repick, resolve};
pub use slice::{create, destroy, is_instance_of, is_whole_instance_of};
pub use sweep::{sweep_unowned, Swept};

use gpushare_proto::{ErrorCode, MigInstanceInfo, MigOrigin};

use crate::error::ServiceError;
use crate::gpu::{Gpu, GpuBackend, GpuError, MigInstance};
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
    /// Another claim's slice on the GPU carries [`MigInstanceInfo::enabled_mig_mode`]: so will
    /// this one's, so that the last of them turns MIG mode off.
    pub carries_mode_flag: bool,
}

impl MigTarget {
    /// The claim record of this target before anything exists.
    pub fn record(&self, gi_id: u32) -> MigInstanceInfo {
        MigInstanceInfo {
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
            origin: MigOrigin::Created,
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
    pub fn existing_record(&self) -> Option<MigInstanceInfo> {
        let inst = self.existing.as_ref()?;
        let ci = inst.compute.as_ref()?;
        Some(MigInstanceInfo {
            ci_id: Some(ci.ci_id),
            uuid: ci.uuid.clone(),
            origin: MigOrigin::Existing,
            ..self.record(inst.gi_id)
        })
    }
}

fn err(code: ErrorCode, msg: impl Into<String>) -> ServiceError {
    ServiceError::new(code, msg)
}

/// The GPU's MIG model, or `Unsupported` naming why it has none.
///
/// # Errors
/// `Unsupported` for GPUs without MIG or without profile tables here.
pub fn model_of(gpu: &Gpu) -> Result<MigModel, ServiceError> {
    if !gpu.mig_capable {
        return Err(err(
            ErrorCode::Unsupported,
            format!(
                "{} ({}) does not support MIG",
                gpu.device_name(),
                gpu.product_name
            ),
        ));
    }
    MigModel::from_product_name(&gpu.product_name).ok_or_else(|| {
        err(
            ErrorCode::Unsupported,
            format!(
                "{} ({}): gpushare has no MIG profile tables for this GPU",
                gpu.device_name(),
                gpu.product_name
            ),
        )
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

/// Whether `gpu` enters and leaves MIG mode without a GPU reset (Hopper and later): the one
/// place that says where gpushare may change a GPU's MIG mode at all.
pub fn toggles_without_reset(gpu: &Gpu) -> bool {
    model_of(gpu).is_ok_and(MigModel::reset_free_mode_toggle)
}

/// Why MIG mode was turned off, for the log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeOffFor {
    /// The last claim whose slice it was turned on for is released.
    LastRelease,
    /// A prepare that crashed had turned it on, and nothing is left on the GPU.
    CrashedPrepare,
}

/// The one "MIG mode off" path for a GPU gpushare turned MIG mode on for: turned off when
/// the GPU leaves MIG mode without a reset ([`toggles_without_reset`]), it is on, and no MIG
/// instance is left on it (one made by others keeps the mode as it is). The caller has
/// checked that no claim records or is making a slice there. Logged whatever happens; never
/// an error (the release or start stands).
pub fn mode_off_if_bare(backend: &dyn GpuBackend, gpu: &Gpu, why: ModeOffFor) {
    let name = gpu.device_name();
    if !toggles_without_reset(gpu) {
        return;
    }
    // Off already (a start finishing a release that a kill cut short after this).
    if backend.mig_mode(&gpu.uuid).is_ok_and(|m| !m.current) {
        return;
    }
    match backend.mig_instances(&gpu.uuid) {
        Ok(live) if !live.is_empty() => {
            tracing::info!(gpu = %name, instances = live.len(), "MIG mode stays on: MIG instances gpushare did not make are there");
            return;
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(gpu = %name, error = %e, "reading MIG instances before turning MIG mode off");
            return;
        }
    }
    let what = match why {
        ModeOffFor::LastRelease => "the last MIG claim it was enabled for is released",
        ModeOffFor::CrashedPrepare => {
            "a prepare that crashed had turned it on, and nothing is left on the GPU"
        }
    };
    match backend.set_mig_mode(&gpu.uuid, false) {
        Ok(m) if !m.current => tracing::info!(gpu = %name, "MIG mode disabled: {what}"),
        Ok(_) => tracing::warn!(gpu = %name, "disabling MIG mode stays pending a reset; left so"),
        Err(e) => tracing::error!(gpu = %name, error = %e, "disabling MIG mode ({what})"),
    }
}

/// A backend error as the service's answer ([`ServiceError::gpu`], the one mapping).
pub fn gpu_err(what: &str, e: GpuError) -> ServiceError {
    ServiceError::gpu(what, &e)
}
