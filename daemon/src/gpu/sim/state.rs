//! What a simulated node's GPUs keep while gpushared is away, as hardware keeps it across a
//! daemon restart: every GPU's compute mode and time-slice interval, MIG mode (current and
//! pending), GPU instances with their IDs and placements, their compute instances with their
//! IDs and MIG UUIDs, and how many MIG UUIDs each GPU has handed out (a recreated instance
//! always gets a new one). Kept in
//! `<sim dev root>/mig-state.json`, the simulated node's own directory, never in gpushared's
//! state; MIG instances are lost at a reboot on hardware, and the default dev root lies in
//! the run directory, which a reboot empties too.
//!
//! The switch `<sim dev root>/reset-gpus`, read once at the next start and then removed,
//! resets the GPUs it names (one device name `gpu-<minor>` or GPU UUID a line, or `all`; an
//! empty file means all) before gpushared sees them: compute mode and time-slice are back to
//! Default, a pending MIG mode takes effect and every MIG instance on them is gone, as after `nvidia-smi --gpu-reset` or an
//! administrator's `nvidia-smi mig -dci` / `-dgi` while gpushared was away.
//!
//! The state file is input: one that does not parse or does not describe a valid MIG layout
//! of this node is refused naming the file and what is wrong (remove it to start the
//! simulated node afresh); one written for another profile or node name is another machine's
//! and is replaced.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use gpushare_proto::{ComputeMode, TimeSliceInterval};

use super::Settings;
use crate::gpu::{ComputeInstance, Gpu, MigInstance, MigMode};
use crate::mig::{self, GiProfileId, MigPlacement, Occupied};

/// File name of the simulated node's MIG state, in its dev root.
pub(crate) const STATE_FILE: &str = "mig-state.json";

/// File name of the reset switch, in the simulated node's dev root.
pub(crate) const RESET_SWITCH: &str = "reset-gpus";

/// Largest state file or reset switch read, in bytes (a state file of 8 GPUs with every
/// instance is a few KiB).
const MAX_FILE_BYTES: u64 = 4 << 20;

/// GPU-instance IDs the driver hands out on A100-class GPUs (0..=14).
const GI_IDS: u32 = 15;

/// Compute-instance IDs per GPU instance (0..=7).
const CI_IDS: u32 = 8;

/// The file: which simulated node it describes, and each GPU's state by UUID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateFile {
    /// Node profile name (`p4d.24xlarge`, or a profile file's `name`).
    profile: String,
    /// Node name the GPU UUIDs were derived from.
    node: String,
    /// By GPU UUID.
    gpus: BTreeMap<String, GpuRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuRecord {
    /// Absent in files written before it was kept: Default.
    #[serde(default)]
    compute_mode: ComputeMode,
    /// Absent in files written before it was kept: Default.
    #[serde(default)]
    time_slice: TimeSliceInterval,
    mig_current: bool,
    mig_pending: bool,
    /// MIG UUIDs handed out so far.
    serial: u32,
    instances: Vec<InstanceRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct InstanceRecord {
    gi_id: u32,
    gi_profile_id: u32,
    placement_start: u32,
    memory_slices: u32,
    #[serde(default)]
    compute: Option<ComputeRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComputeRecord {
    ci_id: u32,
    uuid: String,
}

fn invalid(path: &Path, why: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "simulated MIG state {}: {why}; remove the file to start the simulated node afresh",
            path.display()
        ),
    )
}

/// The file's view of `settings`.
pub(super) fn encode(profile: &str, node: &str, settings: &HashMap<String, Settings>) -> Vec<u8> {
    let gpus = settings
        .iter()
        .map(|(uuid, s)| {
            let mut instances: Vec<InstanceRecord> = s
                .instances
                .iter()
                .map(|i| InstanceRecord {
                    gi_id: i.gi_id,
                    gi_profile_id: i.profile.0,
                    placement_start: i.placement.start,
                    memory_slices: i.placement.size,
                    compute: i.compute.as_ref().map(|c| ComputeRecord {
                        ci_id: c.ci_id,
                        uuid: c.uuid.clone(),
                    }),
                })
                .collect();
            instances.sort_by_key(|i| i.gi_id);
            (
                uuid.clone(),
                GpuRecord {
                    compute_mode: s.compute_mode,
                    time_slice: s.time_slice,
                    mig_current: s.mig.current,
                    mig_pending: s.mig.pending,
                    serial: s.serial,
                    instances,
                },
            )
        })
        .collect();
    let file = StateFile {
        profile: profile.to_string(),
        node: node.to_string(),
        gpus,
    };
    // Plain data with string keys: serializing cannot fail.
    serde_json::to_vec_pretty(&file).unwrap_or_default()
}

/// Lays the state in `path` (if the file exists) over `settings`, all or nothing.
///
/// # Errors
/// `InvalidData` naming the file for one that does not parse or does not describe a valid
/// MIG state of this node's GPUs (unknown GPU, GPU without MIG, instances without MIG mode,
/// a placement the profile never takes or that overlaps another, IDs out of range or twice,
/// a MIG UUID that is not one); other I/O errors reading it.
pub(super) fn load(
    path: &Path,
    profile: &str,
    node: &str,
    settings: &mut HashMap<String, Settings>,
) -> io::Result<()> {
    let Some(raw) = read_input(path)? else {
        return Ok(());
    };
    let file: StateFile =
        serde_json::from_slice(&raw).map_err(|e| invalid(path, format_args!("{e}")))?;
    if file.profile != profile || file.node != node {
        tracing::warn!(path = %path.display(), profile = %file.profile, node = %file.node, "simulated MIG state of another simulated node; starting this one afresh");
        return Ok(());
    }
    let mut next = settings.clone();
    for (uuid, rec) in &file.gpus {
        let s = next
            .get_mut(uuid)
            .ok_or_else(|| invalid(path, format_args!("the node has no GPU {uuid}")))?;
        s.compute_mode = rec.compute_mode;
        s.time_slice = rec.time_slice;
        let Some(model) = s.model else {
            // A GPU without MIG keeps only its compute mode and time-slice.
            if rec.mig_current || rec.mig_pending || !rec.instances.is_empty() || rec.serial != 0 {
                return Err(invalid(path, format_args!("GPU {uuid} has no MIG")));
            }
            continue;
        };
        if !rec.mig_current && !rec.instances.is_empty() {
            return Err(invalid(
                path,
                format_args!("GPU {uuid} has MIG instances with MIG mode off"),
            ));
        }
        let mut instances: Vec<MigInstance> = Vec::with_capacity(rec.instances.len());
        let mut uuids = BTreeSet::new();
        for i in &rec.instances {
            let at = format!("GPU {uuid}, GPU instance {}", i.gi_id);
            if i.gi_id >= GI_IDS || instances.iter().any(|o| o.gi_id == i.gi_id) {
                return Err(invalid(
                    path,
                    format_args!("{at}: GI ID out of range or twice"),
                ));
            }
            let taken: Vec<Occupied> = instances
                .iter()
                .map(|o| Occupied {
                    profile: o.profile,
                    placement: o.placement,
                })
                .collect();
            let placement = mig::check_placement(
                model,
                GiProfileId(i.gi_profile_id),
                i.placement_start,
                &taken,
            )
            .map_err(|e| invalid(path, format_args!("{at}: {e}")))?;
            if placement.size != i.memory_slices {
                return Err(invalid(
                    path,
                    format_args!(
                        "{at}: spans {} memory slices, its profile {}",
                        i.memory_slices, placement.size
                    ),
                ));
            }
            let compute = match &i.compute {
                None => None,
                Some(c) => {
                    let well_formed = c.uuid.len() <= 64
                        && c.uuid.strip_prefix("MIG-").is_some_and(|rest| {
                            !rest.is_empty()
                                && rest.chars().all(|ch| ch.is_ascii_hexdigit() || ch == '-')
                        });
                    if c.ci_id >= CI_IDS || !well_formed || !uuids.insert(c.uuid.clone()) {
                        return Err(invalid(
                            path,
                            format_args!(
                                "{at}: compute instance {} with MIG UUID {:?} is not a valid one",
                                c.ci_id, c.uuid
                            ),
                        ));
                    }
                    Some(ComputeInstance {
                        ci_id: c.ci_id,
                        uuid: c.uuid.clone(),
                    })
                }
            };
            instances.push(MigInstance {
                gi_id: i.gi_id,
                profile: GiProfileId(i.gi_profile_id),
                placement: MigPlacement {
                    start: placement.start,
                    size: placement.size,
                },
                compute,
            });
        }
        s.mig = MigMode {
            current: rec.mig_current,
            pending: rec.mig_pending,
        };
        s.serial = rec.serial;
        s.instances = instances;
    }
    *settings = next;
    Ok(())
}

/// Reads and removes the reset switch in `dir`: the UUIDs of the GPUs it names (every
/// MIG-capable GPU for `all` or an empty file); none when there is no switch.
///
/// # Errors
/// A line naming no GPU of the node (`InvalidInput`, the file is left in place), or an I/O
/// error reading or removing it.
pub(super) fn take_reset_switch(dir: &Path, gpus: &[Gpu]) -> io::Result<Vec<String>> {
    let path = dir.join(RESET_SWITCH);
    let Some(raw) = read_input(&path)? else {
        return Ok(Vec::new());
    };
    let text = String::from_utf8(raw).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: not text (one gpu-<minor> or GPU UUID a line, or \"all\")",
                path.display()
            ),
        )
    })?;
    let names: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let mut out = Vec::new();
    if names.is_empty() || names == ["all"] {
        out.extend(gpus.iter().map(|g| g.uuid.clone()));
    } else {
        for name in names {
            let g = gpus
                .iter()
                .find(|g| g.uuid == name || g.device_name() == name)
                .ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "{}: the simulated node has no GPU {name:?} (one gpu-<minor> or GPU UUID a line, or \"all\")",
                            path.display()
                        ),
                    )
                })?;
            out.push(g.uuid.clone());
        }
    }
    crate::fsutil::remove_file_if_exists(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("removing {}: {e}", path.display())))?;
    Ok(out)
}

/// Reads the state file or the reset switch as the input it is (`None`: there is none): a
/// regular file only, never through a symbolic link, bounded, opened non-blocking, as every
/// file read at start is (`fsutil::read_own_file`). A fifo there would otherwise block the
/// start for good, waiting for a writer.
///
/// # Errors
/// `InvalidData` naming the file when it is not a regular file (left there for the operator
/// to remove) or too large; other I/O errors reading it.
fn read_input(path: &Path) -> io::Result<Option<Vec<u8>>> {
    use crate::fsutil::ReadRefusal;
    match crate::fsutil::read_own_file(path, MAX_FILE_BYTES) {
        Ok(raw) => Ok(Some(raw)),
        Err(ReadRefusal::Missing) => Ok(None),
        Err(ReadRefusal::Io(e)) => {
            Err(io::Error::new(e.kind(), format!("{}: {e}", path.display())))
        }
        Err(refusal) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: {refusal}; remove it (the simulated node reads only regular files there)",
                path.display()
            ),
        )),
    }
}
