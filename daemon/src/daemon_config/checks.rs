//! The checks of the config file's values that TOML types cannot express (ranges, modes,
//! addresses, kinds), and of how the run, state and CDI directories sit together.

use std::path::Path;

use super::{DaemonConfig, DaemonConfigError, MetricsConfig};

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
/// run directory's files (`claims/`, `mig-intents.json`, `simulated-dev/`) and the state
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
                "the CDI directory {} is also the {which}: container runtimes read every .json and .yaml file in a CDI directory as a CDI spec, and gpushared's own files there (claim records, mig-intents.json) would break them; give --cdi-dir (paths.cdi_dir) a directory of its own",
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
    pub(super) fn validate(&self, path: &Path) -> Result<(), DaemonConfigError> {
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
