//! The administrator's switches (`[gpus] manage_compute_mode`, `manage_time_slice`) laid over
//! any backend: where the host's administrators own a setting, gpushare reads it but never
//! changes it. MPS works in compute mode DEFAULT too (EXCLUSIVE_PROCESS only keeps non-MPS
//! processes off the GPU), so an MPS claim still works with compute-mode management off.

use std::sync::Arc;

use gpushare_proto::{ComputeMode, TimeSliceInterval};

use super::{DeviceNode, Gpu, GpuBackend, GpuError};

/// Passes everything to `inner` except the setting changes that are switched off, which are
/// logged and skipped.
#[derive(Debug)]
pub struct ManagedSettings {
    inner: Arc<dyn GpuBackend>,
    compute_mode: bool,
    time_slice: bool,
}

impl ManagedSettings {
    /// `compute_mode` / `time_slice`: whether gpushare may change that setting.
    pub fn new(inner: Arc<dyn GpuBackend>, compute_mode: bool, time_slice: bool) -> Self {
        ManagedSettings {
            inner,
            compute_mode,
            time_slice,
        }
    }
}

impl GpuBackend for ManagedSettings {
    fn describe(&self) -> String {
        let mut d = self.inner.describe();
        if !self.compute_mode {
            d += " (compute mode not managed)";
        }
        if !self.time_slice {
            d += " (time-slice not managed)";
        }
        d
    }

    fn gpus(&self) -> &[Gpu] {
        self.inner.gpus()
    }

    fn device_majors(&self) -> super::nodes::DriverMajors {
        self.inner.device_majors()
    }

    fn mig_mode(&self, uuid: &str) -> Result<super::MigMode, GpuError> {
        self.inner.mig_mode(uuid)
    }

    fn set_mig_mode(&self, uuid: &str, enabled: bool) -> Result<super::MigMode, GpuError> {
        self.inner.set_mig_mode(uuid, enabled)
    }

    fn compute_processes(&self, uuid: &str) -> Result<Vec<u32>, GpuError> {
        self.inner.compute_processes(uuid)
    }

    fn mig_instances(&self, uuid: &str) -> Result<Vec<super::MigInstance>, GpuError> {
        self.inner.mig_instances(uuid)
    }

    fn create_gpu_instance(
        &self,
        uuid: &str,
        profile: crate::mig::GiProfileId,
        start: u32,
    ) -> Result<u32, GpuError> {
        self.inner.create_gpu_instance(uuid, profile, start)
    }

    fn create_compute_instance(
        &self,
        uuid: &str,
        gi_id: u32,
        profile: crate::mig::CiProfileIndex,
    ) -> Result<super::ComputeInstance, GpuError> {
        self.inner.create_compute_instance(uuid, gi_id, profile)
    }

    fn destroy_compute_instance(&self, uuid: &str, gi_id: u32, ci_id: u32) -> Result<(), GpuError> {
        self.inner.destroy_compute_instance(uuid, gi_id, ci_id)
    }

    fn destroy_gpu_instance(&self, uuid: &str, gi_id: u32) -> Result<(), GpuError> {
        self.inner.destroy_gpu_instance(uuid, gi_id)
    }

    fn mig_device_nodes(&self, gpu: &Gpu, gi_id: u32, ci_id: u32) -> Vec<DeviceNode> {
        self.inner.mig_device_nodes(gpu, gi_id, ci_id)
    }

    fn gpu_device_nodes(&self, gpu: &Gpu) -> Vec<DeviceNode> {
        self.inner.gpu_device_nodes(gpu)
    }

    fn control_device_nodes(&self) -> Vec<DeviceNode> {
        self.inner.control_device_nodes()
    }

    fn compute_mode(&self, uuid: &str) -> Result<ComputeMode, GpuError> {
        self.inner.compute_mode(uuid)
    }

    fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), GpuError> {
        if self.compute_mode {
            return self.inner.set_compute_mode(uuid, mode);
        }
        if self.find(uuid).is_none() {
            return Err(GpuError::NoSuchGpu(uuid.to_string()));
        }
        tracing::info!(gpu = %uuid, ?mode, "compute mode left as it is: gpus.manage_compute_mode = false");
        Ok(())
    }

    fn time_slice(&self, uuid: &str) -> Result<TimeSliceInterval, GpuError> {
        self.inner.time_slice(uuid)
    }

    fn set_time_slice(&self, uuid: &str, interval: TimeSliceInterval) -> Result<(), GpuError> {
        if self.time_slice {
            return self.inner.set_time_slice(uuid, interval);
        }
        if self.find(uuid).is_none() {
            return Err(GpuError::NoSuchGpu(uuid.to_string()));
        }
        tracing::info!(gpu = %uuid, interval = interval.as_str(), "time-slice interval left as it is: gpus.manage_time_slice = false");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::SimulatedBackend;
    use std::path::Path;

    #[test]
    fn switched_off_settings_are_never_changed() {
        let sim: Arc<dyn GpuBackend> = Arc::new(
            SimulatedBackend::without_device_nodes("g5.xlarge", "n", Path::new("/d")).unwrap(),
        );
        let m = ManagedSettings::new(sim.clone(), false, false);
        let uuid = sim.gpus()[0].uuid.clone();
        m.set_compute_mode(&uuid, ComputeMode::ExclusiveProcess)
            .unwrap();
        m.set_time_slice(&uuid, TimeSliceInterval::Long).unwrap();
        assert_eq!(sim.compute_mode(&uuid).unwrap(), ComputeMode::Default);
        assert_eq!(sim.time_slice(&uuid).unwrap(), TimeSliceInterval::Default);
        assert!(m.set_compute_mode("GPU-x", ComputeMode::Default).is_err());
        assert!(m.describe().contains("compute mode not managed"));

        let on = ManagedSettings::new(sim.clone(), true, true);
        on.set_compute_mode(&uuid, ComputeMode::ExclusiveProcess)
            .unwrap();
        assert_eq!(
            sim.compute_mode(&uuid).unwrap(),
            ComputeMode::ExclusiveProcess
        );
    }
}
