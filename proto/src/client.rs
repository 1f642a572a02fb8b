//! A blocking client: one connection, one request at a time, every wait bounded.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{
    ClaimInfo, ClaimPage, ErrorBody, ErrorCode, ListClaimsParams, Method, Request, Response,
    VersionInfo, MAX_REQUEST_BYTES, OLDEST_PROTOCOL_VERSION,
};

/// Protocol version of a paged `list_claims`.
const PAGES_VERSION: u32 = 2;

/// Largest response line the client accepts (a whole `list_claims` of a version-1 daemon with
/// thousands of claims fits; a page is far smaller).
const MAX_RESPONSE_BYTES: u64 = 64 * 1024 * 1024;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached (daemon down, wrong path, no permission).
    // The I/O error is part of the message, not a `source`, so that error chains
    // (`anyhow`'s `{:#}`) do not print it twice.
    #[error("cannot connect to gpushared at {}: {error}", path.display())]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// Underlying error.
        error: std::io::Error,
    },
    /// The path exists but is no socket (a directory, a regular file, ...), so nothing
    /// listens there: usually a socket flag naming the directory instead of the socket file.
    #[error("cannot connect to gpushared at {}: it is {what}, not a socket", path.display())]
    NotASocket {
        /// The path given.
        path: PathBuf,
        /// What it is instead, e.g. `a directory`.
        what: &'static str,
    },
    /// The request is longer than the daemon accepts; it was not sent.
    #[error(
        "{method} request is {bytes} bytes, longer than the {} MiB gpushared accepts (a ResourceClaim is at most 1.5 MiB); nothing was sent",
        MAX_REQUEST_BYTES >> 20
    )]
    TooLarge {
        /// The method.
        method: Method,
        /// The request line's length without its newline.
        bytes: usize,
    },
    /// Reading or writing failed, or the timeout passed.
    #[error("talking to gpushared at {}: {error}", path.display())]
    Io {
        /// Socket path.
        path: PathBuf,
        /// Underlying error (`WouldBlock`/`TimedOut` when the timeout passed).
        error: std::io::Error,
    },
    /// The daemon's answer was not a valid response.
    #[error("bad response from gpushared: {0}")]
    Protocol(String),
    /// The daemon refused the request.
    #[error("{0}")]
    Remote(ErrorBody),
}

impl ClientError {
    /// The daemon's error, if the daemon answered with one.
    pub fn remote(&self) -> Option<&ErrorBody> {
        match self {
            ClientError::Remote(body) => Some(body),
            _ => None,
        }
    }
}

/// A connection to `gpushared`.
#[derive(Debug)]
pub struct Client {
    path: PathBuf,
    reader: BufReader<Conn>,
    next_id: u64,
}

/// The connection's socket and how long its reads and writes may wait.
#[derive(Debug)]
struct Conn {
    stream: UnixStream,
    /// With a deadline, the socket's timeout is set to what is left of it before each read and
    /// write, so a peer that trickles its answer a byte at a time cannot stretch the exchange
    /// past it. Without one, the timeouts set at connect bound each call alone.
    deadline: Option<Instant>,
}

impl Conn {
    /// Sets the read (or write) timeout to what is left of the deadline, if there is one.
    fn arm(&self, read: bool) -> io::Result<()> {
        let Some(deadline) = self.deadline else {
            return Ok(());
        };
        let left = deadline.saturating_duration_since(Instant::now());
        // A zero timeout would mean "wait forever" to the socket (and std refuses it).
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the deadline passed",
            ));
        }
        if read {
            self.stream.set_read_timeout(Some(left))
        } else {
            self.stream.set_write_timeout(Some(left))
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm(true)?;
        self.stream.read(buf)
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm(false)?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

impl Client {
    /// Connects to the socket at `path`; the connect, and every later read and write, waits
    /// at most `timeout` each.
    ///
    /// # Errors
    /// [`ClientError::NotASocket`] when `path` is something else (a directory, say);
    /// [`ClientError::Connect`] when the socket cannot be reached, or its listen backlog stayed
    /// full for `timeout` (`WouldBlock`).
    pub fn connect(path: impl AsRef<Path>, timeout: Duration) -> Result<Client, ClientError> {
        let path = path.as_ref().to_path_buf();
        let stream = open(&path, timeout)?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|error| ClientError::Io {
                path: path.clone(),
                error,
            })?;
        Ok(Client {
            path,
            reader: BufReader::new(Conn {
                stream,
                deadline: None,
            }),
            next_id: 1,
        })
    }

    /// Connects to the socket at `path` for an exchange that must end by `deadline`: the
    /// connect and all later reads and writes together, however the daemon paces its answer.
    /// This is how a hook bounds its whole run on its own thread.
    ///
    /// # Errors
    /// As [`Client::connect`]; a deadline that has passed, or passes during the connect, is
    /// [`ClientError::Connect`] with `TimedOut` or `WouldBlock`, and later an
    /// [`ClientError::Io`] of the same kinds.
    pub fn connect_until(path: impl AsRef<Path>, deadline: Instant) -> Result<Client, ClientError> {
        let path = path.as_ref().to_path_buf();
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ClientError::Connect {
                path,
                error: io::Error::new(io::ErrorKind::TimedOut, "the deadline passed"),
            });
        }
        let stream = open(&path, left)?;
        Ok(Client {
            path,
            reader: BufReader::new(Conn {
                stream,
                deadline: Some(deadline),
            }),
            next_id: 1,
        })
    }

    /// Sends one request and waits for its response. It goes as protocol version 1, which
    /// every method but a paged `list_claims` ([`Client::list_claims_page`]) means the same in,
    /// so it reaches daemons of every version.
    ///
    /// # Errors
    /// [`ClientError::Remote`] when the daemon refused; the other variants when the exchange
    /// itself failed.
    pub fn call<P: Serialize, R: DeserializeOwned>(
        &mut self,
        method: Method,
        params: Option<&P>,
    ) -> Result<R, ClientError> {
        let value = self.call_value(method, params)?;
        serde_json::from_value(value)
            .map_err(|e| ClientError::Protocol(format!("{method} result: {e}")))
    }

    /// Like [`Client::call`], returning the raw JSON result.
    ///
    /// # Errors
    /// As [`Client::call`].
    pub fn call_value<P: Serialize>(
        &mut self,
        method: Method,
        params: Option<&P>,
    ) -> Result<serde_json::Value, ClientError> {
        self.call_value_as(OLDEST_PROTOCOL_VERSION, method, params)
    }

    /// One page of claims, in UID order (`list_claims` of protocol version 2): at most
    /// `limit` (the daemon's maximum, [`crate::MAX_CLAIMS_PAGE`], when `None` or larger), from
    /// `continue_from`, the previous page's [`ClaimPage::next`] (`None`: the first page).
    ///
    /// # Errors
    /// As [`Client::call`]; a daemon that speaks only version 1 refuses with `InvalidRequest`
    /// ([`Client::list_claims`] then falls back to the whole list).
    pub fn list_claims_page(
        &mut self,
        limit: Option<u32>,
        continue_from: Option<&str>,
    ) -> Result<ClaimPage, ClientError> {
        let params = ListClaimsParams {
            limit,
            continue_from: continue_from.map(str::to_string),
        };
        let value = self.call_value_as(PAGES_VERSION, Method::ListClaims, Some(&params))?;
        serde_json::from_value(value)
            .map_err(|e| ClientError::Protocol(format!("list_claims page: {e}")))
    }

    /// Every claim, in UID order, read page by page ([`Client::list_claims_page`]), so that
    /// no answer line is large; from a daemon that speaks only protocol version 1, its whole
    /// list in one answer. A claim prepared or released while the pages are read may be
    /// missing or present; every other claim is listed once.
    ///
    /// # Errors
    /// As [`Client::call`]; [`ClientError::Protocol`] when the daemon's pages do not advance
    /// (a `continue` not past the one before, in UID order).
    pub fn list_claims(&mut self) -> Result<Vec<ClaimInfo>, ClientError> {
        let mut claims = Vec::new();
        let mut next: Option<String> = None;
        loop {
            let page = match self.list_claims_page(None, next.as_deref()) {
                Ok(page) => page,
                Err(ClientError::Remote(e))
                    if next.is_none() && e.code == ErrorCode::InvalidRequest =>
                {
                    // An older daemon refuses version 2. Ask it which it speaks, rather than
                    // read its message: messages are for people.
                    let version: VersionInfo = self.call(Method::Version, None::<&()>)?;
                    if version.protocol >= PAGES_VERSION {
                        return Err(ClientError::Remote(e));
                    }
                    return self.call(Method::ListClaims, None::<&()>);
                }
                Err(e) => return Err(e),
            };
            claims.extend(page.claims);
            match page.next {
                None => return Ok(claims),
                // Pages are in UID order: each token is past the one before, or the daemon
                // is not paging and the loop would never end.
                Some(token) if next.as_deref().is_some_and(|last| token.as_str() <= last) => {
                    return Err(ClientError::Protocol(format!(
                        "list_claims: the page after {:?} continues at {token:?}, which does not advance",
                        next.unwrap_or_default()
                    )))
                }
                Some(token) => next = Some(token),
            }
        }
    }

    /// Sends one request of protocol `version` and waits for its response.
    fn call_value_as<P: Serialize>(
        &mut self,
        version: u32,
        method: Method,
        params: Option<&P>,
    ) -> Result<serde_json::Value, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        let params = params
            .map(serde_json::to_value)
            .transpose()
            .map_err(|e| ClientError::Protocol(format!("encoding params: {e}")))?;
        let request = Request {
            version,
            id,
            method: method.as_str().to_string(),
            params,
        };
        let mut line = serde_json::to_vec(&request)
            .map_err(|e| ClientError::Protocol(format!("encoding request: {e}")))?;
        if line.len() > MAX_REQUEST_BYTES {
            return Err(ClientError::TooLarge {
                method,
                bytes: line.len(),
            });
        }
        line.push(b'\n');
        let path = self.path.clone();
        let io = |error| ClientError::Io {
            path: path.clone(),
            error,
        };
        if let Err(e) = self.reader.get_mut().write_all(&line) {
            // The daemon answers some refusals (no free connection slot, a line it will not
            // read to the end) at once and closes: its answer is still there to read, and
            // says more than the broken pipe.
            if matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ) {
                if let Ok(Some(response)) = self.read_response() {
                    if let Some(error) = response.error {
                        return Err(ClientError::Remote(error));
                    }
                }
            }
            return Err(io(e));
        }
        let response = self
            .read_response()?
            .ok_or_else(|| ClientError::Protocol("connection closed before a response".into()))?;
        if response.id != id {
            // Id 0 with an error: the daemon refused before it read this request's id (no
            // free connection slot, a line too long or not JSON). That refusal is the answer.
            if let (0, Some(error)) = (response.id, response.error) {
                return Err(ClientError::Remote(error));
            }
            return Err(ClientError::Protocol(format!(
                "response id {} does not match request id {id}",
                response.id
            )));
        }
        match (response.result, response.error) {
            (_, Some(error)) => Err(ClientError::Remote(error)),
            (Some(result), None) => Ok(result),
            (None, None) => Err(ClientError::Protocol(
                "response has neither result nor error".into(),
            )),
        }
    }

    /// Reads one response line: `None` when the daemon closed the connection first.
    fn read_response(&mut self) -> Result<Option<Response>, ClientError> {
        let mut buf = String::new();
        let n = (&mut self.reader)
            .take(MAX_RESPONSE_BYTES)
            .read_line(&mut buf)
            .map_err(|error| ClientError::Io {
                path: self.path.clone(),
                error,
            })?;
        if n == 0 {
            return Ok(None);
        }
        serde_json::from_str(buf.trim_end())
            .map(Some)
            .map_err(|e| ClientError::Protocol(format!("{e}")))
    }
}

/// Connects a new socket to `path`, waiting at most `timeout` (non-zero) for room in the
/// listen backlog; the socket's write timeout is left at `timeout`.
///
/// The timeout is set before connecting because a Unix socket's connect(2) waits for a full
/// backlog as long as the socket's send timeout (`SO_SNDTIMEO`) allows, and without one for
/// ever (net/unix/af_unix.c, `unix_stream_connect`); std's `UnixStream::connect` cannot set it
/// first.
fn open(path: &Path, timeout: Duration) -> Result<UnixStream, ClientError> {
    let connect_error = |error: io::Error| {
        // connect(2) says "connection refused" for a directory or a regular file alike:
        // name what is there instead, since that is the mistake to fix.
        match std::fs::metadata(path).ok().and_then(|m| not_a_socket(&m)) {
            Some(what) => ClientError::NotASocket {
                path: path.to_path_buf(),
                what,
            },
            None => ClientError::Connect {
                path: path.to_path_buf(),
                error,
            },
        }
    };
    let address = socket2::SockAddr::unix(path).map_err(connect_error)?;
    // socket2 opens it close-on-exec.
    let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None).map_err(
        |error| ClientError::Connect {
            path: path.to_path_buf(),
            error,
        },
    )?;
    socket
        .set_write_timeout(Some(timeout))
        .map_err(|error| ClientError::Connect {
            path: path.to_path_buf(),
            error,
        })?;
    socket.connect(&address).map_err(connect_error)?;
    Ok(UnixStream::from(std::os::fd::OwnedFd::from(socket)))
}

/// What a path that is no socket is, for [`ClientError::NotASocket`]; `None` for a socket.
fn not_a_socket(meta: &std::fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_socket() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_file() {
        Some("a regular file")
    } else if t.is_fifo() {
        Some("a named pipe")
    } else if t.is_char_device() || t.is_block_device() {
        Some("a device node")
    } else {
        Some("a special file")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;
    use std::os::unix::net::UnixListener;

    /// A one-connection server that answers `answer` (a response line) at once, without
    /// reading what the client sends, and closes — as gpushared does when it has no slot.
    fn refusing_server(dir: &Path, answer: &'static str) -> (PathBuf, std::thread::JoinHandle<()>) {
        let path = dir.join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            stream.write_all(answer.as_bytes()).unwrap();
        });
        (path, server)
    }

    const BUSY: &str = "{\"version\":1,\"id\":0,\"error\":{\"code\":\"Busy\",\"message\":\"uid 1000 holds 16 connections already\"}}\n";

    #[test]
    fn a_refusal_sent_before_the_request_was_read_is_the_answer() {
        // A small request (written before the daemon closes) and one of 1.9 MiB (the write
        // breaks off when it does): either way the daemon's refusal is what the caller gets,
        // not an id mismatch or a broken pipe.
        for size in [0, 1_900_000] {
            let dir = tempfile::tempdir().unwrap();
            let (path, server) = refusing_server(dir.path(), BUSY);
            let mut client = Client::connect(&path, Duration::from_secs(10)).unwrap();
            server.join().unwrap();
            let params = serde_json::json!({ "uid": "x".repeat(size) });
            let err = client
                .call_value(Method::GetClaim, Some(&params))
                .unwrap_err();
            let body = err.remote().unwrap_or_else(|| panic!("{size}: {err}"));
            assert_eq!(body.code, ErrorCode::Busy, "{size}");
            assert_eq!(
                err.to_string(),
                "Busy: uid 1000 holds 16 connections already"
            );
        }
    }

    #[test]
    fn a_response_to_another_request_is_still_a_protocol_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream);
            reader.read_line(&mut String::new()).unwrap();
            reader
                .get_mut()
                .write_all(b"{\"version\":1,\"id\":9,\"result\":{}}\n")
                .unwrap();
        });
        let mut client = Client::connect(&path, Duration::from_secs(10)).unwrap();
        let err = client.call_value(Method::Health, None::<&()>).unwrap_err();
        assert!(
            err.to_string()
                .contains("response id 9 does not match request id 1"),
            "{err}"
        );
        server.join().unwrap();
    }

    #[test]
    fn a_request_longer_than_the_daemon_accepts_is_not_sent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let mut client = Client::connect(&path, Duration::from_secs(10)).unwrap();
        let params = serde_json::json!({ "claim": { "blob": "x".repeat(MAX_REQUEST_BYTES) } });
        let err = client
            .call_value(Method::Prepare, Some(&params))
            .unwrap_err();
        assert!(matches!(err, ClientError::TooLarge { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.starts_with("prepare request is 2097") && text.contains("2 MiB"),
            "{text}"
        );
        // Nothing reached the socket.
        let (mut server_side, _) = listener.accept().unwrap();
        drop(client);
        let mut got = Vec::new();
        server_side.read_to_end(&mut got).unwrap();
        assert!(got.is_empty(), "{} bytes were sent", got.len());
    }

    #[test]
    fn a_path_that_is_no_socket_is_named_for_what_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let err = Client::connect(dir.path(), Duration::from_secs(1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "cannot connect to gpushared at {}: it is a directory, not a socket",
                dir.path().display()
            )
        );
        let file = dir.path().join("f");
        std::fs::write(&file, "").unwrap();
        let err = Client::connect(&file, Duration::from_secs(1)).unwrap_err();
        assert!(
            err.to_string()
                .ends_with("it is a regular file, not a socket"),
            "{err}"
        );
        // A missing path stays a connection error with the system's reason.
        let err = Client::connect(dir.path().join("none"), Duration::from_secs(1)).unwrap_err();
        assert!(matches!(err, ClientError::Connect { .. }), "{err}");
    }

    /// What a socket timeout (or a passed deadline) reports.
    fn timed_out(error: &io::Error) -> bool {
        matches!(
            error.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        )
    }

    /// A listener with a backlog of one that never accepts: after one queued connection, a
    /// connect waits for room.
    fn full_backlog(dir: &Path) -> (PathBuf, socket2::Socket, UnixStream) {
        let path = dir.join("full.sock");
        let listener =
            socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None).unwrap();
        listener
            .bind(&socket2::SockAddr::unix(&path).unwrap())
            .unwrap();
        listener.listen(0).unwrap();
        let queued = UnixStream::connect(&path).unwrap();
        (path, listener, queued)
    }

    #[test]
    fn a_connect_to_a_full_backlog_ends_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _listener, _queued) = full_backlog(dir.path());
        let started = Instant::now();
        let err = Client::connect_until(&path, started + Duration::from_millis(300)).unwrap_err();
        let waited = started.elapsed();
        match &err {
            ClientError::Connect { error, .. } => assert!(timed_out(error), "{err}"),
            other => panic!("{other:?}"),
        }
        assert!(waited >= Duration::from_millis(250), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        // The per-call form is bounded the same way.
        let err = Client::connect(&path, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(err, ClientError::Connect { .. }), "{err:?}");
    }

    #[test]
    fn a_deadline_bounds_an_answer_trickled_a_byte_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("slow.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&stream).read_line(&mut line).unwrap();
            // Each byte comes well within any per-read timeout; the whole never ends.
            let mut stream = &stream;
            while stream.write_all(b" ").is_ok() {
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let started = Instant::now();
        let mut client =
            Client::connect_until(&path, started + Duration::from_millis(500)).unwrap();
        let err = client.call_value::<()>(Method::Health, None).unwrap_err();
        let waited = started.elapsed();
        match &err {
            ClientError::Io { error, .. } => assert!(timed_out(error), "{err}"),
            other => panic!("{other:?}"),
        }
        assert!(waited < Duration::from_secs(5), "{waited:?}");
        drop(client);
        server.join().unwrap();
    }

    #[test]
    fn a_deadline_that_has_passed_connects_nowhere() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let err = Client::connect_until(&path, Instant::now()).unwrap_err();
        assert!(matches!(err, ClientError::Connect { .. }), "{err:?}");
        assert!(listener.accept().is_err(), "nothing may have connected");
    }

    /// A one-connection server that answers each request line with `answer(request)`, and
    /// returns the requests it read.
    fn scripted_server(
        dir: &Path,
        answer: impl Fn(&Request) -> serde_json::Value + Send + 'static,
    ) -> (PathBuf, std::thread::JoinHandle<Vec<Request>>) {
        let path = dir.join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream);
            let mut seen = vec![];
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap() > 0 {
                let request: Request = serde_json::from_str(&line).unwrap();
                let mut out = serde_json::to_vec(&answer(&request)).unwrap();
                out.push(b'\n');
                reader.get_mut().write_all(&out).unwrap();
                seen.push(request);
                line.clear();
            }
            seen
        });
        (path, server)
    }

    fn claim(uid: &str) -> serde_json::Value {
        serde_json::json!({"uid": uid, "namespace": "ns", "name": uid, "state": "Prepared",
            "groups": [], "requests": [], "cdi_spec": "/c", "attach_limit": null, "attached": []})
    }

    fn ok(r: &Request, result: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"version": r.version, "id": r.id, "result": result})
    }

    #[test]
    fn list_claims_reads_every_page() {
        let dir = tempfile::tempdir().unwrap();
        let (path, server) = scripted_server(dir.path(), |r| {
            let from = r.params.as_ref().and_then(|p| p.get("continue")).cloned();
            match from.as_ref().and_then(|v| v.as_str()) {
                None => ok(
                    r,
                    serde_json::json!({"claims": [claim("a"), claim("b")], "continue": "b"}),
                ),
                Some("b") => ok(
                    r,
                    serde_json::json!({"claims": [claim("c")], "continue": null}),
                ),
                Some(other) => panic!("continue {other}"),
            }
        });
        let mut client = Client::connect(&path, Duration::from_secs(10)).unwrap();
        let claims = client.list_claims().unwrap();
        drop(client);
        let uids: Vec<&str> = claims.iter().map(|c| c.uid.as_str()).collect();
        assert_eq!(uids, ["a", "b", "c"]);
        let seen = server.join().unwrap();
        assert_eq!(seen.len(), 2);
        assert!(seen
            .iter()
            .all(|r| r.version == 2 && r.method == "list_claims"));
        assert_eq!(seen[0].params, Some(serde_json::json!({})));
        assert_eq!(seen[1].params, Some(serde_json::json!({"continue": "b"})));
    }

    #[test]
    fn list_claims_of_a_version_1_daemon_is_its_whole_list() {
        let dir = tempfile::tempdir().unwrap();
        // As a daemon of protocol version 1 answers.
        let (path, server) =
            scripted_server(dir.path(), |r| match (r.version, r.method.as_str()) {
                (2, _) => {
                    serde_json::json!({"version": 1, "id": r.id, "error": {"code": "InvalidRequest",
                "message": "protocol version 2 is not supported; this daemon speaks 1"}})
                }
                (1, "version") => ok(r, serde_json::json!({"daemon": "0.1.0", "protocol": 1})),
                (1, "list_claims") if r.params.is_none() => {
                    ok(r, serde_json::json!([claim("a"), claim("b")]))
                }
                other => panic!("{other:?}"),
            });
        let mut client = Client::connect(&path, Duration::from_secs(10)).unwrap();
        let claims = client.list_claims().unwrap();
        drop(client);
        assert_eq!(claims.len(), 2);
        let asked: Vec<(u32, String)> = server
            .join()
            .unwrap()
            .into_iter()
            .map(|r| (r.version, r.method))
            .collect();
        assert_eq!(
            asked,
            [
                (2, "list_claims".into()),
                (1, "version".into()),
                (1, "list_claims".into())
            ]
        );
    }

    #[test]
    fn a_refused_first_page_of_a_version_2_daemon_stays_an_error_and_pages_must_advance() {
        let dir = tempfile::tempdir().unwrap();
        let (path, server) = scripted_server(dir.path(), |r| match r.method.as_str() {
            "version" => ok(r, serde_json::json!({"daemon": "0.2.0", "protocol": 2})),
            _ => serde_json::json!({"version": 2, "id": r.id, "error": {"code": "InvalidRequest",
                "message": "params of list_claims: limit must be 1 or more"}}),
        });
        let mut client = Client::connect(&path, Duration::from_secs(10)).unwrap();
        let err = client.list_claims().unwrap_err();
        assert!(err.to_string().contains("limit must be 1 or more"), "{err}");
        drop(client);
        server.join().unwrap();

        let dir = tempfile::tempdir().unwrap();
        let (path, server) = scripted_server(dir.path(), |r| {
            ok(
                r,
                serde_json::json!({"claims": [claim("a")], "continue": "a"}),
            )
        });
        let mut client = Client::connect(&path, Duration::from_secs(10)).unwrap();
        let err = client.list_claims().unwrap_err();
        assert!(matches!(err, ClientError::Protocol(_)), "{err}");
        assert!(err.to_string().contains("does not advance"), "{err}");
        drop(client);
        assert_eq!(server.join().unwrap().len(), 2);
    }

    #[test]
    fn pages_that_go_back_end_the_listing_instead_of_looping() {
        let dir = tempfile::tempdir().unwrap();
        // a -> b -> a -> b ...: each token differs from the one before, none advances past
        // the last. (The script gives up after 10 requests, so a loop ends the test.)
        let asked = std::sync::atomic::AtomicUsize::new(0);
        let (path, server) = scripted_server(dir.path(), move |r| {
            assert!(
                asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 10,
                "looping"
            );
            let from = r.params.as_ref().and_then(|p| p.get("continue")).cloned();
            let next = match from.as_ref().and_then(|v| v.as_str()) {
                Some("b") => "a",
                _ => "b",
            };
            ok(
                r,
                serde_json::json!({"claims": [claim(next)], "continue": next}),
            )
        });
        let mut client = Client::connect(&path, Duration::from_secs(10)).unwrap();
        let err = client.list_claims().unwrap_err();
        assert!(matches!(err, ClientError::Protocol(_)), "{err}");
        assert!(err.to_string().contains("does not advance"), "{err}");
        drop(client);
        // The second page went back ("b", then "a"): no third request.
        assert_eq!(server.join().unwrap().len(), 2);
    }
}
