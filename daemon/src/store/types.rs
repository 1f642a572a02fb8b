//! The values the store exchanges: its own record ([`StoreMeta`], with the [`FileStamp`] of
//! its downgrade export), what a load found ([`Loaded`], [`Unreadable`]), and the changes of one
//! durable write ([`Batch`]).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::record::ClaimRecord;
use crate::checkpoint::Tombstone;

/// The store's own record (`store.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreMeta {
    /// [`RECORD_FORMAT`](super::RECORD_FORMAT) of the build that wrote it.
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
    pub(super) fn of(path: &Path) -> io::Result<FileStamp> {
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

/// What [`Store::load`](super::Store::load) found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Boot ID recorded by the last start (empty when unknown).
    pub boot_id: String,
    /// Highest generation recorded anywhere in the store.
    pub generation: u64,
    /// Claims by the name of their file, as read (attachments only from a version 2
    /// checkpoint, which had them).
    pub claims: BTreeMap<String, crate::claim::Claim>,
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
    /// Claims whose record was written in another format than this build's
    /// ([`RECORD_FORMAT`](super::RECORD_FORMAT)): the start writes them again, so that
    /// the store holds this build's format without a stop rewriting every record.
    pub other_format: std::collections::BTreeSet<String>,
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
