//! The quarantine: refused records kept as evidence, bounded, and what `health` reports of
//! them.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::QUARANTINE_DIR;
use crate::fsutil;
use crate::service::now_secs;

/// Most files kept in the quarantine directory (the oldest go first), so that a node whose
/// records keep being refused cannot fill its disk with evidence.
const MAX_QUARANTINED: usize = 256;

/// Where refused records are kept, and how many went there this start.
#[derive(Debug)]
pub(in crate::service) struct Quarantine {
    dir: PathBuf,
    /// One line per record refused through this quarantine: what `health` shows.
    refused: std::sync::Mutex<Vec<String>>,
    /// The keys (claim UIDs, as filed) of the records refused through it.
    refused_claims: std::sync::Mutex<BTreeSet<String>>,
}

/// Distinguishes quarantine files written within one second.
static QUARANTINED: AtomicU64 = AtomicU64::new(0);

impl Quarantine {
    /// Where the evidence goes.
    pub(in crate::service) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The quarantine beside the checkpoint (`<state-dir>/quarantine`).
    pub(in crate::service) fn beside(checkpoint: &Path) -> Quarantine {
        Quarantine {
            dir: checkpoint
                .parent()
                .unwrap_or(Path::new("."))
                .join(QUARANTINE_DIR),
            refused: std::sync::Mutex::new(Vec::new()),
            refused_claims: std::sync::Mutex::new(BTreeSet::new()),
        }
    }

    /// The claims (as their records were filed) whose records were refused through this
    /// quarantine so far. One of them may still be a claim, rebuilt from a good host record.
    pub(in crate::service) fn refused_claims(&self) -> BTreeSet<String> {
        self.refused_claims
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// What was refused through this quarantine so far, one line per record: the claim it
    /// was filed under, where it was read, why, and where it is kept.
    pub(in crate::service) fn refused(&self) -> Vec<String> {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Logs why a record was refused and keeps it as
    /// `<state-dir>/quarantine/<source>-<unix seconds>-<pid>-<n>.json`: a JSON object with
    /// where it was read (`from`), under which key or directory (`filed_under`), why it was
    /// refused (`reason`) and the record itself (`record`: as read, or its bytes as text when
    /// they are not JSON; absent when nothing could be read). Never fails: evidence that
    /// cannot be written is only logged.
    pub(in crate::service) fn keep(
        &self,
        source: &str,
        origin: &Path,
        filed_under: &str,
        bytes: Option<&[u8]>,
        why: &str,
    ) {
        let record = bytes.map(|b| {
            serde_json::from_slice::<serde_json::Value>(b)
                .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(b).into()))
        });
        let evidence = serde_json::json!({
            "from": origin.display().to_string(),
            "filed_under": filed_under,
            "reason": why,
            "record": record,
        });
        debug_assert!(
            crate::service::quarantine_name::SOURCES.contains(&source),
            "{source}"
        );
        let n = QUARANTINED.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!(
            "{source}-{}-{}-{n}.json",
            now_secs(),
            std::process::id()
        ));
        let kept = serde_json::to_vec_pretty(&evidence)
            .map_err(std::io::Error::other)
            .and_then(|text| {
                fsutil::create_dir_if_missing(&self.dir, 0o700)?;
                fsutil::write_atomic(&path, &text, 0o600)
            });
        let line = format!(
            "claim {filed_under:?} (from {}): {why}; {}",
            origin.display(),
            match &kept {
                Ok(()) => format!("kept at {}", path.display()),
                Err(e) => format!("keeping a copy failed: {e}"),
            }
        );
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(line);
        self.refused_claims
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(filed_under.to_string());
        match kept {
            Ok(()) => {
                tracing::error!(record = %origin.display(), filed_under, reason = %why, kept_at = %path.display(), "refused a claim record read back from disk and kept it in quarantine; the claim is not re-adopted from it");
                self.prune();
            }
            Err(e) => {
                tracing::error!(record = %origin.display(), filed_under, reason = %why, error = %e, "refused a claim record read back from disk (keeping a copy failed); the claim is not re-adopted from it");
            }
        }
    }

    /// Removes the oldest quarantine files beyond [`MAX_QUARANTINED`]: only regular files
    /// named as [`Quarantine::keep`] names them count and go, never anything else there.
    fn prune(&self) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
            .flatten()
            .filter(|e| crate::service::quarantine_name::is_ours(&e.file_name().to_string_lossy()))
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        if files.len() <= MAX_QUARANTINED {
            return;
        }
        files.sort();
        let excess = files.len() - MAX_QUARANTINED;
        for (_, p) in files.into_iter().take(excess) {
            let _ = fsutil::remove_file_if_exists(&p);
        }
    }
}
