//! The Unix-socket server: newline-delimited JSON, one response per request line.
//!
//! Each connection is served by its own task; each request runs on tokio's blocking pool, so a
//! slow prepare never stalls another connection's `list_claims`. Every request is checked
//! against the peer's SO_PEERCRED credentials ([`authorize`]): changing methods need uid 0 or a
//! uid in `changing_uids`; reading methods also admit members of the socket's group; anyone
//! else gets `PermissionDenied` (logged once per uid). Input is bounded: line length
//! ([`MAX_REQUEST_BYTES`]), JSON nesting ([`MAX_JSON_DEPTH`]), connections (with slots kept
//! for privileged peers and a share per unprivileged uid: [`slots`]), the time to the first
//! request line, idle time and the time one request may take; a connection that breaks a
//! bound is answered and closed, and nothing else is affected. Output is bounded too: an
//! answer is held whole only when it is small, and `list_claims` is written as it is read
//! ([`listing`]), so an unread answer holds one piece of it per connection.

mod decode;
mod dispatch;
pub mod listing;
mod mig_audit;
mod peer;
mod shape;
pub mod slots;

use std::fs::{self, Permissions};
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gpushare_proto::{ErrorCode, Method};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::service::Service;

pub use decode::{decode_request, nesting_exceeds};
pub use dispatch::{handle, Answer};
pub use peer::{authorize, AuthorizeError, Peer};

use decode::{error_response, MALFORMED};
use peer::DeniedPeers;

/// Longest request line accepted: a ResourceClaim is at most 1.5 MiB (etcd's object limit),
/// plus the envelope.
pub use gpushare_proto::MAX_REQUEST_BYTES;

use slots::{Holder, SlotLimits, Slots};

/// Default for [`ServerConfig::max_connections`].
pub const MAX_CONNECTIONS: usize = 256;

/// Default for [`ServerConfig::reserved_connections`]: a quarter of [`MAX_CONNECTIONS`].
pub const RESERVED_CONNECTIONS: usize = 64;

/// Default for [`ServerConfig::max_connections_per_uid`]: more than any reading tool opens
/// (the CLI and `doctor` use one), far fewer than the slots readers share.
pub const MAX_CONNECTIONS_PER_UID: usize = 16;

/// Default for [`ServerConfig::first_request_timeout`]: every client of ours sends its first
/// request right after connecting; 5 s leaves room for a loaded node.
pub const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Default for [`ServerConfig::idle_timeout`].
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Default for [`ServerConfig::request_timeout`]: longer than any prepare should take (MPS
/// start, limits and read-back are each bounded by `mps.timeout_seconds`).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// Capacity of a connection's request line buffer kept between requests; a larger one (left
/// by a large request) is freed.
const KEPT_LINE_BYTES: usize = 64 * 1024;

/// Deepest nesting of JSON arrays and objects accepted in a request line. A ResourceClaim
/// nests about a dozen levels; serde_json stops at 128 on its own, but a deeply nested line
/// is refused here with a clear message before any parsing.
pub const MAX_JSON_DEPTH: usize = 64;

/// How the socket is set up.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Socket path; a stale socket file there is replaced, anything else is refused.
    pub socket: PathBuf,
    /// Socket file mode (default 0660).
    pub mode: u32,
    /// Socket file's group (default 0, root). Its members, by primary or supplementary gid,
    /// may call reading methods.
    pub group: u32,
    /// Uids besides 0 allowed to call changing methods (and reading ones).
    pub changing_uids: Vec<u32>,
    /// Most connections served at once; one more is answered `Busy` and closed, which keeps
    /// a flood of idle clients from exhausting the daemon's file descriptors.
    pub max_connections: usize,
    /// Of `max_connections`, how many only root and `changing_uids` may take, so that
    /// readers holding connections never lock out the kubelet plugin or the hook.
    pub reserved_connections: usize,
    /// Most connections one uid that is neither root nor in `changing_uids` may hold at once.
    pub max_connections_per_uid: usize,
    /// How long a new connection may take to send its first complete request line (at most
    /// `idle_timeout`).
    pub first_request_timeout: Duration,
    /// How long a connection may sit without sending a complete request line.
    pub idle_timeout: Duration,
    /// Where request latencies and errors are recorded for `/metrics` (none: not recorded).
    pub metrics: Option<Arc<crate::metrics::RequestMetrics>>,
    /// How long the daemon waits for one request's work before answering `Internal`; the work
    /// itself (holding its claim's lock) is not interrupted and finishes in the background.
    pub request_timeout: Duration,
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
    std::os::unix::fs::lchown(&cfg.socket, None, Some(cfg.group))?;
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
    let slots = Slots::new(SlotLimits {
        total: cfg.max_connections,
        reserved: cfg.reserved_connections,
        per_uid: cfg.max_connections_per_uid,
    });
    let denied = Arc::new(DeniedPeers::default());
    let busy = DeniedPeers::default();
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
        // The kernel recorded the credentials at connect: reading them does not wait on
        // the peer, so a slow or hostile client cannot stall the accept loop here.
        let peer = Peer::of(&stream);
        let holder = holder_of(&cfg, peer.as_ref());
        let slot = match slots.admit(holder) {
            Ok(slot) => slot,
            Err(refusal) => {
                let uid = peer.as_ref().map_or(u32::MAX, |p| p.uid);
                if busy.first(uid) {
                    let (open, unprivileged) = slots.in_use();
                    tracing::warn!(
                        peer_uid = peer.as_ref().map(|p| p.uid),
                        peer_pid = peer.as_ref().and_then(|p| p.pid),
                        open,
                        unprivileged,
                        reason = %refusal,
                        "refused a connection: no slot for it (logged once per uid)"
                    );
                }
                tokio::spawn(refuse_busy(stream, refusal.to_string()));
                continue;
            }
        };
        let service = Arc::clone(&service);
        let cfg = Arc::clone(&cfg);
        let denied = Arc::clone(&denied);
        tokio::spawn(async move {
            if let Err(e) = connection(stream, peer, service, &cfg, &denied).await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
}

/// Which slots a peer may take: root and `changing_uids` any, everyone else (readers,
/// strangers, unknown credentials) the shared ones, within their uid's share.
fn holder_of(cfg: &ServerConfig, peer: Option<&Peer>) -> Holder {
    match peer {
        Some(p) if p.uid == 0 || cfg.changing_uids.contains(&p.uid) => Holder::Privileged,
        Some(p) => Holder::Unprivileged(p.uid),
        None => Holder::Unprivileged(u32::MAX),
    }
}

/// Answers `Busy` (id 0: the request is never read) and closes.
async fn refuse_busy(mut stream: UnixStream, message: String) {
    let response = error_response(0, ErrorCode::Busy, message);
    if let Ok(mut line) = serde_json::to_vec(&response) {
        line.push(b'\n');
        let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&line)).await;
    }
}

async fn connection(
    stream: UnixStream,
    peer: Option<Peer>,
    service: Arc<Service>,
    cfg: &ServerConfig,
    denied: &DeniedPeers,
) -> io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut line = Vec::new();
    // A connection that has not sent its first request within a few seconds is not one of
    // our clients at work: it gives its slot back long before the idle timeout.
    let mut wait = cfg.first_request_timeout.min(cfg.idle_timeout);
    loop {
        line.clear();
        let mut limited = (&mut reader).take(MAX_REQUEST_BYTES as u64 + 1);
        let read = limited.read_until(b'\n', &mut line);
        let Ok(n) = tokio::time::timeout(wait, read).await else {
            // Idle (or stuck mid-line) too long: free the slot for others.
            return Ok(());
        };
        wait = cfg.idle_timeout;
        let n = n?;
        if n == 0 {
            return Ok(());
        }
        let too_long = line.len() > MAX_REQUEST_BYTES;
        let answer = if too_long {
            Answer::Whole(error_response(
                0,
                ErrorCode::InvalidRequest,
                format!("request line longer than {MAX_REQUEST_BYTES} bytes"),
            ))
        } else {
            handle(&service, cfg, peer.as_ref(), &line).await
        };
        if line.capacity() > KEPT_LINE_BYTES {
            // An idle connection keeps no buffer sized for its largest request (2 MiB).
            line = Vec::new();
        }
        let response = match answer {
            Answer::Whole(response) => response,
            Answer::Claims(listing) => {
                let mut work = Duration::ZERO;
                let written = tokio::time::timeout(
                    cfg.idle_timeout,
                    listing::write(&mut write, &*service, &listing, &mut work),
                )
                .await;
                if let Some(m) = &cfg.metrics {
                    m.observe(Method::ListClaims, None, work);
                }
                match written {
                    Ok(written) => written?,
                    // A client that never reads must not hold its slot forever either.
                    Err(_) => {
                        tracing::debug!(
                            id = listing.id,
                            "list_claims answer not taken within the idle timeout; closing"
                        );
                        return Ok(());
                    }
                }
                continue;
            }
        };
        let error_code = response.error.as_ref().map(|e| e.code);
        if error_code == Some(ErrorCode::PermissionDenied) {
            let uid = peer.as_ref().map_or(u32::MAX, |p| p.uid);
            if denied.first(uid) {
                tracing::warn!(
                    peer_uid = peer.as_ref().map(|p| p.uid),
                    peer_gid = peer.as_ref().map(|p| p.gid),
                    peer_pid = peer.as_ref().and_then(|p| p.pid),
                    reason = response.error.as_ref().map_or("", |e| e.message.as_str()),
                    "refused a request (logged once per uid)"
                );
            }
        }
        // A line that is not a request at all leaves the stream in an unknown state: answer
        // it and close, so garbage costs its sender the connection and nobody else anything.
        let malformed = error_code == Some(ErrorCode::InvalidRequest)
            && response
                .error
                .as_ref()
                .is_some_and(|e| e.message.starts_with(MALFORMED));
        let mut out = serde_json::to_vec(&response).map_err(io::Error::other)?;
        // Only the text waits for the peer, not the value it was made from as well.
        drop(response);
        out.push(b'\n');
        // A client that never reads must not hold its slot forever either.
        match tokio::time::timeout(cfg.idle_timeout, write.write_all(&out)).await {
            Ok(written) => written?,
            Err(_) => return Ok(()),
        }
        if too_long || malformed {
            // The rest of an oversized line cannot be told apart from the next request.
            return Ok(());
        }
    }
}

/// Removes the socket file if it is still a socket (on shutdown).
pub fn remove_socket(path: &Path) {
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = fs::remove_file(path);
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
