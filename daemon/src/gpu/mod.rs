//! GPU backends behind one trait: what the node has, and the few settings gpushare changes
//! (compute mode, time-slice interval). [`HostBackend`] drives real GPUs through NVML (the
//! [`nvml`] leaf) and `nvidia-smi` ([`timeslice`]); [`SimulatedBackend`] describes a node from
//! a [`catalog`] profile. [`ManagedSettings`] lays the administrator's switches over either.
//! [`resource_slice`] is the `gpushare-slice` crate (shared with `gpushare-dra`): it builds,
//! purely, the ResourceSlices a DRA driver publishes.

pub mod catalog;
mod host;
mod managed;
pub mod nodes;
pub mod nvml;
pub use gpushare_slice as resource_slice;
mod sim;
pub mod timeslice;

pub use catalog::{NodeProfile, ProfileError};
pub use host::HostBackend;
pub use managed::ManagedSettings;
pub use sim::{SimFault, SimulatedBackend, NVIDIA_CAPS_MAJOR};

use std::path::PathBuf;

use gpushare_proto::{ComputeMode, TimeSliceInterval};

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Minor number: `/dev/nvidia<minor>`, device name `gpu-<minor>`.
    pub minor: u32,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// Product name as NVML reports it, e.g. `NVIDIA A100-SXM4-40GB`.
    pub product_name: String,
    /// Total memory in MiB.
    pub memory_mib: u64,
    /// CUDA compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Brand as NVML names it (`Nvidia`, `Tesla`, …).
    pub brand: String,
    /// Architecture (`Ampere`, `Hopper`, `Ada Lovelace`, …).
    pub architecture: String,
    /// Kernel driver version, e.g. `570.172.08`.
    pub driver_version: String,
    /// Highest CUDA version the driver supports, `major.minor`.
    pub cuda_driver_version: String,
    /// PCI bus ID as NVML reports it, e.g. `00000000:10:1C.0`.
    pub pci_bus_id: String,
    /// NUMA node, when the platform reports one.
    pub numa_node: Option<u32>,
    /// The GPU supports MIG.
    pub mig_capable: bool,
    /// MIG mode is enabled now.
    pub mig_enabled: bool,
    /// MIG devices present now (MIG mode only).
    pub mig_devices: Vec<gpushare_proto::MigDeviceInfo>,
}

impl Gpu {
    /// The device name NVIDIA's DRA driver publishes for the whole GPU.
    pub fn device_name(&self) -> String {
        format!("gpu-{}", self.minor)
    }

    /// What `list_gpus` reports about it, with the current settings and holders left at
    /// their defaults for the caller to fill in.
    pub fn info(&self) -> gpushare_proto::GpuInfo {
        gpushare_proto::GpuInfo {
            name: self.device_name(),
            minor: self.minor,
            uuid: self.uuid.clone(),
            product_name: self.product_name.clone(),
            memory_mib: self.memory_mib,
            compute_mode: ComputeMode::Default,
            time_slice: TimeSliceInterval::Default,
            sharing: gpushare_proto::GpuSharing::Free,
            claims: Vec::new(),
            brand: self.brand.clone(),
            architecture: self.architecture.clone(),
            cuda_compute_capability: format!(
                "{}.{}",
                self.compute_capability.0, self.compute_capability.1
            ),
            driver_version: self.driver_version.clone(),
            cuda_driver_version: self.cuda_driver_version.clone(),
            pci_bus_id: self.pci_bus_id.clone(),
            numa_node: self.numa_node,
            mig_capable: self.mig_capable,
            mig_enabled: self.mig_enabled,
            mig_pending: None,
            mig_devices: self.mig_devices.clone(),
            mig_partitions: None,
        }
    }
}

/// A device node to give containers: `path` inside the container, `host_path` on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    /// Path inside the container, e.g. `/dev/nvidia0`.
    pub path: PathBuf,
    /// Path on the host (differs from `path` only for simulated nodes).
    pub host_path: PathBuf,
}

/// Why a backend call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuError {
    /// No GPU with this UUID.
    #[error("no GPU with UUID {0}")]
    NoSuchGpu(String),
    /// The GPU does not support the setting (e.g. time-slicing on Tesla P4).
    #[error("{0}")]
    Unsupported(String),
    /// Compute processes run on the GPU, so its settings are not changed under them.
    #[error("{0}")]
    Busy(String),
    /// The backend failed.
    #[error("{0}")]
    Failed(String),
    /// The resources asked for are taken (NVML `INSUFFICIENT_RESOURCES`: an occupied MIG
    /// placement, a profile's instance count reached).
    #[error("{0}")]
    InsufficientResources(String),
    /// A bad argument (NVML `INVALID_ARGUMENT`: an unknown MIG profile, a placement the
    /// profile never takes).
    #[error("{0}")]
    InvalidArgument(String),
    /// No such MIG instance (NVML `NOT_FOUND`).
    #[error("{0}")]
    NotFound(String),
}

/// A GPU's MIG mode as NVML reports it (`nvmlDeviceGetMigMode`): the mode in effect and the
/// one that takes effect after the next GPU reset. They differ on Ampere after a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MigMode {
    /// MIG mode in effect now.
    pub current: bool,
    /// MIG mode after the next reset.
    pub pending: bool,
}

/// One GPU instance on a GPU in MIG mode, with its compute instance when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigInstance {
    /// GPU-instance ID the driver assigned (`nvidia-smi mig -lgi`'s `GI ID`).
    pub gi_id: u32,
    /// GPU-instance profile ID.
    pub profile: crate::mig::GiProfileId,
    /// Its memory slices.
    pub placement: crate::mig::MigPlacement,
    /// Its compute instance (a GI left without one by a failed create has `None`).
    pub compute: Option<ComputeInstance>,
}

/// A compute instance: what CUDA calls a MIG device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComputeInstance {
    /// Compute-instance ID within its GPU instance.
    pub ci_id: u32,
    /// `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
}

fn unsupported_mig(uuid: &str) -> GpuError {
    GpuError::Unsupported(format!("GPU {uuid}: this backend does not manage MIG"))
}

/// The minor of `/dev/nvidia-caps/nvidia-cap<N>` for a GPU instance (`ci: None`) or compute
/// instance, as `/proc/driver/nvidia-caps/mig-minors` lays them out: `config` 1, `monitor` 2,
/// then per GPU 15 GPU instances of 9 minors each (the GI's `access`, then its 8 CIs').
pub fn mig_cap_minor(gpu_minor: u32, gi_id: u32, ci: Option<u32>) -> u32 {
    3 + gpu_minor * 15 * 9 + gi_id * 9 + ci.map_or(0, |c| c + 1)
}

/// What gpushare reads and changes on the node's GPUs.
pub trait GpuBackend: Send + Sync + std::fmt::Debug {
    /// Short description for `health` and logs, e.g. `simulated:p4d.24xlarge`.
    fn describe(&self) -> String;

    /// The node's GPUs, by minor number.
    fn gpus(&self) -> &[Gpu];

    /// Device nodes giving a container this GPU.
    fn gpu_device_nodes(&self, gpu: &Gpu) -> Vec<DeviceNode>;

    /// Device nodes every GPU container needs (`/dev/nvidiactl`, …). A node the driver must
    /// have is listed even when it is missing on the host, so that the check before a claim
    /// is ready names it instead of a spec silently lacking it.
    fn control_device_nodes(&self) -> Vec<DeviceNode>;

    /// The character-device majors the driver's modules registered (`/proc/devices`), which
    /// the device-node check expects of `nvidia-uvm` and `nvidia-caps` nodes; empty where
    /// unknown (then only their minors are checked).
    fn device_majors(&self) -> nodes::DriverMajors {
        nodes::DriverMajors::default()
    }

    /// Current compute mode.
    ///
    /// # Errors
    /// Unknown GPU or backend failure.
    fn compute_mode(&self, uuid: &str) -> Result<ComputeMode, GpuError>;

    /// Sets the compute mode (MPS wants `ExclusiveProcess`).
    ///
    /// # Errors
    /// Unknown GPU, unsupported, or backend failure.
    fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), GpuError>;

    /// Current time-slice interval.
    ///
    /// # Errors
    /// Unknown GPU or backend failure.
    fn time_slice(&self, uuid: &str) -> Result<TimeSliceInterval, GpuError>;

    /// Sets the time-slice interval (`nvidia-smi compute-policy --set-timeslice`).
    ///
    /// # Errors
    /// Unknown GPU, unsupported, or backend failure.
    fn set_time_slice(&self, uuid: &str, interval: TimeSliceInterval) -> Result<(), GpuError>;

    /// The GPU's MIG mode. GPUs without MIG answer `Unsupported` (NVML `NOT_SUPPORTED`).
    ///
    /// # Errors
    /// Unknown GPU, unsupported, or backend failure.
    fn mig_mode(&self, uuid: &str) -> Result<MigMode, GpuError> {
        Err(unsupported_mig(uuid))
    }

    /// Asks for MIG mode on or off (`nvmlDeviceSetMigMode`) and returns the mode after the
    /// call: on Ampere the change stays pending until a GPU reset; on Hopper it is in effect
    /// at once unless processes hold the GPU (`Busy`).
    ///
    /// # Errors
    /// `Busy` when processes or MIG instances hold the GPU, `Unsupported`, backend failure.
    fn set_mig_mode(&self, uuid: &str, enabled: bool) -> Result<MigMode, GpuError> {
        let _ = enabled;
        Err(unsupported_mig(uuid))
    }

    /// PIDs of compute processes on the GPU (any instance), for refusing mode changes.
    ///
    /// # Errors
    /// Unknown GPU or backend failure.
    fn compute_processes(&self, uuid: &str) -> Result<Vec<u32>, GpuError> {
        let _ = uuid;
        Ok(Vec::new())
    }

    /// The GPU instances of a GPU in MIG mode, by GI ID (empty when MIG mode is off).
    ///
    /// # Errors
    /// Unknown GPU, unsupported, or backend failure.
    fn mig_instances(&self, uuid: &str) -> Result<Vec<MigInstance>, GpuError> {
        Err(unsupported_mig(uuid))
    }

    /// Creates a GPU instance of `profile` at memory slice `start`
    /// (`nvmlDeviceCreateGpuInstanceWithPlacement`); returns its GI ID.
    ///
    /// # Errors
    /// `InsufficientResources` for a taken placement, `InvalidArgument` for an unknown
    /// profile or a placement it never takes, `Unsupported` when MIG mode is not in effect.
    fn create_gpu_instance(
        &self,
        uuid: &str,
        profile: crate::mig::GiProfileId,
        start: u32,
    ) -> Result<u32, GpuError> {
        let _ = (profile, start);
        Err(unsupported_mig(uuid))
    }

    /// Creates a compute instance of `profile` in GPU instance `gi_id`
    /// (`nvmlGpuInstanceCreateComputeInstance`); returns it with the MIG UUID read from the
    /// instance itself.
    ///
    /// # Errors
    /// `NotFound` for an unknown GI, `InsufficientResources`, backend failure.
    fn create_compute_instance(
        &self,
        uuid: &str,
        gi_id: u32,
        profile: crate::mig::CiProfileIndex,
    ) -> Result<ComputeInstance, GpuError> {
        let _ = (gi_id, profile);
        Err(unsupported_mig(uuid))
    }

    /// Destroys a compute instance.
    ///
    /// # Errors
    /// `NotFound`, `Busy` (processes on it), backend failure.
    fn destroy_compute_instance(&self, uuid: &str, gi_id: u32, ci_id: u32) -> Result<(), GpuError> {
        let _ = (gi_id, ci_id);
        Err(unsupported_mig(uuid))
    }

    /// Destroys a GPU instance, which must have no compute instance left.
    ///
    /// # Errors
    /// `NotFound`, `Busy` (compute instances or processes on it), backend failure.
    fn destroy_gpu_instance(&self, uuid: &str, gi_id: u32) -> Result<(), GpuError> {
        let _ = gi_id;
        Err(unsupported_mig(uuid))
    }

    /// The MIG capability device nodes a container needs for compute instance `ci_id` of GPU
    /// instance `gi_id` (`/dev/nvidia-caps/nvidia-cap<N>` for the GI and for the CI, numbered
    /// as `/proc/driver/nvidia-caps/mig-minors` says).
    fn mig_device_nodes(&self, gpu: &Gpu, gi_id: u32, ci_id: u32) -> Vec<DeviceNode> {
        let _ = (gpu, gi_id, ci_id);
        Vec::new()
    }

    /// Finds a GPU by device name (`gpu-<minor>`) or UUID.
    fn find(&self, name: &str) -> Option<&Gpu> {
        self.gpus()
            .iter()
            .find(|g| g.uuid == name || g.device_name() == name)
    }
}
