//! The wrapper's decision: pass through, or inject CDI devices first; then exec.
//!
//! - Any subcommand but `create`/`run`: exec the low-level runtime at once.
//! - `create`/`run`: read `<bundle>/config.json`. If it cannot be read, or requests no device
//!   (see [`crate::requests`]), exec at once, without reading any CDI spec and whatever state
//!   the wrapper's own config file is in: the wrapper is often the node's default runtime, and
//!   failing there would take down every pod (fail open). Otherwise resolve the devices with
//!   the CDI registry, apply the edits, write `config.json` back atomically, and exec.
//! - Failures that concern a container's device request stop it: one JSON error line in the
//!   `--log` file (what containerd reports) and in the configured log file, one line on
//!   stderr, exit status 1.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use gpushare_cdi::Registry;

use crate::args::{self, Invocation};
use crate::bundle;
use crate::config::{self, Config, ConfigError};
use crate::exec;
use crate::logging::{Format, Level, Logger};
use crate::requests;

/// What the process environment contributes.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    /// [`config::CONFIG_ENV`], if set.
    pub config_path: Option<OsString>,
    /// `PATH`, if set.
    pub path: Option<OsString>,
    /// This program's own executable, so it is never chosen as the low-level runtime.
    pub self_exe: Option<PathBuf>,
}

impl Environment {
    /// Reads the real process environment.
    pub fn from_process() -> Environment {
        Environment {
            config_path: std::env::var_os(config::CONFIG_ENV),
            path: std::env::var_os("PATH"),
            self_exe: std::env::current_exe().ok(),
        }
    }
}

/// A failure that stops the command: its one-line message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure(pub String);

fn load_config(env: &Environment) -> (Config, Option<ConfigError>) {
    let (path, explicit) = match env.config_path.as_deref().filter(|p| !p.is_empty()) {
        Some(p) => (PathBuf::from(p), true),
        None => (PathBuf::from(config::DEFAULT_CONFIG_PATH), false),
    };
    match config::load(&path, explicit) {
        Ok(c) => (c, None),
        Err(e) => (Config::default(), Some(e)),
    }
}

fn make_logger(inv: &Invocation, config: &Config) -> Logger {
    let level = if inv.debug {
        Level::Debug
    } else {
        config.log_level
    };
    let mut logger = Logger::new(level);
    if let Some(log) = &inv.log_file {
        let format = if inv.log_format.as_deref() == Some("text") {
            Format::Text
        } else {
            Format::Json
        };
        logger.add_file(log, format);
    }
    if let Some(file) = &config.log_file {
        logger.add_file(file, Format::Json);
    }
    logger
}

/// Edits the bundle's config for `create`/`run` if the container requests devices.
fn prepare_bundle(
    bundle_dir: &Path,
    config: &Config,
    config_error: Option<&ConfigError>,
    logger: &Logger,
) -> Result<(), Failure> {
    let mut oci = match bundle::read_config(bundle_dir) {
        Ok(oci) => oci,
        Err(e) => {
            // Not ours to judge: the low-level runtime reports a broken bundle itself.
            logger.debug(&format!(
                "cannot read {}: {e}; passing through",
                bundle::config_path(bundle_dir).display()
            ));
            return Ok(());
        }
    };
    let requested = requests::collect(&oci).map_err(|e| Failure(e.to_string()))?;
    if requested.is_empty() {
        logger.debug("no CDI device requested; passing through");
        return Ok(());
    }
    let list = requested.join(", ");
    if let Some(e) = config_error {
        return Err(Failure(format!("cannot inject CDI devices {list}: {e}")));
    }
    let registry = Registry::load(&config.spec_dirs);
    for error in registry.errors().values().flatten() {
        logger.warning(&format!("ignoring CDI spec: {error}"));
    }
    registry
        .inject(&mut oci, &requested)
        .map_err(|e| Failure(format!("failed to inject CDI devices: {e}")))?;
    bundle::write_config(bundle_dir, &oci).map_err(|e| {
        Failure(format!(
            "failed to write {}: {e}",
            bundle::config_path(bundle_dir).display()
        ))
    })?;
    logger.info(&format!(
        "injected CDI devices {list} into {}",
        bundle::config_path(bundle_dir).display()
    ));
    Ok(())
}

/// Runs the wrapper on `args` (argv without argv\[0\]). Returns only on failure (after
/// logging it); on success the process has become the low-level runtime.
pub fn run(args: &[OsString], env: &Environment) -> Failure {
    let inv = args::scan(args);
    let (config, config_error) = load_config(env);
    let logger = make_logger(&inv, &config);
    if let Some(e) = &config_error {
        logger.warning(&format!("{e}; using the defaults"));
    }
    logger.debug(&format!("invoked with {args:?}"));

    let failure = match proceed(args, &inv, &config, config_error.as_ref(), env, &logger) {
        Ok(never) => match never {},
        Err(f) => f,
    };
    logger.error(&failure.0);
    failure
}

/// Uninhabited: `proceed` only returns on error.
enum Never {}

fn proceed(
    args: &[OsString],
    inv: &Invocation,
    config: &Config,
    config_error: Option<&ConfigError>,
    env: &Environment,
    logger: &Logger,
) -> Result<Never, Failure> {
    let runtime = exec::find_runtime(
        &config.runtimes,
        env.path.as_deref().map(OsStr::new),
        env.self_exe.as_deref(),
    )
    .map_err(|e| Failure(e.to_string()))?;
    if inv.creates_container() {
        let bundle_dir = inv.bundle.clone().unwrap_or_else(|| PathBuf::from("."));
        prepare_bundle(&bundle_dir, config, config_error, logger)?;
    }
    logger.debug(&format!("exec {}", runtime.display()));
    let err = exec::exec_runtime(&runtime, args);
    Err(Failure(format!(
        "failed to exec {}: {err}",
        runtime.display()
    )))
}
