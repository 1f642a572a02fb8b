//! The CDI spec model: every field a CDI spec file may hold, up to cdiVersion 1.1.0.
//!
//! JSON keys are the ones the CDI specification serializes (`cdiVersion`, `containerEdits`,
//! `hostPath`, `additionalGids`, ...). Decoding is strict: an unknown key anywhere is an error,
//! as in the reference loader. As in Go's decoder, an explicit `null` is read as the field's
//! zero value. Serializing leaves out empty optional fields, like Go's `omitempty`.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

/// Reads `null` (or a missing field, with `#[serde(default)]`) as the type's default value.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// Reads `fileMode`: a number, or (as YAML 1.1 readers such as the reference loader's take an
/// unquoted `0666`) a string of octal digits with a leading `0`.
fn file_mode<'de, D>(deserializer: D) -> Result<Option<u32>, D::Error>
where
    D: Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Number(u32),
        Text(String),
    }
    match Option::<Raw>::deserialize(deserializer)? {
        None => Ok(None),
        Some(Raw::Number(n)) => Ok(Some(n)),
        Some(Raw::Text(t)) => {
            let octal = t
                .strip_prefix('0')
                .filter(|d| !d.is_empty() && d.bytes().all(|b| (b'0'..=b'7').contains(&b)));
            octal
                .and_then(|d| u32::from_str_radix(d, 8).ok())
                .map(Some)
                .ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "invalid fileMode {t:?}: expected a number or an octal 0NNN"
                    ))
                })
        }
    }
}

/// One CDI spec file: a kind (`vendor/class`) and the devices of that kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    /// `cdiVersion`: the spec version the file declares, `0.1.0` to `1.1.0`, a leading `v`
    /// tolerated. It must be at least [`crate::minimum_version`] of the content.
    #[serde(rename = "cdiVersion", default, deserialize_with = "null_as_default")]
    pub cdi_version: String,
    /// `kind`: `vendor/class`, for example `gpushare.io/claim`.
    #[serde(default, deserialize_with = "null_as_default")]
    pub kind: String,
    /// `annotations` (cdiVersion >= 0.6.0): free-form metadata; keys follow Kubernetes'
    /// annotation key rules.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub annotations: BTreeMap<String, String>,
    /// `devices`: at least one, names unique within the spec.
    #[serde(default, deserialize_with = "null_as_default")]
    pub devices: Vec<Device>,
    /// `containerEdits`: spec-level edits, applied once to a container that gets any device
    /// of this spec.
    #[serde(
        rename = "containerEdits",
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "ContainerEdits::is_empty"
    )]
    pub container_edits: ContainerEdits,
}

/// One device of a spec, requested by its qualified name `vendor/class=name`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    /// `name`: letters, digits, `_ - . :`; starts and ends with a letter or digit.
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
    /// `annotations` (cdiVersion >= 0.6.0).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub annotations: BTreeMap<String, String>,
    /// `containerEdits`: must not be empty for a device.
    #[serde(
        rename = "containerEdits",
        default,
        deserialize_with = "null_as_default"
    )]
    pub container_edits: ContainerEdits,
}

/// Changes to an OCI runtime config (`config.json`) that expose a device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerEdits {
    /// `env`: `KEY=VALUE` entries for `process.env` (`=` present and not first).
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub env: Vec<String>,
    /// `deviceNodes`: entries for `linux.devices` (and cgroup allow rules).
    #[serde(
        rename = "deviceNodes",
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub device_nodes: Vec<DeviceNode>,
    /// `hooks`: OCI hooks, each put into the list its `hookName` names.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub hooks: Vec<Hook>,
    /// `mounts`: entries for `mounts`.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub mounts: Vec<Mount>,
    /// `intelRdt` (cdiVersion >= 0.7.0): replaces `linux.intelRdt`.
    #[serde(rename = "intelRdt", default, skip_serializing_if = "Option::is_none")]
    pub intel_rdt: Option<IntelRdt>,
    /// `additionalGids` (cdiVersion >= 0.7.0): added to `process.user.additionalGids`;
    /// 0 is ignored.
    #[serde(
        rename = "additionalGids",
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub additional_gids: Vec<u32>,
    /// `netDevices` (cdiVersion >= 1.1.0): host interfaces moved into the container, set in
    /// `linux.netDevices`.
    #[serde(
        rename = "netDevices",
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub net_devices: Vec<NetDevice>,
}

impl ContainerEdits {
    /// True when no edit of any kind is present (allowed at spec level, refused for a device).
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.hooks.is_empty()
            && self.mounts.is_empty()
            && self.intel_rdt.is_none()
            && self.additional_gids.is_empty()
            && self.net_devices.is_empty()
    }

    /// Appends `other` to these edits, the way the reference library merges the edits of
    /// several devices: lists are concatenated and a later `intelRdt` replaces an earlier one.
    pub fn append(&mut self, other: &ContainerEdits) {
        self.env.extend(other.env.iter().cloned());
        self.device_nodes.extend(other.device_nodes.iter().cloned());
        self.net_devices.extend(other.net_devices.iter().cloned());
        self.hooks.extend(other.hooks.iter().cloned());
        self.mounts.extend(other.mounts.iter().cloned());
        if other.intel_rdt.is_some() {
            self.intel_rdt.clone_from(&other.intel_rdt);
        }
        self.additional_gids
            .extend(other.additional_gids.iter().copied());
    }
}

/// A device node to create in the container (`linux.devices`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceNode {
    /// `path`: where the node appears in the container. Required.
    #[serde(default, deserialize_with = "null_as_default")]
    pub path: String,
    /// `hostPath` (cdiVersion >= 0.5.0): the host node to take type and numbers from;
    /// defaults to `path`.
    #[serde(
        rename = "hostPath",
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub host_path: String,
    /// `type`: `b` (block), `c` or `u` (character), `p` (fifo), or empty (taken from the host).
    #[serde(
        rename = "type",
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub device_type: String,
    /// `major` device number; 0 means "take it from the host node".
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "is_zero_i64"
    )]
    pub major: i64,
    /// `minor` device number.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "is_zero_i64"
    )]
    pub minor: i64,
    /// `fileMode`: permission bits of the node in the container (a number, e.g. 438 = 0o666,
    /// or in YAML the octal `0666`);
    /// taken from the host node when absent.
    #[serde(
        rename = "fileMode",
        default,
        deserialize_with = "file_mode",
        skip_serializing_if = "Option::is_none"
    )]
    pub file_mode: Option<u32>,
    /// `permissions`: cgroup access, a combination of `r`, `w`, `m`; empty means `rwm`,
    /// `none` means no access.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub permissions: String,
    /// `uid` owning the node in the container; defaults to the process uid when that is > 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// `gid` owning the node in the container; defaults to the process gid when that is > 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

fn is_zero_i64(v: &i64) -> bool {
    *v == 0
}

/// A mount to add to the container (`mounts`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    /// `hostPath`: the mount source. Required.
    #[serde(rename = "hostPath", default, deserialize_with = "null_as_default")]
    pub host_path: String,
    /// `containerPath`: the mount destination. Required.
    #[serde(
        rename = "containerPath",
        default,
        deserialize_with = "null_as_default"
    )]
    pub container_path: String,
    /// `options`: mount options such as `bind`, `ro`, `nosuid`.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub options: Vec<String>,
    /// `type` (cdiVersion >= 0.4.0): filesystem type, e.g. `bind` or `tmpfs`.
    #[serde(
        rename = "type",
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub mount_type: String,
}

/// An OCI hook to add.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hook {
    /// `hookName`: `prestart`, `createRuntime`, `createContainer`, `startContainer`,
    /// `poststart` or `poststop`.
    #[serde(rename = "hookName", default, deserialize_with = "null_as_default")]
    pub hook_name: String,
    /// `path` of the program to run. Required (the spec wants it absolute; the reference
    /// library only checks that it is not empty, and so do we).
    #[serde(default, deserialize_with = "null_as_default")]
    pub path: String,
    /// `args`: the full argv, argv\[0\] included.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub args: Vec<String>,
    /// `env`: `KEY=VALUE` entries for the hook.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub env: Vec<String>,
    /// `timeout` in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

/// Intel RDT settings (cdiVersion >= 0.7.0), copied to `linux.intelRdt`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntelRdt {
    /// `closID`: the resctrl class of service (a file name, or `/` for the root class).
    #[serde(
        rename = "closID",
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub clos_id: String,
    /// `l3CacheSchema`, e.g. `L3:0=ff`.
    #[serde(
        rename = "l3CacheSchema",
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub l3_cache_schema: String,
    /// `memBwSchema`, e.g. `MB:0=50`.
    #[serde(
        rename = "memBwSchema",
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "String::is_empty"
    )]
    pub mem_bw_schema: String,
    /// `schemata` (cdiVersion >= 1.1.0): raw resctrl schemata lines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schemata: Option<Vec<String>>,
    /// `enableMonitoring` (cdiVersion >= 1.1.0).
    #[serde(
        rename = "enableMonitoring",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub enable_monitoring: Option<bool>,
    /// `enableCMT` (cdiVersion 0.7.0 to 1.0.0 only; refused from 1.1.0 on).
    #[serde(rename = "enableCMT", default, skip_serializing_if = "Option::is_none")]
    pub enable_cmt: Option<bool>,
    /// `enableMBM` (cdiVersion 0.7.0 to 1.0.0 only; refused from 1.1.0 on).
    #[serde(rename = "enableMBM", default, skip_serializing_if = "Option::is_none")]
    pub enable_mbm: Option<bool>,
}

/// A host network interface to move into the container (cdiVersion >= 1.1.0).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetDevice {
    /// `hostInterfaceName`: the interface on the host. Required, unique within the edits.
    #[serde(
        rename = "hostInterfaceName",
        default,
        deserialize_with = "null_as_default"
    )]
    pub host_interface_name: String,
    /// `name`: its name in the container. Required, unique within the edits.
    #[serde(default, deserialize_with = "null_as_default")]
    pub name: String,
}
