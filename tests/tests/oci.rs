//! The OCI state cases of `shared/cases/oci` through the real hook binary and a real daemon,
//! as the table in `shared/cases/README.md` says.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use gpushare_e2e::*;

fn hook(verb: &str, socket: &Path, claim: &str, state: &[u8]) -> Output {
    let mut child = Command::new(bin("gpushare-cdi-hook"))
        .args([verb, "--socket"])
        .arg(socket)
        .args(["--claim", claim, "--timeout", "5"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("gpushare-cdi-hook");
    child.stdin.take().unwrap().write_all(state).unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn oci_state_cases_behave_as_documented() {
    let Some(cases) = setup() else {
        return;
    };
    let oci = cases.join("oci");
    let read = |f: &str| std::fs::read(oci.join(f)).unwrap();
    let d = Daemon::emulated();
    // The createRuntime state names claim 3b0c6e52-… (seed-mps.yaml).
    let uid = "3b0c6e52-8f0a-4d7e-9a51-0c2f7d1e9a01";
    let id = "8f1d6b2a0c3e4f5a9b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a";

    // Before the claim is prepared, attach fails with a one-line reason.
    let out = hook("attach", &d.socket, uid, &read("state-createRuntime.json"));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains(uid), "{err}");

    d.prepare(&load_claim(&cases.join("claims/seed-mps.yaml")))
        .unwrap_or_else(|e| panic!("{e}\n{}", d.log()));
    let out = hook("attach", &d.socket, uid, &read("state-createRuntime.json"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c = d.claim(uid).unwrap();
    assert_eq!(c.attached.len(), 1);
    let a = &c.attached[0];
    assert_eq!(a.container_id, id);
    assert_eq!(a.pid, Some(48213));
    assert_eq!(a.claim_uid, uid);
    assert!(a.bundle.as_deref().is_some_and(|b| b.ends_with(id)));

    // Malformed states: one line naming the field, non-zero, nothing sent.
    for (file, field) in [
        ("state-truncated.json", "pid"),
        ("state-bad-values.json", "pid"),
    ] {
        let out = hook("attach", &d.socket, uid, &read(file));
        assert!(!out.status.success(), "{file}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{file}: {err}");
        assert!(err.contains(field), "{file}: {err}");
        assert_eq!(
            d.claim(uid).unwrap().attached.len(),
            1,
            "{file}: nothing changed"
        );
    }

    // poststop: detach, always exit 0.
    let out = hook("detach", &d.socket, uid, &read("state-poststop.json"));
    assert!(out.status.success());
    assert!(d.claim(uid).unwrap().attached.is_empty());
    // Again (already detached), with the claim gone, and with the daemon down: still 0.
    assert!(hook("detach", &d.socket, uid, &read("state-poststop.json"))
        .status
        .success());
    d.unprepare(uid);
    assert!(hook("detach", &d.socket, uid, &read("state-poststop.json"))
        .status
        .success());
    let gone = d.dir.path().join("no-such.sock");
    let out = hook("detach", &gone, uid, &read("state-poststop.json"));
    assert!(out.status.success());
    assert!(!out.stderr.is_empty(), "a warning on stderr");
}

#[test]
fn the_fifth_container_on_a_four_replica_claim_fails_to_start() {
    let Some(cases) = setup() else {
        return;
    };
    let d = Daemon::emulated();
    let r = d
        .prepare(&load_claim(&cases.join("claims/seed-timeslicing.yaml")))
        .unwrap();
    let uid = r.uid;
    // Live pids: the daemon frees the slots of containers whose process is gone.
    let state = |id: &str| {
        format!(
            r#"{{"ociVersion":"1.2.0","id":"{id}","status":"creating","pid":{},"bundle":"/run/b/{id}"}}"#,
            std::process::id()
        )
    };
    for i in 1..=4 {
        let out = hook(
            "attach",
            &d.socket,
            &uid,
            state(&format!("c{i}")).as_bytes(),
        );
        assert!(
            out.status.success(),
            "container {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = hook("attach", &d.socket, &uid, state("c5").as_bytes());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains(&uid) && err.contains("4 of 4") && err.contains("replicas: 4"),
        "{err}"
    );
    // One leaves; the next one starts.
    assert!(hook("detach", &d.socket, &uid, state("c2").as_bytes())
        .status
        .success());
    assert!(hook("attach", &d.socket, &uid, state("c5").as_bytes())
        .status
        .success());
    assert_eq!(d.claim(&uid).unwrap().attached.len(), 4);
}
