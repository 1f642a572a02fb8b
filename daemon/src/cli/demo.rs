//! `gpushare demo`: the whole job on a simulated node, from claim files to a container.

/// Flags of `gpushare demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {}

/// Runs the demo.
///
/// # Errors
/// Any step failed.
pub fn run(_args: &DemoArgs, _output: super::Output) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
