//! The claims a start reconciles, read and checked: the store's records that pass
//! [`persisted::check_record`] (with their containers from their host records), and the host
//! record of every claim the store does not hold (all of them when it was missing): a claim
//! with a valid host record is never taken for no claim's. Step 1 of the start-up order
//! (`docs/crash-safety.md`, "Start-up reconcile").

use std::collections::BTreeMap;
use std::fs;

use crate::claim::Claim;
use crate::fsutil;
use crate::service::persisted::{self, Quarantine, HOST_RECORD};
use crate::service::Service;
use crate::store::{ClaimRecord, Loaded};

/// What the start-up reconcile works on (see [`Service::claims_to_reconcile`]).
pub(super) struct ToReconcile {
    /// The claims, each with whether its record must be written.
    pub(super) claims: BTreeMap<String, (Claim, bool)>,
    /// Where refused records went.
    pub(super) quarantine: Quarantine,
    /// The host records as read (those that parsed and passed), by claim UID.
    pub(super) host_records: BTreeMap<String, Claim>,
}

impl Service {
    /// The claims to reconcile: the store's records that pass [`persisted::check_record`]
    /// (with their containers from their host records), and the host record of every claim
    /// the store does not hold (all of them when it was missing): a claim with a valid host
    /// record is never taken for no claim's. A host record older than its claim's tombstone
    /// is of a claim released since: its release is finished (as `Unpreparing`). Refused and
    /// unreadable records are kept in the quarantine, alone. The flag says whether the
    /// record must be written (it did not come from the store as it is).
    pub(super) fn claims_to_reconcile(&self, loaded: &mut Loaded) -> ToReconcile {
        let quarantine = Quarantine::beside(&self.cfg.checkpoint);
        self.quarantine_unreadable(loaded, &quarantine);
        let (mut claims, host_records) = self.checked_records(loaded, &quarantine);
        loaded
            .tombstones
            .retain(|uid, _| crate::config::validate_claim_uid(uid).is_ok());
        for (uid, info) in self.rebuilt_claims(loaded, &quarantine, &claims) {
            claims.insert(uid, (info, true));
        }
        self.refuse_collisions(&mut claims, &quarantine);
        self.state().quarantined_records = quarantine.refused();
        ToReconcile {
            claims,
            quarantine,
            host_records,
        }
    }

    /// Record files that are not records go to the quarantine (and are removed, as what they
    /// are), reported in `health`.
    fn quarantine_unreadable(&self, loaded: &mut Loaded, quarantine: &Quarantine) {
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
    }

    /// The store's records that pass their check, each with the containers its host record
    /// keeps, and the host records as read (compared, not read again, when the claim is
    /// revived); refused ones go to the quarantine and are removed.
    #[allow(clippy::type_complexity)]
    fn checked_records(
        &self,
        loaded: &mut Loaded,
        quarantine: &Quarantine,
    ) -> (BTreeMap<String, (Claim, bool)>, BTreeMap<String, Claim>) {
        let mut claims = BTreeMap::new();
        let mut host_records = BTreeMap::new();
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
                    let path = self.records.store.claim_path(&key);
                    let why = why.to_string();
                    quarantine.keep("checkpoint-claim", &path, &key, bytes.as_deref(), &why);
                    if crate::config::validate_claim_uid(&key).is_ok() {
                        let _ = fsutil::remove_file_if_exists(&path);
                    }
                }
            }
        }
        (claims, host_records)
    }

    /// The claims rebuilt from the host records of claims the store does not hold (`known`),
    /// logged as what they mean (a first start, a missing checkpoint, one that lacks claims);
    /// a host record older than its claim's tombstone is of a claim released since, whose
    /// release is finished (as `Unpreparing`).
    fn rebuilt_claims(
        &self,
        loaded: &Loaded,
        quarantine: &Quarantine,
        known: &BTreeMap<String, (Claim, bool)>,
    ) -> BTreeMap<String, Claim> {
        let mut rebuilt =
            persisted::host_records(&self.cfg.run_dir, &self.cfg.cdi_dir, quarantine, |uid| {
                known.contains_key(uid)
            });
        if loaded.missing && rebuilt.is_empty() {
            tracing::info!(
                path = %self.records.store.dir().display(),
                "no checkpoint and no host records: a node without claims (a first start)"
            );
        } else if loaded.missing {
            tracing::warn!(
                path = %self.records.store.dir().display(),
                host_records = rebuilt.len(),
                "no checkpoint found; rebuilding the claims from their host records (a missing checkpoint is not a node without claims)"
            );
        } else if loaded.quarantined.is_none() && !rebuilt.is_empty() {
            tracing::warn!(
                claims = ?rebuilt.keys().collect::<Vec<_>>(),
                "the checkpoint lacks claims that have host records; rebuilding them from those"
            );
        }
        for (uid, info) in &mut rebuilt {
            if let Some(t) = loaded
                .tombstones
                .get(uid)
                .filter(|t| t.generation > info.generation)
            {
                tracing::warn!(claim = %uid, released_generation = t.generation, record_generation = info.generation, "the host record is of a claim released since; finishing its release");
                let _ = crate::claim::lifecycle::take(
                    info,
                    crate::claim::Event::ReleaseStarted,
                    Vec::new(),
                );
            }
        }
        rebuilt
    }

    /// Refuses (to the quarantine) every record whose MIG slice is another record's
    /// ([`persisted::mig_collisions`]).
    fn refuse_collisions(
        &self,
        claims: &mut BTreeMap<String, (Claim, bool)>,
        quarantine: &Quarantine,
    ) {
        let collisions =
            persisted::mig_collisions(claims.values().map(|(c, rebuilt)| (c, *rebuilt)));
        for (uid, why) in collisions {
            if let Some((info, from_host)) = claims.remove(&uid) {
                let path = if from_host {
                    self.cfg.run_dir.join("claims").join(&uid).join(HOST_RECORD)
                } else {
                    self.records.store.claim_path(&uid)
                };
                let bytes = if from_host {
                    serde_json::to_vec(&crate::store::HostRecord::of(&info)).ok()
                } else {
                    serde_json::to_vec(&ClaimRecord::of(&info)).ok()
                };
                quarantine.keep("conflicting-claim", &path, &uid, bytes.as_deref(), &why);
            }
        }
    }
}
