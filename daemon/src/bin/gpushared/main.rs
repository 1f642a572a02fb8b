//! `gpushared`: the node daemon that owns every GPU sharing decision on its node.

mod args;
mod backends;
mod host;
mod logging;
mod metrics_endpoint;
mod reload;
mod run;
mod watchdog;

use anyhow::{bail, Context, Result};
use clap::Parser;

use gpushare::daemon_config::DEFAULT_CONFIG;
use gpushare::privileges;

use crate::args::Args;
use crate::run::run;

/// Caps glibc's malloc at two arenas. By default each thread that allocates gets its own arena
/// (up to eight per core), and the blocking pool's threads each kept the peak of a checkpoint
/// rebuild long after it was freed: at 1,000 claims the idle daemon's RSS was 46 MiB with the
/// default and 19 MiB with two arenas (bench/, "Footprint"). Its work is mostly waiting on
/// processes and disks, so fewer arenas cost nothing measurable.
fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes the allocator's tuning; it runs before any other thread
    // exists, and M_ARENA_MAX with a positive value is a documented, always-valid setting.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Prints `text` on stdout. A reader that is gone (`gpushared --print-default-config | head`)
/// ends the output quietly: the daemon keeps Rust's ignored SIGPIPE (a client that hangs up
/// must never kill it), so the write fails with EPIPE, where `print!` would panic.
fn print_quietly(text: &str) -> Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

/// Parses the command line and the config file, drops capabilities while the process has
/// one thread (they are per thread), then runs the daemon.
fn start() -> Result<()> {
    let args = Args::parse();
    if args.print_default_config {
        return print_quietly(DEFAULT_CONFIG);
    }
    if let Some(dir) = &args.generate_man {
        let mut out = Vec::new();
        clap_mangen::Man::new(<Args as clap::CommandFactory>::command())
            .section("8")
            .render(&mut out)
            .context("rendering the man page")?;
        let path = dir.join("gpushared.8");
        std::fs::write(&path, out).with_context(|| format!("writing {}", path.display()))?;
        return Ok(());
    }
    // Everything past here needs root (mounts, MPS control daemons that switch to their
    // clients' uids, device nodes, GPU settings, /run): say so once, before any of it fails
    // on its own with a message that hides why.
    let euid = nix::unistd::geteuid();
    if !euid.is_root() {
        bail!(
            "gpushared must run as root (this is uid {euid}): it mounts each MPS claim's /dev/shm, starts MPS control daemons as their clients' users and changes GPU settings; run it with sudo, or as the gpushared systemd service"
        );
    }
    let settings = args.settings()?;
    limit_malloc_arenas();
    let keep = privileges::kept(!settings.gpus.simulate.is_empty());
    let outcome = privileges::drop_to(&keep)?;
    run(args, settings, keep, outcome)
}

fn main() -> std::process::ExitCode {
    match start() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // One line for the journal, whatever RUST_BACKTRACE says.
            eprintln!("gpushared: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
