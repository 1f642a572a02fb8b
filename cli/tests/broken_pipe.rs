//! Output into a closed pipe (`gpushare completion bash | head -1`): the CLI stops writing and
//! exits without a panic message, as other command-line tools do.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};

/// Runs `gpushare <args>` with stdout a pipe whose read end is already closed, so that its
/// first write fails with EPIPE; returns its stderr and whether it exited with status 0 or
/// was ended by SIGPIPE (both are what a shell pipeline expects).
fn run_into_closed_pipe(args: &[&str]) -> (String, bool) {
    let (read, write): (OwnedFd, OwnedFd) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = Command::new(env!("CARGO_BIN_EXE_gpushare"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let quiet_end = {
        use std::os::unix::process::ExitStatusExt;
        out.status.success() || out.status.signal() == Some(nix::libc::SIGPIPE)
    };
    (String::from_utf8_lossy(&out.stderr).into_owned(), quiet_end)
}

#[test]
fn completion_into_a_closed_pipe_exits_quietly() {
    let (stderr, quiet_end) = run_into_closed_pipe(&["completion", "bash"]);
    assert_eq!(stderr, "", "nothing on stderr");
    assert!(quiet_end, "status 0 or SIGPIPE");
}

#[test]
fn a_listing_into_a_closed_pipe_exits_quietly() {
    let (stderr, quiet_end) = run_into_closed_pipe(&["profiles"]);
    assert_eq!(stderr, "", "nothing on stderr");
    assert!(quiet_end, "status 0 or SIGPIPE");
}
