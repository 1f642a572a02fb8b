//! CDI specs for claims: what a claim's CDI devices carry, and the atomic writer.
//!
//! One spec file per claim, `gpushare.io-claim_<uid>.json` in the CDI directory (the dynamic,
//! highest-priority `/var/run/cdi` by default), kind `gpushare.io/claim`, one CDI device per
//! request. The spec model, its validation and the minimum-version rules are the
//! `gpushare-cdi` library's (shared with `gpushare-runtime`); podman 4.3 (Debian bookworm)
//! reads up to `0.5.0`, so every spec says the lowest version its contents need.

use std::io;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub use gpushare_cdi::{ContainerEdits, Device, DeviceNode, Hook, Mount, Spec};
use gpushare_proto::CDI_KIND;

/// Path inside containers where the claim's MPS pipe directory is mounted; what CUDA and
/// NVIDIA's tools use when `CUDA_MPS_PIPE_DIRECTORY` is unset, and what we set it to.
pub const MPS_PIPE_IN_CONTAINER: &str = "/tmp/nvidia-mps";

/// Set by every claim device: NVIDIA's runtime (the default runtime of EKS AL2023 NVIDIA
/// nodes) then injects no GPU of its own, whatever `NVIDIA_VISIBLE_DEVICES` the image sets
/// (`all` in NVIDIA's CUDA images), so a container sees only its claim's GPUs. NVIDIA's own
/// generated specs set it for the same reason.
pub const NO_RUNTIME_GPUS: &str = "NVIDIA_VISIBLE_DEVICES=void";

/// The edits every claim device carries whatever its strategy: [`NO_RUNTIME_GPUS`].
pub fn claim_env_edits() -> ContainerEdits {
    ContainerEdits {
        env: vec![NO_RUNTIME_GPUS.to_string()],
        ..ContainerEdits::default()
    }
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
        env: vec![],
        timeout: Some(i64::from(hook.timeout_secs)),
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
        mount_type: "bind".into(),
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

/// A device node edit: `path` in the container, `host_path` on the host when it differs
/// (simulated GPUs), read-write.
pub fn device_node(path: &Path, host_path: &Path) -> DeviceNode {
    DeviceNode {
        path: path.display().to_string(),
        host_path: if host_path == path {
            String::new()
        } else {
            host_path.display().to_string()
        },
        permissions: "rw".into(),
        ..DeviceNode::default()
    }
}

/// Appends `other` to `into`, skipping env entries, device nodes (by container path) and mounts
/// (by destination) already present: a request's GPUs share the control device nodes.
pub fn merge(into: &mut ContainerEdits, other: ContainerEdits) {
    for e in other.env {
        if !into.env.contains(&e) {
            into.env.push(e);
        }
    }
    for n in other.device_nodes {
        if !into.device_nodes.iter().any(|d| d.path == n.path) {
            into.device_nodes.push(n);
        }
    }
    for m in other.mounts {
        if !into
            .mounts
            .iter()
            .any(|x| x.container_path == m.container_path)
        {
            into.mounts.push(m);
        }
    }
    into.hooks.extend(other.hooks);
}

/// Builds a spec from `(device name, edits)` pairs, at its minimum version.
pub fn build_spec(devices: Vec<(String, ContainerEdits)>) -> Spec {
    let mut spec = Spec {
        kind: CDI_KIND.into(),
        devices: devices
            .into_iter()
            .map(|(name, container_edits)| Device {
                name,
                container_edits,
                ..Device::default()
            })
            .collect(),
        ..Spec::default()
    };
    spec.cdi_version = gpushare_cdi::minimum_version(&spec).to_string();
    spec
}

/// Validates `spec` as a CDI consumer would, then writes it for `claim_uid` into `cdi_dir`
/// atomically (mode 0644); returns its path.
///
/// # Errors
/// The spec is invalid (a bug: nothing is written), or any I/O error (no partial file is
/// left).
pub fn write_spec(cdi_dir: &Path, claim_uid: &str, spec: &Spec) -> io::Result<PathBuf> {
    gpushare_cdi::validate_spec(spec).map_err(|e| {
        io::Error::new(io::ErrorKind::InvalidData, format!("invalid CDI spec: {e}"))
    })?;
    crate::fsutil::create_dir_if_missing(cdi_dir, 0o755)?;
    let path = spec_path(cdi_dir, claim_uid);
    let mut bytes = serde_json::to_vec_pretty(spec).map_err(io::Error::other)?;
    bytes.push(b'\n');
    crate::fsutil::write_atomic(&path, &bytes, 0o644)?;
    Ok(path)
}

/// Applies `edits` to an OCI runtime `config.json` value as the reference CDI library does
/// (through `gpushare-cdi`). gpushare's tests and demo use it to give a plain runc bundle a
/// claim's devices.
///
/// # Errors
/// A host device node cannot be stat'ed, or the edits are invalid.
pub fn apply_to_oci_config(config: &mut Value, edits: &ContainerEdits) -> io::Result<()> {
    gpushare_cdi::apply_edits(config, edits).map_err(|e| io::Error::other(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
            build_spec(vec![("1abc".into(), plain)]).cdi_version,
            "0.5.0"
        );
        let mps = mps_edits(Path::new("/p"), Path::new("/s"));
        assert_eq!(build_spec(vec![("abc".into(), mps)]).cdi_version, "0.4.0");
        let node = ContainerEdits {
            device_nodes: vec![device_node(
                Path::new("/dev/nvidia0"),
                Path::new("/sim/nvidia0"),
            )],
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
    fn merge_skips_what_is_there() {
        let mut a = mps_edits(Path::new("/p"), Path::new("/s"));
        a.device_nodes.push(device_node(
            Path::new("/dev/nvidiactl"),
            Path::new("/dev/nvidiactl"),
        ));
        let mut b = mps_edits(Path::new("/p2"), Path::new("/s2"));
        b.device_nodes.push(device_node(
            Path::new("/dev/nvidiactl"),
            Path::new("/dev/nvidiactl"),
        ));
        merge(&mut a, b);
        assert_eq!(
            (a.env.len(), a.mounts.len(), a.device_nodes.len()),
            (1, 2, 1)
        );
        assert_eq!(a.mounts[0].host_path, "/p");
        assert_eq!(
            a.device_nodes[0].host_path, "",
            "same path on host and in the container"
        );
    }

    #[test]
    fn spec_serializes_with_cdi_field_names_and_validates() {
        let mut edits = mps_edits(Path::new("/p"), Path::new("/s"));
        edits.hooks = claim_hooks(&hook(), "u");
        let spec = build_spec(vec![("u".into(), edits)]);
        gpushare_cdi::validate_spec(&spec).unwrap();
        let v = serde_json::to_value(&spec).unwrap();
        assert_eq!(v["kind"], "gpushare.io/claim");
        let d = &v["devices"][0]["containerEdits"];
        assert_eq!(d["mounts"][0]["containerPath"], "/tmp/nvidia-mps");
        assert_eq!(d["mounts"][0]["type"], "bind");
        assert_eq!(d["hooks"][0]["hookName"], "createRuntime");
        assert_eq!(d["hooks"][0]["timeout"], 10);
    }

    #[test]
    fn write_is_atomic_named_per_claim_and_readable_by_the_loader() {
        let dir = tempfile::tempdir().unwrap();
        let spec = build_spec(vec![(
            "u".into(),
            mps_edits(Path::new("/p"), Path::new("/s")),
        )]);
        let p = write_spec(dir.path(), "u", &spec).unwrap();
        assert_eq!(p, dir.path().join("gpushare.io-claim_u.json"));
        let back = gpushare_cdi::load_spec_file(&p).unwrap();
        assert_eq!(back, spec);
        let bad = Spec {
            cdi_version: "0.3.0".into(),
            ..spec
        };
        assert!(
            write_spec(dir.path(), "v", &bad).is_err(),
            "0.3.0 is too low for typed mounts"
        );
        assert!(!dir.path().join("gpushare.io-claim_v.json").exists());
    }

    #[test]
    fn applies_edits_to_an_oci_config() {
        let mut cfg = json!({"process": {"env": ["PATH=/bin"]}, "mounts": [{"destination": "/dev/shm", "type": "tmpfs", "source": "shm"}]});
        let mut edits = mps_edits(Path::new("/p"), Path::new("/s"));
        edits.device_nodes.push(device_node(
            Path::new("/dev/null-copy"),
            Path::new("/dev/null"),
        ));
        edits.hooks = claim_hooks(&hook(), "u");
        apply_to_oci_config(&mut cfg, &edits).unwrap();
        assert!(cfg["process"]["env"]
            .as_array()
            .unwrap()
            .contains(&json!("CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps")));
        let shm: Vec<_> = cfg["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["destination"] == "/dev/shm")
            .collect();
        assert_eq!(shm.len(), 1);
        assert_eq!(shm[0]["source"], "/s");
        assert_eq!(cfg["linux"]["devices"][0]["major"], 1);
        assert_eq!(cfg["hooks"]["createRuntime"][0]["args"][1], "attach");
        assert_eq!(cfg["hooks"]["poststop"][0]["args"][1], "detach");
    }
}
