//! Which CDI devices a container asks for, read from its OCI config.
//!
//! Two sources, in this order:
//! 1. Annotations whose key starts with [`ANNOTATION_PREFIX`] (`cdi.k8s.io/`), in key order;
//!    each value is a comma-separated list of fully-qualified names, as the CDI annotation
//!    convention defines it. An entry that is not a qualified name is an error.
//! 2. The variable [`ENV_VAR`] in `process.env` (the last definition wins), comma-separated,
//!    the way NVIDIA's runtime reads `NVIDIA_VISIBLE_DEVICES`. A name that is not qualified
//!    gets the default kind [`DEFAULT_KIND`] (`abc` → `gpushare.io/claim=abc`).
//!
//! Entries are trimmed, empty ones ignored, and repeated names kept once (first position), so
//! that a device asked for twice is not injected twice.

use gpushare_cdi::{is_qualified_name, qualified_name};
use serde_json::Value;

/// Annotation key prefix of CDI device requests.
pub const ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
/// Environment variable of device requests in the container's `process.env`.
pub const ENV_VAR: &str = "GPUSHARE_VISIBLE_DEVICES";
/// Kind given to unqualified names from [`ENV_VAR`].
pub const DEFAULT_KIND: &str = "gpushare.io/claim";

/// A device request that cannot be understood. Fails the container's start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestError {
    /// An annotation value entry is not `vendor/class=name`.
    Annotation {
        /// The annotation key.
        key: String,
        /// The offending entry.
        entry: String,
    },
    /// An annotation value is not a string.
    AnnotationType {
        /// The annotation key.
        key: String,
    },
    /// An entry of [`ENV_VAR`] does not make a valid name even with the default kind.
    Env {
        /// The offending entry.
        entry: String,
    },
}

impl std::fmt::Display for RequestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestError::Annotation { key, entry } => write!(
                f,
                "invalid CDI device name {entry:?} in annotation {key:?}: expected vendor/class=name"
            ),
            RequestError::AnnotationType { key } => {
                write!(f, "annotation {key:?} is not a string")
            }
            RequestError::Env { entry } => {
                write!(f, "invalid CDI device name {entry:?} in {ENV_VAR}")
            }
        }
    }
}

impl std::error::Error for RequestError {}

fn entries(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|e| !e.is_empty())
}

/// The requested devices of an OCI config, as qualified names in request order.
/// An empty list means the container asks for nothing.
pub fn collect(config: &Value) -> Result<Vec<String>, RequestError> {
    let mut names: Vec<String> = Vec::new();

    if let Some(annotations) = config.get("annotations").and_then(Value::as_object) {
        // serde_json's map iterates in key order.
        for (key, value) in annotations {
            if !key.starts_with(ANNOTATION_PREFIX) {
                continue;
            }
            let text = value
                .as_str()
                .ok_or_else(|| RequestError::AnnotationType { key: key.clone() })?;
            for entry in entries(text) {
                if !is_qualified_name(entry) {
                    return Err(RequestError::Annotation {
                        key: key.clone(),
                        entry: entry.to_string(),
                    });
                }
                names.push(entry.to_string());
            }
        }
    }

    let prefix = format!("{ENV_VAR}=");
    let env_value = config
        .get("process")
        .and_then(|p| p.get("env"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter_map(|e| e.strip_prefix(&prefix))
        .next_back();
    if let Some(value) = env_value {
        for entry in entries(value) {
            let name = if is_qualified_name(entry) {
                entry.to_string()
            } else {
                qualified_name(DEFAULT_KIND, entry)
            };
            if !is_qualified_name(&name) {
                return Err(RequestError::Env {
                    entry: entry.to_string(),
                });
            }
            names.push(name);
        }
    }

    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn nothing_requested() {
        assert_eq!(collect(&json!({})), Ok(vec![]));
        assert_eq!(
            collect(
                &json!({"process": {"env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]},
                            "annotations": {"io.kubernetes.cri.container-type": "container"}})
            ),
            Ok(vec![])
        );
        assert_eq!(
            collect(&json!({"process": {"env": ["GPUSHARE_VISIBLE_DEVICES="]}})),
            Ok(vec![])
        );
        assert_eq!(
            collect(&json!({"process": {"env": ["GPUSHARE_VISIBLE_DEVICES= , ,"]}})),
            Ok(vec![])
        );
        assert_eq!(
            collect(&json!({"annotations": {"cdi.k8s.io/x": ""}})),
            Ok(vec![])
        );
        // Odd shapes are ignored rather than fatal: nothing is requested through them.
        assert_eq!(
            collect(&json!({"process": {"env": "x"}, "annotations": []})),
            Ok(vec![])
        );
        assert_eq!(collect(&json!([1, 2])), Ok(vec![]));
    }

    #[test]
    fn annotations_in_key_order() {
        let config = json!({"annotations": {
            "cdi.k8s.io/zz_plugin": "vendor.com/gpu=1",
            "cdi.k8s.io/gpushare_claim-a": "gpushare.io/claim=a, gpushare.io/claim=b",
            "other.io/x": "not/checked=at all!",
        }});
        assert_eq!(
            collect(&config).unwrap(),
            vec![
                "gpushare.io/claim=a",
                "gpushare.io/claim=b",
                "vendor.com/gpu=1"
            ]
        );
    }

    #[test]
    fn bad_annotation_entries_are_errors() {
        let err = collect(&json!({"annotations": {"cdi.k8s.io/p": "gpushare.io/claim=a,claim-b"}}))
            .unwrap_err();
        assert_eq!(
            err,
            RequestError::Annotation {
                key: "cdi.k8s.io/p".into(),
                entry: "claim-b".into()
            }
        );
        assert!(err.to_string().contains("claim-b"));
        let err = collect(&json!({"annotations": {"cdi.k8s.io/p": 3}})).unwrap_err();
        assert!(matches!(err, RequestError::AnnotationType { .. }));
    }

    #[test]
    fn env_names_get_the_default_kind() {
        let config = json!({"process": {"env": [
            "PATH=/bin",
            "GPUSHARE_VISIBLE_DEVICES=old",
            "GPUSHARE_VISIBLE_DEVICES=5d1c-0, nvidia.com/gpu=0,abc:1"
        ]}});
        assert_eq!(
            collect(&config).unwrap(),
            vec![
                "gpushare.io/claim=5d1c-0",
                "nvidia.com/gpu=0",
                "gpushare.io/claim=abc:1"
            ]
        );
        let err = collect(&json!({"process": {"env": ["GPUSHARE_VISIBLE_DEVICES=bad name"]}}))
            .unwrap_err();
        assert_eq!(
            err,
            RequestError::Env {
                entry: "bad name".into()
            }
        );
        let err = collect(&json!({"process": {"env": ["GPUSHARE_VISIBLE_DEVICES=/dev/nvidia0"]}}))
            .unwrap_err();
        assert!(err.to_string().contains("/dev/nvidia0"));
        // A similar-looking variable is not ours.
        assert_eq!(
            collect(&json!({"process": {"env": ["GPUSHARE_VISIBLE_DEVICES_X=a"]}})),
            Ok(vec![])
        );
    }

    #[test]
    fn annotations_first_then_env_without_repeats() {
        let config = json!({
            "annotations": {"cdi.k8s.io/a": "gpushare.io/claim=x,vendor.com/gpu=0,gpushare.io/claim=x"},
            "process": {"env": ["GPUSHARE_VISIBLE_DEVICES=y,x"]}
        });
        assert_eq!(
            collect(&config).unwrap(),
            vec![
                "gpushare.io/claim=x",
                "vendor.com/gpu=0",
                "gpushare.io/claim=y"
            ]
        );
    }
}
