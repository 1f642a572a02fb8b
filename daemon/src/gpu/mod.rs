//! GPU backends behind one trait: what the node has, and the few settings gpushare changes
//! (compute mode, time-slice interval). The simulated backend stands in for NVML and
//! `nvidia-smi`; the NVML backend arrives with its own issue.

mod sim;

pub use sim::{NodeProfile, SimulatedBackend, NODE_PROFILES};

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
}

impl Gpu {
    /// The device name NVIDIA's DRA driver publishes for the whole GPU.
    pub fn device_name(&self) -> String {
        format!("gpu-{}", self.minor)
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
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// No GPU with this UUID.
    #[error("no GPU with UUID {0}")]
    NoSuchGpu(String),
    /// The GPU does not support the setting (e.g. time-slicing on Tesla P4).
    #[error("{0}")]
    Unsupported(String),
    /// The backend failed.
    #[error("{0}")]
    Failed(String),
}

/// What gpushare reads and changes on the node's GPUs.
pub trait GpuBackend: Send + Sync + std::fmt::Debug {
    /// Short description for `health` and logs, e.g. `simulated:p4d.24xlarge`.
    fn describe(&self) -> String;

    /// The node's GPUs, by minor number.
    fn gpus(&self) -> &[Gpu];

    /// Device nodes giving a container this GPU.
    fn gpu_device_nodes(&self, gpu: &Gpu) -> Vec<DeviceNode>;

    /// Device nodes every GPU container needs (`/dev/nvidiactl`, …).
    fn control_device_nodes(&self) -> Vec<DeviceNode>;

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

    /// Finds a GPU by device name (`gpu-<minor>`) or UUID.
    fn find(&self, name: &str) -> Option<&Gpu> {
        self.gpus()
            .iter()
            .find(|g| g.uuid == name || g.device_name() == name)
    }
}
