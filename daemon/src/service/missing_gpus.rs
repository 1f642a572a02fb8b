//! Claims whose record, read back at start, names a GPU this node does not have: a record of
//! another node's (a restored or copied state directory), or a GPU gone since (an instance
//! type changed under the same state, a GPU fallen off the bus). Such a claim is kept, so its
//! release still stops and removes what it set up, but it is `Degraded` with the GPUs named:
//! the CDI device IDs handed out for it resolve nowhere, so no container may start on it, and
//! nothing heals it but a release (a restarted MPS control daemon does not).

use crate::claim::{Cause, Claim, Event};

use super::{now_secs, wants_of, Service};

/// Start of the reason in a claim's message.
const NO_GPU: &str = "the node has no GPU";

impl Service {
    /// The GPUs of `c` this node does not have, as `gpu-<minor> (GPU-<uuid>)`, by UUID (a
    /// device name alone may be another GPU's here).
    pub(super) fn missing_gpus(&self, c: &Claim) -> Vec<String> {
        let gpus = self.host.backend.gpus();
        let mut missing: Vec<String> = wants_of(c)
            .into_iter()
            .filter(|(uuid, _, _)| !gpus.iter().any(|g| g.uuid == *uuid))
            .map(|(uuid, name, _)| format!("{name} ({uuid})"))
            .collect();
        missing.dedup();
        missing
    }

    /// At start: makes `uid` `Degraded` when it names a GPU this node does not have (cause
    /// `GpuMissing`, which only a release clears), and says whether it did (then nothing of the claim is
    /// started again: its MPS control daemons would run on a GPU that is not there).
    pub(super) fn degrade_if_gpus_missing(&self, uid: &str) -> bool {
        // Checked under the lock, without a copy of the claim: this runs for every claim at
        // every start.
        let missing = match self.state().claims.get(uid) {
            Some(c) => self.missing_gpus(c),
            None => return false,
        };
        if missing.is_empty() {
            return false;
        }
        tracing::error!(claim = %uid, gpus = %missing.join(", "), "the claim's record names a GPU this node does not have; claim Degraded, release it");
        let mut st = self.state();
        let detail = missing_gpus_error(&missing);
        if let Err(e) = st
            .claims
            .degrade(uid, Event::GpuMissing, vec![(Cause::GpuMissing, detail)])
        {
            tracing::error!(claim = %uid, error = %e, "recording a missing GPU");
        }
        let _ = self.commit(st);
        let _ = self.write_host_record(uid);
        true
    }
}

/// What cause `GpuMissing` says for the GPUs `missing` (as [`Service::missing_gpus`] names
/// them).
fn missing_gpus_error(missing: &[String]) -> String {
    format!(
        "at {} s after the epoch: {NO_GPU} {} that the claim's record names (a record of another node's, or a GPU gone since): its CDI devices resolve nowhere; release the claim",
        now_secs(),
        missing.join(", ")
    )
}
