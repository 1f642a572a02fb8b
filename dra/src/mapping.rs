//! Pure: gpushared's `prepare` answer as kubelet's `Device`s, and the checks a fetched
//! ResourceClaim must pass before it is handed to gpushared.

use gpushare_proto::PrepareResult;
use serde_json::Value;

/// One `Device` of a `NodePrepareResourceResponse` (the same in v1 and v1beta1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletDevice {
    /// Base request names (`parent` for a subrequest `parent/sub`).
    pub request_names: Vec<String>,
    /// The allocation result's pool.
    pub pool_name: String,
    /// The allocation result's device.
    pub device_name: String,
    /// CDI device IDs, passed through in gpushared's order.
    pub cdi_device_ids: Vec<String>,
}

/// `parent/sub` → `parent`: kubelet matches a container's claim request by its base name
/// (the Go helper's `BaseRequestRef`).
pub fn base_request(name: &str) -> &str {
    name.split_once('/').map_or(name, |(base, _)| base)
}

/// kubelet's `Device`s for a prepared claim: one per allocated device, from gpushared's
/// `per_device`, whose IDs are passed through as they come (gpushared puts an ID that serves
/// the whole request on the request's last device only, since kubelet hands the runtime
/// every ID of every `Device`). For a gpushared older than `per_device`, the devices come
/// from `devices` with the pool of the claim's own allocation result and the request's IDs
/// on its last device only, the same contract.
pub fn kubelet_devices(result: &PrepareResult, claim: &Value) -> Vec<KubeletDevice> {
    let mut out = Vec::new();
    for r in &result.requests {
        let base = base_request(&r.request).to_string();
        if !r.per_device.is_empty() {
            out.extend(r.per_device.iter().map(|d| KubeletDevice {
                request_names: vec![base.clone()],
                pool_name: d.pool.clone(),
                device_name: d.device.clone(),
                cdi_device_ids: d.cdi_device_ids.clone(),
            }));
            continue;
        }
        let n = r.devices.len();
        out.extend(r.devices.iter().enumerate().map(|(i, dev)| KubeletDevice {
            request_names: vec![base.clone()],
            pool_name: allocation_pool(claim, &r.request, dev).unwrap_or_default(),
            device_name: dev.clone(),
            cdi_device_ids: if i + 1 == n {
                r.cdi_device_ids.clone()
            } else {
                Vec::new()
            },
        }));
    }
    out
}

fn allocation_pool(claim: &Value, request: &str, device: &str) -> Option<String> {
    claim
        .pointer("/status/allocation/devices/results")?
        .as_array()?
        .iter()
        .find(|r| r["request"] == request && r["device"] == device)
        .and_then(|r| r["pool"].as_str())
        .map(str::to_string)
}

/// Why a fetched claim is not the one kubelet asked for, or not ready to prepare.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimCheckError {
    /// The claim under that name has another UID: the one kubelet meant was deleted and
    /// the name reused.
    #[error("ResourceClaim {namespace}/{name} has UID {found}, not {wanted}: it was replaced")]
    Replaced {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// kubelet's UID.
        wanted: String,
        /// The API server's.
        found: String,
    },
    /// The claim has no `status.allocation`.
    #[error("ResourceClaim {namespace}/{name} is not allocated")]
    NotAllocated {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

/// Checks that `claim` (as the API server returned it) has kubelet's `uid` and an
/// allocation.
///
/// # Errors
/// [`ClaimCheckError`] saying which.
pub fn check_claim(
    claim: &Value,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<(), ClaimCheckError> {
    let found = claim.pointer("/metadata/uid").and_then(Value::as_str);
    if found != Some(uid) {
        return Err(ClaimCheckError::Replaced {
            namespace: namespace.into(),
            name: name.into(),
            wanted: uid.into(),
            found: found.unwrap_or("<none>").into(),
        });
    }
    if claim
        .pointer("/status/allocation")
        .is_none_or(Value::is_null)
    {
        return Err(ClaimCheckError::NotAllocated {
            namespace: namespace.into(),
            name: name.into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpushare_proto::{PreparedDevice, RequestDevices};
    use serde_json::json;

    fn per_device(device: &str, ids: &[&str]) -> PreparedDevice {
        PreparedDevice {
            device: device.into(),
            pool: "node-a".into(),
            cdi_device_ids: ids.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn per_device_ids_pass_through_and_request_names_are_base_names() {
        let claim_id = "gpushare.io/claim=u1";
        let result = PrepareResult {
            uid: "u1".into(),
            requests: vec![
                RequestDevices {
                    request: "gpus".into(),
                    cdi_device_ids: vec!["nvidia.com/gpu=0".into(), claim_id.into()],
                    devices: vec!["gpu-4".into(), "gpu-5".into()],
                    per_device: vec![
                        per_device("gpu-4", &["nvidia.com/gpu=4"]),
                        per_device("gpu-5", &["nvidia.com/gpu=5", claim_id]),
                    ],
                },
                RequestDevices {
                    request: "big/mig".into(),
                    cdi_device_ids: vec!["gpushare.io/claim=u1-big".into()],
                    devices: vec!["gpu-2-mig-3g20gb-9-4".into()],
                    per_device: vec![per_device(
                        "gpu-2-mig-3g20gb-9-4",
                        &["gpushare.io/claim=u1-big"],
                    )],
                },
            ],
            already_prepared: false,
        };
        let d = kubelet_devices(&result, &json!({}));
        assert_eq!(d.len(), 3);
        assert_eq!(d[0].request_names, ["gpus"]);
        assert_eq!(d[0].cdi_device_ids, ["nvidia.com/gpu=4"]);
        assert_eq!(d[1].cdi_device_ids, ["nvidia.com/gpu=5", claim_id]);
        assert_eq!(d[2].request_names, ["big"]);
        assert_eq!(d[2].pool_name, "node-a");
        let all: Vec<&String> = d.iter().flat_map(|x| &x.cdi_device_ids).collect();
        let mut uniq = all.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(all.len(), uniq.len(), "no ID given twice: {all:?}");
    }

    #[test]
    fn an_older_gpushared_without_per_device_gets_the_ids_on_the_last_device() {
        let result = PrepareResult {
            uid: "u1".into(),
            requests: vec![RequestDevices {
                request: "gpus".into(),
                cdi_device_ids: vec!["gpushare.io/claim=u1".into()],
                devices: vec!["gpu-4".into(), "gpu-5".into()],
                per_device: Vec::new(),
            }],
            already_prepared: true,
        };
        let claim = json!({"status": {"allocation": {"devices": {"results": [
            {"request": "gpus", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-4"},
            {"request": "gpus", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-5"}
        ]}}}});
        let d = kubelet_devices(&result, &claim);
        assert_eq!(d[0].cdi_device_ids, Vec::<String>::new());
        assert_eq!(d[1].cdi_device_ids, ["gpushare.io/claim=u1"]);
        assert_eq!(d[0].pool_name, "node-a");
    }

    #[test]
    fn claim_checks() {
        let ok = json!({"metadata": {"uid": "u1"}, "status": {"allocation": {}}});
        check_claim(&ok, "ns", "c", "u1").unwrap();
        let e = check_claim(&ok, "ns", "c", "u2").unwrap_err();
        assert!(e.to_string().contains("replaced"), "{e}");
        let unalloc = json!({"metadata": {"uid": "u1"}, "status": {}});
        let e = check_claim(&unalloc, "ns", "c", "u1").unwrap_err();
        assert_eq!(e.to_string(), "ResourceClaim ns/c is not allocated");
    }
}
