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
use serde_json::Value;

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
    /// A path to this program's own executable, so it is never chosen as the low-level
    /// runtime (`/proc/self/exe` for the running process: a `stat` through it names the file
    /// without resolving a path).
    pub self_exe: Option<PathBuf>,
    /// [`exec::LOOP_MARKER`] is set: a runtime this wrapper exec'd has led back to it.
    pub looped: bool,
}

impl Environment {
    /// Reads the real process environment.
    pub fn from_process() -> Environment {
        Environment {
            config_path: std::env::var_os(config::CONFIG_ENV),
            path: std::env::var_os("PATH"),
            self_exe: Some(PathBuf::from("/proc/self/exe")),
            looped: std::env::var_os(exec::LOOP_MARKER).is_some(),
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

/// Annotation recording the devices this wrapper injected, so that a second `create` on the
/// same bundle (a retry after a failed start) does not apply them twice.
pub const INJECTED_ANNOTATION: &str = "io.gpushare.runtime.injected";

/// Whether the raw text of a config that could not be parsed still names CDI requests.
fn mentions_requests(file: &Path) -> bool {
    std::fs::read(file).is_ok_and(|data| {
        let text = String::from_utf8_lossy(&data);
        text.contains("cdi.k8s.io/") || text.contains(requests::ENV_VAR)
    })
}

/// Edits the container's OCI config for `create`/`run`/`restore` if it requests devices.
fn prepare_bundle(
    config_file: &Path,
    config: &Config,
    config_error: Option<&ConfigError>,
    logger: &Logger,
) -> Result<(), Failure> {
    let mut oci = match bundle::read_config(config_file) {
        Ok(oci) => oci,
        Err(e) if mentions_requests(config_file) => {
            // It asks for devices we cannot read: starting it without them would be silent
            // breakage; a container that asks for none is not ours to judge.
            return Err(Failure(format!(
                "cannot read {} to inject its CDI devices: {e}",
                config_file.display()
            )));
        }
        Err(e) => {
            logger.debug(&format!(
                "cannot read {}: {e}; passing through",
                config_file.display()
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
    if let Some(done) = oci
        .pointer(&format!(
            "/annotations/{}",
            INJECTED_ANNOTATION.replace('/', "~1")
        ))
        .and_then(Value::as_str)
    {
        logger.debug(&format!(
            "CDI devices {done} were injected already; passing through"
        ));
        return Ok(());
    }
    if let Some(e) = config_error {
        return Err(Failure(format!("cannot inject CDI devices {list}: {e}")));
    }
    let registry = Registry::load(&config.spec_dirs);
    for error in registry.errors().values().flatten() {
        logger.warning(&format!("ignoring CDI spec: {error}"));
    }
    registry
        .inject(&mut oci, &requested)
        .map_err(|e| Failure(format!("cannot inject CDI devices {list}: {e}")))?;
    if let Some(annotations) = oci.as_object_mut().map(|o| {
        o.entry("annotations")
            .or_insert_with(|| Value::Object(Default::default()))
    }) {
        if let Some(map) = annotations.as_object_mut() {
            map.insert(INJECTED_ANNOTATION.into(), Value::String(list.clone()));
        }
    }
    bundle::write_config(config_file, &oci)
        .map_err(|e| Failure(format!("failed to write {}: {e}", config_file.display())))?;
    logger.info(&format!(
        "injected CDI devices {list} into {}",
        config_file.display()
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
    if env.looped {
        return Err(Failure(format!(
            "gpushare-runtime was started again by its own low-level runtime (an exec loop: one of {} leads back here); fix `runtimes` in the config",
            config.runtimes.join(", ")
        )));
    }
    if inv.version {
        // Ours first, then the low-level runtime's own lines (it gets the same arguments).
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "gpushare-runtime {}", env!("CARGO_PKG_VERSION"));
        let _ = out.flush();
    }
    let path = env.path.as_deref().map(OsStr::new);
    let self_exe = env.self_exe.as_deref();
    // A configured runtime that is missing is an error for every container, as containerd
    // shows it: silently starting another runtime than the one configured would hide it.
    let runtime =
        exec::find_runtime(&config.runtimes, path, self_exe).map_err(|e| Failure(e.to_string()))?;
    if inv.creates_container() {
        let bundle_dir = inv.bundle.clone().unwrap_or_else(|| PathBuf::from("."));
        let file = inv
            .config
            .clone()
            .unwrap_or_else(|| bundle::config_path(&bundle_dir));
        prepare_bundle(&file, config, config_error, logger)?;
    }
    logger.debug(&format!("exec {}", runtime.display()));
    let err = exec::exec_runtime(&runtime, args);
    Err(Failure(format!(
        "failed to exec {}: {err}",
        runtime.display()
    )))
}
