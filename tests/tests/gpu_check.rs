//! `tests/gpu/check.sh`, the GPU-host check: on a host without a GPU it stops at once with a
//! clear "no GPU" and exit status 2; its daemon part runs and cleans up on a simulated node.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use gpushare_e2e::*;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("gpu/check.sh")
}

#[test]
fn without_a_gpu_it_says_so_and_runs_nothing() {
    if Path::new("/dev/nvidiactl").exists() {
        eprintln!("SKIPPED: this host has an NVIDIA driver");
        return;
    }
    let out = Command::new("bash")
        .arg(script())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("no GPU"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn the_daemon_part_passes_on_a_simulated_node_and_leaves_nothing() {
    if !need(is_root(), "root (mounts, device nodes)")
        || !need(which("python3").is_some(), "python3")
    {
        return;
    }
    let out = Command::new("bash")
        .arg(script())
        .args(["--simulate", "p5.48xlarge"])
        .env("GPUSHARE_BIN_DIR", bin_dir())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    for line in [
        "NVML inventory",
        "8 x NVIDIA H100 80GB HBM3 (Hopper, CC 9.0, 81559 MiB)",
        "active threads 100.0 read back",
        "read back: 25.0, 2G",
        "released; nothing left; GPU settings as found                ok",
    ] {
        assert!(stdout.contains(line), "{line:?} missing:\n{stdout}");
    }
    assert!(!stdout.contains("FAILED"), "{stdout}");
}
