//! The host record's writes, the tombstones' check against stale prepares, and what the
//! start and the orphans' sweep share. The start-up reconcile itself is `startup/`, the restart
//! of dead MPS control daemons `restarts.rs`, the graceful stop `stop.rs`.

use gpushare_proto::ErrorCode;

use super::persisted::{HOST_RECORD, MAX_HOST_RECORD_BYTES};
use super::Service;
use crate::claim::{Claim, Phase};
use crate::error::ServiceError;
use crate::fsutil;
use crate::store::HostRecord;

pub use crate::sys::BOOT_ID_PATH;

/// Largest CDI spec file read when looking for orphans of ours, in bytes (ours are a few KiB).
pub(super) const MAX_SPEC_BYTES: u64 = 4 << 20;

/// Mode of a claim's directory `<run-dir>/claims/<uid>`, whatever its strategy (an MPS
/// claim's is made so by its MPS start too): traversable, so that an MPS server started under
/// a client's uid reaches its pipe directory, but not listable by other host users.
pub(super) const CLAIM_DIR_MODE: u32 = 0o711;

impl Service {
    /// Refuses a prepare older than a release of the same claim: one that arrived before the
    /// release's generation, or that carries the very claim object (same `resourceVersion`)
    /// that was released.
    pub(super) fn refuse_stale_prepare(
        &self,
        uid: &str,
        arrived: u64,
        resource_version: Option<&str>,
    ) -> Result<(), ServiceError> {
        let st = self.state();
        let Some(t) = st.tombstones.get(uid) else {
            return Ok(());
        };
        let same_object =
            resource_version.is_some() && t.resource_version.as_deref() == resource_version;
        if t.generation > arrived || same_object {
            let why = if same_object {
                format!(
                    "it carries resourceVersion {} of the claim object that was released",
                    resource_version.unwrap_or_default()
                )
            } else {
                "it arrived before the release finished".to_string()
            };
            tracing::warn!(claim = %uid, generation = t.generation, "refusing a stale prepare of a released claim");
            return Err(ServiceError::new(
                ErrorCode::Stale,
                format!(
                    "claim {uid} was released (at {} s after the epoch, generation {}) and this prepare is older: {why}; nothing was changed",
                    t.released_at, t.generation
                ),
            ));
        }
        Ok(())
    }

    /// Writes `<run-dir>/claims/<uid>/claim.json`, the copy a missing or corrupt checkpoint is
    /// rebuilt from, unless it already holds exactly this record: a restart re-checks every claim,
    /// and a durable rewrite per claim made restart-to-ready grow with the claims
    /// (BENCHMARKS.md, "Recovery", has the figures). A failure is logged only: the checkpoint
    /// stays the record.
    /// Attachments are in it too (written at every attach and detach; the run directory is a
    /// tmpfs, where this costs no disk flush), so a rebuilt claim keeps its containers' slots.
    ///
    /// What is written is the claim as the registry holds it when the write begins, under one
    /// lock for all host-record writes, so that of two changes written at once the later one
    /// is what stays on disk. Only a `Prepared` or `Degraded`
    /// claim has one: a release under way (`Unpreparing`, set before its directory goes) is
    /// never written back.
    pub(super) fn write_host_record(&self, uid: &str) -> Result<(), ServiceError> {
        self.write_host_record_over(uid, None)
    }

    /// As [`Service::write_host_record`], where `on_disk` (when given) is the record the
    /// file held moments ago: a claim equal to it needs no write, and neither the file is read
    /// again nor the claim encoded.
    pub(super) fn write_host_record_over(
        &self,
        uid: &str,
        on_disk: Option<&Claim>,
    ) -> Result<(), ServiceError> {
        let _writes = self
            .host
            .host_record_writes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Encoded under the lock rather than copied out first: this runs for every claim at
        // every start.
        let encoded = {
            let st = self.state();
            let Some(info) = st
                .claims
                .get(uid)
                .filter(|c| matches!(c.phase, Phase::Prepared | Phase::Degraded))
            else {
                return Ok(());
            };
            if on_disk == Some(info) {
                return Ok(());
            }
            serde_json::to_vec(&HostRecord::of(info))
        };
        let dir = self.claim_dir(uid);
        let result = fsutil::create_dir_if_missing(&dir, CLAIM_DIR_MODE).and_then(|()| {
            let bytes = encoded.map_err(std::io::Error::other)?;
            let path = dir.join(HOST_RECORD);
            if on_disk.is_none()
                && fsutil::read_own_file(&path, MAX_HOST_RECORD_BYTES)
                    .is_ok_and(|on_disk| on_disk == bytes)
            {
                return Ok(());
            }
            // No flush: what this record alone keeps (the attached containers) dies with the
            // boot, and the run directory is a tmpfs; a crash of gpushared finds it whole.
            fsutil::write_replace(&path, &bytes, 0o600)
        });
        result.map_err(|e| {
            tracing::warn!(claim = %uid, error = %e, "writing the claim's host record");
            ServiceError::internal(format!(
                "writing the run-directory record of claim {uid}: {e}"
            ))
        })
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn every_crash_point_is_used_in_the_code() {
        let sources = [
            include_str!("mod.rs"),
            include_str!("apply.rs"),
            include_str!("ops/prepare.rs"),
            include_str!("ops/unprepare.rs"),
            include_str!("../checkpoint.rs"),
            include_str!("../store.rs"),
            include_str!("reconcile.rs"),
            include_str!("restarts.rs"),
            include_str!("orphans.rs"),
            include_str!("../strategy/mps/group.rs"),
            include_str!("../strategy/mig/group.rs"),
            include_str!("../strategy/mig/slice.rs"),
        ]
        .concat();
        for p in crate::crash::CRASH_POINTS {
            assert!(
                sources.contains(&format!("point(\"{p}\")")),
                "crash point {p} is listed but never reached"
            );
        }
    }
}
