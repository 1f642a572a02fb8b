//! The HTTP listener scrapers reach: `GET /metrics` on a loopback address, nothing else.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;

use super::{render, CONTENT_TYPE};

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
