//! The API server's rules for counter sets and counter consumption, which changed in
//! Kubernetes 1.35 (k8s-openapi 0.29's `resource.k8s.io/v1` documentation, `v1_34` and
//! `v1_35` modules): before, a slice's devices consume only counters of that slice's own
//! sets, with at most 32 counters in all its sets, 32 per device and 1024 consumed in all
//! the slice; from 1.35 a slice holds devices or counter sets, not both, at most 8 sets of
//! at most 32 counters, devices consume from at most 2 sets (32 counters each), and a slice
//! where any device consumes counters holds at most 64 devices. Names of sets and counters
//! are DNS labels, values quantities.

use std::collections::{BTreeMap, BTreeSet};

use crate::partitionable::{MAX_COUNTER_DEVICES, MAX_COUNTER_SETS};
use crate::{is_dns_label, is_quantity, validate, Counter, Layout, ResourceSlice};

/// Before 1.35: counters in all of a slice's sets.
const MAX_SLICE_COUNTERS_1_34: usize = 32;
/// Before 1.35: counters one device consumes.
const MAX_DEVICE_COUNTERS_1_34: usize = 32;
/// Before 1.35: counters all of a slice's devices consume.
const MAX_CONSUMED_COUNTERS_1_34: usize = 1024;
/// From 1.35: counters in one set, and in one consumption.
const MAX_SET_COUNTERS: usize = 32;
/// From 1.35: counter sets one device consumes from.
const MAX_CONSUMPTIONS: usize = 2;

fn check_counters(at: &str, counters: &BTreeMap<String, Counter>, errs: &mut Vec<String>) {
    if counters.is_empty() {
        errs.push(format!("{at}.counters: required"));
    }
    for (k, c) in counters {
        if !is_dns_label(k) {
            errs.push(format!("{at}.counters[{k:?}]: not a DNS label"));
        }
        if !is_quantity(&c.value) {
            errs.push(format!(
                "{at}.counters[{k:?}].value {:?}: not a quantity",
                c.value
            ));
        }
    }
}

/// Checks `s` against [`validate`]'s rules and those of `layout`'s server for counters: none
/// at all in [`Layout::Static`]; names, values and the per-slice limits of the server's
/// version otherwise (see the module documentation). References to counter sets of other
/// slices are [`validate_pool`]'s.
///
/// # Errors
/// Every violation found, each naming the field path.
pub fn validate_layout(s: &ResourceSlice, layout: Layout) -> Result<(), Vec<String>> {
    let mut errs = validate(s).err().unwrap_or_default();
    let spec = &s.spec;
    let consuming = spec
        .devices
        .iter()
        .filter(|d| !d.consumes_counters.is_empty())
        .count();
    if layout == Layout::Static {
        if !spec.shared_counters.is_empty() || consuming > 0 {
            errs.push("spec: counters in a slice for a server that keeps none".into());
        }
        return if errs.is_empty() { Ok(()) } else { Err(errs) };
    }
    let mut names = BTreeSet::new();
    for (i, set) in spec.shared_counters.iter().enumerate() {
        let at = format!("spec.sharedCounters[{i}]");
        if !is_dns_label(&set.name) {
            errs.push(format!("{at}.name {:?}: not a DNS label", set.name));
        }
        if !names.insert(set.name.as_str()) {
            errs.push(format!("{at}.name {:?}: duplicate", set.name));
        }
        check_counters(&at, &set.counters, &mut errs);
        if layout == Layout::Split && set.counters.len() > MAX_SET_COUNTERS {
            errs.push(format!("{at}.counters: more than {MAX_SET_COUNTERS}"));
        }
    }
    let mut consumed = 0;
    for (i, d) in spec.devices.iter().enumerate() {
        let mut sets = BTreeSet::new();
        let mut counters = 0;
        for (j, c) in d.consumes_counters.iter().enumerate() {
            let at = format!("spec.devices[{i}].consumesCounters[{j}]");
            if !sets.insert(c.counter_set.as_str()) {
                errs.push(format!(
                    "{at}.counterSet {:?}: a second entry for one set",
                    c.counter_set
                ));
            }
            check_counters(&at, &c.counters, &mut errs);
            counters += c.counters.len();
            if layout == Layout::Split && c.counters.len() > MAX_SET_COUNTERS {
                errs.push(format!("{at}.counters: more than {MAX_SET_COUNTERS}"));
            }
            if layout == Layout::Combined {
                match spec
                    .shared_counters
                    .iter()
                    .find(|s| s.name == c.counter_set)
                {
                    None => errs.push(format!(
                        "{at}.counterSet {:?}: must reference a counter set of this slice",
                        c.counter_set
                    )),
                    Some(set) => {
                        for k in c.counters.keys().filter(|k| !set.counters.contains_key(*k)) {
                            errs.push(format!(
                                "{at}.counters[{k:?}]: not a counter of set {:?}",
                                set.name
                            ));
                        }
                    }
                }
            }
        }
        consumed += counters;
        match layout {
            Layout::Combined if counters > MAX_DEVICE_COUNTERS_1_34 => errs.push(format!(
                "spec.devices[{i}].consumesCounters: more than {MAX_DEVICE_COUNTERS_1_34} counters"
            )),
            Layout::Split if d.consumes_counters.len() > MAX_CONSUMPTIONS => errs.push(format!(
                "spec.devices[{i}].consumesCounters: more than {MAX_CONSUMPTIONS} entries"
            )),
            _ => {}
        }
    }
    match layout {
        Layout::Combined => {
            let total: usize = spec.shared_counters.iter().map(|s| s.counters.len()).sum();
            if total > MAX_SLICE_COUNTERS_1_34 {
                errs.push(format!(
                    "spec.sharedCounters: {total} counters in all sets, at most {MAX_SLICE_COUNTERS_1_34}"
                ));
            }
            if consumed > MAX_CONSUMED_COUNTERS_1_34 {
                errs.push(format!(
                    "spec.devices: {consumed} counters consumed in all, at most {MAX_CONSUMED_COUNTERS_1_34}"
                ));
            }
        }
        Layout::Split => {
            if !spec.devices.is_empty() && !spec.shared_counters.is_empty() {
                errs.push("spec: only one of devices and sharedCounters may be set".into());
            }
            if spec.shared_counters.len() > MAX_COUNTER_SETS {
                errs.push(format!(
                    "spec.sharedCounters: {} sets, at most {MAX_COUNTER_SETS}",
                    spec.shared_counters.len()
                ));
            }
            if consuming > 0 && spec.devices.len() > MAX_COUNTER_DEVICES {
                errs.push(format!(
                    "spec.devices: {} devices, at most {MAX_COUNTER_DEVICES} where any consumes counters",
                    spec.devices.len()
                ));
            }
        }
        Layout::Static => {}
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

/// Checks a whole pool in `layout`: each slice by [`validate_layout`], one pool name,
/// generation and `resourceSliceCount` (the number of slices) in all, device names and
/// counter-set names unique in the pool, and every consumption naming a set of the pool and
/// counters of that set, at most what the set holds for each (a device that consumes more
/// than there is could never be allocated). Quantities are compared as written by this
/// crate: plain numbers, or numbers with one binary suffix.
///
/// # Errors
/// Every violation found, each naming the slice.
pub fn validate_pool(slices: &[ResourceSlice], layout: Layout) -> Result<(), Vec<String>> {
    let mut errs = Vec::new();
    let mut devices = BTreeSet::new();
    let mut sets: BTreeMap<&str, &BTreeMap<String, Counter>> = BTreeMap::new();
    for s in slices {
        let name = &s.metadata.name;
        if let Err(e) = validate_layout(s, layout) {
            errs.extend(e.into_iter().map(|e| format!("{name}: {e}")));
        }
        let (first, pool) = (&slices[0].spec.pool, &s.spec.pool);
        if pool.name != first.name
            || pool.generation != first.generation
            || usize::try_from(pool.resource_slice_count).ok() != Some(slices.len())
        {
            errs.push(format!(
                "{name}: spec.pool {pool:?} differs from the pool's {} slices",
                slices.len()
            ));
        }
        for d in &s.spec.devices {
            if !devices.insert(d.name.as_str()) {
                errs.push(format!("{name}: device {:?} twice in the pool", d.name));
            }
        }
        for set in &s.spec.shared_counters {
            if sets.insert(set.name.as_str(), &set.counters).is_some() {
                errs.push(format!(
                    "{name}: counter set {:?} twice in the pool",
                    set.name
                ));
            }
        }
    }
    for s in slices {
        for d in &s.spec.devices {
            for c in &d.consumes_counters {
                let Some(set) = sets.get(c.counter_set.as_str()) else {
                    errs.push(format!(
                        "{}: device {:?} consumes from {:?}, no counter set of the pool",
                        s.metadata.name, d.name, c.counter_set
                    ));
                    continue;
                };
                for (k, v) in &c.counters {
                    match (set.get(k).and_then(|h| bytes(&h.value)), bytes(&v.value)) {
                        (Some(have), Some(want)) if want <= have => {}
                        _ => errs.push(format!(
                            "{}: device {:?} consumes {k} = {} of set {:?}, which holds {}",
                            s.metadata.name,
                            d.name,
                            v.value,
                            c.counter_set,
                            set.get(k).map_or("none", |h| h.value.as_str())
                        )),
                    }
                }
            }
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

/// A quantity of this crate's forms as a number (`40192Mi` → bytes, `98` → 98).
pub(crate) fn bytes(q: &str) -> Option<u128> {
    let digits = q.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let n: u128 = digits.parse().ok()?;
    let shift = match &q[digits.len()..] {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        "Ti" => 40,
        "Pi" => 50,
        "Ei" => 60,
        _ => return None,
    };
    Some(n << shift)
}
