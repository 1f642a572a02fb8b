//! `attach`: ties a container to its claim (the hook, at `createRuntime`).
//!
//! Guard (the request, the claim's phase) → plan (the container's record, stale slots) →
//! admit (the attach limit) → transaction (the slot, undone unless kept) → apply (the
//! claim's run-directory record, which keeps the slot across a crash of gpushared: see
//! `docs/crash-safety.md`, "Attachments") → commit.
//!
//! Nothing here waits for a disk flush, and the MPS control daemon's liveness is its pidfd's
//! (`Service::daemon_gone`), not a scan of `/proc/locks`.

use gpushare_proto::{AttachParams, ErrorCode};

use super::super::{now_secs, Service, State};
use crate::claim::{Attachment, Cause, Phase, Pod};
use crate::config;
use crate::error::ServiceError;
use crate::registry::Txn;

impl Service {
    /// Ties a container to its claim (called by the hook at `createRuntime`). Idempotent per
    /// container id.
    ///
    /// # Errors
    /// `NotFound` for an unknown claim, `NotReady` when the claim or its MPS control daemon is
    /// not ready, `LimitReached` at the claim's `replicas`, `Internal` when the claim's
    /// run-directory record cannot be written (the slot is then not taken).
    pub fn attach(&self, p: &AttachParams) -> Result<Attachment, ServiceError> {
        check_params(p)?;
        // What reads /proc (the container's cgroup, whether the claim's MPS control daemon
        // runs) is done before taking the registry lock.
        let cgroup = p
            .pid
            .and_then(|pid| self.host.mps.ops().machine.cgroup(pid));
        self.refuse_dead_daemon(p)?;
        let mut tx = Txn::begin(self);
        let mut st = self.state();
        self.guard_attach(&st, p)?;
        let existing = st.claims[&p.claim_uid]
            .attached
            .iter()
            .find(|a| a.container_id == p.container_id)
            .cloned();
        let attachment = match existing {
            Some(a) if a.pid == p.pid => return Ok(a),
            // The same container id started again (a restart in place): its record follows
            // the new process, so that the old pid's death does not free a live slot.
            Some(a) => Attachment {
                pid: p.pid,
                cgroup,
                bundle: p.bundle.clone(),
                pod: p.pod.clone().map(Pod::from).or(a.pod.clone()),
                ..a
            },
            None => {
                self.admit_container(&mut st, p)?;
                Attachment {
                    claim_uid: p.claim_uid.clone(),
                    container_id: p.container_id.clone(),
                    pid: p.pid,
                    cgroup,
                    bundle: p.bundle.clone(),
                    attached_at: now_secs(),
                    pod: p.pod.clone().map(Pod::from),
                }
            }
        };
        let saved = st.claims[&p.claim_uid].attached.clone();
        let uid = p.claim_uid.clone();
        tx.on_undo(move |st: &mut State| {
            if let Some(a) = st.claims.attachments_mut(&uid) {
                *a = saved;
            }
        });
        if let Some(list) = st.claims.attachments_mut(&p.claim_uid) {
            list.retain(|a| a.container_id != p.container_id);
            list.push(attachment.clone());
        }
        tx.commit(st, |st| {
            st.unlock();
            self.write_host_record(&p.claim_uid)
        })?;
        let pod = p.pod.as_ref().map(ToString::to_string).unwrap_or_default();
        tracing::info!(claim = %p.claim_uid, container = %p.container_id, pid = ?p.pid, pod, "container attached");
        Ok(attachment)
    }

    /// Refuses (`NotReady`) an attach to a claim seen `Prepared` whose MPS control daemon is
    /// gone. What reads /proc is done before taking the registry lock, on the published view,
    /// and only for a claim seen Prepared: any other state (Degraded with its reason, above
    /// all) is answered under the lock.
    fn refuse_dead_daemon(&self, p: &AttachParams) -> Result<(), ServiceError> {
        let seen = self.records.view.load();
        let Some(claim) = seen
            .claims
            .get(&p.claim_uid)
            .filter(|c| c.phase == Phase::Prepared)
        else {
            return Ok(());
        };
        match self.daemon_gone(claim) {
            Some(pid) => Err(ServiceError::new(
                ErrorCode::NotReady,
                format!(
                    "claim {}: its MPS control daemon (pid {pid}) is not running",
                    p.claim_uid
                ),
            )),
            None => Ok(()),
        }
    }

    /// Refuses an attach to a claim that is not there or not `Prepared`.
    fn guard_attach(&self, st: &State, p: &AttachParams) -> Result<(), ServiceError> {
        let claim = st.claims.get(&p.claim_uid).ok_or_else(|| {
            ServiceError::new(
                ErrorCode::NotFound,
                format!(
                    "claim {} is not prepared on node {}",
                    p.claim_uid, self.cfg.node_name
                ),
            )
        })?;
        if claim.phase == Phase::Degraded {
            let causes = claim.causes();
            let what = if causes.contains(Cause::SliceLost) {
                "release the claim; it can be prepared again once its MIG slice can be made"
            } else if causes.contains(Cause::GpuMissing) {
                "release the claim: a GPU it names is not on this node"
            } else {
                "gpushared is restarting its MPS control daemon, retry later"
            };
            return Err(ServiceError::new(
                ErrorCode::NotReady,
                format!(
                    "claim {} is Degraded ({}); {what}",
                    p.claim_uid,
                    claim
                        .last_error
                        .as_deref()
                        .unwrap_or("MPS control daemon died")
                ),
            ));
        }
        if claim.phase != Phase::Prepared {
            return Err(ServiceError::new(
                ErrorCode::NotReady,
                format!("claim {} is {:?}, not ready", p.claim_uid, claim.phase),
            ));
        }
        Ok(())
    }

    /// Admits one more container to the claim under its attach limit (`replicas`), after
    /// dropping the containers whose process is gone: one whose init process died without
    /// its poststop hook (a runtime crash) must not hold a slot forever.
    fn admit_container(&self, st: &mut State, p: &AttachParams) -> Result<(), ServiceError> {
        let stale: Vec<String> = st.claims[&p.claim_uid]
            .attached
            .iter()
            .filter(|a| a.pid.is_some_and(|pid| !self.host.processes.alive(pid)))
            .map(|a| a.container_id.clone())
            .collect();
        if !stale.is_empty() {
            tracing::warn!(claim = %p.claim_uid, containers = ?stale, "detaching containers whose process is gone");
            if let Some(a) = st.claims.attachments_mut(&p.claim_uid) {
                a.retain(|a| !stale.contains(&a.container_id));
            }
        }
        let claim = &st.claims[&p.claim_uid];
        if let Some(limit) = claim.attach_limit {
            if claim.attached.len() >= limit as usize {
                return Err(ServiceError::new(
                    ErrorCode::LimitReached,
                    format!(
                        "claim {} ({}/{}) already has {} of {limit} containers attached (replicas: {limit})",
                        p.claim_uid,
                        claim.namespace,
                        claim.name,
                        claim.attached.len()
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn check_params(p: &AttachParams) -> Result<(), ServiceError> {
    config::validate_claim_uid(&p.claim_uid)?;
    if p.container_id.is_empty() {
        return Err(ServiceError::new(
            ErrorCode::InvalidRequest,
            "container_id is empty",
        ));
    }
    if let Some(pid) = p.pid.filter(|pid| *pid <= 0) {
        return Err(ServiceError::new(
            ErrorCode::InvalidRequest,
            format!("pid must be a positive process id, got {pid}"),
        ));
    }
    if let Some(pod) = p.pod.as_ref().filter(|pod| !pod.is_valid()) {
        return Err(ServiceError::new(
            ErrorCode::InvalidRequest,
            format!(
                "pod {:?}/{:?} is not a Kubernetes namespace and pod name",
                pod.namespace, pod.name
            ),
        ));
    }
    Ok(())
}
