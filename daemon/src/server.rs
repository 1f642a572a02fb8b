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
//! bound is answered and closed, and nothing else is affected.

mod shape;
pub mod slots;

use std::collections::HashSet;
use std::fs::{self, Permissions};
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
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

use crate::error::ServiceError;
use crate::service::Service;

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

/// Deepest nesting of JSON arrays and objects accepted in a request line. A ResourceClaim
/// nests about a dozen levels; serde_json stops at 128 on its own, but a deeply nested line
/// is refused here with a clear message before any parsing.
pub const MAX_JSON_DEPTH: usize = 64;

/// Most distinct uids remembered for "logged once per peer"; past it denials are still
/// refused, only no longer logged, so a uid-cycling client cannot grow the daemon's memory.
const MAX_LOGGED_PEERS: usize = 4096;

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

/// Who is on the other end of a connection, from SO_PEERCRED and SO_PEERGROUPS (both as the
/// kernel recorded them at connect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Effective uid when it connected.
    pub uid: u32,
    /// Primary gid when it connected.
    pub gid: u32,
    /// Pid, when the kernel gives one (not across pid namespaces).
    pub pid: Option<i32>,
    /// Supplementary gids; on kernels without SO_PEERGROUPS (before 4.13) read from
    /// `/proc/<pid>/status`, empty when that fails too.
    pub groups: Vec<u32>,
}

impl Peer {
    fn of(stream: &UnixStream) -> Option<Peer> {
        use std::os::fd::AsFd;
        let cred = stream.peer_cred().ok()?;
        let pid = cred.pid().filter(|p| *p > 0);
        let groups = crate::sys::peer_groups(stream.as_fd())
            .ok()
            .or_else(|| pid.and_then(crate::sys::read_groups))
            .unwrap_or_default();
        Some(Peer {
            uid: cred.uid(),
            gid: cred.gid(),
            pid,
            groups,
        })
    }
}

/// May `peer` call `method`? Root and `changing_uids` may call everything; members of the
/// socket's group may call reading methods; nobody else anything (an unknown peer included).
///
/// # Errors
/// The message for `PermissionDenied`, naming the method and the peer's uid.
pub fn authorize(cfg: &ServerConfig, peer: Option<&Peer>, method: Method) -> Result<(), String> {
    let Some(peer) = peer else {
        return Err(format!(
            "{method} refused: the peer's credentials are unknown"
        ));
    };
    if peer.uid == 0 || cfg.changing_uids.contains(&peer.uid) {
        return Ok(());
    }
    let in_group = peer.gid == cfg.group || peer.groups.contains(&cfg.group);
    if method.is_changing() {
        return Err(format!(
            "{method} needs root or a uid in socket.changing_uids (peer uid {})",
            peer.uid
        ));
    }
    if in_group {
        return Ok(());
    }
    Err(format!(
        "{method} needs root, a uid in socket.changing_uids or membership of the socket's group {} (peer uid {})",
        cfg.group, peer.uid
    ))
}

/// Uids already logged as denied, so a client retrying in a loop does not flood the journal.
#[derive(Debug, Default)]
struct DeniedPeers(Mutex<HashSet<u32>>);

impl DeniedPeers {
    /// True the first time `uid` is seen (and while the set has room).
    fn first(&self, uid: u32) -> bool {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        seen.len() < MAX_LOGGED_PEERS && seen.insert(uid)
    }
}

/// True when `line` nests arrays and objects deeper than `max` (strings are skipped, escapes
/// included). Linear in the line, no allocation.
pub fn nesting_exceeds(line: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in line {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
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
        let response = if too_long {
            error_response(
                0,
                ErrorCode::InvalidRequest,
                format!("request line longer than {MAX_REQUEST_BYTES} bytes"),
            )
        } else {
            handle(&service, cfg, peer.as_ref(), &line).await
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

fn error_response(id: u64, code: ErrorCode, message: String) -> Response {
    Response {
        version: PROTOCOL_VERSION,
        id,
        result: None,
        error: Some(ErrorBody { code, message }),
    }
}

/// Decodes `params` of `method`, an object (never serde's array form of a struct).
fn params<T: DeserializeOwned>(method: Method, p: Option<Value>) -> Result<T, ServiceError> {
    if let Some(why) = shape::params_problem(p.as_ref()) {
        return Err(ServiceError::new(
            ErrorCode::InvalidRequest,
            format!("params of {method}: {why}"),
        ));
    }
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

/// Start of the message of a line that is not a request (the connection is then closed).
const MALFORMED: &str = "malformed request";

/// Decodes one request line (without its newline) into the request and its method. Pure: the
/// protocol fuzz target drives it.
///
/// # Errors
/// The response to send: `InvalidRequest` for a line nested deeper than [`MAX_JSON_DEPTH`],
/// malformed JSON, JSON that is not one object (an array, too, which serde would otherwise
/// take for the envelope's fields by position), a wrong protocol version or an unknown method.
#[allow(clippy::result_large_err)]
pub fn decode_request(line: &[u8]) -> Result<(Request, Method), Response> {
    if nesting_exceeds(line, MAX_JSON_DEPTH) {
        return Err(error_response(
            0,
            ErrorCode::InvalidRequest,
            format!("{MALFORMED}: JSON nested deeper than {MAX_JSON_DEPTH} levels"),
        ));
    }
    if let Some(why) = shape::envelope_problem(line) {
        return Err(error_response(
            0,
            ErrorCode::InvalidRequest,
            format!("{MALFORMED}: {why}"),
        ));
    }
    let request: Request = match serde_json::from_slice(line) {
        Ok(r) => r,
        Err(e) => {
            let id = serde_json::from_slice::<Value>(line)
                .ok()
                .and_then(|v| v.get("id").and_then(Value::as_u64))
                .unwrap_or(0);
            return Err(error_response(
                id,
                ErrorCode::InvalidRequest,
                format!("{MALFORMED}: {e}"),
            ));
        }
    };
    let id = request.id;
    if request.version != PROTOCOL_VERSION {
        return Err(error_response(
            id,
            ErrorCode::InvalidRequest,
            format!(
                "protocol version {} is not supported; this daemon speaks {PROTOCOL_VERSION}",
                request.version
            ),
        ));
    }
    let Some(method) = Method::parse(&request.method) else {
        let known: Vec<_> = Method::ALL.iter().map(|m| m.as_str()).collect();
        return Err(error_response(
            id,
            ErrorCode::InvalidRequest,
            format!(
                "unknown method {:?}; known: {}",
                request.method,
                known.join(", ")
            ),
        ));
    };
    Ok((request, method))
}

/// Answers one request line from `peer` (`None`: credentials unknown, so only refusals).
pub async fn handle(
    service: &Arc<Service>,
    cfg: &ServerConfig,
    peer: Option<&Peer>,
    line: &[u8],
) -> Response {
    let (request, method) = match decode_request(line) {
        Ok(r) => r,
        Err(response) => return response,
    };
    let id = request.id;
    if let Err(message) = authorize(cfg, peer, method) {
        return error_response(id, ErrorCode::PermissionDenied, message);
    }
    let started = Instant::now();
    let claim_uid = claim_uid_of(method, request.params.as_ref());
    let service = Arc::clone(service);
    let p = request.params;
    let uid = claim_uid.clone();
    let work = tokio::task::spawn_blocking(move || {
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
    });
    let Ok(outcome) = tokio::time::timeout(cfg.request_timeout, work).await else {
        if let Some(m) = &cfg.metrics {
            m.observe(method, Some(ErrorCode::Internal), started.elapsed());
        }
        tracing::warn!(%method, id, timeout_ms = cfg.request_timeout.as_millis() as u64, "request exceeded its time; it finishes in the background");
        return error_response(
            id,
            ErrorCode::Internal,
            format!(
                "{method} did not finish within {:?}; it goes on in the background (ask get_claim, or retry: prepare and unprepare are idempotent)",
                cfg.request_timeout
            ),
        );
    };
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

/// Checks a claim UID given as the request parameter `field`, naming that parameter (the
/// service's own check names `metadata.uid`, which only a prepare's claim has).
fn claim_uid_param<'a>(method: Method, field: &str, uid: &'a str) -> Result<&'a str, ServiceError> {
    match crate::config::claim_uid_problem(uid) {
        None => Ok(uid),
        Some(why) => Err(ServiceError::new(
            ErrorCode::InvalidRequest,
            format!("params of {method}: {field}: {uid:?} is not a valid claim UID: it {why}"),
        )),
    }
}

/// Runs one request on the service (blocking).
fn dispatch(service: &Service, method: Method, p: Option<Value>) -> Result<Value, ServiceError> {
    match method {
        Method::Prepare => to_value(service.prepare(&params::<PrepareParams>(method, p)?.claim)?),
        Method::Unprepare => {
            let p = params::<UidParams>(method, p)?;
            to_value(service.unprepare(claim_uid_param(method, "uid", &p.uid)?)?)
        }
        Method::GetClaim => {
            let p = params::<UidParams>(method, p)?;
            to_value(service.get_claim(claim_uid_param(method, "uid", &p.uid)?)?)
        }
        Method::ListClaims => {
            no_params(method, &p)?;
            to_value(service.list_claims())
        }
        Method::ListGpus => {
            no_params(method, &p)?;
            to_value(service.list_gpus())
        }
        Method::Attach => {
            let p = params::<AttachParams>(method, p)?;
            claim_uid_param(method, "claim_uid", &p.claim_uid)?;
            to_value(service.attach(&p)?)
        }
        Method::Detach => {
            let p = params::<DetachParams>(method, p)?;
            claim_uid_param(method, "claim_uid", &p.claim_uid)?;
            to_value(service.detach(&p)?)
        }
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
        Method::MigApply => {
            to_value(service.mig_apply(&params::<gpushare_proto::MigApplyParams>(method, p)?)?)
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
    let strategy = info.map_or_else(
        || "-".to_string(),
        gpushare_proto::ClaimInfo::strategy_summary,
    );
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
    // To 0.1 ms, as gpushare-dra logs it: more digits are float noise, not precision.
    let duration_ms = format!("{:.1}", took.as_secs_f64() * 1000.0);
    match error {
        None => tracing::info!(
            claim = %uid, %strategy, %devices, outcome = %"ok", %duration_ms, "{method}"
        ),
        Some((code @ ErrorCode::Internal, message)) => tracing::error!(
            claim = %uid, %strategy, %devices, outcome = %code.as_str(), error = message, %duration_ms, "{method}"
        ),
        Some((code, message)) => tracing::warn!(
            claim = %uid, %strategy, %devices, outcome = %code.as_str(), error = message, %duration_ms, "{method}"
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
#[path = "server_tests.rs"]
mod tests;
