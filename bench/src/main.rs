//! `gpushare-bench`: measures gpushare against its baselines in one run and writes
//! BENCHMARKS.md. Run it through `bench/run.sh`, which builds the binaries first.
//!
//! Every figure is taken beside its baseline in the same run (interleaved sample by sample
//! where the two can alternate), because absolute times on a shared machine are noise and
//! ratios are not. The daemon is driven only through its public interfaces: the `gpushared`
//! binary with `--simulate`, the socket protocol, `gpushare-cdi-hook`, `gpushare-runtime`,
//! runc and podman.

mod daemon;
mod dra;
mod dra_memory;
mod measure;
mod readers;
mod report;
mod stats;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// Measure gpushare against its baselines and write BENCHMARKS.md.
#[derive(Debug, Parser)]
#[command(name = "gpushare-bench")]
pub struct Cli {
    /// Directory of the binaries under test (gpushared, gpushare-cdi-hook, gpushare-runtime,
    /// gpushare-mps-control).
    #[arg(long, value_name = "DIR")]
    pub bin_dir: PathBuf,
    /// Where to write the report.
    #[arg(long, value_name = "FILE", default_value = "BENCHMARKS.md")]
    pub out: PathBuf,
    /// Cut every size down (a minute or two): checks that each measurement works, not speed.
    #[arg(long)]
    pub smoke: bool,
    /// The command line to print as "reproduce" in the report.
    #[arg(long, value_name = "CMD", default_value = "bench/run.sh")]
    pub command: String,
    /// Run only one group of measurements: `dra` (the DRA kubelet plugin), `hook`, `shim`,
    /// `scale` (prepare per strategy, then scaling, footprint and recovery), `mps-scale`
    /// (MPS prepare with NVIDIA's control program while 10,000 claims are held), `readers`
    /// (gpushared's memory with unread `list_claims` answers), or `cluster` (pods with claims on
    /// the tests' real one-node Kubernetes cluster). The report then holds only those
    /// sections and targets; for iterating on one figure, not for BENCHMARKS.md.
    #[arg(long, value_name = "SECTION", value_parser = ["dra", "hook", "shim", "scale", "mps-scale", "readers", "cluster"])]
    pub only: Option<String>,
    /// Markdown file appended to the report as its notes.
    #[arg(long, value_name = "FILE")]
    pub notes: Option<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match measure::run(&cli) {
        Ok(report) => {
            if cli.smoke {
                println!(
                    "smoke run: sizes cut down on the debug build; the figures below only show \
                     that every measurement works and judge no target (bench/run.sh does)"
                );
            }
            for t in &report.targets {
                println!(
                    "{}: {}: {} {} (limit {} {})",
                    t.verdict(cli.smoke),
                    t.name,
                    report::num(t.measured),
                    t.unit,
                    report::num(t.limit),
                    t.unit
                );
            }
            println!("wrote {}", cli.out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gpushare-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
