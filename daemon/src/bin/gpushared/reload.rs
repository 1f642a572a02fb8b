//! SIGHUP: what a reload applies at once (`[log] level`, `[metrics]`, a new try of a failing
//! driver CDI spec) and what it names as waiting for the next restart.

use std::sync::Arc;

use gpushare::daemon_config::DaemonConfig;
use gpushare::notify;

use crate::args::Args;
use crate::logging::FilterHandle;
use crate::metrics_endpoint::start_metrics;

/// Keys whose change a reload cannot apply (they take effect at the next restart).
fn restart_only_changes(old: &DaemonConfig, new: &DaemonConfig) -> Vec<&'static str> {
    let mut changed = Vec::new();
    let mut check = |key: &'static str, differs: bool| {
        if differs {
            changed.push(key);
        }
    };
    check("[paths]", old.paths != new.paths);
    check("[node]", old.node != new.node);
    check("[socket]", old.socket != new.socket);
    check("[mps]", old.mps != new.mps);
    check("[hook]", old.hook != new.hook);
    check("[cdi]", old.cdi != new.cdi);
    check("[gpus]", old.gpus != new.gpus);
    check(
        "metrics.allow_non_loopback",
        old.metrics.allow_non_loopback != new.metrics.allow_non_loopback,
    );
    changed
}

/// What a reload may change while the daemon runs: the settings in effect, the log filter,
/// the metrics endpoint (its address and task) and the registry it serves.
pub(crate) struct Running {
    pub(crate) settings: DaemonConfig,
    pub(crate) filter: Option<FilterHandle>,
    pub(crate) metrics: Option<(String, tokio::task::JoinHandle<()>)>,
    pub(crate) registry: Arc<prometheus_client::registry::Registry>,
    /// The driver's CDI spec: a reload runs a failing generator again at once.
    pub(crate) driver_spec: Option<Arc<gpushare::driver_spec::DriverSpecs>>,
}

impl Running {
    /// SIGHUP: re-reads the config file (with the command line laid over it again) and applies
    /// `[log] level` and `[metrics]`; a bad file is refused and nothing changes. A driver CDI
    /// spec whose generation fails is generated again at once.
    pub(crate) async fn reload(&mut self, args: &Args) {
        notify::reloading();
        let new = match args.settings() {
            Ok(new) => new,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "reload refused: the config file has an error; keeping the running configuration");
                notify::ready("reload refused: config file error (see the journal); serving");
                return;
            }
        };
        let waiting = restart_only_changes(&self.settings, &new);
        if !waiting.is_empty() {
            tracing::warn!(keys = %waiting.join(", "), "changed keys take effect at the next restart");
        }
        if new.log.level != self.settings.log.level {
            match (
                &self.filter,
                tracing_subscriber::EnvFilter::try_new(&new.log.level),
            ) {
                (Some(handle), Ok(filter)) => match handle.reload(filter) {
                    Ok(()) => tracing::info!(level = %new.log.level, "log level changed"),
                    Err(e) => tracing::error!(error = %e, "changing the log level failed"),
                },
                (None, _) => tracing::warn!("RUST_LOG is set: log.level is ignored"),
                (Some(_), Err(e)) => tracing::error!(error = %e, "log.level refused"),
            }
        }
        // Also retried when it is wanted but not served (its port was taken at start).
        if new.metrics.enabled != self.settings.metrics.enabled
            || new.metrics.address != self.settings.metrics.address
            || (new.metrics.enabled && self.metrics.is_none())
        {
            // The old endpoint goes first: the new one may want the same port.
            if let Some((_, task)) = self.metrics.take() {
                task.abort();
                let _ = task.await;
            }
            match start_metrics(&new, &self.registry).await {
                Ok(m) => {
                    if m.is_none() {
                        tracing::info!("metrics endpoint turned off");
                    }
                    self.metrics = m;
                }
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "metrics endpoint not served after reload")
                }
            }
        }
        // An operator who fixed the node (a driver reloaded, a toolkit repaired) reloads: a
        // failing generator runs now, not after its back-off. In the background: a reload
        // answers at once, and the generation logs how it went.
        if let Some(specs) = &self.driver_spec {
            let specs = Arc::clone(specs);
            drop(tokio::task::spawn_blocking(move || {
                if let Some(Ok(())) = specs.retry_now() {
                    tracing::info!("reload: the NVIDIA driver's CDI spec is generated again");
                }
            }));
        }
        // What a reload did not apply stays as it was, so the next reload compares with it.
        let mut applied = self.settings.clone();
        applied.log = new.log;
        applied.metrics.enabled = new.metrics.enabled;
        applied.metrics.address = new.metrics.address;
        self.settings = applied;
        tracing::info!("configuration reloaded");
        notify::ready("serving (configuration reloaded)");
    }
}
