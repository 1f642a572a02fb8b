//! Runs the built `gpushare-cdi-hook` the way a runtime does (state on stdin, arguments from
//! the CDI spec) against a fake daemon, using the recorded OCI states in
//! `shared/cases/oci/`.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use gpushare_proto::{
    AttachParams, Attachment, DetachParams, DetachResult, ErrorBody, ErrorCode, PodRef, Request,
    Response, OLDEST_PROTOCOL_VERSION,
};
use serde_json::Value;
use tempfile::TempDir;

const HOOK: &str = env!("CARGO_BIN_EXE_gpushare-cdi-hook");
const CLAIM: &str = "3b0c6e52-8f0a-4d7e-9a51-0c2f7d1e9a01";
/// Longest any hook run may take before the test calls it hung.
const HUNG: Duration = Duration::from_secs(30);

/// How the fake daemon answers every request.
#[derive(Debug, Clone)]
enum Reply {
    /// `{"result": …}`.
    Ok(Value),
    /// `{"error": {"code": …, "message": …}}`.
    Refuse(ErrorCode, String),
    /// Reads the request, then keeps the connection open without a word.
    Silent,
    /// As a gpushared from before `pod` in `attach`'s params: params with it are refused as
    /// serde refuses an unknown field; without it, answered with the value.
    BeforePod(Value),
}

/// What the fake daemon saw.
#[derive(Debug, Default)]
struct Seen {
    connections: usize,
    requests: Vec<String>,
}

impl Seen {
    fn only_request(&self) -> Request {
        assert_eq!(self.connections, 1, "requests: {:?}", self.requests);
        assert_eq!(self.requests.len(), 1, "requests: {:?}", self.requests);
        serde_json::from_str(&self.requests[0]).expect("the hook sends a valid request line")
    }
}

/// A Unix socket in a temporary directory, answered from a thread with canned responses.
struct FakeDaemon {
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Seen>,
    _dir: TempDir,
}

impl FakeDaemon {
    fn start(reply: Reply) -> FakeDaemon {
        let dir = tempfile::tempdir().expect("temporary directory");
        let socket = dir.path().join("gpushared.sock");
        let listener = UnixListener::bind(&socket).expect("bind the fake daemon's socket");
        // Non-blocking, so the thread can notice `stop` between connections.
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let stop = Arc::new(AtomicBool::new(false));
        let stop_seen = Arc::clone(&stop);
        let thread = thread::spawn(move || {
            let mut seen = Seen::default();
            let mut held = Vec::new();
            loop {
                match listener.accept() {
                    Ok((stream, _)) => {
                        seen.connections += 1;
                        if let Some(stream) = serve(stream, &reply, &mut seen) {
                            held.push(stream);
                        }
                    }
                    // `stop` is checked only once nothing is waiting, so a connection the hook
                    // made before it exited is always counted.
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if stop_seen.load(Ordering::SeqCst) {
                            return seen;
                        }
                        thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
        });
        FakeDaemon {
            socket,
            stop,
            thread,
            _dir: dir,
        }
    }

    fn socket(&self) -> &str {
        self.socket.to_str().expect("temporary paths are UTF-8")
    }

    /// Stops the daemon (call after the hook exited) and returns what it saw.
    fn finish(self) -> Seen {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().expect("fake daemon thread")
    }
}

/// Answers one request; returns the stream when it must stay open unanswered.
fn serve(stream: UnixStream, reply: &Reply, seen: &mut Seen) -> Option<UnixStream> {
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(Duration::from_secs(10))))
        .expect("blocking connection with a read timeout");
    let mut line = String::new();
    let read = BufReader::new(&stream).read_line(&mut line).unwrap_or(0);
    if read == 0 {
        return None;
    }
    seen.requests.push(line.trim_end().to_owned());
    let request: Request = serde_json::from_str(&line).expect("request line");
    let (result, error) = match reply {
        Reply::Ok(value) => (Some(value.clone()), None),
        Reply::Refuse(code, message) => (
            None,
            Some(ErrorBody {
                code: *code,
                message: message.clone(),
            }),
        ),
        Reply::Silent => return Some(stream),
        Reply::BeforePod(value) => {
            if request
                .params
                .as_ref()
                .is_some_and(|p| p.get("pod").is_some())
            {
                (
                    None,
                    Some(ErrorBody {
                        code: ErrorCode::InvalidRequest,
                        message: "params of attach: unknown field `pod`, expected one of \
                                  `claim_uid`, `container_id`, `pid`, `bundle`"
                            .into(),
                    }),
                )
            } else {
                (Some(value.clone()), None)
            }
        }
    };
    let response = Response {
        version: request.version,
        id: request.id,
        result,
        error,
    };
    let mut out = serde_json::to_vec(&response).expect("encode the response");
    out.push(b'\n');
    // The hook may already have given up; that is its business.
    let _ = (&stream).write_all(&out);
    None
}

/// What a hook run left behind.
#[derive(Debug)]
struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

impl Run {
    fn stderr_lines(&self) -> Vec<&str> {
        self.stderr.lines().collect()
    }

    /// The one line on stderr (panics if there are more or none).
    fn only_line(&self) -> &str {
        let lines = self.stderr_lines();
        assert_eq!(lines.len(), 1, "stderr: {:?}", self.stderr);
        lines[0]
    }
}

/// What the hook gets on stdin.
enum Stdin<'a> {
    /// These bytes, then end of file.
    Bytes(&'a [u8]),
    /// Nothing, and the pipe is never closed (a runtime that forgot to).
    NeverClosed,
}

fn run_hook(args: &[&str], stdin: Stdin<'_>) -> Run {
    let started = Instant::now();
    let mut child = Command::new(HOOK)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the hook");
    let pipe = child.stdin.take().expect("stdin is piped");
    let _open = match stdin {
        Stdin::Bytes(bytes) => {
            let bytes = bytes.to_vec();
            let mut pipe = pipe;
            // Written from a thread: a hook that does not read stdin must not block the test.
            thread::spawn(move || {
                let _ = pipe.write_all(&bytes);
            });
            None
        }
        Stdin::NeverClosed => Some(pipe),
    };
    let status = wait_bounded(&mut child);
    let elapsed = started.elapsed();
    let mut stdout = String::new();
    let mut stderr = String::new();
    child
        .stdout
        .take()
        .expect("stdout is piped")
        .read_to_string(&mut stdout)
        .expect("read the hook's stdout");
    child
        .stderr
        .take()
        .expect("stderr is piped")
        .read_to_string(&mut stderr)
        .expect("read the hook's stderr");
    Run {
        status,
        stdout,
        stderr,
        elapsed,
    }
}

fn wait_bounded(child: &mut Child) -> ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait for the hook") {
            return status;
        }
        if started.elapsed() > HUNG {
            let _ = child.kill();
            panic!("the hook ran for more than {HUNG:?}");
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/cases/oci")
}

/// A recorded state, or `None` (with a note) where the shared cases are not checked out.
fn case(name: &str) -> Option<Vec<u8>> {
    let dir = cases_dir();
    if !dir.is_dir() {
        eprintln!(
            "note: {} is absent; skipping this test of the recorded states",
            dir.display()
        );
        return None;
    }
    Some(fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}")))
}

/// The state's fields as the runtime wrote them, read independently of the hook's parser.
fn fields(state: &[u8]) -> Value {
    serde_json::from_slice(state).expect("the recorded state is JSON")
}

fn attach_args(socket: &str) -> Vec<&str> {
    vec!["attach", "--socket", socket, "--claim", CLAIM]
}

fn detach_args(socket: &str) -> Vec<&str> {
    vec!["detach", "--socket", socket, "--claim", CLAIM]
}

#[test]
fn attach_sends_the_runtime_state_and_starts_the_container_when_the_daemon_agrees() {
    let Some(state) = case("state-createRuntime.json") else {
        return;
    };
    let want = fields(&state);
    let id = want["id"].as_str().unwrap().to_owned();
    let bundle = want["bundle"].as_str().unwrap().to_owned();
    let attachment = Attachment {
        claim_uid: CLAIM.into(),
        container_id: id.clone(),
        pid: Some(48213),
        cgroup: None,
        bundle: Some(bundle.clone()),
        attached_at: 1_700_000_000,
        pod: None,
    };
    let daemon = FakeDaemon::start(Reply::Ok(serde_json::to_value(attachment).unwrap()));

    let run = run_hook(&attach_args(daemon.socket()), Stdin::Bytes(&state));
    let request = daemon.finish().only_request();

    assert!(run.status.success(), "{run:?}");
    assert_eq!(run.stderr, "", "a successful attach is silent");
    assert_eq!(run.stdout, "");
    // Version 1: attach means the same in every version, so the hook reaches any daemon.
    assert_eq!(request.version, OLDEST_PROTOCOL_VERSION);
    assert_eq!(request.method, "attach");
    let params: AttachParams = serde_json::from_value(request.params.unwrap()).unwrap();
    assert_eq!(
        params,
        AttachParams {
            claim_uid: CLAIM.into(),
            container_id: id,
            pid: Some(48213),
            bundle: Some(bundle),
            // containerd's CRI annotations in the state name the container's pod.
            pod: Some(PodRef {
                namespace: "ml-workloads".into(),
                name: "inference-pod".into(),
            }),
        }
    );
}

#[test]
fn a_gpushared_from_before_pods_attaches_the_container_without_its_pod() {
    let Some(state) = case("state-createRuntime.json") else {
        return;
    };
    let id = fields(&state)["id"].as_str().unwrap().to_owned();
    let attachment = Attachment {
        claim_uid: CLAIM.into(),
        container_id: id,
        pid: Some(48213),
        cgroup: None,
        bundle: None,
        attached_at: 1_700_000_000,
        pod: None,
    };
    let daemon = FakeDaemon::start(Reply::BeforePod(serde_json::to_value(attachment).unwrap()));

    let run = run_hook(&attach_args(daemon.socket()), Stdin::Bytes(&state));
    let seen = daemon.finish();

    assert!(run.status.success(), "{run:?}");
    assert_eq!(run.stderr, "");
    // Asked with the pod, refused for it, asked again without it.
    assert_eq!(seen.requests.len(), 2, "{:?}", seen.requests);
    let params = |i: usize| -> AttachParams {
        let r: Request = serde_json::from_str(&seen.requests[i]).unwrap();
        serde_json::from_value(r.params.unwrap()).unwrap()
    };
    assert_eq!(params(0).pod.unwrap().name, "inference-pod");
    assert_eq!(params(1).pod, None);
    assert_eq!(
        AttachParams {
            pod: None,
            ..params(0)
        },
        params(1)
    );
}

#[test]
fn attach_fails_the_start_with_the_daemons_message_when_refused() {
    let Some(state) = case("state-createRuntime.json") else {
        return;
    };
    let id = fields(&state)["id"].as_str().unwrap().to_owned();
    let refusals = [
        (
            ErrorCode::NotFound,
            format!("no claim {CLAIM} on this node"),
        ),
        (
            ErrorCode::NotReady,
            format!("claim {CLAIM} is not ready: its MPS control daemon is gone"),
        ),
        (
            ErrorCode::LimitReached,
            format!("claim {CLAIM} allows 2 attached containers (replicas) and has 2"),
        ),
    ];
    for (code, message) in refusals {
        let daemon = FakeDaemon::start(Reply::Refuse(code, message.clone()));
        let run = run_hook(&attach_args(daemon.socket()), Stdin::Bytes(&state));
        let request = daemon.finish().only_request();

        assert_eq!(run.status.code(), Some(1), "{code}: {run:?}");
        assert_eq!(request.method, "attach");
        assert_eq!(
            run.only_line(),
            format!("gpushare-cdi-hook: cannot attach container {id} to claim {CLAIM}: {message}"),
            "{code}"
        );
    }
}

#[test]
fn attach_fails_the_start_when_no_daemon_listens() {
    let Some(state) = case("state-createRuntime.json") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("missing.sock");
    let run = run_hook(&attach_args(socket.to_str().unwrap()), Stdin::Bytes(&state));
    assert_eq!(run.status.code(), Some(1), "{run:?}");
    let line = run.only_line();
    assert!(
        line.starts_with("gpushare-cdi-hook: cannot attach container "),
        "{line}"
    );
    assert!(line.contains(socket.to_str().unwrap()), "{line}");
}

#[test]
fn attach_gives_up_on_a_silent_daemon_within_its_timeout() {
    let Some(state) = case("state-createRuntime.json") else {
        return;
    };
    let daemon = FakeDaemon::start(Reply::Silent);
    let mut args = attach_args(daemon.socket());
    args.extend(["--timeout", "1"]);
    let run = run_hook(&args, Stdin::Bytes(&state));
    let seen = daemon.finish();

    assert_eq!(run.status.code(), Some(1), "{run:?}");
    assert!(
        run.elapsed < Duration::from_secs(4),
        "took {:?}",
        run.elapsed
    );
    assert!(
        run.only_line().ends_with("did not answer within 1s"),
        "{}",
        run.stderr
    );
    assert_eq!(seen.requests.len(), 1);
}

#[test]
fn attach_gives_up_on_a_stdin_that_is_never_closed() {
    let daemon = FakeDaemon::start(Reply::Ok(Value::Null));
    let mut args = attach_args(daemon.socket());
    args.extend(["--timeout", "1"]);
    let run = run_hook(&args, Stdin::NeverClosed);
    let seen = daemon.finish();

    assert_eq!(run.status.code(), Some(1), "{run:?}");
    assert!(
        run.elapsed < Duration::from_secs(4),
        "took {:?}",
        run.elapsed
    );
    assert_eq!(
        run.only_line(),
        "gpushare-cdi-hook attach: no complete OCI state on stdin within 1s"
    );
    assert_eq!(seen.connections, 0);
}

#[test]
fn attach_with_a_broken_state_names_the_field_and_asks_nothing() {
    let cases = [
        (
            "state-truncated.json",
            r#"gpushare-cdi-hook attach: OCI state on stdin is truncated (ends in field "pid")"#,
        ),
        (
            "state-bad-values.json",
            r#"gpushare-cdi-hook attach: invalid OCI state: field "pid": must be a positive integer, got -5"#,
        ),
    ];
    for (name, want) in cases {
        let Some(state) = case(name) else {
            return;
        };
        let daemon = FakeDaemon::start(Reply::Ok(Value::Null));
        let run = run_hook(&attach_args(daemon.socket()), Stdin::Bytes(&state));
        let seen = daemon.finish();

        assert!(!run.status.success(), "{name}: {run:?}");
        assert_eq!(run.only_line(), want, "{name}");
        assert_eq!(seen.connections, 0, "{name}: the daemon was contacted");
        assert!(seen.requests.is_empty(), "{name}");
    }
}

#[test]
fn detach_sends_the_container_and_exits_zero() {
    let Some(state) = case("state-poststop.json") else {
        return;
    };
    let id = fields(&state)["id"].as_str().unwrap().to_owned();
    let daemon = FakeDaemon::start(Reply::Ok(
        serde_json::to_value(DetachResult { detached: true }).unwrap(),
    ));
    let run = run_hook(&detach_args(daemon.socket()), Stdin::Bytes(&state));
    let request = daemon.finish().only_request();

    assert!(run.status.success(), "{run:?}");
    assert_eq!(run.stderr, "");
    assert_eq!(request.method, "detach");
    let params: DetachParams = serde_json::from_value(request.params.unwrap()).unwrap();
    assert_eq!(
        params,
        DetachParams {
            claim_uid: CLAIM.into(),
            container_id: id,
        }
    );
}

#[test]
fn detach_warns_but_exits_zero_when_the_daemon_refuses() {
    let Some(state) = case("state-poststop.json") else {
        return;
    };
    let message = format!("no claim {CLAIM} on this node");
    let daemon = FakeDaemon::start(Reply::Refuse(ErrorCode::NotFound, message.clone()));
    let run = run_hook(&detach_args(daemon.socket()), Stdin::Bytes(&state));
    let seen = daemon.finish();

    assert!(run.status.success(), "{run:?}");
    let line = run.only_line();
    assert!(
        line.starts_with("gpushare-cdi-hook detach: warning: "),
        "{line}"
    );
    assert!(line.ends_with(&message), "{line}");
    assert_eq!(seen.requests.len(), 1);
}

#[test]
fn detach_warns_but_exits_zero_without_a_daemon() {
    let Some(state) = case("state-poststop.json") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("missing.sock");
    let run = run_hook(&detach_args(socket.to_str().unwrap()), Stdin::Bytes(&state));

    assert!(run.status.success(), "{run:?}");
    let line = run.only_line();
    assert!(
        line.starts_with("gpushare-cdi-hook detach: warning: "),
        "{line}"
    );
    assert!(line.contains(socket.to_str().unwrap()), "{line}");
}

#[test]
fn detach_gives_up_on_a_silent_daemon_within_its_timeout() {
    let Some(state) = case("state-poststop.json") else {
        return;
    };
    let daemon = FakeDaemon::start(Reply::Silent);
    let mut args = detach_args(daemon.socket());
    args.extend(["--timeout", "1"]);
    let run = run_hook(&args, Stdin::Bytes(&state));
    let seen = daemon.finish();

    assert!(run.status.success(), "{run:?}");
    assert!(
        run.elapsed < Duration::from_secs(4),
        "took {:?}",
        run.elapsed
    );
    assert!(
        run.only_line().ends_with("did not answer within 1s"),
        "{}",
        run.stderr
    );
    assert_eq!(seen.requests.len(), 1);
}

#[test]
fn detach_of_a_broken_state_still_frees_the_container_it_names() {
    let Some(state) = case("state-truncated.json") else {
        return;
    };
    let daemon = FakeDaemon::start(Reply::Ok(
        serde_json::to_value(DetachResult { detached: false }).unwrap(),
    ));
    let run = run_hook(&detach_args(daemon.socket()), Stdin::Bytes(&state));
    let request = daemon.finish().only_request();

    assert!(run.status.success(), "{run:?}");
    let params: DetachParams = serde_json::from_value(request.params.unwrap()).unwrap();
    assert_eq!(params.container_id, "broken");
}

#[test]
fn detach_without_a_container_id_warns_and_asks_nothing() {
    let daemon = FakeDaemon::start(Reply::Ok(Value::Null));
    let run = run_hook(
        &detach_args(daemon.socket()),
        Stdin::Bytes(br#"{"ociVersion":"1.2.0","status":"stopped"}"#),
    );
    let seen = daemon.finish();

    assert!(run.status.success(), "{run:?}");
    assert_eq!(
        run.only_line(),
        format!(
            r#"gpushare-cdi-hook detach: warning: cannot detach from claim {CLAIM}: invalid OCI state: field "id": is missing"#
        )
    );
    assert_eq!(seen.connections, 0);
}

#[test]
fn unknown_or_missing_hooks_are_ignored() {
    let daemon = FakeDaemon::start(Reply::Ok(Value::Null));
    let cases: [(&[&str], &str); 2] = [
        (
            &["update-ldcache", "--folder", "/usr/lib64"],
            "update-ldcache",
        ),
        (&["--debug", "attach", "--claim", CLAIM], "--debug"),
    ];
    for (args, name) in cases {
        let run = run_hook(args, Stdin::Bytes(b"{}"));
        assert!(run.status.success(), "{args:?}: {run:?}");
        assert_eq!(
            run.only_line(),
            format!("gpushare-cdi-hook: unsupported hook \"{name}\", ignoring")
        );
    }
    assert_eq!(daemon.finish().connections, 0);
}

#[test]
fn no_arguments_at_all_is_a_usage_error() {
    // No CDI spec runs the hook without a hook name: this is someone trying it by hand.
    let daemon = FakeDaemon::start(Reply::Ok(Value::Null));
    let run = run_hook(&[], Stdin::Bytes(b""));
    assert_eq!(run.status.code(), Some(2), "{run:?}");
    let line = run.only_line();
    assert!(
        line.starts_with("gpushare-cdi-hook: no hook given; usage: gpushare-cdi-hook attach|detach --claim <UID>"),
        "{line}"
    );
    assert_eq!(daemon.finish().connections, 0);
}

#[test]
fn bad_arguments_fail_attach_but_not_detach() {
    let run = run_hook(&["attach", "--socket", "/x.sock"], Stdin::Bytes(b"{}"));
    assert_eq!(run.status.code(), Some(1), "{run:?}");
    assert!(run.only_line().contains("--claim"), "{}", run.stderr);

    let run = run_hook(
        &["detach", "--claim", CLAIM, "--no-such-flag"],
        Stdin::Bytes(b"{}"),
    );
    assert!(run.status.success(), "{run:?}");
    assert!(
        run.only_line()
            .starts_with("gpushare-cdi-hook detach: warning: "),
        "{}",
        run.stderr
    );
}

#[test]
fn version_is_printed() {
    let run = run_hook(&["--version"], Stdin::Bytes(b""));
    assert!(run.status.success(), "{run:?}");
    assert_eq!(
        run.stdout.trim(),
        format!("gpushare-cdi-hook {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn the_man_page_is_generated_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_hook(
        &["--generate-man", dir.path().to_str().unwrap()],
        Stdin::Bytes(b""),
    );
    assert!(run.status.success(), "{run:?}");
    let page = std::fs::read_to_string(dir.path().join("gpushare-cdi-hook.8")).unwrap();
    assert!(page.contains(".TH gpushare-cdi-hook 8"), "{page}");
    for hook in ["attach", "detach"] {
        assert!(page.contains(hook), "{hook}: {page}");
    }
}
