//! Pure: what to create, update and delete so that the API server holds exactly the pool
//! we want, the way the Go helper's ResourceSlice controller decides it
//! (kubernetes/dynamic-resource-allocation, `resourceslice/resourceslicecontroller.go`):
//! existing slices are matched to wanted ones by their device names (and counter-set names: a
//! slice of counter sets has no devices), changed ones are updated, missing ones created,
//! obsolete ones deleted; the pool generation is bumped unless at most one update and no
//! create is needed.

use std::collections::BTreeSet;

use gpushare_slice::{
    counters_of_object, devices_of_object, ApiVersion, CounterSet, Device, ResourceSlice,
};
use serde_json::Value;

/// One API change.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Create a slice with the devices of wanted slice `index`.
    Create {
        /// Index of the wanted slice.
        index: usize,
    },
    /// Replace the spec of the existing slice `name`.
    Update {
        /// The existing slice's name.
        name: String,
        /// Index of the wanted slice.
        index: usize,
    },
    /// Delete the existing slice `name` (on condition of its `uid`).
    Delete {
        /// Name.
        name: String,
        /// UID.
        uid: String,
    },
}

/// The plan: the pool generation to write and the changes, creates and updates first.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// `spec.pool.generation` of every slice written.
    pub generation: i64,
    /// The changes; empty when the server already holds what we want.
    pub changes: Vec<Change>,
}

/// What a slice holds, compared by meaning.
type Content = (Vec<Device>, Vec<CounterSet>);

/// Device names, and counter-set names marked as such.
fn names((devices, sets): &Content) -> BTreeSet<String> {
    devices
        .iter()
        .map(|d| d.name.clone())
        .chain(sets.iter().map(|s| format!("counter set {}", s.name)))
        .collect()
}

fn i64_at(v: &Value, p: &str) -> i64 {
    v.pointer(p).and_then(Value::as_i64).unwrap_or(0)
}

fn str_at<'a>(v: &'a Value, p: &str) -> &'a str {
    v.pointer(p).and_then(Value::as_str).unwrap_or_default()
}

/// Plans the changes that turn `existing` (this node's slices of our driver, as listed and
/// watched) into `wanted` (the slices of pool `pool`: their devices and counter sets count).
pub fn plan(existing: &[Value], wanted: &[ResourceSlice], pool: &str, version: ApiVersion) -> Plan {
    let wanted: Vec<Content> = wanted
        .iter()
        .map(|s| (s.spec.devices.clone(), s.spec.shared_counters.clone()))
        .collect();
    let mut changes = Vec::new();
    // Slices of another pool (a renamed node) are obsolete.
    let mut ours: Vec<(&Value, Option<Content>)> = Vec::new();
    for s in existing {
        if str_at(s, "/spec/pool/name") == pool {
            let content = devices_of_object(s, version)
                .and_then(|d| Ok((d, counters_of_object(s)?)))
                .ok();
            ours.push((s, content));
        } else {
            changes.push(Change::Delete {
                name: str_at(s, "/metadata/name").into(),
                uid: str_at(s, "/metadata/uid").into(),
            });
        }
    }
    let max_gen = ours
        .iter()
        .map(|(s, _)| i64_at(s, "/spec/pool/generation"))
        .max()
        .unwrap_or(0);
    // Match by device-name sets first, then the rest in order.
    let mut matched: Vec<Option<usize>> = vec![None; wanted.len()];
    let mut used = vec![false; ours.len()];
    for (j, w) in wanted.iter().enumerate() {
        let want = names(w);
        if let Some(i) = (0..ours.len())
            .find(|&i| !used[i] && ours[i].1.as_ref().is_some_and(|d| names(d) == want))
        {
            used[i] = true;
            matched[j] = Some(i);
        }
    }
    for m in matched.iter_mut().filter(|m| m.is_none()) {
        if let Some(i) = (0..ours.len()).find(|&i| !used[i]) {
            used[i] = true;
            *m = Some(i);
        }
    }
    let count = i64::try_from(wanted.len()).unwrap_or(i64::MAX);
    let differs = |i: usize, j: usize, generation: i64| {
        let (s, content) = &ours[i];
        content.as_ref() != Some(&wanted[j])
            || i64_at(s, "/spec/pool/resourceSliceCount") != count
            || i64_at(s, "/spec/pool/generation") != generation
    };
    let creates = matched.iter().filter(|m| m.is_none()).count();
    let updates_at_same = matched
        .iter()
        .enumerate()
        .filter(|(j, m)| m.is_some_and(|i| differs(i, *j, max_gen)))
        .count();
    let generation = if creates == 0 && updates_at_same <= 1 && max_gen > 0 {
        max_gen
    } else {
        max_gen + 1
    };
    for (j, m) in matched.iter().enumerate() {
        match m {
            None => changes.push(Change::Create { index: j }),
            Some(i) if differs(*i, j, generation) => changes.push(Change::Update {
                name: str_at(ours[*i].0, "/metadata/name").into(),
                index: j,
            }),
            Some(_) => {}
        }
    }
    for (i, (s, _)) in ours.iter().enumerate() {
        if !used[i] {
            changes.push(Change::Delete {
                name: str_at(s, "/metadata/name").into(),
                uid: str_at(s, "/metadata/uid").into(),
            });
        }
    }
    // Creates and updates before deletes: the pool is never emptier than it must be.
    changes.sort_by_key(|c| match c {
        Change::Create { .. } => 0,
        Change::Update { .. } => 1,
        Change::Delete { .. } => 2,
    });
    Plan {
        generation,
        changes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_slice::{build_pool, build_pool_in, Layout};
    use serde_json::json;

    fn gpu(minor: u32) -> gpushare_proto::GpuInfo {
        serde_json::from_value(json!({
            "name": format!("gpu-{minor}"), "minor": minor, "uuid": format!("GPU-{minor}"),
            "product_name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960,
            "compute_mode": "Default", "time_slice": "Default", "sharing": "Free", "claims": []
        }))
        .unwrap()
    }

    fn stored(devices: &[Device], name: &str, generation: i64, count: i64) -> Value {
        let mut s = build_pool(&[], "node-a", "gpu.nvidia.com", generation)[0].clone();
        s.spec.devices = devices.to_vec();
        s.spec.pool.resource_slice_count = count;
        let mut v = s.to_api_object(ApiVersion::V1);
        v["metadata"] = json!({"name": name, "uid": format!("uid-{name}"), "resourceVersion": "5"});
        v
    }

    fn wanted(gpus: &[u32]) -> Vec<ResourceSlice> {
        let g: Vec<_> = gpus.iter().map(|m| gpu(*m)).collect();
        build_pool(&g, "node-a", "gpu.nvidia.com", 0)
    }

    #[test]
    fn nothing_to_do_when_the_server_holds_the_pool() {
        let w = wanted(&[0, 1]);
        let existing = [stored(&w[0].spec.devices, "a", 3, 1)];
        let p = plan(&existing, &w, "node-a", ApiVersion::V1);
        assert_eq!(p.changes, []);
        assert_eq!(p.generation, 3);
    }

    #[test]
    fn a_wiped_pool_is_created_and_a_change_is_one_update_at_the_same_generation() {
        let w = wanted(&[0, 1]);
        let p = plan(&[], &w, "node-a", ApiVersion::V1);
        assert_eq!(p.changes, [Change::Create { index: 0 }]);
        assert_eq!(p.generation, 1);

        let old = wanted(&[0]);
        let existing = [stored(&old[0].spec.devices, "a", 2, 1)];
        let p = plan(&existing, &w, "node-a", ApiVersion::V1);
        assert_eq!(
            p.changes,
            [Change::Update {
                name: "a".into(),
                index: 0
            }]
        );
        assert_eq!(p.generation, 2);
    }

    #[test]
    fn duplicates_and_other_pools_are_deleted_and_the_generation_bumped_on_create() {
        let w = wanted(&[0]);
        let existing = [
            stored(&w[0].spec.devices, "a", 1, 1),
            stored(&w[0].spec.devices, "b", 1, 1),
            json!({"metadata": {"name": "old", "uid": "u-old"}, "spec": {"pool": {"name": "renamed-node"}}}),
        ];
        let p = plan(&existing, &w, "node-a", ApiVersion::V1);
        assert_eq!(
            p.changes,
            [
                Change::Delete {
                    name: "old".into(),
                    uid: "u-old".into()
                },
                Change::Delete {
                    name: "b".into(),
                    uid: "uid-b".into()
                },
            ]
        );
        // Two slices wanted where one exists: a create, so a new generation for both.
        let gpus: Vec<u32> = (0..130).collect();
        let w = wanted(&gpus);
        let existing = [stored(&w[0].spec.devices, "a", 4, 1)];
        let p = plan(&existing, &w, "node-a", ApiVersion::V1);
        assert_eq!(p.generation, 5);
        assert_eq!(
            p.changes,
            [
                Change::Create { index: 1 },
                Change::Update {
                    name: "a".into(),
                    index: 0
                }
            ]
        );
    }

    fn partitioned(minor: u32) -> gpushare_proto::GpuInfo {
        let mut g = gpu(minor);
        let cap = json!({"memory_mib": 9984, "multiprocessors": 16, "copy_engines": 1,
            "decoders": 1, "encoders": 0, "jpeg_engines": 1, "ofa_engines": 0});
        g.mig_partitions = Some(
            serde_json::from_value(
                json!({"whole_gpu": true, "slices": true, "memory_slices": 8,
                "capacity": cap, "placements": (0..7).map(|i| json!({"profile": "1g.10gb",
                "gi_profile_id": 19, "placement_start": i, "memory_slices": 1, "capacity": cap}))
                .collect::<Vec<_>>()}),
            )
            .unwrap(),
        );
        g
    }

    fn stored_slice(s: &ResourceSlice, name: &str, generation: i64) -> Value {
        let mut s = s.clone();
        s.spec.pool.generation = generation;
        let mut v = s.to_api_object(ApiVersion::V1);
        v["metadata"] = json!({"name": name, "uid": format!("uid-{name}"), "resourceVersion": "5"});
        v
    }

    #[test]
    fn counter_sets_count_and_counters_only_slices_match_by_their_sets() {
        let gpus: Vec<_> = (0..9).map(partitioned).collect();
        let w = build_pool_in(&gpus, "node-a", "gpu.nvidia.com", 0, Layout::Split);
        // Two counters-only slices (8 sets and 1), nine device slices.
        assert_eq!(w.len(), 11);
        let existing: Vec<Value> = w
            .iter()
            .enumerate()
            .rev()
            .map(|(i, s)| stored_slice(s, &format!("s{i}"), 2))
            .collect();
        let p = plan(&existing, &w, "node-a", ApiVersion::V1);
        assert_eq!(
            p.changes,
            [],
            "each slice matched to its own, whatever the order"
        );
        assert_eq!(p.generation, 2);
        // The server dropped the counters of one slice: that one is updated, at the same
        // generation; likewise a device's consumption.
        for (name, index) in [("s1", 1), ("s5", 5)] {
            let mut lost = existing.clone();
            let at = lost
                .iter()
                .position(|s| s["metadata"]["name"] == name)
                .unwrap();
            let spec = &mut lost[at]["spec"];
            if index == 1 {
                spec.as_object_mut().unwrap().remove("sharedCounters");
            } else {
                spec["devices"][0]
                    .as_object_mut()
                    .unwrap()
                    .remove("consumesCounters");
            }
            let p = plan(&lost, &w, "node-a", ApiVersion::V1);
            assert_eq!(
                p.changes,
                [Change::Update {
                    name: name.into(),
                    index
                }]
            );
            assert_eq!(p.generation, 2);
        }
    }
}
