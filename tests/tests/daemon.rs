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

#[test]
fn the_config_file_is_read_and_flags_override_it() {
    if !need(is_root(), "root") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("gsc-")
        .tempdir_in("/tmp")
        .unwrap();
    let p = dir.path();
    let config = p.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[paths]\nsocket = \"{0}/from-file.sock\"\nstate_dir = \"{0}/state\"\nrun_dir = \"{0}/run\"\ncdi_dir = \"{0}/cdi\"\n\
             [node]\nname = \"{NODE}\"\n[gpus]\nsimulate = \"g5.xlarge\"\n[socket]\nmode = \"0600\"\n[mps]\ncontrol = \"{1}\"\n",
            p.display(),
            bin("gpushare-mps-control").display()
        ),
    )
    .unwrap();
    let mut child = Command::new(bin("gpushared"))
        .arg("--config")
        .arg(&config)
        .arg("--socket")
        .arg(p.join("flag.sock"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The socket file appears at bind, before listen: only a connection says it serves.
    let up = wait_until(std::time::Duration::from_secs(20), || {
        std::os::unix::net::UnixStream::connect(p.join("flag.sock")).is_ok()
    });
    let gpus = up.then(|| {
        gpushare_proto::Client::connect(p.join("flag.sock"), std::time::Duration::from_secs(2))
            .unwrap()
            .call::<(), Vec<gpushare_proto::GpuInfo>>(gpushare_proto::Method::ListGpus, None)
            .unwrap()
    });
    let mode = std::fs::metadata(p.join("flag.sock"))
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o7777);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(up, "gpushared did not bind the socket named by the flag");
    // g5.xlarge from the file: one A10G.
    assert_eq!(gpus.unwrap().len(), 1);
    assert_eq!(mode.unwrap(), 0o600);
    assert!(
        p.join("state/gpushared.lock").exists(),
        "state dir from the file"
    );
    assert!(!p.join("from-file.sock").exists());
}

#[test]
fn an_unknown_config_key_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[mps]\ntimeout_secs = 5\n").unwrap();
    let out = Command::new(bin("gpushared"))
        .arg("--config")
        .arg(&config)
        .args(["--simulate", "g5.xlarge"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("timeout_secs"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    // A config file named on the command line must exist.
    let out = Command::new(bin("gpushared"))
        .arg("--config")
        .arg(dir.path().join("missing.toml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
}

#[test]
fn the_printed_default_config_is_the_shipped_file_and_loads() {
    let out = Command::new(bin("gpushared"))
        .arg("--print-default-config")
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    let shipped = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/config.toml"),
    )
    .unwrap();
    assert_eq!(printed, shipped);
    let parsed: toml::Value = toml::from_str(&printed).unwrap();
    assert!(parsed.get("paths").is_some());
}

#[test]
fn a_second_daemon_on_the_same_run_directory_is_refused_and_takes_nothing() {
    let Some(cases) = setup() else {
        return;
    };
    let d = Daemon::emulated();
    let uid = unique_uid("shared-run");
    let claim = with_uid(&load_claim(&cases.join("claims/seed-mps.yaml")), &uid);
    d.prepare(&claim)
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let before = d.claim(&uid).unwrap();
    let other = tempfile::Builder::new()
        .prefix("gsr-")
        .tempdir_in("/tmp")
        .unwrap();
    let out = Command::new(bin("gpushared"))
        .args([
            "--simulate",
            "p4d.24xlarge",
            "--node-name",
            NODE,
            "--no-metrics",
        ])
        .arg("--config")
        .arg(d.dir.path().join("config.toml"))
        .arg("--socket")
        .arg(other.path().join("s.sock"))
        .arg("--state-dir")
        .arg(other.path().join("state"))
        .arg("--run-dir")
        .arg(&d.run_dir)
        .arg("--cdi-dir")
        .arg(other.path().join("cdi"))
        .arg("--mps-control")
        .arg(bin("gpushare-mps-control"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("another gpushared already runs on run directory"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    // The first daemon's claim is untouched: same MPS control daemon, still prepared.
    let after = d.claim(&uid).unwrap();
    assert_eq!(after.state, gpushare_proto::ClaimState::Prepared);
    assert_eq!(after.groups, before.groups);
    assert!(d.run_dir.join("claims").join(&uid).is_dir());
    d.unprepare(&uid);
    d.assert_nothing_left(&uid, &[]);
}
