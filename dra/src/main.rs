//! `gpushare-dra`: the DRA kubelet plugin. See the crate's library for the architecture and
//! `packaging/dra.toml` for every setting.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use gpushare_dra::config::{self, Config, FileConfig, Overrides};

/// The DRA kubelet plugin of gpushare: serves kubelet's DRA gRPC (v1 and v1beta1) and
/// registration, publishes the node's ResourceSlices, and prepares claims through gpushared.
///
/// Flags that `probe` reads too are global; the plugin's own (API server, metrics, claim
/// timeout, device health) are not, so that `probe --help` offers only what it uses.
#[derive(Debug, Parser)]
#[command(name = "gpushare-dra", version)]
struct Cli {
    /// Config file (default /etc/gpushare/dra.toml; missing there means defaults).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// DRA driver name served [default: gpu.nvidia.com].
    #[arg(long, global = true)]
    driver_name: Option<String>,
    /// The node's name as kubelet registers it [default: $NODE_NAME, else the host name].
    #[arg(long, global = true)]
    node_name: Option<String>,
    /// kubeconfig [default: the in-cluster service account, else /var/lib/kubelet/kubeconfig].
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// gpushared's socket [default: /run/gpushare/gpushared.sock].
    #[arg(long, global = true)]
    gpushared_socket: Option<PathBuf>,
    /// kubelet's plugins directory [default: /var/lib/kubelet/plugins].
    #[arg(long, global = true)]
    plugins_dir: Option<PathBuf>,
    /// kubelet's plugin registry directory [default: /var/lib/kubelet/plugins_registry].
    #[arg(long, global = true)]
    registry_dir: Option<PathBuf>,
    /// host:port of /metrics and /healthz, or `off` [default: 127.0.0.1:9472].
    #[arg(long)]
    metrics_address: Option<String>,
    /// Most seconds one claim's prepare or unprepare may take, 1-40 [default: 30].
    #[arg(long)]
    claim_timeout_seconds: Option<u64>,
    /// Serve v1alpha1.DRAResourceHealth (kubelet's ResourceHealthStatus feature gate).
    #[arg(long)]
    device_health: bool,
    /// Delete this node's ResourceSlices of this driver and exit (the RPM's erase runs it).
    #[arg(long)]
    remove_slices: bool,
    /// Print the documented default config file and exit.
    #[arg(long)]
    print_default_config: bool,
    /// Write the man pages gpushare-dra.8 and gpushare-dra-probe.8 into this directory and
    /// exit (for packaging).
    #[arg(long, value_name = "DIR", hide = true)]
    generate_man: Option<PathBuf>,
    /// Print a shell completion script and exit (for packaging).
    #[arg(long, value_name = "SHELL", hide = true)]
    completion: Option<clap_complete::Shell>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check the running plugin: its sockets answer GetInfo and NodePrepareResources, and
    /// its node and driver agree with gpushared's (`gpushare doctor` runs this).
    Probe {
        /// Print the checks as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `gpushare-dra.8` and one page per subcommand (`gpushare-dra-probe.8`), from the clap
/// definition, so that they always match the binary that ships.
fn write_man_pages(dir: &std::path::Path) -> anyhow::Result<()> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    cmd.build();
    let write = |c: &clap::Command, name: &str| -> anyhow::Result<()> {
        let mut out = Vec::new();
        clap_mangen::Man::new(
            c.clone()
                .display_name(name.to_string())
                .bin_name(name.to_string()),
        )
        .section("8")
        .render(&mut out)
        .with_context(|| format!("rendering the man page of {name}"))?;
        let path = dir.join(format!("{name}.8"));
        std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))
    };
    write(&cmd, "gpushare-dra")?;
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        write(sub, &format!("gpushare-dra-{}", sub.get_name()))?;
    }
    Ok(())
}

/// The node name when neither a flag nor the config file gives one: `node_name_env` (a
/// process's `NODE_NAME`) when set, else the host's name, lower-cased.
fn default_node(node_name_env: Option<String>) -> String {
    node_name_env
        .filter(|n| !n.is_empty())
        .or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|h| h.into_string().ok())
        })
        .unwrap_or_default()
        .to_ascii_lowercase()
}

/// The configuration `cli` resolves to for a process started in `cwd` (a relative
/// `--config` is read there) whose default node name is `default_node`.
fn load(cli: &Cli, cwd: &std::path::Path, default_node: &str) -> anyhow::Result<Config> {
    let (path, required) = match &cli.config {
        Some(p) => (cwd.join(p), true),
        None => (PathBuf::from(config::DEFAULT_CONFIG_FILE), false),
    };
    let file = match std::fs::read_to_string(&path) {
        Ok(text) => config::parse_file(&text, &path)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => FileConfig::default(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let flags = Overrides {
        driver_name: cli.driver_name.clone(),
        node_name: cli.node_name.clone(),
        kubeconfig: cli.kubeconfig.clone(),
        gpushared_socket: cli.gpushared_socket.clone(),
        plugins_dir: cli.plugins_dir.clone(),
        registry_dir: cli.registry_dir.clone(),
        metrics_address: cli.metrics_address.clone(),
        claim_timeout_seconds: cli.claim_timeout_seconds,
        device_health: cli.device_health,
    };
    Ok(Config::resolve(file, flags, default_node)?)
}

/// The names of the plugin listening on `cfg`'s registration socket, resolved from its own
/// command line, working directory and `NODE_NAME` as it resolved them at its start; each
/// name the probe was given a flag for stays the probe's. `None` when there is no such
/// process, it cannot be read, or it is not a plugin's command line.
fn running_names(cli: &Cli, cfg: &Config) -> Option<gpushare_dra::probe::RunningNames> {
    let p = gpushare_dra::running::behind_socket(&cfg.registration_socket())?;
    let theirs = Cli::try_parse_from(&p.args).ok()?;
    if theirs.command.is_some() {
        return None;
    }
    // An environment we may not read: the probe's own default, as before.
    let node_env = p
        .node_name_env
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok());
    let resolved = load(&theirs, &p.cwd, &default_node(node_env)).ok()?;
    Some(gpushare_dra::probe::RunningNames {
        node_name: if cli.node_name.is_some() {
            cfg.node_name.clone()
        } else {
            resolved.node_name
        },
        driver_name: if cli.driver_name.is_some() {
            cfg.driver_name.clone()
        } else {
            resolved.driver_name
        },
        pid: p.pid,
    })
}

/// Writes `bytes` to stdout. A reader that is gone (`gpushare-dra --print-default-config |
/// head`) ends the output quietly: the plugin keeps Rust's ignored SIGPIPE, since a kubelet
/// or gpushared that hangs up on one of its sockets must never kill it, so the write fails
/// with EPIPE, where `print!` would panic. (Restoring SIGPIPE's default for the one-shot
/// commands alone would not do either: `probe` and `--remove-slices` write to sockets too.)
///
/// # Errors
/// Writing failed for another reason.
fn print_quietly(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

/// The exit status of a command that only prints: failure with its one line on stderr.
fn exit_code(outcome: anyhow::Result<()>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpushare-dra: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(level: &str) {
    // kube's client logs every failed request at ERROR ("failed with error client error
    // (Connect)") beside our own line, which names the server and what was being done: off
    // unless RUST_LOG asks for it.
    const KUBE_REQUEST_LOG: &str = "kube_client::client::builder=off";
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(format!("{level},{KUBE_REQUEST_LOG}")))
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(!journal && std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if journal {
        b.without_time().init();
    } else {
        b.init();
    }
}

async fn main_async(cli: Cli) -> anyhow::Result<ExitCode> {
    let cfg = load(
        &cli,
        std::path::Path::new(""),
        &default_node(std::env::var("NODE_NAME").ok()),
    )?;
    if let Some(Command::Probe { json }) = cli.command {
        let running = running_names(&cli, &cfg);
        let checks = gpushare_dra::probe::probe(&cfg, running).await;
        let mut text = String::new();
        if json {
            text = serde_json::to_string(&checks)? + "\n";
        } else {
            for c in &checks {
                let hint = if c.hint.is_empty() {
                    String::new()
                } else {
                    format!(" -> {}", c.hint)
                };
                text += &format!(
                    "{:<5} {:<13} {}{hint}\n",
                    if c.ok() { "OK" } else { "FAIL" },
                    c.name,
                    c.detail
                );
            }
        }
        print_quietly(text.as_bytes())?;
        return Ok(if checks.iter().all(|c| c.ok()) {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    init_logging(&cfg.log_level);
    let api = Arc::new(gpushare_dra::api::connect(cfg.kubeconfig.as_deref()).await?);
    if cli.remove_slices {
        let n = gpushare_dra::slices::remove_all(&api, &cfg.driver_name, &cfg.node_name)
            .await
            .with_context(|| {
                format!(
                    "removing the ResourceSlices of driver {} on node {}",
                    cfg.driver_name, cfg.node_name
                )
            })?;
        print_quietly(
            format!(
                "removed {n} ResourceSlice(s) of driver {} on node {}\n",
                cfg.driver_name, cfg.node_name
            )
            .as_bytes(),
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    match gpushare_dra::run::run(cfg, api).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.is::<gpushare_dra::run::Fatal>() => {
            tracing::error!("{e}");
            eprintln!("gpushare-dra: {e}");
            Ok(ExitCode::from(2))
        }
        Err(e) => Err(e),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.print_default_config {
        return exit_code(print_quietly(config::DEFAULT_CONFIG_TEXT.as_bytes()));
    }
    if let Some(dir) = &cli.generate_man {
        return exit_code(write_man_pages(dir));
    }
    if let Some(shell) = cli.completion {
        // Into memory first: clap_complete panics on a failed write.
        let mut script = Vec::new();
        clap_complete::generate(
            shell,
            &mut <Cli as clap::CommandFactory>::command(),
            "gpushare-dra",
            &mut script,
        );
        return exit_code(print_quietly(&script));
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("gpushare-dra")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gpushare-dra: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(main_async(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gpushare-dra: {e:#}");
            ExitCode::FAILURE
        }
    }
}
