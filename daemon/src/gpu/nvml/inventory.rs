//! NVML loaded and every GPU read once at start ([`NvmlLib::init`]): identity, memory, compute
//! capability, and the MIG devices of a GPU in MIG mode.

use std::sync::Mutex;

use gpushare_proto::MigDeviceInfo;
use nvml_wrapper::enum_wrappers::device::Brand;
use nvml_wrapper::enums::device::DeviceArchitecture;
use nvml_wrapper::error::{nvml_try, NvmlError};
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    nvmlGpuInstanceInfo_t, nvmlGpuInstance_t, NVML_GPU_INSTANCE_PROFILE_COUNT,
};

use super::{NvmlInitError, NvmlLib, NVML_LIBRARY};
use crate::gpu::Gpu;

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
}

/// Why the MIG devices of a GPU in MIG mode cannot be listed ([`mig_devices`]); the GPU's
/// full use is unaffected, and the log says this.
#[derive(Debug, thiserror::Error)]
enum MigListError {
    /// The loaded NVML lacks a GPU-instance call (an old driver); the loader's error is kept
    /// as text, since the library holds it.
    #[error("{library} lacks a GPU-instance call: {0}", library = NVML_LIBRARY)]
    MissingCall(String),
    /// An NVML call failed; `call` names it and what it was asked, as
    /// `nvmlDeviceGetGpuInstanceById(3)` or `MIG device 2 uuid`.
    #[error("{call}: {source}")]
    Nvml {
        /// The call, and the device or index it was about.
        call: String,
        /// NVML's error.
        #[source]
        source: NvmlError,
    },
    /// The MIG device's name has no profile (`… MIG 3g.20gb`).
    #[error("MIG device {uuid}: no profile in its name {name:?}")]
    NoProfile {
        /// The MIG device.
        uuid: String,
        /// Its name as NVML gives it.
        name: String,
    },
    /// The MIG device's GPU instance has a profile the GPU does not list.
    #[error("MIG device {uuid}: unknown GPU-instance profile {profile_id}")]
    UnknownProfile {
        /// The MIG device.
        uuid: String,
        /// The GPU-instance profile ID.
        profile_id: u32,
    },
}

/// The MIG devices of a GPU in MIG mode, each with its GPU-instance profile and placement.
/// nvml-wrapper does not wrap the GPU-instance calls, so they are made on its raw bindings.
fn mig_devices(
    nvml: &'static Nvml,
    parent: &Device<'static>,
) -> Result<Vec<MigDeviceInfo>, MigListError> {
    let lib = nvml.lib();
    fn missing(e: impl std::fmt::Display) -> MigListError {
        MigListError::MissingCall(e.to_string())
    }
    let failed = |call: String| move |source: NvmlError| MigListError::Nvml { call, source };
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
        .map_err(failed("nvmlDeviceGetMaxMigDeviceCount".into()))?;
    let mut out = Vec::new();
    for index in 0..max {
        let mig = match parent.mig_device_by_index(index) {
            Ok(m) => m,
            // Indices without a MIG device behind them.
            Err(NvmlError::NotFound | NvmlError::InvalidArg) => continue,
            Err(e) => {
                return Err(failed(format!(
                    "nvmlDeviceGetMigDeviceHandleByIndex({index})"
                ))(e))
            }
        };
        let uuid = mig
            .uuid()
            .map_err(failed(format!("MIG device {index} uuid")))?;
        // "NVIDIA A100-SXM4-40GB MIG 3g.20gb": the profile name is NVML's last word.
        let name = mig
            .name()
            .map_err(failed(format!("MIG device {uuid} name")))?;
        let Some(profile) = name.rsplit_once("MIG ").map(|(_, p)| p.trim().to_string()) else {
            return Err(MigListError::NoProfile { uuid, name });
        };
        let mut gi_id: std::os::raw::c_uint = 0;
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: zeroed is a valid value of this plain C struct (integers and pointers).
        let mut info: nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: the handles come from this NVML instance, which is never shut down (leaked
        // in `init`), so they stay valid; every out-pointer points to a live local of the
        // type the C signature names.
        unsafe {
            nvml_try(gi_id_of(mig.handle(), &mut gi_id))
                .map_err(failed(format!("nvmlDeviceGetGpuInstanceId({uuid})")))?;
            nvml_try(gi_by_id(parent.handle(), gi_id, &mut gi))
                .map_err(failed(format!("nvmlDeviceGetGpuInstanceById({gi_id})")))?;
            nvml_try(gi_info(gi, &mut info))
                .map_err(failed(format!("nvmlGpuInstanceGetInfo({gi_id})")))?;
        }
        let Some(p) = profiles.iter().find(|p| p.id == info.profileId) else {
            return Err(MigListError::UnknownProfile {
                uuid,
                profile_id: info.profileId,
            });
        };
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
