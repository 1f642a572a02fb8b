//! Real containers on prepared claims: podman (which reads our CDI spec with the reference CDI
//! library) and plain runc with our hooks in its `config.json`.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use gpushare_e2e::*;
use gpushare_proto::{ClaimInfo, MigInstanceInfo, StrategyInfo};
use serde_json::Value;

fn claim_via_cli(d: &Daemon, uid: &str) -> ClaimInfo {
    let out = Command::new(bin("gpushare"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["claim", uid, "-o", "json"])
        .output()
        .expect("gpushare claim");
    assert!(
        out.status.success(),
        "gpushare claim: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("claim JSON")
}

fn seed_mps(uid: &str) -> Option<Value> {
    let cases = cases_dir()?;
    Some(with_uid(
        &load_claim(&cases.join("claims/seed-mps.yaml")),
        uid,
    ))
}

fn atp_of(c: &ClaimInfo) -> String {
    c.groups
        .iter()
        .find_map(|g| match &g.sharing {
            StrategyInfo::Mps(m) => Some(m.active_thread_percentage.clone()),
            _ => None,
        })
        .expect("an MPS group")
}

#[test]
fn podman_container_uses_the_claims_mps_daemon() {
    if !need(is_root(), "root")
        || !need(which("podman").is_some(), "podman")
        || !need(which("runc").is_some(), "runc")
    {
        return;
    }
    let _serial = global_lock();
    for (name, program) in mps_programs() {
        eprintln!("--- MPS control program: {name}");
        let d = Daemon::start(DaemonOptions {
            mps_control: program.clone(),
            // podman reads CDI specs from /etc/cdi and /var/run/cdi only.
            cdi_dir: Some(PathBuf::from("/var/run/cdi")),
            run_dir: None,
        });
        let uid = unique_uid(&format!("podman-{name}"));
        let Some(claim) = seed_mps(&uid) else {
            need(false, "shared/cases");
            return;
        };
        d.prepare(&claim)
            .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
        let tmp = tempfile::tempdir().unwrap();
        // NVIDIA's control UI (or ours) with its libraries, at the same path as on the host.
        let rootfs = busybox_rootfs(tmp.path(), std::slice::from_ref(&program));
        let script = format!(
            "echo env=$CUDA_MPS_PIPE_DIRECTORY; ls /tmp/nvidia-mps; grep ' /dev/shm ' /proc/self/mountinfo; \
             echo atp=$(echo get_default_active_thread_percentage | {}); sleep 3",
            program.display()
        );
        let child = gpushare_cli::container::podman_run(
            &format!("gpushare.io/claim={uid}"),
            &rootfs,
            &script,
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("podman run");
        let attached = wait_until(Duration::from_secs(30), || {
            claim_via_cli(&d, &uid).attached.len() == 1
        });
        let during = claim_via_cli(&d, &uid);
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "podman failed: {stdout}\n{stderr}\n{}",
            d.log()
        );
        assert!(
            attached,
            "gpushare claim never showed the container attached: {during:?}"
        );
        let a = &during.attached[0];
        assert!(a.pid.is_some_and(|p| p > 0), "{a:?}");
        assert!(a.cgroup.is_some(), "{a:?}");
        assert!(stdout.contains("env=/tmp/nvidia-mps"), "{stdout}");
        assert!(
            stdout.lines().any(|l| l.trim() == "control"),
            "pipe dir mounted: {stdout}"
        );
        let shm = stdout
            .lines()
            .find(|l| l.contains(" /dev/shm "))
            .unwrap_or_default();
        assert!(
            shm.contains("tmpfs") && shm.contains("size=65536k"),
            "the claim's 64 MiB tmpfs on /dev/shm: {stdout}"
        );
        assert!(
            stdout.contains(&format!("atp={}", atp_of(&during))),
            "UI in the container: {stdout}"
        );
        assert!(stdout.contains("atp=50.0"), "{stdout}");
        assert!(
            wait_until(Duration::from_secs(10), || claim_via_cli(&d, &uid)
                .attached
                .is_empty()),
            "detached after exit"
        );
        d.unprepare(&uid);
        d.assert_nothing_left(&uid, &[]);
    }
}

fn runc_bundle(dir: &Path, cdi_spec: &Path, device: &str, cmd: &str) -> PathBuf {
    let bundle = dir.join("bundle");
    fs::create_dir_all(&bundle).unwrap();
    busybox_rootfs(&bundle, &[]);
    let spec: gpushare::cdi::Spec = serde_json::from_slice(&fs::read(cdi_spec).unwrap()).unwrap();
    let dev = spec
        .devices
        .iter()
        .find(|d| d.name == device)
        .expect("device in spec");
    gpushare_cli::container::runc_config(&bundle, cmd, &dev.container_edits).unwrap();
    bundle
}

#[test]
fn runc_container_attaches_detaches_and_fails_without_claim() {
    if !need(is_root(), "root") || !need(which("runc").is_some(), "runc") {
        return;
    }
    let program = mps_programs().remove(0).1;
    let d = Daemon::start(DaemonOptions {
        mps_control: program,
        cdi_dir: None,
        run_dir: None,
    });
    let uid = unique_uid("runc");
    let Some(claim) = seed_mps(&uid) else {
        need(false, "shared/cases");
        return;
    };
    d.prepare(&claim).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let spec = d.cdi_dir.join(format!("gpushare.io-claim_{uid}.json"));
    let bundle = runc_bundle(
        tmp.path(),
        &spec,
        &uid,
        "test -S /tmp/nvidia-mps/control && echo pipe-ok; echo env=$CUDA_MPS_PIPE_DIRECTORY; test -c /dev/nvidia0 && echo dev-ok; sleep 2",
    );
    let runc_root = tmp.path().join("runc-root");
    let run = |id: &str| {
        Command::new("runc")
            .arg("--root")
            .arg(&runc_root)
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(id)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("runc run")
    };
    let child = run("gs-runc-1");
    let attached = wait_until(Duration::from_secs(20), || {
        d.claim(&uid)
            .map(|c| c.attached.iter().any(|a| a.container_id == "gs-runc-1"))
            .unwrap_or(false)
    });
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "runc: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(attached, "container attached while running");
    assert!(
        stdout.contains("pipe-ok")
            && stdout.contains("env=/tmp/nvidia-mps")
            && stdout.contains("dev-ok"),
        "{stdout}"
    );
    assert!(
        wait_until(Duration::from_secs(10), || d
            .claim(&uid)
            .map(|c| c.attached.is_empty())
            .unwrap_or(false)),
        "detached after exit"
    );

    // Without the claim, the hook fails the start with its reason. (The claim's pipe and shm
    // directories are gone with it, so this bundle carries only the hooks.)
    let spec: gpushare::cdi::Spec = serde_json::from_slice(&fs::read(&spec).unwrap()).unwrap();
    let hooks_only = gpushare::cdi::ContainerEdits {
        hooks: spec.devices[0].container_edits.hooks.clone(),
        ..Default::default()
    };
    d.unprepare(&uid);
    gpushare_cli::container::runc_config(&bundle, "true", &hooks_only).unwrap();
    let out = run("gs-runc-2").wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "runc must fail without the claim");
    assert!(
        stderr.contains(&uid) && stderr.contains("not prepared"),
        "hook's reason in runc's error: {stderr}"
    );
    let _ = Command::new("runc")
        .arg("--root")
        .arg(&runc_root)
        .args(["delete", "-f", "gs-runc-2"])
        .status();
}

/// A daemon on the p4d.24xlarge with gpu-2 in MIG mode, writing CDI specs where podman reads
/// them (/etc/cdi and /var/run/cdi only).
fn mig_daemon_for_podman() -> Daemon {
    Daemon::start_on(
        DaemonOptions {
            mps_control: bin("gpushare-mps-control"),
            cdi_dir: Some(PathBuf::from("/var/run/cdi")),
            run_dir: None,
        },
        &p4d_mig_profile(),
    )
}

/// Runs a podman container on claim `uid` and asserts that it sees the parent GPU's node and
/// the two capability nodes of MIG slice `rec` as character devices.
fn assert_slice_in_podman(d: &Daemon, uid: &str, rec: &MigInstanceInfo, tmp: &Path) {
    // The GI and CI access nodes, as /proc/driver/nvidia-caps/mig-minors numbers them.
    let gi_cap = 3 + 2 * 15 * 9 + rec.gi_id * 9;
    let ci_cap = gi_cap + 1 + rec.ci_id.unwrap();
    let rootfs = busybox_rootfs(tmp, &[]);
    let out = gpushare_cli::container::podman_run(
        &format!("gpushare.io/claim={uid}"),
        &rootfs,
        &format!("ls -l /dev/nvidia{} /dev/nvidia-caps/", rec.gpu_minor),
    )
    .output()
    .expect("podman run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "podman failed: {stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    for cap in [gi_cap, ci_cap] {
        let line = stdout
            .lines()
            .find(|l| l.ends_with(&format!(" nvidia-cap{cap}")))
            .unwrap_or_else(|| panic!("nvidia-cap{cap} missing in the container: {stdout}"));
        assert!(line.starts_with('c'), "a character device: {line}");
    }
    assert!(
        stdout.contains(&format!("/dev/nvidia{}", rec.gpu_minor)),
        "{stdout}"
    );
}

#[test]
fn podman_container_sees_the_mig_capability_device_nodes() {
    if !need(is_root(), "root")
        || !need(which("podman").is_some(), "podman")
        || !need(which("runc").is_some(), "runc")
    {
        return;
    }
    let Some(cases) = cases_dir() else {
        need(false, "shared/cases");
        return;
    };
    let _serial = global_lock();
    let d = mig_daemon_for_podman();
    let uid = unique_uid("podman-mig");
    let claim = with_uid(
        &load_claim(&cases.join("claims/seed-mig-3g20gb.yaml")),
        &uid,
    );
    d.prepare(&claim)
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let c = claim_via_cli(&d, &uid);
    let tmp = tempfile::tempdir().unwrap();
    assert_slice_in_podman(&d, &uid, &c.groups[0].mig[0], tmp.path());
    d.unprepare(&uid);
    d.assert_nothing_left(&uid, &[]);
    let g2 = d.gpus()["gpu-2"].clone();
    assert!(g2.mig_devices.is_empty(), "{:?}", g2.mig_devices);
}

#[test]
fn podman_container_on_a_static_mig_device_a_layout_made() {
    if !need(is_root(), "root")
        || !need(which("podman").is_some(), "podman")
        || !need(which("runc").is_some(), "runc")
    {
        return;
    }
    let _serial = global_lock();
    let d = mig_daemon_for_podman();
    // Static MIG: the layout is made first (here by `gpushare mig apply`; mig-parted or
    // nvidia-smi at node setup on a real node), then a claim names one of its devices.
    let tmp = tempfile::tempdir().unwrap();
    let layout = tmp.path().join("layout.yaml");
    fs::write(
        &layout,
        "version: v1\nmig-configs:\n  g2:\n    - devices: [2]\n      mig-enabled: true\n      mig-devices: {\"1g.5gb\": 2, \"2g.10gb\": 1, \"3g.20gb\": 1}\n",
    )
    .unwrap();
    let out = Command::new(bin("gpushare"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["mig", "apply", "-f", layout.to_str().unwrap(), "-c", "g2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = d.gpus()["gpu-2"].mig_devices.clone();
    assert_eq!(before.len(), 4, "{before:?}");
    let three = before
        .iter()
        .find(|m| m.profile == "3g.20gb")
        .unwrap()
        .clone();
    let device = format!(
        "gpu-2-mig-3g20gb-{}-{}",
        three.gi_profile_id, three.placement_start
    );
    let uid = unique_uid("podman-static-mig");
    let claim = serde_json::json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "static", "namespace": "default", "uid": uid},
        "status": {"allocation": {"devices": {"results": [{"request": "gpu",
            "driver": "gpu.nvidia.com", "pool": NODE, "device": device}]}}}});
    d.prepare(&claim)
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let c = claim_via_cli(&d, &uid);
    let rec = c.groups[0].mig[0].clone();
    assert_eq!(rec.uuid, three.uuid, "the layout's instance itself");
    assert_eq!(rec.origin, gpushare_proto::MigOrigin::Existing);
    assert_slice_in_podman(&d, &uid, &rec, tmp.path());
    d.unprepare(&uid);
    d.assert_nothing_left(&uid, &[]);
    let after: Vec<String> = d.gpus()["gpu-2"]
        .mig_devices
        .iter()
        .map(|m| m.uuid.clone())
        .collect();
    let want: Vec<String> = before.iter().map(|m| m.uuid.clone()).collect();
    assert_eq!(after, want, "the layout is left as it was");
}
