//! The MIG intents against what a break-it round did to them: a crash between making a GPU
//! instance and recording it, a crash before the GPU instance was made, a directory or
//! garbage at the intents path, intents of the last boot, two prepares for one static device,
//! and a release stopped between destroying a slice's compute and GPU instance.

use super::*;

fn intents_path(f: &Fixture) -> std::path::PathBuf {
    f.cfg.run_dir.join("mig-intents.json")
}

#[test]
fn a_crashed_prepare_s_gpu_instance_is_destroyed_before_its_claim_is_rolled_back() {
    // What a kill between making the GPU instance and recording it leaves: the claim's
    // record `PrepareStarted` without the slice, the intent marked with the GI ID, the GPU
    // instance without a compute instance. The start destroys it while the record that
    // vouches for the intent is still there, then rolls the claim back.
    let f = fixture("p4d.24xlarge", &[3]);
    interrupted(&f, "cut", "gpu-3-mig-1g5gb-19-4", None);
    let gi = make_bare(&f, "gpu-3", 19, 4);
    write_intents(
        &f,
        json!([intent(&f, "cut", "gpu-3", (19, 4, 1), Some(gi))]),
    );
    let s = start(&f.cfg, &f.host, &f.backend);
    assert!(
        instances(&f, "gpu-3").is_empty(),
        "made by gpushare: destroyed"
    );
    assert!(s.get_claim("cut").is_err(), "rolled back");
    assert!(!intents_path(&f).exists());
    // The placement can be claimed again.
    s.prepare(&claim("next", &["gpu-3-mig-1g5gb-19-4"], None))
        .unwrap();
}

#[test]
fn an_intent_without_its_gi_id_takes_only_a_gpu_instance_without_compute() {
    // A crash after the intent, before the create: whatever an administrator made there
    // since (GPU and compute instance) is theirs; a bare GPU instance is what our create
    // leaves when a crash follows it. The short form (a whole GPU with `migProfile`) plans
    // no placement: any one of the GPU is its.
    let f = fixture("p4d.24xlarge", &[3]);
    interrupted(&f, "a", "gpu-3-mig-1g5gb-19-4", None);
    interrupted(&f, "b", "gpu-3", Some(short_mig("1g.5gb")));
    make_by_hand(&f, "gpu-3", 19, 4);
    make_bare(&f, "gpu-3", 19, 5);
    write_intents(
        &f,
        json!([
            intent(&f, "a", "gpu-3", (19, 4, 1), None),
            intent(&f, "b", "gpu-3", (19, 5, 1), None)
        ]),
    );
    let _s = start(&f.cfg, &f.host, &f.backend);
    let left: Vec<u32> = instances(&f, "gpu-3")
        .iter()
        .map(|i| i.placement.start)
        .collect();
    assert_eq!(
        left,
        [4],
        "the administrator's whole instance kept, the bare one destroyed"
    );
}

#[test]
fn intents_of_the_last_boot_are_not_taken() {
    let f = fixture("p4d.24xlarge", &[3]);
    interrupted(&f, "x", "gpu-3-mig-1g5gb-19-4", None);
    let gi = make_bare(&f, "gpu-3", 19, 4);
    write_intents(&f, json!([intent(&f, "x", "gpu-3", (19, 4, 1), Some(gi))]));
    let mps = MpsControl::new(
        "/usr/bin/nvidia-cuda-mps-control".into(),
        f.host.ops(),
        Duration::from_millis(200),
    );
    // The store remembers the fixture's boot; a start under another boot ID is a reboot.
    let _s = Service::with_boot_id(
        f.cfg.clone(),
        Arc::clone(&f.backend) as Arc<dyn GpuBackend>,
        mps,
        "another-boot".into(),
    )
    .unwrap();
    assert_eq!(instances(&f, "gpu-3").len(), 1, "made since the boot: kept");
}

#[test]
fn a_directory_or_garbage_at_the_intents_path_is_moved_aside_and_prepares_go_on() {
    let f = fixture("p4d.24xlarge", &[3]);
    make_by_hand(&f, "gpu-3", 19, 4);
    std::fs::create_dir_all(intents_path(&f)).unwrap();
    let s = start(&f.cfg, &f.host, &f.backend);
    assert_eq!(instances(&f, "gpu-3").len(), 1, "nothing destroyed");
    assert!(!intents_path(&f).exists(), "moved aside");
    s.prepare(&claim("after", &["gpu-3-mig-3g20gb-9-0"], None))
        .unwrap();
    s.unprepare("after").unwrap();
    drop(s);
    std::fs::write(intents_path(&f), b"not json").unwrap();
    let _s = start(&f.cfg, &f.host, &f.backend);
    let aside = std::fs::read_dir(&f.cfg.run_dir)
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("mig-intents.json.refused-")
        })
        .count();
    assert!(aside >= 1, "kept as evidence");
    assert_eq!(instances(&f, "gpu-3").len(), 1);
}

#[test]
fn a_static_device_a_claim_records_is_not_reserved_for_another() {
    // The loser of a race planned before the winner's record named the device and reserves
    // after the winner struck its intent: the reservation checks the claims as they are now.
    let f = fixture("p4d.24xlarge", &[3]);
    make_by_hand(&f, "gpu-3", 19, 4);
    let target = {
        let claimed = crate::strategy::mig::Claimed::default();
        crate::strategy::mig::resolve(
            f.backend.as_ref(),
            "gpu",
            "gpu-3-mig-1g5gb-19-4",
            None,
            &claimed,
            &[],
        )
        .unwrap()
    };
    assert!(target.existing.is_some());
    f.service
        .prepare(&claim("winner", &["gpu-3-mig-1g5gb-19-4"], None))
        .unwrap();
    let e = f.service.reserve_slice("loser", &target).unwrap_err();
    assert_eq!(e.code, ErrorCode::Conflict, "{e}");
    assert!(e.message.contains("winner"), "{e}");
    f.service.unprepare("winner").unwrap();
    assert_eq!(instances(&f, "gpu-3").len(), 1, "left as it is");
}

#[test]
fn a_release_that_stops_between_compute_and_gpu_instance_finishes_at_the_next_start() {
    // The compute instance is destroyed, then the GPU instance's destroy fails: the record
    // on disk says the destroy had begun (written before the compute instance went), so the
    // next start's release takes the GPU instance left without it for the claim's own. (A
    // kill in between is the crash suite's `unprepare.mig_compute_destroyed`.)
    let f = fixture("p4d.24xlarge", &[3]);
    f.service
        .prepare(&claim("c", &["gpu-3-mig-1g5gb-19-4"], None))
        .unwrap();
    let made = f.service.get_claim("c").unwrap().groups[0].mig[0].clone();
    f.backend.inject(SimFault::DestroyGpuInstance);
    assert!(f.service.unprepare("c").is_err());
    let on_disk = RecordsOnDisk::new(f.cfg.checkpoint.clone())
        .load()
        .unwrap()
        .checkpoint;
    let rec = &on_disk.claims["c"].groups[0].mig[0];
    assert!(
        rec.destroying,
        "on disk before the compute instance's destroy"
    );
    assert_eq!(
        (rec.ci_id, &rec.uuid),
        (made.ci_id, &made.uuid),
        "the compute instance it names stays recorded"
    );
    let live = instances(&f, "gpu-3");
    assert!(live.len() == 1 && live[0].compute.is_none(), "{live:?}");
    let restarted = start(&f.cfg, &f.host, &f.backend);
    assert!(instances(&f, "gpu-3").is_empty(), "released at start");
    assert!(restarted.get_claim("c").is_err());
}

#[test]
fn a_prepared_record_marked_as_being_destroyed_is_refused_and_destroys_no_bare_instance() {
    // Only a release marks a slice `destroying` (the claim `Unpreparing` on disk first), and
    // a record so marked matches a GPU instance without a compute instance. A `Prepared`
    // record carrying the mark (forged, corrupt) made the start take an administrator's bare
    // GPU instance at its GI ID and placement for its own slice half made, destroy it and
    // make the slice again.
    let f = fixture("p4d.24xlarge", &[3]);
    f.service
        .prepare(&claim("forged", &["gpu-3-mig-1g5gb-19-4"], None))
        .unwrap();
    let made = f.service.get_claim("forged").unwrap().groups[0].mig[0].clone();
    let uuid = uuid_of(&f, "gpu-3");
    // The slice vanishes while gpushared is away, and an administrator makes a bare GPU
    // instance at its placement (`nvidia-smi mig -cgi` without `-C`): the driver hands out the
    // same GI ID.
    f.backend
        .destroy_compute_instance(&uuid, made.gi_id, made.ci_id.unwrap())
        .unwrap();
    f.backend.destroy_gpu_instance(&uuid, made.gi_id).unwrap();
    let bare = make_bare(&f, "gpu-3", 19, 4);
    assert_eq!(bare, made.gi_id, "the precondition: the GI ID reused");
    let file = RecordsOnDisk::new(f.cfg.checkpoint.clone());
    let mut cp = file.load().unwrap().checkpoint;
    let r = cp.claims.get_mut("forged").unwrap();
    assert_eq!(r.state, ClaimState::Prepared);
    r.groups[0].mig[0].destroying = true;
    file.save(&cp).unwrap();
    // Its host record says the same (else the claim is rebuilt from that one).
    let host = f.cfg.run_dir.join("claims/forged/claim.json");
    let mut v: Value = serde_json::from_slice(&std::fs::read(&host).unwrap()).unwrap();
    v["groups"][0]["mig"][0]["destroying"] = json!(true);
    std::fs::write(&host, serde_json::to_vec(&v).unwrap()).unwrap();

    let s = start(&f.cfg, &f.host, &f.backend);
    let live = instances(&f, "gpu-3");
    assert!(
        live.len() == 1 && live[0].gi_id == bare && live[0].compute.is_none(),
        "the bare instance is kept as it is: {live:?}"
    );
    assert!(s.get_claim("forged").is_err(), "refused");
    let shown = s.health().quarantined_records;
    assert!(
        shown
            .iter()
            .any(|l| l.contains("\"forged\"") && l.contains("destroy")),
        "refused and shown with why: {shown:#?}"
    );
}

#[test]
fn a_slice_recreation_cut_short_is_found_half_made_and_made_again() {
    // What a kill between the recreated slice's GPU and compute instance leaves: the record,
    // Prepared, naming the new GPU instance without a compute instance, and still the MIG
    // UUID its CDI IDs name. It must be re-adopted (not refused) and made whole again.
    let f = fixture("p4d.24xlarge", &[3]);
    f.service
        .prepare(&claim("r", &["gpu-3-mig-1g5gb-19-5"], None))
        .unwrap();
    let old = f.service.get_claim("r").unwrap().groups[0].mig[0].clone();
    let uuid = uuid_of(&f, "gpu-3");
    f.backend
        .destroy_compute_instance(&uuid, old.gi_id, old.ci_id.unwrap())
        .unwrap();
    f.backend.destroy_gpu_instance(&uuid, old.gi_id).unwrap();
    let gi = f
        .backend
        .create_gpu_instance(&uuid, crate::mig::GiProfileId(19), 5)
        .unwrap();
    let file = RecordsOnDisk::new(f.cfg.checkpoint.clone());
    let mut cp = file.load().unwrap().checkpoint;
    let r = cp.claims.get_mut("r").unwrap();
    // The driver's device of the slice, as a node with the toolkit's spec hands it out.
    r.requests[0]
        .cdi_device_ids
        .insert(0, format!("gpushare.io/gpu={}", old.uuid));
    let m = &mut r.groups[0].mig[0];
    m.gi_id = gi;
    m.ci_id = None;
    file.save(&cp).unwrap();
    let restarted = start(&f.cfg, &f.host, &f.backend);
    assert!(restarted.health().quarantined_records.is_empty());
    let c = restarted.get_claim("r").unwrap();
    assert_eq!(c.state, ClaimState::Prepared, "{:?}", c.last_error);
    let live = instances(&f, "gpu-3");
    assert_eq!(live.len(), 1);
    assert!(live[0].compute.is_some(), "made whole again: {live:?}");
    restarted.unprepare("r").unwrap();
    assert!(instances(&f, "gpu-3").is_empty());
}
