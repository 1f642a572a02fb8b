//! The claims on disk, so that a restarted daemon knows what it holds.
//!
//! Written atomically (temporary file, fsync, rename, fsync of the directory) after every
//! change. Unknown fields from newer versions are ignored on load. A checkpoint that cannot be
//! parsed is moved aside with a timestamp and reported, never a crash loop.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use gpushare_proto::ClaimInfo;

use crate::fsutil;

/// Version of the checkpoint format this build writes.
pub const CHECKPOINT_VERSION: u32 = 1;

/// Checkpoint writes since the process started: (succeeded, failed). Process-wide because a
/// daemon has one checkpoint; read by the metrics endpoint.
static WRITES: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Checkpoint writes since the process started, as (succeeded, failed), for metrics.
pub fn write_counts() -> (u64, u64) {
    (
        WRITES[0].load(Ordering::Relaxed),
        WRITES[1].load(Ordering::Relaxed),
    )
}

/// The checkpoint document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Format version.
    pub version: u32,
    /// Claims by UID, as `get_claim` reports them.
    #[serde(default)]
    pub claims: BTreeMap<String, ClaimInfo>,
}

impl Default for Checkpoint {
    fn default() -> Checkpoint {
        Checkpoint {
            version: CHECKPOINT_VERSION,
            claims: BTreeMap::new(),
        }
    }
}

/// What loading found.
#[derive(Debug)]
pub struct Loaded {
    /// The checkpoint (empty when there was none or it was corrupt).
    pub checkpoint: Checkpoint,
    /// Where a corrupt checkpoint was moved, and why it was refused.
    pub quarantined: Option<(PathBuf, String)>,
}

/// The checkpoint file.
#[derive(Debug, Clone)]
pub struct CheckpointFile {
    path: PathBuf,
}

impl CheckpointFile {
    /// The checkpoint at `path` (`/var/lib/gpushare/checkpoint.json` by default).
    pub fn new(path: PathBuf) -> CheckpointFile {
        CheckpointFile { path }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Loads the checkpoint; a missing file is an empty checkpoint, a corrupt one is moved to
    /// `<path>.corrupt-<unix seconds>` and reported in [`Loaded::quarantined`].
    ///
    /// # Errors
    /// The file exists but cannot be read, or a corrupt one cannot be moved aside.
    pub fn load(&self) -> io::Result<Loaded> {
        let bytes = match fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(Loaded {
                    checkpoint: Checkpoint::default(),
                    quarantined: None,
                })
            }
            Err(e) => return Err(e),
        };
        match serde_json::from_slice::<Checkpoint>(&bytes) {
            Ok(checkpoint) => Ok(Loaded {
                checkpoint,
                quarantined: None,
            }),
            Err(e) => {
                let secs = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let aside = self
                    .path
                    .with_file_name(format!("checkpoint.json.corrupt-{secs}"));
                fs::rename(&self.path, &aside)?;
                Ok(Loaded {
                    checkpoint: Checkpoint::default(),
                    quarantined: Some((aside, e.to_string())),
                })
            }
        }
    }

    /// Writes `checkpoint` atomically (mode 0600).
    ///
    /// # Errors
    /// Any I/O error; the previous checkpoint is then still in place.
    pub fn save(&self, checkpoint: &Checkpoint) -> io::Result<()> {
        if let Some(dir) = self.path.parent() {
            fsutil::create_dir_if_missing(dir, 0o700)?;
        }
        let bytes = serde_json::to_vec_pretty(checkpoint).map_err(io::Error::other)?;
        let written = fsutil::write_atomic(&self.path, &bytes, 0o600);
        WRITES[usize::from(written.is_err())].fetch_add(1, Ordering::Relaxed);
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_is_empty_and_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let f = CheckpointFile::new(dir.path().join("state/checkpoint.json"));
        let loaded = f.load().unwrap();
        assert!(loaded.checkpoint.claims.is_empty());
        f.save(&loaded.checkpoint).unwrap();
        assert_eq!(f.load().unwrap().checkpoint, Checkpoint::default());
    }

    #[test]
    fn unknown_fields_are_tolerated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("checkpoint.json");
        fs::write(
            &p,
            r#"{"version": 2, "claims": {}, "from_the_future": true}"#,
        )
        .unwrap();
        let loaded = CheckpointFile::new(p).load().unwrap();
        assert_eq!(loaded.checkpoint.version, 2);
        assert!(loaded.quarantined.is_none());
    }

    #[test]
    fn corrupt_is_moved_aside_and_reported() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("checkpoint.json");
        fs::write(&p, b"{\"version\": 1, \"claims\": {").unwrap();
        let loaded = CheckpointFile::new(p.clone()).load().unwrap();
        let (aside, why) = loaded.quarantined.unwrap();
        assert!(aside.exists() && !p.exists());
        assert!(aside
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("checkpoint.json.corrupt-"));
        assert!(why.contains("EOF"), "{why}");
        assert!(loaded.checkpoint.claims.is_empty());
    }
}
