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

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::checkpoint::{Checkpoint, CheckpointFile, Tombstone};
use crate::claim::{ClaimRecord, TombstoneRecord, RECORD_FORMAT};
use crate::fsutil;

/// Name of the store's own record in the state directory.
pub const STORE_FILE: &str = "store.json";
/// Directory of the claim records in the state directory.
pub const CLAIMS_DIR: &str = "records";
/// Directory of the tombstones in the state directory.
pub const TOMBSTONES_DIR: &str = "tombstones";
/// Largest record read, in bytes (a record is a few KiB).
pub const MAX_RECORD_BYTES: u64 = 4 << 20;

/// The store's own record (`store.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreMeta {
    /// [`RECORD_FORMAT`] of the build that wrote it.
    pub format: u32,
    /// Boot ID of the boot gpushared last started in.
    #[serde(default)]
    pub boot_id: String,
    /// Last generation handed out when this was written; the records' own are newer.
    #[serde(default)]
    pub generation: u64,
    /// The `checkpoint.json` this store wrote at its last graceful stop, to tell it from one
    /// a previous release wrote after a downgrade.
    #[serde(default)]
    pub export: Option<FileStamp>,
}

/// Identity of a file as written: device, inode, size and modification time. A rewrite by
/// another program (atomic: a new inode) never matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

impl FileStamp {
    fn of(path: &Path) -> io::Result<FileStamp> {
        let m = fs::symlink_metadata(path)?;
        Ok(FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        })
    }
}

/// A record file that could not be read as a record: kept as evidence by the caller.
#[derive(Debug)]
pub struct Unreadable {
    /// The file.
    pub path: PathBuf,
    /// Its bytes, when they could be read.
    pub bytes: Option<Vec<u8>>,
    /// Why it was refused.
    pub why: String,
}

/// What [`Store::load`] found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Boot ID recorded by the last start (empty when unknown).
    pub boot_id: String,
    /// Highest generation recorded anywhere in the store.
    pub generation: u64,
    /// Claims by the name of their file, as read (attachments only from a version 2
    /// checkpoint, which had them).
    pub claims: BTreeMap<String, gpushare_proto::ClaimInfo>,
    /// Tombstones by claim UID.
    pub tombstones: BTreeMap<String, Tombstone>,
    /// Record files that are not records (not JSON, wrong shape, not a regular file): the
    /// files are left in place for the caller to quarantine and remove.
    pub unreadable: Vec<Unreadable>,
    /// Neither a store nor a checkpoint was there: a new node or a lost state directory, which
    /// is not the same as a node without claims (the host records are looked at).
    pub missing: bool,
    /// A version 2 checkpoint that was corrupt at migration: where it went, and why.
    pub quarantined: Option<(PathBuf, String)>,
    /// A version 2 checkpoint was migrated: where the original was kept.
    pub migrated: Option<PathBuf>,
}

/// The changes of one durable write: records to write (`Some`) or remove (`None`).
#[derive(Debug, Default, Clone)]
pub struct Batch {
    /// Claim records by UID.
    pub claims: BTreeMap<String, Option<ClaimRecord>>,
    /// Tombstones by claim UID.
    pub tombstones: BTreeMap<String, Option<Tombstone>>,
}

impl Batch {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.claims.is_empty() && self.tombstones.is_empty()
    }

    /// Adds `other`'s changes where this batch has none for the same key (this one is newer).
    pub fn merge_older(&mut self, other: Batch) {
        for (k, v) in other.claims {
            self.claims.entry(k).or_insert(v);
        }
        for (k, v) in other.tombstones {
            self.tombstones.entry(k).or_insert(v);
        }
    }
}

/// The per-claim store in a state directory.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
    /// The version 2 checkpoint path (`<state-dir>/checkpoint.json`): migrated from, and the
    /// downgrade export.
    checkpoint: PathBuf,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
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

    fn read_meta(&self) -> Option<StoreMeta> {
        let bytes = fsutil::read_own_file(&self.meta_path(), MAX_RECORD_BYTES).ok()?;
        match serde_json::from_slice(&bytes) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::error!(path = %self.meta_path().display(), error = %e, "the store's own record is corrupt; its boot ID and generation are taken from the records");
                Some(StoreMeta::default())
            }
        }
    }

    /// Writes every claim and tombstone of a version 2 checkpoint as records, then the store's
    /// own record, then keeps the checkpoint aside.
    fn migrate(&self, loaded: &mut Loaded) -> io::Result<()> {
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
                    .insert(key.clone(), Some(ClaimRecord::of(info)));
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
            loaded.claims.insert(key, info);
        }
        loaded.migrated = Some(kept);
        Ok(())
    }

    /// UIDs of the records in `sub` (file names `<uid>.json`); temporaries of interrupted
    /// writes are removed.
    fn list(&self, sub: &str) -> io::Result<Vec<String>> {
        let dir = self.dir.join(sub);
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.contains(".tmp-") {
                tracing::info!(path = %entry.path().display(), "removing a temporary file of an interrupted record write");
                let _ = fsutil::remove_file_if_exists(&entry.path());
                continue;
            }
            if let Some(uid) = name.strip_suffix(".json") {
                out.push(uid.to_string());
            }
        }
        out.sort();
        Ok(out)
    }

    fn read_claims(&self, loaded: &mut Loaded) -> io::Result<()> {
        for key in self.list(CLAIMS_DIR)? {
            if loaded.claims.contains_key(&key) {
                continue;
            }
            let path = self.claim_path(&key);
            let read = fsutil::read_own_file(&path, MAX_RECORD_BYTES);
            let bytes = match read {
                Ok(b) => b,
                Err(fsutil::ReadRefusal::Missing) => continue,
                Err(why) => {
                    loaded.unreadable.push(Unreadable {
                        path,
                        bytes: None,
                        why: why.to_string(),
                    });
                    continue;
                }
            };
            match serde_json::from_slice::<ClaimRecord>(&bytes) {
                Ok(rec) => {
                    loaded.generation = loaded.generation.max(rec.generation);
                    loaded.claims.insert(key, rec.into_claim(String::new()));
                }
                Err(e) => loaded.unreadable.push(Unreadable {
                    path,
                    bytes: Some(bytes),
                    why: format!("not a claim record: {e}"),
                }),
            }
        }
        Ok(())
    }

    fn read_tombstones(&self, loaded: &mut Loaded) -> io::Result<()> {
        for uid in self.list(TOMBSTONES_DIR)? {
            if crate::config::validate_claim_uid(&uid).is_err() {
                continue;
            }
            let path = self.tombstone_path(&uid);
            let parsed = fsutil::read_own_file(&path, MAX_RECORD_BYTES)
                .map_err(|e| e.to_string())
                .and_then(|b| {
                    serde_json::from_slice::<TombstoneRecord>(&b).map_err(|e| e.to_string())
                });
            match parsed {
                Ok(t) => {
                    loaded.generation = loaded.generation.max(t.tombstone.generation);
                    loaded.tombstones.insert(uid, t.tombstone);
                }
                Err(why) => {
                    // A tombstone only ever refuses a late prepare; a broken one is dropped.
                    tracing::error!(path = %path.display(), reason = %why, "removing an unreadable tombstone");
                    let _ = fsutil::remove_file_if_exists(&path);
                }
            }
        }
        Ok(())
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
                        .insert(uid.to_string(), r.into_claim(String::new()));
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
        batch.claims.insert(k.clone(), Some(ClaimRecord::of(c)));
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

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
