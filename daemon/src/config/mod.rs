//! Claim input, parsed and validated without touching the host (pure).
//!
//! Three forms are understood, as `../../docs/claims.md` describes: NVIDIA's `GpuConfig` /
//! `MigDeviceConfig` opaque parameters (strict, NVIDIA's defaults and validation), the short
//! `sharingMode` form, and whole `ResourceClaim` objects of `resource.k8s.io` v1, v1beta1 and
//! v1beta2 in JSON or YAML.

use std::collections::BTreeMap;
use std::fmt;

use gpushare_proto::{ErrorCode, TimeSliceInterval};

mod nvidia;
mod quantity;
mod resource_claim;
mod short;
mod value;

#[cfg(test)]
mod tests;

pub use nvidia::{NvidiaKind, NVIDIA_API_VERSION, UNSUPPORTED_NVIDIA_KINDS};
pub use quantity::{bytes_to_mib, parse_quantity_bytes, QuantityError, MAX_BYTES, MIB};
pub(crate) use resource_claim::is_request_name;
pub use resource_claim::{
    claim_uid_problem, is_mig_device, parse_claim, parse_claim_document, parse_parameters,
    validate_claim_uid, ConfigKind, CLAIM_API_VERSIONS, MAX_CLAIM_UID_BYTES,
};

/// The DRA driver name served by default (NVIDIA's GPU driver name).
pub const DEFAULT_DRIVER: &str = "gpu.nvidia.com";

/// What `parse_claim` needs to know about the node.
#[derive(Debug, Clone)]
pub struct ParseContext {
    /// Pool name every allocation result for our drivers must carry (the node name).
    pub node_name: String,
    /// DRA driver names we serve (`gpu.nvidia.com` by default).
    pub drivers: Vec<String>,
}

/// A claim reduced to what the daemon acts on.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimSpec {
    /// `metadata.uid`, validated as safe for paths and CDI names.
    pub uid: String,
    /// `metadata.namespace` (may be empty).
    pub namespace: String,
    /// `metadata.name` (may be empty).
    pub name: String,
    /// Allocation results for our drivers, in allocation order.
    pub results: Vec<AllocatedDevice>,
    /// Device groups: results sharing one config object, in order of first result.
    pub groups: Vec<DeviceGroup>,
}

/// One allocation result for one of our drivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocatedDevice {
    /// Request name (may be `parent/sub` for a prioritized-list subrequest).
    pub request: String,
    /// Driver name.
    pub driver: String,
    /// Pool (already checked to equal the node name).
    pub pool: String,
    /// Device name (`gpu-<minor>`, `gpu-<minor>-mig-…`, or a GPU UUID).
    pub device: String,
}

/// Results that share one config object: one strategy applied once for all of them.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceGroup {
    /// Indices into [`ClaimSpec::results`].
    pub results: Vec<usize>,
    /// Sharing to apply.
    pub sharing: Sharing,
}

/// The sharing strategy of a device group.
#[derive(Debug, Clone, PartialEq)]
pub enum Sharing {
    /// No sharing config: the GPUs belong to the claim alone.
    Exclusive,
    /// Time-slicing with this interval; `replicas` caps attached containers (short form).
    TimeSlicing {
        /// Interval for every GPU of the group.
        interval: TimeSliceInterval,
        /// Most containers attached to the claim at once.
        replicas: Option<u32>,
    },
    /// One MPS control daemon for the group.
    Mps {
        /// Limits to apply.
        settings: MpsSettings,
        /// Most containers attached to the claim at once (short form).
        replicas: Option<u32>,
    },
    /// A MIG slice, created at prepare (`strategy::mig`).
    Mig {
        /// Profile such as `3g.20gb`, when given.
        profile: Option<String>,
        /// MPS on the slice (`MigDeviceConfig` with strategy MPS).
        mps: Option<MpsSettings>,
    },
}

impl Sharing {
    /// Most containers attached to the claim at once, where the config caps them
    /// (`replicas`, the short form's); a MIG slice or a whole GPU has no cap.
    pub fn replicas(&self) -> Option<u32> {
        match self {
            Sharing::TimeSlicing { replicas, .. } | Sharing::Mps { replicas, .. } => *replicas,
            Sharing::Exclusive | Sharing::Mig { .. } => None,
        }
    }
}

/// MPS limits as configured (NVIDIA `MpsConfig`, normalized).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MpsSettings {
    /// `defaultActiveThreadPercentage`, 1–100.
    pub active_thread_percentage: Option<u32>,
    /// `defaultPinnedDeviceMemoryLimit` in whole MiB (≥ 1).
    pub default_pinned_limit_mib: Option<u64>,
    /// `defaultPerDevicePinnedMemoryLimit`: key → MiB (≥ 1), keys not yet resolved.
    pub per_device_pinned_limit_mib: BTreeMap<DeviceKey, u64>,
    /// `multiUser`: start the control daemon with `-M`.
    pub multi_user: bool,
}

/// A key of `defaultPerDevicePinnedMemoryLimit`: an index into the group's sorted UUIDs, or
/// one of the group's GPU UUIDs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceKey {
    /// Index into the group's sorted UUID list (= CUDA ordinal inside the MPS daemon).
    Index(usize),
    /// A GPU UUID (`GPU-…`).
    Uuid(String),
}

/// A refused claim: stable code plus a message naming field and value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ConfigError {
    /// Stable code (`InvalidConfig`, `InvalidRequest`, `WrongNode`, …).
    pub code: ErrorCode,
    /// One line naming the field and value.
    pub message: String,
}

impl ConfigError {
    /// An error with this code and message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ConfigError {
            code,
            message: message.into(),
        }
    }

    /// An `InvalidConfig` error: a sharing config is malformed or out of range.
    pub fn invalid_config(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidConfig, message)
    }

    /// An `InvalidRequest` error: the claim object or document itself is malformed.
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }
}

impl ParseContext {
    /// A context for node `node_name` serving only [`DEFAULT_DRIVER`].
    pub fn new(node_name: impl Into<String>) -> Self {
        ParseContext {
            node_name: node_name.into(),
            drivers: vec![DEFAULT_DRIVER.to_owned()],
        }
    }
}

impl AllocatedDevice {
    /// Whether the device is a MIG device (`gpu-<minor>-mig-…` or `MIG-…`), see [`is_mig_device`].
    pub fn is_mig(&self) -> bool {
        is_mig_device(&self.device)
    }
}

impl fmt::Display for DeviceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceKey::Index(i) => write!(f, "index {i}"),
            DeviceKey::Uuid(uuid) => f.write_str(uuid),
        }
    }
}

impl MpsSettings {
    /// Pinned device memory limit per CUDA ordinal, in MiB, for a group whose GPU UUIDs sorted
    /// ascending are `sorted_uuids` (the order of `CUDA_VISIBLE_DEVICES` given to the MPS
    /// control daemon, so index = CUDA ordinal, as in NVIDIA's DRA driver).
    ///
    /// Each entry is the `defaultPerDevicePinnedMemoryLimit` entry for that device (by index or
    /// UUID) if any, else `defaultPinnedDeviceMemoryLimit`, else `None` (no limit). An index
    /// past the end of the list, a UUID not in it, or two keys naming one device are refused
    /// with `InvalidConfig` naming `defaultPerDevicePinnedMemoryLimit` and the key.
    pub fn resolve_pinned_limits(
        &self,
        sorted_uuids: &[String],
    ) -> Result<Vec<Option<u64>>, ConfigError> {
        let field = "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit";
        let mut limits = vec![self.default_pinned_limit_mib; sorted_uuids.len()];
        let mut set_by: Vec<Option<&DeviceKey>> = vec![None; sorted_uuids.len()];
        for (key, mib) in &self.per_device_pinned_limit_mib {
            let ordinal = match key {
                DeviceKey::Index(i) if *i < sorted_uuids.len() => *i,
                DeviceKey::Index(i) => {
                    return Err(ConfigError::invalid_config(format!(
                        "{field}: key \"{i}\" is not a valid device index: the group has {} device(s){}",
                        sorted_uuids.len(),
                        match sorted_uuids.len() {
                            0 => String::new(),
                            n => format!(", indices 0 to {}", n - 1),
                        }
                    )))
                }
                DeviceKey::Uuid(uuid) => sorted_uuids
                    .iter()
                    .position(|u| u == uuid)
                    .ok_or_else(|| {
                        ConfigError::invalid_config(format!(
                            "{field}: key \"{uuid}\" is not one of the group's devices ({})",
                            sorted_uuids.join(", ")
                        ))
                    })?,
            };
            if let Some(Some(previous)) = set_by.get(ordinal) {
                return Err(ConfigError::invalid_config(format!(
                    "{field}: keys \"{}\" and \"{}\" both name device {ordinal} ({})",
                    key_text(previous),
                    key_text(key),
                    sorted_uuids.get(ordinal).map_or("", String::as_str)
                )));
            }
            if let (Some(slot), Some(by)) = (limits.get_mut(ordinal), set_by.get_mut(ordinal)) {
                *slot = Some(*mib);
                *by = Some(key);
            }
        }
        Ok(limits)
    }
}

/// A per-device key as the user wrote it (`"1"` or the UUID).
fn key_text(key: &DeviceKey) -> String {
    match key {
        DeviceKey::Index(i) => i.to_string(),
        DeviceKey::Uuid(uuid) => uuid.clone(),
    }
}
