//! What the service lends MIG's code beyond one claim's group (`strategy/mig/effects.rs`):
//! the claims as the published view has them, and, for the start-up recovery of vanished
//! slices, the registry, the claims' CDI specs and host records, and the MPS control daemons
//! on slices made again.

use super::{cdi_spec, now_secs, Service};
use crate::claim::{Cause, Claim, Event, MigSlice};
use crate::error::ServiceError;
use crate::strategy::mig::{Claimed, ClaimsView, RecoveredClaims};
use crate::strategy::mps::launch_of;

impl ClaimsView for Service {
    fn claimed(&self, except: Option<&str>) -> Claimed {
        let view = self.records.view.load();
        Claimed::of(
            view.claims
                .values()
                .map(|c| &**c)
                .filter(|c| except.is_none_or(|uid| c.uid != uid)),
        )
    }
}

/// The service as the start-up recovery of MIG slices reaches it.
pub(super) struct Recovering<'s>(pub(super) &'s Service);

impl ClaimsView for Recovering<'_> {
    fn claimed(&self, except: Option<&str>) -> Claimed {
        self.0.claimed(except)
    }
}

impl RecoveredClaims for Recovering<'_> {
    fn uids(&self, keep: &dyn Fn(&Claim) -> bool) -> Vec<String> {
        self.0
            .state()
            .claims
            .values()
            .filter(|c| keep(c))
            .map(|c| c.uid.clone())
            .collect()
    }

    fn claim(&self, uid: &str) -> Option<Claim> {
        self.0.state().claims.get(uid).cloned()
    }

    fn set_slice(&self, uid: &str, gi: usize, ri: usize, rec: &MigSlice) {
        let mut st = self.0.state();
        if let Some(m) = st
            .claims
            .get_mut(uid)
            .and_then(|c| c.groups.get_mut(gi))
            .and_then(|g| g.slices_mut()?.get_mut(ri))
        {
            *m = rec.clone();
        }
    }

    fn commit(&self) -> Result<(), ServiceError> {
        self.0.commit(self.0.state())
    }

    fn follow_new_slices(&self, uid: &str, gi: usize) {
        self.0.follow_new_slices(uid, gi);
    }

    fn write_cdi(&self, uid: &str, claim: &Claim) -> Result<(), ServiceError> {
        self.0.write_cdi(uid, &claim.groups, claim)
    }

    fn check_cdi_ids(&self, uid: &str, claim: &Claim, lost: &mut Vec<String>) {
        self.0.check_recreated_ids(uid, claim, lost);
    }

    fn record_slice_outcome(&self, uid: &str, lost: &[String]) -> bool {
        self.0.record_slice_outcome(uid, lost)
    }

    fn write_host_record(&self, uid: &str) {
        let _ = self.0.write_host_record(uid);
    }
}

impl Service {
    /// After slices of group `gi` were recreated: an MPS control daemon on them is started
    /// again on the new MIG UUIDs, in its directories (running containers have them mounted),
    /// with its limits read back; then the claim's daemon causes go. One that does not start
    /// makes the claim `Degraded` (its daemon down, its restart failed) and is restarted with
    /// backoff, on the new slices.
    fn follow_new_slices(&self, uid: &str, gi: usize) {
        let Some(g) = self
            .state()
            .claims
            .get(uid)
            .and_then(|c| c.groups.get(gi).cloned())
        else {
            return;
        };
        let Some(old) = g.mps() else {
            return;
        };
        let mut launch = launch_of(old);
        launch.visible_devices = g.slices().iter().map(|m| m.uuid.clone()).collect();
        let result = self.host.mps.restart(&launch);
        let mut st = self.state();
        let Some(group) = st.claims.get_mut(uid).and_then(|c| c.groups.get_mut(gi)) else {
            return;
        };
        match result {
            Ok(mut new) => {
                tracing::info!(claim = %uid, old_pid = old.control_daemon_pid, pid = new.control_daemon_pid, "MPS control daemon started again on the recreated MIG slice(s)");
                new.restarts = old.restarts;
                if let Some(m) = group.mps_mut() {
                    *m = new;
                }
                self.daemons_running(&mut st, uid);
                let _ = self.commit(st);
                self.wake_supervisor();
            }
            Err(e) => {
                // The record follows the new slices, so that the supervisor's restart uses them.
                if let Some(m) = group.mps_mut() {
                    m.visible_devices = launch.visible_devices;
                }
                let down = format!(
                    "at {} s after the epoch: its MIG slice(s) were made again, and the MPS control daemon on them must start again",
                    now_secs()
                );
                super::restarts::record_restart_failed(&mut st, uid, old, &e, Some(down));
                let _ = self.commit(st);
            }
        }
    }

    /// Resolves claim `uid`'s CDI device IDs against the installed driver spec (without
    /// running the generator) and checks them as a prepare does, recording the resolved
    /// requests; what fails is added to `lost`, so that the claim becomes `Degraded`.
    fn check_recreated_ids(&self, uid: &str, after: &Claim, lost: &mut Vec<String>) {
        match self.prepared_requests_with(
            uid,
            &after.groups,
            &after.requests,
            cdi_spec::DriverLookup::InstalledOnly,
        ) {
            Ok(requests) => {
                if let Err(why) = self.verify_cdi(uid, &requests) {
                    tracing::error!(claim = %uid, error = %why, "the CDI device IDs of recreated MIG slices do not resolve");
                    lost.push(format!(
                        "the claim's CDI device IDs after recreating its MIG slice(s): {why}"
                    ));
                }
                if let Some(c) = self.state().claims.get_mut(uid) {
                    c.requests = requests;
                }
            }
            Err(e) => {
                tracing::error!(claim = %uid, error = %e, "the driver's CDI spec lacks a recreated MIG slice");
                lost.push(format!(
                    "naming the recreated MIG slice(s) in the driver's CDI spec: {e}"
                ));
            }
        }
    }

    /// Records the reconcile's outcome in claim `uid`'s phase and commits it: `Degraded` with
    /// what was `lost`, or `Prepared` again when nothing was lost and a slice of it had been
    /// lost before. Returns `false` (nothing recorded) when the claim is gone, so that no host
    /// record is written for it.
    fn record_slice_outcome(&self, uid: &str, lost: &[String]) -> bool {
        let mut st = self.state();
        let Some(c) = st.claims.get_mut(uid) else {
            return false;
        };
        if !lost.is_empty() {
            let detail = format!("at {} s after the epoch: {}", now_secs(), lost.join("; "));
            if let Err(e) =
                st.claims
                    .degrade(uid, Event::SliceLost, vec![(Cause::SliceLost, detail)])
            {
                tracing::error!(claim = %uid, error = %e, "recording a lost MIG slice");
            }
        } else if c.causes().contains(Cause::SliceLost) {
            tracing::info!(claim = %uid, "every MIG slice of the claim is there again");
            if let Err(e) = st.claims.transition(uid, Event::SlicesIntact) {
                tracing::error!(claim = %uid, error = %e, "recording a recreated MIG slice");
            }
        }
        let _ = self.commit(st);
        true
    }
}
