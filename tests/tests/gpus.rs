//! GPU backends as operators meet them: gpushared without a driver, `gpushare gpus` and its
//! ResourceSlice output from a real daemon, and the compute-mode switch.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use gpushare::gpu::resource_slice::{self, ResourceSlice};
use gpushare_e2e::*;
use gpushare_proto::{ComputeMode, GpuSharing};

fn gpushare(d: &Daemon, args: &[&str]) -> std::process::Output {
    Command::new(bin("gpushare"))
        .arg("--socket")
        .arg(&d.socket)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn without_a_driver_gpushared_names_libnvidia_ml_and_suggests_simulate() {
    if Path::new("/dev/nvidiactl").exists() {
        eprintln!("SKIPPED: this host has an NVIDIA driver");
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("gsn-")
        .tempdir_in("/tmp")
        .unwrap();
    let p = dir.path();
    std::fs::write(p.join("config.toml"), "").unwrap();
    let out = Command::new(bin("gpushared"))
        .arg("--config")
        .arg(p.join("config.toml"))
        .args(["--node-name", NODE])
        .arg("--socket")
        .arg(p.join("s"))
        .arg("--state-dir")
        .arg(p.join("state"))
        .arg("--run-dir")
        .arg(p.join("run"))
        .arg("--cdi-dir")
        .arg(p.join("cdi"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("libnvidia-ml.so.1"), "{stderr}");
    assert!(stderr.contains("--simulate"), "{stderr}");
    assert!(!p.join("s").exists(), "no socket may be bound");
}

#[test]
fn every_catalog_profile_served_by_gpushared_renders_its_stored_table() {
    if !need(is_root(), "root (device nodes)") {
        return;
    }
    let mut mismatched = Vec::new();
    for profile in gpushare::gpu::catalog::catalog().unwrap() {
        let (dir, mut child) = daemon_with_gpus_config(&profile.name, "");
        let out = Command::new(bin("gpushare"))
            .arg("--socket")
            .arg(dir.path().join("s"))
            .arg("gpus")
            .output()
            .unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        let want = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../cli/tests/data/gpus")
                .join(format!("{}.txt", profile.name)),
        )
        .unwrap();
        let got = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || got != want {
            mismatched.push(format!(
                "{}: {}\n{got}\nwanted:\n{want}",
                profile.name,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(mismatched.is_empty(), "{}", mismatched.join("\n"));
}

#[test]
fn gpushare_gpus_resourceslice_for_p4d_is_valid() {
    if !need(is_root(), "root (device nodes)") {
        return;
    }
    let d = Daemon::emulated();
    let out = gpushare(&d, &["gpus", "-o", "resourceslice"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let slice: ResourceSlice = serde_norway::from_slice(&out.stdout).unwrap();
    resource_slice::validate(&slice).unwrap();
    assert_eq!(slice.spec.node_name, NODE);
    assert_eq!(slice.spec.devices.len(), 8);
    let gpus = d.gpus();
    for dev in &slice.spec.devices {
        let g = &gpus[&dev.name];
        assert_eq!(
            dev.attributes["uuid"].string.as_deref(),
            Some(g.uuid.as_str())
        );
        assert_eq!(dev.capacity["memory"].value, "40Gi");
    }
    // Only `gpus` has a ResourceSlice.
    let out = gpushare(&d, &["claims", "-o", "resourceslice"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("gpushare gpus"));
}

#[test]
fn gpushare_gpus_resourceslice_partitionable_shows_each_servers_pool() {
    if !need(is_root(), "root (device nodes)") {
        return;
    }
    // gpu-2 in MIG mode (Ampere: slices, not the whole GPU), the others off (whole only).
    let d = Daemon::start_on(
        DaemonOptions {
            mps_control: bin("gpushare-mps-control"),
            cdi_dir: None,
            run_dir: None,
        },
        &p4d_mig_profile(),
    );
    let pool = |version: &str| -> Vec<ResourceSlice> {
        let out = gpushare(
            &d,
            &["gpus", "-o", "resourceslice", "--partitionable", version],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_norway::Deserializer::from_slice(&out.stdout)
            .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
            .collect()
    };
    let names = |s: &ResourceSlice| -> Vec<String> {
        s.spec.devices.iter().map(|d| d.name.clone()).collect()
    };
    // 1.34: the whole GPUs together, gpu-2's counter set with its 25 slices.
    let combined = pool("1.34");
    resource_slice::validate_pool(&combined, resource_slice::Layout::Combined).unwrap();
    assert_eq!(combined.len(), 2);
    assert_eq!(
        names(&combined[0]),
        ["gpu-0", "gpu-1", "gpu-3", "gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    );
    assert_eq!(
        combined[1].spec.shared_counters[0].name,
        "gpu-2-counter-set"
    );
    assert_eq!(combined[1].spec.devices.len(), 25);
    assert!(names(&combined[1]).contains(&"gpu-2-mig-3g20gb-9-4".to_string()));
    // 1.35: the counter set in a slice of its own.
    let split = pool("v1.35");
    resource_slice::validate_pool(&split, resource_slice::Layout::Split).unwrap();
    assert_eq!(split.len(), 3);
    assert!(split[1].spec.devices.is_empty());
    assert_eq!(split[1].spec.shared_counters.len(), 1);
    assert_eq!(names(&split[2]), names(&combined[1]));
    // Without the flag: what a server that drops the counters gets (gpu-2 has no instance).
    let out = gpushare(&d, &["gpus", "-o", "resourceslice"]);
    let static_: ResourceSlice = serde_norway::from_slice(&out.stdout).unwrap();
    assert!(static_.spec.shared_counters.is_empty());
    assert_eq!(static_.spec.devices.len(), 7);
    // Kubernetes 1.33 serves no resource.k8s.io/v1: its pool is written in v1beta2, or in
    // v1beta1 when asked, each in its own shape.
    let docs = |args: &[&str]| -> Vec<serde_json::Value> {
        let out = gpushare(&d, args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_norway::Deserializer::from_slice(&out.stdout)
            .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
            .collect()
    };
    let k133 = docs(&["gpus", "-o", "resourceslice", "--partitionable", "1.33"]);
    assert_eq!(k133.len(), 2);
    for s in &k133 {
        assert_eq!(s["apiVersion"], "resource.k8s.io/v1beta2", "{s}");
        assert!(s["spec"]["devices"][0]["attributes"].is_object(), "{s}");
    }
    let beta1 = docs(&[
        "gpus",
        "-o",
        "resourceslice",
        "--partitionable",
        "1.33",
        "--api-version",
        "resource.k8s.io/v1beta1",
    ]);
    for s in &beta1 {
        assert_eq!(s["apiVersion"], "resource.k8s.io/v1beta1", "{s}");
        let device = &s["spec"]["devices"][0];
        assert!(
            device["basic"]["attributes"].is_object() && device.get("attributes").is_none(),
            "{s}"
        );
    }
    let static_beta2 = docs(&["gpus", "-o", "resourceslice", "--api-version", "v1beta2"]);
    assert_eq!(static_beta2[0]["apiVersion"], "resource.k8s.io/v1beta2");
    assert_eq!(
        static_beta2[0]["spec"]["devices"].as_array().unwrap().len(),
        7
    );
    for (args, why) in [
        (
            &["gpus", "--api-version", "resource.k8s.io/v1beta2"][..],
            "--api-version applies to `gpushare gpus -o resourceslice` only",
        ),
        (
            &["gpus", "-o", "resourceslice", "--api-version", "resource.k8s.io/v2"][..],
            "accepted: resource.k8s.io/v1 (Kubernetes 1.34+), resource.k8s.io/v1beta2 (Kubernetes 1.33+), resource.k8s.io/v1beta1 (Kubernetes 1.32+)",
        ),
        (
            &[
                "gpus",
                "-o",
                "resourceslice",
                "--partitionable",
                "1.33",
                "--api-version",
                "resource.k8s.io/v1",
            ][..],
            "Kubernetes 1.33 does not serve resource.k8s.io/v1",
        ),
        (
            &["gpus", "--partitionable", "1.35"][..],
            "applies to `gpushare gpus -o resourceslice` only",
        ),
        (
            &["gpus", "-o", "resourceslice", "--partitionable", "1.30"][..],
            "came in 1.33",
        ),
        (
            &["gpus", "-o", "resourceslice", "--partitionable", "latest"][..],
            "not a Kubernetes version",
        ),
    ] {
        let out = gpushare(&d, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(why),
            "{args:?}: {err}"
        );
    }
}

/// A daemon on the simulated node `profile` with `gpus_section` added to its config file's
/// `[gpus]`.
fn daemon_with_gpus_config(
    profile: &str,
    gpus_section: &str,
) -> (tempfile::TempDir, std::process::Child) {
    let dir = tempfile::Builder::new()
        .prefix("gsm-")
        .tempdir_in("/tmp")
        .unwrap();
    let p = dir.path();
    let config = p.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[paths]\nsocket = \"{0}/s\"\nstate_dir = \"{0}/state\"\nrun_dir = \"{0}/run\"\ncdi_dir = \"{0}/cdi\"\n\
             [node]\nname = \"{NODE}\"\n[mps]\ncontrol = \"{1}\"\nshm_size_mib = 64\n[gpus]\nsimulate = \"{profile}\"\n{gpus_section}\n",
            p.display(),
            bin("gpushare-mps-control").display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(p.join("log")).unwrap();
    let child = Command::new(bin("gpushared"))
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let sock = p.join("s");
    assert!(
        wait_until(Duration::from_secs(20), || gpushare_proto::Client::connect(
            &sock,
            Duration::from_secs(2)
        )
        .is_ok()),
        "gpushared did not start: {}",
        std::fs::read_to_string(p.join("log")).unwrap_or_default()
    );
    (dir, child)
}

#[test]
fn with_compute_mode_management_off_an_mps_claim_leaves_compute_mode_alone() {
    if !need(is_root(), "root (mounts, device nodes)") {
        return;
    }
    let (dir, mut child) = daemon_with_gpus_config("p4d.24xlarge", "manage_compute_mode = false");
    let sock = dir.path().join("s");
    let run = |args: &[&str]| {
        Command::new(bin("gpushare"))
            .arg("--socket")
            .arg(&sock)
            .args(args)
            .output()
            .unwrap()
    };
    let uid = unique_uid("cm-off");
    let claim = with_uid(
        &load_claim(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../daemon/examples/claims/seed-mps.yaml"),
        ),
        &uid,
    );
    let file = dir.path().join("claim.json");
    std::fs::write(&file, serde_json::to_string(&claim).unwrap()).unwrap();
    let prepared = run(&["prepare", "-f", file.to_str().unwrap()]);
    let gpus: Vec<gpushare_proto::GpuInfo> =
        serde_json::from_slice(&run(&["gpus", "-o", "json"]).stdout).unwrap_or_default();
    let status = String::from_utf8_lossy(&run(&["status"]).stdout).into_owned();
    let released = run(&["unprepare", &uid]);
    child.kill().unwrap();
    child.wait().unwrap();
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
    assert!(
        prepared.status.success(),
        "{}\n{log}",
        String::from_utf8_lossy(&prepared.stderr)
    );
    let held = gpus.iter().find(|g| g.sharing == GpuSharing::Mps).unwrap();
    assert_eq!(held.compute_mode, ComputeMode::Default, "{log}");
    assert!(status.contains("compute mode not managed"), "{status}");
    assert!(log.contains("gpus.manage_compute_mode = false"), "{log}");
    assert!(released.status.success());
}

#[test]
fn a_profile_file_describes_the_node_and_its_mig_devices_reach_the_resource_slice() {
    if !need(is_root(), "root (device nodes)") {
        return;
    }
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/examples/node-profile-mig.toml");
    let (dir, mut child) = daemon_with_gpus_config(file.to_str().unwrap(), "");
    let run = |args: &[&str]| {
        Command::new(bin("gpushare"))
            .arg("--socket")
            .arg(dir.path().join("s"))
            .args(args)
            .output()
            .unwrap()
    };
    let table = String::from_utf8_lossy(&run(&["gpus"]).stdout).into_owned();
    let status = String::from_utf8_lossy(&run(&["status"]).stdout).into_owned();
    let slice = run(&["gpus", "-o", "resourceslice"]);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(status.contains("simulated:lab-a100-mig"), "{status}");
    assert!(table.contains("on (3 devices)"), "{table}");
    let slice: ResourceSlice = serde_norway::from_slice(&slice.stdout).unwrap();
    resource_slice::validate(&slice).unwrap();
    let names: Vec<&str> = slice.spec.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gpu-0-mig-3g20gb-9-0",
            "gpu-0-mig-2g10gb-14-4",
            "gpu-0-mig-1g5gb-19-6",
            "gpu-1"
        ]
    );
    assert_eq!(
        slice.spec.devices[0].attributes["driverVersion"]
            .version
            .as_deref(),
        Some("550.90.7")
    );
}
