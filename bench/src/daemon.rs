//! A real `gpushared` driven only through its public interfaces: its command line (simulated
//! GPUs), its socket protocol, `/proc`, and signals.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpushare_proto::{
    ClaimInfo, Client, HealthInfo, Method, PrepareParams, PrepareResult, UidParams, UnprepareResult,
};
use serde_json::{json, Value};

/// Node name the benchmark's claims are allocated on.
pub const NODE: &str = "bench-node.gpushare.internal";

/// Simulated node profile: 8 GPUs.
pub const PROFILE: &str = "p4d.24xlarge";

/// How long a daemon may take to become ready (start, or restart with its checkpoint).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// A `gpushared` on its own socket and directories; released and stopped on drop.
///
/// Laid out as on a node: the state directory on the disk (`/var/lib/gpushare` there), the run
/// directory and the CDI directory on a tmpfs of their own (`/run/gpushare` and
/// `/var/run/cdi` are on systemd's `/run` there), mounted for the daemon's lifetime and
/// kept across its restarts as `/run` is.
#[derive(Debug)]
pub struct Daemon {
    /// Its directory (socket, state, log; `v/` holds run and cdi; short, since MPS pipe paths must fit a socket address).
    pub dir: PathBuf,
    /// Socket path.
    pub socket: PathBuf,
    /// CDI spec directory.
    pub cdi_dir: PathBuf,
    bin: PathBuf,
    mps_control: PathBuf,
    child: Option<Child>,
}

impl Daemon {
    /// Starts `<bin_dir>/gpushared` in `dir` (created; keep it short: socket paths hold at most
    /// 107 bytes) with `mps_control`, and waits until it answers `health`.
    pub fn start(bin_dir: &Path, dir: &Path, mps_control: &Path) -> Result<Daemon> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        // An empty config file: the host's /etc/gpushare/config.toml must not leak in.
        fs::write(dir.join("config.toml"), "")?;
        let volatile = dir.join("v");
        fs::create_dir_all(&volatile)?;
        nix::mount::mount(
            Some("tmpfs"),
            &volatile,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some("mode=0755,size=256m"),
        )
        .with_context(|| format!("mounting a tmpfs on {}", volatile.display()))?;
        let mut d = Daemon {
            dir: dir.to_path_buf(),
            socket: dir.join("sock"),
            cdi_dir: volatile.join("cdi"),
            bin: bin_dir.join("gpushared"),
            mps_control: mps_control.to_path_buf(),
            child: None,
        };
        d.restart(0)?;
        Ok(d)
    }

    /// Spawns the daemon (after [`Daemon::stop`]) and returns the time from spawn until it
    /// answers `health` as ready with `claims` claims.
    pub fn restart(&mut self, claims: usize) -> Result<Duration> {
        if self.child.is_some() {
            bail!("gpushared is already running");
        }
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("gpushared.log"))?;
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--config")
            .arg(self.dir.join("config.toml"))
            .args(["--simulate", PROFILE, "--node-name", NODE])
            .args(["--shm-size-mib", "64"])
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(self.dir.join("state"))
            .arg("--run-dir")
            .arg(self.dir.join("v/run"))
            .arg("--cdi-dir")
            .arg(&self.cdi_dir)
            .arg("--mps-control")
            .arg(&self.mps_control)
            // The daemon's own default log level, as in production.
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let t0 = Instant::now();
        self.child = Some(
            cmd.spawn()
                .with_context(|| format!("spawning {}", self.bin.display()))?,
        );
        loop {
            if let Ok(h) = self.health() {
                if h.ready && h.claims == claims {
                    return Ok(t0.elapsed());
                }
            }
            if t0.elapsed() > READY_TIMEOUT {
                bail!(
                    "gpushared not ready with {claims} claims within {READY_TIMEOUT:?}; log {}",
                    self.dir.join("gpushared.log").display()
                );
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(Child::try_wait) {
                bail!(
                    "gpushared exited ({st}); log {}",
                    self.dir.join("gpushared.log").display()
                );
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    /// Stops the daemon with SIGTERM (SIGKILL after 20 s); its claims stay in the checkpoint.
    pub fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                child.wait()?;
                bail!("gpushared did not stop within 20 s of SIGTERM; killed");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        Ok(())
    }

    /// Kills the daemon with SIGKILL, as a crash would, where a SIGTERM would write every
    /// claim's record once more (thousands of fsyncs at scale); its claims stay in the state
    /// directory, and on drop nothing is released.
    pub fn kill(&mut self) -> Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// The daemon's pid.
    pub fn pid(&self) -> Result<u32> {
        self.child
            .as_ref()
            .map(Child::id)
            .context("gpushared is not running")
    }

    /// A new connection.
    pub fn client(&self) -> Result<Client> {
        Ok(Client::connect(&self.socket, Duration::from_secs(60))?)
    }

    /// `health`, on a new connection.
    pub fn health(&self) -> Result<HealthInfo> {
        Ok(Client::connect(&self.socket, Duration::from_secs(5))?
            .call::<(), HealthInfo>(Method::Health, None)?)
    }

    /// Releases every claim the daemon holds.
    pub fn release_all(&self) -> Result<()> {
        let mut c = self.client()?;
        let claims: Vec<ClaimInfo> = c.call::<(), _>(Method::ListClaims, None)?;
        for claim in claims {
            unprepare(&mut c, &claim.uid)?;
        }
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Nothing may outlive the benchmark: MPS control daemons, mounts, CDI specs.
        if self.child.is_some() {
            if let Err(e) = self.release_all() {
                eprintln!("releasing the claims of {}: {e:#}", self.dir.display());
            }
        }
        if let Err(e) = self.stop() {
            eprintln!("{e:#}");
        }
        let volatile = self.dir.join("v");
        if let Err(e) = nix::mount::umount2(&volatile, nix::mount::MntFlags::MNT_DETACH) {
            eprintln!("unmounting {}: {e}", volatile.display());
        }
    }
}

/// A `resource.k8s.io/v1` ResourceClaim with one request `gpu` allocated `device` on [`NODE`],
/// configured with the short-form opaque `parameters`.
pub fn claim(uid: &str, device: &str, parameters: &Value) -> Value {
    let config = json!({
        "requests": ["gpu"],
        "opaque": {"driver": "gpu.nvidia.com", "parameters": parameters},
    });
    let mut from_claim = config.clone();
    from_claim["source"] = json!("FromClaim");
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": format!("bench-{uid}"), "namespace": "bench", "uid": uid},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}],
            "config": [config],
        }},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": device}],
            "config": [from_claim],
        }}},
    })
}

/// Short-form parameters of each strategy.
pub fn mps_params() -> Value {
    json!({"sharingMode": "mps", "mpsActiveThreadPercentage": 50})
}

/// Time-slicing at the default interval.
pub fn time_slicing_params() -> Value {
    json!({"sharingMode": "time-slicing", "timeSlice": "default"})
}

/// A whole GPU.
pub fn exclusive_params() -> Value {
    json!({"sharingMode": "exclusive"})
}

/// Prepares `claim` on `c`; a claim that was already prepared is an error (the benchmark
/// never repeats a UID, so that would mean the measurement is wrong).
pub fn prepare(c: &mut Client, claim: &Value) -> Result<PrepareResult> {
    let r: PrepareResult = c
        .call(
            Method::Prepare,
            Some(&PrepareParams {
                claim: claim.clone(),
            }),
        )
        .with_context(|| format!("prepare {}", claim["metadata"]["uid"]))?;
    if r.already_prepared {
        bail!("claim {} was already prepared", r.uid);
    }
    Ok(r)
}

/// Releases `uid`; a claim that was not held is an error.
pub fn unprepare(c: &mut Client, uid: &str) -> Result<()> {
    let r: UnprepareResult = c
        .call(Method::Unprepare, Some(&UidParams { uid: uid.into() }))
        .with_context(|| format!("unprepare {uid}"))?;
    if !r.released {
        bail!("claim {uid} was not held");
    }
    Ok(())
}

/// Unique claim UIDs (UUID-shaped) for this run: other runs and tests on the host never
/// share them, which matters where specs land in the host's `/var/run/cdi`.
#[derive(Debug)]
pub struct Uids {
    run: u32,
    next: u64,
}

impl Uids {
    /// UIDs tagged with this process's id.
    pub fn new() -> Uids {
        Uids {
            run: std::process::id(),
            next: 0,
        }
    }

    /// The next UID.
    pub fn next(&mut self) -> String {
        self.next += 1;
        format!("{:08x}-b3c4-4000-8000-{:012x}", self.run, self.next)
    }
}

/// Resident set size (`VmRSS`) and its peak (`VmHWM`) of `pid`, in KiB.
pub fn rss_kib(pid: u32) -> Result<(u64, u64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> Result<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{name} missing in /proc/{pid}/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// CPU time consumed so far by every thread of `pid` (`/proc/<pid>/task/*/schedstat`, which
/// counts nanoseconds where `stat`'s utime/stime count 10 ms ticks).
pub fn cpu_time(pid: u32) -> Result<Duration> {
    let mut ns = 0u64;
    for task in fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = task?.path().join("schedstat");
        // A thread that exited since the listing no longer counts.
        if let Ok(s) = fs::read_to_string(&path) {
            ns += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .with_context(|| format!("parsing {}", path.display()))?;
        }
    }
    Ok(Duration::from_nanos(ns))
}

/// Time to replace a file of `bytes` bytes in `dir` durably, the way a crash-safe checkpoint
/// is written: write a temporary file, fsync it, rename it over the target, fsync the
/// directory. A reference for the daemon's per-request persistence cost on this disk.
pub fn durable_rewrite(dir: &Path, bytes: usize) -> Result<Duration> {
    use std::io::Write as _;
    let data = vec![b'x'; bytes];
    let (tmp, target) = (dir.join("bench-rewrite.tmp"), dir.join("bench-rewrite"));
    let t = Instant::now();
    let mut f = fs::File::create(&tmp)?;
    f.write_all(&data)?;
    f.sync_all()?;
    fs::rename(&tmp, &target)?;
    fs::File::open(dir)?.sync_all()?;
    let elapsed = t.elapsed();
    fs::remove_file(&target)?;
    Ok(elapsed)
}
