//! `gpushared` as systemd runs it: `READY=1` on `NOTIFY_SOCKET` only once the socket answers,
//! `WATCHDOG=1` pings, `RELOADING=1`/`READY=1` around a SIGHUP reload (a bad file refused, the
//! daemon still serving), Prometheus metrics parsed by Prometheus' own parser after a
//! prepare, the one log line per prepare/unprepare, and `gpushare doctor`.

use std::io::{Read, Write};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gpushare_e2e::{bin, is_root, load_claim, need, unique_uid, wait_until, with_uid, NODE};
use gpushare_proto::{Client, HealthInfo, Method, PrepareParams, PrepareResult, UidParams};

/// A `gpushared` started the way `gpushared.service` starts it: `NOTIFY_SOCKET` and the
/// watchdog variables set, its own config file.
struct Notified {
    dir: tempfile::TempDir,
    socket: PathBuf,
    config: PathBuf,
    notify: UnixDatagram,
    child: Child,
}

impl Notified {
    fn start(config: &str) -> Notified {
        let dir = tempfile::Builder::new()
            .prefix("gs-n-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let notify_path = dir.path().join("notify");
        let notify = UnixDatagram::bind(&notify_path).expect("notify socket");
        let config_path = dir.path().join("config.toml");
        std::fs::write(&config_path, config).expect("config");
        let socket = dir.path().join("sock");
        let log = std::fs::File::create(dir.path().join("log")).expect("log");
        // `exec` keeps the shell's pid, so WATCHDOG_PID names gpushared as systemd's would.
        let child = Command::new("sh")
            .arg("-c")
            .arg("WATCHDOG_PID=$$ exec \"$@\"")
            .arg("sh")
            .arg(bin("gpushared"))
            .arg("--config")
            .arg(&config_path)
            .args(["--simulate", "p4d.24xlarge", "--node-name", NODE])
            .args(["--shm-size-mib", "64"])
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--run-dir")
            .arg(dir.path().join("run"))
            .arg("--cdi-dir")
            .arg(dir.path().join("cdi"))
            .arg("--mps-control")
            .arg(bin("gpushare-mps-control"))
            .env("NOTIFY_SOCKET", &notify_path)
            .env("WATCHDOG_USEC", "400000")
            .env_remove("RUST_LOG")
            .env_remove("JOURNAL_STREAM")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("spawning gpushared");
        Notified {
            dir,
            socket,
            config: config_path,
            notify,
            child,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// The next notification datagram, within `within`.
    fn next(&self, within: Duration) -> Option<String> {
        self.notify.set_read_timeout(Some(within)).expect("timeout");
        let mut buf = [0u8; 4096];
        let n = self.notify.recv(&mut buf).ok()?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    /// Datagrams until one contains `what`, skipping watchdog pings; panics after 20 s.
    fn until(&self, what: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(m) = self.next(Duration::from_secs(1)) {
                if m.lines().any(|l| l == what) {
                    return m;
                }
            }
        }
        panic!("no {what} within 20 s; log:\n{}", self.log());
    }

    fn client(&self) -> Client {
        Client::connect(&self.socket, Duration::from_secs(10)).expect("connect")
    }

    fn sighup(&self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGHUP,
        )
        .expect("SIGHUP");
    }

    /// `host:port` of the metrics endpoint, from the last "serving metrics" log line.
    fn metrics_address(&self) -> Option<String> {
        let log = self.log();
        let line = log.lines().rev().find(|l| l.contains("serving metrics"))?;
        Some(
            line.split("address=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .to_string(),
        )
    }
}

impl Drop for Notified {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// `GET /metrics` over plain HTTP/1.1: (status line, content type, body).
fn scrape(addr: &str) -> (String, String, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect to metrics");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .expect("request");
    let mut raw = String::new();
    s.read_to_string(&mut raw).expect("response");
    let (head, body) = raw.split_once("\r\n\r\n").expect("HTTP response");
    let status = head.lines().next().unwrap_or_default().to_string();
    let ctype = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    (status, ctype, body.to_string())
}

/// Family names (and sample counts) as Prometheus' Python client parses the OpenMetrics
/// text; panics with the parser's message when it does not parse.
fn parse_openmetrics(text: &str) -> std::collections::BTreeMap<String, usize> {
    let script = "import sys\nfrom prometheus_client.openmetrics.parser import text_string_to_metric_families as p\nfor f in p(sys.stdin.read()):\n    print(f.name, f.type, len(f.samples))\n";
    let mut child = Command::new(PYTHON)
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("parser");
    assert!(
        out.status.success(),
        "not valid OpenMetrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let name = f.next()?.to_string();
            let _type = f.next()?;
            Some((name, f.next()?.parse().ok()?))
        })
        .collect()
}

/// Debian's python3, where `python3-prometheus-client` installs (PATH may lead elsewhere).
const PYTHON: &str = "/usr/bin/python3";

fn python_parser() -> bool {
    Command::new(PYTHON)
        .args(["-c", "import prometheus_client.openmetrics.parser"])
        .status()
        .is_ok_and(|s| s.success())
}

/// The repository's sample MPS claim (50 % active threads on gpu-0) under another UID.
fn mps_claim(uid: &str) -> serde_json::Value {
    let claim = load_claim(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../daemon/examples/claims/seed-mps.yaml"),
    );
    with_uid(&claim, uid)
}

/// Root is needed: the MPS claim mounts a tmpfs.
fn setup() -> bool {
    need(is_root(), "root (mounts)")
}

#[test]
fn ready_only_after_the_socket_answers_then_watchdog_and_reload() {
    if !setup() {
        return;
    }
    // The metrics port is taken: gpushared still serves claims (and says why it has no
    // metrics) rather than leave the node without GPU sharing.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let d = Notified::start(&format!("[metrics]\naddress = \"127.0.0.1:{port}\"\n"));
    let ready = d.until("READY=1");
    assert!(
        d.log().contains("metrics endpoint not served"),
        "{}",
        d.log()
    );
    // READY=1 is sent once the socket is bound and the checkpoint re-adopted: the very first
    // connection after it must be answered, with no retry.
    let health: HealthInfo = d
        .client()
        .call(Method::Health, None::<&()>)
        .expect("health right after READY=1");
    assert!(health.ready);
    assert!(
        ready.contains("STATUS=serving 0 claims on 8 GPUs"),
        "{ready}"
    );

    // Watchdog pings (WATCHDOG_USEC=400 ms: every 200 ms), while the service answers.
    d.until("WATCHDOG=1");
    d.until("WATCHDOG=1");

    // A reload with a broken file is refused and changes nothing; the daemon keeps serving.
    std::fs::write(&d.config, "[log]\nlevl = \"debug\"\n").expect("bad config");
    d.sighup();
    let reloading = d.until("RELOADING=1");
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading}");
    let after = d.until("READY=1");
    assert!(after.contains("reload refused"), "{after}");
    assert!(
        wait_until(Duration::from_secs(5), || d.log().contains("levl")),
        "the refusal names the key; log:\n{}",
        d.log()
    );
    let _: HealthInfo = d
        .client()
        .call(Method::Health, None::<&()>)
        .expect("still serving");

    // A good file: the log level takes effect at once, restart-only keys are named.
    std::fs::write(
        &d.config,
        "[log]\nlevel = \"debug\"\n[mps]\ntimeout_seconds = 7\n[metrics]\naddress = \"127.0.0.1:0\"\n",
    )
    .expect("config");
    d.sighup();
    d.until("RELOADING=1");
    let after = d.until("READY=1");
    assert!(after.contains("configuration reloaded"), "{after}");
    let log = d.log();
    assert!(log.contains("log level changed"), "{log}");
    assert!(
        log.contains("[mps]") && log.contains("next restart"),
        "{log}"
    );
    // The new metrics address is served.
    let addr = d
        .metrics_address()
        .expect("serving metrics after the reload");
    let (status, _, _) = scrape(&addr);
    assert!(status.contains("200"), "{status}");
    drop(taken);

    // And turned off by the next reload.
    std::fs::write(&d.config, "[metrics]\nenabled = false\n").expect("config");
    d.sighup();
    d.until("RELOADING=1");
    d.until("READY=1");
    assert!(
        wait_until(Duration::from_secs(5), || d
            .log()
            .contains("metrics endpoint turned off")),
        "{}",
        d.log()
    );
    assert!(
        std::net::TcpStream::connect(&addr).is_err(),
        "{addr} still served"
    );
}

#[test]
fn metrics_after_one_prepare_parse_and_name_every_family() {
    if !setup() {
        return;
    }
    if !need(
        python_parser(),
        "python3-prometheus-client (Prometheus' parser)",
    ) {
        return;
    }
    let d = Notified::start("[metrics]\naddress = \"127.0.0.1:0\"\n");
    d.until("READY=1");
    let addr = d.metrics_address().expect("metrics address in the log");
    let uid = unique_uid("metrics");
    let mut c = d.client();
    let r: PrepareResult = c
        .call(
            Method::Prepare,
            Some(&PrepareParams {
                claim: mps_claim(&uid),
            }),
        )
        .expect("prepare");
    assert_eq!(r.uid, uid);
    // One refused request, so that errors by code have a sample.
    let refused = c.call_value(Method::Unprepare, Some(&serde_json::json!({"uid": 7})));
    assert!(refused.is_err());

    let (status, ctype, body) = scrape(&addr);
    assert!(status.contains("200"), "{status}");
    assert!(ctype.starts_with("application/openmetrics-text"), "{ctype}");
    let families = parse_openmetrics(&body);
    for name in [
        "gpushare_build",
        "gpushare_ready",
        "gpushare_gpu_sharing_mode",
        "gpushare_gpu_compute_mode",
        "gpushare_claim_strategy",
        "gpushare_claim_attached_containers",
        "gpushare_mps_daemon_up",
        "gpushare_mps_daemon_restarts",
        "gpushare_prepare_duration_seconds",
        "gpushare_unprepare_duration_seconds",
        "gpushare_request_errors",
        "gpushare_checkpoint_writes",
    ] {
        assert!(
            families.contains_key(name),
            "{name} missing: {families:?}\n{body}"
        );
    }
    // Values, not just names: the MPS claim's daemon runs, gpu-0 is shared with MPS, one
    // prepare was timed, the refused unprepare counted, the checkpoint written.
    let has = |needle: &str| body.lines().any(|l| l.starts_with(needle));
    assert!(
        has(&format!(
            "gpushare_mps_daemon_up{{claim=\"{uid}\",group=\"0\"}} 1"
        )),
        "{body}"
    );
    assert!(has(&format!("gpushare_claim_strategy{{claim=\"{uid}\",namespace=\"ml-workloads\",name=\"inference-pod-gpu-claim-4xk9q\",strategy=\"MPS\"}} 1")), "{body}");
    assert!(has("gpushare_gpu_sharing_mode{gpu=\"gpu-0\""), "{body}");
    assert!(body.contains("mode=\"MPS\"} 1"), "{body}");
    assert!(
        has("gpushare_prepare_duration_seconds_count{outcome=\"ok\"} 1"),
        "{body}"
    );
    assert!(
        has("gpushare_request_errors_total{method=\"unprepare\",code=\"InvalidRequest\"} 1"),
        "{body}"
    );
    let writes = body
        .lines()
        .find_map(|l| l.strip_prefix("gpushare_checkpoint_writes_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .expect("checkpoint writes");
    assert!(writes >= 1.0, "{body}");

    // The one log line of the prepare: claim, strategy, devices, outcome, duration.
    let log = d.log();
    let line = log
        .lines()
        .find(|l| l.contains("gpushare::server: prepare ") && l.contains(&format!("claim={uid} ")))
        .unwrap_or_else(|| panic!("no prepare line for {uid}:\n{log}"));
    for field in [
        "strategy=MPS(50.0%)",
        "devices=gpu-0",
        "outcome=ok",
        "duration_ms=",
    ] {
        assert!(line.contains(field), "{field} missing in {line}");
    }

    let _: serde_json::Value = c
        .call(Method::Unprepare, Some(&UidParams { uid: uid.clone() }))
        .expect("unprepare");
    let log = d.log();
    let line = log
        .lines()
        .find(|l| {
            l.contains("gpushare::server: unprepare ") && l.contains(&format!("claim={uid} "))
        })
        .unwrap_or_else(|| panic!("no unprepare line for {uid}:\n{log}"));
    assert!(
        line.contains("devices=gpu-0")
            && line.contains("strategy=MPS(50.0%)")
            && line.contains("outcome=ok"),
        "{line}"
    );
    let (_, _, body) = scrape(&addr);
    assert!(
        body.lines()
            .any(|l| l.starts_with("gpushare_unprepare_duration_seconds_count{outcome=\"ok\"} 1")),
        "{body}"
    );
    // The released claim is gone from the per-claim families.
    assert!(!body.contains(&uid), "{body}");
}

fn doctor(args: &[&str]) -> (i32, String) {
    let out = Command::new(bin("gpushare"))
        .arg("doctor")
        .args(args)
        .output()
        .expect("gpushare doctor");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn line<'a>(out: &'a str, check: &str) -> &'a str {
    out.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(check))
        .unwrap_or_else(|| panic!("no {check} line in:\n{out}"))
}

#[test]
fn doctor_on_this_machine_fails_with_hints_and_passes_gpu_checks_simulated() {
    if !setup() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("gs-doc-")
        .tempdir_in("/tmp")
        .expect("tempdir");
    let missing_socket = dir.path().join("none.sock");
    let socket = missing_socket.to_str().expect("utf-8");
    // This machine: no GPU, no NVML, no daemon on that socket.
    let (code, out) = doctor(&["--socket", socket]);
    assert_eq!(code, 1, "{out}");
    for check in ["nvml", "socket"] {
        let l = line(&out, check);
        assert!(l.starts_with("FAIL") && l.contains(" -> "), "{l}");
    }
    assert!(line(&out, "compute-mode").starts_with("SKIP"), "{out}");
    assert!(out.ends_with("check(s) failed\n"), "{out}");

    // Simulated: the GPU checks pass; the others say what they find.
    let (code, out) = doctor(&[
        "--socket",
        socket,
        "--simulate",
        "p4d.24xlarge",
        "-o",
        "json",
    ]);
    let report: serde_json::Value = serde_json::from_str(&out).expect("json report");
    assert_eq!(code, 1, "the socket check still fails: {out}");
    assert_eq!(report["ok"], false);
    let status = |name: &str| {
        report["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| c["status"].as_str().unwrap_or_default().to_string())
            .unwrap_or_else(|| panic!("no {name}: {out}"))
    };
    assert_eq!(status("nvml"), "ok");
    assert_eq!(status("compute-mode"), "ok");
    assert_eq!(status("socket"), "fail");

    // With a daemon holding an MPS claim: socket, checkpoint and compute mode pass.
    let d = Notified::start("[metrics]\nenabled = false\n");
    d.until("READY=1");
    let uid = unique_uid("doctor");
    let _: PrepareResult = d
        .client()
        .call(
            Method::Prepare,
            Some(&PrepareParams {
                claim: mps_claim(&uid),
            }),
        )
        .expect("prepare");
    let cfg = dir.path().join("gpushared.toml");
    std::fs::write(
        &cfg,
        format!(
            "[paths]\nstate_dir = \"{}\"\nrun_dir = \"{}\"\ncdi_dir = \"{}\"\n",
            d.dir.path().join("state").display(),
            d.dir.path().join("run").display(),
            d.dir.path().join("cdi").display()
        ),
    )
    .expect("config");
    let daemon_socket = d.socket.to_str().expect("utf-8");
    let cfg_arg = cfg.to_str().expect("utf-8");
    let (_, out) = doctor(&[
        "--socket",
        daemon_socket,
        "--simulate",
        "p4d.24xlarge",
        "--config",
        cfg_arg,
    ]);
    for check in [
        "config",
        "nvml",
        "socket",
        "paths",
        "checkpoint",
        "compute-mode",
        "cdi-specs",
    ] {
        assert!(line(&out, check).starts_with("OK"), "{check}:\n{out}");
    }
    assert!(
        line(&out, "compute-mode").contains("1 GPU shared with MPS"),
        "{out}"
    );
    assert!(line(&out, "checkpoint").contains("1 claims"), "{out}");

    // A second spec defining the same claim device is caught.
    let spec = std::fs::read_dir(d.dir.path().join("cdi"))
        .expect("cdi dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains(&uid))
        .expect("the claim's spec");
    let copy = spec.with_file_name(format!(
        "copy-{}",
        spec.file_name().expect("name").to_string_lossy()
    ));
    std::fs::copy(&spec, &copy).expect("copy spec");
    let (code, out) = doctor(&[
        "--socket",
        daemon_socket,
        "--simulate",
        "p4d.24xlarge",
        "--config",
        cfg_arg,
    ]);
    assert_eq!(code, 1, "{out}");
    let l = line(&out, "cdi-specs");
    assert!(
        l.starts_with("FAIL") && l.contains("conflicting device"),
        "{l}"
    );
    std::fs::remove_file(&copy).expect("rm copy");
    let _: serde_json::Value = d
        .client()
        .call(Method::Unprepare, Some(&UidParams { uid }))
        .expect("unprepare");
}
