//! Prometheus metrics (OpenMetrics text, `prometheus-client`), served over HTTP on a loopback
//! address (`[metrics]` in the config file).
//!
//! Two kinds of families:
//! - **Recorded** at the server layer, where each request is dispatched ([`RequestMetrics`]):
//!   prepare and unprepare latency histograms and errors by code.
//! - **Gathered at scrape time** from the service's read views ([`ServiceCollector`]): per-GPU
//!   sharing and compute mode, per-claim strategy, attached containers and degraded state,
//!   MPS control daemon up and restarts (as the service counts them in each claim record),
//!   the checkpoint's health (quarantined at start, last write failed) and checkpoint writes
//!   (a counter kept by [`crate::checkpoint`]). Nothing inside the service knows about
//!   metrics.
//!
//! Names follow Prometheus conventions: `gpushare_` prefix, base units (`_seconds`), counters
//! end in `_total` (added by the encoder), state as info-style gauges whose value is 1.
//!
//! Here: the request recorder, the registry and its text. The scrape-time families are in
//! `metrics/collector.rs`, the HTTP listener that serves them in `metrics/listener.rs`; both
//! are re-exported from here.

mod collector;
mod listener;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use gpushare_proto::ErrorCode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

pub use collector::{mps_daemons, pid_alive, MpsDaemonSeen, PidAlive, ServiceCollector};
pub use listener::{bind, serve};

/// The content type of what [`render`] returns (OpenMetrics 1.0 text, which Prometheus
/// scrapes natively).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Latency buckets in seconds: a time-sliced or exclusive prepare takes milliseconds, an MPS
/// prepare (start a control daemon, set limits, read them back) up to the MPS timeout.
const LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

type Labels = Vec<(&'static str, String)>;

/// Metrics recorded where requests are dispatched (`server.rs`).
#[derive(Debug)]
pub struct RequestMetrics {
    prepare_seconds: Family<Labels, Histogram>,
    unprepare_seconds: Family<Labels, Histogram>,
    errors: Family<Labels, Counter>,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

impl Default for RequestMetrics {
    fn default() -> Self {
        RequestMetrics {
            prepare_seconds: Family::new_with_constructor(latency_histogram),
            unprepare_seconds: Family::new_with_constructor(latency_histogram),
            errors: Family::default(),
        }
    }
}

impl RequestMetrics {
    /// Records one answered request: latency for prepare and unprepare (labelled
    /// `outcome="ok"` or the error code), and an error count by method and code.
    pub fn observe(
        &self,
        method: gpushare_proto::Method,
        error: Option<ErrorCode>,
        took: Duration,
    ) {
        let outcome = error.map_or("ok", ErrorCode::as_str).to_string();
        let labels = vec![("outcome", outcome)];
        match method {
            gpushare_proto::Method::Prepare => self
                .prepare_seconds
                .get_or_create(&labels)
                .observe(took.as_secs_f64()),
            gpushare_proto::Method::Unprepare => self
                .unprepare_seconds
                .get_or_create(&labels)
                .observe(took.as_secs_f64()),
            _ => {}
        }
        if let Some(code) = error {
            self.errors
                .get_or_create(&vec![
                    ("method", method.as_str().to_string()),
                    ("code", code.as_str().to_string()),
                ])
                .inc();
        }
    }
}

/// Builds the registry: build info, the request metrics and the scrape-time collector.
pub fn registry(requests: &Arc<RequestMetrics>, collector: ServiceCollector) -> Registry {
    let mut r = Registry::default();
    let info = prometheus_client::metrics::info::Info::new(vec![(
        "version",
        env!("CARGO_PKG_VERSION").to_string(),
    )]);
    r.register("gpushare_build", "gpushared's version", info);
    // The successful series exist from the start (count 0), so that rate() and alerts see
    // them before the first claim arrives.
    let ok = vec![("outcome", "ok".to_string())];
    drop(requests.prepare_seconds.get_or_create(&ok));
    drop(requests.unprepare_seconds.get_or_create(&ok));
    r.register(
        "gpushare_prepare_duration_seconds",
        "Time to answer prepare requests, by outcome (ok or the error code)",
        requests.prepare_seconds.clone(),
    );
    r.register(
        "gpushare_unprepare_duration_seconds",
        "Time to answer unprepare requests, by outcome (ok or the error code)",
        requests.unprepare_seconds.clone(),
    );
    r.register(
        "gpushare_request_errors",
        "Requests answered with an error, by method and error code",
        requests.errors.clone(),
    );
    r.register_collector(Box::new(collector));
    r
}

/// The registry's OpenMetrics text.
///
/// # Errors
/// Formatting failed (only if a collector fails).
pub fn render(registry: &Registry) -> Result<String, fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
