//! The NVML leaf: the only code that calls NVML, through `nvml-wrapper`, which loads
//! `libnvidia-ml.so.1` at run time (a host without the driver gets [`NvmlInitError`], never a
//! panic). Everything above it ([`super::HostBackend`]) runs against the [`NvmlDevices`] trait,
//! so it is tested with a fake.
//!
//! One NVML handle lives for the whole process and every device handle is looked up once at
//! start: NVIDIA's own DRA driver found that per-call UUID look-ups can take seconds under
//! concurrency.

use std::sync::Mutex;

use gpushare_proto::{ComputeMode, MigDeviceInfo};
use nvml_wrapper::enum_wrappers::device::{Brand, ComputeMode as NvmlComputeMode};
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlGpuInstanceInfo_t, nvmlGpuInstance_t, NVML_GPU_INSTANCE_PROFILE_COUNT,
};

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
}

/// The real NVML.
pub struct NvmlLib {
    gpus: Vec<Gpu>,
    /// Device handles in `gpus` order. `set_compute_mode` takes `&mut Device`.
    devices: Vec<Mutex<Device<'static>>>,
}

impl std::fmt::Debug for NvmlLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlLib")
            .field("gpus", &self.gpus.len())
            .finish()
    }
}

fn brand_name(b: &Brand) -> String {
    match b {
        Brand::Nvidia => "Nvidia".into(),
        Brand::Tesla => "Tesla".into(),
        other => format!("{other:?}"),
    }
}

/// Architecture names as NVIDIA's DRA driver publishes them.
fn architecture_name(a: &DeviceArchitecture) -> String {
    match a {
        DeviceArchitecture::Ada => "Ada Lovelace".into(),
        other => other.to_string(),
    }
}

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

impl NvmlLib {
    /// Loads NVML, initialises it and reads every GPU once.
    ///
    /// # Errors
    /// [`NvmlInitError::Init`] (naming `libnvidia-ml.so.1`) when there is no driver;
    /// [`NvmlInitError::Device`] when a GPU's identity cannot be read.
    pub fn init() -> Result<Self, NvmlInitError> {
        let nvml = Nvml::init().map_err(|e| NvmlInitError::Init(e.to_string()))?;
        // The handle must outlive every cached `Device`, which borrows it; it is meant to live
        // as long as the daemon, so it is leaked rather than shut down.
        let nvml: &'static Nvml = Box::leak(Box::new(nvml));
        let init = |e: NvmlError| NvmlInitError::Init(e.to_string());
        let driver_version = nvml.sys_driver_version().map_err(init)?;
        let cuda = nvml.sys_cuda_driver_version().map_err(init)?;
        let cuda_driver_version = format!("{}.{}", cuda / 1000, (cuda % 1000) / 10);
        let count = nvml.device_count().map_err(init)?;
        let mut pairs = Vec::with_capacity(count as usize);
        for index in 0..count {
            let dev = |message: String| NvmlInitError::Device { index, message };
            let device = nvml
                .device_by_index(index)
                .map_err(|e| dev(e.to_string()))?;
            let read = |what: &str, e: NvmlError| dev(format!("{what}: {e}"));
            let uuid = device.uuid().map_err(|e| read("uuid", e))?;
            let cc = device
                .cuda_compute_capability()
                .map_err(|e| read("cuda compute capability", e))?;
            let mig = device.mig_mode();
            let mut gpu = Gpu {
                minor: device.minor_number().map_err(|e| read("minor number", e))?,
                product_name: device.name().map_err(|e| read("name", e))?,
                memory_mib: device.memory_info().map_err(|e| read("memory", e))?.total >> 20,
                compute_capability: (cc.major.max(0) as u32, cc.minor.max(0) as u32),
                brand: device.brand().map(|b| brand_name(&b)).unwrap_or_default(),
                architecture: device
                    .architecture()
                    .map(|a| architecture_name(&a))
                    .unwrap_or_else(|_| "Unknown".into()),
                driver_version: driver_version.clone(),
                cuda_driver_version: cuda_driver_version.clone(),
                pci_bus_id: device.pci_info().map_err(|e| read("PCI info", e))?.bus_id,
                numa_node: device.numa_node_id().ok(),
                mig_capable: mig.is_ok(),
                mig_enabled: mig.map(|m| m.current == 1).unwrap_or(false),
                mig_devices: Vec::new(),
                uuid,
            };
            if gpu.mig_enabled {
                match mig_devices(nvml, &device) {
                    Ok(m) => gpu.mig_devices = m,
                    // A node must still come up: its full GPUs are usable, and the log says
                    // why its MIG devices are missing.
                    Err(e) => {
                        tracing::warn!(gpu = %gpu.uuid, error = %e, "listing MIG devices")
                    }
                }
            }
            pairs.push((gpu, device));
        }
        pairs.sort_by_key(|(g, _)| g.minor);
        let (gpus, devices) = pairs.into_iter().map(|(g, d)| (g, Mutex::new(d))).unzip();
        Ok(NvmlLib { gpus, devices })
    }

    fn device(&self, uuid: &str) -> Result<std::sync::MutexGuard<'_, Device<'static>>, GpuError> {
        let i = self
            .gpus
            .iter()
            .position(|g| g.uuid == uuid)
            .ok_or_else(|| GpuError::NoSuchGpu(uuid.to_string()))?;
        Ok(self.devices[i].lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// The MIG devices of a GPU in MIG mode, each with its GPU-instance profile and placement.
/// nvml-wrapper does not wrap the GPU-instance calls, so they are made on its raw bindings.
fn mig_devices(
    nvml: &'static Nvml,
    parent: &Device<'static>,
) -> Result<Vec<MigDeviceInfo>, String> {
    let lib = nvml.lib();
    fn missing(e: impl std::fmt::Display) -> String {
        format!("{NVML_LIBRARY} lacks a GPU-instance call: {e}")
    }
    let gi_id_of = lib.nvmlDeviceGetGpuInstanceId.as_ref().map_err(missing)?;
    let gi_by_id = lib.nvmlDeviceGetGpuInstanceById.as_ref().map_err(missing)?;
    let gi_info = lib.nvmlGpuInstanceGetInfo.as_ref().map_err(missing)?;
    // GPU-instance profile IDs (as `nvidia-smi mig -lgip` shows them) to their sizes; the
    // profiles this GPU lacks answer NOT_SUPPORTED and are skipped.
    let profiles: Vec<_> = (0..NVML_GPU_INSTANCE_PROFILE_COUNT)
        .filter_map(|p| parent.profile_info(p).ok())
        .collect();
    let max = parent
        .mig_device_count()
        .map_err(|e| format!("nvmlDeviceGetMaxMigDeviceCount: {e}"))?;
    let mut out = Vec::new();
    for index in 0..max {
        let mig = match parent.mig_device_by_index(index) {
            Ok(m) => m,
            // Indices without a MIG device behind them.
            Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
            Err(e) => return Err(format!("nvmlDeviceGetMigDeviceHandleByIndex({index}): {e}")),
        };
        let uuid = mig
            .uuid()
            .map_err(|e| format!("MIG device {index} uuid: {e}"))?;
        // "NVIDIA A100-SXM4-40GB MIG 3g.20gb": the profile name is NVML's last word.
        let name = mig
            .name()
            .map_err(|e| format!("MIG device {uuid} name: {e}"))?;
        let profile = name
            .rsplit_once("MIG ")
            .map(|(_, p)| p.trim().to_string())
            .ok_or_else(|| format!("MIG device {uuid}: no profile in its name {name:?}"))?;
        let mut gi_id: std::os::raw::c_uint = 0;
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: zeroed is a valid value of this plain C struct (integers and pointers).
        let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: the handles come from this NVML instance, which is never shut down (leaked
        // in `init`), so they stay valid; every out-pointer points to a live local of the
        // type the C signature names.
        unsafe {
            nvml_try(gi_id_of(mig.handle(), &mut gi_id))
                .map_err(|e| format!("nvmlDeviceGetGpuInstanceId({uuid}): {e}"))?;
            nvml_try(gi_by_id(parent.handle(), gi_id, &mut gi))
                .map_err(|e| format!("nvmlDeviceGetGpuInstanceById({gi_id}): {e}"))?;
            nvml_try(gi_info(gi, &mut info))
                .map_err(|e| format!("nvmlGpuInstanceGetInfo({gi_id}): {e}"))?;
        }
        let p = profiles
            .iter()
            .find(|p| p.id == info.profileId)
            .ok_or_else(|| {
                format!(
                    "MIG device {uuid}: unknown GPU-instance profile {}",
                    info.profileId
                )
            })?;
        out.push(MigDeviceInfo {
            uuid,
            profile,
            gi_profile_id: info.profileId,
            placement_start: info.placement.start,
            memory_slices: info.placement.size,
            memory_mib: p.memory_size_mb,
            multiprocessors: p.multiprocessor_count,
            copy_engines: p.copy_engine_count,
            decoders: p.decoder_count,
            encoders: p.encoder_count,
            jpeg_engines: p.jpeg_count,
            ofa_engines: p.ofa_count,
        });
    }
    out.sort_by_key(|m| m.placement_start);
    Ok(out)
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
