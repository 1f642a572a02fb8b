//! `gpushared`: the node daemon that owns every GPU sharing decision on its node.

use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use tokio::signal::unix::{signal, SignalKind};

use gpushare::cdi::HookConfig;
use gpushare::daemon_config::{
    parse_mode, DaemonConfig, DriverSpecMode, GpusConfig, DEFAULT_CONFIG, DEFAULT_CONFIG_PATH,
};
use gpushare::driver_spec::{
    nvidia_ctk::NvidiaCtk, sim::SimulatedToolkit, DriverSpecs, SpecGenerator,
};
use gpushare::gpu::nvml::NvmlLib;
use gpushare::gpu::timeslice::NvidiaSmi;
use gpushare::gpu::{GpuBackend, HostBackend, ManagedSettings, SimulatedBackend};
use gpushare::privileges;
use gpushare::server::{self, ServerConfig};
use gpushare::service::{Service, ServiceConfig};
use gpushare::strategy::mps::MpsControl;
use gpushare::sys::{reap_orphans, HostOps, HostRunner};
use gpushare::{metrics, notify};

/// gpushared: per-claim MPS control daemons, time-slicing and exclusive GPUs for Kubernetes DRA
/// claims, with one CDI spec per claim.
///
/// Settings come from the config file (default /etc/gpushare/config.toml; see
/// --print-default-config); each flag below overrides its key.
#[derive(Debug, Parser)]
#[command(name = "gpushared", version)]
pub struct Args {
    /// Config file (TOML). Without this flag /etc/gpushare/config.toml is read when it exists.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the documented default config file and exit.
    #[arg(long)]
    print_default_config: bool,
    /// Write the man page gpushared.8 into this directory and exit (for packaging).
    #[arg(long, value_name = "DIR", hide = true)]
    generate_man: Option<PathBuf>,
    /// Unix socket the DRA driver, the hook and the CLI talk to [paths.socket].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Directory of the checkpoint (`checkpoint.json`) [paths.state_dir].
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Runtime directory: per-claim MPS pipe, log and shm directories live under `claims/`
    /// [paths.run_dir].
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// CDI spec directory to write claims' specs into [paths.cdi_dir].
    #[arg(long)]
    cdi_dir: Option<PathBuf>,
    /// Simulate the GPUs of this node profile instead of using NVML: a catalog name (e.g.
    /// p4d.24xlarge; `gpushare profiles` lists them) or a profile file (a path containing '/')
    /// [gpus.simulate].
    #[arg(long, value_name = "NODE_PROFILE")]
    simulate: Option<String>,
    /// Where simulated GPU device nodes are created (default: <run-dir>/simulated-dev)
    /// [gpus.sim_dev_root].
    #[arg(long)]
    sim_dev_root: Option<PathBuf>,
    /// Node name: the pool that allocation results must name (default: the host name)
    /// [node.name].
    #[arg(long)]
    node_name: Option<String>,
    /// DRA driver names served (repeatable) [node.drivers].
    #[arg(long = "driver")]
    drivers: Vec<String>,
    /// MPS control program (default: nvidia-cuda-mps-control from PATH, else the
    /// gpushare-mps-control emulator beside this executable) [mps.control].
    #[arg(long)]
    mps_control: Option<PathBuf>,
    /// gpushare-cdi-hook named in CDI specs (default: beside this executable) [hook.path].
    #[arg(long)]
    hook_path: Option<PathBuf>,
    /// Size of each MPS claim's /dev/shm tmpfs in MiB (default: half the host's memory)
    /// [mps.shm_size_mib].
    #[arg(long)]
    shm_size_mib: Option<u64>,
    /// Seconds any run of the MPS control program, and any wait for a daemon to quit, may take
    /// [mps.timeout_seconds].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    mps_timeout: Option<u64>,
    /// Serve Prometheus metrics at this host:port [metrics.address].
    #[arg(long, value_name = "HOST:PORT", conflicts_with = "no_metrics")]
    metrics_address: Option<String>,
    /// Do not serve metrics [metrics.enabled = false].
    #[arg(long)]
    no_metrics: bool,
    /// Socket file mode (octal) [socket.mode].
    #[arg(long, value_parser = parse_mode)]
    socket_mode: Option<u32>,
    /// File holding the boot ID (default /proc/sys/kernel/random/boot_id). Tests point it
    /// elsewhere to simulate a reboot.
    #[arg(long, hide = true, value_name = "FILE")]
    boot_id_file: Option<PathBuf>,
    /// Longest wait, in seconds, for prepares and unprepares under way when SIGTERM arrives.
    #[arg(long, default_value_t = STOP_BOUND_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    stop_timeout: u64,
}

/// Default bound of a graceful stop: a prepare's slowest step (an MPS control program run and
/// a bounded quit) is far shorter, and systemd's default stop timeout (90 s) is longer.
const STOP_BOUND_SECS: u64 = 30;

impl Args {
    /// The config file with this command line's flags laid over it.
    fn settings(&self) -> Result<DaemonConfig> {
        let mut cfg = match &self.config {
            Some(path) => DaemonConfig::load(path, true)?,
            None => DaemonConfig::load(Path::new(DEFAULT_CONFIG_PATH), false)?,
        };
        let set = |dst: &mut PathBuf, src: &Option<PathBuf>| {
            if let Some(p) = src {
                dst.clone_from(p);
            }
        };
        set(&mut cfg.paths.socket, &self.socket);
        set(&mut cfg.paths.state_dir, &self.state_dir);
        set(&mut cfg.paths.run_dir, &self.run_dir);
        set(&mut cfg.paths.cdi_dir, &self.cdi_dir);
        set(&mut cfg.gpus.sim_dev_root, &self.sim_dev_root);
        set(&mut cfg.mps.control, &self.mps_control);
        set(&mut cfg.hook.path, &self.hook_path);
        if let Some(s) = &self.simulate {
            cfg.gpus.simulate.clone_from(s);
        }
        if let Some(n) = &self.node_name {
            cfg.node.name.clone_from(n);
        }
        if !self.drivers.is_empty() {
            cfg.node.drivers.clone_from(&self.drivers);
        }
        if let Some(m) = self.shm_size_mib {
            cfg.mps.shm_size_mib = m;
        }
        if let Some(t) = self.mps_timeout {
            cfg.mps.timeout_seconds = t;
        }
        if let Some(a) = &self.metrics_address {
            cfg.metrics.address.clone_from(a);
            cfg.metrics.enabled = true;
            gpushare::daemon_config::check_metrics_address(&cfg.metrics)
                .map_err(|m| anyhow::anyhow!("--metrics-address: {m}"))?;
        }
        if self.no_metrics {
            cfg.metrics.enabled = false;
        }
        if let Some(m) = self.socket_mode {
            cfg.socket.mode = format!("{m:04o}");
        }
        Ok(cfg)
    }
}

fn beside_exe(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding gpushared's own path")?;
    Ok(exe.with_file_name(name))
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

fn default_mps_control() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding gpushared's own path")?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    gpushare::mps_program::default_program(find_in_path, dir, Path::is_file)
        .map_err(|e| anyhow::anyhow!("{e}; pass --mps-control"))
}

/// Holds a POSIX write lock on `<dir>/gpushared.lock` (the directory exists: see
/// [`real_dir`]) for the daemon's life, as long as the returned file stays open; a second
/// daemon on the same `what` directory (`"state"` or `"run"`) is refused at once.
///
/// A POSIX lock, not a flock: the kernel names its holder to anyone who asks
/// (`fcntl(F_GETLK)`, which `gpushare doctor` uses to tell which gpushared owns a
/// directory), and forked children do not inherit it. gpushared never opens this file
/// elsewhere (closing any descriptor of it would drop the lock).
fn lock_instance(dir: &Path, what: &str) -> Result<std::fs::File> {
    let path = dir.join("gpushared.lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // A previous gpushared that is still exiting (killed a moment ago) holds the lock until
    // it is gone: wait that out (bounded) rather than fail the restart.
    let deadline = std::time::Instant::now() + INSTANCE_LOCK_WAIT;
    let lock = gpushare::sys::whole_file_write_lock();
    loop {
        use std::os::fd::AsRawFd;
        match nix::fcntl::fcntl(file.as_raw_fd(), nix::fcntl::FcntlArg::F_SETLK(&lock)) {
            Ok(_) => return Ok(file),
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES)
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                let holder = gpushare::sys::find_lock_holder(&path)
                    .ok()
                    .flatten()
                    .map(|pid| format!(", held by pid {pid}"))
                    .unwrap_or_default();
                bail!(
                    "another gpushared already runs on {what} directory {} ({}: {e}{holder})",
                    dir.display(),
                    path.display()
                )
            }
        }
    }
}

/// How long a start waits for the instance lock of a previous gpushared to go.
const INSTANCE_LOCK_WAIT: Duration = Duration::from_secs(2);

fn absolute(p: &Path) -> Result<PathBuf> {
    std::path::absolute(p).with_context(|| format!("making {} absolute", p.display()))
}

/// Creates `dir` if missing, checks that only root controls it (not a symbolic link, no
/// foreign-owned directory or link on the way: see [`gpushare::fsutil::check_trusted_dir`]) and
/// resolves it to its real path. Mount points are compared with `/proc/self/mountinfo`, which
/// shows resolved paths, and the default CDI directory itself (`/var/run/cdi`) usually lies
/// behind the root-owned `/var/run` → `/run` link.
fn real_dir(what: &str, dir: &Path, mode: u32) -> Result<PathBuf> {
    let dir = absolute(dir)?;
    // Created without following a link that is not root's (a missing parent gets 0711).
    gpushare::fsutil::create_dir_if_missing(&dir, mode)
        .with_context(|| format!("creating {what} {}", dir.display()))?;
    gpushare::fsutil::check_trusted_dir(&dir)
        .with_context(|| format!("{what} {}", dir.display()))?;
    std::fs::canonicalize(&dir).with_context(|| format!("resolving {what} {}", dir.display()))
}

/// Resolves `socket.group`: a numeric gid as is, else a name from the group database.
fn resolve_group(group: &str) -> Result<u32> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        Ok(None) => bail!("socket.group: no group named {group:?} on this host"),
        Err(e) => bail!("socket.group: looking up group {group:?}: {e}"),
    }
}

/// Parses the command line and the config file, drops capabilities while the process has
/// one thread (they are per thread), then runs the daemon.
/// Caps glibc's malloc at two arenas. By default each thread that allocates gets its own arena
/// (up to eight per core), and the blocking pool's threads each kept the peak of a checkpoint
/// rebuild long after it was freed: at 1,000 claims the idle daemon's RSS was 46 MiB with the
/// default and 19 MiB with two arenas (bench/, "Footprint"). Its work is mostly waiting on
/// processes and disks, so fewer arenas cost nothing measurable.
fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes the allocator's tuning; it runs before any other thread
    // exists, and M_ARENA_MAX with a positive value is a documented, always-valid setting.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn start() -> Result<()> {
    let args = Args::parse();
    if args.print_default_config {
        print!("{DEFAULT_CONFIG}");
        return Ok(());
    }
    if let Some(dir) = &args.generate_man {
        let mut out = Vec::new();
        clap_mangen::Man::new(<Args as clap::CommandFactory>::command())
            .section("8")
            .render(&mut out)
            .context("rendering the man page")?;
        let path = dir.join("gpushared.8");
        std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
        return Ok(());
    }
    // Everything past here needs root (mounts, MPS control daemons that switch to their
    // clients' uids, device nodes, GPU settings, /run): say so once, before any of it fails
    // on its own with a message that hides why.
    let euid = nix::unistd::geteuid();
    if !euid.is_root() {
        bail!(
            "gpushared must run as root (this is uid {euid}): it mounts each MPS claim's /dev/shm, starts MPS control daemons as their clients' users and changes GPU settings; run it with sudo, or as the gpushared systemd service"
        );
    }
    let settings = args.settings()?;
    limit_malloc_arenas();
    let keep = privileges::kept(!settings.gpus.simulate.is_empty());
    let outcome = privileges::drop_to(&keep)?;
    run(args, settings, keep, outcome)
}

/// NVML unless a node profile is simulated, with the administrator's switches laid over it.
fn gpu_backend(gpus: &GpusConfig, node_name: &str, run_dir: &Path) -> Result<Arc<dyn GpuBackend>> {
    let inner: Arc<dyn GpuBackend> = if gpus.simulate.is_empty() {
        let nvml = NvmlLib::init().map_err(|e| {
            anyhow::anyhow!("{e}; is the NVIDIA driver installed? Without GPUs, run with --simulate <node profile> (e.g. p4d.24xlarge)")
        })?;
        let smi = if gpus.nvidia_smi.as_os_str().is_empty() {
            NvidiaSmi::default_program()
        } else {
            gpus.nvidia_smi.clone()
        };
        let smi = NvidiaSmi::new(
            smi,
            Arc::new(HostRunner),
            Duration::from_secs(gpus.nvidia_smi_timeout_seconds),
        );
        Arc::new(HostBackend::new(Arc::new(nvml), smi, Path::new("/dev")))
    } else {
        let profile = &gpus.simulate;
        let dev_root = if gpus.sim_dev_root.as_os_str().is_empty() {
            run_dir.join("simulated-dev")
        } else {
            gpus.sim_dev_root.clone()
        };
        Arc::new(
            SimulatedBackend::new(profile, node_name, &dev_root)
                .with_context(|| format!("setting up simulated node {profile}"))?,
        )
    };
    Ok(Arc::new(ManagedSettings::new(
        inner,
        gpus.manage_compute_mode,
        gpus.manage_time_slice,
    )))
}

/// The driver's CDI spec (`[cdi]`): NVIDIA's `nvidia-ctk cdi generate` on a real node; on a
/// simulated one the simulated generator over the simulated GPUs and driver root, unless
/// `[cdi] nvidia_ctk` names a program to run instead. `None` for `driver_spec = "none"`.
fn driver_specs(
    settings: &DaemonConfig,
    backend: &Arc<dyn GpuBackend>,
    run_dir: &Path,
    cdi_dir: &Path,
) -> Result<Option<Arc<DriverSpecs>>> {
    if settings.cdi.driver_spec == DriverSpecMode::None {
        tracing::info!(
            "[cdi] driver_spec = \"none\": claims' containers get no driver files from gpushare"
        );
        return Ok(None);
    }
    let generator: Arc<dyn SpecGenerator> =
        if !settings.gpus.simulate.is_empty() && settings.cdi.nvidia_ctk.as_os_str().is_empty() {
            let root = if settings.gpus.sim_driver_root.as_os_str().is_empty() {
                run_dir.join("simulated-driver")
            } else {
                absolute(&settings.gpus.sim_driver_root)?
            };
            Arc::new(SimulatedToolkit::new(Arc::clone(backend), &root))
        } else {
            Arc::new(NvidiaCtk::new(
                &settings.cdi.nvidia_ctk,
                &settings.cdi.driver_root,
                Arc::new(HostRunner),
                Duration::from_secs(settings.cdi.generate_timeout_seconds),
            ))
        };
    let specs = DriverSpecs::new(
        generator,
        &settings.cdi.driver_kind,
        cdi_dir,
        &run_dir.join("driver-spec"),
    )
    .map_err(anyhow::Error::msg)?;
    Ok(Some(Arc::new(specs)))
}

fn main() -> std::process::ExitCode {
    match start() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line for the journal, whatever RUST_BACKTRACE says.
            eprintln!("gpushared: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

type FilterHandle =
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>;

/// Logging: one line per event on stderr. Under systemd (`JOURNAL_STREAM` set) the journal
/// stamps each line itself, so no timestamp and no colour. `RUST_LOG` wins over `[log] level`;
/// the returned handle changes the filter on reload.
fn init_logging(level: &str) -> Result<Option<FilterHandle>> {
    use tracing_subscriber::prelude::*;
    let from_env = std::env::var_os("RUST_LOG").is_some();
    let filter = if from_env {
        tracing_subscriber::EnvFilter::try_from_default_env().context("RUST_LOG")?
    } else {
        tracing_subscriber::EnvFilter::try_new(level).context("log.level")?
    };
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(!journal && std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let registry = tracing_subscriber::registry().with(filter);
    if journal {
        registry.with(fmt.without_time()).init();
    } else {
        registry.with(fmt).init();
    }
    Ok((!from_env).then_some(handle))
}

/// The metrics endpoint, when enabled: bound now (a bad address fails start-up), served by a
/// task that stops when the returned handle is aborted.
async fn start_metrics(
    settings: &DaemonConfig,
    registry: &Arc<prometheus_client::registry::Registry>,
) -> Result<Option<(String, tokio::task::JoinHandle<()>)>> {
    if !settings.metrics.enabled {
        return Ok(None);
    }
    let addr: std::net::SocketAddr = settings
        .metrics
        .address
        .parse()
        .with_context(|| format!("metrics.address {:?}", settings.metrics.address))?;
    let listener = metrics::bind(addr)
        .await
        .with_context(|| format!("binding the metrics endpoint {addr}"))?;
    let bound = listener.local_addr().map_or(addr, |a| a);
    tracing::info!(address = %bound, "serving metrics at /metrics");
    let task = tokio::spawn(metrics::serve(listener, Arc::clone(registry)));
    Ok(Some((settings.metrics.address.clone(), task)))
}

/// Keys whose change a reload cannot apply (they take effect at the next restart).
fn restart_only_changes(old: &DaemonConfig, new: &DaemonConfig) -> Vec<&'static str> {
    let mut changed = Vec::new();
    let mut check = |key: &'static str, differs: bool| {
        if differs {
            changed.push(key);
        }
    };
    check("[paths]", old.paths != new.paths);
    check("[node]", old.node != new.node);
    check("[socket]", old.socket != new.socket);
    check("[mps]", old.mps != new.mps);
    check("[hook]", old.hook != new.hook);
    check("[cdi]", old.cdi != new.cdi);
    check("[gpus]", old.gpus != new.gpus);
    check(
        "metrics.allow_non_loopback",
        old.metrics.allow_non_loopback != new.metrics.allow_non_loopback,
    );
    changed
}

struct Running {
    settings: DaemonConfig,
    filter: Option<FilterHandle>,
    metrics: Option<(String, tokio::task::JoinHandle<()>)>,
    registry: Arc<prometheus_client::registry::Registry>,
}

impl Running {
    /// SIGHUP: re-reads the config file (with the command line laid over it again) and applies
    /// `[log] level` and `[metrics]`; a bad file is refused and nothing changes.
    async fn reload(&mut self, args: &Args) {
        notify::reloading();
        let new = match args.settings() {
            Ok(new) => new,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "reload refused: the config file has an error; keeping the running configuration");
                notify::ready("reload refused: config file error (see the journal); serving");
                return;
            }
        };
        let waiting = restart_only_changes(&self.settings, &new);
        if !waiting.is_empty() {
            tracing::warn!(keys = %waiting.join(", "), "changed keys take effect at the next restart");
        }
        if new.log.level != self.settings.log.level {
            match (
                &self.filter,
                tracing_subscriber::EnvFilter::try_new(&new.log.level),
            ) {
                (Some(handle), Ok(filter)) => match handle.reload(filter) {
                    Ok(()) => tracing::info!(level = %new.log.level, "log level changed"),
                    Err(e) => tracing::error!(error = %e, "changing the log level failed"),
                },
                (None, _) => tracing::warn!("RUST_LOG is set: log.level is ignored"),
                (Some(_), Err(e)) => tracing::error!(error = %e, "log.level refused"),
            }
        }
        // Also retried when it is wanted but not served (its port was taken at start).
        if new.metrics.enabled != self.settings.metrics.enabled
            || new.metrics.address != self.settings.metrics.address
            || (new.metrics.enabled && self.metrics.is_none())
        {
            // The old endpoint goes first: the new one may want the same port.
            if let Some((_, task)) = self.metrics.take() {
                task.abort();
                let _ = task.await;
            }
            match start_metrics(&new, &self.registry).await {
                Ok(m) => {
                    if m.is_none() {
                        tracing::info!("metrics endpoint turned off");
                    }
                    self.metrics = m;
                }
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "metrics endpoint not served after reload")
                }
            }
        }
        // What a reload did not apply stays as it was, so the next reload compares with it.
        let mut applied = self.settings.clone();
        applied.log = new.log;
        applied.metrics.enabled = new.metrics.enabled;
        applied.metrics.address = new.metrics.address;
        self.settings = applied;
        tracing::info!("configuration reloaded");
        notify::ready("serving (configuration reloaded)");
    }
}

#[tokio::main]
async fn run(
    args: Args,
    settings: DaemonConfig,
    kept: Vec<caps::Capability>,
    privileges: privileges::Outcome,
) -> Result<()> {
    let filter = init_logging(&settings.log.level)?;
    let capabilities = kept
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",");
    if privileges == privileges::Outcome::NoSetpcap {
        tracing::warn!(
            kept = %capabilities,
            "no CAP_SETPCAP: effective and permitted capabilities reduced, the bounding set left as the service manager set it"
        );
    }

    // MPS control daemons double-fork away from us; as a subreaper we get them back as
    // children, learn of their exit, and reap them (PID 1 here may not).
    nix::sys::prctl::set_child_subreaper(true).context("becoming a child subreaper")?;
    let node_name = match settings.node.name.as_str() {
        "" => nix::unistd::gethostname()
            .context("reading the host name (pass --node-name)")?
            .to_string_lossy()
            .into_owned(),
        name => name.to_string(),
    };
    let run_dir = real_dir("run directory", &settings.paths.run_dir, 0o755)?;
    let state_dir = real_dir("state directory", &settings.paths.state_dir, 0o700)?;
    let cdi_dir = real_dir("CDI directory", &settings.paths.cdi_dir, 0o755)?;
    gpushare::daemon_config::check_layout(&run_dir, &state_dir, &cdi_dir)
        .map_err(anyhow::Error::msg)?;
    // Two daemons on one state directory would each believe they own every claim; two on one
    // run directory would each remove the other's claim directories as orphans at start.
    // One directory serving as both is locked once (a second descriptor of the lock file,
    // closed, would drop the process's lock).
    let _instance = lock_instance(&state_dir, "state")?;
    let _run = if run_dir == state_dir {
        None
    } else {
        Some(lock_instance(&run_dir, "run")?)
    };
    let backend = gpu_backend(&settings.gpus, &node_name, &run_dir)?;
    let cdi_dir = real_dir("CDI directory", &settings.paths.cdi_dir, 0o755)?;
    let driver_spec = driver_specs(&settings, &backend, &run_dir, &cdi_dir)?;

    let mps_program = if settings.mps.control.as_os_str().is_empty() {
        default_mps_control()?
    } else {
        absolute(&settings.mps.control)?
    };
    let executable = std::fs::metadata(&mps_program)
        .map(|m| {
            m.is_file() && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0
        })
        .unwrap_or(false);
    if !executable {
        bail!(
            "MPS control program {} is not an executable file",
            mps_program.display()
        );
    }
    let hook_path = if settings.hook.path.as_os_str().is_empty() {
        beside_exe("gpushare-cdi-hook")?
    } else {
        absolute(&settings.hook.path)?
    };
    let socket = absolute(&settings.paths.socket)?;
    let mps = MpsControl::new(
        mps_program.clone(),
        HostOps::host(),
        Duration::from_secs(settings.mps.timeout_seconds),
    );
    let cfg = ServiceConfig {
        node_name: node_name.clone(),
        drivers: settings.node.drivers.clone(),
        run_dir,
        cdi_dir,
        checkpoint: state_dir.join("checkpoint.json"),
        hook: HookConfig {
            path: hook_path,
            socket: socket.clone(),
            timeout_secs: settings.hook.timeout_seconds,
        },
        shm_bytes: (settings.mps.shm_size_mib > 0).then_some(settings.mps.shm_size_mib << 20),
        driver_spec,
    };
    let boot_id_file = args
        .boot_id_file
        .clone()
        .unwrap_or_else(|| PathBuf::from(gpushare::service::BOOT_ID_PATH));
    let boot_id = std::fs::read_to_string(&boot_id_file)
        .map(|s| s.trim().to_string())
        .with_context(|| format!("reading the boot ID from {}", boot_id_file.display()))?;
    // Before the reconcile: the `-d` parents of MPS control daemons it starts again exit
    // meanwhile and become our children (a child subreaper); their SIGCHLD, had it come
    // before this stream existed, would be lost and they would stay zombies.
    let mut sigchld = signal(SignalKind::child())?;
    // Reconciles the host with the checkpoint (re-adoption, restarts, rollbacks, orphans)
    // before the socket exists: nobody is served from a half-known state.
    let service = Arc::new(
        Service::with_boot_id(cfg, backend.clone(), mps, boot_id)
            .map_err(|e| anyhow::anyhow!(e))?,
    );
    gpushare::supervise::spawn(Arc::clone(&service))
        .context("starting the MPS control daemon supervisor")?;
    let requests = Arc::new(metrics::RequestMetrics::default());
    let registry = Arc::new(metrics::registry(
        &requests,
        metrics::ServiceCollector::new(Arc::clone(&service), Arc::new(metrics::pid_alive)),
    ));
    let server_cfg = Arc::new(ServerConfig {
        socket: socket.clone(),
        mode: parse_mode(&settings.socket.mode).map_err(anyhow::Error::msg)?,
        group: resolve_group(&settings.socket.group)?,
        changing_uids: settings.socket.changing_uids.clone(),
        max_connections: settings.socket.max_connections,
        reserved_connections: settings.socket.reserved_connections,
        max_connections_per_uid: settings.socket.max_connections_per_uid,
        first_request_timeout: Duration::from_secs(settings.socket.first_request_timeout_seconds),
        idle_timeout: Duration::from_secs(settings.socket.idle_timeout_seconds),
        request_timeout: Duration::from_secs(settings.socket.request_timeout_seconds),
        metrics: Some(Arc::clone(&requests)),
    });
    let listener = server::bind(&server_cfg)
        .with_context(|| format!("binding socket {}", socket.display()))?;
    // Metrics are for watching the node, not part of serving it: a port taken by another
    // process is an error in the journal, never a node without GPU sharing.
    let metrics_task = match start_metrics(&settings, &registry).await {
        Ok(m) => m,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "metrics endpoint not served; fix [metrics] and reload");
            None
        }
    };
    tracing::info!(
        socket = %socket.display(),
        node = %node_name,
        backend = %backend.describe(),
        mps_control = %mps_program.display(),
        %capabilities,
        "gpushared ready"
    );
    // Service::with_boot_id has loaded the checkpoint and reconciled the host with it
    // (re-adoption, restarts, rollbacks, orphans, the MIG sweep), and the socket is bound:
    // clients that systemd lets start after us are served from here on.
    let health = service.health();
    notify::ready(&format!(
        "serving {} claims on {} GPUs",
        health.claims, health.gpus
    ));
    let watchdog = notify::watchdog_interval().map(|every| {
        tracing::info!(
            every_ms = every.as_millis() as u64,
            "pinging the systemd watchdog"
        );
        tokio::spawn(watchdog_loop(Arc::clone(&service), every))
    });
    let mut running = Running {
        settings,
        filter,
        metrics: metrics_task,
        registry,
    };
    let mut sighup = signal(SignalKind::hangup())?;

    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    // Boxed, not pinned on the stack, so that dropping it at SIGTERM closes the listener.
    let mut serving = Box::pin(server::serve(listener, Arc::clone(&service), server_cfg));
    let result = loop {
        tokio::select! {
            r = &mut serving => break r.context("serving"),
            _ = sigchld.recv() => {
                let reaped = tokio::task::spawn_blocking(reap_orphans).await.unwrap_or_default();
                if !reaped.is_empty() {
                    tracing::debug!(?reaped, "reaped exited children");
                }
            }
            _ = sighup.recv() => running.reload(&args).await,
            _ = sigterm.recv() => break Ok(()),
            _ = sigint.recv() => break Ok(()),
        }
    };
    notify::stopping();
    if let Some(w) = watchdog {
        w.abort();
    }
    if let Some((_, m)) = running.metrics.take() {
        m.abort();
    }
    // Stop accepting first (the listener is dropped with `serving`), then let requests under
    // way finish, bounded, and write the checkpoint. MPS control daemons are left running on
    // purpose: GPU jobs must survive a restart of gpushared.
    drop(serving);
    server::remove_socket(&socket);
    let bound = Duration::from_secs(args.stop_timeout);
    let stopping = Arc::clone(&service);
    let stopped = tokio::task::spawn_blocking(move || stopping.stop(bound))
        .await
        .context("stopping the service")?;
    match stopped {
        Ok(true) => tracing::info!("{}", stopped_line(&service)),
        Ok(false) => {
            tracing::warn!(
                "gpushared stopped with requests still under way; the next start reconciles them"
            );
            // The runtime would wait for them without a bound when dropped.
            server::remove_socket(&socket);
            std::process::exit(0);
        }
        Err(e) => tracing::error!(error = %e, "writing the checkpoint at stop"),
    }
    result
}

/// The last log line of a clean stop: how many MPS control daemons stay behind on purpose.
fn stopped_line(service: &Service) -> String {
    let left = service
        .list_claims()
        .iter()
        .flat_map(|c| &c.groups)
        .filter(|g| {
            matches!(&g.sharing, gpushare_proto::StrategyInfo::Mps(m) if m.control_daemon_pid > 0)
        })
        .count();
    match left {
        0 => "gpushared stopped".to_string(),
        1 => "gpushared stopped; 1 MPS control daemon left running for its claim (the next start re-adopts it)".to_string(),
        n => format!("gpushared stopped; {n} MPS control daemons left running for their claims (the next start re-adopts them)"),
    }
}

/// Pings the watchdog only while the path that changes take answers: a probe that takes the
/// claim registry's lock ([`gpushare::service::registry_answers`]), bounded by the ping
/// interval. A registry wedged by a stuck change stops the pings and systemd restarts the
/// daemon (the MPS control daemons stay: `KillMode=process`). `health` alone would not do:
/// it reads the published view and answers whatever the registry does.
async fn watchdog_loop(service: Arc<Service>, every: Duration) {
    loop {
        let probe = Arc::clone(&service);
        let answered =
            tokio::task::spawn_blocking(move || gpushare::service::registry_answers(&probe, every))
                .await;
        match answered {
            Ok(true) => notify::watchdog(),
            _ => tracing::error!(
                "the claim registry did not answer in time; not pinging the watchdog"
            ),
        }
        tokio::time::sleep(every).await;
    }
}
