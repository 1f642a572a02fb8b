//! Fault injection against a real `gpushared` with real MPS control daemons: named crash points
//! inside prepare and unprepare (`GPUSHARE_CRASH_AT`, honoured by debug builds only), `kill -9`
//! at random moments under concurrent load, a corrupt and a truncated checkpoint, a full disk
//! under the checkpoint (a tiny tmpfs), a simulated reboot (another boot ID), a killed MPS
//! control daemon, and SIGTERM. After each fault the daemon is started again and every
//! invariant is checked: each claim fully prepared or absent, each MPS claim's daemon alive with
//! its limits read back, no orphan process, directory, mount, CDI spec or checkpoint entry,
//! compute mode and time-slice matching the claims.
//!
//! `GPUSHARE_CRASH_ROUNDS` sets the number of `kill -9` rounds (default 200),
//! `GPUSHARE_CRASH_SEED` replays one random sequence (the seed is printed).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpushare::crash::{CRASH_ENV, CRASH_POINTS};
use gpushare::strategy::mps::percentage_display;
use gpushare_e2e::*;
use gpushare_proto::{
    ClaimInfo, ClaimState, Client, ClientError, ComputeMode, ErrorCode, GpuInfo, HealthInfo,
    Method, MpsInfo, PrepareParams, PrepareResult, StrategyInfo, TimeSliceInterval, UidParams,
    UnprepareResult,
};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

/// A change made to the checkpoint file's bytes.
type Mutation = fn(&[u8]) -> Vec<u8>;

/// How many times each invariant was checked, by name.
type Counts = BTreeMap<&'static str, usize>;

/// A gpushared that can be killed and started again on the same socket and directories.
struct Node {
    dir: tempfile::TempDir,
    socket: PathBuf,
    state_dir: PathBuf,
    run_dir: PathBuf,
    cdi_dir: PathBuf,
    boot_file: PathBuf,
    log: PathBuf,
    mps_control: PathBuf,
    child: Option<Child>,
    /// What `--simulate` is given.
    simulate: String,
}

impl Node {
    fn new(mps_control: PathBuf) -> Node {
        let dir = tempfile::Builder::new()
            .prefix("gc-")
            .tempdir_in("/tmp")
            .unwrap();
        let state_dir = dir.path().join("state");
        Node::with_state_dir(dir, state_dir, mps_control)
    }

    fn with_state_dir(dir: tempfile::TempDir, state_dir: PathBuf, mps_control: PathBuf) -> Node {
        let boot_file = dir.path().join("boot_id");
        fs::write(&boot_file, "boot-1\n").unwrap();
        fs::write(dir.path().join("config.toml"), "").unwrap();
        Node {
            socket: dir.path().join("sock"),
            run_dir: dir.path().join("run"),
            cdi_dir: dir.path().join("cdi"),
            log: dir.path().join("gpushared.log"),
            state_dir,
            boot_file,
            mps_control,
            child: None,
            simulate: "p4d.24xlarge".into(),
            dir,
        }
    }

    /// The same node with gpu-2 in MIG mode, as an operator set it up before gpushared.
    fn with_mig_on_gpu_2(mut self) -> Node {
        self.simulate = format!(
            "{}/../daemon/examples/profiles/p4d.24xlarge-mig2.toml",
            env!("CARGO_MANIFEST_DIR")
        );
        self
    }

    /// The same node simulating `profile` (a catalog name) instead.
    fn on(mut self, profile: &str) -> Node {
        self.simulate = profile.into();
        self
    }

    /// Claim `uid`'s record in the store (`<state-dir>/records/<uid>.json`).
    fn record(&self, uid: &str) -> PathBuf {
        self.state_dir.join("records").join(format!("{uid}.json"))
    }

    /// The UIDs the store holds a record of, read while gpushared runs (each record is a file
    /// of its own; none is locked).
    fn recorded(&self) -> BTreeSet<String> {
        fs::read_dir(self.state_dir.join("records"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| {
                        let n = e.file_name().to_string_lossy().into_owned();
                        let uid = n.strip_suffix(".json")?.to_string();
                        // Every record is whole and names its claim.
                        let v: Value = serde_json::from_slice(&fs::read(e.path()).ok()?).ok()?;
                        (v["uid"] == uid.as_str()).then_some(uid)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Removes the store: the checkpoint goes missing.
    fn remove_store(&self) {
        fs::remove_file(self.state_dir.join("store.json")).unwrap();
        fs::remove_dir_all(self.state_dir.join("records")).unwrap();
        let _ = fs::remove_dir_all(self.state_dir.join("tombstones"));
    }

    /// Evidence files the store's quarantine holds of refused claim records.
    fn quarantined_records(&self) -> usize {
        read_names(&self.state_dir.join("quarantine"))
            .iter()
            .filter(|n| n.starts_with("checkpoint-claim-"))
            .count()
    }

    fn spawn(&mut self, crash_at: Option<&str>) {
        assert!(self.child.is_none(), "gpushared already runs");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = Command::new(bin("gpushared"));
        cmd.arg("--config")
            .arg(self.dir.path().join("config.toml"))
            .arg("--simulate")
            .arg(&self.simulate)
            .args(["--node-name", NODE])
            .args(["--shm-size-mib", "16", "--mps-timeout", "5"])
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(&self.state_dir)
            .arg("--run-dir")
            .arg(&self.run_dir)
            .arg("--cdi-dir")
            .arg(&self.cdi_dir)
            .arg("--mps-control")
            .arg(&self.mps_control)
            .arg("--boot-id-file")
            .arg(&self.boot_file)
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

    /// Starts gpushared (without crash points) and waits until it reports ready.
    fn start(&mut self) {
        self.spawn(None);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(h) = self.try_health() {
                if h.ready {
                    return;
                }
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!("gpushared exited at start ({status}); log:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "gpushared not ready; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn sigterm(&mut self) -> ExitStatus {
        let mut c = self.child.take().expect("gpushared runs");
        kill(Pid::from_raw(c.id() as i32), Signal::SIGTERM).unwrap();
        c.wait().unwrap()
    }

    fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        let c = self.child.as_mut().expect("gpushared runs");
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                self.child = None;
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "gpushared did not exit; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn client(&self) -> Result<Client, ClientError> {
        Client::connect(&self.socket, Duration::from_secs(30))
    }

    fn try_health(&self) -> Result<HealthInfo, ClientError> {
        Client::connect(&self.socket, Duration::from_secs(2))?.call(Method::Health, None::<&()>)
    }

    fn health(&self) -> HealthInfo {
        self.try_health().unwrap()
    }

    fn prepare(&self, claim: &Value) -> Result<PrepareResult, ClientError> {
        self.client()?.call(
            Method::Prepare,
            Some(&PrepareParams {
                claim: claim.clone(),
            }),
        )
    }

    fn unprepare(&self, uid: &str) -> Result<UnprepareResult, ClientError> {
        self.client()?
            .call(Method::Unprepare, Some(&UidParams { uid: uid.into() }))
    }

    fn claim(&self, uid: &str) -> Result<ClaimInfo, ClientError> {
        self.client()?
            .call(Method::GetClaim, Some(&UidParams { uid: uid.into() }))
    }

    fn claims(&self) -> Vec<ClaimInfo> {
        self.client()
            .unwrap()
            .call(Method::ListClaims, None::<&()>)
            .unwrap()
    }

    fn gpus(&self) -> Vec<GpuInfo> {
        self.client()
            .unwrap()
            .call(Method::ListGpus, None::<&()>)
            .unwrap()
    }

    fn gpu(&self, name: &str) -> GpuInfo {
        self.gpus()
            .into_iter()
            .find(|g| g.name == name)
            .unwrap_or_else(|| panic!("no {name}"))
    }

    fn cli_status(&self) -> String {
        let out = Command::new(bin("gpushare"))
            .arg("--socket")
            .arg(&self.socket)
            .arg("status")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn release_all(&self) {
        for c in self.claims() {
            self.unprepare(&c.uid)
                .unwrap_or_else(|e| panic!("unprepare {}: {e}; log:\n{}", c.uid, self.log()));
        }
    }

    /// Checks every invariant against the running daemon and the host; counts each check.
    fn check(&self, counts: &mut Counts) {
        let ctx = self.log();
        let claims = self.claims();
        let uids: BTreeSet<String> = claims.iter().map(|c| c.uid.clone()).collect();
        for c in &claims {
            assert_eq!(c.state, ClaimState::Prepared, "{c:?}\n{ctx}");
        }
        *counts
            .entry("every claim fully prepared or absent")
            .or_default() += 1;

        let in_cp = self.recorded();
        assert_eq!(
            in_cp, uids,
            "checkpoint entries (the store's records) are the claims"
        );
        *counts.entry("no orphan checkpoint entry").or_default() += 1;

        let mut daemon_pids = BTreeSet::new();
        let mut groups = BTreeSet::new();
        let mut shm_dirs = BTreeSet::new();
        for c in &claims {
            for m in mps_groups(c) {
                let lock = Path::new(&m.pipe_dir).join("control_lock");
                let holder = gpushare::sys::find_lock_holder(&lock).ok().flatten();
                assert_eq!(
                    holder,
                    Some(m.control_daemon_pid),
                    "{} daemon\n{ctx}",
                    c.uid
                );
                assert_eq!(
                    gpushare::sys::process_start_time(m.control_daemon_pid),
                    Some(m.control_daemon_start_time),
                    "{}: the recorded process",
                    c.uid
                );
                let want = percentage_display(m.requested.active_thread_percentage);
                assert_eq!(m.active_thread_percentage, want);
                assert_eq!(
                    mps_ui(
                        &self.mps_control,
                        &m.pipe_dir,
                        "get_default_active_thread_percentage"
                    ),
                    want,
                    "{}: limits read back from the daemon itself",
                    c.uid
                );
                daemon_pids.insert(m.control_daemon_pid);
                groups.insert(Path::new(&m.pipe_dir).parent().unwrap().to_path_buf());
                shm_dirs.insert(PathBuf::from(&m.shm_dir));
            }
        }
        *counts
            .entry("MPS daemon alive with verified limits")
            .or_default() += claims.iter().map(|c| mps_groups(c).len()).sum::<usize>();

        let claims_dir = self.run_dir.join("claims");
        let on_disk: BTreeSet<String> = read_names(&claims_dir);
        assert_eq!(on_disk, uids, "claim directories are the claims");
        let mut group_dirs = BTreeSet::new();
        for uid in &on_disk {
            for g in read_names(&claims_dir.join(uid)) {
                if g.starts_with("mps-") {
                    group_dirs.insert(claims_dir.join(uid).join(g));
                }
            }
        }
        assert_eq!(group_dirs, groups, "MPS directories are the groups");
        *counts.entry("no orphan directory").or_default() += 1;

        let mounts: BTreeSet<PathBuf> = fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(PathBuf::from)
            .filter(|p| p.starts_with(&claims_dir))
            .collect();
        assert_eq!(mounts, shm_dirs, "mounts are the claims' shm tmpfs");
        *counts.entry("no orphan mount").or_default() += 1;

        // The node's driver spec (generated at start) is not a claim's.
        let mut specs = read_names(&self.cdi_dir);
        assert!(
            specs.remove("gpushare.io-gpu.json"),
            "the driver's CDI spec is in {}",
            self.cdi_dir.display()
        );
        let want: BTreeSet<String> = uids
            .iter()
            .map(|u| format!("gpushare.io-claim_{u}.json"))
            .collect();
        assert_eq!(specs, want, "CDI specs are the claims'");
        *counts.entry("no orphan CDI spec").or_default() += 1;

        let running = mps_processes(&claims_dir);
        assert!(
            running.is_subset(&daemon_pids),
            "MPS processes {running:?} beyond the claims' daemons {daemon_pids:?}"
        );
        *counts.entry("no orphan process").or_default() += 1;

        for g in self.gpus() {
            let holders: Vec<&ClaimInfo> = claims
                .iter()
                .filter(|c| g.claims.contains(&c.uid))
                .collect();
            let mut mode = ComputeMode::Default;
            let mut interval = TimeSliceInterval::Default;
            for c in &holders {
                for grp in &c.groups {
                    if grp.devices.iter().any(|d| d.uuid == g.uuid) {
                        match &grp.sharing {
                            StrategyInfo::Mps(_) => mode = ComputeMode::ExclusiveProcess,
                            StrategyInfo::TimeSlicing { interval: i } => interval = *i,
                            StrategyInfo::Exclusive => {}
                        }
                    }
                }
            }
            assert_eq!(g.compute_mode, mode, "{}: {g:?}", g.name);
            assert_eq!(g.time_slice, interval, "{}: {g:?}", g.name);
        }
        *counts
            .entry("compute mode and time-slice match the claims")
            .or_default() += 1;
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // Release whatever is left, so that no MPS daemon or mount outlives the test.
        self.kill9();
        if fs::metadata(&self.state_dir).is_ok() {
            self.spawn(None);
            let up = wait_until(Duration::from_secs(30), || {
                self.try_health().is_ok_and(|h| h.ready)
            });
            if up {
                for c in self.claims() {
                    let _ = self.unprepare(&c.uid);
                }
            }
            self.kill9();
        }
        for pid in mps_processes(&self.run_dir.join("claims")) {
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

fn mps_groups(c: &ClaimInfo) -> Vec<MpsInfo> {
    c.groups
        .iter()
        .filter_map(|g| match &g.sharing {
            StrategyInfo::Mps(m) => Some(m.clone()),
            _ => None,
        })
        .collect()
}

fn read_names(dir: &Path) -> BTreeSet<String> {
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

fn mps_ui(program: &Path, pipe_dir: &str, command: &str) -> String {
    let mut child = Command::new(program)
        .env_clear()
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{command}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A `ResourceClaim` (resource.k8s.io/v1) allocated `gpu-<gpu>` of this node, with short-form
/// sharing parameters when given.
fn claim_on(uid: &str, gpu: u32, params: Option<Value>) -> Value {
    let config: Vec<Value> = params
        .into_iter()
        .map(|p| {
            json!({"source": "FromClaim", "requests": ["gpu"],
                   "opaque": {"driver": "gpu.nvidia.com", "parameters": p}})
        })
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": "crash-test", "namespace": "ns", "uid": uid},
           "status": {"allocation": {"devices": {
               "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE,
                            "device": format!("gpu-{gpu}")}],
               "config": config}}}})
}

fn mps_claim(uid: &str, gpu: u32, atp: u32) -> Value {
    claim_on(
        uid,
        gpu,
        Some(json!({"sharingMode": "mps", "mpsActiveThreadPercentage": atp})),
    )
}

/// An MPS claim on the 3g.20gb slice at memory slice 4 of gpu-2 (made at prepare).
fn mps_on_mig_claim(uid: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": "crash-test", "namespace": "ns", "uid": uid},
           "status": {"allocation": {"devices": {
               "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE,
                            "device": "gpu-2-mig-3g20gb-9-4"}],
               "config": [{"source": "FromClaim", "requests": ["gpu"],
                           "opaque": {"driver": "gpu.nvidia.com", "parameters":
                               {"sharingMode": "mps", "mpsActiveThreadPercentage": 40}}}]}}}})
}

/// A claim for a 1g.10gb slice of gpu-5 of a simulated p5.48xlarge (a Hopper GPU, whose MIG
/// mode is off until a prepare turns it on), its placement chosen at prepare.
fn hopper_mig_claim(uid: &str) -> Value {
    claim_on(
        uid,
        5,
        Some(json!({"sharingMode": "mig", "migProfile": "1g.10gb"})),
    )
}

/// The crash points only a MIG prepare or release on a GPU whose MIG mode gpushare turns on
/// and off reaches (Hopper).
fn needs_mode_toggle(point: &str) -> bool {
    point.contains("mig_mode")
}

fn ts_claim(uid: &str, gpu: u32) -> Value {
    claim_on(
        uid,
        gpu,
        Some(json!({"sharingMode": "time-slicing", "timeSlice": "long", "replicas": 4})),
    )
}

fn exclusive_claim(uid: &str, gpu: u32) -> Value {
    claim_on(uid, gpu, None)
}

/// The MPS control program for these tests: NVIDIA's real one when installed (else the
/// emulator, after a note or a failure under `GPUSHARE_E2E_REQUIRE=1`).
fn mps_program() -> PathBuf {
    mps_programs().remove(0).1
}

fn print_counts(what: &str, counts: &Counts) {
    let list: Vec<String> = counts.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    eprintln!("{what}; invariants checked: {}", list.join(", "));
}

/// xorshift64*: reproducible from the printed seed, no dependency.
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

#[test]
fn kill_9_at_random_moments_under_concurrent_load_leaves_every_invariant_holding() {
    if !need(is_root(), "root") {
        return;
    }
    let rounds: usize = std::env::var("GPUSHARE_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let seed: u64 = std::env::var("GPUSHARE_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("GPUSHARE_CRASH_SEED={seed} GPUSHARE_CRASH_ROUNDS={rounds}");
    let mut rng = Rng(seed);
    let mut node = Node::new(mps_program());
    node.start();
    let node = Arc::new(std::sync::Mutex::new(node));
    let socket = node.lock().unwrap().socket.clone();
    let mut counts = Counts::new();
    let done_ops = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    // Each worker owns two GPUs and a kind of claim, and alternates prepare and unprepare as
    // a kubelet would, retrying what a crash cut short in the next round.
    let workers: Vec<(u32, &str)> = vec![(0, "mps"), (2, "mps"), (4, "ts"), (6, "excl")];
    for round in 0..rounds {
        let stop = Arc::new(AtomicBool::new(false));
        let held: Vec<Option<String>> = {
            let n = node.lock().unwrap();
            let claims = n.claims();
            workers
                .iter()
                .map(|(gpu, _)| {
                    claims
                        .iter()
                        .find(|c| {
                            c.groups[0].devices.iter().any(|d| {
                                d.device == format!("gpu-{gpu}")
                                    || d.device == format!("gpu-{}", gpu + 1)
                            })
                        })
                        .map(|c| c.uid.clone())
                })
                .collect()
        };
        let threads: Vec<_> = workers
            .iter()
            .zip(held)
            .enumerate()
            .map(|(w, ((gpu, kind), mut current))| {
                let (gpu, kind) = (*gpu, *kind);
                let stop = Arc::clone(&stop);
                let socket = socket.clone();
                let done_ops = Arc::clone(&done_ops);
                let mut n = 0u32;
                std::thread::spawn(move || {
                    let call = |method: Method, params: Value| -> Result<Value, ClientError> {
                        Client::connect(&socket, Duration::from_secs(20))?
                            .call(method, Some(&params))
                    };
                    while !stop.load(Ordering::Relaxed) {
                        let result = match &current {
                            Some(uid) => call(Method::Unprepare, json!({"uid": uid})).map(|_| None),
                            None => {
                                n += 1;
                                let uid = format!("crash-{}-{round}-{w}-{n}", std::process::id());
                                let g = gpu + n % 2;
                                let claim = match kind {
                                    "mps" => mps_claim(&uid, g, 10 + (n % 9) * 10),
                                    "ts" => ts_claim(&uid, g),
                                    _ => exclusive_claim(&uid, g),
                                };
                                call(Method::Prepare, json!({"claim": claim})).map(|_| Some(uid))
                            }
                        };
                        match result {
                            Ok(next) => {
                                current = next;
                                done_ops.fetch_add(1, Ordering::Relaxed);
                            }
                            // The daemon was killed under this request.
                            Err(_) => return,
                        }
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(rng.below(400)));
        let mut n = node.lock().unwrap();
        n.kill9();
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        n.start();
        n.check(&mut counts);
        if round % 20 == 19 {
            eprintln!(
                "round {}: {} operations so far, {:?}",
                round + 1,
                done_ops.load(Ordering::Relaxed),
                started.elapsed()
            );
        }
    }
    let n = node.lock().unwrap();
    n.release_all();
    n.check(&mut counts);
    print_counts(
        &format!(
            "kill -9 rounds: {rounds} ({} prepare/unprepare calls answered, {:?})",
            done_ops.load(Ordering::Relaxed),
            started.elapsed()
        ),
        &counts,
    );
    assert!(done_ops.load(Ordering::Relaxed) > 0, "the load ran");
}

#[test]
fn every_named_crash_point_is_hit_and_recovered_from() {
    if !need(is_root(), "root") {
        return;
    }
    // gpu-2 is in MIG mode: the MIG points are reached by an MPS claim on a MIG slice there,
    // the others by MPS claims on the whole GPUs around it; those of MIG mode being turned on
    // and off by a MIG claim on a Hopper GPU of a second node.
    let mut ampere = Node::new(mps_program()).with_mig_on_gpu_2();
    let mut hopper = Node::new(mps_program()).on("p5.48xlarge");
    let mut counts = Counts::new();
    let mut hit = BTreeSet::new();
    for (i, point) in CRASH_POINTS.iter().enumerate() {
        let uid = format!("cp-{}-{i}", std::process::id());
        let toggles = needs_mode_toggle(point);
        let on_mig = toggles || point.contains(".mig_");
        let node = if toggles { &mut hopper } else { &mut ampere };
        let claim = if toggles {
            hopper_mig_claim(&uid)
        } else if on_mig {
            mps_on_mig_claim(&uid)
        } else {
            mps_claim(&uid, [0, 1, 3, 4, 5, 6, 7][i % 7], 40)
        };
        let in_unprepare = point.starts_with("unprepare.");
        if in_unprepare {
            node.start();
            node.prepare(&claim).unwrap();
            node.sigterm();
        }
        node.spawn(Some(point));
        // The checkpoint writer's point is reached by the start-up reconcile's own write
        // already: a crash while starting is one more case to recover from.
        let crashed_at_start = wait_until(Duration::from_secs(60), || {
            node.try_health().is_ok_and(|h| h.ready)
                || node.child.as_mut().unwrap().try_wait().unwrap().is_some()
        }) && node.child.as_mut().unwrap().try_wait().unwrap().is_some();
        if !crashed_at_start {
            let result = if in_unprepare {
                node.unprepare(&uid).map(|_| ())
            } else {
                node.prepare(&claim).map(|_| ())
            };
            assert!(
                result.is_err(),
                "{point}: the daemon died under the request"
            );
        }
        let status = node.wait_exit(Duration::from_secs(30));
        assert_eq!(
            status.signal(),
            Some(Signal::SIGABRT as i32),
            "{point}: {status}"
        );
        assert!(
            node.log().contains(&format!("crash point {point} reached")),
            "{point}"
        );
        eprintln!(
            "crash point {point} hit ({})",
            if crashed_at_start {
                "while starting"
            } else {
                "under the request"
            }
        );
        hit.insert(*point);

        node.start();
        node.check(&mut counts);
        if on_mig {
            // Made by gpushare and not recorded before the crash, or half released by it:
            // destroyed at the start, never left for static MIG.
            let gpu = node.gpu(if toggles { "gpu-5" } else { "gpu-2" });
            assert!(gpu.mig_devices.is_empty(), "{point}: {:?}", gpu.mig_devices);
            *counts.entry("no MIG instance left by a crash").or_default() += 1;
        }
        if toggles {
            // Turned on by gpushare for the claim: off again, nothing being left on the GPU.
            assert!(!node.gpu("gpu-5").mig_enabled, "{point}\n{}", node.log());
            *counts.entry("no MIG mode left on by a crash").or_default() += 1;
        }
        let after = node.claim(&uid);
        if *point == "prepare.completed_saved" || (crashed_at_start && in_unprepare) {
            assert_eq!(after.unwrap().state, ClaimState::Prepared, "{point}: kept");
        } else {
            assert!(after.is_err(), "{point}: rolled back or released");
        }
        // The kubelet's retry finishes the job.
        if in_unprepare {
            let r = node.unprepare(&uid).unwrap();
            assert_eq!(r.released, crashed_at_start, "{point}");
        } else if crashed_at_start {
            node.prepare(&claim).unwrap();
            node.unprepare(&uid).unwrap();
        } else {
            node.prepare(&claim).unwrap();
            assert_eq!(node.claim(&uid).unwrap().state, ClaimState::Prepared);
            node.unprepare(&uid).unwrap();
        }
        node.check(&mut counts);
        if toggles {
            assert!(
                !node.gpu("gpu-5").mig_enabled,
                "{point}: off after the retry"
            );
        }
        node.sigterm();
    }
    let all: BTreeSet<&str> = CRASH_POINTS.iter().copied().collect();
    assert_eq!(hit, all);
    print_counts(
        &format!("crash points hit and recovered: {}", hit.len()),
        &counts,
    );
}

/// A claim for the 3g.20gb slice at memory slice 4 of gpu-2, without sharing settings.
fn mig_claim(uid: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": "crash-test", "namespace": "ns", "uid": uid},
           "status": {"allocation": {"devices": {
               "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE,
                            "device": "gpu-2-mig-3g20gb-9-4"}]}}}})
}

#[test]
fn a_kill_after_a_slices_compute_instance_is_destroyed_leaks_no_gpu_instance() {
    // The release destroys the compute instance and is killed before anything is recorded
    // after it: the next start finishes destroying the GPU instance (the record said the
    // destroy had begun), and the placement can be claimed again. (It used to find a GPU
    // instance without the compute instance its record named, take it for someone else's,
    // and keep it for good as static MIG; every claim for the placement got Conflict.)
    if !need(is_root(), "root") {
        return;
    }
    let mut node = Node::new(mps_program()).with_mig_on_gpu_2();
    let mut counts = Counts::new();
    node.start();
    let uid = format!("mig-ci-{}", std::process::id());
    node.prepare(&mig_claim(&uid)).unwrap();
    node.sigterm();
    node.spawn(Some("unprepare.mig_compute_destroyed"));
    node.wait_ready();
    assert!(node.unprepare(&uid).is_err(), "killed under the release");
    let status = node.wait_exit(Duration::from_secs(30));
    assert_eq!(status.signal(), Some(Signal::SIGABRT as i32), "{status}");
    node.start();
    let gpu2 = node.gpus().into_iter().find(|g| g.name == "gpu-2").unwrap();
    assert!(
        gpu2.mig_devices.is_empty(),
        "a GPU instance left: {:?}\n{}",
        gpu2.mig_devices,
        node.log()
    );
    assert!(node.claim(&uid).is_err(), "the release finished");
    node.check(&mut counts);
    let again = format!("mig-ci-again-{}", std::process::id());
    node.prepare(&mig_claim(&again))
        .unwrap_or_else(|e| panic!("the placement is not claimable again: {e}"));
    let c = node.claim(&again).unwrap();
    assert_eq!(c.groups[0].mig[0].placement_start, 4);
    node.unprepare(&again).unwrap();
    let gpu2 = node.gpus().into_iter().find(|g| g.name == "gpu-2").unwrap();
    assert!(gpu2.mig_devices.is_empty(), "{:?}", gpu2.mig_devices);
    node.check(&mut counts);
    node.sigterm();
}

/// Waits for the crash point gpushared was started with to kill it.
fn assert_crashed(node: &mut Node, point: &str) {
    let status = node.wait_exit(Duration::from_secs(30));
    assert_eq!(status.signal(), Some(Signal::SIGABRT as i32), "{status}");
    assert!(
        node.log().contains(&format!("crash point {point} reached")),
        "{point}"
    );
}

#[test]
fn a_kill_right_after_a_prepare_turned_mig_mode_on_leaves_it_off_after_the_next_start() {
    // MIG mode was turned on for the slice, and gpushared was killed before its GPU instance
    // existed. The intent learnt that the prepare had turned the mode on only once the
    // instance was made, so nothing said so: the mode stayed on for good, with nothing on the
    // GPU and no claim whose release would turn it off.
    if !need(is_root(), "root") {
        return;
    }
    let mut node = Node::new(mps_program()).on("p5.48xlarge");
    let mut counts = Counts::new();
    let uid = format!("mode-on-{}", std::process::id());
    node.spawn(Some("prepare.mig_mode_enabled"));
    node.wait_ready();
    assert!(!node.gpu("gpu-5").mig_enabled, "off before");
    assert!(
        node.prepare(&hopper_mig_claim(&uid)).is_err(),
        "killed under the prepare"
    );
    assert_crashed(&mut node, "prepare.mig_mode_enabled");
    node.start();
    let g = node.gpu("gpu-5");
    assert!(
        !g.mig_enabled && g.mig_devices.is_empty(),
        "MIG mode on: {}, instances: {:?}\n{}",
        g.mig_enabled,
        g.mig_devices,
        node.log()
    );
    assert!(node.claim(&uid).is_err(), "rolled back");
    node.check(&mut counts);
    // The kubelet's retry turns it on again, and the release off.
    node.prepare(&hopper_mig_claim(&uid)).unwrap();
    assert!(node.gpu("gpu-5").mig_enabled);
    node.unprepare(&uid).unwrap();
    assert!(!node.gpu("gpu-5").mig_enabled);
    node.check(&mut counts);
    node.sigterm();
}

#[test]
fn a_kill_between_a_release_on_disk_and_mig_mode_going_off_leaves_it_off_after_the_next_start() {
    // The release of the last slice on a GPU whose MIG mode gpushare had turned on was on disk
    // (the claim's record gone) when gpushared was killed, before the mode went off: nothing
    // said any more that gpushare had turned it on, so it stayed on for good.
    if !need(is_root(), "root") {
        return;
    }
    let mut node = Node::new(mps_program()).on("p5.48xlarge");
    let mut counts = Counts::new();
    let uid = format!("mode-off-{}", std::process::id());
    node.start();
    node.prepare(&hopper_mig_claim(&uid)).unwrap();
    assert!(node.gpu("gpu-5").mig_enabled, "turned on for the claim");
    node.sigterm();
    node.spawn(Some("unprepare.released_saved"));
    node.wait_ready();
    assert!(node.unprepare(&uid).is_err(), "killed under the release");
    assert_crashed(&mut node, "unprepare.released_saved");
    node.start();
    let g = node.gpu("gpu-5");
    assert!(
        !g.mig_enabled && g.mig_devices.is_empty(),
        "MIG mode on: {}, instances: {:?}\n{}",
        g.mig_enabled,
        g.mig_devices,
        node.log()
    );
    assert!(node.claim(&uid).is_err(), "released");
    node.check(&mut counts);
    node.sigterm();
}

#[test]
fn a_bare_gpu_instance_whose_claims_record_is_refused_is_kept_and_the_log_says_how_to_remove_it() {
    // A kill right after a slice's GPU instance was made leaves it bare, named by the claim's
    // intent and by no record. Where the claim's record (`PrepareStarted`) is then refused at
    // the next start (here: corrupt), nothing vouches for the intent, and the instance is
    // kept (never destroyed on an intent alone): its capacity is lost until an operator
    // removes it. It was kept without a word above info level; the log must say, as a
    // warning, which instance it is and the command that removes it.
    if !need(is_root(), "root") {
        return;
    }
    let mut node = Node::new(mps_program()).with_mig_on_gpu_2();
    let uid = format!("refused-{}", std::process::id());
    node.spawn(Some("prepare.mig_gpu_instance_created"));
    node.wait_ready();
    assert!(node.prepare(&mig_claim(&uid)).is_err(), "killed");
    assert_crashed(&mut node, "prepare.mig_gpu_instance_created");
    // The record the crash left, made unacceptable: a request name Kubernetes does not allow.
    let path = node.record(&uid);
    let mut record: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(record["state"], "PrepareStarted");
    record["requests"][0]["request"] = json!("Not A Name!");
    fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();
    node.start();
    assert_eq!(node.quarantined_records(), 1, "the record is refused");
    assert!(node.claim(&uid).is_err());
    let gpu2 = node.gpu("gpu-2");
    let [bare] = gpu2.mig_devices.as_slice() else {
        panic!("the bare GPU instance is kept: {:?}", gpu2.mig_devices);
    };
    assert!(bare.owner.is_none() && bare.uuid.is_empty(), "{bare:?}");
    let command = format!(
        "nvidia-smi mig -dgi -gi {} -i {}",
        bare.gi_id.unwrap(),
        gpu2.uuid
    );
    let log = node.log();
    let line = log
        .lines()
        .find(|l| l.contains(&command))
        .unwrap_or_else(|| panic!("no line names {command:?}:\n{log}"));
    assert!(line.contains("WARN") && line.contains(&uid), "{line}");
    node.sigterm();
}

#[test]
fn an_mps_daemon_keeps_its_pid_across_20_restarts_while_a_container_stays_attached() {
    if !need(is_root(), "root") || !need(which("runc").is_some(), "runc") {
        return;
    }
    let mut node = Node::new(mps_program());
    node.start();
    let uid = format!("keep-{}", std::process::id());
    node.prepare(&mps_claim(&uid, 1, 30)).unwrap();
    let before = mps_groups(&node.claim(&uid).unwrap())[0].clone();

    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("bundle");
    fs::create_dir_all(&bundle).unwrap();
    busybox_rootfs(&bundle, &[]);
    let spec: gpushare::cdi::Spec = serde_json::from_slice(
        &fs::read(node.cdi_dir.join(format!("gpushare.io-claim_{uid}.json"))).unwrap(),
    )
    .unwrap();
    gpushare_cli::container::runc_config(&bundle, "sleep 600", &spec.devices[0].container_edits)
        .unwrap();
    let runc_root = tmp.path().join("runc-root");
    let id = format!("gs-keep-{}", std::process::id());
    let runc = |args: &[&str]| {
        Command::new("runc")
            .arg("--root")
            .arg(&runc_root)
            .args(args)
            .output()
            .unwrap()
    };
    // The container's stdio goes to a file: a pipe would stay open in the detached container.
    let runc_log = tmp.path().join("runc.log");
    let mut run = Command::new("runc")
        .arg("--root")
        .arg(&runc_root)
        .args(["run", "--detach", "--bundle"])
        .arg(&bundle)
        .arg(&id)
        .stdin(Stdio::null())
        .stdout(fs::File::create(&runc_log).unwrap())
        .stderr(fs::File::create(tmp.path().join("runc.err")).unwrap())
        .spawn()
        .unwrap();
    let mut status = None;
    assert!(
        wait_until(Duration::from_secs(60), || {
            status = run.try_wait().unwrap();
            status.is_some()
        }),
        "runc run --detach did not return"
    );
    assert!(
        status.unwrap().success(),
        "runc: {}",
        fs::read_to_string(tmp.path().join("runc.err")).unwrap_or_default()
    );
    let attached = |n: &Node| {
        n.claim(&uid)
            .map(|c| c.attached.iter().any(|a| a.container_id == id))
            .unwrap_or(false)
    };
    assert!(attached(&node), "attached by the hook at createRuntime");

    let mut counts = Counts::new();
    for i in 0..20 {
        // Both ways a daemon goes away: an upgrade's SIGTERM and a crash.
        if i % 2 == 0 {
            assert_eq!(node.sigterm().code(), Some(0));
        } else {
            node.kill9();
        }
        node.start();
        let now = mps_groups(&node.claim(&uid).unwrap())[0].clone();
        assert_eq!(
            now.control_daemon_pid, before.control_daemon_pid,
            "restart {i}"
        );
        assert_eq!(now.restarts, 0);
        assert!(attached(&node), "restart {i}: still attached");
        node.check(&mut counts);
    }
    // The container still reaches its claim's daemon through the pipe directory.
    let out = runc(&["exec", &id, "test", "-S", "/tmp/nvidia-mps/control"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = runc(&["kill", &id, "KILL"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_until(Duration::from_secs(10), || {
        runc(&["state", &id])
            .stdout
            .windows(9)
            .any(|w| w == b"\"stopped\"")
    });
    let out = runc(&["delete", "-f", &id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        wait_until(Duration::from_secs(10), || !attached(&node)),
        "detached at poststop"
    );
    node.unprepare(&uid).unwrap();
    node.check(&mut counts);
    print_counts("20 restarts with a container attached", &counts);
}

#[test]
fn a_late_prepare_retry_does_not_resurrect_a_released_claim() {
    if !need(is_root(), "root") {
        return;
    }
    let mut node = Node::new(mps_program());
    node.start();
    let uid = format!("late-{}", std::process::id());
    let mut claim = mps_claim(&uid, 2, 50);
    claim["metadata"]["resourceVersion"] = json!("48213");
    node.prepare(&claim).unwrap();
    node.unprepare(&uid).unwrap();
    let mut counts = Counts::new();
    for restart in [false, true] {
        if restart {
            node.kill9();
            node.start();
        }
        match node.prepare(&claim) {
            Err(ClientError::Remote(e)) => {
                assert_eq!(e.code, ErrorCode::Stale, "{e}");
                assert!(e.message.contains(&uid), "{e}");
            }
            other => panic!("the stale prepare was not refused: {other:?}"),
        }
        assert!(node.claim(&uid).is_err());
        node.check(&mut counts);
    }
}

#[test]
fn a_corrupt_and_a_truncated_checkpoint_each_give_a_clear_report_and_no_crash_loop() {
    if !need(is_root(), "root") {
        return;
    }
    let mutations: [(&str, Mutation); 2] = [
        ("corrupt", |b| {
            let mut v = b.to_vec();
            for x in v.iter_mut().step_by(7) {
                *x = b'#';
            }
            v
        }),
        ("truncated", |b| b[..b.len() / 2].to_vec()),
    ];
    let mut counts = Counts::new();
    for (what, mutate) in mutations {
        let mut node = Node::new(mps_program());
        node.start();
        let uid = format!("cc-{what}-{}", std::process::id());
        node.prepare(&mps_claim(&uid, 3, 20)).unwrap();
        let pid = mps_groups(&node.claim(&uid).unwrap())[0].control_daemon_pid;
        node.kill9();
        // The claim's record in the store is what a crash can leave torn now.
        let bytes = fs::read(node.record(&uid)).unwrap();
        fs::write(node.record(&uid), mutate(&bytes)).unwrap();
        node.start();
        let h = node.health();
        let report = h.checkpoint_quarantined.clone().unwrap_or_default();
        assert!(
            report.contains(&format!("records/{uid}.json")) && report.contains("quarantine"),
            "{what}: {h:?}"
        );
        let status = node.cli_status();
        assert!(status.contains("CHECKPOINT WAS CORRUPT"), "{status}");
        assert!(
            node.log().contains("checkpoint was corrupt"),
            "{what}: logged"
        );
        assert_eq!(node.quarantined_records(), 1, "{what}: kept as evidence");
        // Rebuilt from the host: the GPU job's daemon is kept.
        let c = node.claim(&uid).unwrap();
        assert_eq!(mps_groups(&c)[0].control_daemon_pid, pid, "{what}");
        node.check(&mut counts);
        // Not a crash loop: the next start finds a good checkpoint.
        node.kill9();
        node.start();
        assert!(node.health().checkpoint_quarantined.is_none());
        node.check(&mut counts);
        node.unprepare(&uid).unwrap();
        node.check(&mut counts);
    }
    print_counts("corrupt and truncated checkpoints", &counts);
}

#[test]
fn a_full_disk_under_the_checkpoint_gives_a_clear_report_and_no_crash_loop() {
    if !need(is_root(), "root") {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("gf-")
        .tempdir_in("/tmp")
        .unwrap();
    let state_dir = dir.path().join("state");
    fs::create_dir(&state_dir).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &state_dir,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=64k,mode=0700"),
    )
    .unwrap();
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    let _unmount = Unmount(state_dir.clone());
    let mut node = Node::with_state_dir(dir, state_dir.clone(), mps_program());
    node.start();
    let mut counts = Counts::new();
    let a = format!("full-a-{}", std::process::id());
    let b = format!("full-b-{}", std::process::id());
    node.prepare(&mps_claim(&a, 0, 30)).unwrap();
    // Fill the disk.
    let filler = state_dir.join("filler");
    let mut f = fs::File::create(&filler).unwrap();
    let chunk = [0u8; 1024];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
    drop(f);

    let err = node.prepare(&mps_claim(&b, 1, 30)).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("No space left on device") && text.contains("checkpoint"),
        "{text}"
    );
    let h = node.health();
    assert!(
        h.checkpoint_error
            .as_deref()
            .is_some_and(|e| e.contains("No space left")),
        "{h:?}"
    );
    assert!(node.cli_status().contains("CHECKPOINT NOT WRITABLE"));
    // A release that cannot be recorded changes nothing either.
    assert!(node.unprepare(&a).is_err());
    assert_eq!(node.claim(&a).unwrap().state, ClaimState::Prepared);
    node.check(&mut counts);
    assert!(node.claim(&b).is_err());

    // Restarts with the disk still full: up and ready, no crash loop, the claim kept.
    for _ in 0..3 {
        node.kill9();
        node.start();
        assert!(node.health().checkpoint_error.is_some());
        node.check(&mut counts);
    }
    fs::remove_file(&filler).unwrap();
    node.unprepare(&a).unwrap();
    assert!(node.health().checkpoint_error.is_none(), "healed");
    node.prepare(&mps_claim(&b, 1, 30)).unwrap();
    node.unprepare(&b).unwrap();
    node.check(&mut counts);
    print_counts("full disk", &counts);
}

#[test]
fn a_simulated_reboot_redoes_every_claims_host_setup() {
    if !need(is_root(), "root") {
        return;
    }
    let mut node = Node::new(mps_program());
    node.start();
    let pid = std::process::id();
    let (m, t, e) = (
        format!("rb-mps-{pid}"),
        format!("rb-ts-{pid}"),
        format!("rb-ex-{pid}"),
    );
    node.prepare(&mps_claim(&m, 0, 30)).unwrap();
    node.prepare(&ts_claim(&t, 1)).unwrap();
    node.prepare(&exclusive_claim(&e, 3)).unwrap();
    let old = mps_groups(&node.claim(&m).unwrap())[0].clone();
    node.kill9();
    // What a reboot takes away: processes, mounts, /run (the run and CDI directories).
    let _ = kill(Pid::from_raw(old.control_daemon_pid), Signal::SIGKILL);
    assert!(wait_until(Duration::from_secs(10), || {
        !gpushare::sys::pid_alive(old.control_daemon_pid)
    }));
    nix::mount::umount2(old.shm_dir.as_str(), nix::mount::MntFlags::MNT_DETACH).unwrap();
    fs::remove_dir_all(&node.run_dir).unwrap();
    fs::remove_dir_all(&node.cdi_dir).unwrap();
    fs::write(&node.boot_file, "boot-2\n").unwrap();
    node.start();
    let mut counts = Counts::new();
    node.check(&mut counts);
    let now = mps_groups(&node.claim(&m).unwrap())[0].clone();
    assert_ne!(now.control_daemon_pid, old.control_daemon_pid);
    assert_eq!(now.active_thread_percentage, "30.0");
    assert!(node.log().contains("rebooted"));
    for uid in [&m, &t, &e] {
        node.unprepare(uid).unwrap();
    }
    node.check(&mut counts);
}

#[test]
fn a_killed_mps_daemon_is_restarted_with_its_limits_and_counted() {
    if !need(is_root(), "root") {
        return;
    }
    let mut node = Node::new(mps_program());
    node.start();
    let uid = format!("sv-{}", std::process::id());
    node.prepare(&mps_claim(&uid, 5, 70)).unwrap();
    let old = mps_groups(&node.claim(&uid).unwrap())[0].clone();
    let killed = Instant::now();
    kill(Pid::from_raw(old.control_daemon_pid), Signal::SIGKILL).unwrap();
    let restarted = wait_until(Duration::from_secs(30), || {
        node.claim(&uid)
            .is_ok_and(|c| c.restarts == 1 && c.state == ClaimState::Prepared)
    });
    assert!(restarted, "log:\n{}", node.log());
    eprintln!(
        "MPS control daemon killed, detected and restarted with verified limits in {:?}",
        killed.elapsed()
    );
    let c = node.claim(&uid).unwrap();
    let now = mps_groups(&c)[0].clone();
    assert_ne!(now.control_daemon_pid, old.control_daemon_pid);
    assert_eq!(now.restarts, 1);
    assert!(c
        .last_error
        .as_deref()
        .is_some_and(|e| e.contains(&old.control_daemon_pid.to_string())));
    let out = Command::new(bin("gpushare"))
        .arg("--socket")
        .arg(&node.socket)
        .args(["claim", &uid])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Restarts:   1") && text.contains("Last error:") && text.contains("exited"),
        "{text}"
    );
    let mut counts = Counts::new();
    node.check(&mut counts);
    node.unprepare(&uid).unwrap();
    node.check(&mut counts);
}

#[test]
fn sigterm_exits_0_and_leaves_mps_daemons_running() {
    if !need(is_root(), "root") {
        return;
    }
    let mut node = Node::new(mps_program());
    node.start();
    let uid = format!("term-{}", std::process::id());
    node.prepare(&mps_claim(&uid, 6, 60)).unwrap();
    let pid = mps_groups(&node.claim(&uid).unwrap())[0].control_daemon_pid;
    let status = node.sigterm();
    assert_eq!(status.code(), Some(0), "log:\n{}", node.log());
    assert!(
        gpushare::sys::pid_alive(pid),
        "the MPS control daemon outlives gpushared"
    );
    assert!(!node.socket.exists(), "socket removed");
    node.start();
    assert_eq!(
        mps_groups(&node.claim(&uid).unwrap())[0].control_daemon_pid,
        pid
    );
    let mut counts = Counts::new();
    node.check(&mut counts);
    node.unprepare(&uid).unwrap();
}

#[test]
fn the_hook_refuses_a_container_on_a_degraded_claim_with_the_reason_until_it_recovers() {
    if !need(is_root(), "root") || !need(which("runc").is_some(), "runc") {
        return;
    }
    // A control program that refuses to start daemons while a flag file exists, so that the
    // claim stays Degraded for as long as the test wants.
    let tmp = tempfile::Builder::new()
        .prefix("gh-")
        .tempdir_in("/tmp")
        .unwrap();
    let flag = tmp.path().join("refuse-start");
    let wrapper = tmp.path().join("mps-control");
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nif [ \"$1\" = -d ] && [ -e {} ]; then echo refused by the test >&2; exit 1; fi\nexec {} \"$@\"\n",
            flag.display(),
            mps_program().display()
        ),
    )
    .unwrap();
    fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut node = Node::new(wrapper);
    node.start();
    let uid = format!("deg-{}", std::process::id());
    node.prepare(&mps_claim(&uid, 7, 50)).unwrap();
    let old = mps_groups(&node.claim(&uid).unwrap())[0].control_daemon_pid;
    fs::write(&flag, "").unwrap();
    kill(Pid::from_raw(old), Signal::SIGKILL).unwrap();
    assert!(wait_until(Duration::from_secs(30), || {
        node.claim(&uid).is_ok_and(|c| {
            c.state == ClaimState::Degraded
                && c.last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("restarting"))
        })
    }));

    let bundle = tmp.path().join("bundle");
    fs::create_dir_all(&bundle).unwrap();
    busybox_rootfs(&bundle, &[]);
    let spec: gpushare::cdi::Spec = serde_json::from_slice(
        &fs::read(node.cdi_dir.join(format!("gpushare.io-claim_{uid}.json"))).unwrap(),
    )
    .unwrap();
    gpushare_cli::container::runc_config(&bundle, "true", &spec.devices[0].container_edits)
        .unwrap();
    let runc_root = tmp.path().join("runc-root");
    let run = |id: &str| {
        let out = Command::new("runc")
            .arg("--root")
            .arg(&runc_root)
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(id)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let _ = Command::new("runc")
            .arg("--root")
            .arg(&runc_root)
            .args(["delete", "-f", id])
            .output();
        out
    };
    let out = run("gs-degraded-1");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "refused while Degraded");
    assert!(
        stderr.contains("Degraded") && stderr.contains(&format!("pid {old}")),
        "the hook names the reason: {stderr}"
    );

    // Once the control program starts daemons again, the backoff's next attempt heals it.
    fs::remove_file(&flag).unwrap();
    assert!(
        wait_until(Duration::from_secs(60), || node
            .claim(&uid)
            .is_ok_and(|c| c.state == ClaimState::Prepared && c.restarts == 1)),
        "log:\n{}",
        node.log()
    );
    let out = run("gs-degraded-2");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut counts = Counts::new();
    node.check(&mut counts);
    node.unprepare(&uid).unwrap();
}

/// A way the checkpoint goes missing, done to a stopped node.
type Loss = fn(&Node);

/// Whether something is mounted exactly on `path` (from this process's mountinfo).
fn mounted(path: &str) -> bool {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| m == path)
}

#[test]
fn a_missing_checkpoint_or_state_directory_loses_no_claim() {
    if !need(is_root(), "root") {
        return;
    }
    let mut node = Node::new(mps_program());
    node.start();
    let pid = std::process::id();
    let (m, t) = (format!("mc-mps-{pid}"), format!("mc-ts-{pid}"));
    node.prepare(&mps_claim(&m, 2, 30)).unwrap();
    node.prepare(&ts_claim(&t, 3)).unwrap();
    let before = mps_groups(&node.claim(&m).unwrap())[0].clone();
    let spec = node.cdi_dir.join(format!("gpushare.io-claim_{m}.json"));
    // Each way the checkpoint goes missing, or stops being a file: an operator's `rm`, a lost
    // volume (the whole state directory), something else at its path.
    let losses: [(&str, Loss); 4] = [
        ("checkpoint removed", |n| n.remove_store()),
        ("state directory removed", |n| {
            fs::remove_dir_all(&n.state_dir).unwrap()
        }),
        ("a directory at the MPS claim's record path", |n| {
            let p = n.record(&format!("mc-mps-{}", std::process::id()));
            fs::remove_file(&p).unwrap();
            fs::create_dir(&p).unwrap();
        }),
        ("a fifo at the MPS claim's record path", |n| {
            let p = n.record(&format!("mc-mps-{}", std::process::id()));
            fs::remove_file(&p).unwrap();
            nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        }),
    ];
    let mut counts = Counts::new();
    for (what, lose) in losses {
        node.kill9();
        lose(&node);
        node.start();
        let c = node
            .claim(&m)
            .unwrap_or_else(|e| panic!("{what}: {e}; log:\n{}", node.log()));
        assert_eq!(c.state, ClaimState::Prepared, "{what}");
        let now = mps_groups(&c)[0].clone();
        assert_eq!(
            (now.control_daemon_pid, now.control_daemon_start_time),
            (before.control_daemon_pid, before.control_daemon_start_time),
            "{what}: the GPU job's MPS control daemon is the same process"
        );
        assert_eq!(now.restarts, 0, "{what}");
        assert!(spec.exists(), "{what}: CDI spec kept");
        assert!(mounted(&before.shm_dir), "{what}: shm tmpfs kept");
        assert_eq!(
            node.claim(&t).unwrap().state,
            ClaimState::Prepared,
            "{what}"
        );
        // Every invariant: the fresh checkpoint holds both claims, nothing orphaned, the
        // time-slice interval and compute mode as the claims ask.
        node.check(&mut counts);
    }
    let log = node.log();
    assert!(log.contains("no checkpoint found"), "logged");
    assert!(
        log.contains("checkpoint was corrupt"),
        "the wrong types quarantined"
    );
    assert_eq!(
        node.quarantined_records(),
        2,
        "the two wrong types kept as evidence"
    );
    node.unprepare(&m).unwrap();
    node.unprepare(&t).unwrap();
    node.check(&mut counts);
    print_counts("missing checkpoint and state directory", &counts);
}

#[test]
fn a_restart_that_cannot_readopt_mps_daemons_stops_and_restarts_them_all_at_once() {
    if !need(is_root(), "root") {
        return;
    }
    const CLAIMS: u32 = 8;
    // --mps-timeout of the Node: the bound each stop waits for a `quit` not taken.
    const TIMEOUT: Duration = Duration::from_secs(5);
    let real = mps_program();
    let mut node = Node::new(real.clone());
    node.start();
    let pid = std::process::id();
    let uids: Vec<String> = (0..CLAIMS).map(|i| format!("ra-{i}-{pid}")).collect();
    for (i, uid) in uids.iter().enumerate() {
        node.prepare(&mps_claim(uid, i as u32, 10 + i as u32))
            .unwrap();
    }
    let old: Vec<i32> = uids
        .iter()
        .map(|u| mps_groups(&node.claim(u).unwrap())[0].control_daemon_pid)
        .collect();
    node.kill9();
    // The MPS control program changed under the running daemons: this one talks only to
    // daemons it started itself, so none of the old ones can be re-adopted, or asked to quit.
    let marks = node.dir.path().join("started-by-the-new-program");
    fs::create_dir(&marks).unwrap();
    let changed = node.dir.path().join("changed-mps-control");
    fs::write(
        &changed,
        format!(
            "#!/bin/sh\n\
             mark={marks}/$(printf %s \"$CUDA_MPS_PIPE_DIRECTORY\" | /usr/bin/md5sum | /usr/bin/cut -d' ' -f1)\n\
             if [ \"$1\" = -d ]; then : > \"$mark\"; exec {real} \"$@\"; fi\n\
             if [ -e \"$mark\" ]; then exec {real} \"$@\"; fi\n\
             /bin/cat > /dev/null; echo 'cannot reach an MPS control daemon started by another program' >&2; exit 1\n",
            marks = marks.display(),
            real = real.display()
        ),
    )
    .unwrap();
    fs::set_permissions(
        &changed,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    node.mps_control = changed;
    let started = Instant::now();
    node.start();
    let took = started.elapsed();
    eprintln!(
        "{CLAIMS} MPS daemons that could not be re-adopted stopped and started again; ready in {took:?}"
    );
    // One after another, each stop alone waits out the timeout for its quit: 8 × 5 s.
    let sequential = TIMEOUT * CLAIMS;
    assert!(
        took < sequential / 2,
        "ready after {took:?}: at least {sequential:?} is what one stop after another takes; log:\n{}",
        node.log()
    );
    for (uid, old) in uids.iter().zip(&old) {
        let c = node.claim(uid).unwrap();
        assert_eq!(c.state, ClaimState::Prepared, "{c:?}");
        let m = &mps_groups(&c)[0];
        assert_ne!(m.control_daemon_pid, *old, "{uid}: started again");
        assert!(
            !gpushare::sys::pid_alive(*old),
            "{uid}: the old daemon is gone"
        );
        assert_eq!(c.restarts, 1, "{uid}");
    }
    assert_eq!(
        node.log().matches("cannot be re-adopted").count(),
        CLAIMS as usize
    );
    let mut counts = Counts::new();
    node.check(&mut counts);
    for uid in &uids {
        node.unprepare(uid).unwrap();
    }
    node.check(&mut counts);
}

/// Issue 25, item 5: a SIGSTOPped MPS control daemon held gpushared's start for two MPS
/// timeouts: the re-adoption probe ran out its timeout, then `quit` waited a full timeout on
/// the same dead pipe. A stopped process shows as such in `/proc` and is not asked at all, and
/// a daemon that did not answer the probe is not asked again: the start is ready within about
/// one timeout, with the stopped daemon killed and replaced and the claim's limits read back.
#[test]
fn a_sigstopped_mps_daemon_delays_the_start_by_at_most_about_one_timeout() {
    if !need(is_root(), "root") {
        return;
    }
    // --mps-timeout of the Node.
    const TIMEOUT: Duration = Duration::from_secs(5);
    let mut node = Node::new(mps_program());
    node.start();
    let uid = format!("stop-{}", std::process::id());
    node.prepare(&mps_claim(&uid, 3, 35)).unwrap();
    let old = mps_groups(&node.claim(&uid).unwrap())[0].clone();
    node.kill9();
    kill(Pid::from_raw(old.control_daemon_pid), Signal::SIGSTOP).unwrap();
    let started = Instant::now();
    node.start();
    let took = started.elapsed();
    eprintln!("a SIGSTOPped MPS control daemon killed and replaced; ready in {took:?}");
    // The mechanism: neither probed nor asked to quit, killed at once for being stopped.
    let log = node.log();
    assert!(
        log.contains("is stopped (SIGSTOP or a tracer); sending SIGKILL without asking it to quit"),
        "{log}"
    );
    assert!(
        !log.contains("did not answer its last control command"),
        "it was not probed: {log}"
    );
    // And its effect: far less than the two timeouts it took before (a bound with the whole
    // start's slack, not a measurement).
    assert!(
        took < TIMEOUT * 3 / 2,
        "ready after {took:?}, the MPS timeout is {TIMEOUT:?}; log:\n{}",
        node.log()
    );
    assert!(
        !gpushare::sys::pid_alive(old.control_daemon_pid),
        "the stopped daemon was killed"
    );
    let c = node.claim(&uid).unwrap();
    assert_eq!(c.state, ClaimState::Prepared, "{c:?}");
    let now = mps_groups(&c)[0].clone();
    assert_ne!(now.control_daemon_pid, old.control_daemon_pid, "replaced");
    assert_eq!(now.active_thread_percentage, "35.0");
    assert_eq!(c.restarts, 1);
    // Every invariant, the limits read back from the new daemon itself among them.
    let mut counts = Counts::new();
    node.check(&mut counts);
    node.unprepare(&uid).unwrap();
    node.check(&mut counts);
}
