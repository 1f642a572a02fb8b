//! The simulated `nvidia-ctk cdi generate`: NVIDIA's toolkit cannot be installed on machines
//! without an NVIDIA driver, so a simulated node gets a driver root of fake files and a spec of
//! the layout the toolkit writes for it, and everything above ([`super::DriverSpecs`], prepare,
//! the runtimes) runs as on a real node.
//!
//! The driver root (`[gpus] sim_driver_root`, default `<run_dir>/simulated-driver`) gets, for
//! the profile's driver version `<v>`: `usr/lib64/libcuda.so.<v>` and its SONAME link
//! `libcuda.so.1`, `usr/lib64/libnvidia-ml.so.<v>` and `libnvidia-ml.so.1`, `usr/bin/nvidia-smi`
//! (a shell script that prints the driver's versions) and
//! `lib/firmware/nvidia/<v>/gsp_ga10x.bin`. The spec, as the toolkit's: kind as asked, a
//! device per GPU named by its UUID (its `/dev/nvidia<N>`), one per MIG device named
//! `MIG-<uuid>` (the parent's node and the two capability nodes) and `all`; common edits with
//! `NVIDIA_VISIBLE_DEVICES=void`, `NVIDIA_CTK_LIBCUDA_DIR`, the control device nodes, a
//! read-only mount of every file above at its path below the driver root, and a mount of
//! `<driver root>/tmp/nvidia-mps` when that exists at generation time (a node-wide MPS daemon).
//!
//! What differs from the toolkit, said here because the tests and the demo rely on it: no
//! hooks (NVIDIA's `nvidia-cdi-hook` is not on these machines), so instead of the toolkit's
//! `create-symlinks` hook the SONAME links are mounted too (a bind mount of a link gives the
//! file it points to), and there is no `update-ldcache` (the fake libraries are not loaded).

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use gpushare_cdi::{ContainerEdits, Device, DeviceNode as CdiNode, Mount, Spec};

use super::{GenerateError, SpecGenerator, HOST_MPS_PIPE};
use crate::gpu::{DeviceNode, GpuBackend};

/// The driver version used when the node has no GPU to read one from.
const FALLBACK_VERSION: &str = "570.172.08";

/// Where the simulated driver puts its libraries (Amazon Linux 2023's layout).
pub const LIB_DIR: &str = "usr/lib64";

/// A simulated toolkit over a simulated node's GPUs.
#[derive(Debug)]
pub struct SimulatedToolkit {
    backend: Arc<dyn GpuBackend>,
    driver_root: PathBuf,
}

impl SimulatedToolkit {
    /// Generates for `backend`'s GPUs and MIG devices, with the driver's files under
    /// `driver_root` (created, with its files, at each generation when missing).
    pub fn new(backend: Arc<dyn GpuBackend>, driver_root: &Path) -> SimulatedToolkit {
        SimulatedToolkit {
            backend,
            driver_root: driver_root.to_path_buf(),
        }
    }

    fn version(&self) -> (String, String) {
        self.backend.gpus().first().map_or_else(
            || (FALLBACK_VERSION.to_string(), "12.8".to_string()),
            |g| (g.driver_version.clone(), g.cuda_driver_version.clone()),
        )
    }

    /// The driver's files, relative to the driver root, in the order the spec mounts them;
    /// created when missing.
    fn populate(&self, version: &str, cuda: &str) -> io::Result<Vec<String>> {
        let root = &self.driver_root;
        let libs = root.join(LIB_DIR);
        fs::create_dir_all(&libs)?;
        let mut files = Vec::new();
        for lib in ["libcuda.so", "libnvidia-ml.so"] {
            let real = format!("{lib}.{version}");
            write_if_missing(
                &libs.join(&real),
                format!("simulated {real} of NVIDIA driver {version} (gpushare)\n").as_bytes(),
                0o755,
            )?;
            let soname = libs.join(format!("{lib}.1"));
            if fs::symlink_metadata(&soname).is_err() {
                // Generations may run at once (`super::DriverSpecs`): another one's link is
                // the same link.
                match std::os::unix::fs::symlink(&real, &soname) {
                    Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                    _ => {}
                }
            }
            files.push(format!("{LIB_DIR}/{real}"));
        }
        // In place of the toolkit's create-symlinks hook: the SONAME links themselves.
        files.push(format!("{LIB_DIR}/libcuda.so.1"));
        files.push(format!("{LIB_DIR}/libnvidia-ml.so.1"));
        let bin = root.join("usr/bin");
        fs::create_dir_all(&bin)?;
        write_if_missing(
            &bin.join("nvidia-smi"),
            format!(
                "#!/bin/sh\necho 'NVIDIA-SMI {version} (simulated by gpushare)   Driver Version: {version}   CUDA Version: {cuda}'\n"
            )
            .as_bytes(),
            0o755,
        )?;
        files.push("usr/bin/nvidia-smi".into());
        let firmware = root.join(format!("lib/firmware/nvidia/{version}"));
        fs::create_dir_all(&firmware)?;
        write_if_missing(
            &firmware.join("gsp_ga10x.bin"),
            b"simulated GSP firmware\n",
            0o644,
        )?;
        files.push(format!("lib/firmware/nvidia/{version}/gsp_ga10x.bin"));
        Ok(files)
    }

    /// The spec for the node as it is now.
    fn spec(&self, kind: &str, files: &[String]) -> Spec {
        let node = |n: &DeviceNode| CdiNode {
            path: n.path.display().to_string(),
            host_path: n.host_path.display().to_string(),
            ..CdiNode::default()
        };
        let device = |name: String, nodes: Vec<CdiNode>| Device {
            name,
            container_edits: ContainerEdits {
                device_nodes: nodes,
                ..ContainerEdits::default()
            },
            ..Device::default()
        };
        let mut devices = Vec::new();
        let mut all = Vec::new();
        for gpu in self.backend.gpus() {
            let nodes: Vec<CdiNode> = self
                .backend
                .gpu_device_nodes(gpu)
                .iter()
                .map(node)
                .collect();
            all.extend(nodes.iter().cloned());
            devices.push(device(gpu.uuid.clone(), nodes.clone()));
            for gi in self.backend.mig_instances(&gpu.uuid).unwrap_or_default() {
                let Some(ci) = gi.compute else { continue };
                let mut mig = nodes.clone();
                mig.extend(
                    self.backend
                        .mig_device_nodes(gpu, gi.gi_id, ci.ci_id)
                        .iter()
                        .map(node),
                );
                devices.push(device(ci.uuid.clone(), mig));
            }
        }
        if !all.is_empty() {
            devices.push(device("all".into(), all));
        }
        let read_only = |rel: &str| Mount {
            host_path: self.driver_root.join(rel).display().to_string(),
            container_path: format!("/{rel}"),
            mount_type: String::new(),
            options: ["ro", "nosuid", "nodev", "rbind", "rprivate"]
                .map(String::from)
                .to_vec(),
        };
        let mut mounts: Vec<Mount> = files.iter().map(|f| read_only(f)).collect();
        // As the toolkit's IPC discovery: a node-wide MPS daemon's pipe directory, when one
        // exists at generation time.
        let host_mps = self.driver_root.join(HOST_MPS_PIPE.trim_start_matches('/'));
        if host_mps.is_dir() {
            mounts.push(Mount {
                host_path: host_mps.display().to_string(),
                container_path: HOST_MPS_PIPE.into(),
                mount_type: String::new(),
                options: ["rbind", "rprivate", "nosuid", "nodev", "noexec"]
                    .map(String::from)
                    .to_vec(),
            });
        }
        let mut spec = Spec {
            kind: kind.to_string(),
            devices,
            container_edits: ContainerEdits {
                env: vec![
                    "NVIDIA_VISIBLE_DEVICES=void".into(),
                    format!("NVIDIA_CTK_LIBCUDA_DIR=/{LIB_DIR}"),
                ],
                device_nodes: self
                    .backend
                    .control_device_nodes()
                    .iter()
                    .map(node)
                    .collect(),
                mounts,
                ..ContainerEdits::default()
            },
            ..Spec::default()
        };
        spec.cdi_version = gpushare_cdi::minimum_version(&spec).to_string();
        spec
    }
}

fn write_if_missing(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    if path.exists() {
        return Ok(());
    }
    fs::write(path, contents)?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

impl SpecGenerator for SimulatedToolkit {
    fn describe(&self) -> String {
        format!(
            "the simulated nvidia-ctk cdi generate (driver root {})",
            self.driver_root.display()
        )
    }

    fn generate(&self, vendor: &str, class: &str, output: &Path) -> Result<(), GenerateError> {
        let (version, cuda) = self.version();
        let files = self.populate(&version, &cuda).map_err(|e| {
            GenerateError::Failed(format!(
                "creating the simulated driver root {}: {e}",
                self.driver_root.display()
            ))
        })?;
        let spec = self.spec(&format!("{vendor}/{class}"), &files);
        let bytes = serde_json::to_vec_pretty(&spec)
            .map_err(|e| GenerateError::Failed(format!("encoding the simulated spec: {e}")))?;
        fs::write(output, bytes)
            .map_err(|e| GenerateError::Failed(format!("writing {}: {e}", output.display())))
    }
}
