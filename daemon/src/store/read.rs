//! Reading the store's files back: its own record, the record directories' listings (with
//! temporaries of interrupted writes removed), the claim records and the tombstones.

use std::fs;
use std::io;

use super::record::{ClaimRecord, TombstoneRecord};
use super::{Loaded, Store, StoreMeta, Unreadable, CLAIMS_DIR, MAX_RECORD_BYTES, TOMBSTONES_DIR};
use crate::fsutil;

impl Store {
    pub(super) fn read_meta(&self) -> Option<StoreMeta> {
        let bytes = fsutil::read_own_file(&self.meta_path(), MAX_RECORD_BYTES).ok()?;
        match serde_json::from_slice(&bytes) {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::error!(path = %self.meta_path().display(), error = %e, "the store's own record is corrupt; its boot ID and generation are taken from the records");
                Some(StoreMeta::default())
            }
        }
    }

    /// UIDs of the records in `sub` (file names `<uid>.json`); temporaries of interrupted
    /// writes are removed.
    pub(super) fn list(&self, sub: &str) -> io::Result<Vec<String>> {
        Ok(self
            .list_typed(sub)?
            .into_iter()
            .map(|(uid, _)| uid)
            .collect())
    }

    /// UIDs whose claim record is on disk as a regular file (`records/<uid>.json`), from one
    /// listing of the directory; nothing is removed (a write under way may have its
    /// temporary there). A missing directory holds none.
    ///
    /// # Errors
    /// The directory cannot be listed.
    pub fn claims_on_disk(&self) -> io::Result<std::collections::BTreeSet<String>> {
        let entries = match fs::read_dir(self.dir.join(CLAIMS_DIR)) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Default::default()),
            Err(e) => return Err(e),
        };
        Ok(entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_suffix(".json").map(str::to_string)
            })
            .collect())
    }

    /// As [`Store::list`], each UID with whether the listing reported a regular file (read
    /// with [`fsutil::read_listed_file`]; any other entry is read with the look first).
    pub(super) fn list_typed(&self, sub: &str) -> io::Result<Vec<(String, bool)>> {
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
                // From the entry's d_type; a listing that lacks it stats the entry (no link is
                // followed), which is as good.
                let regular = entry.file_type().is_ok_and(|t| t.is_file());
                out.push((uid.to_string(), regular));
            }
        }
        out.sort();
        Ok(out)
    }

    pub(super) fn read_claims(&self, loaded: &mut Loaded) -> io::Result<()> {
        let keys: Vec<(String, bool)> = self
            .list_typed(CLAIMS_DIR)?
            .into_iter()
            .filter(|(key, _)| !loaded.claims.contains_key(key))
            .collect();
        let read = crate::parallel::map(&keys, |(key, regular)| {
            let path = self.claim_path(key);
            let read = read_record(&path, *regular).map(|bytes| {
                let parsed = serde_json::from_slice::<ClaimRecord>(&bytes);
                (bytes, parsed)
            });
            (path, read)
        });
        for ((key, _), (path, read)) in keys.into_iter().zip(read) {
            let (bytes, parsed) = match read {
                Ok(read) => read,
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
            // A claim record always says its format (only a host record before format 4 did
            // not): one that does not is not a record this daemon wrote.
            let parsed = parsed.map_err(|e| e.to_string()).and_then(|rec| {
                if rec.format == 0 {
                    Err("it names no record format".to_string())
                } else {
                    Ok(rec)
                }
            });
            match parsed {
                Ok(rec) => {
                    loaded.generation = loaded.generation.max(rec.generation);
                    if rec.format != super::RECORD_FORMAT {
                        loaded.other_format.insert(key.clone());
                    }
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

    pub(super) fn read_tombstones(&self, loaded: &mut Loaded) -> io::Result<()> {
        let uids: Vec<(String, bool)> = self
            .list_typed(TOMBSTONES_DIR)?
            .into_iter()
            .filter(|(uid, _)| crate::config::validate_claim_uid(uid).is_ok())
            .collect();
        let read = crate::parallel::map(&uids, |(uid, regular)| {
            read_record(&self.tombstone_path(uid), *regular)
                .map_err(|e| e.to_string())
                .and_then(|b| {
                    serde_json::from_slice::<TombstoneRecord>(&b).map_err(|e| e.to_string())
                })
        });
        for ((uid, _), parsed) in uids.into_iter().zip(read) {
            let path = self.tombstone_path(&uid);
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
}

/// A record the listing found: one it reported as a regular file is opened at once, anything
/// else is looked at first ([`fsutil::read_own_file`]).
fn read_record(
    path: &std::path::Path,
    listed_regular: bool,
) -> Result<Vec<u8>, fsutil::ReadRefusal> {
    if listed_regular {
        fsutil::read_listed_file(path, MAX_RECORD_BYTES)
    } else {
        fsutil::read_own_file(path, MAX_RECORD_BYTES)
    }
}
