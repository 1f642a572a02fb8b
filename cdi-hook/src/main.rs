//! `gpushare-cdi-hook attach|detach --socket PATH --claim UID [--timeout SECS]`, run by the
//! container runtime with the OCI state on stdin. See the library for what each hook does.

use std::ffi::OsString;
use std::io;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{Args, Parser, Subcommand};
use gpushare_cdi_hook::hook::{self, HookOptions};
use gpushare_cdi_hook::report;

/// OCI hook that ties containers to their gpushare claims.
#[derive(Debug, Parser)]
#[command(name = "gpushare-cdi-hook", version)]
struct Cli {
    /// Write the man page gpushare-cdi-hook.8 into this directory and exit (for packaging).
    #[arg(long, value_name = "DIR", hide = true)]
    generate_man: Option<PathBuf>,
    #[command(subcommand)]
    hook: Option<Hook>,
}

/// Writes `gpushare-cdi-hook.8` into `dir`, generated from the clap definition.
fn generate_man(dir: &std::path::Path) -> ExitCode {
    let mut out = Vec::new();
    let path = dir.join("gpushare-cdi-hook.8");
    let written = clap_mangen::Man::new(<Cli as clap::CommandFactory>::command())
        .section("8")
        .render(&mut out)
        .and_then(|()| std::fs::write(&path, out));
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}: writing {}: {e}", report::PROGRAM, path.display());
            ExitCode::FAILURE
        }
    }
}

#[derive(Debug, Subcommand)]
enum Hook {
    /// createRuntime: attach the container to the claim; fails the start if the daemon refuses.
    Attach(HookArgs),
    /// poststop: detach the container from the claim; never fails.
    Detach(HookArgs),
    /// Any other name: ignored, so newer or older CDI specs never block a container.
    #[command(external_subcommand)]
    Unsupported(Vec<OsString>),
}

#[derive(Debug, Args)]
struct HookArgs {
    /// The daemon's socket.
    #[arg(long, value_name = "PATH", default_value = gpushare_proto::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// UID of the claim the container belongs to.
    #[arg(long, value_name = "UID", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    claim: String,
    /// Bound on the whole run: reading stdin and the exchange with the daemon.
    #[arg(long, value_name = "SECS", default_value_t = 5,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout: u64,
}

impl From<HookArgs> for HookOptions {
    fn from(args: HookArgs) -> HookOptions {
        HookOptions {
            socket: args.socket,
            claim_uid: args.claim,
            timeout_secs: args.timeout,
        }
    }
}

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(err) => return usage_error(&err, argv.get(1)),
    };
    if let Some(dir) = &cli.generate_man {
        return generate_man(dir);
    }
    match cli.hook {
        Some(Hook::Attach(args)) => match hook::attach(&args.into(), io::stdin()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("{}", report::attach_error_line(&err));
                ExitCode::FAILURE
            }
        },
        Some(Hook::Detach(args)) => {
            if let Err(err) = hook::detach(&args.into(), io::stdin()) {
                eprintln!("{}", report::detach_warning_line(&err));
            }
            ExitCode::SUCCESS
        }
        Some(Hook::Unsupported(args)) => unsupported(args.first()),
        None => {
            // No CDI spec runs the hook without a hook name: someone is trying it by hand.
            eprintln!("{}", report::no_hook_line());
            ExitCode::from(2)
        }
    }
}

/// Bad arguments fail only `attach`. `detach` must never fail, and anything else (including an
/// unknown top-level flag) is an unsupported hook: NVIDIA's hook set that rule so specs written
/// for other versions never block a container.
fn usage_error(err: &clap::Error, first: Option<&OsString>) -> ExitCode {
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
    ) {
        // Prints to stdout; nothing useful can be done if that fails.
        let _ = err.print();
        return ExitCode::SUCCESS;
    }
    let rendered = err.render().to_string();
    match first.and_then(|arg| arg.to_str()) {
        Some("attach") => {
            eprintln!("{}", report::usage_line("attach", false, &rendered));
            ExitCode::FAILURE
        }
        Some("detach") => {
            eprintln!("{}", report::usage_line("detach", true, &rendered));
            ExitCode::SUCCESS
        }
        _ => unsupported(first),
    }
}

fn unsupported(hook: Option<&OsString>) -> ExitCode {
    eprintln!(
        "{}",
        report::unsupported_line(hook.map(OsString::as_os_str))
    );
    ExitCode::SUCCESS
}
