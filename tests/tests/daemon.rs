//! gpushared as a process: one instance per state directory.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::process::Command;

use gpushare_e2e::*;

#[test]
fn a_second_daemon_on_the_same_state_directory_is_refused() {
    if !need(is_root(), "root") {
        return;
    }
    let d = Daemon::emulated();
    let state = d.checkpoint.parent().unwrap();
    let out = Command::new(bin("gpushared"))
        .args(["--simulate", "p4d.24xlarge", "--node-name", NODE])
        .arg("--socket")
        .arg(d.dir.path().join("second.sock"))
        .arg("--state-dir")
        .arg(state)
        .arg("--run-dir")
        .arg(&d.run_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("another gpushared already runs"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(!d.dir.path().join("second.sock").exists());
    // The first one still serves.
    assert!(
        d.client()
            .call::<(), gpushare_proto::HealthInfo>(gpushare_proto::Method::Health, None)
            .unwrap()
            .ready
    );
}

#[test]
fn run_and_cdi_directories_behind_symlinks_work_and_are_cleaned() {
    let Some(cases) = setup() else {
        return;
    };
    let base = tempfile::Builder::new()
        .prefix("gsl-")
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::create_dir(base.path().join("real")).unwrap();
    std::os::unix::fs::symlink(base.path().join("real"), base.path().join("link")).unwrap();
    let d = Daemon::start(DaemonOptions {
        mps_control: bin("gpushare-mps-control"),
        cdi_dir: Some(base.path().join("link/cdi")),
        run_dir: Some(base.path().join("link/run")),
    });
    let claim = load_claim(&cases.join("claims/seed-mps.yaml"));
    let uid = d
        .prepare(&claim)
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()))
        .uid;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(mounts.contains(&base.path().join("real/run/claims").display().to_string()));
    d.unprepare(&uid);
    d.assert_nothing_left(&uid, &[]);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&base.path().display().to_string()),
        "tmpfs unmounted"
    );
}

#[test]
fn a_live_socket_is_not_taken_over() {
    if !need(is_root(), "root") {
        return;
    }
    let d = Daemon::emulated();
    let other = tempfile::Builder::new()
        .prefix("gso-")
        .tempdir_in("/tmp")
        .unwrap();
    let out = Command::new(bin("gpushared"))
        .args(["--simulate", "p4d.24xlarge", "--node-name", NODE])
        .arg("--socket")
        .arg(&d.socket)
        .arg("--state-dir")
        .arg(other.path().join("state"))
        .arg("--run-dir")
        .arg(other.path().join("run"))
        .arg("--cdi-dir")
        .arg(other.path().join("cdi"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("another process listens on"), "{stderr}");
    assert!(
        d.client()
            .call::<(), gpushare_proto::HealthInfo>(gpushare_proto::Method::Health, None)
            .unwrap()
            .ready
    );
}
