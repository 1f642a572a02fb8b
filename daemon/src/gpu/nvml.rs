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
        Ok(NvmlLib {
            gpus,
            devices,
            nvml,
        })
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
            gi_id: None,
            owner: None,
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

    fn mig_mode(&self, uuid: &str) -> Result<super::MigMode, GpuError> {
        let m = self
            .device(uuid)?
            .mig_mode()
            .map_err(|e| mig_error("nvmlDeviceGetMigMode", uuid, e))?;
        Ok(super::MigMode {
            current: m.current == 1,
            pending: m.pending == 1,
        })
    }

    fn set_mig_mode(&self, uuid: &str, enabled: bool) -> Result<super::MigMode, GpuError> {
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

    fn mig_instances(&self, uuid: &str) -> Result<Vec<super::MigInstance>, GpuError> {
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
    ) -> Result<super::ComputeInstance, GpuError> {
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

/// The GPU- and compute-instance calls nvml-wrapper does not wrap, made on its raw bindings.
mod raw {
    use std::os::raw::{c_char, c_uint};

    use nvml_wrapper::error::{nvml_sym, nvml_try, NvmlError};
    use nvml_wrapper::{Device, Nvml};
    use nvml_wrapper_sys::bindings::{
        nvmlComputeInstanceInfo_t, nvmlComputeInstance_t, nvmlGpuInstanceInfo_t,
        nvmlGpuInstancePlacement_t, nvmlGpuInstance_t, NVML_GPU_INSTANCE_PROFILE_COUNT,
    };

    use crate::gpu::{ComputeInstance, MigInstance};
    use crate::mig::{GiProfileId, MigPlacement};

    /// GPU instances per GPU at most (A100/H100: 7 one-slice instances; 8 leaves room).
    const MAX_INSTANCES: usize = 8;

    fn gi_by_id(
        nvml: &Nvml,
        dev: &Device<'static>,
        id: u32,
    ) -> Result<nvmlGpuInstance_t, NvmlError> {
        let f = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstanceById.as_ref())?;
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: `dev` is a live handle of this never-shut-down NVML; `gi` is a live local.
        unsafe { nvml_try(f(dev.handle(), id, &mut gi))? };
        Ok(gi)
    }

    fn compute_instances(
        nvml: &Nvml,
        gi: nvmlGpuInstance_t,
    ) -> Result<Vec<nvmlComputeInstance_t>, NvmlError> {
        let list = nvml_sym(nvml.lib().nvmlGpuInstanceGetComputeInstances.as_ref())?;
        let mut out = Vec::new();
        // CI profile indexes 0..=8 (1 slice … 7 slices NVL).
        for profile in 0..9 {
            let mut cis: [nvmlComputeInstance_t; MAX_INSTANCES] =
                [std::ptr::null_mut(); MAX_INSTANCES];
            let mut count: c_uint = 0;
            // SAFETY: `gi` came from NVML; `cis` has room for MAX_INSTANCES handles and
            // NVML writes at most that many (a GI holds at most 7 CIs); `count` is live.
            let r = unsafe { nvml_try(list(gi, profile, cis.as_mut_ptr(), &mut count)) };
            match r {
                Ok(()) => out.extend_from_slice(&cis[..(count as usize).min(MAX_INSTANCES)]),
                Err(NvmlError::NotSupported | NvmlError::InvalidArg) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    fn ci_info(nvml: &Nvml, ci: nvmlComputeInstance_t) -> Result<(u32, String), NvmlError> {
        let info_of = nvml_sym(nvml.lib().nvmlComputeInstanceGetInfo_v2.as_ref())?;
        let uuid_of = nvml_sym(nvml.lib().nvmlDeviceGetUUID.as_ref())?;
        // SAFETY: zeroed is a valid value of this plain C struct (integers and pointers).
        let mut info: nvmlComputeInstanceInfo_t = unsafe { std::mem::zeroed() };
        let mut buf = [0 as c_char; 96];
        // SAFETY: `ci` came from NVML; `info` is a live local of the named type; `info.device`
        // is the MIG device handle NVML filled in, and `buf`'s length is passed with it.
        unsafe {
            nvml_try(info_of(ci, &mut info))?;
            nvml_try(uuid_of(info.device, buf.as_mut_ptr(), buf.len() as c_uint))?;
        }
        // SAFETY: NVML wrote a NUL-terminated string into `buf` (it fails rather than
        // truncating without NUL).
        let uuid = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok((info.id, uuid))
    }

    /// Every GPU instance of `dev`, with its first compute instance.
    pub(super) fn instances(
        nvml: &Nvml,
        dev: &Device<'static>,
    ) -> Result<Vec<MigInstance>, NvmlError> {
        let list = nvml_sym(nvml.lib().nvmlDeviceGetGpuInstances.as_ref())?;
        let info_of = nvml_sym(nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
        let mut out = Vec::new();
        for index in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
            let Ok(profile) = dev.profile_info(index) else {
                continue;
            };
            let mut gis: [nvmlGpuInstance_t; MAX_INSTANCES] = [std::ptr::null_mut(); MAX_INSTANCES];
            let mut count: c_uint = 0;
            // SAFETY: `dev` is live; `gis` has room for MAX_INSTANCES handles, more than a
            // GPU holds of one profile (7); `count` is a live local.
            unsafe { nvml_try(list(dev.handle(), profile.id, gis.as_mut_ptr(), &mut count))? };
            for &gi in &gis[..(count as usize).min(MAX_INSTANCES)] {
                // SAFETY: zeroed is a valid value of this plain C struct.
                let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
                // SAFETY: `gi` came from NVML just now; `info` is a live local.
                unsafe { nvml_try(info_of(gi, &mut info))? };
                let compute = match compute_instances(nvml, gi)?.first() {
                    Some(&ci) => {
                        let (ci_id, uuid) = ci_info(nvml, ci)?;
                        Some(ComputeInstance { ci_id, uuid })
                    }
                    None => None,
                };
                out.push(MigInstance {
                    gi_id: info.id,
                    profile: GiProfileId(info.profileId),
                    placement: MigPlacement {
                        start: info.placement.start,
                        size: info.placement.size,
                    },
                    compute,
                });
            }
        }
        out.sort_by_key(|i| i.gi_id);
        Ok(out)
    }

    /// Creates a GPU instance of profile ID `profile_id` at `start`; returns its GI ID.
    pub(super) fn create_gi(
        nvml: &Nvml,
        dev: &Device<'static>,
        profile_id: u32,
        placement: MigPlacement,
    ) -> Result<u32, NvmlError> {
        let create = nvml_sym(nvml.lib().nvmlDeviceCreateGpuInstanceWithPlacement.as_ref())?;
        let info_of = nvml_sym(nvml.lib().nvmlGpuInstanceGetInfo.as_ref())?;
        let MigPlacement { start, size } = placement;
        let placement = nvmlGpuInstancePlacement_t { start, size };
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: zeroed is a valid value of this plain C struct.
        let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `dev` is live; `placement`, `gi` and `info` are live locals of the types
        // the C signatures name.
        unsafe {
            nvml_try(create(dev.handle(), profile_id, &placement, &mut gi))?;
            nvml_try(info_of(gi, &mut info))?;
        }
        Ok(info.id)
    }

    /// Creates a compute instance of CI profile index `ci_profile` in GI `gi_id`.
    pub(super) fn create_ci(
        nvml: &Nvml,
        dev: &Device<'static>,
        gi_id: u32,
        ci_profile: u32,
    ) -> Result<ComputeInstance, NvmlError> {
        let profile_info = nvml_sym(
            nvml.lib()
                .nvmlGpuInstanceGetComputeInstanceProfileInfo
                .as_ref(),
        )?;
        let create = nvml_sym(nvml.lib().nvmlGpuInstanceCreateComputeInstance.as_ref())?;
        let gi = gi_by_id(nvml, dev, gi_id)?;
        // SAFETY: zeroed is a valid value of this plain C struct.
        let mut info: nvml_wrapper_sys::bindings::nvmlComputeInstanceProfileInfo_t =
            unsafe { std::mem::zeroed() };
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `gi` came from NVML; `info` and `ci` are live locals of the named types.
        unsafe {
            nvml_try(profile_info(
                gi,
                ci_profile,
                nvml_wrapper_sys::bindings::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut info,
            ))?;
            nvml_try(create(gi, info.id, &mut ci))?;
        }
        let (ci_id, uuid) = ci_info(nvml, ci)?;
        Ok(ComputeInstance { ci_id, uuid })
    }

    /// Destroys compute instance `ci_id` of GI `gi_id`.
    pub(super) fn destroy_ci(
        nvml: &Nvml,
        dev: &Device<'static>,
        gi_id: u32,
        ci_id: u32,
    ) -> Result<(), NvmlError> {
        let by_id = nvml_sym(nvml.lib().nvmlGpuInstanceGetComputeInstanceById.as_ref())?;
        let destroy = nvml_sym(nvml.lib().nvmlComputeInstanceDestroy.as_ref())?;
        let gi = gi_by_id(nvml, dev, gi_id)?;
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `gi` came from NVML; `ci` is a live local; the handle is destroyed once.
        unsafe {
            nvml_try(by_id(gi, ci_id, &mut ci))?;
            nvml_try(destroy(ci))
        }
    }

    /// Destroys GI `gi_id` (its compute instances must be gone).
    pub(super) fn destroy_gi(
        nvml: &Nvml,
        dev: &Device<'static>,
        gi_id: u32,
    ) -> Result<(), NvmlError> {
        let destroy = nvml_sym(nvml.lib().nvmlGpuInstanceDestroy.as_ref())?;
        let gi = gi_by_id(nvml, dev, gi_id)?;
        // SAFETY: `gi` came from NVML just now and is destroyed once.
        unsafe { nvml_try(destroy(gi)) }
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
