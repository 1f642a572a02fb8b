//! The tables of `gpushared`'s config file, each with its documented default (what
//! `packaging/config.toml` shows).

use std::path::PathBuf;

use serde::Deserialize;

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
    /// Seconds one generation may take before it is killed and counts as failed; below
    /// [`MAX_GENERATE_TIMEOUT_SECONDS`], since a prepare may wait on one.
    pub generate_timeout_seconds: u64,
}

impl Default for CdiConfig {
    fn default() -> Self {
        CdiConfig {
            driver_spec: DriverSpecMode::Toolkit,
            driver_root: PathBuf::from("/"),
            nvidia_ctk: PathBuf::new(),
            driver_kind: crate::driver_spec::DEFAULT_KIND.to_string(),
            generate_timeout_seconds: 15,
        }
    }
}

/// The DRA plugin's default bound on a whole prepare (`claim_timeout_seconds` in `dra.toml`):
/// a generation of the driver's CDI spec, which a prepare may wait on, must end well before it,
/// or the plugin gives up on the prepare and kubelet retries it while `nvidia-ctk` still runs.
pub const PLUGIN_CLAIM_TIMEOUT_SECONDS: u64 = 30;

/// The longest `[cdi] generate_timeout_seconds` allowed: 5 s of the plugin's default claim
/// timeout are left for the rest of a prepare.
pub const MAX_GENERATE_TIMEOUT_SECONDS: u64 = PLUGIN_CLAIM_TIMEOUT_SECONDS - 5;

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
