//! The checks of the config file's values that TOML types cannot express (ranges, modes,
//! addresses, kinds), and of how the run, state and CDI directories sit together.

use std::net::SocketAddr;
use std::num::ParseIntError;
use std::path::{Path, PathBuf};

use super::{DaemonConfig, DaemonConfigError, MetricsConfig};

/// Why a file mode is refused ([`parse_mode`]); the message quotes it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModeError {
    /// Not octal digits (or empty, or too large for a `u32`).
    #[error("{text:?} is not an octal mode: {source}")]
    NotOctal {
        /// The mode as written.
        text: String,
        /// Why it does not parse.
        #[source]
        source: ParseIntError,
    },
    /// Octal, but with bits beyond `0o7777`.
    #[error("{text:?} has bits beyond 07777")]
    BeyondPermissions {
        /// The mode as written.
        text: String,
    },
}

/// Parses an octal file mode such as `"0660"` or `"660"`.
///
/// # Errors
/// [`ModeError::NotOctal`] for what are not octal digits, [`ModeError::BeyondPermissions`]
/// for bits beyond `0o7777`.
pub fn parse_mode(s: &str) -> Result<u32, ModeError> {
    let mode = u32::from_str_radix(s, 8).map_err(|source| ModeError::NotOctal {
        text: s.to_string(),
        source,
    })?;
    if mode > 0o7777 {
        return Err(ModeError::BeyondPermissions {
            text: s.to_string(),
        });
    }
    Ok(mode)
}

/// Why `[metrics] address` is refused ([`check_metrics_address`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetricsAddressError {
    /// Not `host:port` with a numeric host.
    #[error("{address:?} is not host:port: {source}")]
    NotHostPort {
        /// The address as written.
        address: String,
        /// Why it does not parse.
        #[source]
        source: std::net::AddrParseError,
    },
    /// Not a loopback address, and `allow_non_loopback` is not set.
    #[error("{addr} is not a loopback address; set metrics.allow_non_loopback = true to serve it")]
    NotLoopback {
        /// The address.
        addr: SocketAddr,
    },
}

/// Checks `[metrics] address`: `host:port` with a numeric host, loopback unless
/// `allow_non_loopback`.
///
/// # Errors
/// [`MetricsAddressError`], saying what is wrong.
pub fn check_metrics_address(m: &MetricsConfig) -> Result<SocketAddr, MetricsAddressError> {
    let addr: SocketAddr =
        m.address
            .parse()
            .map_err(|source| MetricsAddressError::NotHostPort {
                address: m.address.clone(),
                source,
            })?;
    if !addr.ip().is_loopback() && !m.allow_non_loopback {
        return Err(MetricsAddressError::NotLoopback { addr });
    }
    Ok(addr)
}

/// Why the run, state and CDI directories cannot sit as they do ([`check_layout`]); one line
/// naming the directories, why, and the setting to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The CDI directory is the run or state directory: container runtimes read every
    /// `.json` and `.yaml` file in a CDI directory as a spec, and gpushared's own files would
    /// break them.
    #[error("the CDI directory {} is also the {which}: container runtimes read every .json and .yaml file in a CDI directory as a CDI spec, and gpushared's own files there (claim records, mig-intents.json) would break them; give --cdi-dir (paths.cdi_dir) a directory of its own", cdi.display())]
    CdiIsOurs {
        /// The CDI directory.
        cdi: PathBuf,
        /// Which of ours it is: `run directory` or `state directory`.
        which: &'static str,
    },
    /// The state or CDI directory lies in the run directory's `claims/`, whose entries no
    /// claim owns are removed at start.
    #[error("the {which} {} lies in {}, where gpushared removes at start what no claim owns; move {flag} out of it", dir.display(), claims.display())]
    InClaims {
        /// Which directory: `state directory` or `CDI directory`.
        which: &'static str,
        /// That directory.
        dir: PathBuf,
        /// The run directory's `claims/`.
        claims: PathBuf,
        /// The flag and key that set it, e.g. `--state-dir (paths.state_dir)`.
        flag: &'static str,
    },
}

/// Checks how the run, state and CDI directories (resolved, real paths) sit together.
/// The run and state directories may be one directory (a hand-run daemon in one place): the
/// run directory's files (`claims/`, `mig-intents.json`, `simulated-dev/`) and the state
/// directory's (`checkpoint.json`) do not collide, and the single-instance lock is taken once.
///
/// # Errors
/// [`LayoutError::CdiIsOurs`] when the CDI directory is the run or state directory,
/// [`LayoutError::InClaims`] when the state or CDI directory lies in the run directory's
/// `claims/`.
pub fn check_layout(run: &Path, state: &Path, cdi: &Path) -> Result<(), LayoutError> {
    for (dir, which) in [(run, "run directory"), (state, "state directory")] {
        if cdi == dir {
            return Err(LayoutError::CdiIsOurs {
                cdi: cdi.to_path_buf(),
                which,
            });
        }
    }
    let claims = run.join("claims");
    for (dir, which, flag) in [
        (state, "state directory", "--state-dir (paths.state_dir)"),
        (cdi, "CDI directory", "--cdi-dir (paths.cdi_dir)"),
    ] {
        if dir.starts_with(&claims) {
            return Err(LayoutError::InClaims {
                which,
                dir: dir.to_path_buf(),
                claims,
                flag,
            });
        }
    }
    Ok(())
}

impl DaemonConfig {
    pub(super) fn validate(&self, path: &Path) -> Result<(), DaemonConfigError> {
        let invalid = |key: &'static str, message: String| DaemonConfigError::Invalid {
            path: path.to_path_buf(),
            key,
            message,
        };
        parse_mode(&self.socket.mode).map_err(|e| invalid("socket.mode", e.to_string()))?;
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
        if self.cdi.generate_timeout_seconds > super::sections::MAX_GENERATE_TIMEOUT_SECONDS {
            return Err(invalid(
                "cdi.generate_timeout_seconds",
                format!(
                    "{} must be at most {}: a prepare may wait on a generation, and the DRA plugin gives a whole prepare {} s (claim_timeout_seconds in dra.toml); a longer one would be cut off and retried by kubelet while nvidia-ctk still runs",
                    self.cdi.generate_timeout_seconds,
                    super::sections::MAX_GENERATE_TIMEOUT_SECONDS,
                    super::sections::PLUGIN_CLAIM_TIMEOUT_SECONDS
                ),
            ));
        }
        if self.cdi.driver_root.as_os_str().is_empty() || !self.cdi.driver_root.is_absolute() {
            return Err(invalid(
                "cdi.driver_root",
                format!("{:?} is not an absolute path", self.cdi.driver_root),
            ));
        }
        crate::driver_spec::split_kind(&self.cdi.driver_kind)
            .map_err(|e| invalid("cdi.driver_kind", e.to_string()))?;
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
        check_metrics_address(&self.metrics)
            .map_err(|e| invalid("metrics.address", e.to_string()))?;
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
