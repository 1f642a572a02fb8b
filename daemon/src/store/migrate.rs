//! The version 2 checkpoint migrated to per-claim records, once, and kept aside.

use std::fs;
use std::io;
use std::time::{SystemTime, UNIX_EPOCH};

use super::record::{ClaimRecord, RECORD_FORMAT};
use super::{Batch, Loaded, Store, StoreMeta, CLAIMS_DIR, TOMBSTONES_DIR};
use crate::checkpoint::CheckpointFile;
use crate::claim::wire::claim_of;

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Store {
    /// Writes every claim and tombstone of a version 2 checkpoint as records, then the store's
    /// own record, then keeps the checkpoint aside.
    pub(super) fn migrate(&self, loaded: &mut Loaded) -> io::Result<()> {
        let v2 = CheckpointFile::new(self.checkpoint.clone()).load()?;
        if let Some(q) = v2.quarantined {
            // Moved aside by its loader; the claims come from the host records.
            loaded.quarantined = Some(q);
            self.write_meta(&StoreMeta {
                format: RECORD_FORMAT,
                ..StoreMeta::default()
            })?;
            return Ok(());
        }
        let cp = v2.checkpoint;
        let mut batch = Batch::default();
        for (key, info) in &cp.claims {
            // Filed under its checkpoint key: a key that is not a safe file name is refused
            // (and quarantined) by the caller, from `loaded.claims`, not written.
            if crate::config::validate_claim_uid(key).is_ok() {
                batch
                    .claims
                    .insert(key.clone(), Some(ClaimRecord::of(&claim_of(info.clone()))));
            }
        }
        for (uid, t) in &cp.tombstones {
            if crate::config::validate_claim_uid(uid).is_ok() {
                batch.tombstones.insert(uid.clone(), Some(t.clone()));
            }
        }
        // Records of the store that the checkpoint no longer has (a downgrade ran in between
        // and released them) go.
        for uid in self.list(CLAIMS_DIR)? {
            batch.claims.entry(uid).or_insert(None);
        }
        for uid in self.list(TOMBSTONES_DIR)? {
            batch.tombstones.entry(uid).or_insert(None);
        }
        self.write(&batch)?;
        self.write_meta(&StoreMeta {
            format: RECORD_FORMAT,
            boot_id: cp.boot_id.clone(),
            generation: cp.generation,
            export: None,
        })?;
        let name = self
            .checkpoint
            .file_name()
            .map_or_else(|| "checkpoint.json".into(), |n| n.to_string_lossy());
        let mut kept = self
            .checkpoint
            .with_file_name(format!("{name}.migrated-{}", now_secs()));
        let mut n = 1;
        while fs::symlink_metadata(&kept).is_ok() {
            kept = self
                .checkpoint
                .with_file_name(format!("{name}.migrated-{}.{n}", now_secs()));
            n += 1;
        }
        fs::rename(&self.checkpoint, &kept)?;
        tracing::warn!(from = %kept.display(), claims = cp.claims.len(), tombstones = cp.tombstones.len(), "migrated a version 2 checkpoint to per-claim records");
        loaded.generation = cp.generation;
        // The attachments of a version 2 checkpoint are in its entries, not in the records.
        for (key, info) in cp.claims {
            loaded.claims.insert(key, claim_of(info));
        }
        loaded.migrated = Some(kept);
        Ok(())
    }
}
