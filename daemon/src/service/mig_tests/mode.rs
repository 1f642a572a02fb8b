//! MIG mode after the last MIG claim: gpushare turns it off again where it turned it on for
//! a claim (Hopper: no reset needed), carried by every claim's slice on that GPU; never on
//! Ampere, never where `gpushare mig apply` set it, never under instances others made.

use super::*;

fn mode_on(f: &Fixture, gpu: &str) -> bool {
    f.backend.mig_mode(&uuid_of(f, gpu)).unwrap().current
}

#[test]
fn mig_mode_gpushare_turned_on_goes_off_after_the_last_claim_it_carries() {
    let f = fixture("p5.48xlarge", &[]);
    assert!(!mode_on(&f, "gpu-3"));
    f.service
        .prepare(&claim("a", &["gpu-3-mig-3g40gb-9-0"], None))
        .unwrap();
    assert!(mode_on(&f, "gpu-3"), "enabled for the claim");
    assert!(f.service.get_claim("a").unwrap().groups[0].mig[0].enabled_mig_mode);
    // A second claim on the GPU carries the flag over.
    f.service
        .prepare(&claim("b", &["gpu-3"], Some(short_mig("1g.10gb"))))
        .unwrap();
    assert!(f.service.get_claim("b").unwrap().groups[0].mig[0].enabled_mig_mode);
    f.service.unprepare("a").unwrap();
    assert!(mode_on(&f, "gpu-3"), "b still has a slice there");
    // The flag is on disk: a restart in between keeps it.
    let restarted = start(&f.cfg, &f.host, &f.backend);
    restarted.unprepare("b").unwrap();
    assert!(!mode_on(&f, "gpu-3"), "off after the last one");
    assert!(instances(&f, "gpu-3").is_empty());
}

#[test]
fn mig_mode_stays_on_where_a_layout_set_it_or_others_made_instances() {
    let f = fixture("p5.48xlarge", &[]);
    // Set by `gpushare mig apply` (gpu-0 and gpu-1): a claim there does not carry the flag.
    apply(&f, "balanced", false).unwrap();
    let before = instances(&f, "gpu-1");
    f.service
        .prepare(&claim("l", &["gpu-1"], Some(short_mig("1g.10gb"))))
        .unwrap();
    assert!(!f.service.get_claim("l").unwrap().groups[0].mig[0].enabled_mig_mode);
    f.service.unprepare("l").unwrap();
    assert!(mode_on(&f, "gpu-1"), "the layout's mode stays");
    assert_eq!(instances(&f, "gpu-1"), before);

    // Turned on for a claim, but someone made an instance beside it meanwhile: kept on.
    f.service
        .prepare(&claim("c", &["gpu-4-mig-3g40gb-9-0"], None))
        .unwrap();
    make_by_hand(&f, "gpu-4", 19, 6);
    f.service.unprepare("c").unwrap();
    assert!(mode_on(&f, "gpu-4"));
    assert_eq!(instances(&f, "gpu-4").len(), 1, "the other's instance kept");
}

#[test]
fn ampere_mig_mode_is_never_turned_off() {
    // MIG on at node setup (set, then reset): a claim's slice does not carry the flag, and
    // leaving would need a reset anyway.
    let f = fixture("p4d.24xlarge", &[2]);
    f.service
        .prepare(&claim("amp", &["gpu-2-mig-3g20gb-9-4"], None))
        .unwrap();
    assert!(!f.service.get_claim("amp").unwrap().groups[0].mig[0].enabled_mig_mode);
    f.service.unprepare("amp").unwrap();
    assert!(mode_on(&f, "gpu-2"));
}

#[test]
fn concurrent_first_claims_all_carry_the_flag_and_the_last_release_turns_mig_mode_off() {
    // Seven prepares at once on a GPU with MIG mode off: one of them turns it on, the others
    // find it on when they make their slices; every slice carries the flag (break-it finding:
    // only the one that flipped it did, so the mode stayed on unless it was released last).
    let f = Arc::new(fixture("p5.48xlarge", &[]));
    let threads: Vec<_> = (0..7)
        .map(|i| {
            let f = Arc::clone(&f);
            std::thread::spawn(move || {
                f.service
                    .prepare(&claim(
                        &format!("h-{i}"),
                        &["gpu-6"],
                        Some(short_mig("1g.10gb")),
                    ))
                    .unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(mode_on(&f, "gpu-6"));
    for i in 0..7 {
        let c = f.service.get_claim(&format!("h-{i}")).unwrap();
        assert!(c.groups[0].mig[0].enabled_mig_mode, "h-{i}");
    }
    for i in 0..7 {
        f.service.unprepare(&format!("h-{i}")).unwrap();
    }
    assert!(
        !mode_on(&f, "gpu-6"),
        "off after the last, whatever the order"
    );
}

#[test]
fn mig_mode_a_crashed_prepare_turned_on_goes_off_at_the_next_start() {
    // What a crash after the GPU instance was made leaves: the instance, MIG mode on, the
    // intent marked with the GI ID and the flag, the claim's record `PrepareStarted` without
    // the slice.
    let f = fixture("p5.48xlarge", &[]);
    interrupted(&f, "crashed", "gpu-7", Some(short_mig("1g.10gb")));
    let uuid = uuid_of(&f, "gpu-7");
    assert!(mode_on(&f, "gpu-7"));
    let gi = make_bare(&f, "gpu-7", 19, 0);
    let mut x = intent(&f, "crashed", "gpu-7", (19, 0, 1), Some(gi));
    x["enabled_mig_mode"] = json!(true);
    write_intents(&f, json!([x]));
    assert_eq!(x["gpu_uuid"], uuid.as_str());
    let _s = start(&f.cfg, &f.host, &f.backend);
    assert!(instances(&f, "gpu-7").is_empty());
    assert!(!mode_on(&f, "gpu-7"), "turned off again");
}

#[test]
fn mig_mode_turned_on_for_a_slice_that_could_not_be_made_goes_off_with_the_failed_prepare() {
    // MIG mode was turned on, then the GPU instance could not be made: nothing recorded a
    // slice carrying the flag, so the rollback left the mode on for good.
    let f = fixture("p5.48xlarge", &[]);
    f.backend.inject(SimFault::CreateGpuInstance);
    let e = f
        .service
        .prepare(&claim("x", &["gpu-3-mig-3g40gb-9-0"], None))
        .unwrap_err();
    assert!(e.message.contains("injected"), "{e}");
    assert!(!mode_on(&f, "gpu-3"), "as the failed prepare found it");
    assert_clean(&f, "x");
    // The retry turns it on again, the release off.
    f.service
        .prepare(&claim("x", &["gpu-3-mig-3g40gb-9-0"], None))
        .unwrap();
    assert!(mode_on(&f, "gpu-3"));
    f.service.unprepare("x").unwrap();
    assert!(!mode_on(&f, "gpu-3"));
}
