//! `gpushared`'s command line, and the config file with those flags laid over it (what both a
//! start and a reload read).

use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::Parser;

use gpushare::daemon_config::{parse_mode, DaemonConfig, DEFAULT_CONFIG_PATH};

// The first line is the man page's NAME ("gpushared - <it>"): it does not start with the name.
/// The node's GPU sharing daemon: per-claim MPS control daemons, time-slicing and exclusive
/// GPUs for Kubernetes DRA claims, with one CDI spec per claim.
///
/// Settings come from the config file (default /etc/gpushare/config.toml; see
/// --print-default-config); each flag below overrides its key.
#[derive(Debug, Parser)]
#[command(name = "gpushared", version)]
pub(crate) struct Args {
    /// Config file (TOML). Without this flag /etc/gpushare/config.toml is read when it exists.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the documented default config file and exit.
    #[arg(long)]
    pub(crate) print_default_config: bool,
    /// Write the man page gpushared.8 into this directory and exit (for packaging).
    #[arg(long, value_name = "DIR", hide = true)]
    pub(crate) generate_man: Option<PathBuf>,
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
    pub(crate) boot_id_file: Option<PathBuf>,
    /// Longest wait, in seconds, for prepares and unprepares under way when SIGTERM arrives.
    #[arg(long, default_value_t = STOP_BOUND_SECS, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) stop_timeout: u64,
}

/// Default bound of a graceful stop: a prepare's slowest step (an MPS control program run and
/// a bounded quit) is far shorter, and systemd's default stop timeout (90 s) is longer.
const STOP_BOUND_SECS: u64 = 30;

impl Args {
    /// The config file with this command line's flags laid over it.
    pub(crate) fn settings(&self) -> Result<DaemonConfig> {
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
