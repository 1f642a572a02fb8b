//! Hostile input and least privilege against a real `gpushared`: who may call what on its
//! socket, a flood of bad connections, symbolic links and traversal on every path it writes,
//! and the capabilities it keeps.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::collections::VecDeque;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{lchown, symlink, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use gpushare::privileges;
use gpushare_e2e::*;
use gpushare_proto::{ErrorCode, Method, Response, StrategyInfo, VersionInfo};
use serde_json::{json, Value};

/// Test ids: not in /etc/passwd or /etc/group, and unlike any engineer's own.
const READER_UID: u32 = 64_998;
const READ_GID: u32 = 64_999;
const STRANGER: u32 = 64_997;
const CHANGER_UID: u32 = 64_996;
const SUPPLEMENTARY_READER: u32 = 64_995;

/// Sends one request line as `uid`/`gid` (a child that drops to them) and prints the
/// response line, or `CONNECT <error>` when it cannot connect.
const PY_CLIENT: &str = r#"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("CONNECT " + type(e).__name__)
    sys.exit(3)
s.sendall(sys.argv[2].encode() + b"\n")
sys.stdout.write(s.makefile("rb").readline().decode())
"#;

/// The system's Python: one under root's home (pyenv) is out of a test uid's reach.
const PYTHON: &str = "/usr/bin/python3";

fn as_user(program: &Path, uid: u32, gid: u32) -> Command {
    let mut c = Command::new(program);
    c.uid(uid).gid(gid).current_dir("/").stdin(Stdio::null());
    c
}

fn raw_call_as(uid: u32, gid: u32, socket: &Path, request: &Value) -> String {
    let out = as_user(Path::new(PYTHON), uid, gid)
        .arg("-c")
        .arg(PY_CLIENT)
        .arg(socket)
        .arg(request.to_string())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// As [`raw_call_as`], for a uid whose membership of `group` is supplementary only: Python
/// starts as root, sets the groups, then drops to `uid` (gid `uid`).
fn raw_call_with_group(uid: u32, group: u32, socket: &Path, request: &Value) -> String {
    let drop = format!("import os\nos.setgroups([{group}])\nos.setgid({uid})\nos.setuid({uid})\n");
    let out = Command::new(PYTHON)
        .current_dir("/")
        .arg("-c")
        .arg(drop + PY_CLIENT)
        .arg(socket)
        .arg(request.to_string())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn error_code(line: &str) -> Option<ErrorCode> {
    let r: Response = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    r.error.map(|e| e.code)
}

fn request(method: &str, params: Value) -> Value {
    json!({"version": 1, "id": 7, "method": method, "params": params})
}

/// Lets other uids reach the daemon's socket (the harness's directory is 0700).
fn open_socket_dir(d: &Daemon) {
    fs::set_permissions(d.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn readers_list_only_changers_change_and_strangers_do_nothing() {
    let Some(cases) = setup() else {
        return;
    };
    if !need(
        Path::new(PYTHON).is_file(),
        "/usr/bin/python3 (test client as another uid)",
    ) {
        return;
    }
    // Mode 0666 lets a stranger connect, so the daemon's own check is what refuses it.
    let d = Daemon::start_with_config(
        DaemonOptions {
            mps_control: bin("gpushare-mps-control"),
            cdi_dir: None,
            run_dir: None,
        },
        &format!(
            "[socket]\nmode = \"0666\"\ngroup = \"{READ_GID}\"\nchanging_uids = [{CHANGER_UID}]\n"
        ),
    );
    open_socket_dir(&d);
    let meta = fs::metadata(&d.socket).unwrap();
    assert_eq!(
        meta.gid(),
        READ_GID,
        "the socket carries the configured group"
    );
    assert_eq!(meta.mode() & 0o777, 0o666);

    // A reader (by its primary group) lists with the CLI...
    let out = as_user(&bin("gpushare"), READER_UID, READ_GID)
        .arg("--socket")
        .arg(&d.socket)
        .args(["-o", "json", "gpus"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let gpus: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(gpus.as_array().unwrap().len(), 8);
    // ...but the CLI refuses to prepare in one line, before sending anything...
    let claim_file = cases.join("claims/seed-basic-v1beta1.yaml");
    let out = as_user(&bin("gpushare"), READER_UID, READ_GID)
        .arg("--socket")
        .arg(&d.socket)
        .arg("prepare")
        .arg("-f")
        .arg(&claim_file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("must run as root"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    // ...and the daemon refuses it on the wire as well.
    let uid = unique_uid("reader");
    let claim = with_uid(&load_claim(&claim_file), &uid);
    let prepare = request("prepare", json!({ "claim": claim }));
    let line = raw_call_as(READER_UID, READ_GID, &d.socket, &prepare);
    assert_eq!(
        error_code(&line),
        Some(ErrorCode::PermissionDenied),
        "{line}"
    );
    let unprepare = request("unprepare", json!({ "uid": uid }));
    let line = raw_call_as(READER_UID, READ_GID, &d.socket, &unprepare);
    assert_eq!(
        error_code(&line),
        Some(ErrorCode::PermissionDenied),
        "{line}"
    );
    assert!(d.claim(&uid).is_err(), "nothing was prepared");
    // Membership by a supplementary group counts the same.
    let line = raw_call_with_group(
        SUPPLEMENTARY_READER,
        READ_GID,
        &d.socket,
        &request("list_claims", Value::Null),
    );
    assert_eq!(error_code(&line), None, "{line}");
    let line = raw_call_with_group(SUPPLEMENTARY_READER, READ_GID, &d.socket, &prepare);
    assert_eq!(
        error_code(&line),
        Some(ErrorCode::PermissionDenied),
        "{line}"
    );

    // A stranger can call nothing, reading methods included; the refusal is logged once.
    for method in ["list_claims", "list_gpus", "health", "version"] {
        let line = raw_call_as(STRANGER, STRANGER, &d.socket, &request(method, Value::Null));
        assert_eq!(
            error_code(&line),
            Some(ErrorCode::PermissionDenied),
            "{method}: {line}"
        );
    }
    let line = raw_call_as(STRANGER, STRANGER, &d.socket, &prepare);
    assert_eq!(
        error_code(&line),
        Some(ErrorCode::PermissionDenied),
        "{line}"
    );
    let out = as_user(&bin("gpushare"), STRANGER, STRANGER)
        .arg("--socket")
        .arg(&d.socket)
        .arg("claims")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("PermissionDenied"),
        "{out:?}"
    );
    let log = d.log();
    let logged = |uid: u32| {
        log.lines()
            .filter(|l| l.contains("refused a request") && l.contains(&format!("peer_uid={uid}")))
            .count()
    };
    assert_eq!(logged(STRANGER), 1, "{log}");
    assert_eq!(logged(READER_UID), 1, "{log}");

    // A uid in changing_uids prepares and releases.
    let line = raw_call_as(CHANGER_UID, CHANGER_UID, &d.socket, &prepare);
    assert_eq!(error_code(&line), None, "{line}");
    assert!(d.claim(&uid).is_ok());
    let line = raw_call_as(CHANGER_UID, CHANGER_UID, &d.socket, &unprepare);
    assert_eq!(error_code(&line), None, "{line}");
    d.assert_nothing_left(&uid, &[]);
}

#[test]
fn by_default_only_root_can_even_connect() {
    if !need(is_root(), "root") || !need(Path::new(PYTHON).is_file(), "/usr/bin/python3") {
        return;
    }
    let d = Daemon::emulated();
    open_socket_dir(&d);
    let meta = fs::metadata(&d.socket).unwrap();
    assert_eq!((meta.mode() & 0o777, meta.uid(), meta.gid()), (0o660, 0, 0));
    let line = raw_call_as(
        READER_UID,
        READ_GID,
        &d.socket,
        &request("version", Value::Null),
    );
    assert_eq!(line, "CONNECT PermissionError");
    // The CLI run by that user: changing commands say they need root (not "permission
    // denied"), and reading ones say who may use the socket.
    for args in [
        vec!["prepare", "-f", "/dev/null"],
        vec!["unprepare", "some-claim"],
    ] {
        let out = as_user(&bin("gpushare"), READER_UID, READ_GID)
            .arg("--socket")
            .arg(&d.socket)
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains("must run as root"), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
    let out = as_user(&bin("gpushare"), READER_UID, READ_GID)
        .arg("--socket")
        .arg(&d.socket)
        .arg("status")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("may not use the socket"), "{stderr}");
    assert!(!stderr.contains("is gpushared running"), "{stderr}");
}

fn fd_count(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

fn version(socket: &Path) -> Result<VersionInfo, String> {
    let mut c = gpushare_proto::Client::connect(socket, Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    c.call(Method::Version, None::<&()>)
        .map_err(|e| e.to_string())
}

/// One hostile connection of kind `i % 6`; errors (the daemon hanging up on us) are expected.
fn hostile(socket: &Path, i: usize, held: &mut VecDeque<UnixStream>) {
    let Ok(mut s) = UnixStream::connect(socket) else {
        return;
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let answer = |s: &mut UnixStream, line: &[u8]| {
        if s.write_all(line).is_ok() {
            let mut out = String::new();
            let _ = BufReader::new(s).read_line(&mut out);
        }
    };
    match i % 6 {
        0 => answer(&mut s, b"\x00\xff\xfe garbage {]\n"),
        1 => answer(&mut s, format!("{}\n", "[".repeat(100_000)).as_bytes()),
        2 if i % 600 == 2 => {
            // Longer than any request may be: answered, then hung up on.
            answer(
                &mut s,
                &vec![b'x'; gpushare::server::MAX_REQUEST_BYTES + 10],
            )
        }
        2 => answer(
            &mut s,
            format!(
                "{{\"version\":1,\"id\":1,\"method\":\"prepare\",\"params\":{{\"claim\":{}}}}}\n",
                "{\"a\":".repeat(60) + "1" + &"}".repeat(60)
            )
            .as_bytes(),
        ),
        3 => {
            // Half-open: connected, never sends. At most 12 per thread held at once.
            held.push_back(s);
            if held.len() > 12 {
                held.pop_front();
            }
        }
        4 => {
            // Half a line, then silence.
            let _ = s.write_all(br#"{"version":1,"id":1,"meth"#);
            held.push_back(s);
            if held.len() > 12 {
                held.pop_front();
            }
        }
        _ => drop(s),
    }
}

#[test]
fn ten_thousand_hostile_connections_leave_the_daemon_serving_without_leaking() {
    if !need(is_root(), "root") {
        return;
    }
    let d = Daemon::start_with_config(
        DaemonOptions {
            mps_control: bin("gpushare-mps-control"),
            cdi_dir: None,
            run_dir: None,
        },
        "[socket]\nidle_timeout_seconds = 2\n",
    );
    for _ in 0..3 {
        version(&d.socket).unwrap();
    }
    let before = fd_count(d.pid());
    let threads = 8;
    let per_thread = 10_000 / threads;
    let started = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let socket = d.socket.clone();
            std::thread::spawn(move || {
                let mut held = VecDeque::new();
                let mut slowest = Duration::ZERO;
                for i in 0..per_thread {
                    hostile(&socket, t * per_thread + i, &mut held);
                    if i % 125 == 0 {
                        // A well-formed request amid the flood.
                        let t0 = Instant::now();
                        let v = version(&socket);
                        assert!(
                            v.is_ok(),
                            "well-formed request failed amid the flood: {v:?}"
                        );
                        slowest = slowest.max(t0.elapsed());
                    }
                }
                slowest
            })
        })
        .collect();
    let slowest = workers
        .into_iter()
        .map(|w| w.join().unwrap())
        .max()
        .unwrap();
    let flood = started.elapsed();
    eprintln!(
        "10000 hostile connections in {flood:?}; slowest well-formed request amid them {slowest:?}"
    );
    assert!(
        slowest < Duration::from_secs(5),
        "a well-formed request took {slowest:?} amid the flood"
    );
    // Every hostile connection is closed (by us, or by the daemon's idle timeout): the
    // daemon's descriptors come back to where they were.
    let settled = wait_until(Duration::from_secs(20), || fd_count(d.pid()) <= before);
    assert!(
        settled,
        "gpushared holds {} descriptors after the flood, {before} before",
        fd_count(d.pid())
    );
    version(&d.socket).unwrap();
    assert!(!d.log().contains("panicked"), "{}", d.log());
}

/// Runs `gpushared` with `flags` over a fresh private layout; it must exit (not serve).
fn gpushared_refuses(base: &Path, flags: &[(&str, &Path)]) -> Output {
    let config = base.join("config.toml");
    fs::write(&config, "").unwrap();
    let mut cmd = Command::new(bin("gpushared"));
    cmd.arg("--config").arg(&config).args([
        "--simulate",
        "p4d.24xlarge",
        "--node-name",
        NODE,
        "--mps-control",
    ]);
    cmd.arg(bin("gpushare-mps-control"));
    for (name, default) in [
        ("--socket", base.join("s.sock")),
        ("--state-dir", base.join("state")),
        ("--run-dir", base.join("run")),
        ("--cdi-dir", base.join("cdi")),
    ] {
        let value = flags
            .iter()
            .find(|(f, _)| *f == name)
            .map_or(default, |(_, p)| p.to_path_buf());
        cmd.arg(name).arg(value);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let exited = wait_until(Duration::from_secs(20), || {
        child.try_wait().unwrap().is_some()
    });
    if !exited {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    assert!(exited, "gpushared started where it must refuse: {out:?}");
    out
}

#[test]
fn linked_or_foreign_run_state_and_cdi_directories_are_refused() {
    if !need(is_root(), "root") {
        return;
    }
    for flag in ["--run-dir", "--state-dir", "--cdi-dir"] {
        let base = tempfile::Builder::new()
            .prefix("gsp-")
            .tempdir_in("/tmp")
            .unwrap();
        let outside = base.path().join("outside");
        fs::create_dir(&outside).unwrap();
        let link = base.path().join("link");
        symlink(&outside, &link).unwrap();
        let out = gpushared_refuses(base.path(), &[(flag, &link)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        let last = stderr.trim().lines().last().unwrap_or_default();
        assert!(
            last.contains(&link.display().to_string()) && last.contains("is a symbolic link"),
            "{flag}: {stderr}"
        );
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0, "{flag}");

        // Owned by someone else: refused as well, and left untouched.
        let foreign = base.path().join("foreign");
        fs::create_dir(&foreign).unwrap();
        lchown(&foreign, Some(65534), Some(65534)).unwrap();
        let out = gpushared_refuses(base.path(), &[(flag, &foreign)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(stderr.contains("owned by uid 65534"), "{flag}: {stderr}");
        assert_eq!(fs::read_dir(&foreign).unwrap().count(), 0, "{flag}");

        // Reached through a link that someone else owns: refused.
        let real = base.path().join("real");
        fs::create_dir(&real).unwrap();
        let their_link = base.path().join("theirs");
        symlink(&real, &their_link).unwrap();
        lchown(&their_link, Some(65534), Some(65534)).unwrap();
        let out = gpushared_refuses(base.path(), &[(flag, &their_link.join("sub"))]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("symbolic link owned by uid 65534"),
            "{flag}: {stderr}"
        );
        assert!(!real.join("sub").exists(), "{flag}");
    }
}

/// Every file under `dir`, as paths relative to it.
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn claim_paths_cannot_be_redirected_or_escape() {
    let Some(cases) = setup() else {
        return;
    };
    let d = Daemon::emulated();
    let outside = tempfile::Builder::new()
        .prefix("gso-")
        .tempdir_in("/tmp")
        .unwrap();
    let victim = outside.path().join("victim");
    fs::write(&victim, "keep").unwrap();

    // A link planted where an MPS claim's directory goes: prepare refuses, nothing is left.
    let uid = unique_uid("linked-run");
    let claims_dir = d.run_dir.join("claims");
    fs::create_dir_all(&claims_dir).unwrap();
    symlink(outside.path(), claims_dir.join(&uid)).unwrap();
    let mps = with_uid(&load_claim(&cases.join("claims/seed-mps.yaml")), &uid);
    let e = d.prepare(&mps).unwrap_err().to_string();
    assert!(e.contains("is a symbolic link"), "{e}");
    assert_eq!(tree(outside.path()), vec!["victim".to_string()]);
    assert!(d.claim(&uid).is_err());
    assert!(!d
        .cdi_dir
        .join(format!("gpushare.io-claim_{uid}.json"))
        .exists());
    // The rollback removed the planted link itself (never what it points to).
    assert!(fs::symlink_metadata(claims_dir.join(&uid)).is_err());
    let r = d.prepare(&mps).unwrap();
    assert_eq!(r.uid, uid);
    // Other host users may walk to the MPS directories (an MPS server runs as its client's
    // uid) but not list the claim's; the log directory is root's alone.
    let mode = |p: &Path| fs::symlink_metadata(p).unwrap().mode() & 0o7777;
    let claim_dir = claims_dir.join(&uid);
    assert_eq!(mode(&claim_dir), 0o711);
    let mps_root = fs::read_dir(&claim_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("mps-"))
        .unwrap();
    assert_eq!(
        [
            mode(&mps_root),
            mode(&mps_root.join("pipe")),
            mode(&mps_root.join("log"))
        ],
        [0o711, 0o755, 0o700]
    );
    d.unprepare(&uid);
    d.assert_nothing_left(&uid, &[]);

    // A link planted where the claim's CDI spec goes is replaced, never written through.
    let uid = unique_uid("linked-cdi");
    let spec = d.cdi_dir.join(format!("gpushare.io-claim_{uid}.json"));
    fs::create_dir_all(&d.cdi_dir).unwrap();
    symlink(&victim, &spec).unwrap();
    let basic = with_uid(
        &load_claim(&cases.join("claims/seed-basic-v1beta1.yaml")),
        &uid,
    );
    d.prepare(&basic).unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");
    assert!(!fs::symlink_metadata(&spec)
        .unwrap()
        .file_type()
        .is_symlink());
    d.unprepare(&uid);
    assert_eq!(fs::read_to_string(&victim).unwrap(), "keep");
    d.assert_nothing_left(&uid, &[]);

    // Traversal in the claim UID, request names and device names: refused, nothing written.
    let before = tree(d.dir.path());
    let traversal = load_claim(&cases.join("claims/invalid/claim-uid-path-traversal.json"));
    let e = d.prepare(&traversal).unwrap_err().to_string();
    assert!(e.contains("InvalidRequest"), "{e}");
    // ("a/b" is a legal request name: request "a", subrequest "b".)
    for bad in ["../../../etc", "..", "a/../b", "/abs", "a\\b"] {
        let mut c = with_uid(&mps, &unique_uid("trav"));
        c["status"]["allocation"]["devices"]["results"][0]["device"] = json!(bad);
        let e = d.prepare(&c).unwrap_err().to_string();
        assert!(
            e.contains("UnknownDevice") || e.contains("InvalidRequest"),
            "{bad}: {e}"
        );
        let mut c = with_uid(&mps, &unique_uid("trav"));
        c["status"]["allocation"]["devices"]["results"][0]["request"] = json!(bad);
        let e = d.prepare(&c).unwrap_err().to_string();
        assert!(e.contains("InvalidRequest"), "request {bad}: {e}");
        for method in [Method::Unprepare, Method::GetClaim] {
            let r: Result<Value, _> = d
                .client()
                .call(method, Some(&gpushare_proto::UidParams { uid: bad.into() }));
            let e = r.unwrap_err().to_string();
            assert!(e.contains("InvalidRequest"), "{method} {bad}: {e}");
        }
    }
    let mut after = tree(d.dir.path());
    after.retain(|p| !p.starts_with("gpushared.log"));
    let mut before = before;
    before.retain(|p| !p.starts_with("gpushared.log"));
    assert_eq!(before, after, "refused requests wrote nothing");
}

fn status_masks(pid: u32) -> Vec<(String, u64)> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.starts_with("Cap")
                .then(|| (k.to_string(), u64::from_str_radix(v.trim(), 16).unwrap()))
        })
        .collect()
}

#[test]
fn the_daemon_and_its_mps_control_daemons_keep_only_the_documented_capabilities() {
    let Some(cases) = setup() else {
        return;
    };
    for (name, program) in mps_programs() {
        let d = Daemon::start(DaemonOptions {
            mps_control: program,
            cdi_dir: None,
            run_dir: None,
        });
        // The test daemon simulates GPUs, so CAP_MKNOD is kept for their device nodes.
        let kept = privileges::mask(&privileges::kept(true));
        let masks = status_masks(d.pid());
        for (set, want) in [
            ("CapEff", kept),
            ("CapPrm", kept),
            ("CapBnd", kept),
            ("CapInh", 0),
            ("CapAmb", 0),
        ] {
            let got = masks.iter().find(|(k, _)| k == set).map(|(_, v)| *v);
            assert_eq!(got, Some(want), "{name}: gpushared's {set}: {masks:x?}");
        }
        // Its MPS control daemon runs as root too, and gets no more than the bounding set.
        let uid = unique_uid(&format!("caps-{name}"));
        let claim = with_uid(&load_claim(&cases.join("claims/seed-mps.yaml")), &uid);
        d.prepare(&claim)
            .unwrap_or_else(|e| panic!("{name}: {e}; log:\n{}", d.log()));
        let info = d.claim(&uid).unwrap();
        let pid = info
            .groups
            .iter()
            .find_map(|g| match &g.sharing {
                StrategyInfo::Mps(m) => Some(m.control_daemon_pid as u32),
                _ => None,
            })
            .unwrap();
        for (set, v) in status_masks(pid) {
            if set != "CapAmb" && set != "CapInh" {
                assert_eq!(v & !kept, 0, "{name}: MPS control daemon's {set} {v:x}");
            }
        }
        d.unprepare(&uid);
        // unprepare returns once the daemon released its pipe directory's lock, which it
        // does just before it exits (strategy::mps::wait_exit): allow it that moment.
        wait_until(Duration::from_secs(10), || {
            !gpushare::sys::pid_alive(pid as i32)
        });
        d.assert_nothing_left(&uid, &[pid as i32]);
    }
}

/// Starts gpushared under `setpriv --bounding-set <bounding>` (what systemd's
/// `CapabilityBoundingSet=` does) and returns its capability masks and log.
fn start_with_bounding_set(bounding: &str) -> (Vec<(String, u64)>, String) {
    let dir = tempfile::Builder::new()
        .prefix("gsb-")
        .tempdir_in("/tmp")
        .unwrap();
    let p = dir.path();
    fs::write(p.join("config.toml"), "[metrics]\nenabled = false\n").unwrap();
    let log = fs::File::create(p.join("log")).unwrap();
    let mut child = Command::new("setpriv")
        .args(["--bounding-set", bounding, "--"])
        .arg(bin("gpushared"))
        .arg("--config")
        .arg(p.join("config.toml"))
        .args(["--simulate", "g5.xlarge", "--node-name", NODE])
        .arg("--socket")
        .arg(p.join("s.sock"))
        .arg("--state-dir")
        .arg(p.join("state"))
        .arg("--run-dir")
        .arg(p.join("run"))
        .arg("--cdi-dir")
        .arg(p.join("cdi"))
        .arg("--mps-control")
        .arg(bin("gpushare-mps-control"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let up = wait_until(Duration::from_secs(20), || {
        UnixStream::connect(p.join("s.sock")).is_ok()
    });
    // setpriv execs gpushared: the child's pid is the daemon's.
    let masks = up.then(|| status_masks(child.id()));
    child.kill().unwrap();
    child.wait().unwrap();
    let log = fs::read_to_string(p.join("log")).unwrap();
    (
        masks.unwrap_or_else(|| panic!("gpushared did not start:\n{log}")),
        log,
    )
}

#[test]
fn a_bounding_set_already_reduced_by_the_service_manager_is_not_reported() {
    if !need(is_root(), "root") || !need(which("setpriv").is_some(), "setpriv") {
        return;
    }
    let kept = privileges::mask(&privileges::kept(true));
    // systemd's CapabilityBoundingSet= in gpushared.service: exactly what gpushared keeps
    // (CAP_MKNOD only because this daemon simulates its GPUs), no CAP_SETPCAP.
    let (masks, log) =
        start_with_bounding_set("-all,+sys_admin,+kill,+setuid,+setgid,+chown,+mknod");
    for (set, v) in &masks {
        if matches!(set.as_str(), "CapEff" | "CapPrm" | "CapBnd") {
            assert_eq!(*v, kept, "{set}: {masks:x?}");
        }
    }
    assert!(!log.contains("no CAP_SETPCAP"), "{log}");
    // One capability beyond what gpushared keeps, and no CAP_SETPCAP to drop it with: said.
    let (masks, log) =
        start_with_bounding_set("-all,+sys_admin,+kill,+setuid,+setgid,+chown,+mknod,+net_admin");
    let eff = masks.iter().find(|(k, _)| k == "CapEff").unwrap().1;
    assert_eq!(eff, kept, "effective reduced all the same: {masks:x?}");
    assert!(log.contains("no CAP_SETPCAP"), "{log}");
}

/// Holds connections to the socket as several uids at once: a root Python that forks one
/// child per uid; each child drops to its uid (primary group `gid`), keeps `per` connections
/// open with half a request line sent, reconnecting whenever the daemon closes one, for
/// `secs` seconds. A connection counts as held once it has gone a second without an answer
/// (a refusal comes at once). Each child prints `ready <uid>` after its first round, then
/// `done <uid> <most held at once> <each distinct refusal, |-joined, or ->` (one write each, so that lines of
/// different children never interleave).
const PY_HOLDER: &str = r#"
import os, select, socket, sys, time
path, uids, gid, per, secs = sys.argv[1], [int(u) for u in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
for uid in uids:
    if os.fork() != 0:
        continue
    os.setgroups([]); os.setgid(gid); os.setuid(uid)
    held, most, refusals, first = [], 0, set(), True
    deadline = time.time() + secs
    while time.time() < deadline:
        new = []
        while len(held) + len(new) < per:
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
                s.sendall(b'{"version":1,"id":1,"meth')
            except OSError:
                s.close()
                break
            new.append(s)
        time.sleep(1.0)
        kept = []
        for s in held + new:
            readable, _, _ = select.select([s], [], [], 0)
            if readable:
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                if data:
                    refusals.add(data.decode(errors="replace").strip().replace(" ", "_"))
                s.close()
            else:
                kept.append(s)
        held = kept
        most = max(most, len(held))
        if first:
            os.write(1, b"ready %d\n" % uid)
            first = False
    os.write(1, ("done %d %d %s\n" % (uid, most, "|".join(sorted(refusals)) or "-")).encode())
    os._exit(0)
for _ in uids:
    os.wait()
"#;

/// Uids of the socket's read group that flood it (not in /etc/passwd).
const FLOOD_UIDS: std::ops::Range<u32> = 64_900..64_914;

#[test]
fn readers_holding_connections_cannot_starve_root_or_the_hook() {
    let Some(cases) = setup() else {
        return;
    };
    if !need(Path::new(PYTHON).is_file(), "/usr/bin/python3") {
        return;
    }
    // The documented defaults: 256 connections, 64 kept for root and changing_uids, 16 per
    // reading uid, 5 s for a first request line.
    let d = Daemon::start_with_config(
        DaemonOptions {
            mps_control: bin("gpushare-mps-control"),
            cdi_dir: None,
            run_dir: None,
        },
        &format!("[socket]\ngroup = \"{READ_GID}\"\n"),
    );
    open_socket_dir(&d);
    let before = fd_count(d.pid());
    // 14 reading uids, 40 connections each: more than any share the daemon gives them.
    let uids: Vec<String> = FLOOD_UIDS.map(|u| u.to_string()).collect();
    let mut flood = Command::new(PYTHON)
        .current_dir("/")
        .arg("-c")
        .arg(PY_HOLDER)
        .arg(&d.socket)
        .arg(uids.join(","))
        .arg(READ_GID.to_string())
        .args(["40", "9"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(flood.stdout.take().unwrap()).lines();
    let mut ready = 0;
    while ready < uids.len() {
        let line = lines.next().unwrap().unwrap();
        if line.starts_with("ready") {
            ready += 1;
        }
    }

    // The daemon holds no more of their connections than the 192 slots not kept for root:
    // its descriptors, sampled while they hold what they can. A refused connection holds one
    // for a moment too, so the fewest of the samples is the measure.
    let held = (0..20)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(50));
            fd_count(d.pid()).saturating_sub(before)
        })
        .min()
        .unwrap();
    assert!(
        (150..=192 + 4).contains(&held),
        "{held} connections held by readers"
    );
    // While they hold what they can: root's prepare (the kubelet plugin's call) and the
    // hook's attach (the container runtime's) succeed.
    let uid = "3b0c6e52-8f0a-4d7e-9a51-0c2f7d1e9a01";
    let out = Command::new(bin("gpushare"))
        .arg("--socket")
        .arg(&d.socket)
        .arg("prepare")
        .arg("-f")
        .arg(cases.join("claims/seed-mps.yaml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "root's prepare amid the flood: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut hook = Command::new(bin("gpushare-cdi-hook"))
        .args(["attach", "--socket"])
        .arg(&d.socket)
        .args(["--claim", uid, "--timeout", "5"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    hook.stdin
        .take()
        .unwrap()
        .write_all(&fs::read(cases.join("oci/state-createRuntime.json")).unwrap())
        .unwrap();
    let out = hook.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the hook's attach amid the flood: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(d.claim(uid).unwrap().attached.len(), 1);
    // A reader past its share gets the daemon's own refusal, in one line.
    let out = as_user(&bin("gpushare"), FLOOD_UIDS.start, READ_GID)
        .arg("--socket")
        .arg(&d.socket)
        .arg("gpus")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.starts_with("gpushare: Busy: "), "{stderr}");
    assert!(!stderr.contains("does not match"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");

    // No reading uid held more than its 16; they were told why, by both bounds.
    let done: Vec<String> = lines.map(Result::unwrap).collect();
    flood.wait().unwrap();
    assert_eq!(
        done.iter().filter(|l| l.starts_with("done")).count(),
        uids.len()
    );
    for line in done.iter().filter(|l| l.starts_with("done")) {
        let most: usize = line.split(' ').nth(2).unwrap().parse().unwrap();
        assert!(most <= 16, "{line}");
    }
    for bound in [
        "socket.max_connections_per_uid",
        "socket.reserved_connections",
    ] {
        assert!(done.iter().any(|l| l.contains(bound)), "{bound}: {done:?}");
    }
    d.unprepare(uid);
    d.assert_nothing_left(uid, &[]);
}

#[test]
fn an_oversized_claim_is_refused_with_its_size() {
    let Some(cases) = setup() else {
        return;
    };
    let d = Daemon::emulated();
    let mut claim = load_claim(&cases.join("claims/seed-mps.yaml"));
    claim["metadata"]["annotations"] = json!({"example.com/blob": "x".repeat(3 << 20)});
    let file = d.dir.path().join("big-claim.json");
    fs::write(&file, serde_json::to_vec(&claim).unwrap()).unwrap();
    let out = Command::new(bin("gpushare"))
        .arg("--socket")
        .arg(&d.socket)
        .arg("prepare")
        .arg("-f")
        .arg(&file)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
    assert!(stderr.contains("2 MiB"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    let uid = claim["metadata"]["uid"].as_str().unwrap();
    assert!(d.claim(uid).is_err(), "nothing was prepared");
}

/// A `resource.k8s.io/v1` ResourceClaim `uid`, time-sliced on `device` of [`NODE`].
fn time_sliced_claim(uid: &str, device: &str) -> Value {
    let config = json!({
        "requests": ["gpu"],
        "opaque": {"driver": "gpu.nvidia.com",
                   "parameters": {"sharingMode": "time-slicing", "timeSlice": "default"}},
    });
    let mut from_claim = config.clone();
    from_claim["source"] = json!("FromClaim");
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": format!("unread-{uid}"), "namespace": "bench", "uid": uid},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}}],
            "config": [config],
        }},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": NODE, "device": device}],
            "config": [from_claim],
        }}},
    })
}

/// `VmRSS` of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Bytes waiting to be read on `s` (a peek: nothing is taken).
fn queued(s: &UnixStream, buf: &mut [u8]) -> usize {
    use nix::sys::socket::{recv, MsgFlags};
    use std::os::fd::AsRawFd;
    recv(
        s.as_raw_fd(),
        buf,
        MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT,
    )
    .unwrap_or(0)
}

/// Claims held while readers leave their `list_claims` answers unread
/// (`GPUSHARE_UNREAD_CLAIMS`): about 0.95 MB of answer each (the benchmark's row uses 10,000).
const UNREAD_CLAIMS: usize = 1_000;

/// A reading uid's share of connections (`socket.max_connections_per_uid`).
const UNREAD_READERS: usize = 16;

/// Issue 25, finding 3: each `list_claims` answer was built whole (the claims copied, their
/// JSON tree, its text) and held until its reader took the last byte, so 16 connections that
/// asked and never read took gpushared from 29 MB to 320 MB with 2,000 claims (1.5 GB with
/// 10,000), and 88 MB stayed resident after they closed.
#[test]
fn unread_list_claims_answers_do_not_grow_the_daemon() {
    if !need(is_root(), "root") {
        return;
    }
    let claims = std::env::var("GPUSHARE_UNREAD_CLAIMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(UNREAD_CLAIMS);
    let d = Daemon::emulated();
    let mut c = d.client();
    for i in 0..claims {
        let uid = format!("{:08x}-7e4d-4c1a-9b2f-{i:012x}", std::process::id());
        let device = format!("gpu-{}", 1 + i % 7);
        let _: Value = c
            .call(
                Method::Prepare,
                Some(&json!({"claim": time_sliced_claim(&uid, &device)})),
            )
            .unwrap();
    }
    // The baseline: the daemon with its claims, after one whole answer was read (whatever a
    // listing allocates for good is in it).
    let whole: Vec<Value> = c.call(Method::ListClaims, None::<&()>).unwrap();
    assert_eq!(whole.len(), claims);
    let answer_kib = serde_json::to_vec(&whole).unwrap().len() as u64 / 1024;
    drop((c, whole));
    std::thread::sleep(Duration::from_millis(500));
    let baseline = rss_kib(d.pid());

    // A uid's share of connections, each asking for the whole list (protocol version 1, as
    // any old client does) and reading nothing.
    let request = b"{\"version\":1,\"id\":1,\"method\":\"list_claims\"}\n";
    let readers: Vec<UnixStream> = (0..UNREAD_READERS)
        .map(|_| {
            let mut s = UnixStream::connect(&d.socket).unwrap();
            s.write_all(request).unwrap();
            s
        })
        .collect();
    // The daemon has answered every one as far as it will while nobody reads: each socket
    // holds the start of its answer, and none grows any more.
    let mut buf = vec![0u8; 8 << 20];
    let mut last = vec![usize::MAX; UNREAD_READERS];
    let settled = wait_until(Duration::from_secs(60), || {
        std::thread::sleep(Duration::from_millis(300));
        let now: Vec<usize> = readers.iter().map(|s| queued(s, &mut buf)).collect();
        let steady = now.iter().all(|&n| n > 0) && now == last;
        last = now;
        steady
    });
    assert!(settled, "the answers never settled: {last:?} bytes queued");
    let with_readers = rss_kib(d.pid());
    // Other callers are served meanwhile.
    let health: Value = d.client().call(Method::Health, None::<&()>).unwrap();
    assert_eq!(health["claims"], claims);
    drop(readers);
    let released = wait_until(Duration::from_secs(10), || {
        rss_kib(d.pid()) < baseline + baseline / 4
    });
    let after = rss_kib(d.pid());
    eprintln!(
        "{claims} claims ({answer_kib} KiB listed): gpushared's RSS {baseline} KiB, with \
         {UNREAD_READERS} unread answers {with_readers} KiB, after they closed {after} KiB"
    );
    assert!(
        with_readers < 2 * baseline,
        "{UNREAD_READERS} unread list_claims answers took gpushared from {baseline} KiB to \
         {with_readers} KiB"
    );
    // Bounded per answer, not only smaller: each costs far less than its size.
    let each = with_readers.saturating_sub(baseline) / UNREAD_READERS as u64;
    assert!(
        each < answer_kib / 4,
        "each unread answer of {answer_kib} KiB costs gpushared {each} KiB"
    );
    assert!(
        released,
        "gpushared kept {after} KiB after the readers closed ({baseline} KiB before)"
    );
    // The CLI lists them in pages (protocol version 2, 500 claims a page at most).
    let out = Command::new(bin("gpushare"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["-o", "json", "claims"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed.len(), claims);
}
