//! Validation of specs and container edits, with the rules of the reference loader:
//! version, kind, annotations, edits, device names, duplicates.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use crate::model::{ContainerEdits, DeviceNode, Hook, IntelRdt, Mount, NetDevice, Spec};
use crate::name::{parse_kind, validate_device_name, NameError};
use crate::version::{minimum_version, Version};

/// The hook names a CDI spec may use, one per OCI hook list.
pub const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// The `permissions` value that grants no cgroup access at all.
pub const NO_PERMISSIONS: &str = "none";

/// Why a set of container edits is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditsError {
    /// An env entry has no `=`, or starts with it.
    #[error("invalid environment variable {0:?}")]
    Env(String),
    /// A device node breaks a rule.
    #[error("device {path:?}: {reason}")]
    DeviceNode {
        /// The node's `path`.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A hook breaks a rule.
    #[error("invalid hook {name:?}: {reason}")]
    Hook {
        /// The hook's `hookName`.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A mount lacks its host or container path.
    #[error("invalid mount: {0}")]
    Mount(&'static str),
    /// `intelRdt.closID` is not a valid resctrl group name.
    #[error("invalid intelRdt: {0}")]
    IntelRdt(&'static str),
    /// A net device lacks a name or repeats one.
    #[error("invalid net device: {0}")]
    NetDevice(String),
}

/// Why a spec could not be loaded. Messages name the offending value.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The file could not be read.
    #[error("failed to read CDI spec {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file name is not `*.json` or `*.yaml`.
    #[error("not a CDI spec file name (want *.json or *.yaml): {0}")]
    Extension(PathBuf),
    /// The data is not a spec: bad syntax, wrong type, or an unknown field.
    #[error("failed to unmarshal CDI spec: {0}")]
    Parse(String),
    /// `cdiVersion` is not a known version.
    #[error("invalid version {0:?}")]
    UnknownVersion(String),
    /// The declared version is lower than what the content needs.
    #[error("the spec version must be at least v{required} (declared {declared:?})")]
    VersionTooLow {
        /// The `cdiVersion` as written.
        declared: String,
        /// What the content needs ([`minimum_version`]).
        required: Version,
    },
    /// A field present is not allowed at the declared version.
    #[error("{0}")]
    VersionedField(String),
    /// `kind` is not a valid `vendor/class`.
    #[error("invalid kind: {0}")]
    Kind(NameError),
    /// Spec or device annotations break Kubernetes' annotation rules.
    #[error("invalid annotations {path}: {reason}")]
    Annotations {
        /// Where: `annotations` or `<device>.annotations`.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The spec-level container edits are invalid.
    #[error("invalid container edits: {0}")]
    Edits(EditsError),
    /// A device is invalid.
    #[error("failed add device {name:?}: {reason}")]
    Device {
        /// The device name as written.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// Two devices share a name.
    #[error("invalid spec, multiple device {0:?}")]
    DuplicateDevice(String),
    /// The spec has no device.
    #[error("invalid spec, no devices")]
    NoDevices,
}

/// Checks an env list: every entry is `KEY=VALUE` with a non-empty key.
pub fn validate_env(env: &[String]) -> Result<(), EditsError> {
    match env
        .iter()
        .find(|v| !matches!(v.find('='), Some(i) if i > 0))
    {
        Some(bad) => Err(EditsError::Env(bad.clone())),
        None => Ok(()),
    }
}

fn validate_device_node(node: &DeviceNode) -> Result<(), EditsError> {
    let err = |reason: String| EditsError::DeviceNode {
        path: node.path.clone(),
        reason,
    };
    if node.path.is_empty() {
        return Err(err("invalid (empty) device path".into()));
    }
    if !matches!(node.device_type.as_str(), "" | "b" | "c" | "u" | "p") {
        return Err(err(format!("invalid type {:?}", node.device_type)));
    }
    if node.major < 0 || node.minor < 0 {
        return Err(err(format!(
            "invalid (negative) device number {}:{}",
            node.major, node.minor
        )));
    }
    let perms = node.permissions.as_str();
    if perms != NO_PERMISSIONS && !perms.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
        return Err(err(format!("invalid permissions {perms:?}")));
    }
    Ok(())
}

fn validate_hook(hook: &Hook) -> Result<(), EditsError> {
    let err = |reason: String| EditsError::Hook {
        name: hook.hook_name.clone(),
        reason,
    };
    if !HOOK_NAMES.contains(&hook.hook_name.as_str()) {
        return Err(err("unknown hook name".into()));
    }
    if hook.path.is_empty() {
        return Err(err("empty path".into()));
    }
    validate_env(&hook.env).map_err(|e| err(e.to_string()))
}

fn validate_mount(mount: &Mount) -> Result<(), EditsError> {
    if mount.host_path.is_empty() {
        return Err(EditsError::Mount("empty host path"));
    }
    if mount.container_path.is_empty() {
        return Err(EditsError::Mount("empty container path"));
    }
    Ok(())
}

fn validate_intel_rdt(rdt: &IntelRdt) -> Result<(), EditsError> {
    let c = rdt.clos_id.as_str();
    if c != "/" && (c.len() >= 4096 || c == "." || c == ".." || c.contains(['/', '\n'])) {
        return Err(EditsError::IntelRdt("invalid closID"));
    }
    Ok(())
}

fn validate_net_devices(devices: &[NetDevice]) -> Result<(), EditsError> {
    let mut hosts = HashSet::new();
    let mut names = HashSet::new();
    for dev in devices {
        if dev.host_interface_name.is_empty() {
            return Err(EditsError::NetDevice("empty hostInterfaceName".into()));
        }
        if dev.name.is_empty() {
            return Err(EditsError::NetDevice("empty name".into()));
        }
        if !hosts.insert(dev.host_interface_name.as_str()) {
            return Err(EditsError::NetDevice(format!(
                "duplicate hostInterfaceName {:?}",
                dev.host_interface_name
            )));
        }
        if !names.insert(dev.name.as_str()) {
            return Err(EditsError::NetDevice(format!(
                "duplicate name {:?}",
                dev.name
            )));
        }
    }
    Ok(())
}

/// Checks container edits: env entries, device nodes (path, type, numbers, permissions),
/// hooks (known name, path, env), mounts (both paths), `intelRdt.closID`, net devices.
pub fn validate_edits(edits: &ContainerEdits) -> Result<(), EditsError> {
    validate_env(&edits.env)?;
    edits
        .device_nodes
        .iter()
        .try_for_each(validate_device_node)?;
    edits.hooks.iter().try_for_each(validate_hook)?;
    edits.mounts.iter().try_for_each(validate_mount)?;
    if let Some(rdt) = &edits.intel_rdt {
        validate_intel_rdt(rdt)?;
    }
    validate_net_devices(&edits.net_devices)
}

/// DNS-1123 subdomain: lowercase alphanumeric labels with inner `-`, joined by `.`, ≤ 253.
fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// Kubernetes qualified name: `[prefix/]name`, name ≤ 63 chars of `[A-Za-z0-9_.-]`,
/// alphanumeric at both ends; prefix a DNS-1123 subdomain.
fn check_qualified_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split('/').collect::<Vec<_>>()[..] {
        [name] => (None, name),
        [prefix, name] => (Some(prefix), name),
        _ => return Err(format!("{key:?}: a qualified name has at most one '/'")),
    };
    if let Some(prefix) = prefix {
        if !is_dns1123_subdomain(prefix) {
            return Err(format!("{key:?}: prefix must be a DNS-1123 subdomain"));
        }
    }
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{key:?}: name part must be 1-63 characters of [A-Za-z0-9_.-], alphanumeric at both ends"
        ))
    }
}

/// Total size of all annotation keys and values, as Kubernetes limits it (256 KiB).
const ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

/// Checks annotations with Kubernetes' rules: each key (lowercased) a qualified name,
/// total size of keys and values at most 256 KiB. `path` names the map in errors.
pub fn validate_annotations(
    annotations: &BTreeMap<String, String>,
    path: &str,
) -> Result<(), SpecError> {
    let err = |reason: String| SpecError::Annotations {
        path: path.to_string(),
        reason,
    };
    let mut total = 0usize;
    for (key, value) in annotations {
        check_qualified_key(&key.to_ascii_lowercase()).map_err(err)?;
        total += key.len() + value.len();
    }
    if total > ANNOTATION_SIZE_LIMIT {
        return Err(err(format!(
            "total size {total} exceeds {ANNOTATION_SIZE_LIMIT} bytes"
        )));
    }
    Ok(())
}

/// Checks fields whose presence alone is tied to a version range (`intelRdt.enableCMT`
/// and `enableMBM` are gone from 1.1.0; `schemata` and `enableMonitoring` need it).
fn validate_versioned_fields(spec: &Spec, version: Version) -> Result<(), SpecError> {
    let edits = std::iter::once(("containerEdits".to_string(), &spec.container_edits)).chain(
        spec.devices
            .iter()
            .enumerate()
            .map(|(i, d)| (format!("devices[{i}].containerEdits"), &d.container_edits)),
    );
    for (path, e) in edits {
        let Some(rdt) = &e.intel_rdt else { continue };
        let removed = [
            ("enableCMT", rdt.enable_cmt.is_some()),
            ("enableMBM", rdt.enable_mbm.is_some()),
        ];
        let added = [
            ("schemata", rdt.schemata.is_some()),
            ("enableMonitoring", rdt.enable_monitoring.is_some()),
        ];
        if version >= Version::V1_1_0 {
            if let Some((field, _)) = removed.iter().find(|(_, present)| *present) {
                return Err(SpecError::VersionedField(format!(
                    "{path}.intelRdt.{field} is not valid for CDI spec version {version}"
                )));
            }
        } else if let Some((field, _)) = added.iter().find(|(_, present)| *present) {
            return Err(SpecError::VersionedField(format!(
                "{path}.intelRdt.{field} requires CDI spec version at least 1.1.0"
            )));
        }
    }
    Ok(())
}

/// Validates a decoded spec the way the reference loader does, in this order: the version
/// is known and at least [`minimum_version`]; version-bound fields; the kind; spec
/// annotations; spec-level edits; each device (name, annotations, non-empty and valid edits);
/// no duplicate device names; at least one device.
pub fn validate_spec(spec: &Spec) -> Result<(), SpecError> {
    let version = Version::parse(&spec.cdi_version)
        .ok_or_else(|| SpecError::UnknownVersion(spec.cdi_version.clone()))?;
    validate_versioned_fields(spec, version)?;
    let required = minimum_version(spec);
    if required > version {
        return Err(SpecError::VersionTooLow {
            declared: spec.cdi_version.clone(),
            required,
        });
    }
    parse_kind(&spec.kind).map_err(SpecError::Kind)?;
    validate_annotations(&spec.annotations, "annotations")?;
    validate_edits(&spec.container_edits).map_err(SpecError::Edits)?;

    let mut seen = HashSet::new();
    for device in &spec.devices {
        let dev_err = |reason: String| SpecError::Device {
            name: device.name.clone(),
            reason,
        };
        validate_device_name(&device.name).map_err(|e| dev_err(e.to_string()))?;
        validate_annotations(&device.annotations, &format!("{}.annotations", device.name))
            .map_err(|e| dev_err(e.to_string()))?;
        if device.container_edits.is_empty() {
            return Err(dev_err("invalid device, empty device edits".into()));
        }
        validate_edits(&device.container_edits).map_err(|e| dev_err(e.to_string()))?;
        if !seen.insert(device.name.as_str()) {
            return Err(SpecError::DuplicateDevice(device.name.clone()));
        }
    }
    if spec.devices.is_empty() {
        return Err(SpecError::NoDevices);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{parse_spec, SpecFormat};

    fn spec(json: &str) -> Spec {
        parse_spec(json.as_bytes(), SpecFormat::Json).unwrap()
    }

    fn check(json: &str) -> Result<(), SpecError> {
        validate_spec(&spec(json))
    }

    fn with_edits(version: &str, edits: &str) -> String {
        format!(
            r#"{{"cdiVersion":"{version}","kind":"example.com/dev","devices":[{{"name":"d","containerEdits":{edits}}}]}}"#
        )
    }

    #[test]
    fn versions() {
        assert!(check(&with_edits("0.3.0", r#"{"env":["A=1"]}"#)).is_ok());
        assert!(check(&with_edits("v0.3.0", r#"{"env":["A=1"]}"#)).is_ok());
        // 0.1.0 and 0.2.0 are known versions, but every spec needs at least 0.3.0, so the
        // reference loader (and this one) refuses any spec declaring them.
        assert!(matches!(
            check(&with_edits("0.1.0", r#"{"env":["A=1"]}"#)),
            Err(SpecError::VersionTooLow {
                required: Version::V0_3_0,
                ..
            })
        ));
        assert!(check(&with_edits("1.1.0", r#"{"env":["A=1"]}"#)).is_ok());
        assert!(matches!(
            check(&with_edits("0.9.0", r#"{"env":["A=1"]}"#)),
            Err(SpecError::UnknownVersion(v)) if v == "0.9.0"
        ));
        assert!(matches!(
            check(&with_edits("", r#"{"env":["A=1"]}"#)),
            Err(SpecError::UnknownVersion(_))
        ));
        let low = check(&with_edits(
            "0.3.0",
            r#"{"mounts":[{"hostPath":"/a","containerPath":"/b","type":"bind"}]}"#,
        ))
        .unwrap_err();
        assert!(matches!(
            low,
            SpecError::VersionTooLow {
                required: Version::V0_4_0,
                ..
            }
        ));
        assert!(low.to_string().contains("at least v0.4.0"), "{low}");
    }

    #[test]
    fn version_bound_intel_rdt_fields() {
        assert!(check(&with_edits(
            "0.7.0",
            r#"{"intelRdt":{"closID":"a","enableCMT":true}}"#
        ))
        .is_ok());
        assert!(matches!(
            check(&with_edits("1.1.0", r#"{"intelRdt":{"closID":"a","enableMBM":false}}"#)),
            Err(SpecError::VersionedField(m)) if m.contains("enableMBM")
        ));
        assert!(matches!(
            check(&with_edits("1.0.0", r#"{"intelRdt":{"enableMonitoring":false}}"#)),
            Err(SpecError::VersionedField(m)) if m.contains("enableMonitoring")
        ));
        assert!(check(&with_edits(
            "1.1.0",
            r#"{"intelRdt":{"schemata":["L3:0=f"],"enableMonitoring":true}}"#
        ))
        .is_ok());
    }

    #[test]
    fn kinds() {
        let bad = r#"{"cdiVersion":"0.3.0","kind":"dev","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}"#;
        assert!(matches!(check(bad), Err(SpecError::Kind(_))));
        let bad = r#"{"cdiVersion":"0.3.0","kind":"_ex.com/dev","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}"#;
        assert!(matches!(
            check(bad),
            Err(SpecError::Kind(NameError::Vendor { .. }))
        ));
        // A dot in the class needs 0.6.0 ...
        let dotted = r#"{"cdiVersion":"0.5.0","kind":"ex.com/dev.x","devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}"#;
        assert!(matches!(
            check(dotted),
            Err(SpecError::VersionTooLow {
                required: Version::V0_6_0,
                ..
            })
        ));
        // ... and is fine with it.
        assert!(check(&dotted.replace("0.5.0", "0.6.0")).is_ok());
    }

    #[test]
    fn devices() {
        let no_devices = r#"{"cdiVersion":"0.3.0","kind":"ex.com/dev","devices":[]}"#;
        assert!(matches!(check(no_devices), Err(SpecError::NoDevices)));
        let missing = r#"{"cdiVersion":"0.3.0","kind":"ex.com/dev"}"#;
        assert!(matches!(check(missing), Err(SpecError::NoDevices)));
        let dup = r#"{"cdiVersion":"0.3.0","kind":"ex.com/dev","devices":[
            {"name":"d","containerEdits":{"env":["A=1"]}},{"name":"d","containerEdits":{"env":["A=2"]}}]}"#;
        assert!(matches!(check(dup), Err(SpecError::DuplicateDevice(d)) if d == "d"));
        let empty_edits = r#"{"cdiVersion":"0.3.0","kind":"ex.com/dev","devices":[{"name":"d","containerEdits":{}}]}"#;
        assert!(
            matches!(check(empty_edits), Err(SpecError::Device { reason, .. }) if reason.contains("empty device edits"))
        );
        let no_edits = r#"{"cdiVersion":"0.3.0","kind":"ex.com/dev","devices":[{"name":"d"}]}"#;
        assert!(matches!(check(no_edits), Err(SpecError::Device { .. })));
        let bad_name = r#"{"cdiVersion":"0.3.0","kind":"ex.com/dev","devices":[{"name":"d!","containerEdits":{"env":["A=1"]}}]}"#;
        assert!(matches!(check(bad_name), Err(SpecError::Device { name, .. }) if name == "d!"));
        // A digit-first name needs 0.5.0.
        let digit = r#"{"cdiVersion":"0.4.0","kind":"ex.com/dev","devices":[{"name":"0","containerEdits":{"env":["A=1"]}}]}"#;
        assert!(matches!(
            check(digit),
            Err(SpecError::VersionTooLow {
                required: Version::V0_5_0,
                ..
            })
        ));
        // Spec-level edits may be empty.
        let spec_level_empty = r#"{"cdiVersion":"0.3.0","kind":"ex.com/dev","containerEdits":{},"devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}"#;
        assert!(check(spec_level_empty).is_ok());
    }

    #[test]
    fn env_rules() {
        assert!(validate_env(&["A=".into(), "B=c=d".into()]).is_ok());
        assert_eq!(
            validate_env(&["=x".into()]),
            Err(EditsError::Env("=x".into()))
        );
        assert_eq!(
            validate_env(&["NOEQ".into()]),
            Err(EditsError::Env("NOEQ".into()))
        );
        assert!(matches!(
            check(&with_edits("0.3.0", r#"{"env":["BAD"]}"#)),
            Err(SpecError::Device { reason, .. }) if reason.contains("\"BAD\"")
        ));
        let spec_level = r#"{"cdiVersion":"0.3.0","kind":"ex.com/dev","containerEdits":{"env":["=1"]},"devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}"#;
        assert!(matches!(
            check(spec_level),
            Err(SpecError::Edits(EditsError::Env(_)))
        ));
    }

    #[test]
    fn device_node_rules() {
        let ok =
            |e: &str| validate_edits(&spec(&with_edits("0.5.0", e)).devices[0].container_edits);
        assert!(ok(r#"{"deviceNodes":[{"path":"/dev/x","type":"c","major":1,"minor":3,"permissions":"rw"}]}"#).is_ok());
        assert!(ok(r#"{"deviceNodes":[{"path":"/dev/x","permissions":"none"}]}"#).is_ok());
        assert!(ok(r#"{"deviceNodes":[{"path":"/dev/x","type":"u","major":1}]}"#).is_ok());
        assert!(ok(r#"{"deviceNodes":[{"path":"/dev/x","type":"p"}]}"#).is_ok());
        for bad in [
            r#"{"deviceNodes":[{"path":""}]}"#,
            r#"{"deviceNodes":[{"hostPath":"/dev/x"}]}"#,
            r#"{"deviceNodes":[{"path":"/dev/x","type":"x"}]}"#,
            r#"{"deviceNodes":[{"path":"/dev/x","major":-1}]}"#,
            r#"{"deviceNodes":[{"path":"/dev/x","minor":-1}]}"#,
            r#"{"deviceNodes":[{"path":"/dev/x","permissions":"rwx"}]}"#,
        ] {
            assert!(
                matches!(ok(bad), Err(EditsError::DeviceNode { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn hook_mount_rdt_and_net_rules() {
        let edits =
            |v: &str, e: &str| validate_edits(&spec(&with_edits(v, e)).devices[0].container_edits);
        for name in HOOK_NAMES {
            let e = format!(r#"{{"hooks":[{{"hookName":"{name}","path":"/bin/true"}}]}}"#);
            assert!(edits("0.3.0", &e).is_ok(), "{name}");
        }
        assert!(matches!(
            edits(
                "0.3.0",
                r#"{"hooks":[{"hookName":"preStart","path":"/x"}]}"#
            ),
            Err(EditsError::Hook { .. })
        ));
        assert!(matches!(
            edits("0.3.0", r#"{"hooks":[{"hookName":"prestart","path":""}]}"#),
            Err(EditsError::Hook { .. })
        ));
        assert!(matches!(
            edits(
                "0.3.0",
                r#"{"hooks":[{"hookName":"prestart","path":"/x","env":["X"]}]}"#
            ),
            Err(EditsError::Hook { .. })
        ));
        assert!(matches!(
            edits(
                "0.3.0",
                r#"{"mounts":[{"hostPath":"","containerPath":"/b"}]}"#
            ),
            Err(EditsError::Mount(_))
        ));
        assert!(matches!(
            edits(
                "0.3.0",
                r#"{"mounts":[{"hostPath":"/a","containerPath":""}]}"#
            ),
            Err(EditsError::Mount(_))
        ));
        assert!(edits("0.7.0", r#"{"intelRdt":{"closID":"/"}}"#).is_ok());
        assert!(edits("0.7.0", r#"{"intelRdt":{}}"#).is_ok());
        for bad in ["a/b", ".", "..", "a\nb"] {
            let e = format!(
                r#"{{"intelRdt":{{"closID":{}}}}}"#,
                serde_json::to_string(bad).unwrap()
            );
            assert!(
                matches!(edits("0.7.0", &e), Err(EditsError::IntelRdt(_))),
                "{bad}"
            );
        }
        assert!(edits("1.1.0", r#"{"netDevices":[{"hostInterfaceName":"a","name":"b"},{"hostInterfaceName":"c","name":"d"}]}"#).is_ok());
        for bad in [
            r#"{"netDevices":[{"hostInterfaceName":"","name":"b"}]}"#,
            r#"{"netDevices":[{"hostInterfaceName":"a","name":""}]}"#,
            r#"{"netDevices":[{"hostInterfaceName":"a","name":"b"},{"hostInterfaceName":"a","name":"c"}]}"#,
            r#"{"netDevices":[{"hostInterfaceName":"a","name":"b"},{"hostInterfaceName":"c","name":"b"}]}"#,
        ] {
            assert!(
                matches!(edits("1.1.0", bad), Err(EditsError::NetDevice(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn annotation_rules() {
        let mut a = BTreeMap::new();
        a.insert("gpushare.io/claim-uid".to_string(), "x".to_string());
        a.insert("simple".to_string(), "y".to_string());
        a.insert("Upper.Case_ok".to_string(), "y".to_string());
        assert!(validate_annotations(&a, "annotations").is_ok());
        for bad in [
            "",
            "a/b/c",
            "-x",
            "x-",
            "/x",
            "x/",
            "bad_prefix!/x",
            &"n".repeat(64),
        ] {
            let mut m = BTreeMap::new();
            m.insert(bad.to_string(), String::new());
            assert!(validate_annotations(&m, "annotations").is_err(), "{bad:?}");
        }
        let mut big = BTreeMap::new();
        big.insert("k".to_string(), "v".repeat(ANNOTATION_SIZE_LIMIT));
        assert!(validate_annotations(&big, "annotations").is_err());
        let spec_json = r#"{"cdiVersion":"0.6.0","kind":"ex.com/dev","annotations":{"bad key":"x"},"devices":[{"name":"d","containerEdits":{"env":["A=1"]}}]}"#;
        assert!(matches!(
            check(spec_json),
            Err(SpecError::Annotations { .. })
        ));
        let dev_json = r#"{"cdiVersion":"0.6.0","kind":"ex.com/dev","devices":[{"name":"d","annotations":{"bad key":"x"},"containerEdits":{"env":["A=1"]}}]}"#;
        assert!(matches!(check(dev_json), Err(SpecError::Device { .. })));
    }
}
