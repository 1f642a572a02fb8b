//! `gpushared`'s own configuration file (`/etc/gpushare/config.toml`), pure.
//!
//! Every key is optional; a missing key takes the default shown by
//! `gpushared --print-default-config`, which prints [`DEFAULT_CONFIG`]. Unknown keys are
//! refused with their name, so a typo never silently falls back to a default. Command-line
//! flags override the file.
//!
//! Here: the whole file, its errors, and reading it; each table (`[paths]`, `[socket]`, …)
//! with its defaults is in `daemon_config/sections.rs`, the checks of values and of the
//! directories' layout in `daemon_config/checks.rs`.

mod checks;
mod sections;

use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use checks::{
    check_layout, check_metrics_address, parse_mode, LayoutError, MetricsAddressError, ModeError,
};
pub use sections::{
    CdiConfig, DriverSpecMode, GpusConfig, HookSettings, LogConfig, MetricsConfig, MpsConfig,
    NodeConfig, PathsConfig, SocketConfig, DEFAULT_METRICS_ADDRESS, MAX_GENERATE_TIMEOUT_SECONDS,
    PLUGIN_CLAIM_TIMEOUT_SECONDS,
};

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
}

#[cfg(test)]
#[path = "daemon_config_tests.rs"]
mod tests;
