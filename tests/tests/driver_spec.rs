//! The NVIDIA driver's user-space with a claim's devices, end to end: a real gpushared on a
//! simulated node generates the driver's CDI spec (the simulated `nvidia-ctk cdi generate`,
//! or a stand-in `nvidia-ctk` program), and real containers (podman, which applies CDI with its
//! vendored reference library; `gpushare-runtime` before runc) get the driver's files at the
//! spec's paths, the claim's MPS pipe directory at `/tmp/nvidia-mps` even though a node-wide
//! one existed at generation time, and no GPU outside the claim although the image asks for
//! `NVIDIA_VISIBLE_DEVICES=all`. Where two devices name one container path, the later device
//! wins: that is what putting the claim's device last relies on, shown in both orders. A node
//! without the toolkit, or whose toolkit spec lacks the claim's GPU, refuses the claim naming
//! what is missing and leaves nothing behind.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use gpushare_e2e::driver_view::*;
use gpushare_e2e::*;
use serde_json::{json, Value};

fn mps_claim(uid: &str, device: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"uid": uid, "name": "driver-spec", "namespace": "default"},
           "status": {"allocation": {"devices": {
               "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": device}],
               "config": [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com",
                 "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                   "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}}}}]}}}})
}

#[test]
fn podman_on_an_mps_claim_sees_the_drivers_files_its_own_pipe_and_no_other_gpu() {
    if !need(is_root(), "root")
        || !need(which("podman").is_some(), "podman")
        || !need(which("runc").is_some(), "runc")
    {
        return;
    }
    let _serial = global_lock();
    let tmp = tempfile::tempdir().unwrap();
    let root = driver_root_with_host_mps(tmp.path());
    let d = Daemon::start_with_config(
        DaemonOptions {
            mps_control: bin("gpushare-mps-control"),
            // podman reads CDI specs from /etc/cdi and /var/run/cdi only.
            cdi_dir: Some(PathBuf::from("/var/run/cdi")),
            run_dir: None,
        },
        &sim_root_config(&root),
    );
    let uid = unique_uid("drv-podman");
    let r = d
        .prepare(&mps_claim(&uid, "gpu-1"))
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let ids = r.requests[0].cdi_device_ids.clone();
    let gpu1 = d.gpus()["gpu-1"].uuid.clone();
    assert_eq!(
        ids,
        vec![
            format!("gpushare.io/gpu={gpu1}"),
            format!("gpushare.io/claim={uid}")
        ]
    );
    let files = driver_files(&d.driver_spec());
    let rootfs = busybox_rootfs(tmp.path(), &[]);
    let out = gpushare_cli::container::podman_run_devices(
        &ids,
        &["NVIDIA_VISIBLE_DEVICES=all"],
        &rootfs,
        &view_script(&files),
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "podman: {stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    check_view(&stdout, &files, "nvidia1");
    d.unprepare(&uid);
    d.assert_nothing_left(&uid, &[]);
}

/// A spec of another kind whose device names the container paths the claim's device names:
/// the host MPS pipe dir at `/tmp/nvidia-mps`, `CUDA_MPS_PIPE_DIRECTORY`, and the claim's GPU
/// node (named twice). Removed on drop.
struct ClashingSpec {
    path: PathBuf,
    id: String,
}

impl ClashingSpec {
    fn write(cdi_dir: &Path, host_mps: &Path, gpu_node: &Path) -> ClashingSpec {
        let class = format!("clash{}", std::process::id());
        let path = cdi_dir.join(format!("e2e.gpushare.io-{class}.json"));
        let spec = json!({"cdiVersion": "0.5.0", "kind": format!("e2e.gpushare.io/{class}"),
            "devices": [{"name": "drv", "containerEdits": {
                "env": ["CUDA_MPS_PIPE_DIRECTORY=/host-mps"],
                "deviceNodes": [{"path": "/dev/nvidia1", "hostPath": gpu_node.display().to_string()}],
                "mounts": [{"hostPath": host_mps.display().to_string(), "containerPath": "/tmp/nvidia-mps",
                            "options": ["rbind", "rprivate", "nosuid", "nodev", "noexec"]}]}}]});
        fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        ClashingSpec {
            path,
            id: format!("e2e.gpushare.io/{class}=drv"),
        }
    }
}

impl Drop for ClashingSpec {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// `runc spec` bundle with `script` under `/bin/sh`, asking for `ids` through
/// `GPUSHARE_VISIBLE_DEVICES` as an image could, with `NVIDIA_VISIBLE_DEVICES=all`.
fn runtime_bundle(dir: &Path, ids: &[String], script: &str) -> PathBuf {
    let bundle = dir.join("bundle");
    fs::create_dir_all(&bundle).unwrap();
    busybox_rootfs(&bundle, &[]);
    let st = Command::new("runc")
        .args(["spec", "--bundle"])
        .arg(&bundle)
        .status()
        .unwrap();
    assert!(st.success());
    let path = bundle.join("config.json");
    let mut config: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    config["process"]["terminal"] = json!(false);
    config["process"]["args"] = json!(["/bin/sh", "-c", script]);
    config["root"]["readonly"] = json!(false);
    let env = config["process"]["env"].as_array_mut().unwrap();
    env.push(json!("NVIDIA_VISIBLE_DEVICES=all"));
    env.push(json!(format!("GPUSHARE_VISIBLE_DEVICES={}", ids.join(","))));
    fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    bundle
}

/// Runs `gpushare-runtime run` (runc underneath) on `bundle`, CDI specs from `spec_dir`.
fn runtime_run(dir: &Path, spec_dir: &Path, bundle: &Path, id: &str) -> std::process::Output {
    let config = dir.join("runtime.toml");
    fs::write(
        &config,
        format!(
            "runtimes = [\"runc\"]\nspec_dirs = [{:?}]\nlog_file = {:?}\nlog_level = \"debug\"\n",
            spec_dir.display().to_string(),
            dir.join("runtime.log").display().to_string()
        ),
    )
    .unwrap();
    Command::new(bin("gpushare-runtime"))
        .env("GPUSHARE_RUNTIME_CONFIG", &config)
        .arg("--root")
        .arg(dir.join("runc-state"))
        .args(["run", "--bundle"])
        .arg(bundle)
        .arg(id)
        .output()
        .unwrap()
}

#[test]
fn the_later_device_wins_where_two_specs_name_one_path_in_podman_and_gpushare_runtime() {
    if !need(is_root(), "root")
        || !need(which("podman").is_some(), "podman")
        || !need(which("runc").is_some(), "runc")
    {
        return;
    }
    let _serial = global_lock();
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start(DaemonOptions {
        mps_control: bin("gpushare-mps-control"),
        cdi_dir: Some(PathBuf::from("/var/run/cdi")),
        run_dir: None,
    });
    let uid = unique_uid("drv-order");
    let r = d
        .prepare(&mps_claim(&uid, "gpu-1"))
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let claim_id = r.requests[0].cdi_device_ids.last().unwrap().clone();
    let host_mps = tmp.path().join("host-mps");
    fs::create_dir(&host_mps).unwrap();
    fs::write(host_mps.join("host-mps-marker"), "node-wide").unwrap();
    let clash = ClashingSpec::write(
        Path::new("/var/run/cdi"),
        &host_mps,
        &d.run_dir.join("simulated-dev/nvidia1"),
    );
    let script = "for e in $(ls -A /tmp/nvidia-mps); do echo pipe-entry $e; done; \
                  echo env=$CUDA_MPS_PIPE_DIRECTORY; ls -l /dev | grep -c ' nvidia1$' | sed 's/^/nvidia1-nodes=/'";
    let rootfs = busybox_rootfs(tmp.path(), &[]);
    for (order, ids) in [
        ("claim last", vec![clash.id.clone(), claim_id.clone()]),
        ("claim first", vec![claim_id.clone(), clash.id.clone()]),
    ] {
        let podman = gpushare_cli::container::podman_run_devices(&ids, &[], &rootfs, script)
            .output()
            .unwrap();
        let dir = tmp.path().join(order.replace(' ', "-"));
        fs::create_dir(&dir).unwrap();
        let bundle = runtime_bundle(&dir, &ids, script);
        let runtime = runtime_run(
            &dir,
            Path::new("/var/run/cdi"),
            &bundle,
            &format!("gs-order-{}", std::process::id()),
        );
        for (engine, out) in [("podman", podman), ("gpushare-runtime", runtime)] {
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{engine}, {order}: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            // Named by both devices, the GPU's node is there once either way.
            assert!(
                stdout.contains("nvidia1-nodes=1"),
                "{engine}, {order}: {stdout}"
            );
            if order == "claim last" {
                assert!(
                    stdout.contains("pipe-entry control") && !stdout.contains("host-mps-marker"),
                    "{engine}, {order}: the claim's mount wins: {stdout}"
                );
                assert!(
                    stdout.contains("env=/tmp/nvidia-mps"),
                    "{engine}, {order}: {stdout}"
                );
            } else {
                assert!(
                    stdout.contains("pipe-entry host-mps-marker")
                        && !stdout.contains("pipe-entry control"),
                    "{engine}, {order}: the later device's mount wins: {stdout}"
                );
                assert!(
                    stdout.contains("env=/host-mps"),
                    "{engine}, {order}: {stdout}"
                );
            }
        }
    }
    drop(clash);
    d.unprepare(&uid);
    d.assert_nothing_left(&uid, &[]);
}

#[test]
fn gpushare_runtime_applies_both_specs() {
    if !need(is_root(), "root") || !need(which("runc").is_some(), "runc") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = driver_root_with_host_mps(tmp.path());
    let d = Daemon::start_with_config(
        DaemonOptions {
            mps_control: bin("gpushare-mps-control"),
            cdi_dir: None,
            run_dir: None,
        },
        &sim_root_config(&root),
    );
    let uid = unique_uid("drv-runtime");
    let r = d
        .prepare(&mps_claim(&uid, "gpu-5"))
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let ids = r.requests[0].cdi_device_ids.clone();
    let files = driver_files(&d.driver_spec());
    let bundle = runtime_bundle(tmp.path(), &ids, &view_script(&files));
    let out = runtime_run(
        tmp.path(),
        &d.cdi_dir,
        &bundle,
        &format!("gs-drv-{}", std::process::id()),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        fs::read_to_string(tmp.path().join("runtime.log")).unwrap_or_default()
    );
    check_view(&stdout, &files, "nvidia5");
    // gpushare-runtime replaces a variable the edits set: one definition, void.
    assert_eq!(
        stdout.matches("NVIDIA_VISIBLE_DEVICES=").count(),
        1,
        "{stdout}"
    );
    d.unprepare(&uid);
    d.assert_nothing_left(&uid, &[]);
}

#[test]
fn a_node_without_the_toolkit_refuses_the_claim_in_one_line_and_leaves_nothing() {
    if !need(is_root(), "root") {
        return;
    }
    let d = Daemon::start_with_config(
        DaemonOptions {
            mps_control: bin("gpushare-mps-control"),
            cdi_dir: None,
            run_dir: None,
        },
        "[cdi]\nnvidia_ctk = \"/nonexistent/nvidia-ctk\"\n",
    );
    assert!(
        d.log()
            .contains("cannot generate the NVIDIA driver's CDI spec"),
        "said at start: {}",
        d.log()
    );
    let uid = unique_uid("drv-none");
    let err = d.prepare(&mps_claim(&uid, "gpu-0")).unwrap_err();
    let body = err.remote().cloned().unwrap();
    assert_eq!(body.code.as_str(), "Unsupported", "{body:?}");
    for part in [
        "NVIDIA Container Toolkit not found",
        "/nonexistent/nvidia-ctk",
        "install nvidia-container-toolkit",
    ] {
        assert!(body.message.contains(part), "{part:?} in {body:?}");
    }
    assert!(!body.message.contains('\n'));
    d.assert_nothing_left(&uid, &[]);
    assert!(!d.driver_spec().exists());
    // What an operator sees from the CLI: that one line.
    let file = d.dir.path().join("claim.json");
    fs::write(&file, mps_claim(&uid, "gpu-0").to_string()).unwrap();
    let out = Command::new(bin("gpushare"))
        .arg("--socket")
        .arg(&d.socket)
        .arg("prepare")
        .arg("-f")
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("NVIDIA Container Toolkit not found"),
        "{stderr}"
    );
    d.assert_nothing_left(&uid, &[]);
}

/// The spec a stand-in `nvidia-ctk` writes for the simulated p4d.24xlarge of a daemon whose
/// run directory is `run_dir`: a device per GPU, but those of minors `without`.
fn canned_spec(run_dir: &Path, without: &[u32]) -> Value {
    let gpus = gpushare::gpu::catalog::resolve("p4d.24xlarge")
        .unwrap()
        .gpus(NODE);
    let devices: Vec<Value> = gpus
        .iter()
        .filter(|g| !without.contains(&g.minor))
        .map(|g| {
            json!({"name": g.uuid, "containerEdits": {"deviceNodes": [{"path": format!("/dev/nvidia{}", g.minor),
                "hostPath": run_dir.join(format!("simulated-dev/nvidia{}", g.minor)).display().to_string()}]}})
        })
        .collect();
    json!({"cdiVersion": "0.5.0", "kind": "gpushare.io/gpu",
           "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}, "devices": devices})
}

#[test]
fn a_toolkit_spec_without_the_claims_gpu_refuses_it_naming_the_gpu() {
    if !need(is_root(), "root") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    // The spec a stand-in nvidia-ctk writes: every GPU of the node but gpu-3 (as a spec
    // generated before a GPU came back from a reset would be).
    let gpus = gpushare::gpu::catalog::resolve("p4d.24xlarge")
        .unwrap()
        .gpus(NODE);
    let canned = tmp.path().join("canned.json");
    fs::write(&canned, canned_spec(&run_dir, &[3]).to_string()).unwrap();
    let args_log = tmp.path().join("args.log");
    let ctk = tmp.path().join("nvidia-ctk");
    fs::write(
        &ctk,
        format!(
            "#!/bin/sh\necho \"$@\" >>'{}'\nout=''\nwhile [ $# -gt 0 ]; do [ \"$1\" = --output ] && out=$2; shift; done\ncp '{}' \"$out\"\n",
            args_log.display(),
            canned.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&ctk, fs::Permissions::from_mode(0o755)).unwrap();
    let d = Daemon::start_with_config(
        DaemonOptions {
            mps_control: bin("gpushare-mps-control"),
            cdi_dir: None,
            run_dir: Some(run_dir.clone()),
        },
        &format!(
            "[cdi]\nnvidia_ctk = {:?}\ndriver_root = \"/run/nvidia/driver\"\n",
            ctk.display().to_string()
        ),
    );
    let args = fs::read_to_string(&args_log).unwrap();
    assert!(
        args.lines().next().unwrap().starts_with(
            "cdi generate --vendor gpushare.io --class gpu --device-name-strategy uuid --driver-root /run/nvidia/driver --format json --output "
        ),
        "{args}"
    );
    let ok = unique_uid("drv-gpu2");
    let r = d
        .prepare(&mps_claim(&ok, "gpu-2"))
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    assert_eq!(
        r.requests[0].cdi_device_ids[0],
        format!("gpushare.io/gpu={}", gpus[2].uuid)
    );
    let uid = unique_uid("drv-gpu3");
    let body = d
        .prepare(&mps_claim(&uid, "gpu-3"))
        .unwrap_err()
        .remote()
        .cloned()
        .unwrap();
    assert!(
        body.message.contains(&format!(
            "gpu-3 ({}) not in the NVIDIA driver's CDI spec",
            gpus[3].uuid
        )),
        "{body:?}"
    );
    assert!(body.message.contains("gpushare.io-gpu.json"), "{body:?}");
    d.assert_nothing_left(&uid, &[]);
    d.unprepare(&ok);
    d.assert_nothing_left(&ok, &[]);
}

/// An executable `nvidia-ctk` stand-in at `path` running `body` (a shell script), each run
/// appended to `runs`. Written to a new file and renamed over the old one, as a package
/// update replaces a program.
fn stand_in_ctk(path: &Path, runs: &Path, body: &str) {
    let next = path.with_extension("new");
    fs::write(
        &next,
        format!("#!/bin/sh\necho run >>'{}'\n{body}", runs.display()),
    )
    .unwrap();
    fs::set_permissions(&next, fs::Permissions::from_mode(0o755)).unwrap();
    fs::rename(&next, path).unwrap();
}

/// `GET <path>` over plain HTTP/1.1: the body.
fn http_body(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    raw.split_once("\r\n\r\n").unwrap().1.to_string()
}

#[test]
fn a_failing_nvidia_ctk_shows_everywhere_and_is_not_run_for_every_prepare() {
    if !need(is_root(), "root") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let run_dir = tmp.path().join("run");
    let runs = tmp.path().join("runs.log");
    let ctk = tmp.path().join("nvidia-ctk");
    // What nvidia-ctk says after a driver update without a reboot.
    stand_in_ctk(
        &ctk,
        &runs,
        "echo 'ERRO failed to generate CDI spec: failed to create device CDI specs: failed to initialize NVML: Driver/library version mismatch' >&2\nexit 1\n",
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let d = Daemon::start_with_config(
        DaemonOptions {
            mps_control: bin("gpushare-mps-control"),
            cdi_dir: None,
            run_dir: Some(run_dir.clone()),
        },
        &format!(
            "[cdi]\nnvidia_ctk = {:?}\n[metrics]\nenabled = true\naddress = {metrics:?}\n",
            ctk.display().to_string()
        ),
    );
    let count = || {
        fs::read_to_string(&runs)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let health = || -> gpushare_proto::HealthInfo {
        d.client()
            .call(gpushare_proto::Method::Health, None::<&()>)
            .unwrap()
    };
    // Serving (releases and queries work), and saying that prepares do not.
    let h = health();
    assert!(h.ready);
    let spec = h.driver_spec.clone().expect("driver_spec in health");
    assert!(!spec.ok, "{spec:?}");
    assert!(
        spec.error
            .as_deref()
            .is_some_and(|e| e.contains("Driver/library version mismatch")),
        "{spec:?}"
    );
    assert_eq!(spec.failures, 1, "{spec:?}");
    assert!(spec.retry_in_seconds.is_some_and(|s| s <= 10), "{spec:?}");
    assert_eq!(spec.generate_timeout_seconds, Some(15));
    assert_eq!(count(), 1, "run once at start");
    // Every prepare is refused with the generator's words, without running it each time.
    for i in 0..5 {
        let uid = unique_uid(&format!("drv-mismatch{i}"));
        let body = d
            .prepare(&mps_claim(&uid, "gpu-0"))
            .unwrap_err()
            .remote()
            .cloned()
            .unwrap();
        assert_eq!(body.code.as_str(), "Internal", "{body:?}");
        assert!(
            body.message.contains("Driver/library version mismatch")
                && body.message.contains("runs it again in"),
            "{body:?}"
        );
        d.assert_nothing_left(&uid, &[]);
    }
    // (The retry thread may have run it once meanwhile on a slow machine: 10 s after start.)
    assert!(count() <= 2, "run for every prepare: {} runs", count());
    // gpushare status, text and JSON.
    let status = |json: bool| -> String {
        let mut cmd = Command::new(bin("gpushare"));
        cmd.arg("--socket").arg(&d.socket);
        if json {
            cmd.args(["--output", "json"]);
        }
        let out = cmd.arg("status").output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = status(false);
    assert!(
        text.lines()
            .any(|l| l.starts_with("DRIVER CDI SPEC FAILING: ")
                && l.contains("Driver/library version mismatch")
                && l.ends_with("every prepare that needs it is refused")),
        "{text}"
    );
    let json: Value = serde_json::from_str(&status(true)).unwrap();
    let shown = json
        .pointer("/health/driver_spec")
        .unwrap_or_else(|| panic!("{json}"));
    assert_eq!(shown["ok"], json!(false), "{json}");
    // The metric.
    let scraped = http_body(&metrics, "/metrics");
    assert!(
        scraped.lines().any(|l| l == "gpushare_driver_spec_error 1"),
        "{scraped}"
    );
    // gpushare doctor: FAIL.
    let out = Command::new(bin("gpushare"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["doctor", "--simulate", "p4d.24xlarge", "--config"])
        .arg(d.dir.path().join("config.toml"))
        .arg("--cdi-dir")
        .arg(&d.cdi_dir)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    let line = report
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("driver-spec"))
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        line.starts_with("FAIL") && line.contains("Driver/library version mismatch"),
        "{line}"
    );

    // Fixed (nvidia-ctk replaced): generated again on its own, without waiting for the back-off.
    let canned = tmp.path().join("canned.json");
    fs::write(&canned, canned_spec(&run_dir, &[]).to_string()).unwrap();
    stand_in_ctk(
        &ctk,
        &runs,
        &format!(
            "out=''\nwhile [ $# -gt 0 ]; do [ \"$1\" = --output ] && out=$2; shift; done\ncp '{}' \"$out\"\n",
            canned.display()
        ),
    );
    let healed = wait_until(std::time::Duration::from_secs(8), || {
        health().driver_spec.is_some_and(|s| s.ok)
    });
    assert!(healed, "{:?}\n{}", health().driver_spec, d.log());
    assert!(!status(false).contains("FAILING"));
    let scraped = http_body(&metrics, "/metrics");
    assert!(
        scraped.lines().any(|l| l == "gpushare_driver_spec_error 0"),
        "{scraped}"
    );
    let uid = unique_uid("drv-healed");
    d.prepare(&mps_claim(&uid, "gpu-0"))
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    d.unprepare(&uid);
    d.assert_nothing_left(&uid, &[]);
}
