//! Simulated GPUs from EC2 node profiles, with real character device nodes. A node built with
//! [`SimulatedBackend::new`] (as `gpushared --simulate` builds it at every start) keeps its
//! MIG state in its dev root while gpushared is away, as hardware does ([`state`]).

mod state;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use gpushare_proto::{ComputeMode, TimeSliceInterval};
use nix::sys::stat::{makedev, mknod, Mode, SFlag};

use super::catalog::{self, NodeProfile};
use super::{
    mig_cap_minor, ComputeInstance, DeviceNode, Gpu, GpuBackend, GpuError, MigInstance, MigMode,
};
use crate::mig::{self, CiProfileIndex, GiProfileId, MigModel, Occupied};

/// NVIDIA's character-device major number for `/dev/nvidia*`.
pub const NVIDIA_MAJOR: u64 = 195;
/// Minor number of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u64 = 255;

/// Major number the simulated `nvidia-caps` device nodes get (the real one is dynamic,
/// read from `/proc/devices`).
pub const NVIDIA_CAPS_MAJOR: u64 = 237;

#[derive(Debug, Default, Clone)]
struct Settings {
    compute_mode: ComputeMode,
    time_slice: TimeSliceInterval,
    /// The GPU's MIG profile tables, when it is MIG-capable and gpushare knows its model.
    model: Option<MigModel>,
    mig: MigMode,
    instances: Vec<MigInstance>,
    /// Compute processes on the GPU (set by tests: a busy GPU).
    processes: Vec<u32>,
    /// Handles other clients hold open (set by tests): on the whole GPU (`None`: an NVML
    /// client such as nvidia-smi, DCGM or nvidia-persistenced) or on a GPU instance (a
    /// process using its MIG device), with how many.
    handles: BTreeMap<Option<u32>, u32>,
    /// MIG UUIDs handed out so far: every new compute instance gets a fresh one.
    serial: u32,
}

/// A failure the simulated GPUs inject once, for tests of what callers do when hardware
/// fails half-way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimFault {
    /// The next `create_compute_instance` fails (after its GPU instance was created).
    CreateComputeInstance,
    /// The next `destroy_gpu_instance` fails with `Busy` ("In use by another client").
    DestroyGpuInstance,
}

/// A node of simulated GPUs: deterministic UUIDs derived from the node name, settings held in
/// memory, and real character device nodes (major 195) under `dev_root` so that CDI injection
/// and runc see real devices. MIG state is kept in `dev_root` too when the node is built with
/// [`SimulatedBackend::new`] (see the [`state`] module: `mig-state.json`, and the
/// `reset-gpus` switch that makes MIG instances vanish before the next start).
#[derive(Debug)]
pub struct SimulatedBackend {
    profile: String,
    node: String,
    gpus: Vec<Gpu>,
    dev_root: PathBuf,
    settings: Mutex<HashMap<String, Settings>>,
    faults: Mutex<Vec<SimFault>>,
    make_nodes: bool,
    /// Where MIG state is kept across restarts (`None`: in memory only).
    state_file: Option<PathBuf>,
}

impl SimulatedBackend {
    /// Builds the node for `profile_name` (a catalog name, or a profile file when it contains
    /// `/`: see [`catalog::resolve`]) and `node_name`, creating the device nodes under
    /// `dev_root` (`nvidia<minor>` and `nvidiactl`). Its MIG state (mode, pending mode, GPU
    /// and compute instances) is what `<dev_root>/mig-state.json` says, after the GPUs that
    /// `<dev_root>/reset-gpus` names were reset; every MIG change is written there before it
    /// takes effect.
    ///
    /// # Errors
    /// An unknown or invalid profile (`InvalidInput`; the message lists the known ones), the
    /// device nodes could not be created (mknod needs root), an invalid MIG state file or
    /// reset switch (naming the file), or the MIG state cannot be written.
    pub fn new(profile_name: &str, node_name: &str, dev_root: &Path) -> io::Result<Self> {
        Self::build(profile_name, node_name, dev_root, true)?.keeping_mig_state()
    }

    /// Loads the MIG state kept in the dev root, applies the reset switch, and keeps writing
    /// the state there from now on.
    fn keeping_mig_state(mut self) -> io::Result<Self> {
        let path = self.dev_root.join(state::STATE_FILE);
        let settings = self.settings.get_mut().unwrap_or_else(|p| p.into_inner());
        state::load(&path, &self.profile, &self.node, settings)?;
        for uuid in state::take_reset_switch(&self.dev_root, &self.gpus)? {
            if let Some(s) = settings.get_mut(&uuid) {
                tracing::warn!(gpu = %uuid, instances = s.instances.len(), "simulated GPU reset while gpushared was away (reset-gpus): compute mode and time-slice are Default, its MIG instances are gone");
                s.reset();
            }
        }
        crate::fsutil::create_dir_if_missing(&self.dev_root, 0o755)?;
        crate::fsutil::write_atomic(
            &path,
            &state::encode(&self.profile, &self.node, settings),
            0o644,
        )?;
        self.state_file = Some(path);
        Ok(self)
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
        let mut settings = HashMap::new();
        for g in &gpus {
            let model = g
                .mig_capable
                .then(|| MigModel::from_product_name(&g.product_name))
                .flatten();
            let mut s = Settings {
                model,
                mig: MigMode {
                    current: g.mig_enabled,
                    pending: g.mig_enabled,
                },
                ..Settings::default()
            };
            // MIG devices of a profile file exist at start, as after a mig-parted apply.
            for d in &g.mig_devices {
                let gi_id = next_gi_id(&s.instances, d.memory_slices);
                s.instances.push(MigInstance {
                    gi_id,
                    profile: GiProfileId(d.gi_profile_id),
                    placement: mig::MigPlacement {
                        start: d.placement_start,
                        size: d.memory_slices,
                    },
                    compute: Some(ComputeInstance {
                        ci_id: 0,
                        uuid: d.uuid.clone(),
                    }),
                });
            }
            settings.insert(g.uuid.clone(), s);
        }
        Ok(SimulatedBackend {
            profile: profile.name.clone(),
            node: node_name.to_string(),
            gpus,
            dev_root: dev_root.to_path_buf(),
            settings: Mutex::new(settings),
            faults: Mutex::new(Vec::new()),
            make_nodes,
            state_file: None,
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

    /// Changes a GPU's kept state (MIG, compute mode, time-slice) as hardware would: `f`
    /// works on a copy, which replaces the GPU's state only once it is kept (written to the
    /// state file, when there is one); a failed `f` or write changes nothing.
    fn change_mig<T>(
        &self,
        uuid: &str,
        f: impl FnOnce(&mut Settings) -> Result<T, GpuError>,
    ) -> Result<T, GpuError> {
        let mut map = self
            .settings
            .lock()
            .map_err(|_| GpuError::Failed("simulated GPU state poisoned".into()))?;
        let mut next = map
            .get(uuid)
            .cloned()
            .ok_or_else(|| GpuError::NoSuchGpu(uuid.to_string()))?;
        let out = f(&mut next)?;
        let old = map.insert(uuid.to_string(), next);
        if let Some(path) = &self.state_file {
            let raw = state::encode(&self.profile, &self.node, &map);
            if let Err(e) = crate::fsutil::write_atomic(path, &raw, 0o644) {
                if let Some(old) = old {
                    map.insert(uuid.to_string(), old);
                }
                return Err(GpuError::Failed(format!(
                    "GPU {uuid}: keeping the simulated GPU state in {}: {e}",
                    path.display()
                )));
            }
        }
        Ok(out)
    }
}

impl Settings {
    /// A GPU reset: compute mode and time-slice are back to Default, a pending MIG mode
    /// takes effect and every MIG instance is gone.
    fn reset(&mut self) {
        self.compute_mode = ComputeMode::Default;
        self.time_slice = TimeSliceInterval::Default;
        self.mig.current = self.mig.pending;
        self.instances.clear();
    }

    /// NVML's `IN_USE` while other clients hold handles: on GPU instance `gi`, or (`None`)
    /// on any part of the GPU.
    fn refuse_if_held(&self, uuid: &str, gi: Option<u32>) -> Result<(), GpuError> {
        let held: u32 = self
            .handles
            .iter()
            .filter(|(on, _)| gi.is_none() || **on == gi)
            .map(|(_, n)| n)
            .sum();
        if held == 0 {
            return Ok(());
        }
        Err(GpuError::Busy(format!(
            "GPU {uuid}{}: In use by another client ({held} open handle(s))",
            gi.map(|id| format!(", GPU instance {id}"))
                .unwrap_or_default()
        )))
    }
}

impl SimulatedBackend {
    /// Makes the next call of `fault`'s kind fail once.
    pub fn inject(&self, fault: SimFault) {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(fault);
    }

    /// Sets the compute processes running on a GPU (an empty list: idle).
    ///
    /// # Errors
    /// Unknown GPU.
    pub fn set_processes(&self, uuid: &str, pids: Vec<u32>) -> Result<(), GpuError> {
        self.with_settings(uuid, |s| s.processes = pids)
    }

    /// Performs a GPU reset: a pending MIG mode takes effect and every MIG instance is gone,
    /// as on hardware. Refused while processes or other clients' handles hold the GPU.
    ///
    /// # Errors
    /// `Busy` with processes or open handles, unknown GPU.
    pub fn reset(&self, uuid: &str) -> Result<(), GpuError> {
        self.change_mig(uuid, |s| {
            if !s.processes.is_empty() {
                return Err(GpuError::Busy(format!(
                    "GPU {uuid}: In use by another client ({} processes)",
                    s.processes.len()
                )));
            }
            s.refuse_if_held(uuid, None)?;
            s.reset();
            Ok(())
        })
    }

    /// Opens a handle on a GPU as another client would (`gi: None`: the whole GPU, e.g.
    /// nvidia-smi or DCGM; `Some(id)`: GPU instance `id`, a process on its MIG device). While
    /// it is open, what hardware answers "In use by another client" is refused as
    /// [`GpuError::Busy`]: destroying that instance or its compute instance, changing MIG
    /// mode, a reset.
    ///
    /// # Errors
    /// Unknown GPU, or (`NotFound`) no such GPU instance.
    pub fn open_handle(&self, uuid: &str, gi: Option<u32>) -> Result<(), GpuError> {
        self.with_settings(uuid, |s| {
            if let Some(id) = gi {
                if !s.instances.iter().any(|i| i.gi_id == id) {
                    return Err(GpuError::NotFound(format!(
                        "GPU {uuid}: no GPU instance {id}"
                    )));
                }
            }
            *s.handles.entry(gi).or_default() += 1;
            Ok(())
        })?
    }

    /// Closes a handle [`SimulatedBackend::open_handle`] opened (nothing when none is open).
    ///
    /// # Errors
    /// Unknown GPU.
    pub fn close_handle(&self, uuid: &str, gi: Option<u32>) -> Result<(), GpuError> {
        self.with_settings(uuid, |s| {
            if let Some(n) = s.handles.get_mut(&gi) {
                *n -= 1;
                if *n == 0 {
                    s.handles.remove(&gi);
                }
            }
        })
    }

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

/// The GI ID the driver gives a new GPU instance spanning `memory_slices`: the lowest free one
/// of its size class, as observed on A100 (8 slices: 0; 4: 1–2; 2: 3–6; 1: 7–13).
fn next_gi_id(instances: &[MigInstance], memory_slices: u32) -> u32 {
    let range = match memory_slices {
        8 => 0..1,
        4 => 1..3,
        2 => 3..7,
        _ => 7..14,
    };
    let mut ids = range.clone();
    ids.find(|id| instances.iter().all(|i| i.gi_id != *id))
        .unwrap_or(range.end)
}

fn mig_uuid(node_gpu_uuid: &str, serial: u32) -> String {
    format!(
        "MIG-{}",
        &catalog::simulated_uuid(&format!("{node_gpu_uuid}/mig"), serial)[4..]
    )
}

fn make_char_device(path: &Path, minor: u64) -> io::Result<()> {
    make_device(path, NVIDIA_MAJOR, minor, 0o666)
}

fn make_device(path: &Path, major: u64, minor: u64, mode: u32) -> io::Result<()> {
    match mknod(
        path,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(mode),
        makedev(major, minor),
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

    fn device_majors(&self) -> super::nodes::DriverMajors {
        super::nodes::DriverMajors::default().with("nvidia-caps", NVIDIA_CAPS_MAJOR)
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

#[cfg(test)]
#[path = "sim_tests.rs"]
mod tests;
