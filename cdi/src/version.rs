//! CDI spec versions and the minimum version a spec's content needs.
//!
//! The rules follow the CDI specification's version table (research notes §2.1):
//!
//! | version | needed when the spec uses |
//! |---|---|
//! | 0.3.0 | (the earliest version [`minimum_version`] returns) |
//! | 0.4.0 | a mount with a `type` |
//! | 0.5.0 | a device node with a `hostPath`, or a device name starting with a digit |
//! | 0.6.0 | any spec or device annotation, or a `.` in the class part of the kind |
//! | 0.7.0 | `intelRdt` or `additionalGids` |
//! | 0.8.0, 1.0.0 | nothing (Go API changes only) |
//! | 1.1.0 | `netDevices`, `intelRdt.schemata`, `intelRdt.enableMonitoring` |

use std::fmt;
use std::str::FromStr;

use crate::model::{ContainerEdits, Spec};

/// A released CDI spec version. Ordered oldest to newest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Version {
    /// 0.1.0
    V0_1_0,
    /// 0.2.0
    V0_2_0,
    /// 0.3.0
    V0_3_0,
    /// 0.4.0: mount `type`.
    V0_4_0,
    /// 0.5.0: device node `hostPath`; device names may start with a digit.
    V0_5_0,
    /// 0.6.0: annotations; dots in the class.
    V0_6_0,
    /// 0.7.0: `intelRdt`, `additionalGids`.
    V0_7_0,
    /// 0.8.0: no spec change.
    V0_8_0,
    /// 1.0.0: no spec change.
    V1_0_0,
    /// 1.1.0: `netDevices`, `intelRdt.schemata`/`enableMonitoring`.
    V1_1_0,
}

impl Version {
    /// Every known version, oldest first.
    pub const ALL: [Version; 10] = [
        Version::V0_1_0,
        Version::V0_2_0,
        Version::V0_3_0,
        Version::V0_4_0,
        Version::V0_5_0,
        Version::V0_6_0,
        Version::V0_7_0,
        Version::V0_8_0,
        Version::V1_0_0,
        Version::V1_1_0,
    ];

    /// The lowest version [`minimum_version`] ever returns. Since a spec must declare at least
    /// its minimum version, specs declaring 0.1.0 or 0.2.0 are always refused (as by the
    /// reference loader), although those versions are known.
    pub const EARLIEST: Version = Version::V0_3_0;

    /// The newest version this crate understands.
    pub const LATEST: Version = Version::V1_1_0;

    /// The version as written in specs, without a leading `v` (e.g. `"0.5.0"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Version::V0_1_0 => "0.1.0",
            Version::V0_2_0 => "0.2.0",
            Version::V0_3_0 => "0.3.0",
            Version::V0_4_0 => "0.4.0",
            Version::V0_5_0 => "0.5.0",
            Version::V0_6_0 => "0.6.0",
            Version::V0_7_0 => "0.7.0",
            Version::V0_8_0 => "0.8.0",
            Version::V1_0_0 => "1.0.0",
            Version::V1_1_0 => "1.1.0",
        }
    }

    /// Parses `"0.5.0"` or `"v0.5.0"` (one leading `v` tolerated). Unknown versions are `None`.
    pub fn parse(text: &str) -> Option<Version> {
        let bare = text.strip_prefix('v').unwrap_or(text);
        Version::ALL.into_iter().find(|v| v.as_str() == bare)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error of [`Version::from_str`]: the text is not a known CDI version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid version {0:?}")]
pub struct UnknownVersion(pub String);

impl FromStr for Version {
    type Err = UnknownVersion;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Version::parse(s).ok_or_else(|| UnknownVersion(s.to_string()))
    }
}

fn all_edits(spec: &Spec) -> impl Iterator<Item = &ContainerEdits> {
    spec.devices
        .iter()
        .map(|d| &d.container_edits)
        .chain(std::iter::once(&spec.container_edits))
}

fn requires_v110(spec: &Spec) -> bool {
    all_edits(spec).any(|e| {
        !e.net_devices.is_empty()
            || e.intel_rdt
                .as_ref()
                .is_some_and(|r| r.schemata.is_some() || r.enable_monitoring == Some(true))
    })
}

fn requires_v070(spec: &Spec) -> bool {
    all_edits(spec).any(|e| e.intel_rdt.is_some() || !e.additional_gids.is_empty())
}

fn requires_v060(spec: &Spec) -> bool {
    if !spec.annotations.is_empty() || spec.devices.iter().any(|d| !d.annotations.is_empty()) {
        return true;
    }
    match spec.kind.split_once('/') {
        Some((_, class)) => class.contains('.'),
        None => false,
    }
}

fn requires_v050(spec: &Spec) -> bool {
    spec.devices
        .iter()
        .any(|d| d.name.as_bytes().first().is_some_and(u8::is_ascii_digit))
        || all_edits(spec).any(|e| e.device_nodes.iter().any(|n| !n.host_path.is_empty()))
}

fn requires_v040(spec: &Spec) -> bool {
    all_edits(spec).any(|e| e.mounts.iter().any(|m| !m.mount_type.is_empty()))
}

/// The lowest spec version whose features cover everything `spec` uses (see the module table).
/// Never lower than [`Version::EARLIEST`]. Producers should declare exactly this version, so
/// that older consumers can read the spec.
pub fn minimum_version(spec: &Spec) -> Version {
    if requires_v110(spec) {
        Version::V1_1_0
    } else if requires_v070(spec) {
        Version::V0_7_0
    } else if requires_v060(spec) {
        Version::V0_6_0
    } else if requires_v050(spec) {
        Version::V0_5_0
    } else if requires_v040(spec) {
        Version::V0_4_0
    } else {
        Version::EARLIEST
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Device, DeviceNode, IntelRdt, Mount, NetDevice};

    fn spec_with(edits: ContainerEdits) -> Spec {
        Spec {
            cdi_version: "0.3.0".into(),
            kind: "example.com/dev".into(),
            devices: vec![Device {
                name: "a".into(),
                container_edits: edits,
                ..Device::default()
            }],
            ..Spec::default()
        }
    }

    #[test]
    fn parse_tolerates_one_leading_v() {
        assert_eq!(Version::parse("0.5.0"), Some(Version::V0_5_0));
        assert_eq!(Version::parse("v1.1.0"), Some(Version::V1_1_0));
        assert_eq!(Version::parse("vv0.5.0"), None);
        assert_eq!(Version::parse("0.5"), None);
        assert_eq!(Version::parse("0.9.0"), None);
        assert_eq!(Version::parse(""), None);
        assert_eq!("0.1.0".parse::<Version>(), Ok(Version::V0_1_0));
        assert!("1.2.0".parse::<Version>().is_err());
        for v in Version::ALL {
            assert_eq!(Version::parse(v.as_str()), Some(v));
            assert_eq!(v.to_string(), v.as_str());
        }
        assert!(Version::ALL.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn minimum_version_of_each_feature() {
        let plain = spec_with(ContainerEdits {
            env: vec!["A=1".into()],
            ..ContainerEdits::default()
        });
        assert_eq!(minimum_version(&plain), Version::V0_3_0);

        let typed_mount = spec_with(ContainerEdits {
            mounts: vec![Mount {
                host_path: "/a".into(),
                container_path: "/b".into(),
                mount_type: "bind".into(),
                ..Mount::default()
            }],
            ..ContainerEdits::default()
        });
        assert_eq!(minimum_version(&typed_mount), Version::V0_4_0);

        let host_path = spec_with(ContainerEdits {
            device_nodes: vec![DeviceNode {
                path: "/dev/a".into(),
                host_path: "/dev/b".into(),
                ..DeviceNode::default()
            }],
            ..ContainerEdits::default()
        });
        assert_eq!(minimum_version(&host_path), Version::V0_5_0);

        let mut digit = plain.clone();
        digit.devices[0].name = "0".into();
        assert_eq!(minimum_version(&digit), Version::V0_5_0);

        let mut annotated = plain.clone();
        annotated.annotations.insert("a".into(), "b".into());
        assert_eq!(minimum_version(&annotated), Version::V0_6_0);
        let mut dev_annotated = plain.clone();
        dev_annotated.devices[0]
            .annotations
            .insert("a".into(), "b".into());
        assert_eq!(minimum_version(&dev_annotated), Version::V0_6_0);
        let mut dotted = plain.clone();
        dotted.kind = "example.com/dev.x".into();
        assert_eq!(minimum_version(&dotted), Version::V0_6_0);

        let mut rdt = plain.clone();
        rdt.container_edits.intel_rdt = Some(IntelRdt {
            clos_id: "c".into(),
            ..IntelRdt::default()
        });
        assert_eq!(minimum_version(&rdt), Version::V0_7_0);
        let mut gids = plain.clone();
        gids.devices[0].container_edits.additional_gids = vec![5];
        assert_eq!(minimum_version(&gids), Version::V0_7_0);

        let mut schemata = plain.clone();
        schemata.devices[0].container_edits.intel_rdt = Some(IntelRdt {
            schemata: Some(vec![]),
            ..IntelRdt::default()
        });
        assert_eq!(minimum_version(&schemata), Version::V1_1_0);
        let mut monitoring = plain.clone();
        monitoring.container_edits.intel_rdt = Some(IntelRdt {
            enable_monitoring: Some(true),
            ..IntelRdt::default()
        });
        assert_eq!(minimum_version(&monitoring), Version::V1_1_0);
        let mut net = plain.clone();
        net.devices[0].container_edits.net_devices = vec![NetDevice {
            host_interface_name: "eth1".into(),
            name: "net0".into(),
        }];
        assert_eq!(minimum_version(&net), Version::V1_1_0);
    }

    #[test]
    fn the_highest_needed_version_wins() {
        let mut spec = spec_with(ContainerEdits {
            mounts: vec![Mount {
                host_path: "/a".into(),
                container_path: "/b".into(),
                mount_type: "bind".into(),
                ..Mount::default()
            }],
            additional_gids: vec![3],
            ..ContainerEdits::default()
        });
        assert_eq!(minimum_version(&spec), Version::V0_7_0);
        spec.devices[0].name = "1".into();
        assert_eq!(minimum_version(&spec), Version::V0_7_0);
    }
}
