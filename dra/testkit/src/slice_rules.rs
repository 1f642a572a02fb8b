//! What the stand-in's kube-apiserver does to a ResourceSlice it is asked to store, by the
//! Kubernetes version it plays (k8s-openapi 0.29's `resource.k8s.io` documentation of the
//! `v1_34` and `v1_35` modules; written here apart from `gpushare-slice`'s own checks, so a
//! mistake in those is not repeated by the server that tests them):
//!
//! - without the `DRAPartitionableDevices` feature it drops `spec.sharedCounters` and every
//!   device's `consumesCounters` (v1beta1: `basic.consumesCounters`), as a real server drops
//!   disabled fields, and refuses nothing for them;
//! - with it, before 1.35: at most 32 counters in all of a slice's sets, devices consume only
//!   counters of the slice's own sets, at most 32 counters a device and 1024 in the slice;
//!   from 1.35: devices or counter sets in a slice, not both, at most 8 sets of at most 32
//!   counters, at most 2 consumptions a device of at most 32 counters, at most 64 devices
//!   where any consumes counters;
//! - always at most 128 devices, set and counter names DNS labels.

use serde_json::Value;

fn dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn list(v: &Value) -> &[Value] {
    v.as_array().map(Vec::as_slice).unwrap_or_default()
}

/// A device's consumption list, flat or under `basic` (v1beta1).
fn consumptions(d: &Value) -> &Value {
    if d.get("basic").is_some() {
        &d["basic"]["consumesCounters"]
    } else {
        &d["consumesCounters"]
    }
}

fn counter_names(v: &Value) -> Vec<&str> {
    v.as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

/// Drops the partitionable devices' fields from `slice`.
pub fn drop_counters(slice: &mut Value) {
    if let Some(spec) = slice["spec"].as_object_mut() {
        spec.remove("sharedCounters");
    }
    if let Some(devices) = slice["spec"]["devices"].as_array_mut() {
        for d in devices.iter_mut().filter_map(Value::as_object_mut) {
            d.remove("consumesCounters");
            if let Some(basic) = d.get_mut("basic").and_then(Value::as_object_mut) {
                basic.remove("consumesCounters");
            }
        }
    }
}

/// Why a server of Kubernetes `1.<minor>` with the feature refuses `slice`; empty when it
/// admits it.
pub fn violations(slice: &Value, minor: u32) -> Vec<String> {
    let mut out = Vec::new();
    let spec = &slice["spec"];
    let devices = list(&spec["devices"]);
    let sets = list(&spec["sharedCounters"]);
    let split = minor >= 35;
    if devices.len() > 128 {
        out.push(format!(
            "spec.devices: Too many: {}: must have at most 128 items",
            devices.len()
        ));
    }
    let mut total = 0;
    for (i, set) in sets.iter().enumerate() {
        let name = set["name"].as_str().unwrap_or_default();
        if !dns_label(name) {
            out.push(format!(
                "spec.sharedCounters[{i}].name: Invalid value: {name:?}"
            ));
        }
        let counters = counter_names(&set["counters"]);
        if counters.is_empty() {
            out.push(format!("spec.sharedCounters[{i}].counters: Required value"));
        }
        for c in &counters {
            if !dns_label(c) {
                out.push(format!(
                    "spec.sharedCounters[{i}].counters: Invalid value: {c:?}"
                ));
            }
        }
        if split && counters.len() > 32 {
            out.push(format!("spec.sharedCounters[{i}].counters: Too many"));
        }
        total += counters.len();
    }
    if split {
        if !devices.is_empty() && !sets.is_empty() {
            out.push(
                "spec: Invalid value: only one of devices and sharedCounters may be set".into(),
            );
        }
        if sets.len() > 8 {
            out.push(format!(
                "spec.sharedCounters: Too many: {}: must have at most 8 items",
                sets.len()
            ));
        }
    } else if total > 32 {
        out.push(format!(
            "spec.sharedCounters: Too many: {total} counters: must have at most 32"
        ));
    }
    let mut consumed = 0;
    let mut consuming = false;
    for (i, d) in devices.iter().enumerate() {
        let entries = list(consumptions(d));
        consuming |= !entries.is_empty();
        if split && entries.len() > 2 {
            out.push(format!(
                "spec.devices[{i}].consumesCounters: Too many: {}: must have at most 2 items",
                entries.len()
            ));
        }
        let mut in_device = 0;
        for (j, e) in entries.iter().enumerate() {
            let at = format!("spec.devices[{i}].consumesCounters[{j}]");
            let set_name = e["counterSet"].as_str().unwrap_or_default();
            let counters = counter_names(&e["counters"]);
            if split && counters.len() > 32 {
                out.push(format!("{at}.counters: Too many"));
            }
            in_device += counters.len();
            if !split {
                match sets.iter().find(|s| s["name"] == set_name) {
                    None => out.push(format!(
                        "{at}.counterSet: Invalid value: {set_name:?}: must reference a counter set defined in the ResourceSlice sharedCounters"
                    )),
                    Some(set) => {
                        for c in counters.iter().filter(|c| set["counters"].get(**c).is_none()) {
                            out.push(format!(
                                "{at}.counters: Invalid value: {c:?}: must reference a counter defined in the ResourceSlice sharedCounters"
                            ));
                        }
                    }
                }
            }
        }
        if !split && in_device > 32 {
            out.push(format!(
                "spec.devices[{i}].consumesCounters: Too many counters"
            ));
        }
        consumed += in_device;
    }
    if split && consuming && devices.len() > 64 {
        out.push(format!(
            "spec.devices: Too many: {}: must have at most 64 items where a device consumes counters",
            devices.len()
        ));
    }
    if !split && consumed > 1024 {
        out.push(format!(
            "spec.devices: Too many: {consumed} counters consumed: must have at most 1024"
        ));
    }
    out
}
