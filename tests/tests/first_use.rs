//! What a new user meets first: the messages of `gpushared`, `gpushare`, the hook and the
//! runtime wrapper when they are run by hand, wrongly or on a layout of one's own.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use gpushare_e2e::*;
use gpushare_proto::{ClaimInfo, Client, Method, PrepareParams, StrategyInfo, UidParams};

/// A uid of nobody's: not root, and no member of any group.
const NOBODY: u32 = 65534;

fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts that `out` failed with exactly one line on stderr, containing each of `needles`.
fn fails_in_one_line(out: &Output, needles: &[&str]) -> String {
    let stderr = stderr_of(out);
    assert!(!out.status.success(), "{out:?}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    for n in needles {
        assert!(stderr.contains(n), "{n:?} not in {stderr}");
    }
    stderr
}

/// `gpushared` on `--socket <base>/s.sock` with the given `--run-dir`, `--state-dir` and
/// `--cdi-dir`, a simulated p4d.24xlarge and the emulator; its log goes to `<base>/log`.
fn gpushared(base: &Path, run: &Path, state: &Path, cdi: &Path) -> Command {
    gpushared_with(base, run, state, cdi, &bin("gpushare-mps-control"))
}

/// As [`gpushared`], with `mps` as the MPS control program.
fn gpushared_with(base: &Path, run: &Path, state: &Path, cdi: &Path, mps: &Path) -> Command {
    let config = base.join("config.toml");
    fs::write(&config, "[metrics]\nenabled = false\n").unwrap();
    let mut cmd = Command::new(bin("gpushared"));
    cmd.arg("--config")
        .arg(&config)
        .args([
            "--simulate",
            "p4d.24xlarge",
            "--node-name",
            NODE,
            "--shm-size-mib",
            "64",
        ])
        .arg("--socket")
        .arg(base.join("s.sock"))
        .arg("--run-dir")
        .arg(run)
        .arg("--state-dir")
        .arg(state)
        .arg("--cdi-dir")
        .arg(cdi)
        .arg("--mps-control")
        .arg(mps)
        .stdin(Stdio::null());
    cmd
}

/// Runs `cmd`, which must exit by itself (refuse to start) within 20 s; killed otherwise.
fn exits(mut cmd: Command) -> Output {
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

/// Starts `cmd` with its output in `<base>/log` and waits until its socket answers.
fn serve(base: &Path, mut cmd: Command) -> Child {
    let log = fs::File::create(base.join("log")).unwrap();
    let child = cmd
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let up = wait_until(Duration::from_secs(20), || {
        Client::connect(base.join("s.sock"), Duration::from_secs(2)).is_ok()
    });
    assert!(
        up,
        "gpushared did not start: {}",
        fs::read_to_string(base.join("log")).unwrap_or_default()
    );
    child
}

/// SIGTERM, then the exit status and the whole log.
fn stop(base: &Path, mut child: Child) -> (std::process::ExitStatus, String) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    (status, fs::read_to_string(base.join("log")).unwrap())
}

/// `gpushare --socket BASE/s.sock ARGS` (the socket [`serve`] makes), run.
fn gpushare_on(base: &Path, args: &[&str]) -> Output {
    Command::new(bin("gpushare"))
        .arg("--socket")
        .arg(base.join("s.sock"))
        .args(args)
        .output()
        .unwrap()
}

fn client(base: &Path) -> Client {
    Client::connect(base.join("s.sock"), Duration::from_secs(60)).unwrap()
}

fn tmp_base(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap()
}

#[test]
fn gpushared_run_as_an_ordinary_user_says_it_must_run_as_root() {
    if !need(is_root(), "root (to run gpushared as another uid)") {
        return;
    }
    let base = tmp_base("gsu-");
    let p = base.path();
    // The directories are the user's own, so nothing but root's absence can stop it.
    for d in ["run", "state", "cdi"] {
        fs::create_dir(p.join(d)).unwrap();
        std::os::unix::fs::chown(p.join(d), Some(NOBODY), Some(NOBODY)).unwrap();
    }
    std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    let mut cmd = gpushared(p, &p.join("run"), &p.join("state"), &p.join("cdi"));
    cmd.uid(NOBODY).gid(NOBODY).current_dir("/");
    let out = exits(cmd);
    fails_in_one_line(&out, &["gpushared must run as root", "uid 65534"]);
    assert!(!p.join("s.sock").exists());
    assert_eq!(fs::read_dir(p.join("run")).unwrap().count(), 0);
    // What does not need root still works for anyone.
    for flag in ["--version", "--help", "--print-default-config"] {
        let out = Command::new(bin("gpushared"))
            .arg(flag)
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
            .unwrap();
        assert!(out.status.success(), "{flag}: {}", stderr_of(&out));
    }
}

#[test]
fn gpushared_version_names_gpushared() {
    let out = Command::new(bin("gpushared"))
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("gpushared {}\n", env!("CARGO_PKG_VERSION"))
    );
}

fn mps_pid(c: &ClaimInfo) -> i32 {
    c.groups
        .iter()
        .find_map(|g| match &g.sharing {
            StrategyInfo::Mps(m) => Some(m.control_daemon_pid),
            _ => None,
        })
        .unwrap()
}

#[test]
fn one_directory_as_run_and_state_directory_serves_restarts_and_cleans_up() {
    let Some(cases) = setup() else {
        return;
    };
    let base = tmp_base("gs1-");
    let p = base.path();
    let both = p.join("gs");
    let start = || serve(p, gpushared(p, &both, &both, &p.join("cdi")));
    let daemon = start();
    let uid = unique_uid("one-dir");
    let claim = with_uid(&load_claim(&cases.join("claims/seed-mps.yaml")), &uid);
    let _: gpushare_proto::PrepareResult = client(p)
        .call(Method::Prepare, Some(&PrepareParams { claim }))
        .unwrap();
    let pid = mps_pid(
        &client(p)
            .call(Method::GetClaim, Some(&UidParams { uid: uid.clone() }))
            .unwrap(),
    );
    let (status, log) = stop(p, daemon);
    assert!(status.success(), "{log}");
    // A first start on a fresh node is not a lost checkpoint: no warning says so.
    assert!(
        !log.lines()
            .any(|l| l.contains("WARN") && l.contains("checkpoint")),
        "{log}"
    );
    assert!(log.contains("no checkpoint and no host records"), "{log}");
    // A restart on the same layout re-adopts the claim's MPS control daemon.
    let daemon = start();
    let c: ClaimInfo = client(p)
        .call(Method::GetClaim, Some(&UidParams { uid: uid.clone() }))
        .unwrap();
    assert_eq!(c.state, gpushare_proto::ClaimState::Prepared);
    assert_eq!(mps_pid(&c), pid);
    let r: gpushare_proto::UnprepareResult = client(p)
        .call(Method::Unprepare, Some(&UidParams { uid: uid.clone() }))
        .unwrap();
    assert!(r.released);
    let (status, log) = stop(p, daemon);
    assert!(status.success(), "{log}");
    assert!(!both.join("claims").join(&uid).exists());
    assert!(wait_until(Duration::from_secs(10), || {
        !gpushare::sys::pid_alive(pid)
    }));
    // Only the driver's spec, which gpushared generates at start for the node, stays.
    let left: Vec<String> = fs::read_dir(p.join("cdi"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["gpushare.io-gpu.json"], "claims' CDI specs are gone");
}

#[test]
fn a_cdi_directory_shared_with_the_state_or_run_directory_is_refused_precisely() {
    if !need(is_root(), "root") {
        return;
    }
    let base = tmp_base("gsc-");
    let p = base.path();
    let shared = p.join("shared");
    for (run, state, which) in [
        (p.join("run"), shared.clone(), "state directory"),
        (shared.clone(), p.join("state"), "run directory"),
    ] {
        let out = exits(gpushared(p, &run, &state, &shared));
        fails_in_one_line(
            &out,
            &[
                &format!("the CDI directory {} is also the {which}", shared.display()),
                "container runtimes",
            ],
        );
        assert!(!p.join("s.sock").exists());
    }
}

#[test]
fn the_stop_line_counts_the_mps_control_daemons_left_running() {
    let Some(cases) = setup() else {
        return;
    };
    let base = tmp_base("gss-");
    let p = base.path();
    let start = || {
        serve(
            p,
            gpushared(p, &p.join("run"), &p.join("state"), &p.join("cdi")),
        )
    };
    let (_, log) = stop(p, start());
    let last = log
        .lines()
        .rfind(|l| l.contains("gpushared stopped"))
        .unwrap();
    assert!(!last.contains("left running"), "{last}");
    let daemon = start();
    let uid = unique_uid("stop-line");
    let claim = with_uid(&load_claim(&cases.join("claims/seed-mps.yaml")), &uid);
    let _: gpushare_proto::PrepareResult = client(p)
        .call(Method::Prepare, Some(&PrepareParams { claim }))
        .unwrap();
    let (_, log) = stop(p, daemon);
    let last = log
        .lines()
        .rfind(|l| l.contains("gpushared stopped"))
        .unwrap();
    assert!(last.contains("1 MPS control daemon left running"), "{last}");
    let daemon = start();
    let r: gpushare_proto::UnprepareResult = client(p)
        .call(Method::Unprepare, Some(&UidParams { uid }))
        .unwrap();
    assert!(r.released);
    stop(p, daemon);
}

/// `gpushare` with `args`, as root, and its output.
fn gpushare(args: &[&str]) -> Output {
    Command::new(bin("gpushare")).args(args).output().unwrap()
}

#[test]
fn a_claim_uid_argument_is_refused_as_an_argument() {
    if !need(is_root(), "root") {
        return;
    }
    let base = tmp_base("gsa-");
    let socket = base.path().join("none.sock");
    let socket = socket.to_str().unwrap();
    for command in ["unprepare", "claim"] {
        let out = gpushare(&["--socket", socket, command, "not/a/uid"]);
        let stderr = fails_in_one_line(
            &out,
            &["\"not/a/uid\" is not a valid claim UID", "contains '/'"],
        );
        // Checked before anything is asked: neither metadata.uid nor the socket is blamed.
        assert!(!stderr.contains("metadata.uid"), "{stderr}");
        assert!(!stderr.contains("connect"), "{stderr}");
    }
}

#[test]
fn a_socket_flag_naming_a_directory_or_a_file_says_so() {
    let base = tmp_base("gsd-");
    let dir = base.path().to_str().unwrap();
    let out = gpushare(&["--socket", dir, "claims"]);
    let stderr = fails_in_one_line(&out, &[&format!("{dir}: it is a directory, not a socket")]);
    assert!(!stderr.contains("refused"), "{stderr}");
    let file = base.path().join("file");
    fs::write(&file, "").unwrap();
    let out = gpushare(&["--socket", file.to_str().unwrap(), "status"]);
    fails_in_one_line(&out, &["it is a regular file, not a socket"]);
}

#[test]
fn resourceslice_output_is_refused_by_every_command_but_gpus() {
    let base = tmp_base("gso-");
    let socket: PathBuf = base.path().join("none.sock");
    let socket = socket.to_str().unwrap();
    for args in [
        vec!["doctor", "--simulate", "g5.xlarge"],
        vec!["claims"],
        vec!["status"],
        vec!["profiles"],
        vec!["mig", "list"],
        vec!["completion", "bash"],
    ] {
        let mut all = vec!["--socket", socket, "-o", "resourceslice"];
        all.extend(&args);
        let out = gpushare(&all);
        fails_in_one_line(&out, &["-o resourceslice applies to `gpushare gpus` only"]);
        assert!(out.stdout.is_empty(), "{args:?} printed {:?}", out.stdout);
    }
}

#[test]
fn doctor_checks_a_hand_run_daemon_on_its_own_directories() {
    let Some(cases) = setup() else {
        return;
    };
    let base = tmp_base("gsx-");
    let p = base.path();
    let (run, state, cdi) = (p.join("run"), p.join("state"), p.join("cdi"));
    let daemon = serve(p, gpushared(p, &run, &state, &cdi));
    let uid = unique_uid("doctor-dirs");
    let claim = with_uid(&load_claim(&cases.join("claims/seed-mps.yaml")), &uid);
    let _: gpushare_proto::PrepareResult = client(p)
        .call(Method::Prepare, Some(&PrepareParams { claim }))
        .unwrap();
    // An empty config file: the doctor knows only what the command line tells it.
    let config = p.join("doctor.toml");
    fs::write(&config, "").unwrap();
    let doctor = |dirs: bool| {
        let mut cmd = Command::new(bin("gpushare"));
        cmd.arg("--socket")
            .arg(p.join("s.sock"))
            .args([
                "-o",
                "json",
                "doctor",
                "--simulate",
                "p4d.24xlarge",
                "--config",
            ])
            .arg(&config);
        if dirs {
            cmd.arg("--state-dir")
                .arg(&state)
                .arg("--run-dir")
                .arg(&run)
                .arg("--cdi-dir")
                .arg(&cdi);
        }
        let out = cmd.output().unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", stderr_of(&out)));
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_string(),
                    (
                        c["status"].as_str().unwrap().to_string(),
                        c["detail"].as_str().unwrap().to_string(),
                    ),
                )
            })
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    // Without the directories: doctor reads them from the daemon's command line, says so,
    // and what the daemon uses passes.
    let checks = doctor(false);
    assert_eq!(checks["paths"].0, "ok", "{checks:?}");
    assert!(
        checks["paths"]
            .1
            .contains("directories from gpushared's command line (pid "),
        "{checks:?}"
    );
    assert_eq!(checks["checkpoint"].0, "ok", "{checks:?}");
    // With them: what the daemon uses passes, the emulator included (simulated GPUs).
    let checks = doctor(true);
    for name in [
        "paths",
        "checkpoint",
        "claims",
        "socket",
        "mps-control",
        "cdi-specs",
    ] {
        assert_eq!(checks[name].0, "ok", "{name}: {checks:?}");
    }
    assert!(
        checks["mps-control"].1.contains("gpushare-mps-control"),
        "{checks:?}"
    );
    let r: gpushare_proto::UnprepareResult = client(p)
        .call(Method::Unprepare, Some(&UidParams { uid }))
        .unwrap();
    assert!(r.released);
    stop(p, daemon);
}

#[test]
fn unprepare_all_releases_every_claim_with_one_line_each() {
    let Some(cases) = setup() else {
        return;
    };
    let base = tmp_base("gsu-");
    let p = base.path();
    let (run, state, cdi) = (p.join("run"), p.join("state"), p.join("cdi"));
    let daemon = serve(p, gpushared(p, &run, &state, &cdi));
    let gpushare = |args: &[&str]| gpushare_on(p, args);
    let mut uids = Vec::new();
    for (file, tag) in [
        ("seed-mps.yaml", "all-a"),
        ("seed-timeslicing.yaml", "all-b"),
    ] {
        let uid = unique_uid(tag);
        let claim = with_uid(&load_claim(&cases.join("claims").join(file)), &uid);
        let _: gpushare_proto::PrepareResult = client(p)
            .call(Method::Prepare, Some(&PrepareParams { claim }))
            .unwrap();
        uids.push(uid);
    }
    // A UID and --all together, or neither, are refused before anything is asked.
    let out = gpushare(&["unprepare", "--all", &uids[0]]);
    assert!(!out.status.success(), "{out:?}");
    let out = gpushare(&["unprepare"]);
    assert!(!out.status.success(), "{out:?}");

    let out = gpushare(&["unprepare", "--all"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort_unstable();
    let mut expected: Vec<String> = uids.iter().map(|u| format!("claim {u} released")).collect();
    expected.sort();
    assert_eq!(lines, expected, "{stdout}");
    let left: Vec<ClaimInfo> = client(p).call(Method::ListClaims, None::<&()>).unwrap();
    assert!(left.is_empty(), "{left:?}");
    // Nothing left: one line saying so, success (idempotent).
    let out = gpushare(&["unprepare", "--all"]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "no claim is prepared; nothing to do\n"
    );
    stop(p, daemon);
}

/// Children of `pid` that have exited and are not reaped (`Z` in `/proc/<child>/stat`).
fn zombie_children(pid: u32) -> Vec<String> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() == Some(&"Z") && fields.get(1) == Some(&pid.to_string().as_str()) {
            out.push(stat.trim().to_string());
        }
    }
    out
}

#[test]
fn an_mps_daemon_started_again_while_gpushared_starts_leaves_no_zombie() {
    let Some(cases) = setup() else {
        return;
    };
    // NVIDIA's program: its `-d` leaves an intermediate process that exits while the start
    // waits for the daemon, and becomes gpushared's child (a child subreaper).
    let Some((_, nvidia)) = mps_programs().into_iter().find(|(k, _)| *k == "nvidia") else {
        return;
    };
    let base = tmp_base("gsz-");
    let p = base.path();
    let start = || {
        serve(
            p,
            gpushared_with(p, &p.join("run"), &p.join("state"), &p.join("cdi"), &nvidia),
        )
    };
    let daemon = start();
    let uid = unique_uid("zombie");
    let claim = with_uid(&load_claim(&cases.join("claims/seed-mps.yaml")), &uid);
    let _: gpushare_proto::PrepareResult = client(p)
        .call(Method::Prepare, Some(&PrepareParams { claim }))
        .unwrap();
    let get = || -> ClaimInfo {
        client(p)
            .call(Method::GetClaim, Some(&UidParams { uid: uid.clone() }))
            .unwrap()
    };
    let old = mps_pid(&get());
    let (status, log) = stop(p, daemon);
    assert!(status.success(), "{log}");
    // The claim's MPS control daemon dies while gpushared is away: the start restarts it.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(wait_until(Duration::from_secs(10), || {
        !gpushare::sys::pid_alive(old)
    }));
    let daemon = start();
    let c = get();
    assert_ne!(mps_pid(&c), old, "started again");
    let gone = wait_until(Duration::from_secs(5), || {
        zombie_children(daemon.id()).is_empty()
    });
    assert!(
        gone,
        "children of gpushared left unreaped: {:?}",
        zombie_children(daemon.id())
    );
    let _: gpushare_proto::UnprepareResult = client(p)
        .call(Method::Unprepare, Some(&UidParams { uid: uid.clone() }))
        .unwrap();
    let (status, log) = stop(p, daemon);
    assert!(status.success(), "{log}");
}

#[test]
fn gpushared_prints_its_default_config_into_a_closed_pipe_quietly() {
    // `gpushared --print-default-config | head`, once head has gone: the write fails with
    // EPIPE (the daemon keeps SIGPIPE ignored), which must end it without a panic.
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = Command::new(bin("gpushared"))
        .arg("--print-default-config")
        .stdin(Stdio::null())
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(stderr_of(&out), "", "nothing on stderr, no panic");
    assert!(out.status.success(), "{:?}", out.status);
}

#[test]
fn unprepare_of_a_uid_no_claim_has_fails_naming_it_while_the_socket_stays_idempotent() {
    let Some(cases) = setup() else {
        return;
    };
    let base = tmp_base("gsn-");
    let p = base.path();
    let (run, state, cdi) = (p.join("run"), p.join("state"), p.join("cdi"));
    let daemon = serve(p, gpushared(p, &run, &state, &cdi));
    let gpushare = |args: &[&str]| gpushare_on(p, args);
    let uid = unique_uid("typo");
    let claim = with_uid(
        &load_claim(&cases.join("claims").join("seed-timeslicing.yaml")),
        &uid,
    );
    let _: gpushare_proto::PrepareResult = client(p)
        .call(Method::Prepare, Some(&PrepareParams { claim }))
        .unwrap();
    // A typo of the UID: an error naming what was given, nothing released, exit status 1.
    let typo = format!("{uid}x");
    for args in [
        &["unprepare", &typo][..],
        &["-o", "json", "unprepare", &typo][..],
    ] {
        let out = gpushare(args);
        let stderr = fails_in_one_line(
            &out,
            &[
                &format!("no claim with UID \"{typo}\""),
                "nothing was released",
            ],
        );
        assert_eq!(out.status.code(), Some(1), "{stderr}");
    }
    // -o json still prints the daemon's answer.
    let out = gpushare(&["-o", "json", "unprepare", &typo]);
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["released"], false, "{answer}");
    let left: Vec<ClaimInfo> = client(p).call(Method::ListClaims, None::<&()>).unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    // kubelet's path, the socket, stays idempotent: an unknown claim is a success.
    let r: gpushare_proto::UnprepareResult = client(p)
        .call(Method::Unprepare, Some(&UidParams { uid: typo.clone() }))
        .unwrap();
    assert!(!r.released);
    // The right UID releases it, once; the second time it is no claim either.
    let out = gpushare(&["unprepare", &uid]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("claim {uid} released\n")
    );
    let out = gpushare(&["unprepare", &uid]);
    fails_in_one_line(&out, &[&format!("no claim with UID \"{uid}\"")]);
    stop(p, daemon);
}

#[test]
fn claim_and_unprepare_take_a_unique_start_of_a_uid_and_refuse_an_ambiguous_one() {
    let Some(cases) = setup() else {
        return;
    };
    let base = tmp_base("gsp-");
    let p = base.path();
    let (run, state, cdi) = (p.join("run"), p.join("state"), p.join("cdi"));
    let daemon = serve(p, gpushared(p, &run, &state, &cdi));
    let gpushare = |args: &[&str]| gpushare_on(p, args);
    // Two UIDs alike up to `-a`, and one that starts both.
    let tag = unique_uid("pfx");
    let (a1, a2, whole) = (format!("{tag}-a1x"), format!("{tag}-a2y"), tag.clone());
    for (uid, file) in [
        (&a1, "seed-timeslicing.yaml"),
        (&a2, "seed-mps.yaml"),
        (&whole, "seed-basic-v1beta1.yaml"),
    ] {
        let claim = with_uid(&load_claim(&cases.join("claims").join(file)), uid);
        let _: gpushare_proto::PrepareResult = client(p)
            .call(Method::Prepare, Some(&PrepareParams { claim }))
            .unwrap();
    }
    // Ambiguous: exit status 1, one line naming every UID it starts; nothing released.
    let start = format!("{tag}-a");
    for args in [&["claim", &start][..], &["unprepare", &start][..]] {
        let out = gpushare(args);
        let stderr = fails_in_one_line(
            &out,
            &[
                &format!("\"{start}\" is the start of 2 claims' UIDs: {a1}, {a2}"),
                "give more of the UID",
            ],
        );
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: {:?}", out.stdout);
    }
    let left: Vec<ClaimInfo> = client(p).call(Method::ListClaims, None::<&()>).unwrap();
    assert_eq!(left.len(), 3, "{left:?}");
    // A whole UID wins over the longer ones it starts.
    let out = gpushare(&["-o", "json", "claim", &whole]);
    let shown: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", stderr_of(&out)));
    assert_eq!(shown["uid"], whole.as_str());
    // A unique start names its claim.
    let out = gpushare(&["claim", &format!("{tag}-a2")]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with(&format!("Claim:      {a2} (")),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The table's short UIDs are such starts: `claims` shows each as one that resolves.
    let out = gpushare(&["claims"]);
    let table = String::from_utf8_lossy(&out.stdout).into_owned();
    let shorts: Vec<String> = table
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap().to_string())
        .collect();
    assert_eq!(shorts.len(), 3, "{table}");
    for short in &shorts {
        let out = gpushare(&["-o", "json", "claim", short]);
        let shown: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{short}: {e}: {}", stderr_of(&out)));
        assert!(
            shown["uid"].as_str().unwrap().starts_with(short.as_str()),
            "{short}: {shown}"
        );
    }
    let wide = gpushare(&["-o", "wide", "claims"]);
    let wide = String::from_utf8_lossy(&wide.stdout);
    for uid in [&a1, &a2, &whole] {
        assert!(
            wide.lines()
                .any(|l| l.trim_start().starts_with(&format!("{uid} "))),
            "{wide}"
        );
    }
    // unprepare of a unique start releases that claim, named whole.
    let out = gpushare(&["unprepare", &format!("{tag}-a1")]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("claim {a1} released\n")
    );
    // The start is no longer ambiguous: it names the one claim left that it starts.
    let out = gpushare(&["unprepare", &start]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("claim {a2} released\n")
    );
    // A start nothing has: today's error, exit status 1.
    let out = gpushare(&["unprepare", &start]);
    fails_in_one_line(
        &out,
        &[
            &format!("no claim with UID \"{start}\""),
            "nothing was released",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    // Releasing takes at least the table's 8 characters: a shorter start, though unique now,
    // is refused and nothing is released (`claim` takes any unique start).
    let short = &whole[..4];
    let out = gpushare(&["unprepare", short]);
    fails_in_one_line(
        &out,
        &[
            &format!("\"{short}\" is only the start of claim {whole}"),
            "at least 8 characters",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let out = gpushare(&["-o", "json", "claim", short]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let out = gpushare(&["unprepare", &whole]);
    assert!(out.status.success(), "{}", stderr_of(&out));
    stop(p, daemon);
}
