//! The Prometheus metrics endpoint (`[metrics]`), started at start and again at a reload.

use std::sync::Arc;

use anyhow::{Context, Result};

use gpushare::daemon_config::DaemonConfig;
use gpushare::metrics;

/// The metrics endpoint, when enabled: bound now (a bad address fails start-up), served by a
/// task that stops when the returned handle is aborted.
pub(crate) async fn start_metrics(
    settings: &DaemonConfig,
    registry: &Arc<prometheus_client::registry::Registry>,
) -> Result<Option<(String, tokio::task::JoinHandle<()>)>> {
    if !settings.metrics.enabled {
        return Ok(None);
    }
    let addr: std::net::SocketAddr = settings
        .metrics
        .address
        .parse()
        .with_context(|| format!("metrics.address {:?}", settings.metrics.address))?;
    let listener = metrics::bind(addr)
        .await
        .with_context(|| format!("binding the metrics endpoint {addr}"))?;
    let bound = listener.local_addr().map_or(addr, |a| a);
    tracing::info!(address = %bound, "serving metrics at /metrics");
    let task = tokio::spawn(metrics::serve(listener, Arc::clone(registry)));
    Ok(Some((settings.metrics.address.clone(), task)))
}
