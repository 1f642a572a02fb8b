//! A container's view of the NVIDIA driver's files and of its claim, for the end-to-end tests
//! of the driver's CDI spec (podman, `gpushare-runtime`, containerd): a script that prints
//! it, and the checks of what it printed.

#![allow(clippy::unwrap_used)] // test support: a panic is the failure report

use std::fs;
use std::path::{Path, PathBuf};

/// A simulated driver root in which a node-wide MPS control daemon's pipe directory exists
/// (with a marker file) before gpushared starts and generates the driver's spec.
pub fn driver_root_with_host_mps(dir: &Path) -> PathBuf {
    let root = dir.join("driver");
    fs::create_dir_all(root.join("tmp/nvidia-mps")).unwrap();
    fs::write(root.join("tmp/nvidia-mps/host-mps-marker"), "node-wide").unwrap();
    root
}

/// A daemon config (TOML) that puts the simulated driver root at `root`.
pub fn sim_root_config(root: &Path) -> String {
    format!(
        "[gpus]\nsim_driver_root = {:?}\n",
        root.display().to_string()
    )
}

/// What the script below prints, checked: each driver file (container path, expected first
/// line) is there with the host file's contents; `/tmp/nvidia-mps` is the claim's pipe dir;
/// only `expected_gpu` of the node's GPUs is in `/dev`; NVIDIA's runtime (which takes the last
/// definition of a variable in the OCI spec) would read `NVIDIA_VISIBLE_DEVICES=void`: the
/// OCI process environment as the container's init process got it (`/proc/1/environ`).
pub fn check_view(out: &str, files: &[(String, String)], expected_gpu: &str) {
    for (path, first_line) in files {
        assert!(
            out.lines()
                .any(|l| l == format!("file {path}: {first_line}")),
            "{path} with the driver's contents:\n{out}"
        );
    }
    assert!(
        out.contains("pipe-entry control"),
        "the claim's pipe dir:\n{out}"
    );
    assert!(
        !out.contains("host-mps-marker"),
        "the node-wide MPS pipe dir reached the container:\n{out}"
    );
    assert!(out.contains("env=/tmp/nvidia-mps"), "{out}");
    let gpus: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("dev "))
        .filter(|n| {
            n.strip_prefix("nvidia")
                .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    assert_eq!(gpus, vec![expected_gpu], "no GPU outside the claim:\n{out}");
    let visible: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
        .collect();
    assert_eq!(visible.last(), Some(&"void"), "{out}");
}

/// The shell script printing the container's view of `files` (container paths), as
/// [`check_view`] reads it.
pub fn view_script(files: &[(String, String)]) -> String {
    let mut s = String::new();
    for (path, _) in files {
        s += &format!("echo \"file {path}: $(head -n 1 {path})\"; ");
    }
    s += "for e in $(ls -A /tmp/nvidia-mps); do echo pipe-entry $e; done; \
          echo env=$CUDA_MPS_PIPE_DIRECTORY; for n in $(ls /dev); do echo dev $n; done; \
          tr '\\0' '\\n' </proc/1/environ | grep '^NVIDIA_VISIBLE_DEVICES='; true";
    s
}

/// The driver files the installed spec mounts that a container can read (container path,
/// first line of the host file), the `/usr/lib64` ones and `nvidia-smi`; checks that the
/// spec mounts nothing at `/tmp/nvidia-mps`.
pub fn driver_files(spec: &Path) -> Vec<(String, String)> {
    let spec: gpushare::cdi::Spec = serde_json::from_slice(&fs::read(spec).unwrap()).unwrap();
    // The generator mounted the node-wide MPS pipe dir (it existed); gpushared removed it,
    // so that no claim, MPS or not, reaches the node's MPS daemon.
    assert!(
        spec.container_edits
            .mounts
            .iter()
            .chain(
                spec.devices
                    .iter()
                    .flat_map(|d| d.container_edits.mounts.iter())
            )
            .all(|m| m.container_path != "/tmp/nvidia-mps"),
        "the host's /tmp/nvidia-mps is in the driver's spec"
    );
    let files: Vec<(String, String)> = spec
        .container_edits
        .mounts
        .iter()
        .filter(|m| {
            m.container_path.starts_with("/usr/lib64/") || m.container_path.ends_with("/nvidia-smi")
        })
        .map(|m| {
            let text = fs::read_to_string(&m.host_path).unwrap();
            (
                m.container_path.clone(),
                text.lines().next().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert!(
        files
            .iter()
            .any(|(p, _)| p.starts_with("/usr/lib64/libcuda.so."))
            && files.iter().any(|(p, _)| p == "/usr/lib64/libcuda.so.1")
            && files
                .iter()
                .any(|(p, _)| p.starts_with("/usr/lib64/libnvidia-ml.so."))
            && files.iter().any(|(p, _)| p == "/usr/bin/nvidia-smi"),
        "{files:?}"
    );
    files
}
