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
