//! The simulated node as a [`GpuBackend`]: compute mode, time-slice, MIG mode and
//! instances as NVML and `nvidia-smi` answer on hardware (the same refusals, GI IDs handed out
//! as the driver does, a new MIG UUID for every compute instance), every change kept in the
//! node's state file before it takes effect.

use std::path::{Path, PathBuf};

use gpushare_proto::{ComputeMode, TimeSliceInterval};

use super::{make_device, next_gi_id, SimFault, SimulatedBackend, NVIDIA_CAPS_MAJOR};
use crate::gpu::catalog;
use crate::gpu::{
    mig_cap_minor, ComputeInstance, DeviceNode, Gpu, GpuBackend, GpuError, MigInstance, MigMode,
};
use crate::mig::{self, CiProfileIndex, GiProfileId, Occupied};

impl SimulatedBackend {
    fn take_fault(&self, fault: SimFault) -> bool {
        let mut f = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        match f.iter().position(|x| *x == fault) {
            Some(i) => {
                f.remove(i);
                true
            }
            None => false,
        }
    }

    fn cap_node(&self, minor: u32) -> DeviceNode {
        let name = format!("nvidia-cap{minor}");
        let host_path = self.dev_root.join("nvidia-caps").join(&name);
        if self.make_nodes && !host_path.exists() {
            let made = crate::fsutil::create_dir(&self.dev_root.join("nvidia-caps"), 0o755)
                .and_then(|()| make_device(&host_path, NVIDIA_CAPS_MAJOR, u64::from(minor), 0o444));
            if let Err(e) = made {
                tracing::error!(path = %host_path.display(), error = %e, "creating simulated MIG capability device node");
            }
        }
        DeviceNode {
            path: Path::new("/dev/nvidia-caps").join(&name),
            host_path,
        }
    }
}

fn mig_uuid(node_gpu_uuid: &str, serial: u32) -> String {
    format!(
        "MIG-{}",
        &catalog::simulated_uuid(&format!("{node_gpu_uuid}/mig"), serial)[4..]
    )
}

impl GpuBackend for SimulatedBackend {
    fn describe(&self) -> String {
        format!("simulated:{}", self.profile)
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
        vec![DeviceNode {
            path: PathBuf::from("/dev/nvidiactl"),
            host_path: self.dev_root.join("nvidiactl"),
        }]
    }

    fn device_majors(&self) -> crate::gpu::nodes::DriverMajors {
        crate::gpu::nodes::DriverMajors::default().with("nvidia-caps", NVIDIA_CAPS_MAJOR)
    }

    fn compute_mode(&self, uuid: &str) -> Result<ComputeMode, GpuError> {
        self.with_settings(uuid, |s| s.compute_mode)
    }

    fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), GpuError> {
        // Kept across a restart of gpushared, as the GPU keeps it.
        self.change_mig(uuid, |s| {
            s.compute_mode = mode;
            Ok(())
        })
    }

    fn time_slice(&self, uuid: &str) -> Result<TimeSliceInterval, GpuError> {
        self.with_settings(uuid, |s| s.time_slice)
    }

    fn set_time_slice(&self, uuid: &str, interval: TimeSliceInterval) -> Result<(), GpuError> {
        self.change_mig(uuid, |s| {
            s.time_slice = interval;
            Ok(())
        })
    }

    fn mig_mode(&self, uuid: &str) -> Result<MigMode, GpuError> {
        self.with_settings(uuid, |s| {
            s.model.map(|_| s.mig).ok_or_else(|| not_mig(uuid))
        })?
    }

    fn set_mig_mode(&self, uuid: &str, enabled: bool) -> Result<MigMode, GpuError> {
        self.change_mig(uuid, |s| {
            let model = s.model.ok_or_else(|| not_mig(uuid))?;
            if s.mig.current == enabled && s.mig.pending == enabled {
                return Ok(s.mig);
            }
            if !s.processes.is_empty() {
                return Err(GpuError::Busy(format!(
                    "GPU {uuid}: In use by another client: {} compute process(es) (pids {:?})",
                    s.processes.len(),
                    s.processes
                )));
            }
            s.refuse_if_held(uuid, None)?;
            if !enabled && !s.instances.is_empty() {
                return Err(GpuError::Busy(format!(
                    "GPU {uuid}: {} MIG GPU instance(s) exist; destroy them first",
                    s.instances.len()
                )));
            }
            s.mig.pending = enabled;
            if model.reset_free_mode_toggle() {
                s.mig.current = enabled;
            }
            Ok(s.mig)
        })
    }

    fn compute_processes(&self, uuid: &str) -> Result<Vec<u32>, GpuError> {
        self.with_settings(uuid, |s| s.processes.clone())
    }

    fn mig_instances(&self, uuid: &str) -> Result<Vec<MigInstance>, GpuError> {
        self.with_settings(uuid, |s| {
            s.model.ok_or_else(|| not_mig(uuid))?;
            let mut v = if s.mig.current {
                s.instances.clone()
            } else {
                Vec::new()
            };
            v.sort_by_key(|i| i.gi_id);
            Ok(v)
        })?
    }

    fn create_gpu_instance(
        &self,
        uuid: &str,
        profile: GiProfileId,
        start: u32,
    ) -> Result<u32, GpuError> {
        if self.take_fault(SimFault::CreateGpuInstance) {
            return Err(GpuError::InsufficientResources(format!(
                "GPU {uuid}: no room for a GPU instance of profile {} at {start} (injected)",
                profile.0
            )));
        }
        self.change_mig(uuid, |s| {
            let model = s.model.ok_or_else(|| not_mig(uuid))?;
            if !s.mig.current {
                return Err(GpuError::Unsupported(format!(
                    "GPU {uuid}: MIG mode is not in effect{}",
                    if s.mig.pending {
                        " (enable is pending a GPU reset)"
                    } else {
                        ""
                    }
                )));
            }
            let occupied: Vec<Occupied> = s
                .instances
                .iter()
                .map(|i| Occupied {
                    profile: i.profile,
                    placement: i.placement,
                })
                .collect();
            let placement =
                mig::check_placement(model, profile, start, &occupied).map_err(|e| match e {
                    mig::PlacementError::Invalid(m) => GpuError::InvalidArgument(m),
                    mig::PlacementError::Taken(m) => GpuError::InsufficientResources(m),
                })?;
            let gi_id = next_gi_id(&s.instances, placement.size);
            s.instances.push(MigInstance {
                gi_id,
                profile,
                placement,
                compute: None,
            });
            Ok(gi_id)
        })
    }

    fn create_compute_instance(
        &self,
        uuid: &str,
        gi_id: u32,
        profile: CiProfileIndex,
    ) -> Result<ComputeInstance, GpuError> {
        let fail = self.take_fault(SimFault::CreateComputeInstance);
        self.change_mig(uuid, |s| {
            let model = s.model.ok_or_else(|| not_mig(uuid))?;
            let serial = s.serial;
            let gi = s
                .instances
                .iter_mut()
                .find(|i| i.gi_id == gi_id)
                .ok_or_else(|| GpuError::NotFound(format!("GPU {uuid}: no GPU instance {gi_id}")))?;
            let full = model
                .profile_by_id(gi.profile)
                .map(|p| p.full_ci_profile())
                .ok_or_else(|| GpuError::Failed(format!("GPU instance {gi_id}: unknown profile")))?;
            if profile != full {
                return Err(GpuError::InvalidArgument(format!(
                    "compute-instance profile {} is not the full profile {} of GPU instance {gi_id}",
                    profile.0, full.0
                )));
            }
            if gi.compute.is_some() {
                return Err(GpuError::InsufficientResources(format!(
                    "GPU instance {gi_id} has no compute slices left"
                )));
            }
            if fail {
                return Err(GpuError::Failed(format!(
                    "GPU {uuid}: creating a compute instance in GPU instance {gi_id}: Unknown Error (injected)"
                )));
            }
            let ci = ComputeInstance {
                ci_id: 0,
                uuid: mig_uuid(uuid, serial),
            };
            gi.compute = Some(ci.clone());
            s.serial += 1;
            Ok(ci)
        })
    }

    fn destroy_compute_instance(&self, uuid: &str, gi_id: u32, ci_id: u32) -> Result<(), GpuError> {
        self.change_mig(uuid, |s| {
            if s.instances.iter().any(|i| i.gi_id == gi_id) {
                s.refuse_if_held(uuid, Some(gi_id))?;
            }
            let gi = s
                .instances
                .iter_mut()
                .find(|i| i.gi_id == gi_id)
                .ok_or_else(|| {
                    GpuError::NotFound(format!("GPU {uuid}: no GPU instance {gi_id}"))
                })?;
            match &gi.compute {
                Some(ci) if ci.ci_id == ci_id => {
                    gi.compute = None;
                    Ok(())
                }
                _ => Err(GpuError::NotFound(format!(
                    "GPU {uuid}: GPU instance {gi_id} has no compute instance {ci_id}"
                ))),
            }
        })
    }

    fn destroy_gpu_instance(&self, uuid: &str, gi_id: u32) -> Result<(), GpuError> {
        let fail = self.take_fault(SimFault::DestroyGpuInstance);
        self.change_mig(uuid, |s| {
            let i = s
                .instances
                .iter()
                .position(|i| i.gi_id == gi_id)
                .ok_or_else(|| {
                    GpuError::NotFound(format!("GPU {uuid}: no GPU instance {gi_id}"))
                })?;
            if s.instances[i].compute.is_some() {
                return Err(GpuError::Busy(format!(
                    "GPU {uuid}: GPU instance {gi_id} still has a compute instance"
                )));
            }
            s.refuse_if_held(uuid, Some(gi_id))?;
            if fail {
                return Err(GpuError::Busy(format!(
                    "GPU {uuid}: GPU instance {gi_id}: In use by another client (injected)"
                )));
            }
            s.instances.remove(i);
            Ok(())
        })
    }

    fn mig_device_nodes(&self, gpu: &Gpu, gi_id: u32, ci_id: u32) -> Vec<DeviceNode> {
        vec![
            self.cap_node(mig_cap_minor(gpu.minor, gi_id, None)),
            self.cap_node(mig_cap_minor(gpu.minor, gi_id, Some(ci_id))),
        ]
    }
}

fn not_mig(uuid: &str) -> GpuError {
    GpuError::Unsupported(format!("GPU {uuid} does not support MIG"))
}
