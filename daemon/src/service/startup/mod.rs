//! The start-up reconcile: what the records, the host records and the host say, made one
//! again before the socket exists. Its order is `docs/crash-safety.md`, "Start-up
//! reconcile", written once there; [`Service::reconcile`] is that order, one named step per
//! line, each step's doc saying which of the document's it is. The records are read and
//! checked in [`records`]; each kept claim is brought back by `service/revive.rs`, its MIG
//! slices by `strategy/mig/recover.rs`.

mod records;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::persisted::{Quarantine, HOST_RECORD};
use super::revive::SpecListing;
use super::{reapply_gpu_settings, wants_of, Service};
use crate::claim::{Claim, Phase};
use crate::parallel::in_parallel;
use crate::store::{ClaimRecord, Loaded};
use crate::strategy::mig::{self, Intent};
use crate::strategy::mps::MpsDirs;
use records::ToReconcile;

impl Service {
    /// The start-up reconcile (see [`Service::with_boot_id`]), in the order of
    /// `docs/crash-safety.md`, "Start-up reconcile".
    pub(super) fn reconcile(&self, mut loaded: Loaded, boot_id: String) {
        // Step 1: the records, checked, and the claims of host records the store lacks.
        let ToReconcile {
            claims,
            quarantine,
            host_records,
        } = self.claims_to_reconcile(&mut loaded);
        // Step 2: a reboot is a new boot ID.
        let rebooted = self.take_store_state(&mut loaded, boot_id);
        self.adopt_claims(claims, &quarantine, rebooted, &loaded);
        // Step 7's first part, before the rollbacks: what a crash left between making a GPU
        // instance and recording it.
        let honoured = self.sweep_left_intents(rebooted, &quarantine);
        self.kill_half_started_daemons();
        // Steps 3 and 4: rollbacks and revivals, at once.
        self.roll_back_or_revive(rebooted, &host_records);
        // Step 5: what is ours and no claim's.
        self.remove_orphans();
        // Step 6, after the rollbacks, so that only what the remaining claims asked is
        // applied.
        reapply_gpu_settings(self.host.backend.as_ref(), &self.state().placement);
        // Step 7's last part, after the rollbacks too (which destroyed the rolled-back
        // claims' recorded MIG instances, and turned MIG mode off after the last slice
        // carrying the flag): MIG mode a crashed prepare turned on before its slice was
        // recorded goes off again.
        {
            let st = self.state();
            mig::leave_mig_mode_at_start(self.host.backend.as_ref(), &honoured, st.claims.values());
        }
        self.host.mig_intents.clear();
        // Step 8: the MIG slices of prepared claims that vanished while gpushared was away
        // (a GPU reset, a destroy by hand), recreated at their placements, or the claim is
        // Degraded. The driver's spec of the node as it is now is generated once, after the
        // rollbacks and the sweep (which destroyed MIG devices) and after every slice was
        // made again, so it has the alias each one keeps; then the claims whose slices were
        // made again get their CDI IDs checked against it (one generation per such claim
        // took a start with N of them N+1 runs of the generator, each up to its timeout,
        // before the socket existed).
        let recovered = self.recreate_mig_slices();
        self.regenerate_driver_spec("at start");
        self.settle_mig_claims(recovered);
        self.become_ready();
    }

    /// Takes the store's boot ID, generation and tombstones into the registry, and says
    /// whether the host was rebooted since the records were written (another boot ID: step
    /// 2, every claim's host setup is redone).
    fn take_store_state(&self, loaded: &mut Loaded, boot_id: String) -> bool {
        let rebooted =
            !loaded.boot_id.is_empty() && !boot_id.is_empty() && loaded.boot_id != boot_id;
        let mut st = self.state();
        st.boot_id = boot_id;
        st.claim_generation = loaded.generation;
        st.tombstones = crate::registry::Tombstones::loaded(std::mem::take(&mut loaded.tombstones));
        if let Some((aside, why)) = &loaded.quarantined {
            tracing::error!(moved_to = %aside.display(), reason = %why, "checkpoint was corrupt; moved aside, rebuilding the claims from their host records");
            st.quarantined = Some(format!("moved to {}: {why}", aside.display()));
        }
        if rebooted {
            tracing::warn!("the host was rebooted since the checkpoint was written; redoing every claim's host setup");
        }
        rebooted
    }

    /// Takes every claim into the registry with its holds on the GPUs' mode words, admitted by
    /// the same rules as a prepare, so that the rollbacks release through the mode words
    /// (restoring a GPU's settings when its last holder goes) like any other release. The
    /// store's records first: where one rebuilt from a host record alone collides with one
    /// the store has, the store's is the claim and the other is refused (kept and shown).
    /// After a reboot no container is attached.
    fn adopt_claims(
        &self,
        claims: BTreeMap<String, (Claim, bool)>,
        quarantine: &Quarantine,
        rebooted: bool,
        loaded: &Loaded,
    ) {
        let mut st = self.state();
        let mut claims: Vec<(String, (Claim, bool))> = claims.into_iter().collect();
        claims.sort_by_key(|(_, (_, rebuilt))| *rebuilt);
        for (uid, (mut info, write)) in claims {
            let wants = wants_of(&info);
            if let Err(e) = self.host.modes.adopt(&uid, &wants) {
                tracing::error!(claim = %uid, error = %e, "checkpointed claim conflicts with another; not re-adopted");
                let path = if write {
                    self.cfg.run_dir.join("claims").join(&uid).join(HOST_RECORD)
                } else {
                    self.records.store.claim_path(&uid)
                };
                let bytes = if write {
                    serde_json::to_vec(&crate::store::HostRecord::of(&info)).ok()
                } else {
                    serde_json::to_vec(&ClaimRecord::of(&info)).ok()
                };
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
                info.attached.clear();
            }
            st.claim_generation = st.claim_generation.max(info.generation);
            st.claims.adopt(uid.clone(), info);
            if write || loaded.other_format.contains(&uid) {
                st.claims.mark_durable(&uid);
            }
        }
    }

    /// What the last run was making when it ended, and for which claims, as far as the
    /// records vouch for it (`strategy/mig/start.rs`): a GPU instance such an intent names that
    /// no record owns and that holds no compute instance is what a crash between making and
    /// recording it leaves, and is destroyed now, while the records that vouch for it are
    /// still there (a start killed after the rollbacks finds it gone). Returns the honoured
    /// intents, whose MIG mode the start turns off again after the rollbacks.
    fn sweep_left_intents(&self, rebooted: bool, quarantine: &Quarantine) -> Vec<Intent> {
        let left = self.host.mig_intents.left_for_sweep(rebooted);
        let st = self.state();
        let left = mig::honoured_intents(left, st.claims.values(), &quarantine.refused_claims());
        mig::sweep_at_start(self.host.backend.as_ref(), &left, st.claims.values());
        left.honoured
    }

    /// Half-started MPS daemons of claims about to be rolled back (and of no claim at all) go
    /// first: one still starting holds no lock yet and would keep writing into the
    /// directories the rollback removes.
    fn kill_half_started_daemons(&self) {
        let live_groups: Vec<PathBuf> = self
            .state()
            .claims
            .values()
            .filter(|c| matches!(c.phase, Phase::Prepared | Phase::Degraded))
            .flat_map(|c| c.groups.iter())
            .filter_map(|g| g.mps())
            .map(|m| MpsDirs::from_pipe(Path::new(&m.pipe_dir)).root)
            .collect();
        crate::strategy::mps::kill_strays(
            &self.host.mps,
            self.host.processes.as_ref(),
            &self.cfg.run_dir.join("claims"),
            &live_groups,
        );
    }

    /// Rolls back every claim a crash left half-done and revives every other (steps 3 and
    /// 4), all at once: each claim's rollback or re-adoption waits on its own MPS control
    /// daemons (a `quit` that is not taken waits out the MPS timeout before the kill), so one
    /// after another a start that cannot re-adopt them (say, after the MPS control program
    /// changed) took that wait once per claim. Only claims that may wait on an MPS control
    /// daemon (or on anything a rollback undoes) need a thread each; the others' work is a
    /// few local file checks, which a few threads (`crate::parallel`) do faster than many
    /// contending for the registry. The two sets go on side by side.
    fn roll_back_or_revive(&self, rebooted: bool, host_records: &BTreeMap<String, Claim>) {
        let (mut waiting, mut local) = (Vec::new(), Vec::new());
        for c in self.state().claims.values() {
            let item = (c.uid.clone(), c.phase);
            if !matches!(c.phase, Phase::Prepared | Phase::Degraded) || c.runs_mps() {
                waiting.push(item);
            } else {
                local.push(item);
            }
        }
        let specs = SpecListing::of(&self.cfg.cdi_dir);
        let one = |(uid, phase): &(String, Phase)| match phase {
            Phase::PrepareStarted | Phase::Unpreparing => {
                tracing::warn!(claim = %uid, state = ?phase, "rolling back a claim a crash left half-done");
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
    }

    /// Ready: the reconciled registry written, and the store's own record with this boot's ID
    /// (even when nothing changed). A write that fails is the checkpoint error until one
    /// succeeds.
    fn become_ready(&self) {
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
        if let Err(e) = self.records.store.write_meta(&meta) {
            let msg = format!(
                "writing checkpoint {}: {e}",
                self.records
                    .store
                    .dir()
                    .join(crate::store::STORE_FILE)
                    .display()
            );
            tracing::error!(error = %msg, "cannot write the checkpoint at start; changing requests fail until it can be written");
            self.state().checkpoint_error = Some(msg);
        }
    }
}
