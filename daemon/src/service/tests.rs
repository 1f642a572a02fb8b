//! Service tests on the recording fake host: no privileges needed.

use std::time::Duration;

use gpushare_proto::TimeSliceInterval;
use serde_json::json;

use super::*;
use crate::gpu::SimulatedBackend;
use crate::sys::fake::FakeHost;

const NODE: &str = "node-a";

struct Fixture {
    _dir: tempfile::TempDir,
    host: FakeHost,
    service: Service,
    cfg: ServiceConfig,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let host = FakeHost::default();
    let cfg = ServiceConfig::for_tests(dir.path(), NODE);
    let backend = Arc::new(
        SimulatedBackend::without_device_nodes("p4d.24xlarge", NODE, &dir.path().join("dev"))
            .unwrap(),
    );
    let mps = MpsControl::new(
        "/usr/bin/nvidia-cuda-mps-control".into(),
        host.ops(),
        Duration::from_millis(200),
    );
    let service = Service::new(cfg.clone(), backend, mps).unwrap();
    Fixture {
        _dir: dir,
        host,
        service,
        cfg,
    }
}

/// A fresh backend (as after a restart: simulated settings forgotten).
fn fresh_backend() -> Arc<SimulatedBackend> {
    Arc::new(SimulatedBackend::without_device_nodes("p4d.24xlarge", NODE, Path::new("/x")).unwrap())
}

/// The service again, as a restarted gpushared finds it: same config and host, new backend.
fn restart(f: &Fixture, backend: Arc<SimulatedBackend>) -> Service {
    let mps = MpsControl::new("/x".into(), f.host.ops(), Duration::from_millis(200));
    Service::new(f.cfg.clone(), backend, mps).unwrap()
}

/// A process the fake host knows at `key` (a pipe directory, or any tag for a container's
/// init process).
fn fake_process(f: &Fixture, key: &str, pid: i32) {
    f.host.state().daemons.insert(
        PathBuf::from(key),
        crate::sys::fake::FakeDaemon::new(pid, Default::default()),
    );
}

fn claim(uid: &str, devices: &[&str], params: Option<Value>) -> Value {
    let results: Vec<Value> = devices
        .iter()
        .map(|d| json!({"request": "gpus", "driver": "gpu.nvidia.com", "pool": NODE, "device": d}))
        .collect();
    let config: Vec<Value> = params
        .into_iter()
        .map(|p| json!({"source": "FromClaim", "requests": ["gpus"], "opaque": {"driver": "gpu.nvidia.com", "parameters": p}}))
        .collect();
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"uid": uid, "name": "c", "namespace": "ns"},
           "status": {"allocation": {"devices": {"results": results, "config": config}}}})
}

fn mps(atp: u32) -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
           "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": atp}}})
}

fn mps_two_gpus(atp: u32) -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
           "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": atp,
             "defaultPinnedDeviceMemoryLimit": "8Gi", "defaultPerDevicePinnedMemoryLimit": {"1": "20Gi"}}}})
}

fn gpu(f: &Fixture, name: &str) -> GpuInfo {
    f.service
        .list_gpus()
        .into_iter()
        .find(|g| g.name == name)
        .unwrap()
}

/// Nothing of `uid` remains: registry, checkpoint, CDI file, run directory, mounts, and
/// every fake MPS daemon is gone.
fn assert_clean(f: &Fixture, uid: &str) {
    assert!(f.service.get_claim(uid).is_err());
    let cp = RecordsOnDisk::new(f.cfg.checkpoint.clone())
        .load()
        .unwrap()
        .checkpoint;
    assert!(!cp.claims.contains_key(uid));
    assert!(!cdi::spec_path(&f.cfg.cdi_dir, uid).exists());
    assert!(!f.cfg.run_dir.join("claims").join(uid).exists());
    let st = f.host.state();
    assert!(st.mounts.is_empty(), "{:?}", st.mounts);
    assert!(st.daemons.values().all(|d| !d.alive));
}

#[test]
fn mps_prepare_sets_limits_by_ordinal_reads_back_and_releases() {
    let f = fixture();
    let r = f
        .service
        .prepare(&claim("u1", &["gpu-5", "gpu-4"], Some(mps_two_gpus(30))))
        .unwrap();
    assert_eq!(r.requests[0].cdi_device_ids, vec!["gpushare.io/claim=u1"]);
    // Per device, in allocation order; the claim device once, on the request's last device.
    let per: Vec<(&str, Vec<String>)> = r.requests[0]
        .per_device
        .iter()
        .map(|d| (d.device.as_str(), d.cdi_device_ids.clone()))
        .collect();
    assert_eq!(
        per,
        vec![
            ("gpu-5", vec![]),
            ("gpu-4", vec!["gpushare.io/claim=u1".to_string()])
        ]
    );
    let c = f.service.get_claim("u1").unwrap();
    let StrategyInfo::Mps(m) = &c.groups[0].sharing else {
        panic!("not MPS: {c:?}")
    };
    assert_eq!(m.active_thread_percentage, "30.0");
    assert_eq!(m.pinned_device_memory_limits["0"], "8G");
    assert_eq!(m.pinned_device_memory_limits["1"], "20G");
    let mut uuids = vec![gpu(&f, "gpu-4").uuid, gpu(&f, "gpu-5").uuid];
    uuids.sort();
    assert_eq!(m.visible_devices, uuids);
    {
        let st = f.host.state();
        let d = st.daemons.values().next().unwrap();
        assert_eq!(d.env["CUDA_VISIBLE_DEVICES"], uuids.join(","));
        let sets: Vec<&String> = st
            .calls
            .iter()
            .filter(|c| c.contains("set_default"))
            .collect();
        assert_eq!(sets.len(), 1, "one UI session carries every set: {sets:?}");
        assert!(sets[0].contains("set_default_device_pinned_mem_limit 0 8192M"));
        assert!(sets[0].contains("set_default_device_pinned_mem_limit 1 20480M"));
        assert!(!sets[0].contains("GPU-"), "never a UUID key: {}", sets[0]);
        assert_eq!(st.mounts.len(), 1);
    }
    assert_eq!(gpu(&f, "gpu-4").compute_mode, ComputeMode::ExclusiveProcess);
    assert!(cdi::spec_path(&f.cfg.cdi_dir, "u1").exists());

    let again = f
        .service
        .prepare(&claim("u1", &["gpu-5", "gpu-4"], Some(mps_two_gpus(30))))
        .unwrap();
    assert!(again.already_prepared);
    assert_eq!(
        f.host.state().daemons.len(),
        1,
        "no second daemon on a retry"
    );

    assert!(f.service.unprepare("u1").unwrap().released);
    assert!(f.host.state().calls.last().unwrap().contains("quit"));
    assert_clean(&f, "u1");
    assert_eq!(gpu(&f, "gpu-4").compute_mode, ComputeMode::Default);
    assert!(!f.service.unprepare("u1").unwrap().released);
}

#[test]
fn a_limit_the_daemon_did_not_take_fails_prepare_and_leaves_nothing() {
    let f = fixture();
    f.host.state().ignore_atp = true;
    let err = f
        .service
        .prepare(&claim("u2", &["gpu-0"], Some(mps(50))))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Internal);
    assert!(
        err.message.contains("read back \"100.0\""),
        "{}",
        err.message
    );
    assert_clean(&f, "u2");
    assert_eq!(gpu(&f, "gpu-0").compute_mode, ComputeMode::Default);
    assert_eq!(gpu(&f, "gpu-0").sharing, GpuSharing::Free);
}

#[test]
fn a_daemon_that_fails_to_start_leaves_nothing() {
    let f = fixture();
    f.host.state().fail_start = true;
    let err = f
        .service
        .prepare(&claim("u3", &["gpu-0"], Some(mps(50))))
        .unwrap_err();
    assert!(err.message.contains("failed to start"), "{}", err.message);
    assert_clean(&f, "u3");
}

#[test]
fn a_daemon_that_ignores_quit_is_killed() {
    let f = fixture();
    f.service
        .prepare(&claim("u4", &["gpu-0"], Some(mps(50))))
        .unwrap();
    let pid = f.host.state().daemons.values().next().unwrap().pid;
    f.host.state().ignore_quit = true;
    f.service.unprepare("u4").unwrap();
    assert_eq!(f.host.state().killed, vec![pid]);
    assert_clean(&f, "u4");
}

#[test]
fn an_attached_containers_pod_is_kept_across_a_restart_and_a_bad_one_is_refused() {
    let f = fixture();
    f.service
        .prepare(&claim("u-pod", &["gpu-1"], None))
        .unwrap();
    let pod = |ns: &str, name: &str| {
        Some(gpushare_proto::PodRef {
            namespace: ns.into(),
            name: name.into(),
        })
    };
    let p = |id: &str, pod| AttachParams {
        claim_uid: "u-pod".into(),
        container_id: id.into(),
        pid: None,
        bundle: None,
        pod,
    };
    let a = f
        .service
        .attach(&p("a", pod("team-a", "trainer-0")))
        .unwrap();
    assert_eq!(a.pod.as_ref().unwrap().name, "trainer-0");
    f.service.attach(&p("b", None)).unwrap();
    // A name the API server would not admit: refused, nothing attached.
    let err = f
        .service
        .attach(&p("c", pod("team-a", "../../etc")))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidRequest);
    assert!(err.message.contains("../../etc"), "{}", err.message);
    let pods = |s: &Service| -> Vec<Option<String>> {
        s.get_claim("u-pod")
            .unwrap()
            .attached
            .iter()
            .map(|a| a.pod.as_ref().map(ToString::to_string))
            .collect()
    };
    assert_eq!(pods(&f.service), [Some("team-a/trainer-0".into()), None]);
    // The pods are in the claim's host record: a restarted gpushared shows them still.
    let again = restart(&f, fresh_backend());
    assert_eq!(pods(&again), [Some("team-a/trainer-0".into()), None]);
}

#[test]
fn attach_needs_a_live_daemon_and_respects_replicas() {
    let f = fixture();
    let short = json!({"sharingMode": "mps", "mpsActiveThreadPercentage": 50, "replicas": 2});
    f.service
        .prepare(&claim("u5", &["gpu-1"], Some(short)))
        .unwrap();
    let p = |id: &str| AttachParams {
        claim_uid: "u5".into(),
        container_id: id.into(),
        pid: None,
        bundle: None,
        pod: None,
    };
    f.service.attach(&p("a")).unwrap();
    f.service.attach(&p("a")).unwrap(); // idempotent
    f.service.attach(&p("b")).unwrap();
    let err = f.service.attach(&p("c")).unwrap_err();
    assert_eq!(err.code, ErrorCode::LimitReached);
    assert!(
        err.message.contains("u5") && err.message.contains("2 of 2"),
        "{}",
        err.message
    );
    assert!(
        f.service
            .detach(&DetachParams {
                claim_uid: "u5".into(),
                container_id: "a".into()
            })
            .unwrap()
            .detached
    );
    f.service.attach(&p("c")).unwrap();
    // The MPS control daemon dies: the next container start is refused...
    for d in f.host.state().daemons.values_mut() {
        d.die();
    }
    let err = f.service.attach(&p("d")).unwrap_err();
    assert_eq!(err.code, ErrorCode::NotReady);
    // ...until a prepare retry starts a new one with the claim's limits.
    let short = json!({"sharingMode": "mps", "mpsActiveThreadPercentage": 50, "replicas": 2});
    let r = f
        .service
        .prepare(&claim("u5", &["gpu-1"], Some(short)))
        .unwrap();
    assert!(!r.already_prepared);
    assert_eq!(
        f.host.state().daemons.values().filter(|d| d.alive).count(),
        1
    );
    // The daemon was started again in place: the containers attached before keep their slots.
    assert_eq!(
        f.service.attach(&p("d")).unwrap_err().code,
        ErrorCode::LimitReached
    );
    f.service
        .detach(&DetachParams {
            claim_uid: "u5".into(),
            container_id: "b".into(),
        })
        .unwrap();
    f.service.attach(&p("d")).unwrap();
    let err = f
        .service
        .attach(&AttachParams {
            claim_uid: "nope".into(),
            ..p("e")
        })
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::NotFound);
}

#[test]
fn containers_whose_process_is_gone_free_their_slot() {
    let f = fixture();
    let ts = json!({"sharingMode": "time-slicing", "replicas": 2});
    f.service
        .prepare(&claim("s1", &["gpu-6"], Some(ts)))
        .unwrap();
    let p = |id: &str, pid: Option<i32>| AttachParams {
        claim_uid: "s1".into(),
        container_id: id.into(),
        pid,
        bundle: None,
        pod: None,
    };
    // The fake host knows no process 4242: that container died without its poststop hook.
    f.service.attach(&p("dead", Some(4242))).unwrap();
    f.service.attach(&p("unknown-pid", None)).unwrap();
    f.service.attach(&p("new", None)).unwrap();
    let ids: Vec<String> = f
        .service
        .get_claim("s1")
        .unwrap()
        .attached
        .into_iter()
        .map(|a| a.container_id)
        .collect();
    assert_eq!(ids, vec!["unknown-pid", "new"]);
    let err = f.service.attach(&p("third", None)).unwrap_err();
    assert_eq!(err.code, ErrorCode::LimitReached);
}

#[test]
fn a_release_that_fails_part_way_keeps_the_gpu_until_finished() {
    let f = fixture();
    f.service
        .prepare(&claim("p1", &["gpu-0"], Some(mps(50))))
        .unwrap();
    f.host.state().fail_unmount = true;
    let err = f.service.unprepare("p1").unwrap_err();
    assert_eq!(err.code, ErrorCode::Internal);
    assert_eq!(
        f.service.get_claim("p1").unwrap().state,
        ClaimState::Unpreparing
    );
    let err = f
        .service
        .prepare(&claim("p2", &["gpu-0"], None))
        .unwrap_err();
    assert_eq!(
        err.code,
        ErrorCode::Conflict,
        "the GPU stays held: {}",
        err.message
    );
    // A prepare retry of the same claim finishes the release and prepares afresh.
    let err = f
        .service
        .prepare(&claim("p1", &["gpu-0"], Some(mps(50))))
        .unwrap_err();
    assert!(
        err.message.contains("cannot be released yet"),
        "{}",
        err.message
    );
    f.host.state().fail_unmount = false;
    let r = f
        .service
        .prepare(&claim("p1", &["gpu-0"], Some(mps(50))))
        .unwrap();
    assert!(!r.already_prepared);
    assert_eq!(
        f.service.get_claim("p1").unwrap().state,
        ClaimState::Prepared
    );
    assert_eq!(
        f.host.state().daemons.values().filter(|d| d.alive).count(),
        1
    );
    f.service.unprepare("p1").unwrap();
    assert_clean(&f, "p1");
}

#[test]
fn a_claim_left_prepare_started_by_a_crash_is_prepared_afresh() {
    let f = fixture();
    f.service
        .prepare(&claim("c1", &["gpu-1"], Some(mps(50))))
        .unwrap();
    // As a crash between start and finish leaves it on disk.
    let file = RecordsOnDisk::new(f.cfg.checkpoint.clone());
    let mut cp = file.load().unwrap().checkpoint;
    cp.claims.get_mut("c1").unwrap().state = ClaimState::PrepareStarted;
    file.save(&cp).unwrap();
    let again = restart(&f, fresh_backend());
    let r = again
        .prepare(&claim("c1", &["gpu-1"], Some(mps(50))))
        .unwrap();
    assert!(!r.already_prepared);
    assert_eq!(again.get_claim("c1").unwrap().state, ClaimState::Prepared);
    let st = f.host.state();
    assert_eq!(
        st.daemons.values().filter(|d| d.alive).count(),
        1,
        "the old daemon was stopped"
    );
    assert_eq!(st.mounts.len(), 1);
}

#[test]
fn one_claim_is_prepared_once_and_a_slow_claim_holds_up_nobody_else() {
    let f = Arc::new(fixture());
    f.host.state().delay = Some(Duration::from_millis(150));
    let (tx, rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    for i in 0..3 {
        let (f, tx) = (Arc::clone(&f), tx.clone());
        threads.push(std::thread::spawn(move || {
            let r = f
                .service
                .prepare(&claim("slow", &["gpu-0"], Some(mps(50))))
                .unwrap();
            tx.send(format!("slow{i}:{}", r.already_prepared)).unwrap();
        }));
    }
    std::thread::sleep(Duration::from_millis(50));
    let (f2, tx2) = (Arc::clone(&f), tx.clone());
    threads.push(std::thread::spawn(move || {
        f2.service
            .prepare(&claim("fast", &["gpu-1"], None))
            .unwrap();
        tx2.send("fast".to_string()).unwrap();
    }));
    drop(tx);
    for t in threads {
        t.join().unwrap();
    }
    let order: Vec<String> = rx.iter().collect();
    assert_eq!(
        order[0], "fast",
        "the exclusive claim did not wait for the MPS one: {order:?}"
    );
    let fresh = order.iter().filter(|o| o.ends_with(":false")).count();
    assert_eq!(
        fresh, 1,
        "one prepare did the work, the others found it done: {order:?}"
    );
    assert_eq!(f.host.state().daemons.len(), 1);
    assert!(
        f.service.changes.locks.lock().unwrap().is_empty(),
        "no lock entry outlives its use"
    );
}

#[test]
fn a_leftover_daemon_on_the_claims_pipe_directory_is_replaced() {
    let f = fixture();
    // A daemon holds the pipe directory the claim's group will use, unknown to the service
    // (a checkpoint and host record both lost; a crash in the middle of a start).
    let dirs = MpsDirs::for_group(&f.cfg.run_dir.join("claims/o1"), &[gpu(&f, "gpu-2").uuid]);
    let old = 777_777;
    fake_process(&f, dirs.pipe.to_str().unwrap(), old);
    f.service
        .prepare(&claim("o1", &["gpu-2"], Some(mps(50))))
        .unwrap();
    let st = f.host.state();
    let alive: Vec<i32> = st
        .daemons
        .values()
        .filter(|d| d.alive)
        .map(|d| d.pid)
        .collect();
    assert_eq!(alive.len(), 1);
    assert_ne!(
        alive[0], old,
        "the leftover was stopped and a new daemon started"
    );
    assert!(st.calls.iter().any(|c| c.contains("quit")));
}

#[test]
fn one_mps_claim_per_gpu() {
    let f = fixture();
    f.service
        .prepare(&claim("m1", &["gpu-7"], Some(mps(50))))
        .unwrap();
    let err = f
        .service
        .prepare(&claim("m2", &["gpu-7"], Some(mps(50))))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Conflict);
    assert!(
        err.message.contains("gpu-7") && err.message.contains("m1"),
        "{}",
        err.message
    );
    assert_eq!(
        f.host.state().daemons.len(),
        1,
        "no second daemon was started"
    );
}

#[test]
fn time_slicing_applies_only_where_asked_and_restores_default() {
    let f = fixture();
    let ts = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}});
    f.service
        .prepare(&claim("t1", &["gpu-2"], Some(ts.clone())))
        .unwrap();
    f.service
        .prepare(&claim("t2", &["gpu-2"], Some(ts)))
        .unwrap();
    assert_eq!(gpu(&f, "gpu-2").time_slice, TimeSliceInterval::Long);
    assert!(f
        .service
        .list_gpus()
        .iter()
        .filter(|g| g.name != "gpu-2")
        .all(|g| g.time_slice == TimeSliceInterval::Default));
    f.service.unprepare("t1").unwrap();
    assert_eq!(
        gpu(&f, "gpu-2").time_slice,
        TimeSliceInterval::Long,
        "t2 still holds it"
    );
    f.service.unprepare("t2").unwrap();
    assert_eq!(gpu(&f, "gpu-2").time_slice, TimeSliceInterval::Default);
    // Exclusive after release is allowed again; MPS on an exclusive GPU is a conflict.
    f.service.prepare(&claim("e1", &["gpu-2"], None)).unwrap();
    let err = f
        .service
        .prepare(&claim("m1", &["gpu-2"], Some(mps(10))))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Conflict);
    assert_clean(&f, "m1");
}

#[test]
fn refusals_change_nothing() {
    let f = fixture();
    let cases = [
        (claim("x1", &["gpu-99"], None), ErrorCode::UnknownDevice),
        (
            claim(
                "x2",
                &["gpu-2-mig-3g20gb-9-4"],
                Some(json!({"sharingMode": "mig", "migProfile": "3g.20gb"})),
            ),
            ErrorCode::Unsupported,
        ),
        (
            claim("x3", &["gpu-0", "gpu-0"], None),
            ErrorCode::InvalidRequest,
        ),
        (
            claim(&"l".repeat(120), &["gpu-0"], Some(mps(50))),
            ErrorCode::InvalidRequest,
        ),
        (
            claim(
                "x4",
                &["gpu-0"],
                Some(
                    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"3": "1Gi"}}}}),
                ),
            ),
            ErrorCode::InvalidConfig,
        ),
    ];
    for (c, code) in cases {
        let uid = c["metadata"]["uid"].as_str().unwrap().to_string();
        let err = f.service.prepare(&c).unwrap_err();
        assert_eq!(err.code, code, "{uid}: {}", err.message);
        assert_clean(&f, &uid);
    }
    assert!(f.host.state().calls.is_empty(), "no program was run");
    assert!(f
        .service
        .list_gpus()
        .iter()
        .all(|g| g.sharing == GpuSharing::Free));
}

#[test]
fn a_restarted_service_finds_its_claims() {
    let f = fixture();
    f.service
        .prepare(&claim("r1", &["gpu-3"], Some(mps(40))))
        .unwrap();
    let backend = fresh_backend();
    assert_eq!(
        backend
            .compute_mode(&backend.find("gpu-3").unwrap().uuid)
            .unwrap(),
        ComputeMode::Default
    );
    let again = restart(&f, backend.clone());
    assert_eq!(again.get_claim("r1").unwrap().state, ClaimState::Prepared);
    assert_eq!(
        backend
            .compute_mode(&backend.find("gpu-3").unwrap().uuid)
            .unwrap(),
        ComputeMode::ExclusiveProcess,
        "settings of held GPUs are re-applied from the checkpoint"
    );
    let err = again.prepare(&claim("r2", &["gpu-3"], None)).unwrap_err();
    assert_eq!(
        err.code,
        ErrorCode::Conflict,
        "placement rebuilt from the checkpoint"
    );
}

#[test]
fn a_reused_pid_is_never_signalled() {
    let f = fixture();
    f.service
        .prepare(&claim("z1", &["gpu-4"], Some(mps(50))))
        .unwrap();
    let pid = {
        let mut st = f.host.state();
        let d = st.daemons.values_mut().next().unwrap();
        d.die();
        d.pid
    };
    // An unrelated process now has the dead daemon's pid (it holds no pipe directory of ours).
    fake_process(&f, "/elsewhere", pid);
    f.host.state().ignore_quit = true;
    f.service.unprepare("z1").unwrap();
    let st = f.host.state();
    assert!(st.killed.is_empty(), "killed {:?}", st.killed);
    assert!(st.daemons[Path::new("/elsewhere")].alive);
    assert!(
        !st.calls.last().unwrap().contains("quit"),
        "no quit sent to a dead daemon's pipe"
    );
}

#[test]
fn an_unreadable_proc_is_not_taken_for_a_dead_daemon() {
    let f = fixture();
    f.service
        .prepare(&claim("q1", &["gpu-5"], Some(mps(50))))
        .unwrap();
    let daemons_before = f.host.state().daemons.len();
    f.host.state().fail_proc = true;
    let r = f
        .service
        .prepare(&claim("q1", &["gpu-5"], Some(mps(50))))
        .unwrap();
    assert!(r.already_prepared, "a healthy claim is not torn down");
    f.service
        .attach(&AttachParams {
            claim_uid: "q1".into(),
            container_id: "c".into(),
            pid: None,
            bundle: None,
            pod: None,
        })
        .unwrap();
    // Releasing needs to know the daemon: it waits for /proc rather than guessing.
    let err = f.service.unprepare("q1").unwrap_err();
    assert_eq!(err.code, ErrorCode::Internal);
    assert!(
        err.message.contains("holder of control_lock"),
        "{}",
        err.message
    );
    assert_eq!(gpu(&f, "gpu-5").sharing, GpuSharing::Mps);
    f.host.state().fail_proc = false;
    f.service.unprepare("q1").unwrap();
    assert_clean(&f, "q1");
    assert_eq!(f.host.state().daemons.len(), daemons_before);
}

/// A live process the fake host knows, standing for a container's init.
fn live_process(f: &Fixture, pid: i32) {
    fake_process(f, &format!("/proc-{pid}"), pid);
}

#[test]
fn running_containers_keep_their_slots_when_a_claim_is_prepared_afresh() {
    let f = fixture();
    let one = json!({"sharingMode": "mps", "mpsActiveThreadPercentage": 50, "replicas": 1});
    f.service
        .prepare(&claim("k1", &["gpu-3"], Some(one.clone())))
        .unwrap();
    live_process(&f, 4242);
    let p = |id: &str, pid: i32| AttachParams {
        claim_uid: "k1".into(),
        container_id: id.into(),
        pid: Some(pid),
        bundle: None,
        pod: None,
    };
    f.service.attach(&p("c1", 4242)).unwrap();
    // The MPS daemon dies; the kubelet's retry brings a new one.
    let mut pipe = None;
    for (path, d) in f.host.state().daemons.iter_mut() {
        if path.ends_with("pipe") {
            d.die();
            pipe = Some(path.clone());
        }
    }
    assert!(pipe.is_some());
    assert!(
        !f.service
            .prepare(&claim("k1", &["gpu-3"], Some(one)))
            .unwrap()
            .already_prepared
    );
    let c = f.service.get_claim("k1").unwrap();
    assert_eq!(c.attached.len(), 1);
    assert_eq!(c.attached[0].container_id, "c1");
    live_process(&f, 4343);
    let err = f.service.attach(&p("c2", 4343)).unwrap_err();
    assert_eq!(
        err.code,
        ErrorCode::LimitReached,
        "replicas still hold: {}",
        err.message
    );
}

#[test]
fn a_container_attached_again_follows_its_new_process() {
    let f = fixture();
    let two = json!({"sharingMode": "time-slicing", "replicas": 1});
    f.service
        .prepare(&claim("r1", &["gpu-2"], Some(two)))
        .unwrap();
    live_process(&f, 5001);
    live_process(&f, 5002);
    let p = |pid: i32| AttachParams {
        claim_uid: "r1".into(),
        container_id: "same".into(),
        pid: Some(pid),
        bundle: None,
        pod: None,
    };
    f.service.attach(&p(5001)).unwrap();
    assert_eq!(f.service.attach(&p(5002)).unwrap().pid, Some(5002));
    // The first process ends: the slot is still held by the live one.
    f.host
        .state()
        .daemons
        .get_mut(Path::new("/proc-5001"))
        .unwrap()
        .die();
    live_process(&f, 5003);
    let err = f
        .service
        .attach(&AttachParams {
            container_id: "other".into(),
            ..p(5003)
        })
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::LimitReached);
    let err = f.service.attach(&p(-5)).unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidRequest);
}

#[test]
fn a_missing_cdi_spec_is_written_again_on_retry() {
    let f = fixture();
    f.service.prepare(&claim("w1", &["gpu-6"], None)).unwrap();
    let path = cdi::spec_path(&f.cfg.cdi_dir, "w1");
    let written = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(
        f.service
            .prepare(&claim("w1", &["gpu-6"], None))
            .unwrap()
            .already_prepared
    );
    assert_eq!(std::fs::read(&path).unwrap(), written);
}

#[test]
fn readers_answer_while_the_registry_is_locked() {
    let f = Arc::new(fixture());
    f.service.prepare(&claim("r1", &["gpu-3"], None)).unwrap();
    // Hold the registry as a slow change would; every reader must still answer, from the
    // published view, and see the claim prepared before the lock was taken.
    let held = f.service.records.state.lock().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = {
        let f = Arc::clone(&f);
        std::thread::spawn(move || {
            let claim = f.service.get_claim("r1").map(|c| c.state);
            let listed = f.service.list_claims().len();
            let gpu3 = f
                .service
                .list_gpus()
                .into_iter()
                .find(|g| g.name == "gpu-3")
                .map(|g| (g.sharing, g.claims));
            let ready = f.service.health().ready;
            tx.send((claim, listed, gpu3, ready)).unwrap();
        })
    };
    // A generous bound that only turns a reader stuck on the lock into a failure.
    let seen = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("a reader waited for the registry lock");
    drop(held);
    reader.join().unwrap();
    assert_eq!(
        seen,
        (
            Ok(ClaimState::Prepared),
            1,
            Some((GpuSharing::Exclusive, vec!["r1".to_string()])),
            true
        )
    );
}

#[test]
fn concurrent_changes_all_reach_the_checkpoint() {
    let f = Arc::new(fixture());
    let ts = json!({"sharingMode": "time-slicing", "replicas": 8});
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let (f, ts) = (Arc::clone(&f), ts.clone());
            std::thread::spawn(move || {
                let uid = format!("cc{i}");
                f.service
                    .prepare(&claim(&uid, &[&format!("gpu-{i}")], Some(ts)))
                    .unwrap();
                for c in 0..6 {
                    f.service
                        .attach(&AttachParams {
                            claim_uid: uid.clone(),
                            container_id: format!("{uid}-c{c}"),
                            pid: None,
                            bundle: None,
                            pod: None,
                        })
                        .unwrap();
                }
                f.service
                    .detach(&DetachParams {
                        claim_uid: uid.clone(),
                        container_id: format!("{uid}-c0"),
                    })
                    .unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    // And changes alone, one after another: each its own write.
    for c in ["cc7-c1", "cc7-c2"] {
        f.service
            .detach(&DetachParams {
                claim_uid: "cc7".into(),
                container_id: c.into(),
            })
            .unwrap();
    }
    // Changes committed together share a write; none may be missing from the last one.
    let on_disk = RecordsOnDisk::new(f.cfg.checkpoint.clone())
        .load()
        .unwrap()
        .checkpoint
        .claims;
    let in_memory: BTreeMap<String, ClaimInfo> = f
        .service
        .list_claims()
        .into_iter()
        .map(|c| (c.uid.clone(), c))
        .collect();
    assert_eq!(on_disk, in_memory);
    assert_eq!(in_memory.len(), 8);
    let attached: Vec<usize> = in_memory.values().map(|c| c.attached.len()).collect();
    assert_eq!(attached, [5, 5, 5, 5, 5, 5, 5, 3]);
}

mod claim_dirs;
mod driver;
mod migrate;
mod missing_gpu;
mod mps_capability;
mod nodes;
mod persisted;
mod recover;

mod same_claim {
    //! A claim's allocation does not change under it: a prepare of a prepared UID that asks
    //! for other devices or another configuration is a `Conflict` naming both.

    use super::*;

    fn short(params: Value) -> Option<Value> {
        Some(params)
    }

    fn starts(f: &Fixture) -> usize {
        f.host
            .state()
            .calls
            .iter()
            .filter(|c| c.contains(" -d"))
            .count()
    }

    /// Prepares `first`, then asks `second` of the same UID: the answer is a `Conflict` that
    /// names both, and the claim is exactly as it was.
    fn assert_conflict(first: Value, second: Value, needles: &[&str]) {
        let f = fixture();
        f.service.prepare(&first).unwrap();
        let before = f.service.get_claim("same").unwrap();
        let started = starts(&f);
        let err = f.service.prepare(&second).unwrap_err();
        assert_eq!(err.code, ErrorCode::Conflict, "{}", err.message);
        for n in needles {
            assert!(err.message.contains(n), "{n:?} not in: {}", err.message);
        }
        assert!(
            err.message.contains("prepared with") && err.message.contains("this prepare asks"),
            "{}",
            err.message
        );
        assert_eq!(f.service.get_claim("same").unwrap(), before, "unchanged");
        assert_eq!(starts(&f), started, "nothing started");
        // The first allocation is still what a retry of it gets.
        let again = f.service.prepare(&first).unwrap();
        assert!(again.already_prepared);
        assert_eq!(again.requests, before.requests);
    }

    #[test]
    fn other_devices_are_a_conflict_naming_both() {
        assert_conflict(
            claim("same", &["gpu-1"], Some(mps(50))),
            claim("same", &["gpu-2"], Some(mps(50))),
            &["gpu-1", "gpu-2"],
        );
        assert_conflict(
            claim("same", &["gpu-1"], None),
            claim("same", &["gpu-1", "gpu-2"], None),
            &["gpu-1", "gpu-2"],
        );
    }

    #[test]
    fn another_configuration_is_a_conflict_naming_both() {
        assert_conflict(
            claim("same", &["gpu-1"], Some(mps(50))),
            claim("same", &["gpu-1"], Some(mps(30))),
            &["active thread percentage 50", "active thread percentage 30"],
        );
        assert_conflict(
            claim("same", &["gpu-4", "gpu-5"], Some(mps_two_gpus(30))),
            claim(
                "same",
                &["gpu-4", "gpu-5"],
                Some(
                    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                    "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 30,
                    "defaultPinnedDeviceMemoryLimit": "8Gi"}}}),
                ),
            ),
            &["20480 MiB", "8192 MiB"],
        );
        assert_conflict(
            claim("same", &["gpu-1"], Some(mps(50))),
            claim(
                "same",
                &["gpu-1"],
                Some(
                    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                    "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}),
                ),
            ),
            &["MPS", "time-slicing Long"],
        );
        assert_conflict(
            claim("same", &["gpu-1"], None),
            claim(
                "same",
                &["gpu-1"],
                short(json!({"sharingMode": "time-slicing", "timeSlice": "short", "replicas": 2})),
            ),
            &["exclusive", "time-slicing Short", "replicas 2"],
        );
        assert_conflict(
            claim(
                "same",
                &["gpu-1"],
                short(json!({"sharingMode": "time-slicing", "timeSlice": "short", "replicas": 2})),
            ),
            claim(
                "same",
                &["gpu-1"],
                short(json!({"sharingMode": "time-slicing", "timeSlice": "short", "replicas": 3})),
            ),
            &["replicas 2", "replicas 3"],
        );
    }

    #[test]
    fn an_identical_retry_is_already_prepared_even_with_a_newer_object_version() {
        let f = fixture();
        let mut first = claim("same", &["gpu-4", "gpu-5"], Some(mps_two_gpus(30)));
        first["metadata"]["resourceVersion"] = json!("10");
        f.service.prepare(&first).unwrap();
        let mut retry = first.clone();
        retry["metadata"]["resourceVersion"] = json!("11");
        let r = f.service.prepare(&retry).unwrap();
        assert!(r.already_prepared);
    }

    #[test]
    fn a_degraded_claim_asked_for_another_allocation_is_a_conflict_and_not_restarted() {
        let f = fixture();
        f.service
            .prepare(&claim("same", &["gpu-1"], Some(mps(50))))
            .unwrap();
        for d in f.host.state().daemons.values_mut() {
            d.die();
        }
        let started = starts(&f);
        let err = f
            .service
            .prepare(&claim("same", &["gpu-2"], Some(mps(50))))
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Conflict, "{}", err.message);
        assert_eq!(starts(&f), started, "its daemon is not restarted for it");
    }
}
