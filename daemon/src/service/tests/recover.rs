//! Crash safety on the fake host: tombstones, supervision restarts, the start-up reconcile,
//! reboots, a corrupt or unwritable checkpoint, the graceful stop.

use super::*;

fn with_rv(mut c: Value, rv: &str) -> Value {
    c["metadata"]["resourceVersion"] = json!(rv);
    c
}

fn mps_of(c: &ClaimInfo) -> MpsInfo {
    c.groups
        .iter()
        .find_map(|g| match &g.sharing {
            StrategyInfo::Mps(m) => Some(m.clone()),
            _ => None,
        })
        .expect("an MPS group")
}

fn kill_daemon(f: &Fixture, pid: i32) {
    for d in f.host.state().daemons.values_mut() {
        if d.pid == pid {
            d.die();
        }
    }
}

fn starts(f: &Fixture) -> usize {
    f.host
        .state()
        .calls
        .iter()
        .filter(|c| c.contains(" -d"))
        .count()
}

fn restart_with_boot(f: &Fixture, boot: &str) -> Service {
    let mps = MpsControl::new("/x".into(), f.host.ops(), Duration::from_millis(200));
    Service::with_boot_id(f.cfg.clone(), fresh_backend(), mps, boot.into()).unwrap()
}

fn attach(uid: &str, container: &str) -> AttachParams {
    AttachParams {
        claim_uid: uid.into(),
        container_id: container.into(),
        pid: None,
        bundle: None,
        pod: None,
    }
}

#[test]
fn a_late_prepare_retry_of_a_released_claim_does_not_resurrect_it() {
    let f = fixture();
    let object = with_rv(claim("late", &["gpu-2"], Some(mps(50))), "1001");
    f.service.prepare(&object).unwrap();
    f.service.unprepare("late").unwrap();
    let err = f.service.prepare(&object).unwrap_err();
    assert_eq!(err.code, ErrorCode::Stale, "{}", err.message);
    assert!(err.message.contains("1001"), "{}", err.message);
    assert_clean(&f, "late");
    assert_eq!(gpu(&f, "gpu-2").compute_mode, ComputeMode::Default);
    // Also after a restart: the tombstone is in the checkpoint.
    let again = restart(&f, fresh_backend());
    assert_eq!(again.prepare(&object).unwrap_err().code, ErrorCode::Stale);
    // The claim allocated again (a new object version) is prepared normally.
    let r = again
        .prepare(&with_rv(claim("late", &["gpu-2"], Some(mps(50))), "1007"))
        .unwrap();
    assert!(!r.already_prepared);
    assert_eq!(again.get_claim("late").unwrap().state, ClaimState::Prepared);
    let cp = RecordsOnDisk::new(f.cfg.checkpoint.clone())
        .load()
        .unwrap()
        .checkpoint;
    assert!(
        !cp.tombstones.contains_key("late"),
        "a new prepare lifts it"
    );
}

#[test]
fn a_prepare_that_arrived_before_the_release_is_stale_even_without_a_resource_version() {
    let f = fixture();
    f.service.prepare(&claim("gen", &["gpu-3"], None)).unwrap();
    // What a prepare that arrived now and then waited for the claim's lock would have seen.
    let arrived = f.service.state().claim_generation;
    f.service.unprepare("gen").unwrap();
    let err = f
        .service
        .refuse_stale_prepare("gen", arrived, None)
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Stale);
    // One that arrives after the release is a new prepare.
    let now = f.service.state().claim_generation;
    f.service.refuse_stale_prepare("gen", now, None).unwrap();
    f.service.prepare(&claim("gen", &["gpu-3"], None)).unwrap();
}

#[test]
fn a_failed_prepare_leaves_no_tombstone_so_the_retry_works() {
    let f = fixture();
    f.host.state().fail_start = true;
    let object = with_rv(claim("retry", &["gpu-1"], Some(mps(50))), "7");
    f.service.prepare(&object).unwrap_err();
    f.host.state().fail_start = false;
    f.service.prepare(&object).unwrap();
}

#[test]
fn a_dead_daemon_degrades_the_claim_until_it_is_restarted_with_verified_limits() {
    let f = fixture();
    f.service
        .prepare(&claim("sv", &["gpu-0"], Some(mps(40))))
        .unwrap();
    let before = mps_of(&f.service.get_claim("sv").unwrap());
    // A daemon still running is not taken for dead.
    f.service.mps_daemon_exited("sv", before.control_daemon_pid);
    assert_eq!(
        f.service.get_claim("sv").unwrap().state,
        ClaimState::Prepared
    );

    kill_daemon(&f, before.control_daemon_pid);
    f.service.mps_daemon_exited("sv", before.control_daemon_pid);
    let c = f.service.get_claim("sv").unwrap();
    assert_eq!(c.state, ClaimState::Degraded);
    let why = c.last_error.clone().unwrap();
    assert!(
        why.contains(&before.control_daemon_pid.to_string()) && why.contains("exited"),
        "{why}"
    );
    assert_eq!(f.service.health().degraded_claims, 1);
    // Told again (the supervisor finds the dead pid once more): the restart is not put off.
    let due = f.service.next_restart().unwrap();
    f.service.mps_daemon_exited("sv", before.control_daemon_pid);
    assert_eq!(f.service.next_restart(), Some(due));
    let err = f.service.attach(&attach("sv", "ctr-1")).unwrap_err();
    assert_eq!(err.code, ErrorCode::NotReady);
    assert!(
        err.message.contains("Degraded") && err.message.contains("exited"),
        "{}",
        err.message
    );
    // Degraded is in the checkpoint too.
    let cp = RecordsOnDisk::new(f.cfg.checkpoint.clone()).load().unwrap();
    assert_eq!(cp.checkpoint.claims["sv"].state, ClaimState::Degraded);

    let due = f.service.next_restart().unwrap();
    std::thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
    f.service.run_due_restarts();
    let c = f.service.get_claim("sv").unwrap();
    assert_eq!(c.state, ClaimState::Prepared);
    assert_eq!(c.restarts, 1);
    let after = mps_of(&c);
    assert_ne!(after.control_daemon_pid, before.control_daemon_pid);
    assert_eq!(after.restarts, 1);
    assert_eq!(after.active_thread_percentage, "40.0");
    assert_eq!(after.pipe_dir, before.pipe_dir);
    assert!(c.last_error.is_some(), "kept as history");
    assert!(f.service.next_restart().is_none());
    f.service.attach(&attach("sv", "ctr-1")).unwrap();
    // The restarted daemon was told its limits again and read back.
    let st = f.host.state();
    let sets = st
        .calls
        .iter()
        .filter(|c| c.contains("set_default_active_thread_percentage 40"))
        .count();
    assert_eq!(sets, 2);
}

#[test]
fn failing_restarts_back_off_and_keep_the_claim_degraded_with_the_error() {
    let f = fixture();
    f.service
        .prepare(&claim("bo", &["gpu-0"], Some(mps(40))))
        .unwrap();
    let pid = mps_of(&f.service.get_claim("bo").unwrap()).control_daemon_pid;
    kill_daemon(&f, pid);
    f.host.state().fail_start = true;
    f.service.mps_daemon_exited("bo", pid);
    let first = f.service.next_restart().unwrap();
    std::thread::sleep(first.saturating_duration_since(std::time::Instant::now()));
    f.service.run_due_restarts();
    let c = f.service.get_claim("bo").unwrap();
    assert_eq!(c.state, ClaimState::Degraded);
    assert!(
        c.last_error
            .as_deref()
            .unwrap()
            .contains("restarting the MPS control daemon"),
        "{:?}",
        c.last_error
    );
    let second = f.service.next_restart().unwrap();
    assert!(second >= first + restart_backoff(1), "backoff grows");
    // Containers have the pipe directory and the shm tmpfs bind-mounted: a failed restart
    // keeps them, so the next daemon is reachable through the very same directory.
    let m = mps_of(&c);
    assert!(Path::new(&m.pipe_dir).is_dir());
    assert!(f.host.state().mounts.contains(Path::new(&m.shm_dir)));
    assert_eq!(c.restarts, 0);
    // Unprepare still releases everything, and the supervisor forgets the claim.
    f.service.unprepare("bo").unwrap();
    assert!(f.service.next_restart().is_none());
    assert_clean(&f, "bo");
}

#[test]
fn a_restart_readopts_running_daemons_and_restarts_dead_ones() {
    let f = fixture();
    f.service
        .prepare(&claim("keep", &["gpu-0"], Some(mps(30))))
        .unwrap();
    f.service
        .prepare(&claim("dead", &["gpu-1"], Some(mps(60))))
        .unwrap();
    let keep = mps_of(&f.service.get_claim("keep").unwrap());
    let dead = mps_of(&f.service.get_claim("dead").unwrap());
    kill_daemon(&f, dead.control_daemon_pid);
    let before = starts(&f);
    let again = restart(&f, fresh_backend());
    assert_eq!(starts(&f), before + 1, "only the dead one is started");
    let k = again.get_claim("keep").unwrap();
    assert_eq!(mps_of(&k).control_daemon_pid, keep.control_daemon_pid);
    assert_eq!(k.restarts, 0);
    let d = again.get_claim("dead").unwrap();
    assert_eq!(d.state, ClaimState::Prepared);
    assert_eq!(d.restarts, 1);
    assert_ne!(mps_of(&d).control_daemon_pid, dead.control_daemon_pid);
    assert_eq!(mps_of(&d).active_thread_percentage, "60.0");
    let why = d.last_error.unwrap();
    assert!(
        why.contains(&dead.control_daemon_pid.to_string())
            && why.contains("not running when gpushared started"),
        "{why}"
    );
    assert!(k.last_error.is_none());
    assert_eq!(
        again.list_gpus()[1].compute_mode,
        ComputeMode::ExclusiveProcess,
        "re-applied on the fresh backend"
    );
    assert!(again.health().ready);
}

#[test]
fn a_recycled_pid_is_not_taken_for_the_daemon() {
    let f = fixture();
    f.service
        .prepare(&claim("pidre", &["gpu-0"], Some(mps(30))))
        .unwrap();
    // The recorded start time no longer matches the holder (another process, same pid).
    let file = RecordsOnDisk::new(f.cfg.checkpoint.clone());
    let mut cp = file.load().unwrap().checkpoint;
    for g in &mut cp.claims.get_mut("pidre").unwrap().groups {
        if let StrategyInfo::Mps(m) = &mut g.sharing {
            m.control_daemon_start_time += 1;
        }
    }
    file.save(&cp).unwrap();
    let old = mps_of(&f.service.get_claim("pidre").unwrap()).control_daemon_pid;
    let again = restart(&f, fresh_backend());
    assert_ne!(
        mps_of(&again.get_claim("pidre").unwrap()).control_daemon_pid,
        old
    );
}

#[test]
fn start_rolls_back_half_done_claims_and_removes_orphans_of_ours_only() {
    let f = fixture();
    f.service
        .prepare(&claim("half", &["gpu-2"], Some(mps(50))))
        .unwrap();
    let file = RecordsOnDisk::new(f.cfg.checkpoint.clone());
    let mut cp = file.load().unwrap().checkpoint;
    cp.claims.get_mut("half").unwrap().state = ClaimState::PrepareStarted;
    file.save(&cp).unwrap();
    // An orphan claim directory with a running daemon and a mount, an orphan CDI spec and a
    // temporary of ours, and another vendor's spec.
    let orphan = f.cfg.run_dir.join("claims/orphan/mps-abcde");
    for d in ["pipe", "log", "shm"] {
        std::fs::create_dir_all(orphan.join(d)).unwrap();
    }
    fake_process(&f, orphan.join("pipe").to_str().unwrap(), 777_001);
    f.host.state().mounts.insert(orphan.join("shm"));
    std::fs::create_dir_all(&f.cfg.cdi_dir).unwrap();
    let ours = format!(
        r#"{{"hooks": [{{"args": ["--socket", {:?}]}}]}}"#,
        "/run/gpushare/gpushared.sock"
    );
    std::fs::write(cdi::spec_path(&f.cfg.cdi_dir, "orphan"), &ours).unwrap();
    // Another gpushared's spec in a shared CDI directory (another socket) is not ours.
    let other = cdi::spec_path(&f.cfg.cdi_dir, "other-daemons");
    std::fs::write(&other, ours.replace("gpushared.sock", "other.sock")).unwrap();
    // The fake host knows no process 99: its writer is gone.
    // Named as fsutil::write_atomic names its temporaries: .<file>.tmp-<pid>-<n>.
    let tmp = f.cfg.cdi_dir.join(".gpushare.io-claim_x.json.tmp-99-0");
    std::fs::write(&tmp, "{").unwrap();
    let foreign = f.cfg.cdi_dir.join("nvidia.com-gpu.json");
    std::fs::write(&foreign, "{}").unwrap();

    let again = restart(&f, fresh_backend());
    assert!(again.get_claim("half").is_err(), "rolled back");
    assert!(again.list_claims().is_empty());
    assert!(!f.cfg.run_dir.join("claims/orphan").exists());
    assert!(!cdi::spec_path(&f.cfg.cdi_dir, "orphan").exists());
    assert!(!tmp.exists());
    assert!(foreign.exists(), "not ours");
    assert!(other.exists(), "another daemon's");
    let st = f.host.state();
    assert!(st.mounts.is_empty(), "{:?}", st.mounts);
    assert!(st.daemons.values().all(|d| !d.alive));
    drop(st);
    assert!(again
        .list_gpus()
        .iter()
        .all(|g| g.compute_mode == ComputeMode::Default));
    // A rollback leaves no tombstone: the kubelet's retry prepares it.
    again
        .prepare(&claim("half", &["gpu-2"], Some(mps(50))))
        .unwrap();
}

#[test]
fn an_mps_group_left_in_a_kept_claims_directory_is_stopped_and_removed_at_start() {
    let f = fixture();
    for (uid, gpu) in [("kept", "gpu-3"), ("plain", "gpu-4")] {
        f.service.prepare(&claim(uid, &[gpu], None)).unwrap();
    }
    // A group of an MPS strategy the claim had before a re-prepare that was cut short: its
    // directory and a daemon on its pipe, inside a claim's directory that stays.
    let kept_dir = f.cfg.run_dir.join("claims/kept");
    let stray = kept_dir.join("mps-abcde");
    for d in ["pipe", "log"] {
        std::fs::create_dir_all(stray.join(d)).unwrap();
    }
    fake_process(&f, stray.join("pipe").to_str().unwrap(), 777_002);

    let again = restart(&f, fresh_backend());
    assert_eq!(again.get_claim("kept").unwrap().state, ClaimState::Prepared);
    assert!(!stray.exists(), "the group no claim owns is removed");
    assert!(
        kept_dir.join("claim.json").is_file(),
        "the claim's own record stays"
    );
    assert!(f.cfg.run_dir.join("claims/plain/claim.json").is_file());
    assert!(f.host.state().daemons.values().all(|d| !d.alive));
}

#[test]
fn a_claims_cdi_spec_that_is_missing_or_not_a_regular_file_is_written_again_at_start() {
    let f = fixture();
    for (uid, gpu) in [("gone", "gpu-1"), ("linked", "gpu-2"), ("intact", "gpu-3")] {
        f.service.prepare(&claim(uid, &[gpu], None)).unwrap();
    }
    let spec = |uid: &str| cdi::spec_path(&f.cfg.cdi_dir, uid);
    let intact = std::fs::read(spec("intact")).unwrap();
    std::fs::remove_file(spec("gone")).unwrap();
    let target = f.cfg.cdi_dir.join("elsewhere.json");
    std::fs::rename(spec("linked"), &target).unwrap();
    std::os::unix::fs::symlink(&target, spec("linked")).unwrap();

    let again = restart(&f, fresh_backend());
    for uid in ["gone", "linked", "intact"] {
        assert_eq!(again.get_claim(uid).unwrap().state, ClaimState::Prepared);
        let meta = std::fs::symlink_metadata(spec(uid)).unwrap();
        assert!(meta.is_file(), "{uid}: {meta:?}");
        gpushare_cdi::load_spec_file(&spec(uid)).unwrap();
    }
    assert_eq!(std::fs::read(spec("intact")).unwrap(), intact);
}

#[test]
fn a_new_boot_id_redoes_every_claims_host_setup() {
    let f = fixture();
    let first = restart_with_boot(&f, "boot-a");
    first
        .prepare(&claim("rb", &["gpu-4"], Some(mps(25))))
        .unwrap();
    first
        .prepare(&claim(
            "ts",
            &["gpu-5"],
            Some(
                json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
                "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}}),
            ),
        ))
        .unwrap();
    first.attach(&attach("rb", "before-reboot")).unwrap();
    let old = mps_of(&first.get_claim("rb").unwrap());
    drop(first);
    // The reboot: processes, mounts, /run and the CDI specs there are gone.
    {
        let mut st = f.host.state();
        for d in st.daemons.values_mut() {
            d.die();
        }
        st.mounts.clear();
    }
    std::fs::remove_dir_all(&f.cfg.run_dir).unwrap();
    std::fs::remove_dir_all(&f.cfg.cdi_dir).unwrap();
    let again = restart_with_boot(&f, "boot-b");
    let c = again.get_claim("rb").unwrap();
    assert_eq!(c.state, ClaimState::Prepared);
    assert!(c.attached.is_empty(), "no container survives a reboot");
    assert_eq!(c.restarts, 0, "a reboot is not a crash of the daemon");
    let m = mps_of(&c);
    assert_ne!(m.control_daemon_pid, old.control_daemon_pid);
    assert_eq!(m.active_thread_percentage, "25.0");
    assert!(Path::new(&c.cdi_spec).exists());
    assert!(f.host.state().mounts.contains(Path::new(&m.shm_dir)));
    let gpus = again.list_gpus();
    assert_eq!(gpus[4].compute_mode, ComputeMode::ExclusiveProcess);
    assert_eq!(gpus[5].time_slice, TimeSliceInterval::Long);
    assert!(Path::new(&again.get_claim("ts").unwrap().cdi_spec).exists());
}

#[test]
fn a_corrupt_checkpoint_is_reported_and_claims_are_rebuilt_from_the_host() {
    let f = fixture();
    f.service
        .prepare(&claim("cc", &["gpu-6"], Some(mps(35))))
        .unwrap();
    let pid = mps_of(&f.service.get_claim("cc").unwrap()).control_daemon_pid;
    std::fs::write(
        &f.cfg.checkpoint,
        b"{\"version\": 2, \"claims\": {\"cc\": {",
    )
    .unwrap();
    let again = restart(&f, fresh_backend());
    let h = again.health();
    assert!(h.ready);
    let q = h.checkpoint_quarantined.unwrap();
    assert!(q.contains("checkpoint.json.corrupt-"), "{q}");
    let c = again.get_claim("cc").unwrap();
    assert_eq!(c.state, ClaimState::Prepared);
    assert_eq!(
        mps_of(&c).control_daemon_pid,
        pid,
        "the GPU job's daemon kept"
    );
    // A fresh, valid checkpoint was written.
    let cp = RecordsOnDisk::new(f.cfg.checkpoint.clone()).load().unwrap();
    assert!(cp.quarantined.is_none());
    assert!(cp.checkpoint.claims.contains_key("cc"));
}

#[test]
fn an_unwritable_checkpoint_fails_changes_cleanly_and_is_reported_until_it_heals() {
    let f = fixture();
    let state_dir = f.cfg.checkpoint.parent().unwrap().to_path_buf();
    std::fs::remove_dir_all(&state_dir).ok();
    std::fs::write(&state_dir, b"not a directory").unwrap();
    let err = f
        .service
        .prepare(&claim("full", &["gpu-7"], Some(mps(50))))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Internal);
    assert!(
        err.message.contains("writing checkpoint"),
        "{}",
        err.message
    );
    assert!(f.service.health().checkpoint_error.is_some());
    assert!(f.service.get_claim("full").is_err());
    assert!(f.host.state().mounts.is_empty());
    assert_eq!(starts(&f), 0, "nothing was started");
    std::fs::remove_file(&state_dir).unwrap();
    f.service
        .prepare(&claim("full", &["gpu-7"], Some(mps(50))))
        .unwrap();
    assert!(f.service.health().checkpoint_error.is_none());
}

#[test]
fn a_graceful_stop_refuses_new_changes_and_writes_the_checkpoint() {
    let f = fixture();
    f.service
        .prepare(&claim("gs", &["gpu-0"], Some(mps(50))))
        .unwrap();
    RecordsOnDisk::new(f.cfg.checkpoint.clone()).remove();
    assert!(f.service.stop(Duration::from_secs(5)).unwrap());
    assert!(f.service.health().stopping);
    let err = f.service.unprepare("gs").unwrap_err();
    assert_eq!(err.code, ErrorCode::NotReady);
    assert!(err.message.contains("stopping"), "{}", err.message);
    let cp = RecordsOnDisk::new(f.cfg.checkpoint.clone()).load().unwrap();
    assert!(cp.checkpoint.claims.contains_key("gs"));
    assert!(
        f.host.state().daemons.values().any(|d| d.alive),
        "MPS control daemons are left running"
    );
}

#[test]
fn a_release_that_cannot_be_checkpointed_changes_nothing() {
    let f = fixture();
    f.service
        .prepare(&claim("nospace", &["gpu-0"], Some(mps(50))))
        .unwrap();
    let state_dir = f.cfg.checkpoint.parent().unwrap().to_path_buf();
    std::fs::remove_dir_all(&state_dir).unwrap();
    std::fs::write(&state_dir, b"not a directory").unwrap();
    let err = f.service.unprepare("nospace").unwrap_err();
    assert!(
        err.message.contains("writing checkpoint"),
        "{}",
        err.message
    );
    let c = f.service.get_claim("nospace").unwrap();
    assert_eq!(c.state, ClaimState::Prepared);
    assert!(f.host.state().daemons.values().any(|d| d.alive));
    std::fs::remove_file(&state_dir).unwrap();
    f.service.unprepare("nospace").unwrap();
    assert_clean(&f, "nospace");
}

#[test]
fn a_graceful_stop_lets_a_prepare_under_way_finish_first() {
    let f = Arc::new(fixture());
    f.host.state().delay = Some(Duration::from_millis(50));
    let worker = {
        let f = Arc::clone(&f);
        std::thread::spawn(move || f.service.prepare(&claim("slow", &["gpu-1"], Some(mps(50)))))
    };
    // Wait (without a time bound on the outcome) until the prepare is under way.
    while *f.service.in_flight.0.lock().unwrap() == 0 {
        std::thread::yield_now();
    }
    assert!(f.service.stop(Duration::from_secs(60)).unwrap());
    worker.join().unwrap().unwrap();
    let cp = RecordsOnDisk::new(f.cfg.checkpoint.clone()).load().unwrap();
    assert_eq!(cp.checkpoint.claims["slow"].state, ClaimState::Prepared);
}

#[test]
fn start_kills_mps_processes_no_claim_owns_even_without_their_directory() {
    let f = fixture();
    f.service
        .prepare(&claim("own", &["gpu-0"], Some(mps(50))))
        .unwrap();
    let owned = mps_of(&f.service.get_claim("own").unwrap());
    let env_of = |pipe: &str| {
        std::collections::BTreeMap::from([(
            "CUDA_MPS_PIPE_DIRECTORY".to_string(),
            pipe.to_string(),
        )])
    };
    let ghost_pipe = f.cfg.run_dir.join("claims/ghost/mps-00000/pipe");
    {
        let mut st = f.host.state();
        // A daemon a crash left behind after its directory was removed (no lock to find it).
        st.daemons.insert(
            PathBuf::from("/elsewhere/ghost"),
            crate::sys::fake::FakeDaemon::new(555_001, env_of(ghost_pipe.to_str().unwrap())),
        );
        // An MPS server of the owned daemon: same pipe directory, to be left alone.
        st.daemons.insert(
            PathBuf::from("/elsewhere/server"),
            crate::sys::fake::FakeDaemon::new(555_002, env_of(&owned.pipe_dir)),
        );
    }
    let again = restart(&f, fresh_backend());
    let st = f.host.state();
    assert!(st.killed.contains(&555_001));
    assert!(!st.killed.contains(&555_002));
    assert!(!st.killed.contains(&owned.control_daemon_pid));
    drop(st);
    assert_eq!(
        mps_of(&again.get_claim("own").unwrap()).control_daemon_pid,
        owned.control_daemon_pid
    );
    assert!(!f.cfg.run_dir.join("claims/ghost").exists());
}

#[test]
fn a_prepare_retry_restarts_a_dead_daemon_in_the_same_pipe_directory() {
    use std::os::unix::fs::MetadataExt;
    let f = fixture();
    let object = claim("inplace", &["gpu-2"], Some(mps(45)));
    f.service.prepare(&object).unwrap();
    let before = mps_of(&f.service.get_claim("inplace").unwrap());
    let inode = std::fs::metadata(&before.pipe_dir).unwrap().ino();
    kill_daemon(&f, before.control_daemon_pid);
    let r = f.service.prepare(&object).unwrap();
    assert!(!r.already_prepared, "work was done");
    let c = f.service.get_claim("inplace").unwrap();
    let after = mps_of(&c);
    assert_ne!(after.control_daemon_pid, before.control_daemon_pid);
    assert_eq!(after.active_thread_percentage, "45.0");
    assert_eq!(c.restarts, 1);
    assert_eq!(
        std::fs::metadata(&after.pipe_dir).unwrap().ino(),
        inode,
        "containers' bind mounts still reach the daemon"
    );
    assert!(f.host.state().mounts.contains(Path::new(&after.shm_dir)));
}

#[test]
fn after_a_restart_the_mode_words_hold_readopted_claims_and_rollbacks_free_theirs() {
    let f = fixture();
    f.service
        .prepare(&claim("keep", &["gpu-1"], Some(mps(50))))
        .unwrap();
    f.service
        .prepare(&claim("half", &["gpu-2"], Some(mps(50))))
        .unwrap();
    let file = RecordsOnDisk::new(f.cfg.checkpoint.clone());
    let mut cp = file.load().unwrap().checkpoint;
    cp.claims.get_mut("half").unwrap().state = ClaimState::PrepareStarted;
    file.save(&cp).unwrap();

    let again = restart(&f, fresh_backend());
    // The re-adopted claim's GPU is refused to others by its mode word, before the registry.
    let err = again
        .prepare(&claim("other", &["gpu-1"], None))
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::Conflict, "{}", err.message);
    assert!(err.message.contains("gpu-1"), "{}", err.message);
    // The rolled-back claim's GPU was released through its word (restored, then free).
    again.prepare(&claim("other", &["gpu-2"], None)).unwrap();
    // The checkpoint written by the reconcile carries this boot's ID and the generations.
    let written = file.load().unwrap().checkpoint;
    assert_eq!(written.version, crate::checkpoint::CHECKPOINT_VERSION);
    assert!(written.generation >= cp.generation, "{written:?}");
    assert_eq!(
        written.claims.keys().collect::<Vec<_>>(),
        ["keep", "other"],
        "{written:?}"
    );
    // The re-adopted claim is the last holder of its word: its release restores the GPU.
    again.unprepare("keep").unwrap();
    let gpu1 = again.list_gpus().into_iter().find(|g| g.name == "gpu-1");
    assert_eq!(gpu1.map(|g| g.compute_mode), Some(ComputeMode::Default));
    again.prepare(&claim("third", &["gpu-1"], None)).unwrap();
}

#[test]
fn a_restart_rewrites_only_host_records_that_changed() {
    use std::os::unix::fs::MetadataExt;
    let f = fixture();
    f.service
        .prepare(&claim("same", &["gpu-0"], Some(mps(30))))
        .unwrap();
    f.service
        .prepare(&claim("dies", &["gpu-1"], Some(mps(60))))
        .unwrap();
    let record = |uid: &str| f.cfg.run_dir.join("claims").join(uid).join("claim.json");
    // A durable rewrite replaces the file (a new inode); an unchanged record is left alone.
    let inode = |uid: &str| std::fs::metadata(record(uid)).unwrap().ino();
    let (same, dies) = (inode("same"), inode("dies"));
    kill_daemon(
        &f,
        mps_of(&f.service.get_claim("dies").unwrap()).control_daemon_pid,
    );
    let again = restart(&f, fresh_backend());
    assert_eq!(inode("same"), same, "unchanged record not rewritten");
    assert_ne!(inode("dies"), dies, "the restarted claim's record is new");
    let on_disk: ClaimInfo =
        serde_json::from_slice(&std::fs::read(record("dies")).unwrap()).unwrap();
    assert_eq!(on_disk, again.get_claim("dies").unwrap());
}

/// Makes every MPS claim's recorded daemon one that cannot be re-adopted (the recorded start
/// time is not the running process's) and that ignores `quit`, so that stopping it waits out
/// the whole quit bound before it is killed.
fn unadoptable(f: &Fixture) {
    let file = RecordsOnDisk::new(f.cfg.checkpoint.clone());
    let mut cp = file.load().unwrap().checkpoint;
    for c in cp.claims.values_mut() {
        for g in &mut c.groups {
            if let StrategyInfo::Mps(m) = &mut g.sharing {
                m.control_daemon_start_time += 1;
            }
        }
    }
    file.save(&cp).unwrap();
    // The host records say the same (they are what a lost checkpoint is rebuilt from).
    for c in cp.claims.values() {
        let path = f.cfg.run_dir.join("claims").join(&c.uid).join("claim.json");
        std::fs::write(path, serde_json::to_vec(c).unwrap()).unwrap();
    }
    f.host.state().ignore_quit = true;
}

#[test]
fn the_start_up_reconcile_stops_and_restarts_mps_daemons_all_at_once() {
    let f = fixture();
    for i in 0..8 {
        f.service
            .prepare(&claim(
                &format!("par{i}"),
                &[&format!("gpu-{i}")],
                Some(mps(20 + i)),
            ))
            .unwrap();
    }
    let old: Vec<i32> = (0..8)
        .map(|i| mps_of(&f.service.get_claim(&format!("par{i}")).unwrap()).control_daemon_pid)
        .collect();
    unadoptable(&f);
    // Every daemon's stop sends `quit` and waits for it: all eight must be under way at once.
    f.host.state().gate = Some(("quit".into(), 8));
    let again = restart(&f, fresh_backend());
    assert_eq!(
        f.host.state().gate_peak,
        8,
        "the eight stops ran at once, not one after another"
    );
    for i in 0..8u32 {
        let c = again.get_claim(&format!("par{i}")).unwrap();
        assert_eq!(c.state, ClaimState::Prepared, "{c:?}");
        let m = mps_of(&c);
        assert_ne!(m.control_daemon_pid, old[i as usize]);
        assert_eq!(m.active_thread_percentage, format!("{}.0", 20 + i));
        assert_eq!(c.restarts, 1);
    }
    let st = f.host.state();
    for pid in &old {
        assert!(st.killed.contains(pid), "{pid} killed after ignoring quit");
    }
}

#[test]
fn the_start_up_sweep_stops_orphan_mps_daemons_all_at_once() {
    let f = fixture();
    for i in 0..6 {
        f.service
            .prepare(&claim(
                &format!("orph{i}"),
                &[&format!("gpu-{i}")],
                Some(mps(50)),
            ))
            .unwrap();
    }
    // The claims are forgotten by the checkpoint and their host records lost: every daemon
    // is an orphan now.
    for i in 0..6 {
        std::fs::remove_file(f.cfg.run_dir.join(format!("claims/orph{i}/claim.json"))).unwrap();
    }
    let file = RecordsOnDisk::new(f.cfg.checkpoint.clone());
    let mut cp = file.load().unwrap().checkpoint;
    cp.claims.clear();
    file.save(&cp).unwrap();
    f.host.state().ignore_quit = true;
    f.host.state().gate = Some(("quit".into(), 6));
    let again = restart(&f, fresh_backend());
    assert_eq!(f.host.state().gate_peak, 6, "the six stops ran at once");
    assert!(again.list_claims().is_empty());
    let st = f.host.state();
    assert!(st.daemons.values().all(|d| !d.alive));
    assert!(st.mounts.is_empty(), "{:?}", st.mounts);
}

#[test]
fn a_registry_held_by_a_stuck_change_stops_the_watchdog_pings() {
    let Fixture {
        _dir: dir, service, ..
    } = fixture();
    let service = std::sync::Arc::new(service);
    assert!(crate::service::registry_answers(
        &service,
        Duration::from_secs(5)
    ));
    // A change stuck while holding the registry (a wedged NVML call under the lock, say).
    let stuck = service.state();
    assert!(
        !crate::service::registry_answers(&service, Duration::from_millis(200)),
        "no answer while a change holds the registry: no ping"
    );
    // Readers still answer from the published view: `health` alone would have pinged.
    assert!(service.health().ready);
    drop(stuck);
    assert!(crate::service::registry_answers(
        &service,
        Duration::from_secs(5)
    ));
    drop(dir);
}

/// A process outside gpushare (any root process, a pod's) whose environment names a pipe
/// directory under the claims directory that is not one of a claim's MPS groups.
fn plant_process(f: &Fixture, pipe: &Path) -> i32 {
    let mut st = f.host.state();
    st.next_pid += 1;
    let pid = 90_000 + st.next_pid;
    let env = BTreeMap::from([(
        "CUDA_MPS_PIPE_DIRECTORY".to_string(),
        pipe.display().to_string(),
    )]);
    st.daemons.insert(
        pipe.to_path_buf(),
        crate::sys::fake::FakeDaemon::new(pid, env),
    );
    pid
}

#[test]
fn a_pipe_path_from_another_process_s_environment_never_leads_a_removal_or_a_kill() {
    let f = fixture();
    f.service
        .prepare(&claim("kept", &["gpu-1"], Some(mps(50))))
        .unwrap();
    let claims = f.cfg.run_dir.join("claims");
    let victim = f.cfg.run_dir.parent().unwrap().join("victim");
    std::fs::create_dir_all(victim.join("sub")).unwrap();
    std::fs::write(victim.join("sub/precious"), b"x").unwrap();
    let rel = Path::new("..").join(
        victim
            .strip_prefix(f.cfg.run_dir.parent().unwrap())
            .unwrap(),
    );
    let climbing = plant_process(&f, &claims.join("..").join(&rel).join("sub/pipe"));
    let shallow = plant_process(&f, &claims.join("not-a-claim"));
    let again = restart(&f, fresh_backend());
    assert!(
        victim.join("sub/precious").exists(),
        "nothing outside removed"
    );
    assert!(claims.join("kept").is_dir(), "the claims directory kept");
    let c = again.get_claim("kept").unwrap();
    assert_eq!(c.state, ClaimState::Prepared);
    let killed = f.host.state().killed.clone();
    assert!(
        !killed.contains(&climbing) && !killed.contains(&shallow),
        "a process that is not an MPS group's of ours is not signalled: {killed:?}"
    );
}

#[test]
fn a_linked_pipe_directory_in_an_orphan_group_never_stops_a_live_claim_s_daemon() {
    let f = fixture();
    f.service
        .prepare(&claim("live", &["gpu-1"], Some(mps(50))))
        .unwrap();
    let pid = mps_of(&f.service.get_claim("live").unwrap()).control_daemon_pid;
    let live_pipe = mps_of(&f.service.get_claim("live").unwrap()).pipe_dir;
    let orphan = f.cfg.run_dir.join("claims/orphan-x/mps-abcde");
    std::fs::create_dir_all(&orphan).unwrap();
    std::os::unix::fs::symlink(&live_pipe, orphan.join("pipe")).unwrap();
    let again = restart(&f, fresh_backend());
    let c = again.get_claim("live").unwrap();
    assert_eq!(c.state, ClaimState::Prepared, "{:?}", c.last_error);
    assert_eq!(mps_of(&c).control_daemon_pid, pid, "the live daemon kept");
    assert_eq!(c.restarts, 0);
    assert!(!f.host.state().killed.contains(&pid));
    assert!(Path::new(&live_pipe).is_dir(), "the link's target kept");
    assert!(
        !orphan.exists(),
        "the orphan group removed, the link with it"
    );
}

#[test]
fn settings_no_claim_holds_are_put_back_to_default_at_start() {
    let f = fixture();
    f.service
        .prepare(&claim("keeps-mps", &["gpu-0"], Some(mps(50))))
        .unwrap();
    // What a gpushared killed between changing a GPU and recording its claim (or between a
    // release and restoring the GPU) leaves: settings nobody holds.
    let backend = fresh_backend();
    let uuid = |name: &str| backend.find(name).unwrap().uuid.clone();
    backend
        .set_time_slice(&uuid("gpu-4"), TimeSliceInterval::Long)
        .unwrap();
    backend
        .set_compute_mode(&uuid("gpu-6"), ComputeMode::ExclusiveProcess)
        .unwrap();
    backend
        .set_compute_mode(&uuid("gpu-0"), ComputeMode::ExclusiveProcess)
        .unwrap();
    let again = restart(&f, Arc::clone(&backend));
    let gpus = again.list_gpus();
    assert_eq!(gpus[4].time_slice, TimeSliceInterval::Default);
    assert_eq!(gpus[6].compute_mode, ComputeMode::Default);
    assert_eq!(
        gpus[0].compute_mode,
        ComputeMode::ExclusiveProcess,
        "what a claim holds stays"
    );
}
