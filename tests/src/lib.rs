//! Harness for gpushare's end-to-end tests: a real `gpushared` on its own socket and
//! directories, real MPS control programs, and real containers (runc, podman) against it.
//!
//! Tests need root. Tools that are missing make a test skip with a note, unless
//! `GPUSHARE_E2E_REQUIRE=1` (set by the README's test command), where they fail it.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use gpushare_proto::{
    ClaimInfo, Client, ClientError, GpuInfo, Method, PrepareParams, PrepareResult, UidParams,
};
use serde_json::Value;

pub mod cluster;
pub mod driver_view;
pub mod release;

/// Node name of the cases in `shared/cases` (the `pool` of their allocations).
pub const NODE: &str = "ip-10-0-1-23.us-west-2.compute.internal";

/// The build's binary directory (`target/debug`), found from the test executable's path.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/debug/deps/<test> -> target/debug
    exe.parent()
        .and_then(Path::parent)
        .expect("target directory")
        .to_path_buf()
}

/// A binary of the workspace; panics with a hint when it was not built.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.is_file(),
        "{} is missing: run `cargo build --workspace` (or `cargo test --workspace`) first",
        p.display()
    );
    p
}

/// `shared/cases` beside the repository (or where `GPUSHARE_CASES_DIR` says, for a checkout
/// elsewhere, such as a git worktree), if present.
pub fn cases_dir() -> Option<PathBuf> {
    let p = std::env::var_os("GPUSHARE_CASES_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/cases"));
    p.is_dir()
        .then(|| p.canonicalize().expect("canonical cases dir"))
}

/// Whether missing tools must fail tests instead of skipping them.
pub fn required() -> bool {
    std::env::var("GPUSHARE_E2E_REQUIRE").is_ok_and(|v| v == "1")
}

/// Skips (returns false, with a note) or fails, when `ok` is false.
pub fn need(ok: bool, what: &str) -> bool {
    if !ok {
        assert!(!required(), "required for the end-to-end tests: {what}");
        eprintln!("SKIPPED: {what}");
    }
    ok
}

/// The cases directory when the end-to-end prerequisites hold (root, `shared/cases`); `None`
/// (after a note, or a failure under `GPUSHARE_E2E_REQUIRE=1`) otherwise.
pub fn setup() -> Option<PathBuf> {
    if !need(is_root(), "root (mounts, device nodes, containers)") {
        return None;
    }
    let cases = cases_dir();
    need(cases.is_some(), "shared/cases beside the repository");
    cases
}

/// Whether we run as root.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A program on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

/// The MPS control programs to test with: NVIDIA's real one (when installed) and our emulator.
pub fn mps_programs() -> Vec<(&'static str, PathBuf)> {
    let mut v = Vec::new();
    match which("nvidia-cuda-mps-control") {
        Some(p) => v.push(("nvidia", p)),
        None => {
            need(
                false,
                "nvidia-cuda-mps-control (Debian package nvidia-cuda-mps, non-free)",
            );
        }
    }
    v.push(("emulator", bin("gpushare-mps-control")));
    v
}

/// Serializes tests that share host-global things (the podman CDI directory).
pub fn global_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The p4d.24xlarge profile file with MIG mode enabled on gpu-2
/// (`daemon/examples/profiles/p4d.24xlarge-mig2.toml`), for dynamic MIG.
pub fn p4d_mig_profile() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../daemon/examples/profiles/p4d.24xlarge-mig2.toml")
        .display()
        .to_string()
}

/// Options of a test daemon.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    /// MPS control program.
    pub mps_control: PathBuf,
    /// CDI directory (default: inside the daemon's temporary directory).
    pub cdi_dir: Option<PathBuf>,
    /// Runtime directory (default: inside the daemon's temporary directory).
    pub run_dir: Option<PathBuf>,
}

/// A running `gpushared` in its own temporary directory, stopped on drop.
#[derive(Debug)]
pub struct Daemon {
    /// Temporary root (socket, state, run, cdi).
    pub dir: tempfile::TempDir,
    /// Socket path.
    pub socket: PathBuf,
    /// CDI directory.
    pub cdi_dir: PathBuf,
    /// Runtime directory.
    pub run_dir: PathBuf,
    /// Checkpoint path.
    pub checkpoint: PathBuf,
    /// MPS control program in use.
    pub mps_control: PathBuf,
    /// The CDI directory is not the daemon's own (e.g. podman's `/var/run/cdi`): the driver
    /// spec it generated there is removed when it stops, as nothing else will.
    shared_cdi: bool,
    child: Child,
}

impl Daemon {
    /// A daemon with our MPS control emulator and a private CDI directory.
    pub fn emulated() -> Daemon {
        Daemon::start(DaemonOptions {
            mps_control: bin("gpushare-mps-control"),
            cdi_dir: None,
            run_dir: None,
        })
    }

    /// Starts a daemon on a simulated p4d.24xlarge named [`NODE`] and waits until it answers.
    pub fn start(opts: DaemonOptions) -> Daemon {
        Daemon::start_on(opts, "p4d.24xlarge")
    }

    /// As [`Daemon::start`], with `config` as the daemon's config file (TOML; flags for the
    /// paths, the node and the MPS control program still override it).
    pub fn start_with_config(opts: DaemonOptions, config: &str) -> Daemon {
        Daemon::start_on_with_config(opts, "p4d.24xlarge", config)
    }

    /// Starts a daemon on simulated `profile` (a catalog name or a profile file, see
    /// `gpushared --simulate`) named [`NODE`] and waits until it answers.
    pub fn start_on(opts: DaemonOptions, profile: &str) -> Daemon {
        Daemon::start_on_with_config(opts, profile, "")
    }

    /// As [`Daemon::start_on`], with `config` as the daemon's config file. Metrics are off
    /// unless `config` has a `[metrics]` table: test daemons running side by side must not
    /// compete for the metrics port.
    pub fn start_on_with_config(opts: DaemonOptions, profile: &str, config: &str) -> Daemon {
        // Under /tmp with a short name: Unix socket paths are limited to 108 bytes.
        let dir = tempfile::Builder::new()
            .prefix("gs-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let socket = dir.path().join("gpushared.sock");
        let cdi_dir = opts
            .cdi_dir
            .clone()
            .unwrap_or_else(|| dir.path().join("cdi"));
        let run_dir = opts
            .run_dir
            .clone()
            .unwrap_or_else(|| dir.path().join("run"));
        let state = dir.path().join("state");
        let log = fs::File::create(dir.path().join("gpushared.log")).expect("log file");
        // Always a config file of our own: the host's /etc/gpushare/config.toml must not leak in.
        let config_text = if config.contains("[metrics]") {
            config.to_string()
        } else {
            format!("[metrics]\nenabled = false\n{config}")
        };
        let config = dir.path().join("config.toml");
        fs::write(&config, config_text).expect("config file");
        let child = Command::new(bin("gpushared"))
            .arg("--config")
            .arg(&config)
            .args([
                "--simulate",
                profile,
                "--node-name",
                NODE,
                "--shm-size-mib",
                "64",
            ])
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(&state)
            .arg("--run-dir")
            .arg(&run_dir)
            .arg("--cdi-dir")
            .arg(&cdi_dir)
            .arg("--mps-control")
            .arg(&opts.mps_control)
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawning gpushared");
        let d = Daemon {
            shared_cdi: opts.cdi_dir.is_some(),
            socket,
            cdi_dir,
            run_dir,
            checkpoint: state.join("checkpoint.json"),
            mps_control: opts.mps_control,
            dir,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Client::connect(&d.socket, Duration::from_secs(2)).is_err() {
            assert!(
                Instant::now() < deadline,
                "gpushared did not start; log:\n{}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    /// The driver's CDI spec the daemon generates (`[cdi]` defaults: the simulated toolkit's).
    pub fn driver_spec(&self) -> PathBuf {
        self.cdi_dir.join("gpushare.io-gpu.json")
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("gpushared.log")).unwrap_or_default()
    }

    /// A new client.
    pub fn client(&self) -> Client {
        Client::connect(&self.socket, Duration::from_secs(60)).expect("connecting to gpushared")
    }

    /// Prepares a claim object.
    pub fn prepare(&self, claim: &Value) -> Result<PrepareResult, ClientError> {
        self.client().call(
            Method::Prepare,
            Some(&PrepareParams {
                claim: claim.clone(),
            }),
        )
    }

    /// Releases a claim.
    pub fn unprepare(&self, uid: &str) {
        let r: gpushare_proto::UnprepareResult = self
            .client()
            .call(Method::Unprepare, Some(&UidParams { uid: uid.into() }))
            .unwrap_or_else(|e| panic!("unprepare {uid}: {e}; log:\n{}", self.log()));
        assert!(r.released, "claim {uid} was not prepared");
    }

    /// One claim.
    pub fn claim(&self, uid: &str) -> Result<ClaimInfo, ClientError> {
        self.client()
            .call(Method::GetClaim, Some(&UidParams { uid: uid.into() }))
    }

    /// The GPUs by device name.
    pub fn gpus(&self) -> BTreeMap<String, GpuInfo> {
        let v: Vec<GpuInfo> = self
            .client()
            .call(Method::ListGpus, None::<&()>)
            .expect("list_gpus");
        v.into_iter().map(|g| (g.name.clone(), g)).collect()
    }

    /// Asserts that nothing of `uid` is left: no claim, no checkpoint entry, no CDI spec, no
    /// run directory, no mount under it, and none of `pids` alive.
    pub fn assert_nothing_left(&self, uid: &str, pids: &[i32]) {
        assert!(self.claim(uid).is_err(), "claim {uid} still known");
        let cp: Value =
            serde_json::from_slice(&fs::read(&self.checkpoint).unwrap_or_else(|_| b"{}".to_vec()))
                .expect("checkpoint JSON");
        assert!(
            cp["claims"].get(uid).is_none(),
            "checkpoint still holds {uid}: {cp}"
        );
        let spec = self.cdi_dir.join(format!("gpushare.io-claim_{uid}.json"));
        assert!(!spec.exists(), "{} left behind", spec.display());
        let claim_dir = self.run_dir.join("claims").join(uid);
        assert!(!claim_dir.exists(), "{} left behind", claim_dir.display());
        let mounts = fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        assert!(
            !mounts.contains(&claim_dir.display().to_string()),
            "mount left under {}",
            claim_dir.display()
        );
        for &pid in pids {
            assert!(
                !gpushare::sys::pid_alive(pid),
                "MPS control daemon {pid} of {uid} still running"
            );
        }
    }

    /// Runs one UI session of the MPS control program against a pipe directory.
    pub fn mps_ui(&self, pipe_dir: &str, command: &str) -> Output {
        mps_ui(&self.mps_control, pipe_dir, command)
    }
}

/// Runs one UI session of MPS control program `program` against a pipe directory: `command`
/// on its standard input; what it answered.
pub fn mps_ui(program: &Path, pipe_dir: &str, command: &str) -> Output {
    output_with_input(
        Command::new(program)
            .env_clear()
            .env("CUDA_MPS_PIPE_DIRECTORY", pipe_dir),
        &format!("{command}\n"),
    )
}

/// Runs `cmd` with `input` on its standard input; its output (both streams captured).
///
/// # Panics
/// When it cannot be started or written to.
pub fn output_with_input(cmd: &mut Command, input: &str) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .unwrap_or_else(|e| panic!("writing to {cmd:?}: {e}"));
    child.wait_with_output().expect("output")
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Release whatever a failed test left, so no MPS daemon or mount outlives the test.
        if let Ok(claims) = Client::connect(&self.socket, Duration::from_secs(5))
            .and_then(|mut c| c.call::<(), Vec<ClaimInfo>>(Method::ListClaims, None))
        {
            for c in claims {
                let _ =
                    Client::connect(&self.socket, Duration::from_secs(30)).and_then(|mut cl| {
                        cl.call::<_, Value>(
                            Method::Unprepare,
                            Some(&UidParams { uid: c.uid.clone() }),
                        )
                    });
            }
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        if self.shared_cdi {
            let _ = fs::remove_file(self.driver_spec());
        }
    }
}

/// Reads a case file (JSON or YAML) into a claim object.
pub fn load_claim(path: &Path) -> Value {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    gpushare::config::parse_claim_document(&text)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A copy of `claim` with another UID (for tests that share host-global directories).
pub fn with_uid(claim: &Value, uid: &str) -> Value {
    let mut c = claim.clone();
    c["metadata"]["uid"] = Value::String(uid.into());
    c
}

/// A unique claim UID for this test run.
pub fn unique_uid(tag: &str) -> String {
    format!(
        "e2e-{tag}-{}-{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos() % 1_000_000
    )
}

/// A busybox root filesystem with `extra` host programs and their libraries.
pub fn busybox_rootfs(dir: &Path, extra: &[PathBuf]) -> PathBuf {
    gpushare_cli::container::busybox_rootfs(dir, extra).expect("building a busybox rootfs")
}

/// Polls `f` until it returns true or `timeout` passes.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}
