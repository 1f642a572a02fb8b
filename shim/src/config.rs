//! The wrapper's configuration file (TOML), by default [`DEFAULT_CONFIG_PATH`], or the file
//! named by the environment variable [`CONFIG_ENV`].
//!
//! ```toml
//! # Low-level runtime candidates: the first that is an executable wins. Bare names are
//! # looked up on PATH; paths are used as they are. May name nvidia-container-runtime, so
//! # that both wrappers chain.
//! runtimes = ["runc", "crun"]
//! # CDI spec directories, lowest priority first.
//! spec_dirs = ["/etc/cdi", "/var/run/cdi"]
//! # Optional extra log file (JSON lines), besides runc's --log file.
//! log_file = "/var/log/gpushare-runtime.log"
//! # error | warning | info | debug (runc's --debug forces debug).
//! log_level = "info"
//! ```
//!
//! Every key is optional; unknown keys are refused, naming the key. The caller decides what a
//! broken file means: the wrapper falls back to the defaults for containers that request no
//! device, and refuses to inject devices with them.

use std::path::{Path, PathBuf};

use gpushare_cdi::DEFAULT_SPEC_DIRS;
use serde::Deserialize;

use crate::logging::Level;

/// Where the configuration is read from unless [`CONFIG_ENV`] says otherwise.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/gpushare/runtime.toml";
/// Environment variable naming another configuration file.
pub const CONFIG_ENV: &str = "GPUSHARE_RUNTIME_CONFIG";
/// Low-level runtime candidates when none are configured.
pub const DEFAULT_RUNTIMES: [&str; 2] = ["runc", "crun"];

/// The effective configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Low-level runtime candidates, in order of preference.
    pub runtimes: Vec<String>,
    /// CDI spec directories, lowest priority first.
    pub spec_dirs: Vec<PathBuf>,
    /// Extra log file, JSON lines.
    pub log_file: Option<PathBuf>,
    /// Most verbose level written.
    pub log_level: Level,
}

impl Default for Config {
    fn default() -> Config {
        Config {
            runtimes: DEFAULT_RUNTIMES.iter().map(|s| s.to_string()).collect(),
            spec_dirs: DEFAULT_SPEC_DIRS.iter().map(PathBuf::from).collect(),
            log_file: None,
            log_level: Level::Info,
        }
    }
}

/// The file as written; every key optional.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    runtimes: Option<Vec<String>>,
    spec_dirs: Option<Vec<PathBuf>>,
    log_file: Option<PathBuf>,
    log_level: Option<String>,
}

/// Why the configuration file could not be used.
#[derive(Debug)]
pub enum ConfigError {
    /// The file could not be read (a missing default file is not an error).
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema (the message names an unknown key).
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A value is out of range.
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::Read { path, source } => {
                write!(f, "cannot read config {}: {source}", path.display())
            }
            ConfigError::Parse { path, message } => write!(
                f,
                "invalid config {}: {}",
                path.display(),
                message.trim().replace('\n', " ")
            ),
            ConfigError::Invalid { path, message } => {
                write!(f, "invalid config {}: {message}", path.display())
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// Parses configuration text; `path` is only used in messages.
pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
    let file: ConfigFile = toml::from_str(text).map_err(|e| ConfigError::Parse {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let invalid = |message: String| ConfigError::Invalid {
        path: path.to_path_buf(),
        message,
    };
    let mut config = Config::default();
    if let Some(runtimes) = file.runtimes {
        if runtimes.is_empty() || runtimes.iter().any(|r| r.trim().is_empty()) {
            return Err(invalid(
                "runtimes must list at least one non-empty name or path".into(),
            ));
        }
        config.runtimes = runtimes;
    }
    if let Some(dirs) = file.spec_dirs {
        if dirs.iter().any(|d| d.as_os_str().is_empty()) {
            return Err(invalid("spec_dirs has an empty entry".into()));
        }
        config.spec_dirs = dirs;
    }
    if let Some(log_file) = file.log_file {
        if !log_file.as_os_str().is_empty() {
            config.log_file = Some(log_file);
        }
    }
    if let Some(level) = file.log_level {
        config.log_level = Level::parse(&level).ok_or_else(|| {
            invalid(format!(
                "log_level {level:?} is not one of error, warning, info, debug"
            ))
        })?;
    }
    Ok(config)
}

/// Loads the configuration from `path`. When `explicit` is false (the default path), a
/// missing file means the defaults; a named file must exist.
pub fn load(path: &Path, explicit: bool) -> Result<Config, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text, path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => Ok(Config::default()),
        Err(source) => Err(ConfigError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p() -> &'static Path {
        Path::new("/etc/gpushare/runtime.toml")
    }

    #[test]
    fn empty_file_means_defaults() {
        let c = parse("", p()).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.runtimes, vec!["runc", "crun"]);
        assert_eq!(
            c.spec_dirs,
            vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")]
        );
        assert_eq!(c.log_level, Level::Info);
    }

    #[test]
    fn every_key() {
        let c = parse(
            "runtimes = [\"nvidia-container-runtime\", \"/usr/sbin/runc\"]\n\
             spec_dirs = [\"/a\"]\nlog_file = \"/var/log/g.log\"\nlog_level = \"debug\"\n",
            p(),
        )
        .unwrap();
        assert_eq!(
            c.runtimes,
            vec!["nvidia-container-runtime", "/usr/sbin/runc"]
        );
        assert_eq!(c.spec_dirs, vec![PathBuf::from("/a")]);
        assert_eq!(c.log_file, Some(PathBuf::from("/var/log/g.log")));
        assert_eq!(c.log_level, Level::Debug);
        assert_eq!(
            parse("log_level = \"warn\"", p()).unwrap().log_level,
            Level::Warning
        );
        assert_eq!(parse("log_file = \"\"", p()).unwrap().log_file, None);
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = parse("runtimes = [\"runc\"]\nspec-dirs = [\"/a\"]\n", p()).unwrap_err();
        assert!(matches!(err, ConfigError::Parse { .. }));
        assert!(err.to_string().contains("spec-dirs"), "{err}");
        assert!(!err.to_string().contains('\n'));
        let err = parse("[nvidia]\nx = 1\n", p()).unwrap_err();
        assert!(err.to_string().contains("nvidia"), "{err}");
    }

    #[test]
    fn bad_values() {
        assert!(matches!(
            parse("runtimes = []", p()),
            Err(ConfigError::Invalid { .. })
        ));
        assert!(matches!(
            parse("runtimes = [\"\"]", p()),
            Err(ConfigError::Invalid { .. })
        ));
        assert!(matches!(
            parse("spec_dirs = [\"\"]", p()),
            Err(ConfigError::Invalid { .. })
        ));
        assert!(matches!(
            parse("log_level = \"loud\"", p()),
            Err(ConfigError::Invalid { .. })
        ));
        assert!(matches!(
            parse("runtimes = \"runc\"", p()),
            Err(ConfigError::Parse { .. })
        ));
        assert!(matches!(
            parse("runtimes = [", p()),
            Err(ConfigError::Parse { .. })
        ));
    }

    #[test]
    fn loading_files() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none.toml");
        assert_eq!(load(&missing, false).unwrap(), Config::default());
        assert!(matches!(
            load(&missing, true),
            Err(ConfigError::Read { .. })
        ));
        let file = dir.path().join("r.toml");
        std::fs::write(&file, "log_level = \"error\"\n").unwrap();
        assert_eq!(load(&file, true).unwrap().log_level, Level::Error);
        std::fs::write(&file, "bogus = 1\n").unwrap();
        let err = load(&file, false).unwrap_err();
        assert!(err.to_string().contains("bogus"));
        assert!(err.to_string().contains(&file.display().to_string()));
    }
}
