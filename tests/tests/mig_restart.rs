//! Dynamic MIG across gpushared restarts, against a real gpushared on a simulated p4d.24xlarge
//! whose gpu-2 is in MIG mode (`daemon/examples/profiles/p4d.24xlarge-mig2.toml`): the
//! simulated GPUs keep their MIG instances while gpushared is away, as hardware does; an
//! instance that vanished meanwhile (a GPU reset, a destroy by hand: the simulated node's
//! `reset-gpus` switch) is recreated at the claim's placement with the claim's CDI spec and
//! MPS control daemon following the new MIG device, or, where it cannot be made again (MIG
//! mode turned off meanwhile), the claim is Degraded with the reason and still releasable; two
//! claims never hold one slice, and releasing one never destroys another's.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpushare_e2e::*;
use gpushare_proto::{
    ClaimInfo, ClaimState, Client, ClientError, ErrorCode, GpuInfo, HealthInfo, Method,
    MigInstanceInfo, PrepareParams, PrepareResult, StrategyInfo, UidParams, UnprepareResult,
};
use serde_json::{json, Value};

/// A gpushared that is stopped and started again on the same socket and directories.
struct Node {
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// Its CDI directory: its own, or podman's `/var/run/cdi` ([`Node::for_containers`]).
    cdi_dir: PathBuf,
    /// The simulated node's own directory (`--sim-dev-root`): its device nodes and the MIG
    /// state its GPUs keep while gpushared is away.
    sim_dir: PathBuf,
    /// The boot ID file it reads (`--boot-id-file`).
    boot_file: PathBuf,
}

impl Node {
    fn new() -> Node {
        // Under /tmp with a short name: MPS sockets live under the run directory.
        let dir = tempfile::Builder::new()
            .prefix("gm-")
            .tempdir_in("/tmp")
            .unwrap();
        fs::write(
            dir.path().join("config.toml"),
            "[metrics]\nenabled = false\n",
        )
        .unwrap();
        let boot_file = dir.path().join("boot_id");
        fs::write(&boot_file, "boot-1\n").unwrap();
        Node {
            cdi_dir: dir.path().join("cdi"),
            // The default: inside the run directory.
            sim_dir: dir.path().join("run/simulated-dev"),
            boot_file,
            dir,
            child: None,
        }
    }

    /// A node whose containers podman starts: its CDI directory is podman's `/var/run/cdi`
    /// (the driver's spec it writes there is removed at drop), and its simulated GPUs keep
    /// their state outside the run directory, as hardware keeps its own across a reboot that
    /// empties `/run` (a reboot still loses their MIG instances: [`Node::reboot_while_away`]).
    fn for_containers() -> Node {
        let mut node = Node::new();
        node.cdi_dir = PathBuf::from("/var/run/cdi");
        node.sim_dir = node.path("gpus");
        node
    }

    /// What a reboot does while gpushared is stopped: a new boot ID, every MIG instance gone
    /// (MIG mode stays, as on hardware), the run directory emptied, and `claims`' CDI specs
    /// and the driver's gone from the CDI directory (`/var/run/cdi` is a tmpfs).
    fn reboot_while_away(&self, claims: &[&str]) {
        assert!(self.child.is_none(), "gpushared runs");
        let boot = fs::read_to_string(&self.boot_file).unwrap();
        fs::write(&self.boot_file, format!("{}-next\n", boot.trim())).unwrap();
        fs::write(self.sim_dir.join("reset-gpus"), "all\n").unwrap();
        fs::remove_dir_all(self.path("run")).unwrap();
        for uid in claims {
            let _ = fs::remove_file(self.cdi_dir.join(format!("gpushare.io-claim_{uid}.json")));
        }
        let _ = fs::remove_file(self.driver_spec());
    }

    fn driver_spec(&self) -> PathBuf {
        self.cdi_dir.join("gpushare.io-gpu.json")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn socket(&self) -> PathBuf {
        self.path("sock")
    }

    fn sim_dir(&self) -> PathBuf {
        self.sim_dir.clone()
    }

    fn log(&self) -> String {
        fs::read_to_string(self.path("gpushared.log")).unwrap_or_default()
    }

    fn start(&mut self) {
        assert!(self.child.is_none(), "gpushared already runs");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("gpushared.log"))
            .unwrap();
        let child = Command::new(bin("gpushared"))
            .arg("--config")
            .arg(self.path("config.toml"))
            .args(["--simulate", &p4d_mig_profile(), "--node-name", NODE])
            .args(["--shm-size-mib", "16", "--mps-timeout", "5"])
            .arg("--socket")
            .arg(self.socket())
            .arg("--state-dir")
            .arg(self.path("state"))
            .arg("--run-dir")
            .arg(self.path("run"))
            .arg("--cdi-dir")
            .arg(&self.cdi_dir)
            .arg("--sim-dev-root")
            .arg(&self.sim_dir)
            .arg("--boot-id-file")
            .arg(&self.boot_file)
            .arg("--mps-control")
            .arg(bin("gpushare-mps-control"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawning gpushared");
        self.child = Some(child);
        let ready = wait_until(Duration::from_secs(60), || {
            Client::connect(self.socket(), Duration::from_secs(2))
                .and_then(|mut c| c.call::<(), HealthInfo>(Method::Health, None))
                .is_ok_and(|h| h.ready)
        });
        assert!(
            ready,
            "gpushared did not become ready; log:\n{}",
            self.log()
        );
    }

    /// SIGTERM, as systemd stops it; MPS control daemons and MIG instances stay.
    fn stop(&mut self) {
        let mut child = self.child.take().expect("gpushared runs");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "gpushared did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn client(&self) -> Client {
        Client::connect(self.socket(), Duration::from_secs(60)).unwrap()
    }

    fn prepare(&self, claim: &Value) -> Result<PrepareResult, ClientError> {
        self.client().call(
            Method::Prepare,
            Some(&PrepareParams {
                claim: claim.clone(),
            }),
        )
    }

    fn claim(&self, uid: &str) -> ClaimInfo {
        self.client()
            .call(Method::GetClaim, Some(&UidParams { uid: uid.into() }))
            .unwrap_or_else(|e| panic!("claim {uid}: {e}; log:\n{}", self.log()))
    }

    fn unprepare(&self, uid: &str) {
        let r: UnprepareResult = self
            .client()
            .call(Method::Unprepare, Some(&UidParams { uid: uid.into() }))
            .unwrap_or_else(|e| panic!("unprepare {uid}: {e}; log:\n{}", self.log()));
        assert!(r.released, "{uid} was not prepared");
    }

    fn gpu(&self, name: &str) -> GpuInfo {
        let gpus: Vec<GpuInfo> = self.client().call(Method::ListGpus, None::<&()>).unwrap();
        gpus.into_iter().find(|g| g.name == name).unwrap()
    }

    fn cli(&self, args: &[&str]) -> Output {
        Command::new(bin("gpushare"))
            .arg("--socket")
            .arg(self.socket())
            .args(args)
            .output()
            .unwrap()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.child.is_some() {
            // Release whatever a failed test left, so no MPS daemon outlives the test.
            if let Ok(claims) = Client::connect(self.socket(), Duration::from_secs(5))
                .and_then(|mut c| c.call::<(), Vec<ClaimInfo>>(Method::ListClaims, None))
            {
                for c in claims {
                    let _ = Client::connect(self.socket(), Duration::from_secs(30)).and_then(
                        |mut cl| {
                            cl.call::<_, Value>(Method::Unprepare, Some(&UidParams { uid: c.uid }))
                        },
                    );
                }
            }
            self.stop();
        }
        if self.cdi_dir != self.path("cdi") {
            // Nothing else removes it from a shared CDI directory.
            let _ = fs::remove_file(self.driver_spec());
        }
    }
}

/// A claim allocated `device`, with `parameters` as its opaque config (none: no config).
fn mig_claim(uid: &str, device: &str, parameters: Option<Value>) -> Value {
    let config: Vec<Value> = parameters
        .into_iter()
        .map(|p| {
            json!({"source": "FromClaim", "requests": ["gpu"],
            "opaque": {"driver": "gpu.nvidia.com", "parameters": p}})
        })
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"uid": uid, "name": "mig", "namespace": "e2e"},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": device}],
            "config": config}}}})
}

fn the_slice(c: &ClaimInfo) -> MigInstanceInfo {
    assert_eq!(c.groups.len(), 1, "{c:?}");
    assert_eq!(c.groups[0].mig.len(), 1, "{c:?}");
    c.groups[0].mig[0].clone()
}

/// `/dev/nvidia-caps/nvidia-cap<N>` paths a claim's CDI spec gives its containers.
fn cap_nodes(node: &Node, uid: &str) -> Vec<(String, String)> {
    let path = node.cdi_dir.join(format!("gpushare.io-claim_{uid}.json"));
    let spec: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    spec["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["path"].as_str().unwrap().starts_with("/dev/nvidia-caps/"))
        .map(|n| {
            (
                n["path"].as_str().unwrap().to_string(),
                n["hostPath"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The capability device nodes of GPU instance `gi` and its compute instance `ci` on gpu-2,
/// numbered as `/proc/driver/nvidia-caps/mig-minors` lays them out.
fn expected_caps(gi: u32, ci: u32) -> Vec<String> {
    vec![
        format!(
            "/dev/nvidia-caps/nvidia-cap{}",
            gpushare::gpu::mig_cap_minor(2, gi, None)
        ),
        format!(
            "/dev/nvidia-caps/nvidia-cap{}",
            gpushare::gpu::mig_cap_minor(2, gi, Some(ci))
        ),
    ]
}

fn control_daemon_env(pid: i32) -> String {
    String::from_utf8_lossy(&fs::read(format!("/proc/{pid}/environ")).unwrap())
        .split('\0')
        .find_map(|kv| kv.strip_prefix("CUDA_VISIBLE_DEVICES="))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn mig_instances_outlive_gpushared_and_a_slice_is_never_granted_twice() {
    if setup().is_none() {
        return;
    }
    let mut node = Node::new();
    node.start();
    let first = unique_uid("mig-keep");
    node.prepare(&mig_claim(
        &first,
        "gpu-2-mig-3g20gb-9-4",
        Some(json!({"sharingMode": "mig", "migProfile": "3g.20gb"})),
    ))
    .unwrap_or_else(|e| panic!("{e}; log:\n{}", node.log()));
    let before = the_slice(&node.claim(&first));

    node.stop();
    node.start();
    let gpu = node.gpu("gpu-2");
    assert_eq!(
        gpu.mig_devices.len(),
        1,
        "the MIG instance outlives gpushared, as on hardware: {gpu:?}"
    );
    let live = &gpu.mig_devices[0];
    assert_eq!(
        (live.uuid.as_str(), live.gi_id, live.placement_start),
        (before.uuid.as_str(), Some(before.gi_id), 4)
    );
    assert_eq!(live.owner.as_deref(), Some(first.as_str()));
    let after = node.claim(&first);
    assert_eq!(after.state, ClaimState::Prepared);
    assert_eq!(the_slice(&after), before, "nothing recreated");

    // The same slice for another claim: Conflict naming the holder; nothing of it left.
    let second = unique_uid("mig-twice");
    let e = node
        .prepare(&mig_claim(&second, "gpu-2-mig-3g20gb-9-4", None))
        .expect_err("one slice granted to two claims");
    let body = e.remote().unwrap_or_else(|| panic!("{e}"));
    assert_eq!(body.code, ErrorCode::Conflict, "{}", body.message);
    assert!(body.message.contains(&first), "{}", body.message);
    assert_eq!(node.gpu("gpu-2").mig_devices.len(), 1);

    node.unprepare(&first);
    assert!(node.gpu("gpu-2").mig_devices.is_empty());
}

#[test]
fn vanished_mig_instances_are_recreated_at_their_placements_with_cdi_and_mps_following() {
    if setup().is_none() {
        return;
    }
    let mut node = Node::new();
    node.start();
    // Prepared in this order, the slice at 0 gets GPU instance 1 and the one at 4 gets 2; a
    // start recreates claims in UID order ("a-…" first), so the IDs swap and the capability
    // device nodes of both specs must change.
    let tag = unique_uid("mig");
    let high = format!("a-{tag}");
    let low = format!("b-{tag}");
    node.prepare(&mig_claim(
        &low,
        "gpu-2-mig-3g20gb-9-0",
        Some(
            json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 40}}}),
        ),
    ))
    .unwrap_or_else(|e| panic!("{e}; log:\n{}", node.log()));
    node.prepare(&mig_claim(&high, "gpu-2-mig-3g20gb-9-4", None))
        .unwrap_or_else(|e| panic!("{e}; log:\n{}", node.log()));
    let old_high = the_slice(&node.claim(&high));
    let old_low = the_slice(&node.claim(&low));
    assert_eq!((old_low.gi_id, old_high.gi_id), (1, 2));
    let StrategyInfo::Mps(old_mps) = node.claim(&low).groups[0].sharing.clone() else {
        panic!("not MPS")
    };
    assert_eq!(control_daemon_env(old_mps.control_daemon_pid), old_low.uuid);

    // gpushared away; the GPU is reset meanwhile: every MIG instance on it is gone.
    node.stop();
    fs::write(node.sim_dir().join("reset-gpus"), "gpu-2\n").unwrap();
    node.start();
    assert!(
        !node.sim_dir().join("reset-gpus").exists(),
        "the switch acts once"
    );

    let gpu = node.gpu("gpu-2");
    assert_eq!(gpu.mig_devices.len(), 2, "{gpu:?}");
    for (uid, old, start) in [(&high, &old_high, 4), (&low, &old_low, 0)] {
        let c = node.claim(uid);
        assert_eq!(c.state, ClaimState::Prepared, "{uid}: {:?}", c.last_error);
        let new = the_slice(&c);
        assert_eq!(new.placement_start, start, "at its placement");
        assert_eq!(new.device, old.device);
        assert_ne!(
            new.uuid, old.uuid,
            "a recreated instance has a new MIG UUID"
        );
        let live = gpu
            .mig_devices
            .iter()
            .find(|d| d.placement_start == start)
            .unwrap();
        assert_eq!(live.uuid, new.uuid);
        assert_eq!(live.gi_id, Some(new.gi_id));
        assert_eq!(live.owner.as_deref(), Some(uid.as_str()));
        // The CDI spec names the new instance's capability device nodes, and they exist.
        let caps = cap_nodes(&node, uid);
        let paths: Vec<String> = caps.iter().map(|(p, _)| p.clone()).collect();
        assert_eq!(paths, expected_caps(new.gi_id, new.ci_id.unwrap()), "{uid}");
        for (_, host) in &caps {
            let meta = fs::metadata(host).unwrap_or_else(|e| panic!("{host}: {e}"));
            assert!(meta.file_type().is_char_device(), "{host}");
        }
    }
    assert_eq!(the_slice(&node.claim(&high)).gi_id, 1, "IDs swapped");
    assert_eq!(the_slice(&node.claim(&low)).gi_id, 2, "IDs swapped");

    // The MPS control daemon of the slice runs on the new MIG device.
    let c = node.claim(&low);
    let StrategyInfo::Mps(mps) = &c.groups[0].sharing else {
        panic!("not MPS")
    };
    let new_low = the_slice(&c);
    assert_eq!(mps.visible_devices, vec![new_low.uuid.clone()]);
    assert_eq!(control_daemon_env(mps.control_daemon_pid), new_low.uuid);
    assert_eq!(mps.active_thread_percentage, "40.0");
    let detail = node.cli(&["claim", &low]);
    let detail = String::from_utf8_lossy(&detail.stdout);
    assert!(detail.contains(&new_low.uuid), "{detail}");

    node.unprepare(&high);
    node.unprepare(&low);
    assert!(node.gpu("gpu-2").mig_devices.is_empty());
    assert!(
        !gpushare::sys::pid_alive(mps.control_daemon_pid),
        "MPS control daemon left running"
    );
}

#[test]
fn a_slice_that_cannot_be_recreated_leaves_its_claim_degraded_and_releasable() {
    if setup().is_none() {
        return;
    }
    let mut node = Node::new();
    node.start();
    let uid = unique_uid("mig-lost");
    node.prepare(&mig_claim(&uid, "gpu-2-mig-3g20gb-9-4", None))
        .unwrap_or_else(|e| panic!("{e}; log:\n{}", node.log()));
    let gpu_uuid = node.gpu("gpu-2").uuid;
    node.stop();
    // While gpushared is away an operator turns MIG mode off on gpu-2 (`nvidia-smi -i 2 -mig
    // 0`, pending on this A100: written into the simulated hardware's state) and resets it.
    let state = node.sim_dir().join("mig-state.json");
    let mut hw: Value = serde_json::from_slice(&fs::read(&state).unwrap()).unwrap();
    hw["gpus"][&gpu_uuid]["mig_pending"] = json!(false);
    fs::write(&state, serde_json::to_vec(&hw).unwrap()).unwrap();
    fs::write(node.sim_dir().join("reset-gpus"), "gpu-2\n").unwrap();
    node.start();

    let c = node.claim(&uid);
    assert_eq!(c.state, ClaimState::Degraded);
    let why = c.last_error.clone().unwrap_or_default();
    assert!(
        why.contains("gpu-2-mig-3g20gb-9-4") && why.contains("MIG mode"),
        "{why}"
    );
    let g = node.gpu("gpu-2");
    assert!(!g.mig_enabled && g.mig_devices.is_empty(), "{g:?}");
    let status = node.cli(&["status"]);
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("degraded:     1"),
        "{}",
        String::from_utf8_lossy(&status.stdout)
    );
    // New containers are refused with the reason.
    let e = node
        .client()
        .call::<_, Value>(
            Method::Attach,
            Some(&gpushare_proto::AttachParams {
                claim_uid: uid.clone(),
                container_id: "c1".into(),
                pid: None,
                bundle: None,
                pod: None,
            }),
        )
        .expect_err("a container attached to a claim without its slice");
    let body = e.remote().unwrap_or_else(|| panic!("{e}"));
    assert_eq!(body.code, ErrorCode::NotReady, "{}", body.message);
    assert!(
        body.message.contains("gpu-2-mig-3g20gb-9-4"),
        "{}",
        body.message
    );
    // The release works and leaves nothing.
    node.unprepare(&uid);
    assert!(!node
        .path(&format!("cdi/gpushare.io-claim_{uid}.json"))
        .exists());
    assert!(!node.path(&format!("run/claims/{uid}")).exists());
}

/// The capability device nodes a container started by podman with CDI devices `ids` has,
/// sorted: the MIG slice it was given.
fn caps_in_podman(node: &Node, rootfs: &Path, ids: &[String]) -> Vec<String> {
    let out = gpushare_cli::container::podman_run_devices(
        ids,
        &[],
        rootfs,
        "for n in /dev/nvidia-caps/*; do echo cap=$n; done",
    )
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "podman with {ids:?}: {stdout}\n{}\nlog:\n{}",
        String::from_utf8_lossy(&out.stderr),
        node.log()
    );
    let mut caps: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("cap="))
        .map(str::to_string)
        .collect();
    caps.sort();
    caps
}

#[test]
fn cdi_ids_kubelet_cached_give_the_recreated_slice_after_a_reset_and_a_reboot() {
    if setup().is_none()
        || !need(which("podman").is_some(), "podman")
        || !need(which("runc").is_some(), "runc")
    {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let rootfs = busybox_rootfs(tmp.path(), &[]);
    let mut node = Node::for_containers();
    node.start();
    // Prepared in this order, the slice at 0 gets GPU instance 1 and the one at 4 gets 2; a
    // start recreates claims in UID order ("a-…" first), so the IDs swap: a container given
    // the first slice's nodes would see the other claim's slice.
    let tag = unique_uid("mig-ids");
    let (high, low) = (format!("a-{tag}"), format!("b-{tag}"));
    let mut handed = Vec::new();
    for (uid, device) in [
        (&low, "gpu-2-mig-3g20gb-9-0"),
        (&high, "gpu-2-mig-3g20gb-9-4"),
    ] {
        let r = node
            .prepare(&mig_claim(uid, device, None))
            .unwrap_or_else(|e| panic!("{e}; log:\n{}", node.log()));
        let slice = the_slice(&node.claim(uid));
        let ids = r.requests[0].cdi_device_ids.clone();
        assert_eq!(ids[0], format!("gpushare.io/gpu={}", slice.uuid));
        let caps = caps_in_podman(&node, &rootfs, &ids);
        assert_eq!(
            caps,
            expected_caps(slice.gi_id, slice.ci_id.unwrap()),
            "{uid}"
        );
        handed.push((uid.clone(), ids, slice));
    }
    let claims = [low.as_str(), high.as_str()];
    for fault in ["reset", "reboot"] {
        // Kubelet never prepares again a claim it checkpointed as prepared: a container
        // restarted after the fault asks for the IDs the first prepare returned.
        node.stop();
        if fault == "reset" {
            fs::write(node.sim_dir().join("reset-gpus"), "gpu-2\n").unwrap();
        } else {
            node.reboot_while_away(&claims);
        }
        node.start();
        if fault == "reboot" {
            assert!(node.log().contains("rebooted"), "{}", node.log());
        }
        // Every ID resolves as the CDI library reads the CDI directory.
        let registry = gpushare_cdi::Registry::load(&[&node.cdi_dir]);
        for (uid, ids, first) in &handed {
            let c = node.claim(uid);
            assert_eq!(
                c.state,
                ClaimState::Prepared,
                "{fault}, {uid}: {:?}",
                c.last_error
            );
            let now = the_slice(&c);
            assert_ne!(now.uuid, first.uuid, "{fault}, {uid}: made again");
            registry
                .resolve(ids)
                .unwrap_or_else(|e| panic!("{fault}, {uid}: {ids:?}: {e}"));
            let want = expected_caps(now.gi_id, now.ci_id.unwrap());
            // The driver's device alone, and the whole list, give the recreated slice.
            assert_eq!(
                caps_in_podman(&node, &rootfs, &ids[..1]),
                want,
                "{fault}, {uid}"
            );
            assert_eq!(caps_in_podman(&node, &rootfs, ids), want, "{fault}, {uid}");
            // And they stay the IDs the claim answers with, as its detail says.
            assert_eq!(&c.requests[0].cdi_device_ids, ids, "{fault}, {uid}");
            let detail = node.cli(&["claim", uid]);
            let detail = String::from_utf8_lossy(&detail.stdout);
            assert!(
                detail.contains(&now.uuid)
                    && detail.contains(&format!("keep its first name {}", first.uuid)),
                "{detail}"
            );
        }
        assert_ne!(
            the_slice(&node.claim(&high)).gi_id,
            handed[1].2.gi_id,
            "{fault}: the GPU instances changed places"
        );
    }
    for uid in claims {
        node.unprepare(uid);
        assert!(!node
            .cdi_dir
            .join(format!("gpushare.io-claim_{uid}.json"))
            .exists());
    }
    let spec = fs::read_to_string(node.driver_spec()).unwrap();
    for (_, _, first) in &handed {
        assert!(
            !spec.contains(&first.uuid),
            "a released claim's name is left"
        );
    }
}
