//! Applying container edits to an OCI runtime config (`config.json`), with the semantics of
//! the reference CDI library (research notes §2.5). The config is a [`serde_json::Value`], so
//! fields this crate does not know survive untouched (object keys come back sorted).
//!
//! Order of application, all from one merged set of edits:
//! 1. `env` → `process.env`: an entry whose key (text before the first `=`) is already there
//!    replaces that entry in place; otherwise it is appended. (Research §2.5 says "appended";
//!    the current reference library replaces existing keys, and so do we. podman 4.3's
//!    vendored copy only collapses keys repeated within the CDI edits.)
//! 2. `deviceNodes` → `linux.devices`: see [`fill_device_node`]; `uid`/`gid` default to
//!    `process.user.uid`/`gid` when those are > 0; the first device with the same path is
//!    removed, then the node replaces another one with its path or is appended; `b` and `c`
//!    nodes also get a `linux.resources.devices` allow rule with their `permissions`
//!    (empty → `rwm`, `none` → no access letters).
//! 3. `netDevices` → `linux.netDevices[hostInterfaceName] = {"name": name}`.
//! 4. `mounts` → `mounts`: the first mount with the same destination is removed and the new
//!    one appended; then all mounts are stably sorted by the number of `/` in their cleaned
//!    destination. (The user-namespace id-mapping of bind mounts done by newer reference
//!    versions is not applied.)
//! 5. `hooks` → appended to `hooks.<hookName>`.
//! 6. `intelRdt` → replaces `linux.intelRdt`.
//! 7. `additionalGids` → appended to `process.user.additionalGids` unless 0 or already there.

use std::collections::HashMap;
use std::io;
use std::path::Path;

use serde_json::{json, Map, Value};

use crate::model::{ContainerEdits, DeviceNode, Hook, Mount};
use crate::validate::{validate_edits, EditsError, NO_PERMISSIONS};

/// What `lstat` tells about a host device node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDeviceInfo {
    /// `"b"` (block), `"c"` (character) or `"p"` (fifo).
    pub device_type: &'static str,
    /// Major device number (0 for a fifo).
    pub major: i64,
    /// Minor device number (0 for a fifo).
    pub minor: i64,
    /// Permission bits of the node (`st_mode` without the file type bits, so at most 0o7777).
    pub file_mode: u32,
}

/// Where device-node facts come from. [`HostFs`] asks the kernel; tests can supply fakes.
pub trait HostDevices {
    /// `lstat`s `path` (symlinks are not followed). A path that exists but is not a block,
    /// character or fifo node is an error of kind [`io::ErrorKind::InvalidInput`].
    fn device_info(&self, path: &Path) -> io::Result<HostDeviceInfo>;
}

/// The real host: `lstat(2)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostFs;

impl HostDevices for HostFs {
    fn device_info(&self, path: &Path) -> io::Result<HostDeviceInfo> {
        use nix::sys::stat::{lstat, major, minor, SFlag};
        let st = lstat(path).map_err(io::Error::from)?;
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        let device_type = if kind == SFlag::S_IFBLK {
            "b"
        } else if kind == SFlag::S_IFCHR {
            "c"
        } else if kind == SFlag::S_IFIFO {
            "p"
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a device node",
            ));
        };
        let (maj, min) = if device_type == "p" {
            (0, 0)
        } else {
            (major(st.st_rdev), minor(st.st_rdev))
        };
        Ok(HostDeviceInfo {
            device_type,
            major: i64::try_from(maj).unwrap_or(i64::MAX),
            minor: i64::try_from(min).unwrap_or(i64::MAX),
            file_mode: st.st_mode & !SFlag::S_IFMT.bits(),
        })
    }
}

/// Why edits could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The edits themselves are invalid (checked before anything is changed).
    #[error("invalid container edits: {0}")]
    Invalid(#[from] EditsError),
    /// The host node of a device that is not fully specified could not be examined.
    #[error("failed to stat CDI host device {host_path:?}: {source}")]
    Stat {
        /// The host path that was `lstat`ed.
        host_path: String,
        /// Why it failed (missing, or not a device node).
        source: io::Error,
    },
    /// The declared node type differs from the host node's.
    #[error("CDI device ({path:?}, {host_path:?}), host type mismatch ({declared}, {actual})")]
    TypeMismatch {
        /// Container path.
        path: String,
        /// Host path.
        host_path: String,
        /// The type in the spec.
        declared: String,
        /// The type on the host.
        actual: &'static str,
    },
    /// The OCI config has an unexpected shape (e.g. `process.env` is not an array).
    #[error("invalid OCI config: {0}")]
    Config(String),
}

/// Completes a device node from its host node, as the reference library does:
/// `hostPath` defaults to `path`; the host path is `lstat`ed; a failure is an error unless the
/// node is minimally specified (a type, and a major number unless it is a fifo); a missing
/// `fileMode` is taken from the host even for a minimally specified node; otherwise a missing
/// type is taken from the host and must match it, and for `b`/`c` a zero major takes both
/// numbers from the host.
pub fn fill_device_node(
    node: &DeviceNode,
    host: &dyn HostDevices,
) -> Result<DeviceNode, ApplyError> {
    let mut node = node.clone();
    let minimal = !node.device_type.is_empty() && (node.major != 0 || node.device_type == "p");
    if node.host_path.is_empty() {
        node.host_path.clone_from(&node.path);
    }
    let info = match host.device_info(Path::new(&node.host_path)) {
        Ok(info) => info,
        Err(_) if minimal => return Ok(node),
        Err(source) => {
            return Err(ApplyError::Stat {
                host_path: node.host_path,
                source,
            })
        }
    };
    if node.file_mode.is_none() {
        node.file_mode = Some(info.file_mode);
    }
    if minimal {
        return Ok(node);
    }
    if node.device_type.is_empty() {
        node.device_type = info.device_type.to_string();
    }
    if node.device_type != info.device_type {
        return Err(ApplyError::TypeMismatch {
            path: node.path,
            host_path: node.host_path,
            declared: node.device_type,
            actual: info.device_type,
        });
    }
    if node.device_type != "p" && node.major == 0 {
        node.major = info.major;
        node.minor = info.minor;
    }
    Ok(node)
}

/// `filepath.Clean` for `/`-separated paths: drops empty and `.` elements, resolves `..`
/// lexically, keeps a leading `/`; the empty path becomes `.`.
fn clean_path(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.last().is_some_and(|p| *p != "..") {
                    parts.pop();
                } else if !rooted {
                    parts.push("..");
                }
            }
            p => parts.push(p),
        }
    }
    let joined = parts.join("/");
    if rooted {
        format!("/{joined}")
    } else if joined.is_empty() {
        ".".to_string()
    } else {
        joined
    }
}

/// The sort key of a mount destination: the number of `/` in the cleaned path
/// (`/` and `/a` are 1, `/a/b` is 2).
pub fn mount_depth(destination: &str) -> usize {
    clean_path(destination).matches('/').count()
}

fn object_field<'a>(
    parent: &'a mut Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<&'a mut Map<String, Value>, ApplyError> {
    let slot = parent
        .entry(key)
        .or_insert_with(|| Value::Object(Map::new()));
    if slot.is_null() {
        *slot = Value::Object(Map::new());
    }
    slot.as_object_mut()
        .ok_or_else(|| ApplyError::Config(format!("{path} is not an object")))
}

fn array_field<'a>(
    parent: &'a mut Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<&'a mut Vec<Value>, ApplyError> {
    let slot = parent
        .entry(key)
        .or_insert_with(|| Value::Array(Vec::new()));
    if slot.is_null() {
        *slot = Value::Array(Vec::new());
    }
    slot.as_array_mut()
        .ok_or_else(|| ApplyError::Config(format!("{path} is not an array")))
}

fn env_key(entry: &str) -> &str {
    entry.split_once('=').map_or(entry, |(k, _)| k)
}

fn apply_env(root: &mut Map<String, Value>, env: &[String]) -> Result<(), ApplyError> {
    let process = object_field(root, "process", "process")?;
    let list = array_field(process, "env", "process.env")?;
    let mut index: HashMap<String, usize> = HashMap::new();
    for (i, entry) in list.iter().enumerate() {
        let text = entry
            .as_str()
            .ok_or_else(|| ApplyError::Config("process.env has a non-string entry".into()))?;
        index.insert(env_key(text).to_string(), i);
    }
    for entry in env {
        let key = env_key(entry).to_string();
        match index.get(&key) {
            Some(&i) => list[i] = Value::String(entry.clone()),
            None => {
                list.push(Value::String(entry.clone()));
                index.insert(key, list.len() - 1);
            }
        }
    }
    Ok(())
}

/// `process.user.uid` and `.gid` when `process` is present (missing numbers read as 0).
fn process_ids(root: &Map<String, Value>) -> Option<(u64, u64)> {
    let process = root.get("process").filter(|p| !p.is_null())?;
    let id = |key: &str| {
        process
            .get("user")
            .and_then(|u| u.get(key))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    Some((id("uid"), id("gid")))
}

fn device_to_oci(node: &DeviceNode, ids: Option<(u64, u64)>) -> Value {
    let mut dev = Map::new();
    dev.insert("path".into(), json!(node.path));
    dev.insert("type".into(), json!(node.device_type));
    dev.insert("major".into(), json!(node.major));
    dev.insert("minor".into(), json!(node.minor));
    if let Some(mode) = node.file_mode {
        dev.insert("fileMode".into(), json!(mode));
    }
    let (puid, pgid) = ids.unwrap_or((0, 0));
    match node.uid {
        Some(uid) => {
            dev.insert("uid".into(), json!(uid));
        }
        None if puid > 0 => {
            dev.insert("uid".into(), json!(puid));
        }
        None => {}
    }
    match node.gid {
        Some(gid) => {
            dev.insert("gid".into(), json!(gid));
        }
        None if pgid > 0 => {
            dev.insert("gid".into(), json!(pgid));
        }
        None => {}
    }
    Value::Object(dev)
}

fn apply_device_nodes(
    root: &mut Map<String, Value>,
    nodes: &[DeviceNode],
    host: &dyn HostDevices,
) -> Result<(), ApplyError> {
    let ids = process_ids(root);
    for node in nodes {
        let filled = fill_device_node(node, host)?;
        let dev = device_to_oci(&filled, ids);
        let linux = object_field(root, "linux", "linux")?;
        let devices = array_field(linux, "devices", "linux.devices")?;
        let same_path = |d: &Value| d.get("path").and_then(Value::as_str) == Some(&filled.path);
        if let Some(i) = devices.iter().position(same_path) {
            devices.remove(i);
        }
        match devices.iter().position(same_path) {
            Some(i) => devices[i] = dev,
            None => devices.push(dev),
        }
        if filled.device_type == "b" || filled.device_type == "c" {
            let access = match node.permissions.as_str() {
                "" => "rwm",
                NO_PERMISSIONS => "",
                other => other,
            };
            let mut rule = Map::new();
            rule.insert("allow".into(), json!(true));
            rule.insert("type".into(), json!(filled.device_type));
            rule.insert("major".into(), json!(filled.major));
            rule.insert("minor".into(), json!(filled.minor));
            if !access.is_empty() {
                rule.insert("access".into(), json!(access));
            }
            let resources = object_field(linux, "resources", "linux.resources")?;
            array_field(resources, "devices", "linux.resources.devices")?.push(Value::Object(rule));
        }
    }
    Ok(())
}

fn mount_to_oci(mount: &Mount) -> Value {
    let mut m = Map::new();
    m.insert("destination".into(), json!(mount.container_path));
    if !mount.mount_type.is_empty() {
        m.insert("type".into(), json!(mount.mount_type));
    }
    m.insert("source".into(), json!(mount.host_path));
    if !mount.options.is_empty() {
        m.insert("options".into(), json!(mount.options));
    }
    Value::Object(m)
}

fn apply_mounts(root: &mut Map<String, Value>, mounts: &[Mount]) -> Result<(), ApplyError> {
    let list = array_field(root, "mounts", "mounts")?;
    for mount in mounts {
        if let Some(i) = list.iter().position(|m| {
            m.get("destination").and_then(Value::as_str) == Some(&mount.container_path)
        }) {
            list.remove(i);
        }
        list.push(mount_to_oci(mount));
    }
    list.sort_by_key(|m| mount_depth(m.get("destination").and_then(Value::as_str).unwrap_or("")));
    Ok(())
}

fn hook_to_oci(hook: &Hook) -> Value {
    let mut h = Map::new();
    h.insert("path".into(), json!(hook.path));
    if !hook.args.is_empty() {
        h.insert("args".into(), json!(hook.args));
    }
    if !hook.env.is_empty() {
        h.insert("env".into(), json!(hook.env));
    }
    if let Some(timeout) = hook.timeout {
        h.insert("timeout".into(), json!(timeout));
    }
    Value::Object(h)
}

/// Applies validated, merged edits to an OCI runtime config in place, using `host` for
/// device-node facts. On error the config may be partly edited: callers that need all or
/// nothing should edit a copy (as [`crate::Registry::inject`] does).
pub fn apply_edits_with(
    config: &mut Value,
    edits: &ContainerEdits,
    host: &dyn HostDevices,
) -> Result<(), ApplyError> {
    validate_edits(edits)?;
    let root = config
        .as_object_mut()
        .ok_or_else(|| ApplyError::Config("the config is not a JSON object".into()))?;

    if !edits.env.is_empty() {
        apply_env(root, &edits.env)?;
    }
    apply_device_nodes(root, &edits.device_nodes, host)?;
    if !edits.net_devices.is_empty() {
        let linux = object_field(root, "linux", "linux")?;
        let net = object_field(linux, "netDevices", "linux.netDevices")?;
        for dev in &edits.net_devices {
            net.insert(dev.host_interface_name.clone(), json!({ "name": dev.name }));
        }
    }
    if !edits.mounts.is_empty() {
        apply_mounts(root, &edits.mounts)?;
    }
    for hook in &edits.hooks {
        let hooks = object_field(root, "hooks", "hooks")?;
        let path = format!("hooks.{}", hook.hook_name);
        array_field(hooks, &hook.hook_name, &path)?.push(hook_to_oci(hook));
    }
    if let Some(rdt) = &edits.intel_rdt {
        let mut r = Map::new();
        for (key, value) in [
            ("closID", &rdt.clos_id),
            ("l3CacheSchema", &rdt.l3_cache_schema),
            ("memBwSchema", &rdt.mem_bw_schema),
        ] {
            if !value.is_empty() {
                r.insert(key.into(), json!(value));
            }
        }
        if let Some(schemata) = rdt.schemata.as_ref().filter(|s| !s.is_empty()) {
            r.insert("schemata".into(), json!(schemata));
        }
        for (key, value) in [
            ("enableMonitoring", rdt.enable_monitoring),
            ("enableCMT", rdt.enable_cmt),
            ("enableMBM", rdt.enable_mbm),
        ] {
            if value == Some(true) {
                r.insert(key.into(), json!(true));
            }
        }
        let linux = object_field(root, "linux", "linux")?;
        linux.insert("intelRdt".into(), Value::Object(r));
    }
    let gids: Vec<u32> = edits
        .additional_gids
        .iter()
        .copied()
        .filter(|g| *g != 0)
        .collect();
    if !gids.is_empty() {
        let process = object_field(root, "process", "process")?;
        let user = object_field(process, "user", "process.user")?;
        let list = array_field(user, "additionalGids", "process.user.additionalGids")?;
        for gid in gids {
            if !list.iter().any(|g| g.as_u64() == Some(u64::from(gid))) {
                list.push(json!(gid));
            }
        }
    }
    Ok(())
}

/// [`apply_edits_with`] on the real host ([`HostFs`]).
pub fn apply_edits(config: &mut Value, edits: &ContainerEdits) -> Result<(), ApplyError> {
    apply_edits_with(config, edits, &HostFs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{IntelRdt, NetDevice};

    /// Fake host nodes, keyed by path.
    struct FakeHost(HashMap<&'static str, HostDeviceInfo>);

    impl HostDevices for FakeHost {
        fn device_info(&self, path: &Path) -> io::Result<HostDeviceInfo> {
            let key = path.to_str().unwrap_or_default();
            self.0
                .get(key)
                .cloned()
                .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
        }
    }

    fn fake() -> FakeHost {
        let mut m = HashMap::new();
        m.insert(
            "/dev/gpu0",
            HostDeviceInfo {
                device_type: "c",
                major: 195,
                minor: 0,
                file_mode: 0o666,
            },
        );
        m.insert(
            "/dev/sda",
            HostDeviceInfo {
                device_type: "b",
                major: 8,
                minor: 0,
                file_mode: 0o660,
            },
        );
        m.insert(
            "/dev/fifo",
            HostDeviceInfo {
                device_type: "p",
                major: 0,
                minor: 0,
                file_mode: 0o600,
            },
        );
        m.insert(
            "/host/dev/gpu1",
            HostDeviceInfo {
                device_type: "c",
                major: 195,
                minor: 1,
                file_mode: 0o4666,
            },
        );
        FakeHost(m)
    }

    fn node(path: &str) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            ..DeviceNode::default()
        }
    }

    fn base() -> Value {
        json!({
            "ociVersion": "1.0.2",
            "process": {"user": {"uid": 0, "gid": 0}, "env": ["PATH=/bin", "TERM=xterm"], "args": ["sh"]},
            "root": {"path": "rootfs"},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
                {"destination": "/dev/pts", "type": "devpts", "source": "devpts"},
                {"destination": "/sys", "type": "sysfs", "source": "sysfs"}
            ],
            "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}, "namespaces": [{"type": "mount"}]},
            "x-unknown": {"kept": [1, 2, 3]}
        })
    }

    fn apply(config: &mut Value, edits: &ContainerEdits) -> Result<(), ApplyError> {
        apply_edits_with(config, edits, &fake())
    }

    #[test]
    fn fill_takes_type_numbers_and_mode_from_the_host() {
        let n = fill_device_node(&node("/dev/gpu0"), &fake()).unwrap();
        assert_eq!(
            (n.device_type.as_str(), n.major, n.minor, n.file_mode),
            ("c", 195, 0, Some(0o666))
        );
        assert_eq!(n.host_path, "/dev/gpu0");
        let n = fill_device_node(
            &DeviceNode {
                path: "/dev/gpu1".into(),
                host_path: "/host/dev/gpu1".into(),
                ..DeviceNode::default()
            },
            &fake(),
        )
        .unwrap();
        assert_eq!((n.major, n.minor, n.file_mode), (195, 1, Some(0o4666)));
        assert_eq!(n.path, "/dev/gpu1");
        let n = fill_device_node(&node("/dev/fifo"), &fake()).unwrap();
        assert_eq!((n.device_type.as_str(), n.major, n.minor), ("p", 0, 0));
    }

    #[test]
    fn fill_keeps_what_the_spec_says() {
        // Type given, major 0: numbers still come from the host; fileMode given: kept.
        let n = fill_device_node(
            &DeviceNode {
                path: "/dev/gpu0".into(),
                device_type: "c".into(),
                file_mode: Some(0o600),
                ..DeviceNode::default()
            },
            &fake(),
        )
        .unwrap();
        assert_eq!((n.major, n.minor, n.file_mode), (195, 0, Some(0o600)));
        // Minimally specified: host numbers are not used, but the mode is filled in.
        let n = fill_device_node(
            &DeviceNode {
                path: "/dev/gpu0".into(),
                device_type: "c".into(),
                major: 10,
                minor: 7,
                ..DeviceNode::default()
            },
            &fake(),
        )
        .unwrap();
        assert_eq!((n.major, n.minor, n.file_mode), (10, 7, Some(0o666)));
        // Minimally specified and missing on the host: fine, nothing filled.
        let n = fill_device_node(
            &DeviceNode {
                path: "/dev/none".into(),
                device_type: "c".into(),
                major: 10,
                minor: 7,
                ..DeviceNode::default()
            },
            &fake(),
        )
        .unwrap();
        assert_eq!((n.file_mode, n.host_path.as_str()), (None, "/dev/none"));
        let n = fill_device_node(
            &DeviceNode {
                path: "/dev/none".into(),
                device_type: "p".into(),
                ..DeviceNode::default()
            },
            &fake(),
        )
        .unwrap();
        assert_eq!(n.major, 0);
    }

    #[test]
    fn fill_errors() {
        let err = fill_device_node(&node("/dev/none"), &fake()).unwrap_err();
        assert!(matches!(err, ApplyError::Stat { ref host_path, .. } if host_path == "/dev/none"));
        assert!(
            err.to_string()
                .starts_with("failed to stat CDI host device \"/dev/none\""),
            "{err}"
        );
        // Type given without a major is not minimal: the host must have it.
        let err = fill_device_node(
            &DeviceNode {
                path: "/dev/none".into(),
                device_type: "c".into(),
                ..DeviceNode::default()
            },
            &fake(),
        )
        .unwrap_err();
        assert!(matches!(err, ApplyError::Stat { .. }));
        let err = fill_device_node(
            &DeviceNode {
                path: "/dev/sda".into(),
                device_type: "c".into(),
                ..DeviceNode::default()
            },
            &fake(),
        )
        .unwrap_err();
        assert!(
            matches!(err, ApplyError::TypeMismatch { actual: "b", .. }),
            "{err}"
        );
        // "u" with no major is compared to the host's "c" and refused, as in the reference.
        let err = fill_device_node(
            &DeviceNode {
                path: "/dev/gpu0".into(),
                device_type: "u".into(),
                ..DeviceNode::default()
            },
            &fake(),
        )
        .unwrap_err();
        assert!(matches!(err, ApplyError::TypeMismatch { .. }));
    }

    #[test]
    fn real_host_nodes() {
        let info = HostFs.device_info(Path::new("/dev/null")).unwrap();
        assert_eq!((info.device_type, info.major, info.minor), ("c", 1, 3));
        assert_eq!(info.file_mode & 0o777, 0o666);
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o640)).unwrap();
        let info = HostFs.device_info(&fifo).unwrap();
        assert_eq!(
            (info.device_type, info.major, info.file_mode & 0o777),
            ("p", 0, 0o640 & !current_umask())
        );
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        assert_eq!(
            HostFs.device_info(&file).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            HostFs
                .device_info(&dir.path().join("none"))
                .unwrap_err()
                .kind(),
            io::ErrorKind::NotFound
        );
        // lstat: a symlink to a device is not a device.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("/dev/null", &link).unwrap();
        assert!(HostFs.device_info(&link).is_err());
    }

    fn current_umask() -> u32 {
        use nix::sys::stat::{umask, Mode};
        let old = umask(Mode::empty());
        umask(old);
        old.bits()
    }

    #[test]
    fn env_replaces_existing_keys_and_appends_new_ones() {
        let mut c = base();
        let edits = ContainerEdits {
            env: vec![
                "A=1".into(),
                "TERM=cdi".into(),
                "A=2".into(),
                "B=x=y".into(),
            ],
            ..ContainerEdits::default()
        };
        apply(&mut c, &edits).unwrap();
        assert_eq!(
            c["process"]["env"],
            json!(["PATH=/bin", "TERM=cdi", "A=2", "B=x=y"])
        );
        // A config without a process gets one.
        let mut c = json!({});
        apply(&mut c, &edits).unwrap();
        assert_eq!(c["process"]["env"], json!(["A=2", "TERM=cdi", "B=x=y"]));
    }

    #[test]
    fn device_nodes_and_cgroup_rules() {
        let mut c = base();
        c["linux"]["devices"] = json!([
            {"path": "/dev/gpu0", "type": "c", "major": 1, "minor": 1},
            {"path": "/dev/other", "type": "c", "major": 1, "minor": 2}
        ]);
        let edits = ContainerEdits {
            device_nodes: vec![
                node("/dev/gpu0"),
                DeviceNode {
                    path: "/dev/disk".into(),
                    host_path: "/dev/sda".into(),
                    permissions: "r".into(),
                    ..DeviceNode::default()
                },
                DeviceNode {
                    path: "/dev/fifo".into(),
                    ..DeviceNode::default()
                },
                DeviceNode {
                    path: "/dev/nope".into(),
                    device_type: "c".into(),
                    major: 5,
                    minor: 6,
                    permissions: "none".into(),
                    uid: Some(7),
                    gid: Some(8),
                    file_mode: Some(0o600),
                    ..DeviceNode::default()
                },
            ],
            ..ContainerEdits::default()
        };
        apply(&mut c, &edits).unwrap();
        assert_eq!(
            c["linux"]["devices"],
            json!([
                {"path": "/dev/other", "type": "c", "major": 1, "minor": 2},
                {"path": "/dev/gpu0", "type": "c", "major": 195, "minor": 0, "fileMode": 0o666},
                {"path": "/dev/disk", "type": "b", "major": 8, "minor": 0, "fileMode": 0o660},
                {"path": "/dev/fifo", "type": "p", "major": 0, "minor": 0, "fileMode": 0o600},
                {"path": "/dev/nope", "type": "c", "major": 5, "minor": 6, "fileMode": 0o600, "uid": 7, "gid": 8}
            ])
        );
        assert_eq!(
            c["linux"]["resources"]["devices"],
            json!([
                {"allow": false, "access": "rwm"},
                {"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rwm"},
                {"allow": true, "type": "b", "major": 8, "minor": 0, "access": "r"},
                {"allow": true, "type": "c", "major": 5, "minor": 6}
            ])
        );
    }

    #[test]
    fn duplicate_device_paths_in_the_config() {
        // The first same-path device is removed, a second one is replaced in place.
        let mut c = base();
        c["linux"]["devices"] = json!([
            {"path": "/dev/gpu0", "type": "c", "major": 1, "minor": 1},
            {"path": "/dev/a", "type": "c", "major": 1, "minor": 2},
            {"path": "/dev/gpu0", "type": "c", "major": 1, "minor": 3},
            {"path": "/dev/b", "type": "c", "major": 1, "minor": 4}
        ]);
        apply(
            &mut c,
            &ContainerEdits {
                device_nodes: vec![node("/dev/gpu0")],
                ..ContainerEdits::default()
            },
        )
        .unwrap();
        let paths: Vec<_> = c["linux"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["path"].as_str().unwrap().to_string(),
                    d["minor"].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            paths,
            vec![
                ("/dev/a".to_string(), 2),
                ("/dev/gpu0".to_string(), 0),
                ("/dev/b".to_string(), 4)
            ]
        );
    }

    #[test]
    fn device_owner_defaults_to_a_non_root_process_user() {
        let mut c = base();
        c["process"]["user"] = json!({"uid": 1000, "gid": 2000});
        let edits = ContainerEdits {
            device_nodes: vec![
                node("/dev/gpu0"),
                DeviceNode {
                    path: "/dev/sda".into(),
                    gid: Some(5),
                    ..DeviceNode::default()
                },
            ],
            ..ContainerEdits::default()
        };
        apply(&mut c, &edits).unwrap();
        assert_eq!(c["linux"]["devices"][0]["uid"], 1000);
        assert_eq!(c["linux"]["devices"][0]["gid"], 2000);
        assert_eq!(c["linux"]["devices"][1]["uid"], 1000);
        assert_eq!(c["linux"]["devices"][1]["gid"], 5);
        // uid 1000, gid 0: only the uid is defaulted.
        let mut c = base();
        c["process"]["user"] = json!({"uid": 1000, "gid": 0});
        apply(
            &mut c,
            &ContainerEdits {
                device_nodes: vec![node("/dev/gpu0")],
                ..ContainerEdits::default()
            },
        )
        .unwrap();
        assert_eq!(c["linux"]["devices"][0]["uid"], 1000);
        assert!(c["linux"]["devices"][0].get("gid").is_none());
    }

    #[test]
    fn a_missing_host_device_fails() {
        let mut c = base();
        let err = apply(
            &mut c,
            &ContainerEdits {
                device_nodes: vec![node("/dev/missing")],
                ..ContainerEdits::default()
            },
        )
        .unwrap_err();
        assert!(matches!(err, ApplyError::Stat { .. }));
    }

    fn destinations(c: &Value) -> Vec<String> {
        c["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["destination"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn mounts_replace_same_destination_then_sort_stably_by_depth() {
        let mut c = base();
        let edits = ContainerEdits {
            mounts: vec![
                Mount {
                    host_path: "/h/a".into(),
                    container_path: "/opt/a/b".into(),
                    ..Mount::default()
                },
                Mount {
                    host_path: "/h/dev".into(),
                    container_path: "/dev".into(),
                    mount_type: "bind".into(),
                    options: vec!["rbind".into(), "ro".into()],
                },
                Mount {
                    host_path: "/h/z".into(),
                    container_path: "/z".into(),
                    ..Mount::default()
                },
                Mount {
                    host_path: "/h/b".into(),
                    container_path: "/a//b/".into(),
                    ..Mount::default()
                },
            ],
            ..ContainerEdits::default()
        };
        apply(&mut c, &edits).unwrap();
        assert_eq!(
            destinations(&c),
            vec!["/proc", "/sys", "/dev", "/z", "/dev/pts", "/a//b/", "/opt/a/b"]
        );
        let dev = &c["mounts"][2];
        assert_eq!(
            dev,
            &json!({"destination": "/dev", "type": "bind", "source": "/h/dev", "options": ["rbind", "ro"]})
        );
        assert_eq!(
            c["mounts"][3],
            json!({"destination": "/z", "source": "/h/z"})
        );
    }

    #[test]
    fn depth_uses_the_cleaned_path() {
        assert_eq!(mount_depth("/"), 1);
        assert_eq!(mount_depth("/a"), 1);
        assert_eq!(mount_depth("/a/"), 1);
        assert_eq!(mount_depth("/a//b"), 2);
        assert_eq!(mount_depth("/a/./b/../c/d"), 3);
        assert_eq!(mount_depth("/../a"), 1);
        assert_eq!(mount_depth("a/b"), 1);
        assert_eq!(mount_depth(""), 0);
        assert_eq!(clean_path("../../a"), "../../a");
        assert_eq!(clean_path("a/.."), ".");
    }

    #[test]
    fn hooks_are_appended_to_their_lists() {
        let mut c = base();
        c["hooks"] = json!({"prestart": [{"path": "/existing"}]});
        let hook = |name: &str, path: &str| Hook {
            hook_name: name.into(),
            path: path.into(),
            ..Hook::default()
        };
        let mut full = hook("createContainer", "/usr/bin/gpushare-cdi-hook");
        full.args = vec!["gpushare-cdi-hook".into(), "attach".into()];
        full.env = vec!["A=1".into()];
        full.timeout = Some(5);
        let edits = ContainerEdits {
            hooks: vec![
                hook("prestart", "/p"),
                hook("createRuntime", "/cr"),
                full,
                hook("startContainer", "/sc"),
                hook("poststart", "/ps"),
                hook("poststop", "/pst"),
                hook("createRuntime", "/cr2"),
            ],
            ..ContainerEdits::default()
        };
        apply(&mut c, &edits).unwrap();
        assert_eq!(
            c["hooks"],
            json!({
                "prestart": [{"path": "/existing"}, {"path": "/p"}],
                "createRuntime": [{"path": "/cr"}, {"path": "/cr2"}],
                "createContainer": [{"path": "/usr/bin/gpushare-cdi-hook", "args": ["gpushare-cdi-hook", "attach"], "env": ["A=1"], "timeout": 5}],
                "startContainer": [{"path": "/sc"}],
                "poststart": [{"path": "/ps"}],
                "poststop": [{"path": "/pst"}]
            })
        );
    }

    #[test]
    fn invalid_edits_change_nothing() {
        let mut c = base();
        let before = c.clone();
        let edits = ContainerEdits {
            env: vec!["A=1".into()],
            hooks: vec![Hook {
                hook_name: "bogus".into(),
                path: "/x".into(),
                ..Hook::default()
            }],
            ..ContainerEdits::default()
        };
        assert!(matches!(apply(&mut c, &edits), Err(ApplyError::Invalid(_))));
        assert_eq!(c, before);
    }

    #[test]
    fn rdt_gids_and_net_devices() {
        let mut c = base();
        c["process"]["user"]["additionalGids"] = json!([10]);
        let edits = ContainerEdits {
            intel_rdt: Some(IntelRdt {
                clos_id: "gold".into(),
                l3_cache_schema: "L3:0=f".into(),
                schemata: Some(vec!["MB:0=50".into()]),
                enable_monitoring: Some(true),
                ..IntelRdt::default()
            }),
            additional_gids: vec![0, 10, 44, 44, 45],
            net_devices: vec![NetDevice {
                host_interface_name: "eth1".into(),
                name: "net1".into(),
            }],
            ..ContainerEdits::default()
        };
        apply(&mut c, &edits).unwrap();
        assert_eq!(
            c["linux"]["intelRdt"],
            json!({"closID": "gold", "l3CacheSchema": "L3:0=f", "schemata": ["MB:0=50"], "enableMonitoring": true})
        );
        assert_eq!(c["process"]["user"]["additionalGids"], json!([10, 44, 45]));
        assert_eq!(c["linux"]["netDevices"], json!({"eth1": {"name": "net1"}}));
        // A later intelRdt replaces the whole object.
        let edits = ContainerEdits {
            intel_rdt: Some(IntelRdt {
                mem_bw_schema: "MB:0=20".into(),
                enable_cmt: Some(true),
                ..IntelRdt::default()
            }),
            ..ContainerEdits::default()
        };
        apply(&mut c, &edits).unwrap();
        assert_eq!(
            c["linux"]["intelRdt"],
            json!({"memBwSchema": "MB:0=20", "enableCMT": true})
        );
    }

    #[test]
    fn unknown_config_fields_survive() {
        let mut c = base();
        apply(
            &mut c,
            &ContainerEdits {
                env: vec!["A=1".into()],
                ..ContainerEdits::default()
            },
        )
        .unwrap();
        assert_eq!(c["x-unknown"], json!({"kept": [1, 2, 3]}));
        assert_eq!(c["root"], json!({"path": "rootfs"}));
    }

    #[test]
    fn badly_shaped_configs_are_reported() {
        let edits = ContainerEdits {
            env: vec!["A=1".into()],
            ..ContainerEdits::default()
        };
        assert!(matches!(
            apply(&mut json!([]), &edits),
            Err(ApplyError::Config(_))
        ));
        assert!(
            matches!(apply(&mut json!({"process": 3}), &edits), Err(ApplyError::Config(m)) if m.contains("process"))
        );
        assert!(
            matches!(apply(&mut json!({"process": {"env": {}}}), &edits), Err(ApplyError::Config(m)) if m.contains("process.env"))
        );
        assert!(matches!(
            apply(&mut json!({"process": {"env": [1]}}), &edits),
            Err(ApplyError::Config(_))
        ));
        let mounts = ContainerEdits {
            mounts: vec![Mount {
                host_path: "/a".into(),
                container_path: "/b".into(),
                ..Mount::default()
            }],
            ..ContainerEdits::default()
        };
        assert!(matches!(
            apply(&mut json!({"mounts": "x"}), &mounts),
            Err(ApplyError::Config(_))
        ));
        // null is treated as absent.
        let mut c = json!({"process": null, "mounts": null});
        apply(&mut c, &edits).unwrap();
        apply(&mut c, &mounts).unwrap();
        assert_eq!(c["mounts"], json!([{"destination": "/b", "source": "/a"}]));
    }
}
