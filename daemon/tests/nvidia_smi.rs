//! Time-slicing through `nvidia-smi` against recorded outputs (`tests/data/nvidia-smi/`):
//! a stand-in `nvidia-smi` script replays each recording with its exit status, run by the
//! daemon's real process runner, so the time bound and signals are real.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpushare::gpu::timeslice::NvidiaSmi;
use gpushare::gpu::GpuError;
use gpushare::sys::HostRunner;
use gpushare_proto::TimeSliceInterval;

const UUID: &str = "GPU-9c0780bf-792c-e80f-f569-e1c1f319bef0";
const BOUND: Duration = Duration::from_secs(2);

fn recording(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/nvidia-smi")
        .join(name)
}

/// A stand-in `nvidia-smi` in `dir` that records its arguments and runs `body`.
fn tool(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("nvidia-smi");
    let args = dir.join("args");
    std::fs::write(
        &path,
        format!("#!/bin/sh\necho \"$@\" > {}\n{body}\n", args.display()),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn run(body: &str, interval: TimeSliceInterval) -> (Result<(), GpuError>, String, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let smi = NvidiaSmi::new(tool(dir.path(), body), Arc::new(HostRunner), BOUND);
    let started = Instant::now();
    let r = smi.set_time_slice(UUID, interval);
    let elapsed = started.elapsed();
    let args = std::fs::read_to_string(dir.path().join("args")).unwrap_or_default();
    (r, args, elapsed)
}

fn replay(file: &str, code: i32) -> String {
    format!("cat '{}'\nexit {code}", recording(file).display())
}

#[test]
fn success_is_confirmed_and_the_command_line_is_nvidia_s() {
    let (r, args, _) = run(
        &replay("set-timeslice-success.stdout", 0),
        TimeSliceInterval::Short,
    );
    r.unwrap();
    assert_eq!(
        args.trim(),
        format!("compute-policy -i {UUID} --set-timeslice 1")
    );
}

#[test]
fn not_supported_on_tesla_p4_is_unsupported() {
    let (r, _, _) = run(
        &replay("set-timeslice-not-supported-tesla-p4.stdout", 3),
        TimeSliceInterval::Default,
    );
    match r {
        Err(GpuError::Unsupported(m)) => assert!(m.contains("exit 3") && m.contains(UUID), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn garbage_is_a_failure_not_a_success() {
    let (r, _, _) = run(
        &replay("set-timeslice-garbage.stdout", 0),
        TimeSliceInterval::Long,
    );
    match r {
        Err(GpuError::Failed(m)) => assert!(m.contains("without confirming"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_crash_is_a_failure() {
    let (r, _, _) = run("kill -SEGV $$", TimeSliceInterval::Long);
    match r {
        Err(GpuError::Failed(m)) => assert!(m.contains("killed by a signal"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_hang_is_killed_at_the_bound() {
    let (r, _, elapsed) = run("exec sleep 60", TimeSliceInterval::Medium);
    match r {
        Err(GpuError::Failed(m)) => assert!(m.contains("did not finish within 2 s"), "{m}"),
        other => panic!("{other:?}"),
    }
    // The tool would sleep a minute; the call must come back at the bound (plus the runner's
    // short grace), far earlier.
    assert!(elapsed < Duration::from_secs(30), "{elapsed:?}");
}

#[test]
fn a_missing_tool_names_it() {
    let smi = NvidiaSmi::new(
        "/nonexistent/nvidia-smi".into(),
        Arc::new(HostRunner),
        BOUND,
    );
    let e = smi
        .set_time_slice(UUID, TimeSliceInterval::Short)
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/nvidia-smi"), "{e}");
}
