//! State read back from disk at start: a missing checkpoint is not a node without claims,
//! and every record (checkpoint entry or host record) is input, checked before any path is
//! built from it; a refused one is quarantined alone.

use std::os::unix::fs::symlink;

use super::*;

fn mps_pid(c: &ClaimInfo) -> i32 {
    c.groups
        .iter()
        .find_map(|g| match &g.sharing {
            StrategyInfo::Mps(m) => Some(m.control_daemon_pid),
            _ => None,
        })
        .expect("an MPS group")
}

fn mps_info(c: &ClaimInfo) -> MpsInfo {
    c.groups
        .iter()
        .find_map(|g| match &g.sharing {
            StrategyInfo::Mps(m) => Some(m.clone()),
            _ => None,
        })
        .expect("an MPS group")
}

fn ts(interval: &str) -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
           "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}})
}

fn host_record(f: &Fixture, uid: &str) -> PathBuf {
    f.cfg.run_dir.join("claims").join(uid).join("claim.json")
}

fn quarantined(f: &Fixture) -> Vec<String> {
    let dir = f.cfg.checkpoint.parent().unwrap().join("quarantine");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|e| {
            e.flatten()
                .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Three prepared claims (MPS, time-slicing, exclusive) on the fake host.
fn three_claims(f: &Fixture) {
    f.service
        .prepare(&claim("m1", &["gpu-1"], Some(mps(40))))
        .unwrap();
    f.service
        .prepare(&claim("t1", &["gpu-2"], Some(ts("Long"))))
        .unwrap();
    f.service.prepare(&claim("e1", &["gpu-3"], None)).unwrap();
}

/// What each claim has on the host is all still there, and its MPS daemon is the same one.
fn assert_kept(f: &Fixture, again: &Service, pid: i32) {
    for uid in ["m1", "t1", "e1"] {
        let c = again.get_claim(uid).unwrap();
        assert_eq!(c.state, ClaimState::Prepared, "{uid}");
        assert!(Path::new(&c.cdi_spec).exists(), "{uid}: CDI spec kept");
        assert!(host_record(f, uid).exists(), "{uid}: host record kept");
    }
    let m = mps_info(&again.get_claim("m1").unwrap());
    assert_eq!(m.control_daemon_pid, pid, "the GPU job's daemon kept");
    let st = f.host.state();
    assert!(st.killed.is_empty(), "killed {:?}", st.killed);
    assert!(st.mounts.contains(Path::new(&m.shm_dir)), "shm tmpfs kept");
    assert!(
        st.daemons.values().any(|d| d.pid == pid && d.alive),
        "daemon alive"
    );
    assert_eq!(
        st.calls.iter().filter(|c| c.contains(" -d")).count(),
        1,
        "no daemon started again"
    );
    drop(st);
    assert_eq!(
        again.list_gpus()[2].time_slice,
        TimeSliceInterval::Long,
        "settings re-applied from the rebuilt claims"
    );
    // Placement rebuilt too: the GPUs stay held.
    let err = again.prepare(&claim("x", &["gpu-3"], None)).unwrap_err();
    assert_eq!(err.code, ErrorCode::Conflict, "{}", err.message);
    // And the fresh checkpoint holds them all again.
    let cp = RecordsOnDisk::new(f.cfg.checkpoint.clone()).load().unwrap();
    assert_eq!(
        cp.checkpoint.claims.keys().collect::<Vec<_>>(),
        ["e1", "m1", "t1"]
    );
}

#[test]
fn a_missing_checkpoint_rebuilds_every_claim_from_its_host_record_and_sweeps_nothing() {
    let f = fixture();
    three_claims(&f);
    let pid = mps_pid(&f.service.get_claim("m1").unwrap());
    RecordsOnDisk::new(f.cfg.checkpoint.clone()).remove();
    let again = restart(&f, fresh_backend());
    assert!(again.health().ready);
    assert_kept(&f, &again, pid);
}

#[test]
fn a_missing_state_directory_rebuilds_every_claim_from_its_host_record() {
    let f = fixture();
    three_claims(&f);
    let pid = mps_pid(&f.service.get_claim("m1").unwrap());
    std::fs::remove_dir_all(f.cfg.checkpoint.parent().unwrap()).unwrap();
    let again = restart(&f, fresh_backend());
    assert_kept(&f, &again, pid);
}

#[test]
fn a_checkpoint_path_of_the_wrong_type_is_quarantined_and_claims_rebuilt() {
    for what in ["directory", "fifo", "symlink"] {
        let f = fixture();
        three_claims(&f);
        let pid = mps_pid(&f.service.get_claim("m1").unwrap());
        // The claim's record in the store.
        let p = &crate::store::Store::beside(&f.cfg.checkpoint).claim_path("m1");
        let bytes = std::fs::read(p).unwrap();
        std::fs::remove_file(p).unwrap();
        match what {
            "directory" => std::fs::create_dir(p).unwrap(),
            "fifo" => {
                nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
            }
            _ => {
                // Even a link to a good checkpoint: ours is never a link, so it is not ours.
                let target = p.with_file_name("elsewhere.json");
                std::fs::write(&target, &bytes).unwrap();
                symlink(&target, p).unwrap();
            }
        }
        let again = restart(&f, fresh_backend());
        let q = again.health().checkpoint_quarantined.expect(what);
        assert!(q.contains("not a regular file"), "{what}: {q}");
        assert_kept(&f, &again, pid);
    }
}

#[test]
fn a_checkpoint_lacking_a_claim_keeps_the_claim_of_its_host_record() {
    let f = fixture();
    three_claims(&f);
    let pid = mps_pid(&f.service.get_claim("m1").unwrap());
    // An older checkpoint (restored from a backup, say) without m1 and t1; e1's host record
    // is missing instead.
    let file = RecordsOnDisk::new(f.cfg.checkpoint.clone());
    let mut cp = file.load().unwrap().checkpoint;
    cp.claims.remove("m1");
    cp.claims.remove("t1");
    file.save(&cp).unwrap();
    std::fs::remove_file(host_record(&f, "e1")).unwrap();
    let again = restart(&f, fresh_backend());
    assert_kept(&f, &again, pid);
}

#[test]
fn a_host_record_older_than_its_claims_release_is_released_not_revived() {
    let f = fixture();
    f.service
        .prepare(&claim("gone", &["gpu-4"], Some(mps(40))))
        .unwrap();
    let c = f.service.get_claim("gone").unwrap();
    let record = std::fs::read(host_record(&f, "gone")).unwrap();
    f.service.unprepare("gone").unwrap();
    // The record comes back (a restored /run), with a directory of its MPS group.
    let m = mps_info(&c);
    std::fs::create_dir_all(&m.pipe_dir).unwrap();
    std::fs::write(host_record(&f, "gone"), &record).unwrap();
    let again = restart(&f, fresh_backend());
    assert!(again.get_claim("gone").is_err(), "the release stands");
    assert!(!f.cfg.run_dir.join("claims/gone").exists());
    assert_eq!(again.list_gpus()[4].compute_mode, ComputeMode::Default);
    // And the tombstone too: the released object's retry is still stale.
    assert!(again.list_claims().is_empty());
}

/// Plants `info` into the checkpoint under `key`.
/// (As a version 2 checkpoint, which the next start migrates: records of any key and shape
/// reach a start that way.)
fn plant_in_checkpoint(f: &Fixture, key: &str, info: ClaimInfo) {
    let file = RecordsOnDisk::new(f.cfg.checkpoint.clone());
    // What was planted before, else the records.
    let mut cp = match crate::checkpoint::CheckpointFile::new(f.cfg.checkpoint.clone()).load() {
        Ok(l) if !l.missing => l.checkpoint,
        _ => file.load().unwrap().checkpoint,
    };
    cp.claims.insert(key.into(), info);
    file.save_v2(&cp).unwrap();
}

/// A directory outside the run, state and CDI directories, with a file in it, as an MPS
/// group's: `<root>/outside/mps-00000/{pipe,log,shm}`.
fn outside(f: &Fixture) -> (PathBuf, PathBuf) {
    let root = f.cfg.run_dir.parent().unwrap().join("outside");
    let group = root.join("mps-00000");
    for d in ["pipe", "log", "shm"] {
        std::fs::create_dir_all(group.join(d)).unwrap();
    }
    let precious = root.join("precious");
    std::fs::write(&precious, "keep me").unwrap();
    (group, precious)
}

fn pointing_at(mut info: ClaimInfo, group: &Path) -> ClaimInfo {
    for g in &mut info.groups {
        if let StrategyInfo::Mps(m) = &mut g.sharing {
            m.pipe_dir = group.join("pipe").display().to_string();
            m.log_dir = group.join("log").display().to_string();
            m.shm_dir = group.join("shm").display().to_string();
        }
    }
    info
}

#[test]
fn hostile_checkpoint_entries_are_quarantined_alone_and_nothing_outside_is_removed() {
    let f = fixture();
    f.service
        .prepare(&claim("good", &["gpu-0"], Some(mps(50))))
        .unwrap();
    f.service
        .prepare(&claim("tmpl", &["gpu-5"], Some(mps(50))))
        .unwrap();
    let tmpl = f.service.get_claim("tmpl").unwrap();
    f.service.unprepare("tmpl").unwrap();
    let good_pid = mps_pid(&f.service.get_claim("good").unwrap());
    let (group, precious) = outside(&f);

    // A UID that climbs out of the claims directory.
    let mut climb = tmpl.clone();
    climb.uid = "../../outside".into();
    climb.state = ClaimState::Unpreparing;
    plant_in_checkpoint(&f, "../../outside", climb);
    // A valid UID whose MPS directories are somewhere else, being released (teardown would
    // remove the group's directory).
    let mut elsewhere = pointing_at(tmpl.clone(), &group);
    elsewhere.uid = "elsewhere".into();
    elsewhere.state = ClaimState::Unpreparing;
    plant_in_checkpoint(&f, "elsewhere", elsewhere);
    // A prepared one whose shm directory (bind-mounted into containers) is the host's root.
    let mut shm = tmpl.clone();
    shm.uid = "shm-root".into();
    shm.cdi_spec = cdi::spec_path(&f.cfg.cdi_dir, "shm-root")
        .display()
        .to_string();
    if let StrategyInfo::Mps(m) = &mut shm.groups[0].sharing {
        m.shm_dir = "/".into();
    }
    plant_in_checkpoint(&f, "shm-root", shm);
    // An entry filed under another claim's UID.
    let mut filed = tmpl.clone();
    filed.uid = "good".into();
    plant_in_checkpoint(&f, "misfiled", filed);
    // A CDI device ID that is not the claim's own (it is handed to the kubelet).
    let mut ids = tmpl.clone();
    ids.uid = "ids".into();
    ids.requests[0].cdi_device_ids = vec!["nvidia.com/gpu=all".into()];
    plant_in_checkpoint(&f, "ids", ids);

    let again = restart(&f, fresh_backend());
    assert!(again.health().ready);
    assert!(
        precious.exists() && group.join("pipe").exists(),
        "nothing outside removed"
    );
    assert_eq!(
        again
            .list_claims()
            .iter()
            .map(|c| c.uid.as_str())
            .collect::<Vec<_>>(),
        ["good"],
        "only the good claim"
    );
    let good = again.get_claim("good").unwrap();
    assert_eq!(mps_pid(&good), good_pid, "the good claim goes on");
    assert!(Path::new(&good.cdi_spec).exists());
    let q = quarantined(&f);
    assert_eq!(q.len(), 5, "each refused entry kept: {q:#?}");
    for needle in [
        "../../outside",
        "elsewhere",
        "shm-root",
        "misfiled",
        "nvidia.com/gpu=all",
    ] {
        assert!(q.iter().any(|r| r.contains(needle)), "{needle} kept");
    }
    // The refused entries are out of the fresh checkpoint.
    let cp = RecordsOnDisk::new(f.cfg.checkpoint.clone()).load().unwrap();
    assert_eq!(cp.checkpoint.claims.keys().collect::<Vec<_>>(), ["good"]);
    // And an operator sees them without reading the log: health (status, doctor, metrics)
    // names each, why, and where it is kept.
    let shown = again.health().quarantined_records;
    assert_eq!(shown.len(), 5, "{shown:#?}");
    for (needle, why) in [
        ("\"misfiled\"", "names claim \"good\""),
        ("\"ids\"", "nvidia.com/gpu=all"),
    ] {
        let line = shown
            .iter()
            .find(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("{needle} shown: {shown:#?}"));
        assert!(line.contains(why), "{line}");
        assert!(line.contains("/quarantine/checkpoint-claim-"), "{line}");
    }
}

#[test]
fn hostile_host_records_are_quarantined_alone_and_nothing_outside_is_removed() {
    let f = fixture();
    f.service
        .prepare(&claim("good", &["gpu-0"], Some(mps(50))))
        .unwrap();
    f.service
        .prepare(&claim("tmpl", &["gpu-5"], Some(mps(50))))
        .unwrap();
    let tmpl = f.service.get_claim("tmpl").unwrap();
    f.service.unprepare("tmpl").unwrap();
    let good_pid = mps_pid(&f.service.get_claim("good").unwrap());
    let (group, precious) = outside(&f);
    let claims = f.cfg.run_dir.join("claims");
    let write_record = |dir: &str, info: &ClaimInfo| {
        std::fs::create_dir_all(claims.join(dir)).unwrap();
        std::fs::write(
            claims.join(dir).join("claim.json"),
            serde_json::to_vec(info).unwrap(),
        )
        .unwrap();
    };
    // Being released, with MPS directories elsewhere.
    let mut elsewhere = pointing_at(tmpl.clone(), &group);
    elsewhere.uid = "elsewhere".into();
    elsewhere.state = ClaimState::Unpreparing;
    write_record("elsewhere", &elsewhere);
    // A record naming another directory's claim.
    let mut other = tmpl.clone();
    other.uid = "good".into();
    write_record("impostor", &other);
    // A record that is a link to a good record elsewhere (never followed).
    let mut linked = tmpl.clone();
    linked.uid = "linked".into();
    let target = group.join("linked.json");
    std::fs::write(&target, serde_json::to_vec(&linked).unwrap()).unwrap();
    std::fs::create_dir_all(claims.join("linked")).unwrap();
    symlink(&target, claims.join("linked/claim.json")).unwrap();
    // A fifo (reading it would block the start for ever) and a huge sparse file.
    std::fs::create_dir_all(claims.join("fifo")).unwrap();
    nix::unistd::mkfifo(
        &claims.join("fifo/claim.json"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    std::fs::create_dir_all(claims.join("huge")).unwrap();
    std::fs::File::create(claims.join("huge/claim.json"))
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    // A claim directory that is a link to the outside directory (its MPS group included).
    symlink(group.parent().unwrap(), claims.join("dirlink")).unwrap();
    // No checkpoint: everything comes from the host records.
    RecordsOnDisk::new(f.cfg.checkpoint.clone()).remove();

    let again = restart(&f, fresh_backend());
    assert!(again.health().ready);
    assert!(precious.exists(), "nothing outside removed");
    assert!(group.join("pipe").exists() && target.exists());
    assert_eq!(
        again
            .list_claims()
            .iter()
            .map(|c| c.uid.as_str())
            .collect::<Vec<_>>(),
        ["good"]
    );
    assert_eq!(mps_pid(&again.get_claim("good").unwrap()), good_pid);
    let q = quarantined(&f);
    assert_eq!(q.len(), 5, "each refused record kept: {q:#?}");
    for needle in [
        "elsewhere",
        "impostor",
        "a symbolic link",
        "a fifo",
        "larger than",
    ] {
        assert!(q.iter().any(|r| r.contains(needle)), "{needle} kept");
    }
    // Everything else under the claims directory was ours and no claim's: swept, links
    // removed as links.
    let left: Vec<String> = std::fs::read_dir(&claims)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["good"]);
}

#[test]
fn hostile_tombstones_and_attachments_are_refused() {
    let f = fixture();
    f.service.prepare(&claim("att", &["gpu-6"], None)).unwrap();
    let mut c = f.service.get_claim("att").unwrap();
    c.attached.push(Attachment {
        claim_uid: "att".into(),
        container_id: "c1".into(),
        pid: Some(-1),
        cgroup: None,
        bundle: None,
        attached_at: 0,
        pod: None,
    });
    let file = RecordsOnDisk::new(f.cfg.checkpoint.clone());
    let mut cp = file.load().unwrap().checkpoint;
    cp.claims.insert("att".into(), c);
    cp.tombstones.insert(
        "../x".into(),
        crate::checkpoint::Tombstone {
            generation: 1,
            resource_version: None,
            released_at: now_secs(),
        },
    );
    file.save_v2(&cp).unwrap();
    // The host record is good: it stands in for the refused entry.
    let again = restart(&f, fresh_backend());
    let c = again.get_claim("att").unwrap();
    assert!(c.attached.is_empty(), "rebuilt from the good host record");
    assert_eq!(quarantined(&f).len(), 1);
    let cp = file.load().unwrap().checkpoint;
    assert!(cp.tombstones.is_empty(), "{:?}", cp.tombstones);
}

#[test]
fn what_is_not_a_regular_file_in_the_cdi_directory_is_never_read_or_followed() {
    let f = fixture();
    f.service.prepare(&claim("ok", &["gpu-1"], None)).unwrap();
    let fifo = cdi::spec_path(&f.cfg.cdi_dir, "fifo");
    // Opening a fifo with no writer for reading blocks: the start must not.
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // A link named like one of ours, to a file that looks like ours, elsewhere.
    let elsewhere = f.cfg.run_dir.parent().unwrap().join("spec-elsewhere.json");
    std::fs::write(
        &elsewhere,
        format!(
            r#"{{"args": ["--socket", {:?}]}}"#,
            "/run/gpushare/gpushared.sock"
        ),
    )
    .unwrap();
    let link = cdi::spec_path(&f.cfg.cdi_dir, "link");
    symlink(&elsewhere, &link).unwrap();
    let again = restart(&f, fresh_backend());
    assert!(again.health().ready);
    assert!(
        std::fs::symlink_metadata(&fifo).is_ok(),
        "not provably ours: left"
    );
    assert!(
        std::fs::symlink_metadata(&link).is_ok(),
        "not provably ours: left"
    );
    assert!(elsewhere.exists());
    assert!(Path::new(&again.get_claim("ok").unwrap().cdi_spec).exists());
}

#[test]
fn attachments_survive_a_missing_checkpoint() {
    let f = fixture();
    let short = json!({"sharingMode": "time-slicing", "replicas": 2});
    f.service
        .prepare(&claim("att", &["gpu-1"], Some(short)))
        .unwrap();
    fake_process(&f, "/proc-4242", 4242);
    let a = |id: &str, pid| AttachParams {
        claim_uid: "att".into(),
        container_id: id.into(),
        pid: Some(pid),
        bundle: None,
        pod: None,
    };
    f.service.attach(&a("c1", 4242)).unwrap();
    f.service.attach(&a("c2", 4242)).unwrap();
    f.service
        .detach(&DetachParams {
            claim_uid: "att".into(),
            container_id: "c2".into(),
        })
        .unwrap();
    RecordsOnDisk::new(f.cfg.checkpoint.clone()).remove();
    let again = restart(&f, fresh_backend());
    let c = again.get_claim("att").unwrap();
    let ids: Vec<&str> = c.attached.iter().map(|a| a.container_id.as_str()).collect();
    assert_eq!(ids, ["c1"], "the running container keeps its slot");
}

#[test]
fn a_record_that_conflicts_with_another_claim_is_kept_and_shown_not_dropped() {
    let f = fixture();
    f.service
        .prepare(&claim("on-mps", &["gpu-0"], Some(mps(50))))
        .unwrap();
    f.service
        .prepare(&claim("whole", &["gpu-3"], None))
        .unwrap();
    let uuid = |uid: &str| {
        f.service.get_claim(uid).unwrap().groups[0].devices[0]
            .uuid
            .clone()
    };
    let (u0, u3) = (uuid("on-mps"), uuid("whole"));
    // The exclusive claim's record, copied as another claim's and moved onto gpu-0.
    let text = std::fs::read_to_string(host_record(&f, "whole"))
        .unwrap()
        .replace("whole", "evil")
        .replace(&u3, &u0)
        .replace("gpu-3", "gpu-0")
        .replace("\"minor\":3", "\"minor\":0");
    let dir = f.cfg.run_dir.join("claims/evil");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("claim.json"), text).unwrap();
    let again = restart(&f, fresh_backend());
    assert!(again.get_claim("evil").is_err(), "not re-adopted");
    assert_eq!(
        again.get_claim("on-mps").unwrap().state,
        ClaimState::Prepared
    );
    let shown = again.health().quarantined_records;
    assert!(
        shown
            .iter()
            .any(|l| l.contains("\"evil\"") && l.contains("conflicts with another claim")),
        "{shown:#?}"
    );
    assert!(quarantined(&f).iter().any(|r| r.contains("evil")));
}

/// Break-it finding 17: the prune of the quarantine (at most 256 files, the oldest go first)
/// deleted any file in `<state-dir>/quarantine`, an administrator's notes too. Only files
/// named as the quarantine writes them (`<source>-<secs>-<pid>-<n>.json`) are counted and
/// pruned.
#[test]
fn the_quarantine_prune_removes_only_files_it_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let q = crate::service::persisted::Quarantine::beside(&dir.path().join("cp.json"));
    std::fs::create_dir_all(q.dir()).unwrap();
    let notes: Vec<PathBuf> = (0..270)
        .map(|i| q.dir().join(format!("admin-note-{i}.txt")))
        .chain([
            q.dir().join("host-record-notes.json"),
            q.dir().join("checkpoint-claim-1-2-3.json.bak"),
        ])
        .collect();
    for n in &notes {
        std::fs::write(n, "keep me").unwrap();
    }
    for i in 0..258 {
        q.keep(
            "checkpoint-claim",
            Path::new("/x"),
            &format!("c{i}"),
            None,
            "bad",
        );
    }
    let left: Vec<String> = std::fs::read_dir(q.dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for n in &notes {
        assert!(n.exists(), "{} was not the quarantine's", n.display());
    }
    let ours = left
        .iter()
        .filter(|n| n.starts_with("checkpoint-claim-") && n.ends_with(".json"))
        .count();
    assert_eq!(ours, 256, "the quarantine keeps 256 of its own");
}
