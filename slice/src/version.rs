//! The `resource.k8s.io` versions a slice can be written in. v1 (Kubernetes 1.34+) and
//! v1beta2 (1.33) give each device its `attributes` and `capacity` directly; v1beta1 (1.32,
//! still served by 1.33) wraps them in `basic` (`consumesCounters` too). Everything else of a
//! slice, `sharedCounters` included, is the same in the three.

use serde_json::{json, Value};

use crate::{CounterSet, Device, ResourceSlice};

/// A `resource.k8s.io` version, in the order a publisher prefers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ApiVersion {
    /// `resource.k8s.io/v1`, GA in Kubernetes 1.34.
    V1,
    /// `resource.k8s.io/v1beta2`, Kubernetes 1.33.
    V1beta2,
    /// `resource.k8s.io/v1beta1`, Kubernetes 1.32 and 1.33.
    V1beta1,
}

impl ApiVersion {
    /// Every version, most preferred first.
    pub const PREFERENCE: [ApiVersion; 3] =
        [ApiVersion::V1, ApiVersion::V1beta2, ApiVersion::V1beta1];

    /// The version as the API names it: `v1`, `v1beta2`, `v1beta1`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApiVersion::V1 => "v1",
            ApiVersion::V1beta2 => "v1beta2",
            ApiVersion::V1beta1 => "v1beta1",
        }
    }

    /// The version named `s` (`v1`, `v1beta2`, `v1beta1`), if it is one of ours.
    pub fn parse(s: &str) -> Option<ApiVersion> {
        Self::PREFERENCE.into_iter().find(|v| v.as_str() == s)
    }

    /// `apiVersion` of objects in this version, e.g. `resource.k8s.io/v1`.
    pub fn api_version(self) -> String {
        format!("resource.k8s.io/{}", self.as_str())
    }

    /// The first Kubernetes minor version (`1.<minor>`) that serves this version: v1 from
    /// 1.34, v1beta2 from 1.33, v1beta1 from 1.32.
    pub fn first_served(self) -> u32 {
        match self {
            ApiVersion::V1 => 34,
            ApiVersion::V1beta2 => 33,
            ApiVersion::V1beta1 => 32,
        }
    }

    /// The version to write for a server of Kubernetes `1.<minor>`: the most preferred one
    /// it serves (v1 from 1.34, v1beta2 on 1.33), or `None` before 1.32.
    pub fn for_kubernetes(minor: u32) -> Option<ApiVersion> {
        Self::PREFERENCE
            .into_iter()
            .find(|v| v.first_served() <= minor)
    }

    /// The most preferred of the versions a server serves (by name, e.g. from
    /// `GET /apis/resource.k8s.io`), or `None` when it serves none of ours.
    pub fn best_of<'a>(served: impl IntoIterator<Item = &'a str>) -> Option<ApiVersion> {
        served.into_iter().filter_map(ApiVersion::parse).min()
    }
}

impl std::fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn device_value(d: &Device, version: ApiVersion) -> Value {
    let mut v = match version {
        ApiVersion::V1 | ApiVersion::V1beta2 => json!({
            "name": d.name,
            "attributes": d.attributes,
            "capacity": d.capacity,
        }),
        ApiVersion::V1beta1 => json!({
            "name": d.name,
            "basic": {"attributes": d.attributes, "capacity": d.capacity},
        }),
    };
    if !d.consumes_counters.is_empty() {
        let at = match version {
            ApiVersion::V1beta1 => &mut v["basic"],
            ApiVersion::V1 | ApiVersion::V1beta2 => &mut v,
        };
        at["consumesCounters"] = json!(d.consumes_counters);
    }
    v
}

impl ResourceSlice {
    /// The slice as an API object of `version`: `apiVersion`, `kind`, `metadata.name` and
    /// `spec` (driver, pool, nodeName, devices in that version's shape).
    pub fn to_api_object(&self, version: ApiVersion) -> Value {
        let devices: Vec<Value> = self
            .spec
            .devices
            .iter()
            .map(|d| device_value(d, version))
            .collect();
        let mut obj = json!({
            "apiVersion": version.api_version(),
            "kind": "ResourceSlice",
            "metadata": {"name": self.metadata.name},
            "spec": {
                "driver": self.spec.driver,
                "pool": self.spec.pool,
                "nodeName": self.spec.node_name,
                "devices": devices,
            }
        });
        if !self.spec.shared_counters.is_empty() {
            obj["spec"]["sharedCounters"] = json!(self.spec.shared_counters);
            // From 1.35 a slice holds one of the two.
            if self.spec.devices.is_empty() {
                if let Some(spec) = obj["spec"].as_object_mut() {
                    spec.remove("devices");
                }
            }
        }
        obj
    }
}

/// The counter sets of a ResourceSlice object as the API server returns it (empty when it
/// has none: never written, or dropped by a server that does not keep them).
///
/// # Errors
/// `spec.sharedCounters` does not have the API's shape.
pub fn counters_of_object(object: &Value) -> Result<Vec<CounterSet>, String> {
    match object.pointer("/spec/sharedCounters") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(v) => {
            serde_json::from_value(v.clone()).map_err(|e| format!("spec.sharedCounters: {e}"))
        }
    }
}

/// The devices of a ResourceSlice object of `version` as the API server returns it, read
/// back into our model so a publisher compares what it wants with what is there by meaning
/// (fields the server adds, such as defaults, are ignored).
///
/// # Errors
/// A device that does not have the shape of `version`, naming its index.
pub fn devices_of_object(object: &Value, version: ApiVersion) -> Result<Vec<Device>, String> {
    let Some(devices) = object.pointer("/spec/devices") else {
        return Ok(Vec::new());
    };
    let Some(list) = devices.as_array() else {
        return Err("spec.devices: not a list".into());
    };
    list.iter()
        .enumerate()
        .map(|(i, d)| {
            let flat = match version {
                ApiVersion::V1 | ApiVersion::V1beta2 => d.clone(),
                ApiVersion::V1beta1 => {
                    let mut v = d.get("basic").cloned().unwrap_or_else(|| json!({}));
                    v["name"] = d.get("name").cloned().unwrap_or(Value::Null);
                    v
                }
            };
            let mut flat = flat;
            for key in ["attributes", "capacity"] {
                if flat.get(key).is_none_or(Value::is_null) {
                    flat[key] = json!({});
                }
            }
            serde_json::from_value(flat).map_err(|e| format!("spec.devices[{i}]: {e}"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests_support::{a10g, mig_a100};

    #[test]
    fn each_kubernetes_version_gets_the_best_version_it_serves() {
        assert_eq!(ApiVersion::for_kubernetes(36), Some(ApiVersion::V1));
        assert_eq!(ApiVersion::for_kubernetes(34), Some(ApiVersion::V1));
        assert_eq!(ApiVersion::for_kubernetes(33), Some(ApiVersion::V1beta2));
        assert_eq!(ApiVersion::for_kubernetes(32), Some(ApiVersion::V1beta1));
        assert_eq!(ApiVersion::for_kubernetes(31), None);
    }

    #[test]
    fn best_version_prefers_v1_then_v1beta2() {
        assert_eq!(
            ApiVersion::best_of(["v1beta1", "v1", "v1beta2"]),
            Some(ApiVersion::V1)
        );
        assert_eq!(
            ApiVersion::best_of(["v1beta1", "v1alpha3", "v1beta2"]),
            Some(ApiVersion::V1beta2)
        );
        assert_eq!(ApiVersion::best_of(["v1alpha3"]), None);
    }

    #[test]
    fn each_version_has_its_device_shape_and_reads_back() {
        let gpus = [a10g(0), mig_a100(1)];
        let slice = crate::build(&gpus, "node-a", "gpu.nvidia.com");
        for v in ApiVersion::PREFERENCE {
            let obj = slice.to_api_object(v);
            assert_eq!(obj["apiVersion"], format!("resource.k8s.io/{v}"));
            let d0 = &obj["spec"]["devices"][0];
            if v == ApiVersion::V1beta1 {
                assert!(d0.get("attributes").is_none(), "{d0}");
                assert_eq!(d0["basic"]["attributes"]["type"]["string"], "gpu");
            } else {
                assert!(d0.get("basic").is_none(), "{d0}");
                assert_eq!(d0["attributes"]["type"]["string"], "gpu");
            }
            assert_eq!(obj["spec"]["pool"]["resourceSliceCount"], 1);
            assert_eq!(devices_of_object(&obj, v).unwrap(), slice.spec.devices);
        }
    }
}
