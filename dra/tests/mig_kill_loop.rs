//! A kill loop over MIG prepares and releases: a real gpushared on the simulated
//! p4d.24xlarge whose gpu-2 is in MIG mode (`daemon/examples/profiles/p4d.24xlarge-mig2.toml`),
//! the real `gpushare-dra` publishing to the API-server stand-in (a server without partitionable
//! devices, as EKS runs through Kubernetes 1.35: the MIG devices that exist are published), and
//! workers that prepare and release MIG slices (named ones, the short form, one with an MPS
//! control daemon on it) beside a static instance of the node's layout. Each round gpushared is
//! killed: at a named crash point of a MIG prepare or release (`GPUSHARE_CRASH_AT`, debug
//! builds) or by `kill -9` at a random moment. After every restart the records, the MIG
//! instances and their owners, the CDI specs and the devices the plugin publishes must agree:
//! every claim `Prepared` with a record, every instance a claim's whole slice or the layout's,
//! no GPU instance without its compute instance left or published, each claim's CDI spec naming
//! its slice's capability device nodes, and the published MIG devices exactly the live ones,
//! each with its MIG UUID.
//!
//! `GPUSHARE_MIG_KILL_ROUNDS` sets the rounds (default 30), `GPUSHARE_MIG_KILL_SEED` replays one
//! random sequence (the seed is printed).

#![allow(clippy::unwrap_used)]

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpushare::crash::{CRASH_ENV, CRASH_POINTS};
use gpushare_proto::{
    ClaimInfo, ClaimState, Client, ClientError, GpuInfo, HealthInfo, Method, MigApplyParams,
    MigApplyResult, StrategyInfo,
};
use gpushare_slice::{devices_of_object, ApiVersion};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};
use support::apiserver::ApiServer;
use support::*;

/// A gpushared killed and started again on the same socket and directories.
struct Node {
    dir: tempfile::TempDir,
    socket: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn new() -> Node {
        // Under /tmp with a short name: MPS sockets live under the run directory.
        let dir = tempfile::Builder::new()
            .prefix("gk-")
            .tempdir_in("/tmp")
            .unwrap();
        fs::write(
            dir.path().join("config.toml"),
            "[metrics]\nenabled = false\n",
        )
        .unwrap();
        fs::write(dir.path().join("boot_id"), "boot-1\n").unwrap();
        Node {
            socket: dir.path().join("sock"),
            dir,
            child: None,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn log(&self) -> String {
        fs::read_to_string(self.path("gpushared.log")).unwrap_or_default()
    }

    fn spawn(&mut self, crash_at: Option<&str>) {
        assert!(self.child.is_none(), "gpushared already runs");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path("gpushared.log"))
            .unwrap();
        let mut cmd = Command::new(bin("gpushared"));
        cmd.arg("--config")
            .arg(self.path("config.toml"))
            .args(["--simulate", &p4d_mig_profile(), "--node-name", NODE])
            .args(["--shm-size-mib", "16", "--mps-timeout", "5"])
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(self.path("state"))
            .arg("--run-dir")
            .arg(self.path("run"))
            .arg("--cdi-dir")
            .arg(self.path("cdi"))
            .arg("--mps-control")
            .arg(mps_program())
            .arg("--boot-id-file")
            .arg(self.path("boot_id"))
            .env("RUST_LOG", "info")
            .env_remove(CRASH_ENV)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        if let Some(point) = crash_at {
            cmd.env(CRASH_ENV, point);
        }
        self.child = Some(cmd.spawn().expect("spawning gpushared"));
    }

    fn health(&self) -> Result<HealthInfo, ClientError> {
        Client::connect(&self.socket, Duration::from_secs(2))?.call(Method::Health, None::<&()>)
    }

    /// Waits until gpushared is ready or has exited (a crash point the start reaches);
    /// whether it is ready.
    fn wait_ready_or_exit(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.health().is_ok_and(|h| h.ready) {
                return true;
            }
            if let Some(c) = self.child.as_mut() {
                if c.try_wait().unwrap().is_some() {
                    return false;
                }
            }
            assert!(
                Instant::now() < deadline,
                "gpushared not ready; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn start(&mut self) {
        self.spawn(None);
        assert!(
            self.wait_ready_or_exit(),
            "gpushared exited at start; log:\n{}",
            self.log()
        );
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn call<T: serde::de::DeserializeOwned>(&self, method: Method, params: Option<Value>) -> T {
        Client::connect(&self.socket, Duration::from_secs(30))
            .and_then(|mut c| c.call(method, params.as_ref()))
            .unwrap_or_else(|e| panic!("{method:?}: {e}; log:\n{}", self.log()))
    }

    fn claims(&self) -> Vec<ClaimInfo> {
        self.call(Method::ListClaims, None)
    }

    fn gpu2(&self) -> GpuInfo {
        let gpus: Vec<GpuInfo> = self.call(Method::ListGpus, None);
        gpus.into_iter().find(|g| g.name == "gpu-2").unwrap()
    }

    /// The UIDs the store holds a whole record of.
    fn recorded(&self) -> BTreeSet<String> {
        names_in(&self.path("state/records"))
            .into_iter()
            .filter_map(|n| {
                let uid = n.strip_suffix(".json")?.to_string();
                let v: Value =
                    serde_json::from_slice(&fs::read(self.path("state/records").join(&n)).ok()?)
                        .ok()?;
                (v["uid"] == uid.as_str()).then_some(uid)
            })
            .collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Release whatever is left, so that no MPS daemon or mount outlives the test.
        self.kill9();
        self.spawn(None);
        if self.wait_ready_or_exit() {
            if let Ok(claims) = Client::connect(&self.socket, Duration::from_secs(5))
                .and_then(|mut c| c.call::<(), Vec<ClaimInfo>>(Method::ListClaims, None))
            {
                for c in claims {
                    let _ = Client::connect(&self.socket, Duration::from_secs(30)).and_then(
                        |mut cl| {
                            cl.call::<_, Value>(Method::Unprepare, Some(&json!({"uid": c.uid})))
                        },
                    );
                }
            }
        }
        self.kill9();
        for pid in mps_processes(&self.path("run/claims")) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        if let Ok(text) = fs::read_to_string("/proc/self/mountinfo") {
            for m in text.lines().filter_map(|l| l.split(' ').nth(4)) {
                if Path::new(m).starts_with(self.dir.path()) {
                    let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
                }
            }
        }
    }
}

fn names_in(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .map(|e| {
            e.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Live processes whose environment puts their MPS pipe directory under `claims_dir`.
fn mps_processes(claims_dir: &Path) -> BTreeSet<i32> {
    let needle = format!("CUDA_MPS_PIPE_DIRECTORY={}/", claims_dir.display());
    let mut out = BTreeSet::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(env) = fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if env
            .split(|b| *b == 0)
            .any(|v| v.starts_with(needle.as_bytes()))
            && gpushare::sys::pid_alive(pid)
        {
            out.insert(pid);
        }
    }
    out
}

/// xorshift64*: reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What one worker asks for, again and again: an allocated device, with sharing parameters.
struct Work {
    device: String,
    params: Option<Value>,
}

fn claim(uid: &str, w: &Work) -> Value {
    let config: Vec<Value> = w
        .params
        .iter()
        .map(|p| {
            json!({"source": "FromClaim", "requests": ["gpu"],
                   "opaque": {"driver": "gpu.nvidia.com", "parameters": p}})
        })
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": "kill-loop", "namespace": "ns", "uid": uid},
           "status": {"allocation": {"devices": {
               "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE,
                            "device": w.device}],
               "config": config}}}})
}

/// The devices of our node in the stand-in: name → `uuid` attribute (empty when it has none).
fn published(api: &ApiServer) -> BTreeMap<String, String> {
    api.slices()
        .iter()
        .filter(|s| s["spec"]["nodeName"] == NODE)
        .flat_map(|o| devices_of_object(o, ApiVersion::V1).unwrap())
        .map(|d| {
            let uuid = d
                .attributes
                .get("uuid")
                .and_then(|a| a.string.clone())
                .unwrap_or_default();
            (d.name, uuid)
        })
        .collect()
}

/// Checks that the records, MIG instances and owners, CDI specs and the published devices
/// agree, with `layout` the static instance's MIG UUID; counts each check.
fn check(node: &Node, api: &ApiServer, layout: &str, counts: &mut BTreeMap<&'static str, usize>) {
    let ctx = || node.log();
    let claims = node.claims();
    let uids: BTreeSet<String> = claims.iter().map(|c| c.uid.clone()).collect();
    for c in &claims {
        assert_eq!(c.state, ClaimState::Prepared, "{c:?}\n{}", ctx());
    }
    assert_eq!(node.recorded(), uids, "records are the claims");
    *counts.entry("records are the prepared claims").or_default() += 1;

    // Every live instance whole, and the layout's or one claim's; every claim's slice live.
    let gpu = node.gpu2();
    let mut owned: BTreeMap<String, Vec<(u32, String)>> = BTreeMap::new();
    for d in &gpu.mig_devices {
        assert!(
            !d.uuid.is_empty(),
            "a GPU instance without its compute instance: {d:?}\n{}",
            ctx()
        );
        match &d.owner {
            None => assert_eq!(d.uuid, layout, "an instance nobody owns: {d:?}\n{}", ctx()),
            Some(o) => {
                assert!(uids.contains(o), "owned by no claim: {d:?}");
                owned
                    .entry(o.clone())
                    .or_default()
                    .push((d.gi_id.unwrap(), d.uuid.clone()));
            }
        }
    }
    assert!(
        gpu.mig_devices.iter().any(|d| d.uuid == layout),
        "the layout's instance is gone: {:?}\n{}",
        gpu.mig_devices,
        ctx()
    );
    for c in &claims {
        let recorded: Vec<(u32, String)> = c
            .groups
            .iter()
            .flat_map(|g| &g.mig)
            .map(|m| (m.gi_id, m.uuid.clone()))
            .collect();
        assert!(!recorded.is_empty(), "{c:?}");
        assert_eq!(
            owned.get(&c.uid).cloned().unwrap_or_default(),
            recorded,
            "{}: its slices are the live instances it owns",
            c.uid
        );
    }
    *counts
        .entry("MIG instances are the claims' slices and the layout's")
        .or_default() += 1;

    // CDI specs: the driver's and one per claim, naming its slice's capability device nodes.
    let mut specs = names_in(&node.path("cdi"));
    assert!(specs.remove("gpushare.io-gpu.json"), "{specs:?}");
    // No temporary either: one a kill during a regeneration of the driver's spec left is
    // removed by the start (its writer is gone).
    let want: BTreeSet<String> = uids
        .iter()
        .map(|u| format!("gpushare.io-claim_{u}.json"))
        .collect();
    assert_eq!(specs, want, "CDI specs are the claims'");
    for c in &claims {
        let spec: Value = serde_json::from_slice(
            &fs::read(node.path(&format!("cdi/gpushare.io-claim_{}.json", c.uid))).unwrap(),
        )
        .unwrap();
        let caps: BTreeSet<String> = spec["devices"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|d| {
                d["containerEdits"]["deviceNodes"]
                    .as_array()
                    .unwrap()
                    .iter()
            })
            .filter_map(|n| n["path"].as_str())
            .filter(|p| p.starts_with("/dev/nvidia-caps/"))
            .map(str::to_string)
            .collect();
        let mut expected = BTreeSet::new();
        for m in c.groups.iter().flat_map(|g| &g.mig) {
            for ci in [None, m.ci_id] {
                expected.insert(format!(
                    "/dev/nvidia-caps/nvidia-cap{}",
                    gpushare::gpu::mig_cap_minor(2, m.gi_id, ci)
                ));
            }
        }
        assert_eq!(caps, expected, "{}: the CDI spec names its slice", c.uid);
    }
    *counts
        .entry("CDI specs are the claims', naming their slices")
        .or_default() += 1;

    // MPS control daemons: the MPS claims' own, alive; no other.
    let daemons: BTreeSet<i32> = claims
        .iter()
        .flat_map(|c| &c.groups)
        .filter_map(|g| match &g.sharing {
            StrategyInfo::Mps(m) => Some(m.control_daemon_pid),
            _ => None,
        })
        .collect();
    for pid in &daemons {
        assert!(gpushare::sys::pid_alive(*pid), "MPS daemon {pid} dead");
    }
    let running = mps_processes(&node.path("run/claims"));
    assert!(
        running.is_subset(&daemons),
        "{running:?} beyond {daemons:?}"
    );
    *counts.entry("MPS daemons are the claims'").or_default() += 1;

    // What the plugin publishes (a server without partitionable devices: what exists) comes to
    // be the whole GPUs and gpu-2's live MIG devices with their UUIDs; never a device without.
    let mut want: BTreeMap<String, String> = (0..8)
        .filter(|m| *m != 2)
        .map(|m| (format!("gpu-{m}"), String::new()))
        .collect();
    for d in &gpu.mig_devices {
        want.insert(d.device_name(gpu.minor), d.uuid.clone());
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let now = published(api);
        for (name, uuid) in &now {
            assert!(
                !name.contains("-mig-") || !uuid.is_empty(),
                "{name} published without a MIG UUID: {now:?}"
            );
        }
        let whole_uuids: BTreeMap<String, String> = now
            .iter()
            .map(|(n, u)| {
                let u = if n.contains("-mig-") {
                    u.clone()
                } else {
                    String::new()
                };
                (n.clone(), u)
            })
            .collect();
        if whole_uuids == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "published {now:?}, want {want:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    *counts
        .entry("published devices are the live ones")
        .or_default() += 1;
}

#[test]
fn kill_loop_over_mig_prepares_and_releases_keeps_records_instances_cdi_and_slices_agreeing() {
    if !need(is_root(), "root") {
        return;
    }
    let rounds: usize = std::env::var("GPUSHARE_MIG_KILL_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let seed: u64 = std::env::var("GPUSHARE_MIG_KILL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("GPUSHARE_MIG_KILL_SEED={seed} GPUSHARE_MIG_KILL_ROUNDS={rounds}");
    let mut rng = Rng(seed);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let api = rt.block_on(ApiServer::start(NODE));
    let mut node = Node::new();
    node.start();
    // The node's layout: one static 2g.10gb, which nothing here may destroy.
    let layout = "version: v1\nmig-configs:\n  one:\n    - devices: [2]\n      mig-enabled: true\n      mig-devices: {\"2g.10gb\": 1}\n";
    let applied: MigApplyResult = node.call(
        Method::MigApply,
        Some(
            serde_json::to_value(MigApplyParams {
                layout: layout.into(),
                config: "one".into(),
                dry_run: false,
            })
            .unwrap(),
        ),
    );
    let (_, layout_uuid) = applied.gpus[0].create[0].split_once('=').unwrap();
    let layout_uuid = layout_uuid.to_string();
    let taken = node.gpu2().mig_devices[0].clone();
    let taken = taken.placement_start..taken.placement_start + taken.memory_slices;
    // 1g.5gb slices where the layout is not: three named ones, one with an MPS control daemon,
    // and the short form, which takes the lowest free placement (and races the named ones).
    let free: Vec<u32> = (0..7).filter(|s| !taken.contains(s)).collect();
    assert!(free.len() >= 4, "{free:?}");
    let named = |s: u32| format!("gpu-2-mig-1g5gb-19-{s}");
    let work: Arc<Vec<Work>> = Arc::new(vec![
        Work {
            device: named(free[0]),
            params: None,
        },
        Work {
            device: named(free[1]),
            params: None,
        },
        Work {
            device: named(free[2]),
            params: Some(json!({"sharingMode": "mps", "mpsActiveThreadPercentage": 30})),
        },
        Work {
            device: "gpu-2".into(),
            params: Some(json!({"sharingMode": "mig", "migProfile": "1g.5gb"})),
        },
    ]);
    let dirs = Dirs::new(&api);
    let plugin = Plugin::start(&dirs, &node.socket, &[]);
    let mut counts: BTreeMap<&'static str, usize> = BTreeMap::new();
    check(&node, &api, &layout_uuid, &mut counts);
    // The points a MIG prepare or release passes (the checkpoint writer's too).
    let points: Vec<&str> = CRASH_POINTS
        .iter()
        .copied()
        .filter(|p| !p.contains("gpu_settings"))
        .collect();
    let ops = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut crashed_at: BTreeMap<&str, usize> = BTreeMap::new();
    for round in 0..rounds {
        let point = (rng.below(2) == 0).then(|| points[rng.below(points.len() as u64) as usize]);
        let window = Duration::from_millis(rng.below(600));
        // Which claim each worker holds (a kill may have come after a prepare was recorded).
        let held: Vec<Option<String>> = {
            let claims = node.claims();
            (0..work.len())
                .map(|w| {
                    claims
                        .iter()
                        .find(|c| c.uid.starts_with(&format!("mk-w{w}-")))
                        .map(|c| c.uid.clone())
                })
                .collect()
        };
        node.kill9();
        node.spawn(point);
        let up = node.wait_ready_or_exit();
        let stop = Arc::new(AtomicBool::new(false));
        let threads: Vec<_> = held
            .into_iter()
            .enumerate()
            .map(|(w, mut current)| {
                let (stop, ops, work) = (Arc::clone(&stop), Arc::clone(&ops), Arc::clone(&work));
                let socket = node.socket.clone();
                std::thread::spawn(move || {
                    let mut n = 0u32;
                    while up && !stop.load(Ordering::Relaxed) {
                        let mut client = match Client::connect(&socket, Duration::from_secs(20)) {
                            Ok(c) => c,
                            Err(_) => return,
                        };
                        let result: Result<Option<String>, ClientError> = match &current {
                            Some(uid) => client
                                .call::<_, Value>(Method::Unprepare, Some(&json!({"uid": uid})))
                                .map(|_| None),
                            None => {
                                n += 1;
                                let uid = format!("mk-w{w}-r{round}-n{n}-{}", std::process::id());
                                client
                                    .call::<_, Value>(
                                        Method::Prepare,
                                        Some(&json!({"claim": claim(&uid, &work[w])})),
                                    )
                                    .map(|_| Some(uid))
                            }
                        };
                        match result {
                            Ok(next) => {
                                current = next;
                                ops.fetch_add(1, Ordering::Relaxed);
                            }
                            // Answered with an error (the short form took this placement, say):
                            // nothing of it may be left; try again.
                            Err(e) if e.remote().is_some() => {
                                std::thread::sleep(Duration::from_millis(5));
                            }
                            // The daemon died under the request.
                            Err(_) => return,
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(window);
        let crashed = node
            .child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_some());
        if let (Some(p), true) = (point, crashed) {
            *crashed_at.entry(p).or_default() += 1;
        }
        node.kill9();
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        node.start();
        check(&node, &api, &layout_uuid, &mut counts);
        if round % 10 == 9 {
            eprintln!(
                "round {}: {} prepares and releases answered, {:?}",
                round + 1,
                ops.load(Ordering::Relaxed),
                started.elapsed()
            );
        }
    }
    for c in node.claims() {
        let _: Value = node.call(Method::Unprepare, Some(json!({"uid": c.uid})));
    }
    check(&node, &api, &layout_uuid, &mut counts);
    assert_eq!(
        node.gpu2().mig_devices.len(),
        1,
        "only the layout's instance is left"
    );
    let list: Vec<String> = counts.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    eprintln!(
        "MIG kill loop: {rounds} rounds, {} prepares and releases answered, crash points hit {crashed_at:?}, {:?}; checked: {}",
        ops.load(Ordering::Relaxed),
        started.elapsed(),
        list.join(", ")
    );
    assert!(ops.load(Ordering::Relaxed) > 0, "the load ran");
    drop(plugin);
}
