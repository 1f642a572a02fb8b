//! `gpushared`'s log output, and the handle that changes its filter on reload.

use anyhow::{Context, Result};

/// The reload handle of the log filter (`[log] level`).
pub(crate) type FilterHandle =
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>;

/// Logging: one line per event on stderr. Under systemd (`JOURNAL_STREAM` set) the journal
/// stamps each line itself, so no timestamp and no colour. `RUST_LOG` wins over `[log] level`;
/// the returned handle changes the filter on reload.
pub(crate) fn init_logging(level: &str) -> Result<Option<FilterHandle>> {
    use tracing_subscriber::prelude::*;
    let from_env = std::env::var_os("RUST_LOG").is_some();
    let filter = if from_env {
        tracing_subscriber::EnvFilter::try_from_default_env().context("RUST_LOG")?
    } else {
        tracing_subscriber::EnvFilter::try_new(level).context("log.level")?
    };
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(!journal && std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let registry = tracing_subscriber::registry().with(filter);
    if journal {
        registry.with(fmt.without_time()).init();
    } else {
        registry.with(fmt).init();
    }
    Ok((!from_env).then_some(handle))
}
