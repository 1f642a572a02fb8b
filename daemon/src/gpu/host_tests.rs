//! Unit tests of `host.rs`.

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
