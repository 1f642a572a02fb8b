//! `gpushare-dra`'s command line: what each command's help offers is what it uses.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::process::Command;

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_gpushare-dra"))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn probe_help_lists_only_what_the_probe_reads() {
    let text = help(&["probe"]);
    for used in [
        "--config",
        "--json",
        "--driver-name",
        "--node-name",
        "--gpushared-socket",
        "--plugins-dir",
        "--registry-dir",
    ] {
        assert!(text.contains(used), "{used} missing:\n{text}");
    }
    for unused in [
        "--kubeconfig",
        "--metrics-address",
        "--claim-timeout-seconds",
        "--device-health",
    ] {
        assert!(!text.contains(unused), "{unused} offered:\n{text}");
    }
    // The plugin itself still takes them.
    let text = help(&[]);
    assert!(text.contains("--kubeconfig") && text.contains("--device-health"));
}

#[test]
fn the_man_page_and_completions_are_generated_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_gpushare-dra"))
        .arg("--generate-man")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let page = std::fs::read_to_string(dir.path().join("gpushare-dra.8")).unwrap();
    assert!(page.contains(".TH gpushare-dra 8"), "{page}");
    for needle in ["probe", "remove\\-slices", "kubeconfig"] {
        assert!(page.contains(needle), "{needle}: {page}");
    }
    let probe = std::fs::read_to_string(dir.path().join("gpushare-dra-probe.8")).unwrap();
    assert!(probe.contains("gpushared\\-socket"), "{probe}");
    let out = Command::new(env!("CARGO_BIN_EXE_gpushare-dra"))
        .args(["--completion", "bash"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let script = String::from_utf8(out.stdout).unwrap();
    assert!(script.contains("gpushare-dra") && script.contains("--remove-slices"));
}

/// Runs `gpushare-dra <args>` with stdout a pipe whose read end is already closed (its
/// first write fails with EPIPE, as under `| head` once head has gone); its stderr and
/// whether it exited with status 0 or was ended by SIGPIPE.
fn run_into_closed_pipe(args: &[&str]) -> (String, std::process::ExitStatus) {
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = Command::new(env!("CARGO_BIN_EXE_gpushare-dra"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(write))
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status,
    )
}

#[test]
fn printing_into_a_closed_pipe_exits_quietly() {
    for args in [
        &["--print-default-config"][..],
        &["--completion", "bash"][..],
    ] {
        let (stderr, status) = run_into_closed_pipe(args);
        assert_eq!(stderr, "", "{args:?}: nothing on stderr, no panic");
        assert!(status.success(), "{args:?}: {status:?}");
    }
}
