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

use gpushare_proto::{
    AttachParams, DetachParams, ErrorBody, ErrorCode, Method, PrepareParams, Request, Response,
    UidParams, VersionInfo, PROTOCOL_VERSION,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::error::ServiceError;
use crate::service::Service;

/// Longest request line accepted (a ResourceClaim with managedFields fits easily).
pub const MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// How the socket is set up.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Socket path; a stale socket file there is replaced, anything else is refused.
    pub socket: PathBuf,
    /// Socket file mode (default 0660).
    pub mode: u32,
    /// Uids besides 0 allowed to call changing methods.
    pub changing_uids: Vec<u32>,
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
        Ok(m) if m.file_type().is_socket() => fs::remove_file(&cfg.socket)?,
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

/// Serves connections until the listener fails.
///
/// # Errors
/// `accept` failed fatally.
pub async fn serve(
    listener: UnixListener,
    service: Arc<Service>,
    cfg: Arc<ServerConfig>,
) -> io::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let service = Arc::clone(&service);
        let cfg = Arc::clone(&cfg);
        tokio::spawn(async move {
            if let Err(e) = connection(stream, service, &cfg).await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
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
        let n = (&mut reader)
            .take(MAX_REQUEST_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
            .await?;
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
        write.write_all(&out).await?;
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
    let service = Arc::clone(service);
    let p = request.params;
    let outcome = tokio::task::spawn_blocking(move || -> Result<Value, ServiceError> {
        match method {
            Method::Prepare => {
                to_value(service.prepare(&params::<PrepareParams>(method, p)?.claim)?)
            }
            Method::Unprepare => to_value(service.unprepare(&params::<UidParams>(method, p)?.uid)?),
            Method::GetClaim => to_value(service.get_claim(&params::<UidParams>(method, p)?.uid)?),
            Method::ListClaims => to_value(service.list_claims()),
            Method::ListGpus => to_value(service.list_gpus()),
            Method::Attach => to_value(service.attach(&params::<AttachParams>(method, p)?)?),
            Method::Detach => to_value(service.detach(&params::<DetachParams>(method, p)?)?),
            Method::Health => to_value(service.health()),
            Method::Version => to_value(VersionInfo {
                daemon: env!("CARGO_PKG_VERSION").to_string(),
                protocol: PROTOCOL_VERSION,
            }),
        }
    })
    .await;
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

/// Removes the socket file if it is still a socket (on shutdown).
pub fn remove_socket(path: &Path) {
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = fs::remove_file(path);
    }
}
