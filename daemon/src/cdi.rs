//! CDI specs for claims: building (pure), the minimum `cdiVersion`, and the atomic writer.
//!
//! One spec file per claim, `gpushare.io-claim_<uid>.json` in the CDI directory (the dynamic,
//! highest-priority `/var/run/cdi` by default), kind `gpushare.io/claim`, one CDI device per
//! request. Field names and version rules follow the CDI specification; podman 4.3 (Debian
//! bookworm) reads up to `0.5.0`, so the spec always says the lowest version its contents need.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use gpushare_proto::CDI_KIND;

/// Path inside containers where the claim's MPS pipe directory is mounted; what CUDA and
/// NVIDIA's tools use when `CUDA_MPS_PIPE_DIRECTORY` is unset, and what we set it to.
pub const MPS_PIPE_IN_CONTAINER: &str = "/tmp/nvidia-mps";

/// A CDI spec (the subset of fields gpushare writes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// Lowest version the contents need ([`minimum_version`]).
    pub cdi_version: String,
    /// `gpushare.io/claim`.
    pub kind: String,
    /// One device per request.
    pub devices: Vec<Device>,
}

/// A CDI device: a name and the edits it brings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Device name within the kind.
    pub name: String,
    /// What requesting it does to the container.
    pub container_edits: ContainerEdits,
}

/// CDI container edits.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    /// `KEY=VALUE` entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    /// Mounts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    /// OCI hooks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
}

/// A CDI device node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path in the container.
    pub path: String,
    /// Path on the host when it differs (needs cdiVersion 0.5.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// cgroup permissions, subset of `rwm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
}

/// A CDI mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Source on the host.
    pub host_path: String,
    /// Destination in the container.
    pub container_path: String,
    /// Mount type (needs cdiVersion 0.4.0).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Mount options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// A CDI hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hook {
    /// OCI hook point (`createRuntime`, `poststop`, …).
    pub hook_name: String,
    /// Absolute path of the executable.
    pub path: String,
    /// argv, starting with the program name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Seconds the runtime waits for the hook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u32>,
}

/// Where the hooks in our specs point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookConfig {
    /// Absolute path of `gpushare-cdi-hook`.
    pub path: PathBuf,
    /// The daemon's socket, passed to the hook so that a daemon on any socket works.
    pub socket: PathBuf,
    /// Seconds the runtime gives each hook run.
    pub timeout_secs: u32,
}

/// The CDI device name of a request: the claim UID alone when the claim has one request (so
/// `--device gpushare.io/claim=<uid>` works), else `<uid>-<request>` (a `/` of a subrequest
/// becomes `_`).
pub fn device_name(claim_uid: &str, request: &str, single_request: bool) -> String {
    if single_request {
        claim_uid.to_string()
    } else {
        format!("{claim_uid}-{}", request.replace('/', "_"))
    }
}

/// The fully-qualified CDI device ID: `gpushare.io/claim=<name>`.
pub fn qualified_name(device_name: &str) -> String {
    format!("{CDI_KIND}={device_name}")
}

/// The spec file of a claim in `cdi_dir`.
pub fn spec_path(cdi_dir: &Path, claim_uid: &str) -> PathBuf {
    cdi_dir.join(format!("gpushare.io-claim_{claim_uid}.json"))
}

/// The edits that tie a container to its claim: `attach` at `createRuntime` (fails the start
/// when the claim is not ready or full) and `detach` at `poststop` (never fails).
pub fn claim_hooks(hook: &HookConfig, claim_uid: &str) -> Vec<Hook> {
    let make = |hook_name: &str, verb: &str| Hook {
        hook_name: hook_name.into(),
        path: hook.path.display().to_string(),
        args: vec![
            "gpushare-cdi-hook".into(),
            verb.into(),
            "--socket".into(),
            hook.socket.display().to_string(),
            "--claim".into(),
            claim_uid.into(),
        ],
        timeout: Some(hook.timeout_secs),
    };
    vec![make("createRuntime", "attach"), make("poststop", "detach")]
}

/// The edits giving a container the claim's MPS control daemon: its pipe directory at
/// `/tmp/nvidia-mps` (with `CUDA_MPS_PIPE_DIRECTORY` pointing there) and its shm tmpfs at
/// `/dev/shm`, which MPS clients and server must share.
pub fn mps_edits(pipe_dir: &Path, shm_dir: &Path) -> ContainerEdits {
    let bind = |host: &Path, container: &str| Mount {
        host_path: host.display().to_string(),
        container_path: container.into(),
        kind: Some("bind".into()),
        options: vec!["rbind".into(), "rw".into(), "nosuid".into(), "nodev".into()],
    };
    ContainerEdits {
        env: vec![format!("CUDA_MPS_PIPE_DIRECTORY={MPS_PIPE_IN_CONTAINER}")],
        mounts: vec![
            bind(pipe_dir, MPS_PIPE_IN_CONTAINER),
            bind(shm_dir, "/dev/shm"),
        ],
        ..ContainerEdits::default()
    }
}

impl ContainerEdits {
    /// Appends `other`, skipping device nodes, mounts and env entries already present.
    pub fn merge(&mut self, other: ContainerEdits) {
        for e in other.env {
            if !self.env.contains(&e) {
                self.env.push(e);
            }
        }
        for n in other.device_nodes {
            if !self.device_nodes.iter().any(|d| d.path == n.path) {
                self.device_nodes.push(n);
            }
        }
        for m in other.mounts {
            if !self
                .mounts
                .iter()
                .any(|x| x.container_path == m.container_path)
            {
                self.mounts.push(m);
            }
        }
        self.hooks.extend(other.hooks);
    }
}

/// The lowest `cdiVersion` whose features cover `spec`: 0.3.0, raised to 0.4.0 by a mount
/// type, and to 0.5.0 by a device node `hostPath` or a device name starting with a digit.
pub fn minimum_version(spec: &Spec) -> &'static str {
    let needs_050 = spec.devices.iter().any(|d| {
        d.name.starts_with(|c: char| c.is_ascii_digit())
            || d.container_edits
                .device_nodes
                .iter()
                .any(|n| n.host_path.is_some())
    });
    let needs_040 = spec
        .devices
        .iter()
        .any(|d| d.container_edits.mounts.iter().any(|m| m.kind.is_some()));
    if needs_050 {
        "0.5.0"
    } else if needs_040 {
        "0.4.0"
    } else {
        "0.3.0"
    }
}

/// Builds a spec from `(device name, edits)` pairs, at its minimum version.
pub fn build_spec(devices: Vec<(String, ContainerEdits)>) -> Spec {
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: CDI_KIND.into(),
        devices: devices
            .into_iter()
            .map(|(name, container_edits)| Device {
                name,
                container_edits,
            })
            .collect(),
    };
    spec.cdi_version = minimum_version(&spec).into();
    spec
}

/// Writes `spec` for `claim_uid` into `cdi_dir` atomically (mode 0644); returns its path.
///
/// # Errors
/// Any I/O error; no partial file is left.
pub fn write_spec(cdi_dir: &Path, claim_uid: &str, spec: &Spec) -> io::Result<PathBuf> {
    crate::fsutil::create_dir_if_missing(cdi_dir, 0o755)?;
    let path = spec_path(cdi_dir, claim_uid);
    let mut bytes = serde_json::to_vec_pretty(spec).map_err(io::Error::other)?;
    bytes.push(b'\n');
    crate::fsutil::write_atomic(&path, &bytes, 0o644)?;
    Ok(path)
}

/// Applies `edits` to an OCI runtime `config.json` value the way the reference CDI library
/// does: env appended, device nodes added with their cgroup allow rules (type and numbers read
/// from the host node), mounts replacing any at the same destination, hooks appended.
///
/// gpushare's tests and demo use this to give a plain runc bundle a claim's devices.
///
/// # Errors
/// A host device node cannot be stat'ed or is not a device.
pub fn apply_to_oci_config(config: &mut Value, edits: &ContainerEdits) -> io::Result<()> {
    let obj = |v: &mut Value| {
        if !v.is_object() {
            *v = json!({});
        }
    };
    obj(config);
    let process = &mut config["process"];
    obj(process);
    let env = &mut process["env"];
    if !env.is_array() {
        *env = json!([]);
    }
    if let Some(list) = env.as_array_mut() {
        list.extend(edits.env.iter().map(|e| json!(e)));
    }

    for node in &edits.device_nodes {
        let host = node.host_path.as_deref().unwrap_or(&node.path);
        let meta = std::fs::metadata(host)?;
        let kind = if meta.file_type().is_char_device() {
            "c"
        } else if meta.file_type().is_block_device() {
            "b"
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CDI host device {host} is not a device node"),
            ));
        };
        let (major, minor) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
        let linux = &mut config["linux"];
        obj(linux);
        push(
            &mut linux["devices"],
            json!({
                "path": node.path, "type": kind, "major": major, "minor": minor,
                "fileMode": 0o666, "uid": 0, "gid": 0
            }),
        );
        let resources = &mut linux["resources"];
        obj(resources);
        push(
            &mut resources["devices"],
            json!({
                "allow": true, "type": kind, "major": major, "minor": minor,
                "access": node.permissions.as_deref().unwrap_or("rwm")
            }),
        );
    }

    if !config["mounts"].is_array() {
        config["mounts"] = json!([]);
    }
    if let Some(mounts) = config["mounts"].as_array_mut() {
        for m in &edits.mounts {
            mounts.retain(|x| x["destination"] != json!(m.container_path));
            mounts.push(json!({
                "destination": m.container_path,
                "type": m.kind.as_deref().unwrap_or("bind"),
                "source": m.host_path,
                "options": m.options,
            }));
        }
    }

    for h in &edits.hooks {
        let hooks = &mut config["hooks"];
        obj(hooks);
        let mut entry = json!({"path": h.path, "args": h.args});
        if let Some(t) = h.timeout {
            entry["timeout"] = json!(t);
        }
        push(&mut hooks[h.hook_name.as_str()], entry);
    }
    Ok(())
}

fn push(slot: &mut Value, item: Value) {
    if !slot.is_array() {
        *slot = json!([]);
    }
    if let Some(list) = slot.as_array_mut() {
        list.push(item);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook() -> HookConfig {
        HookConfig {
            path: "/usr/bin/gpushare-cdi-hook".into(),
            socket: "/run/gpushare/gpushared.sock".into(),
            timeout_secs: 10,
        }
    }

    #[test]
    fn version_is_the_lowest_that_fits() {
        let plain = ContainerEdits {
            env: vec!["A=1".into()],
            ..Default::default()
        };
        assert_eq!(
            build_spec(vec![("abc".into(), plain.clone())]).cdi_version,
            "0.3.0"
        );
        assert_eq!(
            build_spec(vec![("1abc".into(), plain.clone())]).cdi_version,
            "0.5.0"
        );
        let mps = mps_edits(Path::new("/p"), Path::new("/s"));
        assert_eq!(build_spec(vec![("abc".into(), mps)]).cdi_version, "0.4.0");
        let node = ContainerEdits {
            device_nodes: vec![DeviceNode {
                path: "/dev/nvidia0".into(),
                host_path: Some("/sim/nvidia0".into()),
                permissions: None,
            }],
            ..Default::default()
        };
        assert_eq!(build_spec(vec![("abc".into(), node)]).cdi_version, "0.5.0");
    }

    #[test]
    fn names_and_hooks() {
        assert_eq!(device_name("u1", "gpu", true), "u1");
        assert_eq!(device_name("u1", "gpus/a100", false), "u1-gpus_a100");
        assert_eq!(qualified_name("u1"), "gpushare.io/claim=u1");
        let hooks = claim_hooks(&hook(), "u1");
        assert_eq!(hooks[0].hook_name, "createRuntime");
        assert_eq!(hooks[0].args[1], "attach");
        assert_eq!(hooks[1].hook_name, "poststop");
        assert_eq!(hooks[1].args[1], "detach");
        assert!(hooks
            .iter()
            .all(|h| h.args.contains(&"/run/gpushare/gpushared.sock".to_string())));
    }

    #[test]
    fn mps_edits_set_pipe_env_and_mounts() {
        let e = mps_edits(Path::new("/run/c/pipe"), Path::new("/run/c/shm"));
        assert_eq!(e.env, vec!["CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"]);
        assert_eq!(e.mounts[0].container_path, "/tmp/nvidia-mps");
        assert_eq!(e.mounts[0].host_path, "/run/c/pipe");
        assert_eq!(e.mounts[1].container_path, "/dev/shm");
    }

    #[test]
    fn spec_serializes_with_cdi_field_names() {
        let mut edits = mps_edits(Path::new("/p"), Path::new("/s"));
        edits.hooks = claim_hooks(&hook(), "u");
        let v = serde_json::to_value(build_spec(vec![("u".into(), edits)])).unwrap();
        assert_eq!(v["kind"], "gpushare.io/claim");
        let d = &v["devices"][0]["containerEdits"];
        assert_eq!(d["mounts"][0]["containerPath"], "/tmp/nvidia-mps");
        assert_eq!(d["mounts"][0]["type"], "bind");
        assert_eq!(d["hooks"][0]["hookName"], "createRuntime");
    }

    #[test]
    fn write_is_atomic_and_named_per_claim() {
        let dir = tempfile::tempdir().unwrap();
        let spec = build_spec(vec![(
            "u".into(),
            mps_edits(Path::new("/p"), Path::new("/s")),
        )]);
        let p = write_spec(dir.path(), "u", &spec).unwrap();
        assert_eq!(p, dir.path().join("gpushare.io-claim_u.json"));
        let back: Spec = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn applies_edits_to_an_oci_config() {
        let mut cfg = json!({"process": {"env": ["PATH=/bin"]}, "mounts": [{"destination": "/dev/shm", "type": "tmpfs", "source": "shm"}]});
        let mut edits = mps_edits(Path::new("/p"), Path::new("/s"));
        edits.device_nodes.push(DeviceNode {
            path: "/dev/null-copy".into(),
            host_path: Some("/dev/null".into()),
            permissions: None,
        });
        edits.hooks = claim_hooks(&hook(), "u");
        apply_to_oci_config(&mut cfg, &edits).unwrap();
        assert_eq!(
            cfg["process"]["env"][1],
            "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"
        );
        let shm: Vec<_> = cfg["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["destination"] == "/dev/shm")
            .collect();
        assert_eq!(shm.len(), 1);
        assert_eq!(shm[0]["source"], "/s");
        assert_eq!(cfg["linux"]["devices"][0]["major"], 1);
        assert_eq!(cfg["linux"]["resources"]["devices"][0]["allow"], true);
        assert_eq!(cfg["hooks"]["createRuntime"][0]["args"][1], "attach");
        assert_eq!(cfg["hooks"]["poststop"][0]["args"][1], "detach");
    }
}
