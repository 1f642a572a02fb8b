//! Node profiles: what the GPUs of a node are, for the simulated backend. The built-in catalog
//! of EC2 GPU instance types (`catalog.toml` beside this file) and user-written profile files
//! share one format, documented in `docs/node-profiles.md`. Pure: parsing, validation and the
//! expansion into [`Gpu`]s; nothing here touches the host.

use std::path::{Path, PathBuf};

use gpushare_proto::MigDeviceInfo;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::Gpu;

/// The catalog's text, embedded so the binary needs no data files.
const CATALOG: &str = include_str!("catalog.toml");

/// Driver version simulated nodes report unless the profile names one: the 570 branch of the
/// EKS AL2023 NVIDIA AMIs.
pub const DEFAULT_DRIVER_VERSION: &str = "570.172.08";
/// CUDA driver version simulated nodes report unless the profile names one.
pub const DEFAULT_CUDA_DRIVER_VERSION: &str = "12.8";

/// Why a node profile could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Neither a catalog name nor a file.
    #[error(
        "unknown node profile {name:?}; known: {known} (or a profile file path containing '/')"
    )]
    Unknown {
        /// What was asked for.
        name: String,
        /// The catalog's names, comma-separated.
        known: String,
    },
    /// The profile file could not be read.
    #[error("reading node profile {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What failed.
        error: std::io::Error,
    },
    /// Not valid TOML, an unknown key, or a wrong type.
    #[error("node profile {path}: {message}")]
    Parse {
        /// The file (`<catalog>` for the built-in one).
        path: PathBuf,
        /// The TOML library's message, naming the key and line.
        message: String,
    },
    /// Values that do not describe a possible node.
    #[error("node profile {profile}: {message}")]
    Invalid {
        /// The profile's name.
        profile: String,
        /// What is wrong.
        message: String,
    },
}

/// One node: a name and its GPUs, as groups of identical GPUs in minor-number order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeProfile {
    /// Instance type or any label, e.g. `p4d.24xlarge`; shown as `simulated:<name>`.
    pub name: String,
    /// Kernel driver version the GPUs report (default [`DEFAULT_DRIVER_VERSION`]).
    #[serde(default = "default_driver")]
    pub driver_version: String,
    /// CUDA driver version, `major.minor` (default [`DEFAULT_CUDA_DRIVER_VERSION`]).
    #[serde(default = "default_cuda")]
    pub cuda_driver_version: String,
    /// GPU groups; minors are numbered from 0 across groups in this order.
    pub gpus: Vec<GpuGroup>,
}

/// `count` identical GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuGroup {
    /// Product name as NVML reports it, e.g. `NVIDIA A100-SXM4-40GB`.
    pub product_name: String,
    /// Brand as NVML names it (`Nvidia`, `Tesla`, …).
    #[serde(default = "default_brand")]
    pub brand: String,
    /// Architecture, e.g. `Ampere`.
    pub architecture: String,
    /// Total memory in MiB as NVML reports it.
    pub memory_mib: u64,
    /// CUDA compute capability, `major.minor`.
    pub cuda_compute_capability: String,
    /// The GPU supports MIG.
    #[serde(default)]
    pub mig_capable: bool,
    /// MIG mode is enabled (needs `mig_capable`).
    #[serde(default)]
    pub mig_enabled: bool,
    /// MIG devices present on each GPU of the group (needs `mig_enabled`).
    #[serde(default)]
    pub mig_devices: Vec<MigDeviceSpec>,
    /// How many GPUs.
    pub count: u32,
    /// NUMA nodes the group's GPUs are spread over evenly (0 = not reported).
    #[serde(default = "one")]
    pub numa_nodes: u32,
    /// PCI bus IDs, one per GPU; synthesized (`00000000:<minor + 0x10>:00.0`) when absent.
    #[serde(default)]
    pub pci_bus_ids: Vec<String>,
}

/// A MIG device in a profile file; its UUID is derived like simulated GPU UUIDs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigDeviceSpec {
    /// GPU-instance profile name, e.g. `3g.20gb`.
    pub profile: String,
    /// GPU-instance profile ID, e.g. 9.
    pub gi_profile_id: u32,
    /// First memory slice of its placement.
    pub placement_start: u32,
    /// Memory slices the placement spans.
    pub memory_slices: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Copy engines.
    #[serde(default)]
    pub copy_engines: u32,
    /// Video decoders.
    #[serde(default)]
    pub decoders: u32,
    /// Video encoders.
    #[serde(default)]
    pub encoders: u32,
    /// JPEG engines.
    #[serde(default)]
    pub jpeg_engines: u32,
    /// Optical-flow accelerators.
    #[serde(default)]
    pub ofa_engines: u32,
}

fn default_driver() -> String {
    DEFAULT_DRIVER_VERSION.to_string()
}
fn default_cuda() -> String {
    DEFAULT_CUDA_DRIVER_VERSION.to_string()
}
fn default_brand() -> String {
    "Nvidia".to_string()
}
fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Catalog {
    profile: Vec<NodeProfile>,
}

/// Every profile of the built-in catalog, in catalog order.
///
/// # Errors
/// Only if the embedded catalog is broken (a test loads it).
pub fn catalog() -> Result<Vec<NodeProfile>, ProfileError> {
    let c: Catalog = toml::from_str(CATALOG).map_err(|e| ProfileError::Parse {
        path: PathBuf::from("<catalog>"),
        message: one_line(&e),
    })?;
    for p in &c.profile {
        p.validate()?;
    }
    Ok(c.profile)
}

fn one_line(e: &toml::de::Error) -> String {
    e.to_string().trim_end().replace('\n', " ")
}

/// Resolves `--simulate`'s value: a value containing `/` is a profile file, anything else a
/// catalog name.
///
/// # Errors
/// [`ProfileError::Unknown`] (listing the catalog), or the file's read, parse or validation
/// error.
pub fn resolve(name_or_path: &str) -> Result<NodeProfile, ProfileError> {
    if name_or_path.contains('/') {
        return NodeProfile::load(Path::new(name_or_path));
    }
    let all = catalog()?;
    let known = all
        .iter()
        .map(|p| p.name.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    all.iter()
        .find(|p| p.name == name_or_path)
        .cloned()
        .ok_or(ProfileError::Unknown {
            name: name_or_path.to_string(),
            known,
        })
}

impl NodeProfile {
    /// Parses a profile file's text; `path` only names it in errors.
    ///
    /// # Errors
    /// [`ProfileError::Parse`] or [`ProfileError::Invalid`].
    pub fn parse(text: &str, path: &Path) -> Result<NodeProfile, ProfileError> {
        let p: NodeProfile = toml::from_str(text).map_err(|e| ProfileError::Parse {
            path: path.to_path_buf(),
            message: one_line(&e),
        })?;
        p.validate()?;
        Ok(p)
    }

    /// Reads and parses a profile file.
    ///
    /// # Errors
    /// As [`NodeProfile::parse`], plus [`ProfileError::Read`].
    pub fn load(path: &Path) -> Result<NodeProfile, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|error| ProfileError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        NodeProfile::parse(&text, path)
    }

    fn validate(&self) -> Result<(), ProfileError> {
        let invalid = |message: String| ProfileError::Invalid {
            profile: self.name.clone(),
            message,
        };
        if self.name.trim().is_empty() {
            return Err(invalid("name must not be empty".into()));
        }
        for (what, v) in [
            ("driver_version", &self.driver_version),
            ("cuda_driver_version", &self.cuda_driver_version),
        ] {
            if !is_dotted_numbers(v) {
                return Err(invalid(format!(
                    "{what} {v:?} must be dot-separated numbers"
                )));
            }
        }
        let total: u64 = self.gpus.iter().map(|g| u64::from(g.count)).sum();
        if total == 0 || total > 64 {
            return Err(invalid(format!("{total} GPUs; a node has 1 to 64")));
        }
        for (i, g) in self.gpus.iter().enumerate() {
            let at = |m: String| invalid(format!("gpus[{i}] ({}): {m}", g.product_name));
            if g.product_name.trim().is_empty() || g.architecture.trim().is_empty() {
                return Err(at("product_name and architecture must not be empty".into()));
            }
            if g.memory_mib == 0 {
                return Err(at("memory_mib must be positive".into()));
            }
            if parse_cc(&g.cuda_compute_capability).is_none() {
                return Err(at(format!(
                    "cuda_compute_capability {:?} must be major.minor",
                    g.cuda_compute_capability
                )));
            }
            if g.mig_enabled && !g.mig_capable {
                return Err(at("mig_enabled needs mig_capable".into()));
            }
            if !g.mig_devices.is_empty() && !g.mig_enabled {
                return Err(at("mig_devices need mig_enabled".into()));
            }
            let mut used = [false; 8];
            for m in &g.mig_devices {
                let end = m.placement_start + m.memory_slices;
                if m.memory_slices == 0 || end > 8 {
                    return Err(at(format!(
                        "MIG device {} at {}:{} lies outside the 8 memory slices",
                        m.profile, m.placement_start, m.memory_slices
                    )));
                }
                for s in m.placement_start..end {
                    if std::mem::replace(&mut used[s as usize], true) {
                        return Err(at(format!(
                            "MIG device {} at {}:{} overlaps another",
                            m.profile, m.placement_start, m.memory_slices
                        )));
                    }
                }
                if m.memory_mib > g.memory_mib {
                    return Err(at(format!(
                        "MIG device {} has more memory than its GPU",
                        m.profile
                    )));
                }
            }
            if !g.pci_bus_ids.is_empty() && g.pci_bus_ids.len() != g.count as usize {
                return Err(at(format!(
                    "{} pci_bus_ids for {} GPUs",
                    g.pci_bus_ids.len(),
                    g.count
                )));
            }
        }
        Ok(())
    }

    /// The node's GPUs, minors from 0, UUIDs derived from `node_name` (stable across restarts,
    /// different per node).
    pub fn gpus(&self, node_name: &str) -> Vec<Gpu> {
        let mut out = Vec::new();
        for g in &self.gpus {
            for i in 0..g.count {
                let minor = out.len() as u32;
                let uuid = simulated_uuid(node_name, minor);
                let mig_devices = g
                    .mig_devices
                    .iter()
                    .map(|m| MigDeviceInfo {
                        uuid: format!(
                            "MIG-{}",
                            &simulated_uuid(
                                &format!("{node_name}/{minor}"),
                                m.gi_profile_id * 8 + m.placement_start
                            )[4..]
                        ),
                        profile: m.profile.clone(),
                        gi_profile_id: m.gi_profile_id,
                        placement_start: m.placement_start,
                        memory_slices: m.memory_slices,
                        memory_mib: m.memory_mib,
                        multiprocessors: m.multiprocessors,
                        copy_engines: m.copy_engines,
                        decoders: m.decoders,
                        encoders: m.encoders,
                        jpeg_engines: m.jpeg_engines,
                        ofa_engines: m.ofa_engines,
                        gi_id: None,
                        owner: None,
                    })
                    .collect();
                out.push(Gpu {
                    minor,
                    uuid,
                    product_name: g.product_name.clone(),
                    memory_mib: g.memory_mib,
                    compute_capability: parse_cc(&g.cuda_compute_capability).unwrap_or_default(),
                    brand: g.brand.clone(),
                    architecture: g.architecture.clone(),
                    driver_version: self.driver_version.clone(),
                    cuda_driver_version: self.cuda_driver_version.clone(),
                    pci_bus_id: g
                        .pci_bus_ids
                        .get(i as usize)
                        .cloned()
                        .unwrap_or_else(|| format!("00000000:{:02X}:00.0", minor + 0x10)),
                    numa_node: (g.numa_nodes > 0).then(|| i * g.numa_nodes / g.count),
                    mig_capable: g.mig_capable,
                    mig_enabled: g.mig_enabled,
                    mig_devices,
                });
            }
        }
        out
    }
}

fn is_dotted_numbers(s: &str) -> bool {
    !s.is_empty()
        && s.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `"8.0"` → `(8, 0)`.
pub fn parse_cc(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// `GPU-` plus a UUID-shaped rendering of SHA-256(node name, minor): stable across restarts
/// and different on every node, as real UUIDs are.
pub fn simulated_uuid(node_name: &str, minor: u32) -> String {
    let digest = Sha256::digest(format!("gpushare-sim/{node_name}/{minor}").as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
#[path = "catalog_tests.rs"]
mod tests;
