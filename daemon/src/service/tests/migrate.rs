//! Upgrading from the previous release: its version 2 `checkpoint.json` (a fixture written
//! by that release's gpushared: six claims of every strategy, three MPS control daemons, two
//! attached containers, a tombstone) is migrated at the first start, every claim and MPS
//! control daemon kept; and the attach limit holds across a crash between attaches.

use super::*;

/// The fixture with its root at `root`, and each MPS daemon's start time as the fake host
/// reports it for that pid (the real run's ticks mean nothing here).
fn fixture_checkpoint(root: &Path) -> Value {
    let text = include_str!("../../../tests/fixtures/checkpoint-v2.json")
        .replace("@ROOT@", &root.display().to_string());
    let mut v: Value = serde_json::from_str(&text).unwrap();
    for c in v["claims"].as_object_mut().unwrap().values_mut() {
        for g in c["groups"].as_array_mut().unwrap() {
            if g["sharing"]["strategy"] == "Mps" {
                let pid = g["sharing"]["control_daemon_pid"].as_i64().unwrap();
                g["sharing"]["control_daemon_start_time"] = (pid * 100).into();
            }
        }
    }
    v
}

#[test]
fn a_version_2_checkpoint_is_migrated_with_every_claim_and_mps_daemon_kept() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = ServiceConfig::for_tests(dir.path(), NODE);
    let v = fixture_checkpoint(dir.path());
    std::fs::create_dir_all(cfg.checkpoint.parent().unwrap()).unwrap();
    std::fs::write(&cfg.checkpoint, serde_json::to_vec(&v).unwrap()).unwrap();
    let old: crate::checkpoint::Checkpoint = serde_json::from_value(v).unwrap();
    // The previous release's MPS control daemons still run, as they do across an upgrade.
    let host = FakeHost::default();
    let mut daemons = Vec::new();
    for c in old.claims.values() {
        for g in &c.groups {
            if let StrategyInfo::Mps(m) = &g.sharing {
                daemons.push((c.uid.clone(), m.control_daemon_pid));
                let mut d = crate::sys::fake::FakeDaemon::new(
                    m.control_daemon_pid,
                    BTreeMap::from([("CUDA_MPS_PIPE_DIRECTORY".to_string(), m.pipe_dir.clone())]),
                );
                // Configured as the previous release configured it.
                for cmd in crate::strategy::mps::set_commands(&crate::strategy::mps::launch_of(
                    &m.clone().into(),
                )) {
                    d.execute(&cmd);
                }
                host.state().daemons.insert(PathBuf::from(&m.pipe_dir), d);
            }
        }
    }
    assert_eq!(daemons.len(), 3);
    let start = || {
        let mps = MpsControl::new("/x".into(), host.ops(), Duration::from_millis(200));
        // An upgrade in the boot the fixture was written in: no reboot between.
        Service::with_boot_id(cfg.clone(), fresh_backend(), mps, old.boot_id.clone()).unwrap()
    };
    let first = start();
    let claims = first.list_claims();
    assert_eq!(
        claims.iter().map(|c| c.uid.as_str()).collect::<Vec<_>>(),
        old.claims.keys().map(String::as_str).collect::<Vec<_>>(),
        "every claim kept"
    );
    for (uid, pid) in &daemons {
        let c = first.get_claim(uid).unwrap();
        assert!(
            c.groups.iter().any(
                |g| matches!(&g.sharing, StrategyInfo::Mps(m) if m.control_daemon_pid == *pid)
            ),
            "claim {uid} keeps MPS control daemon {pid}: {c:?}"
        );
    }
    assert!(
        host.state().killed.is_empty(),
        "no daemon was stopped: {:?}",
        host.state().killed
    );
    let containers: Vec<String> = claims
        .iter()
        .flat_map(|c| c.attached.iter().map(|a| a.container_id.clone()))
        .collect();
    assert_eq!(containers, ["ctr-mps-1", "ctr-ts-1"], "attachments kept");
    // On disk: one record per claim, the tombstone, and the old file kept aside.
    let on_disk = RecordsOnDisk::new(cfg.checkpoint.clone()).load().unwrap();
    assert_eq!(on_disk.checkpoint.claims.len(), 6);
    assert!(on_disk
        .checkpoint
        .tombstones
        .contains_key("0d0e0f10-1112-4314-9516-1718191a1b1c"));
    assert!(!cfg.checkpoint.exists());
    let kept: Vec<String> = std::fs::read_dir(cfg.checkpoint.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("checkpoint.json.migrated-"))
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    drop(first);
    // The next start reads the records; nothing is migrated again, nothing restarted.
    let second = start();
    assert_eq!(second.list_claims().len(), 6);
    for (uid, pid) in &daemons {
        let c = second.get_claim(uid).unwrap();
        assert!(c
            .groups
            .iter()
            .any(|g| matches!(&g.sharing, StrategyInfo::Mps(m) if m.control_daemon_pid == *pid)));
    }
    let attached: usize = second.list_claims().iter().map(|c| c.attached.len()).sum();
    assert_eq!(
        attached, 2,
        "containers kept from the run-directory records"
    );
}

#[test]
fn the_attach_limit_holds_across_a_crash_between_attaches() {
    let f = fixture();
    f.service
        .prepare(&claim(
            "lim",
            &["gpu-1"],
            Some(json!({"sharingMode": "time-slicing", "replicas": 2})),
        ))
        .unwrap();
    let attach = |s: &Service, id: &str, pid: i32| {
        s.attach(&AttachParams {
            claim_uid: "lim".into(),
            container_id: id.into(),
            pid: Some(pid),
            bundle: None,
            pod: None,
        })
    };
    fake_process(&f, "/proc-7001", 7001);
    fake_process(&f, "/proc-7002", 7002);
    fake_process(&f, "/proc-7003", 7003);
    attach(&f.service, "c1", 7001).unwrap();
    // gpushared is killed here (no stop: nothing more is written) and started again.
    let again = restart(&f, fresh_backend());
    attach(&again, "c2", 7002).unwrap();
    let err = attach(&again, "c3", 7003).unwrap_err();
    assert_eq!(err.code, ErrorCode::LimitReached, "{}", err.message);
    // Once more, after the second attach.
    let third = restart(&f, fresh_backend());
    let err = attach(&third, "c3", 7003).unwrap_err();
    assert_eq!(err.code, ErrorCode::LimitReached, "{}", err.message);
}

/// The inode of claim `uid`'s record: a write replaces the file (a temporary renamed over it),
/// so a record written again has a new one.
fn record_inode(f: &Fixture, uid: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(f.service.records.store.claim_path(uid))
        .unwrap()
        .ino()
}

#[test]
fn a_stop_writes_only_what_changed_and_a_start_rewrites_records_of_another_format() {
    let f = fixture();
    f.service
        .prepare(&claim(
            "t1",
            &["gpu-2"],
            Some(
                json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
           "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}),
            ),
        ))
        .unwrap();
    f.service.prepare(&claim("e1", &["gpu-3"], None)).unwrap();
    let before = [record_inode(&f, "t1"), record_inode(&f, "e1")];
    // A stop with nothing queued writes no record again: at 10,000 claims a flush each took
    // it past systemd's stop timeout.
    assert!(f.service.stop(Duration::from_secs(5)).unwrap());
    assert_eq!([record_inode(&f, "t1"), record_inode(&f, "e1")], before);

    // A record another build wrote (here a newer format, read as far as its fields are
    // known) is written again in this build's format at the next start, and only it.
    let path = f.service.records.store.claim_path("t1");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    v["format"] = json!(crate::store::RECORD_FORMAT + 1);
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
    let e1 = record_inode(&f, "e1");
    let t1 = record_inode(&f, "t1");
    let again = restart(&f, fresh_backend());
    assert!(again.get_claim("t1").is_ok());
    let v: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(v["format"], json!(crate::store::RECORD_FORMAT));
    assert_ne!(record_inode(&f, "t1"), t1);
    assert_eq!(record_inode(&f, "e1"), e1);
}
