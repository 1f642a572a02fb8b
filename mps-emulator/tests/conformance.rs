//! Conformance with NVIDIA's `nvidia-cuda-mps-control` 535.
//!
//! The reference transcript (`shared/cases/mps/golden-535.309.01.json`) was captured from
//! NVIDIA's program with `shared/cases/mps/capture.py`; the same script run against the
//! emulator must give the same transcript. Where NVIDIA's program is installed, both
//! programs are also run side by side, on the script and on start-up failures.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{emulator, nvidia_program, run_with, shared_dir, text, Daemon};

/// Runs capture.py against `program`; `None` (with a note) when python3 is unavailable.
fn capture(shared: &Path, program: &Path) -> Option<serde_json::Value> {
    let script = shared.join("cases/mps/capture.py");
    let output = match Command::new("python3").arg(&script).arg(program).output() {
        Ok(output) => output,
        Err(err) => {
            eprintln!("note: cannot run python3 ({err}); skipping capture of {program:?}");
            return None;
        }
    };
    assert!(
        output.status.success(),
        "capture.py {program:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut transcript: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("capture.py prints JSON");
    transcript
        .as_object_mut()
        .expect("transcript is an object")
        .remove("program");
    Some(transcript)
}

fn golden(shared: &Path) -> serde_json::Value {
    let path = shared.join("cases/mps/golden-535.309.01.json");
    let text = std::fs::read_to_string(&path).expect("golden transcript");
    let mut golden: serde_json::Value = serde_json::from_str(&text).expect("golden is JSON");
    golden
        .as_object_mut()
        .expect("golden is an object")
        .remove("program");
    golden
}

/// Asserts equality step by step, so a failure names the command that differs.
fn assert_same_transcript(got: &serde_json::Value, want: &serde_json::Value, what: &str) {
    let steps = |v: &serde_json::Value| v["steps"].as_array().cloned().unwrap_or_default();
    for (got_step, want_step) in steps(got).iter().zip(steps(want).iter()) {
        assert_eq!(got_step, want_step, "{what}: step differs");
    }
    assert_eq!(got, want, "{what}: transcript differs");
}

/// Runs of NVIDIA's program allowed before a difference counts.
const RETRIES: usize = 3;

fn shared_or_note() -> Option<PathBuf> {
    let shared = shared_dir();
    if shared.is_none() {
        eprintln!("note: <workspace>/../shared not found; skipping conformance test");
    }
    shared
}

#[test]
fn emulator_matches_golden_535_transcript() {
    let Some(shared) = shared_or_note() else {
        return;
    };
    let Some(transcript) = capture(&shared, &emulator()) else {
        return;
    };
    assert_same_transcript(&transcript, &golden(&shared), "emulator vs golden 535");
}

#[test]
fn emulator_matches_nvidia_program_live() {
    let Some(shared) = shared_or_note() else {
        return;
    };
    let Some(nvidia) = nvidia_program() else {
        eprintln!("note: nvidia-cuda-mps-control not on PATH; skipping live comparison");
        return;
    };
    let Some(ours) = capture(&shared, &emulator()) else {
        return;
    };
    // NVIDIA's program has timing races of its own (its `-d` may return before the start
    // lines reach control.log, and its UI sometimes exits 1 after start_server), so
    // a few captures are allowed to find one that is not disturbed by them.
    let mut theirs = None;
    for _ in 0..RETRIES {
        theirs = capture(&shared, &nvidia);
        if theirs.as_ref() == Some(&ours) {
            break;
        }
    }
    let Some(theirs) = theirs else {
        return;
    };
    assert_same_transcript(&ours, &theirs, "emulator vs nvidia-cuda-mps-control");
}

/// stdout, stderr and exit code of a start-up attempt, with the temporary root replaced.
fn attempt(program: &Path, args: &[&str], pipe: &Path, log: &Path, root: &Path) -> String {
    let out = run_with(program, args, pipe, log, &[], "get_server_list\n");
    let (stdout, stderr, code) = text(&out);
    let root = root.display().to_string();
    format!(
        "{args:?} rc={code:?} stdout={:?} stderr={:?}",
        stdout.replace(&root, "ROOT"),
        stderr.replace(&root, "ROOT")
    )
}

/// Start-up failures and the UI without a daemon, as seen by a caller.
fn failure_transcript(program: &Path) -> Vec<String> {
    let root = tempfile::tempdir().expect("tempdir");
    let r = root.path();
    let log = r.join("log");
    std::fs::create_dir(&log).expect("log dir");
    std::fs::write(r.join("file"), "").expect("file");
    let mut lines = Vec::new();
    for (pipe, log) in [
        (r.join("a/b/pipe"), log.clone()),
        (r.join("a/b/pipe"), r.join("x/y/log")),
        (r.join("file"), log.clone()),
    ] {
        for args in [&["-d"][..], &["-f"], &[]] {
            lines.push(attempt(program, args, &pipe, &log, r));
        }
    }
    // Multi-user start (`-d -M`, newer releases) on usable directories: 535 takes it as a UI
    // call and finds no daemon.
    let fresh = r.join("fresh");
    std::fs::create_dir(&fresh).expect("fresh pipe dir");
    lines.push(attempt(program, &["-d", "-M"], &fresh, &log, r));
    // Already running, then the UI against what `quit` leaves behind.
    let daemon = Daemon::start_with(program, &[]);
    for args in [&["-d"][..], &["-f"]] {
        lines.push(attempt(program, args, &daemon.pipe, &daemon.log, r));
    }
    lines.push(attempt(program, &["-h", "x"], &daemon.pipe, &daemon.log, r));
    let quit = daemon.ui("quit\n");
    lines.push(format!("quit {:?}", text(&quit)));
    lines.push(attempt(program, &[], &daemon.pipe, &daemon.log, r));
    lines.push(format!("after quit: {:?}", daemon.pipe_entries()));
    lines
}

#[test]
fn start_failures_match_nvidia_program_live() {
    let Some(nvidia) = nvidia_program() else {
        eprintln!("note: nvidia-cuda-mps-control not on PATH; skipping live comparison");
        return;
    };
    let ours = failure_transcript(&emulator());
    let mut theirs = failure_transcript(&nvidia);
    for _ in 1..RETRIES {
        if theirs == ours {
            break;
        }
        theirs = failure_transcript(&nvidia);
    }
    for (got, want) in ours.iter().zip(theirs.iter()) {
        assert_eq!(got, want);
    }
    assert_eq!(ours.len(), theirs.len());
}
