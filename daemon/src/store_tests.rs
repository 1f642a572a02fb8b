//! Unit tests of `store.rs`.

use super::ClaimRecord;
use super::*;
use crate::checkpoint::Tombstone;

fn fixture(root: &Path) -> String {
    include_str!("../tests/fixtures/checkpoint-v2.json")
        .replace("@ROOT@", &root.display().to_string())
}

#[test]
fn a_version_2_checkpoint_is_migrated_once_with_every_claim_and_tombstone() {
    let dir = tempfile::tempdir().unwrap();
    let cp = dir.path().join("state/checkpoint.json");
    fs::create_dir_all(cp.parent().unwrap()).unwrap();
    fs::write(&cp, fixture(dir.path())).unwrap();
    let store = Store::beside(&cp);
    let loaded = store.load().unwrap();
    assert_eq!(loaded.claims.len(), 6);
    assert_eq!(loaded.tombstones.len(), 1);
    assert_eq!(loaded.generation, 8);
    assert_eq!(loaded.boot_id, "aaaf8f0d-50a8-4985-849f-43abe17a7a7b");
    let kept = loaded.migrated.expect("migrated");
    assert!(kept.exists() && !cp.exists(), "kept aside, not read again");
    let pids: Vec<i32> = loaded
        .claims
        .values()
        .flat_map(|c| c.mps_daemons())
        .map(|m| m.control_daemon_pid)
        .collect();
    assert_eq!(pids.len(), 3);
    // The records on disk hold the same, without the containers.
    let (again, problems) = snapshot(&dir.path().join("state"));
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(again.claims.len(), 6);
    assert_eq!(again.tombstones.len(), 1);
    let second = store.load().unwrap();
    assert!(second.migrated.is_none() && !second.missing);
    assert_eq!(second.claims.len(), 6);
    assert!(second.claims.values().all(|c| c.attached.is_empty()));
}

#[test]
fn our_own_export_is_removed_and_a_rewritten_one_is_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let cp_path = dir.path().join("checkpoint.json");
    let store = Store::beside(&cp_path);
    fs::write(&cp_path, fixture(dir.path())).unwrap();
    let loaded = store.load().unwrap();
    let mut cp = Checkpoint {
        generation: loaded.generation,
        claims: loaded
            .claims
            .values()
            .map(|c| (c.uid.clone(), crate::claim::wire::claim_info(c)))
            .collect(),
        tombstones: loaded.tombstones.clone(),
        ..Checkpoint::default()
    };
    store.export(&cp).unwrap();
    let again = store.load().unwrap();
    assert!(again.migrated.is_none(), "our own export is not migrated");
    assert!(!cp_path.exists(), "and it is gone");
    // A previous release (after a downgrade) released a claim and wrote its checkpoint.
    store.export(&cp).unwrap();
    cp.claims.remove("1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d");
    CheckpointFile::new(cp_path.clone()).save(&cp).unwrap();
    let after = store.load().unwrap();
    assert!(after.migrated.is_some());
    assert_eq!(after.claims.len(), 5);
    assert!(!store
        .claim_path("1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d")
        .exists());
}

#[test]
fn an_unreadable_record_is_reported_alone() {
    let dir = tempfile::tempdir().unwrap();
    let cp_path = dir.path().join("checkpoint.json");
    fs::write(&cp_path, fixture(dir.path())).unwrap();
    let store = Store::beside(&cp_path);
    store.load().unwrap();
    let bad = store.claim_path("9c1d2e3f-4a5b-4c6d-8e7f-0a1b2c3d4e5f");
    fs::write(&bad, b"{\"format\": 3, \"uid\": ").unwrap();
    fs::write(dir.path().join("records/.x.json.tmp-1-0"), b"{").unwrap();
    let loaded = store.load().unwrap();
    assert_eq!(loaded.claims.len(), 5);
    assert_eq!(loaded.unreadable.len(), 1);
    assert_eq!(loaded.unreadable[0].path, bad);
    assert!(!dir.path().join("records/.x.json.tmp-1-0").exists());
}

#[test]
fn a_batch_writes_and_removes_only_its_records() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::beside(&dir.path().join("checkpoint.json"));
    let loaded = store.load().unwrap();
    assert!(loaded.missing);
    let mut b = Batch::default();
    let info: gpushare_proto::ClaimInfo = serde_json::from_value(
        serde_json::from_str::<serde_json::Value>(&fixture(dir.path())).unwrap()["claims"]
            ["1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"]
            .clone(),
    )
    .unwrap();
    b.claims.insert(
        info.uid.clone(),
        Some(ClaimRecord::of(&crate::claim::wire::claim_of(info.clone()))),
    );
    store.write(&b).unwrap();
    assert_eq!(store.load().unwrap().claims.len(), 1);
    let mut b = Batch::default();
    b.claims.insert(info.uid.clone(), None);
    b.tombstones.insert(
        info.uid.clone(),
        Some(Tombstone {
            generation: 9,
            resource_version: None,
            released_at: 1,
        }),
    );
    store.write(&b).unwrap();
    let l = store.load().unwrap();
    assert!(l.claims.is_empty());
    assert_eq!(l.tombstones.len(), 1);
    assert_eq!(l.generation, 9);
}

/// Review finding (issue 28): a claim record without a format (the host record's shape before
/// format 4 made `format` optional to read) is not one this daemon wrote: refused, not read
/// as format 0.
#[test]
fn a_claim_record_without_a_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::beside(&dir.path().join("checkpoint.json"));
    let info: gpushare_proto::ClaimInfo = serde_json::from_value(
        serde_json::from_str::<serde_json::Value>(&fixture(dir.path())).unwrap()["claims"]
            ["1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"]
            .clone(),
    )
    .unwrap();
    let mut b = Batch::default();
    let uid = info.uid.clone();
    b.claims.insert(
        uid.clone(),
        Some(ClaimRecord::of(&crate::claim::wire::claim_of(info))),
    );
    store.write(&b).unwrap();
    assert_eq!(store.load().unwrap().claims.len(), 1);
    let path = store.claim_path(&uid);
    let mut v: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("format");
    fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
    let loaded = store.load().unwrap();
    assert!(loaded.claims.is_empty());
    assert_eq!(loaded.unreadable.len(), 1);
    assert!(
        loaded.unreadable[0].why.contains("names no record format"),
        "{}",
        loaded.unreadable[0].why
    );
}
