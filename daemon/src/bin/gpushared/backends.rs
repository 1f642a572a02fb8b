//! The GPU backend (NVML or a simulated node, under the administrator's switches) and the
//! driver's CDI spec generator that `gpushared` builds from its config.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

use gpushare::daemon_config::{DaemonConfig, DriverSpecMode, GpusConfig};
use gpushare::driver_spec::{
    nvidia_ctk::NvidiaCtk, sim::SimulatedToolkit, DriverSpecs, SpecGenerator,
};
use gpushare::gpu::nvml::NvmlLib;
use gpushare::gpu::timeslice::NvidiaSmi;
use gpushare::gpu::{GpuBackend, HostBackend, ManagedSettings, SimulatedBackend};
use gpushare::sys::HostRunner;

use crate::host::absolute;

/// NVML unless a node profile is simulated, with the administrator's switches laid over it.
pub(crate) fn gpu_backend(
    gpus: &GpusConfig,
    node_name: &str,
    run_dir: &Path,
) -> Result<Arc<dyn GpuBackend>> {
    let inner: Arc<dyn GpuBackend> = if gpus.simulate.is_empty() {
        let nvml = NvmlLib::init().map_err(|e| {
            anyhow::anyhow!("{e}; is the NVIDIA driver installed? Without GPUs, run with --simulate <node profile> (e.g. p4d.24xlarge)")
        })?;
        let smi = if gpus.nvidia_smi.as_os_str().is_empty() {
            NvidiaSmi::default_program()
        } else {
            gpus.nvidia_smi.clone()
        };
        let smi = NvidiaSmi::new(
            smi,
            Arc::new(HostRunner),
            Duration::from_secs(gpus.nvidia_smi_timeout_seconds),
        );
        Arc::new(HostBackend::new(Arc::new(nvml), smi, Path::new("/dev")))
    } else {
        let profile = &gpus.simulate;
        let dev_root = if gpus.sim_dev_root.as_os_str().is_empty() {
            run_dir.join("simulated-dev")
        } else {
            gpus.sim_dev_root.clone()
        };
        Arc::new(
            SimulatedBackend::new(profile, node_name, &dev_root)
                .with_context(|| format!("setting up simulated node {profile}"))?,
        )
    };
    Ok(Arc::new(ManagedSettings::new(
        inner,
        gpus.manage_compute_mode,
        gpus.manage_time_slice,
    )))
}

/// The driver's CDI spec (`[cdi]`): NVIDIA's `nvidia-ctk cdi generate` on a real node; on a
/// simulated one the simulated generator over the simulated GPUs and driver root, unless
/// `[cdi] nvidia_ctk` names a program to run instead. `None` for `driver_spec = "none"`.
pub(crate) fn driver_specs(
    settings: &DaemonConfig,
    backend: &Arc<dyn GpuBackend>,
    run_dir: &Path,
    cdi_dir: &Path,
) -> Result<Option<Arc<DriverSpecs>>> {
    if settings.cdi.driver_spec == DriverSpecMode::None {
        tracing::info!(
            "[cdi] driver_spec = \"none\": claims' containers get no driver files from gpushare"
        );
        return Ok(None);
    }
    let generator: Arc<dyn SpecGenerator> =
        if !settings.gpus.simulate.is_empty() && settings.cdi.nvidia_ctk.as_os_str().is_empty() {
            let root = if settings.gpus.sim_driver_root.as_os_str().is_empty() {
                run_dir.join("simulated-driver")
            } else {
                absolute(&settings.gpus.sim_driver_root)?
            };
            Arc::new(SimulatedToolkit::new(Arc::clone(backend), &root))
        } else {
            Arc::new(NvidiaCtk::new(
                &settings.cdi.nvidia_ctk,
                &settings.cdi.driver_root,
                Arc::new(HostRunner),
                Duration::from_secs(settings.cdi.generate_timeout_seconds),
            ))
        };
    let specs = DriverSpecs::new(
        generator,
        &settings.cdi.driver_kind,
        cdi_dir,
        &run_dir.join("driver-spec"),
    )
    .map_err(anyhow::Error::msg)?;
    Ok(Some(Arc::new(specs)))
}
