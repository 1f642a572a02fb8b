//! Partitionable devices (KEP-4815, `resource.k8s.io` `sharedCounters` / `consumesCounters`),
//! as NVIDIA's DynamicMIG publishes them (NVIDIA/k8s-dra-driver-gpu,
//! `cmd/gpu-kubelet-plugin/partitions.go`): for each GPU whose MIG layout gpushared may change
//! ([`GpuInfo::mig_partitions`]), every (profile, placement) it can be cut into is a device,
//! with one counter set per GPU, `gpu-<minor>-counter-set`. A slice consumes its capacities and
//! the memory slices of its placement, the whole GPU consumes everything, so no two allocations
//! the scheduler can make overlap. The whole GPU is published only where a whole-GPU claim can
//! have it (not an Ampere GPU in MIG mode), slices only where they can be made (not an Ampere
//! GPU with MIG mode off), and MIG instances that exist without a claim owning them (the node's
//! static layout) as those static instances, whose overlapping placements gpushared leaves out.
//!
//! Where the API server keeps none of those fields the pool is [`Layout::Static`]: the
//! devices that exist, as [`crate::build_pool`] publishes them.

use std::collections::BTreeMap;

use gpushare_proto::{GpuInfo, MigCapacity, MigPartitions, MigSlot};

use crate::{
    common_attributes, mig_device, quantity, slice, string, whole_gpu_device, Capacity, Counter,
    CounterSet, Device, DeviceCounterConsumption, ResourceSlice, MAX_DEVICES,
};

/// Most devices one slice may hold where any of them consumes counters, from Kubernetes 1.35.
pub const MAX_COUNTER_DEVICES: usize = 64;
/// Most counter sets one slice may hold, from Kubernetes 1.35.
pub const MAX_COUNTER_SETS: usize = 8;

/// How a pool's slices are laid out, as the API server decides: whether it keeps
/// `sharedCounters` / `consumesCounters` (the `DRAPartitionableDevices` feature), and where
/// its version wants the counter sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// The server drops the fields: only devices that exist now (whole GPUs, and the MIG
    /// devices of GPUs in MIG mode), as without partitionable devices.
    Static,
    /// Partitionable devices, each GPU's counter set in the slice of its devices (Kubernetes
    /// before 1.35: a device may consume only counters of its own slice; at most 32 counters
    /// in all of a slice's sets).
    Combined,
    /// Partitionable devices, counter sets in slices of their own (Kubernetes 1.35 and later:
    /// a slice holds devices or counter sets, not both; at most 8 sets and, where any device
    /// consumes counters, 64 devices a slice).
    Split,
}

impl Layout {
    /// The partitionable layout for a server of Kubernetes `1.<minor>` that keeps the fields.
    pub fn partitionable(minor: u32) -> Layout {
        if minor >= 35 {
            Layout::Split
        } else {
            Layout::Combined
        }
    }

    /// Whether devices consume counters in this layout.
    pub fn is_partitionable(self) -> bool {
        self != Layout::Static
    }

    /// How it reads in logs and output: `static`, `combined`, `split`.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Static => "static",
            Layout::Combined => "combined",
            Layout::Split => "split",
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The counter set of GPU `minor`: `gpu-<minor>-counter-set`, NVIDIA's name.
pub fn counter_set_name(minor: u32) -> String {
    format!("gpu-{minor}-counter-set")
}

fn counter(v: impl ToString) -> Counter {
    Counter {
        value: v.to_string(),
    }
}

/// Counters of a capacity, named as NVIDIA's counters (capacity names made DNS labels).
fn capacity_counters(c: &MigCapacity) -> BTreeMap<String, Counter> {
    BTreeMap::from([
        ("multiprocessors".into(), counter(c.multiprocessors)),
        ("copy-engines".into(), counter(c.copy_engines)),
        ("decoders".into(), counter(c.decoders)),
        ("encoders".into(), counter(c.encoders)),
        ("jpeg-engines".into(), counter(c.jpeg_engines)),
        ("ofa-engines".into(), counter(c.ofa_engines)),
        ("memory".into(), counter(quantity(c.memory_mib << 20))),
    ])
}

fn with_memory_slices(
    mut counters: BTreeMap<String, Counter>,
    start: u32,
    size: u32,
) -> BTreeMap<String, Counter> {
    for i in start..start + size {
        counters.insert(format!("memory-slice-{i}"), counter(1));
    }
    counters
}

fn consumes(minor: u32, counters: BTreeMap<String, Counter>) -> Vec<DeviceCounterConsumption> {
    vec![DeviceCounterConsumption {
        counter_set: counter_set_name(minor),
        counters,
    }]
}

/// Capacities of a slice as a device publishes them (the MIG device's names).
fn slice_capacity(c: &MigCapacity) -> BTreeMap<String, Capacity> {
    [
        ("multiprocessors", c.multiprocessors.to_string()),
        ("copyEngines", c.copy_engines.to_string()),
        ("decoders", c.decoders.to_string()),
        ("encoders", c.encoders.to_string()),
        ("jpegEngines", c.jpeg_engines.to_string()),
        ("ofaEngines", c.ofa_engines.to_string()),
        ("memory", quantity(c.memory_mib << 20)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), Capacity { value: v }))
    .collect()
}

/// A slice that does not exist yet (dynamic MIG): the MIG device's attributes but no `uuid`.
fn slot_device(g: &GpuInfo, s: &MigSlot) -> Device {
    let mut attributes = common_attributes(g);
    attributes.insert("type".into(), string("mig"));
    attributes.insert("parentUUID".into(), string(&g.uuid));
    attributes.insert("profile".into(), string(&s.profile));
    Device {
        name: s.device_name(g.minor),
        attributes,
        capacity: slice_capacity(&s.capacity),
        consumes_counters: consumes(
            g.minor,
            with_memory_slices(
                capacity_counters(&s.capacity),
                s.placement_start,
                s.memory_slices,
            ),
        ),
    }
}

/// One GPU's partitionable devices and the counter set they draw from, or `None` when it
/// has no MIG device to publish (then its whole GPU, if offered, needs no counters).
fn partitioned(g: &GpuInfo, p: &MigPartitions) -> Option<(CounterSet, Vec<Device>)> {
    // The node's static layout: instances no claim owns, which gpushared never destroys.
    // A GPU instance left without a compute instance is no device anyone can use; its
    // placements are left out all the same.
    let statics: Vec<Device> = g
        .mig_devices
        .iter()
        .filter(|m| m.owner.is_none() && !m.uuid.is_empty())
        .map(|m| {
            let mut d = mig_device(g, m);
            let c = MigCapacity {
                memory_mib: m.memory_mib,
                multiprocessors: m.multiprocessors,
                copy_engines: m.copy_engines,
                decoders: m.decoders,
                encoders: m.encoders,
                jpeg_engines: m.jpeg_engines,
                ofa_engines: m.ofa_engines,
            };
            d.consumes_counters = consumes(
                g.minor,
                with_memory_slices(capacity_counters(&c), m.placement_start, m.memory_slices),
            );
            d
        })
        .collect();
    let mut devices = statics;
    for s in &p.placements {
        let d = slot_device(g, s);
        // A static instance is its placement's device already.
        if devices.iter().all(|o| o.name != d.name) {
            devices.push(d);
        }
    }
    if devices.is_empty() {
        return None;
    }
    let all = with_memory_slices(capacity_counters(&p.capacity), 0, p.memory_slices);
    if p.whole_gpu {
        let mut whole = whole_gpu_device(g);
        for (k, v) in slice_capacity(&p.capacity) {
            // `memory` stays the GPU's own (what a whole-GPU claim gets).
            whole.capacity.entry(k).or_insert(v);
        }
        whole.consumes_counters = consumes(g.minor, all.clone());
        devices.insert(0, whole);
    }
    Some((
        CounterSet {
            name: counter_set_name(g.minor),
            counters: all,
        },
        devices,
    ))
}

/// The pool `driver` publishes for `gpus` on node `node_name` at pool `generation` in
/// `layout`. [`Layout::Static`] is [`crate::build_pool`]. The partitionable layouts publish,
/// for each GPU with [`GpuInfo::mig_partitions`], its whole GPU where it can be granted
/// whole, its static MIG instances and every slice it can be cut into, all drawing from its
/// counter set; other GPUs as whole GPUs. Slices, named `<node>-<driver>-<index>`, are cut
/// at the API's limits: GPUs without counters together, at most [`MAX_DEVICES`] a slice;
/// in [`Layout::Combined`] one slice per partitioned GPU holding its counter set and
/// devices; in [`Layout::Split`] the counter sets in slices of their own (at most
/// [`MAX_COUNTER_SETS`] each) and each partitioned GPU's devices in slices of at most
/// [`MAX_COUNTER_DEVICES`]. Every slice's `resourceSliceCount` is the number of slices.
pub fn build_pool_in(
    gpus: &[GpuInfo],
    node_name: &str,
    driver: &str,
    generation: i64,
    layout: Layout,
) -> Vec<ResourceSlice> {
    if layout == Layout::Static {
        return crate::build_pool(gpus, node_name, driver, generation);
    }
    let mut plain: Vec<Device> = Vec::new();
    let mut parts: Vec<(CounterSet, Vec<Device>)> = Vec::new();
    for g in gpus {
        match g.mig_partitions.as_ref() {
            None => plain.extend(crate::devices(std::slice::from_ref(g))),
            Some(p) => match partitioned(g, p) {
                Some(part) => parts.push(part),
                None if p.whole_gpu => plain.push(whole_gpu_device(g)),
                None => {}
            },
        }
    }
    // (counter sets, devices) of each slice.
    let mut contents: Vec<(Vec<CounterSet>, Vec<Device>)> = plain
        .chunks(MAX_DEVICES)
        .map(|c| (Vec::new(), c.to_vec()))
        .collect();
    match layout {
        Layout::Static | Layout::Combined => {
            contents.extend(parts.into_iter().map(|(set, d)| (vec![set], d)));
        }
        Layout::Split => {
            let sets: Vec<CounterSet> = parts.iter().map(|(s, _)| s.clone()).collect();
            contents.extend(
                sets.chunks(MAX_COUNTER_SETS)
                    .map(|c| (c.to_vec(), Vec::new())),
            );
            for (_, d) in parts {
                contents.extend(
                    d.chunks(MAX_COUNTER_DEVICES)
                        .map(|c| (Vec::new(), c.to_vec())),
                );
            }
        }
    }
    if contents.is_empty() {
        contents.push((Vec::new(), Vec::new()));
    }
    let count = i64::try_from(contents.len()).unwrap_or(i64::MAX);
    contents
        .into_iter()
        .enumerate()
        .map(|(i, (sets, devices))| {
            let mut s = slice(
                format!("{node_name}-{driver}-{i}"),
                node_name,
                driver,
                generation,
                count,
                devices,
            );
            s.spec.shared_counters = sets;
            s
        })
        .collect()
}

#[cfg(test)]
#[path = "partitionable_tests.rs"]
mod tests;
