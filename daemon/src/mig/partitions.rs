//! What a MIG-capable GPU can be cut into at a claim's prepare, pure: the (profile, placement)
//! slices of its model, whether it can be granted whole, and the capacities its slices draw
//! from. This is what a DRA driver publishes as partitionable devices (KEP-4815) with one
//! counter set per GPU, as NVIDIA's DynamicMIG does (NVIDIA/k8s-dra-driver-gpu,
//! `cmd/gpu-kubelet-plugin/partitions.go`): every slice consumes its capacities and the memory
//! slices of its placement, the whole GPU consumes everything, so the scheduler never hands out
//! two allocations that overlap.
//!
//! The counter set's capacities are, per dimension, the most that any valid layout of the
//! GPU uses (at least the largest profile's): NVIDIA takes the largest profile's, which is
//! the same on the A100 and H100 tables, but the H200 table's memory figures are inferred
//! (`MigModel::H200`), and a `3g.71gb` beside four `1g.18gb` there would exceed `7g.141gb`'s
//! memory. Taking the layouts' maximum keeps every layout the hardware can make allocatable
//! whatever the figures, while the memory-slice counters alone keep placements from
//! overlapping (and the OFA counter keeps a second `+me` out, as the tables allow one).

use std::sync::OnceLock;

use gpushare_proto::{MigCapacity, MigDeviceInfo, MigPartitions, MigSlot};

use super::MEMORY_SLICES;
use super::{check_placement, GiProfile, GiProfileId, MigModel, MigPlacement, Occupied};

impl GiProfile {
    /// The profile's capacities, as a slice of it publishes them.
    pub fn capacity(&self) -> MigCapacity {
        MigCapacity {
            memory_mib: self.memory_mib,
            multiprocessors: self.multiprocessors,
            copy_engines: self.copy_engines,
            decoders: self.decoders,
            encoders: self.encoders,
            jpeg_engines: self.jpeg_engines,
            ofa_engines: self.ofa_engines,
        }
    }
}

fn add(a: MigCapacity, b: MigCapacity) -> MigCapacity {
    MigCapacity {
        memory_mib: a.memory_mib + b.memory_mib,
        multiprocessors: a.multiprocessors + b.multiprocessors,
        copy_engines: a.copy_engines + b.copy_engines,
        decoders: a.decoders + b.decoders,
        encoders: a.encoders + b.encoders,
        jpeg_engines: a.jpeg_engines + b.jpeg_engines,
        ofa_engines: a.ofa_engines + b.ofa_engines,
    }
}

fn max(a: MigCapacity, b: MigCapacity) -> MigCapacity {
    MigCapacity {
        memory_mib: a.memory_mib.max(b.memory_mib),
        multiprocessors: a.multiprocessors.max(b.multiprocessors),
        copy_engines: a.copy_engines.max(b.copy_engines),
        decoders: a.decoders.max(b.decoders),
        encoders: a.encoders.max(b.encoders),
        jpeg_engines: a.jpeg_engines.max(b.jpeg_engines),
        ofa_engines: a.ofa_engines.max(b.ofa_engines),
    }
}

impl MigModel {
    /// Every (profile, placement) of the model, smallest profile first, each placement in
    /// start order. Every profile of the tables has one full compute instance (C == G), the
    /// only kind gpushare creates.
    pub fn slots(self) -> Vec<(GiProfile, MigPlacement)> {
        self.profiles()
            .into_iter()
            .flat_map(|p| p.placements().into_iter().map(move |pl| (p.clone(), pl)))
            .collect()
    }

    /// Every valid layout of the model: each set of GPU instances that can exist together
    /// (placements pairwise disjoint, instance counts kept; [`check_placement`]), as indexes
    /// into [`MigModel::slots`]. The empty layout included.
    pub fn layouts(self) -> Vec<Vec<usize>> {
        fn go(
            model: MigModel,
            slots: &[(GiProfile, MigPlacement)],
            from: usize,
            chosen: &mut Vec<usize>,
            out: &mut Vec<Vec<usize>>,
        ) {
            out.push(chosen.clone());
            for i in from..slots.len() {
                let taken: Vec<Occupied> = chosen
                    .iter()
                    .map(|&j| Occupied {
                        profile: slots[j].0.id,
                        placement: slots[j].1,
                    })
                    .collect();
                let (p, pl) = &slots[i];
                if check_placement(model, p.id, pl.start, &taken).is_ok() {
                    chosen.push(i);
                    go(model, slots, i + 1, chosen, out);
                    chosen.pop();
                }
            }
        }
        let slots = self.slots();
        let mut out = Vec::new();
        go(self, &slots, 0, &mut Vec::new(), &mut out);
        out
    }

    /// The capacities the GPU's slices draw from (its counter set): per dimension the most
    /// that any valid layout uses, and at least the largest profile's. Computed once per
    /// model.
    pub fn counter_capacity(self) -> MigCapacity {
        static CACHE: [OnceLock<MigCapacity>; 4] = [
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
        ];
        let i = MigModel::ALL.iter().position(|m| *m == self).unwrap_or(0);
        *CACHE[i].get_or_init(|| {
            let slots = self.slots();
            let by_profile = slots
                .iter()
                .fold(MigCapacity::default(), |m, (p, _)| max(m, p.capacity()));
            self.layouts()
                .iter()
                .map(|l| {
                    l.iter().fold(MigCapacity::default(), |s, &i| {
                        add(s, slots[i].0.capacity())
                    })
                })
                .fold(by_profile, max)
        })
    }
}

/// What `list_gpus` reports of a GPU of `model` whose MIG mode is `current` now and
/// `pending` after the next reset, with `instances` (its MIG devices as `list_gpus` reports
/// them, each with the claim that owns it, if any): see [`MigPartitions`]. An instance no
/// claim owns (the node's layout: `gpushare mig apply`, mig-parted, nvidia-smi) is never
/// destroyed by gpushare, so the placements it rules out are left out and the GPU is not
/// offered whole; instances claims own are those claims' allocations, which the scheduler
/// already counts.
pub fn partitions(
    model: MigModel,
    current: bool,
    pending: bool,
    instances: &[MigDeviceInfo],
) -> MigPartitions {
    let settled = current == pending;
    let toggle = model.reset_free_mode_toggle();
    let layout: Vec<Occupied> = instances
        .iter()
        .filter(|i| i.owner.is_none())
        .map(|i| Occupied {
            profile: GiProfileId(i.gi_profile_id),
            placement: MigPlacement {
                start: i.placement_start,
                size: i.memory_slices,
            },
        })
        .collect();
    let whole_gpu = settled && (!current || (toggle && layout.is_empty()));
    let slices = settled && (current || toggle);
    let placements = if slices {
        model
            .slots()
            .into_iter()
            .filter(|(p, pl)| check_placement(model, p.id, pl.start, &layout).is_ok())
            .map(|(p, pl)| MigSlot {
                profile: p.name.to_string(),
                gi_profile_id: p.id.0,
                placement_start: pl.start,
                memory_slices: pl.size,
                capacity: p.capacity(),
            })
            .collect()
    } else {
        Vec::new()
    };
    MigPartitions {
        whole_gpu,
        slices,
        memory_slices: MEMORY_SLICES,
        capacity: model.counter_capacity(),
        placements,
    }
}

/// [`partitions`] for a MIG-capable GPU named `product_name` by NVML (what `list_gpus` fills
/// in, with the GPU's live MIG mode and devices); `None` for a model without profile tables
/// here, whose layout gpushare never changes.
pub fn for_gpu(
    product_name: &str,
    current: bool,
    pending: bool,
    instances: &[MigDeviceInfo],
) -> Option<MigPartitions> {
    MigModel::from_product_name(product_name).map(|m| partitions(m, current, pending, instances))
}

#[cfg(test)]
#[path = "partition_tests.rs"]
mod tests;
