//! What the service lends MIG's code beyond one claim's group (that one is
//! [`crate::strategy::GroupEffects`]): the claims as the published view has them
//! ([`ClaimsView`]), and, for the start-up recovery of vanished slices, the registry, the
//! claims' CDI specs and host records, and their MPS control daemons ([`RecoveredClaims`],
//! lent with the GPUs and the intents as [`RecoverEffects`]). Implemented for the service in
//! `service/mig_effects.rs`; MIG's code never reaches the service otherwise.

use std::fmt;

use super::{Claimed, MigIntents};
use crate::claim::{Claim, MigSlice};
use crate::driver_spec::DriverSpecs;
use crate::error::ServiceError;
use crate::gpu::GpuBackend;

/// The claims as MIG's decisions read them: the view published after the registry's last
/// change, read without its lock.
pub trait ClaimsView {
    /// The MIG slices every claim records, or every claim but `except`.
    fn claimed(&self, except: Option<&str>) -> Claimed;
}

/// The registry and what hangs off a claim, as the start-up recovery of vanished MIG slices
/// ([`super::recreate_slices`], [`super::settle_recovered`]) reaches them. Nothing is served yet
/// while it runs (the start-up reconcile runs before the socket exists): no claim lock is taken.
pub trait RecoveredClaims: ClaimsView {
    /// The UIDs of the claims in the registry that `keep` keeps.
    fn uids(&self, keep: &dyn Fn(&Claim) -> bool) -> Vec<String>;

    /// Claim `uid` as the registry has it now.
    fn claim(&self, uid: &str) -> Option<Claim>;

    /// Sets slice `ri` of group `gi` of claim `uid` to `rec` in the registry (published at
    /// once, on disk with the next commit).
    fn set_slice(&self, uid: &str, gi: usize, ri: usize, rec: &MigSlice);

    /// Writes the registry's changes to disk.
    ///
    /// # Errors
    /// The store's, when the change cannot be made durable.
    fn commit(&self) -> Result<(), ServiceError>;

    /// After slices of group `gi` of claim `uid` were made again: an MPS control daemon on
    /// them is started again on the new MIG UUIDs, and the claim's record follows it (or its
    /// failure, restarted with backoff on the new slices).
    fn follow_new_slices(&self, uid: &str, gi: usize);

    /// Writes claim `uid`'s CDI spec again from `claim`'s groups (containers started from now
    /// on get the new instances' capability device nodes).
    ///
    /// # Errors
    /// The spec cannot be written.
    fn write_cdi(&self, uid: &str, claim: &Claim) -> Result<(), ServiceError>;

    /// Resolves claim `uid`'s CDI device IDs against the installed driver spec (without
    /// running its generator) and checks them as a prepare does, recording the resolved
    /// requests in the claim; what fails is added to `lost`.
    fn check_cdi_ids(&self, uid: &str, claim: &Claim, lost: &mut Vec<String>);

    /// Records the recovery's outcome in claim `uid`'s phase and commits it: `Degraded` with
    /// what was `lost`, or `Prepared` again when nothing was lost and a slice of it had been
    /// lost before. `false` (nothing recorded) when the claim is gone.
    fn record_slice_outcome(&self, uid: &str, lost: &[String]) -> bool;

    /// Writes claim `uid`'s host record again (logged on failure).
    fn write_host_record(&self, uid: &str);
}

/// What the start-up recovery of vanished MIG slices is lent.
#[derive(Clone, Copy)]
pub struct RecoverEffects<'a> {
    /// The GPUs (MIG instances read, made and destroyed).
    pub backend: &'a dyn GpuBackend,
    /// The MIG intents, written before a slice is made again.
    pub intents: &'a MigIntents,
    /// The NVIDIA driver's CDI spec, where the node has one: the aliases it keeps.
    pub driver_spec: Option<&'a DriverSpecs>,
    /// The registry and what hangs off a claim.
    pub claims: &'a dyn RecoveredClaims,
}

impl fmt::Debug for RecoverEffects<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecoverEffects").finish_non_exhaustive()
    }
}
