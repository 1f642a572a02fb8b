//! Simulated GPUs from EC2 node profiles, with real character device nodes. A node built with
//! [`SimulatedBackend::new`] (as `gpushared --simulate` builds it at every start) keeps its
//! MIG state in its dev root while gpushared is away, as hardware does ([`state`]). Here: the
//! node built from its profile; `backend.rs`: what it answers as a [`super::GpuBackend`];
//! `controls.rs`: what tests and the demo do to it (faults, processes, handles, resets).

mod backend;
mod controls;
mod state;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use gpushare_proto::{ComputeMode, TimeSliceInterval};
use nix::sys::stat::{makedev, mknod, Mode, SFlag};

use super::catalog::{self, NodeProfile};
use super::{ComputeInstance, Gpu, GpuError, MigInstance, MigMode};
use crate::mig::{self, GiProfileId, MigModel};

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
    /// The next `create_gpu_instance` fails (`InsufficientResources`, as the driver answers
    /// when it has no room left).
    CreateGpuInstance,
    /// The next `create_compute_instance` fails (after its GPU instance was created).
    CreateComputeInstance,
    /// The next `destroy_gpu_instance` fails with `Busy` ("In use by another client").
    DestroyGpuInstance,
}

/// A node of simulated GPUs: deterministic UUIDs derived from the node name, settings held in
/// memory, and real character device nodes (major 195) under `dev_root` so that CDI injection
/// and runc see real devices. MIG state is kept in `dev_root` too when the node is built with
/// [`SimulatedBackend::new`] (see the `state` module: `mig-state.json`, and the
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

    /// Like [`SimulatedBackend::without_device_nodes`], keeping MIG state in
    /// `<dev_root>/mig-state.json` as [`SimulatedBackend::new`] does: for tests that restart
    /// gpushared over GPUs whose MIG instances outlive it.
    ///
    /// # Errors
    /// An unknown profile, an invalid state file.
    #[cfg(test)]
    pub(crate) fn without_device_nodes_keeping_mig_state(
        profile_name: &str,
        node_name: &str,
        dev_root: &Path,
    ) -> io::Result<Self> {
        std::fs::create_dir_all(dev_root)?;
        Self::build(profile_name, node_name, dev_root, false)?.keeping_mig_state()
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

#[cfg(test)]
#[path = "sim_tests.rs"]
mod tests;
