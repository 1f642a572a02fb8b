//! `gpushare-dra`'s settings: the config file (`/etc/gpushare/dra.toml`; the documented
//! default is `packaging/dra.toml`) with the command-line flags laid over it. Pure: reading
//! the file is the caller's.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Where the config file is read from when `--config` is not given (a missing file there
/// means all defaults; a missing file named by `--config` is an error).
pub const DEFAULT_CONFIG_FILE: &str = "/etc/gpushare/dra.toml";
/// The documented default config file, printed by `--print-default-config`.
pub const DEFAULT_CONFIG_TEXT: &str = include_str!("../../packaging/dra.toml");
/// kubelet's kubeconfig on EKS AL2023 (written by nodeadm; uses an `exec` credential plugin).
pub const KUBELET_KUBECONFIG: &str = "/var/lib/kubelet/kubeconfig";

/// The config file, as written: every key optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// `driver_name`.
    pub driver_name: Option<String>,
    /// `node_name`.
    pub node_name: Option<String>,
    /// `kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `gpushared_socket`.
    pub gpushared_socket: Option<PathBuf>,
    /// `plugins_dir`.
    pub plugins_dir: Option<PathBuf>,
    /// `registry_dir`.
    pub registry_dir: Option<PathBuf>,
    /// `metrics_address`.
    pub metrics_address: Option<String>,
    /// `claim_timeout_seconds`.
    pub claim_timeout_seconds: Option<u64>,
    /// `device_health`.
    pub device_health: Option<bool>,
    /// `log_level`.
    pub log_level: Option<String>,
}

/// Why the settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file is not valid TOML or has a key we do not know.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: String,
        /// The parser's message (names the key and line).
        message: String,
    },
    /// A value is out of range.
    #[error("{key}: {message}")]
    Value {
        /// The key (or flag) at fault.
        key: &'static str,
        /// What is wrong with it.
        message: String,
    },
}

/// Parses the config file's text; `path` is only used in messages.
///
/// # Errors
/// [`ConfigError::File`] for bad TOML or an unknown key.
pub fn parse_file(text: &str, path: &Path) -> Result<FileConfig, ConfigError> {
    toml::from_str(text).map_err(|e| ConfigError::File {
        path: path.display().to_string(),
        message: e.to_string().trim().replace('\n', " "),
    })
}

/// The settings in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The DRA driver name served, e.g. `gpu.nvidia.com`.
    pub driver_name: String,
    /// The node (as kubelet names it: on EKS the EC2 private DNS name).
    pub node_name: String,
    /// The kubeconfig; `None` means the in-cluster service account when present, else
    /// [`KUBELET_KUBECONFIG`].
    pub kubeconfig: Option<PathBuf>,
    /// gpushared's socket.
    pub gpushared_socket: PathBuf,
    /// kubelet's plugins directory: the DRA socket is `<plugins_dir>/<driver>/dra.sock`.
    pub plugins_dir: PathBuf,
    /// kubelet's plugin registry directory: the registration socket is
    /// `<registry_dir>/<driver>-reg.sock`.
    pub registry_dir: PathBuf,
    /// Where `/metrics` and `/healthz` are served; `None` turns them off.
    pub metrics_address: Option<SocketAddr>,
    /// The most one claim's prepare or unprepare may take (below kubelet's 45 s call
    /// timeout, so kubelet sees the claim's own error instead of `DeadlineExceeded`).
    pub claim_timeout: Duration,
    /// Serve `v1alpha1.DRAResourceHealth` (kubelet's `ResourceHealthStatus` gate).
    pub device_health: bool,
    /// A `tracing` filter; `RUST_LOG` wins.
    pub log_level: String,
}

impl Config {
    /// The DRA socket kubelet dials: `<plugins_dir>/<driver>/dra.sock`.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugins_dir.join(&self.driver_name).join("dra.sock")
    }

    /// The registration socket kubelet watches for: `<registry_dir>/<driver>-reg.sock`.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir
            .join(format!("{}-reg.sock", self.driver_name))
    }
}

/// Values given on the command line (each overrides the file's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--driver-name`.
    pub driver_name: Option<String>,
    /// `--node-name`.
    pub node_name: Option<String>,
    /// `--kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `--gpushared-socket`.
    pub gpushared_socket: Option<PathBuf>,
    /// `--plugins-dir`.
    pub plugins_dir: Option<PathBuf>,
    /// `--registry-dir`.
    pub registry_dir: Option<PathBuf>,
    /// `--metrics-address` (`off` turns metrics off).
    pub metrics_address: Option<String>,
    /// `--claim-timeout-seconds`.
    pub claim_timeout_seconds: Option<u64>,
    /// `--device-health`.
    pub device_health: bool,
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

impl Config {
    /// The file's settings with `flags` laid over them; `default_node` is used when neither
    /// names the node (the `NODE_NAME` environment variable, else the host name).
    ///
    /// # Errors
    /// [`ConfigError::Value`] naming the key: a driver or node name that is not a DNS
    /// subdomain, a metrics address that is not `host:port`, a timeout of 0 or above 40 s.
    pub fn resolve(
        file: FileConfig,
        flags: Overrides,
        default_node: &str,
    ) -> Result<Config, ConfigError> {
        let driver_name = flags
            .driver_name
            .or(file.driver_name)
            .unwrap_or_else(|| "gpu.nvidia.com".into());
        if !is_dns_subdomain(&driver_name) || driver_name.len() > 63 {
            return Err(ConfigError::Value {
                key: "driver_name",
                message: format!("{driver_name:?} is not a DNS subdomain of at most 63 characters"),
            });
        }
        let node_name = flags
            .node_name
            .or(file.node_name)
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| default_node.to_string());
        if !is_dns_subdomain(&node_name) {
            return Err(ConfigError::Value {
                key: "node_name",
                message: format!("{node_name:?} is not a DNS subdomain (a Kubernetes node name)"),
            });
        }
        let metrics = flags
            .metrics_address
            .or(file.metrics_address)
            .unwrap_or_else(|| "127.0.0.1:9472".into());
        let metrics_address = if metrics.is_empty() || metrics == "off" {
            None
        } else {
            Some(metrics.parse().map_err(|_| ConfigError::Value {
                key: "metrics_address",
                message: format!("{metrics:?} is not host:port (e.g. 127.0.0.1:9472), or off"),
            })?)
        };
        let secs = flags
            .claim_timeout_seconds
            .or(file.claim_timeout_seconds)
            .unwrap_or(30);
        if secs == 0 || secs > 40 {
            return Err(ConfigError::Value {
                key: "claim_timeout_seconds",
                message: format!(
                    "{secs} must be between 1 and 40 (kubelet gives a whole call 45 s)"
                ),
            });
        }
        let path = |flag: Option<PathBuf>, file: Option<PathBuf>, default: &str| {
            flag.or(file)
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or_else(|| PathBuf::from(default))
        };
        Ok(Config {
            driver_name,
            node_name,
            kubeconfig: flags
                .kubeconfig
                .or(file.kubeconfig)
                .filter(|p| !p.as_os_str().is_empty()),
            gpushared_socket: path(
                flags.gpushared_socket,
                file.gpushared_socket,
                gpushare_proto::DEFAULT_SOCKET,
            ),
            plugins_dir: path(
                flags.plugins_dir,
                file.plugins_dir,
                "/var/lib/kubelet/plugins",
            ),
            registry_dir: path(
                flags.registry_dir,
                file.registry_dir,
                "/var/lib/kubelet/plugins_registry",
            ),
            metrics_address,
            claim_timeout: Duration::from_secs(secs),
            device_health: flags.device_health || file.device_health.unwrap_or(false),
            log_level: file.log_level.unwrap_or_else(|| "info".into()),
        })
    }
}

/// Checks the plugin's claim timeout against gpushared's bound on one generation of the
/// driver's CDI spec (`[cdi] generate_timeout_seconds`, in its `health` answer; absent from
/// gpushared before the field and for the simulated generator): a prepare waits on one
/// generation at most, so the claim timeout must be longer, or the plugin gives up on a
/// prepare that is still generating and kubelet retries it meanwhile.
///
/// # Errors
/// One line naming both keys.
pub fn check_generate_timeout(
    claim_timeout: Duration,
    health: &serde_json::Value,
) -> Result<(), String> {
    let Some(generate) = health
        .pointer("/driver_spec/generate_timeout_seconds")
        .and_then(serde_json::Value::as_u64)
    else {
        return Ok(());
    };
    if claim_timeout.as_secs() > generate {
        return Ok(());
    }
    Err(format!(
        "claim_timeout_seconds {} must be above gpushared's [cdi] generate_timeout_seconds ({generate}): a prepare may wait on a generation of the driver's CDI spec, and one the plugin gives up on is retried by kubelet while it still runs; raise claim_timeout_seconds (at most 40) or lower generate_timeout_seconds",
        claim_timeout.as_secs()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_claim_timeout_must_cover_a_generation_of_the_driver_spec() {
        let health = |g: serde_json::Value| {
            serde_json::json!({"driver_spec": {"path": "p", "generator": "g", "ok": true,
                "generate_timeout_seconds": g}})
        };
        let thirty = Duration::from_secs(30);
        check_generate_timeout(thirty, &health(serde_json::json!(15))).unwrap();
        check_generate_timeout(thirty, &health(serde_json::json!(null))).unwrap();
        check_generate_timeout(thirty, &serde_json::json!({"ready": true})).unwrap();
        let e = check_generate_timeout(Duration::from_secs(10), &health(serde_json::json!(15)))
            .unwrap_err();
        assert!(
            e.starts_with("claim_timeout_seconds 10 must be above gpushared's [cdi] generate_timeout_seconds (15)"),
            "{e}"
        );
        assert!(
            check_generate_timeout(Duration::from_secs(15), &health(serde_json::json!(15)))
                .is_err()
        );
    }

    #[test]
    fn the_documented_default_file_is_the_default() {
        let file = parse_file(DEFAULT_CONFIG_TEXT, Path::new("dra.toml")).unwrap();
        let from_file = Config::resolve(file, Overrides::default(), "node-a").unwrap();
        let bare = Config::resolve(FileConfig::default(), Overrides::default(), "node-a").unwrap();
        assert_eq!(from_file, bare);
        assert_eq!(bare.driver_name, "gpu.nvidia.com");
        assert_eq!(
            bare.dra_socket(),
            Path::new("/var/lib/kubelet/plugins/gpu.nvidia.com/dra.sock")
        );
        assert_eq!(
            bare.registration_socket(),
            Path::new("/var/lib/kubelet/plugins_registry/gpu.nvidia.com-reg.sock")
        );
        assert_eq!(
            bare.metrics_address,
            Some("127.0.0.1:9472".parse().unwrap())
        );
        assert_eq!(bare.claim_timeout, Duration::from_secs(30));
        assert_eq!(bare.node_name, "node-a");
    }

    #[test]
    fn flags_win_over_the_file_and_bad_values_name_their_key() {
        let file = parse_file(
            "driver_name = \"gpu.example.com\"\nnode_name = \"from-file\"\n",
            Path::new("f"),
        )
        .unwrap();
        let flags = Overrides {
            node_name: Some("from-flag".into()),
            metrics_address: Some("off".into()),
            ..Overrides::default()
        };
        let c = Config::resolve(file, flags, "host").unwrap();
        assert_eq!(
            (c.driver_name.as_str(), c.node_name.as_str()),
            ("gpu.example.com", "from-flag")
        );
        assert_eq!(c.metrics_address, None);

        let err = parse_file("drivr_name = \"x\"\n", Path::new("f")).unwrap_err();
        assert!(err.to_string().contains("drivr_name"), "{err}");
        for (flags, key) in [
            (
                Overrides {
                    driver_name: Some("GPU".into()),
                    ..Overrides::default()
                },
                "driver_name",
            ),
            (
                Overrides {
                    claim_timeout_seconds: Some(45),
                    ..Overrides::default()
                },
                "claim_timeout_seconds",
            ),
            (
                Overrides {
                    metrics_address: Some("localhost".into()),
                    ..Overrides::default()
                },
                "metrics_address",
            ),
        ] {
            let err = Config::resolve(FileConfig::default(), flags, "n").unwrap_err();
            assert!(err.to_string().starts_with(key), "{err}");
        }
    }
}
