//! Prometheus metrics, `/healthz` (readiness) and `/livez` (liveness), served on `--metrics-address` (default
//! `127.0.0.1:9472`; gpushared's are on 9471).
//!
//! | family | type | labels |
//! |---|---|---|
//! | `gpushare_dra_claims_total` | counter: claims answered | `method` (`NodePrepareResources`, `NodeUnprepareResources`), `outcome` (`ok`, gpushared's error code, `ApiError`, `Unreachable`, `Timeout`, `Replaced`, `NotAllocated`) |
//! | `gpushare_dra_claim_duration_seconds` | histogram | `method` |
//! | `gpushare_dra_calls_total` | counter: kubelet calls (a call without claims, a health probe's, is not counted) | `method`, `version` (`v1`, `v1beta1`) |
//! | `gpushare_dra_published_slices`, `gpushare_dra_published_devices` | gauge | |
//! | `gpushare_dra_api_errors_total` | counter | `operation` |
//! | `gpushare_dra_api_oversized_answers_total` | counter: API-server answers cut off past their bound ([`crate::api::OBJECT_LIMIT`]) | `operation` (`get_claim`, `list_slices`, `watch_slices`, …) |
//! | `gpushare_dra_registered` | gauge: 1 registered, 0 not yet, -1 refused by kubelet | |
//! | `gpushare_dra_gpushared_up` | gauge (0/1) | |

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::state::{Gpushared, Registration, State};

type Labels = Vec<(&'static str, String)>;

/// The content type of `/metrics` (OpenMetrics 1.0 text).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Every metric of the plugin.
#[derive(Debug)]
pub struct Metrics {
    claims: Family<Labels, Counter>,
    durations: Family<Labels, Histogram>,
    calls: Family<Labels, Counter>,
    api_errors: Family<Labels, Counter>,
    /// Slices this plugin last published.
    pub published_slices: Gauge,
    /// Devices in them.
    pub published_devices: Gauge,
    registered: Gauge<i64, AtomicI64>,
    gpushared_up: Gauge,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("gpushare_dra");
        let claims = Family::<Labels, Counter>::default();
        let durations =
            Family::<Labels, Histogram>::new_with_constructor(|| Histogram::new(BUCKETS));
        let calls = Family::<Labels, Counter>::default();
        let api_errors = Family::<Labels, Counter>::default();
        let published_slices = Gauge::default();
        let published_devices = Gauge::default();
        let registered = Gauge::<i64, AtomicI64>::default();
        let gpushared_up = Gauge::default();
        registry.register(
            "claims",
            "Claims answered, by method and outcome",
            claims.clone(),
        );
        registry.register(
            "claim_duration_seconds",
            "Time to answer one claim",
            durations.clone(),
        );
        registry.register(
            "calls",
            "kubelet calls, by method and API version",
            calls.clone(),
        );
        registry.register(
            "api_errors",
            "Failed API server calls, by operation",
            api_errors.clone(),
        );
        registry.register(
            "published_slices",
            "ResourceSlices published for this node",
            published_slices.clone(),
        );
        registry.register(
            "published_devices",
            "Devices in the published ResourceSlices",
            published_devices.clone(),
        );
        registry.register(
            "registered",
            "kubelet's registration: 1 registered, 0 pending, -1 refused",
            registered.clone(),
        );
        registry.register(
            "gpushared_up",
            "gpushared answered its last health call",
            gpushared_up.clone(),
        );
        Metrics {
            claims,
            durations,
            calls,
            api_errors,
            published_slices,
            published_devices,
            registered,
            gpushared_up,
            registry,
        }
    }
}

impl Metrics {
    /// Every metric, with `api`'s count of answers cut off past their bound
    /// (`gpushare_dra_api_oversized_answers_total`, counted where the answers are read).
    pub fn with_api(api: &crate::api::Api) -> Metrics {
        let mut m = Metrics::default();
        m.registry.register(
            "api_oversized_answers",
            "API server answers cut off past their bound (an object's API maximum plus slack), by operation",
            api.oversized_answers_family(),
        );
        m
    }

    /// One claim answered by `method` with `outcome` in `took`.
    pub fn claim(&self, method: &'static str, outcome: &str, took: Duration) {
        self.claims
            .get_or_create(&vec![
                ("method", method.into()),
                ("outcome", outcome.into()),
            ])
            .inc();
        self.durations
            .get_or_create(&vec![("method", method.into())])
            .observe(took.as_secs_f64());
    }

    /// One kubelet call of `method` in API `version`.
    pub fn call(&self, method: &'static str, version: &'static str) {
        self.calls
            .get_or_create(&vec![
                ("method", method.into()),
                ("version", version.into()),
            ])
            .inc();
    }

    /// One failed API server call.
    pub fn api_error(&self, operation: &'static str) {
        self.api_errors
            .get_or_create(&vec![("operation", operation.into())])
            .inc();
    }

    /// Renders every metric, the state gauges first brought up to date.
    pub fn render(&self, state: &State) -> String {
        self.registered.set(match state.registration() {
            Registration::Registered => 1,
            Registration::Pending => 0,
            Registration::Refused(_) => -1,
        });
        self.gpushared_up
            .set(i64::from(matches!(state.gpushared(), Gpushared::Up { .. })));
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// `/healthz`: 200 `ok` while kubelet has not refused the registration, gpushared answers and
/// it can generate the driver's CDI spec (without which every prepare fails); 503 with the
/// reason otherwise. The DaemonSet's readiness probe: a plugin that can prepare nothing shows
/// as not ready (`kubectl get pods`) without being restarted.
pub fn healthz(state: &State) -> (u16, String) {
    let mut problems = live_problems(state);
    if let Gpushared::Up {
        driver_spec_error: Some(e),
        ..
    } = state.gpushared()
    {
        problems.push(format!(
            "gpushared cannot generate the NVIDIA driver's CDI spec, so every prepare fails: {e}"
        ));
    }
    answer(problems)
}

/// `/livez`: as [`healthz`] without the driver's CDI spec, the DaemonSet's liveness probe. A
/// restart of the plugin cannot mend a spec that gpushared on the host fails to generate (a
/// driver updated without a reboot), so that alone must not get the plugin restarted over and
/// over; a refused registration or a gpushared that does not answer is retried by a restart,
/// which registers again and reconnects.
pub fn livez(state: &State) -> (u16, String) {
    answer(live_problems(state))
}

/// What [`livez`] checks: the registration and gpushared's answer.
fn live_problems(state: &State) -> Vec<String> {
    let mut problems = Vec::new();
    if let Registration::Refused(e) = state.registration() {
        problems.push(format!("kubelet refused the registration: {e}"));
    }
    match state.gpushared() {
        Gpushared::Down(e) => problems.push(format!("gpushared does not answer: {e}")),
        Gpushared::Unknown => problems.push("gpushared not asked yet".into()),
        Gpushared::Up { .. } => {}
    }
    problems
}

/// 200 `ok` without problems, else 503 with them joined by `; `.
fn answer(problems: Vec<String>) -> (u16, String) {
    if problems.is_empty() {
        (200, "ok\n".into())
    } else {
        (503, format!("{}\n", problems.join("; ")))
    }
}

/// Serves `/metrics`, `/healthz` and `/livez` on `listener` until the task is dropped.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>, state: Arc<State>) {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::{Request, Response, StatusCode};
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a metrics connection failed; pausing");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        let (metrics, state) = (Arc::clone(&metrics), Arc::clone(&state));
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                let (metrics, state) = (Arc::clone(&metrics), Arc::clone(&state));
                async move {
                    let (status, ctype, body) = match req.uri().path() {
                        "/metrics" => (200, CONTENT_TYPE, metrics.render(&state)),
                        "/healthz" => {
                            let (s, b) = healthz(&state);
                            (s, "text/plain; charset=utf-8", b)
                        }
                        "/livez" => {
                            let (s, b) = livez(&state);
                            (s, "text/plain; charset=utf-8", b)
                        }
                        _ => (
                            404,
                            "text/plain; charset=utf-8",
                            "/metrics, /healthz and /livez are served here\n".into(),
                        ),
                    };
                    let mut r = Response::new(Full::new(Bytes::from(body)));
                    *r.status_mut() =
                        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                    if let Ok(v) = hyper::header::HeaderValue::from_str(ctype) {
                        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
                    }
                    Ok::<_, Infallible>(r)
                }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
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

/// Binds the metrics address; a taken port is the caller's to log.
///
/// # Errors
/// The address cannot be bound.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_fails_while_gpushared_cannot_generate_the_driver_spec() {
        let state = State::default();
        state.set_registration(Registration::Registered);
        state.set_gpushared(Gpushared::Up {
            node_name: "n".into(),
            driver_spec_error: None,
        });
        assert_eq!(healthz(&state), (200, "ok\n".to_string()));
        state.set_gpushared(Gpushared::Up {
            node_name: "n".into(),
            driver_spec_error: Some("Driver/library version mismatch".into()),
        });
        let (code, body) = healthz(&state);
        assert_eq!(code, 503);
        assert_eq!(
            body,
            "gpushared cannot generate the NVIDIA driver's CDI spec, so every prepare fails: Driver/library version mismatch\n"
        );
        // The liveness probe leaves it out: a restart of the plugin cannot mend it.
        assert_eq!(livez(&state), (200, "ok\n".to_string()));
    }

    #[test]
    fn livez_fails_while_gpushared_is_down_or_the_registration_was_refused() {
        let state = State::default();
        state.set_registration(Registration::Registered);
        state.set_gpushared(Gpushared::Down("connection refused".into()));
        assert_eq!(
            livez(&state),
            (
                503,
                "gpushared does not answer: connection refused\n".to_string()
            )
        );
        state.set_gpushared(Gpushared::Up {
            node_name: "n".into(),
            driver_spec_error: None,
        });
        assert_eq!(livez(&state), (200, "ok\n".to_string()));
        state.set_registration(Registration::Refused("taken".into()));
        assert_eq!(
            livez(&state),
            (503, "kubelet refused the registration: taken\n".to_string())
        );
        assert_eq!(livez(&state), healthz(&state));
    }
}
