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

use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gpushare_proto::{ComputeMode, ErrorCode, GpuInfo, GpuSharing, HealthInfo};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::claim::{Claim, Phase};
use crate::service::Service;

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

/// Whether a process runs: the one effect scraping needs (MPS control daemon up), kept behind
/// a function so that tests decide.
pub type PidAlive = Arc<dyn Fn(i32) -> bool + Send + Sync>;

/// Whether `pid` exists, by `kill(pid, 0)` (EPERM still means it exists).
pub fn pid_alive(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(e) => e == nix::errno::Errno::EPERM,
    }
}

/// Families read from the service at each scrape.
pub struct ServiceCollector {
    service: Arc<Service>,
    alive: PidAlive,
}

impl fmt::Debug for ServiceCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceCollector").finish_non_exhaustive()
    }
}

fn compute_mode_str(m: ComputeMode) -> &'static str {
    match m {
        ComputeMode::Default => "Default",
        ComputeMode::Prohibited => "Prohibited",
        ComputeMode::ExclusiveProcess => "ExclusiveProcess",
    }
}

fn sharing_str(s: GpuSharing) -> &'static str {
    match s {
        GpuSharing::Free => "Free",
        GpuSharing::Exclusive => "Exclusive",
        GpuSharing::TimeSlicing => "TimeSlicing",
        GpuSharing::Mps => "MPS",
        GpuSharing::Mig => "MIG",
    }
}

fn encode_family<M: EncodeMetric + prometheus_client::metrics::TypedMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    family: &Family<Labels, M>,
) -> Result<(), fmt::Error>
where
    Family<Labels, M>: EncodeMetric,
{
    let metric = encoder.encode_descriptor(name, help, None, family.metric_type())?;
    family.encode(metric)
}

/// One MPS control daemon as a scrape sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsDaemonSeen {
    /// The claim's UID.
    pub claim: String,
    /// Index of the MPS device group in the claim.
    pub group: usize,
    /// The control daemon's pid now.
    pub pid: i32,
    /// Times the service restarted this daemon after it died, as the claim record counts
    /// them (kept in the checkpoint, so across restarts of gpushared too).
    pub restarts: u64,
}

/// Every MPS control daemon of `claims`, with its restart count from the claim record.
pub fn mps_daemons(claims: &[Arc<Claim>]) -> Vec<MpsDaemonSeen> {
    claims
        .iter()
        .flat_map(|c| {
            c.groups.iter().enumerate().filter_map(move |(i, g)| {
                g.mps().map(|m| MpsDaemonSeen {
                    claim: c.uid.clone(),
                    group: i,
                    pid: m.control_daemon_pid,
                    restarts: u64::from(m.restarts),
                })
            })
        })
        .collect()
}

/// Encodes a gauge without labels.
fn encode_gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), fmt::Error> {
    let g = ConstGauge::new(value);
    let m = encoder.encode_descriptor(name, help, None, g.metric_type())?;
    g.encode(m)
}

/// The service's health as gauges: degraded claims, the checkpoint's state and the driver's
/// CDI spec's.
fn encode_health(encoder: &mut DescriptorEncoder, health: &HealthInfo) -> Result<(), fmt::Error> {
    encode_gauge(
        encoder,
        "gpushare_degraded_claims",
        "Claims whose MPS control daemon died and is being restarted (state Degraded).",
        i64::try_from(health.degraded_claims).unwrap_or(i64::MAX),
    )?;
    encode_gauge(
        encoder,
        "gpushare_checkpoint_quarantined",
        "Whether the checkpoint was corrupt at start and moved aside (1) or not (0); see gpushare status.",
        i64::from(health.checkpoint_quarantined.is_some()),
    )?;
    encode_gauge(
        encoder,
        "gpushare_quarantined_records",
        "Claim records refused at start and kept in quarantine (their claims not re-adopted); see gpushare status.",
        i64::try_from(health.quarantined_records.len()).unwrap_or(i64::MAX),
    )?;
    encode_gauge(
        encoder,
        "gpushare_checkpoint_write_error",
        "Whether the last checkpoint write failed (1: changing requests fail until one succeeds) or not (0).",
        i64::from(health.checkpoint_error.is_some()),
    )?;
    // gpushare_ready keeps its meaning (changing requests are accepted: releases work, and
    // prepares that need no driver spec); this is the gauge that says prepares fail.
    let failing = health.driver_spec.as_ref().filter(|d| !d.ok);
    encode_gauge(
        encoder,
        "gpushare_driver_spec_error",
        "Whether the NVIDIA driver's CDI spec cannot be generated (1: every prepare that needs it is refused; gpushare status says why) or can (0).",
        i64::from(failing.is_some()),
    )?;
    encode_gauge(
        encoder,
        "gpushare_driver_spec_failures",
        "Failed generations of the NVIDIA driver's CDI spec in a row (0 once one succeeds).",
        i64::from(failing.map_or(0, |d| d.failures)),
    )
}

impl ServiceCollector {
    /// A collector over `service`; `alive` tells whether an MPS control daemon's pid runs.
    pub fn new(service: Arc<Service>, alive: PidAlive) -> ServiceCollector {
        ServiceCollector { service, alive }
    }

    fn encode_views(
        &self,
        encoder: &mut DescriptorEncoder,
        gpus: &[GpuInfo],
        claims: &[Arc<Claim>],
    ) -> Result<(), fmt::Error> {
        let sharing: Family<Labels, Gauge> = Family::default();
        let compute: Family<Labels, Gauge> = Family::default();
        for g in gpus {
            let gpu = || vec![("gpu", g.name.clone()), ("uuid", g.uuid.clone())];
            let mut l = gpu();
            l.push(("mode", sharing_str(g.sharing).to_string()));
            sharing.get_or_create(&l).set(1);
            let mut l = gpu();
            l.push(("compute_mode", compute_mode_str(g.compute_mode).to_string()));
            compute.get_or_create(&l).set(1);
        }
        encode_family(
            encoder,
            "gpushare_gpu_sharing_mode",
            "How each GPU is shared (1 for the current mode: Free, Exclusive, TimeSlicing, MPS).",
            &sharing,
        )?;
        encode_family(
            encoder,
            "gpushare_gpu_compute_mode",
            "Each GPU's compute mode as gpushared reads it (1 for the current mode).",
            &compute,
        )?;

        let strategy: Family<Labels, Gauge> = Family::default();
        let attached: Family<Labels, Gauge> = Family::default();
        let degraded: Family<Labels, Gauge> = Family::default();
        let mps_up: Family<Labels, Gauge> = Family::default();
        let mps_restarts: Family<Labels, Counter> = Family::default();
        for c in claims {
            for g in &c.groups {
                let l = vec![
                    ("claim", c.uid.clone()),
                    ("namespace", c.namespace.clone()),
                    ("name", c.name.clone()),
                    ("strategy", g.sharing.name().to_string()),
                ];
                strategy.get_or_create(&l).set(1);
            }
            attached
                .get_or_create(&vec![("claim", c.uid.clone())])
                .set(c.attached.len() as i64);
            degraded
                .get_or_create(&vec![("claim", c.uid.clone())])
                .set(i64::from(c.phase == Phase::Degraded));
        }
        for d in mps_daemons(claims) {
            let l = vec![("claim", d.claim), ("group", d.group.to_string())];
            let up = d.pid > 0 && (self.alive)(d.pid);
            mps_up.get_or_create(&l).set(i64::from(up));
            mps_restarts.get_or_create(&l).inc_by(d.restarts);
        }
        encode_family(
            encoder,
            "gpushare_claim_strategy",
            "Sharing strategy of each prepared claim's device groups: Exclusive, TimeSlicing, MPS or MIG (1 per claim and strategy).",
            &strategy,
        )?;
        encode_family(
            encoder,
            "gpushare_claim_attached_containers",
            "Containers attached to each claim through the OCI hook.",
            &attached,
        )?;
        encode_family(
            encoder,
            "gpushare_claim_degraded",
            "Whether each claim is Degraded (1: its MPS control daemon died and is being restarted) or not (0).",
            &degraded,
        )?;
        encode_family(
            encoder,
            "gpushare_mps_daemon_up",
            "Whether each MPS claim's control daemon runs (1) or not (0).",
            &mps_up,
        )?;
        encode_family(
            encoder,
            "gpushare_mps_daemon_restarts",
            "Times gpushared restarted an MPS claim's control daemon after it died.",
            &mps_restarts,
        )?;
        Ok(())
    }
}

impl Collector for ServiceCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let gpus = self.service.list_gpus();
        // Shared with the published view, not copied.
        let claims = self.service.claims();
        let health = self.service.health();
        let ready = ConstGauge::new(i64::from(health.ready));
        let m = encoder.encode_descriptor(
            "gpushare_ready",
            "Whether gpushared accepts changing requests (1) or not (0).",
            None,
            ready.metric_type(),
        )?;
        ready.encode(m)?;
        self.encode_views(&mut encoder, &gpus, &claims)?;
        encode_health(&mut encoder, &health)?;
        let (writes, failures) = crate::checkpoint::write_counts();
        let c = ConstCounter::new(writes);
        let m = encoder.encode_descriptor(
            "gpushare_checkpoint_writes",
            "Checkpoint files written (atomically) since start.",
            None,
            c.metric_type(),
        )?;
        c.encode(m)?;
        let c = ConstCounter::new(failures);
        let m = encoder.encode_descriptor(
            "gpushare_checkpoint_write_failures",
            "Checkpoint writes that failed since start (the previous checkpoint stayed).",
            None,
            c.metric_type(),
        )?;
        c.encode(m)
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

/// Binds the metrics listener.
///
/// # Errors
/// The address cannot be bound.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// Serves `GET /metrics` on `listener` until the task is dropped; every other path is 404 and
/// every other method 405. Each scrape renders on the blocking pool: reading the service's
/// views takes its registry lock.
pub async fn serve(listener: tokio::net::TcpListener, registry: Arc<Registry>) {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::{Method, Request, Response, StatusCode};

    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a metrics connection failed; pausing");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let registry = Arc::clone(&registry);
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let registry = Arc::clone(&registry);
                async move {
                    let reply = |status: StatusCode, ctype: &str, body: String| {
                        let mut r = Response::new(Full::new(Bytes::from(body)));
                        *r.status_mut() = status;
                        if let Ok(v) = hyper::header::HeaderValue::from_str(ctype) {
                            r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
                        }
                        r
                    };
                    let text = "text/plain; charset=utf-8";
                    if req.uri().path() != "/metrics" {
                        return Ok::<_, Infallible>(reply(
                            StatusCode::NOT_FOUND,
                            text,
                            "only /metrics is served here\n".into(),
                        ));
                    }
                    if req.method() != Method::GET && req.method() != Method::HEAD {
                        return Ok(reply(
                            StatusCode::METHOD_NOT_ALLOWED,
                            text,
                            "use GET\n".into(),
                        ));
                    }
                    let rendered = tokio::task::spawn_blocking(move || render(&registry)).await;
                    Ok(match rendered {
                        Ok(Ok(body)) => reply(StatusCode::OK, CONTENT_TYPE, body),
                        _ => reply(
                            StatusCode::INTERNAL_SERVER_ERROR,
                            text,
                            "rendering metrics failed\n".into(),
                        ),
                    })
                }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            // A scraper that stalls must not hold a task forever.
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(io, svc);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "metrics connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
#[path = "metrics_tests.rs"]
mod tests;
