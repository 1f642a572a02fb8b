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
    // Output to files, not pipes: a leftover child holding a pipe would make the wait hang
    // instead of fail. The unusual limit names the watchdog's sleep.
    let dir = tempfile::tempdir().unwrap();
    let (out_path, err_path) = (dir.path().join("out"), dir.path().join("err"));
    let status = Command::new("bash")
        .arg(script())
        .args(["--simulate", "p5.48xlarge"])
        .env("GPUSHARE_BIN_DIR", bin_dir())
        .env("GPUSHARE_CHECK_LIMIT", "3571")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .status()
        .unwrap();
    let stdout = std::fs::read_to_string(&out_path).unwrap();
    let stderr = std::fs::read_to_string(&err_path).unwrap();
    assert_eq!(status.code(), Some(0), "{stdout}\n{stderr}");
    // Nothing of the check outlives it (its watchdog's sleep once did, holding the output
    // pipes of whoever ran it for the whole limit).
    let leftovers: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.trim_end() == "sleep 3571")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    for line in [
        "NVML inventory",
        "8 x NVIDIA H100 80GB HBM3 (Hopper, CC 9.0, 81559 MiB)",
        "active threads 100.0 read back",
        "read back: 25.0, 2G",
        "released; nothing left; GPU settings as found                ok",
    ] {
        assert!(stdout.contains(line), "{line:?} missing:\n{stdout}");
    }
    // The container step runs on a simulated node too (no CUDA to call), or says why not.
    let container = stdout
        .lines()
        .find(|l| l.starts_with("container on an MPS claim's CDI IDs runs a CUDA client"))
        .unwrap_or_else(|| panic!("no container step:\n{stdout}"));
    if which("runc").is_some() {
        assert!(
            container.contains("ok (simulated: the driver's libcuda.so.1, only /dev/nvidia0, the claim's MPS pipe, NVIDIA_VISIBLE_DEVICES=void"),
            "{container}"
        );
    } else {
        assert!(
            container.contains("skipped (no container runtime (runc)"),
            "{container}"
        );
    }
    assert!(!stdout.contains("FAILED"), "{stdout}");
    // A passing run prints nothing alarming (ldd's "<file>:" headers once went to cp).
    assert!(!stderr.contains("cannot stat"), "{stderr}");
}
