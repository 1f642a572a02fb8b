//! `gpushare doctor`: what is wrong with this node's gpushare setup, one line per check with
//! a fix hint.
//!
//! Checks ([`CHECKS`], in order, after the config file's): NVML and the driver version (or
//! the simulated GPUs of `--simulate`, else of the running daemon's simulated backend), the
//! MPS control program gpushared runs (or would run), the helper programs
//! (`gpushare-cdi-hook`, `gpushare-runtime`, `gpushare-dra`: beside this executable first,
//! else on `PATH`; see [`find_helper`]), NVIDIA's container toolkit for the driver's CDI spec
//! (`[cdi] driver_spec`), the containerd config (CDI enabled or the `gpushare` runtime
//! configured), `nodeadm` and our drop-in, the CDI spec directories (valid specs, no device
//! defined twice), the daemon's socket (a hint per [`DaemonError`]), whether the daemon
//! answering there uses the directories checked here, the claim records (the `checkpoint`
//! check), degraded claims, the compute mode of GPUs shared with MPS, and the DRA kubelet
//! plugin (`gpushare-dra probe`). Files are read where [`DoctorPaths`] says (the config file,
//! with `--state-dir`/`--run-dir`/`--cdi-dir` laid over it as gpushared does; tests point them
//! at temporary directories); everything that asks the driver, `PATH`, lock holders or the
//! daemon goes through [`DoctorHost`]. Nothing is changed: a corrupt claim record or checkpoint
//! is reported, not moved aside as `gpushared` would.
//!
//! A new check is a function `fn(&Context) -> Check` and an entry in [`CHECKS`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use gpushare_proto::{ClaimInfo, ClaimState, ComputeMode, GpuInfo, GpuSharing, HealthInfo};
use serde::Serialize;

use gpushare::cli_api::{
    catalog, default_program, find_lock_holder, is_emulator, nvidia_ctk, split_kind, store,
    Checkpoint, DaemonConfig, DriverSpecMode, DEFAULT_CONFIG_PATH,
};

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Fine.
    Ok,
    /// Worth a look, but gpushare works (e.g. not an EKS node, so no `nodeadm`).
    Warn,
    /// gpushare cannot work as configured; `doctor` exits non-zero.
    Fail,
    /// Could not be checked because an earlier check failed.
    Skip,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Short stable name, e.g. `containerd`.
    pub name: &'static str,
    /// Outcome.
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// How to fix it (empty when nothing needs fixing).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub hint: String,
}

/// Every check, in order; `-o json` prints this.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// No check failed.
    pub ok: bool,
    /// The checks.
    pub checks: Vec<Check>,
}

impl Report {
    /// One line per check: status, name, what was found, and the hint after `->`.
    pub fn text(&self) -> String {
        let width = self.checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
        let mut s = String::new();
        for c in &self.checks {
            s += &format!("{:<4}  {:<width$}  {}", c.status.label(), c.name, c.detail);
            if !c.hint.is_empty() {
                s += &format!(" -> {}", c.hint);
            }
            s.push('\n');
        }
        let failed = self
            .checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .count();
        s += &if failed == 0 {
            "no problem found\n".to_string()
        } else {
            format!("{failed} check(s) failed\n")
        };
        s
    }
}

/// What the daemon reports over its socket.
#[derive(Debug, Clone)]
pub struct DaemonView {
    /// The daemon's pid, from the socket's peer credentials (`None` across pid namespaces).
    pub pid: Option<i32>,
    /// `health`.
    pub health: HealthInfo,
    /// `list_gpus`.
    pub gpus: Vec<GpuInfo>,
    /// `list_claims`.
    pub claims: Vec<ClaimInfo>,
}

/// Why the daemon at the socket gave doctor no answer: each kind has a hint of its own (a
/// daemon this user may not connect to runs, and needs no "start it").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DaemonError {
    /// Nothing listens there: no socket file, or a socket nobody accepts on (what a stopped
    /// daemon leaves, `ECONNREFUSED`).
    NotRunning(String),
    /// The socket exists, but this user may not connect to it (`EACCES`/`EPERM`): the
    /// daemon's `[socket] mode` and `group` let only root and that group in.
    PermissionDenied(String),
    /// No connection or no answer within the timeout.
    TimedOut(String),
    /// The path is no socket (a directory, a regular file).
    NotASocket(String),
    /// Connected, but the answer was an error or not gpushared's protocol.
    Protocol(String),
    /// Anything else the connection or the exchange failed with.
    Other(String),
}

impl DaemonError {
    /// What went wrong, in the words of the error met.
    pub fn message(&self) -> &str {
        match self {
            DaemonError::NotRunning(m)
            | DaemonError::PermissionDenied(m)
            | DaemonError::TimedOut(m)
            | DaemonError::NotASocket(m)
            | DaemonError::Protocol(m)
            | DaemonError::Other(m) => m,
        }
    }

    /// The kind of a client's error: connecting, by its `io::ErrorKind`; an answer that is an
    /// error or unreadable, [`DaemonError::Protocol`].
    pub fn from_client(e: &gpushare_proto::ClientError) -> DaemonError {
        use gpushare_proto::ClientError as E;
        use std::io::ErrorKind as K;
        let m = e.to_string();
        match e {
            E::Connect { error, .. } => match error.kind() {
                K::NotFound | K::ConnectionRefused => DaemonError::NotRunning(m),
                K::PermissionDenied => DaemonError::PermissionDenied(m),
                K::TimedOut | K::WouldBlock => DaemonError::TimedOut(m),
                _ => DaemonError::Other(m),
            },
            E::NotASocket { .. } => DaemonError::NotASocket(m),
            E::Io { error, .. } => match error.kind() {
                K::TimedOut | K::WouldBlock => DaemonError::TimedOut(m),
                _ => DaemonError::Other(m),
            },
            // gpushared's own refusals: a peer outside [socket] group on a socket any user may
            // open is refused by the server, not the kernel; every connection taken is busy.
            E::Remote(body) => match body.code {
                gpushare_proto::ErrorCode::PermissionDenied => DaemonError::PermissionDenied(m),
                gpushare_proto::ErrorCode::Busy => DaemonError::TimedOut(m),
                _ => DaemonError::Protocol(m),
            },
            E::Protocol(_) | E::TooLarge { .. } => DaemonError::Protocol(m),
        }
    }
}

impl std::fmt::Display for DaemonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

/// The effects `doctor` needs beyond reading files.
pub trait DoctorHost {
    /// The NVIDIA driver version, from NVML's library and the kernel module; `Err` says what
    /// is missing.
    ///
    /// # Errors
    /// No driver or no NVML library.
    fn driver_version(&self) -> Result<String, String>;
    /// A program on `PATH`.
    fn which(&self, name: &str) -> Option<PathBuf>;
    /// Whether `path` is an executable file.
    fn executable(&self, path: &Path) -> bool;
    /// Asks the daemon at `socket` for its health, GPUs and claims.
    ///
    /// # Errors
    /// Not reachable (not running, no permission, timed out, no socket), or an error answer;
    /// the kind decides the socket check's hint.
    fn daemon(&self, socket: &Path) -> Result<DaemonView, DaemonError>;
    /// The directory `gpushared` is installed in (where it finds its MPS control emulator and
    /// `gpushare-cdi-hook`); the CLI's own executable's, as the package installs every
    /// gpushare program side by side: where [`find_helper`] looks first.
    fn gpushared_dir(&self) -> PathBuf;
    /// The pid holding a POSIX lock on `path` (`fcntl(F_GETLK)`), `None` when nobody does.
    ///
    /// # Errors
    /// `path` cannot be opened or asked (the message says which and why).
    fn lock_holder(&self, path: &Path) -> Result<Option<i32>, String>;
    /// The command line and working directory of process `pid` (`/proc/<pid>/cmdline` and
    /// `cwd`), `None` when they cannot be read: where a hand-started gpushared's
    /// `--state-dir`, `--run-dir`, `--cdi-dir` and `--config` are found.
    fn daemon_command_line(&self, _pid: i32) -> Option<(Vec<String>, PathBuf)> {
        None
    }
    /// Runs `program probe --json` (`gpushare-dra`, found by [`find_helper`]: the DRA kubelet
    /// plugin checks its own sockets and names, with its own config), bounded to 15 s: each
    /// check as (name, passed, detail, hint).
    ///
    /// # Errors
    /// The probe could not run or its output is unreadable.
    fn dra_probe(&self, program: &Path, args: &[String]) -> Result<Vec<ProbeCheck>, String> {
        run_dra_probe(program, args)
    }
}

/// Where [`find_helper`] found a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Helper {
    /// The program.
    pub path: PathBuf,
    /// Found beside this executable ([`DoctorHost::gpushared_dir`]), not on `PATH`.
    pub beside: bool,
}

impl std::fmt::Display for Helper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let place = if self.beside {
            "beside gpushare"
        } else {
            "on PATH"
        };
        write!(f, "{} ({place})", self.path.display())
    }
}

/// A gpushare helper program (`gpushare-cdi-hook`, `gpushare-runtime`, `gpushare-dra`):
/// beside this executable first, then on `PATH`.
///
/// Beside first, because the package installs every gpushare program side by side and
/// gpushared itself looks for its hook and its MPS emulator beside its own executable only:
/// the helpers beside the CLI are those of its own build (an unpacked release, a build tree,
/// an install in /usr/local/bin), which speak its version of `probe --json`, where an older
/// copy on `PATH` may not. `PATH` finds a helper for a CLI copied on its own.
pub fn find_helper<H: DoctorHost + ?Sized>(host: &H, name: &str) -> Option<Helper> {
    let beside = host.gpushared_dir().join(name);
    if host.executable(&beside) {
        return Some(Helper {
            path: beside,
            beside: true,
        });
    }
    host.which(name).map(|path| Helper {
        path,
        beside: false,
    })
}

/// The helper programs gpushare installs beside `gpushared` and where each was found: the
/// OCI hook every claim's CDI spec names (`[hook] path`, else beside gpushared; WARN when
/// found nowhere, FAIL when `[hook] path` names no executable), the runtime wrapper
/// (containerd's `gpushare` runtime only) and the DRA kubelet plugin (a DaemonSet may run it
/// instead), the last two only reported.
fn check_helpers(ctx: &Context<'_>) -> Check {
    let host = ctx.host;
    let hook_hint = "install the gpushare package (it puts gpushare-cdi-hook beside gpushared), or set [hook] path to it";
    let configured = &ctx.cfg.hook.path;
    let (hook, status) = if configured.as_os_str().is_empty() {
        match find_helper(host, "gpushare-cdi-hook") {
            Some(h) if h.beside => (format!("gpushare-cdi-hook {h}"), Status::Ok),
            // gpushared names the hook beside its own executable, never one on PATH.
            Some(h) => (
                format!(
                    "gpushare-cdi-hook {h}, not beside gpushare in {}: gpushared names the hook beside itself in every claim's CDI spec (unless [hook] path is set), not one on PATH",
                    host.gpushared_dir().display()
                ),
                Status::Warn,
            ),
            None => (
                format!(
                    "gpushare-cdi-hook found neither beside gpushare in {} nor on PATH: gpushared names it in every claim's CDI spec (beside itself unless [hook] path is set), and a claim's container cannot start without it",
                    host.gpushared_dir().display()
                ),
                Status::Warn,
            ),
        }
    } else if host.executable(configured) {
        (
            format!("gpushare-cdi-hook {} ([hook] path)", configured.display()),
            Status::Ok,
        )
    } else {
        (
            format!(
                "[hook] path {} is not an executable file: gpushared names it in every claim's CDI spec, and a claim's container cannot start without it",
                configured.display()
            ),
            Status::Fail,
        )
    };
    let mut found = vec![hook];
    for (name, absent) in [
        (
            "gpushare-runtime",
            "not installed (only containerd's gpushare runtime uses it)",
        ),
        (
            "gpushare-dra",
            "not installed (a DaemonSet may run the DRA kubelet plugin)",
        ),
    ] {
        found.push(match find_helper(host, name) {
            Some(h) => format!("{name} {h}"),
            None => format!("{name} {absent}"),
        });
    }
    check("helpers", status, found.join("; "), hook_hint)
}

/// One check of `gpushare-dra probe`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeCheck {
    /// The probe's name for it (`registration`, `dra-socket`, `names`).
    pub name: String,
    /// Passed.
    pub passed: bool,
    /// What was found.
    pub detail: String,
    /// The probe's fix hint (empty when it passed, or from a plugin without hints).
    pub hint: String,
}

/// `gpushare-dra probe --json`'s checks: `{"name", "status": "ok"|"fail", "detail", "hint"}`
/// (plugins before the status field wrote `"ok": bool` and no hint). `None` when it is
/// not such a list.
fn parse_probe_json(stdout: &[u8]) -> Option<Vec<ProbeCheck>> {
    let checks: Vec<serde_json::Value> = serde_json::from_slice(stdout).ok()?;
    let text = |c: &serde_json::Value, k: &str| c[k].as_str().unwrap_or_default().to_string();
    Some(
        checks
            .iter()
            .map(|c| ProbeCheck {
                name: text(c, "name"),
                passed: c["status"] == "ok" || c["ok"] == true,
                detail: text(c, "detail"),
                hint: text(c, "hint"),
            })
            .collect(),
    )
}

fn run_dra_probe(program: &Path, args: &[String]) -> Result<Vec<ProbeCheck>, String> {
    use std::process::{Command, Stdio};
    let mut child = Command::new(program)
        .args(["probe", "--json"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running {}: {e}", program.display()))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{} probe took more than 15 s", program.display()));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    parse_probe_json(&out.stdout)
        .ok_or_else(|| String::from_utf8_lossy(&out.stderr).trim().to_string())
}

/// The DRA kubelet plugin: its registration socket answers `GetInfo`, its DRA socket
/// answers, and its node and driver names agree with gpushared's (`gpushare-dra probe`).
fn check_dra_plugin(host: &dyn DoctorHost, args: &[String]) -> Check {
    let hint = "the plugin's log: kubectl -n gpushare logs <the node's plugin pod> under the DaemonSet, or systemctl status gpushare-dra; journalctl -u gpushare-dra for the host unit (node and driver names: the DaemonSet's args, or /etc/gpushare/dra.toml)";
    let Some(program) = find_helper(host, "gpushare-dra") else {
        return check(
            "dra-plugin",
            Status::Skip,
            format!(
                "gpushare-dra not installed (neither beside gpushare in {} nor on PATH)",
                host.gpushared_dir().display()
            ),
            "",
        );
    };
    let by = format!("probed with {program}");
    match host.dra_probe(&program.path, args) {
        Err(e) => check("dra-plugin", Status::Fail, format!("{e} ({by})"), hint),
        Ok(checks) => {
            let failed: Vec<&ProbeCheck> = checks.iter().filter(|c| !c.passed).collect();
            if failed.is_empty() && !checks.is_empty() {
                let shown: Vec<&str> = checks.iter().map(|c| c.detail.as_str()).collect();
                check(
                    "dra-plugin",
                    Status::Ok,
                    format!("{} ({by})", shown.join("; ")),
                    "",
                )
            } else {
                let detail: Vec<String> = failed
                    .iter()
                    .map(|c| format!("{}: {}", c.name, c.detail))
                    .collect();
                // The probe's own hints where it gives them, each once.
                let mut hints: Vec<&str> = Vec::new();
                for c in &failed {
                    if !c.hint.is_empty() && !hints.contains(&c.hint.as_str()) {
                        hints.push(&c.hint);
                    }
                }
                let hint = if hints.is_empty() {
                    hint.to_string()
                } else {
                    hints.join("; ")
                };
                check(
                    "dra-plugin",
                    Status::Fail,
                    format!("{} ({by})", detail.join("; ")),
                    &hint,
                )
            }
        }
    }
}

/// `gpushare-dra probe`'s flags for this doctor run: the socket doctor checks (so that the
/// plugin's check asks the same gpushared), and the plugin's config file and kubelet
/// directories where doctor was given them (else the probe reads its own config).
fn dra_probe_args(ctx: &Context<'_>) -> Vec<String> {
    let mut args = vec![
        "--gpushared-socket".to_string(),
        ctx.socket.display().to_string(),
    ];
    for (flag, value) in [
        ("--config", &ctx.paths.dra_config),
        ("--plugins-dir", &ctx.paths.dra_plugins_dir),
        ("--registry-dir", &ctx.paths.dra_registry_dir),
    ] {
        if let Some(v) = value {
            args.extend([flag.to_string(), v.display().to_string()]);
        }
    }
    args
}

/// Where `doctor` reads files; [`DoctorPaths::default`] is a real node.
#[derive(Debug, Clone)]
pub struct DoctorPaths {
    /// gpushared's config file.
    pub config: PathBuf,
    /// Whether `config` was named by the user (then a missing file fails).
    pub config_required: bool,
    /// containerd's main config file.
    pub containerd_config: PathBuf,
    /// `nodeadm`'s drop-in directory.
    pub nodeadm_dir: PathBuf,
    /// The static CDI spec directory (the dynamic one is the config's `paths.cdi_dir`).
    pub static_cdi_dir: PathBuf,
    /// Overrides the config's socket (`--socket`).
    pub socket: Option<PathBuf>,
    /// Overrides the config's `paths.state_dir` (`--state-dir`, as given to gpushared).
    pub state_dir: Option<PathBuf>,
    /// Overrides the config's `paths.run_dir` (`--run-dir`).
    pub run_dir: Option<PathBuf>,
    /// Overrides the config's `paths.cdi_dir` (`--cdi-dir`).
    pub cdi_dir: Option<PathBuf>,
    /// The DRA kubelet plugin's config file, passed to `gpushare-dra probe --config`
    /// (`--dra-config`; the probe's default is `/etc/gpushare/dra.toml`).
    pub dra_config: Option<PathBuf>,
    /// kubelet's plugins directory the plugin serves in (`--dra-plugins-dir`).
    pub dra_plugins_dir: Option<PathBuf>,
    /// kubelet's plugin registry directory (`--dra-registry-dir`).
    pub dra_registry_dir: Option<PathBuf>,
}

/// Where our `nodeadm` drop-in is installed.
pub const NODEADM_DROPIN: &str = "50-gpushare.yaml";

impl Default for DoctorPaths {
    fn default() -> Self {
        DoctorPaths {
            config: PathBuf::from(DEFAULT_CONFIG_PATH),
            config_required: false,
            containerd_config: PathBuf::from("/etc/containerd/config.toml"),
            nodeadm_dir: PathBuf::from("/etc/eks/nodeadm.d"),
            static_cdi_dir: PathBuf::from("/etc/cdi"),
            socket: None,
            state_dir: None,
            run_dir: None,
            cdi_dir: None,
            dra_config: None,
            dra_plugins_dir: None,
            dra_registry_dir: None,
        }
    }
}

fn check(name: &'static str, status: Status, detail: String, hint: &str) -> Check {
    Check {
        name,
        status,
        detail,
        hint: if status == Status::Ok {
            String::new()
        } else {
            hint.to_string()
        },
    }
}

/// What every check may look at: the config with the command line's paths laid over it, the
/// simulated node profile (if any), the host and what the daemon answered (asked once).
pub struct Context<'a> {
    /// Where files are read.
    pub paths: &'a DoctorPaths,
    /// The config file (defaults when it is absent or broken), with `--state-dir`,
    /// `--run-dir` and `--cdi-dir` applied and the directories resolved where they exist.
    pub cfg: DaemonConfig,
    /// The node profile the GPU checks simulate (`--simulate`, else the running daemon's
    /// simulated backend, else `gpus.simulate` while no daemon answers); `None`: NVML.
    pub simulate: Option<String>,
    /// Set when `simulate` was taken from the running daemon's backend: a line saying so.
    pub simulate_source: Option<String>,
    /// The socket asked.
    pub socket: PathBuf,
    /// The daemon's answer, or why there is none.
    pub daemon: Result<DaemonView, DaemonError>,
    /// Where the directories came from when not from doctor's flags or config file (the
    /// daemon's command line), for the paths check to say.
    pub paths_source: Option<String>,
    /// Effects.
    pub host: &'a dyn DoctorHost,
}

impl std::fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("paths", &self.paths)
            .field("cfg", &self.cfg)
            .field("simulate", &self.simulate)
            .field("simulate_source", &self.simulate_source)
            .field("socket", &self.socket)
            .field("paths_source", &self.paths_source)
            .field("daemon", &self.daemon.as_ref().map(|_| "answered"))
            .finish_non_exhaustive()
    }
}

/// One check.
pub type CheckFn = fn(&Context<'_>) -> Check;

/// Every check after the config file's, in the order printed.
pub const CHECKS: &[CheckFn] = &[
    |c| check_driver(c.simulate.as_deref(), c.simulate_source.as_deref(), c.host),
    check_mps_control,
    check_helpers,
    |c| {
        check_driver_spec(
            &c.cfg,
            c.simulate.as_deref(),
            c.host,
            c.daemon.as_ref().ok(),
        )
    },
    |c| check_containerd(&c.paths.containerd_config),
    |c| check_nodeadm(&c.paths.nodeadm_dir, c.host),
    |c| check_cdi(&c.paths.static_cdi_dir, &c.cfg.paths.cdi_dir),
    check_socket,
    check_paths,
    |c| {
        // A daemon on other directories writes its claim records elsewhere: these say
        // nothing about it (the paths check names the mismatch).
        if check_paths(c).status == Status::Fail {
            return check(
                "checkpoint",
                Status::Skip,
                format!(
                    "claim records in {}: not the state directory of the daemon answering (see paths)",
                    c.cfg.paths.state_dir.display()
                ),
                "fix the paths check first",
            );
        }
        check_checkpoint(&c.cfg.paths.state_dir, c.daemon.as_ref().ok())
    },
    check_claims,
    |c| check_compute_mode(c.simulate.as_deref(), c.daemon.as_ref().ok()),
    |c| check_dra_plugin(c.host, &dra_probe_args(c)),
];

/// The value of `flag` in a command line: `--flag VALUE` or `--flag=VALUE` (the last one
/// wins, as clap takes it).
fn daemon_flag<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let mut found = None;
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        if a == flag {
            found = it.next().map(String::as_str);
        } else if let Some(v) = a.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            found = Some(v);
        }
    }
    found
}

/// A directory as gpushared resolves it (the daemon reports real paths), when it exists.
fn resolved(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The GPU backend the checks look at without `--simulate`, and, when the running daemon
/// told it, a line saying so: the daemon's own (`health.backend`) where it answers, since
/// that is what serves claims (a simulated one is no reason to ask NVML), else the config's
/// `gpus.simulate`. A simulated daemon's profile is the `--simulate` of its command line
/// (resolved from its working directory), else the config's when it is the same profile,
/// else the name its backend reports (a catalog name, or the `name` of a profile file, which
/// the nvml check then cannot read and skips).
fn backend_of(
    daemon: &Result<DaemonView, DaemonError>,
    command_line: Option<&(Vec<String>, PathBuf)>,
    cfg: &DaemonConfig,
    socket: &Path,
) -> (Option<String>, Option<String>) {
    let configured = (!cfg.gpus.simulate.is_empty()).then(|| cfg.gpus.simulate.clone());
    let Ok(d) = daemon else {
        return (configured, None);
    };
    let Some(name) = d.health.backend.strip_prefix("simulated:") else {
        // `nvml` (or a backend this release does not know): the real driver.
        return (None, None);
    };
    let from_args = command_line.and_then(|(args, cwd)| {
        daemon_flag(args, "--simulate").map(|v| {
            if v.contains('/') {
                cwd.join(v).display().to_string()
            } else {
                v.to_string()
            }
        })
    });
    let from_config =
        configured.filter(|c| c == name || catalog::resolve(c).is_ok_and(|p| p.name == name));
    let profile = from_args
        .or(from_config)
        .unwrap_or_else(|| name.to_string());
    let source = format!(
        "the running gpushared at {} uses the simulated backend {}",
        socket.display(),
        d.health.backend
    );
    (Some(profile), Some(source))
}

/// Runs every check. `simulate` names a node profile: the GPU checks then use the simulated
/// GPUs (as `gpushared --simulate` does) instead of NVML.
pub fn run(paths: &DoctorPaths, simulate: Option<&str>, host: &dyn DoctorHost) -> Report {
    let mut checks = Vec::new();
    let mut cfg = match DaemonConfig::load(&paths.config, paths.config_required) {
        Ok(cfg) => {
            let shown = if paths.config.exists() {
                format!("{} is valid", paths.config.display())
            } else {
                format!("{} absent: defaults in use", paths.config.display())
            };
            checks.push(check("config", Status::Ok, shown, ""));
            cfg
        }
        Err(e) => {
            checks.push(check(
                "config",
                Status::Fail,
                e.to_string(),
                "fix the key named (gpushared --print-default-config shows every key); gpushared refuses to start with this file",
            ));
            DaemonConfig::default()
        }
    };
    for (dst, src) in [
        (&mut cfg.paths.state_dir, &paths.state_dir),
        (&mut cfg.paths.run_dir, &paths.run_dir),
        (&mut cfg.paths.cdi_dir, &paths.cdi_dir),
    ] {
        if let Some(p) = src {
            dst.clone_from(p);
        }
    }
    let socket = paths.socket.clone().unwrap_or(cfg.paths.socket.clone());
    let daemon = host.daemon(&socket);
    let command_line = match &daemon {
        Ok(DaemonView { pid: Some(pid), .. }) => host.daemon_command_line(*pid).map(|c| (*pid, c)),
        _ => None,
    };
    // Without doctor's own directory flags, a gpushared started by hand says where it runs:
    // its command line (which overrides its config file, as it does for the daemon).
    let mut paths_source = None;
    let no_dir_flags =
        paths.state_dir.is_none() && paths.run_dir.is_none() && paths.cdi_dir.is_none();
    if let (true, Some((pid, (args, cwd)))) = (no_dir_flags, &command_line) {
        let before = cfg.paths.clone();
        let mut theirs_note = String::new();
        if let Some(file) = daemon_flag(args, "--config").filter(|_| !paths.config_required) {
            let file = cwd.join(file);
            if let Ok(theirs) = DaemonConfig::load(&file, true) {
                cfg = theirs;
                theirs_note = format!(", its config file {}", file.display());
            }
        }
        for (dst, flag) in [
            (&mut cfg.paths.state_dir, "--state-dir"),
            (&mut cfg.paths.run_dir, "--run-dir"),
            (&mut cfg.paths.cdi_dir, "--cdi-dir"),
        ] {
            if let Some(v) = daemon_flag(args, flag) {
                *dst = cwd.join(v);
            }
        }
        if cfg.paths != before || !theirs_note.is_empty() {
            paths_source = Some(format!(
                "directories from gpushared's command line (pid {pid}{theirs_note})"
            ));
        }
    }
    for dst in [
        &mut cfg.paths.state_dir,
        &mut cfg.paths.run_dir,
        &mut cfg.paths.cdi_dir,
    ] {
        *dst = resolved(dst);
    }
    let (simulate, simulate_source) = match simulate {
        Some(profile) => (Some(profile.to_string()), None),
        None => backend_of(
            &daemon,
            command_line.as_ref().map(|(_, c)| c),
            &cfg,
            &socket,
        ),
    };
    let ctx = Context {
        paths,
        daemon,
        cfg,
        simulate,
        simulate_source,
        socket,
        paths_source,
        host,
    };
    checks.extend(CHECKS.iter().map(|f| f(&ctx)));
    Report {
        ok: checks.iter().all(|c| c.status != Status::Fail),
        checks,
    }
}

fn check_socket(ctx: &Context<'_>) -> Check {
    let socket = &ctx.socket;
    match &ctx.daemon {
        Ok(v) => check(
            "socket",
            if v.health.ready {
                Status::Ok
            } else {
                Status::Fail
            },
            format!(
                "{} answers: {}, backend {}, {} GPUs, {} claims",
                socket.display(),
                if v.health.ready { "ready" } else { "not ready" },
                v.health.backend,
                v.health.gpus,
                v.health.claims
            ),
            "gpushared is up but not ready: journalctl -u gpushared",
        ),
        Err(e) => check(
            "socket",
            Status::Fail,
            socket_detail(socket, e),
            &socket_hint(ctx, e),
        ),
    }
}

/// The socket check's detail: the error, and for a refused permission the socket's own mode
/// and group (what the running daemon set), where the file can be looked at.
fn socket_detail(socket: &Path, e: &DaemonError) -> String {
    use std::os::unix::fs::MetadataExt;
    let mut detail = format!("{}: {e}", socket.display());
    if let (DaemonError::PermissionDenied(_), Ok(m)) = (e, std::fs::metadata(socket)) {
        let gid = nix::unistd::Gid::from_raw(m.gid());
        let group = match nix::unistd::Group::from_gid(gid) {
            Ok(Some(g)) => g.name,
            _ => format!("gid {gid}"),
        };
        detail += &format!(
            " (the socket is mode {:04o}, group {group}; doctor runs as uid {})",
            m.mode() & 0o7777,
            nix::unistd::geteuid()
        );
    }
    detail
}

/// The socket check's hint for why the daemon did not answer.
fn socket_hint(ctx: &Context<'_>, e: &DaemonError) -> String {
    let journal = "systemctl status gpushared; journalctl -u gpushared";
    match e {
        DaemonError::NotRunning(_) => format!(
            "start it: systemctl enable --now gpushared; then {journal} (for a gpushared started by hand, give doctor its --socket)"
        ),
        DaemonError::PermissionDenied(_) => format!(
            "gpushared runs, but this user may not connect to its socket: run doctor as root (sudo gpushare doctor), or as a member of the socket's group: [socket] group (now {:?}) and mode (now {:?}) in {}{} set them",
            ctx.cfg.socket.group,
            ctx.cfg.socket.mode,
            ctx.paths.config.display(),
            if ctx.paths.config.exists() {
                ""
            } else {
                " (absent: the defaults)"
            }
        ),
        DaemonError::TimedOut(_) => format!(
            "gpushared accepted no connection or did not answer in time: it may be stuck, or busy with every connection it serves ([socket] max_connections); {journal}"
        ),
        DaemonError::NotASocket(_) => format!(
            "--socket names the socket file itself ([paths] socket of gpushared's config; default {})",
            gpushare_proto::DEFAULT_SOCKET
        ),
        DaemonError::Protocol(_) => format!(
            "something answered, but not as this release's gpushared does: gpushare --version and gpushared --version should agree; {journal}"
        ),
        DaemonError::Other(_) => journal.to_string(),
    }
}

/// NVML and the driver version, or the simulated node profile's GPUs. `source` says that the
/// profile is the running daemon's backend (then one doctor cannot read is skipped, not
/// failed: the daemon read it).
fn check_driver(simulate: Option<&str>, source: Option<&str>, host: &dyn DoctorHost) -> Check {
    if let Some(profile) = simulate {
        return match catalog::resolve(profile) {
            Ok(p) => {
                // One entry per product, in the profile's order: a profile lists GPUs in
                // groups of equal settings (MIG mode), not of products.
                let mut products: Vec<(&str, u32, u32)> = Vec::new();
                for g in &p.gpus {
                    let mig = if g.mig_enabled { g.count } else { 0 };
                    match products.iter_mut().find(|e| e.0 == g.product_name) {
                        Some(e) => (e.1, e.2) = (e.1 + g.count, e.2 + mig),
                        None => products.push((&g.product_name, g.count, mig)),
                    }
                }
                let gpus: Vec<String> = products
                    .iter()
                    .map(|(name, count, mig)| match mig {
                        0 => format!("{count} x {name}"),
                        m => format!("{count} x {name} (MIG mode on for {m})"),
                    })
                    .collect();
                let from = source.map_or_else(String::new, |s| format!("; {s}"));
                check(
                    "nvml",
                    Status::Ok,
                    format!(
                        "simulated {}: {} (no NVML used{from})",
                        p.name,
                        gpus.join(", ")
                    ),
                    "",
                )
            }
            Err(e) if source.is_some() => check(
                "nvml",
                Status::Skip,
                format!(
                    "{}, whose node profile doctor cannot read ({e}): NVML not checked",
                    source.unwrap_or_default()
                ),
                "give doctor the profile gpushared was started with: gpushare doctor --simulate <profile file>",
            ),
            Err(e) => check(
                "nvml",
                Status::Fail,
                format!("simulated node profile {profile:?}: {e}"),
                "use a name from `gpushare profiles` or a profile file (docs/node-profiles.md)",
            ),
        };
    }
    match host.driver_version() {
        Ok(v) => check("nvml", Status::Ok, format!("NVIDIA driver {v}"), ""),
        Err(e) => check(
            "nvml",
            Status::Fail,
            e,
            "install the NVIDIA driver and its NVML library (EKS: use the AL2023 NVIDIA AMI); nvidia-smi must work",
        ),
    }
}

/// `[cdi] driver_spec = "toolkit"` needs NVIDIA's `nvidia-ctk` (nvidia-container-toolkit):
/// without it gpushared refuses every claim; the answering daemon says whether it can
/// generate the spec now (a generator that fails, say with "Driver/library version mismatch",
/// also fails every prepare); without one, the spec it generates at start should be in the
/// CDI directory.
fn check_driver_spec(
    cfg: &DaemonConfig,
    simulate: Option<&str>,
    host: &dyn DoctorHost,
    daemon: Option<&DaemonView>,
) -> Check {
    if cfg.cdi.driver_spec == DriverSpecMode::None {
        return check(
            "driver-spec",
            Status::Ok,
            "[cdi] driver_spec = \"none\": claims' containers get no driver files from gpushare; their images must bring a user-space that matches the host's driver".into(),
            "",
        );
    }
    let spec = match split_kind(&cfg.cdi.driver_kind) {
        Ok((vendor, class)) => cfg.paths.cdi_dir.join(format!("{vendor}-{class}.json")),
        Err(e) => {
            return check(
                "driver-spec",
                Status::Fail,
                e.to_string(),
                "fix [cdi] driver_kind",
            )
        }
    };
    let generator = if simulate.is_some() && cfg.cdi.nvidia_ctk.as_os_str().is_empty() {
        "the simulated toolkit".to_string()
    } else {
        match nvidia_ctk::find(&cfg.cdi.nvidia_ctk, |p| host.executable(p)) {
            Ok(p) => p.display().to_string(),
            Err(e) => {
                return check(
                    "driver-spec",
                    Status::Fail,
                    format!("NVIDIA Container Toolkit not found: {e}; gpushared refuses every claim without it"),
                    "install nvidia-container-toolkit (EKS AL2023 NVIDIA AMIs ship it: dnf install nvidia-container-toolkit; the GPU Operator installs it in /usr/local/nvidia/toolkit), or set [cdi] driver_spec = \"none\" if your images bring the driver's user-space",
                )
            }
        }
    };
    if let Some(d) = daemon.and_then(|v| v.health.driver_spec.as_ref()) {
        return driver_spec_of_daemon(d);
    }
    match gpushare_cdi::load_spec_file(&spec) {
        Ok(s) => check(
            "driver-spec",
            Status::Ok,
            format!(
                "{generator}; {} has {} devices",
                spec.display(),
                s.devices.len()
            ),
            "",
        ),
        Err(e) => check(
            "driver-spec",
            Status::Warn,
            format!("{generator}; {}: {e}", spec.display()),
            "gpushared generates it at start and after MIG changes: journalctl -u gpushared says why it did not",
        ),
    }
}

/// The driver spec as the answering daemon reports it: FAIL while it cannot generate it.
fn driver_spec_of_daemon(d: &gpushare_proto::DriverSpecHealth) -> Check {
    if d.ok {
        return check(
            "driver-spec",
            Status::Ok,
            format!("gpushared generates {} with {}", d.path, d.generator),
            "",
        );
    }
    let when = d
        .retry_in_seconds
        .map_or(String::new(), |s| format!("; next try in {s} s"));
    check(
        "driver-spec",
        Status::Fail,
        format!(
            "gpushared cannot generate {} with {} ({} failed generations in a row{when}): {}; every prepare is refused until it can",
            d.path,
            d.generator,
            d.failures,
            d.error.as_deref().unwrap_or("not generated yet")
        ),
        "run the generator by hand for its whole output (nvidia-ctk cdi generate --output /tmp/spec.json); \"Driver/library version mismatch\" means the driver's libraries were updated without its kernel module: reboot the node (or reload the nvidia kernel modules). gpushared tries again on its own, and at once after a change of nvidia-ctk or the driver or a systemctl reload gpushared",
    )
}

/// The MPS control program gpushared runs: the answering daemon says which; without one,
/// the one it would choose (`[mps] control`, else NVIDIA's from `PATH`, else the emulator
/// beside gpushared: [`default_program`]). The emulator drives no GPU, so it passes only
/// for simulated GPUs.
fn check_mps_control(ctx: &Context<'_>) -> Check {
    let hint = "install nvidia-cuda-mps-control (it comes with the NVIDIA driver's utilities) or set [mps] control";
    let host = ctx.host;
    let (program, source) = match &ctx.daemon {
        Ok(v) if !v.health.mps_control.is_empty() => (
            PathBuf::from(&v.health.mps_control),
            format!("run by gpushared at {}", ctx.socket.display()),
        ),
        _ if !ctx.cfg.mps.control.as_os_str().is_empty() => {
            (ctx.cfg.mps.control.clone(), "mps.control".to_string())
        }
        _ => {
            let chosen = default_program(
                |n| host.which(n),
                &host.gpushared_dir(),
                |p| host.executable(p),
            );
            match chosen {
                Ok(p) => (p, "what gpushared would run".to_string()),
                Err(e) => return check("mps-control", Status::Fail, e.to_string(), hint),
            }
        }
    };
    if !host.executable(&program) {
        return check(
            "mps-control",
            Status::Fail,
            format!("{} ({source}) is not an executable file", program.display()),
            hint,
        );
    }
    if is_emulator(&program) {
        return match &ctx.simulate {
            Some(profile) => check(
                "mps-control",
                Status::Ok,
                format!(
                    "{} ({source}): gpushare's emulator, for the simulated {profile}",
                    program.display()
                ),
                "",
            ),
            None => check(
                "mps-control",
                Status::Fail,
                format!(
                    "{} ({source}) is gpushare's emulator, which drives no GPU",
                    program.display()
                ),
                "real GPUs need NVIDIA's nvidia-cuda-mps-control: install it, or set [mps] control to it",
            ),
        };
    }
    check(
        "mps-control",
        Status::Ok,
        format!("{} ({source})", program.display()),
        "",
    )
}

/// Whether the daemon answering on the socket is the one whose directories are checked here:
/// it holds the instance lock (`gpushared.lock`) of the state and run directories, its
/// claims' CDI specs are in the CDI directory and their MPS directories under the run
/// directory. A daemon started by hand with its own `--state-dir` and friends otherwise
/// gives false failures in the other checks.
fn check_paths(ctx: &Context<'_>) -> Check {
    let Ok(d) = &ctx.daemon else {
        return check(
            "paths",
            Status::Skip,
            "the daemon did not answer, so which directories it uses is unknown".into(),
            "fix the socket check first",
        );
    };
    let p = &ctx.cfg.paths;
    let mut wrong = Vec::new();
    let mut dirs = vec![("state directory", &p.state_dir)];
    if p.run_dir != p.state_dir {
        dirs.push(("run directory", &p.run_dir));
    }
    for (what, dir) in dirs {
        let lock = dir.join("gpushared.lock");
        match (ctx.host.lock_holder(&lock), d.pid) {
            (Ok(Some(holder)), Some(pid)) if holder != pid => wrong.push(format!(
                "{what} {} is held by pid {holder}, not by the gpushared answering (pid {pid})",
                dir.display()
            )),
            (Ok(Some(_)), _) => {}
            (Ok(None), _) => wrong.push(format!("no gpushared runs on {what} {}", dir.display())),
            (Err(e), _) => wrong.push(format!("{what} {}: {e}", dir.display())),
        }
    }
    let claims_dir = p.run_dir.join("claims");
    for c in &d.claims {
        let spec = Path::new(&c.cdi_spec);
        if !c.cdi_spec.is_empty() && spec.parent() != Some(p.cdi_dir.as_path()) {
            wrong.push(format!(
                "claim {}'s CDI spec {} is not in CDI directory {}",
                c.uid,
                spec.display(),
                p.cdi_dir.display()
            ));
        }
        for g in &c.groups {
            if let gpushare_proto::StrategyInfo::Mps(m) = &g.sharing {
                if !Path::new(&m.pipe_dir).starts_with(&claims_dir) {
                    wrong.push(format!(
                        "claim {}'s MPS pipe directory {} is not under run directory {}",
                        c.uid,
                        m.pipe_dir,
                        p.run_dir.display()
                    ));
                }
            }
        }
    }
    let source = ctx
        .paths_source
        .as_ref()
        .map_or_else(String::new, |s| format!(" ({s})"));
    if wrong.is_empty() {
        return check(
            "paths",
            Status::Ok,
            format!(
                "gpushared at {} uses state directory {}, run directory {} and CDI directory {}{source}",
                ctx.socket.display(),
                p.state_dir.display(),
                p.run_dir.display(),
                p.cdi_dir.display()
            ),
            "",
        );
    }
    check(
        "paths",
        Status::Fail,
        format!(
            "gpushared at {} uses other directories than checked here{source}: {}",
            ctx.socket.display(),
            wrong.join("; ")
        ),
        "give doctor the directories gpushared was started with (--state-dir, --run-dir, --cdi-dir, or --config with its config file); as root, since the state directory is root's",
    )
}

/// Claims the daemon reports as `Degraded` (their MPS control daemon died: new containers are
/// refused until it is back).
fn check_claims(ctx: &Context<'_>) -> Check {
    let Ok(d) = &ctx.daemon else {
        return check(
            "claims",
            Status::Skip,
            "the daemon did not answer, so the claims' states are unknown".into(),
            "fix the socket check first",
        );
    };
    let degraded: Vec<String> = d
        .claims
        .iter()
        .filter(|c| c.state == ClaimState::Degraded)
        .map(|c| match &c.last_error {
            Some(e) => format!("{} ({}/{}): {e}", c.uid, c.namespace, c.name),
            None => format!("{} ({}/{})", c.uid, c.namespace, c.name),
        })
        .collect();
    let refused = &d.health.quarantined_records;
    let refused_note = if refused.is_empty() {
        String::new()
    } else {
        format!(
            "; {} claim record(s) refused at start and not re-adopted: {}",
            refused.len(),
            refused.join("; ")
        )
    };
    const REFUSED_HINT: &str = "a refused record is kept under the state directory's quarantine/ with why; its claim is prepared afresh by the kubelet's next prepare, or released by draining its pods";
    if degraded.is_empty() {
        let held = match d.claims.len() {
            1 => "1 claim, not degraded".to_string(),
            n => format!("{n} claims, none degraded"),
        };
        return if refused.is_empty() {
            check("claims", Status::Ok, held, "")
        } else {
            check(
                "claims",
                Status::Warn,
                format!("{held}{refused_note}"),
                REFUSED_HINT,
            )
        };
    }
    check(
        "claims",
        Status::Fail,
        format!(
            "{} of {} claims degraded (new containers are refused): {}{refused_note}",
            degraded.len(),
            d.claims.len(),
            degraded.join("; ")
        ),
        "gpushared restarts a dead MPS control daemon with backoff: gpushare claim <uid> shows its restarts and last error, journalctl -u gpushared says why; a claim that stays degraded is released and prepared again by draining its pods",
    )
}

/// containerd's main config and the files its `imports` name (`*` globs in the file name).
fn containerd_files(main: &Path) -> Result<Vec<(PathBuf, toml::Value)>, String> {
    let read = |p: &Path| -> Result<toml::Value, String> {
        let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
        toml::from_str(&text).map_err(|e| format!("{}: {}", p.display(), e.message()))
    };
    let root = read(main)?;
    let mut files = vec![(main.to_path_buf(), root.clone())];
    let imports = root
        .get("imports")
        .and_then(toml::Value::as_array)
        .cloned()
        .unwrap_or_default();
    for pattern in imports.iter().filter_map(toml::Value::as_str) {
        let pattern = main.parent().unwrap_or(Path::new("/")).join(pattern);
        let (Some(dir), Some(name)) = (pattern.parent(), pattern.file_name()) else {
            continue;
        };
        let name = name.to_string_lossy();
        let (prefix, suffix) = name.split_once('*').unwrap_or((&name, ""));
        let mut matched: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name().is_some_and(|n| {
                            let n = n.to_string_lossy();
                            if name.contains('*') {
                                n.starts_with(prefix)
                                    && n.ends_with(suffix)
                                    && n.len() >= prefix.len() + suffix.len()
                            } else {
                                n == name
                            }
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        matched.sort();
        for p in matched {
            let v = read(&p)?;
            files.push((p, v));
        }
    }
    Ok(files)
}

/// Every (dotted path, value) of `v`'s leaves.
fn leaves<'a>(v: &'a toml::Value, at: String, out: &mut Vec<(String, &'a toml::Value)>) {
    match v {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let next = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                leaves(v, next, out);
            }
        }
        other => out.push((at, other)),
    }
}

/// What serves DRA claims (containerd applying CDI itself: kubelet passes their CDI IDs only
/// in CRI's CDI field) and what does not (gpushare-runtime, which sees only annotations and
/// the environment), for the containerd check's hints.
const CONTAINERD_DRA_HINT: &str = "DRA claims need containerd to apply CDI itself: containerd 1.7: set enable_cdi = true and cdi_spec_dirs = [\"/etc/cdi\", \"/var/run/cdi\"] under [plugins.\"io.containerd.grpc.v1.cri\"] (on EKS AL2023, in a NodeConfig's spec.containerd.config under /etc/eks/nodeadm.d/, applied at nodeadm's next run), or containerd 2.x (CDI on by default)";

fn check_containerd(main: &Path) -> Check {
    let hint_missing = format!("install containerd; {CONTAINERD_DRA_HINT}");
    if !main.exists() {
        return check(
            "containerd",
            Status::Fail,
            format!("{} not found", main.display()),
            &hint_missing,
        );
    }
    let files = match containerd_files(main) {
        Ok(f) => f,
        Err(e) => {
            return check(
                "containerd",
                Status::Fail,
                e,
                "fix the TOML error named; containerd will not start with it either",
            )
        }
    };
    let mut cdi = None;
    let mut cdi_off = None;
    let mut runtime = None;
    for (path, v) in &files {
        let mut all = Vec::new();
        leaves(v, String::new(), &mut all);
        for (key, value) in all {
            if key.ends_with(".enable_cdi") {
                match value.as_bool() {
                    Some(true) => cdi = Some(path.clone()),
                    Some(false) => cdi_off = Some(path.clone()),
                    None => {}
                }
            }
            if key.ends_with(".BinaryName")
                && value
                    .as_str()
                    .is_some_and(|b| b.ends_with("/gpushare-runtime") || b == "gpushare-runtime")
            {
                runtime = Some((path.clone(), key));
            }
        }
    }
    // Config version 3 is containerd 2.x's, whose CRI plugin has CDI on by default.
    let version = files
        .first()
        .and_then(|(_, v)| v.get("version"))
        .and_then(toml::Value::as_integer)
        .unwrap_or(1);
    let runtime_note = runtime.as_ref().map_or_else(String::new, |(p, key)| {
        format!(
            "; gpushare-runtime also configured ({key} in {})",
            p.display()
        )
    });
    match (cdi, cdi_off, runtime) {
        (Some(p), _, _) => check(
            "containerd",
            Status::Ok,
            format!(
                "CDI enabled (enable_cdi = true in {}): DRA claims are served{runtime_note}",
                p.display()
            ),
            "",
        ),
        (None, None, _) if version >= 3 => check(
            "containerd",
            Status::Ok,
            format!(
                "containerd 2.x config (version = {version} in {}): CDI on by default, DRA claims are served{runtime_note}",
                main.display()
            ),
            "",
        ),
        (None, _, Some((p, key))) => check(
            "containerd",
            Status::Warn,
            format!(
                "gpushare-runtime configured ({key} in {}), CDI off: it serves cdi.k8s.io annotations and GPUSHARE_VISIBLE_DEVICES only, not DRA claims",
                p.display()
            ),
            CONTAINERD_DRA_HINT,
        ),
        (None, off, None) => check(
            "containerd",
            Status::Fail,
            match off {
                Some(p) => format!("enable_cdi = false in {}, and no runtime with BinaryName gpushare-runtime", p.display()),
                None => format!(
                    "{}: neither enable_cdi = true nor a runtime with BinaryName gpushare-runtime",
                    main.display()
                ),
            },
            &format!("{CONTAINERD_DRA_HINT}; without DRA, containerd 1.6 serves annotation and GPUSHARE_VISIBLE_DEVICES requests through gpushare-runtime (the tables of /usr/share/doc/gpushare/examples/containerd-gpushare-runtime.toml; on EKS the RPM's /etc/eks/nodeadm.d/50-gpushare.yaml)"),
        ),
    }
}

fn check_nodeadm(dir: &Path, host: &dyn DoctorHost) -> Check {
    let dropin = dir.join(NODEADM_DROPIN);
    let Some(nodeadm) = host.which("nodeadm") else {
        return check(
            "nodeadm",
            Status::Warn,
            "nodeadm not found: not an EKS AL2023 node, so containerd's config is yours to keep"
                .into(),
            &format!(
                "on EKS AL2023, install the gpushare RPM before nodeadm runs so that {} is applied",
                dropin.display()
            ),
        );
    };
    let hint = format!(
        "install the gpushare RPM (it ships {}), then rerun nodeadm init or reboot",
        dropin.display()
    );
    let text = match std::fs::read_to_string(&dropin) {
        Ok(t) => t,
        Err(e) => {
            return check(
                "nodeadm",
                Status::Fail,
                format!("{} found, but {}: {e}", nodeadm.display(), dropin.display()),
                &hint,
            )
        }
    };
    match serde_norway::from_str::<serde_json::Value>(&text) {
        Ok(v) if v.get("kind").and_then(|k| k.as_str()) == Some("NodeConfig") => check(
            "nodeadm",
            Status::Ok,
            format!("{} and drop-in {}", nodeadm.display(), dropin.display()),
            "",
        ),
        Ok(_) => check(
            "nodeadm",
            Status::Fail,
            format!("{} is not a NodeConfig", dropin.display()),
            &hint,
        ),
        Err(e) => check(
            "nodeadm",
            Status::Fail,
            format!("{}: {e}", dropin.display()),
            &hint,
        ),
    }
}

fn check_cdi(static_dir: &Path, dynamic_dir: &Path) -> Check {
    let hint = "remove or fix the files named; a broken spec can stop the container runtime from resolving any device in it";
    let registry = gpushare_cdi::Registry::load(&[static_dir, dynamic_dir]);
    let mut problems: Vec<String> = registry
        .errors()
        .values()
        .flatten()
        .map(ToString::to_string)
        .collect();
    problems.sort();
    problems.dedup();
    // The same device in both directories is legal CDI (the dynamic one wins), but two
    // definitions of one of our claims means a stale spec.
    let mut ours: BTreeMap<String, Vec<&Path>> = BTreeMap::new();
    for s in registry.specs() {
        if s.spec.kind == gpushare_proto::CDI_KIND {
            for d in &s.spec.devices {
                ours.entry(format!("{}={}", s.spec.kind, d.name))
                    .or_default()
                    .push(&s.path);
            }
        }
    }
    for (name, at) in &ours {
        if at.len() > 1 {
            let at: Vec<String> = at.iter().map(|p| p.display().to_string()).collect();
            problems.push(format!("{name} defined in {}", at.join(" and ")));
        }
    }
    let our_specs = registry
        .specs()
        .iter()
        .filter(|s| s.spec.kind == gpushare_proto::CDI_KIND)
        .count();
    if !problems.is_empty() {
        return check("cdi-specs", Status::Fail, problems.join("; "), hint);
    }
    // Only directories that exist hold specs; the others are named as absent.
    let (present, absent): (Vec<&Path>, Vec<&Path>) = [static_dir, dynamic_dir]
        .into_iter()
        .partition(|d| d.is_dir());
    let listed = |dirs: &[&Path]| {
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(" and ")
    };
    let place = if present.is_empty() {
        "no CDI directory".to_string()
    } else {
        format!("valid in {}", listed(&present))
    };
    let mut notes = Vec::new();
    if !absent.is_empty() {
        notes.push(format!("{} does not exist", listed(&absent)));
    }
    if !dynamic_dir.is_dir() {
        notes.push("gpushared creates its CDI directory at start".to_string());
    }
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join("; "))
    };
    let n = registry.specs().len();
    check(
        "cdi-specs",
        Status::Ok,
        format!(
            "{n} spec{} {place}, {our_specs} of them gpushare claims, no device defined twice{notes}",
            if n == 1 { "" } else { "s" }
        ),
        "",
    )
}

/// What gpushared keeps its claims in (the check keeps its name `checkpoint`, which `-o json`
/// readers know, and the daemon's `checkpoint_*` health fields and metrics still use): since
/// per-claim records, the store's own record (`store.json`) and one file per claim under
/// `records/` in the state directory. `checkpoint.json` is named only where it is what is
/// there: before the first start of this release (a previous release's checkpoint, migrated at
/// the next start), or beside the store between a graceful stop and the next start (the
/// downgrade export).
fn check_checkpoint(state_dir: &Path, daemon: Option<&DaemonView>) -> Check {
    let store_file = state_dir.join(store::STORE_FILE);
    let records = state_dir.join(store::CLAIMS_DIR);
    let v2 = state_dir.join(V2_CHECKPOINT);
    match std::fs::symlink_metadata(&store_file) {
        Ok(_) => {
            let (cp, problems) = store::snapshot(state_dir);
            if !problems.is_empty() {
                return check(
                    "checkpoint",
                    Status::Fail,
                    format!(
                        "corrupt claim records in {}: {}",
                        records.display(),
                        problems.join("; ")
                    ),
                    "gpushared quarantines a corrupt record at start and rebuilds its claim from the claim's host record: restart it",
                );
            }
            let note = if std::fs::symlink_metadata(&v2).is_ok() {
                format!(
                    "; {} beside them is the downgrade export of gpushared's last stop, or a checkpoint a previous release wrote after a downgrade (gpushared removes the one, migrates the other at its next start)",
                    v2.display()
                )
            } else {
                String::new()
            };
            return checkpoint_claims(&records, &cp, &note);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return check(
                "checkpoint",
                Status::Fail,
                format!("{}: {e}", store_file.display()),
                "gpushared must be able to read its claim records (run doctor as root: the state directory is root's)",
            )
        }
    }
    let bytes = match std::fs::read(&v2) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let held = daemon.map_or(0, |d| d.claims.len());
            return if held == 0 {
                check(
                    "checkpoint",
                    Status::Ok,
                    format!(
                        "no claim records yet: {} absent (gpushared writes it, and each claim's record under {}, from its first start)",
                        store_file.display(),
                        records.display()
                    ),
                    "",
                )
            } else {
                check(
                    "checkpoint",
                    Status::Fail,
                    format!(
                        "{} absent but the daemon holds {held} claims",
                        store_file.display()
                    ),
                    "check that paths.state_dir is writable and on persistent storage; journalctl -u gpushared",
                )
            };
        }
        Err(e) => {
            return check(
                "checkpoint",
                Status::Fail,
                format!("{}: {e}", v2.display()),
                "gpushared must be able to read its checkpoint (run doctor as root)",
            )
        }
    };
    let cp: Checkpoint = match serde_json::from_slice(&bytes) {
        Ok(cp) => cp,
        Err(e) => {
            return check(
                "checkpoint",
                Status::Fail,
                format!("{} (from before per-claim records) is corrupt: {e}", v2.display()),
                "gpushared moves a corrupt checkpoint aside at start and forgets its claims: restart it, then re-prepare the node's claims (drain the node)",
            )
        }
    };
    let note = format!(
        " (a checkpoint from before per-claim records, no {} yet: gpushared migrates it to records under {} at its next start)",
        store::STORE_FILE,
        records.display()
    );
    checkpoint_claims(&v2, &cp, &note)
}

/// The whole-node checkpoint of releases before per-claim records: read, and written only as
/// the downgrade export.
const V2_CHECKPOINT: &str = "checkpoint.json";

/// Every claim of `cp` (read from `path`) with its CDI spec present; `note` follows the
/// detail.
fn checkpoint_claims(path: &Path, cp: &Checkpoint, note: &str) -> Check {
    let missing: Vec<&str> = cp
        .claims
        .values()
        .filter(|c| !c.cdi_spec.is_empty() && !Path::new(&c.cdi_spec).exists())
        .map(|c| c.uid.as_str())
        .collect();
    if !missing.is_empty() {
        return check(
            "checkpoint",
            Status::Fail,
            format!(
                "{}: CDI spec missing for claims {}{note}",
                path.display(),
                missing.join(", ")
            ),
            "a prepare of the claim writes its spec again (the kubelet retries); or unprepare and re-prepare it",
        );
    }
    check(
        "checkpoint",
        Status::Ok,
        format!(
            "{}: {} claims, each with its CDI spec{note}",
            path.display(),
            cp.claims.len()
        ),
        "",
    )
}

fn check_compute_mode(simulate: Option<&str>, daemon: Option<&DaemonView>) -> Check {
    let Some(d) = daemon else {
        return if simulate.is_some() {
            check(
                "compute-mode",
                Status::Ok,
                "simulated GPUs start in compute mode Default and no GPU is shared with MPS".into(),
                "",
            )
        } else {
            check(
                "compute-mode",
                Status::Skip,
                "the daemon did not answer, so which GPUs run MPS is unknown".into(),
                "fix the socket check first",
            )
        };
    };
    let mps: Vec<&GpuInfo> = d
        .gpus
        .iter()
        .filter(|g| g.sharing == GpuSharing::Mps)
        .collect();
    let wrong: Vec<String> = mps
        .iter()
        .filter(|g| g.compute_mode != ComputeMode::ExclusiveProcess)
        .map(|g| format!("{} ({}) is {:?}", g.name, g.uuid, g.compute_mode))
        .collect();
    if wrong.is_empty() {
        check(
            "compute-mode",
            Status::Ok,
            match mps.len() {
                0 => "no GPU shared with MPS".to_string(),
                1 => "1 GPU shared with MPS, EXCLUSIVE_PROCESS".to_string(),
                n => format!("{n} GPUs shared with MPS, all EXCLUSIVE_PROCESS"),
            },
            "",
        )
    } else {
        check(
            "compute-mode",
            Status::Fail,
            format!("MPS GPUs not in EXCLUSIVE_PROCESS: {}", wrong.join(", ")),
            "something else changed the compute mode (nvidia-smi -c): set it back with nvidia-smi -i <uuid> -c EXCLUSIVE_PROCESS, or re-prepare the claim",
        )
    }
}

/// The real host: NVML's library on the loader's paths, `/proc/driver/nvidia/version`, `PATH`,
/// and the daemon's socket.
#[derive(Debug, Clone)]
pub struct RealHost {
    /// Seconds to wait for the daemon.
    pub timeout: std::time::Duration,
}

/// Where distributions put `libnvidia-ml.so.1` (AL2023: `/usr/lib64`).
const NVML_DIRS: [&str; 5] = [
    "/usr/lib64",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib",
    "/lib64",
];

/// The pid of the process listening on `socket`, from a connection's peer credentials; only
/// for a process of root or of doctor's own user. Its command line names files doctor then
/// reads (its `--config`, `--simulate`): a root doctor must not read what any user's process
/// listening on a `--socket` names.
fn daemon_pid(socket: &Path) -> Option<i32> {
    let stream = std::os::unix::net::UnixStream::connect(socket).ok()?;
    let cred =
        nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials).ok()?;
    let trusted = cred.uid() == 0 || cred.uid() == nix::unistd::geteuid().as_raw();
    Some(cred.pid()).filter(|p| *p > 0 && trusted)
}

impl DoctorHost for RealHost {
    fn daemon_command_line(&self, pid: i32) -> Option<(Vec<String>, PathBuf)> {
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let args = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
        Some((args, cwd))
    }

    fn gpushared_dir(&self) -> PathBuf {
        std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from("/usr/bin"))
    }

    fn lock_holder(&self, path: &Path) -> Result<Option<i32>, String> {
        match find_lock_holder(path) {
            Ok(holder) => Ok(holder),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    fn driver_version(&self) -> Result<String, String> {
        let lib = NVML_DIRS
            .iter()
            .map(|d| Path::new(d).join("libnvidia-ml.so.1"))
            .find(|p| p.exists());
        let module = std::fs::read_to_string("/proc/driver/nvidia/version");
        match (lib, module) {
            (Some(_), Ok(text)) => {
                // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.133.20  <date>"
                let version = text
                    .lines()
                    .next()
                    .and_then(|l| l.split("Kernel Module").nth(1))
                    .and_then(|rest| rest.split_whitespace().next())
                    .unwrap_or("of unknown version");
                Ok(version.to_string())
            }
            (None, _) => Err(format!(
                "NVML library libnvidia-ml.so.1 not found in {}",
                NVML_DIRS.join(", ")
            )),
            (Some(_), Err(e)) => Err(format!(
                "NVIDIA kernel module not loaded (/proc/driver/nvidia/version: {e})"
            )),
        }
    }

    fn which(&self, name: &str) -> Option<PathBuf> {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| self.executable(p))
        })
    }

    fn executable(&self, path: &Path) -> bool {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }

    fn daemon(&self, socket: &Path) -> Result<DaemonView, DaemonError> {
        use gpushare_proto::{Client, Method};
        let e = |e: gpushare_proto::ClientError| DaemonError::from_client(&e);
        let mut client = Client::connect(socket, self.timeout).map_err(e)?;
        let none = None::<&()>;
        Ok(DaemonView {
            pid: daemon_pid(socket),
            health: client.call(Method::Health, none).map_err(e)?,
            gpus: client.call(Method::ListGpus, none).map_err(e)?,
            claims: client.call(Method::ListClaims, none).map_err(e)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_proto::TimeSliceInterval;

    #[derive(Debug, Default)]
    struct FakeHost {
        driver: Option<String>,
        programs: Vec<&'static str>,
        daemon: Option<DaemonView>,
        /// The pid holding every `gpushared.lock` (none: nobody).
        lock_pid: Option<i32>,
        /// Programs installed beside gpushared (in `exe_dir`).
        beside: Vec<&'static str>,
        /// The directory of the CLI and gpushared (default /usr/bin, which is on PATH too).
        exe_dir: Option<&'static str>,
        /// The program `dra_probe` ran (it answers with one passing check).
        probed: std::cell::RefCell<Option<PathBuf>>,
        /// The daemon's command line and working directory.
        command_line: Option<(Vec<String>, PathBuf)>,
        /// Why the daemon does not answer, without `daemon` (default: not running).
        daemon_error: Option<DaemonError>,
    }

    impl DoctorHost for FakeHost {
        fn driver_version(&self) -> Result<String, String> {
            self.driver.clone().ok_or_else(|| "no NVML".to_string())
        }
        fn which(&self, name: &str) -> Option<PathBuf> {
            self.programs
                .contains(&name)
                .then(|| PathBuf::from("/usr/bin").join(name))
        }
        fn executable(&self, path: &Path) -> bool {
            // `programs` are anywhere but in a separate `exe_dir`, which holds `beside`.
            let in_exe_dir = path.parent() == Some(&self.gpushared_dir());
            path.file_name().is_some_and(|n| {
                ((!in_exe_dir || path.starts_with("/usr/bin"))
                    && self.programs.iter().any(|p| n == *p))
                    || (in_exe_dir && self.beside.iter().any(|p| n == *p))
            })
        }
        fn gpushared_dir(&self) -> PathBuf {
            PathBuf::from(self.exe_dir.unwrap_or("/usr/bin"))
        }
        fn dra_probe(&self, program: &Path, _: &[String]) -> Result<Vec<ProbeCheck>, String> {
            self.probed.replace(Some(program.to_path_buf()));
            Ok(vec![ProbeCheck {
                name: "registration".into(),
                passed: true,
                detail: "registration socket answers GetInfo".into(),
                hint: String::new(),
            }])
        }
        fn lock_holder(&self, path: &Path) -> Result<Option<i32>, String> {
            assert!(path.ends_with("gpushared.lock"), "{}", path.display());
            Ok(self.lock_pid)
        }
        fn daemon(&self, _socket: &Path) -> Result<DaemonView, DaemonError> {
            match (&self.daemon, &self.daemon_error) {
                (Some(v), _) => Ok(v.clone()),
                (None, Some(e)) => Err(e.clone()),
                (None, None) => Err(DaemonError::NotRunning("connection refused".into())),
            }
        }
        fn daemon_command_line(&self, pid: i32) -> Option<(Vec<String>, PathBuf)> {
            assert_eq!(pid, 4242);
            self.command_line.clone()
        }
    }

    struct Node {
        dir: tempfile::TempDir,
        paths: DoctorPaths,
    }

    /// A node in a temporary directory: config pointing state and CDI dirs inside it.
    fn node(containerd: &str) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in [
            "etc-cdi",
            "run-cdi",
            "state",
            "run",
            "nodeadm.d",
            "containerd/conf.d",
        ] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        std::fs::write(d.join("containerd/config.toml"), containerd).unwrap();
        std::fs::write(
            d.join("config.toml"),
            format!(
                "[paths]\nstate_dir = \"{}\"\nrun_dir = \"{}\"\ncdi_dir = \"{}\"\n",
                d.join("state").display(),
                d.join("run").display(),
                d.join("run-cdi").display()
            ),
        )
        .unwrap();
        let paths = DoctorPaths {
            config: d.join("config.toml"),
            config_required: true,
            containerd_config: d.join("containerd/config.toml"),
            nodeadm_dir: d.join("nodeadm.d"),
            static_cdi_dir: d.join("etc-cdi"),
            socket: Some(d.join("sock")),
            ..DoctorPaths::default()
        };
        Node { dir, paths }
    }

    fn get<'a>(r: &'a Report, name: &str) -> &'a Check {
        r.checks.iter().find(|c| c.name == name).unwrap()
    }

    fn gpu(sharing: GpuSharing, mode: ComputeMode) -> GpuInfo {
        // The fields the doctor reads; the rest take their wire defaults.
        serde_json::from_value(serde_json::json!({
            "name": "gpu-0",
            "minor": 0,
            "uuid": "GPU-0",
            "product_name": "A100",
            "memory_mib": 40960,
            "compute_mode": mode,
            "time_slice": TimeSliceInterval::Default,
            "sharing": sharing,
            "claims": [],
        }))
        .unwrap()
    }

    fn healthy(gpus: Vec<GpuInfo>) -> DaemonView {
        DaemonView {
            pid: Some(4242),
            health: HealthInfo {
                ready: true,
                node_name: "n".into(),
                gpus: gpus.len(),
                claims: 0,
                backend: "nvml".into(),
                mps_control: "/usr/bin/nvidia-cuda-mps-control".into(),
                checkpoint_quarantined: None,
                checkpoint_error: None,
                quarantined_records: vec![],
                degraded_claims: 0,
                stopping: false,
                drivers: vec![],
                driver_spec: None,
            },
            gpus,
            claims: vec![],
        }
    }

    const CDI_ON: &str =
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nenable_cdi = true\n";

    #[test]
    fn a_well_set_node_passes_every_check() {
        let n = node(CDI_ON);
        std::fs::write(
            n.paths.nodeadm_dir.join(NODEADM_DROPIN),
            "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec: {}\n",
        )
        .unwrap();
        std::fs::write(
            n.dir.path().join("run-cdi/gpushare.io-gpu.json"),
            r#"{"cdiVersion":"0.3.0","kind":"gpushare.io/gpu","devices":[{"name":"GPU-0","containerEdits":{"env":["A=1"]}}]}"#,
        )
        .unwrap();
        let host = FakeHost {
            driver: Some("570.133.20".into()),
            programs: vec!["nvidia-cuda-mps-control", "nodeadm", "nvidia-ctk"],
            beside: vec!["gpushare-cdi-hook"],
            daemon: Some(healthy(vec![gpu(
                GpuSharing::Mps,
                ComputeMode::ExclusiveProcess,
            )])),
            lock_pid: Some(4242),
            ..FakeHost::default()
        };
        let r = run(&n.paths, None, &host);
        assert!(r.ok, "{}", r.text());
        // gpushare-dra is not installed on this fake host (a node whose plugin runs as a
        // DaemonSet): its check is skipped, every other one passes.
        assert!(
            r.checks
                .iter()
                .all(|c| c.status == Status::Ok
                    || (c.name == "dra-plugin" && c.status == Status::Skip)),
            "{}",
            r.text()
        );
        assert!(get(&r, "nvml").detail.contains("570.133.20"));
        assert!(r.text().ends_with("no problem found\n"));
    }

    #[test]
    fn failures_carry_hints_and_make_the_report_fail() {
        let n = node("version = 2\n");
        let host = FakeHost {
            programs: vec!["nodeadm"],
            daemon: Some(healthy(vec![gpu(GpuSharing::Mps, ComputeMode::Default)])),
            ..FakeHost::default()
        };
        let r = run(&n.paths, None, &host);
        assert!(!r.ok);
        for name in [
            "nvml",
            "mps-control",
            "driver-spec",
            "containerd",
            "nodeadm",
            "compute-mode",
        ] {
            let c = get(&r, name);
            assert_eq!(c.status, Status::Fail, "{name}: {}", r.text());
            assert!(!c.hint.is_empty(), "{name} has no hint");
        }
        assert!(get(&r, "compute-mode")
            .detail
            .contains("gpu-0 (GPU-0) is Default"));
        assert!(get(&r, "nodeadm").detail.contains(NODEADM_DROPIN));
        for line in r.text().lines().filter(|l| l.starts_with("FAIL")) {
            assert!(line.contains(" -> "), "{line}");
        }
    }

    #[test]
    fn the_driver_spec_check_says_what_to_install() {
        let n = node(CDI_ON);
        let r = run(&n.paths, None, &FakeHost::default());
        let c = get(&r, "driver-spec");
        assert_eq!(c.status, Status::Fail, "{}", r.text());
        assert!(
            c.detail.contains("nvidia-ctk is in none of /usr/bin"),
            "{c:?}"
        );
        assert!(c.hint.contains("install nvidia-container-toolkit"), "{c:?}");
        // Installed but the spec not (yet) generated: a warning pointing at the journal.
        let host = FakeHost {
            programs: vec!["nvidia-ctk"],
            ..FakeHost::default()
        };
        let c = get(&run(&n.paths, None, &host), "driver-spec").clone();
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(c.detail.starts_with("/usr/bin/nvidia-ctk"), "{c:?}");
        // Simulated nodes use the simulated toolkit; "none" is a knowing choice.
        let c = get(
            &run(&n.paths, Some("g5.xlarge"), &FakeHost::default()),
            "driver-spec",
        )
        .clone();
        assert!(c.detail.starts_with("the simulated toolkit"), "{c:?}");
        std::fs::write(
            &n.paths.config,
            format!(
                "[paths]\nstate_dir = \"{}\"\n[cdi]\ndriver_spec = \"none\"\n",
                n.dir.path().join("state").display()
            ),
        )
        .unwrap();
        let c = get(&run(&n.paths, None, &FakeHost::default()), "driver-spec").clone();
        assert_eq!(c.status, Status::Ok, "{c:?}");
    }

    #[test]
    fn a_driver_spec_the_daemon_cannot_generate_fails_the_check() {
        let n = node(CDI_ON);
        // The file of an earlier, good generation is there; the daemon's word wins.
        std::fs::write(
            n.dir.path().join("run-cdi/gpushare.io-gpu.json"),
            r#"{"cdiVersion":"0.3.0","kind":"gpushare.io/gpu","devices":[{"name":"GPU-0","containerEdits":{"env":["A=1"]}}]}"#,
        )
        .unwrap();
        let mut daemon = healthy(vec![gpu(GpuSharing::Free, ComputeMode::Default)]);
        daemon.health.driver_spec = Some(gpushare_proto::DriverSpecHealth {
            path: "/var/run/cdi/gpushare.io-gpu.json".into(),
            generator: "/usr/bin/nvidia-ctk cdi generate (driver root /)".into(),
            ok: false,
            error: Some("/usr/bin/nvidia-ctk cdi generate failed: exit 1: Failed to initialize NVML: Driver/library version mismatch".into()),
            failures: 3,
            retry_in_seconds: Some(40),
            generate_timeout_seconds: Some(15),
        });
        let host = FakeHost {
            programs: vec!["nvidia-ctk"],
            daemon: Some(daemon.clone()),
            ..FakeHost::default()
        };
        let r = run(&n.paths, None, &host);
        let c = get(&r, "driver-spec");
        assert_eq!(c.status, Status::Fail, "{}", r.text());
        for part in [
            "Driver/library version mismatch",
            "3 failed generations in a row",
            "next try in 40 s",
            "every prepare is refused",
        ] {
            assert!(c.detail.contains(part), "{part:?} in {c:?}");
        }
        assert!(c.hint.contains("reboot"), "{c:?}");
        assert!(!r.ok);
        // Generated again: OK, from the daemon's word too.
        daemon.health.driver_spec = Some(gpushare_proto::DriverSpecHealth {
            ok: true,
            error: None,
            failures: 0,
            retry_in_seconds: None,
            ..daemon.health.driver_spec.clone().unwrap()
        });
        let host = FakeHost {
            programs: vec!["nvidia-ctk"],
            daemon: Some(daemon),
            ..FakeHost::default()
        };
        let c = get(&run(&n.paths, None, &host), "driver-spec").clone();
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(c.detail.contains("gpushared generates"), "{c:?}");
    }

    #[test]
    fn containerd_runtime_in_an_imported_file_counts() {
        let n = node("version = 2\nimports = [\"conf.d/*.toml\"]\n");
        std::fs::write(
            n.dir.path().join("containerd/conf.d/gpushare-runtime.toml"),
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.gpushare.options]\nBinaryName = \"/usr/bin/gpushare-runtime\"\n",
        )
        .unwrap();
        let c = check_containerd(&n.paths.containerd_config);
        // Enough for annotation and environment requests, not for DRA: kubelet hands DRA's
        // CDI IDs only in CRI's CDI field, which the runtime wrapper never sees.
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(c.detail.contains("gpushare-runtime configured"), "{c:?}");
        assert!(
            c.detail.contains("CDI off") && c.hint.contains("DRA") && c.hint.contains("enable_cdi"),
            "{c:?}"
        );
        // The shipped drop-in itself is recognised.
        let shipped = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../packaging/containerd/gpushare-runtime.toml"
        );
        std::fs::copy(
            shipped,
            n.dir.path().join("containerd/conf.d/gpushare-runtime.toml"),
        )
        .unwrap();
        assert_eq!(
            check_containerd(&n.paths.containerd_config).status,
            Status::Warn
        );
        // A TOML error is named.
        std::fs::write(&n.paths.containerd_config, "version = = 2\n").unwrap();
        let c = check_containerd(&n.paths.containerd_config);
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("config.toml"), "{c:?}");
    }

    #[test]
    fn the_shipped_nodeadm_dropin_passes() {
        let n = node(CDI_ON);
        std::fs::copy(
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../packaging/nodeadm/gpushare-nodeconfig.yaml"
            ),
            n.paths.nodeadm_dir.join(NODEADM_DROPIN),
        )
        .unwrap();
        let host = FakeHost {
            programs: vec!["nodeadm"],
            ..FakeHost::default()
        };
        assert_eq!(
            check_nodeadm(&n.paths.nodeadm_dir, &host).status,
            Status::Ok
        );
        let none = FakeHost::default();
        assert_eq!(
            check_nodeadm(&n.paths.nodeadm_dir, &none).status,
            Status::Warn
        );
    }

    #[test]
    fn corrupt_checkpoint_and_broken_specs_are_reported_and_left_alone() {
        let n = node(CDI_ON);
        let cp = n.dir.path().join("state/checkpoint.json");
        std::fs::write(&cp, "{not json").unwrap();
        std::fs::write(
            n.paths.static_cdi_dir.join("broken.json"),
            "{\"cdiVersion\": 1}",
        )
        .unwrap();
        let r = run(&n.paths, Some("g5.xlarge"), &FakeHost::default());
        let c = get(&r, "checkpoint");
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("corrupt"), "{c:?}");
        assert_eq!(
            std::fs::read_to_string(&cp).unwrap(),
            "{not json",
            "doctor changes nothing"
        );
        let c = get(&r, "cdi-specs");
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("broken.json"), "{c:?}");
        // Simulated GPU checks pass even so; without a daemon, compute mode has nothing to check.
        assert_eq!(get(&r, "nvml").status, Status::Ok);
        assert_eq!(get(&r, "compute-mode").status, Status::Ok);
        let r = run(&n.paths, Some("p9.mystery"), &FakeHost::default());
        assert_eq!(get(&r, "nvml").status, Status::Fail);
    }

    #[test]
    fn a_bad_config_file_fails_with_the_key_named() {
        let n = node(CDI_ON);
        std::fs::write(&n.paths.config, "[mps]\ntimeout_secnds = 3\n").unwrap();
        let r = run(&n.paths, Some("g5.xlarge"), &FakeHost::default());
        let c = get(&r, "config");
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("timeout_secnds"), "{c:?}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["ok"], false);
        assert_eq!(json["checks"][0]["status"], "fail");
    }

    fn claim(uid: &str, state: ClaimState, cdi_spec: &Path) -> ClaimInfo {
        serde_json::from_value(serde_json::json!({
            "uid": uid, "namespace": "ns", "name": "c", "state": state, "groups": [],
            "requests": [], "cdi_spec": cdi_spec, "attach_limit": null, "attached": [],
            "last_error": (state == ClaimState::Degraded).then_some("MPS control daemon (pid 77) exited"),
            "restarts": 1,
        }))
        .unwrap()
    }

    #[test]
    fn the_mps_control_program_is_the_one_gpushared_would_run() {
        let n = node(CDI_ON);
        // No NVIDIA program; the emulator beside gpushared: what gpushared --simulate runs.
        let host = FakeHost {
            beside: vec!["gpushare-mps-control"],
            ..FakeHost::default()
        };
        let r = run(&n.paths, Some("p4d.24xlarge"), &host);
        let c = get(&r, "mps-control");
        assert_eq!(c.status, Status::Ok, "{}", r.text());
        assert!(
            c.detail.contains(
                "/usr/bin/gpushare-mps-control (what gpushared would run): gpushare's emulator"
            ),
            "{c:?}"
        );
        // On real GPUs the emulator is no MPS at all.
        let r = run(&n.paths, None, &host);
        let c = get(&r, "mps-control");
        assert_eq!(c.status, Status::Fail, "{}", r.text());
        assert!(c.detail.contains("drives no GPU"), "{c:?}");
        // Neither: both places named.
        let r = run(&n.paths, Some("g5.xlarge"), &FakeHost::default());
        let c = get(&r, "mps-control");
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail
                .contains("/usr/bin/gpushare-mps-control does not exist"),
            "{c:?}"
        );
        // A daemon that answers says what it runs.
        let mut view = healthy(vec![]);
        view.health.mps_control = "/opt/nvidia/nvidia-cuda-mps-control".into();
        let host = FakeHost {
            programs: vec!["nvidia-cuda-mps-control"],
            daemon: Some(view),
            ..FakeHost::default()
        };
        let c = get(&run(&n.paths, None, &host), "mps-control").clone();
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(
            c.detail
                .starts_with("/opt/nvidia/nvidia-cuda-mps-control (run by gpushared at "),
            "{c:?}"
        );
    }

    #[test]
    fn a_daemon_on_other_directories_is_named_and_the_flags_fix_it() {
        let n = node(CDI_ON);
        let d = n.dir.path();
        // The daemon was started by hand on directories of its own.
        let own = d.join("own");
        for sub in ["state", "run", "cdi"] {
            std::fs::create_dir_all(own.join(sub)).unwrap();
        }
        let spec = own.join("cdi/gpushare.io-claim_u1.json");
        std::fs::write(&spec, "{}").unwrap();
        std::fs::write(
            own.join("state/checkpoint.json"),
            serde_json::to_vec(&serde_json::json!({"version": 1, "claims": {}})).unwrap(),
        )
        .unwrap();
        let mut view = healthy(vec![]);
        view.claims = vec![claim("u1", ClaimState::Prepared, &spec)];
        let host = |lock_pid| FakeHost {
            daemon: Some(view.clone()),
            lock_pid,
            programs: vec!["nvidia-cuda-mps-control"],
            ..FakeHost::default()
        };
        // Nobody holds the configured directories' locks, and the claim's spec is elsewhere.
        let r = run(&n.paths, Some("g5.xlarge"), &host(None));
        let c = get(&r, "paths");
        assert_eq!(c.status, Status::Fail, "{}", r.text());
        assert!(
            c.detail.contains("no gpushared runs on state directory"),
            "{c:?}"
        );
        assert!(c.detail.contains("claim u1's CDI spec"), "{c:?}");
        assert!(c.hint.contains("--state-dir"), "{c:?}");
        // The checkpoint of directories the daemon does not use says nothing about it.
        let c = get(&r, "checkpoint");
        assert_eq!(c.status, Status::Skip, "{}", r.text());
        assert!(c.detail.contains("see paths"), "{c:?}");
        // Another gpushared holds them.
        let c = get(&run(&n.paths, Some("g5.xlarge"), &host(Some(7))), "paths").clone();
        assert!(
            c.detail
                .contains("held by pid 7, not by the gpushared answering (pid 4242)"),
            "{c:?}"
        );
        // Given the daemon's own directories, every path check passes.
        let paths = DoctorPaths {
            state_dir: Some(own.join("state")),
            run_dir: Some(own.join("run")),
            cdi_dir: Some(own.join("cdi")),
            ..n.paths.clone()
        };
        let r = run(&paths, Some("g5.xlarge"), &host(Some(4242)));
        for name in ["paths", "checkpoint", "claims"] {
            assert_eq!(get(&r, name).status, Status::Ok, "{name}: {}", r.text());
        }
        assert!(get(&r, "checkpoint")
            .detail
            .contains(&own.join("state").display().to_string()));

        // Without doctor's flags, the directories come from the daemon's own command line
        // (`--state-dir DIR`, `--run-dir=DIR`, relative to its working directory), and the
        // paths check says so.
        let by_hand = FakeHost {
            command_line: Some((
                [
                    "gpushared",
                    "--simulate",
                    "g5.xlarge",
                    "--state-dir",
                    "state",
                    "--run-dir=run",
                    "--cdi-dir",
                    own.join("cdi").to_str().unwrap(),
                ]
                .map(String::from)
                .to_vec(),
                own.clone(),
            )),
            ..host(Some(4242))
        };
        let r = run(&n.paths, Some("g5.xlarge"), &by_hand);
        for name in ["paths", "checkpoint", "claims"] {
            assert_eq!(get(&r, name).status, Status::Ok, "{name}: {}", r.text());
        }
        assert!(
            get(&r, "paths")
                .detail
                .contains("directories from gpushared's command line (pid 4242)"),
            "{}",
            r.text()
        );
        // Flags given to doctor win over the daemon's command line.
        let r = run(&paths, Some("g5.xlarge"), &by_hand);
        assert!(
            !get(&r, "paths").detail.contains("command line"),
            "{}",
            r.text()
        );
    }

    #[test]
    fn containerd_hints_say_what_serves_dra_and_what_does_not() {
        // Neither: the hint says what DRA needs, and does not send EKS users to the nodeadm
        // drop-in (which adds only gpushare-runtime).
        let n = node("version = 2\n");
        let c = check_containerd(&n.paths.containerd_config);
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(
            c.hint.contains("DRA") && c.hint.contains("enable_cdi = true"),
            "{c:?}"
        );
        assert!(!c.hint.contains("nodeadm does it"), "{c:?}");
        // containerd 2.x (config version 3) has CDI on unless it is turned off.
        std::fs::write(&n.paths.containerd_config, "version = 3\n").unwrap();
        let c = check_containerd(&n.paths.containerd_config);
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(c.detail.contains("containerd 2.x"), "{c:?}");
        std::fs::write(
            &n.paths.containerd_config,
            "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\"]\nenable_cdi = false\n",
        )
        .unwrap();
        let c = check_containerd(&n.paths.containerd_config);
        assert_eq!(c.status, Status::Fail, "{c:?}");
    }

    #[test]
    fn a_simulated_profile_counts_each_product_once_with_its_mig_gpus() {
        let profile = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../daemon/examples/profiles/p4d.24xlarge-mig2.toml"
        );
        let c = check_driver(Some(profile), None, &FakeHost::default());
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(
            c.detail
                .contains(": 8 x NVIDIA A100-SXM4-40GB (MIG mode on for 1) (no NVML used)"),
            "{c:?}"
        );
    }

    #[test]
    fn counts_and_directories_are_worded_as_they_are() {
        let n = node(CDI_ON);
        let host = FakeHost {
            daemon: Some(healthy(vec![gpu(
                GpuSharing::Mps,
                ComputeMode::ExclusiveProcess,
            )])),
            ..FakeHost::default()
        };
        std::fs::remove_dir(&n.paths.static_cdi_dir).unwrap();
        let r = run(&n.paths, Some("g5.xlarge"), &host);
        let c = get(&r, "compute-mode");
        assert_eq!(
            c.detail, "1 GPU shared with MPS, EXCLUSIVE_PROCESS",
            "{c:?}"
        );
        let c = get(&r, "cdi-specs");
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(
            c.detail.starts_with(&format!(
                "0 specs valid in {},",
                n.dir.path().join("run-cdi").display()
            )) && c.detail.contains(&format!(
                "{} does not exist",
                n.paths.static_cdi_dir.display()
            )),
            "{c:?}"
        );
    }

    #[test]
    fn degraded_claims_fail_with_their_last_error() {
        let n = node(CDI_ON);
        let mut view = healthy(vec![]);
        view.claims = vec![
            claim("ok-1", ClaimState::Prepared, Path::new("")),
            claim("bad-1", ClaimState::Degraded, Path::new("")),
        ];
        let host = FakeHost {
            daemon: Some(view),
            ..FakeHost::default()
        };
        let c = get(&run(&n.paths, Some("g5.xlarge"), &host), "claims").clone();
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(
            c.detail.contains("1 of 2 claims degraded")
                && c.detail
                    .contains("bad-1 (ns/c): MPS control daemon (pid 77) exited"),
            "{c:?}"
        );
        assert!(!c.detail.contains("ok-1"), "{c:?}");
        assert!(c.hint.contains("gpushare claim <uid>"), "{c:?}");
        // Without a daemon there is nothing to say.
        let r = run(&n.paths, Some("g5.xlarge"), &FakeHost::default());
        assert_eq!(get(&r, "claims").status, Status::Skip);
    }

    #[test]
    fn a_socket_this_user_may_not_open_is_no_daemon_to_start() {
        let n = node(CDI_ON);
        let mut text = std::fs::read_to_string(&n.paths.config).unwrap();
        text += "[socket]\ngroup = \"gpu-ops\"\nmode = \"0660\"\n";
        std::fs::write(&n.paths.config, text).unwrap();
        let denied = |error| {
            DaemonError::from_client(&gpushare_proto::ClientError::Connect {
                path: n.paths.socket.clone().unwrap(),
                error,
            })
        };
        // EACCES and EPERM alike: the daemon runs, this user may not open its socket.
        for errno in [13, 1] {
            let e = denied(std::io::Error::from_raw_os_error(errno));
            assert!(matches!(e, DaemonError::PermissionDenied(_)), "{e:?}");
        }
        // And gpushared's own refusal of a peer outside [socket] group (a socket any user
        // may open); a busy server is one that does not answer in time.
        let refusal = |code, message: &str| {
            DaemonError::from_client(&gpushare_proto::ClientError::Remote(
                gpushare_proto::ErrorBody {
                    code,
                    message: message.into(),
                },
            ))
        };
        let e = refusal(
            gpushare_proto::ErrorCode::PermissionDenied,
            "peer uid 1000 may not read",
        );
        assert!(matches!(e, DaemonError::PermissionDenied(_)), "{e:?}");
        let e = refusal(gpushare_proto::ErrorCode::Busy, "every connection is taken");
        assert!(matches!(e, DaemonError::TimedOut(_)), "{e:?}");
        let host = FakeHost {
            daemon_error: Some(denied(std::io::Error::from_raw_os_error(13))),
            ..FakeHost::default()
        };
        let r = run(&n.paths, Some("g5.xlarge"), &host);
        let c = get(&r, "socket");
        assert_eq!(c.status, Status::Fail, "{}", r.text());
        assert!(c.detail.contains("Permission denied"), "{c:?}");
        assert!(!c.hint.contains("start it"), "{c:?}");
        assert!(
            c.hint.contains("run doctor as root")
                && c.hint
                    .contains("[socket] group (now \"gpu-ops\") and mode (now \"0660\")")
                && c.hint.contains(&n.paths.config.display().to_string()),
            "{c:?}"
        );
        // The socket file's own mode and group, where it can be looked at.
        std::fs::write(n.paths.socket.as_ref().unwrap(), "").unwrap();
        let c = get(&run(&n.paths, Some("g5.xlarge"), &host), "socket").clone();
        assert!(c.detail.contains("(the socket is mode 0"), "{c:?}");
        // A daemon that is not there is still one to start; one that does not answer in time
        // or answers wrongly is not.
        let refused = denied(std::io::ErrorKind::ConnectionRefused.into());
        let absent = denied(std::io::ErrorKind::NotFound.into());
        for e in [refused, absent] {
            assert!(matches!(e, DaemonError::NotRunning(_)), "{e:?}");
            let host = FakeHost {
                daemon_error: Some(e),
                ..FakeHost::default()
            };
            let c = get(&run(&n.paths, Some("g5.xlarge"), &host), "socket").clone();
            assert!(c.hint.starts_with("start it: systemctl"), "{c:?}");
        }
        for e in [
            denied(std::io::ErrorKind::TimedOut.into()),
            DaemonError::from_client(&gpushare_proto::ClientError::Protocol("x".into())),
        ] {
            let host = FakeHost {
                daemon_error: Some(e.clone()),
                ..FakeHost::default()
            };
            let c = get(&run(&n.paths, Some("g5.xlarge"), &host), "socket").clone();
            assert_eq!(c.status, Status::Fail, "{c:?}");
            assert!(!c.hint.contains("start it"), "{e:?}: {c:?}");
        }
    }

    #[test]
    fn a_simulated_daemons_backend_is_checked_instead_of_nvml() {
        let n = node(CDI_ON);
        // No NVIDIA driver on this host; gpushared runs on simulated GPUs.
        let mut view = healthy(vec![]);
        view.health.backend = "simulated:g5.xlarge".into();
        view.health.mps_control = "/usr/bin/gpushare-mps-control".into();
        let host = FakeHost {
            daemon: Some(view.clone()),
            beside: vec!["gpushare-mps-control"],
            lock_pid: Some(4242),
            ..FakeHost::default()
        };
        let r = run(&n.paths, None, &host);
        let c = get(&r, "nvml");
        assert_eq!(c.status, Status::Ok, "{}", r.text());
        assert!(
            c.detail.starts_with(
                "simulated g5.xlarge: 1 x NVIDIA A10G (no NVML used; the running gpushared at "
            ) && c
                .detail
                .contains("uses the simulated backend simulated:g5.xlarge"),
            "{c:?}"
        );
        // Its emulator is the simulated node's MPS control program, not a failure.
        assert_eq!(get(&r, "mps-control").status, Status::Ok, "{}", r.text());
        // A profile file on the daemon's command line, relative to its working directory.
        view.health.backend = "simulated:p4d.24xlarge-mig2".into();
        let by_hand = FakeHost {
            daemon: Some(view.clone()),
            command_line: Some((
                [
                    "gpushared",
                    "--simulate",
                    "daemon/examples/profiles/p4d.24xlarge-mig2.toml",
                ]
                .map(String::from)
                .to_vec(),
                Path::new(env!("CARGO_MANIFEST_DIR")).join(".."),
            )),
            ..host
        };
        let c = get(&run(&n.paths, None, &by_hand), "nvml").clone();
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(c.detail.contains("(MIG mode on for 1)"), "{c:?}");
        // Without the command line, a profile file's name is no catalog name: the check says
        // which backend runs and is skipped, not failed.
        let unread = FakeHost {
            command_line: None,
            ..by_hand
        };
        let r = run(&n.paths, None, &unread);
        let c = get(&r, "nvml");
        assert_eq!(c.status, Status::Skip, "{}", r.text());
        assert!(
            c.detail
                .contains("uses the simulated backend simulated:p4d.24xlarge-mig2")
                && c.detail.contains("NVML not checked"),
            "{c:?}"
        );
        assert!(c.hint.contains("--simulate"), "{c:?}");
        // A daemon on NVML: NVML is asked (and fails on this driverless host); --simulate wins
        // over the daemon.
        let nvml = FakeHost {
            daemon: Some(healthy(vec![])),
            ..FakeHost::default()
        };
        assert_eq!(
            get(&run(&n.paths, None, &nvml), "nvml").status,
            Status::Fail
        );
        let c = get(&run(&n.paths, Some("g5.xlarge"), &nvml), "nvml").clone();
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(!c.detail.contains("running gpushared"), "{c:?}");
    }

    #[test]
    fn helpers_beside_the_cli_are_found_and_said_where() {
        let n = node(CDI_ON);
        // An unpacked build in /opt/gpushare/bin, not on PATH; gpushare-runtime on PATH only.
        let host = FakeHost {
            exe_dir: Some("/opt/gpushare/bin"),
            beside: vec!["gpushare-cdi-hook", "gpushare-dra"],
            programs: vec!["gpushare-runtime"],
            ..FakeHost::default()
        };
        let r = run(&n.paths, Some("g5.xlarge"), &host);
        let c = get(&r, "helpers");
        assert_eq!(c.status, Status::Ok, "{}", r.text());
        assert_eq!(
            c.detail,
            "gpushare-cdi-hook /opt/gpushare/bin/gpushare-cdi-hook (beside gpushare); gpushare-runtime /usr/bin/gpushare-runtime (on PATH); gpushare-dra /opt/gpushare/bin/gpushare-dra (beside gpushare)"
        );
        // The DRA plugin's probe runs: it is installed beside the CLI.
        let c = get(&r, "dra-plugin");
        assert_eq!(c.status, Status::Ok, "{}", r.text());
        assert!(
            c.detail
                .ends_with("(probed with /opt/gpushare/bin/gpushare-dra (beside gpushare))"),
            "{c:?}"
        );
        assert_eq!(
            *host.probed.borrow(),
            Some(PathBuf::from("/opt/gpushare/bin/gpushare-dra"))
        );
        // Beside and on PATH: the one beside, of the CLI's own build.
        let both = FakeHost {
            programs: vec!["gpushare-dra"],
            ..host
        };
        let c = get(&run(&n.paths, Some("g5.xlarge"), &both), "helpers").clone();
        assert!(
            c.detail
                .contains("gpushare-dra /opt/gpushare/bin/gpushare-dra (beside gpushare)"),
            "{c:?}"
        );
        // The hook on PATH only is not the one gpushared names (beside itself): a warning.
        let on_path = FakeHost {
            exe_dir: Some("/opt/gpushare/bin"),
            programs: vec!["gpushare-cdi-hook"],
            ..FakeHost::default()
        };
        let c = get(&run(&n.paths, Some("g5.xlarge"), &on_path), "helpers").clone();
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(
            c.detail.contains(
                "not beside gpushare in /opt/gpushare/bin: gpushared names the hook beside itself"
            ),
            "{c:?}"
        );
        // Nowhere: the hook's absence is a warning naming both places; the plugin's check is
        // skipped saying where it looked.
        let none = FakeHost {
            exe_dir: Some("/opt/gpushare/bin"),
            ..FakeHost::default()
        };
        let r = run(&n.paths, Some("g5.xlarge"), &none);
        let c = get(&r, "helpers");
        assert_eq!(c.status, Status::Warn, "{}", r.text());
        assert!(
            c.detail.contains(
                "gpushare-cdi-hook found neither beside gpushare in /opt/gpushare/bin nor on PATH"
            ) && c.detail.contains("gpushare-runtime not installed"),
            "{c:?}"
        );
        let c = get(&r, "dra-plugin");
        assert_eq!(c.status, Status::Skip, "{}", r.text());
        assert!(c.detail.contains("/opt/gpushare/bin"), "{c:?}");
        // [hook] path names what gpushared puts in every spec: it must be there.
        let mut text = std::fs::read_to_string(&n.paths.config).unwrap();
        text += "[hook]\npath = \"/opt/other/gpushare-cdi-hook\"\n";
        std::fs::write(&n.paths.config, text).unwrap();
        let c = get(&run(&n.paths, Some("g5.xlarge"), &none), "helpers").clone();
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(
            c.detail
                .starts_with("[hook] path /opt/other/gpushare-cdi-hook is not an executable file"),
            "{c:?}"
        );
    }

    #[test]
    fn the_checkpoint_check_names_the_claim_records_the_daemon_uses() {
        let n = node(CDI_ON);
        let state = n.dir.path().join("state");
        let shown = |p: &str| state.join(p).display().to_string();
        // Before the first start: the store gpushared will write, no checkpoint.json.
        let r = run(&n.paths, Some("g5.xlarge"), &FakeHost::default());
        let c = get(&r, "checkpoint");
        assert_eq!(c.status, Status::Ok, "{}", r.text());
        assert!(
            c.detail.starts_with(&format!(
                "no claim records yet: {} absent",
                shown("store.json")
            )) && c.detail.contains(&shown("records")),
            "{c:?}"
        );
        assert!(!c.detail.contains("checkpoint.json"), "{c:?}");
        // A daemon holding claims without a store: the store is named missing.
        let mut view = healthy(vec![]);
        view.claims = vec![claim("u1", ClaimState::Prepared, Path::new(""))];
        let holding = FakeHost {
            daemon: Some(view),
            lock_pid: Some(4242),
            ..FakeHost::default()
        };
        let c = get(&run(&n.paths, Some("g5.xlarge"), &holding), "checkpoint").clone();
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert_eq!(
            c.detail,
            format!(
                "{} absent but the daemon holds 1 claims",
                shown("store.json")
            )
        );
        // A previous release's checkpoint, before this release's first start: named as such.
        std::fs::write(
            state.join("checkpoint.json"),
            serde_json::to_vec(&serde_json::json!({"version": 1, "claims": {}})).unwrap(),
        )
        .unwrap();
        let c = get(
            &run(&n.paths, Some("g5.xlarge"), &FakeHost::default()),
            "checkpoint",
        )
        .clone();
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(
            c.detail
                .starts_with(&format!("{}: 0 claims", shown("checkpoint.json")))
                && c.detail.contains("from before per-claim records")
                && c.detail.contains("migrates it"),
            "{c:?}"
        );
        // The store of a running daemon: its records directory, and checkpoint.json only while
        // it is there beside them (the downgrade export).
        std::fs::write(
            state.join("store.json"),
            r#"{"format": 4, "boot_id": "b", "generation": 0, "export": null}"#,
        )
        .unwrap();
        std::fs::create_dir(state.join("records")).unwrap();
        let c = get(
            &run(&n.paths, Some("g5.xlarge"), &FakeHost::default()),
            "checkpoint",
        )
        .clone();
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert!(
            c.detail
                .starts_with(&format!("{}: 0 claims", shown("records")))
                && c.detail.contains("downgrade export"),
            "{c:?}"
        );
        std::fs::remove_file(state.join("checkpoint.json")).unwrap();
        let c = get(
            &run(&n.paths, Some("g5.xlarge"), &FakeHost::default()),
            "checkpoint",
        )
        .clone();
        assert_eq!(
            c.detail,
            format!("{}: 0 claims, each with its CDI spec", shown("records"))
        );
        // A corrupt record is named in the records directory.
        std::fs::write(state.join("records/u1.json"), "{not json").unwrap();
        let c = get(
            &run(&n.paths, Some("g5.xlarge"), &FakeHost::default()),
            "checkpoint",
        )
        .clone();
        assert_eq!(c.status, Status::Fail, "{c:?}");
        assert!(
            c.detail
                .starts_with(&format!("corrupt claim records in {}", shown("records"))),
            "{c:?}"
        );
        // Directories of another daemon: skipped, naming the state directory, not a file.
        let elsewhere = FakeHost {
            daemon: Some(healthy(vec![])),
            ..FakeHost::default()
        };
        let c = get(&run(&n.paths, Some("g5.xlarge"), &elsewhere), "checkpoint").clone();
        assert_eq!(c.status, Status::Skip, "{c:?}");
        assert_eq!(
            c.detail,
            format!(
                "claim records in {}: not the state directory of the daemon answering (see paths)",
                state.display()
            )
        );
    }

    #[test]
    fn records_refused_at_start_are_a_warning_naming_each() {
        let n = node(CDI_ON);
        let mut view = healthy(vec![]);
        view.claims = vec![claim("ok-1", ClaimState::Prepared, Path::new(""))];
        let refused = "claim \"m\" (from /run/gpushare/claims/m/claim.json): CDI device ID \"gpushare.io/gpu=MIG-old\" is not the claim's; kept at /var/lib/gpushare/quarantine/host-record-1-2-0.json";
        view.health.quarantined_records = vec![refused.into()];
        let host = FakeHost {
            daemon: Some(view),
            ..FakeHost::default()
        };
        let r = run(&n.paths, Some("g5.xlarge"), &host);
        let c = get(&r, "claims");
        assert_eq!(c.status, Status::Warn, "{c:?}");
        assert!(
            c.detail.contains("1 claim record(s) refused at start"),
            "{c:?}"
        );
        assert!(c.detail.contains(refused), "{c:?}");
        assert!(c.hint.contains("quarantine/"), "{c:?}");
    }
}

#[cfg(test)]
mod dra_check_tests {
    use super::*;

    struct Probe(
        Option<Result<Vec<ProbeCheck>, String>>,
        std::cell::RefCell<Vec<String>>,
    );

    fn probe(answer: Option<Result<Vec<ProbeCheck>, String>>) -> Probe {
        Probe(answer, std::cell::RefCell::default())
    }

    impl DoctorHost for Probe {
        fn driver_version(&self) -> Result<String, String> {
            Err("none".into())
        }
        fn which(&self, name: &str) -> Option<PathBuf> {
            // Installed on PATH where the probe has an answer.
            (name == "gpushare-dra" && self.0.is_some())
                .then(|| PathBuf::from("/usr/bin/gpushare-dra"))
        }
        fn executable(&self, _: &Path) -> bool {
            false
        }
        fn daemon(&self, _: &Path) -> Result<DaemonView, DaemonError> {
            Err(DaemonError::NotRunning("none".into()))
        }
        fn gpushared_dir(&self) -> PathBuf {
            PathBuf::from("/nonexistent")
        }
        fn lock_holder(&self, _: &Path) -> Result<Option<i32>, String> {
            Ok(None)
        }
        fn dra_probe(&self, program: &Path, args: &[String]) -> Result<Vec<ProbeCheck>, String> {
            assert_eq!(program, Path::new("/usr/bin/gpushare-dra"));
            self.1.replace(args.to_vec());
            self.0.clone().expect("probed only where installed")
        }
    }

    #[test]
    fn the_plugin_check_skips_passes_and_fails_with_the_probe() {
        assert_eq!(check_dra_plugin(&probe(None), &[]).status, Status::Skip);
        let ok = |n: &str| ProbeCheck {
            name: n.to_string(),
            passed: true,
            detail: format!("{n} fine"),
            hint: String::new(),
        };
        let c = check_dra_plugin(&probe(Some(Ok(vec![ok("registration"), ok("names")]))), &[]);
        assert_eq!(c.status, Status::Ok, "{c:?}");
        let bad = ProbeCheck {
            name: "names".to_string(),
            passed: false,
            detail: "node name mismatch: \"a\" vs \"b\"".to_string(),
            hint: String::new(),
        };
        let c = check_dra_plugin(&probe(Some(Ok(vec![ok("registration"), bad]))), &[]);
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail.contains("node name mismatch") && !c.detail.contains("registration"),
            "{c:?}"
        );
        assert!(c.hint.contains("journalctl -u gpushare-dra"));
        let c = check_dra_plugin(&probe(Some(Err("no answer".into()))), &[]);
        assert_eq!(c.status, Status::Fail);
    }

    #[test]
    fn the_probes_json_is_read_in_both_shapes_with_its_hints() {
        let now = br#"[{"name":"registration","status":"ok","detail":"fine"},
            {"name":"names","status":"fail","detail":"node name mismatch","hint":"make them agree"}]"#;
        let checks = parse_probe_json(now).unwrap();
        assert_eq!(
            checks.iter().map(|c| c.passed).collect::<Vec<_>>(),
            [true, false]
        );
        let c = check_dra_plugin(&probe(Some(Ok(checks))), &[]);
        assert_eq!(
            (c.status, c.hint.as_str()),
            (Status::Fail, "make them agree")
        );
        // A plugin from before the status field.
        let before = br#"[{"name":"registration","ok":true,"detail":"fine"}]"#;
        assert!(parse_probe_json(before).unwrap()[0].passed);
        assert!(parse_probe_json(b"not json").is_none());
    }

    #[test]
    fn the_probe_gets_doctors_socket_and_the_plugins_directories() {
        let dir = tempfile::tempdir().unwrap();
        let paths = DoctorPaths {
            config: dir.path().join("absent.toml"),
            containerd_config: dir.path().join("containerd.toml"),
            socket: Some(PathBuf::from("/tmp/gs/sock")),
            dra_config: Some(PathBuf::from("/tmp/gs/dra.toml")),
            dra_plugins_dir: Some(PathBuf::from("/tmp/gs/plugins")),
            dra_registry_dir: Some(PathBuf::from("/tmp/gs/registry")),
            ..DoctorPaths::default()
        };
        let host = probe(Some(Ok(vec![])));
        run(&paths, Some("g5.xlarge"), &host);
        assert_eq!(
            *host.1.borrow(),
            [
                "--gpushared-socket",
                "/tmp/gs/sock",
                "--config",
                "/tmp/gs/dra.toml",
                "--plugins-dir",
                "/tmp/gs/plugins",
                "--registry-dir",
                "/tmp/gs/registry"
            ]
        );
        // Without doctor's flags, the socket it checks is still the plugin's gpushared.
        let paths = DoctorPaths {
            socket: None,
            dra_config: None,
            dra_plugins_dir: None,
            dra_registry_dir: None,
            ..paths
        };
        run(&paths, Some("g5.xlarge"), &host);
        assert_eq!(
            *host.1.borrow(),
            ["--gpushared-socket", "/run/gpushare/gpushared.sock"]
        );
    }
}
