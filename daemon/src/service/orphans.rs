//! What is ours on the host and owned by no claim, found and removed at start: directories
//! and shm mounts under the run directory, CDI specs of ours, and MPS control daemons and
//! stray MPS processes (which `strategy::mps::orphans` stops). Nothing is followed, and
//! nothing outside our directories is touched.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::reconcile::MAX_SPEC_BYTES;
use super::Service;
use crate::fsutil;
use crate::strategy::mps::{self, MpsDirs};

impl Service {
    /// Removes what is ours on the host and owned by no claim: MPS control daemons on, mounts
    /// under and directories in `<run-dir>/claims/` (every entry there is ours), and CDI specs
    /// named `gpushare.io-claim_<uid>.json` (and their temporaries, and the driver spec's) in
    /// the CDI directory.
    pub(super) fn remove_orphans(&self) {
        let (owned_claims, owned_groups): (Vec<String>, Vec<PathBuf>) = {
            let st = self.state();
            let groups = st
                .claims
                .values()
                .flat_map(|c| c.groups.iter())
                .filter_map(|g| g.mps())
                .map(|m| MpsDirs::from_pipe(Path::new(&m.pipe_dir)).root)
                .collect();
            (st.claims.keys().cloned().collect(), groups)
        };
        let claims_dir = self.cfg.run_dir.join("claims");
        self.remove_orphan_dirs(&claims_dir, &owned_claims, &owned_groups);
        // A stray may have made its directories after the first sweep; without one, nothing
        // can have (no other writer runs under the claims' directory before READY).
        let strays = mps::kill_strays(
            &self.host.mps,
            self.host.processes.as_ref(),
            &claims_dir,
            &owned_groups,
        );
        if strays > 0 {
            self.remove_orphan_dirs(&claims_dir, &owned_claims, &owned_groups);
        }
        self.remove_orphan_specs(&owned_claims);
    }

    /// Removes `gpushare.io-claim_<uid>.json` specs in the CDI directory that no claim owns and
    /// that are provably this daemon's: their hooks name this daemon's socket. The CDI
    /// directory is shared (with other vendors, and in tests with other gpushared instances),
    /// so a spec of ours by name alone is not enough. Temporaries of interrupted writes, of
    /// the claims' specs and of the driver's spec (`.gpushare.io-gpu.json.tmp-<pid>-<n>`), go
    /// when the process that wrote them (the pid in their name) is gone.
    pub(super) fn remove_orphan_specs(&self, owned_claims: &[String]) {
        let owned: BTreeSet<&str> = owned_claims.iter().map(String::as_str).collect();
        let Ok(entries) = fs::read_dir(&self.cfg.cdi_dir) else {
            return;
        };
        let socket = format!("{:?}", self.cfg.hook.socket.display().to_string());
        // The driver's spec (`gpushare.io-gpu.json` by default; its kind is configurable) is
        // written the same way: a kill during a regeneration leaves its temporary too.
        let driver_file = self.cfg.driver_spec.as_ref().and_then(|d| {
            d.spec_path()
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        });
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            let driver_writer = driver_file
                .as_deref()
                .and_then(|target| fsutil::temporary_writer(&name, target));
            let orphan = if let Some(pid) = driver_writer {
                !self.host.processes.alive(pid)
            } else if let Some(rest) = name.strip_prefix(".gpushare.io-claim_") {
                rest.split_once(".json.tmp-")
                    .and_then(|(uid, _)| {
                        fsutil::temporary_writer(&name, &format!("gpushare.io-claim_{uid}.json"))
                    })
                    .is_some_and(|pid| !self.host.processes.alive(pid))
            } else if let Some(uid) = name
                .strip_prefix("gpushare.io-claim_")
                .and_then(|r| r.strip_suffix(".json"))
            {
                // Read as input: a regular file only, not through a link, bounded; a fifo
                // opened for a blocking read would hold up the start for ever.
                !owned.contains(uid)
                    && fsutil::read_own_file(&path, MAX_SPEC_BYTES)
                        .is_ok_and(|text| String::from_utf8_lossy(&text).contains(&socket))
            } else {
                false
            };
            if orphan && driver_writer.is_some() {
                tracing::warn!(path = %path.display(), "removing the temporary of a regeneration of the driver's CDI spec that was cut short");
                if let Err(e) = fsutil::remove_file_if_exists(&path) {
                    tracing::error!(path = %path.display(), error = %e, "removing a driver spec's temporary");
                }
            } else if orphan {
                tracing::warn!(path = %path.display(), "removing a CDI spec no claim owns");
                if let Err(e) = fsutil::remove_file_if_exists(&path) {
                    tracing::error!(path = %path.display(), error = %e, "removing an orphan CDI spec");
                }
            }
        }
    }

    /// Stops the MPS groups and removes the claim directories under `claims_dir` that no claim
    /// owns.
    pub(super) fn remove_orphan_dirs(
        &self,
        claims_dir: &Path,
        owned_claims: &[String],
        owned_groups: &[PathBuf],
    ) {
        let owned: BTreeSet<&str> = owned_claims.iter().map(String::as_str).collect();
        let (orphan_groups, orphan_dirs) = find_orphan_dirs(claims_dir, &owned, owned_groups);
        mps::stop_orphan_groups(&self.host.mps, &orphan_groups);
        for dir in orphan_dirs {
            tracing::warn!(path = %dir.display(), "removing a claim directory no claim owns");
            if let Err(e) = fsutil::remove_dir_all_if_exists(&dir) {
                tracing::error!(path = %dir.display(), error = %e, "removing an orphan claim directory");
            }
        }
    }
}

// Nothing is followed: a link (or any other non-directory) where a claim or MPS group
// directory should be is removed as the link it is, never read or stopped through.

/// Whether `e` is a directory itself, not a link to one (its own file type, not followed).
fn real_dir(e: &fs::DirEntry) -> bool {
    e.file_type().is_ok_and(|t| t.is_dir())
}

/// Removes `path`, found where `what` (a directory) should be but not a directory, as the
/// file or link it is.
fn not_a_dir(path: &Path, what: &str) {
    tracing::warn!(path = %path.display(), "removing what is not a directory where {what} should be");
    if let Err(e) = fsutil::remove_file_if_exists(path) {
        tracing::error!(path = %path.display(), error = %e, "removing it");
    }
}

/// Lists `claims_dir` for [`Service::remove_orphan_dirs`]: the MPS group directories that no
/// group of `owned_groups` is, and the claim directories that no claim of `owned` has, in
/// that order; what is not a directory where one should be is removed on the way.
fn find_orphan_dirs(
    claims_dir: &Path,
    owned: &BTreeSet<&str>,
    owned_groups: &[PathBuf],
) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut orphan_groups: Vec<PathBuf> = Vec::new();
    let mut orphan_dirs: Vec<PathBuf> = Vec::new();
    if let Ok(entries) = fs::read_dir(claims_dir) {
        let claim_dirs = claim_dirs_of(entries, owned);
        let groups = group_dirs_of(&claim_dirs);
        for ((dir, owned), groups) in claim_dirs.into_iter().zip(groups) {
            for (root, is_dir) in groups {
                if !is_dir {
                    not_a_dir(&root, "an MPS group directory");
                } else if !owned_groups.contains(&root) {
                    orphan_groups.push(root);
                }
            }
            if !owned {
                orphan_dirs.push(dir);
            }
        }
    }
    (orphan_groups, orphan_dirs)
}

/// The claim directories among `entries` (the claims directory's), each with whether a
/// claim of `owned` has it; an entry that is not a directory is removed.
fn claim_dirs_of(entries: fs::ReadDir, owned: &BTreeSet<&str>) -> Vec<(PathBuf, bool)> {
    let mut claim_dirs = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.path();
        if !real_dir(&entry) {
            not_a_dir(&dir, "a claim directory");
            continue;
        }
        let owned = entry
            .file_name()
            .to_str()
            .is_some_and(|n| owned.contains(n));
        claim_dirs.push((dir, owned));
    }
    claim_dirs
}

/// The `mps-*` entries of each of `claim_dirs` (in its order), each with whether it is a
/// directory itself.
fn group_dirs_of(claim_dirs: &[(PathBuf, bool)]) -> Vec<Vec<(PathBuf, bool)>> {
    // Every claim directory is listed for its MPS groups: on a few threads at once,
    // since a node may hold a thousand of them. A claim's own directory whose link
    // count says it has no subdirectory (2: its entry and its own `.`, as tmpfs and
    // ext4 count) holds no group and is not listed; a filesystem that does not count
    // a directory's links so (btrfs reports 1) gets the listing.
    crate::parallel::map(claim_dirs, |(dir, owned)| {
        if *owned && fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir() && m.nlink() == 2) {
            return Vec::new();
        }
        let Ok(groups) = fs::read_dir(dir) else {
            return Vec::new();
        };
        groups
            .flatten()
            .filter(|g| g.file_name().to_string_lossy().starts_with("mps-"))
            .map(|g| (g.path(), real_dir(&g)))
            .collect::<Vec<_>>()
    })
}
