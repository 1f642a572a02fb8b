//! The Unix-socket server: newline-delimited JSON, one response per request line.
//!
//! Each connection is served by its own task; each request runs on tokio's blocking pool, so a
//! slow prepare never stalls another connection's `list_claims`. Changing methods need a peer
//! whose SO_PEERCRED uid is 0 (or listed in `changing_uids`).

use std::fs::{self, Permissions};
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpushare_proto::{
    AttachParams, DetachParams, ErrorBody, ErrorCode, Method, PrepareParams, Request, Response,
    UidParams, VersionInfo, PROTOCOL_VERSION,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;

use crate::error::ServiceError;
use crate::service::Service;

/// Longest request line accepted: a ResourceClaim is at most 1.5 MiB (etcd's object limit),
/// plus the envelope.
pub const MAX_REQUEST_BYTES: usize = 2 * 1024 * 1024;

/// Default for [`ServerConfig::max_connections`].
pub const MAX_CONNECTIONS: usize = 256;

/// Default for [`ServerConfig::idle_timeout`].
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How the socket is set up.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Socket path; a stale socket file there is replaced, anything else is refused.
    pub socket: PathBuf,
    /// Socket file mode (default 0660).
    pub mode: u32,
    /// Uids besides 0 allowed to call changing methods.
    pub changing_uids: Vec<u32>,
    /// Most connections served at once; one more is told so and closed, which keeps a flood
    /// of idle clients from exhausting the daemon's file descriptors.
    pub max_connections: usize,
    /// How long a connection may sit without sending a complete request line.
    pub idle_timeout: Duration,
    /// Where request latencies and errors are recorded for `/metrics` (none: not recorded).
    pub metrics: Option<Arc<crate::metrics::RequestMetrics>>,
}

/// Binds the socket: creates its directory, replaces a stale socket, sets the mode.
///
/// # Errors
/// The path holds something other than a socket, or binding failed.
pub fn bind(cfg: &ServerConfig) -> io::Result<UnixListener> {
    if let Some(dir) = cfg.socket.parent() {
        crate::fsutil::create_dir_if_missing(dir, 0o755)?;
    }
    match fs::symlink_metadata(&cfg.socket) {
        Ok(m) if m.file_type().is_socket() => {
            // Stale (left by a crash) or live (another daemon): only a stale one may go.
            if std::os::unix::net::UnixStream::connect(&cfg.socket).is_ok() {
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "another process listens on {}; refusing to take it over",
                        cfg.socket.display()
                    ),
                ));
            }
            fs::remove_file(&cfg.socket)?
        }
        Ok(_) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; refusing to replace it",
                    cfg.socket.display()
                ),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(&cfg.socket)?;
    fs::set_permissions(&cfg.socket, Permissions::from_mode(cfg.mode))?;
    Ok(listener)
}

/// Serves connections forever. `accept` errors (such as running out of file descriptors) are
/// logged and retried after a pause, never fatal.
///
/// # Errors
/// None in practice; the signature leaves room for a fatal listener error.
pub async fn serve(
    listener: UnixListener,
    service: Arc<Service>,
    cfg: Arc<ServerConfig>,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(cfg.max_connections));
    let mut backoff = Duration::from_millis(100);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, most likely: back off (up to ~3 s) instead of
                // spinning and flooding the log, and serve again once they are freed.
                tracing::warn!(error = %e, pause_ms = backoff.as_millis() as u64, "accepting a connection failed; pausing");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(3200));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
            tokio::spawn(refuse_busy(stream, cfg.max_connections));
            continue;
        };
        let service = Arc::clone(&service);
        let cfg = Arc::clone(&cfg);
        tokio::spawn(async move {
            if let Err(e) = connection(stream, service, &cfg).await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(permit);
        });
    }
}

async fn refuse_busy(mut stream: UnixStream, max: usize) {
    let response = error_response(
        0,
        ErrorCode::Internal,
        format!("gpushared is serving {max} connections already; retry later"),
    );
    if let Ok(mut line) = serde_json::to_vec(&response) {
        line.push(b'\n');
        let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&line)).await;
    }
}

async fn connection(
    stream: UnixStream,
    service: Arc<Service>,
    cfg: &ServerConfig,
) -> io::Result<()> {
    let peer_uid = stream.peer_cred().map(|c| c.uid()).ok();
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        let mut limited = (&mut reader).take(MAX_REQUEST_BYTES as u64 + 1);
        let read = limited.read_until(b'\n', &mut line);
        let Ok(n) = tokio::time::timeout(cfg.idle_timeout, read).await else {
            // Idle (or stuck mid-line) too long: free the slot for others.
            return Ok(());
        };
        let n = n?;
        if n == 0 {
            return Ok(());
        }
        let too_long = line.len() > MAX_REQUEST_BYTES;
        let response = if too_long {
            error_response(
                0,
                ErrorCode::InvalidRequest,
                format!("request line longer than {MAX_REQUEST_BYTES} bytes"),
            )
        } else {
            handle(&service, cfg, peer_uid, &line).await
        };
        let mut out = serde_json::to_vec(&response).map_err(io::Error::other)?;
        out.push(b'\n');
        // A client that never reads must not hold its slot forever either.
        match tokio::time::timeout(cfg.idle_timeout, write.write_all(&out)).await {
            Ok(written) => written?,
            Err(_) => return Ok(()),
        }
        if too_long {
            // The rest of the oversized line cannot be told apart from the next request.
            return Ok(());
        }
    }
}

fn error_response(id: u64, code: ErrorCode, message: String) -> Response {
    Response {
        version: PROTOCOL_VERSION,
        id,
        result: None,
        error: Some(ErrorBody { code, message }),
    }
}

fn params<T: DeserializeOwned>(method: Method, p: Option<Value>) -> Result<T, ServiceError> {
    serde_json::from_value(p.unwrap_or(Value::Null)).map_err(|e| {
        ServiceError::new(
            ErrorCode::InvalidRequest,
            format!("params of {method}: {e}"),
        )
    })
}

/// Methods without parameters accept none, `null` or `{}`: anything else is likely a mistake.
fn no_params(method: Method, p: &Option<Value>) -> Result<(), ServiceError> {
    match p {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(o)) if o.is_empty() => Ok(()),
        Some(other) => Err(ServiceError::new(
            ErrorCode::InvalidRequest,
            format!("{method} takes no params, got {other}"),
        )),
    }
}

fn to_value<T: Serialize>(v: T) -> Result<Value, ServiceError> {
    serde_json::to_value(v).map_err(|e| ServiceError::internal(format!("encoding result: {e}")))
}

/// Answers one request line.
pub async fn handle(
    service: &Arc<Service>,
    cfg: &ServerConfig,
    peer_uid: Option<u32>,
    line: &[u8],
) -> Response {
    let request: Request = match serde_json::from_slice(line) {
        Ok(r) => r,
        Err(e) => {
            let id = serde_json::from_slice::<Value>(line)
                .ok()
                .and_then(|v| v.get("id").and_then(Value::as_u64))
                .unwrap_or(0);
            return error_response(
                id,
                ErrorCode::InvalidRequest,
                format!("malformed request: {e}"),
            );
        }
    };
    let id = request.id;
    if request.version != PROTOCOL_VERSION {
        return error_response(
            id,
            ErrorCode::InvalidRequest,
            format!(
                "protocol version {} is not supported; this daemon speaks {PROTOCOL_VERSION}",
                request.version
            ),
        );
    }
    let Some(method) = Method::parse(&request.method) else {
        let known: Vec<_> = Method::ALL.iter().map(|m| m.as_str()).collect();
        return error_response(
            id,
            ErrorCode::InvalidRequest,
            format!(
                "unknown method {:?}; known: {}",
                request.method,
                known.join(", ")
            ),
        );
    };
    if method.is_changing() {
        let allowed = peer_uid.is_some_and(|u| u == 0 || cfg.changing_uids.contains(&u));
        if !allowed {
            return error_response(
                id,
                ErrorCode::PermissionDenied,
                format!(
                    "{method} needs root (peer uid {})",
                    peer_uid.map_or("unknown".into(), |u| u.to_string())
                ),
            );
        }
    }
    let started = Instant::now();
    let claim_uid = claim_uid_of(method, request.params.as_ref());
    let service = Arc::clone(service);
    let p = request.params;
    let uid = claim_uid.clone();
    let outcome = tokio::task::spawn_blocking(move || {
        // What the claim was (unprepare removes it) or became, for the log line.
        let claim_info =
            |uid: &Option<String>| uid.as_deref().and_then(|u| service.get_claim(u).ok());
        let released = (method == Method::Unprepare)
            .then(|| claim_info(&uid))
            .flatten();
        let result = dispatch(&service, method, p);
        let info = match method {
            Method::Prepare if result.is_ok() => claim_info(&uid),
            _ => released,
        };
        (result, info)
    })
    .await;
    let took = started.elapsed();
    let (outcome, info) = match outcome {
        Ok((result, info)) => (Ok(result), info),
        Err(join) => (Err(join), None),
    };
    let error = match &outcome {
        Ok(Ok(_)) => None,
        Ok(Err(e)) => Some((e.code, e.message.as_str())),
        Err(_) => Some((ErrorCode::Internal, "the request's task panicked")),
    };
    if let Some(m) = &cfg.metrics {
        m.observe(method, error.map(|e| e.0), took);
    }
    if matches!(method, Method::Prepare | Method::Unprepare) {
        let uid = claim_uid.as_deref().unwrap_or("?");
        log_claim_event(method, uid, info.as_ref(), error, took);
    }
    match outcome {
        Ok(Ok(result)) => Response {
            version: PROTOCOL_VERSION,
            id,
            result: Some(result),
            error: None,
        },
        Ok(Err(e)) => error_response(id, e.code, e.message),
        Err(join) => error_response(id, ErrorCode::Internal, format!("{method} failed: {join}")),
    }
}

/// Runs one request on the service (blocking).
fn dispatch(service: &Service, method: Method, p: Option<Value>) -> Result<Value, ServiceError> {
    match method {
        Method::Prepare => to_value(service.prepare(&params::<PrepareParams>(method, p)?.claim)?),
        Method::Unprepare => to_value(service.unprepare(&params::<UidParams>(method, p)?.uid)?),
        Method::GetClaim => to_value(service.get_claim(&params::<UidParams>(method, p)?.uid)?),
        Method::ListClaims => {
            no_params(method, &p)?;
            to_value(service.list_claims())
        }
        Method::ListGpus => {
            no_params(method, &p)?;
            to_value(service.list_gpus())
        }
        Method::Attach => to_value(service.attach(&params::<AttachParams>(method, p)?)?),
        Method::Detach => to_value(service.detach(&params::<DetachParams>(method, p)?)?),
        Method::Health => {
            no_params(method, &p)?;
            to_value(service.health())
        }
        Method::Version => {
            no_params(method, &p)?;
            to_value(VersionInfo {
                daemon: env!("CARGO_PKG_VERSION").to_string(),
                protocol: PROTOCOL_VERSION,
            })
        }
    }
}

/// The claim UID a prepare (`claim.metadata.uid`) or unprepare (`uid`) request names.
fn claim_uid_of(method: Method, params: Option<&Value>) -> Option<String> {
    let pointer = match method {
        Method::Prepare => "/claim/metadata/uid",
        Method::Unprepare => "/uid",
        _ => return None,
    };
    params?.pointer(pointer)?.as_str().map(str::to_string)
}

/// The one log line of each prepare and unprepare: claim UID, strategy, devices, outcome
/// and duration (refusals at `warn`, host failures at `error`).
fn log_claim_event(
    method: Method,
    uid: &str,
    info: Option<&gpushare_proto::ClaimInfo>,
    error: Option<(ErrorCode, &str)>,
    took: Duration,
) {
    let strategy = info.map_or_else(|| "-".to_string(), crate::cli::strategy_summary);
    let devices = info.map_or_else(
        || "-".to_string(),
        |c| {
            let d: Vec<&str> = c
                .groups
                .iter()
                .flat_map(|g| g.devices.iter().map(|d| d.device.as_str()))
                .collect();
            d.join(",")
        },
    );
    let duration_ms = took.as_secs_f64() * 1000.0;
    match error {
        None => tracing::info!(
            claim = %uid, %strategy, %devices, outcome = %"ok", duration_ms, "{method}"
        ),
        Some((code @ ErrorCode::Internal, message)) => tracing::error!(
            claim = %uid, %strategy, %devices, outcome = %code.as_str(), error = message, duration_ms, "{method}"
        ),
        Some((code, message)) => tracing::warn!(
            claim = %uid, %strategy, %devices, outcome = %code.as_str(), error = message, duration_ms, "{method}"
        ),
    }
}

/// Removes the socket file if it is still a socket (on shutdown).
pub fn remove_socket(path: &Path) {
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = fs::remove_file(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::HookConfig;
    use crate::gpu::SimulatedBackend;
    use crate::service::ServiceConfig;
    use crate::strategy::mps::MpsControl;
    use crate::sys::fake::FakeHost;

    async fn start(max_connections: usize, idle: Duration) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let host = FakeHost::default();
        let cfg = ServiceConfig {
            node_name: "n".into(),
            drivers: vec!["gpu.nvidia.com".into()],
            run_dir: dir.path().join("run"),
            cdi_dir: dir.path().join("cdi"),
            checkpoint: dir.path().join("cp.json"),
            hook: HookConfig {
                path: "/h".into(),
                socket: "/s".into(),
                timeout_secs: 1,
            },
            shm_bytes: Some(1),
        };
        let backend = Arc::new(
            SimulatedBackend::without_device_nodes("g5.xlarge", "n", Path::new("/d")).unwrap(),
        );
        let mps = MpsControl::new("/m".into(), host.ops(), Duration::from_millis(100));
        let service = Arc::new(Service::new(cfg, backend, mps).unwrap());
        let socket = dir.path().join("s");
        let server_cfg = Arc::new(ServerConfig {
            socket: socket.clone(),
            mode: 0o660,
            changing_uids: vec![],
            max_connections,
            idle_timeout: idle,
            metrics: None,
        });
        let listener = bind(&server_cfg).unwrap();
        tokio::spawn(serve(listener, service, server_cfg));
        (dir, socket)
    }

    async fn call(stream: &mut UnixStream, line: &str) -> Response {
        stream
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        let mut reader = BufReader::new(stream);
        let mut out = String::new();
        reader.read_line(&mut out).await.unwrap();
        serde_json::from_str(&out).unwrap()
    }

    #[tokio::test]
    async fn methods_without_params_refuse_params() {
        let (_dir, socket) = start(8, IDLE_TIMEOUT).await;
        let mut s = UnixStream::connect(&socket).await.unwrap();
        let ok = call(
            &mut s,
            r#"{"version":1,"id":1,"method":"list_gpus","params":{}}"#,
        )
        .await;
        assert_eq!(ok.result.unwrap().as_array().unwrap().len(), 1);
        let bad = call(
            &mut s,
            r#"{"version":1,"id":2,"method":"health","params":{"verbose":true}}"#,
        )
        .await;
        assert_eq!(bad.error.unwrap().code, ErrorCode::InvalidRequest);
        assert_eq!(bad.id, 2);
    }

    #[tokio::test]
    async fn connections_past_the_cap_are_refused_and_idle_ones_closed() {
        let (_dir, socket) = start(2, Duration::from_millis(300)).await;
        let _a = UnixStream::connect(&socket).await.unwrap();
        let _b = UnixStream::connect(&socket).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut c = UnixStream::connect(&socket).await.unwrap();
        let mut text = String::new();
        c.read_to_string(&mut text).await.unwrap();
        assert!(text.contains("serving 2 connections already"), "{text}");
        // The idle ones are closed after the idle timeout, and their slots serve again.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let mut d = UnixStream::connect(&socket).await.unwrap();
        let r = call(&mut d, r#"{"version":1,"id":7,"method":"version"}"#).await;
        assert_eq!(r.id, 7);
        assert!(r.result.is_some());
    }
}
