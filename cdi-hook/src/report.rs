//! What can go wrong in a hook run, and the single stderr line that says so.
//!
//! Pure: no I/O. The runtime folds a failing hook's stderr into the error the user sees
//! (`kubectl describe pod`, `podman run`), so every problem is rendered as exactly one line that
//! names the container, the claim and the cause.

use std::ffi::OsStr;
use std::io;
use std::path::PathBuf;

use gpushare_proto::{ClientError, ErrorBody};

use crate::state::StateError;

/// The program name every stderr line starts with.
pub const PROGRAM: &str = "gpushare-cdi-hook";

/// Why the OCI state could not be obtained from stdin.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// Reading stdin failed.
    #[error("cannot read OCI state from stdin: {0}")]
    Read(io::Error),
    /// The runtime did not close stdin in time.
    #[error("no complete OCI state on stdin within {secs}s")]
    Timeout {
        /// The hook's timeout.
        secs: u64,
    },
    /// What arrived is not a usable state.
    #[error(transparent)]
    State(#[from] StateError),
}

/// Why an exchange with `gpushared` did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The daemon answered with an error; its message names the claim and the cause.
    #[error("{}", refusal_text(.0))]
    Refused(ErrorBody),
    /// The daemon did not answer in time.
    #[error("gpushared at {} did not answer within {secs}s", .socket.display())]
    NoAnswer {
        /// Socket path.
        socket: PathBuf,
        /// The hook's timeout.
        secs: u64,
    },
    /// The daemon could not be reached, or its answer was not a valid response.
    #[error(transparent)]
    Exchange(ClientError),
}

impl DaemonError {
    /// Sorts a client error: refusals keep the daemon's body, and a connect, read or write that
    /// ran out of time (a listen backlog that stayed full counts) is said as such rather than
    /// as the bare `EAGAIN` the socket reports.
    pub fn from_client(err: ClientError, timeout_secs: u64) -> DaemonError {
        match err {
            ClientError::Remote(body) => DaemonError::Refused(body),
            ClientError::Io { path, error } | ClientError::Connect { path, error }
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                DaemonError::NoAnswer {
                    socket: path,
                    secs: timeout_secs,
                }
            }
            other => DaemonError::Exchange(other),
        }
    }
}

/// The daemon's message; its code only when the message is blank, so a refusal never renders
/// as nothing.
fn refusal_text(body: &ErrorBody) -> String {
    if body.message.trim().is_empty() {
        format!("refused with {}", body.code)
    } else {
        body.message.clone()
    }
}

/// Why `attach` failed; each one fails the container's start.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    /// No usable OCI state; nothing was sent to the daemon.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The daemon refused or could not be asked.
    #[error("cannot attach container {container_id} to claim {claim_uid}: {reason}")]
    Daemon {
        /// OCI container id.
        container_id: String,
        /// The claim's UID.
        claim_uid: String,
        /// What went wrong.
        reason: DaemonError,
    },
}

/// Why `detach` did not detach; each one is only a warning.
#[derive(Debug, thiserror::Error)]
pub enum DetachError {
    /// No container id could be read; nothing was sent to the daemon.
    #[error("cannot detach from claim {claim_uid}: {source}")]
    Input {
        /// The claim's UID.
        claim_uid: String,
        /// What was wrong with stdin.
        source: InputError,
    },
    /// The daemon refused or could not be asked.
    #[error("cannot detach container {container_id} from claim {claim_uid}: {reason}")]
    Daemon {
        /// OCI container id.
        container_id: String,
        /// The claim's UID.
        claim_uid: String,
        /// What went wrong.
        reason: DaemonError,
    },
}

/// The stderr line for a failed `attach`.
///
/// Problems with the state are prefixed `gpushare-cdi-hook attach:` (a runtime problem, not a
/// claim problem); refusals read `gpushare-cdi-hook: cannot attach container …`.
pub fn attach_error_line(err: &AttachError) -> String {
    match err {
        AttachError::Input(_) => one_line(&format!("{PROGRAM} attach: {err}")),
        AttachError::Daemon { .. } => one_line(&format!("{PROGRAM}: {err}")),
    }
}

/// The stderr warning for a `detach` that did not happen.
pub fn detach_warning_line(err: &DetachError) -> String {
    one_line(&format!("{PROGRAM} detach: warning: {err}"))
}

/// The stderr line for a hook this build does not know. Such hooks are ignored, not failed,
/// so a CDI spec written by a newer or older daemon never blocks a container's start.
pub fn unsupported_line(hook: Option<&OsStr>) -> String {
    let name = hook.map(OsStr::to_string_lossy).unwrap_or_default();
    // `{:?}` quotes the name and escapes anything that could break the line.
    format!("{PROGRAM}: unsupported hook {name:?}, ignoring")
}

/// The stderr line for a run without any argument (exit status 2): what the hook is for and
/// how the container runtime calls it.
pub fn no_hook_line() -> String {
    format!(
        "{PROGRAM}: no hook given; usage: {PROGRAM} attach|detach --claim <UID> [--socket <PATH>] [--timeout <SECS>], with the OCI state on stdin (the container runtime runs it from a claim's CDI spec; --help says more)"
    )
}

/// The stderr line for bad arguments to a known hook: clap's error without its `error: ` prefix,
/// tips and usage, which do not fit the runtime's one-line error.
pub fn usage_line(hook: &str, warning: bool, rendered: &str) -> String {
    let summary = rendered
        .lines()
        .map(str::trim)
        .take_while(|line| {
            !(line.starts_with("Usage:")
                || line.starts_with("tip:")
                || line.starts_with("For more"))
        })
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    let summary = summary.strip_prefix("error: ").unwrap_or(&summary);
    let summary = if summary.is_empty() {
        "invalid arguments"
    } else {
        summary
    };
    let kind = if warning { "warning: " } else { "" };
    one_line(&format!("{PROGRAM} {hook}: {kind}{summary}"))
}

/// Replaces control characters (newlines above all) with spaces, so text from the daemon or
/// from the state (a container id) cannot split the message across lines.
pub fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_proto::ErrorCode;

    fn refused(code: ErrorCode, message: &str) -> DaemonError {
        DaemonError::from_client(
            ClientError::Remote(ErrorBody {
                code,
                message: message.into(),
            }),
            5,
        )
    }

    fn attach_daemon(reason: DaemonError) -> AttachError {
        AttachError::Daemon {
            container_id: "c1".into(),
            claim_uid: "u1".into(),
            reason,
        }
    }

    #[test]
    fn attach_refusal_carries_the_daemon_message() {
        let err = attach_daemon(refused(
            ErrorCode::LimitReached,
            "claim u1 allows 2 containers (replicas) and has 2",
        ));
        assert_eq!(
            attach_error_line(&err),
            "gpushare-cdi-hook: cannot attach container c1 to claim u1: claim u1 allows 2 \
             containers (replicas) and has 2"
        );
    }

    #[test]
    fn blank_daemon_message_falls_back_to_the_code() {
        let err = attach_daemon(refused(ErrorCode::NotReady, " "));
        assert_eq!(
            err.to_string(),
            "cannot attach container c1 to claim u1: refused with NotReady"
        );
    }

    #[test]
    fn timeouts_are_named_as_such() {
        for kind in [io::ErrorKind::WouldBlock, io::ErrorKind::TimedOut] {
            let io_error = ClientError::Io {
                path: "/run/g.sock".into(),
                error: io::Error::from(kind),
            };
            // A connect that waited out a full listen backlog.
            let connect_error = ClientError::Connect {
                path: "/run/g.sock".into(),
                error: io::Error::from(kind),
            };
            for client_error in [io_error, connect_error] {
                let err = DaemonError::from_client(client_error, 3);
                assert_eq!(
                    err.to_string(),
                    "gpushared at /run/g.sock did not answer within 3s"
                );
                assert!(matches!(err, DaemonError::NoAnswer { .. }));
            }
        }
        let broken = DaemonError::from_client(
            ClientError::Io {
                path: "/run/g.sock".into(),
                error: io::Error::from(io::ErrorKind::BrokenPipe),
            },
            3,
        );
        assert!(matches!(broken, DaemonError::Exchange(_)));
    }

    #[test]
    fn unreachable_daemon_names_the_socket() {
        let err = DaemonError::from_client(
            ClientError::Connect {
                path: "/nope.sock".into(),
                error: io::Error::from(io::ErrorKind::NotFound),
            },
            5,
        );
        assert!(err.to_string().contains("/nope.sock"), "{err}");
    }

    #[test]
    fn state_problems_use_the_attach_prefix() {
        let err = AttachError::from(InputError::State(StateError::Truncated {
            last_field: Some("pid".into()),
        }));
        assert_eq!(
            attach_error_line(&err),
            r#"gpushare-cdi-hook attach: OCI state on stdin is truncated (ends in field "pid")"#
        );
        let err = AttachError::from(InputError::Timeout { secs: 5 });
        assert_eq!(
            attach_error_line(&err),
            "gpushare-cdi-hook attach: no complete OCI state on stdin within 5s"
        );
    }

    #[test]
    fn detach_warnings_are_one_line() {
        let err = DetachError::Daemon {
            container_id: "c\n1".into(),
            claim_uid: "u1".into(),
            reason: refused(ErrorCode::Internal, "first\nsecond"),
        };
        assert_eq!(
            detach_warning_line(&err),
            "gpushare-cdi-hook detach: warning: cannot detach container c 1 from claim u1: first second"
        );
        let err = DetachError::Input {
            claim_uid: "u1".into(),
            source: InputError::State(StateError::Empty),
        };
        assert_eq!(
            detach_warning_line(&err),
            "gpushare-cdi-hook detach: warning: cannot detach from claim u1: no OCI state on stdin (it is empty)"
        );
    }

    #[test]
    fn unsupported_hooks_are_quoted() {
        assert_eq!(
            unsupported_line(Some(OsStr::new("update-ldcache"))),
            r#"gpushare-cdi-hook: unsupported hook "update-ldcache", ignoring"#
        );
        assert_eq!(
            unsupported_line(None),
            r#"gpushare-cdi-hook: unsupported hook "", ignoring"#
        );
        assert_eq!(
            unsupported_line(Some(OsStr::new("a\nb"))),
            r#"gpushare-cdi-hook: unsupported hook "a\nb", ignoring"#
        );
    }

    #[test]
    fn usage_lines_keep_only_claps_summary() {
        let rendered = "error: the following required arguments were not provided:\n  --claim <UID>\n\nUsage: gpushare-cdi-hook attach --claim <UID>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            usage_line("attach", false, rendered),
            "gpushare-cdi-hook attach: the following required arguments were not provided: --claim <UID>"
        );
        assert_eq!(
            usage_line(
                "detach",
                true,
                "\nerror: unexpected argument '--x' found\n\n  tip: to pass '--x' as a value, use '-- --x'\n"
            ),
            "gpushare-cdi-hook detach: warning: unexpected argument '--x' found"
        );
        assert_eq!(
            usage_line("attach", false, ""),
            "gpushare-cdi-hook attach: invalid arguments"
        );
    }
}
