//! `prepare`, in order: guard (stopping, stale, a prepared claim asked again:
//! [`Service::prepare`]) → plan (`plan.rs`: each group's config mapped onto its strategy; a
//! MIG group's slices resolved against the node, `strategy/mig/resolve.rs`) → admit (the
//! GPUs' mode words) → `PrepareStarted` on disk (undone unless written) → apply (`apply.rs`:
//! each group's strategy, `strategy/<name>`; for MIG, `strategy/mig/group.rs` makes each
//! slice, recorded the moment its GPU instance exists, then the MPS control daemon on it) →
//! the CDI spec written and checked → `Prepared` on disk (the tombstone lifted). A failure
//! anywhere after `PrepareStarted` is undone by the same teardown an unprepare runs
//! (`unprepare.rs`: each group's strategy stops, then destroys, what its record holds; for
//! MIG, the daemon, then each slice, `strategy/mig/slice.rs`), and a crash by the next
//! start's rollback (`docs/crash-safety.md`).

use std::collections::BTreeMap;
use std::path::Path;

use gpushare_proto::{ErrorCode, PrepareResult, RequestDevices};
use serde_json::Value;

use super::super::plan::GroupPlan;
use super::super::{asked, wants_of, Service, State};
use crate::cdi;
use crate::claim::{Attachment, Claim, Event, Group, Phase, Request};
use crate::config::{self, ClaimSpec};
use crate::error::ServiceError;
use crate::registry::Txn;

impl Service {
    /// Prepares the claim in `claim` (a `ResourceClaim` object). Idempotent: a claim already
    /// prepared is returned as it is with `already_prepared: true`. A refused or failed prepare
    /// leaves nothing behind: no process, directory, mount, CDI file or checkpoint entry.
    ///
    /// # Errors
    /// `InvalidRequest`/`InvalidConfig`/`WrongNode` for bad input, `UnknownDevice`,
    /// `Unsupported` (MIG), `Conflict` with other claims, `Internal` for host failures.
    pub fn prepare(&self, claim: &Value) -> Result<PrepareResult, ServiceError> {
        let spec = config::parse_claim(claim, &self.ctx)?;
        let _busy = self.begin_change()?;
        // Taken before waiting for the claim's lock: a release that finishes while this
        // request waits leaves a later generation, and this request is then stale.
        let arrived = self.state().claim_generation;
        let _claim = self.changes.lock(&spec.uid);
        let resource_version = claim
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .map(str::to_string);
        self.refuse_stale_prepare(&spec.uid, arrived, resource_version.as_deref())?;
        let existing = self.state().claims.get(&spec.uid).cloned();
        // Containers still running on a claim that is prepared afresh keep their slots.
        let mut carried: Vec<Attachment> = Vec::new();
        if let Some(existing) = existing {
            match self.prepare_existing(&spec, &existing)? {
                Again::Answered(r) => return Ok(r),
                Again::Afresh(kept) => carried = kept,
            }
        }
        let (plans, attach_limit) = self.plan(&spec)?;
        // Before anything changes: a node without the toolkit, or whose toolkit spec lacks a
        // GPU of the claim, refuses it here (MIG devices are checked once they exist).
        self.check_driver_devices(&spec.uid, &plans)?;
        let mut info = self.started_claim(&spec, &plans, attach_limit, resource_version);
        self.record_started(&spec, &mut info)?;
        crate::crash::point("prepare.started_saved");
        tracing::info!(claim = %spec.uid, namespace = %spec.namespace, name = %spec.name, "preparing claim");

        // A MIG slice's intent stands until the record naming it is on disk (`Prepared`,
        // below) or the prepare is torn down; then it is struck, on every way out.
        let _intents = self.host.mig_intents.strike_on_drop(&spec.uid);
        match self.apply_plans(&spec, &plans, &info) {
            Ok((groups, requests)) => self.record_prepared(&spec, groups, requests, carried),
            Err(e) => {
                tracing::warn!(claim = %spec.uid, error = %e, "prepare failed; rolling back");
                self.teardown(&spec.uid, None);
                Err(e)
            }
        }
    }

    /// A prepare of a claim the registry holds: answered as it is when it is `Prepared` and
    /// usable, its dead MPS control daemons started again in place when that is all it
    /// lacks; otherwise released first (what a crash or a failed release left), its running
    /// containers' attachments carried over to the fresh prepare.
    fn prepare_existing(&self, spec: &ClaimSpec, existing: &Claim) -> Result<Again, ServiceError> {
        if matches!(existing.phase, Phase::Prepared | Phase::Degraded) {
            asked::refuse_changed(spec, existing)?;
        }
        if existing.phase == Phase::Prepared && self.dead_mps_daemon(existing).is_none() {
            return self.prepared_again(spec, existing).map(Again::Answered);
        }
        // Prepared (or Degraded) with a dead MPS control daemon: start it again in place, so
        // that running containers, which have its pipe directory bind-mounted, reach the new
        // one.
        if matches!(existing.phase, Phase::Prepared | Phase::Degraded)
            && self.restart_dead_daemons(&spec.uid)
        {
            if let Ok(again) = self.claim(&spec.uid) {
                if !Path::new(&again.cdi_spec).exists() {
                    self.write_cdi(&spec.uid, &again.groups, &again)?;
                }
                return Ok(Again::Answered(PrepareResult {
                    uid: again.uid.clone(),
                    requests: again.requests.iter().map(RequestDevices::from).collect(),
                    already_prepared: false,
                }));
            }
        }
        // Left half-done by a crash (PrepareStarted), by a release that failed part-way
        // (Unpreparing), or prepared but with a dead MPS control daemon: nothing else works on
        // it now (we hold its lock), so undo what is left and prepare afresh.
        tracing::warn!(claim = %spec.uid, state = ?existing.phase, "finishing the release of an interrupted claim before preparing it again");
        let carried = existing
            .attached
            .iter()
            .filter(|a| a.pid.is_some_and(|pid| self.host.processes.alive(pid)))
            .cloned()
            .collect();
        if let Some(e) = self.teardown(&spec.uid, None) {
            return Err(ServiceError::new(
                e.code,
                format!(
                    "claim {} was left {:?} and cannot be released yet: {}",
                    spec.uid, existing.phase, e.message
                ),
            ));
        }
        // Its MPS control daemons are gone: their watches go too, whatever comes next.
        self.wake_supervisor_for(existing);
        Ok(Again::Afresh(carried))
    }

    /// The answer to a prepare of a claim that is `Prepared`: its CDI IDs, which must resolve
    /// (the driver's spec and the claim's written again if gone) and whose device nodes must
    /// all be there, since the kubelet is about to hand them to the runtime.
    fn prepared_again(
        &self,
        spec: &ClaimSpec,
        existing: &Claim,
    ) -> Result<PrepareResult, ServiceError> {
        let not_ready = |m: String| {
            ServiceError::new(
                ErrorCode::NotReady,
                format!("claim {} is prepared but not usable: {m}", spec.uid),
            )
        };
        let requests = self
            .prepared_requests(&spec.uid, &existing.groups, &existing.requests)
            .map_err(|e| not_ready(e.to_string()))?;
        if !Path::new(&existing.cdi_spec).exists() {
            tracing::warn!(claim = %spec.uid, path = %existing.cdi_spec, "CDI spec of a prepared claim is missing; writing it again");
            self.write_cdi(&spec.uid, &existing.groups, existing)?;
        }
        // A GPU's node removed since (a driver reload, an administrator) would fail the
        // container's start.
        self.verify_cdi(&spec.uid, &requests)
            .map_err(|e| not_ready(e.to_string()))?;
        if requests != existing.requests {
            self.record_requests(&spec.uid, &requests)?;
        }
        Ok(PrepareResult {
            uid: existing.uid.clone(),
            requests: requests.iter().map(RequestDevices::from).collect(),
            already_prepared: true,
        })
    }

    /// The claim as a prepare records it first (`PrepareStarted`), its groups as planned.
    fn started_claim(
        &self,
        spec: &ClaimSpec,
        plans: &[GroupPlan],
        attach_limit: Option<u32>,
        resource_version: Option<String>,
    ) -> Claim {
        Claim {
            uid: spec.uid.clone(),
            namespace: spec.namespace.clone(),
            name: spec.name.clone(),
            phase: Phase::PrepareStarted,
            groups: plans.iter().map(GroupPlan::planned).collect(),
            requests: self.request_devices(spec),
            cdi_spec: cdi::spec_path(&self.cfg.cdi_dir, &spec.uid)
                .display()
                .to_string(),
            attach_limit,
            attached: vec![],
            degraded: BTreeMap::new(),
            last_error: None,
            restarts: 0,
            resource_version,
            generation: 0,
        }
    }

    /// Admits `info` to its GPUs and records it `PrepareStarted` on disk, with its generation;
    /// undone (the claim gone from the registry, its GPUs given back) unless written.
    fn record_started(&self, spec: &ClaimSpec, info: &mut Claim) -> Result<(), ServiceError> {
        let wants = wants_of(info);
        self.admit(&spec.uid, &wants)?;
        let mut tx = Txn::begin(self);
        tx.after_undo(|| self.host.modes.release(self.host.backend.as_ref(), &wants));
        let mut st = self.state();
        st.placement.record(&spec.uid, &wants);
        let (uid, held) = (spec.uid.clone(), wants.clone());
        tx.on_undo(move |st: &mut State| {
            for (gpu, _, _) in &held {
                st.placement.release(&uid, gpu);
            }
            st.claims.remove(&uid);
        });
        st.claim_generation += 1;
        info.generation = st.claim_generation;
        st.claims.insert(spec.uid.clone(), info.clone());
        tx.commit(st, |st| self.commit(st))
    }

    /// Records the claim `Prepared` with its groups as applied and its CDI IDs, its
    /// attachments carried over, its tombstone lifted; torn down when that cannot be written.
    fn record_prepared(
        &self,
        spec: &ClaimSpec,
        groups: Vec<Group>,
        requests: Vec<Request>,
        carried: Vec<Attachment>,
    ) -> Result<PrepareResult, ServiceError> {
        let mut tx = Txn::begin(self);
        let mut st = self.state();
        let (saved, uid) = (st.claims.get(&spec.uid).cloned(), spec.uid.clone());
        tx.on_undo(move |st: &mut State| st.claims.restore(&uid, saved));
        if let Some(c) = st.claims.get_mut(&spec.uid) {
            c.groups = groups;
            c.requests = requests.clone();
        }
        if let Some(a) = st.claims.attachments_mut(&spec.uid) {
            *a = carried;
        }
        if let Err(e) = st.claims.transition(&spec.uid, Event::Applied) {
            drop(st);
            drop(tx);
            self.teardown(&spec.uid, None);
            return Err(ServiceError::internal(format!("claim {}: {e}", spec.uid)));
        }
        // A prepare of this claim is what the kubelet wants now: an older release no longer
        // stands against it.
        let (tombstone, uid) = (st.tombstones.remove(&spec.uid), spec.uid.clone());
        tx.on_undo(move |st: &mut State| st.tombstones.restore(&uid, tombstone));
        let prepared = st.claims.get(&spec.uid).cloned();
        if let Err(e) = tx.commit(st, |st| self.commit(st)) {
            self.teardown(&spec.uid, None);
            return Err(e);
        }
        if let Some(c) = &prepared {
            let _ = self.write_host_record(&c.uid);
        }
        crate::crash::point("prepare.completed_saved");
        if let Some(c) = &prepared {
            self.wake_supervisor_for(c);
        }
        tracing::info!(claim = %spec.uid, "claim prepared");
        Ok(PrepareResult {
            uid: spec.uid.clone(),
            requests: requests.iter().map(RequestDevices::from).collect(),
            already_prepared: false,
        })
    }
}

/// What a prepare of a claim the registry holds comes to.
enum Again {
    /// Answered as the claim is.
    Answered(PrepareResult),
    /// Released; prepared afresh, with these attachments carried over.
    Afresh(Vec<Attachment>),
}
