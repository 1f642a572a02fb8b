//! Concurrent stress test: 1,000 claims over the 8 GPUs of a simulated p4d.24xlarge, 64
//! clients doing random prepare / attach / detach / unprepare / status calls against a real
//! `gpushared` (with NVIDIA's MPS control daemon when installed) for a bounded time, checking
//! the invariants throughout and at the end, and printing latency percentiles per method.
//!
//! Each client owns the claims whose index is its own modulo the client count, so it knows
//! exactly what every answer about them must be; what depends on other clients (a `Conflict`
//! on a GPU someone else holds) is checked against the GPU listings instead: no GPU ever shows
//! two conflicting modes, and no claim ever has more containers attached than its replicas.
//!
//! Environment: `GPUSHARE_STRESS_SECS` (default 30), `GPUSHARE_STRESS_CLAIMS` (1000),
//! `GPUSHARE_STRESS_CLIENTS` (64), `GPUSHARE_STRESS_SEED` (random; printed).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpushare_e2e::*;
use gpushare_proto::{
    AttachParams, Attachment, ClaimInfo, ClaimState, Client, ClientError, DetachParams,
    DetachResult, ErrorCode, GpuInfo, GpuSharing, HealthInfo, Method, PrepareParams, PrepareResult,
    UidParams, UnprepareResult,
};
use serde_json::{json, Value};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value")),
        Err(_) => default,
    }
}

/// What a claim of the test asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    Exclusive,
    TimeSliced(&'static str, u32),
    Mps(u32),
}

impl Ask {
    fn limit(self) -> Option<u32> {
        match self {
            Ask::Exclusive => None,
            Ask::TimeSliced(_, r) | Ask::Mps(r) => Some(r),
        }
    }

    fn params(self) -> Value {
        match self {
            Ask::Exclusive => json!({"sharingMode": "exclusive"}),
            Ask::TimeSliced(interval, replicas) => {
                json!({"sharingMode": "time-slicing", "timeSlice": interval, "replicas": replicas})
            }
            Ask::Mps(replicas) => {
                json!({"sharingMode": "mps", "mpsActiveThreadPercentage": 50, "replicas": replicas})
            }
        }
    }
}

/// The claims' mix: time-slicing at two intervals on gpu-0..3 (so intervals conflict),
/// time-slicing against exclusive on gpu-4, exclusive only on gpu-5, MPS against
/// time-slicing on gpu-6, MPS only on gpu-7.
fn ask_of(i: usize) -> (usize, Ask) {
    let gpu = i % 8;
    let replicas = (i / 8 % 4) as u32 + 1;
    let ask = match gpu {
        0..=3 if i.is_multiple_of(5) => Ask::TimeSliced("short", replicas),
        0..=3 => Ask::TimeSliced("default", replicas),
        4 if i.is_multiple_of(3) => Ask::Exclusive,
        4 => Ask::TimeSliced("long", 2),
        5 => Ask::Exclusive,
        6 if i.is_multiple_of(2) => Ask::Mps(2),
        6 => Ask::TimeSliced("medium", replicas),
        _ => Ask::Mps(3),
    };
    (gpu, ask)
}

fn claim_object(uid: &str, gpu: usize, ask: Ask) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": format!("stress-{gpu}"), "namespace": "stress", "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": format!("gpu-{gpu}")}],
            "config": [{"source": "FromClaim", "requests": ["gpu"],
                        "opaque": {"driver": "gpu.nvidia.com", "parameters": ask.params()}}]
        }}}
    })
}

/// One claim as its owning client knows it.
struct Own {
    uid: String,
    gpu: usize,
    ask: Ask,
    object: Value,
    prepared: bool,
    attached: BTreeSet<String>,
}

#[derive(Default)]
struct Shared {
    violations: Mutex<Vec<String>>,
    latencies: Mutex<BTreeMap<&'static str, Vec<Duration>>>,
    outcomes: Mutex<BTreeMap<String, u64>>,
}

impl Shared {
    fn violation(&self, what: String) {
        let mut v = self.violations.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() < 200 {
            v.push(what);
        }
    }

    fn outcome(&self, what: &str) {
        *self
            .outcomes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(what.to_string())
            .or_default() += 1;
    }
}

struct Ctx {
    shared: Arc<Shared>,
    asks: Arc<BTreeMap<String, (usize, Ask)>>,
    socket: std::path::PathBuf,
    client: Client,
    latencies: BTreeMap<&'static str, Vec<Duration>>,
}

impl Ctx {
    fn call<P: serde::Serialize, R: serde::de::DeserializeOwned>(
        &mut self,
        name: &'static str,
        method: Method,
        params: Option<&P>,
    ) -> Result<R, ClientError> {
        let start = Instant::now();
        let r = self.client.call(method, params);
        self.latencies
            .entry(name)
            .or_default()
            .push(start.elapsed());
        if let Err(e @ (ClientError::Io { .. } | ClientError::Protocol(_))) = &r {
            // A timed-out call is a stuck daemon (or a deadlock): record it and reconnect.
            self.shared
                .violation(format!("{name}: no answer within the client timeout: {e}"));
            self.client = Client::connect(&self.socket, CALL_TIMEOUT).expect("reconnecting");
        }
        r
    }

    /// Checks a GPU listing: no GPU shows two conflicting modes, holders ask what it shows.
    fn check_gpus(&self, gpus: &[GpuInfo]) {
        for g in gpus {
            let asks: Vec<(usize, Ask)> = g
                .claims
                .iter()
                .filter_map(|uid| self.asks.get(uid).copied())
                .collect();
            let wrong_gpu = asks.iter().any(|(gpu, _)| format!("gpu-{gpu}") != g.name);
            let ok = match g.sharing {
                GpuSharing::Free => g.claims.is_empty(),
                GpuSharing::Exclusive => {
                    g.claims.len() == 1 && matches!(asks[..], [(_, Ask::Exclusive)])
                }
                GpuSharing::Mps => g.claims.len() == 1 && matches!(asks[..], [(_, Ask::Mps(_))]),
                GpuSharing::TimeSlicing => {
                    let intervals: BTreeSet<&str> = asks
                        .iter()
                        .filter_map(|(_, a)| match a {
                            Ask::TimeSliced(i, _) => Some(*i),
                            _ => None,
                        })
                        .collect();
                    !g.claims.is_empty() && asks.len() == g.claims.len() && intervals.len() == 1
                }
                // This stress run asks for no MIG devices.
                GpuSharing::Mig => false,
            };
            if !ok || wrong_gpu {
                self.shared.violation(format!(
                    "{} shows {:?} held by {:?} (asks {asks:?})",
                    g.name, g.sharing, g.claims
                ));
            }
        }
    }

    fn check_claims(&self, claims: &[ClaimInfo]) {
        for c in claims {
            if let Some(limit) = c.attach_limit {
                if c.attached.len() > limit as usize {
                    self.shared.violation(format!(
                        "claim {} has {} containers attached, limit {limit}",
                        c.uid,
                        c.attached.len()
                    ));
                }
            }
        }
    }

    fn step(&mut self, own: &mut Own, rng: &mut fastrand::Rng, pids: &[i32], serial: &mut u64) {
        let uid = own.uid.clone();
        let mut pick = rng.u32(0..100);
        // Most calls on a claim that is not prepared are a prepare, as on a real node; a few
        // attach, detach or unprepare it anyway (a hook or kubelet retry after a release).
        if !own.prepared && (25..75).contains(&pick) && rng.u32(0..100) < 80 {
            pick = 0;
        }
        match pick {
            0..=24 => {
                let r: Result<PrepareResult, _> = self.call(
                    "prepare",
                    Method::Prepare,
                    Some(&PrepareParams {
                        claim: own.object.clone(),
                    }),
                );
                match r {
                    Ok(p) if p.already_prepared == own.prepared => {
                        self.shared.outcome("prepare ok");
                        own.prepared = true;
                    }
                    Err(ClientError::Remote(e))
                        if e.code == ErrorCode::Conflict && !own.prepared =>
                    {
                        self.shared.outcome("prepare conflict");
                    }
                    other => self.shared.violation(format!(
                        "prepare {uid} (prepared: {}): {other:?}",
                        own.prepared
                    )),
                }
            }
            25..=39 => {
                let r: Result<UnprepareResult, _> = self.call(
                    "unprepare",
                    Method::Unprepare,
                    Some(&UidParams { uid: uid.clone() }),
                );
                match r {
                    Ok(u) if u.released == own.prepared => {
                        own.prepared = false;
                        own.attached.clear();
                        self.shared.outcome("unprepare ok");
                    }
                    other => self.shared.violation(format!(
                        "unprepare {uid} (prepared: {}): {other:?}",
                        own.prepared
                    )),
                }
            }
            40..=59 => {
                *serial += 1;
                let container = format!("c{serial}-{}", rng.u32(..));
                let r: Result<Attachment, _> = self.call(
                    "attach",
                    Method::Attach,
                    Some(&AttachParams {
                        claim_uid: uid.clone(),
                        container_id: container.clone(),
                        pid: Some(pids[rng.usize(..pids.len())]),
                        bundle: None,
                        pod: None,
                    }),
                );
                let full = own
                    .ask
                    .limit()
                    .is_some_and(|l| own.attached.len() >= l as usize);
                match r {
                    Ok(_) if own.prepared && !full => {
                        own.attached.insert(container);
                        self.shared.outcome("attach ok");
                    }
                    Err(ClientError::Remote(e))
                        if e.code == ErrorCode::LimitReached && own.prepared && full =>
                    {
                        self.shared.outcome("attach at limit");
                    }
                    Err(ClientError::Remote(e))
                        if e.code == ErrorCode::NotFound && !own.prepared =>
                    {
                        self.shared.outcome("attach not prepared");
                    }
                    other => self.shared.violation(format!(
                        "attach to {uid} (prepared: {}, attached {}/{:?}): {other:?}",
                        own.prepared,
                        own.attached.len(),
                        own.ask.limit()
                    )),
                }
            }
            60..=74 => {
                let known = own.attached.iter().next().cloned();
                let container = known.clone().unwrap_or_else(|| "never-attached".into());
                let r: Result<DetachResult, _> = self.call(
                    "detach",
                    Method::Detach,
                    Some(&DetachParams {
                        claim_uid: uid.clone(),
                        container_id: container.clone(),
                    }),
                );
                match r {
                    Ok(d) if d.detached == known.is_some() => {
                        own.attached.remove(&container);
                        self.shared.outcome("detach ok");
                    }
                    other => self
                        .shared
                        .violation(format!("detach {container} from {uid}: {other:?}")),
                }
            }
            75..=84 => {
                let r: Result<ClaimInfo, _> = self.call(
                    "get_claim",
                    Method::GetClaim,
                    Some(&UidParams { uid: uid.clone() }),
                );
                match r {
                    Ok(c)
                        if own.prepared
                            && c.state == ClaimState::Prepared
                            && c.attached
                                .iter()
                                .map(|a| a.container_id.clone())
                                .collect::<BTreeSet<_>>()
                                == own.attached => {}
                    Err(ClientError::Remote(e))
                        if e.code == ErrorCode::NotFound && !own.prepared => {}
                    other => self.shared.violation(format!(
                        "get_claim {uid} (prepared: {}, attached {:?}): {other:?}",
                        own.prepared, own.attached
                    )),
                }
            }
            85..=91 => match self.call::<(), Vec<GpuInfo>>("list_gpus", Method::ListGpus, None) {
                Ok(gpus) => self.check_gpus(&gpus),
                Err(e) => self.shared.violation(format!("list_gpus: {e}")),
            },
            92..=96 => {
                match self.call::<(), Vec<ClaimInfo>>("list_claims", Method::ListClaims, None) {
                    Ok(claims) => self.check_claims(&claims),
                    Err(e) => self.shared.violation(format!("list_claims: {e}")),
                }
            }
            _ => match self.call::<(), HealthInfo>("health", Method::Health, None) {
                Ok(h) if h.ready => {}
                other => self.shared.violation(format!("health: {other:?}")),
            },
        }
    }
}

const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Sleeping processes whose pids stand for containers' init processes.
struct Sleepers(Vec<Child>);

impl Drop for Sleepers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[test]
fn thousand_claims_sixty_four_clients() {
    if !need(is_root(), "root (mounts, MPS control daemons)") {
        return;
    }
    let secs: u64 = env_or("GPUSHARE_STRESS_SECS", 30);
    let n_claims: usize = env_or("GPUSHARE_STRESS_CLAIMS", 1000);
    let n_clients: usize = env_or("GPUSHARE_STRESS_CLIENTS", 64);
    let seed: u64 = env_or("GPUSHARE_STRESS_SEED", fastrand::u64(..));
    let (mps_name, mps_control) = mps_programs().remove(0);
    let d = Daemon::start(DaemonOptions {
        mps_control,
        cdi_dir: None,
        run_dir: None,
    });
    let mut out = std::io::stderr().lock();
    // Straight to the handle: the test harness captures print! and eprint!, not this.
    let _ = writeln!(
        out,
        "stress: {n_claims} claims, {n_clients} clients, {secs} s, seed {seed}, MPS control {mps_name}"
    );
    drop(out);

    let sleepers = Sleepers(
        (0..4)
            .map(|_| {
                Command::new("sleep")
                    .arg("3600")
                    .spawn()
                    .expect("spawning sleep")
            })
            .collect(),
    );
    let pids: Arc<Vec<i32>> = Arc::new(sleepers.0.iter().map(|c| c.id() as i32).collect());
    let tag = format!("st{}", std::process::id());
    let mut asks = BTreeMap::new();
    let mut owned: Vec<Vec<Own>> = (0..n_clients).map(|_| Vec::new()).collect();
    for i in 0..n_claims {
        let uid = format!("{tag}-{i}");
        let (gpu, ask) = ask_of(i);
        asks.insert(uid.clone(), (gpu, ask));
        owned[i % n_clients].push(Own {
            object: claim_object(&uid, gpu, ask),
            uid,
            gpu,
            ask,
            prepared: false,
            attached: BTreeSet::new(),
        });
    }
    let asks = Arc::new(asks);
    let shared = Arc::new(Shared::default());
    let deadline = Instant::now() + Duration::from_secs(secs);
    let started = Instant::now();

    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let mut handles = Vec::new();
    for (k, mut mine) in owned.into_iter().enumerate() {
        let shared = Arc::clone(&shared);
        let asks = Arc::clone(&asks);
        let pids = Arc::clone(&pids);
        let socket = d.socket.clone();
        let done_tx = done_tx.clone();
        handles.push(std::thread::spawn(move || {
            let mut ctx = Ctx {
                client: Client::connect(&socket, CALL_TIMEOUT).expect("connecting"),
                socket,
                shared: Arc::clone(&shared),
                asks,
                latencies: BTreeMap::new(),
            };
            let mut rng =
                fastrand::Rng::with_seed(seed ^ (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let mut serial = 0;
            let mut ops = 0u64;
            while Instant::now() < deadline && !mine.is_empty() {
                let i = rng.usize(..mine.len());
                ctx.step(&mut mine[i], &mut rng, &pids, &mut serial);
                ops += 1;
            }
            // Drain: detach everything and release every claim this client holds.
            for own in &mut mine {
                for container in std::mem::take(&mut own.attached) {
                    let r: Result<DetachResult, _> = ctx.call(
                        "detach",
                        Method::Detach,
                        Some(&DetachParams {
                            claim_uid: own.uid.clone(),
                            container_id: container.clone(),
                        }),
                    );
                    if !matches!(r, Ok(DetachResult { detached: true })) {
                        shared.violation(format!("final detach {container} of {}: {r:?}", own.uid));
                    }
                }
                if own.prepared {
                    let r: Result<UnprepareResult, _> = ctx.call(
                        "unprepare",
                        Method::Unprepare,
                        Some(&UidParams {
                            uid: own.uid.clone(),
                        }),
                    );
                    if !matches!(r, Ok(UnprepareResult { released: true, .. })) {
                        shared.violation(format!(
                            "final unprepare {} (gpu-{}): {r:?}",
                            own.uid, own.gpu
                        ));
                    }
                    own.prepared = false;
                }
            }
            let mut all = shared.latencies.lock().unwrap_or_else(|p| p.into_inner());
            for (name, mut v) in ctx.latencies {
                all.entry(name).or_default().append(&mut v);
            }
            drop(all);
            let _ = done_tx.send(ops);
        }));
    }
    drop(done_tx);
    // Zero deadlocks: every client finishes its run and its drain within a bound.
    let grace = Duration::from_secs(secs + 180);
    let mut total_ops = 0;
    for _ in 0..n_clients {
        match done_rx.recv_timeout(grace.saturating_sub(started.elapsed())) {
            Ok(ops) => total_ops += ops,
            Err(_) => panic!(
                "deadlock: a client did not finish within {} s; daemon log tail:\n{}",
                grace.as_secs(),
                tail(&d.log(), 60)
            ),
        }
    }
    for h in handles {
        h.join().expect("client thread");
    }
    let elapsed = started.elapsed();

    // The end state: nothing held, nothing left on disk.
    let mut c = d.client();
    let claims: Vec<ClaimInfo> = c
        .call(Method::ListClaims, None::<&()>)
        .expect("list_claims");
    if !claims.is_empty() {
        shared.violation(format!(
            "{} claims left after the drain: {:?}",
            claims.len(),
            claims.iter().map(|c| &c.uid).take(10).collect::<Vec<_>>()
        ));
    }
    let gpus: Vec<GpuInfo> = c.call(Method::ListGpus, None::<&()>).expect("list_gpus");
    for g in &gpus {
        if g.sharing != GpuSharing::Free
            || g.compute_mode != Default::default()
            || g.time_slice != Default::default()
        {
            shared.violation(format!(
                "{} left {:?} / compute mode {:?} / time-slice {:?}",
                g.name, g.sharing, g.compute_mode, g.time_slice
            ));
        }
    }
    let cp: Value = serde_json::from_slice(&std::fs::read(&d.checkpoint).unwrap_or_default())
        .unwrap_or(json!({}));
    if cp["claims"].as_object().is_some_and(|m| !m.is_empty()) {
        shared.violation("checkpoint still holds claims".into());
    }
    // Claims' specs; the node's driver spec (generated at start) stays, as on a node.
    let left_specs = std::fs::read_dir(&d.cdi_dir)
        .map(|r| {
            r.flatten()
                .filter(|e| e.file_name() != "gpushare.io-gpu.json")
                .count()
        })
        .unwrap_or(0);
    let left_dirs = std::fs::read_dir(d.run_dir.join("claims"))
        .map(|r| r.count())
        .unwrap_or(0);
    if left_specs + left_dirs > 0 {
        shared.violation(format!(
            "{left_specs} CDI specs and {left_dirs} claim directories left"
        ));
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    if mounts.contains(&d.run_dir.display().to_string()) {
        shared.violation("mounts left under the run directory".into());
    }

    let latencies = shared.latencies.lock().unwrap_or_else(|p| p.into_inner());
    let outcomes = shared.outcomes.lock().unwrap_or_else(|p| p.into_inner());
    let violations = shared.violations.lock().unwrap_or_else(|p| p.into_inner());
    let mut report = format!(
        "stress: {total_ops} calls in {:.1} s ({:.0}/s), {} invariant violations, 0 deadlocks\n",
        elapsed.as_secs_f64(),
        total_ops as f64 / elapsed.as_secs_f64(),
        violations.len()
    );
    report += &format!(
        "{:<12} {:>8} {:>10} {:>10} {:>10}\n",
        "method", "calls", "p50 ms", "p99 ms", "max ms"
    );
    for (name, v) in latencies.iter() {
        let mut v = v.clone();
        v.sort();
        if v.is_empty() {
            continue;
        }
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        report += &format!(
            "{name:<12} {:>8} {:>10.2} {:>10.2} {:>10.2}\n",
            v.len(),
            ms(percentile(&v, 0.50)),
            ms(percentile(&v, 0.99)),
            ms(*v.last().expect("non-empty"))
        );
    }
    report += &format!("outcomes: {outcomes:?}\n");
    let _ = std::io::stderr().lock().write_all(report.as_bytes());
    drop(sleepers);
    assert!(
        violations.is_empty(),
        "{} invariant violations (first ones):\n{}\nlog tail:\n{}",
        violations.len(),
        violations
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n"),
        tail(&d.log(), 40)
    );
    assert!(
        outcomes.get("prepare ok").is_some_and(|n| *n > 0)
            && outcomes.get("attach ok").is_some_and(|n| *n > 0),
        "the run did no real work: {outcomes:?}"
    );
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
