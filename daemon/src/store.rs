//! The claims on disk, one file per claim, so that a change writes only what changed.
//!
//! Layout, under the state directory (`/var/lib/gpushare`):
//!
//! | path | what |
//! |---|---|
//! | `store.json` | the store's own record: format, boot ID of the boot that last started on it, the last generation handed out, and the downgrade export it wrote at its last stop |
//! | `records/<uid>.json` | one claim's [`ClaimRecord`], written atomically (temporary file, fsync, rename, directory fsync) whenever its durable state changes |
//! | `tombstones/<uid>.json` | one released claim's [`TombstoneRecord`] |
//! | `checkpoint.json` | only between a graceful stop and the next start: the whole node in the version 2 format, for a downgrade (see `docs/crash-safety.md`) |
//!
//! Why files and not an embedded database (`docs/crash-safety.md`, "The store"): each record
//! is readable by any tool while gpushared runs (doctor, an operator's `jq`, the crash suite),
//! a corrupt one is a file of its own to quarantine, and nothing is added to the daemon. A
//! change costs one claim's record, not the node's: O(1) in the number of claims.
//!
//! Concurrent changes are written in one batch (`Batch`): every record's file is written and
//! fsynced, renamed, and each directory fsynced once.
//!
//! Here: the store, its load and its durable writes; the values it exchanges are in
//! `store/types.rs`, reading records back in `store/read.rs`, the version 2 migration in
//! `store/migrate.rs`, and the reads and replacements made outside a running daemon (doctor,
//! tests) in `store/offline.rs`.

pub mod leaf;
mod migrate;
mod offline;
mod read;
pub mod record;
mod types;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::checkpoint::{Checkpoint, CheckpointFile};
use crate::fsutil;
pub use record::{ClaimRecord, HostRecord, TombstoneRecord, RECORD_FORMAT};

pub use offline::{replace_with, snapshot};
pub use types::{Batch, FileStamp, Loaded, StoreMeta, Unreadable};

/// Name of the store's own record in the state directory.
pub const STORE_FILE: &str = "store.json";
/// Directory of the claim records in the state directory.
pub const CLAIMS_DIR: &str = "records";
/// Directory of the tombstones in the state directory.
pub const TOMBSTONES_DIR: &str = "tombstones";
/// Largest record read, in bytes (a record is a few KiB).
pub const MAX_RECORD_BYTES: u64 = 4 << 20;

/// The per-claim store in a state directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    /// The version 2 checkpoint path (`<state-dir>/checkpoint.json`): migrated from, and the
    /// downgrade export.
    checkpoint: PathBuf,
}

impl Store {
    /// The store beside `checkpoint` (`<state-dir>/checkpoint.json`, the path the daemon's
    /// configuration names).
    pub fn beside(checkpoint: &Path) -> Store {
        Store {
            dir: checkpoint.parent().unwrap_or(Path::new(".")).to_path_buf(),
            checkpoint: checkpoint.to_path_buf(),
        }
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where claim `uid`'s record lives.
    pub fn claim_path(&self, uid: &str) -> PathBuf {
        self.dir.join(CLAIMS_DIR).join(format!("{uid}.json"))
    }

    fn tombstone_path(&self, uid: &str) -> PathBuf {
        self.dir.join(TOMBSTONES_DIR).join(format!("{uid}.json"))
    }

    fn meta_path(&self) -> PathBuf {
        self.dir.join(STORE_FILE)
    }

    /// Reads the store. A version 2 checkpoint (`checkpoint.json`) that this store did not
    /// export itself is migrated first: every claim and tombstone is written as its own record,
    /// then the file is kept as `checkpoint.json.migrated-<unix seconds>` (a migration cut
    /// short is done again at the next start: it writes the same records). Our own export
    /// of the last stop is removed (the records are the truth). Temporaries of interrupted
    /// writes are removed.
    ///
    /// # Errors
    /// The state directory cannot be read or written.
    pub fn load(&self) -> io::Result<Loaded> {
        let meta = self.read_meta();
        let mut loaded = Loaded::default();
        let v2_present = fs::symlink_metadata(&self.checkpoint).is_ok();
        if v2_present {
            let ours = meta
                .as_ref()
                .and_then(|m| m.export)
                .is_some_and(|stamp| FileStamp::of(&self.checkpoint).ok() == Some(stamp));
            if ours {
                fsutil::remove_file_if_exists(&self.checkpoint)?;
            } else {
                self.migrate(&mut loaded)?;
            }
        } else if meta.is_none() {
            // The checkpoint file's loader also removes temporaries of its interrupted writes.
            let _ = CheckpointFile::new(self.checkpoint.clone()).load();
            loaded.missing = !self.dir.join(CLAIMS_DIR).is_dir();
        }
        let meta = self.read_meta().unwrap_or_default();
        loaded.boot_id = meta.boot_id;
        loaded.generation = loaded.generation.max(meta.generation);
        self.read_claims(&mut loaded)?;
        self.read_tombstones(&mut loaded)?;
        Ok(loaded)
    }

    /// Writes `batch` durably: each record is written to a temporary file, fsynced and renamed
    /// over its file (a removal removes it), then each directory is fsynced once.
    ///
    /// # Errors
    /// Any I/O error (say, a full disk); what was renamed before it may be on disk, what was
    /// not is not, and every record on disk is whole.
    pub fn write(&self, batch: &Batch) -> io::Result<()> {
        crate::crash::point("checkpoint.before_write");
        let result = self.write_inner(batch);
        crate::checkpoint::count_write(result.is_ok());
        result
    }

    fn write_inner(&self, batch: &Batch) -> io::Result<()> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        let mut touch = |sub: &str| -> io::Result<PathBuf> {
            let d = self.dir.join(sub);
            if !dirs.contains(&d) {
                fsutil::create_dir_if_missing(&self.dir, 0o700)?;
                fsutil::create_dir_if_missing(&d, 0o700)?;
                dirs.push(d.clone());
            }
            Ok(d)
        };
        for (uid, rec) in &batch.claims {
            touch(CLAIMS_DIR)?;
            let path = self.claim_path(uid);
            match rec {
                Some(r) => {
                    let bytes = serde_json::to_vec_pretty(r).map_err(io::Error::other)?;
                    fsutil::write_synced(&path, &bytes, 0o600)?;
                }
                None => fsutil::remove_file_if_exists(&path)?,
            }
        }
        for (uid, t) in &batch.tombstones {
            touch(TOMBSTONES_DIR)?;
            let path = self.tombstone_path(uid);
            match t {
                Some(t) => {
                    let rec = TombstoneRecord {
                        format: RECORD_FORMAT,
                        tombstone: t.clone(),
                    };
                    let bytes = serde_json::to_vec_pretty(&rec).map_err(io::Error::other)?;
                    fsutil::write_synced(&path, &bytes, 0o600)?;
                }
                None => fsutil::remove_file_if_exists(&path)?,
            }
        }
        for d in &dirs {
            fsutil::sync_dir(d)?;
        }
        Ok(())
    }

    /// Writes the store's own record durably.
    ///
    /// # Errors
    /// Any I/O error.
    pub fn write_meta(&self, meta: &StoreMeta) -> io::Result<()> {
        fsutil::create_dir_if_missing(&self.dir, 0o700)?;
        let bytes = serde_json::to_vec_pretty(meta).map_err(io::Error::other)?;
        fsutil::write_atomic(&self.meta_path(), &bytes, 0o600)
    }

    /// At a graceful stop: writes the whole node as a version 2 `checkpoint.json` (what a
    /// previous release reads after a downgrade) and records its identity in the store's own
    /// record, so that the next start of this release knows it for its own and removes it.
    ///
    /// # Errors
    /// Any I/O error; the records are unchanged either way.
    pub fn export(&self, cp: &Checkpoint) -> io::Result<()> {
        CheckpointFile::new(self.checkpoint.clone()).save(cp)?;
        let stamp = FileStamp::of(&self.checkpoint)?;
        self.write_meta(&StoreMeta {
            format: RECORD_FORMAT,
            boot_id: cp.boot_id.clone(),
            generation: cp.generation,
            export: Some(stamp),
        })
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
