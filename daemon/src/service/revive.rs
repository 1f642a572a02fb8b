//! Bringing back a claim the start-up reconcile keeps (`reconcile.rs`): its MPS control
//! daemons re-adopted or started again, its CDI spec and claim directory as they must be,
//! its host record rewritten where it differs.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use crate::claim::Claim;

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
        let mut restarted = false;
        // Only what is needed is copied out of the registry: most claims have no MPS group,
        // and this runs for every claim at every start.
        let Some((mps, cdi_spec)) = self.state().claims.get(uid).map(|c| {
            let mps: Vec<_> = c.mps_daemons().cloned().collect();
            (mps, c.cdi_spec.clone())
        }) else {
            return;
        };
        for m in &mps {
            if !rebooted && m.control_daemon_pid > 0 {
                match self.host.mps.check_adoptable(m) {
                    Ok(()) => {
                        tracing::info!(claim = %uid, pid = m.control_daemon_pid, "re-adopted the running MPS control daemon");
                        continue;
                    }
                    Err(why) => {
                        tracing::warn!(claim = %uid, pid = m.control_daemon_pid, reason = %why, "MPS control daemon cannot be re-adopted; restarting it")
                    }
                }
            }
            let _ = self.restart_group(uid, &m.pipe_dir, !rebooted);
            restarted = true;
        }
        if !self.state().claims.contains_key(uid) {
            return;
        }
        if !restarted && !mps.is_empty() {
            // Every daemon re-adopted as it runs: a claim recorded Degraded for one (a record
            // of an older format, whose causes are read from what it holds) is so no more.
            let mut st = self.state();
            self.daemons_running(&mut st, uid);
            let _ = self.commit(st);
        }
        {
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
            // A claim directory an older release made 0755 becomes what the README says.
            if let Err(e) = fsutil::ensure_dir(&self.claim_dir(uid), CLAIM_DIR_MODE) {
                tracing::warn!(claim = %uid, error = %e, "setting the mode of the claim's directory");
            }
            // A restart has written the record since it was read: then the file is compared.
            let _ = self.write_host_record_over(uid, host_record.filter(|_| !restarted));
        }
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
