//! Unit tests of `server.rs`.

use super::dispatch::log_claim_event;
use super::*;
use crate::cdi::HookConfig;
use crate::gpu::SimulatedBackend;
use crate::service::ServiceConfig;
use crate::strategy::mps::MpsControl;
use crate::sys::fake::FakeHost;
use gpushare_proto::{Method, Response};

async fn start(max_connections: usize, idle: Duration) -> (tempfile::TempDir, PathBuf) {
    let (dir, socket, _) = start_with(
        max_connections,
        (FIRST_REQUEST_TIMEOUT, idle),
        REQUEST_TIMEOUT,
        FakeHost::default(),
    )
    .await;
    (dir, socket)
}

/// A server on a fake host; `(first, idle)` are the first-request and idle timeouts.
async fn start_with(
    max_connections: usize,
    (first, idle): (Duration, Duration),
    request_timeout: Duration,
    host: FakeHost,
) -> (tempfile::TempDir, PathBuf, FakeHost) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ServiceConfig {
        node_name: "n".into(),
        drivers: vec!["gpu.nvidia.com".into()],
        run_dir: dir.path().join("run"),
        cdi_dir: dir.path().join("cdi"),
        checkpoint: dir.path().join("cp.json"),
        hook: HookConfig {
            path: "/h".into(),
            socket: "/s".into(),
            timeout_secs: 1,
        },
        shm_bytes: Some(1),
        driver_spec: None,
    };
    let backend = Arc::new(
        SimulatedBackend::without_device_nodes("g5.xlarge", "n", Path::new("/d")).unwrap(),
    );
    let mps = MpsControl::new("/m".into(), host.ops(), Duration::from_millis(100));
    let service = Arc::new(Service::new(cfg, backend, mps).unwrap());
    let socket = dir.path().join("s");
    let server_cfg = Arc::new(ServerConfig {
        socket: socket.clone(),
        mode: 0o660,
        group: 0,
        changing_uids: vec![],
        max_connections,
        reserved_connections: 0,
        max_connections_per_uid: max_connections,
        first_request_timeout: first,
        idle_timeout: idle,
        request_timeout,
        metrics: None,
    });
    let listener = bind(&server_cfg).unwrap();
    tokio::spawn(serve(listener, service, server_cfg));
    (dir, socket, host)
}

async fn call(stream: &mut UnixStream, line: &str) -> Response {
    stream
        .write_all(format!("{line}\n").as_bytes())
        .await
        .unwrap();
    let mut reader = BufReader::new(stream);
    let mut out = String::new();
    reader.read_line(&mut out).await.unwrap();
    serde_json::from_str(&out).unwrap()
}

#[tokio::test]
async fn methods_without_params_refuse_params() {
    let (_dir, socket) = start(8, IDLE_TIMEOUT).await;
    let mut s = UnixStream::connect(&socket).await.unwrap();
    let ok = call(
        &mut s,
        r#"{"version":1,"id":1,"method":"list_gpus","params":{}}"#,
    )
    .await;
    assert_eq!(ok.result.unwrap().as_array().unwrap().len(), 1);
    let bad = call(
        &mut s,
        r#"{"version":1,"id":2,"method":"health","params":{"verbose":true}}"#,
    )
    .await;
    assert_eq!(bad.error.unwrap().code, ErrorCode::InvalidRequest);
    assert_eq!(bad.id, 2);
}

#[tokio::test]
async fn a_bad_uid_parameter_is_named_as_the_parameter() {
    let (_dir, socket) = start(8, IDLE_TIMEOUT).await;
    let mut s = UnixStream::connect(&socket).await.unwrap();
    for (id, line) in [
            r#"{"version":1,"id":1,"method":"get_claim","params":{"uid":"not/a/uid"}}"#,
            r#"{"version":1,"id":2,"method":"unprepare","params":{"uid":"not/a/uid"}}"#,
            r#"{"version":1,"id":3,"method":"detach","params":{"claim_uid":"not/a/uid","container_id":"c"}}"#,
        ]
        .into_iter()
        .enumerate()
        {
            let r = call(&mut s, line).await;
            let e = r.error.unwrap();
            assert_eq!(e.code, ErrorCode::InvalidRequest, "{line}");
            assert!(
                e.message.contains(r#""not/a/uid" is not a valid claim UID: it contains '/'"#),
                "{}",
                e.message
            );
            assert!(!e.message.contains("metadata.uid"), "{}", e.message);
            assert_eq!(r.id, id as u64 + 1);
        }
}

#[tokio::test]
async fn connections_past_the_cap_are_refused_and_idle_ones_closed() {
    let (_dir, socket) = start(2, Duration::from_millis(300)).await;
    let _a = UnixStream::connect(&socket).await.unwrap();
    let _b = UnixStream::connect(&socket).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut c = UnixStream::connect(&socket).await.unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).await.unwrap();
    assert!(text.contains("serving 2 connections already"), "{text}");
    assert!(text.contains("\"code\":\"Busy\""), "{text}");
    // The idle ones are closed after the idle timeout, and their slots serve again.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut d = UnixStream::connect(&socket).await.unwrap();
    let r = call(&mut d, r#"{"version":1,"id":7,"method":"version"}"#).await;
    assert_eq!(r.id, 7);
    assert!(r.result.is_some());
}

#[tokio::test]
async fn a_connection_that_sends_nothing_gives_its_slot_back_at_the_first_request_deadline() {
    let (_dir, socket, _) = start_with(
        8,
        (Duration::from_millis(300), IDLE_TIMEOUT),
        REQUEST_TIMEOUT,
        FakeHost::default(),
    )
    .await;
    // Half a line, then silence: closed at the first-request deadline, not after the
    // 60 s idle timeout.
    let mut silent = UnixStream::connect(&socket).await.unwrap();
    silent
        .write_all(br#"{"version":1,"id":1,"meth"#)
        .await
        .unwrap();
    let mut rest = String::new();
    let closed =
        tokio::time::timeout(Duration::from_secs(10), silent.read_to_string(&mut rest)).await;
    assert!(closed.is_ok(), "still open after 10 s");
    assert_eq!(rest, "");
    // A client at work: after its first request only the idle timeout applies.
    let mut busy = UnixStream::connect(&socket).await.unwrap();
    let r = call(&mut busy, r#"{"version":1,"id":1,"method":"version"}"#).await;
    assert!(r.result.is_some());
    tokio::time::sleep(Duration::from_millis(900)).await;
    let r = call(&mut busy, r#"{"version":1,"id":2,"method":"version"}"#).await;
    assert_eq!(r.id, 2);
    assert!(r.result.is_some());
}

#[test]
fn root_and_changing_uids_are_privileged_holders() {
    let cfg = policy(2000, &[1500]);
    assert_eq!(holder_of(&cfg, Some(&peer(0, 0, &[]))), Holder::Privileged);
    assert_eq!(
        holder_of(&cfg, Some(&peer(1500, 1500, &[]))),
        Holder::Privileged
    );
    // A reader of the socket's group is not: it reads, and shares the other slots.
    assert_eq!(
        holder_of(&cfg, Some(&peer(1000, 2000, &[]))),
        Holder::Unprivileged(1000)
    );
    assert_eq!(holder_of(&cfg, None), Holder::Unprivileged(u32::MAX));
}

fn policy(group: u32, changing: &[u32]) -> ServerConfig {
    ServerConfig {
        socket: "/s".into(),
        mode: 0o660,
        group,
        changing_uids: changing.to_vec(),
        max_connections: 1,
        reserved_connections: 0,
        max_connections_per_uid: 1,
        first_request_timeout: FIRST_REQUEST_TIMEOUT,
        idle_timeout: IDLE_TIMEOUT,
        request_timeout: REQUEST_TIMEOUT,
        metrics: None,
    }
}

fn peer(uid: u32, gid: u32, groups: &[u32]) -> Peer {
    Peer {
        uid,
        gid,
        pid: None,
        groups: groups.to_vec(),
    }
}

#[test]
fn authorize_by_uid_and_group() {
    let cfg = policy(2000, &[1500]);
    for m in Method::ALL {
        assert!(
            authorize(&cfg, Some(&peer(0, 0, &[])), m).is_ok(),
            "root {m}"
        );
        assert!(
            authorize(&cfg, Some(&peer(1500, 1500, &[])), m).is_ok(),
            "changing uid {m}"
        );
        // Group members read, by primary or supplementary gid, and never change.
        for member in [peer(1000, 2000, &[]), peer(1000, 1000, &[4, 2000])] {
            assert_eq!(
                authorize(&cfg, Some(&member), m).is_ok(),
                !m.is_changing(),
                "{m}"
            );
        }
        let stranger = authorize(&cfg, Some(&peer(1001, 1001, &[4])), m)
            .unwrap_err()
            .to_string();
        assert!(stranger.contains("peer uid 1001"), "{stranger}");
        assert!(authorize(&cfg, None, m).is_err());
    }
}

/// The denials' messages are the `PermissionDenied` answers operators read: each names the
/// method, what it needs and the peer's uid, as they did when they were strings.
#[test]
fn denials_say_what_the_method_needs() {
    let cfg = policy(2000, &[1500]);
    let member = peer(1000, 2000, &[]);
    let stranger = peer(1001, 1001, &[4]);
    let changing = authorize(&cfg, Some(&member), Method::Prepare).unwrap_err();
    assert_eq!(
        changing,
        AuthorizeError::ChangeRefused {
            method: Method::Prepare,
            uid: 1000
        }
    );
    assert_eq!(
        changing.to_string(),
        format!(
            "{} needs root or a uid in socket.changing_uids (peer uid 1000)",
            Method::Prepare
        )
    );
    let reading = authorize(&cfg, Some(&stranger), Method::Health).unwrap_err();
    assert_eq!(
        reading.to_string(),
        format!(
            "{} needs root, a uid in socket.changing_uids or membership of the socket's group 2000 (peer uid 1001)",
            Method::Health
        )
    );
    let unknown = authorize(&cfg, None, Method::Health).unwrap_err();
    assert_eq!(
        unknown.to_string(),
        format!(
            "{} refused: the peer's credentials are unknown",
            Method::Health
        )
    );
}

#[test]
fn nesting_is_counted_outside_strings() {
    assert!(!nesting_exceeds(br#"{"a":[1,{"b":2}]}"#, 3));
    assert!(nesting_exceeds(br#"{"a":[1,{"b":[]}]}"#, 3));
    // Brackets inside strings, escaped quotes included, do not count.
    assert!(!nesting_exceeds(br#"{"a":"[[[[\"[[[["}"#, 1));
    let deep = "[".repeat(100_000);
    assert!(nesting_exceeds(deep.as_bytes(), MAX_JSON_DEPTH));
    let err = decode_request(deep.as_bytes()).unwrap_err();
    assert!(err.error.unwrap().message.contains("nested deeper than 64"));
}

#[tokio::test]
async fn garbage_and_deep_json_get_an_error_and_the_connection_closed() {
    let (_dir, socket) = start(8, IDLE_TIMEOUT).await;
    for garbage in [
        "not json at all".to_string(),
        format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000)),
        format!(
            r#"{{"version":1,"id":3,"method":"health","params":{}}}"#,
            "{\"a\":".repeat(200) + "1" + &"}".repeat(200)
        ),
    ] {
        let mut s = UnixStream::connect(&socket).await.unwrap();
        let r = call(&mut s, &garbage).await;
        assert_eq!(r.error.unwrap().code, ErrorCode::InvalidRequest);
        let mut rest = String::new();
        s.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "", "the connection is closed after a malformed line");
    }
    let mut ok = UnixStream::connect(&socket).await.unwrap();
    let r = call(&mut ok, r#"{"version":1,"id":9,"method":"version"}"#).await;
    assert!(r.result.is_some(), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_its_time_is_answered_and_finishes_in_the_background() {
    let host = FakeHost::default();
    // Every MPS control program run takes 300 ms; a prepare runs it several times.
    host.state().delay = Some(Duration::from_millis(300));
    let (_dir, socket, host) = start_with(
        8,
        (FIRST_REQUEST_TIMEOUT, IDLE_TIMEOUT),
        Duration::from_millis(100),
        host,
    )
    .await;
    let claim = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"uid": "slow", "name": "c", "namespace": "ns"},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpus", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0"}],
            "config": [{"source": "FromClaim", "requests": ["gpus"], "opaque": {"driver": "gpu.nvidia.com",
                "parameters": {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}}}}}]}}}
    });
    let line =
        serde_json::json!({"version": 1, "id": 5, "method": "prepare", "params": {"claim": claim}});
    let mut s = UnixStream::connect(&socket).await.unwrap();
    let r = call(&mut s, &line.to_string()).await;
    let e = r.error.unwrap();
    assert_eq!((r.id, e.code), (5, ErrorCode::Internal));
    assert!(
        e.message.contains("did not finish within 100ms"),
        "{}",
        e.message
    );
    // The connection still serves, and the prepare completes on its own.
    let get = r#"{"version":1,"id":6,"method":"get_claim","params":{"uid":"slow"}}"#;
    let mut done = false;
    for _ in 0..100 {
        let r = call(&mut s, get).await;
        if r.result.is_some_and(|c| c["state"] == "Prepared") {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(done, "the prepare finished in the background");
    host.state().delay = None;
}

/// A `tracing` writer into a shared buffer, to read back what a log call printed.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What `f` logged on this thread, as the formatter prints it (without colours).
fn logged(f: impl FnOnce()) -> String {
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, f);
    let bytes = out.0.lock().unwrap().clone();
    String::from_utf8(bytes).unwrap()
}

#[test]
fn claim_event_duration_is_rounded_to_a_tenth_of_a_millisecond() {
    let text = logged(|| {
        log_claim_event(
            Method::Unprepare,
            "u-1",
            None,
            None,
            Duration::from_nanos(553_272_485),
        );
        log_claim_event(
            Method::Unprepare,
            "u-2",
            None,
            Some((ErrorCode::NotFound, "gone")),
            Duration::from_nanos(400_011),
        );
    });
    let durations: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split("duration_ms=").nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(durations, ["553.3", "0.4"], "{text}");
}

/// Finding 8 of the break-it session: serde's sequence form of structs let a JSON array
/// stand for the envelope (`[1,7,"version"]`) and for `params` (`["abc"]`), contrary to
/// docs/protocol.md ("one JSON object", `params` an object).
#[tokio::test]
async fn arrays_are_refused_as_the_envelope_and_as_params() {
    let (_dir, socket) = start(8, IDLE_TIMEOUT).await;
    for envelope in [
        r#"[1,7,"version"]"#,
        r#"[1,7,"list_claims",null]"#,
        "[]",
        r#"  ["*"]"#,
        "7",
        r#""version""#,
    ] {
        let mut s = UnixStream::connect(&socket).await.unwrap();
        let r = call(&mut s, envelope).await;
        assert!(r.result.is_none(), "{envelope}: {r:?}");
        let e = r.error.unwrap();
        assert_eq!(e.code, ErrorCode::InvalidRequest, "{envelope}");
        assert!(
            e.message.starts_with(MALFORMED) && e.message.contains("must be one JSON object"),
            "{envelope}: {}",
            e.message
        );
        let mut rest = String::new();
        s.read_to_string(&mut rest).await.unwrap();
        assert_eq!(rest, "", "{envelope}: the connection is closed");
    }
    let mut s = UnixStream::connect(&socket).await.unwrap();
    for (id, line, shape) in [
        (
            1,
            r#"{"version":1,"id":1,"method":"get_claim","params":["abc"]}"#,
            "an array",
        ),
        (
            2,
            r#"{"version":1,"id":2,"method":"unprepare","params":["abc"]}"#,
            "an array",
        ),
        (
            3,
            r#"{"version":1,"id":3,"method":"attach","params":["abc","cid",12345,null]}"#,
            "an array",
        ),
        (
            4,
            r#"{"version":1,"id":4,"method":"detach","params":["abc","cid"]}"#,
            "an array",
        ),
        (
            5,
            r#"{"version":1,"id":5,"method":"prepare","params":[{}]}"#,
            "an array",
        ),
        (
            6,
            r#"{"version":1,"id":6,"method":"mig_apply","params":["x","y",true]}"#,
            "an array",
        ),
        (
            7,
            r#"{"version":1,"id":7,"method":"get_claim","params":"abc"}"#,
            "a string",
        ),
    ] {
        let r = call(&mut s, line).await;
        let e = r.error.unwrap();
        assert_eq!((r.id, e.code), (id, ErrorCode::InvalidRequest), "{line}");
        assert!(
            e.message.contains("params must be a JSON object") && e.message.contains(shape),
            "{line}: {}",
            e.message
        );
    }
    // The connection still serves (params of the wrong shape are not a malformed line).
    let r = call(&mut s, r#"{"version":1,"id":9,"method":"version"}"#).await;
    assert!(r.result.is_some(), "{r:?}");
}

/// A time-sliced claim `uid` on the g5.xlarge's only GPU.
fn time_sliced(uid: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"uid": uid, "name": uid, "namespace": "ns"},
        "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0"}],
            "config": [{"source": "FromClaim", "requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com",
                "parameters": {"sharingMode": "time-slicing", "timeSlice": "default"}}}]}}}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_claims_answers_in_the_requests_version_whole_or_in_pages() {
    let (_dir, socket) = start(8, IDLE_TIMEOUT).await;
    let mut s = UnixStream::connect(&socket).await.unwrap();
    let uids: Vec<String> = (0..5).map(|i| format!("claim-{i}")).collect();
    for (i, uid) in uids.iter().enumerate() {
        let line = serde_json::json!({"version": 1, "id": i, "method": "prepare",
            "params": {"claim": time_sliced(uid)}});
        let r = call(&mut s, &line.to_string()).await;
        assert!(r.error.is_none(), "{r:?}");
        assert_eq!(r.version, 1, "a version-1 request is answered in version 1");
    }
    // Version 1: the whole list, as before.
    let r = call(&mut s, r#"{"version":1,"id":7,"method":"list_claims"}"#).await;
    assert_eq!((r.version, r.id), (1, 7));
    let listed: Vec<gpushare_proto::ClaimInfo> = serde_json::from_value(r.result.unwrap()).unwrap();
    assert_eq!(
        listed.iter().map(|c| &c.uid).collect::<Vec<_>>(),
        uids.iter().collect::<Vec<_>>()
    );
    // Version 2: pages, each naming where the next starts.
    let mut pages = vec![];
    let mut next = serde_json::Value::Null;
    loop {
        let line = serde_json::json!({"version": 2, "id": 8, "method": "list_claims",
            "params": {"limit": 2, "continue": next}});
        let r = call(&mut s, &line.to_string()).await;
        assert_eq!((r.version, r.id), (2, 8), "{r:?}");
        let page: gpushare_proto::ClaimPage = serde_json::from_value(r.result.unwrap()).unwrap();
        pages.push(
            page.claims
                .iter()
                .map(|c| c.uid.clone())
                .collect::<Vec<_>>(),
        );
        match page.next {
            Some(n) => next = n.into(),
            None => break,
        }
    }
    assert_eq!(pages, [&uids[0..2], &uids[2..4], &uids[4..5]]);
    // Every other method means the same in version 2 and answers in it.
    let r = call(&mut s, r#"{"version":2,"id":9,"method":"version"}"#).await;
    assert_eq!(r.version, 2);
    assert_eq!(
        r.result.unwrap()["protocol"],
        gpushare_proto::PROTOCOL_VERSION
    );
    // Bad params are refused and the connection kept; an unknown version is refused.
    for (line, says) in [
        (
            r#"{"version":2,"id":10,"method":"list_claims","params":{"limit":0}}"#,
            "limit must be 1 or more",
        ),
        (
            r#"{"version":1,"id":11,"method":"list_claims","params":{"limit":2}}"#,
            "takes no params",
        ),
        (
            r#"{"version":3,"id":12,"method":"list_claims"}"#,
            "this daemon speaks 1 to 2",
        ),
    ] {
        let r = call(&mut s, line).await;
        let e = r.error.unwrap();
        assert_eq!(e.code, ErrorCode::InvalidRequest, "{line}");
        assert!(e.message.contains(says), "{line}: {}", e.message);
    }
    // The Rust client reads every page.
    let path = socket.clone();
    let all = tokio::task::spawn_blocking(move || {
        gpushare_proto::Client::connect(&path, Duration::from_secs(10))
            .unwrap()
            .list_claims()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(all, listed);
}

#[test]
fn long_messages_keep_their_start_and_their_reason() {
    use super::decode::{cut_message, MAX_MESSAGE_BYTES};
    assert_eq!(cut_message("short".into()), "short");
    let exact = "x".repeat(MAX_MESSAGE_BYTES);
    assert_eq!(cut_message(exact.clone()), exact);
    // Multi-byte characters on both cuts: the result is still UTF-8, whatever the offsets.
    for pad in 0..4 {
        let long = format!(
            "{}{}: the reason",
            "a".repeat(pad),
            "é".repeat(MAX_MESSAGE_BYTES)
        );
        let cut = cut_message(long.clone());
        assert!(cut.len() <= MAX_MESSAGE_BYTES + 64, "{}", cut.len());
        assert!(cut.starts_with(&long[..pad]));
        assert!(cut.ends_with(": the reason"), "{pad}");
        let (head, rest) = cut.split_once("… (").unwrap();
        let (n, tail) = rest.split_once(" bytes cut) …").unwrap();
        // Nothing but the counted middle is left out.
        let n: usize = n.parse().unwrap();
        assert_eq!(head.len() + n + tail.len(), long.len());
        assert!(long.starts_with(head) && long.ends_with(tail));
    }
}

#[tokio::test]
async fn an_answer_naming_a_huge_value_is_not_as_huge() {
    let (_dir, socket) = start(8, IDLE_TIMEOUT).await;
    let mut s = UnixStream::connect(&socket).await.unwrap();
    let uid = "u".repeat(1 << 20);
    let line = format!(r#"{{"version":1,"id":4,"method":"get_claim","params":{{"uid":"{uid}"}}}}"#);
    let r = call(&mut s, &line).await;
    let e = r.error.unwrap();
    assert_eq!((r.id, e.code), (4, ErrorCode::InvalidRequest));
    assert!(
        e.message.len() < 4200,
        "a message of {} bytes",
        e.message.len()
    );
    assert!(
        e.message.starts_with("params of get_claim: uid: \"uuu"),
        "{}",
        &e.message[..60]
    );
    assert!(
        e.message
            .ends_with("is not a valid claim UID: it is 1048576 bytes long (at most 128)"),
        "{}",
        &e.message[e.message.len() - 100..]
    );
    // The connection still serves.
    let r = call(&mut s, r#"{"version":1,"id":5,"method":"version"}"#).await;
    assert!(r.result.is_some());
}

/// The trial of issue 29: `mig apply` changed a node's MIG layout with no line in the log
/// saying so. Each apply and plan now gets one, as prepares do.
#[test]
fn each_mig_apply_is_logged_with_what_it_changed_and_its_outcome() {
    use super::mig_audit::log_mig_apply;
    let answer: gpushare_proto::MigApplyResult = serde_json::from_value(serde_json::json!({"config": "all-3g", "dry_run": false, "gpus": [
        {"gpu": "gpu-0", "set_mig_mode": true, "destroy": [], "create": ["gpu-0-mig-3g40gb-9-0=MIG-a", "gpu-0-mig-3g40gb-9-4=MIG-b"]},
        {"gpu": "gpu-1", "destroy": ["gpu-1-mig-1g10gb-19-0"], "create": []},
        {"gpu": "gpu-2", "destroy": [], "create": []}]}))
    .unwrap();
    let asked = |config: &str| gpushare_proto::MigApplyParams {
        layout: "…".into(),
        config: config.into(),
        dry_run: false,
    };
    let text = logged(|| {
        log_mig_apply(&asked("all-3g"), &Ok(answer), Duration::from_millis(12));
        log_mig_apply(
            &asked("busy"),
            &Err(crate::error::ServiceError::new(
                ErrorCode::Conflict,
                "gpu-3 is held by claim c",
            )),
            Duration::from_millis(1),
        );
    });
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    for field in [
        "mig_apply",
        "config=\"all-3g\"",
        "gpus=gpu-0,gpu-1",
        "mig_mode_changes=1",
        "destroyed=1",
        "created=2",
        "outcome=ok",
    ] {
        assert!(lines[0].contains(field), "{field}: {}", lines[0]);
    }
    assert!(lines[1].contains("WARN"), "{}", lines[1]);
    assert!(lines[1].contains("outcome=Conflict"), "{}", lines[1]);
    assert!(
        lines[1].contains("gpu-3 is held by claim c"),
        "{}",
        lines[1]
    );
}
