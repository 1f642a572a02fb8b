//! The store read and replaced outside a running daemon: a snapshot that changes nothing (for
//! `gpushare doctor` and tests), and a replacement (tests: what the records say before a start).

use std::fs;
use std::io;
use std::path::Path;

use super::record::{ClaimRecord, TombstoneRecord, RECORD_FORMAT};
use super::{Batch, Store, CLAIMS_DIR, MAX_RECORD_BYTES, TOMBSTONES_DIR};
use crate::checkpoint::Checkpoint;
use crate::claim::wire::{claim_info, claim_of};
use crate::fsutil;

/// Every claim and tombstone of the store in `state_dir`, as one [`Checkpoint`], read without
/// changing anything (for `gpushare doctor` and tests; unreadable records are left out and
/// listed in the second value).
pub fn snapshot(state_dir: &Path) -> (Checkpoint, Vec<String>) {
    let store = Store::beside(&state_dir.join("checkpoint.json"));
    let mut cp = Checkpoint::default();
    let mut problems = Vec::new();
    if let Some(m) = store.read_meta() {
        cp.boot_id = m.boot_id;
        cp.generation = m.generation;
    }
    let dir = state_dir.join(CLAIMS_DIR);
    if let Ok(entries) = fs::read_dir(&dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(uid) = name
                .strip_suffix(".json")
                .filter(|_| !name.starts_with('.'))
            else {
                continue;
            };
            let parsed = fsutil::read_own_file(&e.path(), MAX_RECORD_BYTES)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<ClaimRecord>(&b).map_err(|e| e.to_string()));
            match parsed {
                Ok(r) => {
                    cp.generation = cp.generation.max(r.generation);
                    cp.claims
                        .insert(uid.to_string(), claim_info(&r.into_claim(String::new())));
                }
                Err(why) => problems.push(format!("{}: {why}", e.path().display())),
            }
        }
    }
    let dir = state_dir.join(TOMBSTONES_DIR);
    if let Ok(entries) = fs::read_dir(&dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(uid) = name
                .strip_suffix(".json")
                .filter(|_| !name.starts_with('.'))
            else {
                continue;
            };
            if let Ok(t) = fsutil::read_own_file(&e.path(), MAX_RECORD_BYTES)
                .map_err(|e| e.to_string())
                .and_then(|b| {
                    serde_json::from_slice::<TombstoneRecord>(&b).map_err(|e| e.to_string())
                })
            {
                cp.tombstones.insert(uid.to_string(), t.tombstone);
            }
        }
    }
    (cp, problems)
}

/// Replaces the store in `state_dir` with `cp`'s claims and tombstones (tests: what a record
/// on disk says before a start).
///
/// # Errors
/// Any I/O error.
pub fn replace_with(state_dir: &Path, cp: &Checkpoint) -> io::Result<()> {
    let store = Store::beside(&state_dir.join("checkpoint.json"));
    let mut batch = Batch::default();
    for uid in store.list(CLAIMS_DIR)? {
        batch.claims.insert(uid, None);
    }
    for uid in store.list(TOMBSTONES_DIR)? {
        batch.tombstones.insert(uid, None);
    }
    for (k, c) in &cp.claims {
        batch
            .claims
            .insert(k.clone(), Some(ClaimRecord::of(&claim_of(c.clone()))));
    }
    for (k, t) in &cp.tombstones {
        batch.tombstones.insert(k.clone(), Some(t.clone()));
    }
    store.write(&batch)?;
    let mut meta = store.read_meta().unwrap_or_default();
    meta.format = RECORD_FORMAT;
    meta.generation = cp.generation;
    if !cp.boot_id.is_empty() {
        meta.boot_id = cp.boot_id.clone();
    }
    store.write_meta(&meta)
}
