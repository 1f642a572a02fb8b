//! The MIG slices claims record: what admission counts besides live instances, and what
//! tells whose a live instance is.

use std::collections::{BTreeMap, BTreeSet};

use super::is_instance_of;
use crate::claim::{Claim, MigSlice};
use crate::gpu::MigInstance;
use crate::mig::{self, Occupied};

/// The MIG slices claims record, by parent GPU UUID, with the claim UID recording each: what
/// admission counts besides the live instances (a slice whose instance vanished still belongs
/// to its claim until the claim is released), and what tells whose a live instance is.
#[derive(Debug, Default, Clone)]
pub struct Claimed {
    by_gpu: BTreeMap<String, Vec<(String, MigSlice)>>,
}

impl Claimed {
    /// The slices every claim in `claims` records, whatever the claim's state.
    pub fn of<'a>(claims: impl IntoIterator<Item = &'a Claim>) -> Claimed {
        let mut by_gpu: BTreeMap<String, Vec<(String, MigSlice)>> = BTreeMap::new();
        for c in claims {
            for m in c.slices() {
                by_gpu
                    .entry(m.gpu_uuid.clone())
                    .or_default()
                    .push((c.uid.clone(), m.clone()));
            }
        }
        Claimed { by_gpu }
    }

    /// The claim whose record is live instance `inst` of GPU `gpu_uuid` ([`is_instance_of`]).
    pub fn owner(&self, gpu_uuid: &str, inst: &MigInstance) -> Option<&str> {
        self.by_gpu
            .get(gpu_uuid)?
            .iter()
            .find(|(_, m)| is_instance_of(m, inst))
            .map(|(uid, _)| uid.as_str())
    }

    /// Whether a slice recorded on GPU `gpu_uuid` carries
    /// [`MigSlice::enabled_mig_mode`]: gpushare turned MIG mode on there.
    pub fn mode_enabled_by_gpushare(&self, gpu_uuid: &str) -> bool {
        self.by_gpu
            .get(gpu_uuid)
            .is_some_and(|v| v.iter().any(|(_, m)| m.enabled_mig_mode))
    }

    /// Whether any claim records a slice on GPU `gpu_uuid`.
    pub fn any_on(&self, gpu_uuid: &str) -> bool {
        self.by_gpu.get(gpu_uuid).is_some_and(|v| !v.is_empty())
    }

    /// The placements recorded on GPU `gpu_uuid`.
    pub fn occupied(&self, gpu_uuid: &str) -> Vec<Occupied> {
        self.by_gpu
            .get(gpu_uuid)
            .into_iter()
            .flatten()
            .map(|(_, m)| Occupied {
                profile: mig::GiProfileId(m.gi_profile_id),
                placement: mig::MigPlacement {
                    start: m.placement_start,
                    size: m.memory_slices,
                },
            })
            .collect()
    }

    /// The claims whose recorded slice on GPU `gpu_uuid` overlaps `placement`.
    pub fn holders(&self, gpu_uuid: &str, placement: &mig::MigPlacement) -> BTreeSet<String> {
        self.by_gpu
            .get(gpu_uuid)
            .into_iter()
            .flatten()
            .filter(|(_, m)| {
                placement.overlaps(&mig::MigPlacement {
                    start: m.placement_start,
                    size: m.memory_slices,
                })
            })
            .map(|(uid, _)| uid.clone())
            .collect()
    }
}
