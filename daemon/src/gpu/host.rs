//! Real GPUs: NVML for what the node has and for compute mode, `nvidia-smi` for time-slice
//! intervals. The rules live here, above both leaves: a GPU already in the wanted state is
//! left alone, and a GPU with running compute processes is never switched to a non-default
//! setting under them.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use gpushare_proto::{ComputeMode, TimeSliceInterval};

use super::nvml::NvmlDevices;
use super::timeslice::NvidiaSmi;
use super::{DeviceNode, Gpu, GpuBackend, GpuError};

/// Device nodes every CUDA container needs: named in every claim's spec whether or not the
/// host has them, so that a missing one refuses the claim with its path (the driver creates
/// `nvidia-uvm` only once its module is loaded: `nvidia-modprobe -u -c=0`, or the toolkit's
/// `nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules`).
const CONTROL_NODES: &[&str] = &["nvidiactl", "nvidia-uvm"];

/// Device nodes named only when the host has them: `nvidia-uvm-tools` serves profilers, not
/// CUDA itself.
const OPTIONAL_CONTROL_NODES: &[&str] = &["nvidia-uvm-tools"];

/// The kernel's table of device majors, where `nvidia-uvm` and `nvidia-caps` get theirs.
const PROC_DEVICES: &str = "/proc/devices";

/// The driver's table of MIG capability minors (`gpu0/gi1/access 12`, one per line).
const MIG_MINORS: &str = "/proc/driver/nvidia-caps/mig-minors";

/// The minor of `key` (`gpu<minor>/gi<id>/access` or `…/ci<id>/access`) in the text of
/// `/proc/driver/nvidia-caps/mig-minors`.
fn mig_minor(text: &str, key: &str) -> Option<u32> {
    text.lines().find_map(|l| {
        let (k, v) = l.trim().split_once(char::is_whitespace)?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The backend for a node with NVIDIA's driver.
#[derive(Debug)]
pub struct HostBackend {
    nvml: Arc<dyn NvmlDevices>,
    gpus: Vec<Gpu>,
    smi: NvidiaSmi,
    dev_root: PathBuf,
    /// Intervals set since start. NVIDIA offers no documented way to read the policy back, so
    /// a GPU not set by this daemon reports `Default`, the driver's state after boot.
    time_slices: Mutex<HashMap<String, TimeSliceInterval>>,
}

impl HostBackend {
    /// GPUs from `nvml`, device nodes under `dev_root` (`/dev` on a real node), time-slices
    /// through `smi`.
    pub fn new(nvml: Arc<dyn NvmlDevices>, smi: NvidiaSmi, dev_root: &Path) -> Self {
        let gpus = nvml.inventory();
        HostBackend {
            nvml,
            gpus,
            smi,
            dev_root: dev_root.to_path_buf(),
            time_slices: Mutex::new(HashMap::new()),
        }
    }

    fn known(&self, uuid: &str) -> Result<(), GpuError> {
        if self.gpus.iter().any(|g| g.uuid == uuid) {
            Ok(())
        } else {
            Err(GpuError::NoSuchGpu(uuid.to_string()))
        }
    }

    /// Refuses a change to a non-default setting while compute processes run on the GPU: they
    /// would lose the GPU (compute mode) or their scheduling would change under them.
    fn refuse_if_busy(&self, uuid: &str, what: &str) -> Result<(), GpuError> {
        let pids = self.nvml.compute_processes(uuid)?;
        if pids.is_empty() {
            return Ok(());
        }
        Err(GpuError::Busy(format!(
            "GPU {uuid} runs {} compute process(es) (pids {}); not changing its {what} under them",
            pids.len(),
            pids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        )))
    }

    fn slices(&self) -> std::sync::MutexGuard<'_, HashMap<String, TimeSliceInterval>> {
        self.time_slices.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl GpuBackend for HostBackend {
    fn describe(&self) -> String {
        match self.gpus.first() {
            Some(g) => format!("nvml:driver {}", g.driver_version),
            None => "nvml:no GPUs".to_string(),
        }
    }

    fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    fn gpu_device_nodes(&self, gpu: &Gpu) -> Vec<DeviceNode> {
        let name = format!("nvidia{}", gpu.minor);
        vec![DeviceNode {
            path: Path::new("/dev").join(&name),
            host_path: self.dev_root.join(&name),
        }]
    }

    fn control_device_nodes(&self) -> Vec<DeviceNode> {
        let node = |n: &&str| DeviceNode {
            path: Path::new("/dev").join(n),
            host_path: self.dev_root.join(n),
        };
        let mut nodes: Vec<DeviceNode> = CONTROL_NODES.iter().map(node).collect();
        for n in OPTIONAL_CONTROL_NODES.iter().map(node) {
            if n.host_path.exists() {
                nodes.push(n);
            } else {
                tracing::debug!(path = %n.host_path.display(), "optional device node absent; not given to containers");
            }
        }
        nodes
    }

    fn device_majors(&self) -> super::nodes::DriverMajors {
        match std::fs::read_to_string(PROC_DEVICES) {
            Ok(text) => super::nodes::DriverMajors::parse_proc_devices(&text),
            Err(e) => {
                tracing::warn!(path = PROC_DEVICES, error = %e, "cannot read device majors; checking only the minors of nvidia-uvm and nvidia-caps nodes");
                super::nodes::DriverMajors::default()
            }
        }
    }

    fn compute_mode(&self, uuid: &str) -> Result<ComputeMode, GpuError> {
        self.nvml.compute_mode(uuid)
    }

    fn mig_mode(&self, uuid: &str) -> Result<super::MigMode, GpuError> {
        self.nvml.mig_mode(uuid)
    }

    fn set_mig_mode(&self, uuid: &str, enabled: bool) -> Result<super::MigMode, GpuError> {
        let now = self.nvml.mig_mode(uuid)?;
        if now.current == enabled && now.pending == enabled {
            return Ok(now);
        }
        self.refuse_if_busy(uuid, "MIG mode")?;
        let after = self.nvml.set_mig_mode(uuid, enabled)?;
        tracing::info!(gpu = %uuid, enabled, current = after.current, pending = after.pending, "MIG mode set");
        Ok(after)
    }

    fn compute_processes(&self, uuid: &str) -> Result<Vec<u32>, GpuError> {
        self.nvml.compute_processes(uuid)
    }

    fn mig_instances(&self, uuid: &str) -> Result<Vec<super::MigInstance>, GpuError> {
        if !self.nvml.mig_mode(uuid)?.current {
            return Ok(Vec::new());
        }
        self.nvml.mig_instances(uuid)
    }

    fn create_gpu_instance(
        &self,
        uuid: &str,
        profile: crate::mig::GiProfileId,
        start: u32,
    ) -> Result<u32, GpuError> {
        self.nvml.create_gpu_instance(uuid, profile, start)
    }

    fn create_compute_instance(
        &self,
        uuid: &str,
        gi_id: u32,
        profile: crate::mig::CiProfileIndex,
    ) -> Result<super::ComputeInstance, GpuError> {
        self.nvml.create_compute_instance(uuid, gi_id, profile)
    }

    fn destroy_compute_instance(&self, uuid: &str, gi_id: u32, ci_id: u32) -> Result<(), GpuError> {
        self.nvml.destroy_compute_instance(uuid, gi_id, ci_id)
    }

    fn destroy_gpu_instance(&self, uuid: &str, gi_id: u32) -> Result<(), GpuError> {
        self.nvml.destroy_gpu_instance(uuid, gi_id)
    }

    fn mig_device_nodes(&self, gpu: &Gpu, gi_id: u32, ci_id: u32) -> Vec<DeviceNode> {
        // The driver publishes the numbering; the formula is its documented layout, used when
        // the file cannot be read.
        let minors = std::fs::read_to_string(MIG_MINORS).unwrap_or_default();
        let gi_key = format!("gpu{}/gi{gi_id}/access", gpu.minor);
        let ci_key = format!("gpu{}/gi{gi_id}/ci{ci_id}/access", gpu.minor);
        [
            (gi_key, super::mig_cap_minor(gpu.minor, gi_id, None)),
            (ci_key, super::mig_cap_minor(gpu.minor, gi_id, Some(ci_id))),
        ]
        .into_iter()
        .map(|(key, fallback)| {
            let minor = mig_minor(&minors, &key).unwrap_or(fallback);
            let name = format!("nvidia-cap{minor}");
            let node = DeviceNode {
                path: Path::new("/dev/nvidia-caps").join(&name),
                host_path: self.dev_root.join("nvidia-caps").join(&name),
            };
            if !node.host_path.exists() {
                tracing::warn!(path = %node.host_path.display(), "MIG capability device node is missing (nvidia-modprobe -f /proc/driver/nvidia-caps/mig-minors creates them)");
            }
            node
        })
        .collect()
    }

    fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), GpuError> {
        if self.nvml.compute_mode(uuid)? == mode {
            return Ok(());
        }
        if mode != ComputeMode::Default {
            self.refuse_if_busy(uuid, "compute mode")?;
        }
        self.nvml.set_compute_mode(uuid, mode)?;
        tracing::info!(gpu = %uuid, ?mode, "compute mode set");
        Ok(())
    }

    fn time_slice(&self, uuid: &str) -> Result<TimeSliceInterval, GpuError> {
        self.known(uuid)?;
        Ok(self.slices().get(uuid).copied().unwrap_or_default())
    }

    fn set_time_slice(&self, uuid: &str, interval: TimeSliceInterval) -> Result<(), GpuError> {
        self.known(uuid)?;
        let current = self.slices().get(uuid).copied().unwrap_or_default();
        if interval != current && interval != TimeSliceInterval::Default {
            self.refuse_if_busy(uuid, "time-slice interval")?;
        }
        // Always run the tool: after a driver reload the remembered value may be stale, and
        // setting the same interval again is harmless.
        self.smi.set_time_slice(uuid, interval)?;
        self.slices().insert(uuid.to_string(), interval);
        tracing::info!(gpu = %uuid, interval = interval.as_str(), "time-slice interval set");
        Ok(())
    }
}

#[cfg(test)]
#[path = "host_tests.rs"]
mod tests;
