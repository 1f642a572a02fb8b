//! Unit tests of `mps/`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use super::*;

#[test]
fn displays_match_nvidia_read_back() {
    assert_eq!(percentage_display(Some(50)), "50.0");
    assert_eq!(percentage_display(None), "100.0");
    assert_eq!(pinned_limit_display(Some(8192)), "8G");
    assert_eq!(pinned_limit_display(Some(20480)), "20G");
    assert_eq!(pinned_limit_display(Some(1536)), "1G");
    assert_eq!(pinned_limit_display(Some(800)), "800M");
    assert_eq!(pinned_limit_display(Some(1024)), "1G");
    assert_eq!(pinned_limit_display(None), "");
}

#[test]
fn pinned_limits_are_keyed_by_ordinal_never_uuid() {
    let launch = MpsLaunch {
        dirs: MpsDirs::for_group(Path::new("/run/x"), &["GPU-a".into(), "GPU-b".into()]),
        visible_devices: vec!["GPU-a".into(), "GPU-b".into()],
        multi_user: false,
        active_thread_percentage: Some(30),
        pinned_limits_mib: vec![Some(8192), Some(20480)],
        shm_bytes: 1 << 20,
    };
    assert_eq!(
        set_commands(&launch),
        vec![
            "set_default_active_thread_percentage 30",
            "set_default_device_pinned_mem_limit 0 8192M",
            "set_default_device_pinned_mem_limit 1 20480M",
        ]
    );
    assert!(set_commands(&launch).iter().all(|c| !c.contains("GPU-")));
}

#[test]
fn devices_without_a_pinned_limit_are_verified_but_not_listed() {
    let host = crate::sys::fake::FakeHost::default();
    let mps = MpsControl::new("/m".into(), host.ops(), Duration::from_millis(200));
    let claim = tempfile::tempdir().unwrap();
    let uuids = vec!["GPU-a".to_string(), "GPU-b".to_string()];
    let dirs = MpsDirs::for_group(claim.path(), &uuids);
    for d in [&dirs.pipe, &dirs.log, &dirs.shm] {
        std::fs::create_dir_all(d).unwrap();
    }
    let launch = |pinned: Vec<Option<u64>>| MpsLaunch {
        dirs: dirs.clone(),
        visible_devices: uuids.clone(),
        multi_user: false,
        active_thread_percentage: Some(50),
        pinned_limits_mib: pinned,
        shm_bytes: 1 << 20,
    };
    // Device 0 without a limit, device 1 with one: both read back, only the limit shown
    // (an empty string for "no limit" read as a limit of nothing).
    let info = mps.start(&launch(vec![None, None])).unwrap();
    assert_eq!(info.active_thread_percentage, "50.0");
    assert!(
        info.pinned_device_memory_limits.is_empty(),
        "{:?}",
        info.pinned_device_memory_limits
    );
    mps.stop(&dirs, Some(info.control_daemon_pid)).unwrap();
    let info = mps.start(&launch(vec![None, Some(8192)])).unwrap();
    assert_eq!(
        info.pinned_device_memory_limits,
        BTreeMap::from([("1".to_string(), "8G".to_string())])
    );
    assert_eq!(info.requested.pinned_limits_mib, vec![None, Some(8192)]);
    // A limit where none was asked for is still caught by the read-back.
    let wrong = mps.read_back(&launch(vec![Some(1024), Some(8192)]));
    assert!(matches!(wrong, Err(MpsError::Verify { .. })), "{wrong:?}");
    mps.stop(&dirs, Some(info.control_daemon_pid)).unwrap();
}

#[test]
fn group_dirs_are_stable_and_distinct() {
    let a = MpsDirs::for_group(Path::new("/c"), &["GPU-1".into()]);
    assert_eq!(a, MpsDirs::for_group(Path::new("/c"), &["GPU-1".into()]));
    assert_ne!(
        a.root,
        MpsDirs::for_group(Path::new("/c"), &["GPU-2".into()]).root
    );
    assert_eq!(a.pipe, a.root.join("pipe"));
}

#[test]
fn mem_total_parse() {
    use crate::sys::parse_mem_total_kib;
    assert_eq!(
        parse_mem_total_kib("MemTotal:       24576000 kB\nMemFree: 1 kB\n"),
        Some(24576000)
    );
    assert_eq!(parse_mem_total_kib("nothing"), None);
    assert_eq!(default_shm_bytes(Some(1024)), 512 * 1024);
    assert_eq!(default_shm_bytes(None), 64 << 20);
}

/// A launch of one group on GPU-a, with a limit to read back, under `claim`.
fn one_gpu_launch(claim: &Path) -> MpsLaunch {
    let uuids = vec!["GPU-a".to_string()];
    MpsLaunch {
        dirs: MpsDirs::for_group(claim, &uuids),
        visible_devices: uuids,
        multi_user: false,
        active_thread_percentage: Some(50),
        pinned_limits_mib: vec![None],
        shm_bytes: 1 << 20,
    }
}

/// Break-it finding 7, then issue 25 item 5: a hung control daemon held the start for three
/// MPS timeouts (the re-adoption probe, `quit`, then a wait for an exit that never comes),
/// then for two (the probe and `quit`). A daemon that did not answer the probe is not asked
/// again: the restart kills it at once, so a restart waits one timeout.
#[test]
fn a_daemon_that_did_not_answer_the_probe_is_killed_without_being_asked_to_quit() {
    let host = crate::sys::fake::FakeHost::default();
    let mps = MpsControl::new("/m".into(), host.ops(), Duration::from_millis(200));
    let claim = tempfile::tempdir().unwrap();
    let launch = one_gpu_launch(claim.path());
    let info = mps.start(&launch).unwrap();
    let pid = info.control_daemon_pid;
    host.state()
        .daemons
        .values_mut()
        .for_each(|d| d.hung = true);
    host.state().timeline.clear();
    let why = mps.check_adoptable(&info).unwrap_err();
    assert!(matches!(why, AdoptError::ReadBack(_)), "{why:?}");
    assert!(why.to_string().contains("timed out"), "{why}");
    let again = mps.restart(&launch).unwrap();
    assert_ne!(again.control_daemon_pid, pid);
    let timeline = host.state().timeline.clone();
    let timed_out: Vec<&String> = timeline
        .iter()
        .filter(|e| e.ends_with("timed out"))
        .collect();
    assert_eq!(
        timed_out,
        ["run get_default_active_thread_percentage: timed out"],
        "one timeout, the probe's ({timeline:#?})"
    );
    assert!(
        !timeline.iter().any(|e| e.starts_with("run quit")),
        "not asked to quit: {timeline:#?}"
    );
    assert!(
        timeline.contains(&format!("SIGKILL {pid}")),
        "killed: {timeline:#?}"
    );
    mps.stop(&launch.dirs, Some(again.control_daemon_pid))
        .unwrap();
}

/// Issue 25 item 5: a SIGSTOPped control daemon shows as stopped in `/proc`; it is neither
/// probed nor asked to quit (each would only run out the timeout), but killed and replaced.
#[test]
fn a_stopped_daemon_is_neither_probed_nor_asked_to_quit() {
    let host = crate::sys::fake::FakeHost::default();
    let mps = MpsControl::new("/m".into(), host.ops(), Duration::from_millis(200));
    let claim = tempfile::tempdir().unwrap();
    let launch = one_gpu_launch(claim.path());
    let info = mps.start(&launch).unwrap();
    let pid = info.control_daemon_pid;
    host.state()
        .daemons
        .values_mut()
        .for_each(|d| d.stopped = true);
    host.state().timeline.clear();
    let why = mps.check_adoptable(&info).unwrap_err();
    assert!(
        matches!(why, AdoptError::Stopped { pid: p } if p == pid),
        "{why:?}"
    );
    assert_eq!(
        why.to_string(),
        format!(
            "pid {pid} is stopped (state T or t in /proc/{pid}/stat) and can answer no control command"
        )
    );
    let again = mps.restart(&launch).unwrap();
    assert_ne!(again.control_daemon_pid, pid);
    assert_eq!(again.active_thread_percentage, "50.0", "read back");
    let timeline = host.state().timeline.clone();
    assert!(
        !timeline.iter().any(|e| e.ends_with("timed out")),
        "no timeout run out: {timeline:#?}"
    );
    let kill = timeline.iter().position(|e| *e == format!("SIGKILL {pid}"));
    let first_run = timeline.iter().position(|e| e.starts_with("run "));
    assert!(
        matches!((kill, first_run), (Some(k), Some(r)) if k < r),
        "killed before anything ran (the new daemon's commands): {timeline:#?}"
    );
    mps.stop(&launch.dirs, Some(again.control_daemon_pid))
        .unwrap();
}

/// A `quit` that times out on a daemon that answered its last command still gets the timeout
/// to exit before the SIGKILL: NVIDIA's `quit` waits for the MPS servers, which wait for their
/// clients, so a slow quit is not yet a hung daemon.
#[test]
fn a_slow_quit_of_a_daemon_that_answered_gets_its_time_before_the_kill() {
    let host = crate::sys::fake::FakeHost::default();
    let mps = MpsControl::new("/m".into(), host.ops(), Duration::from_millis(100));
    let claim = tempfile::tempdir().unwrap();
    let uuids = vec!["GPU-a".to_string()];
    let launch = MpsLaunch {
        dirs: MpsDirs::for_group(claim.path(), &uuids),
        visible_devices: uuids.clone(),
        multi_user: false,
        active_thread_percentage: Some(50),
        pinned_limits_mib: vec![None],
        shm_bytes: 1 << 20,
    };
    let info = mps.start(&launch).unwrap();
    let pid = info.control_daemon_pid;
    mps.check_adoptable(&info).unwrap();
    host.state()
        .daemons
        .values_mut()
        .for_each(|d| d.hung = true);
    host.state().timeline.clear();
    mps.stop(&launch.dirs, Some(pid)).unwrap();
    let timeline = host.state().timeline.clone();
    let quit = timeline.iter().position(|e| e == "run quit: timed out");
    let kill = timeline.iter().position(|e| *e == format!("SIGKILL {pid}"));
    let (Some(quit), Some(kill)) = (quit, kill) else {
        panic!("quit, then SIGKILL: {timeline:#?}")
    };
    assert!(
        timeline[quit + 1..kill]
            .iter()
            .any(|e| e.starts_with("holder? ")),
        "it was waited for before the kill: {timeline:#?}"
    );
}
