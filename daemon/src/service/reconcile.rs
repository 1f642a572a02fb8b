//! The start-up reconcile (what the records, the host records and the host say, made one
//! again; each kept claim brought back by `revive.rs`), the host record's writes and the
//! tombstones' check against stale prepares. The restart of dead MPS control daemons is
//! `restarts.rs`, the graceful stop `stop.rs`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gpushare_proto::ErrorCode;

use crate::claim::{Claim, Phase};
use crate::store::{ClaimRecord, HostRecord};

use super::persisted::{self, Quarantine, HOST_RECORD, MAX_HOST_RECORD_BYTES};
use super::{mig, reapply_gpu_settings, wants_of, Service};
use crate::error::ServiceError;
use crate::fsutil;
use crate::parallel::in_parallel;
use crate::store::Loaded;
use crate::strategy::mps::MpsDirs;

pub use crate::sys::BOOT_ID_PATH;

/// Largest CDI spec file read when looking for orphans of ours, in bytes (ours are a few KiB).
pub(super) const MAX_SPEC_BYTES: u64 = 4 << 20;

/// Mode of a claim's directory `<run-dir>/claims/<uid>`, whatever its strategy (an MPS
/// claim's is made so by its MPS start too): traversable, so that an MPS server started under
/// a client's uid reaches its pipe directory, but not listable by other host users.
pub(super) const CLAIM_DIR_MODE: u32 = 0o711;

/// First delay before restarting a dead MPS control daemon; doubled after each failure.
pub(super) const RESTART_BASE: Duration = Duration::from_millis(500);

/// Longest delay between two restart attempts.
pub(super) const RESTART_CAP: Duration = Duration::from_secs(30);

/// A daemon that ran this long before it died counts as a new first failure.
pub(super) const RESTART_STABLE: Duration = Duration::from_secs(60);

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
    /// and a durable rewrite per claim made restart-to-ready grow by ~0.6 ms per claim
    /// (BENCHMARKS.md, "Recovery"). A failure is logged only: the checkpoint stays the record.
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

    /// The claims to reconcile: the store's records that pass [`persisted::check_record`]
    /// (with their containers from their host records), and the host record of every claim
    /// the store does not hold (all of them when it was missing): a claim with a valid host
    /// record is never taken for no claim's. A host record older than its claim's tombstone
    /// is of a claim released since: its release is finished (as `Unpreparing`). Refused and
    /// unreadable records are kept in the quarantine, alone. The flag says whether the
    /// record must be written (it did not come from the store as it is).
    fn claims_to_reconcile(&self, loaded: &mut Loaded) -> ToReconcile {
        let quarantine = Quarantine::beside(&self.cfg.checkpoint);
        let mut claims = BTreeMap::new();
        let mut host_records = BTreeMap::new();
        let mut reports = Vec::new();
        for u in std::mem::take(&mut loaded.unreadable) {
            let key = u
                .path
                .file_stem()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            tracing::error!(record = %u.path.display(), reason = %u.why, "a claim record of the checkpoint was corrupt; moved aside, rebuilding the claim from its host record");
            quarantine.keep(
                "checkpoint-claim",
                &u.path,
                &key,
                u.bytes.as_deref(),
                &u.why,
            );
            // Whatever it is (a file, a link, a fifo, a directory), it goes as what it is.
            let _ = if fs::symlink_metadata(&u.path).is_ok_and(|m| m.is_dir()) {
                fsutil::remove_dir_all_if_exists(&u.path)
            } else {
                fsutil::remove_file_if_exists(&u.path)
            };
            reports.push(format!(
                "claim record {} moved to {}: {}",
                u.path.display(),
                quarantine.dir().display(),
                u.why
            ));
        }
        if !reports.is_empty() {
            self.state().quarantined = Some(reports.join("; "));
        }
        let from_v2 = loaded.migrated.is_some();
        let records: Vec<(String, Claim)> =
            std::mem::take(&mut loaded.claims).into_iter().collect();
        // Each record's check and host-record read touch only its own files: on a few
        // threads at once (the results come back in order).
        let checked = crate::parallel::map(&records, |(key, info)| {
            persisted::check_record(info, key, &self.cfg.run_dir).map(|()| {
                // Containers are kept in the claim's run-directory record alone.
                (!from_v2).then(|| persisted::host_record_read(&self.cfg.run_dir, key))
            })
        });
        for ((key, mut info), checked) in records.into_iter().zip(checked) {
            match checked {
                Ok(host) => {
                    persisted::normalize(&mut info, &self.cfg.cdi_dir);
                    if let Some((attached, record)) = host {
                        info.attached = attached;
                        if let Some(record) = record {
                            host_records.insert(key.clone(), record);
                        }
                    }
                    claims.insert(key, (info, false));
                }
                Err(why) => {
                    let bytes = serde_json::to_vec(&ClaimRecord::of(&info)).ok();
                    let path = self.store.claim_path(&key);
                    quarantine.keep("checkpoint-claim", &path, &key, bytes.as_deref(), &why);
                    if crate::config::validate_claim_uid(&key).is_ok() {
                        let _ = fsutil::remove_file_if_exists(&path);
                    }
                }
            }
        }
        loaded
            .tombstones
            .retain(|uid, _| crate::config::validate_claim_uid(uid).is_ok());
        let rebuilt =
            persisted::host_records(&self.cfg.run_dir, &self.cfg.cdi_dir, &quarantine, |uid| {
                claims.contains_key(uid)
            });
        if loaded.missing && rebuilt.is_empty() {
            tracing::info!(
                path = %self.store.dir().display(),
                "no checkpoint and no host records: a node without claims (a first start)"
            );
        } else if loaded.missing {
            tracing::warn!(
                path = %self.store.dir().display(),
                host_records = rebuilt.len(),
                "no checkpoint found; rebuilding the claims from their host records (a missing checkpoint is not a node without claims)"
            );
        } else if loaded.quarantined.is_none() && !rebuilt.is_empty() {
            tracing::warn!(
                claims = ?rebuilt.keys().collect::<Vec<_>>(),
                "the checkpoint lacks claims that have host records; rebuilding them from those"
            );
        }
        for (uid, mut info) in rebuilt {
            if let Some(t) = loaded
                .tombstones
                .get(&uid)
                .filter(|t| t.generation > info.generation)
            {
                tracing::warn!(claim = %uid, released_generation = t.generation, record_generation = info.generation, "the host record is of a claim released since; finishing its release");
                let _ = crate::claim::lifecycle::apply(
                    &mut info,
                    crate::claim::Event::ReleaseStarted,
                    Vec::new(),
                );
            }
            claims.insert(uid, (info, true));
        }
        let collisions =
            persisted::mig_collisions(claims.values().map(|(c, rebuilt)| (c, *rebuilt)));
        for (uid, why) in collisions {
            if let Some((info, from_host)) = claims.remove(&uid) {
                let path = if from_host {
                    self.cfg.run_dir.join("claims").join(&uid).join(HOST_RECORD)
                } else {
                    self.store.claim_path(&uid)
                };
                let bytes = serde_json::to_vec(&ClaimRecord::of(&info)).ok();
                quarantine.keep("conflicting-claim", &path, &uid, bytes.as_deref(), &why);
            }
        }
        self.state().quarantined_records = quarantine.refused();
        ToReconcile {
            claims,
            quarantine,
            host_records,
        }
    }

    /// The start-up reconcile (see [`Service::with_boot_id`]).
    pub(super) fn reconcile(&self, mut loaded: Loaded, boot_id: String) {
        let ToReconcile {
            claims,
            quarantine,
            host_records,
        } = self.claims_to_reconcile(&mut loaded);
        let rebooted =
            !loaded.boot_id.is_empty() && !boot_id.is_empty() && loaded.boot_id != boot_id;
        {
            let mut st = self.state();
            st.boot_id = boot_id;
            st.claim_generation = loaded.generation;
            st.tombstones =
                crate::registry::Tombstones::loaded(std::mem::take(&mut loaded.tombstones));
            if let Some((aside, why)) = &loaded.quarantined {
                tracing::error!(moved_to = %aside.display(), reason = %why, "checkpoint was corrupt; moved aside, rebuilding the claims from their host records");
                st.quarantined = Some(format!("moved to {}: {why}", aside.display()));
            }
        }
        if rebooted {
            tracing::warn!("the host was rebooted since the checkpoint was written; redoing every claim's host setup");
        }
        {
            let mut st = self.state();
            // The store's records first: where one rebuilt from a host record alone collides
            // with one the store has, the store's is the claim and the other is refused.
            let mut claims: Vec<(String, (Claim, bool))> = claims.into_iter().collect();
            claims.sort_by_key(|(_, (_, rebuilt))| *rebuilt);
            for (uid, (mut info, write)) in claims {
                // Admitted by the same rules as a prepare, so that the rollbacks below release
                // through the mode words (restoring a GPU's settings when its last holder goes)
                // like any other release.
                let wants = wants_of(&info);
                if let Err(e) = self.modes.adopt(&uid, &wants) {
                    tracing::error!(claim = %uid, error = %e, "checkpointed claim conflicts with another; not re-adopted");
                    // Refused like any record that cannot be true: kept and shown.
                    let path = if write {
                        self.cfg.run_dir.join("claims").join(&uid).join(HOST_RECORD)
                    } else {
                        self.store.claim_path(&uid)
                    };
                    let bytes = serde_json::to_vec(&ClaimRecord::of(&info)).ok();
                    quarantine.keep(
                        "conflicting-claim",
                        &path,
                        &uid,
                        bytes.as_deref(),
                        &format!("it conflicts with another claim: {e}"),
                    );
                    st.quarantined_records = quarantine.refused();
                    continue;
                }
                st.placement.record(&uid, &wants);
                if rebooted {
                    // No container survives a reboot.
                    info.attached.clear();
                }
                st.claim_generation = st.claim_generation.max(info.generation);
                st.claims.adopt(uid.clone(), info);
                if write || loaded.other_format.contains(&uid) {
                    st.claims.mark_durable(&uid);
                }
            }
        }
        // Only claims that may wait on an MPS control daemon (or on anything a rollback
        // undoes) need a thread each; the others' work is a few local file checks, which a
        // few threads (crate::parallel) do faster than many contending for the registry.
        // The two sets go on side by side (below).
        let (mut waiting, mut local) = (Vec::new(), Vec::new());
        for c in self.state().claims.values() {
            let item = (c.uid.clone(), c.phase);
            if !matches!(c.phase, Phase::Prepared | Phase::Degraded) || c.runs_mps() {
                waiting.push(item);
            } else {
                local.push(item);
            }
        }
        // What the last run was making when it ended, and for which claims, as far as the
        // records vouch for it (service/mig/start.rs): a GPU instance such an intent names
        // that no record owns and that holds no compute instance is what a crash between
        // making and recording it leaves, and is destroyed now, while the records that vouch
        // for it are still there (a start killed after the rollbacks below finds it gone).
        let left = {
            let left = self.mig_intents.left_for_sweep(rebooted);
            let st = self.state();
            let left =
                mig::honoured_intents(left, st.claims.values(), &quarantine.refused_claims());
            mig::sweep_at_start(self.backend.as_ref(), &left, st.claims.values());
            left
        };
        // Half-started MPS daemons of claims about to be rolled back (and of no claim at all)
        // go first: one still starting holds no lock yet and would keep writing into the
        // directories the rollback removes.
        let live_groups: Vec<PathBuf> = self
            .state()
            .claims
            .values()
            .filter(|c| matches!(c.phase, Phase::Prepared | Phase::Degraded))
            .flat_map(|c| c.groups.iter())
            .filter_map(|g| g.mps())
            .map(|m| MpsDirs::from_pipe(Path::new(&m.pipe_dir)).root)
            .collect();
        self.kill_stray_mps_processes(&self.cfg.run_dir.join("claims"), &live_groups);
        // All claims at once: each claim's rollback or re-adoption waits on its own MPS
        // control daemons (a `quit` that is not taken waits out the MPS timeout before the
        // kill), so one after another a start that cannot re-adopt them (say, after the MPS
        // control program changed) took that wait once per claim.
        let specs = super::revive::SpecListing::of(&self.cfg.cdi_dir);
        let one = |(uid, state): &(String, Phase)| match state {
            Phase::PrepareStarted | Phase::Unpreparing => {
                tracing::warn!(claim = %uid, ?state, "rolling back a claim a crash left half-done");
                if let Some(e) = self.teardown(uid, None) {
                    tracing::error!(claim = %uid, error = %e, "rolling back; the next unprepare or prepare of the claim retries");
                }
            }
            Phase::Prepared | Phase::Degraded => {
                // A GPU the node does not have: kept, to be released, but nothing is started
                // on it and it never passes for Prepared (service/missing_gpus.rs).
                if !self.degrade_if_gpus_missing(uid) {
                    self.revive(uid, rebooted, host_records.get(uid), &specs);
                }
            }
        };
        std::thread::scope(|s| {
            let apart = std::thread::Builder::new()
                .name("reconcile-mps".into())
                .spawn_scoped(s, || in_parallel(&waiting, one));
            crate::parallel::map(&local, one);
            if apart.is_err() {
                in_parallel(&waiting, one);
            }
        });
        self.remove_orphans();
        // After the rollbacks, so that only what the remaining claims asked is applied.
        reapply_gpu_settings(self.backend.as_ref(), &self.state().placement);
        // After the rollbacks too (which destroyed the rolled-back claims' recorded MIG
        // instances, and turned MIG mode off after the last slice carrying the flag): MIG
        // mode a crashed prepare turned on before its slice was recorded goes off again.
        {
            let st = self.state();
            mig::leave_mig_mode_at_start(self.backend.as_ref(), &left.honoured, st.claims.values());
        }
        self.mig_intents.clear();
        // Then the MIG slices of prepared claims that vanished while gpushared was away (a GPU
        // reset, a destroy by hand): recreated at their placements, or the claim is Degraded
        // (service/mig_recover.rs).
        let recovered = self.recreate_mig_slices();
        // The driver's spec of the node as it is now, generated once: after the rollbacks and
        // the sweep (which destroyed MIG devices) and after every slice was made again, so it
        // has the alias each one keeps. Then the claims whose slices were made again get their
        // CDI IDs checked against it (one generation per such claim took a start with N of
        // them N+1 runs of the generator, each up to its timeout, before the socket existed).
        self.regenerate_driver_spec("at start");
        self.settle_mig_claims(recovered);
        let mut st = self.state();
        st.ready = true;
        tracing::info!(
            claims = st.claims.len(),
            degraded = st
                .claims
                .values()
                .filter(|c| c.phase == Phase::Degraded)
                .count(),
            "reconciled the host with the checkpoint"
        );
        let meta = crate::store::StoreMeta {
            format: crate::store::RECORD_FORMAT,
            boot_id: st.boot_id.clone(),
            generation: st.claim_generation,
            export: None,
        };
        let _ = self.commit(st);
        // Written even when nothing changed: the store then holds this boot's ID.
        if let Err(e) = self.store.write_meta(&meta) {
            let msg = format!(
                "writing checkpoint {}: {e}",
                self.store.dir().join(crate::store::STORE_FILE).display()
            );
            tracing::error!(error = %msg, "cannot write the checkpoint at start; changing requests fail until it can be written");
            self.state().checkpoint_error = Some(msg);
        }
    }
}

/// What the start-up reconcile works on (see [`Service::claims_to_reconcile`]).
struct ToReconcile {
    /// The claims, each with whether its record must be written.
    claims: BTreeMap<String, (Claim, bool)>,
    /// Where refused records went.
    quarantine: Quarantine,
    /// The host records as read (those that parsed and passed), by claim UID.
    host_records: BTreeMap<String, Claim>,
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
            include_str!("../strategy/mig/lifecycle.rs"),
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
