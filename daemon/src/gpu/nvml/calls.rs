//! [`NvmlDevices`] on the real NVML, and NVML's errors in the backend's terms.

use gpushare_proto::ComputeMode;
use nvml_wrapper::enum_wrappers::device::ComputeMode as NvmlComputeMode;
use nvml_wrapper::error::NvmlError;

use super::{raw, NvmlDevices, NvmlLib};
use crate::gpu::{ComputeInstance, Gpu, GpuError, MigInstance, MigMode};

fn to_nvml(mode: ComputeMode) -> NvmlComputeMode {
    match mode {
        ComputeMode::Default => NvmlComputeMode::Default,
        ComputeMode::Prohibited => NvmlComputeMode::Prohibited,
        ComputeMode::ExclusiveProcess => NvmlComputeMode::ExclusiveProcess,
    }
}

fn gpu_error(call: &str, uuid: &str, e: NvmlError) -> GpuError {
    match e {
        NvmlError::NotSupported => {
            GpuError::Unsupported(format!("{call} on {uuid}: not supported by this GPU"))
        }
        NvmlError::NoPermission => GpuError::Failed(format!(
            "{call} on {uuid}: no permission (gpushared must run as root)"
        )),
        other => GpuError::Failed(format!("{call} on {uuid}: {other}")),
    }
}

impl NvmlDevices for NvmlLib {
    fn inventory(&self) -> Vec<Gpu> {
        self.gpus.clone()
    }

    fn compute_mode(&self, uuid: &str) -> Result<ComputeMode, GpuError> {
        let mode = self
            .device(uuid)?
            .compute_mode()
            .map_err(|e| gpu_error("nvmlDeviceGetComputeMode", uuid, e))?;
        match mode {
            NvmlComputeMode::Default => Ok(ComputeMode::Default),
            NvmlComputeMode::Prohibited => Ok(ComputeMode::Prohibited),
            NvmlComputeMode::ExclusiveProcess => Ok(ComputeMode::ExclusiveProcess),
            NvmlComputeMode::ExclusiveThread => Err(GpuError::Failed(format!(
                "GPU {uuid} reports the removed compute mode EXCLUSIVE_THREAD"
            ))),
        }
    }

    fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), GpuError> {
        self.device(uuid)?
            .set_compute_mode(to_nvml(mode))
            .map_err(|e| gpu_error("nvmlDeviceSetComputeMode", uuid, e))
    }

    fn compute_processes(&self, uuid: &str) -> Result<Vec<u32>, GpuError> {
        Ok(self
            .device(uuid)?
            .running_compute_processes()
            .map_err(|e| gpu_error("nvmlDeviceGetComputeRunningProcesses", uuid, e))?
            .into_iter()
            .map(|p| p.pid)
            .collect())
    }

    fn mig_mode(&self, uuid: &str) -> Result<MigMode, GpuError> {
        let m = self
            .device(uuid)?
            .mig_mode()
            .map_err(|e| mig_error("nvmlDeviceGetMigMode", uuid, e))?;
        Ok(MigMode {
            current: m.current == 1,
            pending: m.pending == 1,
        })
    }

    fn set_mig_mode(&self, uuid: &str, enabled: bool) -> Result<MigMode, GpuError> {
        // The activation status NVML returns (e.g. RESET_REQUIRED on Ampere) is what the mode
        // read back below says: pending differs from current.
        let status = self
            .device(uuid)?
            .set_mig_mode(enabled)
            .map_err(|e| mig_error("nvmlDeviceSetMigMode", uuid, e))?;
        if status != 0 {
            tracing::info!(gpu = %uuid, activation_status = status, "MIG mode change is not in effect yet");
        }
        self.mig_mode(uuid)
    }

    fn mig_instances(&self, uuid: &str) -> Result<Vec<MigInstance>, GpuError> {
        let dev = self.device(uuid)?;
        raw::instances(self.nvml, &dev).map_err(|e| mig_error("listing MIG instances", uuid, e))
    }

    fn create_gpu_instance(
        &self,
        uuid: &str,
        profile: crate::mig::GiProfileId,
        start: u32,
    ) -> Result<u32, GpuError> {
        // The placement's size is the profile's memory-slice count, from our tables (NVML's
        // profile info has no memory-slice count).
        let placement = self
            .gpus
            .iter()
            .find(|g| g.uuid == uuid)
            .and_then(|g| crate::mig::MigModel::from_product_name(&g.product_name))
            .and_then(|m| m.profile_by_id(profile))
            .and_then(|p| p.placement(start))
            .ok_or_else(|| {
                GpuError::InvalidArgument(format!(
                    "GPU {uuid}: no GPU-instance profile {profile} starting at {start}"
                ))
            })?;
        let dev = self.device(uuid)?;
        raw::create_gi(self.nvml, &dev, profile.0, placement)
            .map_err(|e| mig_error("nvmlDeviceCreateGpuInstanceWithPlacement", uuid, e))
    }

    fn create_compute_instance(
        &self,
        uuid: &str,
        gi_id: u32,
        profile: crate::mig::CiProfileIndex,
    ) -> Result<ComputeInstance, GpuError> {
        let dev = self.device(uuid)?;
        raw::create_ci(self.nvml, &dev, gi_id, profile.0)
            .map_err(|e| mig_error("nvmlGpuInstanceCreateComputeInstance", uuid, e))
    }

    fn destroy_compute_instance(&self, uuid: &str, gi_id: u32, ci_id: u32) -> Result<(), GpuError> {
        let dev = self.device(uuid)?;
        raw::destroy_ci(self.nvml, &dev, gi_id, ci_id)
            .map_err(|e| mig_error("nvmlComputeInstanceDestroy", uuid, e))
    }

    fn destroy_gpu_instance(&self, uuid: &str, gi_id: u32) -> Result<(), GpuError> {
        let dev = self.device(uuid)?;
        raw::destroy_gi(self.nvml, &dev, gi_id)
            .map_err(|e| mig_error("nvmlGpuInstanceDestroy", uuid, e))
    }
}

/// NVML's MIG answers in the backend's terms: an occupied placement is
/// INSUFFICIENT_RESOURCES (not ALREADY_EXISTS), a bad profile INVALID_ARGUMENT, a busy GPU
/// IN_USE.
fn mig_error(call: &str, uuid: &str, e: NvmlError) -> GpuError {
    let msg = format!("{call} on GPU {uuid}: {e}");
    match e {
        // nvml-wrapper has no variant for it: the raw code comes through.
        NvmlError::UnexpectedVariant(code)
            if code == nvml_wrapper_sys::bindings::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES =>
        {
            GpuError::InsufficientResources(msg)
        }
        NvmlError::InvalidArg => GpuError::InvalidArgument(msg),
        NvmlError::NotFound => GpuError::NotFound(msg),
        NvmlError::InUse => GpuError::Busy(msg),
        NvmlError::NotSupported => GpuError::Unsupported(msg),
        _ => GpuError::Failed(msg),
    }
}
