//! `gpushared`'s own configuration file (`/etc/gpushare/config.toml`), pure.
//!
//! Every key is optional; a missing key takes the default shown by
//! `gpushared --print-default-config`, which prints [`DEFAULT_CONFIG`]. Unknown keys are
//! refused with their name, so a typo never silently falls back to a default. Command-line
//! flags override the file.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Where `gpushared` looks for its configuration when `--config` is not given. A missing file
/// at this path means "all defaults"; a missing file named by `--config` is an error.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/gpushare/config.toml";

/// The documented default configuration, exactly what [`DaemonConfig::default`] holds (a test
/// keeps the two equal). Shipped as `/etc/gpushare/config.toml`.
pub const DEFAULT_CONFIG: &str = include_str!("../../packaging/config.toml");

/// Why the configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum DaemonConfigError {
    /// The file could not be read.
    #[error("reading {path}: {error}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What failed.
        error: std::io::Error,
    },
    /// The file is not valid TOML, has an unknown key, or a value of the wrong type.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The TOML library's message, naming the key and line.
        message: String,
    },
    /// A value has the right type but is out of range.
    #[error("{path}: {key}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The dotted key, e.g. `mps.timeout_seconds`.
        key: &'static str,
        /// What is wrong with it.
        message: String,
    },
}

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DaemonConfig {
    /// Where things live.
    pub paths: PathsConfig,
    /// Which node and drivers are served.
    pub node: NodeConfig,
    /// The socket's access rules.
    pub socket: SocketConfig,
    /// MPS control daemons.
    pub mps: MpsConfig,
    /// The OCI hook named in claims' CDI specs.
    pub hook: HookSettings,
    /// GPU backend and GPU-wide settings.
    pub gpus: GpusConfig,
    /// The NVIDIA driver's user-space in claims' containers (the driver's CDI spec).
    pub cdi: CdiConfig,
    /// The Prometheus metrics endpoint.
    pub metrics: MetricsConfig,
    /// Logging.
    pub log: LogConfig,
}

/// Where claims' containers get the NVIDIA driver's user-space (`[cdi] driver_spec`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriverSpecMode {
    /// gpushared runs NVIDIA's `nvidia-ctk cdi generate` (the simulated generator under
    /// `--simulate`) into its CDI directory, and every prepared device gets the driver's CDI
    /// device before the claim's.
    #[default]
    Toolkit,
    /// No driver spec: claims' containers get only the claim's device nodes, MPS edits and
    /// hooks; their images must bring a user-space matching the host's kernel module.
    None,
}

/// `[cdi]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CdiConfig {
    /// `toolkit` (default) or `none`.
    pub driver_spec: DriverSpecMode,
    /// The driver's root filesystem, passed to `nvidia-ctk cdi generate --driver-root`: `/`
    /// for a driver installed on the host (EKS AL2023 NVIDIA AMIs), the driver container's
    /// root where the GPU Operator runs it (`/run/nvidia/driver`).
    pub driver_root: PathBuf,
    /// `nvidia-ctk` to run; empty means the first of [`crate::driver_spec::NVIDIA_CTK_DIRS`]
    /// that has it. With `--simulate`, naming one runs it instead of the simulated generator.
    pub nvidia_ctk: PathBuf,
    /// The CDI kind (`vendor/class`) of the generated spec: our own, so that it never
    /// collides with the toolkit's `nvidia.com/gpu` spec in the same directory.
    pub driver_kind: String,
    /// Seconds one generation may take before it is killed and counts as failed.
    pub generate_timeout_seconds: u64,
}

impl Default for CdiConfig {
    fn default() -> Self {
        CdiConfig {
            driver_spec: DriverSpecMode::Toolkit,
            driver_root: PathBuf::from("/"),
            nvidia_ctk: PathBuf::new(),
            driver_kind: crate::driver_spec::DEFAULT_KIND.to_string(),
            generate_timeout_seconds: 60,
        }
    }
}

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Serve `/metrics` at all.
    pub enabled: bool,
    /// `host:port` to listen on for `GET /metrics`; a loopback address unless
    /// `allow_non_loopback` is set, since the endpoint has no authentication.
    pub address: String,
    /// Allow a non-loopback `address` (for a Prometheus that scrapes the node's IP).
    pub allow_non_loopback: bool,
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// A `tracing` filter: a level (`error`, `warn`, `info`, `debug`, `trace`) or directives
    /// such as `info,gpushare::server=debug`. `RUST_LOG`, when set, takes precedence.
    pub level: String,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            enabled: true,
            address: DEFAULT_METRICS_ADDRESS.to_string(),
            allow_non_loopback: false,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: "info".to_string(),
        }
    }
}

/// Default `[metrics] address`: loopback only, a port in the exporters' 9xxx range that
/// neither node-exporter (9100) nor DCGM-exporter (9400) uses.
pub const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:9471";

/// `[paths]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PathsConfig {
    /// Unix socket the DRA driver, the hook and the CLI talk to.
    pub socket: PathBuf,
    /// Directory of the checkpoint and the single-instance lock.
    pub state_dir: PathBuf,
    /// Runtime directory; per-claim MPS pipe, log and shm directories live under `claims/`.
    pub run_dir: PathBuf,
    /// CDI spec directory claims' specs are written to.
    pub cdi_dir: PathBuf,
}

/// `[node]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Pool name allocation results must carry; empty means the host name.
    pub name: String,
    /// DRA driver names served.
    pub drivers: Vec<String>,
}

/// `[socket]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SocketConfig {
    /// Socket file mode, as an octal string (`"0660"`).
    pub mode: String,
    /// Socket file's group, a name or a numeric gid; its members may call reading methods
    /// (`list_claims`, `list_gpus`, `get_claim`, `health`, `version`).
    pub group: String,
    /// Uids besides 0 allowed to call changing methods (prepare, unprepare, attach, detach).
    pub changing_uids: Vec<u32>,
    /// Most connections served at once; one more is answered `Busy` ("retry later") and
    /// closed.
    pub max_connections: usize,
    /// Of `max_connections`, how many only root and `changing_uids` may take: readers
    /// holding connections never lock out the kubelet plugin's prepare or the hook's attach.
    /// Less than `max_connections`.
    pub reserved_connections: usize,
    /// Most connections one uid that is neither root nor in `changing_uids` (a member of
    /// `group`, say) may hold at once; one more is answered `Busy` and closed. At least 1.
    pub max_connections_per_uid: usize,
    /// Seconds a new connection may take to send its first complete request line before it
    /// is closed (then `idle_timeout_seconds` applies). At least 1.
    pub first_request_timeout_seconds: u64,
    /// Seconds a connection may take to send a complete request line before it is closed.
    pub idle_timeout_seconds: u64,
    /// Seconds a client waits for one request's work before it is answered `Internal` (the
    /// work goes on in the background).
    pub request_timeout_seconds: u64,
}

/// `[mps]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MpsConfig {
    /// MPS control program; empty means `nvidia-cuda-mps-control` from `PATH`, else the
    /// `gpushare-mps-control` emulator beside `gpushared`.
    pub control: PathBuf,
    /// Seconds any run of the control program, and any wait for a daemon to quit, may take.
    pub timeout_seconds: u64,
    /// Size of each MPS claim's `/dev/shm` tmpfs in MiB; 0 means half the host's memory.
    pub shm_size_mib: u64,
}

/// `[hook]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HookSettings {
    /// `gpushare-cdi-hook` named in CDI specs; empty means beside `gpushared`.
    pub path: PathBuf,
    /// Seconds the hook waits for the daemon.
    pub timeout_seconds: u32,
}

/// `[gpus]`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GpusConfig {
    /// Simulate this node instead of using NVML: a catalog name (e.g. `p4d.24xlarge`) or a
    /// node-profile file (a value containing `/`; `docs/node-profiles.md`); empty means real
    /// GPUs.
    pub simulate: String,
    /// Where simulated GPU device nodes are created; empty means `<run_dir>/simulated-dev`.
    pub sim_dev_root: PathBuf,
    /// The simulated driver root (fake driver libraries, `nvidia-smi`, firmware) the
    /// simulated generator writes and its spec mounts; empty means
    /// `<run_dir>/simulated-driver`.
    pub sim_driver_root: PathBuf,
    /// Whether gpushare sets compute mode (EXCLUSIVE_PROCESS under MPS claims, DEFAULT after
    /// the last); `false` leaves it to the host's administrators.
    pub manage_compute_mode: bool,
    /// Whether gpushare sets time-slice intervals; `false` leaves them to the administrators.
    pub manage_time_slice: bool,
    /// `nvidia-smi` used for time-slice intervals; empty means the first of `/usr/bin`,
    /// `/usr/sbin`, `/bin`, `/opt/bin` that has it.
    pub nvidia_smi: PathBuf,
    /// Seconds one `nvidia-smi` run may take before it is killed and the change fails.
    pub nvidia_smi_timeout_seconds: u64,
}

impl Default for GpusConfig {
    fn default() -> Self {
        GpusConfig {
            simulate: String::new(),
            sim_dev_root: PathBuf::new(),
            sim_driver_root: PathBuf::new(),
            manage_compute_mode: true,
            manage_time_slice: true,
            nvidia_smi: PathBuf::new(),
            nvidia_smi_timeout_seconds: 30,
        }
    }
}

impl Default for PathsConfig {
    fn default() -> Self {
        PathsConfig {
            socket: PathBuf::from(gpushare_proto::DEFAULT_SOCKET),
            state_dir: PathBuf::from("/var/lib/gpushare"),
            run_dir: PathBuf::from("/run/gpushare"),
            cdi_dir: PathBuf::from("/var/run/cdi"),
        }
    }
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            name: String::new(),
            drivers: vec!["gpu.nvidia.com".to_string()],
        }
    }
}

impl Default for SocketConfig {
    fn default() -> Self {
        SocketConfig {
            mode: "0660".to_string(),
            group: "root".to_string(),
            changing_uids: Vec::new(),
            max_connections: 256,
            reserved_connections: 64,
            max_connections_per_uid: 16,
            first_request_timeout_seconds: 5,
            idle_timeout_seconds: 60,
            request_timeout_seconds: 120,
        }
    }
}

impl Default for MpsConfig {
    fn default() -> Self {
        MpsConfig {
            control: PathBuf::new(),
            timeout_seconds: 10,
            shm_size_mib: 0,
        }
    }
}

impl Default for HookSettings {
    fn default() -> Self {
        HookSettings {
            path: PathBuf::new(),
            timeout_seconds: 10,
        }
    }
}

/// Parses an octal file mode such as `"0660"` or `"660"`.
///
/// # Errors
/// Not octal digits, or bits beyond `0o7777`.
pub fn parse_mode(s: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(s, 8).map_err(|e| format!("{s:?} is not an octal mode: {e}"))?;
    if mode > 0o7777 {
        return Err(format!("{s:?} has bits beyond 07777"));
    }
    Ok(mode)
}

/// Checks `[metrics] address`: `host:port` with a numeric host, loopback unless
/// `allow_non_loopback`.
///
/// # Errors
/// The message says what is wrong.
pub fn check_metrics_address(m: &MetricsConfig) -> Result<std::net::SocketAddr, String> {
    let addr: std::net::SocketAddr = m
        .address
        .parse()
        .map_err(|e| format!("{:?} is not host:port: {e}", m.address))?;
    if !addr.ip().is_loopback() && !m.allow_non_loopback {
        return Err(format!(
            "{addr} is not a loopback address; set metrics.allow_non_loopback = true to serve it"
        ));
    }
    Ok(addr)
}

/// Checks how the run, state and CDI directories (resolved, real paths) sit together.
/// The run and state directories may be one directory (a hand-run daemon in one place): the
/// run directory's files (`claims/`, `mig-layout.json`, `simulated-dev/`) and the state
/// directory's (`checkpoint.json`) do not collide, and the single-instance lock is taken once.
///
/// # Errors
/// One line naming the directories and why they cannot be so: the CDI directory is the run or
/// state directory (container runtimes read every `.json` and `.yaml` file in a CDI directory
/// as a spec, and gpushared's own files would break them), or the state or CDI directory lies
/// in the run directory's `claims/` (whose entries no claim owns are removed at start).
pub fn check_layout(run: &Path, state: &Path, cdi: &Path) -> Result<(), String> {
    for (dir, which) in [(run, "run directory"), (state, "state directory")] {
        if cdi == dir {
            return Err(format!(
                "the CDI directory {} is also the {which}: container runtimes read every .json and .yaml file in a CDI directory as a CDI spec, and gpushared's own files there (checkpoint.json, mig-layout.json) would break them; give --cdi-dir (paths.cdi_dir) a directory of its own",
                cdi.display()
            ));
        }
    }
    let claims = run.join("claims");
    for (dir, which, flag) in [
        (state, "state directory", "--state-dir (paths.state_dir)"),
        (cdi, "CDI directory", "--cdi-dir (paths.cdi_dir)"),
    ] {
        if dir.starts_with(&claims) {
            return Err(format!(
                "the {which} {} lies in {}, where gpushared removes at start what no claim owns; move {flag} out of it",
                dir.display(),
                claims.display()
            ));
        }
    }
    Ok(())
}

impl DaemonConfig {
    /// Parses the file's text; `path` only names it in errors.
    ///
    /// # Errors
    /// [`DaemonConfigError::Parse`] for bad TOML, unknown keys (named) and wrong types;
    /// [`DaemonConfigError::Invalid`] for values out of range.
    pub fn parse(text: &str, path: &Path) -> Result<DaemonConfig, DaemonConfigError> {
        let cfg: DaemonConfig = toml::from_str(text).map_err(|e| DaemonConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().replace('\n', " "),
        })?;
        cfg.validate(path)?;
        Ok(cfg)
    }

    /// Reads `path`. With `required == false` a missing file gives the defaults.
    ///
    /// # Errors
    /// As [`DaemonConfig::parse`], plus [`DaemonConfigError::Read`].
    pub fn load(path: &Path, required: bool) -> Result<DaemonConfig, DaemonConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => DaemonConfig::parse(&text, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => {
                Ok(DaemonConfig::default())
            }
            Err(error) => Err(DaemonConfigError::Read {
                path: path.to_path_buf(),
                error,
            }),
        }
    }

    fn validate(&self, path: &Path) -> Result<(), DaemonConfigError> {
        let invalid = |key: &'static str, message: String| DaemonConfigError::Invalid {
            path: path.to_path_buf(),
            key,
            message,
        };
        parse_mode(&self.socket.mode).map_err(|m| invalid("socket.mode", m))?;
        if self.socket.group.is_empty() {
            return Err(invalid("socket.group", "must name a group or a gid".into()));
        }
        for (key, v) in [
            ("socket.max_connections", self.socket.max_connections as u64),
            (
                "socket.max_connections_per_uid",
                self.socket.max_connections_per_uid as u64,
            ),
            (
                "socket.first_request_timeout_seconds",
                self.socket.first_request_timeout_seconds,
            ),
            (
                "socket.idle_timeout_seconds",
                self.socket.idle_timeout_seconds,
            ),
            (
                "socket.request_timeout_seconds",
                self.socket.request_timeout_seconds,
            ),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be at least 1".into()));
            }
        }
        if self.socket.reserved_connections >= self.socket.max_connections {
            return Err(invalid(
                "socket.reserved_connections",
                format!(
                    "{} leaves no connection to readers: must be less than socket.max_connections ({})",
                    self.socket.reserved_connections, self.socket.max_connections
                ),
            ));
        }
        if self.mps.timeout_seconds == 0 {
            return Err(invalid("mps.timeout_seconds", "must be at least 1".into()));
        }
        if self.gpus.nvidia_smi_timeout_seconds == 0 {
            return Err(invalid(
                "gpus.nvidia_smi_timeout_seconds",
                "must be at least 1".into(),
            ));
        }
        if self.cdi.generate_timeout_seconds == 0 {
            return Err(invalid(
                "cdi.generate_timeout_seconds",
                "must be at least 1".into(),
            ));
        }
        if self.cdi.driver_root.as_os_str().is_empty() || !self.cdi.driver_root.is_absolute() {
            return Err(invalid(
                "cdi.driver_root",
                format!("{:?} is not an absolute path", self.cdi.driver_root),
            ));
        }
        crate::driver_spec::split_kind(&self.cdi.driver_kind)
            .map_err(|m| invalid("cdi.driver_kind", m))?;
        if self.cdi.driver_kind == gpushare_proto::CDI_KIND {
            return Err(invalid(
                "cdi.driver_kind",
                format!("{:?} is the kind of claims' specs", self.cdi.driver_kind),
            ));
        }
        if self.hook.timeout_seconds == 0 {
            return Err(invalid("hook.timeout_seconds", "must be at least 1".into()));
        }
        if self.node.drivers.is_empty() || self.node.drivers.iter().any(|d| d.is_empty()) {
            return Err(invalid(
                "node.drivers",
                "must name at least one driver, none empty".into(),
            ));
        }
        check_metrics_address(&self.metrics).map_err(|m| invalid("metrics.address", m))?;
        tracing_subscriber::EnvFilter::try_new(&self.log.level)
            .map_err(|e| invalid("log.level", format!("{:?}: {e}", self.log.level)))?;
        for (key, p) in [
            ("paths.socket", &self.paths.socket),
            ("paths.state_dir", &self.paths.state_dir),
            ("paths.run_dir", &self.paths.run_dir),
            ("paths.cdi_dir", &self.paths.cdi_dir),
        ] {
            if p.as_os_str().is_empty() {
                return Err(invalid(key, "must not be empty".into()));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "daemon_config_tests.rs"]
mod tests;
