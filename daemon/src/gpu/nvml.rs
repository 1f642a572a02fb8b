//! The NVML leaf: the only code that calls NVML, through `nvml-wrapper`, which loads
//! `libnvidia-ml.so.1` at run time (a host without the driver gets [`NvmlInitError`], never a
//! panic). Everything above it ([`super::HostBackend`]) runs against the [`NvmlDevices`] trait,
//! so it is tested with a fake.
//!
//! One NVML handle lives for the whole process and every device handle is looked up once at
//! start: NVIDIA's own DRA driver found that per-call UUID look-ups can take seconds under
//! concurrency.
//!
//! Here: the trait and its errors, and the real library's handle; [`NvmlLib::init`] and the
//! MIG inventory read at start are in `inventory.rs`, its calls in `calls.rs`, the GPU- and
//! compute-instance calls nvml-wrapper does not wrap in `raw.rs`.

mod calls;
mod inventory;
mod raw;

use std::sync::Mutex;

use gpushare_proto::ComputeMode;
use nvml_wrapper::{Device, Nvml};

use super::{Gpu, GpuError};

/// The library NVML is loaded from.
pub const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// NVML could not be loaded or initialised, or the GPUs could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum NvmlInitError {
    /// `libnvidia-ml.so.1` is missing, or NVML found no loaded driver.
    #[error("NVML ({NVML_LIBRARY}) could not be initialised: {0}")]
    Init(String),
    /// A GPU's identity could not be read.
    #[error("reading GPU {index} through NVML: {message}")]
    Device {
        /// NVML index of the GPU.
        index: u32,
        /// What failed.
        message: String,
    },
}

/// The NVML calls [`super::HostBackend`] makes, by GPU UUID.
pub trait NvmlDevices: Send + Sync + std::fmt::Debug {
    /// The GPUs as read at start, by minor number.
    fn inventory(&self) -> Vec<Gpu>;

    /// `nvmlDeviceGetComputeMode`.
    ///
    /// # Errors
    /// Unknown GPU or NVML failure.
    fn compute_mode(&self, uuid: &str) -> Result<ComputeMode, GpuError>;

    /// `nvmlDeviceSetComputeMode` (root only).
    ///
    /// # Errors
    /// Unknown GPU, not supported, no permission, or NVML failure.
    fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), GpuError>;

    /// Pids of the compute processes running on the GPU (`nvmlDeviceGetComputeRunningProcesses`).
    ///
    /// # Errors
    /// Unknown GPU or NVML failure.
    fn compute_processes(&self, uuid: &str) -> Result<Vec<u32>, GpuError>;

    /// `nvmlDeviceGetMigMode`. NOT_SUPPORTED (no MIG) answers `Unsupported`.
    ///
    /// # Errors
    /// Unknown GPU, no MIG, or NVML failure.
    fn mig_mode(&self, uuid: &str) -> Result<super::MigMode, GpuError> {
        Err(GpuError::Unsupported(format!(
            "GPU {uuid}: MIG not available"
        )))
    }

    /// `nvmlDeviceSetMigMode`; returns the mode after the call (pending on Ampere).
    ///
    /// # Errors
    /// `Busy` (IN_USE), `Unsupported`, NVML failure.
    fn set_mig_mode(&self, uuid: &str, enabled: bool) -> Result<super::MigMode, GpuError> {
        let _ = enabled;
        Err(GpuError::Unsupported(format!(
            "GPU {uuid}: MIG not available"
        )))
    }

    /// Every GPU instance with its compute instance (`nvmlDeviceGetGpuInstances` over each
    /// profile, `nvmlGpuInstanceGetComputeInstances`).
    ///
    /// # Errors
    /// Unknown GPU, no MIG, or NVML failure.
    fn mig_instances(&self, uuid: &str) -> Result<Vec<super::MigInstance>, GpuError> {
        Err(GpuError::Unsupported(format!(
            "GPU {uuid}: MIG not available"
        )))
    }

    /// `nvmlDeviceCreateGpuInstanceWithPlacement`; returns the GI ID.
    ///
    /// # Errors
    /// `InsufficientResources`, `InvalidArgument`, `Unsupported`, NVML failure.
    fn create_gpu_instance(
        &self,
        uuid: &str,
        profile: crate::mig::GiProfileId,
        start: u32,
    ) -> Result<u32, GpuError> {
        let _ = (profile, start);
        Err(GpuError::Unsupported(format!(
            "GPU {uuid}: MIG not available"
        )))
    }

    /// `nvmlGpuInstanceCreateComputeInstance`, the UUID read from the new instance's device.
    ///
    /// # Errors
    /// `NotFound`, `InsufficientResources`, NVML failure.
    fn create_compute_instance(
        &self,
        uuid: &str,
        gi_id: u32,
        profile: crate::mig::CiProfileIndex,
    ) -> Result<super::ComputeInstance, GpuError> {
        let _ = (gi_id, profile);
        Err(GpuError::Unsupported(format!(
            "GPU {uuid}: MIG not available"
        )))
    }

    /// `nvmlComputeInstanceDestroy`.
    ///
    /// # Errors
    /// `NotFound`, `Busy`, NVML failure.
    fn destroy_compute_instance(&self, uuid: &str, gi_id: u32, ci_id: u32) -> Result<(), GpuError> {
        let _ = (gi_id, ci_id);
        Err(GpuError::Unsupported(format!(
            "GPU {uuid}: MIG not available"
        )))
    }

    /// `nvmlGpuInstanceDestroy`.
    ///
    /// # Errors
    /// `NotFound`, `Busy`, NVML failure.
    fn destroy_gpu_instance(&self, uuid: &str, gi_id: u32) -> Result<(), GpuError> {
        let _ = gi_id;
        Err(GpuError::Unsupported(format!(
            "GPU {uuid}: MIG not available"
        )))
    }
}

/// The real NVML.
pub struct NvmlLib {
    gpus: Vec<Gpu>,
    /// Device handles in `gpus` order. `set_compute_mode` takes `&mut Device`.
    devices: Vec<Mutex<Device<'static>>>,
    /// The process-long NVML handle, for the raw MIG calls.
    nvml: &'static Nvml,
}

impl std::fmt::Debug for NvmlLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlLib")
            .field("gpus", &self.gpus.len())
            .finish()
    }
}

impl NvmlLib {
    /// The handle of GPU `uuid` cached at start, locked (some calls take `&mut Device`).
    fn device(&self, uuid: &str) -> Result<std::sync::MutexGuard<'_, Device<'static>>, GpuError> {
        let i = self
            .gpus
            .iter()
            .position(|g| g.uuid == uuid)
            .ok_or_else(|| GpuError::NoSuchGpu(uuid.to_string()))?;
        Ok(self.devices[i].lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_the_error_names_the_library() {
        if std::path::Path::new("/dev/nvidiactl").exists() {
            eprintln!("skipped: this host has an NVIDIA driver");
            return;
        }
        let e = NvmlLib::init().unwrap_err().to_string();
        assert!(e.contains(NVML_LIBRARY), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}
