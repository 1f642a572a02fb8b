//! The start-up reconcile of prepared claims' MIG slices: an instance that vanished while
//! gpushared was away (a GPU reset, an administrator's `nvidia-smi mig -dci` / `-dgi`) is
//! recreated at the claim's placement, with the claim's CDI spec rewritten (the capability
//! device nodes follow the new GPU- and compute-instance IDs) and an MPS control daemon on the
//! slice started again on the new MIG UUID; where that cannot be done the claim is `Degraded`
//! with the reason, and its slice stays its own (admission counts recorded placements) until
//! it is released. MIG instances do not survive a GPU reset on hardware, MIG mode does
//! (NVIDIA's MIG user guide, "Device Reset"); NVIDIA's DRA driver tracks the MIG UUID to tell
//! a reused GI ID from its own instance (NVIDIA/k8s-dra-driver-gpu, its DynamicMIG code in
//! `cmd/gpu-kubelet-plugin`).

use gpushare_proto::{MigInstanceInfo, MigOrigin};

use crate::claim::{Cause, Claim, Event, Phase};

use super::{now_secs, Service};
use crate::strategy::mps::launch_of;

mod slice;

/// What the reconcile found of one recorded slice.
enum Slice {
    /// Its instance is there, as recorded.
    Intact,
    /// Its instance was gone and is made again: the new record.
    Recreated(MigInstanceInfo),
    /// Gone, and why it cannot be made again.
    Lost(String),
}

/// What the first pass of the start-up reconcile did to one claim's slices, for the second
/// pass (after the driver's spec is generated).
pub(super) struct MigRecovery {
    uid: String,
    /// The claim as recorded before the reconcile.
    before: Claim,
    /// Why the claim is `Degraded`, so far.
    lost: Vec<String>,
    /// A slice was made again: its CDI IDs are checked in the second pass.
    recreated: bool,
}

impl Service {
    /// Checks every prepared (or degraded) claim's MIG slices against the GPUs, at start and
    /// after the sweep of instances no claim owns (so a stray left at a claim's placement is
    /// gone first): each slice whose instance no longer exists with its recorded identity
    /// (GI and CI IDs, placement, MIG UUID) is recreated at its placement, with the claim's
    /// spec and MPS control daemon following it, else its claim is to become `Degraded`
    /// naming the slice and why. Claims are done in UID order. The claims' CDI IDs are
    /// checked by [`Service::settle_mig_claims`], once the driver's spec is generated with
    /// every recreated slice in it.
    pub(super) fn recreate_mig_slices(&self) -> Vec<MigRecovery> {
        let uids: Vec<String> = self
            .state()
            .claims
            .values()
            .filter(|c| matches!(c.phase, Phase::Prepared | Phase::Degraded))
            .filter(|c| c.groups.iter().any(|g| !g.slices().is_empty()))
            .map(|c| c.uid.clone())
            .collect();
        // Nothing is served yet (the start-up reconcile runs before the socket exists): no
        // claim lock is needed, and none may be taken on the runtime's thread.
        uids.iter()
            .filter_map(|uid| self.recreate_claim_slices(uid))
            .collect()
    }

    /// The second pass, after the driver's spec was generated (once, with the alias of every
    /// slice made again: `driver_spec::alias`): each claim whose slices were made again gets
    /// its CDI IDs checked against that spec, without running the generator again; each
    /// claim becomes `Degraded` with what was lost, or `Prepared` again when a lost slice of
    /// it is back.
    pub(super) fn settle_mig_claims(&self, recovered: Vec<MigRecovery>) {
        for r in recovered {
            self.settle_mig_claim(r);
        }
    }

    fn recreate_claim_slices(&self, uid: &str) -> Option<MigRecovery> {
        let info = self.state().claims.get(uid).cloned()?;
        let mut lost: Vec<String> = Vec::new();
        let mut changed_groups: Vec<usize> = Vec::new();
        for (gi, g) in info.groups.iter().enumerate() {
            for (ri, rec) in g.slices().iter().enumerate() {
                match self.check_slice(uid, gi, ri, rec) {
                    Slice::Intact => {}
                    Slice::Recreated(mut new) => {
                        // The claim's CDI IDs keep the name it was prepared with.
                        new.original_uuid = super::cdi_spec::driver_name_of(rec).to_string();
                        if new.origin == MigOrigin::Existing {
                            tracing::warn!(claim = %uid, device = %rec.device, old_uuid = %rec.uuid, uuid = %new.uuid, gi = new.gi_id, "MIG slice vanished while gpushared was away; one made again at its placement by someone else is taken as it is");
                        } else {
                            tracing::warn!(claim = %uid, device = %rec.device, old_uuid = %rec.uuid, uuid = %new.uuid, gi = new.gi_id, "MIG slice vanished while gpushared was away; recreated at its placement");
                        }
                        self.set_slice(uid, gi, ri, &new);
                        if !changed_groups.contains(&gi) {
                            changed_groups.push(gi);
                        }
                    }
                    Slice::Lost(why) => {
                        tracing::error!(claim = %uid, device = %rec.device, reason = %why, "MIG slice vanished while gpushared was away and cannot be recreated; claim Degraded");
                        lost.push(format!(
                            "MIG device {} vanished while gpushared was away (a GPU reset, or destroyed by hand) and could not be recreated at placement {}:{}: {why}",
                            rec.device, rec.placement_start, rec.memory_slices
                        ));
                    }
                }
            }
        }
        for &gi in &changed_groups {
            // A daemon that does not start on the new slices is the daemon's fault, not the
            // slices': restarted with backoff like any dead daemon (follow_new_slices).
            self.follow_new_slices(uid, gi);
        }
        if !changed_groups.is_empty() {
            let after = self.state().claims.get(uid).cloned()?;
            // Containers started from now on get the new instances' capability device nodes.
            if let Err(e) = self.write_cdi(uid, &after.groups, &after) {
                tracing::error!(claim = %uid, error = %e, "rewriting the CDI spec for recreated MIG slices");
                lost.push(format!("rewriting the CDI spec: {}", e.message));
            }
        }
        Some(MigRecovery {
            uid: uid.to_string(),
            before: info,
            lost,
            recreated: !changed_groups.is_empty(),
        })
    }

    /// The second pass for one claim (see [`Service::settle_mig_claims`]): where its slices
    /// were made again, its CDI IDs are checked; then its phase follows what was lost, and its
    /// host record is written again if the claim changed.
    fn settle_mig_claim(&self, r: MigRecovery) {
        let MigRecovery {
            uid,
            before: info,
            mut lost,
            recreated,
        } = r;
        let uid = uid.as_str();
        let Some(after) = self.state().claims.get(uid).cloned() else {
            return;
        };
        if recreated {
            // The driver spec names a MIG slice's device by its MIG UUID, which the new
            // instance does not share, and kubelet keeps the IDs it was handed for the claim's
            // whole life: the spec keeps the slice's first name as an alias of its new device
            // (`driver_spec::alias`), so the same IDs give the recreated slice. The spec was
            // generated after every slice was made again: a name it left out stays out until
            // the node changes, so it is not generated again here (that took one run of the
            // generator per claim). The IDs are checked as a prepare checks them before the
            // claim is ready.
            self.check_driver_aliases(&after, &mut lost);
            self.check_recreated_ids(uid, &after, &mut lost);
        }
        if !self.record_slice_outcome(uid, &lost) {
            return;
        }
        // The registry lock is dropped before the write: `write_host_record` takes it again.
        let now = self.state().claims.get(uid).cloned();
        if now.is_some_and(|c| c != info) {
            let _ = self.write_host_record(uid);
        }
    }

    /// Adds to `lost` each of claim `after`'s slice names the driver's CDI spec could not keep
    /// as an alias: the claim's CDI device IDs name its slices by those first names, so a name
    /// left out of the spec leaves an ID that resolves to nothing.
    fn check_driver_aliases(&self, after: &Claim, lost: &mut Vec<String>) {
        if let Some(d) = &self.cfg.driver_spec {
            for m in after.groups.iter().flat_map(|g| g.slices()) {
                if let Some(why) = d.alias_left_out(&m.original_uuid) {
                    lost.push(format!(
                        "the driver's CDI spec cannot keep the name {} the claim's CDI device IDs give MIG device {}: {why}",
                        m.original_uuid, m.device
                    ));
                }
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
            super::cdi_spec::DriverLookup::InstalledOnly,
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

    /// Whether every MIG slice `c` records is there as recorded (what a restarted MPS control
    /// daemon on them needs to serve).
    pub(super) fn mig_intact(&self, c: &Claim) -> bool {
        c.slices().all(|rec| {
            self.host
                .backend
                .mig_instances(&rec.gpu_uuid)
                .unwrap_or_default()
                .iter()
                .any(|i| crate::strategy::mig::is_whole_instance_of(rec, i))
        })
    }

    fn set_slice(&self, uid: &str, gi: usize, ri: usize, rec: &MigInstanceInfo) {
        let mut st = self.state();
        if let Some(m) = st
            .claims
            .get_mut(uid)
            .and_then(|c| c.groups.get_mut(gi))
            .and_then(|g| g.slices_mut()?.get_mut(ri))
        {
            *m = rec.clone();
        }
    }

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
}
