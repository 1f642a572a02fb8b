//! The hooks' I/O: read the state from stdin, then make one exchange with `gpushared`.
//!
//! One deadline, set when the hook starts, bounds both steps, on the hook's own thread: stdin
//! is read only after poll(2) says it has data (or its end), waiting at most what is left, and
//! the exchange uses a connection whose every connect, read and write ends by the deadline
//! ([`Client::connect_until`]). So neither a runtime that never closes stdin nor a daemon that
//! accepts but never answers (or answers a byte at a time) can hold a container's start (or
//! stop) past the hook's timeout, and no helper thread is started: a hook runs at every
//! container start, and threads were most of what it cost beyond the exchange itself.

use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gpushare_proto::{
    AttachParams, Client, ClientError, DetachParams, DetachResult, ErrorCode, Method, PodRef,
};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
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

/// `createRuntime`: validates the state read from `stdin` (the runtime's pipe, or any file
/// descriptor), then asks the daemon to tie the container to the claim.
///
/// Nothing is sent when the state is unusable: attaching on a guessed PID or bundle would record
/// a container that does not exist.
///
/// # Errors
/// [`AttachError::Input`] for an unusable state, [`AttachError::Daemon`] when the daemon refused
/// or could not be asked. Either way the container must not start.
pub fn attach(opts: &HookOptions, stdin: impl AsFd) -> Result<(), AttachError> {
    let deadline = opts.deadline();
    let input = read_state(stdin, deadline, opts.timeout_secs)?;
    let state = parse_for_attach(&input).map_err(InputError::from)?;
    let params = AttachParams {
        claim_uid: opts.claim_uid.clone(),
        container_id: state.id.clone(),
        pid: Some(state.pid),
        bundle: Some(state.bundle),
        // Which pod the container is part of, for operators (`gpushare claims`); a container
        // whose runtime names none is attached all the same.
        pod: PodRef::from_annotations(&state.annotations),
    };
    // The result's shape is not checked: once the daemon says yes the container is attached,
    // and failing its start over a field this build does not know would help nobody.
    let mut answer = call::<_, serde_json::Value>(opts, deadline, Method::Attach, &params);
    if params.pod.is_some() && answer.as_ref().is_err_and(refuses_the_pod_field) {
        // A gpushared from before `pod` (an RPM upgrade replaces this hook before the daemon
        // restarts) refuses the field it does not know: the container is attached without it.
        answer = call(
            opts,
            deadline,
            Method::Attach,
            AttachParams {
                pod: None,
                ..params
            },
        );
    }
    answer.map(drop).map_err(|reason| AttachError::Daemon {
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
pub fn detach(opts: &HookOptions, stdin: impl AsFd) -> Result<bool, DetachError> {
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

/// Reads `stdin` to its end by `deadline`, at most one byte past [`MAX_STATE_BYTES`] (so an
/// oversized state is recognised as such without reading all of it).
///
/// The descriptor is read directly, never through a buffer of its own, so that what poll(2)
/// reports is all there is; it is left in whatever blocking mode it came in, because the
/// runtime may share its open file description.
fn read_state(
    stdin: impl AsFd,
    deadline: Instant,
    timeout_secs: u64,
) -> Result<Vec<u8>, InputError> {
    let limit = MAX_STATE_BYTES + 1;
    let fd = stdin.as_fd();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while buf.len() < limit {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(InputError::Timeout { secs: timeout_secs });
        }
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        match nix::poll::poll(&mut fds, poll_timeout(left)) {
            Ok(0) => return Err(InputError::Timeout { secs: timeout_secs }),
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(InputError::Read(e.into())),
        }
        // Readable, at its end, or in error: each makes read(2) return at once.
        let want = (limit - buf.len()).min(chunk.len());
        match nix::unistd::read(fd.as_raw_fd(), &mut chunk[..want]) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            // A non-blocking descriptor that poll woke for nothing: wait again.
            Err(Errno::EINTR | Errno::EAGAIN) => {}
            Err(e) => return Err(InputError::Read(e.into())),
        }
    }
    Ok(buf)
}

/// poll(2)'s timeout for `left`, rounded up to whole milliseconds so that a wait never ends
/// just short of the deadline and spins.
fn poll_timeout(left: Duration) -> PollTimeout {
    let ms = left.as_micros().div_ceil(1000);
    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
}

/// Whether the daemon refused `attach` for not knowing its `pod` field (serde's words for an
/// unknown field, in an `InvalidRequest`).
fn refuses_the_pod_field(err: &DaemonError) -> bool {
    matches!(err, DaemonError::Refused(body)
        if body.code == ErrorCode::InvalidRequest && body.message.contains("unknown field `pod`"))
}

/// One request on a fresh connection, answered by the deadline.
fn call<P, R>(
    opts: &HookOptions,
    deadline: Instant,
    method: Method,
    params: P,
) -> Result<R, DaemonError>
where
    P: Serialize,
    R: DeserializeOwned,
{
    Client::connect_until(&opts.socket, deadline)
        .and_then(|mut client| client.call(method, Some(&params)))
        .map_err(|err: ClientError| DaemonError::from_client(err, opts.timeout_secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixListener;

    fn opts(socket: PathBuf) -> HookOptions {
        HookOptions {
            socket,
            claim_uid: "u1".into(),
            timeout_secs: 1,
        }
    }

    #[test]
    fn a_stdin_that_never_closes_is_bounded() {
        // A runtime that forgot to close its end of the pipe.
        let (read, _write) = nix::unistd::pipe().unwrap();
        let started = Instant::now();
        let err = attach(&opts("/nonexistent.sock".into()), &read).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(err.to_string(), "no complete OCI state on stdin within 1s");
    }

    #[test]
    fn a_state_written_in_pieces_is_read_whole() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let writer = std::thread::spawn(move || {
            let mut write = std::fs::File::from(write);
            for piece in [
                &br#"{"ociVersion":"1.2.0","id":"c1","#[..],
                br#""status":"stopped"}"#,
            ] {
                write.write_all(piece).unwrap();
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let got = read_state(&read, Instant::now() + Duration::from_secs(5), 5).unwrap();
        writer.join().unwrap();
        assert_eq!(
            got,
            br#"{"ociVersion":"1.2.0","id":"c1","status":"stopped"}"#.to_vec()
        );
    }

    #[test]
    fn an_oversized_state_is_refused_without_reading_it_all() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![b' '; 2 * MAX_STATE_BYTES]).unwrap();
        nix::unistd::lseek(file.as_raw_fd(), 0, nix::unistd::Whence::SeekSet).unwrap();
        let read = read_state(&file, Instant::now() + Duration::from_secs(5), 5).unwrap();
        assert_eq!(read.len(), MAX_STATE_BYTES + 1);
        nix::unistd::lseek(file.as_raw_fd(), 0, nix::unistd::Whence::SeekSet).unwrap();
        let err = attach(&opts("/nonexistent.sock".into()), &file).unwrap_err();
        assert!(err.to_string().contains("larger than"), "{err}");
    }

    #[test]
    fn a_missing_daemon_fails_attach_and_names_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("absent.sock");
        let state = state_file(
            br#"{"ociVersion":"1.2.0","id":"c1","status":"creating","pid":7,"bundle":"/b"}"#,
        );
        let err = attach(&opts(socket.clone()), &state).unwrap_err();
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
    fn a_daemon_that_accepts_and_never_answers_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("silent.sock");
        // Accepted by the kernel (backlog), never read or answered.
        let _listener = UnixListener::bind(&socket).unwrap();
        let state = state_file(
            br#"{"ociVersion":"1.2.0","id":"c1","status":"creating","pid":7,"bundle":"/b"}"#,
        );
        let started = Instant::now();
        let err = attach(&opts(socket), &state).unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            matches!(
                err,
                AttachError::Daemon {
                    reason: DaemonError::NoAnswer { secs: 1, .. },
                    ..
                }
            ),
            "{err:?}"
        );
    }

    /// A state on a file descriptor, as a runtime's pipe would carry it.
    fn state_file(bytes: &[u8]) -> std::fs::File {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(bytes).unwrap();
        nix::unistd::lseek(file.as_raw_fd(), 0, nix::unistd::Whence::SeekSet).unwrap();
        file
    }

    #[test]
    fn poll_timeouts_round_up() {
        assert_eq!(i32::from(poll_timeout(Duration::from_micros(1))), 1);
        assert_eq!(i32::from(poll_timeout(Duration::from_millis(1500))), 1500);
        assert_eq!(
            i32::from(poll_timeout(Duration::from_secs(3600))),
            3_600_000
        );
    }
}
