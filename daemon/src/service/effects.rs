//! What the service lends a device group's strategy (`strategy::group`) at prepare and at
//! release: the GPUs, MPS control, the group's record in its claim (in the registry: published
//! at once, written with the claim's next change) and the MIG intents.

use super::Service;
use crate::claim::{Device, MigSlice, MpsDaemon};
use crate::error::ServiceError;
use crate::strategy::group::{GroupEffects, GroupRecorder, SliceIntents};
use crate::strategy::mig::MigTarget;

/// One group of one claim, as its strategy's effects reach it. The group is known in its
/// claim's record by its devices.
pub(super) struct ClaimGroup<'s> {
    service: &'s Service,
    uid: &'s str,
    devices: &'s [Device],
}

impl<'s> ClaimGroup<'s> {
    /// The group of claim `uid` whose devices are `devices`.
    pub(super) fn new(service: &'s Service, uid: &'s str, devices: &'s [Device]) -> Self {
        ClaimGroup {
            service,
            uid,
            devices,
        }
    }

    /// The effects its strategy may have.
    pub(super) fn effects(&self) -> GroupEffects<'_> {
        GroupEffects {
            uid: self.uid,
            backend: self.service.host.backend.as_ref(),
            mps: &self.service.host.mps,
            record: self,
            intents: self,
        }
    }
}

impl GroupRecorder for ClaimGroup<'_> {
    fn mps(&self, mps: &MpsDaemon) {
        if let Some(c) = self.service.state().claims.get_mut(self.uid) {
            if let Some(g) = c.groups.iter_mut().find(|g| g.devices == self.devices) {
                g.set_mps(mps.clone());
            }
        }
    }

    fn mig_made(&self, rec: &MigSlice) -> Result<(), ServiceError> {
        self.mig(rec);
        self.service.commit(self.service.state()).map_err(|e| {
            ServiceError::new(
                e.code,
                format!("recording MIG device {}: {}", rec.device, e.message),
            )
        })
    }

    fn mig(&self, rec: &MigSlice) {
        let mut st = self.service.state();
        if let Some(c) = st.claims.get_mut(self.uid) {
            if let Some(g) = c.groups.iter_mut().find(|g| g.devices == self.devices) {
                if let Some(slices) = g.slices_mut() {
                    match slices
                        .iter_mut()
                        .find(|m| m.gpu_uuid == rec.gpu_uuid && m.gi_id == rec.gi_id)
                    {
                        Some(m) => *m = rec.clone(),
                        None => slices.push(rec.clone()),
                    }
                }
            }
        }
    }

    /// Looks for `rec` in every group of the claim: a record names one MIG instance.
    fn mig_destroying(&self, rec: &MigSlice) -> Result<(), ServiceError> {
        let mut st = self.service.state();
        let Some(m) = st
            .claims
            .get_mut(self.uid)
            .into_iter()
            .flat_map(|c| c.groups.iter_mut())
            .flat_map(|g| g.slices_mut().into_iter().flatten())
            .find(|m| *m == rec)
        else {
            // Nothing would say on disk that the destroy began: a crash half-way would leak
            // the GPU instance. (The release works from the record it read; nothing else
            // changes the claim meanwhile.)
            return Err(ServiceError::internal(format!(
                "claim {}: MIG device {} (GPU instance {}) is not in the claim's record as the release read it",
                self.uid, rec.device, rec.gi_id
            )));
        };
        // The compute instance and MIG UUID stay: the record then matches its GPU instance
        // with that compute instance or with none, never with another's.
        m.destroying = true;
        // On disk before the compute instance goes: a kill before the GPU instance is
        // destroyed too leaves a record that names it, which the next start's release
        // finds and destroys.
        self.service.commit(st).map_err(|e| {
            ServiceError::new(
                e.code,
                format!(
                    "recording that MIG device {} is being destroyed: {}",
                    rec.device, e.message
                ),
            )
        })
    }
}

impl SliceIntents for ClaimGroup<'_> {
    fn reserve(&self, target: &MigTarget) -> Result<MigTarget, ServiceError> {
        self.service.reserve_slice(self.uid, target)
    }

    fn made(&self, rec: &MigSlice) {
        self.service.host.mig_intents.made(self.uid, rec);
    }

    fn entering_mig_mode(&self, target: &MigTarget) -> Result<(), ServiceError> {
        self.service
            .host
            .mig_intents
            .entering_mig_mode(self.uid, target)
    }
}
