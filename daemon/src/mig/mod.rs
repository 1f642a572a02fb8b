//! The MIG model, pure: GPU-instance and compute-instance profiles of the MIG-capable GPUs
//! gpushare knows (A100-SXM4-40GB, A100-SXM4-80GB, H100 80GB, H200), their placements over
//! the 8 memory slices, placement validity, and the DRA driver's MIG device names.
//!
//! NVML numbers GPU-instance profiles twice: the *profile index* passed to
//! `nvmlDeviceGetGpuInstanceProfileInfo` (`NVML_GPU_INSTANCE_PROFILE_3_SLICE = 2`) and the
//! *profile ID* that call returns, which `nvidia-smi mig -lgip`, `CreateGpuInstance*`, device
//! names and mig-parted use (`3g.20gb` is ID 9). The two are distinct types here
//! ([`GiProfileIndex`], [`GiProfileId`]) so one can never be passed where the other is meant.
//! Tables: NVIDIA's MIG user guide (<https://docs.nvidia.com/datacenter/tesla/mig-user-guide/>,
//! "Supported MIG Profiles"), NVIDIA/go-nvml's `pkg/nvml/mock` GPUs and real
//! `nvidia-smi mig -lgip` outputs; the comment above each table says which figure is whose.

pub mod layout;
pub mod partitions;

use std::fmt;

/// A GPU-instance profile ID as `nvidia-smi mig -lgip` shows it and `CreateGpuInstance`
/// takes it (`3g.20gb` = 9, `1g.5gb` = 19, `7g.40gb` = 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GiProfileId(pub u32);

/// An NVML GPU-instance profile index (`NVML_GPU_INSTANCE_PROFILE_*`, the argument of
/// `nvmlDeviceGetGpuInstanceProfileInfo`): `3_SLICE` = 2, `1_SLICE_REV1` (`+me`) = 7.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GiProfileIndex(pub u32);

/// An NVML compute-instance profile index (`NVML_COMPUTE_INSTANCE_PROFILE_*`), which
/// nvidia-smi also shows as the CI profile ID: 1 slice = 0, 2 = 1, 3 = 2, 4 = 3, 7 = 4.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CiProfileIndex(pub u32);

impl fmt::Display for GiProfileId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Memory slices per MIG-capable GPU (the placement index space is `0..8`).
pub const MEMORY_SLICES: u32 = 8;

/// A GPU instance's range of memory slices, `[start, start + size)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MigPlacement {
    /// First memory slice.
    pub start: u32,
    /// Memory slices spanned.
    pub size: u32,
}

impl MigPlacement {
    /// Whether the two ranges share a memory slice.
    pub fn overlaps(&self, other: &MigPlacement) -> bool {
        self.start < other.start + other.size && other.start < self.start + self.size
    }
}

impl fmt::Display for MigPlacement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.start, self.size)
    }
}

/// One GPU-instance profile of one GPU model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GiProfile {
    /// Name as nvidia-smi and mig-parted write it, e.g. `3g.20gb`, `1g.5gb+me`.
    pub name: &'static str,
    /// Profile ID (`nvidia-smi mig -lgip`).
    pub id: GiProfileId,
    /// NVML profile index.
    pub index: GiProfileIndex,
    /// Compute (SM) slices, the `<G>` of `<G>g`.
    pub compute_slices: u32,
    /// Memory slices a placement spans.
    pub memory_slices: u32,
    /// Memory in MiB (NVML's `memorySizeMB`).
    pub memory_mib: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Copy engines.
    pub copy_engines: u32,
    /// Video decoders.
    pub decoders: u32,
    /// Video encoders.
    pub encoders: u32,
    /// JPEG engines.
    pub jpeg_engines: u32,
    /// Optical-flow accelerators.
    pub ofa_engines: u32,
    /// Most instances of this profile one GPU holds.
    pub max_instances: u32,
    /// Valid placement starts (each spans `memory_slices`).
    pub starts: &'static [u32],
}

impl GiProfile {
    /// The compute-instance profile that takes the whole GPU instance (the only one
    /// gpushare creates: one CI per GI, as NVIDIA's DRA driver does).
    pub fn full_ci_profile(&self) -> CiProfileIndex {
        CiProfileIndex(match self.compute_slices {
            1 => 0,
            2 => 1,
            3 => 2,
            4 => 3,
            6 => 6,
            7 => 4,
            _ => 5,
        })
    }

    /// The placement starting at `start`, if it is one of the profile's.
    pub fn placement(&self, start: u32) -> Option<MigPlacement> {
        self.starts.contains(&start).then_some(MigPlacement {
            start,
            size: self.memory_slices,
        })
    }

    /// Every valid placement.
    pub fn placements(&self) -> Vec<MigPlacement> {
        self.starts
            .iter()
            .map(|&start| MigPlacement {
                start,
                size: self.memory_slices,
            })
            .collect()
    }

    /// The `proto` description of a MIG device of this profile at `start`.
    pub fn device_info(&self, uuid: String, start: u32) -> gpushare_proto::MigDeviceInfo {
        gpushare_proto::MigDeviceInfo {
            uuid,
            profile: self.name.to_string(),
            gi_profile_id: self.id.0,
            placement_start: start,
            memory_slices: self.memory_slices,
            memory_mib: self.memory_mib,
            multiprocessors: self.multiprocessors,
            copy_engines: self.copy_engines,
            decoders: self.decoders,
            encoders: self.encoders,
            jpeg_engines: self.jpeg_engines,
            ofa_engines: self.ofa_engines,
            gi_id: None,
            owner: None,
        }
    }
}

/// A MIG-capable GPU model gpushare has profile tables for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MigModel {
    /// A100-SXM4-40GB (p4d), Ampere.
    A100Sxm4_40,
    /// A100-SXM4-80GB (p4de), Ampere.
    A100Sxm4_80,
    /// H100 80GB HBM3 (p5), Hopper.
    H100_80,
    /// H200 141GB (p5e, p5en), Hopper.
    H200,
}

const STARTS_1: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const STARTS_1_2: &[u32] = &[0, 2, 4, 6];
const STARTS_2: &[u32] = &[0, 2, 4];
const STARTS_4: &[u32] = &[0, 4];
const STARTS_0: &[u32] = &[0];

/// `(name, id, index, compute slices, memory slices, MiB, SMs, CE, DEC, ENC, JPG, OFA, max, starts)`.
type Row = (
    &'static str,
    u32,
    u32,
    u32,
    u32,
    u64,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    &'static [u32],
);

// Where the figures come from, table by table (the sources are in the module docs). A100-40GB:
// memory is NVML's `memorySizeMB` (go-nvml's tables, which match real `nvidia-smi mig -lgip`
// outputs: 4864 MiB = 4.75 GiB), SMs and engines the MIG user guide's. Read, not inferred.
#[rustfmt::skip]
const A100_40: &[Row] = &[
    ("1g.5gb",     19, 0, 1, 1,  4864, 14, 1, 0, 0, 0, 0, 7, STARTS_1),
    ("1g.5gb+me",  20, 7, 1, 1,  4864, 14, 1, 1, 0, 1, 1, 1, STARTS_1),
    ("1g.10gb",    15, 9, 1, 2,  9856, 14, 1, 1, 0, 0, 0, 4, STARTS_1_2),
    ("2g.10gb",    14, 1, 2, 2,  9856, 28, 2, 1, 0, 0, 0, 3, STARTS_2),
    ("3g.20gb",     9, 2, 3, 4, 19968, 42, 3, 2, 0, 0, 0, 2, STARTS_4),
    ("4g.20gb",     5, 3, 4, 4, 19968, 56, 4, 2, 0, 0, 0, 1, STARTS_0),
    ("7g.40gb",     0, 4, 7, 8, 40192, 98, 7, 5, 0, 1, 1, 1, STARTS_0),
];

// A100-80GB: IDs, placements, SMs and engines as the A100-40GB (the guide gives the same
// geometry). The memory figures are INFERRED: go-nvml's mock values, while real `-lgip`
// outputs show e.g. 9.50 GiB (9728 MiB) for 1g.10gb, not 9856. tests/gpu/check.sh compares
// them with NVML on a host that has one.
#[rustfmt::skip]
const A100_80: &[Row] = &[
    ("1g.10gb",    19, 0, 1, 1,  9856, 14, 1, 0, 0, 0, 0, 7, STARTS_1),
    ("1g.10gb+me", 20, 7, 1, 1,  9856, 14, 1, 1, 0, 1, 1, 1, STARTS_1),
    ("1g.20gb",    15, 9, 1, 2, 19968, 14, 1, 1, 0, 0, 0, 4, STARTS_1_2),
    ("2g.20gb",    14, 1, 2, 2, 19968, 28, 2, 1, 0, 0, 0, 3, STARTS_2),
    ("3g.40gb",     9, 2, 3, 4, 40192, 42, 3, 2, 0, 0, 0, 2, STARTS_4),
    ("4g.40gb",     5, 3, 4, 4, 40192, 56, 4, 2, 0, 0, 0, 1, STARTS_0),
    ("7g.80gb",     0, 4, 7, 8, 80384, 98, 7, 5, 0, 1, 1, 1, STARTS_0),
];

// H100 80GB HBM3: a real `nvidia-smi mig -lgip` (memory its GiB × 1024, SMs and engines as
// it lists them). Read, not inferred.
#[rustfmt::skip]
const H100_80: &[Row] = &[
    ("1g.10gb",    19, 0, 1, 1,  9984,  16, 1, 1, 0, 1, 0, 7, STARTS_1),
    ("1g.10gb+me", 20, 7, 1, 1,  9984,  16, 1, 1, 0, 1, 1, 1, STARTS_1),
    ("1g.20gb",    15, 9, 1, 2, 20096,  26, 1, 1, 0, 1, 0, 4, STARTS_1_2),
    ("2g.20gb",    14, 1, 2, 2, 20096,  32, 2, 2, 0, 2, 0, 3, STARTS_2),
    ("3g.40gb",     9, 2, 3, 4, 40448,  60, 3, 3, 0, 3, 0, 2, STARTS_4),
    ("4g.40gb",     5, 3, 4, 4, 40448,  64, 4, 4, 0, 4, 0, 1, STARTS_0),
    ("7g.80gb",     0, 4, 7, 8, 81152, 132, 8, 7, 0, 7, 1, 1, STARTS_0),
];

// H200: profiles, instance counts, placements and engines from the MIG user guide; SMs of
// 1g.18gb, 2g.35gb, 3g.71gb and 7g.141gb seen in public outputs. INFERRED: the SMs of
// 1g.35gb (26) and 4g.71gb (64), from H100's geometry, and every memory figure (go-nvml's
// mock values; real outputs show e.g. 16.00 GiB for 1g.18gb, where the mock has 18432 MiB).
// tests/gpu/check.sh compares them with NVML on a lent H200; the counter set's capacities
// (`partitions`) stay sound whatever the figures.
#[rustfmt::skip]
const H200: &[Row] = &[
    ("1g.18gb",    19, 0, 1, 1,  18432,  16, 1, 1, 0, 1, 0, 7, STARTS_1),
    ("1g.18gb+me", 20, 7, 1, 1,  18432,  16, 1, 1, 0, 1, 1, 1, STARTS_1),
    ("1g.35gb",    15, 9, 1, 2,  35840,  26, 1, 1, 0, 1, 0, 4, STARTS_1_2),
    ("2g.35gb",    14, 1, 2, 2,  35840,  32, 2, 2, 0, 2, 0, 3, STARTS_2),
    ("3g.71gb",     9, 2, 3, 4,  72704,  60, 3, 3, 0, 3, 0, 2, STARTS_4),
    ("4g.71gb",     5, 3, 4, 4,  72704,  64, 4, 4, 0, 4, 0, 1, STARTS_0),
    ("7g.141gb",    0, 4, 7, 8, 144384, 132, 8, 7, 0, 7, 1, 1, STARTS_0),
];

/// The model as users know it: the product name NVML reports and `gpushare gpus` shows.
impl fmt::Display for MigModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.product_name())
    }
}

impl MigModel {
    /// Every model, in table order.
    pub const ALL: [MigModel; 4] = [
        MigModel::A100Sxm4_40,
        MigModel::A100Sxm4_80,
        MigModel::H100_80,
        MigModel::H200,
    ];

    /// The model of a GPU by its NVML product name (`NVIDIA A100-SXM4-40GB`,
    /// `NVIDIA H100 80GB HBM3`, `NVIDIA H200`); `None` for GPUs without tables here.
    pub fn from_product_name(name: &str) -> Option<MigModel> {
        let n = name.to_ascii_uppercase();
        if n.contains("A100") && n.contains("40GB") {
            Some(MigModel::A100Sxm4_40)
        } else if n.contains("A100") && n.contains("80GB") {
            Some(MigModel::A100Sxm4_80)
        } else if n.contains("H100") && n.contains("80GB") {
            Some(MigModel::H100_80)
        } else if n.contains("H200") {
            Some(MigModel::H200)
        } else {
            None
        }
    }

    /// The product name NVML reports for the model (`NVIDIA A100-SXM4-40GB`).
    pub fn product_name(self) -> &'static str {
        match self {
            MigModel::A100Sxm4_40 => "NVIDIA A100-SXM4-40GB",
            MigModel::A100Sxm4_80 => "NVIDIA A100-SXM4-80GB",
            MigModel::H100_80 => "NVIDIA H100 80GB HBM3",
            MigModel::H200 => "NVIDIA H200",
        }
    }

    /// Whether MIG mode changes take effect without a GPU reset (Hopper and newer). On Ampere
    /// a change stays pending until a reset or reboot, which cloud VMs may not allow.
    pub fn reset_free_mode_toggle(self) -> bool {
        matches!(self, MigModel::H100_80 | MigModel::H200)
    }

    /// The names of its GPU-instance profiles, smallest first, comma-separated: what an error
    /// naming an unknown profile lists.
    pub fn profile_names(self) -> String {
        self.profiles()
            .iter()
            .map(|p| p.name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Every GPU-instance profile, smallest first.
    pub fn profiles(self) -> Vec<GiProfile> {
        let rows = match self {
            MigModel::A100Sxm4_40 => A100_40,
            MigModel::A100Sxm4_80 => A100_80,
            MigModel::H100_80 => H100_80,
            MigModel::H200 => H200,
        };
        rows.iter()
            .map(
                |&(name, id, index, cs, ms, mib, sm, ce, dec, enc, jpg, ofa, max, starts)| {
                    GiProfile {
                        name,
                        id: GiProfileId(id),
                        index: GiProfileIndex(index),
                        compute_slices: cs,
                        memory_slices: ms,
                        memory_mib: mib,
                        multiprocessors: sm,
                        copy_engines: ce,
                        decoders: dec,
                        encoders: enc,
                        jpeg_engines: jpg,
                        ofa_engines: ofa,
                        max_instances: max,
                        starts,
                    }
                },
            )
            .collect()
    }

    /// The profile with this name (`3g.20gb`).
    pub fn profile_by_name(self, name: &str) -> Option<GiProfile> {
        self.profiles().into_iter().find(|p| p.name == name)
    }

    /// The profile with this ID.
    pub fn profile_by_id(self, id: GiProfileId) -> Option<GiProfile> {
        self.profiles().into_iter().find(|p| p.id == id)
    }

    /// The profile at this NVML index.
    pub fn profile_by_index(self, index: GiProfileIndex) -> Option<GiProfile> {
        self.profiles().into_iter().find(|p| p.index == index)
    }
}

/// A GPU instance that exists (or is asked for) on one GPU, for placement checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Occupied {
    /// Its profile.
    pub profile: GiProfileId,
    /// Its memory slices.
    pub placement: MigPlacement,
}

/// Why a GPU instance cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The profile does not exist on this GPU model, or never starts there: a bad request.
    #[error("{0}")]
    Invalid(String),
    /// The placement is valid but memory slices or the profile's instance count are taken.
    #[error("{0}")]
    Taken(String),
}

/// Checks that a GPU instance of `profile` at `start` can join `existing` on a GPU of
/// `model`: the start is one of the profile's placements (else [`PlacementError::Invalid`]),
/// its memory slices overlap none of `existing`'s and the profile's instance count is not
/// reached (else [`PlacementError::Taken`]). Returns the placement.
///
/// # Errors
/// As above; messages name the profile, placement and what is in the way.
pub fn check_placement(
    model: MigModel,
    profile: GiProfileId,
    start: u32,
    existing: &[Occupied],
) -> Result<MigPlacement, PlacementError> {
    let p = model.profile_by_id(profile).ok_or_else(|| {
        PlacementError::Invalid(format!(
            "GPU-instance profile ID {profile} does not exist on {model} (it has {})",
            model
                .profiles()
                .iter()
                .map(|p| format!("{} = {}", p.name, p.id))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    let placement = p.placement(start).ok_or_else(|| {
        PlacementError::Invalid(format!(
            "{} (profile {}) cannot start at memory slice {start}; its placements are {}",
            p.name,
            p.id,
            p.placements()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    if let Some(o) = existing.iter().find(|o| o.placement.overlaps(&placement)) {
        let other = model
            .profile_by_id(o.profile)
            .map_or_else(|| format!("profile {}", o.profile), |p| p.name.to_string());
        return Err(PlacementError::Taken(format!(
            "{} at {placement} overlaps the {other} GPU instance at {}",
            p.name, o.placement
        )));
    }
    let same = existing.iter().filter(|o| o.profile == p.id).count() as u32;
    if same >= p.max_instances {
        return Err(PlacementError::Taken(format!(
            "a GPU holds at most {} {} GPU instance(s)",
            p.max_instances, p.name
        )));
    }
    Ok(placement)
}

/// A MIG device name as NVIDIA's DRA driver writes it:
/// `gpu-<minor>-mig-<profile without dots>-<GI profile ID>-<placement start>`
/// (`gpu-2-mig-3g20gb-9-4`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigDeviceName {
    /// Parent GPU minor.
    pub minor: u32,
    /// Profile as written in the name (`3g20gb`, `1g5gbme`).
    pub profile: String,
    /// GPU-instance profile ID.
    pub gi_profile: GiProfileId,
    /// Placement start.
    pub start: u32,
}

impl MigDeviceName {
    /// Parses a canonical name; `None` when it is not one.
    pub fn parse(name: &str) -> Option<MigDeviceName> {
        let rest = name.strip_prefix("gpu-")?;
        let (minor, rest) = rest.split_once("-mig-")?;
        let mut parts = rest.rsplitn(3, '-');
        let start = parts.next()?;
        let id = parts.next()?;
        let profile = parts.next()?;
        let num = |s: &str| -> Option<u32> {
            (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .then(|| s.parse().ok())
                .flatten()
        };
        if profile.is_empty()
            || !profile
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return None;
        }
        Some(MigDeviceName {
            minor: num(minor)?,
            profile: profile.to_string(),
            gi_profile: GiProfileId(num(id)?),
            start: num(start)?,
        })
    }

    /// The canonical name of `profile` at `start` on GPU `minor`.
    pub fn format(minor: u32, profile: &GiProfile, start: u32) -> String {
        format!(
            "gpu-{minor}-mig-{}-{}-{start}",
            squash(profile.name),
            profile.id
        )
    }
}

/// A profile name as it appears in device names: lower-case letters and digits only.
pub fn squash(profile: &str) -> String {
    profile
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

#[cfg(test)]
mod tests;
