//! `gpushare`: the operators' CLI for gpushared.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use gpushare::cli_api::{self as daemon, catalog};
use gpushare_cli::{self as cli, Output};
use gpushare_proto::{
    ClaimInfo, Client, ClientError, ErrorCode, GpuInfo, HealthInfo, Method, MigApplyParams,
    MigApplyResult, PrepareParams, PrepareResult, UidParams, UnprepareResult, VersionInfo,
};

// The first line is the man page's NAME ("gpushare - <it>"): it does not start with the name.
/// Inspect and control gpushared, the node's GPU sharing daemon.
#[derive(Debug, Parser)]
// The package is gpushare-cli; the command, its man pages and completions are `gpushare`.
#[command(name = "gpushare", version)]
struct Args {
    /// gpushared's socket [default: /run/gpushare/gpushared.sock].
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    /// Output format [default: table, at most 120 columns with claim UIDs shortened to a
    /// unique prefix; `wide` for every column in full]; `gpushare gpus --help` names one more
    /// of its own.
    #[arg(short, long, global = true, value_enum)]
    output: Option<Output>,
    /// Seconds to wait for the daemon's answer.
    #[arg(long, global = true, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Daemon health, version, backend and counts.
    Status,
    /// The node's GPUs with their compute mode, time-slice and holders.
    ///
    /// `-o resourceslice` prints the ResourceSlice a DRA driver would publish for them.
    Gpus {
        /// With `-o resourceslice`: the slices published where the API server, of this
        /// Kubernetes version (e.g. 1.34, 1.35), keeps partitionable devices (every MIG slice
        /// gpushared can make, with one counter set per GPU). Without it: what a server that
        /// drops them gets, the devices that exist.
        #[arg(long, value_name = "KUBERNETES_VERSION", value_parser = kubernetes_minor)]
        partitionable: Option<u32>,
        /// With `-o resourceslice`: the API version written, `resource.k8s.io/v1` (Kubernetes
        /// 1.34+), `resource.k8s.io/v1beta2` (1.33+) or `resource.k8s.io/v1beta1` (1.32+; each
        /// device's attributes and capacity under `basic`). Default: the best one the version
        /// of `--partitionable` serves, else `resource.k8s.io/v1`.
        #[arg(long, value_name = "API_VERSION", value_parser = cli::parse_api_version)]
        api_version: Option<gpushare_slice::ApiVersion>,
    },
    /// All claims.
    Claims,
    /// One claim: strategy, devices, MPS daemon pid, limits as read back, containers, CDI IDs.
    Claim {
        /// The claim's UID, or a unique start of it (as `gpushare claims` shows it).
        uid: String,
    },
    /// Prepare a claim from a ResourceClaim file (JSON or YAML, as the API server returns it).
    Prepare {
        /// The file; `-` for stdin.
        #[arg(short, long)]
        file: PathBuf,
    },
    /// Release a claim, or with --all every claim of the node (one line per claim; asks
    /// nothing: drain the node's pods first). A UID that names no prepared claim fails
    /// (exit status 1): nothing was released. A unique start of a UID of at least 8
    /// characters names its claim, as `gpushare claims` shows it; one that several UIDs start
    /// with, or a shorter one, fails and releases nothing.
    Unprepare {
        /// The claim's UID, or a unique start of it (at least 8 characters).
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        uid: Option<String>,
        /// Release every claim gpushared holds.
        #[arg(long)]
        all: bool,
    },
    /// The node profiles `gpushared --simulate` knows (no daemon needed); with a name or a
    /// profile file, that node's GPUs as `gpushare gpus` shows them on a fresh node.
    Profiles {
        /// A catalog name or a profile file (a path containing '/').
        profile: Option<String>,
    },
    /// Run the whole job on a simulated p4d.24xlarge in a temporary directory and clean up.
    Demo(cli::demo::DemoArgs),
    /// Check this node's setup (driver, MPS, containerd, nodeadm, CDI specs, the helper
    /// programs, socket, the daemon's directories, its claim records, degraded claims, compute
    /// modes): one line per check
    /// with a fix hint; exits 1 when any fails. For a gpushared started by hand, give the same
    /// --socket (its --state-dir, --run-dir and --cdi-dir are then read from its command line
    /// unless given here); for a gpushare-dra started by hand, its
    /// --dra-plugins-dir and --dra-registry-dir (the plugin's check asks the gpushared at
    /// --socket).
    Doctor {
        /// Check against simulated GPUs of this node profile (as gpushared --simulate) instead
        /// of NVML.
        #[arg(long, value_name = "NODE_PROFILE")]
        simulate: Option<String>,
        /// gpushared's config file [default: /etc/gpushare/config.toml].
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// containerd's config file.
        #[arg(
            long,
            value_name = "FILE",
            default_value = "/etc/containerd/config.toml"
        )]
        containerd_config: PathBuf,
        /// gpushared's state directory, when it was started with --state-dir
        /// [default: paths.state_dir of the config file].
        #[arg(long, value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// gpushared's run directory, when it was started with --run-dir [paths.run_dir].
        #[arg(long, value_name = "DIR")]
        run_dir: Option<PathBuf>,
        /// gpushared's CDI directory, when it was started with --cdi-dir [paths.cdi_dir].
        #[arg(long, value_name = "DIR")]
        cdi_dir: Option<PathBuf>,
        /// The DRA kubelet plugin's config file, for its check (`gpushare-dra probe
        /// --config`) [default: /etc/gpushare/dra.toml].
        #[arg(long, value_name = "FILE")]
        dra_config: Option<PathBuf>,
        /// kubelet's plugins directory the DRA plugin was started with (its
        /// --plugins-dir) [default: its config's].
        #[arg(long, value_name = "DIR")]
        dra_plugins_dir: Option<PathBuf>,
        /// kubelet's plugin registry directory the DRA plugin was started with (its
        /// --registry-dir) [default: its config's].
        #[arg(long, value_name = "DIR")]
        dra_registry_dir: Option<PathBuf>,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish or powershell).
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write man pages for gpushare and its subcommands into a directory (for packaging).
    #[command(hide = true)]
    GenerateMan {
        /// Existing directory to write gpushare.1 and gpushare-<command>.1 into.
        dir: PathBuf,
    },
    /// MIG: list instances, or plan/apply an NVIDIA mig-parted v1 layout file.
    Mig {
        #[command(subcommand)]
        command: MigCommand,
    },
}

#[derive(Debug, Subcommand)]
enum MigCommand {
    /// Every MIG instance with its owner claim, profile, placement and UUID.
    List,
    /// Show what `apply` would set, destroy and create; changes nothing.
    Plan {
        /// mig-parted v1 config file (`version: v1`, `mig-configs`).
        #[arg(short, long)]
        file: PathBuf,
        /// Name of the config under `mig-configs`.
        #[arg(short, long)]
        config: String,
    },
    /// Apply a config: GPUs held by prepared claims are refused and nothing is changed.
    Apply {
        /// mig-parted v1 config file (`version: v1`, `mig-configs`).
        #[arg(short, long)]
        file: PathBuf,
        /// Name of the config under `mig-configs`.
        #[arg(short, long)]
        config: String,
    },
}

fn print_structured_or<T: serde::Serialize>(
    value: &T,
    output: Output,
    table: impl FnOnce(&T) -> String,
) -> Result<()> {
    match cli::render_structured(value, output)? {
        Some(text) => print!("{text}"),
        None => print!("{}", table(value)),
    }
    Ok(())
}

/// The line of one unprepare's answer.
fn unprepared_line(r: &UnprepareResult) -> String {
    if r.released {
        format!("claim {} released\n", r.uid)
    } else {
        format!("claim {} was not prepared; nothing to do\n", r.uid)
    }
}

/// The error of `gpushare unprepare <uid>` when gpushared holds no claim of that UID.
fn no_claim_released(uid: &str) -> String {
    format!(
        "no claim with UID {uid:?} is prepared on this node: nothing was released (`gpushare claims` lists the claims gpushared holds)"
    )
}

/// `gpushare unprepare --all`: every claim gpushared lists, released one by one with one
/// line each, as it goes (a claim released meanwhile by kubelet reads "was not prepared").
/// All are tried; each failure is a line on stderr, and the command then fails.
fn unprepare_all(client: &mut Client, output: Output) -> Result<()> {
    let claims = client.list_claims()?;
    if claims.is_empty() && output == Output::Table {
        println!("no claim is prepared; nothing to do");
        return Ok(());
    }
    let mut results = Vec::new();
    let mut failed = 0;
    for c in &claims {
        match client
            .call::<_, UnprepareResult>(Method::Unprepare, Some(&UidParams { uid: c.uid.clone() }))
        {
            Ok(r) => {
                if output == Output::Table {
                    print!("{}", unprepared_line(&r));
                }
                results.push(r);
            }
            Err(e) => {
                eprintln!("gpushare: claim {} not released: {e}", c.uid);
                failed += 1;
            }
        }
    }
    if output != Output::Table {
        print_structured_or(&results, output, |_| String::new())?;
    }
    if failed > 0 {
        anyhow::bail!("{failed} of {} claims not released (above)", claims.len());
    }
    Ok(())
}

fn require_root(what: &str) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        anyhow::bail!("gpushare {what} changes node state and must run as root");
    }
    Ok(())
}

/// `gpushare profiles [PROFILE]`. The list of profiles is one table whatever the output: it
/// fits in 120 columns with nothing left out, so `-o wide` has nothing to add.
fn profiles(profile: Option<&str>, output: Output) -> Result<()> {
    match profile {
        None => {
            let all = catalog::catalog()?;
            let rows: Vec<cli::ProfileRow> = all.iter().map(cli::ProfileRow::of).collect();
            print_structured_or(&rows, output, |r| cli::profiles_table(r))
        }
        Some(p) => {
            let node = catalog::resolve(p)?;
            let gpus: Vec<GpuInfo> = node
                .gpus("simulated-node")
                .iter()
                .map(daemon::Gpu::info)
                .collect();
            print_structured_or(&gpus, output, |g| gpus_table(g, output))
        }
    }
}

/// The `gpushare gpus` table `output` asks for.
fn gpus_table(gpus: &[GpuInfo], output: Output) -> String {
    if output == Output::Wide {
        cli::gpus_table_wide(gpus)
    } else {
        cli::gpus_table(gpus)
    }
}

/// Output into a closed pipe (`gpushare completion bash | head -1`) ends the process quietly,
/// as it does for other command-line tools: Rust ignores SIGPIPE, so every `print!` would
/// panic on EPIPE instead. Chosen over handling each write's error because no command but
/// `demo` holds anything of its own to undo when its reader goes. Not for `demo`, which must
/// live on to release its claims and stop its daemon: it writes through `demo::emit`, which
/// drops a failed write (its output is diagnostics; losing the rest of it is harmless).
fn die_on_sigpipe() {
    use nix::sys::signal::{signal, SigHandler, Signal};
    // SAFETY: SIG_DFL installs no handler of ours, and no other thread exists yet.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if !matches!(args.command, Command::Demo(_)) {
        die_on_sigpipe();
    }
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpushare: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// A claim UID, or the start of one, given on the command line, checked before anything is
/// asked: the daemon's refusal would name `metadata.uid`, which the user never typed.
fn claim_uid_arg(uid: &str) -> Result<()> {
    let Some(why) = daemon::claim_uid_problem(uid) else {
        return Ok(());
    };
    // The start of a UID may end where a whole one may not (`3f75ec50-`): it passes when
    // some UID can start with it. Whether one does is known only from the claims.
    if !uid.is_empty() && daemon::claim_uid_problem(&format!("{uid}0")).is_none() {
        return Ok(());
    }
    anyhow::bail!("{uid:?} is not a valid claim UID: it {why}")
}

/// What a claim UID typed by an operator is for: reading takes any unique start of it,
/// releasing one of at least [`cli::SHORT_UID_LEN`] characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Use {
    Read,
    Release,
}

/// The claim a UID given on the command line names, and the claim itself when it was read on
/// the way: a whole UID of a claim (asked for alone, without listing every claim), or the one
/// UID that starts with it ([`cli::resolve_claim_uid`] among the claims gpushared lists).
/// When none does, what was given goes to the daemon as before, so its answer (no such claim)
/// is unchanged; only it must then be a whole UID.
fn resolve_claim(client: &mut Client, given: &str, to: Use) -> Result<(String, Option<ClaimInfo>)> {
    let exact: Result<ClaimInfo, _> = client.call(
        Method::GetClaim,
        Some(&UidParams {
            uid: given.to_string(),
        }),
    );
    match exact {
        Ok(claim) => return Ok((given.to_string(), Some(claim))),
        // No claim of that UID, or not a whole UID at all (`3f75ec50-`): perhaps a start.
        Err(ClientError::Remote(e))
            if matches!(e.code, ErrorCode::NotFound | ErrorCode::InvalidRequest) => {}
        Err(e) => return Err(e.into()),
    }
    let claims = client.list_claims()?;
    let uid = cli::resolve_claim_uid(given, claims.iter().map(|c| c.uid.as_str()))?;
    if to == Use::Release && uid != given && given.len() < cli::SHORT_UID_LEN {
        // A release cannot be undone: a start shorter than the tables show is more likely a
        // slip than a choice, even when it names one claim today.
        anyhow::bail!(
            "{given:?} is only the start of claim {uid}: give at least {} characters of a UID to release it",
            cli::SHORT_UID_LEN
        );
    }
    if uid == given {
        if let Some(why) = daemon::claim_uid_problem(given) {
            anyhow::bail!(
                "{given:?} is not a valid claim UID, nor the start of a prepared claim's: it {why}"
            );
        }
    }
    Ok((uid, None))
}

/// Whether `command` prints a table that `-o wide` widens.
fn has_wide_table(command: &Command) -> bool {
    matches!(
        command,
        Command::Gpus { .. }
            | Command::Claims
            | Command::Profiles { .. }
            | Command::Mig {
                command: MigCommand::List
            }
    )
}

/// `--partitionable`'s Kubernetes version (`1.34`, `v1.35`) as its minor; partitionable
/// devices exist from 1.33.
fn kubernetes_minor(s: &str) -> Result<u32, String> {
    let bad = || format!("{s:?} is not a Kubernetes version such as 1.34 or 1.35");
    let (major, minor) = s.trim_start_matches('v').split_once('.').ok_or_else(bad)?;
    let minor: u32 = minor
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .ok_or_else(bad)?;
    if major != "1" {
        return Err(bad());
    }
    if minor < 33 {
        return Err(format!(
            "Kubernetes 1.{minor} has no partitionable devices (they came in 1.33)"
        ));
    }
    Ok(minor)
}

fn run(args: Args) -> Result<()> {
    // Before any command runs: only `gpus` has this output, and a silent fallback (or YAML
    // under another name) would hide the mistake.
    if args.output == Some(Output::ResourceSlice) && !matches!(args.command, Command::Gpus { .. }) {
        anyhow::bail!(
            "-o resourceslice applies to `gpushare gpus` only; use -o table, json or yaml here"
        );
    }
    // Likewise `-o wide`: the other commands print no table to widen.
    if args.output == Some(Output::Wide) && !has_wide_table(&args.command) {
        anyhow::bail!(
            "-o wide applies to the tables of `gpushare gpus`, `claims`, `mig list` and `profiles` only; use -o table, json or yaml here"
        );
    }
    // The version `-o resourceslice` writes, checked before anything is asked.
    let mut slice_version = gpushare_slice::ApiVersion::V1;
    if let Command::Gpus {
        partitionable,
        api_version,
    } = &args.command
    {
        if args.output == Some(Output::ResourceSlice) {
            slice_version = cli::slice_api_version(*api_version, *partitionable)?;
        } else if partitionable.is_some() {
            anyhow::bail!("--partitionable applies to `gpushare gpus -o resourceslice` only");
        } else if api_version.is_some() {
            anyhow::bail!("--api-version applies to `gpushare gpus -o resourceslice` only");
        }
    }
    match &args.command {
        Command::Doctor {
            simulate,
            config,
            containerd_config,
            state_dir,
            run_dir,
            cdi_dir,
            dra_config,
            dra_plugins_dir,
            dra_registry_dir,
        } => {
            let paths = cli::doctor::DoctorPaths {
                config: config
                    .clone()
                    .unwrap_or_else(|| PathBuf::from(daemon::DEFAULT_CONFIG_PATH)),
                config_required: config.is_some(),
                containerd_config: containerd_config.clone(),
                socket: args.socket.clone(),
                state_dir: state_dir.clone(),
                run_dir: run_dir.clone(),
                cdi_dir: cdi_dir.clone(),
                dra_config: dra_config.clone(),
                dra_plugins_dir: dra_plugins_dir.clone(),
                dra_registry_dir: dra_registry_dir.clone(),
                ..cli::doctor::DoctorPaths::default()
            };
            let host = cli::doctor::RealHost {
                timeout: Duration::from_secs(args.timeout.min(10)),
            };
            let report = cli::doctor::run(&paths, simulate.as_deref(), &host);
            print_structured_or(&report, args.output.unwrap_or(Output::Table), |r| r.text())?;
            if !report.ok {
                std::process::exit(1);
            }
            return Ok(());
        }
        Command::Completion { shell } => {
            clap_complete::generate(
                *shell,
                &mut <Args as clap::CommandFactory>::command(),
                "gpushare",
                &mut std::io::stdout(),
            );
            return Ok(());
        }
        Command::GenerateMan { dir } => {
            let cmd = <Args as clap::CommandFactory>::command();
            return cli::write_man_pages(&cmd, dir);
        }
        _ => {}
    }
    if let Command::Demo(demo) = &args.command {
        if args.socket.is_some() || args.output.is_some() {
            anyhow::bail!("gpushare demo starts its own daemon and prints tables: --socket and -o do not apply");
        }
        return cli::demo::run(demo);
    }
    let output = args.output.unwrap_or(Output::Table);
    if let Command::Profiles { profile } = &args.command {
        return profiles(profile.as_deref(), output);
    }
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(|| PathBuf::from(gpushare_proto::DEFAULT_SOCKET));
    // Changing commands say so before anything else: a non-root user usually cannot even
    // connect (the socket is 0660 root:root), and "permission denied" would hide why.
    match &args.command {
        Command::Prepare { .. } => require_root("prepare")?,
        Command::Unprepare { uid, .. } => {
            require_root("unprepare")?;
            if let Some(uid) = uid {
                claim_uid_arg(uid)?;
            }
        }
        Command::Claim { uid } => claim_uid_arg(uid)?,
        Command::Mig {
            command: MigCommand::Apply { .. },
        } => require_root("mig apply")?,
        _ => {}
    }
    let mut client =
        Client::connect(&socket, Duration::from_secs(args.timeout)).map_err(|e| match &e {
            gpushare_proto::ClientError::Connect { error, .. }
                if error.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                anyhow::anyhow!(
                    "{e} (this user may not use the socket: root may, and members of the group set by [socket] group in gpushared's config may read)"
                )
            }
            gpushare_proto::ClientError::NotASocket { .. } => anyhow::anyhow!(
                "{e} (--socket names gpushared's socket file, by default {})",
                gpushare_proto::DEFAULT_SOCKET
            ),
            gpushare_proto::ClientError::Connect { error, .. }
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                anyhow::anyhow!(
                    "{e} (gpushared runs but did not take the connection within {}s: its listen backlog is full; it may be wedged, see `journalctl -u gpushared`)",
                    args.timeout
                )
            }
            _ => anyhow::anyhow!("{e} (is gpushared running? --socket names another socket)"),
        })?;
    let none = None::<&()>;
    match &args.command {
        Command::Status => {
            let h: HealthInfo = client.call(Method::Health, none)?;
            let v: VersionInfo = client.call(Method::Version, none)?;
            let both = serde_json::json!({"health": h, "version": v});
            print_structured_or(&both, output, |_| cli::status_text(&h, &v))?;
        }
        Command::Gpus { partitionable, .. } => {
            let version = slice_version;
            let gpus: Vec<GpuInfo> = client.call(Method::ListGpus, none)?;
            if output == Output::ResourceSlice {
                let h: HealthInfo = client.call(Method::Health, none)?;
                match partitionable {
                    None => print!(
                        "{}",
                        cli::resource_slice_yaml(&gpus, &h.node_name, version)?
                    ),
                    Some(minor) => print!(
                        "{}",
                        cli::resource_pool_yaml(
                            &gpus,
                            &h.node_name,
                            gpushare_slice::Layout::partitionable(*minor),
                            version
                        )?
                    ),
                }
            } else {
                print_structured_or(&gpus, output, |g| gpus_table(g, output))?;
            }
        }
        Command::Claims => {
            // Page by page: no answer line of gpushared's is large, whatever the claim count.
            let claims = client.list_claims()?;
            print_structured_or(&claims, output, |c| {
                if output == Output::Wide {
                    cli::claims_table_wide(c)
                } else {
                    cli::claims_table(c)
                }
            })?;
        }
        Command::Claim { uid } => {
            let c: ClaimInfo = match resolve_claim(&mut client, uid, Use::Read)? {
                (_, Some(claim)) => claim,
                (uid, None) => client.call(Method::GetClaim, Some(&UidParams { uid }))?,
            };
            print_structured_or(&c, output, cli::claim_detail)?;
        }
        Command::Prepare { file } => {
            require_root("prepare")?;
            let text = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).context("reading stdin")?
            } else {
                std::fs::read_to_string(file)
                    .with_context(|| format!("reading {}", file.display()))?
            };
            let claim = daemon::parse_claim_document(&text)
                .map_err(|e| anyhow::anyhow!("{}: {}: {}", file.display(), e.code, e.message))?;
            let r: PrepareResult = client.call(Method::Prepare, Some(&PrepareParams { claim }))?;
            print_structured_or(&r, output, |r| {
                let mut s = format!(
                    "claim {} {}\n",
                    r.uid,
                    if r.already_prepared {
                        "was already prepared"
                    } else {
                        "prepared"
                    }
                );
                for q in &r.requests {
                    s += &format!("  request {}: {}\n", q.request, q.cdi_device_ids.join(","));
                }
                s
            })?;
        }
        Command::Unprepare { uid: Some(uid), .. } => {
            require_root("unprepare")?;
            let uid = &resolve_claim(&mut client, uid, Use::Release)?.0;
            let r: UnprepareResult =
                client.call(Method::Unprepare, Some(&UidParams { uid: uid.clone() }))?;
            if !r.released {
                // The socket's unprepare of an unknown claim is a success (kubelet retries
                // it), but an operator who named one expected it released: a typo must not
                // pass for done. -o json/yaml still print the answer.
                if output != Output::Table {
                    print_structured_or(&r, output, unprepared_line)?;
                }
                anyhow::bail!("{}", no_claim_released(uid));
            }
            print_structured_or(&r, output, unprepared_line)?;
        }
        Command::Unprepare { uid: None, .. } => {
            require_root("unprepare --all")?;
            unprepare_all(&mut client, output)?;
        }
        Command::Mig {
            command: MigCommand::List,
        } => {
            let gpus: Vec<GpuInfo> = client.call(Method::ListGpus, none)?;
            let devices: Vec<serde_json::Value> = gpus
                .iter()
                .flat_map(|g| {
                    g.mig_devices.iter().map(move |d| {
                        serde_json::json!({"gpu": g.name, "device": d.device_name(g.minor), "mig": d})
                    })
                })
                .collect();
            print_structured_or(&devices, output, |_| {
                if output == Output::Wide {
                    cli::mig_table_wide(&gpus)
                } else {
                    cli::mig_table(&gpus)
                }
            })?;
        }
        Command::Mig {
            command: MigCommand::Plan { file, config } | MigCommand::Apply { file, config },
        } => {
            let dry_run = matches!(
                &args.command,
                Command::Mig {
                    command: MigCommand::Plan { .. }
                }
            );
            if !dry_run {
                require_root("mig apply")?;
            }
            let layout = std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?;
            let r: MigApplyResult = client.call(
                Method::MigApply,
                Some(&MigApplyParams {
                    layout,
                    config: config.clone(),
                    dry_run,
                }),
            )?;
            print_structured_or(&r, output, cli::mig_plan_text)?;
        }
        Command::Demo(_)
        | Command::Profiles { .. }
        | Command::Doctor { .. }
        | Command::Completion { .. }
        | Command::GenerateMan { .. } => unreachable!("handled above"),
    }
    Ok(())
}
