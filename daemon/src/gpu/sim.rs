//! Simulated GPUs from EC2 node profiles, with real character device nodes.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use gpushare_proto::{ComputeMode, TimeSliceInterval};
use nix::sys::stat::{makedev, mknod, Mode, SFlag};

use super::catalog::{self, NodeProfile};
use super::{DeviceNode, Gpu, GpuBackend, GpuError};

/// NVIDIA's character-device major number for `/dev/nvidia*`.
pub const NVIDIA_MAJOR: u64 = 195;
/// Minor number of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u64 = 255;

#[derive(Debug, Default, Clone, Copy)]
struct Settings {
    compute_mode: ComputeMode,
    time_slice: TimeSliceInterval,
}

/// A node of simulated GPUs: deterministic UUIDs derived from the node name, settings held in
/// memory, and real character device nodes (major 195) under `dev_root` so that CDI injection
/// and runc see real devices.
#[derive(Debug)]
pub struct SimulatedBackend {
    profile: String,
    gpus: Vec<Gpu>,
    dev_root: PathBuf,
    settings: Mutex<HashMap<String, Settings>>,
}

impl SimulatedBackend {
    /// Builds the node for `profile_name` (a catalog name, or a profile file when it contains
    /// `/`: see [`catalog::resolve`]) and `node_name`, creating the device nodes under
    /// `dev_root` (`nvidia<minor>` and `nvidiactl`).
    ///
    /// # Errors
    /// An unknown or invalid profile (`InvalidInput`; the message lists the known ones), or the
    /// device nodes could not be created (mknod needs root).
    pub fn new(profile_name: &str, node_name: &str, dev_root: &Path) -> io::Result<Self> {
        Self::build(profile_name, node_name, dev_root, true)
    }

    fn build(
        profile_name: &str,
        node_name: &str,
        dev_root: &Path,
        make_nodes: bool,
    ) -> io::Result<Self> {
        let profile = catalog::resolve(profile_name)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        Self::from_profile(&profile, node_name, dev_root, make_nodes)
    }

    /// Builds the node described by `profile`; with `make_nodes` the device nodes are created
    /// under `dev_root`, else only their paths point there.
    ///
    /// # Errors
    /// The device nodes could not be created (mknod needs root).
    pub fn from_profile(
        profile: &NodeProfile,
        node_name: &str,
        dev_root: &Path,
        make_nodes: bool,
    ) -> io::Result<Self> {
        let gpus = profile.gpus(node_name);
        if make_nodes {
            crate::fsutil::create_dir(dev_root, 0o755)?;
            for gpu in &gpus {
                make_char_device(
                    &dev_root.join(format!("nvidia{}", gpu.minor)),
                    u64::from(gpu.minor),
                )?;
            }
            make_char_device(&dev_root.join("nvidiactl"), NVIDIACTL_MINOR)?;
        }
        let settings = gpus
            .iter()
            .map(|g| (g.uuid.clone(), Settings::default()))
            .collect();
        Ok(SimulatedBackend {
            profile: profile.name.clone(),
            gpus,
            dev_root: dev_root.to_path_buf(),
            settings: Mutex::new(settings),
        })
    }

    /// Like [`SimulatedBackend::new`] but creates no device nodes (their host paths still
    /// point under `dev_root`): for tests of the logic above the backend, which need no root.
    ///
    /// # Errors
    /// An unknown profile.
    pub fn without_device_nodes(
        profile_name: &str,
        node_name: &str,
        dev_root: &Path,
    ) -> io::Result<Self> {
        Self::build(profile_name, node_name, dev_root, false)
    }

    fn with_settings<T>(
        &self,
        uuid: &str,
        f: impl FnOnce(&mut Settings) -> T,
    ) -> Result<T, GpuError> {
        let mut map = self
            .settings
            .lock()
            .map_err(|_| GpuError::Failed("simulated GPU state poisoned".into()))?;
        map.get_mut(uuid)
            .map(f)
            .ok_or_else(|| GpuError::NoSuchGpu(uuid.to_string()))
    }
}

fn make_char_device(path: &Path, minor: u64) -> io::Result<()> {
    match mknod(
        path,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(NVIDIA_MAJOR, minor),
    ) {
        Ok(()) => Ok(()),
        Err(nix::errno::Errno::EEXIST) => Ok(()),
        Err(e) => Err(io::Error::new(
            io::Error::from(e).kind(),
            format!(
                "creating simulated GPU device node {} (mknod needs root): {e}",
                path.display()
            ),
        )),
    }
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

    fn compute_mode(&self, uuid: &str) -> Result<ComputeMode, GpuError> {
        self.with_settings(uuid, |s| s.compute_mode)
    }

    fn set_compute_mode(&self, uuid: &str, mode: ComputeMode) -> Result<(), GpuError> {
        self.with_settings(uuid, |s| s.compute_mode = mode)
    }

    fn time_slice(&self, uuid: &str) -> Result<TimeSliceInterval, GpuError> {
        self.with_settings(uuid, |s| s.time_slice)
    }

    fn set_time_slice(&self, uuid: &str, interval: TimeSliceInterval) -> Result<(), GpuError> {
        self.with_settings(uuid, |s| s.time_slice = interval)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_profile_lists_known_ones() {
        let dir = tempfile::tempdir().unwrap();
        let err = SimulatedBackend::new("p9.huge", "n", dir.path()).unwrap_err();
        assert!(err.to_string().contains("p4d.24xlarge"), "{err}");
    }

    #[test]
    fn p4d_has_eight_a100_with_device_nodes() {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: mknod needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let b = SimulatedBackend::new("p4d.24xlarge", "node", dir.path()).unwrap();
        assert_eq!(b.gpus().len(), 8);
        let g = b.find("gpu-7").unwrap();
        assert_eq!(g.product_name, "NVIDIA A100-SXM4-40GB");
        assert_eq!(b.find(&g.uuid).unwrap().minor, 7);
        let meta = std::fs::metadata(dir.path().join("nvidia7")).unwrap();
        assert!(meta.file_type().is_char_device());
        assert_eq!(meta.rdev(), makedev(195, 7));
        b.set_time_slice(&g.uuid, TimeSliceInterval::Long).unwrap();
        assert_eq!(b.time_slice(&g.uuid).unwrap(), TimeSliceInterval::Long);
        assert!(b
            .set_compute_mode("GPU-nope", ComputeMode::Default)
            .is_err());
    }
}
