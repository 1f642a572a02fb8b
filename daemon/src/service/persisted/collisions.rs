//! Records that claim one MIG slice twice, of which only one can be true.

use crate::claim::{Claim, Phase};

/// The records to refuse because a MIG slice they name is another record's: two records
/// whose slices on one GPU overlap in placement (or name one MIG UUID, as the slice's now or
/// the first one a recreated slice keeps) cannot both be true, as
/// admission never grants a placement twice. `claims` pairs each record with whether it was
/// rebuilt from a host record alone (the store did not have it). The one kept is the prepared
/// (or degraded) one over one a crash left half-done, then the one the store has, then the
/// older (lower generation), then the lower UID;
/// each refused one comes with why, naming the claim it collides with. Pure: nothing is
/// released because of a refused record (its release would destroy the other's slice).
pub(in crate::service) fn mig_collisions<'a>(
    claims: impl IntoIterator<Item = (&'a Claim, bool)>,
) -> Vec<(String, String)> {
    let mut order: Vec<(&Claim, bool)> = claims.into_iter().collect();
    order.sort_by_key(|(c, rebuilt)| {
        let settled = matches!(c.phase, Phase::Prepared | Phase::Degraded);
        (!settled, *rebuilt, c.generation, c.uid.clone())
    });
    let mut held: Vec<(&str, &crate::claim::MigSlice)> = Vec::new();
    let mut refused = Vec::new();
    for (c, _) in order {
        let mine: Vec<&crate::claim::MigSlice> = c.groups.iter().flat_map(|g| g.slices()).collect();
        let hit = mine.iter().find_map(|m| {
            held.iter()
                .find(|(_, h)| {
                    let overlap = h.gpu_uuid == m.gpu_uuid
                        && m.placement_start < h.placement_start + h.memory_slices
                        && h.placement_start < m.placement_start + m.memory_slices;
                    // A name the driver's spec gives the slice (its MIG UUID, or the
                    // first one it keeps after being made again) names one device only.
                    let names = |x: &'a crate::claim::MigSlice| {
                        [x.uuid.as_str(), x.original_uuid.as_str()]
                            .into_iter()
                            .filter(|n| !n.is_empty())
                    };
                    overlap || names(m).any(|n| names(h).any(|o| o == n))
                })
                .map(|(owner, h)| (m, *owner, *h))
        });
        match hit {
            Some((m, owner, h)) => refused.push((
                c.uid.clone(),
                format!(
                    "its MIG device {} (placement {}:{}) is claim {owner:?}'s {} too; only one claim can hold a slice",
                    m.device, m.placement_start, m.memory_slices, h.device
                ),
            )),
            None => held.extend(mine.into_iter().map(|m| (c.uid.as_str(), m))),
        }
    }
    refused
}
