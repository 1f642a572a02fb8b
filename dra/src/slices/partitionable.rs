//! Whether the API server keeps partitionable devices' fields (`spec.sharedCounters`,
//! `devices[].consumesCounters`: the `DRAPartitionableDevices` feature, alpha and off by
//! default in Kubernetes 1.33 to 1.35, beta and on from 1.36) and where its version wants the counter sets. A
//! server without the feature does not refuse the fields: it drops them, which for MIG
//! slices would publish devices that overlap with nothing to stop the scheduler handing two
//! of them out. So the publisher asks before it publishes any: it creates, with
//! `dryRun=All` (nothing is stored, nothing can be allocated), a slice holding a counter set
//! and a device consuming it, in the layout `GET /version` says, and reads back whether both
//! survived; the Go helper's controller learns the same from what a write returns
//! (`DroppedFieldsError` in kubernetes/dynamic-resource-allocation's
//! `resourceslice/resourceslicecontroller.go`), which the publisher checks too.

use std::collections::BTreeMap;

use gpushare_slice::{
    counters_of_object, devices_of_object, ApiVersion, Counter, CounterSet, Device,
    DeviceCounterConsumption, Layout, Metadata, Pool, ResourceSlice, ResourceSliceSpec,
};
use serde_json::Value;

use crate::api::{Api, ApiError};

/// What the publisher learned of the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Learned {
    /// The layout to publish in.
    pub layout: Layout,
    /// Why, for the one log line: the version, or what the server did with the fields.
    pub why: String,
}

const PROBE: &str = "gpushare-probe";

fn probe_slices(node: &str, driver: &str, layout: Layout) -> Vec<ResourceSlice> {
    let counters = BTreeMap::from([("probe".to_string(), Counter { value: "1".into() })]);
    let set = CounterSet {
        name: format!("{PROBE}-counter-set"),
        counters: counters.clone(),
    };
    let device = Device {
        name: PROBE.into(),
        attributes: BTreeMap::new(),
        capacity: BTreeMap::new(),
        consumes_counters: vec![DeviceCounterConsumption {
            counter_set: set.name.clone(),
            counters,
        }],
    };
    let slice = |sets: Vec<CounterSet>, devices: Vec<Device>| ResourceSlice {
        api_version: String::new(),
        kind: "ResourceSlice".into(),
        metadata: Metadata {
            name: String::new(),
        },
        spec: ResourceSliceSpec {
            driver: driver.into(),
            pool: Pool {
                name: node.into(),
                generation: 0,
                resource_slice_count: 1,
            },
            node_name: node.into(),
            devices,
            shared_counters: sets,
        },
    };
    match layout {
        Layout::Split => vec![
            slice(vec![set], Vec::new()),
            slice(Vec::new(), vec![device]),
        ],
        _ => vec![slice(vec![set], vec![device])],
    }
}

/// Whether `got` (the server's answer to a write of `sent`, in `v`) still has every counter
/// set and every device's counter consumption `sent` had.
pub fn kept(sent: &ResourceSlice, got: &Value, v: ApiVersion) -> bool {
    let sets = counters_of_object(got).unwrap_or_default();
    let devices = devices_of_object(got, v).unwrap_or_default();
    sent.spec.shared_counters.iter().all(|s| sets.contains(s))
        && sent.spec.devices.iter().all(|d| {
            d.consumes_counters.is_empty()
                || devices
                    .iter()
                    .any(|g| g.name == d.name && g.consumes_counters == d.consumes_counters)
        })
}

/// Learns the layout from the server: its version's partitionable layout where a dry-run
/// slice with counters comes back with them, [`Layout::Static`] where the server drops
/// them, refuses such a slice as invalid (422) or answers `GET /version` with an error,
/// each with the reason.
///
/// # Errors
/// Any other failure (unreachable, a dry run forbidden, …): the publisher retries.
pub async fn learn(
    api: &Api,
    v: ApiVersion,
    node: &str,
    driver: &str,
    owner: &Value,
) -> Result<Learned, ApiError> {
    let minor = match api.server_minor().await {
        Ok(minor) => minor,
        // Answered, but not with a version we can read: where the counters go is unknown.
        Err(e @ ApiError::Status { .. }) => {
            return Ok(Learned {
                layout: Layout::Static,
                why: format!(
                    "the API server's version could not be read ({e}): publishing only the MIG devices that exist, as for a server that keeps no partitionable devices"
                ),
            })
        }
        Err(e) => return Err(e),
    };
    let layout = Layout::partitionable(minor);
    for probe in probe_slices(node, driver, layout) {
        let mut obj = probe.to_api_object(v);
        obj["metadata"] = serde_json::json!({
            "generateName": format!("{node}-{driver}-{PROBE}-"),
            "ownerReferences": [owner],
        });
        match api.create_slice_dry_run(v, &obj).await {
            Ok(got) if kept(&probe, &got, v) => {}
            Ok(_) => {
                return Ok(Learned {
                    layout: Layout::Static,
                    why: format!(
                        "the API server (Kubernetes 1.{minor}) drops spec.sharedCounters and consumesCounters (its DRAPartitionableDevices feature is off): publishing only the MIG devices that exist; a GPU's slices that could still be made are not published, since without counters the scheduler could hand out two that overlap"
                    ),
                });
            }
            Err(e) if e.code() == Some(422) => {
                return Ok(Learned {
                    layout: Layout::Static,
                    why: format!(
                        "the API server (Kubernetes 1.{minor}) refuses a ResourceSlice with counters ({e}): publishing only the MIG devices that exist"
                    ),
                });
            }
            Err(e) => return Err(e),
        }
    }
    Ok(Learned {
        layout,
        why: format!(
            "the API server (Kubernetes 1.{minor}) keeps partitionable devices: publishing every MIG slice gpushared can make, with one counter set per GPU ({layout} layout{})",
            if layout == Layout::Split {
                ": counter sets in slices of their own"
            } else {
                ": each GPU's counter set with its devices"
            }
        ),
    })
}
