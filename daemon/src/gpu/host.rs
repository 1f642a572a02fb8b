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
mod tests {
    use super::*;
    use crate::gpu::catalog;
    use crate::sys::{CommandOutput, CommandRunner, CommandSpec};
    use std::time::Duration;

    /// NVML as the leaf sees it: modes and processes in memory, every call recorded.
    #[derive(Debug)]
    struct FakeNvml {
        gpus: Vec<Gpu>,
        modes: Mutex<HashMap<String, ComputeMode>>,
        pids: Mutex<HashMap<String, Vec<u32>>>,
        calls: Mutex<Vec<String>>,
    }

    impl FakeNvml {
        fn new() -> Arc<Self> {
            let gpus = catalog::resolve("p4d.24xlarge").unwrap().gpus("n");
            Arc::new(FakeNvml {
                modes: Mutex::new(
                    gpus.iter()
                        .map(|g| (g.uuid.clone(), ComputeMode::Default))
                        .collect(),
                ),
                gpus,
                pids: Mutex::new(HashMap::new()),
                calls: Mutex::new(Vec::new()),
            })
        }
        fn sets(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl NvmlDevices for FakeNvml {
        fn inventory(&self) -> Vec<Gpu> {
            self.gpus.clone()
        }
        fn compute_mode(&self, uuid: &str) -> Result<ComputeMode, GpuError> {
            self.modes
                .lock()
                .unwrap()
                .get(uuid)
                .copied()
                .ok_or_else(|| GpuError::NoSuchGpu(uuid.into()))
        }
        fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), GpuError> {
            self.calls
                .lock()
                .unwrap()
                .push(format!("set {uuid} {mode:?}"));
            self.modes.lock().unwrap().insert(uuid.into(), mode);
            Ok(())
        }
        fn compute_processes(&self, uuid: &str) -> Result<Vec<u32>, GpuError> {
            Ok(self
                .pids
                .lock()
                .unwrap()
                .get(uuid)
                .cloned()
                .unwrap_or_default())
        }
    }

    #[test]
    fn mig_minors_are_read_from_the_drivers_table() {
        let text = "config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\ngpu2/gi2/access 291\ngpu2/gi2/ci0/access 292\n";
        assert_eq!(mig_minor(text, "gpu2/gi2/access"), Some(291));
        assert_eq!(mig_minor(text, "gpu2/gi2/ci0/access"), Some(292));
        assert_eq!(mig_minor(text, "gpu2/gi3/access"), None);
        // The fallback formula agrees with the table's layout.
        assert_eq!(crate::gpu::mig_cap_minor(2, 2, None), 291);
        assert_eq!(crate::gpu::mig_cap_minor(0, 0, Some(0)), 4);
    }

    #[derive(Debug, Default)]
    struct Smi(Mutex<Vec<String>>);
    impl CommandRunner for Smi {
        fn run(&self, spec: &CommandSpec) -> std::io::Result<CommandOutput> {
            self.0.lock().unwrap().push(spec.args.join(" "));
            Ok(CommandOutput {
                code: Some(0),
                stdout: "Successfully set timeslice policy with value x for GPU 0\n".into(),
                stderr: String::new(),
                timed_out: false,
            })
        }
    }

    fn backend() -> (HostBackend, Arc<FakeNvml>, Arc<Smi>) {
        let nvml = FakeNvml::new();
        let smi = Arc::new(Smi::default());
        let b = HostBackend::new(
            nvml.clone(),
            NvidiaSmi::new("nvidia-smi".into(), smi.clone(), Duration::from_secs(5)),
            Path::new("/nonexistent-dev"),
        );
        (b, nvml, smi)
    }

    #[test]
    fn required_control_nodes_are_named_even_when_missing() {
        // /nonexistent-dev has none of them: the spec must still name nvidiactl and
        // nvidia-uvm (so the check before ready refuses the claim with their paths), and
        // leaves out only the optional nvidia-uvm-tools.
        let (b, _, _) = backend();
        let nodes: Vec<String> = b
            .control_device_nodes()
            .iter()
            .map(|n| format!("{} {}", n.path.display(), n.host_path.display()))
            .collect();
        assert_eq!(
            nodes,
            vec![
                "/dev/nvidiactl /nonexistent-dev/nvidiactl",
                "/dev/nvidia-uvm /nonexistent-dev/nvidia-uvm"
            ]
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("nvidia-uvm-tools"), "").unwrap();
        let b = HostBackend::new(
            FakeNvml::new(),
            NvidiaSmi::new(
                "nvidia-smi".into(),
                Arc::new(Smi::default()),
                Duration::from_secs(5),
            ),
            dir.path(),
        );
        assert_eq!(
            b.control_device_nodes().len(),
            3,
            "present optional nodes are named"
        );
    }

    #[test]
    fn a_busy_gpu_is_not_switched_to_exclusive_process() {
        let (b, nvml, _) = backend();
        let uuid = b.gpus()[3].uuid.clone();
        nvml.pids.lock().unwrap().insert(uuid.clone(), vec![4242]);
        let e = b
            .set_compute_mode(&uuid, ComputeMode::ExclusiveProcess)
            .unwrap_err();
        assert!(
            matches!(e, GpuError::Busy(ref m) if m.contains("4242")),
            "{e}"
        );
        assert!(nvml.sets().is_empty());
        assert_eq!(b.compute_mode(&uuid).unwrap(), ComputeMode::Default);
        // Restoring DEFAULT is never refused.
        nvml.modes
            .lock()
            .unwrap()
            .insert(uuid.clone(), ComputeMode::ExclusiveProcess);
        b.set_compute_mode(&uuid, ComputeMode::Default).unwrap();
        assert_eq!(b.compute_mode(&uuid).unwrap(), ComputeMode::Default);
    }

    #[test]
    fn setting_the_current_mode_calls_nothing() {
        let (b, nvml, _) = backend();
        let uuid = b.gpus()[0].uuid.clone();
        b.set_compute_mode(&uuid, ComputeMode::Default).unwrap();
        assert!(nvml.sets().is_empty());
        b.set_compute_mode(&uuid, ComputeMode::ExclusiveProcess)
            .unwrap();
        b.set_compute_mode(&uuid, ComputeMode::ExclusiveProcess)
            .unwrap();
        assert_eq!(nvml.sets().len(), 1);
    }

    #[test]
    fn time_slice_goes_through_nvidia_smi_and_is_remembered() {
        let (b, nvml, smi) = backend();
        let uuid = b.gpus()[1].uuid.clone();
        assert_eq!(b.time_slice(&uuid).unwrap(), TimeSliceInterval::Default);
        b.set_time_slice(&uuid, TimeSliceInterval::Medium).unwrap();
        assert_eq!(b.time_slice(&uuid).unwrap(), TimeSliceInterval::Medium);
        assert_eq!(
            smi.0.lock().unwrap().as_slice(),
            [format!("compute-policy -i {uuid} --set-timeslice 2")]
        );
        nvml.pids.lock().unwrap().insert(uuid.clone(), vec![7]);
        assert!(matches!(
            b.set_time_slice(&uuid, TimeSliceInterval::Long),
            Err(GpuError::Busy(_))
        ));
        b.set_time_slice(&uuid, TimeSliceInterval::Default).unwrap();
        assert!(matches!(
            b.set_time_slice("GPU-nope", TimeSliceInterval::Long),
            Err(GpuError::NoSuchGpu(_))
        ));
    }

    /// Through the whole service: a busy GPU refuses an MPS claim with `Conflict`, starts no
    /// MPS control daemon and leaves no CDI spec, compute mode untouched; a time-slicing claim
    /// on a GPU whose nvidia-smi answers "Not Supported" gets `Unsupported` for that claim only.
    #[test]
    fn the_service_maps_busy_to_conflict_and_not_supported_to_unsupported() {
        use crate::service::{Service, ServiceConfig};
        use crate::strategy::mps::MpsControl;
        use crate::sys::fake::FakeHost;
        use gpushare_proto::ErrorCode;
        use serde_json::json;

        #[derive(Debug)]
        struct NotSupported;
        impl CommandRunner for NotSupported {
            fn run(&self, _: &CommandSpec) -> std::io::Result<CommandOutput> {
                Ok(CommandOutput {
                    code: Some(3),
                    stdout:
                        "Failed to set timeslice policy with value Long for GPU 0 : Not Supported\n"
                            .into(),
                    stderr: String::new(),
                    timed_out: false,
                })
            }
        }

        let dir = tempfile::tempdir().unwrap();
        let nvml = FakeNvml::new();
        let backend = Arc::new(HostBackend::new(
            nvml.clone(),
            NvidiaSmi::new(
                "nvidia-smi".into(),
                Arc::new(NotSupported),
                Duration::from_secs(5),
            ),
            Path::new("/nonexistent-dev"),
        ));
        let busy = backend.gpus()[2].uuid.clone();
        nvml.pids.lock().unwrap().insert(busy.clone(), vec![31337]);
        let host = FakeHost::default();
        let cfg = ServiceConfig::for_tests(dir.path(), "n");
        let mps = MpsControl::new(
            "/usr/bin/nvidia-cuda-mps-control".into(),
            host.ops(),
            Duration::from_millis(200),
        );
        let service = Service::new(cfg, backend, mps).unwrap();
        let claim = |uid: &str, device: &str, sharing: serde_json::Value| {
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                   "metadata": {"uid": uid, "name": "c", "namespace": "ns"},
                   "status": {"allocation": {"devices": {
                     "results": [{"request": "gpus", "driver": "gpu.nvidia.com", "pool": "n", "device": device}],
                     "config": [{"source": "FromClaim", "requests": ["gpus"], "opaque": {"driver": "gpu.nvidia.com",
                       "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": sharing}}}]}}}})
        };
        let e = service
            .prepare(&claim("busy-mps", "gpu-2", json!({"strategy": "MPS"})))
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::Conflict, "{}", e.message);
        assert!(e.message.contains("31337"), "{}", e.message);
        assert!(service.list_claims().is_empty());
        assert!(
            !host.state().calls.iter().any(|c| c.contains(" -d ")),
            "{:?}",
            host.state().calls
        );
        assert!(std::fs::read_dir(dir.path().join("cdi")).map_or(true, |mut d| d.next().is_none()));
        assert!(nvml.sets().is_empty());

        let e = service
            .prepare(&claim(
                "p4-ts",
                "gpu-1",
                json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}),
            ))
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::Unsupported, "{}", e.message);
        // Another GPU is still served.
        service
            .prepare(&claim("fine", "gpu-5", json!({"strategy": "MPS"})))
            .unwrap();
        assert_eq!(
            nvml.sets(),
            [format!(
                "set {} ExclusiveProcess",
                backend_uuid(&service, "gpu-5")
            )]
        );
    }

    fn backend_uuid(service: &crate::service::Service, name: &str) -> String {
        service
            .list_gpus()
            .into_iter()
            .find(|g| g.name == name)
            .unwrap()
            .uuid
    }
}
