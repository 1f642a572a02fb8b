//! `unprepare`, and the teardown every release goes through (an unprepare, a failed prepare, a
//! rollback at start): `Unpreparing` on disk first, then every host step, the GPUs freed only
//! when all of them succeeded.

use super::super::effects::ClaimGroup;
use gpushare_core::Want;
use gpushare_proto::UnprepareResult;

use super::super::{now_secs, Service, State};
use crate::cdi;
use crate::checkpoint::Tombstone;
use crate::claim::{Claim, Event, Phase};
use crate::config;
use crate::error::ServiceError;
use crate::fsutil;
use crate::registry::Txn;
use crate::strategy;

impl Service {
    /// Undoes everything a claim holds, whatever its state; used by unprepare (which passes
    /// the tombstone's `resource_version`: `Some`), and by a failed prepare and the start-up
    /// reconcile (`None`: a rollback leaves no tombstone, so the kubelet's retry may prepare
    /// the claim). The state `Unpreparing` is written first, so a crash part-way is finished
    /// at the next start instead of bringing the claim back. Errors are logged and the rest
    /// still runs; returns the first error.
    pub(in crate::service) fn teardown(
        &self,
        uid: &str,
        tombstone: Option<Option<String>>,
    ) -> Option<ServiceError> {
        let info = self.state().claims.get(uid).cloned()?;
        if info.phase != Phase::Unpreparing {
            if let Err(e) = self.record_unpreparing(&info) {
                return Some(e);
            }
        }
        crate::crash::point("unprepare.unpreparing_saved");
        let mut errors = self.release_host(&info);
        crate::crash::point("unprepare.dirs_removed");
        if errors.is_empty() {
            // MIG mode gpushare turned on for this claim's slices goes off with the last one,
            // before the release is on disk: until then the record (`Unpreparing`, its slices
            // carrying the flag) says whose the mode is, and a kill in between has the next
            // start finish the release and come here again.
            self.leave_mig_mode_after(&info);
        }
        crate::crash::point("unprepare.mig_mode_left");
        let freed = self.record_released(&info, tombstone, &mut errors);
        crate::crash::point("unprepare.released_saved");
        self.host.modes.release(self.host.backend.as_ref(), &freed);
        errors.into_iter().next()
    }

    /// Records `info` `Unpreparing` before anything of it is released: on disk, for a claim
    /// that was prepared (else a restart would bring it back); a half-done prepare is rolled
    /// back at the next start anyway.
    fn record_unpreparing(&self, info: &Claim) -> Result<(), ServiceError> {
        let uid = info.uid.as_str();
        let mut tx = Txn::begin(self);
        let mut st = self.state();
        let saved = Some(info.clone());
        tx.on_undo(move |st: &mut State| st.claims.restore(uid, saved));
        if let Err(e) = st.claims.transition(uid, Event::ReleaseStarted) {
            return Err(ServiceError::internal(format!("claim {uid}: {e}")));
        }
        if matches!(info.phase, Phase::Prepared | Phase::Degraded) {
            // On disk the claim is still prepared: releasing it now would have a restart
            // bring it back. Refuse, changing nothing.
            tx.commit(st, |st| self.commit(st))
        } else {
            let _ = self.commit(st);
            tx.keep();
            Ok(())
        }
    }

    /// Everything `info` holds on the host, released: each group's strategy stops what runs
    /// on its devices, then destroys the devices made for it (two passes: the daemons ran on
    /// those devices); then its CDI spec and claim directory go. Every step is tried; the
    /// errors are returned (logged) in order.
    fn release_host(&self, info: &Claim) -> Vec<ServiceError> {
        let uid = info.uid.as_str();
        let mut errors: Vec<ServiceError> = Vec::new();
        let mut note = |e: ServiceError| {
            tracing::error!(claim = %uid, error = %e, "releasing claim");
            errors.push(e);
        };
        for g in &info.groups {
            let group = ClaimGroup::new(self, uid, &g.devices);
            if let Err(e) = strategy::life_of(g).stop(&group.effects(), g) {
                note(e);
            }
        }
        crate::crash::point("unprepare.mps_stopped");
        // Every group's devices are tried; the first failure is the release's.
        let mut destroyed = Ok(());
        for g in &info.groups {
            let group = ClaimGroup::new(self, uid, &g.devices);
            if let Err(e) = strategy::life_of(g).destroy(&group.effects(), g) {
                destroyed = destroyed.and(Err(e));
            }
        }
        if let Err(e) = destroyed {
            note(e);
        }
        if info.groups.iter().any(|g| !g.slices().is_empty()) {
            self.regenerate_driver_spec("after destroying a claim's MIG devices");
        }
        if let Err(e) = fsutil::remove_file_if_exists(&cdi::spec_path(&self.cfg.cdi_dir, uid)) {
            note(ServiceError::internal(format!(
                "removing CDI spec of claim {uid}: {e}"
            )));
        }
        crate::crash::point("unprepare.cdi_removed");
        if let Err(e) = self.remove_claim_dir(uid) {
            note(e);
        }
        errors
    }

    /// Removes the claim's run directory. No host record of the claim is being written
    /// meanwhile (one that began before saw the claim Prepared and is removed with the
    /// directory; one after sees Unpreparing).
    fn remove_claim_dir(&self, uid: &str) -> Result<(), ServiceError> {
        let _writes = self
            .host
            .host_record_writes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        fsutil::remove_dir_all_if_exists(&self.claim_dir(uid)).map_err(|e| {
            ServiceError::internal(format!("removing {}: {e}", self.claim_dir(uid).display()))
        })
    }

    /// The release on disk. Only a complete release (no `errors`) frees the GPUs (returned,
    /// for the caller to give back outside the registry lock) and removes the claim, leaving
    /// its tombstone when `tombstone` says so: while a daemon or mount may still be there, the
    /// claim keeps its holds (state Unpreparing), so no other claim is placed on top of it,
    /// and the next unprepare or prepare of this claim finishes the job. A failed write joins
    /// `errors`.
    fn record_released(
        &self,
        info: &Claim,
        tombstone: Option<Option<String>>,
        errors: &mut Vec<ServiceError>,
    ) -> Vec<(String, String, Want)> {
        let uid = info.uid.as_str();
        let mut st = self.state();
        st.restarts.forget(uid);
        let mut freed = Vec::new();
        if errors.is_empty() {
            freed = self.release_gpus(&mut st, info);
            if let Err(e) = st.claims.transition(uid, Event::Released) {
                tracing::error!(claim = %uid, error = %e, "releasing claim");
                st.claims.remove(uid);
            }
            if let Some(resource_version) = tombstone {
                st.claim_generation += 1;
                let t = Tombstone {
                    generation: st.claim_generation,
                    resource_version,
                    released_at: now_secs(),
                };
                st.tombstones.insert(uid.to_string(), t, now_secs());
            }
        }
        if let Err(e) = self.commit(st) {
            tracing::error!(claim = %uid, error = %e, "releasing claim");
            errors.push(e);
        }
        freed
    }

    /// Releases a claim: stops its MPS control daemons (quit, bounded, then kill), restores
    /// GPU settings the last holder leaves, removes its directories and CDI spec and its
    /// checkpoint entry. Idempotent: an unknown claim returns `released: false`.
    ///
    /// # Errors
    /// `InvalidRequest` for a malformed UID; `Internal` when some host step failed (the claim
    /// stays recorded so a retry finishes the job).
    pub fn unprepare(&self, uid: &str) -> Result<UnprepareResult, ServiceError> {
        config::validate_claim_uid(uid)?;
        let _busy = self.begin_change()?;
        let _claim = self.changes.lock(uid);
        let Some(info) = self.state().claims.get(uid).cloned() else {
            return Ok(UnprepareResult {
                uid: uid.to_string(),
                released: false,
            });
        };
        if !info.attached.is_empty() {
            tracing::warn!(claim = %uid, containers = info.attached.len(), "releasing a claim that still has containers attached");
        }
        match self.teardown(uid, Some(info.resource_version.clone())) {
            None => {
                self.wake_supervisor_for(&info);
                tracing::info!(claim = %uid, "claim released");
                Ok(UnprepareResult {
                    uid: uid.to_string(),
                    released: true,
                })
            }
            Some(e) => Err(e),
        }
    }
}
