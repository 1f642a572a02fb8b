//! `gpushare demo` as a new user runs it: as root it completes the whole job; as an ordinary
//! user it stops at once with one line saying what needs root.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::process::Command;
use std::time::{Duration, Instant};

use gpushare_e2e::*;

#[test]
fn demo_completes_as_root_and_refuses_in_one_line_otherwise() {
    if !need(is_root(), "root") {
        return;
    }
    let _serial = global_lock();
    let out = Command::new(bin("gpushare")).arg("demo").output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "seed-mps.yaml              prepared",
        "seed-mig-3g20gb.yaml       prepared",
        "MIG devices destroyed",
        "active thread percentage (read back): 50.0",
        "nothing left behind",
        "Demo complete.",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    // One spelling of each path and one vocabulary: specs as gpushared reports them (the
    // resolved /run/cdi, not /var/run/cdi beside it), GPUs' sharing as claims' strategies.
    assert!(!stdout.contains("/var/run/cdi/"), "{stdout}");
    for word in [" Mps ", " Mig "] {
        assert!(!stdout.contains(word), "{word:?} in:\n{stdout}");
    }
    assert!(stdout.contains(" MPS "), "{stdout}");
    if which("podman").is_some() || which("runc").is_some() {
        assert!(
            stdout.contains("get_default_active_thread_percentage -> 50.0"),
            "{stdout}"
        );
        assert!(stdout.contains("0 containers attached"), "{stdout}");
    }

    // As on a machine with only the Rust toolchain: our emulator, no container engine.
    let out = Command::new(bin("gpushare"))
        .args(["demo", "--engine", "none", "--mps-control"])
        .arg(bin("gpushare-mps-control"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo with the emulator failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("MPS control program ") && stdout.contains("gpushare-mps-control"),
        "{stdout}"
    );
    assert!(
        stdout.contains("Skipping the container step") && stdout.contains("nothing left behind"),
        "{stdout}"
    );

    // As nobody: one line, non-zero, at once.
    if which("setpriv").is_none() {
        need(false, "setpriv (util-linux)");
        return;
    }
    let start = Instant::now();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(bin("gpushare"))
        .arg("demo")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("must run as root"), "{stderr}");
    assert!(out.stdout.is_empty());
}

/// The `/tmp/gsdemo-*` directories that exist now.
fn demo_dirs() -> std::collections::BTreeSet<std::path::PathBuf> {
    std::fs::read_dir("/tmp")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("gsdemo-"))
        .map(|e| e.path())
        .collect()
}

#[test]
fn demo_into_a_closed_pipe_finishes_its_clean_up_without_a_panic() {
    // `gpushare demo | head`: the reader is gone before the demo's first line. The demo must
    // still release its claims and stop its gpushared, and say nothing of a panic.
    if !need(is_root(), "root") {
        return;
    }
    let _serial = global_lock();
    let before = demo_dirs();
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = Command::new(bin("gpushare"))
        .args(["demo", "--engine", "none", "--mps-control"])
        .arg(bin("gpushare-mps-control"))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(write))
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    // It ran to its end: every check of its clean-up passed (a failed one exits 1).
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    let left: Vec<_> = demo_dirs().difference(&before).cloned().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
