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

/// Version of the checkpoint format this build writes. Version 1 (no boot ID, generations or
/// tombstones) is read as version 2 with those empty.
pub const CHECKPOINT_VERSION: u32 = 2;

/// How long a tombstone is kept: far longer than any kubelet retry of a prepare that was in
/// flight when its claim was released.
pub const TOMBSTONE_TTL_SECS: u64 = 24 * 3600;

/// Most tombstones kept (the oldest go first), so that churn cannot grow the file without
/// bound.
pub const MAX_TOMBSTONES: usize = 4096;

/// Checkpoint writes since the process started: (succeeded, failed). Process-wide because a
/// daemon has one checkpoint; read by the metrics endpoint.
static WRITES: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// Counts one durable write of the store (a record batch) for [`write_counts`].
pub(crate) fn count_write(ok: bool) {
    WRITES[usize::from(!ok)].fetch_add(1, Ordering::Relaxed);
}

/// Checkpoint writes since the process started, as (succeeded, failed), for metrics.
pub fn write_counts() -> (u64, u64) {
    (
        WRITES[0].load(Ordering::Relaxed),
        WRITES[1].load(Ordering::Relaxed),
    )
}

/// The checkpoint document.
///
/// Each claim record ([`ClaimInfo`]) holds its state (`PrepareStarted`, `Prepared`,
/// `Degraded`, `Unpreparing`) and what it owns on the host: MPS control daemons (pid, start
/// time, directories, shm mount, limits as asked), time-slice intervals and compute modes
/// (from its strategies), the CDI spec file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Format version.
    pub version: u32,
    /// `/proc/sys/kernel/random/boot_id` of the boot that wrote it; empty in version 1. A
    /// different one at start means the host was rebooted: nothing of the claims' host setup
    /// survived.
    #[serde(default)]
    pub boot_id: String,
    /// Last generation handed out (see [`ClaimInfo::generation`]).
    #[serde(default)]
    pub generation: u64,
    /// Claims by UID, as `get_claim` reports them.
    #[serde(default)]
    pub claims: BTreeMap<String, ClaimInfo>,
    /// Released claims by UID.
    #[serde(default)]
    pub tombstones: BTreeMap<String, Tombstone>,
}

/// What is left of a released claim: enough to refuse a prepare that is older than the
/// release (KS#1162: a stale kubelet retry finishing after unprepare re-created the claim and
/// leaked its devices).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    /// Generation of the release: prepares that began before it are stale.
    pub generation: u64,
    /// `metadata.resourceVersion` of the claim object that was prepared, when known: a prepare
    /// carrying this same object again is a retry of the released one.
    #[serde(default)]
    pub resource_version: Option<String>,
    /// When the claim was released, seconds since the Unix epoch.
    pub released_at: u64,
}

impl Default for Checkpoint {
    fn default() -> Checkpoint {
        Checkpoint {
            version: CHECKPOINT_VERSION,
            boot_id: String::new(),
            generation: 0,
            claims: BTreeMap::new(),
            tombstones: BTreeMap::new(),
        }
    }
}

impl Checkpoint {
    /// Drops tombstones older than [`TOMBSTONE_TTL_SECS`] at `now` and the oldest beyond
    /// [`MAX_TOMBSTONES`].
    pub fn prune_tombstones(&mut self, now: u64) {
        prune_tombstones(&mut self.tombstones, now);
    }
}

/// Drops from `tombstones` those older than [`TOMBSTONE_TTL_SECS`] at `now` and the oldest
/// beyond [`MAX_TOMBSTONES`]; the service prunes its own set with it as it adds to it, so the
/// set in memory stays as bounded as the file.
pub fn prune_tombstones(tombstones: &mut BTreeMap<String, Tombstone>, now: u64) {
    tombstones.retain(|_, t| now.saturating_sub(t.released_at) < TOMBSTONE_TTL_SECS);
    if tombstones.len() > MAX_TOMBSTONES {
        let mut by_age: Vec<(u64, String)> = tombstones
            .iter()
            .map(|(uid, t)| (t.generation, uid.clone()))
            .collect();
        by_age.sort();
        let excess = tombstones.len() - MAX_TOMBSTONES;
        for (_, uid) in by_age.into_iter().take(excess) {
            tombstones.remove(&uid);
        }
    }
}

/// Largest checkpoint file read, in bytes: far above what 1,000 claims and the most
/// tombstones take (a few MiB), far below what would hurt to hold in memory. A larger file is
/// not one this daemon wrote: it is quarantined like a corrupt one.
pub const MAX_CHECKPOINT_BYTES: u64 = 64 << 20;

/// What loading found.
#[derive(Debug)]
pub struct Loaded {
    /// The checkpoint (empty when there was none or it was corrupt).
    pub checkpoint: Checkpoint,
    /// No checkpoint was there at all (a new or changed state directory, a lost volume, an
    /// operator's `rm`). That is not a node without claims: the reconcile rebuilds the claims
    /// from their host records, as after a corrupt checkpoint.
    pub missing: bool,
    /// Where a corrupt checkpoint (or whatever stood at its path) was moved, and why it was
    /// refused.
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

    /// Loads the checkpoint. A missing file is an empty checkpoint with [`Loaded::missing`]
    /// set. Anything else that is not a checkpoint this daemon wrote is moved to
    /// `<path>.corrupt-<unix seconds>` and reported in [`Loaded::quarantined`]: a file that is
    /// not JSON, truncated, of the wrong shape, empty, larger than [`MAX_CHECKPOINT_BYTES`] or
    /// unreadable, and a path that is not a regular file at all (a directory, a symbolic link,
    /// which is never followed, a fifo, which is never opened for a blocking read, a socket, a
    /// device node), so that no such thing fails every start. Temporary files of interrupted
    /// writes are removed.
    ///
    /// # Errors
    /// What stands at the path cannot be moved aside.
    pub fn load(&self) -> io::Result<Loaded> {
        self.remove_stale_temporaries();
        let refused = match fsutil::read_own_file(&self.path, MAX_CHECKPOINT_BYTES) {
            Ok(bytes) => match serde_json::from_slice::<Checkpoint>(&bytes) {
                Ok(checkpoint) => {
                    return Ok(Loaded {
                        checkpoint,
                        missing: false,
                        quarantined: None,
                    })
                }
                Err(e) => e.to_string(),
            },
            Err(fsutil::ReadRefusal::Missing) => {
                return Ok(Loaded {
                    checkpoint: Checkpoint::default(),
                    missing: true,
                    quarantined: None,
                })
            }
            Err(why) => why.to_string(),
        };
        let aside = self.move_aside()?;
        Ok(Loaded {
            checkpoint: Checkpoint::default(),
            missing: false,
            quarantined: Some((aside, refused)),
        })
    }

    /// Moves whatever stands at the path (a file, a directory, a link itself) to
    /// `<path>.corrupt-<unix seconds>[.<n>]` and returns where.
    fn move_aside(&self) -> io::Result<PathBuf> {
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let name = self
            .path
            .file_name()
            .map_or_else(|| "checkpoint.json".into(), |n| n.to_string_lossy());
        // Two corrupt files within one second (a crash loop elsewhere) must not overwrite the
        // first one's evidence.
        let mut aside = self.path.with_file_name(format!("{name}.corrupt-{secs}"));
        let mut n = 1;
        while fs::symlink_metadata(&aside).is_ok() {
            aside = self
                .path
                .with_file_name(format!("{name}.corrupt-{secs}.{n}"));
            n += 1;
        }
        fs::rename(&self.path, &aside)?;
        Ok(aside)
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
        fsutil::write_atomic(&self.path, &bytes, 0o600)
    }

    /// Removes `.checkpoint.json.tmp-<pid>-<n>` files that a write killed half-way left behind
    /// (ours by name; anything else in the directory is left alone).
    fn remove_stale_temporaries(&self) {
        let (Some(dir), Some(name)) = (self.path.parent(), self.path.file_name()) else {
            return;
        };
        let prefix = format!(".{}.tmp-", name.to_string_lossy());
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let file = entry.file_name();
            if file.to_string_lossy().starts_with(&prefix) {
                tracing::info!(path = %entry.path().display(), "removing a temporary file of an interrupted checkpoint write");
                let _ = fs::remove_file(entry.path());
            }
        }
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
        assert!(loaded.missing && loaded.quarantined.is_none());
        f.save(&loaded.checkpoint).unwrap();
        let again = f.load().unwrap();
        assert_eq!(again.checkpoint, Checkpoint::default());
        assert!(
            !again.missing,
            "an empty checkpoint on disk is not a missing one"
        );
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
    fn version_1_reads_as_empty_boot_and_tombstones() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("checkpoint.json");
        fs::write(&p, r#"{"version": 1, "claims": {}}"#).unwrap();
        let loaded = CheckpointFile::new(p).load().unwrap();
        assert_eq!(loaded.checkpoint.boot_id, "");
        assert!(loaded.checkpoint.tombstones.is_empty());
    }

    #[test]
    fn empty_and_truncated_files_are_quarantined_and_a_second_one_keeps_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("checkpoint.json");
        let f = CheckpointFile::new(p.clone());
        fs::write(&p, b"").unwrap();
        let first = f.load().unwrap().quarantined.unwrap().0;
        fs::write(&p, b"{\"version\": 2, \"boot_id\": \"ab").unwrap();
        let second = f.load().unwrap().quarantined.unwrap().0;
        assert_ne!(first, second);
        assert!(first.exists() && second.exists());
    }

    #[test]
    fn temporaries_of_interrupted_writes_are_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("checkpoint.json");
        fs::write(dir.path().join(".checkpoint.json.tmp-123-0"), b"{").unwrap();
        fs::write(dir.path().join("gpushared.lock"), b"").unwrap();
        CheckpointFile::new(p).load().unwrap();
        assert!(!dir.path().join(".checkpoint.json.tmp-123-0").exists());
        assert!(dir.path().join("gpushared.lock").exists());
    }

    #[test]
    fn tombstones_expire_and_are_capped() {
        let mut cp = Checkpoint::default();
        for i in 0..(MAX_TOMBSTONES as u64 + 10) {
            cp.tombstones.insert(
                format!("u{i}"),
                Tombstone {
                    generation: i,
                    resource_version: None,
                    released_at: 1_000_000,
                },
            );
        }
        cp.tombstones.insert(
            "old".into(),
            Tombstone {
                generation: 99_999,
                resource_version: None,
                released_at: 1,
            },
        );
        cp.prune_tombstones(1_000_000);
        assert_eq!(cp.tombstones.len(), MAX_TOMBSTONES);
        assert!(!cp.tombstones.contains_key("old"), "expired");
        assert!(!cp.tombstones.contains_key("u0"), "oldest dropped first");
        assert!(cp
            .tombstones
            .contains_key(&format!("u{}", MAX_TOMBSTONES + 9)));
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

    #[test]
    fn a_path_that_is_not_a_regular_file_is_quarantined_not_an_error() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("checkpoint.json");
        let f = CheckpointFile::new(p.clone());
        let good = dir.path().join("elsewhere.json");
        fs::write(&good, r#"{"version": 2, "claims": {}}"#).unwrap();
        let plant: [(&str, &dyn Fn()); 4] = [
            ("a directory", &|| fs::create_dir(&p).unwrap()),
            ("a symbolic link", &|| symlink(&good, &p).unwrap()),
            ("a fifo", &|| {
                nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap()
            }),
            ("a socket", &|| {
                std::os::unix::net::UnixListener::bind(&p).unwrap();
            }),
        ];
        for (what, make) in plant {
            make();
            let loaded = f.load().unwrap();
            let (aside, why) = loaded.quarantined.expect(what);
            assert!(why.contains(what), "{what}: {why}");
            assert!(!loaded.missing);
            assert!(fs::symlink_metadata(&p).is_err(), "{what} moved away");
            assert!(
                fs::symlink_metadata(&aside).is_ok(),
                "{what} kept as evidence"
            );
            // The next load finds nothing there: a fresh start, not the same refusal again.
            assert!(f.load().unwrap().missing, "{what}");
        }
        assert!(good.exists(), "a link's target is never touched");
    }

    #[test]
    fn a_huge_file_is_quarantined_without_being_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("checkpoint.json");
        let file = fs::File::create(&p).unwrap();
        // Sparse: no disk is used for it.
        file.set_len(MAX_CHECKPOINT_BYTES + 1).unwrap();
        let (_, why) = CheckpointFile::new(p).load().unwrap().quarantined.unwrap();
        assert!(why.contains("larger than"), "{why}");
    }
}
