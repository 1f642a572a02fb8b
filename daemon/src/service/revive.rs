//! Bringing back a claim the start-up reconcile keeps (`reconcile.rs`): its MPS control
//! daemons re-adopted or started again (`strategy::mps::revive`), its CDI spec and claim directory as they must be,
//! its host record rewritten where it differs.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use crate::claim::{Claim, Group};
use crate::strategy::{life_of, Revival};

use super::reconcile::CLAIM_DIR_MODE;
use super::Service;
use crate::fsutil;

impl Service {
    /// Re-adopts or restarts the MPS control daemons of a prepared claim and makes sure its
    /// CDI spec exists. `host_record` is what its host record held when the start read it.
    pub(super) fn revive(
        &self,
        uid: &str,
        rebooted: bool,
        host_record: Option<&Claim>,
        specs: &SpecListing,
    ) {
        let restarted = self.revive_groups(uid, rebooted);
        let Some(cdi_spec) = self.state().claims.get(uid).map(|c| c.cdi_spec.clone()) else {
            return;
        };
        // Ours is a regular file: anything else there (a link, a fifo) is replaced.
        let info = (!specs.is_regular_file(Path::new(&cdi_spec)))
            .then(|| self.state().claims.get(uid).cloned())
            .flatten();
        if let Some(info) = info {
            tracing::warn!(claim = %uid, "CDI spec missing; writing it again");
            if let Err(e) = self.write_cdi(uid, &info.groups, &info) {
                tracing::error!(claim = %uid, error = %e, "rewriting the CDI spec");
            }
        }
        // A claim directory an older release made 0755 becomes what docs/node.md says.
        if let Err(e) = fsutil::ensure_dir(&self.claim_dir(uid), CLAIM_DIR_MODE) {
            tracing::warn!(claim = %uid, error = %e, "setting the mode of the claim's directory");
        }
        // A restart has written the record since it was read: then the file is compared.
        let _ = self.write_host_record_over(uid, host_record.filter(|_| !restarted));
    }
}

impl Service {
    /// Brings back what runs on each group of claim `uid`, as its strategy says
    /// ([`GroupLife::revive`]). Returns whether anything was started again.
    fn revive_groups(&self, uid: &str, rebooted: bool) -> bool {
        // Copied out of the registry only where something runs on them: most claims run
        // nothing, and this runs for every claim at every start.
        let groups: Vec<Group> = match self.state().claims.get(uid) {
            Some(c) if c.runs_mps() => c.groups.clone(),
            _ => return false,
        };
        let fx = Revival {
            uid,
            rebooted,
            node: self,
        };
        let mut restarted = false;
        for g in &groups {
            restarted |= life_of(g).revive(&fx, g);
        }
        restarted
    }
}

/// The regular files in the CDI directory as one listing at the start of the reconcile
/// showed them (each entry's type from the listing's `d_type`): every claim's spec is
/// checked against it, where an `lstat` per claim cost a name lookup in a directory of a
/// thousand entries. A spec elsewhere, or a listing that failed, is looked at on its own.
pub(super) struct SpecListing {
    dir: PathBuf,
    files: Option<BTreeSet<OsString>>,
}

impl SpecListing {
    pub(super) fn of(dir: &Path) -> SpecListing {
        let files = fs::read_dir(dir).ok().map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| e.file_name())
                .collect()
        });
        SpecListing {
            dir: dir.to_path_buf(),
            files,
        }
    }

    /// Whether `path` is a regular file (not a link, a fifo, a directory, or missing).
    fn is_regular_file(&self, path: &Path) -> bool {
        match (&self.files, path.parent(), path.file_name()) {
            (Some(files), Some(parent), Some(name)) if parent == self.dir => files.contains(name),
            _ => fs::symlink_metadata(path).is_ok_and(|m| m.is_file()),
        }
    }
}
