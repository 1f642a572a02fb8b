//! The MIG intents file is input: an entry that names a claim that is no UID, a claim the
//! records do not know as interrupted, a slice its claim never planned, or a whole instance (a
//! layout's: `gpushare mig apply`, mig-parted, `nvidia-smi -cgi … -C`) destroys nothing at
//! start. Each of these had the instance it named destroyed before intents were checked.

use super::*;

/// Placement starts of `gpu`'s live instances, in order.
fn starts(f: &Fixture, gpu: &str) -> Vec<u32> {
    let mut v: Vec<u32> = instances(f, gpu)
        .iter()
        .map(|i| i.placement.start)
        .collect();
    v.sort_unstable();
    v
}

#[test]
fn an_intent_whose_claim_is_no_uid_destroys_nothing() {
    let f = fixture("p4d.24xlarge", &[3]);
    let whole = make_by_hand(&f, "gpu-3", 19, 4);
    let bare = make_bare(&f, "gpu-3", 19, 5);
    write_intents(
        &f,
        json!([
            intent(&f, "not a uid!", "gpu-3", (19, 4, 1), Some(whole)),
            intent(&f, "../../etc", "gpu-3", (19, 5, 1), Some(bare)),
        ]),
    );
    let _s = start(&f.cfg, &f.host, &f.backend);
    assert_eq!(starts(&f, "gpu-3"), [4, 5], "both kept");
}

#[test]
fn an_intent_of_a_claim_the_records_do_not_know_destroys_nothing() {
    // A valid UID, but no record says a prepare of it was cut short: nothing tells that
    // gpushare made what the intent names.
    let f = fixture("p4d.24xlarge", &[3]);
    let whole = make_by_hand(&f, "gpu-3", 19, 4);
    let bare = make_bare(&f, "gpu-3", 19, 5);
    let unknown = "7d1c9a4e-0b8f-4c3e-9a51-2f6e8d0b4c17";
    write_intents(
        &f,
        json!([
            intent(&f, unknown, "gpu-3", (19, 4, 1), Some(whole)),
            intent(&f, unknown, "gpu-3", (19, 5, 1), Some(bare)),
        ]),
    );
    let _s = start(&f.cfg, &f.host, &f.backend);
    assert_eq!(starts(&f, "gpu-3"), [4, 5], "both kept");
}

#[test]
fn an_intent_of_a_prepared_claim_for_a_slice_it_does_not_record_destroys_nothing() {
    // A prepared claim is not interrupted: only a slice it records at exactly that place
    // (one being made again at start) is its.
    let f = fixture("p4d.24xlarge", &[3]);
    f.service
        .prepare(&claim("held", &["gpu-3-mig-1g5gb-19-0"], None))
        .unwrap();
    let bare = make_bare(&f, "gpu-3", 19, 5);
    write_intents(
        &f,
        json!([intent(&f, "held", "gpu-3", (19, 5, 1), Some(bare))]),
    );
    let s = start(&f.cfg, &f.host, &f.backend);
    assert_eq!(starts(&f, "gpu-3"), [0, 5], "kept");
    assert_eq!(s.get_claim("held").unwrap().state, ClaimState::Prepared);
}

#[test]
fn an_intent_for_a_slice_its_claim_never_planned_destroys_nothing() {
    // The claim's prepare was cut short, but it planned the 1g.5gb at 4 of gpu-3: another
    // GPU, another profile, another placement are not what it was making.
    let f = fixture("p4d.24xlarge", &[2, 3]);
    interrupted(&f, "cut", "gpu-3-mig-1g5gb-19-4", None);
    let other_gpu = make_bare(&f, "gpu-2", 19, 4);
    let other_profile = make_bare(&f, "gpu-3", 14, 4);
    let other_place = make_bare(&f, "gpu-3", 19, 6);
    write_intents(
        &f,
        json!([
            intent(&f, "cut", "gpu-2", (19, 4, 1), Some(other_gpu)),
            intent(&f, "cut", "gpu-3", (14, 4, 2), Some(other_profile)),
            intent(&f, "cut", "gpu-3", (19, 6, 1), Some(other_place)),
        ]),
    );
    let s = start(&f.cfg, &f.host, &f.backend);
    assert!(s.get_claim("cut").is_err(), "rolled back");
    assert_eq!(starts(&f, "gpu-2"), [4], "kept");
    assert_eq!(starts(&f, "gpu-3"), [4, 6], "kept");
}

#[test]
fn an_intent_never_destroys_a_layouts_instance() {
    // A stale intent of a claim whose prepare was cut short, naming exactly the slice it
    // planned and the GI ID of the instance there: that instance is the node's layout's
    // (`gpushare mig apply`, with its compute instance), and a layout's instance is never
    // destroyed on an intent alone.
    let f = fixture("p4d.24xlarge", &[3]);
    let layout = "version: v1\nmig-configs:\n  one:\n    - devices: [3]\n      mig-enabled: true\n      mig-devices: {\"3g.20gb\": 1}\n";
    let applied = f
        .service
        .mig_apply(&MigApplyParams {
            layout: layout.into(),
            config: "one".into(),
            dry_run: false,
        })
        .unwrap();
    let (device, uuid) = applied.gpus[0].create[0].split_once('=').unwrap();
    let live = instances(&f, "gpu-3");
    assert_eq!(live.len(), 1);
    let (gi, start_at) = (live[0].gi_id, live[0].placement.start);
    interrupted(&f, "stale", device, None);
    write_intents(
        &f,
        json!([intent(&f, "stale", "gpu-3", (9, start_at, 4), Some(gi))]),
    );
    let s = start(&f.cfg, &f.host, &f.backend);
    assert!(s.get_claim("stale").is_err(), "rolled back");
    let live = instances(&f, "gpu-3");
    assert_eq!(live.len(), 1, "the layout's instance kept");
    assert_eq!(
        live[0].compute.as_ref().map(|c| c.uuid.as_str()),
        Some(uuid)
    );
}
