//! The hooks' I/O: read the state from stdin, then make one exchange with `gpushared`.
//!
//! One deadline, set when the hook starts, bounds both steps. Each blocking step runs on a
//! helper thread that the hook stops waiting for at the deadline, so neither a runtime that never
//! closes stdin nor a daemon that accepts but never answers can hold a container's start (or
//! stop) past the hook's timeout. The process exits right after, which ends the helper.

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use gpushare_proto::{AttachParams, Client, ClientError, DetachParams, DetachResult, Method};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::report::{AttachError, DaemonError, DetachError, InputError};
use crate::state::{container_id_lenient, parse_for_attach, MAX_STATE_BYTES};

/// What both hooks are told by their arguments in the CDI spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookOptions {
    /// The daemon's socket.
    pub socket: PathBuf,
    /// The claim the container belongs to.
    pub claim_uid: String,
    /// Bound on the whole hook run, in seconds.
    pub timeout_secs: u64,
}

impl HookOptions {
    fn deadline(&self) -> Instant {
        Instant::now() + Duration::from_secs(self.timeout_secs)
    }
}

/// `createRuntime`: validates the state, then asks the daemon to tie the container to the claim.
///
/// Nothing is sent when the state is unusable: attaching on a guessed PID or bundle would record
/// a container that does not exist.
///
/// # Errors
/// [`AttachError::Input`] for an unusable state, [`AttachError::Daemon`] when the daemon refused
/// or could not be asked. Either way the container must not start.
pub fn attach<R: Read + Send + 'static>(opts: &HookOptions, stdin: R) -> Result<(), AttachError> {
    let deadline = opts.deadline();
    let input = read_state(stdin, deadline, opts.timeout_secs)?;
    let state = parse_for_attach(&input).map_err(InputError::from)?;
    let params = AttachParams {
        claim_uid: opts.claim_uid.clone(),
        container_id: state.id.clone(),
        pid: Some(state.pid),
        bundle: Some(state.bundle),
    };
    // The result's shape is not checked: once the daemon says yes the container is attached,
    // and failing its start over a field this build does not know would help nobody.
    call::<_, serde_json::Value>(opts, deadline, Method::Attach, params)
        .map(drop)
        .map_err(|reason| AttachError::Daemon {
            container_id: state.id,
            claim_uid: opts.claim_uid.clone(),
            reason,
        })
}

/// `poststop`: asks the daemon to untie the container from the claim. Returns whether the
/// container was attached (`false` is not a problem: it may never have started).
///
/// # Errors
/// A [`DetachError`] for the caller to print as a warning; a stopped container must never be
/// reported as failed because of its GPU bookkeeping.
pub fn detach<R: Read + Send + 'static>(opts: &HookOptions, stdin: R) -> Result<bool, DetachError> {
    let deadline = opts.deadline();
    let container_id = read_state(stdin, deadline, opts.timeout_secs)
        .and_then(|input| container_id_lenient(&input).map_err(InputError::from))
        .map_err(|source| DetachError::Input {
            claim_uid: opts.claim_uid.clone(),
            source,
        })?;
    let params = DetachParams {
        claim_uid: opts.claim_uid.clone(),
        container_id: container_id.clone(),
    };
    call::<_, DetachResult>(opts, deadline, Method::Detach, params)
        .map(|result| result.detached)
        .map_err(|reason| DetachError::Daemon {
            container_id,
            claim_uid: opts.claim_uid.clone(),
            reason,
        })
}

/// Reads stdin to its end, at most one byte past [`MAX_STATE_BYTES`] (so an oversized state is
/// recognised as such without reading all of it).
fn read_state<R: Read + Send + 'static>(
    stdin: R,
    deadline: Instant,
    timeout_secs: u64,
) -> Result<Vec<u8>, InputError> {
    let limit = MAX_STATE_BYTES as u64 + 1;
    let read = move || {
        let mut buf = Vec::new();
        stdin.take(limit).read_to_end(&mut buf).map(|_| buf)
    };
    match within(deadline, read) {
        Ok(Some(result)) => result.map_err(InputError::Read),
        Ok(None) => Err(InputError::Timeout { secs: timeout_secs }),
        Err(spawn) => Err(InputError::Read(spawn)),
    }
}

/// One request on a fresh connection, answered by the deadline.
fn call<P, R>(
    opts: &HookOptions,
    deadline: Instant,
    method: Method,
    params: P,
) -> Result<R, DaemonError>
where
    P: Serialize + Send + 'static,
    R: DeserializeOwned + Send + 'static,
{
    let no_answer = || DaemonError::NoAnswer {
        socket: opts.socket.clone(),
        secs: opts.timeout_secs,
    };
    let remaining = deadline.saturating_duration_since(Instant::now());
    // A zero socket timeout would mean "wait forever" to the OS (and is refused by std).
    if remaining.is_zero() {
        return Err(no_answer());
    }
    let socket = opts.socket.clone();
    let exchange = move || -> Result<R, ClientError> {
        // The socket timeouts bound each read and write; `within` bounds the whole exchange,
        // including a connect that waits on a full listen backlog.
        let mut client = Client::connect(&socket, remaining)?;
        client.call(method, Some(&params))
    };
    match within(deadline, exchange) {
        Ok(Some(result)) => result.map_err(|err| DaemonError::from_client(err, opts.timeout_secs)),
        Ok(None) => Err(no_answer()),
        Err(spawn) => Err(DaemonError::Exchange(ClientError::Io {
            path: opts.socket.clone(),
            error: spawn,
        })),
    }
}

/// Runs `work` on a helper thread and waits for it until `deadline`.
///
/// `Ok(None)` when the deadline passed first (or the helper died without an answer, which the
/// caller cannot tell apart from silence either); `Err` when no thread could be started.
fn within<T, F>(deadline: Instant, work: F) -> io::Result<Option<T>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = mpsc::sync_channel(1);
    thread::Builder::new()
        .name("hook-io".into())
        .spawn(move || {
            // The receiver is gone only when the deadline passed; the answer is moot then.
            let _ = tx.send(work());
        })?;
    let wait = deadline.saturating_duration_since(Instant::now());
    Ok(rx.recv_timeout(wait).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stdin that never ends, like a runtime that forgot to close the pipe.
    struct Endless;

    impl Read for Endless {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            thread::sleep(Duration::from_secs(30));
            Ok(0)
        }
    }

    fn opts(socket: PathBuf) -> HookOptions {
        HookOptions {
            socket,
            claim_uid: "u1".into(),
            timeout_secs: 1,
        }
    }

    #[test]
    fn a_stdin_that_never_closes_is_bounded() {
        let started = Instant::now();
        let err = attach(&opts("/nonexistent.sock".into()), Endless).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(err.to_string(), "no complete OCI state on stdin within 1s");
    }

    #[test]
    fn an_oversized_state_is_refused_without_reading_it_all() {
        let err = attach(
            &opts("/nonexistent.sock".into()),
            io::repeat(b' ').take(64 * 1024 * 1024),
        )
        .unwrap_err();
        assert!(err.to_string().contains("larger than"), "{err}");
    }

    #[test]
    fn a_missing_daemon_fails_attach_and_names_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("absent.sock");
        let state =
            br#"{"ociVersion":"1.2.0","id":"c1","status":"creating","pid":7,"bundle":"/b"}"#;
        let err = attach(&opts(socket.clone()), &state[..]).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with(
                "cannot attach container c1 to claim u1: cannot connect to gpushared at "
            ),
            "{msg}"
        );
        assert!(msg.contains(socket.to_str().unwrap()), "{msg}");
    }

    #[test]
    fn within_returns_none_at_the_deadline() {
        let deadline = Instant::now() + Duration::from_millis(50);
        let got = within(deadline, || thread::sleep(Duration::from_secs(5))).unwrap();
        assert!(got.is_none());
        let deadline = Instant::now() + Duration::from_secs(5);
        assert_eq!(within(deadline, || 7).unwrap(), Some(7));
    }
}
